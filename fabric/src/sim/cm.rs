//! The simulated RDMA CM: address and route resolution, the IB CM exchange
//! (REQ/REP/RTU, REJ, DREQ/DREP) with timeouts, retries and duplicate
//! detection, and the QP transitions the CM performs.
//!
//! On iWARP devices the same exchange stands for the MPA request/reply; the
//! QP accepted on the passive side is marked as the MPA responder, which may
//! not send before it has heard from the initiator.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

use super::arena::Id;
use super::faults::{CmAction, CmMsgKind};
use super::world::{
    CmChannelObj, CmIdObj, CmState, Ctx, DevIdx, Event, PendingCmEvent, QpObj, ReqInfo, World,
};
use crate::cm::{
    max_private_data, CmEventKind, CmMessage, ConnParam, PortSpace, QpTimers, RejectReason,
};
use crate::types::*;
use crate::{Error, Result};

/// The RNR NAK timer the IB CM gives responders (cm_init_qp_rtr_attr):
/// 0, which IBA reads as 655.36 ms.
pub(crate) const CM_MIN_RNR_TIMER: u8 = 0;

/// A CM message on the wire.
#[derive(Clone)]
pub(crate) enum CmWire {
    Req {
        qpn: Option<u32>,
        psn: u32,
        private: Vec<u8>,
        ps: PortSpace,
        retry: u8,
        rnr_retry: u8,
        from_addr: SocketAddrV4,
    },
    Rep {
        qpn: Option<u32>,
        psn: u32,
        private: Vec<u8>,
        /// RNR retries the initiator's QP makes (the acceptor's parameter).
        rnr_retry: u8,
    },
    Rtu,
    Rej {
        reason: RejectReason,
        private: Vec<u8>,
    },
    Dreq,
    Drep,
}

impl CmWire {
    fn kind(&self) -> CmMsgKind {
        match self {
            CmWire::Req { .. } => CmMsgKind::Req,
            CmWire::Rep { .. } => CmMsgKind::Rep,
            CmWire::Rtu => CmMsgKind::Rtu,
            CmWire::Rej { .. } => CmMsgKind::Rej,
            CmWire::Dreq => CmMsgKind::Dreq,
            CmWire::Drep => CmMsgKind::Drep,
        }
    }
}

/// Where a CM message goes: a listening address, or an id the sender knows.
#[derive(Clone, Copy)]
pub(crate) enum CmDest {
    Listener(SocketAddrV4),
    Id(Id<CmIdObj>),
}

pub(crate) struct CmDelivery {
    from: Id<CmIdObj>,
    from_dev: DevIdx,
    to_dev: DevIdx,
    to: CmDest,
    msg: CmWire,
}

fn v4(addr: SocketAddr) -> Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(Error::invalid("the simulated fabric uses IPv4 addresses")),
    }
}

impl World {
    // ---- objects -----------------------------------------------------------

    pub(crate) fn create_cm_channel(&mut self, ctx: Id<Ctx>) -> Result<Id<CmChannelObj>> {
        self.ctx(ctx)?;
        Ok(self.channels.insert(CmChannelObj {
            ctx,
            events: Default::default(),
        }))
    }

    /// Destroys a channel and the ids its undelivered connect requests
    /// created (nobody can accept them any more).
    pub(crate) fn destroy_cm_channel(&mut self, ch: Id<CmChannelObj>) {
        let Some(c) = self.channels.remove(ch) else {
            return;
        };
        for ev in c.events {
            if let Some(id) = ev.new_id {
                self.destroy_cm_id(id);
            }
        }
    }

    pub(crate) fn create_cm_id(
        &mut self,
        ch: Id<CmChannelObj>,
        ps: PortSpace,
    ) -> Result<Id<CmIdObj>> {
        let ctx = self.channels.get(ch).ok_or(Error::ProcessGone)?.ctx;
        Ok(self.cm_ids.insert(CmIdObj {
            ctx,
            channel: ch,
            ps,
            state: CmState::Idle,
            local: None,
            remote: None,
            remote_dev: None,
            qp: None,
            peer_id: None,
            listener: None,
            children: Default::default(),
            last_sent: None,
            retries: 0,
            timer_gen: 0,
            psn: 0,
            req: None,
            route_cached: false,
            timers: QpTimers::default(),
            stale_key: None,
        }))
    }

    pub(crate) fn destroy_cm_id(&mut self, id: Id<CmIdObj>) {
        let Some(c) = self.cm_ids.get(id) else { return };
        match c.state {
            CmState::Listening => {
                if let Some(a) = c.local {
                    self.listeners.remove(&a);
                }
            }
            CmState::RequestReceived => {
                let msg = CmWire::Rej {
                    reason: RejectReason::Consumer,
                    private: self.pad(id, CmMessage::Reject, &[]),
                };
                self.send_to_peer(id, msg);
            }
            CmState::Established | CmState::Accepting => self.send_to_peer(id, CmWire::Dreq),
            // The IB CM rejects (reason: timeout) a request whose id goes
            // away before the reply: the peer does not wait for an RTU.
            CmState::Connecting => {
                if let (Some(r), Some(dev)) = (c.remote, c.remote_dev) {
                    let msg = CmWire::Rej {
                        reason: RejectReason::Timeout,
                        private: Vec::new(),
                    };
                    self.send_cm(id, dev, CmDest::Listener(r), msg);
                }
            }
            _ => {}
        }
        let c = self.cm_ids.remove(id).expect("present");
        if let Some(k) = c.stale_key {
            if self.remote_qpns.get(&k) == Some(&id) {
                self.remote_qpns.remove(&k);
            }
        }
        if let Some(l) = c.listener.and_then(|l| self.cm_ids.get_mut(l)) {
            // A child is filed under the id that asked (its peer): found
            // at once, not by a look through every child (a listener has
            // one per connection it accepted).
            match c.peer_id {
                Some(from) if l.children.get(&from) == Some(&id) => {
                    l.children.remove(&from);
                }
                _ => l.children.retain(|_, child| *child != id),
            }
        }
        if let Some(q) = c.qp.and_then(|q| self.qps.get_mut(q)) {
            q.cm_id = None;
        }
        // Orphaned children of a listener stay with their owners.
        for child in c.children.values() {
            if let Some(ch) = self.cm_ids.get_mut(*child) {
                ch.listener = None;
            }
        }
    }

