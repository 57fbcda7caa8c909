//! What the fabric reports, turned into the manager's events: async
//! events (a QP or TGT QP broken, an RTU that may have been lost, a QP's
//! last receive) and CM events (requests, resolutions, establishment,
//! rejections, disconnections).

use std::time::Duration;

use xrcbtl_fabric::{AsyncEvent, CmEventKind, CmId, Context, RejectReason};
use xrcbtl_xrc_conn::{CmFailure, CmRef, Event, RouteRef};

use super::{CmIdOf, ConnDriver, ConnEvent};

impl<C: Context> ConnDriver<C> {
    pub(super) fn on_async(&mut self, now: Duration, ev: AsyncEvent) {
        if let AsyncEvent::SrqLimitReached { srq } = ev {
            self.events.push_back(ConnEvent::SrqLimit { srq });
            return;
        }
        if let AsyncEvent::CommEstablished { qpn } = ev {
            // The RTU may have been lost: the peer is sending already.
            if let Some(id) = self.accepting.take_qpn(qpn).and_then(|cm| self.cms.get(cm)) {
                self.stats.comm_est_notices += 1;
                // An id the CM no longer thinks is accepting needs nothing.
                let _ = id.notify_established();
            }
            return;
        }
        let qpn = match ev {
            AsyncEvent::QpFatal { qpn }
            | AsyncEvent::QpRequestError { qpn }
            | AsyncEvent::QpAccessError { qpn }
            | AsyncEvent::QpLastWqeReached { qpn } => qpn,
            _ => return,
        };
        if let Some(d) = self.draining.get_mut(&qpn) {
            if matches!(ev, AsyncEvent::QpLastWqeReached { .. }) {
                d.last_wqe = true;
            }
            return;
        }
        if let Some(tgts) = self.tgts.of_num(qpn) {
            for &tgt in tgts {
                self.mgr.handle(now, Event::TgtFailed { tgt });
            }
        } else if let Some(s) = self.slots.of_num_mut(qpn) {
            if matches!(ev, AsyncEvent::QpLastWqeReached { .. }) {
                s.last_wqe = true;
            } else {
                let qp = s.r;
                self.mgr.handle(now, Event::QpFailed { qp });
            }
        }
    }

    pub(super) fn on_cm_event(&mut self, now: Duration, ev: xrcbtl_fabric::CmEvent<CmIdOf<C>>) {
        if ev.kind == CmEventKind::ConnectRequest {
            let Some(id) = ev.new_id else { return };
            let cm = CmRef(self.fresh());
            self.cms.insert(cm, id, None);
            self.mgr.handle(
                now,
                Event::Request {
                    cm,
                    data: ev.private_data,
                    from: ev.peer,
                },
            );
            return;
        }
        let Some(cm) = self.cms.of_key(ev.id) else {
            return;
        };
        let fail = |how| Event::Failed {
            cm,
            how,
            data: Vec::new(),
        };
        let out = match ev.kind {
            CmEventKind::AddrResolved => {
                let r = self.cms.get(cm).map(|id| id.resolve_route(2_000));
                match r {
                    Some(Ok(())) => return,
                    _ => Event::ResolveFailed { cm },
                }
            }
            CmEventKind::RouteResolved => {
                let route = self.cms.get(cm).and_then(|id| id.route());
                let node = self.cms.rank(cm).and_then(|r| self.directory.node(r));
                let rref = match (route, node) {
                    (Some(route), Some(node)) => {
                        let next = &mut self.next_ref;
                        self.directory.keep_route(node, route, || {
                            *next += 1;
                            RouteRef(*next)
                        })
                    }
                    _ => RouteRef(0),
                };
                Event::Resolved { cm, route: rref }
            }
            CmEventKind::AddrError | CmEventKind::RouteError => Event::ResolveFailed { cm },
            CmEventKind::Established => {
                self.accepting.forget(cm);
                Event::Established {
                    cm,
                    data: ev.private_data,
                }
            }
            CmEventKind::Rejected(RejectReason::Consumer) => Event::Failed {
                cm,
                how: CmFailure::Rejected,
                data: ev.private_data,
            },
            CmEventKind::Rejected(RejectReason::NoListener) => fail(CmFailure::NoListener),
            CmEventKind::Rejected(RejectReason::StaleConnection) => fail(CmFailure::Stale),
            CmEventKind::Rejected(_) | CmEventKind::Unreachable | CmEventKind::ConnectError => {
                fail(CmFailure::Unreachable)
            }
            CmEventKind::Disconnected => Event::Disconnected { cm },
            CmEventKind::ConnectRequest => return,
        };
        self.mgr.handle(now, out);
    }
}
