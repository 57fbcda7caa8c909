//! The connection driver: runs [`ConnManager`] against a fabric.
//!
//! The driver owns every verbs object the manager names by reference, does
//! what the manager asks (one action at a time, synchronously), and turns
//! what the fabric reports into the manager's events: CM events, async events
//! (a TGT QP error reaches every process holding it), failed send
//! completions (an INI QP that lost its TGT QP), and the first receive on an
//! iWARP responder's QP.
//!
//! Receives are posted to one SRQ per size class (XRC SRQs in the node's
//! domain, whose numbers reach the peers in the connection reply; a plain
//! SRQ in RC mode, where a QP can draw from only one, so only the largest
//! class is used there).
//!
//! It also carries a minimal message path, enough to show that traffic flows
//! and keeps flowing through failures: each message is a header (source rank,
//! sequence number) and a payload, sent from a bounce buffer to the smallest
//! class of the peer that fits it. A send to a peer without a path starts
//! the connection (on demand). The BTL's eager and rendezvous protocols
//! replace this path.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use xrcbtl_fabric::{
    Access, AsyncEvent, CmChannel, CmEventKind, CmId, CmRoute, ConnParam, Context, Cq, DmaBuf,
    Error, PortSpace, Qp, QpCaps, QpInit, QpTransition, QpType, RecvWr, RejectReason, Result,
    SendWr, Srq, SrqAttr, Transport, WcOpcode, WcStatus, WorkCompletion, XrcdKey,
};
use xrcbtl_xrc_conn::{
    Action, CmFailure, CmRef, ConnManager, Event, Mode, Node, Notice, Path, QpKind, QpRef, Rank,
    RouteRef, TgtRef,
};

pub use xrcbtl_xrc_conn::Config as ConnConfig;

/// The CM id type of a context.
pub type CmIdOf<C> = <<C as Context>::CmChannel as CmChannel>::Id;

/// Bytes of the message header: source rank and sequence number.
pub const HEADER: usize = 8;

/// How a driver is set up.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This process's rank.
    pub rank: Rank,
    /// Its node.
    pub node: Node,
    /// Job id.
    pub job: u32,
    /// The node's XRC domain key (shared by the node's ranks of the job).
    pub xrcd_key: XrcdKey,
    /// Where to listen for connection requests (port 0: any free one).
    pub listen: SocketAddr,
    /// Receive size classes, smallest first; the same on every rank of the
    /// job.
    pub classes: Vec<SrqClass>,
    /// Use RC + SRQ even where the device has XRC.
    pub force_rc: bool,
    /// Connection manager tuning (rank, node, job and mode are filled in).
    pub retries: u32,
    /// Largest inline payload asked of send QPs (bounded by the device).
    pub max_inline: u32,
    /// Deepest send queue of a QP (bounded by the device).
    pub sq_max: Option<u32>,
    /// The data path is someone else's (the BTL): the driver creates the
    /// SRQs but no receive buffers, posts nothing, and leaves the CQs to
    /// the owner, who reports failures and first receives back through
    /// [`ConnDriver::handle_send_failure`] and
    /// [`ConnDriver::handle_first_receive`].
    pub external_data: bool,
}

impl DriverConfig {
    /// A configuration with the usual values.
    pub fn new(rank: Rank, node: Node, job: u32, xrcd_key: XrcdKey, listen: SocketAddr) -> Self {
        DriverConfig {
            rank,
            node,
            job,
            xrcd_key,
            listen,
            classes: vec![
                SrqClass {
                    size: 256,
                    depth: 256,
                },
                SrqClass {
                    size: 4096,
                    depth: 64,
                },
            ],
            force_rc: false,
            retries: 5,
            max_inline: 0,
            sq_max: None,
            external_data: false,
        }
    }
}

/// A receive size class: an SRQ kept full of `depth` buffers of `size`
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqClass {
    /// Buffer size in bytes.
    pub size: u32,
    /// Buffers kept posted.
    pub depth: u32,
}

/// One class's SRQ and buffers (no buffers with an external data path).
struct Class<C: Context> {
    srq: C::Srq,
    buf: Option<DmaBuf<C>>,
    size: u32,
    depth: u32,
}

