//! What the user must hear of, queued under the lock and handed to the
//! user's callbacks after it is released: messages (with where their bytes
//! are), finished operations, failed peers, and rendezvous sources whose
//! drop is user code.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use xrcbtl_fabric::{Context, DmaBuf};
use xrcbtl_xrc_conn::Rank;

use crate::callbacks::DoneFn;
use crate::types::{BtlError, OpResult, Tag};
use crate::wr_id::RecvSlot;

/// Where a delivered message's bytes are.
pub(crate) enum Body<C: Context> {
    /// In a buffer of the BTL's (a rendezvous sink, a copy to itself).
    Heap(Vec<u8>),
    /// In place, in the receive buffer it arrived in: not posted again
    /// until the consumer is done (the core's `consumed`). Where credits flow,
    /// the credit the sender spent on it is owed back then, to `(sender,
    /// local QP)`.
    Received {
        chunk: Arc<DmaBuf<C>>,
        slot: RecvSlot,
        credit: Option<(Rank, u32)>,
    },
}

impl<C: Context> Body<C> {
    /// Lends bytes `start..end` to `f`.
    pub fn with<R>(&self, start: usize, end: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Body::Heap(b) => f(&b[start..end]),
            Body::Received { chunk, .. } => chunk.with_slice(start, end - start, f),
        }
    }
}

/// What the user must hear of, queued until the lock is released.
pub(crate) enum Delivery<C: Context, H> {
    /// A message: bytes `start..end` of `body`, from `src` with `tag`.
    Message {
        src: Rank,
        tag: Tag,
        body: Body<C>,
        start: usize,
        end: usize,
    },
    /// An operation ended; run its callback.
    Done {
        op: u64,
        result: OpResult,
        cb: DoneFn<H>,
    },
    /// The endpoint to `rank` failed for good.
    Failed { rank: Rank, err: BtlError },
    /// A rendezvous source to let go of (its owner's drop is user code).
    Release(Bytes),
}

/// The queue of deliveries, with its length readable without the lock: a
/// thread that finds it zero has nothing to run.
pub(crate) struct Deliveries<C: Context, H> {
    queue: VecDeque<Delivery<C, H>>,
    /// Deliveries queued, shared with the BTL outside the lock.
    queued: Arc<AtomicUsize>,
    /// Deliveries ever queued.
    pushed: u64,
}

impl<C: Context, H> Deliveries<C, H> {
    /// An empty queue counting into `queued`.
    pub fn new(queued: Arc<AtomicUsize>) -> Self {
        Deliveries {
            queue: VecDeque::new(),
            queued,
            pushed: 0,
        }
    }

    /// Queues `d` for the user.
    pub fn push(&mut self, d: Delivery<C, H>) {
        self.queue.push_back(d);
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.pushed += 1;
    }

    /// Deliveries ever queued.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Takes the next thing for the user.
    pub fn pop(&mut self) -> Option<Delivery<C, H>> {
        let d = self.queue.pop_front()?;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(d)
    }

    /// Deliveries queued.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
