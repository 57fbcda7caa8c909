//! A simulated job: N nodes × M ranks, each a process with its own
//! [`Btl`] on one [`SimFabric`], all driven from one thread in virtual
//! time, deterministic from the seed. Tests, benchmarks and examples build
//! their clusters with it.
//!
//! Time moves only when every rank is idle: [`SimJob::step`] progresses
//! the ranks that have something to do (something the fabric queued for
//! them, a call from the caller, a connection timer that is due), and when
//! none found work, moves the clock to the next scheduled event or timer.
//! Ranks are numbered node by node: rank `r` lives on node `r / per_node`.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use xrcbtl_fabric::sim::{SimConfig, SimContext, SimDevice, SimFabric, SimProcess};
use xrcbtl_fabric::{
    Access, Context, Cq as _, DmaBuf, Fabric, RecvWr, Result, Srq as _, SrqAttr, WcOpcode,
    WcStatus, WorkCompletion, XrcdKey,
};
use xrcbtl_xrc_conn::{Mode, Notice, Rank};

use crate::btl::Btl;
use crate::config::{BtlConfig, Clock};
use crate::conn::{ConnDriver, ConnEvent};
use crate::iface::Lent;
use crate::types::Peer;

/// The job id of simulated jobs.
pub const JOB: u32 = 0xb71;

/// The ranks' next connection timers, by when they are due.
#[derive(Debug, Default)]
pub struct Timers {
    due: BTreeSet<(Duration, Rank)>,
    of: HashMap<Rank, Duration>,
}

impl Timers {
    /// Sets (or, with `None`, clears) rank `r`'s timer.
    pub fn set(&mut self, r: Rank, t: Option<Duration>) {
        if let Some(old) = self.of.remove(&r) {
            self.due.remove(&(old, r));
        }
        if let Some(t) = t {
            self.due.insert((t, r));
            self.of.insert(r, t);
        }
    }

    /// The ranks whose timers are due at `now`, their timers cleared.
    pub fn take_due(&mut self, now: Duration) -> Vec<Rank> {
        let mut out = Vec::new();
        while let Some(&(t, r)) = self.due.first() {
            if t > now {
                break;
            }
            self.due.pop_first();
            self.of.remove(&r);
            out.push(r);
        }
        out
    }

    /// The earliest timer.
    pub fn first(&self) -> Option<Duration> {
        self.due.first().map(|(t, _)| *t)
    }
}

/// Everyone is idle: moves `sim`'s clock to its next event or to `timer`,
/// whichever comes first. `false` when neither exists: nothing can happen
/// any more.
pub fn advance_idle(sim: &SimFabric, timer: Option<Duration>) -> bool {
    let now = sim.now();
    let next = match (sim.next_event_at(), timer) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match next {
        Some(t) if t > now => sim.advance(t - now),
        Some(_) => {
            sim.step();
        }
        None => return false,
    }
    true
}

/// One rank of a simulated job.
pub struct JobRank {
    /// Its BTL.
    pub btl: Arc<Btl<SimContext>>,
    /// Its process.
    pub proc: SimProcess,
    /// Its node.
    pub node: usize,
    /// Not progressed while set (a busy or descheduled process).
    pub paused: bool,
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Ranks found this much work.
    Worked(usize),
    /// Nobody had work: virtual time moved on (or, while the causal clock
    /// holds it back, stays, and every live rank is progressed at the
    /// next step; a paused rank that holds it back holds it for good).
    Advanced,
    /// Nothing is scheduled anywhere: nothing can happen any more.
    Stuck,
}

/// N nodes × M ranks of BTLs on a simulated fabric.
pub struct SimJob {
    /// The fabric (faults, introspection).
    pub sim: SimFabric,
    ranks: Vec<Option<JobRank>>,
    per_node: usize,
    dirty: Vec<bool>,
    rank_of_pid: HashMap<u32, Rank>,
    timers: Timers,
    /// Most sending QPs any rank held at the end of a step.
    pub max_qps: usize,
    track_qps: bool,
}

impl std::fmt::Debug for SimJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SimJob({} ranks, t={:?})",
            self.ranks.len(),
            self.sim.now()
        )
    }
}

impl SimJob {
    /// `nodes` × `per_node` ranks on `device`, every peer added everywhere.
    pub fn new(seed: u64, nodes: usize, per_node: usize, device: SimDevice) -> Result<SimJob> {
        Self::with(
            SimConfig::new(seed, nodes).with_devices(vec![device]),
            per_node,
            |_| {},
        )
    }

