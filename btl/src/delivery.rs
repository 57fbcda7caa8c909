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
use crate::wire::{copy_short, SMALL_BODY};
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

/// A short eager message copied out of its receive buffer, which went back
/// at once: nothing to give back once it is consumed.
#[derive(Clone, Copy)]
pub(crate) struct Short {
    /// Its sender.
    pub src: Rank,
    /// Its tag.
    pub tag: Tag,
    /// Bytes of `bytes` used.
    len: u8,
    /// The body.
    bytes: [u8; SMALL_BODY],
}

impl Short {
    /// No message: what a slot holds before its first.
    pub const EMPTY: Short = Short {
        src: 0,
        tag: 0,
        len: 0,
        bytes: [0; SMALL_BODY],
    };

    /// `body` (at most [`SMALL_BODY`] bytes) from `src` with `tag`.
    pub fn new(src: Rank, tag: Tag, body: &[u8]) -> Self {
        let mut s = Short::EMPTY;
        s.fill(src, tag, body);
        s
    }

    /// The first `len` bytes of `bytes` (`len` at most [`SMALL_BODY`]),
    /// from `src` with `tag`: the body taken at its fixed length, with no
    /// copy that depends on `len`.
    #[inline(always)]
    pub fn of_fixed(src: Rank, tag: Tag, len: u8, bytes: &[u8; SMALL_BODY]) -> Self {
        debug_assert!(usize::from(len) <= SMALL_BODY);
        Short {
            src,
            tag,
            len,
            bytes: *bytes,
        }
    }

