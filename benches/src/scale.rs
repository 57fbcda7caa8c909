//! The scale harness: what xrcbtl costs a process and a node at 1,024 to
//! 10,000 nodes of 128 ranks, on the simulated fabric, in virtual time.
//!
//! The observed node (node 0) is whole: each of its ranks is a real
//! [`Btl`] with its receive buffers. Every other rank the traffic pattern
//! involves is a [`Responder`]: the same connection driver and manager on
//! a process of its own, with one receive buffer per SRQ (for the
//! observed process's message, thrown away), made when the pattern first
//! needs it. Ranks the pattern does not involve are never made.
//!
//! The traffic is a set of *active* ranks of the observed node, each of
//! which talks to its partners under a [`Pattern`], every partner talking
//! back: a connection each way per pair (under XRC an INI QP's endpoint at
//! each end; under RC one QP per pair, made by whichever side wins). Start-up
//! is over when every such endpoint is ready.
//!
//! What a row reports is measured on the first active rank (its process)
//! and on the observed node, after start-up, then after that rank has
//! sent one message to every peer ([`Sent`]); see [`Row`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xrcbtl_btl::config::Clock;
use xrcbtl_btl::sim::{advance_idle, Directory, Responder, Timers, JOB};
use xrcbtl_btl::{Btl, BtlConfig, EagerLimit, Peer};
use xrcbtl_fabric::sim::{CountingAlloc, SimConfig, SimContext, SimDevice, SimFabric, SimProcess};
use xrcbtl_fabric::{Fabric, Gid, IbAddr, XrcdKey, DEFAULT_PKEY};

/// A rank.
pub type Rank = u32;

/// Bytes of connection state a process may keep per peer it talks with
/// both ways (its endpoint to the peer and what the peer's connection to
/// it costs here: TGT QP handle, accepted CM id): 1.28 million peers (an
/// all-to-all at 10,000 nodes of 128 ranks) in 1.83 GiB. A peer only
/// known costs at most 512 (btl/tests/footprint.rs).
pub const BUDGET: f64 = 1536.0;

/// The tag of the observed process's messages (no callback: each
/// receiver drops them).
const TAG: u8 = 7;

/// The bytes of each receive buffer a responder posts ([`Spec::send`]).
const RESPONDER_RECEIVE: u32 = 128;

/// The port every rank listens on: the base plus its index on its node.
const PORT_BASE: u16 = 7000;

/// Who talks to whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Every rank of the job.
    AllToAll,
    /// The 6 neighbours of a periodic 3-D stencil over every rank, plus
    /// the partners of recursive doubling (`r XOR 2^k`, for each `k` with
    /// a partner in the job).
    Sparse,
}