/// A message received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Sending rank.
    pub src: Rank,
    /// The sender's sequence number for this destination.
    pub seq: u32,
    /// Payload.
    pub data: Vec<u8>,
}

/// What the driver counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Send-queue growths the device refused.
    pub resize_unsupported: u64,
    /// Messages sent.
    pub sent: u64,
    /// Messages received.
    pub received: u64,
    /// Messages received, by size class.
    pub received_by_class: Vec<u64>,
    /// Sends that completed with an error.
    pub send_errors: u64,
}

/// Where a CM id is in resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Addr,
    Route,
}

const HELLO_WR: u64 = u64::MAX;
const SEND_SLOTS: usize = 256;

/// Runs the connection manager of one process against a fabric context.
pub struct ConnDriver<C: Context> {
    mgr: ConnManager,
    mode: Mode,
    // Connection objects; dropped before the queues they use.
    cms: HashMap<CmRef, CmIdOf<C>>,
    cm_of_key: HashMap<u64, CmRef>,
    stages: HashMap<CmRef, Stage>,
    listener: CmIdOf<C>,
    ch: C::CmChannel,
    qps: HashMap<QpRef, C::Qp>,
    qp_of_num: HashMap<u32, QpRef>,
    tgts: HashMap<TgtRef, C::Qp>,
    tgt_of_num: HashMap<u32, Vec<TgtRef>>,
    classes: Vec<Class<C>>,
    xrcd: Option<C::Xrcd>,
    sbuf: Option<DmaBuf<C>>,
    slot_size: u32,
    free_slots: Vec<usize>,
    send_cq: C::Cq,
    recv_cq: C::Cq,
    pd: C::Pd,
    ctx: C,
    cfg: DriverConfig,
    routes: HashMap<RouteRef, CmRoute>,
    route_of_node: HashMap<Node, RouteRef>,
    node_of: HashMap<Rank, Node>,
    directory: HashMap<Rank, SocketAddr>,
    next_ref: u64,
    paths: BTreeMap<Rank, Path>,
    seq_out: HashMap<Rank, u32>,
    /// The time of the last progress (for connections a send starts).
    last_now: Duration,
    notices: VecDeque<Notice>,
    inbox: VecDeque<Received>,
    stats: DriverStats,
    /// Numbers of QPs destroyed since the last `take_destroyed`.
    destroyed: Vec<u32>,
    /// Classes whose SRQ reported its limit since the last
    /// `take_srq_limits`.
    srq_limits: Vec<usize>,
}