    fn cm(&self, id: Id<CmIdObj>) -> Result<&CmIdObj> {
        self.cm_ids.get(id).ok_or(Error::ProcessGone)
    }

    fn cm_transport(&self, id: Id<CmIdObj>) -> Result<Transport> {
        let c = self.cm(id)?;
        Ok(self.devs[self.ctx_dev(c.ctx)?].caps.transport)
    }

    /// The iWARP CM connects and accepts only with a QP: without one
    /// given, `qp_num` must name an RC QP of the device not yet past RTR
    /// (`iw_cm_connect` and `iw_cm_accept` look it up and fail with EINVAL
    /// when there is none; the provider refuses a QP already in use). A
    /// QP-less request, which the IB CM carries, cannot be made on iWARP.
    fn iwarp_needs_qp(&self, id: Id<CmIdObj>, qp_num: u32, what: &str) -> Result<()> {
        if self.cm_transport(id)? != Transport::Iwarp {
            return Ok(());
        }
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        let usable = self.devs[dev]
            .qps
            .get(&qp_num)
            .and_then(|q| self.qps.get(*q))
            .is_some_and(|q| {
                q.ty == QpType::Rc
                    && matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr)
            });
        if usable {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "iWARP {what} without a QP: the iWARP CM needs one, and qp_num {qp_num} names no \
             unused RC QP of the device (EINVAL)"
        )))
    }

    fn expect_state(&self, id: Id<CmIdObj>, want: CmState, what: &str) -> Result<()> {
        let s = self.cm(id)?.state;
        if s != want {
            return Err(Error::state(format!("{what} in CM state {s:?}")));
        }
        Ok(())
    }

    /// Private data as the peer receives it: IB CM messages have fixed-size
    /// private data, zero-padded; MPA carries the exact length.
    fn pad(&self, id: Id<CmIdObj>, msg: CmMessage, data: &[u8]) -> Vec<u8> {
        let Ok(c) = self.cm(id) else {
            return data.to_vec();
        };
        let Ok(t) = self.cm_transport(id) else {
            return data.to_vec();
        };
        let mut v = data.to_vec();
        if t.is_ib_family() {
            v.resize(max_private_data(t, c.ps, msg).max(data.len()), 0);
        }
        v
    }

    /// The peer's QP number as the CM event reports it: MPA carries none.
    fn qpn_on_wire(&self, id: Id<CmIdObj>, qpn: Option<u32>) -> Option<u32> {
        match self.cm_transport(id) {
            Ok(Transport::Iwarp) => None,
            _ => qpn,
        }
    }

    fn check_private(&self, id: Id<CmIdObj>, msg: CmMessage, data: &[u8]) -> Result<()> {
        let t = self.cm_transport(id)?;
        let max = max_private_data(t, self.cm(id)?.ps, msg);
        if data.len() > max {
            return Err(Error::invalid(format!(
                "{} bytes of private data exceed the {msg:?} limit of {max} on {t}",
                data.len()
            )));
        }
        Ok(())
    }

    pub(crate) fn post_cm_event(&mut self, id: Id<CmIdObj>, ev: PendingCmEvent) {
        let Some(c) = self.cm_ids.get(id) else {
            // Nobody can accept a request whose listener is gone.
            if let Some(new) = ev.new_id {
                self.destroy_cm_id(new);
            }
            return;
        };
        let ch = c.channel;
        if let Some(ch) = self.channels.get_mut(ch) {
            ch.events.push_back(ev);
            self.stats.cm_events += 1;
            let ctx = ch.ctx;
            self.touch(ctx);
        } else if let Some(new) = ev.new_id {
            self.destroy_cm_id(new);
        }
    }

    fn simple_event(&mut self, id: Id<CmIdObj>, kind: CmEventKind, private_data: Vec<u8>) {
        self.post_cm_event(
            id,
            PendingCmEvent {
                id,
                kind,
                private_data,
                remote_qpn: None,
                peer: None,
                new_id: None,
            },
        );
    }

    /// ESTABLISHED on `id`, naming the peer's QP `qpn` as the wire shows
    /// it.
    fn established_event(&mut self, id: Id<CmIdObj>, qpn: Option<u32>, private_data: Vec<u8>) {
        let remote_qpn = self.qpn_on_wire(id, qpn);
        self.post_cm_event(
            id,
            PendingCmEvent {
                id,
                kind: CmEventKind::Established,
                private_data,
                remote_qpn,
                peer: None,
                new_id: None,
            },
        );
    }

    fn arm_cm_timer(&mut self, id: Id<CmIdObj>) {
        let Some(c) = self.cm_ids.get_mut(id) else {
            return;
        };
        c.timer_gen += 1;
        let gen = c.timer_gen;
        let t = self.cfg.timing.cm_timeout_ns;
        self.schedule_in(t, Event::CmTimer { id, gen });
    }

    fn cancel_cm_timer(&mut self, id: Id<CmIdObj>) {
        if let Some(c) = self.cm_ids.get_mut(id) {
            c.timer_gen += 1;
        }
    }

    // ---- sending -------------------------------------------------------------

    fn send_cm(&mut self, from: Id<CmIdObj>, to_dev: DevIdx, to: CmDest, msg: CmWire) {
        let Ok(from_dev) = self.cm(from).and_then(|c| self.ctx_dev(c.ctx)) else {
            return;
        };
        self.stats.cm_messages += 1;
        self.count_cm(from, |p| p.cm_sent += 1);
        if self.path_down(from_dev, to_dev) {
            self.stats.cm_dropped += 1;
            return;
        }
        let (a, b) = (self.devs[from_dev].node, self.devs[to_dev].node);
        let kind = msg.kind();
        let extra: &[u64] = match self.faults.cm_action(&mut self.rng, a, b, kind) {
            CmAction::Deliver => &[0],
            CmAction::Drop => {
                self.stats.cm_dropped += 1;
                &[]
            }
            CmAction::Delay(ns) => {
                self.stats.cm_delayed += 1;
                return self.deliver_cm(from, from_dev, to_dev, to, msg, ns);
            }
            CmAction::Duplicate => {
                self.stats.cm_duplicated += 1;
                &[0, 1_000]
            }
        };
        for &e in extra {
            self.deliver_cm(from, from_dev, to_dev, to, msg.clone(), e);
        }
    }

    /// Schedules a CM message's handling at the destination: after the
    /// wire latency (plus `extra`), and after the node's CM agent has
    /// finished the messages that arrived before it.
    fn deliver_cm(
        &mut self,
        from: Id<CmIdObj>,
        from_dev: DevIdx,
        to_dev: DevIdx,
        to: CmDest,
        msg: CmWire,
        extra: u64,
    ) {
        let node = self.devs[to_dev].node;
        let t = &self.cfg.timing;
        let arrive = self.now + t.cm_latency_ns + extra;
        let done = arrive.max(self.cm_busy_until[node]) + t.cm_processing_ns;
        self.cm_busy_until[node] = done;
        self.schedule(
            done,
            Event::Cm(Box::new(CmDelivery {
                from,
                from_dev,
                to_dev,
                to,
                msg,
            })),
        );
    }

    fn send_to_peer(&mut self, id: Id<CmIdObj>, msg: CmWire) {
        let Some(c) = self.cm_ids.get(id) else { return };
        let (Some(peer), Some(dev)) = (c.peer_id, c.remote_dev) else {
            return;
        };
        self.send_cm(id, dev, CmDest::Id(peer), msg);
    }

    /// Sends and remembers the message a timer may have to resend.
    fn send_reliable(&mut self, id: Id<CmIdObj>, to_dev: DevIdx, to: CmDest, msg: CmWire) {
        if let Some(c) = self.cm_ids.get_mut(id) {
            c.last_sent = Some(msg.clone());
            c.retries = 0;
        }
        self.send_cm(id, to_dev, to, msg);
        self.arm_cm_timer(id);
    }

    // ---- commands ------------------------------------------------------------

    pub(crate) fn cm_listen(
        &mut self,
        id: Id<CmIdObj>,
        addr: SocketAddr,
        _backlog: u32,
    ) -> Result<()> {
        self.expect_state(id, CmState::Idle, "listen")?;
        let mut a = v4(addr)?;
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        let ip = self.devs[dev].ip;
        if a.ip().is_unspecified() {
            a.set_ip(ip);
        } else if *a.ip() != ip {
            return Err(Error::invalid(format!(
                "{} is not an address of this device ({ip})",
                a.ip()
            )));
        }
        if a.port() == 0 {
            a.set_port(self.free_port(|p| SocketAddrV4::new(ip, p))?);
        }
        let node = self.devs[dev].node;
        if self.devs[dev].caps.transport == Transport::Iwarp
            && self.cfg.tcp_ports_held.contains(&(node, a.port()))
        {
            // The listener's TCP socket cannot bind: a socket the CM does
            // not know holds the port.
            return Err(Error::AddrInUse(format!("{a}: held by a TCP socket")));
        }
        self.bind_listener(id, a, || a.to_string())
    }

    /// Enters a listener in the table under `key` (an IP address, or an
    /// [`ib_key`]); `shown` names the address if it is taken.
    fn bind_listener(
        &mut self,
        id: Id<CmIdObj>,
        key: SocketAddrV4,
        shown: impl FnOnce() -> String,
    ) -> Result<()> {
        if self.listeners.contains_key(&key) {
            return Err(Error::AddrInUse(shown()));
        }
        self.listeners.insert(key, id);
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.local = Some(key);
        c.state = CmState::Listening;
        Ok(())
    }

    /// A native InfiniBand listener: kept in the listener table under a key
    /// no IP address takes (see [`ib_key`]), so that requests addressed by
    /// IP never reach it and requests addressed by GID reach nothing else.
    pub(crate) fn cm_listen_ib(
        &mut self,
        id: Id<CmIdObj>,
        addr: crate::cm::IbAddr,
        _backlog: u32,
    ) -> Result<()> {
        self.expect_state(id, CmState::Idle, "listen_ib")?;
        let dev = self.af_ib_dev(id)?;
        if addr.gid != self.devs[dev].gid {
            return Err(Error::invalid(format!(
                "GID {:?} is not this device's",
                addr.gid
            )));
        }
        if addr.pkey != crate::cm::DEFAULT_PKEY {
            return Err(Error::invalid(format!(
                "P_Key {:#x} is not in the port's table",
                addr.pkey
            )));
        }
        let port = if addr.port == 0 {
            self.free_port(|p| ib_key(dev, p))?
        } else {
            addr.port
        };
        self.bind_listener(id, ib_key(dev, port), || format!("AF_IB port {port}"))
    }

    /// Address resolution by GID: nothing goes to the wire (no ARP); a
    /// cached route also spares the path query.
    pub(crate) fn cm_resolve_ib(
        &mut self,
        id: Id<CmIdObj>,
        dst: crate::cm::IbAddr,
        route: Option<&crate::cm::CmRoute>,
        timeout_ms: u32,
    ) -> Result<()> {
        self.expect_state(id, CmState::Idle, "resolve_ib")?;
        let dev = self.af_ib_dev(id)?;
        let target = self.dev_by_gid(&PortAddr {
            lid: 0,
            gid: dst.gid,
        });
        if let (Some(r), Some(t)) = (route, target) {
            if r.dgid != self.devs[t].gid {
                return Err(Error::invalid("the cached route leads to another device"));
            }
        }
        let local = ib_key(dev, self.ephemeral_port());
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.local = Some(local);
        c.state = CmState::AddrResolving;
        c.route_cached = route.is_some();
        let (kind, next, delay) = match target {
            Some(t) if dst.pkey == crate::cm::DEFAULT_PKEY && !self.path_down(dev, t) => {
                let c = self.cm_ids.get_mut(id).expect("checked");
                c.remote = Some(ib_key(t, dst.port));
                c.remote_dev = Some(t);
                (CmEventKind::AddrResolved, CmState::AddrResolved, 1_000)
            }
            _ => (
                CmEventKind::AddrError,
                CmState::Idle,
                u64::from(timeout_ms.max(1)) * 1_000_000,
            ),
        };
        self.schedule_in(delay, Event::CmLocal { id, kind, next });
        Ok(())
    }

    /// The native InfiniBand address of a listener bound with `listen_ib`.
    pub(crate) fn cm_local_ib_addr(&self, id: Id<CmIdObj>) -> Option<crate::cm::IbAddr> {
        let a = self.cm_ids.get(id)?.local?;
        let dev = ib_key_dev(&a)?;
        Some(crate::cm::IbAddr {
            gid: self.devs.get(dev)?.gid,
            pkey: crate::cm::DEFAULT_PKEY,
            port: a.port(),
        })
    }

    /// The device of an id that may use `AF_IB`: one on an InfiniBand port.
    fn af_ib_dev(&self, id: Id<CmIdObj>) -> Result<DevIdx> {
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        if self.devs[dev].caps.transport != Transport::Infiniband {
            return Err(Error::Unsupported(
                "AF_IB addresses need an InfiniBand port (RoCE and iWARP route by IP)",
            ));
        }
        Ok(dev)
    }

    fn ephemeral_port(&mut self) -> u16 {
        self.next_port = self.next_port.wrapping_add(1).max(20000);
        self.next_port
    }

    /// An ephemeral port no listener holds at `key(port)`, as a kernel
    /// picks one: the counter is shared by every address and wraps after
    /// 45,536 ports, so in a job of more listeners than that it comes
    /// round to ports already bound.
    fn free_port(&mut self, key: impl Fn(u16) -> SocketAddrV4) -> Result<u16> {
        for _ in 0..=u16::MAX {
            let p = self.ephemeral_port();
            if !self.listeners.contains_key(&key(p)) {
                return Ok(p);
            }
        }
        Err(Error::AddrInUse("every ephemeral port".into()))
    }

    /// The address a listener is bound to (an IP address: an `AF_IB` id
    /// has none).
    pub(crate) fn cm_local_addr(&self, id: Id<CmIdObj>) -> Option<SocketAddr> {
        self.cm_ids
            .get(id)
            .and_then(|c| c.local)
            .filter(|a| ib_key_dev(a).is_none())
            .map(SocketAddr::V4)
    }

    pub(crate) fn cm_peer_addr(&self, id: Id<CmIdObj>) -> Option<SocketAddr> {
        self.cm_ids
            .get(id)
            .and_then(|c| c.remote)
            .filter(|a| ib_key_dev(a).is_none())
            .map(SocketAddr::V4)
    }

    pub(crate) fn cm_resolve_addr(
        &mut self,
        id: Id<CmIdObj>,
        dst: SocketAddr,
        timeout_ms: u32,
    ) -> Result<()> {
        self.expect_state(id, CmState::Idle, "resolve_addr")?;
        let dst = v4(dst)?;
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        let local = SocketAddrV4::new(self.devs[dev].ip, self.ephemeral_port());
        let target = self.dev_by_ip(*dst.ip());
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.local = Some(local);
        c.state = CmState::AddrResolving;
        let timeout_ns = u64::from(timeout_ms.max(1)) * 1_000_000;
        let Some(tdev) = target else {
            self.schedule_in(
                timeout_ns,
                Event::CmLocal {
                    id,
                    kind: CmEventKind::AddrError,
                    next: CmState::Idle,
                },
            );
            return Ok(());
        };
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.remote = Some(dst);
        c.remote_dev = Some(tdev);
        let pair = (self.devs[dev].node, self.devs[tdev].node);
        let cached = self.arp_cache.contains(&pair);
        let (kind, next, delay) = if cached {
            (CmEventKind::AddrResolved, CmState::AddrResolved, 1_000)
        } else if self.path_down(dev, tdev) {
            (CmEventKind::AddrError, CmState::Idle, timeout_ns)
        } else {
            self.stats.addr_resolutions += 1;
            self.pair_queries.entry(pair).or_default().arp += 1;
            self.arp_cache.insert(pair);
            (
                CmEventKind::AddrResolved,
                CmState::AddrResolved,
                self.cfg.timing.arp_ns,
            )
        };
        self.schedule_in(delay, Event::CmLocal { id, kind, next });
        Ok(())
    }

    pub(crate) fn cm_resolve_route(&mut self, id: Id<CmIdObj>, _timeout_ms: u32) -> Result<()> {
        self.expect_state(id, CmState::AddrResolved, "resolve_route")?;
        let t = self.cm_transport(id)?;
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.state = CmState::RouteResolving;
        let cached = c.route_cached;
        let pair = c
            .remote_dev
            .map(|r| (self.devs[dev].node, self.devs[r].node));
        let delay = if cached {
            self.stats.cached_routes += 1;
            1_000
        } else {
            self.stats.route_resolutions += 1;
            if let Some(pair) = pair {
                self.pair_queries.entry(pair).or_default().path += 1;
            }
            if t == Transport::Infiniband {
                self.cfg.timing.route_ib_ns
            } else {
                self.cfg.timing.route_eth_ns
            }
        };
        self.schedule_in(
            delay,
            Event::CmLocal {
                id,
                kind: CmEventKind::RouteResolved,
                next: CmState::RouteResolved,
            },
        );
        Ok(())
    }

    /// The route an id resolved.
    pub(crate) fn cm_route(&self, id: Id<CmIdObj>) -> Option<crate::cm::CmRoute> {
        let c = self.cm_ids.get(id)?;
        if !matches!(
            c.state,
            CmState::RouteResolved | CmState::Connecting | CmState::Established
        ) {
            return None;
        }
        let d = &self.devs[c.remote_dev?];
        Some(crate::cm::CmRoute {
            dgid: d.gid,
            dlid: d.lid,
            path: None,
        })
    }

    /// Address resolution from a cached route: no ARP, no path query.
    pub(crate) fn cm_resolve_cached(
        &mut self,
        id: Id<CmIdObj>,
        dst: SocketAddr,
        route: &crate::cm::CmRoute,
    ) -> Result<()> {
        self.expect_state(id, CmState::Idle, "resolve_cached")?;
        let dst = v4(dst)?;
        let target = self.dev_by_ip(*dst.ip());
        let by_gid = self.dev_by_gid(&PortAddr {
            lid: route.dlid,
            gid: route.dgid,
        });
        if target.is_none() || target != by_gid {
            return Err(Error::invalid(format!(
                "the cached route does not lead to {dst}"
            )));
        }
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        let local = SocketAddrV4::new(self.devs[dev].ip, self.ephemeral_port());
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.local = Some(local);
        c.remote = Some(dst);
        c.remote_dev = target;
        c.route_cached = true;
        c.state = CmState::AddrResolving;
        self.schedule_in(
            500,
            Event::CmLocal {
                id,
                kind: CmEventKind::AddrResolved,
                next: CmState::AddrResolved,
            },
        );
        Ok(())
    }

    /// Checks that a QP can be handed to the CM and moves it to INIT.
    fn cm_prepare_qp(&mut self, id: Id<CmIdObj>, qp: Id<QpObj>, allowed: &[QpType]) -> Result<()> {
        let dev = self.ctx_dev(self.cm(id)?.ctx)?;
        let q = self.qps.get(qp).ok_or(Error::ProcessGone)?;
        if q.dev != dev {
            return Err(Error::invalid(
                "the QP belongs to another device than the CM id",
            ));
        }
        if !allowed.contains(&q.ty) {
            return Err(Error::invalid(format!(
                "a {:?} QP cannot be used here",
                q.ty
            )));
        }
        if q.ty != QpType::Rc && self.cm(id)?.ps != PortSpace::Ib {
            return Err(Error::invalid(
                "XRC over the RDMA CM needs the IB port space",
            ));
        }
        // The kernel's CM grants remote writes, and reads and atomics when
        // the connection offers responder resources (rdma_cm always does).
        let mut access = Access::REMOTE_WRITE | Access::REMOTE_READ;
        if self.devs[dev].caps.atomics {
            access |= Access::REMOTE_ATOMIC;
        }
        match q.state {
            QpState::Reset => {
                self.modify_qp(qp, &QpTransition::Init(InitAttr { port: 1, access }), true)?
            }
            QpState::Init => {
                // The CM does not move it again: the port and P_Key stay
                // what the application chose, which on a partitioned IB
                // fabric or a second port is not the route's.
                if !q.init_by_cm {
                    self.stats.cm_qps_init_by_hand += 1;
                }
            }
            s => {
                return Err(Error::state(format!(
                    "the CM needs a QP in RESET or INIT, not {s:?}"
                )))
            }
        }
        Ok(())
    }

    /// Moves a QP to RTR (and RTS when `rts` is given) with what the IB CM
    /// computes: the masks the kernel allows for its type, an RNR NAK timer
    /// of 0 (655 ms) and the ACK timeout derived from the path, unless the
    /// application set its own ([`QpTimers`]).
    fn cm_connect_qp(
        &mut self,
        qp: Id<QpObj>,
        peer_dev: DevIdx,
        qpn: u32,
        rq_psn: u32,
        rts: Option<RtsAttr>,
        timers: QpTimers,
    ) -> Result<()> {
        let d = &self.devs[peer_dev];
        let dest = PortAddr {
            lid: d.lid,
            gid: d.gid,
        };
        let q = self.qps.get(qp).ok_or(Error::ProcessGone)?;
        let ty = q.ty;
        // iWARP retransmits as TCP does, whatever the IB timers say: its
        // QPs keep the fabric's usual values.
        let iwarp = self.devs[q.dev].caps.transport == Transport::Iwarp;
        let timers = if iwarp {
            QpTimers {
                ack_timeout: Some(DEFAULT_ACK_TIMEOUT),
                min_rnr_timer: Some(DEFAULT_MIN_RNR_TIMER),
            }
        } else {
            timers
        };
        let mut rtr = if ty == QpType::XrcIni {
            RtrAttr::initiator(dest, qpn)
        } else {
            RtrAttr {
                min_rnr_timer: Some(timers.min_rnr_timer.unwrap_or(CM_MIN_RNR_TIMER)),
                ..RtrAttr::new(dest, qpn)
            }
        };
        rtr.rq_psn = rq_psn;
        self.modify_qp(qp, &QpTransition::Rtr(rtr), true)?;
        if let Some(mut rts) = rts {
            rts.timeout = timers.ack_timeout.unwrap_or(self.cfg.timing.cm_ack_timeout);
            self.modify_qp(qp, &QpTransition::Rts(rts), true)?;
        }
        Ok(())
    }

    pub(crate) fn cm_connect(
        &mut self,
        id: Id<CmIdObj>,
        qp: Option<Id<QpObj>>,
        p: &ConnParam<'_>,
    ) -> Result<()> {
        self.expect_state(id, CmState::RouteResolved, "connect")?;
        self.check_private(id, CmMessage::Request, p.private_data)?;
        if let Some(qp) = qp {
            self.cm_prepare_qp(id, qp, &[QpType::Rc, QpType::XrcIni])?;
        } else {
            self.iwarp_needs_qp(id, p.qp_num, "connect")?;
        }
        let psn = self.rng.next_u32() & 0x00ff_ffff;
        let private = self.pad(id, CmMessage::Request, p.private_data);
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.qp = qp;
        c.timers = QpTimers::from(p);
        c.psn = c.psn.max(psn);
        c.req = Some(ReqInfo {
            qpn: None,
            psn,
            rnr_retry: p.rnr_retry_count.min(7),
            retry: p.retry_count.min(7),
        });
        c.state = CmState::Connecting;
        let (remote, rdev, ps, local) = (
            c.remote.expect("resolved"),
            c.remote_dev.expect("resolved"),
            c.ps,
            c.local.expect("resolved"),
        );
        // Without a QP the request announces the number the application
        // gives (0 if none), as rdma_connect does.
        let qpn = match qp {
            Some(q) => self.qps.get_mut(q).map(|q| {
                q.cm_id = Some(id);
                q.qpn
            }),
            None => (p.qp_num != 0).then_some(p.qp_num),
        };
        let msg = CmWire::Req {
            qpn,
            psn,
            private,
            ps,
            retry: p.retry_count.min(7),
            rnr_retry: p.rnr_retry_count.min(7),
            from_addr: local,
        };
        self.send_reliable(id, rdev, CmDest::Listener(remote), msg);
        Ok(())
    }

    pub(crate) fn cm_accept(
        &mut self,
        id: Id<CmIdObj>,
        qp: Option<Id<QpObj>>,
        p: &ConnParam<'_>,
    ) -> Result<()> {
        self.expect_state(id, CmState::RequestReceived, "accept")?;
        self.check_private(id, CmMessage::Reply, p.private_data)?;
        if qp.is_none() {
            self.iwarp_needs_qp(id, p.qp_num, "accept")?;
        }
        let c = self.cm(id)?;
        let req = c.req.clone().expect("request kept");
        let rdev = c.remote_dev.expect("request has a source");
        let psn = self.rng.next_u32() & 0x00ff_ffff;
        if let Some(qp) = qp {
            let Some(remote_qpn) = req.qpn else {
                return Err(Error::invalid("the request carried no QP to connect to"));
            };
            self.cm_prepare_qp(id, qp, &[QpType::Rc, QpType::XrcTgt])?;
            let tgt = self.qps.get(qp).expect("prepared").ty == QpType::XrcTgt;
            // Each side's rnr_retry_count governs its peer's sends (the IB
            // CM carries it in the REQ for the acceptor, in the REP for the
            // initiator); retry_count comes from the request for both.
            let rts = (!tgt).then(|| RtsAttr {
                sq_psn: psn,
                retry_cnt: req.retry,
                rnr_retry: req.rnr_retry,
                ..RtsAttr::default()
            });
            self.cm_connect_qp(qp, rdev, remote_qpn, req.psn, rts, QpTimers::from(p))?;
            let iwarp = self.cm_transport(id)? == Transport::Iwarp;
            let q = self.qps.get_mut(qp).expect("prepared");
            q.cm_id = Some(id);
            if iwarp {
                q.iwarp_responder = true;
                q.heard = false;
            }
        }
        let private = self.pad(id, CmMessage::Reply, p.private_data);
        let qpn = qp.and_then(|q| self.qps.get(q)).map(|q| q.qpn);
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.qp = qp;
        c.psn = psn;
        c.state = CmState::Accepting;
        let peer = c.peer_id.expect("request has a source");
        self.send_reliable(
            id,
            rdev,
            CmDest::Id(peer),
            CmWire::Rep {
                qpn,
                psn,
                private,
                rnr_retry: p.rnr_retry_count.min(7),
            },
        );
        Ok(())
    }

    pub(crate) fn cm_reject(&mut self, id: Id<CmIdObj>, private_data: &[u8]) -> Result<()> {
        self.expect_state(id, CmState::RequestReceived, "reject")?;
        self.check_private(id, CmMessage::Reject, private_data)?;
        let msg = CmWire::Rej {
            reason: RejectReason::Consumer,
            private: self.pad(id, CmMessage::Reject, private_data),
        };
        let c = self.cm_ids.get_mut(id).expect("checked");
        c.state = CmState::Failed;
        c.last_sent = Some(msg.clone());
        self.send_to_peer(id, msg);
        Ok(())
    }

    /// The accepting side's connection is established: by the RTU, or by
    /// the application's notice that its QP heard the peer.
    fn cm_accepted(&mut self, id: Id<CmIdObj>) {
        self.cancel_cm_timer(id);
        let c = self.cm_ids.get_mut(id).expect("live");
        c.state = CmState::Established;
        let qpn = c.req.as_ref().and_then(|r| r.qpn);
        self.established_event(id, qpn, Vec::new());
    }

    /// `rdma_notify(COMM_EST)`: establishes an id still waiting for its RTU.
    pub(crate) fn cm_notify_established(&mut self, id: Id<CmIdObj>) -> Result<()> {
        if self.cm(id)?.state == CmState::Accepting {
            self.stats.cm_established_by_notice += 1;
            self.cm_accepted(id);
        }
        Ok(())
    }

    pub(crate) fn cm_disconnect(&mut self, id: Id<CmIdObj>) -> Result<()> {
        let c = self.cm(id)?;
        if !matches!(c.state, CmState::Established | CmState::Accepting) {
            return Err(Error::state(format!(
                "disconnect in CM state {:?}",
                c.state
            )));
        }
        let (qp, peer, dev) = (c.qp, c.peer_id, c.remote_dev);
        let (Some(peer), Some(dev)) = (peer, dev) else {
            return Err(Error::state("no peer to disconnect from"));
        };
        if let Some(qp) = qp {
            self.qp_to_error(qp, None);
        }
        self.cm_ids.get_mut(id).expect("checked").state = CmState::Disconnecting;
        self.send_reliable(id, dev, CmDest::Id(peer), CmWire::Dreq);
        Ok(())
    }

    /// Both ends of a torn-down connection see it disconnect (an iWARP
    /// connection reset: no message exchange, both sides learn at once).
    pub(crate) fn cm_torn_down(&mut self, id: Id<CmIdObj>) {
        let peer = self.cm_ids.get(id).and_then(|c| c.peer_id);
        for x in [Some(id), peer].into_iter().flatten() {
            let Some(c) = self.cm_ids.get_mut(x) else {
                continue;
            };
            if matches!(c.state, CmState::Disconnected | CmState::Failed) {
                continue;
            }
            c.state = CmState::Disconnected;
            if let Some(qp) = c.qp {
                self.qp_to_error(qp, None);
            }
            self.cancel_cm_timer(x);
            self.simple_event(x, CmEventKind::Disconnected, Vec::new());
        }
    }

    // ---- events ----------------------------------------------------------------

    pub(crate) fn on_cm_local(&mut self, id: Id<CmIdObj>, kind: CmEventKind, next: CmState) {
        let Some(c) = self.cm_ids.get_mut(id) else {
            return;
        };
        c.state = next;
        self.simple_event(id, kind, Vec::new());
    }

    pub(crate) fn on_cm_timer(&mut self, id: Id<CmIdObj>, gen: u64) {
        let Some(c) = self.cm_ids.get_mut(id) else {
            return;
        };
        if c.timer_gen != gen {
            return;
        }
        let max = self.cfg.timing.cm_max_retries;
        match c.state {
            CmState::Connecting | CmState::Accepting if c.retries < max => {
                c.retries += 1;
                let msg = c.last_sent.clone().expect("a reliable message");
                let to = match (&msg, c.remote, c.peer_id) {
                    (CmWire::Req { .. }, Some(r), _) => CmDest::Listener(r),
                    (_, _, Some(p)) => CmDest::Id(p),
                    _ => return,
                };
                let dev = c.remote_dev.expect("connected ids know the peer device");
                self.stats.cm_retries += 1;
                if matches!(msg, CmWire::Req { .. }) {
                    self.stats.cm_req_retries += 1;
                }
                self.send_cm(id, dev, to, msg);
                let c = self.cm_ids.get_mut(id).expect("live");
                c.timer_gen += 1;
                let gen = c.timer_gen;
                let t = self.cfg.timing.cm_timeout_ns;
                self.schedule_in(t, Event::CmTimer { id, gen });
            }
            CmState::Connecting => {
                c.state = CmState::Failed;
                self.simple_event(id, CmEventKind::Unreachable, Vec::new());
            }
            CmState::Accepting => {
                c.state = CmState::Failed;
                self.simple_event(id, CmEventKind::ConnectError, Vec::new());
            }
            CmState::Disconnecting => {
                c.state = CmState::Disconnected;
                self.simple_event(id, CmEventKind::Disconnected, Vec::new());
            }
            _ => {}
        }
    }

    /// Counts a CM message at the process owning `id`.
    fn count_cm(&mut self, id: Id<CmIdObj>, f: impl FnOnce(&mut super::world::Proc)) {
        let proc = self
            .cm_ids
            .get(id)
            .and_then(|c| self.ctxs.get(c.ctx))
            .map(|c| c.proc);
        if let Some(p) = proc.and_then(|p| self.procs.get_mut(p)) {
            f(p);
        }
    }

    pub(crate) fn on_cm(&mut self, d: CmDelivery) {
        if self.path_down(d.from_dev, d.to_dev) {
            self.stats.cm_dropped += 1;
            return;
        }
        let to = match d.to {
            CmDest::Listener(addr) => self.listeners.get(&addr).copied(),
            CmDest::Id(id) => Some(id),
        };
        if let Some(to) = to {
            self.count_cm(to, |p| p.cm_received += 1);
        }
        match d.to {
            CmDest::Listener(addr) => match d.msg {
                CmWire::Req { .. } => self.on_req(addr, d),
                // A withdrawn request: reaches the id the request made.
                CmWire::Rej { .. } => {
                    let child = self
                        .listeners
                        .get(&addr)
                        .and_then(|l| self.cm_ids.get(*l))
                        .and_then(|l| l.children.get(&d.from).copied());
                    if let Some(child) = child {
                        self.on_cm_to_id(child, d);
                    }
                }
                _ => {}
            },
            CmDest::Id(id) => {
                if self.cm_ids.contains(id) {
                    self.on_cm_to_id(id, d);
                }
            }
        }
    }

    fn on_req(&mut self, addr: SocketAddrV4, d: CmDelivery) {
        let CmWire::Req {
            qpn,
            psn,
            private,
            ps,
            retry,
            rnr_retry,
            from_addr,
        } = d.msg
        else {
            return;
        };
        let listener = self
            .listeners
            .get(&addr)
            .copied()
            .filter(|l| self.cm_ids.get(*l).is_some_and(|l| l.ps == ps));
        let Some(listener) = listener else {
            let msg = CmWire::Rej {
                reason: RejectReason::NoListener,
                private: Vec::new(),
            };
            // The answering CM has no id; answer from the requester's own
            // id so the message routes like any other.
            self.send_cm(d.from, d.from_dev, CmDest::Id(d.from), msg);
            return;
        };
        if let Some(child) = self
            .cm_ids
            .get(listener)
            .and_then(|l| l.children.get(&d.from).copied())
        {
            // A duplicate request: answer again with what was sent, if
            // anything; the application hears of it only once.
            if let Some(c) = self.cm_ids.get(child) {
                if let (Some(msg), Some(dev)) = (c.last_sent.clone(), c.remote_dev) {
                    self.send_cm(child, dev, CmDest::Id(d.from), msg);
                }
            }
            return;
        }
        // The IB CM keeps every request and connection it holds in a table
        // keyed by (the QP number the REQ announces, the sending HCA), and
        // rejects a second REQ with the same key as a stale connection
        // (cm_insert_remote_qpn). The key is per sending node, not per
        // process: QP-less requests that all announce 0 collide.
        let ib = self.devs[d.to_dev].caps.transport.is_ib_family();
        let stale_key = (d.to_dev, qpn.unwrap_or(0), d.from_dev);
        if ib {
            let held = self
                .remote_qpns
                .get(&stale_key)
                .and_then(|h| self.cm_ids.get(*h))
                .is_some_and(|h| {
                    matches!(
                        h.state,
                        CmState::RequestReceived
                            | CmState::Accepting
                            | CmState::Established
                            | CmState::Disconnecting
                    )
                });
            if held {
                self.stats.cm_stale_rejects += 1;
                let msg = CmWire::Rej {
                    reason: RejectReason::StaleConnection,
                    private: self.pad(listener, CmMessage::Reject, &[]),
                };
                self.send_cm(d.from, d.from_dev, CmDest::Id(d.from), msg);
                return;
            }
        }
        let l = self.cm_ids.get(listener).expect("listening");
        let (ctx, channel) = (l.ctx, l.channel);
        let child = self.cm_ids.insert(CmIdObj {
            ctx,
            channel,
            ps,
            state: CmState::RequestReceived,
            local: Some(addr),
            remote: Some(from_addr),
            remote_dev: Some(d.from_dev),
            qp: None,
            peer_id: Some(d.from),
            listener: Some(listener),
            children: Default::default(),
            last_sent: None,
            retries: 0,
            timer_gen: 0,
            psn: 0,
            req: Some(ReqInfo {
                qpn,
                psn,
                rnr_retry,
                retry,
            }),
            route_cached: false,
            timers: QpTimers::default(),
            stale_key: None,
        });
        if ib {
            self.remote_qpns.insert(stale_key, child);
            self.cm_ids.get_mut(child).expect("just made").stale_key = Some(stale_key);
        }
        self.cm_ids
            .get_mut(listener)
            .expect("listening")
            .children
            .insert(d.from, child);
        let remote_qpn = self.qpn_on_wire(listener, qpn);
        // The request is held by the CM (and in its stale-connection table)
        // until the process has seen it and answered.
        let ev = PendingCmEvent {
            id: listener,
            kind: CmEventKind::ConnectRequest,
            private_data: private,
            remote_qpn,
            peer: Some(from_addr).filter(|a| ib_key_dev(a).is_none()),
            new_id: Some(child),
        };
        let t = self.cfg.timing.cm_upcall_ns;
        self.schedule_in(t, Event::CmUpcall(Box::new(ev)));
    }

    fn on_cm_to_id(&mut self, id: Id<CmIdObj>, d: CmDelivery) {
        let state = self.cm_ids.get(id).expect("checked").state;
        match (d.msg, state) {
            (
                CmWire::Rep {
                    qpn,
                    psn,
                    private,
                    rnr_retry,
                },
                CmState::Connecting,
            ) => {
                self.cancel_cm_timer(id);
                let c = self.cm_ids.get_mut(id).expect("live");
                c.peer_id = Some(d.from);
                let req = c.req.clone().expect("connect kept its request");
                let (qp, rdev, timers) = (c.qp, c.remote_dev.expect("resolved"), c.timers);
                if let (Some(qp), Some(remote_qpn)) = (qp, qpn) {
                    let rts = RtsAttr {
                        sq_psn: req.psn,
                        retry_cnt: req.retry,
                        rnr_retry,
                        ..RtsAttr::default()
                    };
                    if self
                        .cm_connect_qp(qp, rdev, remote_qpn, psn, Some(rts), timers)
                        .is_err()
                    {
                        let msg = CmWire::Rej {
                            reason: RejectReason::Consumer,
                            private: Vec::new(),
                        };
                        self.send_to_peer(id, msg);
                        self.cm_ids.get_mut(id).expect("live").state = CmState::Failed;
                        self.simple_event(id, CmEventKind::ConnectError, Vec::new());
                        return;
                    }
                }
                self.cm_ids.get_mut(id).expect("live").state = CmState::Established;
                self.send_to_peer(id, CmWire::Rtu);
                self.established_event(id, qpn, private);
            }
            (CmWire::Rep { .. }, CmState::Established) => {
                // Our RTU was lost and the peer resent its reply.
                self.send_to_peer(id, CmWire::Rtu);
            }
            (CmWire::Rtu, CmState::Accepting) => self.cm_accepted(id),
            (CmWire::Rej { reason, private }, CmState::Connecting) => {
                self.cancel_cm_timer(id);
                self.cm_ids.get_mut(id).expect("live").state = CmState::Failed;
                let kind = CmEventKind::Rejected(reason);
                self.simple_event(id, kind, private);
            }
            (CmWire::Rej { reason, .. }, CmState::RequestReceived) => {
                self.cm_ids.get_mut(id).expect("live").state = CmState::Failed;
                self.simple_event(id, CmEventKind::Rejected(reason), Vec::new());
            }
            (CmWire::Rej { .. }, CmState::Accepting) => {
                self.cancel_cm_timer(id);
                self.cm_ids.get_mut(id).expect("live").state = CmState::Failed;
                self.simple_event(id, CmEventKind::ConnectError, Vec::new());
            }
            (CmWire::Dreq, s) => {
                // Answer every DREQ; report only the first.
                let c = self.cm_ids.get(id).expect("live");
                let (dev, qp) = (c.remote_dev, c.qp);
                if matches!(
                    s,
                    CmState::Established | CmState::Accepting | CmState::Disconnecting
                ) {
                    // iWARP closes the stream under the QP; the IB CM leaves
                    // a QP the application manages alone.
                    let iwarp = self.cm_transport(id).ok() == Some(Transport::Iwarp);
                    if let (Some(qp), true) = (qp, iwarp) {
                        self.qp_to_error(qp, None);
                    }
                    self.cancel_cm_timer(id);
                    self.cm_ids.get_mut(id).expect("live").state = CmState::Disconnected;
                    self.simple_event(id, CmEventKind::Disconnected, Vec::new());
                }
                if let Some(dev) = dev {
                    self.send_cm(id, dev, CmDest::Id(d.from), CmWire::Drep);
                }
            }
            (CmWire::Drep, CmState::Disconnecting) => {
                self.cancel_cm_timer(id);
                self.cm_ids.get_mut(id).expect("live").state = CmState::Disconnected;
                self.simple_event(id, CmEventKind::Disconnected, Vec::new());
            }
            _ => {}
        }
    }

    /// The IP address of a device (what `ip addr` shows on its netdev).
    pub(crate) fn dev_ip(&self, dev: DevIdx) -> IpAddr {
        IpAddr::V4(self.devs[dev].ip)
    }
}

/// The key under which the simulator keeps an `AF_IB` address of device
/// `dev` in its address tables: 255.x.y.z (the device's index), which no
/// simulated device's IP address takes.
pub(crate) fn ib_key(dev: DevIdx, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(0xff00_0000 | (dev as u32 & 0x00ff_ffff)),
        port,
    )
}

/// The device of an `AF_IB` key (`None`: an IP address).
pub(crate) fn ib_key_dev(a: &SocketAddrV4) -> Option<DevIdx> {
    let b = a.ip().octets();
    (b[0] == 255).then(|| u32::from_be_bytes([0, b[1], b[2], b[3]]) as DevIdx)
}
