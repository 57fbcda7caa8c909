//! Deliveries: what the core queued for the user (messages, finished
//! operations, failed peers, buffers to let go) run one at a time with no
//! lock held, by whichever thread progresses first.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use parking_lot::MutexGuard;
use xrcbtl_fabric::Context;
use xrcbtl_xrc_conn::Rank;

use crate::core::Core;
use crate::delivery::{Body, Delivery};
use crate::types::{BtlError, Incoming, OpId, OpResult, Tag};

use super::{AmCallback, Btl, ErrorCallback, OnDone};

/// What a delivery runs, with its callbacks found.
enum Job<C: Context> {
    Message {
        src: Rank,
        tag: Tag,
        body: Body<C>,
        start: usize,
        end: usize,
        cb: Option<AmCallback<C>>,
    },
    Done {
        op: u64,
        result: OpResult,
        cb: OnDone<C>,
    },
    Failed {
        rank: Rank,
        err: BtlError,
        cbs: [Option<ErrorCallback<C>>; 2],
    },
    Release(Bytes),
}

/// Clears the delivery flag when the deliverer is done, or panics.
struct Delivering<'a>(&'a AtomicBool);

impl Drop for Delivering<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl<C: Context> Btl<C> {
    /// Runs queued deliveries, unless another thread (or a caller up this
    /// thread's stack) is running them. `held` is the lock, taken by the
    /// caller: the first delivery is taken under it, and it is let go
    /// before any callback runs.
    pub(super) fn deliver_all(&self, held: MutexGuard<'_, Core<C, Btl<C>>>) -> usize {
        let mut held = Some(held);
        let mut n = 0;
        loop {
            // Whoever queues a delivery runs this afterwards: nothing
            // queued now is nothing to do.
            if self.queued.load(Ordering::SeqCst) == 0
                || self.delivering.swap(true, Ordering::SeqCst)
            {
                return n;
            }
            let flag = Delivering(&self.delivering);
            let mut spent = None;
            loop {
                let job = {
                    let mut core = held.take().unwrap_or_else(|| self.lock());
                    if let Some(b) = spent.take() {
                        core.consumed(b);
                    }
                    let Some(d) = core.next_delivery() else { break };
                    resolve(&mut core, d)
                };
                n += 1;
                spent = self.run(job);
                // Nothing to give back and nothing waiting: no need to
                // take the lock again (what is queued from now on is seen
                // below, or by the thread that queued it).
                if spent.is_none() && self.queued.load(Ordering::SeqCst) == 0 {
                    break;
                }
            }
            drop(flag);
            // Something queued after the last look, while the flag was
            // still up, is ours to run.
            if self.queued.load(Ordering::SeqCst) == 0 {
                return n;
            }
        }
    }

    /// Runs one delivery's callbacks (no lock held); returns the message
    /// body it consumed.
    fn run(&self, job: Job<C>) -> Option<Body<C>> {
        match job {
            Job::Message {
                src,
                tag,
                body,
                start,
                end,
                cb,
            } => {
                if let Some(cb) = cb {
                    body.with(start, end, |data| cb(self, &Incoming { src, tag, data }));
                }
                // A copy has nothing to give back.
                (!matches!(body, Body::Small { .. })).then_some(body)
            }
            Job::Done { op, result, cb } => {
                cb(self, OpId(op), result);
                None
            }
            Job::Failed { rank, err, cbs } => {
                for cb in cbs.into_iter().flatten() {
                    cb(self, rank, &err);
                }
                None
            }
            Job::Release(b) => {
                drop(b);
                None
            }
        }
    }
}

/// Finds a delivery's callbacks (under the lock).
fn resolve<C: Context>(core: &mut Core<C, Btl<C>>, d: Delivery<C, Btl<C>>) -> Job<C> {
    match d {
        Delivery::Message {
            src,
            tag,
            body,
            start,
            end,
        } => {
            let cb = core.am(tag);
            Job::Message {
                src,
                tag,
                body,
                start,
                end,
                cb,
            }
        }
        Delivery::Done { op, result, cb } => Job::Done { op, result, cb },
        Delivery::Failed { rank, err } => Job::Failed {
            rank,
            err,
            cbs: core.on_error(rank),
        },
        Delivery::Release(b) => Job::Release(b),
    }
}