impl<C: Context> ConnDriver<C> {
    /// Sets up the rank: queues, the SRQ (XRC in the node's domain where the
    /// device has XRC, else a plain SRQ for RC QPs), receive buffers, and the
    /// listener.
    pub fn new(ctx: C, cfg: DriverConfig) -> Result<Self> {
        let caps = ctx.caps().clone();
        let mode = if caps.xrc && !cfg.force_rc {
            Mode::Xrc
        } else {
            Mode::Rc {
                p2p: caps.transport == Transport::Iwarp,
            }
        };
        let pd = ctx.alloc_pd()?;
        let send_cq = ctx.create_cq(4096.min(caps.max_cqe))?;
        let recv_cq = ctx.create_cq(4096.min(caps.max_cqe))?;
        if cfg.classes.is_empty() || cfg.classes.len() > xrcbtl_xrc_conn::wire::MAX_SRQS {
            return Err(Error::invalid(format!(
                "1 to {} receive classes",
                xrcbtl_xrc_conn::wire::MAX_SRQS
            )));
        }
        if cfg
            .classes
            .iter()
            .any(|c| c.size as usize <= HEADER || c.depth == 0)
        {
            return Err(Error::invalid(
                "a class needs room for the header and a buffer",
            ));
        }
        // An RC QP draws from one SRQ: RC mode keeps the largest class.
        let wanted: Vec<SrqClass> = match mode {
            Mode::Xrc => cfg.classes.clone(),
            Mode::Rc { .. } => vec![*cfg
                .classes
                .iter()
                .max_by_key(|c| c.size)
                .expect("non-empty")],
        };
        let xrcd = match mode {
            Mode::Xrc => Some(ctx.open_xrcd(&cfg.xrcd_key)?),
            Mode::Rc { .. } => None,
        };
        let mut classes = Vec::new();
        for c in &wanted {
            let attr = SrqAttr {
                max_wr: c.depth.min(caps.max_srq_wr),
                max_sge: 1,
                srq_limit: 0,
            };
            let srq = match &xrcd {
                Some(x) => ctx.create_xrc_srq(&pd, x, &recv_cq, attr)?,
                None => ctx.create_srq(&pd, attr)?,
            };
            let buf = if cfg.external_data {
                None
            } else {
                Some(DmaBuf::new(
                    &ctx,
                    &pd,
                    (c.size * attr.max_wr) as usize,
                    Access::LOCAL_WRITE,
                )?)
            };
            classes.push((
                Class {
                    srq,
                    buf,
                    size: c.size,
                    depth: attr.max_wr,
                },
                attr.max_wr,
            ));
        }
        let slot_size = wanted.iter().map(|c| c.size).max().expect("non-empty");
        let sbuf = if cfg.external_data {
            None
        } else {
            Some(DmaBuf::new(
                &ctx,
                &pd,
                SEND_SLOTS * slot_size as usize,
                Access::LOCAL_WRITE,
            )?)
        };
        let ch = ctx.create_cm_channel()?;
        let ps = match mode {
            Mode::Xrc => PortSpace::Ib,
            Mode::Rc { .. } => PortSpace::Tcp,
        };
        let listener = ch.create_id(ps)?;
        listener.listen(cfg.listen, 1024)?;
        let srqns: Vec<u32> = classes
            .iter()
            .filter_map(|(c, _)| c.srq.srq_num())
            .collect();
        let depths: Vec<u32> = classes.iter().map(|(_, d)| *d).collect();
        let classes: Vec<Class<C>> = classes.into_iter().map(|(c, _)| c).collect();
        let mut cc = ConnConfig::new(cfg.rank, cfg.node, cfg.job, mode, srqns);
        cc.max_retries = cfg.retries;
        cc.sq_max = cfg
            .sq_max
            .map_or(caps.max_qp_wr, |m| m.clamp(1, caps.max_qp_wr));
        let mgr = ConnManager::new(cc, [(cfg.rank, cfg.node)]);
        let d = ConnDriver {
            mgr,
            mode,
            cms: HashMap::new(),
            cm_of_key: HashMap::new(),
            stages: HashMap::new(),
            listener,
            ch,
            qps: HashMap::new(),
            qp_of_num: HashMap::new(),
            tgts: HashMap::new(),
            tgt_of_num: HashMap::new(),
            classes,
            xrcd,
            sbuf,
            slot_size,
            free_slots: (0..SEND_SLOTS).rev().collect(),
            send_cq,
            recv_cq,
            pd,
            ctx,
            cfg,
            routes: HashMap::new(),
            route_of_node: HashMap::new(),
            node_of: HashMap::new(),
            directory: HashMap::new(),
            next_ref: 1 << 62,
            paths: BTreeMap::new(),
            seq_out: HashMap::new(),
            last_now: Duration::ZERO,
            notices: VecDeque::new(),
            inbox: VecDeque::new(),
            stats: DriverStats::default(),
            destroyed: Vec::new(),
            srq_limits: Vec::new(),
        };
        if !d.cfg.external_data {
            for (class, depth) in depths.into_iter().enumerate() {
                for slot in 0..depth {
                    d.post_recv(class, slot)?;
                }
            }
        }
        Ok(d)
    }

