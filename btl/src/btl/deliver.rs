//! Deliveries: what the core queued for the user (messages, finished
//! operations, failed peers, buffers to let go) run one at a time with no
//! lock held, by whichever thread progresses first.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::MutexGuard;
use xrcbtl_fabric::Context;

use crate::core::Core;
use crate::delivery::{Body, Delivery, Short};
use crate::types::{Incoming, OpId};

use super::{AmCallback, Btl, ErrorCallback};

/// The callbacks a delivery runs, found for it under the lock (a
/// finished operation carries its own; a buffer let go runs none).
enum Found<C: Context> {
    /// A message's active-message callback, if its tag has one.
    Am(Option<AmCallback<C>>),
    /// A failed peer's error callbacks.
    OnError([Option<ErrorCallback<C>>; 2]),
    /// Nothing to find.
    Nothing,
}

/// The delivery flag, up while its deliverer runs callbacks: cleared by
/// [`Delivering::done`], or when a callback panics, by its drop, which
/// also raises the slow-work word (`rare`). What was queued behind the
/// panicking callback is then run by the next progress call, which would
/// otherwise be quiet and not look at the queue.
struct Delivering<'a> {
    flag: &'a AtomicBool,
    rare: &'a AtomicBool,
}

impl Delivering<'_> {
    /// The deliverer is done: the flag goes down, the word stays.
    #[inline(always)]
    fn done(self) {
        self.flag.store(false, Ordering::SeqCst);
        std::mem::forget(self);
    }
}

impl Drop for Delivering<'_> {
    fn drop(&mut self) {
        self.rare.store(true, Ordering::SeqCst);
        self.flag.store(false, Ordering::SeqCst);
    }
}

/// A message body lent to a callback: handed back to the caller when the
/// callback returns ([`GiveBack::keep`]), given back to the core by the
/// drop when it panics, so that its receive buffer is posted again (and,
/// where credits flow, the credit its sender spent returned).
struct GiveBack<'a, C: Context> {
    btl: &'a Btl<C>,
    body: Option<Body<C>>,
}

impl<C: Context> GiveBack<'_, C> {
    /// The callback returned: the body goes back to the caller.
    #[inline(always)]
    fn keep(mut self) -> Option<Body<C>> {
        self.body.take()
    }
}

impl<C: Context> Drop for GiveBack<'_, C> {
    fn drop(&mut self) {
        // Only a panic leaves the body here; no lock is held while a
        // callback runs.
        if let Some(body) = self.body.take() {
            self.btl.lock().consumed(body);
        }
    }
}

