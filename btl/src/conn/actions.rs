//! What the manager asks, done on the fabric: one short function per
//! action, grouped by what it acts on (QPs, TGT QPs, CM ids), and the QPs
//! that only lend their numbers to QP-less requests.

use std::time::Duration;

use xrcbtl_fabric::{
    CmChannel, CmId, Context, Qp, QpCaps, QpInit, QpTransition, QpType, Result, SendWr,
};
use xrcbtl_xrc_conn::{
    Action, CmFailure, CmRef, Event, Mode, QpKind, QpRef, Rank, RouteRef, TgtRef,
};

use crate::wr_id;

use super::drain::{stop_rc, Draining, LAST_WQE_WAIT};
use super::slots::Slot;
use super::{port_space, ConnDriver, ConnEvent};

impl<C: Context> ConnDriver<C> {
    /// Does one thing the manager asks.
    pub(super) fn execute(&mut self, now: Duration, a: Action) {
        match a {
            Action::CreateQp { qp, kind, sq_depth } => self.create_qp(now, qp, kind, sq_depth),
            Action::ResizeQp { qp, sq_depth } => self.resize_qp(qp, sq_depth),
            Action::DestroyQp { qp } => self.destroy_qp(now, qp),
            Action::SendHello { qp } => self.send_hello(now, qp),
            Action::CreateTgt { tgt } => self.create_tgt(now, tgt),
            Action::OpenTgt { tgt, qpn } => self.open_tgt(now, tgt, qpn),
            Action::CloseTgt { tgt } => self.close_tgt(tgt),
            Action::BreakTgt { tgt } => {
                if let Some(q) = self.tgts.get(tgt) {
                    // A TGT QP that cannot be moved to the error state is
                    // already broken or gone: nothing more to do.
                    let _ = q.modify(&QpTransition::Error);
                }
            }
            Action::Resolve { cm, rank, route } => self.resolve(now, cm, rank, route),
            Action::Connect { cm, qp, data } => self.connect_cm(now, cm, qp, &data),
            Action::Accept { cm, qp, tgt, data } => self.accept(now, cm, qp, tgt, &data),
            Action::Reject { cm, data } => {
                if let Some(id) = self.cms.get(cm) {
                    // A request whose id is gone needs no answer.
                    let _ = id.reject(&data);
                }
            }
            Action::DestroyCm { cm } => self.destroy_cm(cm),
        }
    }

    /// Makes the QP the manager calls `qp` and puts it in a slot.
    pub(super) fn create_qp(&mut self, now: Duration, qp: QpRef, kind: QpKind, sq_depth: u32) {
        let caps = self.ctx.caps();
        let qcaps = QpCaps {
            max_send_wr: sq_depth.clamp(1, caps.max_qp_wr),
            max_recv_wr: 0,
            // A header from a bounce slot and a body from the sender's
            // memory (zero-copy eager).
            max_send_sge: 2.min(caps.max_sge).max(1),
            max_recv_sge: 0,
            max_inline: self.max_inline,
        };
        let (qp_type, srq) = match kind {
            QpKind::Ini => (QpType::XrcIni, None),
            QpKind::Rc => (QpType::Rc, Some(&self.rc_srq)),
        };
        let init = QpInit {
            qp_type,
            send_cq: &self.send_cq,
            recv_cq: Some(&self.recv_cq),
            srq,
            caps: qcaps,
        };
        // Left in RESET: the CM moves it to INIT with the port and P_Key of
        // the route it resolved, and grants the remote access the
        // connection's read depths allow.
        match self.ctx.create_qp(&self.pd, &init) {
            Ok(q) => {
                let num = q.qp_num();
                let slot = Slot {
                    caps: q.caps(),
                    qp: q,
                    r: qp,
                    last_wqe: false,
                    wired: false,
                    peer: None,
                };
                self.slots.insert(num, slot);
                self.qp_gen += 1;
            }
            Err(_) => self.mgr.handle(now, Event::QpCreateFailed { qp }),
        }
    }

    pub(super) fn resize_qp(&mut self, qp: QpRef, sq_depth: u32) {
        if let Some(s) = self.slots.of_ref_mut(qp) {
            if s.qp.resize_send_queue(sq_depth).is_err() {
                self.stats.resize_unsupported += 1;
            }
            // Only what the device says now is believed.
            s.caps = s.qp.caps();
        }
    }

