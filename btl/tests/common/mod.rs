//! A simulated cluster: N nodes x M ranks, each rank a process with its own
//! connection driver on SimFabric, all driven from one thread in virtual
//! time, deterministic from the seed.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use xrcbtl_btl::conn::{ConnDriver, DriverConfig, Received};
use xrcbtl_fabric::sim::{SimConfig, SimContext, SimDevice, SimFabric, SimProcess};
use xrcbtl_fabric::{Fabric, XrcdKey};
use xrcbtl_xrc_conn::Notice;

#[path = "../sched/mod.rs"]
mod sched;
use sched::Sched;

pub const JOB: u32 = 0x5eed;

pub struct RankProc {
    pub drv: ConnDriver<SimContext>,
    pub proc: SimProcess,
    pub node: usize,
    /// The test called into it: it must make progress.
    pub dirty: bool,
    /// Messages received, by source: sequence numbers in arrival order.
    pub got: BTreeMap<u32, Vec<u32>>,
    pub notices: Vec<Notice>,
}

pub struct Cluster {
    pub sim: SimFabric,
    pub ranks: Vec<Option<RankProc>>,
    pub nodes: usize,
    pub per_node: usize,
    /// Highest number of sending QPs any process held at once.
    pub max_qps: usize,
    sched: Sched,
}

impl Cluster {
    pub fn new(seed: u64, nodes: usize, per_node: usize, device: SimDevice) -> Cluster {
        Self::with_config(
            SimConfig::new(seed, nodes).with_devices(vec![device]),
            per_node,
            |_| {},
        )
    }

    pub fn with_config(
        cfg: SimConfig,
        per_node: usize,
        tune: impl Fn(&mut DriverConfig),
    ) -> Cluster {
        let nodes = cfg.nodes;
        let name = cfg.devices[0].name.clone();
        let sim = SimFabric::new(cfg).unwrap();
        // Every rank reacts at an instant before time moves on.
        sim.set_auto_advance(false);
        let mut ranks = Vec::new();
        for node in 0..nodes {
            for i in 0..per_node {
                let rank = (node * per_node + i) as u32;
                let proc = sim.spawn(node).unwrap();
                let ctx = proc.open(&name).unwrap();
                let listen = SocketAddr::new(ctx.ip(), 0);
                let mut dc =
                    DriverConfig::new(rank, node as u32, JOB, XrcdKey::new("xrcd-job"), listen);
                tune(&mut dc);
                let drv = ConnDriver::new(ctx, dc).unwrap();
                ranks.push(Some(RankProc {
                    drv,
                    proc,
                    node,
                    dirty: true,
                    got: BTreeMap::new(),
                    notices: Vec::new(),
                }));
            }
        }
        let dir: Vec<(u32, u32, SocketAddr)> = ranks
            .iter()
            .enumerate()
            .map(|(r, p)| {
                let p = p.as_ref().unwrap();
                (r as u32, p.node as u32, p.drv.listen_addr().unwrap())
            })
            .collect();
        for p in ranks.iter_mut().flatten() {
            for (r, n, a) in &dir {
                p.drv.add_peer(*r, *n, *a);
            }
        }
        let rank_of_pid = ranks
            .iter()
            .enumerate()
            .map(|(r, p)| (p.as_ref().unwrap().proc.pid(), r as u32))
            .collect();
        Cluster {
            sim,
            ranks,
            nodes,
            per_node,
            max_qps: 0,
            sched: Sched::new(rank_of_pid),
        }
    }

    pub fn now(&self) -> Duration {
        self.sim.now()
    }

    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    pub fn live(&self) -> Vec<u32> {
        (0..self.ranks.len() as u32)
            .filter(|r| self.ranks[*r as usize].is_some())
            .collect()
    }

    /// A live rank, marked to make progress in the next round (the caller
    /// is about to call into it).
    pub fn rank(&mut self, r: u32) -> &mut RankProc {
        let p = self.ranks[r as usize].as_mut().expect("live rank");
        p.dirty = true;
        p
    }

