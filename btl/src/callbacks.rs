//! The callbacks a user gives the BTL, generic over the handle they
//! receive (the API's [`crate::Btl`] names its own: `AmCallback<C>` and the
//! rest are these with `H = Btl<C>`), so that the state that keeps them
//! needs no knowledge of the API above it.

use std::sync::Arc;

use xrcbtl_xrc_conn::Rank;

use crate::types::{BtlError, Incoming, OpId, OpResult};

/// An active-message callback given handle `H`.
pub type AmFn<H> = Arc<dyn Fn(&H, &Incoming<'_>) + Send + Sync>;

/// An error callback given handle `H`.
pub type ErrFn<H> = Arc<dyn Fn(&H, Rank, &BtlError) + Send + Sync>;

/// An operation's completion callback given handle `H`.
pub type DoneFn<H> = Box<dyn FnOnce(&H, OpId, OpResult) + Send>;
