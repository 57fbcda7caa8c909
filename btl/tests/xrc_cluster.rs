//! The XRC connection manager under the BTL on a simulated cluster.

mod btlsim;

use std::time::Duration;

use btlsim::{Cluster, TAG};
use xrcbtl_fabric::sim::SimDevice;

const S: Duration = Duration::from_secs(1);

#[test]
fn small_all_to_all() {
    let mut c = Cluster::new(1, 3, 2, SimDevice::ib("sim0"));
    c.connect_all(5 * S);
    // One INI QP per remote node (and one to its own node), per process.
    for r in c.live() {
        assert_eq!(c.job.peek(r).with_manager(|m| m.live_qps()), 3, "rank {r}");
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
fn size_classes_reach_the_peers_and_carry_their_messages() {
    let mut c = Cluster::new(4, 2, 2, SimDevice::ib("sim0"));
    let b = c.btl(0);
    // A send starts the connection on demand.
    b.send(3, TAG, &[], b"hello").unwrap();
    c.run_until(5 * S, |c| c.ready(0, 3));
    assert_eq!(
        b.with_manager(|m| m.path(3).unwrap().srqns.len()),
        2,
        "both classes' SRQ numbers"
    );
    let small = vec![7u8; 100];
    let large = vec![9u8; 3000];
    for payload in [&small, &large, &small] {
        b.send(3, TAG, &[], payload).unwrap();
    }
    c.run_until(5 * S, |c| c.got_count(3) == 4);
    assert_eq!(c.job.peek(3).stats().received_by_class, vec![3, 1]);
    let too_big = vec![0u8; b.max_send_size() + 1];
    assert!(b.send(3, TAG, &[], &too_big).is_err());
    c.shutdown(5 * S);
}