    pub(super) fn destroy_qp(&mut self, now: Duration, qp: QpRef) {
        let Some((slot, qpn, s)) = self.slots.remove(qp) else {
            return;
        };
        self.qp_gen += 1;
        // The core clears what its endpoints kept of the QP: nothing to
        // clear for one that never carried anything (a storm drops
        // thousands).
        if s.wired {
            self.events.push_back(ConnEvent::Destroyed {
                slot,
                qpn,
                peer: s.peer,
            });
        }
        if s.qp.qp_type() == QpType::Rc {
            // Drawing from the SRQ: stop it, and destroy it once its last
            // receive is in the CQ and polled.
            let stopped = stop_rc(&s.qp, s.wired);
            self.draining.insert(
                qpn,
                Draining {
                    _qp: s.qp,
                    last_wqe: s.last_wqe || !stopped,
                    deadline: now + LAST_WQE_WAIT,
                },
            );
        }
    }

    pub(super) fn send_hello(&mut self, now: Duration, qp: QpRef) {
        if let Some((_, s)) = self.slots.of_ref(qp) {
            if s.qp.post_send(&SendWr::send(wr_id::HELLO, &[])).is_err() {
                let r = s.r;
                self.mgr.handle(now, Event::QpFailed { qp: r });
            }
        }
    }

    pub(super) fn create_tgt(&mut self, now: Duration, tgt: TgtRef) {
        let made = self.xrcd.as_ref().map(|x| self.ctx.create_tgt_qp(x));
        match made {
            Some(Ok(q)) => {
                let qpn = q.qp_num();
                self.hold_tgt(tgt, q);
                self.mgr.handle(now, Event::TgtCreated { tgt, qpn });
            }
            _ => self.mgr.handle(now, Event::TgtCreateFailed { tgt }),
        }
    }

    pub(super) fn open_tgt(&mut self, now: Duration, tgt: TgtRef, qpn: u32) {
        let opened = self.xrcd.as_ref().map(|x| self.ctx.open_tgt_qp(x, qpn));
        let ok = match opened {
            Some(Ok(q)) => {
                self.hold_tgt(tgt, q);
                true
            }
            _ => false,
        };
        self.mgr.handle(now, Event::TgtOpened { tgt, ok });
    }

    /// Holds the TGT QP the manager calls `tgt`.
    pub(super) fn hold_tgt(&mut self, tgt: TgtRef, q: C::Qp) {
        self.tgts.insert(tgt, q);
        self.qp_gen += 1;
    }

    pub(super) fn close_tgt(&mut self, tgt: TgtRef) {
        if self.tgts.remove(tgt).is_some() {
            self.qp_gen += 1;
        }
    }

    /// Makes a CM id for `cm` and resolves `rank`'s address (or its GID),
    /// through a route already resolved to its node when there is one.
    pub(super) fn resolve(
        &mut self,
        now: Duration,
        cm: CmRef,
        rank: Rank,
        route: Option<RouteRef>,
    ) {
        let Some(addr) = self.directory.addr(rank) else {
            return self.mgr.handle(now, Event::ResolveFailed { cm });
        };
        let id = match self.ch.create_id(port_space(self.mode)) {
            Ok(id) => id,
            Err(_) => return self.mgr.handle(now, Event::ResolveFailed { cm }),
        };
        let cached = route.and_then(|r| self.directory.route(r));
        let by_gid = self
            .listener_ib
            .is_some()
            .then(|| self.directory.ib(rank))
            .flatten();
        let started = match (by_gid, cached) {
            // Both ends speak AF_IB: the GID is the address.
            (Some(dst), r) => id.resolve_ib(*dst, r, 2_000),
            (None, Some(r)) => id.resolve_cached(addr, r, 2_000),
            (None, None) => id.resolve_addr(addr, 2_000),
        };
        self.cms.insert(cm, id, Some(rank));
        if started.is_err() {
            self.mgr.handle(now, Event::ResolveFailed { cm });
        }
    }

