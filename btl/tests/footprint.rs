//! What a rank keeps per peer it knows: the bytes of heap that adding
//! peers leaves behind (endpoint, address book, connection manager),
//! counted by a global allocator, on XRC, RC + SRQ and iWARP. A process
//! must hold 1.28 million known peers (10,000 nodes of 128 ranks) within
//! [`BUDGET`] bytes each: 625 MiB.
//!
//! Receive buffers are not per-peer state: on iWARP a rank posts more of
//! them as peers are added (credits), up to `XRCBTL_SRQ_MAX_DEPTH` per
//! class, and this test holds that at the starting depth so that only the
//! state is counted. Connections, and what a connected peer costs, are not
//! measured here.

use std::net::SocketAddr;
use std::time::Duration;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::Peer;
use xrcbtl_fabric::sim::{CountingAlloc, SimConfig, SimDevice};
use xrcbtl_xrc_conn::Rank;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Bytes a known, unconnected peer may cost a rank (BTL and connection
/// manager together).
const BUDGET: f64 = 512.0;

/// Ranks per node, as on the large machines of issue 14.
const PER_NODE: Rank = 128;

fn peer(rank: Rank) -> Peer {
    let node = 1 + rank / PER_NODE;
    Peer {
        rank,
        node,
        addr: SocketAddr::from((
            [10, (node >> 8) as u8, node as u8, 1],
            7000 + (rank % PER_NODE) as u16,
        )),
        ib: None,
        receive: None,
    }
}

/// Bytes per peer that adding `n` peers (ranks 1..=n, 128 to a node)
/// leaves in rank 0's heap.
fn bytes_per_peer(device: SimDevice, n: Rank) -> f64 {
    let cfg = SimConfig::new(1, 1).with_devices(vec![device]);
    let mut job = SimJob::with(cfg, 1, |c| c.srq_max_depth = c.srq_depth).unwrap();
    let btl = job.btl(0).clone();
    let peers: Vec<Peer> = (1..=n).map(peer).collect();
    let (r, bytes) = CountingAlloc::bytes(|| btl.add_procs(&peers));
    r.unwrap();
    drop(peers);
    bytes as f64 / f64::from(n)
}

#[test]
fn a_known_peer_costs_a_rank_less_than_the_budget() {
    for device in [
        SimDevice::ib("sim0"),
        SimDevice::roce("sim0"),
        SimDevice::iwarp("sim0"),
    ] {
        let what = format!("{:?}", device.caps.transport);
        let small = bytes_per_peer(device.clone(), 1 << 12);
        let large = bytes_per_peer(device, 1 << 17);
        println!(
            "{what}: {small:.0} bytes per known peer at 4,096 peers, {large:.0} at 131,072; \
             1.28 million: {:.0} MiB",
            large * 1.28e6 / f64::from(1 << 20)
        );
        assert!(large > 0.0, "{what}: adding peers kept nothing?");
        assert!(
            large <= BUDGET,
            "{what}: {large:.0} bytes per peer, budget {BUDGET}"
        );
    }
}

/// Bytes the send logs of `peers` RC QPs keep after 15 small messages
/// went on each and everything completed: with `trimmed`, after the
/// logs were idle for two probe intervals.
fn log_bytes_after_a_burst(peers: usize, trimmed: bool) -> i64 {
    let mut job = SimJob::new(3, 1 + peers, 1, SimDevice::roce("sim0")).unwrap();
    const LIMIT: Duration = Duration::from_secs(30);
    // Connections first, and their own memory settled.
    for dst in 1..=peers as Rank {
        job.btl(0).send(dst, 9, b"up", &[]).unwrap();
    }
    job.settle(LIMIT).unwrap();
    job.advance(Duration::from_secs(5));
    let ((), bytes) = CountingAlloc::bytes(|| {
        for _ in 0..15 {
            for dst in 1..=peers as Rank {
                job.btl(0).send(dst, 9, &[7; 16], &[]).unwrap();
            }
        }
        job.settle(LIMIT).unwrap();
        if trimmed {
            // Two probe intervals, with the sender progressing after each
            // second of them (the first look finds the logs just used).
            for _ in 0..5 {
                job.advance(Duration::from_secs(1));
                job.btl(0).progress();
            }
        }
    });
    job.shutdown(LIMIT).unwrap();
    bytes
}

/// One QP per peer (RC) multiplies per-QP state: a send log holds its
/// messages until they complete, then, idle, gives its memory back.
#[test]
fn an_idle_send_log_gives_its_memory_back() {
    const PEERS: usize = 16;
    let busy = log_bytes_after_a_burst(PEERS, false);
    let idle = log_bytes_after_a_burst(PEERS, true);
    println!("send logs of {PEERS} RC QPs: {busy} bytes kept after a burst, {idle} once idle");
    // 15 messages each: a log sized for them is at least 15 entries.
    assert!(busy >= (PEERS * 15 * 64) as i64, "{busy} bytes kept");
    assert!(idle <= 0, "{idle} bytes kept once the logs were idle");
}

#[test]
fn the_allocator_counts_the_bytes_kept_and_freed() {
    let (v, kept) = CountingAlloc::bytes(|| Vec::<u8>::with_capacity(1000));
    assert_eq!(kept, 1000);
    let ((), freed) = CountingAlloc::bytes(|| drop(v));
    assert_eq!(freed, -1000);
    let (v, grown) = CountingAlloc::bytes(|| {
        let mut v = vec![0u8; 10];
        v.reserve_exact(90);
        v
    });
    assert_eq!((grown, v.capacity()), (100, 100));
}