    /// A job on a fabric configured by `cfg` (its first device), each rank's
    /// configuration passed through `tune` first, every peer added
    /// everywhere.
    pub fn with(cfg: SimConfig, per_node: usize, tune: impl Fn(&mut BtlConfig)) -> Result<SimJob> {
        let job = Self::unintroduced(cfg, per_node, tune)?;
        let peers: Vec<Peer> = (0..job.size() as Rank).map(|r| job.peer(r)).collect();
        for r in job.ranks.iter().flatten() {
            r.btl.add_procs(&peers)?;
        }
        Ok(job)
    }

    /// As [`SimJob::with`], but every rank knows only itself: the test adds
    /// peers ([`SimJob::peer`]) as an MPI library would, lazily.
    pub fn unintroduced(
        cfg: SimConfig,
        per_node: usize,
        tune: impl Fn(&mut BtlConfig),
    ) -> Result<SimJob> {
        let nodes = cfg.nodes;
        let name = cfg.devices[0].name.clone();
        let sim = SimFabric::new(cfg)?;
        // Every rank reacts at an instant before time moves on.
        sim.set_auto_advance(false);
        let mut ranks = Vec::new();
        for node in 0..nodes {
            for i in 0..per_node {
                let rank = (node * per_node + i) as Rank;
                let proc = sim.spawn(node)?;
                let ctx = proc.open(&name)?;
                let listen = SocketAddr::new(ctx.ip(), 0);
                let mut cfg =
                    BtlConfig::new(rank, node as u32, JOB, XrcdKey::new("xrcd-job"), listen);
                let s = sim.clone();
                cfg.clock = Clock::from_fn(move || s.now());
                tune(&mut cfg);
                let btl = Arc::new(Btl::new(ctx, cfg)?);
                ranks.push(Some(JobRank {
                    btl,
                    proc,
                    node,
                    paused: false,
                }));
            }
        }
        let rank_of_pid = ranks
            .iter()
            .flatten()
            .map(|r| (r.proc.pid(), r.btl.rank()))
            .collect();
        Ok(SimJob {
            sim,
            dirty: vec![true; ranks.len()],
            ranks,
            per_node,
            rank_of_pid,
            timers: Timers::default(),
            max_qps: 0,
            track_qps: false,
        })
    }

    /// What peers need to know of rank `r` to reach it (as an MPI library
    /// would publish it).
    pub fn peer(&self, r: Rank) -> Peer {
        let j = self.get(r);
        Peer {
            rank: r,
            node: j.node as u32,
            addr: j.btl.listen_addr().expect("a listener"),
            ib: j.btl.listen_ib_addr(),
            receive: Some(j.btl.receive()),
        }
    }

    /// Records, after every step, the most sending QPs any rank holds
    /// ([`SimJob::max_qps`]).
    pub fn track_qps(&mut self, on: bool) {
        self.track_qps = on;
    }

    /// Ranks in the job (live or not).
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Ranks per node.
    pub fn per_node(&self) -> usize {
        self.per_node
    }

    /// Nodes.
    pub fn nodes(&self) -> usize {
        self.ranks.len() / self.per_node.max(1)
    }

    /// The live ranks.
    pub fn live(&self) -> Vec<Rank> {
        (0..self.ranks.len() as Rank)
            .filter(|r| self.ranks[*r as usize].is_some())
            .collect()
    }

    /// Whether rank `r` is live.
    pub fn is_live(&self, r: Rank) -> bool {
        self.ranks.get(r as usize).is_some_and(|x| x.is_some())
    }

    /// Virtual time.
    pub fn now(&self) -> Duration {
        self.sim.now()
    }

    /// A live rank, marked to make progress in the next step (the caller
    /// is about to call into it).
    pub fn rank(&mut self, r: Rank) -> &mut JobRank {
        self.dirty[r as usize] = true;
        self.ranks[r as usize].as_mut().expect("a live rank")
    }

    /// A live rank's BTL, marked to make progress in the next step.
    pub fn btl(&mut self, r: Rank) -> &Arc<Btl<SimContext>> {
        &self.rank(r).btl
    }

    /// A live rank, to look at (not marked).
    pub fn get(&self, r: Rank) -> &JobRank {
        self.ranks[r as usize].as_ref().expect("a live rank")
    }

    /// A live rank's BTL, to look at (not marked).
    pub fn peek(&self, r: Rank) -> &Arc<Btl<SimContext>> {
        &self.get(r).btl
    }

    fn set_timer(&mut self, r: Rank, t: Option<Duration>) {
        self.timers.set(r, t);
    }

