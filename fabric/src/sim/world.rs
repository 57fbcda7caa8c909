//! The simulated world: every node, device, process and verbs object, the
//! virtual clock and the event queue.
//!
//! Everything here runs under one lock ([`super::Shared`]). Objects live in
//! arenas and name each other by generation-checked ids; user handles
//! (`handles.rs`) hold ids too, so that a crashed process's objects vanish at
//! once while its handles turn into `ProcessGone`.
//!
//! Nothing here iterates a `HashMap` to make a decision: the seed alone
//! decides what happens.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) use super::arena::{Arena, Id};
use super::rng::Rng;
use super::{SimConfig, SimStats};
use crate::cm::{CmEventKind, PortSpace};
use crate::types::*;
use crate::{Error, Result};

/// Index of a device in [`World::devs`].
pub(crate) type DevIdx = usize;

pub(crate) struct Dev {
    pub node: usize,
    pub name: String,
    pub caps: DeviceCaps,
    /// See [`super::SimDevice::resizable_send_queue`].
    pub resizable_sq: bool,
    /// See [`super::SimDevice::tgt_error_events`].
    pub tgt_error_events: bool,
    /// See [`super::SimDevice::costly_events`].
    pub costly_events: bool,
    pub lid: u16,
    pub gid: Gid,
    pub ip: Ipv4Addr,
    pub port_up: bool,
    pub lkeys: HashMap<u32, Id<MrObj>>,
    pub rkeys: HashMap<u32, Id<MrObj>>,
    pub qps: HashMap<u32, Id<QpObj>>,
    pub xrc_srqs: HashMap<u32, Id<SrqObj>>,
    /// SRQs (plain and XRC) living on the device, against `max_srq`.
    pub srq_count: u32,
    pub xrcds: BTreeMap<PathBuf, Id<XrcdObj>>,
    /// When the port's transmitter is free again: every packet the device
    /// sends (requests and read responses of all its QPs) shares the link.
    pub tx_free_at: u64,
}

pub(crate) struct Proc {
    pub node: usize,
    pub pid: u32,
    pub alive: bool,
    /// Bumped whenever something is queued for the process (a completion,
    /// an async event, a CM event): a harness progresses only processes
    /// whose count moved.
    pub activity: u64,
    /// It took something from one of its queues and has not polled an
    /// empty one since: it is still reacting (the causal clock waits).
    pub busy: bool,
    /// CM messages its ids sent (resends included).
    pub cm_sent: u64,
    /// CM messages that reached its ids and listeners.
    pub cm_received: u64,
    /// The verbs it called.
    pub verbs: super::VerbCounts,
}

pub(crate) struct Ctx {
    pub proc: Id<Proc>,
    pub dev: DevIdx,
    pub events: VecDeque<AsyncEvent>,
}

pub(crate) struct PdObj {
    pub ctx: Id<Ctx>,
}

pub(crate) struct MrObj {
    pub ctx: Id<Ctx>,
    pub pd: Id<PdObj>,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub lkey: u32,
    pub rkey: u32,
    /// The memory under it was unmapped, remapped or emptied: like a real
    /// device, which keeps the old pages pinned, the region no longer
    /// reaches what the process now has at those addresses.
    pub detached: bool,
    /// Registered through [`crate::Context::reg_mr_cached`]: only such
    /// regions may outlive their memory, so only they are detached.
    pub tracked: bool,
}

/// A completion plus what polling it releases.
pub(crate) struct Cqe {
    pub wc: WorkCompletion,
    /// The QP whose send-queue slots it releases.
    pub qp: Option<Id<QpObj>>,
    /// How many send-queue slots (this request and the unsignaled ones
    /// before it).
    pub slots: u32,
}

pub(crate) struct CqObj {
    pub ctx: Id<Ctx>,
    pub cap: u32,
    pub entries: VecDeque<Cqe>,
    pub overrun: bool,
    /// How it was polled.
    pub polls: super::CqPolls,
}

pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sgl: Vec<Sge>,
}

pub(crate) struct XrcSrqInfo {
    pub xrcd: Id<XrcdObj>,
    pub cq: Id<CqObj>,
    pub srqn: u32,
}

pub(crate) struct SrqObj {
    pub ctx: Id<Ctx>,
    pub pd: Id<PdObj>,
    pub xrc: Option<XrcSrqInfo>,
    pub wqes: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
    pub limit: u32,
}

pub(crate) struct XrcdObj {
    pub dev: DevIdx,
    pub key: PathBuf,
    /// Handles plus TGT QPs living in the domain.
    pub refs: u32,
}

pub(crate) struct XrcdHandle {
    pub ctx: Id<Ctx>,
    pub xrcd: Id<XrcdObj>,
}

/// A send work request from post to completion.
pub(crate) struct SqEntry {
    pub wr_id: u64,
    pub psn: u64,
    pub op: SendOp,
    pub signaled: bool,
    pub srqn: Option<u32>,
    /// The request's SGEs (for a read, the sink).
    pub sgl: Vec<Sge>,
    /// Inline bytes, or the bytes gathered at first transmission.
    pub data: Option<Arc<[u8]>>,
    pub len: u32,
    pub rnr_tries: u8,
    /// Completed when it went on the wire (iWARP sends and writes).
    pub done: bool,
}

pub(crate) struct QpObj {
    pub dev: DevIdx,
    pub qpn: u32,
    pub ty: QpType,
    pub state: QpState,
    pub pd: Option<Id<PdObj>>,
    pub xrcd: Option<Id<XrcdObj>>,
    pub send_cq: Option<Id<CqObj>>,
    pub recv_cq: Option<Id<CqObj>>,
    pub srq: Option<Id<SrqObj>>,
    pub caps: QpCaps,
    /// Every open handle; one for RC and INI QPs, one per opener for TGT QPs.
    pub handles: Vec<Id<QpHandle>>,
    pub access: Access,
    /// Peer device (None if the RTR address matched no device) and QPN.
    pub peer: Option<(Option<DevIdx>, u32)>,
    pub min_rnr_timer: u8,
    /// The CM moved it to INIT (with the port and P_Key of its route), not
    /// the application.
    pub init_by_cm: bool,
    pub rts: RtsAttr,
    pub rq: VecDeque<RecvWqe>,
    // Requester.
    pub sq: VecDeque<SqEntry>,
    /// Entries of `sq` transmitted in the current epoch.
    pub sent: usize,
    pub sq_used: u32,
    pub uncovered: u32,
    pub next_psn: u64,
    /// Bumped on every rewind (RNR, timeout, error): stale transmissions and
    /// deliveries are ignored.
    pub epoch: u64,
    pub tx_scheduled: bool,
    pub timer_gen: u64,
    pub timer_armed: bool,
    pub retries: u8,
    pub last_arrival: u64,
    // Responder.
    pub expected_psn: u64,
    pub last_response: u64,
    /// What the latest atomics returned, by PSN: a retransmitted atomic is
    /// answered from here, never executed twice.
    pub atomic_replies: VecDeque<(u64, [u8; 8])>,
    // iWARP peer-to-peer bookkeeping.
    pub iwarp_responder: bool,
    /// The QP reported its last receive from its SRQ (LAST_WQE_REACHED).
    pub last_wqe: bool,
    pub heard: bool,
    pub cm_id: Option<Id<CmIdObj>>,
    // Statistics.
    pub rnr_naks: u64,
    pub timeouts: u64,
}

