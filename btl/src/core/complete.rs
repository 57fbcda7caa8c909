//! Send completions and the failure policy: work that completed is let
//! go (or, where credits flow, kept in its QP's send log until the peer's
//! credits show it arrived); work that failed with its path is requeued in
//! order, dropped when it cannot be done again, and an endpoint that can no
//! longer be served fails with everything to and from it.

use xrcbtl_fabric::{Context, Cq, WcOpcode, WcStatus, WorkCompletion};
use xrcbtl_xrc_conn::Rank;

use crate::delivery::Delivery;
use crate::ep::EpState;
use crate::iface::Iface;
use crate::post::PostedWr;
use crate::proto::rndv::Control;
use crate::proto::{Owner, Rdma};
use crate::recv::Returned;
use crate::types::{BtlError, OpResult};
use crate::wire::{self, Kind, HEADER};
use crate::work::{Item, Store, Work};
use crate::wr_id::WrId;

use super::{Core, MAX_TRIES};

impl<C: Context, H> Core<C, H> {
    pub(super) fn poll_send(&mut self) -> usize {
        let mut batch = self.sends.take_batch();
        let n = match batch.poll(|b| self.iface.send_cq.poll(b)) {
            Ok(wcs) => {
                for wc in wcs {
                    self.on_send_completion(wc);
                }
                wcs.len()
            }
            Err(_) => 0,
        };
        self.sends.put_batch(batch);
        n
    }

    pub(super) fn on_send_completion(&mut self, wc: &WorkCompletion) {
        match WrId::of(wc.wr_id) {
            WrId::Hello => {
                if wc.status != WcStatus::Success {
                    let now = self.cfg.clock.now();
                    self.drv.handle_send_failure_qpn(now, wc.qp_num);
                }
            }
            WrId::Recv(_) => {}
            WrId::Log { slot, gen, no } => {
                // A QP's work completes in order: the log's front up to
                // this message is done (an error is this message's alone).
                let ok = wc.status == WcStatus::Success;
                if self.iface.credits() {
                    // Done means left: kept until credits show it arrived.
                    self.leave(slot, gen, if ok { no } else { no.wrapping_sub(1) });
                    if !ok {
                        if let Some(p) = self.sends.pop_failed(&mut self.eps, slot, gen, no) {
                            self.send_failed(p, wc);
                        }
                    }
                    return self.retire_arrived(slot);
                }
                // Messages kept in memory need nothing more.
                if ok {
                    self.sends.retire_left(&mut self.eps, slot, gen, no);
                }
                while let Some(p) = self.sends.pop_logged_until(&mut self.eps, slot, gen, no) {
                    if p.no as u32 == no && !ok {
                        self.send_failed(p, wc);
                    } else {
                        self.on_sent(p.item, wc);
                    }
                }
            }
            WrId::Send(id) => {
                let Some((qp, no)) = self.sends.find(id) else {
                    return;
                };
                // Whatever was posted before this request on its QP is done.
                if self.iface.credits() {
                    self.leave(qp, self.sends.gen_of(qp), (no as u32).wrapping_sub(1));
                    self.retire_arrived(qp);
                } else {
                    while let Some(p) = self.sends.pop_logged_before(&mut self.eps, qp, no) {
                        self.on_sent(p.item, wc);
                    }
                }
                let Some(p) = self.sends.complete(&mut self.eps, id) else {
                    return;
                };
                if wc.status == WcStatus::Success {
                    return self.on_sent(p.item, wc);
                }
                self.send_failed(p, wc);
            }
        }
    }

    /// Posted work failed with `wc`'s status: its QP is rebuilt, and the
    /// work goes again, or, when trying again cannot help, is dropped.
    fn send_failed(&mut self, p: PostedWr, wc: &WorkCompletion) {
        self.stats.send_errors += 1;
        let now = self.cfg.clock.now();
        self.drv.handle_send_failure(now, p.qp);
        let fatal = matches!(
            wc.status,
            WcStatus::RemoteAccess
                | WcStatus::RemoteInvalidRequest
                | WcStatus::LocalProtection
                | WcStatus::LocalLength
                | WcStatus::LocalAccess
        );
        if fatal {
            self.drop_item(p.ep, p.item, BtlError::Transfer(wc.status));
        } else {
            self.requeue(p.ep, p.item);
        }
    }

    /// Where credits flow: the messages of QP slot `slot` up to its post
    /// `no` (in generation `gen`) have left ([`crate::post::SendQueues::leave`]),
    /// giving back their bounce slots if slots run short.
    fn leave(&mut self, slot: u32, gen: u8, no: u32) {
        let iface = &mut self.iface;
        self.sends
            .leave(&mut self.eps, slot, gen, no, |item| spare_slot(iface, item));
    }

