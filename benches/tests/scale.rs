//! Start-up grows linearly (issue 14): the scale harness's job at 128 and
//! at 256 nodes of 128 ranks, all-to-all and sparse, XRC and RC + SRQ. The
//! observed process's start-up time (virtual) and CM messages may grow at
//! most as fast as the peers it talks to (the node count, all-to-all; its
//! stencil and recursive-doubling partners, sparse), with 10% to spare;
//! its connection state must stay within [`BUDGET`] bytes per peer, also
//! once it has sent a message to every peer (the send logs); and
//! the structure must be XRC's: one INI QP per node, one TGT QP on the
//! node per sending process. Its clean exit tells every peer, and grows
//! as the peers too.
//!
//! Heavy: it runs in release builds (scripts/test-all runs it) and is
//! ignored in debug builds. The full table at 1,024 to 10,000 nodes is
//! `scripts/scale` (docs/scale.md).

use std::time::Duration;

use xrcbtl_benches::scale::{run, Pattern, Row, Spec, BUDGET};
use xrcbtl_fabric::sim::CountingAlloc;

// The harness measures the observed process's state with it.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Bytes per peer of its connection state and of what a message to every
/// peer left (the send logs).
fn with_logs(r: &Row) -> f64 {
    let sent = r.sent.as_ref().map_or(0, |x| x.bytes);
    (r.state_bytes + sent) as f64 / r.endpoints as f64
}

fn check_shape(r: &Row) {
    let s = &r.spec;
    let what = format!(
        "{} {} at {} nodes",
        s.pattern.name(),
        if s.xrc { "XRC" } else { "RC" },
        s.nodes
    );
    assert_eq!(r.sim.cm_retries, 0, "{what}: the CM resent messages");
    let per_peer = r.state_bytes as f64 / r.endpoints as f64;
    assert!(per_peer > 0.0, "{what}: no state counted");
    let sent = r.sent.as_ref().expect("the spec sends");
    assert_eq!(
        sent.messages, r.endpoints,
        "{what}: a message to every peer"
    );
    // A pass over the endpoints waiting for the CQ stops at its first
    // refusal: at most one per lock taken. (Trying every waiting endpoint
    // on every pass cost 48 million refusals for 8,191 messages at 64
    // nodes, 2.4 s of the run.)
    assert!(
        sent.cq_full <= sent.locks,
        "{what}: {} refusals for the CQ budget in {} locks",
        sent.cq_full,
        sent.locks
    );
    if s.pattern == Pattern::AllToAll {
        // With a score of peers, what a process keeps anyway (its route
        // cache, its first table entries) outweighs them: the budget is
        // for many. It holds with the send logs a message to every peer
        // filled (an INI QP's per node under XRC, an RC QP's per peer).
        assert!(per_peer <= BUDGET, "{what}: {per_peer:.0} bytes per peer");
        let logs = with_logs(r);
        assert!(
            logs <= BUDGET,
            "{what}: {logs:.0} bytes per peer after a message to each"
        );
        assert_eq!(r.endpoints, (s.ranks() - 1) as u64, "{what}");
        if s.xrc {
            assert_eq!((r.qps_end, r.qps_peak), (s.nodes, s.nodes), "{what}");
            assert_eq!(r.tgt_qps, s.ranks(), "{what}: one TGT QP per sender");
            assert_eq!(r.tgt_handles, s.ranks() - 1, "{what}");
        } else {
            assert_eq!(r.qps_end as u64, r.endpoints, "{what}: an RC QP per peer");
            assert_eq!(r.tgt_qps, 0, "{what}");
        }
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "heavy: run with --release")]
fn startup_grows_at_most_linearly_from_128_to_256_nodes() {
    for pattern in [Pattern::AllToAll, Pattern::Sparse] {
        for xrc in [true, false] {
            let a = run(&Spec::new(128, xrc, pattern)).unwrap();
            let b = run(&Spec::new(256, xrc, pattern)).unwrap();
            check_shape(&a);
            check_shape(&b);
            let peers = b.endpoints as f64 / a.endpoints as f64;
            let time = b.startup.as_secs_f64() / a.startup.as_secs_f64();
            let cm = (b.cm_sent + b.cm_received) as f64 / (a.cm_sent + a.cm_received) as f64;
            println!(
                "{} {}: peers x{peers:.2}, start-up {:?} -> {:?} (x{time:.2}), \
                 CM messages {} -> {} (x{cm:.2}), state {:.0} -> {:.0} bytes per peer \
                 ({:.0} -> {:.0} after a message to each)",
                pattern.name(),
                if xrc { "XRC" } else { "RC" },
                a.startup,
                b.startup,
                a.cm_sent + a.cm_received,
                b.cm_sent + b.cm_received,
                a.state_bytes as f64 / a.endpoints as f64,
                b.state_bytes as f64 / b.endpoints as f64,
                with_logs(&a),
                with_logs(&b),
            );
            assert!(
                time <= peers * 1.1,
                "{}: start-up grew x{time:.2}",
                pattern.name()
            );
            assert!(
                cm <= peers * 1.1,
                "{}: CM messages grew x{cm:.2}",
                pattern.name()
            );
        }
    }
}