impl Pattern {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::AllToAll => "all-to-all",
            Pattern::Sparse => "sparse",
        }
    }

    /// The ranks of the observed node that take part by default, of
    /// `per_node`: one for the all-to-all (all of them would be beyond
    /// this machine at 10,000 nodes), every one for the sparse pattern.
    pub fn default_active(self, per_node: usize) -> usize {
        match self {
            Pattern::AllToAll => 1,
            Pattern::Sparse => per_node,
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Nodes of the job.
    pub nodes: usize,
    /// Ranks per node.
    pub per_node: usize,
    /// XRC (`true`) or RC + SRQ, the fallback, on the same device.
    pub xrc: bool,
    /// Who talks to whom.
    pub pattern: Pattern,
    /// Ranks of the observed node that take part (its first ones).
    pub active: usize,
    /// Seed of the fabric.
    pub seed: u64,
    /// The device's QP limit (a ConnectX-like 2^18 by default in the
    /// simulator; scale runs give it more, to measure past it).
    pub max_qp: u32,
    /// How long the CM waits for an answer before it sends again.
    pub cm_timeout: Duration,
    /// The BTL's window of CM exchanges in flight per process
    /// (`BtlConfig::connect_window`; 0: no limit).
    pub connect_window: usize,
    /// After start-up, the observed process sends one 8-byte message to
    /// every peer it talks to ([`Sent`]): what its send logs keep.
    pub send: bool,
    /// Then it leaves cleanly ([`Exit`]).
    pub exit: bool,
    /// How long its exit waits for the next peer's acknowledgement
    /// (`BtlConfig::leave_timeout`).
    pub leave_timeout: Duration,
}

impl Spec {
    /// A job of `nodes` nodes of 128 ranks: one active rank for the
    /// all-to-all, all of node 0's for the sparse pattern; a device with
    /// 2^24 QPs; the RDMA CM's own timeout (4,096 ms: `CMA_CM_RESPONSE_TIMEOUT`
    /// 20); the BTL's default window.
    pub fn new(nodes: usize, xrc: bool, pattern: Pattern) -> Spec {
        let per_node = 128;
        Spec {
            nodes,
            per_node,
            xrc,
            pattern,
            active: pattern.default_active(per_node),
            seed: 14,
            max_qp: 1 << 24,
            cm_timeout: Duration::from_millis(4096),
            connect_window: xrcbtl_xrc_conn::DEFAULT_CONNECT_WINDOW,
            send: true,
            exit: false,
            leave_timeout: xrcbtl_xrc_conn::DEFAULT_LEAVE_TIMEOUT,
        }
    }

    /// Ranks in the job.
    pub fn ranks(&self) -> usize {
        self.nodes * self.per_node
    }
}

/// One measured row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What ran.
    pub spec: Spec,
    /// Endpoints of the observed process made ready (its partners).
    pub endpoints: u64,
    /// Sending QPs of the observed process (INI, or RC) after start-up.
    pub qps_end: usize,
    /// The most it held at any time.
    pub qps_peak: usize,
    /// XRC TGT QPs living on the observed node.
    pub tgt_qps: usize,
    /// TGT QP handles the observed process holds.
    pub tgt_handles: usize,
    /// Bytes of receive buffers in the observed process's SRQs.
    pub srq_bytes: u64,
    /// Heap bytes the observed process's BTL kept from adding its peers
    /// and connecting to them (endpoints, connection state, address book),
    /// by the counting allocator; the simulated device's own objects (what
    /// a kernel and an HCA would hold) are not in it.
    pub state_bytes: i64,
    /// CM messages the observed process sent.
    pub cm_sent: u64,
    /// CM messages that reached it.
    pub cm_received: u64,
    /// Address (ARP) queries the observed node sent.
    pub arp: u64,
    /// Path queries the observed node sent.
    pub path: u64,
    /// CM messages in the whole fabric.
    pub cm_total: u64,
    /// The simulator's counters.
    pub sim: xrcbtl_fabric::sim::SimStats,
    /// The observed process's connection manager's counters.
    pub counters: xrcbtl_xrc_conn::Counters,
    /// Virtual time until every endpoint of the pattern was ready.
    pub startup: Duration,
    /// Remote ranks made.
    pub responders: usize,
    /// Wall-clock time of the run.
    pub wall: Duration,
    /// The observed process's message to every peer, if the spec asked
    /// for it.
    pub sent: Option<Sent>,
    /// The observed process's clean exit, if the spec asked for it.
    pub exit: Option<Exit>,
}

/// After start-up, the observed process sends one 8-byte message to every
/// peer it talks to, at once, and progresses until all of them are
/// complete ([`Btl::is_idle`]): every QP it sends on (an INI QP per node
/// under XRC, an RC QP per peer) has then carried a message, and kept
/// its send log.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// Messages sent.
    pub messages: u64,
    /// Heap bytes the process kept from it, counted as
    /// [`Row::state_bytes`] is (the send logs, which give their memory
    /// back only once idle since the BTL's last look).
    pub bytes: i64,
    /// Posts it refused for the CQ budget meanwhile
    /// ([`xrcbtl_btl::BtlStats::cq_full`]): most messages of the burst
    /// wait for room in the CQ, and each pass over the waiting endpoints
    /// stops at its first refusal.
    pub cq_full: u64,
    /// Times it took its BTL's lock meanwhile (its sends and progress
    /// calls).
    pub locks: u64,
    /// Virtual time until every message was complete.
    pub time: Duration,
    /// Wall-clock time it took.
    pub wall: Duration,
}

/// The observed process's clean exit after start-up ([`Btl::shutdown`]
/// until [`Btl::is_drained`]), its peers staying.
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    /// Virtual time it took.
    pub time: Duration,
    /// Wall-clock time it took.
    pub wall: Duration,
    /// CM messages the process sent during it.
    pub cm_sent: u64,
    /// CM messages that reached the process during it.
    pub cm_received: u64,
    /// Sending QPs the process still held when it was over.
    pub qps_left: usize,
    /// `Leave` exchanges it started (one per peer sending to it).
    pub leaves: u64,
    /// Of those, the ones it gave up on, unanswered.
    pub leaves_abandoned: u64,
}