    /// One round: every rank with something to do (something queued for
    /// it, a timer due, or a call from the test) makes progress and drains
    /// what it got. If none had anything to do, virtual time moves to the
    /// next scheduled event.
    pub fn step(&mut self) -> usize {
        let now = self.sim.now();
        let marked: Vec<u32> = (0..self.ranks.len() as u32)
            .filter(|&r| self.ranks[r as usize].as_ref().is_some_and(|p| p.dirty))
            .collect();
        let mut work = 0;
        for r in self.sched.due(&self.sim, now, marked) {
            let Some(p) = self.ranks[r as usize].as_mut() else {
                continue;
            };
            p.dirty = false;
            work += p.drv.progress(now);
            while let Some(m) = p.drv.recv() {
                let Received { src, seq, .. } = m;
                p.got.entry(src).or_default().push(seq);
            }
            while let Some(n) = p.drv.poll_notice() {
                p.notices.push(n);
            }
            self.max_qps = self.max_qps.max(p.drv.manager().live_qps());
            self.sched.set_timer(r, p.drv.manager().poll_timeout());
        }
        // Everyone idle: time moves to the next event or timer; if nothing
        // is scheduled anywhere, nothing can happen.
        if work == 0 && !self.sched.idle(&self.sim, now) {
            return usize::MAX;
        }
        work
    }

    /// A summary of every rank, for failure messages.
    pub fn dump(&mut self) -> String {
        let mut out = String::new();
        for r in self.live() {
            let p = self.ranks[r as usize].as_ref().unwrap();
            let m = p.drv.manager();
            out += &format!(
                "rank {r}: {:?} qps {} {:?}\n",
                m.endpoints_by_state(),
                m.live_qps(),
                p.drv.stats()
            );
        }
        out
    }

    /// Steps until `done` holds, or fails after `limit` of virtual time.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Cluster) -> bool) {
        let deadline = self.now() + limit;
        while !done(self) {
            let t = self.now();
            if t >= deadline {
                panic!(
                    "not done after {limit:?} of virtual time (t={t:?})\n{}",
                    self.dump()
                );
            }
            if self.step() == usize::MAX {
                panic!(
                    "stuck: nothing scheduled and not done (t={t:?})\n{}",
                    self.dump()
                );
            }
        }
    }

    /// Steps for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now() + d;
        while self.now() < end {
            if self.step() == usize::MAX {
                let now = self.now();
                self.sim.advance(end - now);
            }
        }
    }

    pub fn connect(&mut self, from: u32, to: u32) {
        let now = self.now();
        self.rank(from).drv.connect(now, to);
    }

    pub fn ready(&self, from: u32, to: u32) -> bool {
        self.ranks[from as usize]
            .as_ref()
            .is_some_and(|p| p.drv.is_ready(to))
    }

    /// Connects every live rank to every other and waits until all are ready.
    pub fn connect_all(&mut self, limit: Duration) {
        let live = self.live();
        for &a in &live {
            for &b in &live {
                if a != b {
                    self.connect(a, b);
                }
            }
        }
        self.run_until(limit, |c| {
            live.iter()
                .all(|&a| live.iter().all(|&b| a == b || c.ready(a, b)))
        });
    }

    /// Sends `count` messages from every live rank to every other, waits
    /// until all arrived, and checks exactly once, in order.
    pub fn exchange(&mut self, count: u32, limit: Duration) {
        let live = self.live();
        let before: BTreeMap<(u32, u32), usize> = live
            .iter()
            .flat_map(|&a| live.iter().map(move |&b| (a, b)))
            .map(|(a, b)| {
                (
                    (a, b),
                    self.ranks[b as usize]
                        .as_ref()
                        .unwrap()
                        .got
                        .get(&a)
                        .map_or(0, |v| v.len()),
                )
            })
            .collect();
        let mut todo: BTreeSet<(u32, u32, u32)> = BTreeSet::new();
        for &a in &live {
            for &b in &live {
                if a != b {
                    for i in 0..count {
                        todo.insert((a, b, i));
                    }
                }
            }
        }
        let deadline = self.now() + limit;
        while !todo.is_empty() {
            assert!(
                self.now() < deadline,
                "{} messages not sent (t={:?})",
                todo.len(),
                self.now()
            );
            let batch: Vec<(u32, u32, u32)> = todo.iter().copied().take(4096).collect();
            for (a, b, i) in batch {
                // Keep per-destination order: only the lowest pending index.
                if todo.range((a, b, 0)..(a, b, i)).next().is_some() {
                    continue;
                }
                let now = self.now();
                let p = self.rank(a);
                if !p.drv.is_ready(b) {
                    p.drv.connect(now, b);
                    continue;
                }
                if p.drv.send(b, &i.to_le_bytes()).unwrap() {
                    todo.remove(&(a, b, i));
                }
            }
            self.step();
        }
        self.run_until(limit, |c| {
            live.iter().all(|&a| {
                live.iter().all(|&b| {
                    a == b
                        || c.ranks[b as usize]
                            .as_ref()
                            .unwrap()
                            .got
                            .get(&a)
                            .map_or(0, |v| v.len())
                            >= before[&(a, b)] + count as usize
                })
            })
        });
        for &a in &live {
            for &b in &live {
                if a == b {
                    continue;
                }
                let got = &self.ranks[b as usize].as_ref().unwrap().got[&a];
                let fresh = &got[before[&(a, b)]..];
                assert_eq!(fresh.len(), count as usize, "{a} -> {b}: {fresh:?}");
                for w in got.windows(2) {
                    assert!(
                        w[1] == w[0] + 1,
                        "{a} -> {b}: out of order or duplicated: {got:?}"
                    );
                }
            }
        }
    }

    /// A clean exit: the rank leaves through its manager, then its process
    /// exits.
    pub fn exit(&mut self, r: u32, limit: Duration) {
        let now = self.now();
        self.rank(r).drv.shutdown(now);
        self.run_until(limit, |c| {
            c.ranks[r as usize]
                .as_ref()
                .unwrap()
                .notices
                .contains(&Notice::Drained)
        });
        let p = self.ranks[r as usize].take().unwrap();
        let proc = p.proc.clone();
        drop(p);
        proc.exit();
    }

    /// A crash: the process dies with everything it holds.
    pub fn crash(&mut self, r: u32) {
        let p = self.ranks[r as usize].take().unwrap();
        self.sim.crash(&p.proc);
        drop(p);
    }

    /// TGT QPs per node, and the holders of each.
    pub fn tgt_counts(&self) -> Vec<usize> {
        (0..self.nodes)
            .map(|n| self.sim.node_view(n).tgt_qps.len())
            .collect()
    }
}