pub(crate) struct QpHandle {
    pub ctx: Id<Ctx>,
    pub qp: Id<QpObj>,
}

pub(crate) struct CmChannelObj {
    pub ctx: Id<Ctx>,
    pub events: VecDeque<PendingCmEvent>,
}

pub(crate) struct PendingCmEvent {
    pub id: Id<CmIdObj>,
    pub kind: CmEventKind,
    pub private_data: Vec<u8>,
    pub remote_qpn: Option<u32>,
    pub peer: Option<SocketAddrV4>,
    pub new_id: Option<Id<CmIdObj>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmState {
    Idle,
    Listening,
    AddrResolving,
    AddrResolved,
    RouteResolving,
    RouteResolved,
    Connecting,
    RequestReceived,
    Accepting,
    Established,
    Disconnecting,
    Disconnected,
    Failed,
}

/// What a connection request carried, kept by the passive side.
#[derive(Clone)]
pub(crate) struct ReqInfo {
    pub qpn: Option<u32>,
    pub psn: u32,
    pub rnr_retry: u8,
    pub retry: u8,
}

pub(crate) struct CmIdObj {
    pub ctx: Id<Ctx>,
    pub channel: Id<CmChannelObj>,
    pub ps: PortSpace,
    pub state: CmState,
    pub local: Option<SocketAddrV4>,
    pub remote: Option<SocketAddrV4>,
    pub remote_dev: Option<DevIdx>,
    pub qp: Option<Id<QpObj>>,
    pub peer_id: Option<Id<CmIdObj>>,
    pub listener: Option<Id<CmIdObj>>,
    /// Listener: children by the requesting id, to recognise duplicates.
    pub children: HashMap<Id<CmIdObj>, Id<CmIdObj>>,
    /// The last message sent that a timer may resend.
    pub last_sent: Option<super::cm::CmWire>,
    pub retries: u32,
    pub timer_gen: u64,
    pub psn: u32,
    pub req: Option<ReqInfo>,
    /// Resolved from a cached route: route resolution is local.
    pub route_cached: bool,
    /// Timers the application set for the QP the CM connects.
    pub timers: crate::cm::QpTimers,
    /// This request's entry in the IB CM's stale-connection table.
    pub stale_key: Option<(DevIdx, u32, DevIdx)>,
}

/// Something that happens at a point of virtual time.
pub(crate) enum Event {
    Tx {
        qp: Id<QpObj>,
        epoch: u64,
    },
    Deliver(Box<super::transport::Delivery>),
    Response {
        qp: Id<QpObj>,
        from_dev: DevIdx,
        psn: u64,
        epoch: u64,
        resp: super::transport::Resp,
    },
    AckTimeout {
        qp: Id<QpObj>,
        gen: u64,
    },
    Cm(Box<super::cm::CmDelivery>),
    CmTimer {
        id: Id<CmIdObj>,
        gen: u64,
    },
    CmLocal {
        id: Id<CmIdObj>,
        kind: CmEventKind,
        next: CmState,
    },
    /// A connect request reaches the listener's process.
    CmUpcall(Box<PendingCmEvent>),
}

struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

pub(crate) struct World {
    pub cfg: SimConfig,
    pub now: u64,
    seq: u64,
    pub rng: Rng,
    queue: BinaryHeap<Reverse<Scheduled>>,
    pub devs: Vec<Dev>,
    pub procs: Arena<Proc>,
    pub ctxs: Arena<Ctx>,
    pub pds: Arena<PdObj>,
    pub mrs: Arena<MrObj>,
    pub cqs: Arena<CqObj>,
    pub srqs: Arena<SrqObj>,
    pub xrcds: Arena<XrcdObj>,
    pub xrcd_handles: Arena<XrcdHandle>,
    pub qps: Arena<QpObj>,
    pub qp_handles: Arena<QpHandle>,
    pub channels: Arena<CmChannelObj>,
    pub cm_ids: Arena<CmIdObj>,
    pub listeners: HashMap<SocketAddrV4, Id<CmIdObj>>,
    pub next_port: u16,
    pub next_pid: u32,
    /// (local node, remote node) pairs whose address is cached.
    pub arp_cache: HashSet<(usize, usize)>,
    /// ARP and path queries sent, by (local node, remote node).
    pub pair_queries: HashMap<(usize, usize), super::PairQueries>,
    /// The IB CM's table of requests and connections by (receiving device,
    /// announced QP number, sending device), for its stale-connection
    /// check.
    pub remote_qpns: HashMap<(DevIdx, u32, DevIdx), Id<CmIdObj>>,
    pub faults: super::faults::FaultState,
    /// When each node's CM agent is free again.
    pub cm_busy_until: Vec<u64>,
    /// Pids of the processes something was queued for since the last
    /// [`super::SimFabric::take_touched`].
    pub touched: BTreeSet<u32>,
    pub stats: SimStats,
    /// Reports of memory that changed under registered regions (none where
    /// userfaultfd is unavailable: regions then always reach the current
    /// memory).
    pub unmaps: Option<crate::Subscriber>,
    pub unmapped: Vec<crate::Invalidation>,
    /// Rolling hash of every processed event: equal seeds give equal traces.
    pub trace: u64,
    /// Whether an empty poll may move the clock (see [`World::poll_progress`]).
    pub auto_advance: bool,
    /// With the automatic clock: time moves only while no process has
    /// something queued that it has not polled yet.
    pub causal: bool,
    /// Rewrites the bytes of arriving sends (see [`super::SimFabric::tamper`]).
    pub tamper: Option<super::Tamper>,
}

impl World {
    pub(crate) fn new(cfg: SimConfig) -> Self {
        let mut devs = Vec::new();
        for node in 0..cfg.nodes {
            for (i, d) in cfg.devices.iter().enumerate() {
                let hi = (node >> 8) as u8;
                let lo = (node & 0xff) as u8;
                let ip = Ipv4Addr::new(10, hi, lo, i as u8 + 1);
                let mut gid = [0u8; 16];
                gid[10] = 0xff;
                gid[11] = 0xff;
                gid[12..].copy_from_slice(&ip.octets());
                devs.push(Dev {
                    node,
                    name: d.name.clone(),
                    caps: d.caps.clone(),
                    resizable_sq: d.resizable_send_queue,
                    tgt_error_events: d.tgt_error_events,
                    costly_events: d.costly_events,
                    lid: if d.caps.transport == Transport::Infiniband {
                        (devs.len() + 1) as u16
                    } else {
                        0
                    },
                    gid: Gid(gid),
                    ip,
                    port_up: true,
                    lkeys: HashMap::new(),
                    rkeys: HashMap::new(),
                    qps: HashMap::new(),
                    xrc_srqs: HashMap::new(),
                    srq_count: 0,
                    xrcds: BTreeMap::new(),
                    tx_free_at: 0,
                });
            }
        }
        let seed = cfg.seed;
        let nodes_for_cm = cfg.nodes;
        World {
            cfg,
            now: 0,
            seq: 0,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            devs,
            procs: Arena::default(),
            ctxs: Arena::default(),
            pds: Arena::default(),
            mrs: Arena::default(),
            cqs: Arena::default(),
            srqs: Arena::default(),
            xrcds: Arena::default(),
            xrcd_handles: Arena::default(),
            qps: Arena::default(),
            qp_handles: Arena::default(),
            channels: Arena::default(),
            cm_ids: Arena::default(),
            listeners: HashMap::new(),
            next_port: 20000,
            next_pid: 1,
            arp_cache: HashSet::new(),
            pair_queries: HashMap::new(),
            remote_qpns: HashMap::new(),
            faults: Default::default(),
            cm_busy_until: vec![0; nodes_for_cm],
            touched: BTreeSet::new(),
            stats: SimStats::default(),
            trace: 0xcbf2_9ce4_8422_2325,
            auto_advance: true,
            causal: false,
            tamper: None,
            unmaps: crate::MemMonitor::acquire().and_then(|m| m.subscribe()),
            unmapped: Vec::new(),
        }
    }

