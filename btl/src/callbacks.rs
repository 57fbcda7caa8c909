//! The callbacks a user gives the BTL, generic over the handle they
//! receive (the API's [`crate::Btl`] names its own: `AmCallback<C>` and the
//! rest are these with `H = Btl<C>`), so that the state that keeps them
//! needs no knowledge of the API above it; and the registry that keeps
//! them.

use std::collections::HashMap;
use std::sync::Arc;

use xrcbtl_xrc_conn::Rank;

use crate::types::{BtlError, Incoming, OpId, OpResult, Tag};

/// An active-message callback given handle `H`.
pub type AmFn<H> = Arc<dyn Fn(&H, &Incoming<'_>) + Send + Sync>;

/// An error callback given handle `H`.
pub type ErrFn<H> = Arc<dyn Fn(&H, Rank, &BtlError) + Send + Sync>;

/// An operation's completion callback given handle `H`.
pub type DoneFn<H> = Box<dyn FnOnce(&H, OpId, OpResult) + Send>;

/// Active-message tags.
const TAGS: usize = Tag::MAX as usize + 1;

/// The callbacks a user registered: one per active-message tag, one per
/// peer for its failure, and one for any peer's failure.
pub(crate) struct Registry<H> {
    /// By tag: every tag has its place, so that looking one up checks no
    /// bound.
    am: Box<[Option<AmFn<H>>; TAGS]>,
    on_error: HashMap<Rank, ErrFn<H>>,
    on_any_error: Option<ErrFn<H>>,
}

impl<H> Registry<H> {
    /// No callback yet.
    pub fn new() -> Self {
        Registry {
            am: Box::new(std::array::from_fn(|_| None)),
            on_error: HashMap::new(),
            on_any_error: None,
        }
    }

    /// Sets (or with `None` removes) the callback of messages with `tag`.
    pub fn set_am(&mut self, tag: Tag, cb: Option<AmFn<H>>) {
        self.am[usize::from(tag)] = cb;
    }

    /// The callback of messages with `tag`, if any.
    pub fn am(&self, tag: Tag) -> Option<AmFn<H>> {
        self.am[usize::from(tag)].clone()
    }

    /// Sets the callback run when the endpoint to `rank` fails.
    pub fn set_on_error(&mut self, rank: Rank, cb: ErrFn<H>) {
        self.on_error.insert(rank, cb);
    }

    /// Sets the callback run when any endpoint fails.
    pub fn set_on_any_error(&mut self, cb: ErrFn<H>) {
        self.on_any_error = Some(cb);
    }

    /// Forgets `rank`'s own callback (its endpoint is deleted).
    pub fn forget(&mut self, rank: Rank) {
        self.on_error.remove(&rank);
    }

    /// What runs when the endpoint to `rank` fails, in order: its own
    /// callback, then the one for any endpoint.
    pub fn on_error(&self, rank: Rank) -> [Option<ErrFn<H>>; 2] {
        [self.on_error.get(&rank).cloned(), self.on_any_error.clone()]
    }
}
