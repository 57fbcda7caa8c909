//! Sending: eager messages (inline, from a bounce slot, from the user's
//! buffer, or split in parts), one-sided work, and the one `submit` that
//! posts work now or queues it behind the endpoint's.

use bytes::Bytes;
use xrcbtl_fabric::{Context, Error, Result};
use xrcbtl_xrc_conn::Rank;

use crate::callbacks::DoneFn;
use crate::delivery::{Body, Delivery};
use crate::post::Small;
use crate::proto::{Local, Rdma};
use crate::types::{OpStatus, Tag};
use crate::wire::{Kind, HEADER};
use crate::work::{Item, Msg, Store, Work};

use super::Core;

impl<C: Context, H> Core<C, H> {
    /// A message to this rank itself: delivered by copy.
    pub fn deliver_to_self(&mut self, tag: Tag, parts: [&[u8]; 2]) {
        let mut buf = self.pools.buf();
        buf.clear();
        buf.extend_from_slice(parts[0]);
        buf.extend_from_slice(parts[1]);
        self.stats.bytes_received += buf.len() as u64;
        let (src, end) = (self.cfg.rank, buf.len());
        // Taken under the send's lock, which leaves the slow-work word
        // alone: raised, so that the next progress call delivers it.
        self.raise();
        self.deliver(Delivery::Message {
            src,
            tag,
            body: Body::Heap(buf),
            start: 0,
            end,
        });
    }

    /// Sends an eager message of `parts` (header, then payload) to
    /// endpoint `ei`: copied into the message itself when it is short
    /// enough to go inline, else into a bounce slot, and posted now if it
    /// can go, else queued (in a heap copy if no slot is free). With `now_only`
    /// nothing is queued: `false` if it cannot go at once.
    ///
    /// The latency path ([`crate::post::SendQueues::send_small`]) is
    /// inlined into the caller, so that a short message costs one call
    /// frame, the API's. It also keeps the slow-work word: the caller
    /// (which takes the lock without [`Core::entered`]) leaves the next
    /// progress call quiet when the message went unsignalled, the most
    /// frequent case, and every other outcome asks for the full path.
    #[inline(always)]
    pub fn send_eager(&mut self, ei: u32, tag: Tag, parts: [&[u8]; 2], now_only: bool) -> bool {
        if let Some(sent) = self.send_small(ei, tag, parts, now_only) {
            return sent;
        }
        self.raise();
        self.send_copy(ei, Kind::Eager, tag, parts, now_only)
    }