    // ---- time and events -------------------------------------------------

    pub(crate) fn schedule(&mut self, at: u64, event: Event) {
        debug_assert!(at >= self.now, "event scheduled in the past");
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            event,
        }));
    }

    pub(crate) fn schedule_in(&mut self, delay_ns: u64, event: Event) {
        let at = self.now + delay_ns;
        self.schedule(at, event);
    }

    /// Makes progress: runs the events due now, or else moves the clock to
    /// the next event and runs what is due then, or else lets an idle tick
    /// pass. Returns whether any event ran.
    pub(crate) fn progress(&mut self) -> bool {
        let next = match self.queue.peek() {
            Some(Reverse(s)) => s.at,
            None => {
                self.now += self.cfg.timing.idle_tick_ns;
                return false;
            }
        };
        if next > self.now {
            self.now = next;
        }
        let mut ran = 0u32;
        while let Some(Reverse(s)) = self.queue.peek() {
            if s.at > self.now {
                break;
            }
            let Reverse(s) = self.queue.pop().expect("peeked");
            self.trace = (self.trace ^ s.seq ^ (s.at << 20)).wrapping_mul(0x100_0000_01b3);
            self.stats.events += 1;
            self.run(s.event);
            ran += 1;
        }
        ran > 0
    }

    /// What an empty poll does: with the automatic clock, progress (perhaps
    /// moving time); with the manual clock, only run what is due now, so
    /// that time moves only when the owner of the world says every agent is
    /// idle.
    pub(crate) fn poll_progress(&mut self) -> bool {
        if self.auto_advance && !self.held_back() {
            self.progress()
        } else {
            self.run_due()
        }
    }

    /// Whether the causal clock holds time back: some process has
    /// completions, CM events or async events it has not polled yet, or is
    /// still reacting to what it took (it must see and answer them at the
    /// instant they happened, however slowly its thread runs).
    pub(crate) fn held_back(&self) -> bool {
        self.causal
            && (self.procs.iter().any(|(_, p)| p.alive && p.busy)
                || self.cqs.iter().any(|(_, c)| !c.entries.is_empty())
                || self.channels.iter().any(|(_, c)| !c.events.is_empty())
                || self.ctxs.iter().any(|(_, c)| !c.events.is_empty()))
    }

    /// The verb counters of the process that opened `ctx`.
    pub(crate) fn verbs_of(&mut self, ctx: Id<Ctx>) -> Option<&mut super::VerbCounts> {
        let p = self.ctxs.get(ctx)?.proc;
        self.procs.get_mut(p).map(|p| &mut p.verbs)
    }

    /// The process of `ctx` polled one of its queues and `found` something
    /// (it is reacting until it polls an empty one).
    pub(crate) fn polled(&mut self, ctx: Id<Ctx>, found: bool) {
        if let Some(p) = self.ctxs.get(ctx).map(|c| c.proc) {
            if let Some(p) = self.procs.get_mut(p) {
                p.busy = found;
            }
        }
    }

    /// Runs the events due at the current time.
    pub(crate) fn run_due(&mut self) -> bool {
        let mut ran = false;
        while let Some(Reverse(s)) = self.queue.peek() {
            if s.at > self.now {
                break;
            }
            self.progress();
            ran = true;
        }
        ran
    }

    /// Runs events until `deadline_ns` (inclusive) and sets the clock there.
    pub(crate) fn run_until(&mut self, deadline_ns: u64) {
        while let Some(Reverse(s)) = self.queue.peek() {
            if s.at > deadline_ns {
                break;
            }
            self.progress();
        }
        if self.now < deadline_ns {
            self.now = deadline_ns;
        }
    }

    /// When the next event is due.
    pub(crate) fn next_event_at(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse(s)| s.at)
    }

    /// Whether anything is scheduled.
    pub(crate) fn has_events(&self) -> bool {
        !self.queue.is_empty()
    }

    fn run(&mut self, event: Event) {
        match event {
            Event::Tx { qp, epoch } => self.on_tx(qp, epoch),
            Event::Deliver(d) => self.on_deliver(*d),
            Event::Response {
                qp,
                from_dev,
                psn,
                epoch,
                resp,
            } => self.on_response(qp, from_dev, psn, epoch, resp),
            Event::AckTimeout { qp, gen } => self.on_ack_timeout(qp, gen),
            Event::Cm(d) => self.on_cm(*d),
            Event::CmTimer { id, gen } => self.on_cm_timer(id, gen),
            Event::CmLocal { id, kind, next } => self.on_cm_local(id, kind, next),
            Event::CmUpcall(ev) => self.post_cm_event(ev.id, *ev),
        }
    }

    // ---- lookups ---------------------------------------------------------

    /// The live context, or `ProcessGone` if its process has exited.
    pub(crate) fn ctx(&self, ctx: Id<Ctx>) -> Result<&Ctx> {
        self.ctxs.get(ctx).ok_or(Error::ProcessGone)
    }

    pub(crate) fn ctx_dev(&self, ctx: Id<Ctx>) -> Result<DevIdx> {
        Ok(self.ctx(ctx)?.dev)
    }

    pub(crate) fn qp_of_handle(&self, h: Id<QpHandle>) -> Result<Id<QpObj>> {
        self.qp_handles
            .get(h)
            .map(|h| h.qp)
            .ok_or(Error::ProcessGone)
    }

    /// Whether traffic between two devices is cut (partition or port down).
    pub(crate) fn path_down(&self, a: DevIdx, b: DevIdx) -> bool {
        !self.devs[a].port_up
            || !self.devs[b].port_up
            || self
                .faults
                .partitioned(self.devs[a].node, self.devs[b].node)
    }

    pub(crate) fn dev_by_gid(&self, addr: &PortAddr) -> Option<DevIdx> {
        self.devs.iter().position(|d| {
            d.gid == addr.gid || (d.lid != 0 && d.lid == addr.lid && addr.gid == Gid::default())
        })
    }

    pub(crate) fn dev_by_ip(&self, ip: Ipv4Addr) -> Option<DevIdx> {
        self.devs.iter().position(|d| d.ip == ip)
    }

    // ---- async events ----------------------------------------------------

    pub(crate) fn push_async(&mut self, ctx: Id<Ctx>, ev: AsyncEvent) {
        if let Some(c) = self.ctxs.get_mut(ctx) {
            c.events.push_back(ev);
            self.stats.async_events += 1;
            self.touch(ctx);
        }
    }

    /// Notes that something was queued for the process owning `ctx`.
    pub(crate) fn touch(&mut self, ctx: Id<Ctx>) {
        if let Some(p) = self.ctxs.get(ctx).map(|c| c.proc) {
            if let Some(p) = self.procs.get_mut(p) {
                p.activity += 1;
                self.touched.insert(p.pid);
            }
        }
    }

    /// Delivers a QP-affiliated event to every process holding the QP (for a
    /// shared TGT QP, every opener), once per context.
    pub(crate) fn push_qp_async(&mut self, qp: Id<QpObj>, ev: AsyncEvent) {
        let Some(q) = self.qps.get(qp) else { return };
        let mut ctxs: Vec<Id<Ctx>> = q
            .handles
            .iter()
            .filter_map(|h| self.qp_handles.get(*h).map(|h| h.ctx))
            .collect();
        ctxs.dedup();
        for c in ctxs {
            self.push_async(c, ev);
        }
    }

    // ---- processes and contexts -----------------------------------------

    pub(crate) fn spawn(&mut self, node: usize) -> Result<Id<Proc>> {
        if node >= self.cfg.nodes {
            return Err(Error::invalid(format!(
                "node {node} out of range (the fabric has {} nodes)",
                self.cfg.nodes
            )));
        }
        let pid = self.next_pid;
        self.next_pid += 1;
        Ok(self.procs.insert(Proc {
            node,
            pid,
            alive: true,
            activity: 0,
            busy: false,
            cm_sent: 0,
            cm_received: 0,
            verbs: super::VerbCounts::default(),
        }))
    }

    pub(crate) fn open_ctx(&mut self, proc: Id<Proc>, name: &str) -> Result<Id<Ctx>> {
        let p = self.procs.get(proc).ok_or(Error::ProcessGone)?;
        if !p.alive {
            return Err(Error::ProcessGone);
        }
        let node = p.node;
        let dev = self
            .devs
            .iter()
            .position(|d| d.node == node && d.name == name)
            .ok_or_else(|| Error::not_found(format!("device {name} on node {node}")))?;
        Ok(self.ctxs.insert(Ctx {
            proc,
            dev,
            events: VecDeque::new(),
        }))
    }

    /// Ends a process: the kernel closes every object it held, in the order
    /// a careful process would (CM ids, QPs, SRQs, CQs, MRs, PDs, domains).
    pub(crate) fn exit_process(&mut self, proc: Id<Proc>) {
        let Some(p) = self.procs.get_mut(proc) else {
            return;
        };
        if !p.alive {
            return;
        }
        p.alive = false;
        for ctx in self.ctxs.ids_where(|c| c.proc == proc) {
            self.close_ctx(ctx);
        }
    }

    pub(crate) fn close_ctx(&mut self, ctx: Id<Ctx>) {
        if !self.ctxs.contains(ctx) {
            return;
        }
        for id in self.cm_ids.ids_where(|c| c.ctx == ctx) {
            self.destroy_cm_id(id);
        }
        for ch in self.channels.ids_where(|c| c.ctx == ctx) {
            self.channels.remove(ch);
        }
        for h in self.qp_handles.ids_where(|h| h.ctx == ctx) {
            self.close_qp_handle(h);
        }
        for s in self.srqs.ids_where(|s| s.ctx == ctx) {
            self.destroy_srq(s);
        }
        for c in self.cqs.ids_where(|c| c.ctx == ctx) {
            self.cqs.remove(c);
        }
        for m in self.mrs.ids_where(|m| m.ctx == ctx) {
            self.dereg_mr(m);
        }
        for p in self.pds.ids_where(|p| p.ctx == ctx) {
            self.pds.remove(p);
        }
        for x in self.xrcd_handles.ids_where(|x| x.ctx == ctx) {
            self.close_xrcd_handle(x);
        }
        self.ctxs.remove(ctx);
    }

    // ---- PDs and MRs -----------------------------------------------------

    pub(crate) fn alloc_pd(&mut self, ctx: Id<Ctx>) -> Result<Id<PdObj>> {
        self.ctx(ctx)?;
        Ok(self.pds.insert(PdObj { ctx }))
    }

    fn fresh_key(&mut self, dev: DevIdx) -> u32 {
        loop {
            let k = self.rng.next_u32();
            let d = &self.devs[dev];
            if k != 0 && !d.lkeys.contains_key(&k) && !d.rkeys.contains_key(&k) {
                return k;
            }
        }
    }

    pub(crate) fn reg_mr(
        &mut self,
        ctx: Id<Ctx>,
        pd: Id<PdObj>,
        addr: u64,
        len: u64,
        access: Access,
        tracked: bool,
    ) -> Result<Id<MrObj>> {
        let dev = self.ctx_dev(ctx)?;
        if !self.pds.contains(pd) {
            return Err(Error::ProcessGone);
        }
        self.devs[dev].caps.check_mr_len(len)?;
        if addr.checked_add(len).is_none() {
            return Err(Error::invalid("region wraps the address space"));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            // The verbs reject remote write without local write (EINVAL).
            return Err(Error::invalid("REMOTE_WRITE requires LOCAL_WRITE"));
        }
        let lkey = self.fresh_key(dev);
        let rkey = self.fresh_key(dev);
        if tracked {
            // Reports of unmaps before this registration concern earlier
            // mappings at these addresses, not this one.
            self.apply_unmaps();
            if let Some(u) = &self.unmaps {
                // Memory that cannot be watched (file mappings) is never
                // detached; the simulator then reads whatever is mapped
                // there.
                let _ = u.monitor().watch(addr as usize, len as usize);
            }
        }
        let id = self.mrs.insert(MrObj {
            ctx,
            pd,
            addr,
            len,
            access,
            lkey,
            rkey,
            detached: false,
            tracked,
        });
        let d = &mut self.devs[dev];
        d.lkeys.insert(lkey, id);
        d.rkeys.insert(rkey, id);
        Ok(id)
    }

    pub(crate) fn dereg_mr(&mut self, mr: Id<MrObj>) {
        let Some(m) = self.mrs.remove(mr) else { return };
        if let Some(c) = self.ctxs.get(m.ctx) {
            let d = &mut self.devs[c.dev];
            d.lkeys.remove(&m.lkey);
            d.rkeys.remove(&m.rkey);
        }
    }

    // ---- CQs -------------------------------------------------------------

    pub(crate) fn create_cq(&mut self, ctx: Id<Ctx>, cqe: u32) -> Result<Id<CqObj>> {
        let dev = self.ctx_dev(ctx)?;
        let max = self.devs[dev].caps.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::invalid(format!("cqe {cqe} not in 1..={max}")));
        }
        Ok(self.cqs.insert(CqObj {
            ctx,
            cap: cqe,
            entries: VecDeque::new(),
            overrun: false,
            polls: super::CqPolls::default(),
        }))
    }

    /// Adds a completion; on overrun the CQ breaks, its owner hears of it and
    /// the QP that overran it goes to the error state.
    pub(crate) fn push_cqe(&mut self, cq: Id<CqObj>, cqe: Cqe, culprit: Option<Id<QpObj>>) {
        let Some(c) = self.cqs.get_mut(cq) else {
            return;
        };
        if c.overrun {
            return;
        }
        if c.entries.len() as u32 >= c.cap {
            c.overrun = true;
            let ctx = c.ctx;
            self.stats.cq_overruns += 1;
            self.push_async(ctx, AsyncEvent::CqError { cq: cq.raw() });
            if let Some(qp) = culprit {
                self.qp_to_error(qp, Some(QpErrorEvent::Fatal));
            }
            return;
        }
        c.entries.push_back(cqe);
        let ctx = c.ctx;
        self.touch(ctx);
    }

    pub(crate) fn poll_cq(&mut self, cq: Id<CqObj>, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = self.cqs.get_mut(cq).ok_or(Error::ProcessGone)?;
        if c.overrun {
            return Err(Error::CqOverrun);
        }
        let n = out.len().min(c.entries.len());
        let mut released: Vec<(Id<QpObj>, u32)> = Vec::new();
        for slot in out.iter_mut().take(n) {
            let e = c.entries.pop_front().expect("counted");
            *slot = e.wc;
            if let (Some(qp), true) = (e.qp, e.slots > 0) {
                released.push((qp, e.slots));
            }
        }
        for (qp, slots) in released {
            if let Some(q) = self.qps.get_mut(qp) {
                debug_assert!(q.sq_used >= slots, "releasing more SQ slots than used");
                q.sq_used = q.sq_used.saturating_sub(slots);
            }
        }
        Ok(n)
    }

    // ---- SRQs and XRC domains ---------------------------------------------

    pub(crate) fn create_srq(
        &mut self,
        ctx: Id<Ctx>,
        pd: Id<PdObj>,
        xrc: Option<(Id<XrcdHandle>, Id<CqObj>)>,
        attr: SrqAttr,
    ) -> Result<Id<SrqObj>> {
        let dev = self.ctx_dev(ctx)?;
        let caps = self.devs[dev].caps.clone();
        if !caps.srq {
            return Err(Error::Unsupported("device has no shared receive queues"));
        }
        if attr.max_wr == 0 || attr.max_wr > caps.max_srq_wr {
            return Err(Error::invalid(format!(
                "SRQ max_wr {} not in 1..={}",
                attr.max_wr, caps.max_srq_wr
            )));
        }
        if attr.max_sge == 0 || attr.max_sge > caps.max_sge {
            return Err(Error::invalid(format!(
                "SRQ max_sge {} not in 1..={}",
                attr.max_sge, caps.max_sge
            )));
        }
        if self.devs[dev].srq_count >= caps.max_srq {
            return Err(Error::NoResource("device SRQ table full"));
        }
        let xrc = match xrc {
            None => None,
            Some((xh, cq)) => {
                if !caps.xrc {
                    return Err(Error::Unsupported("device has no XRC"));
                }
                let xrcd = self.xrcd_handles.get(xh).ok_or(Error::ProcessGone)?.xrcd;
                if !self.cqs.contains(cq) {
                    return Err(Error::ProcessGone);
                }
                let srqn = loop {
                    let n = self.rng.next_u32() & 0x00ff_ffff;
                    if n != 0 && !self.devs[dev].xrc_srqs.contains_key(&n) {
                        break n;
                    }
                };
                Some(XrcSrqInfo { xrcd, cq, srqn })
            }
        };
        let srqn = xrc.as_ref().map(|x| x.srqn);
        self.devs[dev].srq_count += 1;
        let id = self.srqs.insert(SrqObj {
            ctx,
            pd,
            xrc,
            wqes: VecDeque::new(),
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
        });
        if let Some(n) = srqn {
            self.devs[dev].xrc_srqs.insert(n, id);
        }
        Ok(id)
    }

    pub(crate) fn destroy_srq(&mut self, srq: Id<SrqObj>) {
        let Some(s) = self.srqs.remove(srq) else {
            return;
        };
        if let Some(c) = self.ctxs.get(s.ctx) {
            let d = &mut self.devs[c.dev];
            d.srq_count -= 1;
            if let Some(x) = s.xrc {
                d.xrc_srqs.remove(&x.srqn);
            }
        }
    }

    pub(crate) fn post_srq_recv(&mut self, srq: Id<SrqObj>, wr: &RecvWr<'_>) -> Result<()> {
        let s = self.srqs.get_mut(srq).ok_or(Error::ProcessGone)?;
        if wr.sgl.len() as u32 > s.max_sge {
            return Err(Error::invalid(format!(
                "{} SGEs exceed the SRQ's max_sge {}",
                wr.sgl.len(),
                s.max_sge
            )));
        }
        if s.wqes.len() as u32 >= s.max_wr {
            return Err(Error::NoResource("shared receive queue full"));
        }
        s.wqes.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sgl: wr.sgl.to_vec(),
        });
        Ok(())
    }

    pub(crate) fn open_xrcd(&mut self, ctx: Id<Ctx>, key: &XrcdKey) -> Result<Id<XrcdHandle>> {
        let dev = self.ctx_dev(ctx)?;
        if !self.devs[dev].caps.xrc {
            return Err(Error::Unsupported("device has no XRC"));
        }
        let xrcd = match self.devs[dev].xrcds.get(&key.0) {
            Some(x) => *x,
            None => {
                let x = self.xrcds.insert(XrcdObj {
                    dev,
                    key: key.0.clone(),
                    refs: 0,
                });
                self.devs[dev].xrcds.insert(key.0.clone(), x);
                x
            }
        };
        self.xrcds.get_mut(xrcd).expect("just found").refs += 1;
        Ok(self.xrcd_handles.insert(XrcdHandle { ctx, xrcd }))
    }

    fn xrcd_unref(&mut self, xrcd: Id<XrcdObj>) {
        let Some(x) = self.xrcds.get_mut(xrcd) else {
            return;
        };
        x.refs -= 1;
        if x.refs == 0 {
            let x = self.xrcds.remove(xrcd).expect("present");
            self.devs[x.dev].xrcds.remove(&x.key);
        }
    }

    pub(crate) fn close_xrcd_handle(&mut self, h: Id<XrcdHandle>) {
        if let Some(h) = self.xrcd_handles.remove(h) {
            self.xrcd_unref(h.xrcd);
        }
    }

    // ---- QPs ---------------------------------------------------------------

    fn fresh_qpn(&mut self, dev: DevIdx) -> u32 {
        loop {
            let n = self.rng.next_u32() & 0x00ff_ffff;
            if n > 1 && !self.devs[dev].qps.contains_key(&n) {
                return n;
            }
        }
    }

    fn new_qp(&mut self, dev: DevIdx, ty: QpType, caps: QpCaps) -> QpObj {
        let qpn = self.fresh_qpn(dev);
        QpObj {
            dev,
            qpn,
            ty,
            state: QpState::Reset,
            pd: None,
            xrcd: None,
            send_cq: None,
            recv_cq: None,
            srq: None,
            caps,
            handles: Vec::new(),
            access: Access::NONE,
            peer: None,
            min_rnr_timer: 12,
            init_by_cm: false,
            rts: RtsAttr::default(),
            rq: VecDeque::new(),
            sq: VecDeque::new(),
            sent: 0,
            sq_used: 0,
            uncovered: 0,
            next_psn: 0,
            epoch: 0,
            tx_scheduled: false,
            timer_gen: 0,
            timer_armed: false,
            retries: 0,
            last_arrival: 0,
            expected_psn: 0,
            last_response: 0,
            atomic_replies: VecDeque::new(),
            iwarp_responder: false,
            last_wqe: false,
            heard: false,
            cm_id: None,
            rnr_naks: 0,
            timeouts: 0,
        }
    }

    fn check_qp_room(&self, dev: DevIdx) -> Result<()> {
        if self.devs[dev].qps.len() as u32 >= self.devs[dev].caps.max_qp {
            return Err(Error::NoResource("device QP table full"));
        }
        Ok(())
    }

    fn insert_qp(&mut self, ctx: Id<Ctx>, qp: QpObj) -> Id<QpHandle> {
        let dev = qp.dev;
        let qpn = qp.qpn;
        let id = self.qps.insert(qp);
        self.devs[dev].qps.insert(qpn, id);
        let h = self.qp_handles.insert(QpHandle { ctx, qp: id });
        self.qps.get_mut(id).expect("inserted").handles.push(h);
        self.stats.qps_created += 1;
        h
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_qp(
        &mut self,
        ctx: Id<Ctx>,
        pd: Id<PdObj>,
        ty: QpType,
        send_cq: Id<CqObj>,
        recv_cq: Option<Id<CqObj>>,
        srq: Option<Id<SrqObj>>,
        caps: QpCaps,
    ) -> Result<Id<QpHandle>> {
        let dev = self.ctx_dev(ctx)?;
        let dcaps = self.devs[dev].caps.clone();
        match ty {
            QpType::Rc => {}
            QpType::XrcIni if dcaps.xrc => {}
            QpType::XrcIni => return Err(Error::Unsupported("device has no XRC")),
            QpType::XrcTgt => {
                return Err(Error::invalid(
                    "XRC TGT QPs are created in an XRC domain (create_tgt_qp)",
                ))
            }
        }
        if caps.max_send_wr == 0 || caps.max_send_wr > dcaps.max_qp_wr {
            return Err(Error::invalid(format!(
                "max_send_wr {} not in 1..={}",
                caps.max_send_wr, dcaps.max_qp_wr
            )));
        }
        if caps.max_send_sge > dcaps.max_sge || caps.max_recv_sge > dcaps.max_sge {
            return Err(Error::invalid(format!(
                "SGE count exceeds max_sge {}",
                dcaps.max_sge
            )));
        }
        // The limit is the QP type's: an XRC INI WQE spends room on the
        // remote SRQ number.
        let max_inline = dcaps.max_inline_for(ty);
        if caps.max_inline > max_inline {
            return Err(Error::invalid(format!(
                "max_inline {} exceeds the device's {max_inline} for {ty:?} QPs",
                caps.max_inline
            )));
        }
        let mut granted = caps;
        if ty == QpType::XrcIni || srq.is_some() {
            granted.max_recv_wr = 0;
            granted.max_recv_sge = 0;
        } else {
            if recv_cq.is_none() {
                return Err(Error::invalid("an RC QP needs a receive CQ"));
            }
            if caps.max_recv_wr == 0 || caps.max_recv_wr > dcaps.max_qp_wr {
                return Err(Error::invalid(format!(
                    "max_recv_wr {} not in 1..={}",
                    caps.max_recv_wr, dcaps.max_qp_wr
                )));
            }
        }
        if ty == QpType::XrcIni && srq.is_some() {
            return Err(Error::invalid("an XRC INI QP has no receive side"));
        }
        if let Some(s) = srq {
            let s = self.srqs.get(s).ok_or(Error::ProcessGone)?;
            if s.xrc.is_some() {
                return Err(Error::invalid(
                    "XRC SRQs receive through TGT QPs, not RC QPs",
                ));
            }
        }
        self.check_qp_room(dev)?;
        let mut q = self.new_qp(dev, ty, granted);
        q.pd = Some(pd);
        q.send_cq = Some(send_cq);
        q.recv_cq = if ty == QpType::Rc { recv_cq } else { None };
        q.srq = srq;
        Ok(self.insert_qp(ctx, q))
    }

    pub(crate) fn create_tgt_qp(
        &mut self,
        ctx: Id<Ctx>,
        xh: Id<XrcdHandle>,
    ) -> Result<Id<QpHandle>> {
        let dev = self.ctx_dev(ctx)?;
        if !self.devs[dev].caps.xrc {
            return Err(Error::Unsupported("device has no XRC"));
        }
        let xrcd = self.xrcd_handles.get(xh).ok_or(Error::ProcessGone)?.xrcd;
        self.check_qp_room(dev)?;
        let caps = QpCaps {
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline: 0,
        };
        let mut q = self.new_qp(dev, QpType::XrcTgt, caps);
        q.xrcd = Some(xrcd);
        self.xrcds.get_mut(xrcd).expect("handle keeps it").refs += 1;
        self.stats.tgt_created += 1;
        Ok(self.insert_qp(ctx, q))
    }

    pub(crate) fn open_tgt_qp(
        &mut self,
        ctx: Id<Ctx>,
        xh: Id<XrcdHandle>,
        qpn: u32,
    ) -> Result<Id<QpHandle>> {
        let dev = self.ctx_dev(ctx)?;
        let xrcd = self.xrcd_handles.get(xh).ok_or(Error::ProcessGone)?.xrcd;
        let qp = self.devs[dev]
            .qps
            .get(&qpn)
            .copied()
            .filter(|q| {
                self.qps
                    .get(*q)
                    .is_some_and(|q| q.ty == QpType::XrcTgt && q.xrcd == Some(xrcd))
            })
            .ok_or_else(|| Error::not_found(format!("XRC TGT QP {qpn:#x} in this domain")))?;
        let h = self.qp_handles.insert(QpHandle { ctx, qp });
        self.qps.get_mut(qp).expect("found").handles.push(h);
        self.stats.tgt_opened += 1;
        Ok(h)
    }

    /// Drops one handle; the QP itself goes with its last handle.
    pub(crate) fn close_qp_handle(&mut self, h: Id<QpHandle>) {
        let Some(handle) = self.qp_handles.remove(h) else {
            return;
        };
        let Some(q) = self.qps.get_mut(handle.qp) else {
            return;
        };
        q.handles.retain(|x| *x != h);
        if q.handles.is_empty() {
            // A live process destroying an RC QP that draws from its SRQ
            // before the QP reported its last receive (LAST_WQE_REACHED)
            // may lose a receive it was taking, and its completions leave
            // the CQ. (A process that died loses everything anyway.)
            let early = q.ty == QpType::Rc && q.srq.is_some() && q.heard && !q.last_wqe;
            let alive = self
                .ctxs
                .get(handle.ctx)
                .and_then(|c| self.procs.get(c.proc))
                .is_some_and(|p| p.alive);
            if early && alive {
                self.stats.srq_qps_destroyed_early += 1;
            }
            self.destroy_qp(handle.qp);
        }
    }

    fn destroy_qp(&mut self, qp: Id<QpObj>) {
        let Some(q) = self.qps.remove(qp) else { return };
        self.devs[q.dev].qps.remove(&q.qpn);
        if q.ty == QpType::XrcTgt {
            self.stats.tgt_destroyed += 1;
            if let Some(x) = q.xrcd {
                self.xrcd_unref(x);
            }
        }
        self.stats.qps_destroyed += 1;
        if let Some(id) = q.cm_id {
            if let Some(c) = self.cm_ids.get_mut(id) {
                c.qp = None;
            }
        }
        // The provider cleans the destroyed QP's completions out of its CQs.
        for cq in [q.send_cq, q.recv_cq].into_iter().flatten() {
            if let Some(c) = self.cqs.get_mut(cq) {
                c.entries.retain(|e| e.qp != Some(qp));
            }
        }
    }

    pub(crate) fn modify_qp(&mut self, qp: Id<QpObj>, t: &QpTransition, by_cm: bool) -> Result<()> {
        let transport = {
            let q = self.qps.get(qp).ok_or(Error::ProcessGone)?;
            self.devs[q.dev].caps.transport
        };
        let q = self.qps.get_mut(qp).ok_or(Error::ProcessGone)?;
        let from = q.state;
        match *t {
            QpTransition::Init(a) => {
                if from != QpState::Reset && from != QpState::Init {
                    return Err(Error::state(format!("INIT from {from:?}")));
                }
                if a.port != 1 {
                    return Err(Error::invalid(format!("port {} does not exist", a.port)));
                }
                q.access = a.access;
                q.init_by_cm = by_cm;
                q.state = QpState::Init;
            }
            QpTransition::Rtr(a) => {
                if from != QpState::Init {
                    return Err(Error::state(format!("RTR from {from:?}")));
                }
                if transport == Transport::Iwarp && !by_cm {
                    return Err(Error::invalid(
                        "iWARP QPs are connected by the RDMA CM, not by hand",
                    ));
                }
                // The kernel's qp_state_table: an RC or TGT responder must
                // set its responder attributes at RTR, an XRC INI QP (which
                // receives nothing) must not.
                let responder = [a.max_dest_rd_atomic, a.min_rnr_timer];
                if q.ty == QpType::XrcIni && responder.iter().any(Option::is_some) {
                    return Err(Error::invalid(
                        "an XRC INI QP takes no responder attributes at RTR \
                         (max_dest_rd_atomic, min_rnr_timer)",
                    ));
                }
                if q.ty != QpType::XrcIni && responder.iter().any(Option::is_none) {
                    return Err(Error::invalid(
                        "an RC or XRC TGT QP needs max_dest_rd_atomic and min_rnr_timer at RTR",
                    ));
                }
                let peer_dev = self.dev_by_gid(&a.dest);
                let q = self.qps.get_mut(qp).expect("checked");
                q.peer = Some((peer_dev, a.dest_qpn));
                q.expected_psn = u64::from(a.rq_psn);
                q.min_rnr_timer = a.min_rnr_timer.unwrap_or(0);
                q.state = QpState::Rtr;
            }
            QpTransition::Rts(a) => {
                if q.ty == QpType::XrcTgt {
                    return Err(Error::invalid("an XRC TGT QP does not send: RTR is final"));
                }
                if from != QpState::Rtr {
                    return Err(Error::state(format!("RTS from {from:?}")));
                }
                if a.retry_cnt > 7 || a.rnr_retry > 7 {
                    return Err(Error::invalid("retry counts are 3-bit values"));
                }
                q.rts = a;
                q.next_psn = u64::from(a.sq_psn);
                q.state = QpState::Rts;
            }
            QpTransition::Error => {
                // The kernel's qp_state_table: RESET leads to RESET or INIT
                // only (rxe and the HCA drivers return EINVAL).
                if from == QpState::Reset {
                    return Err(Error::state("ERR from Reset"));
                }
                self.qp_to_error(qp, None);
            }
            QpTransition::Reset => {
                q.state = QpState::Reset;
                q.sq.clear();
                q.rq.clear();
                q.sent = 0;
                q.sq_used = 0;
                q.uncovered = 0;
                q.peer = None;
                q.epoch += 1;
                q.timer_gen += 1;
                q.timer_armed = false;
                q.tx_scheduled = false;
                q.retries = 0;
                q.heard = false;
                q.iwarp_responder = false;
            }
        }
        Ok(())
    }
}