/// The observed process leaves cleanly after the all-to-all start-up at
/// 128 and at 256 nodes: every peer that sends to it is told (no `Leave`
/// given up on), it keeps no QP, and the exit's time and CM messages grow
/// at most as the peers, with 10% to spare. The wait for acknowledgements
/// is scaled down with the job (500 ms x nodes / 10,000), as the exit at
/// 10,000 nodes takes seconds: a wait for them all rather than for the
/// next one would give up on most peers.
#[test]
#[cfg_attr(debug_assertions, ignore = "heavy: run with --release")]
fn a_clean_exit_tells_every_peer_and_grows_at_most_linearly() {
    for xrc in [true, false] {
        let spec = |nodes| {
            let mut s = Spec::new(nodes, xrc, Pattern::AllToAll);
            s.exit = true;
            s.leave_timeout = s.leave_timeout * nodes as u32 / 10_000;
            s
        };
        let (a, b) = (run(&spec(128)).unwrap(), run(&spec(256)).unwrap());
        let mode = if xrc { "XRC" } else { "RC" };
        for r in [&a, &b] {
            let e = r.exit.as_ref().expect("asked for");
            println!(
                "{mode} exit at {} nodes: {:?}, {} Leave sent, {} abandoned, CM messages {} / {}",
                r.spec.nodes, e.time, e.leaves, e.leaves_abandoned, e.cm_sent, e.cm_received
            );
            assert_eq!(e.leaves, r.endpoints, "{mode}: one Leave per peer");
            assert_eq!((e.leaves_abandoned, e.qps_left), (0, 0), "{mode}");
        }
        let (ea, eb) = (a.exit.unwrap(), b.exit.unwrap());
        let peers = b.endpoints as f64 / a.endpoints as f64;
        let time = eb.time.as_secs_f64() / ea.time.as_secs_f64();
        let cm = (eb.cm_sent + eb.cm_received) as f64 / (ea.cm_sent + ea.cm_received) as f64;
        assert!(time <= peers * 1.1, "{mode}: exit time grew x{time:.2}");
        assert!(cm <= peers * 1.1, "{mode}: exit CM messages grew x{cm:.2}");
    }
}

/// The 10,000-node XRC all-to-all, scaled down to 128 nodes with the CM's
/// timeout scaled along (4,096 ms x 128 / 10,000): every remote process's
/// request reaches node 0 at once and queues there for nearly the timeout.
/// With the BTL's window, the observed process's own exchanges wait their
/// turn instead of queueing behind that storm: no request is sent again,
/// and the only answers sent again are node 0's own (a CM exchange between
/// two ranks of one node queues at its agent both ways: at most one per
/// rank of the node). Without the window, most requests are sent again.
#[test]
#[cfg_attr(debug_assertions, ignore = "heavy: run with --release")]
fn the_window_keeps_the_storm_within_the_cm_timeout() {
    let mut s = Spec::new(128, true, Pattern::AllToAll);
    s.cm_timeout = Duration::from_millis(4096) * 128 / 10_000;
    let paced = run(&s).unwrap();
    s.connect_window = 0;
    let unpaced = run(&s).unwrap();
    let show = |r: &Row| {
        format!(
            "window {}: {} resent ({} requests), {} CM messages",
            r.spec.connect_window,
            r.sim.cm_retries,
            r.sim.cm_req_retries,
            r.cm_sent + r.cm_received
        )
    };
    println!("{}\n{}", show(&paced), show(&unpaced));
    assert_eq!(paced.sim.cm_req_retries, 0, "{}", show(&paced));
    assert!(paced.sim.cm_retries <= 128, "{}", show(&paced));
    assert!(
        unpaced.sim.cm_req_retries > s.ranks() as u64 / 2,
        "{}",
        show(&unpaced)
    );
    assert_eq!(paced.endpoints, unpaced.endpoints);
}