    /// [`Core::send_eager`] to the endpoint of rank `dst`, which is not
    /// this rank: the latency path ([`Core::send_small_to`]), else the
    /// general one ([`Core::send_general_to`]).
    #[inline(always)]
    pub fn send_eager_to(
        &mut self,
        dst: Rank,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> Result<bool> {
        if let Some(sent) = self.send_small_to(dst, tag, parts, now_only) {
            return Ok(sent);
        }
        self.send_general_to(dst, tag, parts, now_only)
    }

    /// The latency path of [`Core::send_eager_to`]: finds the endpoint
    /// once, and looks at it once ([`crate::post::SendQueues::send_small`]
    /// checks that it is open). `None` when the message must take the
    /// general path, else whether it was sent (or queued).
    #[inline(always)]
    pub fn send_small_to(
        &mut self,
        dst: Rank,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> Option<bool> {
        let ei = self.eps.find(dst)?;
        self.send_small(ei, tag, parts, now_only)
    }

    /// The general path of [`Core::send_eager_to`], out of line: the
    /// endpoint through [`Core::endpoint`], which says why a rank cannot
    /// be sent to, then [`Core::send_copy`].
    #[inline(never)]
    pub fn send_general_to(
        &mut self,
        dst: Rank,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> Result<bool> {
        let ei = self.endpoint(dst)?;
        self.raise();
        Ok(self.send_copy(ei, Kind::Eager, tag, parts, now_only))
    }

    /// The latency path of [`Core::send_eager`]: `None` when the message
    /// must take the general path, else whether it was sent (or queued).
    #[inline(always)]
    fn send_small(&mut self, ei: u32, tag: Tag, parts: [&[u8]; 2], now_only: bool) -> Option<bool> {
        let (sends, mut v) = self.sends();
        match sends.send_small(&mut v, ei, tag, parts, now_only)? {
            Small::Quiet => Some(true),
            done => {
                self.raise();
                Some(done != Small::Dropped)
            }
        }
    }

    /// [`Core::send_eager`] of a message of `kind` (an eager message or a
    /// part of one), by the general path.
    #[inline(never)]
    pub(super) fn send_copy(
        &mut self,
        ei: u32,
        kind: Kind,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> bool {
        let len = parts[0].len() + parts[1].len();
        if HEADER + len <= self.cfg.max_inline as usize {
            if let Some(store) = Store::small(parts) {
                return self.send_msg(ei, kind, tag, len, store, now_only);
            }
        }
        let store = match self.iface.bounce.take() {
            Some(s) => {
                self.iface.bounce.write(s, HEADER, parts[0]);
                self.iface
                    .bounce
                    .write(s, HEADER + parts[0].len(), parts[1]);
                Store::Slot(s)
            }
            None if now_only => return false,
            None => {
                self.stats.spilled += 1;
                Store::Heap([parts[0], parts[1]].concat())
            }
        };
        self.send_msg(ei, kind, tag, len, store, now_only)
    }

    /// Sends `data` eagerly to endpoint `ei` from where it is, without a
    /// copy: registered through the cache, kept until the message
    /// completes. Falls back to a copy when the memory cannot be
    /// registered.
    pub fn send_eager_zcopy(&mut self, ei: u32, tag: Tag, data: Bytes) {
        self.send_user(ei, Kind::Eager, tag, data);
    }

    /// [`Core::send_eager_zcopy`] of a message of `kind`.
    pub(super) fn send_user(&mut self, ei: u32, kind: Kind, tag: Tag, data: Bytes) {
        let len = data.len();
        // Sent from, never read by the peer: no remote rights.
        match self.regs.cache.register_local(&data) {
            Ok(reg) => {
                self.stats.zcopy_sent += 1;
                let store = Store::User {
                    slot: None,
                    data,
                    reg,
                };
                self.send_msg(ei, kind, tag, len, store, false);
            }
            Err(_) => {
                self.send_copy(ei, kind, tag, [&data, &[]], false);
                self.deliver(Delivery::Release(data));
            }
        }
    }

    /// Sends `data` (longer than an eager message, at most
    /// [`crate::BtlConfig::split_limit`]) to endpoint `ei` as eager messages back to
    /// back: parts of the largest eager size ([`Kind::Part`]), the last
    /// one an ordinary eager message, with consecutive sequence numbers.
    /// The receiver joins them. Parts go from `data` itself where they are
    /// long enough to be worth it, as [`Core::send_eager_zcopy`] does.
    pub fn send_split(&mut self, ei: u32, tag: Tag, data: Bytes) {
        let part = self.iface.max_message() - HEADER;
        self.stats.split_sent += 1;
        let mut at = 0;
        while at < data.len() {
            let end = (at + part).min(data.len());
            let kind = if end == data.len() {
                Kind::Eager
            } else {
                Kind::Part
            };
            if end - at >= self.cfg.zcopy_min {
                self.send_user(ei, kind, tag, data.slice(at..end));
            } else {
                self.send_copy(ei, kind, tag, [&data[at..end], &[]], false);
            }
            at = end;
        }
    }

    /// Posts a message of `kind` with its body in `store` now, or queues it
    /// behind the endpoint's pending work (with `now_only`, gives the store
    /// back and answers `false` instead).
    pub(super) fn send_msg(
        &mut self,
        ei: u32,
        kind: Kind,
        tag: Tag,
        len: usize,
        store: Store,
        now_only: bool,
    ) -> bool {
        let msg = Msg {
            seq: self.eps.get(ei).tx.peek(),
            kind,
            tag,
            len: len as u32,
            store,
        };
        if now_only {
            if let Err(work) = self.submit_now(ei, Work::Msg(msg)) {
                if let Work::Msg(m) = work {
                    self.let_go(m.store);
                }
                return false;
            }
        } else {
            self.submit(ei, Work::Msg(msg));
        }
        self.eps.get_mut(ei).tx.take();
        self.stats.eager_sent += 1;
        true
    }

    /// Posts `work` to endpoint `ei` at once if nothing waits before it
    /// and it can go; else it waits in the endpoint's queue, in order. (An
    /// endpoint without a path is connected on demand.)
    pub fn submit(&mut self, ei: u32, work: Work) {
        if !self.eps.get(ei).pending.is_empty() {
            return self.eps.enqueue(ei, work);
        }
        let item = Item {
            order: self.eps.next_order(ei),
            tries: 0,
            work,
        };
        if let Err(item) = self.post(ei, item) {
            self.eps.requeue(ei, item);
        }
    }

    /// [`Core::submit`] of work that goes now or not at all: it is given
    /// back if anything waits before it or it cannot be posted at once.
    // By value, as `SendQueues::post` takes and returns it.
    #[allow(clippy::result_large_err)]
    pub(super) fn submit_now(&mut self, ei: u32, work: Work) -> std::result::Result<(), Work> {
        if !self.eps.get(ei).pending.is_empty() {
            return Err(work);
        }
        let item = Item {
            order: self.eps.next_order(ei),
            tries: 0,
            work,
        };
        self.post(ei, item).map_err(|item| item.work)
    }

    /// Starts an operation to `dst`, whose `done` runs when it ends.
    pub fn start_op(&mut self, dst: Rank, done: Option<DoneFn<H>>) -> u64 {
        self.ops.start(dst, done)
    }

    /// Forgets an operation that never started (nobody hears of it); its
    /// callback comes back, to be dropped outside the lock.
    pub fn abandon_op(&mut self, op: u64) -> Option<DoneFn<H>> {
        self.ops.finish(op, Ok(None)).map(|(cb, _)| cb)
    }

    /// Where operation `op` is.
    pub fn op_status(&mut self, op: u64) -> OpStatus {
        self.ops.status(op)
    }

    /// A slot for an atomic's result, and where the device writes it.
    pub fn result_slot(&mut self) -> Result<(u32, Local)> {
        let slot = self
            .iface
            .results
            .take()
            .ok_or(Error::NoResource("atomics in flight"))?;
        let sge = self.iface.results.sge(slot, 8);
        let result = Local {
            addr: sge.addr,
            lkey: sge.lkey,
            rkey: 0,
        };
        Ok((slot, result))
    }

    /// Gives back a result slot whose atomic never started.
    pub fn give_result_slot(&mut self, slot: u32) {
        self.iface.results.give(slot);
    }

    /// Submits one-sided work (and the fence behind it) to endpoint `ei`.
    pub fn submit_rdma(&mut self, ei: u32, rdma: Rdma, fence: Option<Rdma>) {
        self.stats.rdma_frags += u64::from(!rdma.is_atomic());
        self.stats.atomics += u64::from(rdma.is_atomic());
        for rdma in std::iter::once(rdma).chain(fence) {
            self.submit(ei, Work::Rdma(rdma));
        }
    }
}
