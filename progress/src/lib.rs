//! The pieces of a progress engine, independent of any fabric:
//!
//! - [`WrSlab`]: work-request ids that find their request's state in O(1)
//!   when its completion arrives, and refuse stale ids;
//! - [`Ring`]: a queue whose next place is filled where the value stays,
//!   and whose retired values that hold nothing are left in place;
//! - [`Batch`]: completions polled in bounded batches, so that one busy
//!   queue cannot starve the rest of progress;
//! - [`ProgressThread`]: an optional thread that calls progress, and blocks
//!   (on a completion channel, through the caller's wait function) when
//!   there is nothing to do.
//!
//! It depends on no other crate of the workspace.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod batch;
mod ring;
mod slab;
mod thread;

pub use batch::Batch;
pub use ring::{Ring, Spare};
pub use slab::WrSlab;
pub use thread::{ProgressThread, ThreadConfig};
