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