/// The same job as the harness's, with nothing but connection managers:
/// every rank of the cluster a [`ConnManager`], the CM a queue that hands
/// each request, reply and reject to its peer at once (counting them as
/// the simulated CM does: REQ, then REP and RTU, or REJ), TGT QPs created
/// and opened on demand. No fabric, no driver, no time.
mod managers {
    use std::collections::{HashMap, VecDeque};
    use std::time::Duration;

    use xrcbtl_benches::scale::{plan, Spec};
    use xrcbtl_btl::sim::JOB;
    use xrcbtl_xrc_conn::{
        Action, CmFailure, CmRef, Config, ConnManager, Counters, Event, Mode, Node, Rank, RouteRef,
    };

    pub struct Net {
        pub mgrs: Vec<ConnManager>,
        per_node: usize,
        /// The other end of each id, both ways.
        peer: HashMap<(Rank, CmRef), (Rank, CmRef)>,
        /// Whom each id resolves towards.
        towards: HashMap<(Rank, CmRef), Rank>,
        next: u64,
        pub sent: Vec<u64>,
        pub received: Vec<u64>,
        /// TGT QPs created on each node.
        pub tgts: Vec<u64>,
        queue: VecDeque<(Rank, Event)>,
    }

    impl Net {
        /// The harness's job, run to the end.
        pub fn run(spec: &Spec) -> Net {
            let p = spec.ranks();
            let mode = if spec.xrc {
                Mode::Xrc
            } else {
                Mode::Rc { p2p: false }
            };
            let srqns = if spec.xrc { vec![1, 2] } else { Vec::new() };
            let node = |r: usize| (r / spec.per_node) as Node;
            let mgrs = (0..p)
                .map(|r| {
                    let cfg = Config::new(r as Rank, node(r), JOB, mode, srqns.clone());
                    ConnManager::new(cfg, [(r as Rank, node(r))])
                })
                .collect();
            let mut net = Net {
                mgrs,
                per_node: spec.per_node,
                peer: HashMap::new(),
                towards: HashMap::new(),
                next: 1 << 40,
                sent: vec![0; p],
                received: vec![0; p],
                tgts: vec![0; spec.nodes],
                queue: VecDeque::new(),
            };
            // Who talks to whom, in the harness's order.
            for (r, to) in plan(spec) {
                net.talk(r, &to);
            }
            while let Some((r, ev)) = net.queue.pop_front() {
                net.mgrs[r as usize].handle(Duration::ZERO, ev);
                net.act(r);
            }
            net
        }

        fn talk(&mut self, r: Rank, to: &[Rank]) {
            for &q in to {
                self.mgrs[r as usize].add_peer(q, (q as usize / self.per_node) as Node);
            }
            for &q in to {
                self.mgrs[r as usize].connect(Duration::ZERO, q);
                self.act(r);
            }
        }

        fn fresh(&mut self) -> u64 {
            self.next += 1;
            self.next
        }

