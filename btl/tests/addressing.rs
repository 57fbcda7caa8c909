//! What address and route resolution cost a job, per node pair: on
//! InfiniBand the ranks address each other by GID (AF_IB), so no ARP query
//! goes out at all; by IP (RoCE, or with `XRCBTL_AF_IB=0`), one per node
//! pair (the kernel's neighbour table is the node's). Either way each
//! process asks one path query per remote node and reuses the path for
//! every further connection to it.

mod btlsim;

use std::time::Duration;

use btlsim::Cluster;
use xrcbtl_fabric::sim::SimDevice;
use xrcbtl_fabric::IbAddr;

const NODES: usize = 3;
const PER_NODE: usize = 3;
const LIMIT: Duration = Duration::from_secs(30);

/// Connects every rank to every other and returns the (ARP, path) queries
/// of each ordered node pair.
fn queries(device: SimDevice, af_ib: bool) -> (Cluster, Vec<(u64, u64)>) {
    let mut c = Cluster::with(21, NODES, PER_NODE, device, |cfg| cfg.af_ib = af_ib);
    c.connect_all(LIMIT);
    c.exchange(1, LIMIT);
    let mut q = Vec::new();
    for from in 0..NODES {
        for to in 0..NODES {
            let p = c.sim.queries_between(from, to);
            q.push((p.arp, p.path));
        }
    }
    (c, q)
}

#[test]
fn infiniband_ranks_address_each_other_by_gid() {
    let (mut c, q) = queries(SimDevice::ib("sim0"), true);
    assert_eq!(q, vec![(0, PER_NODE as u64); NODES * NODES]);
    // Every rank published a native listener on its port's GID.
    for r in c.live() {
        let a: IbAddr = c.btl(r).listen_ib_addr().expect("an AF_IB listener");
        assert_eq!(a.pkey, xrcbtl_fabric::DEFAULT_PKEY);
        assert_ne!(a.port, 0);
    }
    c.shutdown(LIMIT);
}

#[test]
fn by_ip_each_node_pair_costs_one_arp_query() {
    for (device, af_ib) in [
        (SimDevice::roce("sim0"), true),
        (SimDevice::ib("sim0"), false),
    ] {
        eprintln!("{} af_ib {af_ib}", device.name);
        let (mut c, q) = queries(device, af_ib);
        assert_eq!(q, vec![(1, PER_NODE as u64); NODES * NODES]);
        // RoCE has no AF_IB; on InfiniBand it was turned off.
        assert!(c
            .live()
            .iter()
            .all(|&r| c.job.peek(r).listen_ib_addr().is_none()));
        c.shutdown(LIMIT);
    }
}

/// A rank without AF_IB still reaches one that has it (by IP), and is
/// reached by it by IP: the ranks need not agree on it.
#[test]
fn ranks_with_and_without_af_ib_reach_each_other() {
    let mut c = Cluster::with(22, 2, 2, SimDevice::ib("sim0"), |cfg| {
        cfg.af_ib = cfg.rank % 2 == 0
    });
    c.connect_all(LIMIT);
    c.exchange(3, LIMIT);
    c.shutdown(LIMIT);
}
