//! Peers added lazily, as an MPI library adds them (Open MPI's ob1 adds a
//! remote rank when it first sends to it): the first message between two
//! ranks may come from a rank the receiver has not added. The receiver's
//! resolver makes it known when it asks for a connection; without one the
//! connection is refused and the sender is told the rank is unreachable.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{BtlError, Peer};
use xrcbtl_fabric::sim::{SimConfig, SimDevice};
use xrcbtl_xrc_conn::wire::Reason;
use xrcbtl_xrc_conn::FailReason;

const LIMIT: Duration = Duration::from_secs(30);
const PING: u8 = 1;
const PONG: u8 = 2;

fn job(device: SimDevice) -> SimJob {
    // Two nodes of two ranks: 0 and 1 on node 0, 2 and 3 on node 1.
    SimJob::unintroduced(SimConfig::new(7, 2).with_devices(vec![device]), 2, |_| {}).unwrap()
}

/// Ranks 0 and 2 send to every other rank, knowing only the peers they
/// send to; ranks 1 and 3 know nobody, resolve the senders when they ask
/// for a connection and answer each message from inside its callback.
///
/// With `by_source`, the resolvers know only each rank's listener port and
/// take its IP address from where the request came from (as a library
/// whose address exchange cannot name every rank does); the address must
/// be the sender's.
fn senders_are_resolved_by_receivers_that_never_added_them(device: SimDevice, by_source: bool) {
    let mut job = job(device);
    let peers: Arc<Vec<Peer>> = Arc::new((0..4).map(|r| job.peer(r)).collect());
    let pongs = Arc::new(AtomicU64::new(0));
    for r in 0..4 {
        let b = job.btl(r).clone();
        let p = peers.clone();
        if by_source {
            b.set_peer_resolver_by_source(move |rank, from| {
                let known = p.get(rank as usize).copied()?;
                let from = from.expect("an IP request says where it came from");
                assert_eq!(from.ip(), known.addr.ip(), "rank {rank}'s host");
                Some(Peer {
                    addr: SocketAddr::new(from.ip(), known.addr.port()),
                    ..known
                })
            });
        } else {
            b.set_peer_resolver(move |rank| p.get(rank as usize).copied());
        }
        b.register_am(PING, |btl, m| {
            btl.send(m.src, PONG, &[], m.data)
                .expect("a reply to a resolved peer");
        });
        let n = pongs.clone();
        b.register_am(PONG, move |btl, m| {
            assert_eq!(m.data, [btl.rank() as u8, m.src as u8]);
            n.fetch_add(1, Ordering::Relaxed);
        });
    }
    // The senders add their destinations only, then send.
    for r in [0, 2u32] {
        let b = job.btl(r).clone();
        for d in (0..4).filter(|&d| d != r) {
            b.add_procs(&[peers[d as usize]]).unwrap();
            b.send(d, PING, &[], &[r as u8, d as u8]).unwrap();
        }
    }
    job.run_until(LIMIT, |_| pongs.load(Ordering::Relaxed) == 6)
        .unwrap();
    // 0 and 2 knew each other (each added the other to send to it); 1 and
    // 3 resolved both.
    let resolved: Vec<u64> = (0..4).map(|r| job.peek(r).stats().peers_resolved).collect();
    assert_eq!(resolved, [0, 2, 0, 2]);
    job.shutdown(LIMIT).unwrap();
}

#[test]
fn lazy_peers_over_xrc() {
    senders_are_resolved_by_receivers_that_never_added_them(SimDevice::ib("sim0"), false);
}

#[test]
fn lazy_peers_over_rc_on_roce() {
    senders_are_resolved_by_receivers_that_never_added_them(SimDevice::roce("sim0"), false);
}

#[test]
fn lazy_peers_over_iwarp() {
    senders_are_resolved_by_receivers_that_never_added_them(SimDevice::iwarp("sim0"), false);
}

#[test]
fn lazy_peers_found_by_where_they_asked_from_on_roce() {
    senders_are_resolved_by_receivers_that_never_added_them(SimDevice::roce("sim0"), true);
}

#[test]
fn lazy_peers_found_by_where_they_asked_from_on_iwarp() {
    senders_are_resolved_by_receivers_that_never_added_them(SimDevice::iwarp("sim0"), true);
}

/// A receiver with no resolver (or one that does not know the rank)
/// refuses; the sender's operation fails with the reason.
#[test]
fn an_unknown_sender_is_refused_without_a_resolver() {
    for with_resolver in [false, true] {
        let mut job = job(SimDevice::ib("sim0"));
        let to_two = job.peer(2);
        let zero = job.btl(0).clone();
        if with_resolver {
            job.btl(2).set_peer_resolver(|_| None);
        }
        let errors = Arc::new(Mutex::new(Vec::new()));
        let e = errors.clone();
        zero.register_error(move |_, r, err| e.lock().unwrap().push((r, err.clone())));
        zero.add_procs(&[to_two]).unwrap();
        zero.send(2, PING, &[], b"who?").unwrap();
        job.run_until(LIMIT, |_| !errors.lock().unwrap().is_empty())
            .unwrap();
        let got = errors.lock().unwrap().clone();
        assert!(
            matches!(
                got[0],
                (
                    2,
                    BtlError::Unreachable(2, FailReason::Refused(Reason::WrongRank))
                )
            ),
            "{got:?}"
        );
        assert_eq!(job.peek(2).stats().peers_resolved, 0);
        assert_eq!(job.peek(2).stats().eager_received, 0);
    }
}