        /// Carries out what rank `r`'s manager asks.
        fn act(&mut self, r: Rank) {
            while let Some(a) = self.mgrs[r as usize].poll_action() {
                match a {
                    Action::Resolve { cm, rank, .. } => {
                        self.towards.insert((r, cm), rank);
                        let node = rank as usize / self.per_node;
                        let route = RouteRef(node as u64 + 1);
                        self.queue.push_back((r, Event::Resolved { cm, route }));
                    }
                    Action::Connect { cm, data, .. } => {
                        let to = self.towards[&(r, cm)];
                        let theirs = CmRef(self.fresh());
                        self.peer.insert((r, cm), (to, theirs));
                        self.peer.insert((to, theirs), (r, cm));
                        self.sent[r as usize] += 1;
                        self.received[to as usize] += 1;
                        self.queue.push_back((
                            to,
                            Event::Request {
                                cm: theirs,
                                data,
                                from: None,
                            },
                        ));
                    }
                    Action::Accept { cm, data, .. } => {
                        let (i, icm) = self.peer[&(r, cm)];
                        // REP, then the initiator's RTU.
                        self.sent[r as usize] += 1;
                        self.received[i as usize] += 1;
                        self.sent[i as usize] += 1;
                        self.received[r as usize] += 1;
                        self.queue
                            .push_back((i, Event::Established { cm: icm, data }));
                        self.queue.push_back((
                            r,
                            Event::Established {
                                cm,
                                data: Vec::new(),
                            },
                        ));
                    }
                    Action::Reject { cm, data } => {
                        let (i, icm) = self.peer[&(r, cm)];
                        self.sent[r as usize] += 1;
                        self.received[i as usize] += 1;
                        let how = CmFailure::Rejected;
                        self.queue
                            .push_back((i, Event::Failed { cm: icm, how, data }));
                    }
                    Action::CreateTgt { tgt } => {
                        self.tgts[r as usize / self.per_node] += 1;
                        let qpn = self.fresh() as u32;
                        self.queue.push_back((r, Event::TgtCreated { tgt, qpn }));
                    }
                    Action::OpenTgt { tgt, .. } => {
                        self.queue
                            .push_back((r, Event::TgtOpened { tgt, ok: true }));
                    }
                    _ => {}
                }
            }
            while self.mgrs[r as usize].poll_notice().is_some() {}
        }

        pub fn counters(&self, r: Rank) -> &Counters {
            self.mgrs[r as usize].counters()
        }
    }

    /// The harness's and the managers' counts of the observed process
    /// (rank 0) and its node, side by side.
    pub fn compare(a: &xrcbtl_benches::scale::Row, n: &Net) {
        let what = format!(
            "{} {} at {} x {}",
            a.spec.pattern.name(),
            if a.spec.xrc { "XRC" } else { "RC" },
            a.spec.nodes,
            a.spec.per_node
        );
        let m = &n.mgrs[0];
        let k = n.counters(0);
        let h = &a.counters;
        assert_eq!(a.endpoints, k.ready, "{what}: endpoints ready");
        assert_eq!(a.qps_end, m.live_qps(), "{what}: sending QPs");
        assert_eq!(a.tgt_handles, m.tgt_handles(), "{what}: TGT handles");
        assert_eq!(a.tgt_qps as u64, n.tgts[0], "{what}: TGT QPs on the node");
        assert_eq!(
            (
                h.qps_created,
                h.tgt_created,
                h.tgt_opened,
                h.resolves,
                h.route_hits,
                h.retries
            ),
            (
                k.qps_created,
                k.tgt_created,
                k.tgt_opened,
                k.resolves,
                k.route_hits,
                k.retries
            ),
            "{what}: (QPs, TGT QPs created, opened, resolutions, route cache hits, retries)"
        );
        assert_eq!(a.cm_sent, n.sent[0], "{what}: CM messages sent");
        if a.spec.xrc {
            assert_eq!(a.cm_received, n.received[0], "{what}: CM messages received");
        } else {
            // RC peers connect to each other at once and the lower rank's
            // request wins. On the fabric the loser's own request is still
            // in flight when the winner's connection comes up, and the
            // loser withdraws it (a REJ the winner receives); between bare
            // managers every answer comes before. At most one per peer.
            let extra = a.cm_received - n.received[0];
            assert!(
                extra <= a.endpoints,
                "{what}: {extra} more CM messages received"
            );
        }
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "heavy: run with --release")]
fn the_harness_counts_what_a_cluster_of_bare_managers_counts() {
    for pattern in [Pattern::AllToAll, Pattern::Sparse] {
        for xrc in [true, false] {
            let mut s = Spec::new(8, xrc, pattern);
            s.per_node = 16;
            if pattern == Pattern::Sparse {
                s.active = 16;
            }
            let row = run(&s).unwrap();
            let net = managers::Net::run(&s);
            managers::compare(&row, &net);
        }
    }
}