impl<C: Context> Btl<C> {
    /// The delivery flag's guard, for a thread that raised it.
    #[inline(always)]
    fn delivering_flag(&self) -> Delivering<'_> {
        Delivering {
            flag: &self.delivering,
            rare: &self.rare,
        }
    }

    /// Runs queued deliveries, unless another thread (or a caller up this
    /// thread's stack) is running them. `held` is the lock, taken by the
    /// caller: the first delivery is taken under it, and it is let go
    /// before any callback runs. Inline, so that a short message reaches
    /// its callback from the progress call's own frame; the loop for the
    /// rest is out of line.
    #[inline(always)]
    pub(super) fn deliver_all(&self, mut held: MutexGuard<'_, Core<C, Btl<C>>>) -> usize {
        if held.has_short() {
            // The usual case, on a line of its own: a short message waits
            // in its slot (the oldest delivery) and no one else is
            // delivering. The slot's message is counted only when it is
            // left to another deliverer (below).
            if !self.delivering.swap(true, Ordering::SeqCst) {
                let flag = self.delivering_flag();
                let s = held.next_short_held();
                return self.run_oldest_short(held, &s, flag);
            }
            // Another thread delivers: counted before the loop below looks
            // at the flag again, so that the other thread, which looks at
            // the count after it lets the flag go, sees it if this one does
            // not take the flag.
            held.count_short();
        }
        self.deliver_loop(Some(held))
    }

    /// Hands short message `s`, read under `held` when no delivery waited,
    /// to its callback, unless another thread (or a caller up this
    /// thread's stack) is delivering: then it goes back in line, ahead of
    /// anything queued since, for that thread to run. Returns the
    /// deliveries run. Inline, so that the message goes from the frame it
    /// was copied into to its callback without another copy.
    #[inline(always)]
    pub(super) fn hand_short(&self, mut held: MutexGuard<'_, Core<C, Btl<C>>>, s: &Short) -> usize {
        if !self.delivering.swap(true, Ordering::SeqCst) {
            let flag = self.delivering_flag();
            return self.run_oldest_short(held, s, flag);
        }
        held.hold_short(*s);
        self.deliver_loop(Some(held))
    }

    /// Runs short message `s`, the oldest delivery, taken under `held` by a
    /// thread that raised the delivery flag (`flag`), then lets the flag
    /// go; what was queued while it was up is ours to run, as at the end of
    /// [`Btl::deliver_loop`]. Returns the deliveries run.
    #[inline(always)]
    fn run_oldest_short(
        &self,
        held: MutexGuard<'_, Core<C, Btl<C>>>,
        s: &Short,
        flag: Delivering<'_>,
    ) -> usize {
        self.run_short(held, s);
        flag.done();
        if self.queued.load(Ordering::SeqCst) == 0 {
            return 1;
        }
        1 + self.deliver_loop(None)
    }

    /// [`Btl::deliver_all`]'s loop: runs deliveries while any are queued
    /// and no one else runs them, starting under `held` when the caller
    /// holds the lock.
    #[inline(never)]
    fn deliver_loop(&self, mut held: Option<MutexGuard<'_, Core<C, Btl<C>>>>) -> usize {
        let mut n = 0;
        loop {
            // Whoever queues a delivery runs this afterwards: nothing
            // queued now is nothing to do.
            if self.queued.load(Ordering::SeqCst) == 0
                || self.delivering.swap(true, Ordering::SeqCst)
            {
                return n;
            }
            let flag = self.delivering_flag();
            let mut spent = None;
            loop {
                let mut core = held.take().unwrap_or_else(|| self.lock());
                if let Some(b) = spent.take() {
                    core.consumed(b);
                }
                // The short message in its own slot, the oldest when there
                // is one: taken out whole, with nothing to give back.
                if let Some(s) = core.next_short() {
                    n += 1;
                    self.run_short(core, &s);
                } else {
                    let Some(d) = core.next_delivery() else { break };
                    let found = find(&mut core, &d);
                    drop(core);
                    n += 1;
                    spent = self.run(d, found);
                }
                // Nothing to give back and nothing waiting: no need to
                // take the lock again (what is queued from now on is seen
                // below, or by the thread that queued it).
                if spent.is_none() && self.queued.load(Ordering::SeqCst) == 0 {
                    break;
                }
            }
            flag.done();
            // Something queued after the last look, while the flag was
            // still up, is ours to run.
            if self.queued.load(Ordering::SeqCst) == 0 {
                return n;
            }
        }
    }

    /// Runs one delivery's callbacks (no lock held); returns the message
    /// body it consumed.
    #[inline]
    fn run(&self, d: Delivery<C, Btl<C>>, found: Found<C>) -> Option<Body<C>> {
        match d {
            Delivery::Message {
                src,
                tag,
                body,
                start,
                end,
            } => {
                if let Found::Am(Some(cb)) = found {
                    let back = GiveBack {
                        btl: self,
                        body: Some(body),
                    };
                    let body = back.body.as_ref().expect("just put");
                    body.with(start, end, |data| cb(self, &Incoming { src, tag, data }));
                    return back.keep();
                }
                Some(body)
            }
            Delivery::Short(s) => {
                if let Found::Am(cb) = found {
                    self.call_short(&s, cb);
                }
                None
            }
            Delivery::Done { op, result, cb } => {
                cb(self, OpId(op), result);
                None
            }
            Delivery::Failed { rank, err } => {
                if let Found::OnError(cbs) = found {
                    for cb in cbs.into_iter().flatten() {
                        cb(self, rank, &err);
                    }
                }
                None
            }
            Delivery::Release(b) => {
                drop(b);
                None
            }
        }
    }
}

impl<C: Context> Btl<C> {
    /// Hands short message `s`, taken out under `core`, to its tag's
    /// callback: looked up under the lock, which is let go before the
    /// callback runs.
    #[inline(always)]
    fn run_short(&self, mut core: MutexGuard<'_, Core<C, Btl<C>>>, s: &Short) {
        let cb = core.am(s.tag);
        drop(core);
        self.call_short(s, cb);
    }

    /// Hands short message `s` to its tag's callback `cb`, if it has one
    /// (no lock held).
    #[inline]
    fn call_short(&self, s: &Short, cb: Option<AmCallback<C>>) {
        if let Some(cb) = cb {
            let (src, tag) = (s.src, s.tag);
            cb(
                self,
                &Incoming {
                    src,
                    tag,
                    data: s.body(),
                },
            );
        }
    }
}

/// Finds a delivery's callbacks (under the lock).
fn find<C: Context>(core: &mut Core<C, Btl<C>>, d: &Delivery<C, Btl<C>>) -> Found<C> {
    match d {
        Delivery::Message { tag, .. } => Found::Am(core.am(*tag)),
        Delivery::Short(s) => Found::Am(core.am(s.tag)),
        Delivery::Failed { rank, .. } => Found::OnError(core.on_error(*rank)),
        Delivery::Done { .. } | Delivery::Release(_) => Found::Nothing,
    }
}