    /// Credits came back for the messages sent on a local QP: as many more
    /// of them arrived, and those that have left need not be kept.
    #[inline(always)]
    pub(super) fn arrived(&mut self, r: Returned) {
        let slot = match r.slot {
            Some(slot) => slot,
            None => match self.drv.slot_of_num(r.qpn) {
                Some(slot) => slot,
                // A QP gone meanwhile took its log with it.
                None => return,
            },
        };
        if self.sends.arrive(slot, u64::from(r.n)) {
            self.retire_arrived(slot);
        }
    }

    /// Retires the messages of QP slot `slot` that have left and arrived.
    pub(super) fn retire_arrived(&mut self, slot: u32) {
        while let Some(p) = self.sends.pop_arrived(slot) {
            self.let_go_kept(p.item);
        }
    }

    /// A kept message is no longer needed (it arrived, or its peer is
    /// gone).
    pub(super) fn let_go_kept(&mut self, item: Item) {
        if let Work::Msg(m) = item.work {
            self.let_go(m.store);
        }
    }

    /// Work completed successfully.
    pub(super) fn on_sent(&mut self, item: Item, wc: &WorkCompletion) {
        match item.work {
            Work::Msg(m) => self.let_go(m.store),
            Work::Rdma(r) => match r.owner {
                Owner::RndvIn { .. } | Owner::RndvOut { .. } => {
                    self.rndv.on_rdma_done(r.owner, r.len())
                }
                Owner::Op { op } | Owner::Fence { op, .. } => self.finish_op(op, Ok(None)),
                Owner::Fenced { .. } => {}
                Owner::Atomic { op, slot, fetch } => {
                    debug_assert!(matches!(
                        wc.opcode,
                        WcOpcode::FetchAdd | WcOpcode::CompareSwap
                    ));
                    let mut v = [0u8; 8];
                    self.iface.results.read_to(slot, 0, &mut v);
                    self.iface.results.give(slot);
                    let found = u64::from_le_bytes(v);
                    self.finish_op(op, Ok(fetch.then_some(found)));
                }
            },
        }
    }

    /// A message's body is no longer needed: its slot goes back, a user
    /// buffer's registration goes back to the cache and the buffer to its
    /// owner (dropped outside the lock: its drop is user code).
    pub(crate) fn let_go(&mut self, store: Store) {
        match store {
            Store::Slot(s) => self.iface.bounce.give(s),
            Store::Heap(_) | Store::Small { .. } => {}
            Store::User { slot, data, reg } => {
                if let Some(s) = slot {
                    self.iface.bounce.give(s);
                }
                self.regs.cache.release(reg);
                self.deliver(Delivery::Release(data));
            }
        }
    }

    /// Puts work that failed with its path back into its queue, in order,
    /// or drops it when its endpoint is gone or it failed too often.
    pub(super) fn requeue(&mut self, ei: u32, mut item: Item) {
        if item.is_credit() {
            // Credits belong to the connection that failed.
            if let Work::Msg(m) = item.work {
                self.let_go(m.store);
            }
            self.eps.get_mut(ei).credits = Default::default();
            return;
        }
        if let Work::Rdma(Rdma { owner, .. }) = item.work {
            match owner {
                // Never written again on another connection: the receiver
                // may have delivered and reused the sink. The rendezvous
                // resumes (or, its endpoint gone, fails with it).
                Owner::RndvOut { msg } => return self.rndv.write_lost(msg),
                // Executed there perhaps, its answer lost: an atomic is not
                // done twice. Its outcome is unknown, and the user is told.
                Owner::Atomic { .. } => {
                    return self.drop_item(ei, item, BtlError::Transfer(WcStatus::WrFlush))
                }
                // On iWARP the peer's TERMINATE names no culprit: a write or
                // read whose key the peer refuses breaks the connection
                // again each time it is posted, with everything else on
                // it. The user's operation in flight at a second break
                // fails instead (whether a write landed is unknown).
                Owner::Op { .. } | Owner::Fence { .. }
                    if item.tries >= 1
                        && self.iface.caps.transport == xrcbtl_fabric::Transport::Iwarp =>
                {
                    return self.drop_item(ei, item, BtlError::Transfer(WcStatus::WrFlush));
                }
                // Its fence, flushed behind it, brings it back; a fence
                // not yet posted follows it again from the queue.
                Owner::Fenced { op } if !self.fence_waits(ei, op) => return,
                Owner::RndvIn { .. }
                | Owner::Op { .. }
                | Owner::Fence { .. }
                | Owner::Fenced { .. } => {}
            }
        }
        // A fence goes again with its write before it, in the order just
        // before the fence's.
        let rewrite = match &item.work {
            Work::Rdma(r) => r.refenced(),
            Work::Msg(_) => None,
        };
        item.tries += 1;
        if let EpState::Gone(e) = &self.eps.get(ei).state {
            let e = e.clone();
            return self.drop_item(ei, item, e);
        }
        if item.tries > MAX_TRIES {
            let e = BtlError::Transfer(WcStatus::RetryExceeded);
            if matches!(item.work, Work::Msg(_)) {
                // A message given up leaves a hole in its sequence, which
                // the peer would wait on forever: the endpoint fails, and
                // the user hears of it.
                self.drop_item(ei, item, e.clone());
                return self.fail_endpoint(ei, e);
            }
            return self.drop_item(ei, item, e);
        }
        self.stats.retransmits += 1;
        if let Some(write) = rewrite {
            let write = Item {
                order: item.order - 1,
                tries: item.tries,
                work: Work::Rdma(write),
            };
            self.eps.requeue(ei, write);
        }
        self.eps.requeue(ei, item);
    }