    /// One step: the ranks with something to do progress; if none found
    /// work, time moves to the next event or timer.
    pub fn step(&mut self) -> Step {
        let now = self.sim.now();
        let mut todo: BTreeSet<Rank> = self
            .sim
            .take_touched()
            .iter()
            .filter_map(|pid| self.rank_of_pid.get(pid).copied())
            .collect();
        for (r, d) in self.dirty.iter_mut().enumerate() {
            if std::mem::take(d) {
                todo.insert(r as Rank);
            }
        }
        todo.extend(self.timers.take_due(now));
        let mut work = 0;
        for r in todo {
            let Some(jr) = self.ranks[r as usize].as_ref() else {
                continue;
            };
            if jr.paused {
                continue;
            }
            let btl = jr.btl.clone();
            let n = btl.progress();
            work += n;
            // A rank that did something may have more to do at once.
            self.dirty[r as usize] = n > 0;
            self.set_timer(r, btl.next_timeout().map(|t| t.max(now)));
            if self.track_qps {
                self.max_qps = self.max_qps.max(btl.with_manager(|m| m.live_qps()));
            }
        }
        if work > 0 {
            return Step::Worked(work);
        }
        if self.sim.held_back() {
            // The causal clock waits for a rank to look at what is queued
            // for it: every live rank looks at the next step, as its own
            // polling thread would.
            for r in self.live() {
                self.dirty[r as usize] = true;
            }
            return Step::Advanced;
        }
        if advance_idle(&self.sim, self.timers.first()) {
            Step::Advanced
        } else {
            Step::Stuck
        }
    }

    /// A round in which every rank found nothing to do, for callers that
    /// progress the ranks themselves: unless the causal clock holds time
    /// back ([`SimFabric::held_back`]), asks every rank for its timer and
    /// moves time to the next event or timer, or on by `otherwise` when
    /// nothing is scheduled. `false` while time is held back: it stays
    /// until the ranks have looked at what is queued for them.
    pub fn idle_round(&mut self, otherwise: Duration) -> bool {
        if self.sim.held_back() {
            return false;
        }
        self.refresh_timers();
        if !advance_idle(&self.sim, self.timers.first()) {
            self.sim.advance(otherwise);
        }
        true
    }

    /// Asks every live rank for its next connection timer.
    pub fn refresh_timers(&mut self) {
        let now = self.sim.now();
        for r in self.live() {
            let t = self.peek(r).next_timeout().map(|t| t.max(now));
            self.set_timer(r, t);
        }
    }

    /// Steps until `done`; an error (with a dump of every rank) after
    /// `limit` of virtual time, or when nothing can happen any more.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut SimJob) -> bool,
    ) -> std::result::Result<(), String> {
        let deadline = self.now() + limit;
        while !done(self) {
            let t = self.now();
            if t >= deadline {
                return Err(format!(
                    "not done after {limit:?} (t={t:?})\n{}",
                    self.dump()
                ));
            }
            if self.step() == Step::Stuck {
                return Err(format!(
                    "stuck: nothing scheduled (t={t:?})\n{}",
                    self.dump()
                ));
            }
        }
        Ok(())
    }

    /// Steps through `d` of virtual time (jumping when nothing is
    /// scheduled).
    pub fn advance(&mut self, d: Duration) {
        let end = self.now() + d;
        while self.now() < end {
            if self.step() == Step::Stuck {
                let now = self.now();
                self.sim.advance(end - now);
            }
        }
    }

    /// Steps until every live rank is idle.
    pub fn settle(&mut self, limit: Duration) -> std::result::Result<(), String> {
        self.run_until(limit, |j| j.ranks.iter().flatten().all(|r| r.btl.is_idle()))
    }

    /// Kills a rank: everything it held is released by the fabric.
    pub fn crash(&mut self, r: Rank) {
        let jr = self.ranks[r as usize].take().expect("a live rank");
        self.sim.crash(&jr.proc);
        self.set_timer(r, None);
    }

    /// A clean exit: the rank leaves (its peers hear of it first), then its
    /// process exits.
    pub fn exit(&mut self, r: Rank, limit: Duration) -> std::result::Result<(), String> {
        self.btl(r).shutdown();
        self.run_until(limit, |j| j.peek(r).is_drained())?;
        let jr = self.ranks[r as usize].take().expect("live");
        let proc = jr.proc.clone();
        drop(jr);
        proc.exit();
        self.set_timer(r, None);
        Ok(())
    }

    /// Settles, exits every live rank cleanly, and checks the fabric's
    /// invariants. Settled, no rank may have a CM exchange of its own in
    /// flight or waiting for its turn: each ends, answered or failed, and
    /// one left counted would shrink the rank's window for good.
    pub fn shutdown(&mut self, limit: Duration) -> std::result::Result<(), String> {
        self.settle(limit)?;
        let open = |j: &SimJob| {
            j.ranks
                .iter()
                .enumerate()
                .filter_map(|(i, r)| Some((i, r.as_ref()?.btl.with_manager(|m| m.exchanges()))))
                .filter(|(_, x)| *x != (0, 0))
                .collect::<Vec<_>>()
        };
        self.run_until(limit, |j| open(j).is_empty()).map_err(|e| {
            format!(
                "CM exchanges (rank, (in flight, waiting)) left: {:?}: {e}",
                open(self)
            )
        })?;
        for r in self.live() {
            self.btl(r).shutdown();
        }
        self.run_until(limit, |j| {
            j.ranks.iter().flatten().all(|r| r.btl.is_drained())
        })?;
        self.sim.check_invariants().map_err(|e| e.to_string())
    }

    /// A summary of every live rank, for failure messages.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (i, r) in self.ranks.iter().enumerate() {
            let Some(r) = r else { continue };
            let idle = r.btl.is_idle();
            out += &format!(
                "rank {i}: idle {idle} {:?} eps {:?}\n",
                r.btl.stats(),
                r.btl.with_manager(|m| m.endpoints_by_state()),
            );
            if !idle {
                out += &format!("rank {i}: busy with {}\n", r.btl.busy());
            }
        }
        out
    }
}

