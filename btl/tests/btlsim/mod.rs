//! The tests' view of a simulated job ([`SimJob`]): every rank records
//! what its active-message callbacks received, failures panic with a dump
//! of every rank, and the cluster-level checks (connections, exchanges,
//! what a dead process left behind) live here.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrcbtl_btl::sim::{SimJob, Step};
use xrcbtl_btl::{Btl, BtlConfig, Mode, Notice};
use xrcbtl_fabric::sim::{SimConfig, SimContext, SimDevice, SimFabric, SimProcess};

#[allow(unused_imports)]
pub use xrcbtl_btl::sim::JOB;

#[path = "../util/pattern.rs"]
mod pattern;
#[allow(unused_imports)]
pub use pattern::pattern;

/// The tag every rank records.
pub const TAG: u8 = 7;
/// The tag of cluster exchanges.
pub const XTAG: u8 = 9;

/// A message a rank received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    pub src: u32,
    pub tag: u8,
    pub data: Vec<u8>,
}

type Inbox = Arc<Mutex<Vec<Got>>>;
type Counter = Arc<std::sync::atomic::AtomicUsize>;

pub struct Cluster {
    pub job: SimJob,
    pub sim: SimFabric,
    got: Vec<Inbox>,
    /// Exchange messages each rank received.
    xcount: Vec<Counter>,
    notices: Vec<Vec<Notice>>,
    /// Exchange messages sent, by (source, destination).
    sent: BTreeMap<(u32, u32), u32>,
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
        Self::with_config(
            SimConfig::new(seed, nodes).with_devices(vec![device]),
            per_node,
            tune,
        )
    }

    pub fn with_config(cfg: SimConfig, per_node: usize, tune: impl Fn(&mut BtlConfig)) -> Cluster {
        let mut job = SimJob::with(cfg, per_node, tune).expect("a simulated job");
        job.track_qps(true);
        let mut got = Vec::new();
        let mut xcount = Vec::new();
        for r in 0..job.size() as u32 {
            let inbox: Inbox = Arc::default();
            let count: Counter = Arc::default();
            for tag in [TAG, TAG + 1, XTAG] {
                let (i, n) = (inbox.clone(), count.clone());
                job.peek(r).register_am(tag, move |_, m| {
                    i.lock().unwrap().push(Got {
                        src: m.src,
                        tag: m.tag,
                        data: m.data.to_vec(),
                    });
                    if m.tag == XTAG {
                        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
            got.push(inbox);
            xcount.push(count);
        }
        Cluster {
            sim: job.sim.clone(),
            notices: vec![Vec::new(); job.size()],
            job,
            got,
            xcount,
            sent: BTreeMap::new(),
        }
    }

    pub fn now(&self) -> Duration {
        self.job.now()
    }

    /// How long a test waits for a connection, an exchange or a failure to
    /// show: a connection's worst case is every attempt (the configured
    /// retries) running into a peer that answers nothing, each found dead
    /// after the QPs' ACK timeout and 7 retries; twice that, and at least
    /// a second.
    pub fn patience(&self) -> Duration {
        let live = self.live();
        let cfg = self.job.peek(live[0]).config();
        let attempts = cfg.retries.max(1) + 1;
        (cfg.dead_peer_after() * attempts * 2).max(Duration::from_secs(1))
    }

    pub fn size(&self) -> usize {
        self.job.size()
    }

    pub fn live(&self) -> Vec<u32> {
        self.job.live()
    }

    /// A live rank's BTL (marked to progress next step).
    pub fn btl(&mut self, r: u32) -> Arc<Btl<SimContext>> {
        self.job.btl(r).clone()
    }

    pub fn proc(&self, r: u32) -> SimProcess {
        self.job.get(r).proc.clone()
    }

    pub fn pause(&mut self, r: u32, paused: bool) {
        self.job.rank(r).paused = paused;
    }

    /// Messages rank `r` received so far.
    pub fn got(&self, r: u32) -> Vec<Got> {
        self.got[r as usize].lock().unwrap().clone()
    }

    pub fn got_count(&self, r: u32) -> usize {
        self.got[r as usize].lock().unwrap().len()
    }

    pub fn clear_got(&mut self, r: u32) {
        self.got[r as usize].lock().unwrap().clear();
    }

    /// Notices rank `r` has seen so far.
    pub fn notices(&mut self, r: u32) -> Vec<Notice> {
        let n = self.job.peek(r).take_notices();
        self.notices[r as usize].extend(n);
        self.notices[r as usize].clone()
    }

    pub fn step(&mut self) -> Step {
        self.job.step()
    }

    #[track_caller]
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Cluster) -> bool) {
        let deadline = self.now() + limit;
        while !done(self) {
            let t = self.now();
            assert!(
                t < deadline,
                "not done after {limit:?} (t={t:?})\n{}",
                self.job.dump()
            );
            assert!(
                self.step() != Step::Stuck,
                "stuck: nothing scheduled (t={t:?})\n{}",
                self.job.dump()
            );
        }
    }

    pub fn advance(&mut self, d: Duration) {
        self.job.advance(d);
    }

    #[track_caller]
    pub fn settle(&mut self, limit: Duration) {
        if let Err(e) = self.job.settle(limit) {
            panic!("{e}");
        }
    }

    pub fn crash(&mut self, r: u32) {
        self.job.crash(r);
    }

    /// A clean exit: the rank leaves, then its process exits.
    #[track_caller]
    pub fn exit(&mut self, r: u32, limit: Duration) {
        if let Err(e) = self.job.exit(r, limit) {
            panic!("{e}");
        }
    }

    #[track_caller]
    pub fn shutdown(&mut self, limit: Duration) {
        if let Err(e) = self.job.shutdown(limit) {
            panic!("{e}");
        }
    }

    pub fn dump(&self) -> String {
        self.job.dump()
    }

    // ---- connections and exchanges -------------------------------------

    pub fn connect(&mut self, from: u32, to: u32) {
        self.btl(from).connect(to).unwrap();
    }

    pub fn ready(&self, from: u32, to: u32) -> bool {
        self.job.is_live(from) && self.job.peek(from).is_connected(to)
    }

    /// Connects every live rank to every other and waits until all are
    /// ready.
    #[track_caller]
    pub fn connect_all(&mut self, limit: Duration) {
        let live = self.live();
        for &a in &live {
            for &b in &live {
                if a != b {
                    self.connect(a, b);
                }
            }
        }
        // Pairs become ready and stay so: resume the check where it stopped.
        let pairs: Vec<(u32, u32)> = live
            .iter()
            .flat_map(|&a| live.iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a != b)
            .collect();
        let mut next = 0;
        self.run_until(limit, |c| {
            while next < pairs.len() && c.ready(pairs[next].0, pairs[next].1) {
                next += 1;
            }
            next == pairs.len()
        });
        assert!(
            pairs.iter().all(|&(a, b)| self.ready(a, b)),
            "a pair lost its connection"
        );
    }

    /// The exchange indices rank `dst` received from `src`, in arrival
    /// order.
    pub fn stream(&self, dst: u32, src: u32) -> Vec<u32> {
        self.got[dst as usize]
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.tag == XTAG && g.src == src)
            .map(|g| u32::from_le_bytes(g.data[..4].try_into().unwrap()))
            .collect()
    }

    /// Sends `count` messages from every live rank to every other, waits
    /// until all arrived, and checks that every stream so far arrived
    /// exactly once, in order.
    #[track_caller]
    pub fn exchange(&mut self, count: u32, limit: Duration) {
        let live = self.live();
        let received = |c: &Cluster| -> usize {
            live.iter()
                .map(|&b| c.xcount[b as usize].load(std::sync::atomic::Ordering::Relaxed))
                .sum()
        };
        let before = received(self);
        let fresh = live.len() * (live.len() - 1) * count as usize;
        for &a in &live {
            for &b in &live {
                if a == b {
                    continue;
                }
                let btl = self.btl(a);
                let next = self.sent.entry((a, b)).or_insert(0);
                for _ in 0..count {
                    btl.send(b, XTAG, &next.to_le_bytes(), &[]).unwrap();
                    *next += 1;
                }
            }
        }
        let want: BTreeMap<(u32, u32), u32> = self.sent.clone();
        self.run_until(limit, |c| received(c) >= before + fresh);
        for &a in &live {
            for &b in &live {
                if a != b {
                    let s = self.stream(b, a);
                    let first = s.first().copied().unwrap_or(0);
                    let expect: Vec<u32> = (first..want[&(a, b)]).collect();
                    assert_eq!(s, expect, "{a} -> {b}: out of order, lost or duplicated");
                }
            }
        }
    }

    /// TGT QPs per node.
    pub fn tgt_counts(&self) -> Vec<usize> {
        (0..self.job.nodes())
            .map(|n| self.sim.node_view(n).tgt_qps.len())
            .collect()
    }

    /// Checks that nothing is left behind: the simulator's invariants; the
    /// dead processes hold nothing; no TGT QP is held by a dead process; no
    /// live rank holds more than one sending QP per node (XRC) or per peer
    /// (RC), now or at the end of any step since tracking began.
    #[track_caller]
    pub fn check_clean(&mut self, dead: &[SimProcess]) {
        self.sim.check_invariants().unwrap();
        let st = self.sim.stats();
        assert_eq!(
            st.srq_qps_destroyed_early, 0,
            "an RC QP on the SRQ was destroyed before its last receive was reported"
        );
        assert_eq!(
            st.detached_local, 0,
            "local work used a registration whose memory was gone"
        );
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
        for n in 0..self.job.nodes() {
            for t in self.sim.node_view(n).tgt_qps {
                assert!(
                    t.openers.iter().all(|o| !dead_pids.contains(o)),
                    "node {n}: a dead process still holds {t:?}"
                );
            }
        }
        let live = self.live();
        let xrc = live
            .first()
            .is_some_and(|&r| self.job.peek(r).mode() == Mode::Xrc);
        let bound = if xrc {
            self.job.nodes()
        } else {
            self.size() - 1
        };
        for r in live {
            let qps = self.job.peek(r).with_manager(|m| m.live_qps());
            assert!(
                qps <= bound,
                "rank {r} holds {qps} sending QPs (bound {bound})"
            );
        }
        assert!(
            self.job.max_qps <= bound,
            "a rank once held {} sending QPs (bound {bound})",
            self.job.max_qps
        );
    }

    /// With every survivor connected to every other: each node has exactly
    /// one TGT QP per surviving process, no dead one piled up.
    #[track_caller]
    pub fn check_tgt_per_sender(&self) {
        let live = self.live().len();
        for n in 0..self.job.nodes() {
            let v = self.sim.node_view(n);
            assert_eq!(v.tgt_qps.len(), live, "node {n}: {:?}", v.tgt_qps);
        }
    }
}
