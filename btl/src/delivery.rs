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
use crate::wire::SMALL_BODY;
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
    /// Copied out of its receive buffer, which went back at once: a short
    /// eager message, with nothing to give back once it is consumed.
    Small {
        /// The bytes.
        bytes: [u8; SMALL_BODY],
    },
}

impl<C: Context> Body<C> {
    /// Lends bytes `start..end` to `f`.
    pub fn with<R>(&self, start: usize, end: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Body::Heap(b) => f(&b[start..end]),
            Body::Received { chunk, .. } => chunk.with_slice(start, end - start, f),
            Body::Small { bytes } => f(&bytes[start..end]),
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

/// The deliveries waiting for the user, first in first out, with their
/// number readable without the lock: a thread that finds it zero has
/// nothing to run. The first of a run waits in a slot of its own and is
/// handed straight to the thread that runs it; only those behind it go
/// through the queue (a small message in a ping-pong never does).
pub(crate) struct Deliveries<C: Context, H> {
    /// The oldest delivery, when there is one.
    first: Option<Delivery<C, H>>,
    /// Those behind it, in order.
    queue: VecDeque<Delivery<C, H>>,
    /// Deliveries waiting, shared with the BTL outside the lock.
    queued: Arc<AtomicUsize>,
    /// Deliveries that ever waited behind another.
    pushed: u64,
}

impl<C: Context, H> Deliveries<C, H> {
    /// An empty queue counting into `queued`.
    pub fn new(queued: Arc<AtomicUsize>) -> Self {
        Deliveries {
            first: None,
            queue: VecDeque::new(),
            queued,
            pushed: 0,
        }
    }

    /// Queues `d` for the user.
    #[inline]
    pub fn push(&mut self, d: Delivery<C, H>) {
        if self.first.is_none() {
            // Nothing waits: the queue is empty too (the first is taken
            // before the queue is).
            self.first = Some(d);
        } else {
            self.queue.push_back(d);
            self.pushed += 1;
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// Deliveries that ever waited behind another.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Takes the next thing for the user.
    pub fn pop(&mut self) -> Option<Delivery<C, H>> {
        let d = self.first.take()?;
        self.first = self.queue.pop_front();
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(d)
    }

    /// Deliveries waiting.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.queue.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}
