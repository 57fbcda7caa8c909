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
//!
//! This file holds the driver's state and the data path's questions; the
//! rest is one file each: what the fabric reports (`inputs.rs`) and what
//! the manager asks (`actions.rs`), and what the driver holds: the QP
//! slot table (`slots.rs`), TGT handles and their sweep (`tgts.rs`), CM
//! ids (`cms.rs`), where peers are and the routes to their nodes
//! (`routes.rs`), ids waiting for their RTU (`accepting.rs`), placeholder
//! QPs (`placeholders.rs`), RC QPs draining (`drain.rs`) and the loopback
//! (`loopback.rs`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use xrcbtl_fabric::{
    Access, CmChannel, CmId, ConnParam, Context, IbAddr, PortSpace, Qp, QpCaps, QpType, Result,
    Transport, DEFAULT_PKEY,
};
use xrcbtl_xrc_conn::{ConnManager, Event, Mode, Node, Notice, QpRef, Rank};

use crate::config::BtlConfig;
use crate::iface::Lent;

mod accepting;
mod actions;
mod cms;
mod drain;
mod inputs;
mod loopback;
mod placeholders;
mod routes;
mod slots;
mod tgts;

use accepting::Accepting;
use cms::CmIds;
use drain::{stop_rc, Draining};
use loopback::Loopback;
use placeholders::Placeholders;
use routes::Directory;
use slots::QpSlots;
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
    cms: CmIds<C>,
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
    /// Where peers are, and the routes to their nodes.
    directory: Directory,
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

impl<C: Context> ConnDriver<C> {
    /// Sets up the rank's connection side on `res`: the manager and the
    /// listener (its native InfiniBand one on `cfg.listen`'s port too, when
    /// that is not 0).
    pub(crate) fn new(res: Lent<'_, C>, cfg: &BtlConfig) -> Result<Self> {
        let ctx = res.ctx.clone();
        let caps = ctx.caps().clone();
        let mode = res.mode;
        let ch = ctx.create_cm_channel()?;
        let listener = listen::<C>(&ch, mode, cfg.listen)?;
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
            cms: CmIds::new(),
            accepting: Accepting::default(),
            draining: HashMap::new(),
            listener,
            listener_ib,
            ch,
            slots: QpSlots::new(),
            tgts: Tgts::new(),
            qp_gen: 0,
            placeholders: Placeholders::new(),
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
            directory: Directory::new(),
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
        self.directory.add(rank, node, addr, ib);
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

    /// Marks `qp`'s slot as handed to the CM ([`slots::Slot::wired`]).
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

    /// The slot of the QP numbered `qpn`, if the driver knows it.
    pub fn slot_of_num(&self, qpn: u32) -> Option<u32> {
        if let Some(lb) = self.loopback.as_ref().filter(|l| l.req.qp_num() == qpn) {
            return Some(lb.slot);
        }
        self.slots.of_num(qpn).map(|(slot, _)| slot)
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
        if let Some(slot) = self.slot_of_num(qpn) {
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

/// How many ephemeral ports a rank tries for its listener before it gives
/// up (see [`listen`]).
const LISTEN_TRIES: usize = 8;

/// The rank's listener on `at`. On iWARP a listener is a TCP socket, and
/// the RDMA CM picks an ephemeral port (`at`'s port 0) without seeing the
/// ports TCP sockets outside it hold (an MPI launcher's, say): siw's
/// `rdma_listen` then fails with `EADDRINUSE`. So an ephemeral listen that
/// finds its port taken tries a new id, on the next port the CM picks; a
/// port the user named is not changed.
fn listen<C: Context>(ch: &C::CmChannel, mode: Mode, at: SocketAddr) -> Result<CmIdOf<C>> {
    let mut tries = 0;
    loop {
        let id = ch.create_id(port_space(mode))?;
        match id.listen(at, 1024) {
            Ok(()) => return Ok(id),
            Err(xrcbtl_fabric::Error::AddrInUse(_))
                if at.port() == 0 && tries + 1 < LISTEN_TRIES =>
            {
                tries += 1;
            }
            Err(e) => return Err(e),
        }
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