/// Tells a [`Responder`] how to reach a rank it does not know yet (as an
/// MPI library's address exchange would), or `None`.
pub type Directory = Arc<dyn Fn(Rank) -> Option<Peer> + Send + Sync>;

/// The connection side of a rank without its data path: the real
/// [`ConnDriver`] and [`xrcbtl_xrc_conn::ConnManager`] on a protection
/// domain, one CQ and SRQs (without receive buffers until
/// [`Responder::post_receives`]), with its listener.
/// It answers connection requests (creating or opening TGT QPs, accepting
/// RC connections) and makes connections of its own, as a rank of the job
/// does, in kilobytes instead of a rank's megabytes of buffers (about 16
/// KB with what the simulated device holds for it, in the scale harness):
/// scale simulations stand one in for each rank outside the node they
/// observe, made when the pattern first needs it.
///
/// It sends no message, and none may be sent to it until
/// [`Responder::post_receives`] has given each of its SRQs a buffer: it
/// throws away what lands there and posts the buffer again. The TGT QPs it holds are
/// not swept for errors ([`Responder::next_timer`] leaves the sweep out).
pub struct Responder {
    proc: SimProcess,
    ctx: SimContext,
    driver: ConnDriver<SimContext>,
    directory: Directory,
    /// One receive buffer of `.1` bytes per SRQ, in SRQ order, once
    /// [`Responder::post_receives`] made them.
    receives: Option<(DmaBuf<SimContext>, u32)>,
    // What the driver's QPs live on; dropped after it.
    srqs: Vec<<SimContext as Context>::Srq>,
    _xrcd: Option<<SimContext as Context>::Xrcd>,
    cq: <SimContext as Context>::Cq,
    pd: <SimContext as Context>::Pd,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rank = self.driver.manager().config().rank;
        write!(f, "Responder(rank {rank}, pid {})", self.proc.pid())
    }
}

impl Responder {
    /// Starts rank `cfg.rank` of node `cfg.node` as a process of `sim`, on
    /// the device named `device`, listening on `cfg.listen` (and on the
    /// same port natively, on InfiniBand); `directory` answers for ranks
    /// that ask for a connection while unknown.
    pub fn new(
        sim: &SimFabric,
        device: &str,
        cfg: &BtlConfig,
        directory: Directory,
    ) -> Result<Self> {
        let proc = sim.spawn(cfg.node as usize)?;
        let ctx = proc.open(device)?;
        let caps = ctx.caps().clone();
        let mode = crate::iface::mode_of(&caps, cfg);
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(64.min(caps.max_cqe))?;
        let xrcd = match mode {
            Mode::Xrc => Some(ctx.open_xrcd(&cfg.xrcd_key)?),
            Mode::Rc { .. } => None,
        };
        let attr = SrqAttr {
            max_wr: 1,
            max_sge: 1,
            srq_limit: 0,
        };
        let srqs = match &xrcd {
            Some(x) => crate::iface::class_sizes(cfg, mode)
                .iter()
                .map(|_| ctx.create_xrc_srq(&pd, x, &cq, attr))
                .collect::<Result<Vec<_>>>()?,
            None => vec![ctx.create_srq(&pd, attr)?],
        };
        let lent = Lent {
            ctx: &ctx,
            mode,
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            rc_srq: srqs.last().expect("a class"),
            xrcd: xrcd.as_ref(),
            srqns: srqs.iter().filter_map(|s| s.srq_num()).collect(),
        };
        let driver = ConnDriver::new(lent, cfg)?;
        Ok(Responder {
            proc,
            ctx,
            driver,
            directory,
            receives: None,
            srqs,
            _xrcd: xrcd,
            cq,
            pd,
        })
    }