    /// Whether the fence of operation `op` waits in endpoint `ei`'s
    /// queue (never posted).
    pub(super) fn fence_waits(&self, ei: u32, op: u64) -> bool {
        self.eps.get(ei).pending.iter().any(|i| {
            matches!(i.work, Work::Rdma(Rdma { owner: Owner::Fence { op: o, .. }, .. }) if o == op)
        })
    }

    /// Work that will never be done: fail what it belongs to.
    pub(super) fn drop_item(&mut self, ei: u32, item: Item, e: BtlError) {
        let peer = self.eps.get(ei).rank;
        match item.work {
            Work::Msg(m) => {
                let mut body = [0u8; wire::CONTROL_MAX];
                let n = (m.len as usize).min(body.len());
                m.store.copy_to(&self.iface.bounce, &mut body[..n]);
                self.let_go(m.store);
                if m.kind != Kind::Credit {
                    self.stats.lost += 1;
                }
                if let Some(ctl) = Control::decode(m.kind, &body[..n]) {
                    self.rndv.on_control_lost(peer, ctl, e);
                }
            }
            Work::Rdma(r) => match r.owner {
                Owner::RndvIn { .. } | Owner::RndvOut { .. } => {
                    self.rndv.on_rdma_failed(r.owner, e)
                }
                Owner::Op { op } | Owner::Fenced { op } | Owner::Fence { op, .. } => {
                    self.finish_op(op, Err(e))
                }
                Owner::Atomic { op, slot, .. } => {
                    self.iface.results.give(slot);
                    self.finish_op(op, Err(e));
                }
            },
        }
    }

    /// An operation ended: its callback runs at delivery.
    pub fn finish_op(&mut self, op: u64, result: OpResult) {
        if let Some((cb, result)) = self.ops.finish(op, result) {
            self.deliver(Delivery::Done { op, result, cb });
        }
    }

    /// The endpoint to `rank` is gone for good.
    pub fn fail_rank(&mut self, rank: Rank, e: BtlError) {
        if let Some(ei) = self.eps.find(rank) {
            self.fail_endpoint(ei, e);
        }
    }

    /// The endpoint is gone for good: everything to and from it fails, and
    /// unless it closed (the peer left cleanly, or this rank deleted it) its
    /// error callbacks run.
    pub fn fail_endpoint(&mut self, ei: u32, e: BtlError) {
        let ep = self.eps.get_mut(ei);
        if matches!(ep.state, EpState::Gone(_)) {
            return;
        }
        ep.state = EpState::Gone(e.clone());
        let rank = ep.rank;
        self.recv.forget(&mut self.pools, ei);
        for item in self.eps.drain(ei) {
            self.drop_item(ei, item, e.clone());
        }
        // Its work is in the log of the QP it is in flight on, and where
        // credits flow, messages that left wait in its path's.
        let ep = self.eps.get(ei);
        let (at, path) = (ep.flight_slot, ep.path.as_ref().map(|p| p.slot));
        let mut taken = self.sends.take(&mut self.eps, at, |p| p.ep == ei);
        if path != at {
            taken.extend(self.sends.take(&mut self.eps, path, |p| p.ep == ei));
        }
        for p in taken {
            if p.left {
                // Sent, arrived or not: nothing more is owed to it.
                self.let_go_kept(p.item);
            } else {
                self.drop_item(ei, p.item, e.clone());
            }
        }
        self.rndv.fail_peer(rank, &e);
        for op in self.ops.of_peer(rank) {
            self.finish_op(op, Err(e.clone()));
        }
        self.run_rndv();
        if !matches!(e, BtlError::Closed(_)) {
            self.deliver(Delivery::Failed { rank, err: e });
        }
    }
}

/// A message that left and is kept until it arrives gives its bounce slot
/// back when slots run short: its body moves to the heap. Else peers that
/// return no credits for a while (half of them are owed before any goes
/// back) could hold every slot.
#[inline]
fn spare_slot<C: Context>(iface: &mut Iface<C>, item: &mut Item) {
    if let Work::Msg(m) = &mut item.work {
        if let Store::Slot(s) = m.store {
            if iface.bounce.free() < iface.bounce.count() / 4 {
                let mut body = vec![0u8; m.len as usize];
                iface.bounce.read_to(s, HEADER, &mut body);
                iface.bounce.give(s);
                m.store = Store::Heap(body);
            }
        }
    }
}