impl Cluster {
    /// Checks that nothing is left behind: the simulator's invariants, no
    /// TGT QP held by a dead process, exactly one TGT QP per (live sender,
    /// node) it talks to, and at most one INI QP per (process, node).
    pub fn check_clean(&mut self, dead: &[SimProcess]) {
        self.sim.check_invariants().unwrap();
        let dead_pids: Vec<u32> = dead.iter().map(|p| p.pid()).collect();
        for p in dead {
            let v = self.sim.process_view(p);
            assert!(!v.alive);
            assert_eq!(
                (
                    v.qps,
                    v.tgt_handles,
                    v.mrs,
                    v.srqs,
                    v.cqs,
                    v.pds,
                    v.xrcds,
                    v.cm_ids
                ),
                (0, 0, 0, 0, 0, 0, 0, 0),
                "pid {} left objects behind",
                p.pid()
            );
        }
        for n in 0..self.nodes {
            for t in self.sim.node_view(n).tgt_qps {
                assert!(
                    t.openers.iter().all(|o| !dead_pids.contains(o)),
                    "node {n}: a dead process still holds {t:?}"
                );
            }
        }
        // XRC: one INI QP per node at most. RC: one QP per peer at most.
        let live = self.live();
        let xrc = live
            .first()
            .is_some_and(|&r| self.rank(r).drv.mode() == xrcbtl_xrc_conn::Mode::Xrc);
        let bound = if xrc { self.nodes } else { self.size() - 1 };
        for r in live {
            let qps = self.rank(r).drv.manager().live_qps();
            assert!(
                qps <= bound,
                "rank {r} holds {qps} sending QPs (bound {bound})"
            );
        }
        assert!(
            self.max_qps <= bound,
            "a process once held {} sending QPs (bound {bound})",
            self.max_qps
        );
    }

    /// With every survivor connected to every other: each node has exactly
    /// one TGT QP per surviving process, no dead one piled up.
    pub fn check_tgt_per_sender(&self) {
        let live = self.live().len();
        for n in 0..self.nodes {
            let v = self.sim.node_view(n);
            assert_eq!(v.tgt_qps.len(), live, "node {n}: {:?}", v.tgt_qps);
        }
    }
}
