//! A simulated cluster of BTL ranks: N nodes x M ranks, each a process with
//! its own [`Btl`] on SimFabric, all driven from one thread in virtual time,
//! deterministic from the seed. Every rank records what its active-message
//! callbacks received.

#![allow(dead_code)]

#[path = "../sched/mod.rs"]
mod sched;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrcbtl_btl::{Btl, BtlConfig, Clock, Peer};
use xrcbtl_fabric::sim::{SimConfig, SimContext, SimDevice, SimFabric, SimProcess};
use xrcbtl_fabric::{Fabric, XrcdKey};

use sched::Sched;

pub const JOB: u32 = 0xb71;
/// The tag every rank records.
pub const TAG: u8 = 7;

/// A message a rank received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    pub src: u32,
    pub tag: u8,
    pub data: Vec<u8>,
}

pub struct Rank {
    pub btl: Btl<SimContext>,
    pub proc: SimProcess,
    pub node: usize,
    pub got: Arc<Mutex<Vec<Got>>>,
    /// Not progressed while set (a busy or descheduled process).
    pub paused: bool,
    dirty: bool,
}

pub struct Cluster {
    pub sim: SimFabric,
    pub ranks: Vec<Option<Rank>>,
    sched: Sched,
}

impl Cluster {
    pub fn new(seed: u64, nodes: usize, per_node: usize, device: SimDevice) -> Cluster {
        Self::with(seed, nodes, per_node, device, |_| {})
    }

    pub fn with(
        seed: u64,
        nodes: usize,
        per_node: usize,
        device: SimDevice,
        tune: impl Fn(&mut BtlConfig),
    ) -> Cluster {
        let name = device.name.clone();
        let sim = SimFabric::new(SimConfig::new(seed, nodes).with_devices(vec![device])).unwrap();
        sim.set_auto_advance(false);
        let mut ranks = Vec::new();
        for node in 0..nodes {
            for i in 0..per_node {
                let rank = (node * per_node + i) as u32;
                let proc = sim.spawn(node).unwrap();
                let ctx = proc.open(&name).unwrap();
                let listen = SocketAddr::new(ctx.ip(), 0);
                let mut cfg = BtlConfig::new(rank, node as u32, JOB, XrcdKey::new("xrcd"), listen);
                let s = sim.clone();
                cfg.clock = Clock::from_fn(move || s.now());
                tune(&mut cfg);
                let mut btl = Btl::new(ctx, cfg).unwrap();
                let got = Arc::new(Mutex::new(Vec::new()));
                for tag in [TAG, TAG + 1] {
                    let g = got.clone();
                    btl.register_am(tag, move |m| {
                        g.lock().unwrap().push(Got {
                            src: m.src,
                            tag: m.tag,
                            data: m.data.to_vec(),
                        })
                    });
                }
                ranks.push(Some(Rank {
                    btl,
                    proc,
                    node,
                    got,
                    paused: false,
                    dirty: true,
                }));
            }
        }
        let peers: Vec<Peer> = ranks
            .iter()
            .map(|r| {
                let r = r.as_ref().unwrap();
                Peer {
                    rank: r.btl.rank(),
                    node: r.node as u32,
                    addr: r.btl.listen_addr().unwrap(),
                }
            })
            .collect();
        for r in ranks.iter_mut().flatten() {
            r.btl.add_procs(&peers);
        }
        let rank_of_pid = ranks
            .iter()
            .enumerate()
            .map(|(i, r)| (r.as_ref().unwrap().proc.pid(), i as u32))
            .collect();
        Cluster {
            sim,
            ranks,
            sched: Sched::new(rank_of_pid),
        }
    }

    pub fn now(&self) -> Duration {
        self.sim.now()
    }

    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// A live rank, marked to make progress next round.
    pub fn rank(&mut self, r: u32) -> &mut Rank {
        let p = self.ranks[r as usize].as_mut().expect("live rank");
        p.dirty = true;
        p
    }

    pub fn btl(&mut self, r: u32) -> &mut Btl<SimContext> {
        &mut self.rank(r).btl
    }

    /// Messages rank `r` received so far.
    pub fn got(&self, r: u32) -> Vec<Got> {
        self.ranks[r as usize]
            .as_ref()
            .unwrap()
            .got
            .lock()
            .unwrap()
            .clone()
    }

    pub fn got_count(&self, r: u32) -> usize {
        self.ranks[r as usize]
            .as_ref()
            .unwrap()
            .got
            .lock()
            .unwrap()
            .len()
    }

    pub fn clear_got(&mut self, r: u32) {
        self.ranks[r as usize]
            .as_ref()
            .unwrap()
            .got
            .lock()
            .unwrap()
            .clear();
    }

    /// Kills a rank (a crash: everything it held is released by the fabric).
    pub fn crash(&mut self, r: u32) {
        let p = self.ranks[r as usize].take().expect("live rank");
        self.sim.crash(&p.proc);
        self.sched.set_timer(r, None);
    }

    /// One round: ranks with something to do progress; if none found work,
    /// virtual time moves to the next event or timer. `usize::MAX` when
    /// nothing at all is scheduled.
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
            if p.paused {
                continue;
            }
            let n = p.btl.progress();
            work += n;
            // A rank that did something may have more to do at once
            // (pending work freed by its own completions).
            p.dirty = n > 0;
            let t = p.btl.driver().manager().poll_timeout();
            self.sched.set_timer(r, t.map(|t| t.max(now)));
        }
        if work == 0 && !self.sched.idle(&self.sim, now) {
            return usize::MAX;
        }
        work
    }

    /// Steps until `done`, failing after `limit` of virtual time or when
    /// nothing can happen any more.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Cluster) -> bool) {
        let deadline = self.now() + limit;
        while !done(self) {
            let t = self.now();
            assert!(
                t < deadline,
                "not done after {limit:?} (t={t:?})\n{}",
                self.dump()
            );
            assert!(
                self.step() != usize::MAX,
                "stuck: nothing scheduled (t={t:?})\n{}",
                self.dump()
            );
        }
    }

    /// Steps through `d` of virtual time.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now() + d;
        while self.now() < end {
            if self.step() == usize::MAX {
                return;
            }
        }
    }

    /// Steps until every live rank is idle (nothing pending or in flight).
    pub fn settle(&mut self, limit: Duration) {
        self.run_until(limit, |c| c.ranks.iter().flatten().all(|r| r.btl.is_idle()));
    }

    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (i, r) in self.ranks.iter().enumerate() {
            let Some(r) = r else { continue };
            out += &format!(
                "rank {i}: idle {} got {} {:?} eps {:?}\n",
                r.btl.is_idle(),
                r.got.lock().unwrap().len(),
                r.btl.stats(),
                r.btl.driver().manager().endpoints_by_state(),
            );
        }
        out
    }

    /// Cleanly shuts every live rank down and checks that nothing is left
    /// on the fabric.
    pub fn shutdown(&mut self, limit: Duration) {
        self.settle(limit);
        let live: Vec<u32> = (0..self.size() as u32)
            .filter(|r| self.ranks[*r as usize].is_some())
            .collect();
        for &r in &live {
            self.btl(r).shutdown();
        }
        self.run_until(limit, |c| {
            c.ranks.iter().flatten().all(|r| r.btl.is_drained())
        });
        self.sim.check_invariants().unwrap();
    }
}

/// Bytes of a test message: a pattern from the sizes and a seed.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(len as u32) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