/// `n` split into three factors as even as can be (the smallest spread
/// between the largest and the smallest), largest first, as
/// `MPI_Dims_create` does for a 3-D grid.
pub fn dims(n: usize) -> [usize; 3] {
    let mut best = [n, 1, 1];
    let mut a = 1;
    while a * a * a <= n {
        if n % a == 0 {
            let m = n / a;
            let mut b = a;
            while b * b <= m {
                if m % b == 0 {
                    let c = m / b;
                    if c - a < best[0] - best[2] {
                        best = [c, b, a];
                    }
                }
                b += 1;
            }
        }
        a += 1;
    }
    best
}

/// The partners of rank `r` in a job of `p` ranks, ascending, without `r`.
pub fn partners(pattern: Pattern, p: usize, r: Rank) -> Vec<Rank> {
    match pattern {
        Pattern::AllToAll => (0..p as Rank).filter(|&x| x != r).collect(),
        Pattern::Sparse => {
            let mut out = BTreeSet::new();
            let [z, y, x] = dims(p);
            let r0 = r as usize;
            let c = [r0 / (y * x), (r0 / x) % y, r0 % x];
            for (axis, len) in [z, y, x].into_iter().enumerate() {
                for step in [1, len - 1] {
                    let mut n = c;
                    n[axis] = (n[axis] + step) % len;
                    out.insert((n[0] * y * x + n[1] * x + n[2]) as Rank);
                }
            }
            let mut bit = 1usize;
            while bit < p {
                let q = r0 ^ bit;
                if q < p {
                    out.insert(q as Rank);
                }
                bit <<= 1;
            }
            out.remove(&r);
            out.into_iter().collect()
        }
    }
}

/// Who talks to whom under `spec`, in the order they start: each active
/// rank to its partners, then each partner back to the active ranks it is
/// a partner of, in rank order.
pub fn plan(spec: &Spec) -> Vec<(Rank, Vec<Rank>)> {
    let mut out = Vec::new();
    let mut back: BTreeMap<Rank, Vec<Rank>> = BTreeMap::new();
    for o in 0..spec.active as Rank {
        let to = partners(spec.pattern, spec.ranks(), o);
        for &p in &to {
            if p as usize >= spec.active {
                back.entry(p).or_default().push(o);
            }
        }
        out.push((o, to));
    }
    out.extend(back);
    out
}

/// Where ranks listen: computed from the rank, so that a rank can be told
/// a peer's address before that peer is made.
#[derive(Clone)]
struct Addresses {
    per_node: usize,
    nodes: Arc<Vec<(Ipv4Addr, Gid)>>,
}

impl Addresses {
    fn peer(&self, r: Rank) -> Option<Peer> {
        let node = r as usize / self.per_node;
        let (ip, gid) = *self.nodes.get(node)?;
        let port = PORT_BASE + (r as usize % self.per_node) as u16;
        Some(Peer {
            rank: r,
            node: node as u32,
            addr: SocketAddr::from((ip, port)),
            ib: Some(IbAddr {
                gid,
                pkey: DEFAULT_PKEY,
                port,
            }),
            receive: None,
        })
    }
}

/// An observed rank.
struct Local {
    btl: Arc<Btl<SimContext>>,
    proc: SimProcess,
}

/// The job: the observed node's BTLs and the responders made so far.
struct Job {
    spec: Spec,
    sim: SimFabric,
    addrs: Addresses,
    device: String,
    local: Vec<Local>,
    remote: Vec<Option<Box<Responder>>>,
    rank_of_pid: HashMap<u32, Rank>,
    /// Endpoints each rank must make ready (by rank; 0 for ranks outside
    /// the pattern).
    wants: HashMap<Rank, u64>,
    /// Ranks whose endpoints are not all ready yet.
    unready: BTreeSet<Rank>,
    dirty: BTreeSet<Rank>,
    timers: Timers,
    /// The observed process's sending QPs, at most.
    peak: usize,
    /// Heap bytes the observed process kept.
    bytes: i64,
}

/// The configuration every rank of a run has.
fn config(spec: &Spec, rank: Rank, ip: Ipv4Addr, sim: &SimFabric) -> BtlConfig {
    let node = rank as usize / spec.per_node;
    let port = PORT_BASE + (rank as usize % spec.per_node) as u16;
    let mut cfg = BtlConfig::new(
        rank,
        node as u32,
        JOB,
        XrcdKey::new("xrcd-job"),
        SocketAddr::from((ip, port)),
    );
    let s = sim.clone();
    cfg.clock = Clock::from_fn(move || s.now());
    cfg.force_rc = !spec.xrc;
    cfg.connect_window = spec.connect_window;
    cfg.leave_timeout = spec.leave_timeout;
    // The same eager size (and so receive classes) in both modes.
    cfg.eager_limit = EagerLimit::Bytes(8192);
    cfg
}