    /// Its process.
    pub fn proc(&self) -> &SimProcess {
        &self.proc
    }

    /// Makes `peer` known.
    pub fn add_peer(&mut self, peer: &Peer) {
        self.driver
            .add_peer(peer.rank, peer.node, peer.addr, peer.ib);
    }

    /// Asks for a connection to `rank` (which must be known).
    pub fn connect(&mut self, now: Duration, rank: Rank) {
        self.driver.connect(now, rank);
    }

    /// Posts one receive buffer of `size` bytes on each of its SRQs, so
    /// that ranks may send it messages of up to `size` bytes (header
    /// included): [`Responder::progress`] throws away what lands and posts
    /// the buffer again. Called once; the buffers live as long as it.
    pub fn post_receives(&mut self, size: u32) -> Result<()> {
        if self.receives.is_some() {
            return Ok(());
        }
        let n = self.srqs.len();
        let buf = DmaBuf::new(&self.ctx, &self.pd, n * size as usize, Access::LOCAL_WRITE)?;
        for i in 0..n {
            post_one(&self.srqs, &buf, size, i)?;
        }
        self.receives = Some((buf, size));
        Ok(())
    }

    /// Reads its CQ: each message that landed is thrown away and its
    /// buffer posted again. Returns how many landed.
    fn take_messages(&self) -> Result<usize> {
        let Some((buf, size)) = &self.receives else {
            return Ok(0);
        };
        let mut wcs = [WorkCompletion::default(); 8];
        let mut landed = 0;
        loop {
            let n = self.cq.poll(&mut wcs)?;
            if n == 0 {
                return Ok(landed);
            }
            for wc in &wcs[..n] {
                // Receives flushed by a QP's end are not messages (and it
                // sends none of its own).
                if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
                    landed += 1;
                    post_one(&self.srqs, buf, *size, wc.wr_id as usize)?;
                }
            }
        }
    }

    /// Does whatever is pending (CM and async events, due retries, the
    /// messages that landed); returns how much work it found.
    pub fn progress(&mut self, now: Duration) -> usize {
        // A CQ that fails here has overrun: the scale runs that send to
        // it keep it far below its depth, and a failure shows as the
        // sender's.
        let mut work = self.take_messages().unwrap_or(0);
        work += self.driver.progress(now);
        while let Some(ev) = self.driver.poll_event() {
            work += 1;
            // Only a rank asking while unknown needs an answer; the rest
            // (its own connections ready, peers gone) it has no use for.
            if let ConnEvent::Notice(Notice::UnknownPeer { rank }) = ev {
                match (self.directory)(rank) {
                    Some(p) if p.rank == rank => {
                        self.add_peer(&p);
                        work += self.driver.progress(now);
                    }
                    _ => self.driver.unknown_peer(now, rank),
                }
            }
        }
        work
    }

    /// When the connection manager next needs [`Responder::progress`] for
    /// a retry or a departure (the driver's sweep of held TGT QPs is left
    /// out: nothing fails in a scale run, and a million responders each
    /// waking every 50 ms would cost the simulation more than the job).
    pub fn next_timer(&self) -> Option<Duration> {
        self.driver.manager().poll_timeout()
    }

    /// Its connection manager (counters, state).
    pub fn manager(&self) -> &xrcbtl_xrc_conn::ConnManager {
        self.driver.manager()
    }
}

/// Posts receive buffer `i` of `buf` (`size` bytes each) on SRQ `i` of
/// `srqs`, with its index as the work request's id.
fn post_one(
    srqs: &[<SimContext as Context>::Srq],
    buf: &DmaBuf<SimContext>,
    size: u32,
    i: usize,
) -> Result<()> {
    srqs[i].post_recv(&RecvWr {
        wr_id: i as u64,
        sgl: &[buf.sge(i * size as usize, size)],
    })
}