    /// The address peers connect to.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr()
    }

    /// The transport chosen from the device caps.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Makes a rank known (its node and listener address).
    pub fn add_peer(&mut self, rank: Rank, node: Node, addr: SocketAddr) {
        self.node_of.insert(rank, node);
        self.directory.insert(rank, addr);
        self.mgr.add_peer(rank, node);
    }

    /// The connection manager (counters, state).
    pub fn manager(&self) -> &ConnManager {
        &self.mgr
    }

    /// What the driver counted.
    pub fn stats(&self) -> &DriverStats {
        &self.stats
    }

    /// Whether messages to `rank` can be sent now.
    pub fn is_ready(&self, rank: Rank) -> bool {
        self.paths.contains_key(&rank)
    }

    /// Asks for a connection to `rank` (made on demand; a ready one is
    /// reported again).
    pub fn connect(&mut self, now: Duration, rank: Rank) {
        self.mgr.connect(now, rank);
    }

    /// Starts a clean exit; progress until [`Notice::Drained`].
    pub fn shutdown(&mut self, now: Duration) {
        self.mgr.shutdown(now);
    }

    /// The next notice for the user.
    pub fn poll_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front()
    }

    /// The next message received.
    pub fn recv(&mut self) -> Option<Received> {
        self.inbox.pop_front()
    }

    /// The device context.
    pub fn context(&self) -> &C {
        &self.ctx
    }

    /// The protection domain every object of the rank lives in.
    pub fn pd(&self) -> &C::Pd {
        &self.pd
    }

    /// The CQ every send queue completes on.
    pub fn send_cq(&self) -> &C::Cq {
        &self.send_cq
    }

    /// The CQ every receive completes on.
    pub fn recv_cq(&self) -> &C::Cq {
        &self.recv_cq
    }

    /// The receive classes in use: (buffer size, SRQ depth), smallest
    /// first (RC mode keeps only the largest).
    pub fn classes(&self) -> Vec<(u32, u32)> {
        self.classes.iter().map(|c| (c.size, c.depth)).collect()
    }

    /// The SRQ of class `class`.
    pub fn srq(&self, class: usize) -> &C::Srq {
        &self.classes[class].srq
    }

    /// The path to `rank`, when messages may be posted to it: the QP and the
    /// peer's SRQ numbers (XRC).
    pub fn path(&self, rank: Rank) -> Option<(&C::Qp, &[u32])> {
        let p = self.paths.get(&rank)?;
        Some((self.qps.get(&p.qp)?, &p.srqns))
    }

    /// The numbers of the QPs destroyed since the last call: work posted on
    /// them will never complete.
    pub fn take_destroyed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.destroyed)
    }

    /// The classes whose SRQ fell below its armed limit since the last call.
    pub fn take_srq_limits(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.srq_limits)
    }

    /// The time of the last progress.
    pub fn last_now(&self) -> Duration {
        self.last_now
    }

    /// Posts receive buffer `slot` of `class` (wr_id: class << 32 | slot).
    fn post_recv(&self, class: usize, slot: u32) -> Result<()> {
        let c = &self.classes[class];
        let Some(buf) = &c.buf else {
            return Err(Error::state("the data path is external"));
        };
        let sge = [buf.sge((slot * c.size) as usize, c.size)];
        c.srq.post_recv(&RecvWr {
            wr_id: ((class as u64) << 32) | u64::from(slot),
            sgl: &sge,
        })
    }

    /// Sends `payload` to `rank` if a path is ready; a peer without one is
    /// connected to (on demand). `Ok(false)`: not ready yet, or no send
    /// resources right now; call again after progress.
    pub fn send(&mut self, rank: Rank, payload: &[u8]) -> Result<bool> {
        let need = (HEADER + payload.len()) as u32;
        if need > self.slot_size {
            return Err(Error::invalid(format!(
                "payload of {} bytes exceeds the largest class ({} bytes with the header)",
                payload.len(),
                self.slot_size
            )));
        }
        let Some(path) = self.paths.get(&rank) else {
            self.mgr.connect(self.last_now, rank);
            return Ok(false);
        };
        // The smallest class of the peer that fits (the classes are the
        // same on every rank of the job).
        let class = self
            .classes
            .iter()
            .position(|c| c.size >= need)
            .expect("the largest class fits");
        let srqn = path.srqns.get(class).copied();
        let Some(qp) = self.qps.get(&path.qp) else {
            return Ok(false);
        };
        let Some(sbuf) = &self.sbuf else {
            return Err(Error::state("the data path is external"));
        };
        let Some(slot) = self.free_slots.pop() else {
            return Ok(false);
        };
        let seq = self.seq_out.get(&rank).copied().unwrap_or(0);
        let off = slot * self.slot_size as usize;
        let mut msg = Vec::with_capacity(need as usize);
        msg.extend_from_slice(&self.cfg.rank.to_le_bytes());
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.extend_from_slice(payload);
        sbuf.write(off, &msg);
        let sge = [sbuf.sge(off, msg.len() as u32)];
        let mut wr = SendWr::send(slot as u64, &sge);
        if let Some(n) = srqn {
            wr = wr.to_srq(n);
        }
        match qp.post_send(&wr) {
            Ok(()) => {
                self.seq_out.insert(rank, seq.wrapping_add(1));
                self.stats.sent += 1;
                Ok(true)
            }
            Err(Error::NoResource(_)) => {
                self.free_slots.push(slot);
                Ok(false)
            }
            Err(e) => {
                self.free_slots.push(slot);
                Err(e)
            }
        }
    }

    fn fresh(&mut self) -> u64 {
        self.next_ref += 1;
        self.next_ref
    }

    /// Does whatever is pending: CM and async events, completions, timers,
    /// the manager's actions. Returns how much work it found.
    pub fn progress(&mut self, now: Duration) -> usize {
        self.last_now = now;
        let mut total = 0;
        loop {
            let mut work = 0;
            while let Some(ev) = self.ch.poll_event() {
                work += 1;
                self.on_cm_event(now, ev);
            }
            while let Some(ev) = self.ctx.poll_async_event() {
                work += 1;
                self.on_async(now, ev);
            }
            if !self.cfg.external_data {
                work += self.poll_send(now);
                work += self.poll_recv(now);
            }
            if self.mgr.poll_timeout().is_some_and(|t| t <= now) {
                work += 1;
                self.mgr.handle_timeout(now);
            }
            while let Some(a) = self.mgr.poll_action() {
                work += 1;
                self.execute(now, a);
            }
            while let Some(n) = self.mgr.poll_notice() {
                work += 1;
                match &n {
                    Notice::Ready { rank, path } => {
                        self.paths.insert(*rank, path.clone());
                    }
                    Notice::Lost { rank }
                    | Notice::Closed { rank }
                    | Notice::Failed { rank, .. } => {
                        self.paths.remove(rank);
                    }
                    Notice::Drained => {}
                }
                self.notices.push_back(n);
            }
            if work == 0 {
                return total;
            }
            total += work;
        }
    }

    fn poll_send(&mut self, now: Duration) -> usize {
        let mut wcs = [WorkCompletion::default(); 32];
        let Ok(n) = self.send_cq.poll(&mut wcs) else {
            return 0;
        };
        for wc in &wcs[..n] {
            if wc.wr_id != HELLO_WR {
                self.free_slots.push(wc.wr_id as usize);
            }
            if wc.status != WcStatus::Success {
                self.handle_send_failure(now, wc.qp_num);
            }
        }
        n
    }

    /// A send on QP `qpn` completed with an error: the path through it is
    /// broken.
    pub fn handle_send_failure(&mut self, now: Duration, qpn: u32) {
        self.stats.send_errors += 1;
        if let Some(&qp) = self.qp_of_num.get(&qpn) {
            self.mgr.handle(now, Event::QpFailed { qp });
        }
    }

    /// A zero-length message (the iWARP initiator's hello) arrived on QP
    /// `qpn`: the responder may speak now.
    pub fn handle_first_receive(&mut self, now: Duration, qpn: u32) {
        if let Some(&qp) = self.qp_of_num.get(&qpn) {
            self.mgr.handle(now, Event::FirstReceive { qp });
        }
    }

    fn poll_recv(&mut self, now: Duration) -> usize {
        let mut wcs = [WorkCompletion::default(); 32];
        let Ok(n) = self.recv_cq.poll(&mut wcs) else {
            return 0;
        };
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                continue;
            }
            let (class, slot) = ((wc.wr_id >> 32) as usize, wc.wr_id as u32);
            let len = wc.byte_len as usize;
            if len == 0 {
                // The iWARP initiator's first message: the responder may
                // speak now.
                self.handle_first_receive(now, wc.qp_num);
            } else if len >= HEADER {
                let c = &self.classes[class];
                let Some(buf) = &c.buf else { continue };
                let bytes = buf.read((slot * c.size) as usize, len);
                let src = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
                let seq = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
                self.inbox.push_back(Received {
                    src,
                    seq,
                    data: bytes[HEADER..].to_vec(),
                });
                self.stats.received += 1;
                if self.stats.received_by_class.len() <= class {
                    self.stats.received_by_class.resize(class + 1, 0);
                }
                self.stats.received_by_class[class] += 1;
            }
            // Keep the receive posted; a failure here is a broken SRQ.
            let _ = self.post_recv(class, slot);
        }
        n
    }

    fn on_async(&mut self, now: Duration, ev: AsyncEvent) {
        if let AsyncEvent::SrqLimitReached { srq } = ev {
            if let Some(class) = self.classes.iter().position(|c| c.srq.id() == srq) {
                self.srq_limits.push(class);
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
        if let Some(tgts) = self.tgt_of_num.get(&qpn).cloned() {
            for tgt in tgts {
                self.mgr.handle(now, Event::TgtFailed { tgt });
            }
        } else if let Some(&qp) = self.qp_of_num.get(&qpn) {
            if !matches!(ev, AsyncEvent::QpLastWqeReached { .. }) {
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
                self.stages.insert(cm, Stage::Route);
                let r = self.cms.get(&cm).map(|id| id.resolve_route(2_000));
                match r {
                    Some(Ok(())) => return,
                    _ => Event::ResolveFailed { cm },
                }
            }
            CmEventKind::RouteResolved => {
                self.stages.remove(&cm);
                let route = self.cms.get(&cm).and_then(|id| id.route());
                let peer_node = self
                    .cms
                    .get(&cm)
                    .and_then(|id| id.peer_addr())
                    .and_then(|a| {
                        self.directory
                            .iter()
                            .find(|(_, d)| d.ip() == a.ip())
                            .and_then(|(r, _)| self.node_of.get(r).copied())
                    });
                let rref = match (route, peer_node) {
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
            CmEventKind::Established => Event::Established {
                cm,
                data: ev.private_data,
            },
            CmEventKind::Rejected(RejectReason::Consumer) => Event::Failed {
                cm,
                how: CmFailure::Rejected,
                data: ev.private_data,
            },
            CmEventKind::Rejected(RejectReason::NoListener) => fail(CmFailure::NoListener),
            CmEventKind::Rejected(_) | CmEventKind::Unreachable | CmEventKind::ConnectError => {
                fail(CmFailure::Unreachable)
            }
            CmEventKind::Disconnected => Event::Disconnected { cm },
            CmEventKind::ConnectRequest => return,
        };
        self.mgr.handle(now, out);
    }

    fn execute(&mut self, now: Duration, a: Action) {
        match a {
            Action::CreateQp { qp, kind, sq_depth } => {
                let caps = self.ctx.caps();
                let qcaps = QpCaps {
                    max_send_wr: sq_depth.clamp(1, caps.max_qp_wr),
                    max_recv_wr: 0,
                    max_send_sge: 1,
                    max_recv_sge: 0,
                    max_inline: self.cfg.max_inline.min(caps.max_inline),
                };
                let (qp_type, srq) = match kind {
                    QpKind::Ini => (QpType::XrcIni, None),
                    QpKind::Rc => (QpType::Rc, Some(&self.classes[0].srq)),
                };
                let init = QpInit {
                    qp_type,
                    send_cq: &self.send_cq,
                    recv_cq: Some(&self.recv_cq),
                    srq,
                    caps: qcaps,
                };
                match self.ctx.create_qp(&self.pd, &init) {
                    Ok(q) => {
                        // Receives go to the SRQ: INIT now, the CM does the
                        // rest.
                        let _ = q.modify(&QpTransition::Init(Default::default()));
                        self.qp_of_num.insert(q.qp_num(), qp);
                        self.qps.insert(qp, q);
                    }
                    Err(_) => self.mgr.handle(now, Event::QpCreateFailed { qp }),
                }
            }
            Action::ResizeQp { qp, sq_depth } => {
                if let Some(q) = self.qps.get(&qp) {
                    if q.resize_send_queue(sq_depth).is_err() {
                        self.stats.resize_unsupported += 1;
                    }
                }
            }
            Action::DestroyQp { qp } => {
                if let Some(q) = self.qps.remove(&qp) {
                    self.qp_of_num.remove(&q.qp_num());
                    self.destroyed.push(q.qp_num());
                }
            }
            Action::CreateTgt { tgt } => {
                let made = self.xrcd.as_ref().map(|x| self.ctx.create_tgt_qp(x));
                match made {
                    Some(Ok(q)) => {
                        let qpn = q.qp_num();
                        self.tgt_of_num.entry(qpn).or_default().push(tgt);
                        self.tgts.insert(tgt, q);
                        self.mgr.handle(now, Event::TgtCreated { tgt, qpn });
                    }
                    _ => self.mgr.handle(now, Event::TgtCreateFailed { tgt }),
                }
            }
            Action::OpenTgt { tgt, qpn } => {
                let opened = self.xrcd.as_ref().map(|x| self.ctx.open_tgt_qp(x, qpn));
                let ok = match opened {
                    Some(Ok(q)) => {
                        self.tgt_of_num.entry(qpn).or_default().push(tgt);
                        self.tgts.insert(tgt, q);
                        true
                    }
                    _ => false,
                };
                self.mgr.handle(now, Event::TgtOpened { tgt, ok });
            }
            Action::CloseTgt { tgt } => {
                if let Some(q) = self.tgts.remove(&tgt) {
                    let qpn = q.qp_num();
                    if let Some(v) = self.tgt_of_num.get_mut(&qpn) {
                        v.retain(|t| *t != tgt);
                        if v.is_empty() {
                            self.tgt_of_num.remove(&qpn);
                        }
                    }
                }
            }
            Action::BreakTgt { tgt } => {
                if let Some(q) = self.tgts.get(&tgt) {
                    let _ = q.modify(&QpTransition::Error);
                }
            }
            Action::Resolve { cm, rank, route } => {
                let ps = match self.mode {
                    Mode::Xrc => PortSpace::Ib,
                    Mode::Rc { .. } => PortSpace::Tcp,
                };
                let Some(&addr) = self.directory.get(&rank) else {
                    return self.mgr.handle(now, Event::ResolveFailed { cm });
                };
                let id = match self.ch.create_id(ps) {
                    Ok(id) => id,
                    Err(_) => return self.mgr.handle(now, Event::ResolveFailed { cm }),
                };
                let cached = route.and_then(|r| self.routes.get(&r));
                let started = match cached {
                    Some(r) => id.resolve_cached(addr, r, 2_000),
                    None => id.resolve_addr(addr, 2_000),
                };
                self.cm_of_key.insert(id.key(), cm);
                self.cms.insert(cm, id);
                self.stages.insert(cm, Stage::Addr);
                if started.is_err() {
                    self.mgr.handle(now, Event::ResolveFailed { cm });
                }
            }
            Action::Connect { cm, qp, data } => {
                let q = qp.and_then(|q| self.qps.get(&q));
                let r = self
                    .cms
                    .get(&cm)
                    .map(|id| id.connect(q, &ConnParam::with_data(&data)));
                if !matches!(r, Some(Ok(()))) {
                    self.mgr.handle(now, fail_event(cm));
                }
            }
            Action::Accept { cm, qp, tgt, data } => {
                let q = qp
                    .and_then(|q| self.qps.get(&q))
                    .or_else(|| tgt.and_then(|t| self.tgts.get(&t)));
                let r = self
                    .cms
                    .get(&cm)
                    .map(|id| id.accept(q, &ConnParam::with_data(&data)));
                if !matches!(r, Some(Ok(()))) {
                    self.mgr.handle(now, Event::Disconnected { cm });
                }
            }
            Action::Reject { cm, data } => {
                if let Some(id) = self.cms.get(&cm) {
                    let _ = id.reject(&data);
                }
            }
            Action::DestroyCm { cm } => {
                if let Some(id) = self.cms.remove(&cm) {
                    self.cm_of_key.remove(&id.key());
                }
                self.stages.remove(&cm);
            }
            Action::SendHello { qp } => {
                if let Some(q) = self.qps.get(&qp) {
                    let _ = q.post_send(&SendWr::send(HELLO_WR, &[]));
                }
            }
        }
    }
}

fn fail_event(cm: CmRef) -> Event {
    Event::Failed {
        cm,
        how: CmFailure::Unreachable,
        data: Vec::new(),
    }
}