impl Job {
    fn new(spec: Spec) -> Result<Job, String> {
        let mut dev = SimDevice::ib("sim0");
        dev.caps.max_qp = spec.max_qp;
        let device = dev.name.clone();
        let mut cfg = SimConfig::new(spec.seed, spec.nodes).with_devices(vec![dev]);
        // The RDMA CM's own patience, not the simulator's shortened one: a
        // request waits 4,096 ms for its answer (CMA_CM_RESPONSE_TIMEOUT
        // 20, `Spec::new`) and is sent 15 times (CMA_MAX_CM_RETRIES) before
        // the CM gives up. A node's CM agent answering a start-up storm
        // queues far past the simulator's 100 ms.
        cfg.timing.cm_timeout_ns = spec.cm_timeout.as_nanos() as u64;
        cfg.timing.cm_max_retries = 15;
        let sim = SimFabric::new(cfg).map_err(|e| e.to_string())?;
        sim.set_auto_advance(false);
        let nodes = (0..spec.nodes)
            .map(|n| sim.device_addr(n, 0).ok_or("no device"))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs = Addresses {
            per_node: spec.per_node,
            nodes: Arc::new(nodes),
        };
        let mut local = Vec::new();
        let mut rank_of_pid = HashMap::new();
        for i in 0..spec.per_node {
            let rank = i as Rank;
            let proc = sim.spawn(0).map_err(|e| e.to_string())?;
            let ctx = proc.open(&device).map_err(|e| e.to_string())?;
            let cfg = config(&spec, rank, addrs.nodes[0].0, &sim);
            let btl = Arc::new(Btl::new(ctx, cfg).map_err(|e| e.to_string())?);
            let a = addrs.clone();
            btl.set_peer_resolver(move |r| a.peer(r));
            rank_of_pid.insert(proc.pid(), rank);
            local.push(Local { btl, proc });
        }
        let remote = (spec.per_node..spec.ranks()).map(|_| None).collect();
        Ok(Job {
            spec,
            sim,
            addrs,
            device,
            local,
            remote,
            rank_of_pid,
            wants: HashMap::new(),
            unready: BTreeSet::new(),
            dirty: BTreeSet::new(),
            timers: Timers::default(),
            peak: 0,
            bytes: 0,
        })
    }

    fn is_local(&self, r: Rank) -> bool {
        (r as usize) < self.spec.per_node
    }

    /// The responder of remote rank `r`, made if need be.
    fn responder(&mut self, r: Rank) -> Result<&mut Responder, String> {
        let i = r as usize - self.spec.per_node;
        if self.remote[i].is_none() {
            let (ip, _) = self.addrs.nodes[r as usize / self.spec.per_node];
            let cfg = config(&self.spec, r, ip, &self.sim);
            let a = self.addrs.clone();
            let dir: Directory = Arc::new(move |q| a.peer(q));
            let mut resp = Responder::new(&self.sim, &self.device, &cfg, dir)
                .map_err(|e| format!("rank {r}: {e}"))?;
            if self.spec.send {
                // Room for the observed process's message (header and 8
                // bytes) in each of its SRQs.
                resp.post_receives(RESPONDER_RECEIVE)
                    .map_err(|e| format!("rank {r}: {e}"))?;
            }
            self.rank_of_pid.insert(resp.proc().pid(), r);
            self.remote[i] = Some(Box::new(resp));
        }
        Ok(self.remote[i].as_mut().expect("made"))
    }