/// Which async event accompanies a QP's move to the error state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QpErrorEvent {
    Fatal,
    Request,
    Access,
}

impl World {
    /// Checks that the world is consistent: every object belongs to a live
    /// context, every index points at the object it names, every XRC domain
    /// is referenced exactly by its handles and TGT QPs, and every live QP
    /// has a holder. A crashed or exited process must leave nothing behind.
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let live_ctx = |c: Id<Ctx>, what: &str| -> std::result::Result<(), String> {
            match self.ctxs.get(c) {
                Some(ctx) if self.procs.get(ctx.proc).is_some_and(|p| p.alive) => Ok(()),
                Some(_) => Err(format!("{what} belongs to a context of a dead process")),
                None => Err(format!("{what} outlived its context")),
            }
        };
        for (k, id) in &self.remote_qpns {
            if !self.cm_ids.contains(*id) {
                return Err(format!(
                    "the stale-connection table holds {k:?} of a gone id"
                ));
            }
        }
        for (id, m) in self.mrs.iter() {
            live_ctx(m.ctx, &format!("MR {id:?}"))?;
            if !self.pds.contains(m.pd) {
                return Err(format!("MR {id:?} outlived its PD"));
            }
        }
        for (id, p) in self.pds.iter() {
            live_ctx(p.ctx, &format!("PD {id:?}"))?;
        }
        for (id, c) in self.cqs.iter() {
            live_ctx(c.ctx, &format!("CQ {id:?}"))?;
        }
        for (id, s) in self.srqs.iter() {
            live_ctx(s.ctx, &format!("SRQ {id:?}"))?;
        }
        for (id, x) in self.xrcd_handles.iter() {
            live_ctx(x.ctx, &format!("XRCD handle {id:?}"))?;
        }
        for (id, c) in self.cm_ids.iter() {
            live_ctx(c.ctx, &format!("CM id {id:?}"))?;
        }
        for (id, c) in self.channels.iter() {
            live_ctx(c.ctx, &format!("CM channel {id:?}"))?;
        }
        for (id, h) in self.qp_handles.iter() {
            live_ctx(h.ctx, &format!("QP handle {id:?}"))?;
            match self.qps.get(h.qp) {
                Some(q) if q.handles.contains(&id) => {}
                _ => return Err(format!("QP handle {id:?} names a QP that does not know it")),
            }
        }
        for (id, q) in self.qps.iter() {
            if q.handles.is_empty() {
                return Err(format!("QP {:#x} lives with no holder", q.qpn));
            }
            if q.handles
                .iter()
                .any(|h| self.qp_handles.get(*h).map(|h| h.qp) != Some(id))
            {
                return Err(format!(
                    "QP {:#x} lists a handle that is not its own",
                    q.qpn
                ));
            }
            if self.devs[q.dev].qps.get(&q.qpn) != Some(&id) {
                return Err(format!("QP {:#x} missing from its device's table", q.qpn));
            }
            let deps_live = q.pd.is_none_or(|p| self.pds.contains(p))
                && q.send_cq.is_none_or(|c| self.cqs.contains(c))
                && q.recv_cq.is_none_or(|c| self.cqs.contains(c))
                && q.srq.is_none_or(|s| self.srqs.contains(s))
                && q.xrcd.is_none_or(|x| self.xrcds.contains(x));
            if !deps_live {
                return Err(format!(
                    "QP {:#x} outlived its PD, CQ, SRQ or domain",
                    q.qpn
                ));
            }
        }
        for (id, x) in self.xrcds.iter() {
            let handles = self
                .xrcd_handles
                .iter()
                .filter(|(_, h)| h.xrcd == id)
                .count();
            let tgts = self.qps.iter().filter(|(_, q)| q.xrcd == Some(id)).count();
            if x.refs as usize != handles + tgts || x.refs == 0 {
                return Err(format!(
                    "XRC domain {:?} has {} references for {handles} handles and {tgts} TGT QPs",
                    x.key, x.refs
                ));
            }
        }
        for (i, d) in self.devs.iter().enumerate() {
            for (k, m) in d.lkeys.iter().chain(d.rkeys.iter()) {
                if !self.mrs.contains(*m) {
                    return Err(format!("device {i}: key {k:#x} names a dead MR"));
                }
            }
            for (n, q) in &d.qps {
                if !self.qps.contains(*q) {
                    return Err(format!("device {i}: QPN {n:#x} names a dead QP"));
                }
            }
            for (n, s) in &d.xrc_srqs {
                if !self.srqs.contains(*s) {
                    return Err(format!("device {i}: SRQN {n:#x} names a dead SRQ"));
                }
            }
            let srqs = self
                .srqs
                .iter()
                .filter(|(_, s)| self.ctx_dev(s.ctx).ok() == Some(i))
                .count();
            if srqs != d.srq_count as usize {
                return Err(format!(
                    "device {i}: {srqs} SRQs live, {} counted against max_srq",
                    d.srq_count
                ));
            }
            for x in d.xrcds.values() {
                if !self.xrcds.contains(*x) {
                    return Err(format!("device {i}: a domain key names a dead domain"));
                }
            }
        }
        for (addr, id) in &self.listeners {
            if self.cm_ids.get(*id).map(|c| c.state) != Some(CmState::Listening) {
                return Err(format!("listener {addr} names an id that is not listening"));
            }
        }
        Ok(())
    }
}