    /// Becomes `body` from `src` with `tag`, in place. Inline in the
    /// straight line (its call, with the frame around it, cost the
    /// receiving call more than its copy).
    #[inline(always)]
    pub fn fill(&mut self, src: Rank, tag: Tag, body: &[u8]) {
        self.src = src;
        self.tag = tag;
        self.len = body.len() as u8;
        copy_short(&mut self.bytes[..body.len()], body);
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
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
    /// A short message, queued behind another delivery.
    Short(Short),
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
/// through the queue (a small message in a ping-pong never does). A short
/// message a progress call found alone never comes here when nothing
/// waits: that call hands it from its own frame to its callback, unless
/// another thread is delivering, and only then puts it in line
/// ([`Deliveries::hold_oldest`]). One of several found that finds nothing
/// waiting is copied into a slot of its own, ahead of all else, and taken
/// out whole once. That slot is not in the number until
/// [`Deliveries::count_short`] puts it there: the progress call that
/// filled it hands it to its callback itself, under the same lock, unless
/// another thread is delivering, and only then does that thread need to
/// see it counted.
pub(crate) struct Deliveries<C: Context, H> {
    /// A short message older than everything else, when `short_held`.
    short: Short,
    /// Whether `short` holds a message.
    short_held: bool,
    /// Whether `short`'s message is in `queued`.
    short_counted: bool,
    /// The oldest delivery (after `short`), when there is one.
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
            short: Short::EMPTY,
            short_held: false,
            short_counted: false,
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
            // Nothing waits but perhaps a short message, which is older:
            // the queue is empty too (the first is taken before the queue
            // is).
            self.first = Some(d);
        } else {
            self.queue.push_back(d);
            self.pushed += 1;
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts the short message in its own slot among the deliveries
    /// waiting, if it is not counted yet: before the lock is let go with
    /// it still there, so that a thread delivering meanwhile sees it.
    #[inline]
    pub fn count_short(&mut self) {
        if self.short_held && !self.short_counted {
            self.short_counted = true;
            self.queued.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Queues short message `s`, already copied out: into its own slot
    /// when nothing waits (not counted yet), else behind what does.
    #[inline]
    pub fn push_short(&mut self, s: Short) {
        if !self.short_held && self.first.is_none() {
            self.short = s;
            self.short_held = true;
        } else {
            self.push(Delivery::Short(s));
        }
    }

    /// Puts short message `s`, older than every delivery waiting, into its
    /// own slot, counted: for a message read when nothing waited, which its
    /// progress call could not hand to its callback (another thread
    /// delivers), while deliveries queued since then wait behind it. Only
    /// the reading of a message fills the slot, so it is free.
    #[cold]
    pub fn hold_oldest(&mut self, s: Short) {
        debug_assert!(!self.short_held, "only a reading fills the slot");
        self.short = s;
        self.short_held = true;
        self.count_short();
    }

    /// Whether a short message waits in its own slot.
    #[inline]
    pub fn has_short(&self) -> bool {
        self.short_held
    }

    /// Takes the short message waiting in its own slot: when there is one,
    /// it is the oldest delivery.
    #[inline]
    pub fn pop_short(&mut self) -> Option<Short> {
        if !self.short_held {
            return None;
        }
        Some(self.take_short())
    }

    /// [`Deliveries::pop_short`] when [`Deliveries::has_short`] said one
    /// waits: its test is not made again.
    #[inline]
    pub fn take_short(&mut self) -> Short {
        debug_assert!(self.short_held, "a short message waits");
        self.short_held = false;
        if self.short_counted {
            self.short_counted = false;
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        self.short
    }

    /// Deliveries that ever waited behind another.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Takes the next thing for the user.
    pub fn pop(&mut self) -> Option<Delivery<C, H>> {
        if let Some(s) = self.pop_short() {
            return Some(Delivery::Short(s));
        }
        let d = self.first.take()?;
        self.first = self.queue.pop_front();
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(d)
    }

    /// Deliveries waiting.
    pub fn len(&self) -> usize {
        usize::from(self.short_held) + usize::from(self.first.is_some()) + self.queue.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        !self.short_held && self.first.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xrcbtl_fabric::sim::SimContext;

    type D = Deliveries<SimContext, ()>;

    /// What a delivery is, in a word, with the body of a short message.
    fn what(d: &Delivery<SimContext, ()>) -> String {
        match d {
            Delivery::Short(s) => format!("short {} {:?}", s.src, s.body()),
            Delivery::Message { src, .. } => format!("message {src}"),
            Delivery::Failed { rank, .. } => format!("failed {rank}"),
            Delivery::Done { .. } => "done".into(),
            Delivery::Release(_) => "release".into(),
        }
    }

    /// Takes everything, in order (`pop` empties the short slot first, as
    /// the deliverer does).
    fn drain(d: &mut D) -> Vec<String> {
        std::iter::from_fn(|| d.pop()).map(|x| what(&x)).collect()
    }

    fn heap(src: Rank) -> Delivery<SimContext, ()> {
        Delivery::Message {
            src,
            tag: 0,
            body: Body::Heap(vec![1]),
            start: 0,
            end: 1,
        }
    }

    #[test]
    fn short_messages_keep_their_place_among_the_other_deliveries() {
        let queued = Arc::new(AtomicUsize::new(0));
        let mut d = D::new(queued.clone());
        // In the slot, then behind it: in order, whatever takes them.
        d.push_short(Short::new(1, 7, &[1, 2]));
        d.push(heap(2));
        d.push_short(Short::new(3, 7, &[3]));
        d.push(Delivery::Failed {
            rank: 4,
            err: BtlError::Closed(4),
        });
        assert_eq!(d.len(), 4);
        // The slot's message counts once counted, and only once.
        assert_eq!(queued.load(Ordering::SeqCst), 3);
        d.count_short();
        d.count_short();
        assert_eq!(queued.load(Ordering::SeqCst), 4);
        // Only what waited behind another counts as queued.
        assert_eq!(d.pushed(), 2);
        assert_eq!(
            drain(&mut d),
            ["short 1 [1, 2]", "message 2", "short 3 [3]", "failed 4"]
        );
        assert!(d.is_empty());
        assert_eq!(queued.load(Ordering::SeqCst), 0);
        // A short message behind a queued delivery waits in the queue; the
        // slot takes the next one that finds nothing waiting.
        d.push(heap(5));
        d.push_short(Short::new(6, 7, &[6; SMALL_BODY]));
        assert!(d.pop_short().is_none(), "the slot is kept for the oldest");
        assert_eq!(
            drain(&mut d),
            [
                "message 5",
                format!("short 6 {:?}", [6u8; SMALL_BODY]).as_str()
            ]
        );
        d.push_short(Short::new(8, 7, &[]));
        assert_eq!(d.len(), 1);
        assert_eq!(queued.load(Ordering::SeqCst), 0, "not counted yet");
        assert_eq!(drain(&mut d), ["short 8 []"]);
        assert_eq!(queued.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_short_message_held_back_goes_ahead_of_what_was_queued_since() {
        let queued = Arc::new(AtomicUsize::new(0));
        let mut d = D::new(queued.clone());
        // Read when nothing waited, then a delivery queued behind it before
        // it could be handed on: it goes back in line first, counted.
        d.push(heap(2));
        d.hold_oldest(Short::new(1, 7, &[1]));
        assert_eq!(queued.load(Ordering::SeqCst), 2);
        // One copied out while something waits is queued behind it.
        d.push_short(Short::new(3, 7, &[3]));
        assert_eq!(drain(&mut d), ["short 1 [1]", "message 2", "short 3 [3]"]);
        assert_eq!(queued.load(Ordering::SeqCst), 0);
        // With nothing waiting, a copied-out one takes the slot, uncounted.
        d.push_short(Short::new(4, 7, &[4]));
        assert_eq!(queued.load(Ordering::SeqCst), 0);
        assert_eq!(drain(&mut d), ["short 4 [4]"]);
    }
}
