//! The all-to-all connection storm at 32 nodes x 16 ranks (512 processes,
//! 261,632 endpoints) of BTLs on the simulated InfiniBand fabric with XRC.
//! Heavy: it runs in release builds (scripts/test-all runs it) and is
//! ignored in debug builds.

mod btlsim;

use std::time::{Duration, Instant};

use btlsim::Cluster;
use xrcbtl_fabric::sim::SimDevice;

const NODES: usize = 32;
const PER_NODE: usize = 16;

#[test]
#[cfg_attr(debug_assertions, ignore = "heavy: run with --release")]
fn storm_32x16() {
    let wall = Instant::now();
    // Small receive and bounce pools: 512 BTLs share this machine.
    let mut c = Cluster::with(2026, NODES, PER_NODE, SimDevice::ib("sim0"), |cfg| {
        cfg.eager_limit = xrcbtl_btl::EagerLimit::Bytes(1024);
        cfg.srq_depth = 16;
        cfg.srq_max_depth = 64;
        cfg.send_slots = 16;
    });
    let procs = NODES * PER_NODE;
    let start = c.now();
    c.connect_all(Duration::from_secs(60));
    let setup = c.now() - start;
    let setup_wall = wall.elapsed();

    // One INI QP per (process, node) -- never more, at the end of any step.
    for r in c.live() {
        assert_eq!(
            c.job.peek(r).with_manager(|m| m.live_qps()),
            NODES,
            "rank {r}"
        );
    }
    assert_eq!(
        c.job.max_qps, NODES,
        "a process once held more than one INI QP per node"
    );
    // One TGT QP per (sending process, node), each held by the ranks of the
    // node the sender talks to.
    for n in 0..NODES {
        let v = c.sim.node_view(n);
        assert_eq!(v.tgt_qps.len(), procs, "node {n}");
        let full = v
            .tgt_qps
            .iter()
            .filter(|t| t.open_count == PER_NODE)
            .count();
        let local = v
            .tgt_qps
            .iter()
            .filter(|t| t.open_count == PER_NODE - 1)
            .count();
        assert_eq!((full, local), (procs - PER_NODE, PER_NODE), "node {n}");
    }
    // Addresses resolved once per remote node: every other resolution of a
    // rank process came from its node cache.
    let mut resolves = 0;
    let mut hits = 0;
    let mut resizes = 0;
    for r in c.live() {
        let k = c.job.peek(r).with_manager(|m| m.counters().clone());
        assert_eq!(k.resolves - k.route_hits, NODES as u64, "rank {r}: {k:?}");
        assert_eq!((k.retries, k.reanchors), (0, 0), "rank {r}: {k:?}");
        resolves += k.resolves;
        hits += k.route_hits;
        resizes += k.sq_resizes;
    }
    // Per node pair: no ARP query (the ranks address each other by GID,
    // AF_IB), and one path query per process (its route cache), not one
    // per connection.
    for from in 0..NODES {
        for to in 0..NODES {
            let q = c.sim.queries_between(from, to);
            assert_eq!((q.arp, q.path), (0, PER_NODE as u64), "{from} -> {to}");
        }
    }
    let st = c.sim.stats();
    // The IB CM's stale-connection check never fired: every QP-less request
    // in flight between two nodes announced a QP number of its own.
    assert_eq!(st.cm_stale_rejects, 0, "{st:?}");
    // Every QP reached the CM in RESET, so it got the route's port and
    // P_Key.
    assert_eq!(st.cm_qps_init_by_hand, 0, "{st:?}");
    // Every INI QP was made deep enough for its node's ranks: none had to
    // grow (the device cannot grow a connected QP).
    assert_eq!(resizes, 0);
    c.exchange(1, Duration::from_secs(60));
    c.sim.check_invariants().unwrap();
    eprintln!(
        "storm {NODES}x{PER_NODE}: {} endpoints ready in {:.3} ms of virtual time ({:.1} s wall); \
         INI QPs per process {NODES}; TGT QPs per node {procs} ({} held by {PER_NODE} ranks, {PER_NODE} by {}); \
         {} CM messages ({} stale rejects), {} TGT QPs created, {} opened; resolutions {resolves} ({hits} from the node cache), \
         ARP queries {}, path queries {}, cached routes {}; send-queue growths {resizes}; \
         then one message each way, {:.1} s wall in all",
        procs * (procs - 1),
        setup.as_secs_f64() * 1e3,
        setup_wall.as_secs_f64(),
        procs - PER_NODE,
        PER_NODE - 1,
        st.cm_messages,
        st.cm_stale_rejects,
        st.tgt_created,
        st.tgt_opened,
        st.addr_resolutions,
        st.route_resolutions,
        st.cached_routes,
        wall.elapsed().as_secs_f64(),
    );
}