    /// Rank `r` is to talk to `to`: it learns of it and connects.
    fn talk(&mut self, r: Rank, to: &[Rank]) -> Result<(), String> {
        *self.wants.entry(r).or_default() += to.len() as u64;
        self.unready.insert(r);
        self.dirty.insert(r);
        let peers: Vec<Peer> = to.iter().filter_map(|&q| self.addrs.peer(q)).collect();
        if self.is_local(r) {
            let btl = self.local[r as usize].btl.clone();
            self.observed(r, || {
                btl.add_procs(&peers).map_err(|e| e.to_string())?;
                for q in to {
                    btl.connect(*q).map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        } else {
            let now = self.sim.now();
            let resp = self.responder(r)?;
            for p in &peers {
                resp.add_peer(p);
            }
            for q in to {
                resp.connect(now, *q);
            }
            Ok(())
        }
    }

    /// Runs `f`, a call into local rank `r`; on the observed process (rank
    /// 0), counts the heap bytes it leaves.
    fn observed<R>(&mut self, r: Rank, f: impl FnOnce() -> R) -> R {
        if r != 0 {
            return f();
        }
        let (res, b) = CountingAlloc::bytes(f);
        self.bytes += b;
        res
    }

    /// Endpoints rank `r` made ready so far.
    fn ready(&self, r: Rank) -> u64 {
        if self.is_local(r) {
            self.local[r as usize]
                .btl
                .with_manager(|m| m.counters().ready)
        } else {
            self.remote[r as usize - self.spec.per_node]
                .as_ref()
                .map_or(0, |x| x.manager().counters().ready)
        }
    }

    /// Progresses rank `r`; how much work it found.
    fn progress(&mut self, r: Rank) -> usize {
        let now = self.sim.now();
        let (work, timer) = if self.is_local(r) {
            let btl = self.local[r as usize].btl.clone();
            let work = self.observed(r, || {
                let w = btl.progress();
                btl.take_notices();
                w
            });
            if r == 0 {
                self.peak = self.peak.max(btl.with_manager(|m| m.live_qps()));
            }
            (work, btl.next_timeout())
        } else {
            let i = r as usize - self.spec.per_node;
            let Some(resp) = self.remote[i].as_mut() else {
                return 0;
            };
            (resp.progress(now), resp.next_timer())
        };
        self.timers.set(r, timer.map(|t| t.max(now)));
        if work > 0 {
            self.dirty.insert(r);
        }
        if self.unready.contains(&r) && self.ready(r) >= self.wants[&r] {
            self.unready.remove(&r);
        }
        work
    }

    /// Runs until every endpoint of the pattern is ready; the virtual
    /// time that took.
    fn run(&mut self, limit: Duration) -> Result<Duration, String> {
        self.run_until(limit, |job| job.unready.is_empty())
    }

    /// Runs until `done`; the virtual time until the last work.
    fn run_until(
        &mut self,
        limit: Duration,
        done: impl Fn(&Job) -> bool,
    ) -> Result<Duration, String> {
        let start = self.sim.now();
        let mut last = start;
        while !done(self) {
            let now = self.sim.now();
            if now - start > limit {
                return Err(self.stuck(format!("not ready after {limit:?}")));
            }
            let mut todo: BTreeSet<Rank> = std::mem::take(&mut self.dirty);
            for pid in self.sim.take_touched() {
                if let Some(&r) = self.rank_of_pid.get(&pid) {
                    todo.insert(r);
                }
            }
            todo.extend(self.timers.take_due(now));
            let mut work = 0;
            for r in todo {
                work += self.progress(r);
            }
            if work > 0 {
                last = self.sim.now();
                continue;
            }
            if !advance_idle(&self.sim, self.timers.first()) {
                return Err(self.stuck("nothing scheduled".into()));
            }
        }
        Ok(last - start)
    }

    fn stuck(&self, why: String) -> String {
        let some: Vec<String> = self
            .unready
            .iter()
            .take(8)
            .map(|&r| format!("rank {r}: {} of {} ready", self.ready(r), self.wants[&r]))
            .collect();
        format!(
            "{why} at t={:?}: {} ranks not ready ({})",
            self.sim.now(),
            self.unready.len(),
            some.join("; ")
        )
    }
}

/// Runs `spec` and measures it.
pub fn run(spec: &Spec) -> Result<Row, String> {
    if spec.active == 0 || spec.active > spec.per_node {
        return Err(format!("active ranks: 1..={}", spec.per_node));
    }
    let wall = Instant::now();
    let mut job = Job::new(spec.clone())?;
    // Who talks to whom: each active rank to its partners, each partner
    // back to it.
    let mut peers = Vec::new();
    for (r, to) in plan(spec) {
        if r == 0 {
            peers = to.clone();
        }
        job.talk(r, &to)?;
    }
    let startup = job.run(Duration::from_secs(3600))?;
    let me = &job.local[0];
    let view = job.sim.process_view(&me.proc);
    let node = job.sim.node_view(0);
    let (mut arp, mut path) = (0, 0);
    for to in 0..spec.nodes {
        let q = job.sim.queries_between(0, to);
        arp += q.arp;
        path += q.path;
    }
    let (qps_end, endpoints) = me.btl.with_manager(|m| (m.live_qps(), m.counters().ready));
    let mut row = Row {
        spec: spec.clone(),
        endpoints,
        qps_end,
        qps_peak: job.peak,
        tgt_qps: node.tgt_qps.len(),
        tgt_handles: view.tgt_handles,
        srq_bytes: me.btl.receive_bytes(),
        state_bytes: job.bytes,
        cm_sent: view.cm_sent,
        cm_received: view.cm_received,
        arp,
        path,
        cm_total: job.sim.stats().cm_messages,
        sim: job.sim.stats(),
        counters: me.btl.with_manager(|m| m.counters().clone()),
        startup,
        responders: job.remote.iter().filter(|r| r.is_some()).count(),
        wall: wall.elapsed(),
        sent: None,
        exit: None,
    };
    if spec.send {
        row.sent = Some(send(&mut job, &peers)?);
    }
    if spec.exit {
        row.exit = Some(exit(&mut job)?);
    }
    Ok(row)
}

/// The observed process (rank 0) sends one 8-byte message to each of
/// `peers`; what its state kept from that.
fn send(job: &mut Job, peers: &[Rank]) -> Result<Sent, String> {
    let wall = Instant::now();
    let start = job.sim.now();
    let btl = job.local[0].btl.clone();
    let before = job.bytes;
    let stats = btl.stats();
    job.observed(0, || {
        peers
            .iter()
            .try_for_each(|&q| btl.send(q, TAG, &[], &[0; 8]))
            .map_err(|e| format!("send: {e}"))
    })?;
    job.dirty.insert(0);
    job.run_until(Duration::from_secs(3600), |_| btl.is_idle())
        .map_err(|e| format!("send: {e}: {}", btl.busy()))?;
    let after = btl.stats();
    let sent = after.eager_sent - stats.eager_sent;
    if sent < peers.len() as u64 {
        return Err(format!("send: {sent} of {} messages sent", peers.len()));
    }
    Ok(Sent {
        messages: peers.len() as u64,
        bytes: job.bytes - before,
        cq_full: after.cq_full - stats.cq_full,
        locks: after.locks - stats.locks,
        time: job.sim.now() - start,
        wall: wall.elapsed(),
    })
}

/// The observed process (rank 0) leaves cleanly; what that cost it.
fn exit(job: &mut Job) -> Result<Exit, String> {
    let wall = Instant::now();
    let before = job.sim.process_view(&job.local[0].proc);
    let btl = job.local[0].btl.clone();
    btl.shutdown();
    job.dirty.insert(0);
    let time = job
        .run_until(Duration::from_secs(3600), |_| btl.is_drained())
        .map_err(|e| format!("exit: {e}"))?;
    let after = job.sim.process_view(&job.local[0].proc);
    let (qps_left, leaves, leaves_abandoned) = btl.with_manager(|m| {
        let c = m.counters();
        (m.live_qps(), c.leaves_sent, c.leaves_abandoned)
    });
    Ok(Exit {
        time,
        wall: wall.elapsed(),
        cm_sent: after.cm_sent - before.cm_sent,
        cm_received: after.cm_received - before.cm_received,
        qps_left,
        leaves,
        leaves_abandoned,
    })
}

impl Drop for Job {
    /// Leaves the ranks as they are: the simulator closes a process by
    /// looking through every object of the fabric, so that closing a
    /// million of them one by one would take longer than the run. The
    /// process exits instead.
    fn drop(&mut self) {
        std::mem::forget(std::mem::take(&mut self.local));
        std::mem::forget(std::mem::take(&mut self.remote));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_are_even_and_multiply_back() {
        assert_eq!(dims(16_384), [32, 32, 16]);
        assert_eq!(dims(1_280_000), [128, 100, 100]);
        assert_eq!(dims(524_288), [128, 64, 64]);
        assert_eq!(dims(7), [7, 1, 1]);
        assert_eq!(dims(1), [1, 1, 1]);
    }

    #[test]
    fn sparse_partners_are_symmetric() {
        for p in [16_384, 1_000] {
            for r in [0, 1, 127, 128, 999] {
                for q in partners(Pattern::Sparse, p, r) {
                    assert!(
                        partners(Pattern::Sparse, p, q).contains(&r),
                        "{r} -> {q} in {p}"
                    );
                }
            }
        }
        // 6 neighbours and log2(P) doubling partners, some shared.
        let n = partners(Pattern::Sparse, 1 << 14, 0).len();
        assert!((14..=20).contains(&n), "{n}");
    }
}
