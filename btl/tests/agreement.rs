//! What the ranks of a job must agree on, checked when a peer is added:
//! XRC or RC (the two listen in different port spaces and cannot connect),
//! and, on one node, one XRC domain (a sender reaches a node's ranks
//! through one INI QP, and a message for an SRQ of another domain fails on
//! the TGT QP and breaks that INI QP for every rank of the node).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{Peer, Receive};
use xrcbtl_fabric::sim::{SimConfig, SimDevice};
use xrcbtl_fabric::{Error, XrcdKey};

const LIMIT: Duration = Duration::from_secs(30);
const TAG: u8 = 3;

/// Rank 0 on node 0; ranks 2 and 3 on node 1, rank 3 with a key file of
/// its own (a rank whose environment pointed it elsewhere).
fn split_domain_job() -> SimJob {
    SimJob::unintroduced(
        SimConfig::new(11, 2).with_devices(vec![SimDevice::ib("sim0")]),
        2,
        |c| {
            if c.rank == 3 {
                c.xrcd_key = XrcdKey::new("elsewhere/xrcd-job");
            }
        },
    )
    .unwrap()
}

fn refusal(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        e => panic!("expected a clear refusal, got {e:?}"),
    }
}

#[test]
fn ranks_of_a_node_with_two_domains_are_refused() {
    let mut job = split_domain_job();
    let p: Vec<Peer> = (0..4).map(|r| job.peer(r)).collect();
    let (Some(Receive::Xrc(a)), Some(Receive::Xrc(b))) = (p[2].receive, p[3].receive) else {
        panic!("XRC ranks state their domain: {p:?}");
    };
    assert_ne!(a, b);
    // A rank of the node refuses the other.
    let m = refusal(job.btl(2).add_procs(&[p[3]]).unwrap_err());
    assert!(
        m.contains("rank 3") && m.contains("another XRC domain"),
        "{m}"
    );
    // A sender elsewhere refuses the second rank of the node, in one call
    // or in two, and adds nobody of a refused call.
    let zero = job.btl(0).clone();
    let m = refusal(zero.add_procs(&[p[2], p[3]]).unwrap_err());
    assert!(m.contains("rank 3") && m.contains("rank 2"), "{m}");
    assert!(
        zero.send(2, TAG, &[], b"x").is_err(),
        "rank 2 was not added"
    );
    zero.add_procs(&[p[2]]).unwrap();
    assert!(zero.add_procs(&[p[3]]).is_err());
    // The same rank again is no disagreement.
    zero.add_procs(&[p[2]]).unwrap();
}

/// Why: unchecked, the node's TGT QP belongs to one rank's domain, so the
/// other rank cannot open it (NotReady) and the sender rebuilds the shared
/// INI QP anchored at that rank, which the first rank then cannot open: a
/// rebuild, and the loss of the other rank's path, every time the sender
/// turns from one rank to the other.
#[test]
fn unchecked_two_domains_rebuild_the_shared_ini_qp_each_round() {
    let mut job = split_domain_job();
    let got = Arc::new(AtomicU64::new(0));
    let p0 = job.peer(0);
    for r in [2, 3] {
        job.btl(r).add_procs(&[p0]).unwrap();
        let g = got.clone();
        job.btl(r).register_am(TAG, move |_, _| {
            g.fetch_add(1, Ordering::Relaxed);
        });
    }
    let zero = job.btl(0).clone();
    let unstated: Vec<Peer> = [2, 3]
        .iter()
        .map(|&r| Peer {
            receive: None,
            ..job.peer(r)
        })
        .collect();
    zero.add_procs(&unstated).unwrap();
    const ROUNDS: u64 = 8;
    for round in 0..ROUNDS {
        for r in [2, 3] {
            zero.send(r, TAG, &[], &[round as u8]).unwrap();
        }
        job.run_until(LIMIT, |_| got.load(Ordering::Relaxed) == 2 * (round + 1))
            .unwrap();
    }
    let k = zero.with_manager(|m| m.counters().clone());
    assert!(k.rebuilds >= ROUNDS - 1, "{k:?}");
    assert!(
        k.refused_received.values().sum::<u64>() >= ROUNDS - 1,
        "{k:?}"
    );
}

#[test]
fn xrc_and_rc_ranks_refuse_each_other() {
    // Rank 1 forced to RC on an XRC device: it could connect to nobody.
    let mut job = SimJob::unintroduced(
        SimConfig::new(12, 2).with_devices(vec![SimDevice::ib("sim0")]),
        1,
        |c| c.force_rc = c.rank == 1,
    )
    .unwrap();
    let p: Vec<Peer> = (0..2).map(|r| job.peer(r)).collect();
    assert_eq!(p[1].receive, Some(Receive::Rc));
    let m = refusal(job.btl(0).add_procs(&[p[1]]).unwrap_err());
    assert!(
        m.contains("rank 1 receives by RC") && m.contains("XRCBTL_FORCE_RC"),
        "{m}"
    );
    let m = refusal(job.btl(1).add_procs(&[p[0]]).unwrap_err());
    assert!(m.contains("rank 0 receives by XRC"), "{m}");
    // A whole job in one mode is fine.
    assert!(SimJob::with(
        SimConfig::new(13, 2).with_devices(vec![SimDevice::ib("sim0")]),
        2,
        |c| c.force_rc = true
    )
    .is_ok());
}

#[test]
fn the_simulated_job_refuses_a_split_domain() {
    let made = SimJob::with(
        SimConfig::new(14, 2).with_devices(vec![SimDevice::ib("sim0")]),
        2,
        |c| {
            if c.rank == 1 {
                c.xrcd_key = XrcdKey::new("other");
            }
        },
    );
    let Err(e) = made else {
        panic!("a job with a split domain was made")
    };
    assert!(refusal(e).contains("another XRC domain"));
}

#[test]
fn receive_reads_back_as_written() {
    for r in [
        Receive::Rc,
        Receive::Xrc(xrcbtl_btl::XrcdId {
            dev: 7,
            ino: 1 << 40,
        }),
    ] {
        assert_eq!(r.to_string().parse::<Receive>().unwrap(), r);
    }
    for bad in ["", "xrc", "xrc/1", "xrc/1/2/3", "xrc/a/2", "RC"] {
        assert!(bad.parse::<Receive>().is_err(), "{bad:?}");
    }
}
