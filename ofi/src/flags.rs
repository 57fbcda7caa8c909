//! libfabric's capability, operation and completion flags as the `u64`
//! they travel in (bindgen gives the small ones `u32`).
#![forbid(unsafe_code)]

use crate::sys;

/// FI_MSG.
pub const MSG: u64 = sys::FI_MSG as u64;
/// FI_RMA.
pub const RMA: u64 = sys::FI_RMA as u64;
/// FI_TAGGED.
pub const TAGGED: u64 = sys::FI_TAGGED as u64;
/// FI_ATOMIC.
pub const ATOMIC: u64 = sys::FI_ATOMIC as u64;
/// FI_READ.
pub const READ: u64 = sys::FI_READ as u64;
/// FI_WRITE.
pub const WRITE: u64 = sys::FI_WRITE as u64;
/// FI_RECV.
pub const RECV: u64 = sys::FI_RECV as u64;
/// FI_SEND.
pub const SEND: u64 = sys::FI_SEND as u64;
/// FI_TRANSMIT (a bind flag; the same bit as FI_SEND).
pub const TRANSMIT: u64 = sys::FI_TRANSMIT as u64;
/// FI_REMOTE_READ.
pub const REMOTE_READ: u64 = sys::FI_REMOTE_READ as u64;
/// FI_REMOTE_WRITE.
pub const REMOTE_WRITE: u64 = sys::FI_REMOTE_WRITE as u64;
/// FI_MULTI_RECV.
pub const MULTI_RECV: u64 = sys::FI_MULTI_RECV as u64;
/// FI_REMOTE_CQ_DATA.
pub const REMOTE_CQ_DATA: u64 = sys::FI_REMOTE_CQ_DATA as u64;
/// FI_COMPLETION.
pub const COMPLETION: u64 = sys::FI_COMPLETION as u64;
/// FI_DELIVERY_COMPLETE.
pub const DELIVERY_COMPLETE: u64 = sys::FI_DELIVERY_COMPLETE as u64;
/// FI_TRANSMIT_COMPLETE.
pub const TRANSMIT_COMPLETE: u64 = sys::FI_TRANSMIT_COMPLETE as u64;
/// FI_INJECT.
pub const INJECT: u64 = sys::FI_INJECT as u64;
/// FI_PEEK.
pub const PEEK: u64 = sys::FI_PEEK as u64;
/// FI_CLAIM.
pub const CLAIM: u64 = sys::FI_CLAIM;
/// FI_DISCARD.
pub const DISCARD: u64 = sys::FI_DISCARD;