    /// Connects `cm` with `qp` (or, QP-less, with a number lent to it).
    pub(super) fn connect_cm(&mut self, now: Duration, cm: CmRef, qp: Option<QpRef>, data: &[u8]) {
        let mut param = self.conn.param(data);
        if qp.is_none() {
            param.qp_num = self.lend_number(cm);
        }
        self.wire(qp);
        let q = qp.and_then(|q| self.slots.of_ref(q)).map(|(_, s)| &s.qp);
        let r = self.cms.get(cm).map(|id| id.connect(q, &param));
        if !matches!(r, Some(Ok(()))) {
            self.mgr.handle(
                now,
                Event::Failed {
                    cm,
                    how: CmFailure::Unreachable,
                    data: Vec::new(),
                },
            );
        }
    }

    /// Accepts the request `cm` with `qp` or the TGT QP `tgt` (or neither).
    pub(super) fn accept(
        &mut self,
        now: Duration,
        cm: CmRef,
        qp: Option<QpRef>,
        tgt: Option<TgtRef>,
        data: &[u8],
    ) {
        self.wire(qp);
        let q = qp
            .and_then(|q| self.slots.of_ref(q))
            .map(|(_, s)| &s.qp)
            .or_else(|| tgt.and_then(|t| self.tgts.get(t)));
        let param = self.conn.param(data);
        if let Some(q) = q {
            self.accepting.insert(q.qp_num(), cm);
        }
        let r = self.cms.get(cm).map(|id| id.accept(q, &param));
        if !matches!(r, Some(Ok(()))) {
            self.mgr.handle(now, Event::Disconnected { cm });
        }
    }

    pub(super) fn destroy_cm(&mut self, cm: CmRef) {
        // Its carrier QP goes after its id: the CM lets go of the QP first.
        if self.cms.remove(cm) {
            self.accepting.forget(cm);
        }
        self.placeholders.give_back(cm);
    }
    /// A QP number of its own for the QP-less request `cm`: on the IB CM a
    /// placeholder's (0 if none could be made), on iWARP a QP made for
    /// this request alone (0 if none could be made: the request then
    /// fails at once, as it would have without one).
    pub(super) fn lend_number(&mut self, cm: CmRef) -> u32 {
        if !self.ctx.caps().transport.is_ib_family() {
            return self.carry(cm);
        }
        let Some(node) = self.cms.rank(cm).and_then(|r| self.directory.node(r)) else {
            return 0;
        };
        let (ctx, pd, cq, srq, mode) =
            (&self.ctx, &self.pd, &self.send_cq, &self.rc_srq, self.mode);
        let make = || Self::number_qp(ctx, pd, cq, srq, mode);
        let qpn = self.placeholders.lend(cm, node, make).unwrap_or(0);
        // The pool never shrinks: its size is how many were made.
        self.stats.placeholder_qps = self.placeholders.made() as u64;
        qpn
    }

    /// iWARP: a fresh QP for the request `cm` to connect with (the iWARP
    /// CM binds the connection to a QP; rejected, it leaves the QP unfit
    /// for another), kept until the request's id is destroyed.
    pub(super) fn carry(&mut self, cm: CmRef) -> u32 {
        match Self::number_qp(&self.ctx, &self.pd, &self.send_cq, &self.rc_srq, self.mode) {
            Ok(qp) => {
                let n = qp.qp_num();
                self.cms.carry(cm, qp);
                self.stats.carrier_qps += 1;
                n
            }
            Err(_) => 0,
        }
    }

    /// A QP that only lends its number to a QP-less request: never
    /// connected, never posted to.
    pub(super) fn number_qp(
        ctx: &C,
        pd: &C::Pd,
        cq: &C::Cq,
        srq: &C::Srq,
        mode: Mode,
    ) -> Result<C::Qp> {
        let caps = QpCaps {
            max_send_wr: 1,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline: 0,
        };
        let (qp_type, srq) = match mode {
            Mode::Xrc => (QpType::XrcIni, None),
            Mode::Rc { .. } => (QpType::Rc, Some(srq)),
        };
        ctx.create_qp(
            pd,
            &QpInit {
                qp_type,
                send_cq: cq,
                recv_cq: Some(cq),
                srq,
                caps,
            },
        )
    }
}
