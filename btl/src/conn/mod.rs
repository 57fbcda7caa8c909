//! The connection driver: runs [`ConnManager`] against a fabric. It only
//! makes connections.
//!
//! It owns every CM id and QP the manager names by reference (creating
//! them on the interface's PD and CQs, RC QPs on its SRQ), does what the
//! manager asks (one action at a time, synchronously), and turns what the
//! fabric reports into the manager's events: CM events, async events (a TGT
//! QP error reaches every process holding it), and what the data path
//! reports back (a failed send completion, the first receive on an iWARP
//! responder's QP).
//!
//! The data path reaches a connected QP through its slot
//! ([`ConnDriver::qp`]): an index, found without a search, that stays
//! valid until the driver reports the QP destroyed
//! ([`ConnEvent::Destroyed`]).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use xrcbtl_fabric::{
    Access, AsyncEvent, CmChannel, CmEventKind, CmId, CmRoute, ConnParam, Context, IbAddr,
    PortSpace, Qp, QpCaps, QpInit, QpTransition, QpType, RejectReason, Result, SendWr, Transport,
    DEFAULT_PKEY,
};
use xrcbtl_xrc_conn::{
    Action, CmFailure, CmRef, ConnManager, Event, Mode, Node, Notice, QpKind, QpRef, Rank,
    RouteRef, TgtRef,
};

use crate::config::BtlConfig;
use crate::iface::Iface;
use crate::wr_id;

mod accepting;
mod drain;
mod loopback;
mod placeholders;
mod slots;
mod tgts;

use accepting::Accepting;
use drain::{stop_rc, Draining, LAST_WQE_WAIT};
use loopback::Loopback;
use placeholders::Placeholders;
use slots::{QpSlots, Slot};
use tgts::Tgts;

/// The CM id type of a context.
pub type CmIdOf<C> = <<C as Context>::CmChannel as CmChannel>::Id;

/// What the driver tells the data path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Messages to `rank` may be posted on the QP in `slot`, addressed to
    /// the peer's SRQ numbers `srqns` (XRC; empty with RC).
    Ready {
        /// The peer.
        rank: Rank,
        /// The QP's slot.
        slot: u32,
        /// The QP's number.
        qpn: u32,
        /// The peer's SRQ numbers by class.
        srqns: Vec<u32>,
    },
    /// Any other notice of the manager: a path lost (rebuilt when next
    /// wanted), a peer gone cleanly or unreachable, the clean exit done.
    Notice(Notice),
    /// The QP in `slot` is gone: work posted on it will never complete.
    /// Reported for QPs handed to the CM (connected or accepted); one that
    /// never was carried nothing and goes silently.
    Destroyed {
        /// Its slot (free for reuse from now on).
        slot: u32,
        /// Its number.
        qpn: u32,
        /// The one rank that used it: an RC QP's peer, or this rank for the
        /// loopback; `None` for an XRC INI QP, which serves every rank of
        /// its node.
        peer: Option<Rank>,
    },
    /// An SRQ fell below its armed limit.
    SrqLimit {
        /// The SRQ's id.
        srq: u64,
    },
}

/// What the driver counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Send-queue growths the device refused.
    pub resize_unsupported: u64,
    /// Send failures reported by the data path.
    pub send_errors: u64,
    /// QPs made only to lend their numbers to QP-less requests (see
    /// [`ConnDriver`]'s placeholders); stale rejects are counted by the
    /// manager ([`xrcbtl_xrc_conn::Counters::stale_rejects`]).
    pub placeholder_qps: u64,
    /// iWARP: QPs made for one QP-less request each (a `Leave`), which the
    /// iWARP CM cannot send without a QP; each goes with its request.
    pub carrier_qps: u64,
    /// Held TGT QPs found in the error state by asking them (no event came).
    pub tgts_found_dead: u64,
    /// Accepted connections whose QP heard the peer before the CM's RTU
    /// came, handed to the CM as established (`rdma_notify`).
    pub comm_est_notices: u64,
    /// RC QPs on the SRQ destroyed after their last receive was reported.
    pub drained_qps: u64,
    /// RC QPs on the SRQ destroyed when LAST_WQE_REACHED did not come in
    /// time.
    pub drain_timeouts: u64,
}

