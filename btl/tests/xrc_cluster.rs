//! The XRC connection manager on a simulated cluster.

mod common;

use std::time::Duration;

use common::Cluster;
use xrcbtl_fabric::sim::SimDevice;

const S: Duration = Duration::from_secs(1);

#[test]
fn small_all_to_all() {
    let mut c = Cluster::new(1, 3, 2, SimDevice::ib("sim0"));
    c.connect_all(5 * S);
    // One INI QP per remote node (and one to its own node), per process.
    for r in c.live() {
        assert_eq!(c.rank(r).drv.manager().live_qps(), 3, "rank {r}");
    }
    // One TGT QP per (sending process, node), held by every rank of the node
    // the sender talks to: all of them, or all but itself on its own node.
    assert_eq!(c.tgt_counts(), vec![6, 6, 6]);
    for n in 0..3 {
        let opens: Vec<usize> = c
            .sim
            .node_view(n)
            .tgt_qps
            .iter()
            .map(|t| t.open_count)
            .collect();
        assert_eq!(
            opens.iter().filter(|&&o| o == 2).count(),
            4,
            "node {n}: {opens:?}"
        );
        assert_eq!(
            opens.iter().filter(|&&o| o == 1).count(),
            2,
            "node {n}: {opens:?}"
        );
    }
    c.exchange(3, 5 * S);
    c.sim.check_invariants().unwrap();
}

#[test]
#[ignore = "scaling probe"]
fn probe_scale() {
    let nodes: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let per: usize = std::env::var("M")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let t0 = std::time::Instant::now();
    let mut c = Cluster::new(3, nodes, per, SimDevice::ib("sim0"));
    let v0 = c.now();
    c.connect_all(60 * S);
    eprintln!(
        "{nodes}x{per}: connected in {:?} virtual, {:?} wall; {:?}",
        c.now() - v0,
        t0.elapsed(),
        c.sim.stats()
    );
}
