//! Lock-free submission from other threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_queue::SegQueue;

struct Shared<T> {
    q: SegQueue<T>,
    pushed: AtomicU64,
}

/// The receiving end: progress drains it.
pub struct SubmitQueue<T> {
    shared: Arc<Shared<T>>,
}

/// A sending end: cheap to clone, usable from any thread; a push never
/// blocks and never takes a lock.
pub struct Submitter<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Submitter<T> {
    fn clone(&self) -> Self {
        Submitter {
            shared: self.shared.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Submitter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Submitter({} queued)", self.shared.q.len())
    }
}

impl<T> std::fmt::Debug for SubmitQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SubmitQueue({} queued)", self.shared.q.len())
    }
}

impl<T> Default for SubmitQueue<T> {
    fn default() -> Self {
        SubmitQueue {
            shared: Arc::new(Shared {
                q: SegQueue::new(),
                pushed: AtomicU64::new(0),
            }),
        }
    }
}

impl<T> SubmitQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sending end.
    pub fn submitter(&self) -> Submitter<T> {
        Submitter {
            shared: self.shared.clone(),
        }
    }

    /// Hands up to `max` queued items to `f`, oldest first; returns how many.
    pub fn drain(&self, max: usize, mut f: impl FnMut(T)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.shared.q.pop() else {
                break;
            };
            f(item);
            n += 1;
        }
        n
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.shared.q.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.shared.q.is_empty()
    }
}

impl<T> Submitter<T> {
    /// Queues an item for the next progress.
    pub fn push(&self, item: T) {
        self.shared.q.push(item);
        self.shared.pushed.fetch_add(1, Ordering::Release);
    }

    /// Items pushed through any submitter of this queue so far (a progress
    /// thread compares it before it sleeps).
    pub fn pushed(&self) -> u64 {
        self.shared.pushed.load(Ordering::Acquire)
    }
}