/// References the driver makes for CM ids of incoming requests start here,
/// far above those the manager makes, so that the two never meet.
const DRIVER_REFS: u64 = 1 << 62;

/// Runs the connection manager of one rank against a fabric context.
pub struct ConnDriver<C: Context> {
    mgr: ConnManager,
    me: Rank,
    loopback: Option<Loopback<C>>,
    mode: Mode,
    // Connection objects; dropped before the queues they use.
    cms: HashMap<CmRef, CmIdOf<C>>,
    cm_of_key: HashMap<u64, CmRef>,
    /// The rank each outgoing CM id resolves towards.
    cm_rank: HashMap<CmRef, Rank>,
    /// Accepted ids waiting for their RTU, by the number of the QP they
    /// accepted with: the QP's first packet establishes them.
    accepting: Accepting,
    /// RC QPs on the SRQ waiting to be destroyed, by number.
    draining: HashMap<u32, Draining<C>>,
    listener: CmIdOf<C>,
    /// The native InfiniBand listener (`AF_IB`), where the port and
    /// librdmacm allow one: peers that publish a GID are then reached by
    /// it, with no ARP.
    listener_ib: Option<CmIdOf<C>>,
    ch: C::CmChannel,
    /// The QPs the manager made, by slot.
    slots: QpSlots<C>,
    /// The TGT QPs this rank holds.
    tgts: Tgts<C>,
    /// Changes whenever a QP number comes or goes (`slots`, `tgts`): what
    /// was learnt of a number is good while it stays.
    qp_gen: u64,
    placeholders: Placeholders<C>,
    /// iWARP: the QP each QP-less request (a Leave) connects with, made
    /// for it and destroyed with its CM id. The iWARP CM cannot connect
    /// without a QP, so a request with none would never leave.
    carriers: HashMap<CmRef, C::Qp>,
    // Lent by the interface.
    ctx: C,
    pd: C::Pd,
    send_cq: C::Cq,
    recv_cq: C::Cq,
    rc_srq: C::Srq,
    xrcd: Option<C::Xrcd>,
    init_access: Access,
    max_inline: u32,
    /// Timers and read depths every connection is made with.
    conn: ConnSettings,
    routes: HashMap<RouteRef, CmRoute>,
    route_of_node: HashMap<Node, RouteRef>,
    node_of: HashMap<Rank, Node>,
    directory: HashMap<Rank, SocketAddr>,
    /// Peers' native InfiniBand listeners, for those that have one.
    ib_directory: HashMap<Rank, IbAddr>,
    next_ref: u64,
    /// A command started or changed connection work since the last
    /// [`ConnDriver::progress`]: its events should be looked at soon.
    look_wanted: bool,
    events: VecDeque<ConnEvent>,
    /// The latest notices, for [`ConnDriver::take_notices`]: at most
    /// [`NOTICES_KEPT`], the oldest dropped (a stranger's requests must
    /// not grow a process that never looks).
    notices: VecDeque<Notice>,
    stats: DriverStats,
}

/// Notices kept for [`ConnDriver::take_notices`].
pub const NOTICES_KEPT: usize = 1024;

/// Keeps `n` among the latest [`NOTICES_KEPT`] notices.
fn keep_notice(notices: &mut VecDeque<Notice>, n: Notice) {
    if notices.len() == NOTICES_KEPT {
        notices.pop_front();
    }
    notices.push_back(n);
}

impl<C: Context> Drop for ConnDriver<C> {
    /// Stops the RC QPs that draw from the SRQ before they are destroyed
    /// with the driver: the device then reports their last receive, and
    /// none is taken while they go.
    fn drop(&mut self) {
        for s in self.slots.iter() {
            if s.qp.qp_type() == QpType::Rc {
                stop_rc(&s.qp, s.wired);
            }
        }
    }
}

/// The rank's resources the driver makes its QPs on: the interface's
/// ([`Iface::lend`]), or a bare set that receives nothing
/// ([`crate::sim::Responder`]).
pub(crate) struct Lent<'a, C: Context> {
    pub ctx: &'a C,
    pub mode: Mode,
    pub pd: &'a C::Pd,
    pub send_cq: &'a C::Cq,
    pub recv_cq: &'a C::Cq,
    /// The SRQ RC QPs draw from.
    pub rc_srq: &'a C::Srq,
    /// The node's XRC domain (XRC).
    pub xrcd: Option<&'a C::Xrcd>,
    /// The XRC SRQ numbers peers address, by class (empty with RC).
    pub srqns: Vec<u32>,
}

impl<C: Context> Iface<C> {
    /// What the connection driver makes its QPs on.
    pub(crate) fn lend(&self) -> Lent<'_, C> {
        Lent {
            ctx: &self.ctx,
            mode: self.mode,
            pd: &self.pd,
            send_cq: &self.send_cq,
            recv_cq: &self.recv_cq,
            rc_srq: self.rc_srq(),
            xrcd: self.xrcd.as_ref(),
            srqns: self.srq_nums(),
        }
    }
}

impl<C: Context> ConnDriver<C> {
    /// Sets up the rank's connection side on `res`: the manager and the
    /// listener (its native InfiniBand one on `cfg.listen`'s port too, when
    /// that is not 0).
    pub(crate) fn new(res: Lent<'_, C>, cfg: &BtlConfig) -> Result<Self> {
        let ctx = res.ctx.clone();
        let caps = ctx.caps().clone();
        let mode = res.mode;
        let ch = ctx.create_cm_channel()?;
        let listener = ch.create_id(port_space(mode))?;
        listener.listen(cfg.listen, 1024)?;
        let listener_ib = if cfg.af_ib && caps.transport == Transport::Infiniband {
            // Where AF_IB is missing (an old kernel or librdmacm), IP
            // addressing alone serves.
            let gid = ctx.query_port(1)?.gid;
            let l = ch.create_id(port_space(mode))?;
            let at = IbAddr {
                gid,
                pkey: DEFAULT_PKEY,
                port: cfg.listen.port(),
            };
            l.listen_ib(at, 1024).ok().map(|()| l)
        } else {
            None
        };
        let mut cc = xrcbtl_xrc_conn::Config::new(cfg.rank, cfg.node, cfg.job, mode, res.srqns);
        cc.max_retries = cfg.retries;
        cc.connect_window = cfg.connect_window;
        cc.leave_timeout = cfg.leave_timeout;
        cc.sq_max = cfg
            .sq_max
            .map_or(caps.max_qp_wr, |m| m.clamp(1, caps.max_qp_wr));
        let mgr = ConnManager::new(cc, [(cfg.rank, cfg.node)]);
        let mut init_access = Access::REMOTE_WRITE | Access::REMOTE_READ;
        if caps.atomics {
            init_access |= Access::REMOTE_ATOMIC;
        }
        Ok(ConnDriver {
            mgr,
            me: cfg.rank,
            loopback: None,
            mode,
            cms: HashMap::new(),
            cm_of_key: HashMap::new(),
            cm_rank: HashMap::new(),
            accepting: Accepting::default(),
            draining: HashMap::new(),
            listener,
            listener_ib,
            ch,
            slots: QpSlots::new(),
            tgts: Tgts::new(),
            qp_gen: 0,
            placeholders: Placeholders::new(),
            carriers: HashMap::new(),
            pd: res.pd.clone(),
            send_cq: res.send_cq.clone(),
            recv_cq: res.recv_cq.clone(),
            rc_srq: res.rc_srq.clone(),
            xrcd: res.xrcd.cloned(),
            init_access,
            max_inline: cfg.max_inline.min(caps.max_inline),
            conn: ConnSettings {
                ack_timeout: cfg.ack_timeout,
                min_rnr_timer: cfg.min_rnr_timer,
                rd_atomic: caps.max_qp_rd_atom,
            },
            ctx,
            routes: HashMap::new(),
            route_of_node: HashMap::new(),
            node_of: HashMap::new(),
            directory: HashMap::new(),
            ib_directory: HashMap::new(),
            next_ref: DRIVER_REFS,
            look_wanted: false,
            events: VecDeque::new(),
            notices: VecDeque::new(),
            stats: DriverStats::default(),
        })
    }

    /// The address peers connect to.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr()
    }

    /// The native InfiniBand address peers that can use `AF_IB` connect
    /// to.
    pub fn listen_ib_addr(&self) -> Option<IbAddr> {
        self.listener_ib.as_ref().and_then(|l| l.local_ib_addr())
    }

    /// The transport chosen from the device caps.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Makes a rank known (its node and listener address).
    pub fn add_peer(&mut self, rank: Rank, node: Node, addr: SocketAddr, ib: Option<IbAddr>) {
        self.node_of.insert(rank, node);
        self.directory.insert(rank, addr);
        match ib {
            Some(a) => self.ib_directory.insert(rank, a),
            None => self.ib_directory.remove(&rank),
        };
        self.mgr.add_peer(rank, node);
    }

    /// Where the waiting requests of unknown `rank` came from, where the
    /// CM said.
    pub fn unknown_source(&self, rank: Rank) -> Option<SocketAddr> {
        self.mgr.unknown_source(rank)
    }

    /// `rank` asked for a connection while unknown and stays unknown: its
    /// requests are refused.
    pub fn unknown_peer(&mut self, now: Duration, rank: Rank) {
        self.mgr.unknown_peer(now, rank);
    }

    /// The connection manager (counters, state).
    pub fn manager(&self) -> &ConnManager {
        &self.mgr
    }

    /// What the driver counted.
    pub fn stats(&self) -> &DriverStats {
        &self.stats
    }

    /// Asks for a connection to `rank` (made on demand; a ready one is
    /// reported again). This rank's own is the loopback.
    pub fn connect(&mut self, now: Duration, rank: Rank) {
        if rank == self.me {
            return self.open_loopback();
        }
        self.mgr.connect(now, rank);
        self.look_wanted = true;
        self.react(now);
    }

    /// Whether one-sided work can reach this rank's own memory (through the
    /// loopback: not on iWARP).
    pub fn has_loopback(&self) -> bool {
        self.ctx.caps().transport != Transport::Iwarp
    }

    /// Reports the loopback ready, made first if need be.
    fn open_loopback(&mut self) {
        if self.loopback.is_none() {
            let made = Loopback::make(
                &self.ctx,
                &self.pd,
                [&self.send_cq, &self.recv_cq],
                self.init_access,
                || self.slots.take_number(),
            );
            match made {
                Ok(lb) => self.loopback = Some(lb),
                Err(_) => {
                    let n = Notice::Failed {
                        rank: self.me,
                        reason: xrcbtl_xrc_conn::FailReason::NoResource,
                    };
                    keep_notice(&mut self.notices, n.clone());
                    self.events.push_back(ConnEvent::Notice(n));
                    return;
                }
            }
        }
        let lb = self.loopback.as_ref().expect("just made");
        self.events.push_back(ConnEvent::Ready {
            rank: self.me,
            slot: lb.slot,
            qpn: lb.req.qp_num(),
            srqns: Vec::new(),
        });
    }

    /// Marks `qp`'s slot as handed to the CM ([`Slot::wired`]).
    fn wire(&mut self, qp: Option<QpRef>) {
        let Some(q) = qp else { return };
        let peer = self.mgr.peer_of_qp(q);
        if let Some(s) = self.slots.of_ref_mut(q) {
            s.wired = true;
            s.peer = peer;
        }
    }

    /// The loopback failed (an operation's error broke its QPs): its work
    /// is posted again on a fresh one.
    fn close_loopback(&mut self) {
        if let Some(lb) = self.loopback.take() {
            self.slots.give_number(lb.slot);
            self.events.push_back(ConnEvent::Destroyed {
                slot: lb.slot,
                qpn: lb.req.qp_num(),
                peer: Some(self.me),
            });
        }
    }

    /// Starts a clean exit; progress until [`Notice::Drained`] comes.
    pub fn shutdown(&mut self, now: Duration) {
        self.mgr.shutdown(now);
        self.react(now);
    }

    /// The next event for the data path.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// The manager's notices since the last call, the latest
    /// [`NOTICES_KEPT`] of them (for tests and tools).
    pub fn take_notices(&mut self) -> Vec<Notice> {
        self.notices.drain(..).collect()
    }

    /// When the manager next needs [`ConnDriver::progress`] for a timer, or
    /// held TGT QPs are next asked for their state.
    pub fn next_timeout(&self) -> Option<Duration> {
        let sweep = self.tgts.next_check();
        let drain = self.draining.values().map(|d| d.deadline).min();
        [self.mgr.poll_timeout(), sweep, drain]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether RC QPs wait for the receive CQ to be polled dry.
    pub fn draining(&self) -> bool {
        !self.draining.is_empty()
    }

    /// Whether no connection work is under way: no timer of the manager's
    /// (attempts, retries, a departure), no QP draining, no id accepting.
    pub fn settled(&self) -> bool {
        self.draining.is_empty() && self.accepting.is_empty() && self.mgr.poll_timeout().is_none()
    }

    /// Whether a command (a connect, a failed send, an iWARP hello) started
    /// or changed connection work since the last [`ConnDriver::progress`]:
    /// a progress loop that looks at events only now and then should look
    /// at the next call.
    pub fn wants_look(&self) -> bool {
        self.look_wanted
    }

    /// The receive CQ was just polled dry: destroys the draining QPs whose
    /// last receive was reported (their completions are all consumed), and
    /// those that waited too long for the report.
    pub fn recv_cq_dry(&mut self, now: Duration) {
        let stats = &mut self.stats;
        self.draining.retain(|_, d| {
            if d.last_wqe {
                stats.drained_qps += 1;
                false
            } else if now >= d.deadline {
                stats.drain_timeouts += 1;
                false
            } else {
                true
            }
        });
    }

    /// Asks the next few held TGT QPs for their state, and reports those in
    /// the error state as failed. Another opener (the anchor, when the
    /// sender it served went away) may have moved a TGT QP to the error
    /// state by hand, which raises no event the verbs promise at the other
    /// openers: without asking, they would hold the dead QP until they exit.
    fn sweep_tgts(&mut self, now: Duration) -> usize {
        let mut dead = 0;
        let (tgts, mgr, stats) = (&mut self.tgts, &mut self.mgr, &mut self.stats);
        tgts.sweep(now, |tgt| {
            dead += 1;
            stats.tgts_found_dead += 1;
            mgr.handle(now, Event::TgtFailed { tgt });
        });
        dead
    }

    /// This rank failed `rank` for good, and hears from it still: tell it
    /// (see [`ConnManager::disown`]).
    pub fn disown(&mut self, now: Duration, rank: Rank) {
        self.mgr.disown(now, rank);
        self.look_wanted = true;
        self.react(now);
    }

    /// The rank whose messages arrive on local QP number `qpn`: the peer of
    /// an RC QP, or the sending process of an XRC TGT QP this rank holds.
    /// `None` when the driver does not know the number (any more: a QP's
    /// last messages may still be in the CQ after it went).
    pub fn sender_of(&self, qpn: u32) -> Option<Rank> {
        if let Some((_, s)) = self.slots.of_num(qpn) {
            return self.mgr.peer_of_qp(s.r);
        }
        let tgts = self.tgts.of_num(qpn)?;
        tgts.iter().find_map(|t| self.mgr.tgt_sender(*t))
    }

    /// A number that changes whenever a QP number this driver knows comes
    /// or goes: [`ConnDriver::sender_of`]'s answer holds while it stays.
    pub fn qp_gen(&self) -> u64 {
        self.qp_gen
    }

    /// The QP in `slot` and its granted sizes.
    pub fn qp(&self, slot: u32) -> Option<(&C::Qp, QpCaps)> {
        if let Some(lb) = self.loopback.as_ref().filter(|l| l.slot == slot) {
            return Some((&lb.req, lb.caps));
        }
        self.slots.get(slot).map(|s| (&s.qp, s.caps))
    }

    /// A send on the QP in `slot` completed with an error: the path through
    /// it is broken.
    pub fn handle_send_failure(&mut self, now: Duration, slot: u32) {
        self.stats.send_errors += 1;
        if self.loopback.as_ref().is_some_and(|l| l.slot == slot) {
            return self.close_loopback();
        }
        if let Some(s) = self.slots.get(slot) {
            let qp = s.r;
            self.mgr.handle(now, Event::QpFailed { qp });
            self.look_wanted = true;
            self.react(now);
        }
    }

    /// A send on QP number `qpn` completed with an error (a completion
    /// whose work the data path no longer knows).
    pub fn handle_send_failure_qpn(&mut self, now: Duration, qpn: u32) {
        if let Some(lb) = self.loopback.as_ref().filter(|l| l.req.qp_num() == qpn) {
            let slot = lb.slot;
            return self.handle_send_failure(now, slot);
        }
        if let Some((slot, _)) = self.slots.of_num(qpn) {
            self.handle_send_failure(now, slot);
        }
    }

    /// A zero-length message (the iWARP initiator's hello) arrived on QP
    /// number `qpn`: the responder may speak now.
    pub fn handle_first_receive(&mut self, now: Duration, qpn: u32) {
        if let Some((_, s)) = self.slots.of_num(qpn) {
            let qp = s.r;
            self.mgr.handle(now, Event::FirstReceive { qp });
            self.look_wanted = true;
            self.react(now);
        }
    }

    fn fresh(&mut self) -> u64 {
        self.next_ref += 1;
        self.next_ref
    }

    /// Does whatever is pending: CM and async events, timers, and the
    /// manager's actions. Each input is acted on before the next is looked
    /// at, so that nothing the manager asked for waits behind another poll.
    /// Returns how much work it found.
    pub fn progress(&mut self, now: Duration) -> usize {
        self.look_wanted = false;
        let mut total = self.react(now);
        loop {
            let mut work = 0;
            while let Some(ev) = self.ch.poll_event() {
                work += 1;
                self.on_cm_event(now, ev);
                work += self.react(now);
            }
            while let Some(ev) = self.ctx.poll_async_event() {
                work += 1;
                self.on_async(now, ev);
                work += self.react(now);
            }
            if self.mgr.poll_timeout().is_some_and(|t| t <= now) {
                work += 1;
                self.mgr.handle_timeout(now);
                work += self.react(now);
            }
            if self.sweep_tgts(now) > 0 {
                work += 1;
                work += self.react(now);
            }
            if work == 0 {
                return total;
            }
            total += work;
        }
    }

    /// Carries out what the manager asks, and passes on its notices.
    fn react(&mut self, now: Duration) -> usize {
        let mut work = 0;
        loop {
            let mut n = 0;
            while let Some(a) = self.mgr.poll_action() {
                n += 1;
                self.execute(now, a);
            }
            while let Some(notice) = self.mgr.poll_notice() {
                n += 1;
                self.on_notice(notice);
            }
            if n == 0 {
                return work;
            }
            work += n;
        }
    }

    fn on_notice(&mut self, n: Notice) {
        let ev = match &n {
            Notice::Ready { rank, path } => match self.slots.of_ref(path.qp) {
                Some((slot, s)) => {
                    let qpn = s.qp.qp_num();
                    ConnEvent::Ready {
                        rank: *rank,
                        slot,
                        qpn,
                        srqns: path.srqns.clone(),
                    }
                }
                None => ConnEvent::Notice(Notice::Lost { rank: *rank }),
            },
            other => ConnEvent::Notice(other.clone()),
        };
        self.events.push_back(ev);
        keep_notice(&mut self.notices, n);
    }

    fn on_async(&mut self, now: Duration, ev: AsyncEvent) {
        if let AsyncEvent::SrqLimitReached { srq } = ev {
            self.events.push_back(ConnEvent::SrqLimit { srq });
            return;
        }
        if let AsyncEvent::CommEstablished { qpn } = ev {
            // The RTU may have been lost: the peer is sending already.
            if let Some(id) = self
                .accepting
                .take_qpn(qpn)
                .and_then(|cm| self.cms.get(&cm))
            {
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

    fn on_cm_event(&mut self, now: Duration, ev: xrcbtl_fabric::CmEvent<CmIdOf<C>>) {
        if ev.kind == CmEventKind::ConnectRequest {
            let Some(id) = ev.new_id else { return };
            let cm = CmRef(self.fresh());
            self.cm_of_key.insert(id.key(), cm);
            self.cms.insert(cm, id);
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
        let Some(&cm) = self.cm_of_key.get(&ev.id) else {
            return;
        };
        let fail = |how| Event::Failed {
            cm,
            how,
            data: Vec::new(),
        };
        let out = match ev.kind {
            CmEventKind::AddrResolved => {
                let r = self.cms.get(&cm).map(|id| id.resolve_route(2_000));
                match r {
                    Some(Ok(())) => return,
                    _ => Event::ResolveFailed { cm },
                }
            }
            CmEventKind::RouteResolved => {
                let route = self.cms.get(&cm).and_then(|id| id.route());
                let node = self
                    .cm_rank
                    .get(&cm)
                    .and_then(|r| self.node_of.get(r))
                    .copied();
                let rref = match (route, node) {
                    (Some(route), Some(node)) => {
                        *self.route_of_node.entry(node).or_insert_with(|| {
                            self.next_ref += 1;
                            let r = RouteRef(self.next_ref);
                            self.routes.insert(r, route);
                            r
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

    /// Does one thing the manager asks.
    fn execute(&mut self, now: Duration, a: Action) {
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
                if let Some(id) = self.cms.get(&cm) {
                    // A request whose id is gone needs no answer.
                    let _ = id.reject(&data);
                }
            }
            Action::DestroyCm { cm } => self.destroy_cm(cm),
        }
    }

    // ---- QPs ---------------------------------------------------------------

    /// Makes the QP the manager calls `qp` and puts it in a slot.
    fn create_qp(&mut self, now: Duration, qp: QpRef, kind: QpKind, sq_depth: u32) {
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

    fn resize_qp(&mut self, qp: QpRef, sq_depth: u32) {
        if let Some(s) = self.slots.of_ref_mut(qp) {
            if s.qp.resize_send_queue(sq_depth).is_err() {
                self.stats.resize_unsupported += 1;
            }
            // Only what the device says now is believed.
            s.caps = s.qp.caps();
        }
    }

    fn destroy_qp(&mut self, now: Duration, qp: QpRef) {
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

    fn send_hello(&mut self, now: Duration, qp: QpRef) {
        if let Some((_, s)) = self.slots.of_ref(qp) {
            if s.qp.post_send(&SendWr::send(wr_id::HELLO, &[])).is_err() {
                let r = s.r;
                self.mgr.handle(now, Event::QpFailed { qp: r });
            }
        }
    }

    // ---- TGT QPs -----------------------------------------------------------

    fn create_tgt(&mut self, now: Duration, tgt: TgtRef) {
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

    fn open_tgt(&mut self, now: Duration, tgt: TgtRef, qpn: u32) {
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
    fn hold_tgt(&mut self, tgt: TgtRef, q: C::Qp) {
        self.tgts.insert(tgt, q);
        self.qp_gen += 1;
    }

    fn close_tgt(&mut self, tgt: TgtRef) {
        if self.tgts.remove(tgt).is_some() {
            self.qp_gen += 1;
        }
    }

    // ---- CM ids ------------------------------------------------------------

    /// Makes a CM id for `cm` and resolves `rank`'s address (or its GID),
    /// through a route already resolved to its node when there is one.
    fn resolve(&mut self, now: Duration, cm: CmRef, rank: Rank, route: Option<RouteRef>) {
        let Some(&addr) = self.directory.get(&rank) else {
            return self.mgr.handle(now, Event::ResolveFailed { cm });
        };
        let id = match self.ch.create_id(port_space(self.mode)) {
            Ok(id) => id,
            Err(_) => return self.mgr.handle(now, Event::ResolveFailed { cm }),
        };
        let cached = route.and_then(|r| self.routes.get(&r));
        let by_gid = self
            .listener_ib
            .is_some()
            .then(|| self.ib_directory.get(&rank))
            .flatten();
        let started = match (by_gid, cached) {
            // Both ends speak AF_IB: the GID is the address.
            (Some(dst), r) => id.resolve_ib(*dst, r, 2_000),
            (None, Some(r)) => id.resolve_cached(addr, r, 2_000),
            (None, None) => id.resolve_addr(addr, 2_000),
        };
        self.cm_of_key.insert(id.key(), cm);
        self.cms.insert(cm, id);
        self.cm_rank.insert(cm, rank);
        if started.is_err() {
            self.mgr.handle(now, Event::ResolveFailed { cm });
        }
    }

    /// Connects `cm` with `qp` (or, QP-less, with a number lent to it).
    fn connect_cm(&mut self, now: Duration, cm: CmRef, qp: Option<QpRef>, data: &[u8]) {
        let mut param = self.conn.param(data);
        if qp.is_none() {
            param.qp_num = self.lend_number(cm);
        }
        self.wire(qp);
        let q = qp.and_then(|q| self.slots.of_ref(q)).map(|(_, s)| &s.qp);
        let r = self.cms.get(&cm).map(|id| id.connect(q, &param));
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
    fn accept(
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
        let r = self.cms.get(&cm).map(|id| id.accept(q, &param));
        if !matches!(r, Some(Ok(()))) {
            self.mgr.handle(now, Event::Disconnected { cm });
        }
    }

    fn destroy_cm(&mut self, cm: CmRef) {
        if let Some(id) = self.cms.remove(&cm) {
            self.cm_of_key.remove(&id.key());
            self.accepting.forget(cm);
        }
        self.cm_rank.remove(&cm);
        self.placeholders.give_back(cm);
        // After its id: the CM lets go of the QP first.
        self.carriers.remove(&cm);
    }
}

impl<C: Context> ConnDriver<C> {
    /// A QP number of its own for the QP-less request `cm`: on the IB CM a
    /// placeholder's (0 if none could be made), on iWARP a QP made for
    /// this request alone (0 if none could be made: the request then
    /// fails at once, as it would have without one).
    fn lend_number(&mut self, cm: CmRef) -> u32 {
        if !self.ctx.caps().transport.is_ib_family() {
            return self.carry(cm);
        }
        let Some(node) = self.cm_rank.get(&cm).and_then(|r| self.node_of.get(r)) else {
            return 0;
        };
        let (ctx, pd, cq, srq, mode) =
            (&self.ctx, &self.pd, &self.send_cq, &self.rc_srq, self.mode);
        let make = || Self::number_qp(ctx, pd, cq, srq, mode);
        let qpn = self.placeholders.lend(cm, *node, make).unwrap_or(0);
        // The pool never shrinks: its size is how many were made.
        self.stats.placeholder_qps = self.placeholders.made() as u64;
        qpn
    }

    /// iWARP: a fresh QP for the request `cm` to connect with (the iWARP
    /// CM binds the connection to a QP; rejected, it leaves the QP unfit
    /// for another), kept until the request's id is destroyed.
    fn carry(&mut self, cm: CmRef) -> u32 {
        match Self::number_qp(&self.ctx, &self.pd, &self.send_cq, &self.rc_srq, self.mode) {
            Ok(qp) => {
                let n = qp.qp_num();
                self.carriers.insert(cm, qp);
                self.stats.carrier_qps += 1;
                n
            }
            Err(_) => 0,
        }
    }

    /// A QP that only lends its number to a QP-less request: never
    /// connected, never posted to.
    fn number_qp(ctx: &C, pd: &C::Pd, cq: &C::Cq, srq: &C::Srq, mode: Mode) -> Result<C::Qp> {
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

/// What every connection the driver makes or accepts is set up with.
#[derive(Debug, Clone, Copy)]
struct ConnSettings {
    ack_timeout: u8,
    min_rnr_timer: u8,
    /// The device's RDMA read depth: the CM hands the requested depths to
    /// the QPs, and a device refuses more than it has.
    rd_atomic: u32,
}

impl ConnSettings {
    fn param<'a>(&self, data: &'a [u8]) -> ConnParam<'a> {
        ConnParam {
            ack_timeout: Some(self.ack_timeout),
            min_rnr_timer: Some(self.min_rnr_timer),
            ..ConnParam::with_data(data)
        }
        .clamp_rd_atomic(self.rd_atomic)
    }
}

fn port_space(mode: Mode) -> PortSpace {
    match mode {
        Mode::Xrc => PortSpace::Ib,
        Mode::Rc { .. } => PortSpace::Tcp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latest_notices_are_kept() {
        let mut q = VecDeque::new();
        for rank in 0..(NOTICES_KEPT as u32 + 10) {
            keep_notice(&mut q, Notice::Closed { rank });
        }
        assert_eq!(q.len(), NOTICES_KEPT);
        assert_eq!(q.front(), Some(&Notice::Closed { rank: 10 }));
    }
}
