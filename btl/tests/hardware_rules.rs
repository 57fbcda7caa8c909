//! What a real HCA and the kernel's CM hold the BTL to, on the simulated
//! fabric that enforces the same rules: one send CQ shared by every QP that
//! must never overrun, XRC INI QPs that cannot grow once connected, the
//! timers the BTL gives the QPs the CM connects, and iWARP listeners whose
//! port a TCP socket holds.

mod btlsim;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use btlsim::Cluster;
use xrcbtl_btl::sim::SimJob;
use xrcbtl_fabric::sim::{SimConfig, SimDevice};

const S: Duration = Duration::from_secs(1);

/// A device whose CQs hold 64 completions: three INI QPs of 256 send-queue
/// entries each could overrun the send CQ they share if nothing held work
/// back.
fn small_cq() -> SimDevice {
    let mut d = SimDevice::ib("sim0");
    d.caps.max_cqe = 64;
    d
}

#[test]
fn signalled_work_never_overruns_the_shared_send_cq() {
    let mut c = Cluster::new(11, 3, 2, small_cq());
    c.connect_all(5 * S);
    // Rank 0 posts 200 messages to each of the 5 others at once, then
    // stops polling (it computes) while their completions land.
    let btl = c.btl(0);
    for dst in 1..6 {
        for i in 0..200u32 {
            btl.send(dst, btlsim::TAG, &i.to_le_bytes(), &[]).unwrap();
        }
    }
    c.pause(0, true);
    c.advance(Duration::from_millis(5));
    c.pause(0, false);
    c.run_until(30 * S, |c| (1..6).all(|r| c.got_count(r) == 200));
    let st = c.sim.stats();
    assert_eq!(st.cq_overruns, 0, "{st:?}");
    assert!(
        c.btl(0).stats().cq_full > 0,
        "the burst never reached the CQ's budget"
    );
    c.sim.check_invariants().unwrap();
}

/// The IB CM may lose the RTU; the accepting side's QP then hears the
/// peer's first message before its CM does (COMM_EST), and the BTL hands
/// that to the CM (`rdma_notify`) instead of waiting for the reply's
/// retransmissions, which a lost RTU in each round would run out.
#[test]
fn a_lost_rtu_is_made_good_by_the_first_message() {
    use xrcbtl_fabric::sim::{CmAction, CmFault, CmMsgKind};
    let mut c = Cluster::new(12, 2, 2, SimDevice::ib("sim0"));
    c.sim
        .add_cm_fault(CmFault::new(Some(CmMsgKind::Rtu), CmAction::Drop));
    c.exchange(3, 30 * S);
    // Long enough for the replies' retransmissions to run out.
    c.advance(20 * S);
    c.exchange(3, 30 * S);
    let lost: u64 = c
        .live()
        .into_iter()
        .map(|r| c.btl(r).with_manager(|m| m.counters().lost))
        .sum();
    assert_eq!(lost, 0, "connections were torn down");
    let st = c.sim.stats();
    assert!(st.cm_established_by_notice > 0, "{st:?}");
    let notices: u64 = c
        .live()
        .into_iter()
        .map(|r| c.btl(r).driver_stats().comm_est_notices)
        .sum();
    assert_eq!(notices, st.cm_established_by_notice);
    c.sim.check_invariants().unwrap();
}

/// A peer that sends and leaves at once: its messages were acknowledged
/// by the receiver's HCA but may still sit in the receive CQ when the
/// departure is handled. Destroying the QP that carried them would take
/// their completions out of the CQ (every provider cleans a destroyed QP's
/// completions), so they must all be delivered first.
fn messages_of_a_departing_peer_all_arrive(force_rc: bool) {
    let mut c = btlsim::Cluster::with(13, 2, 1, SimDevice::ib("sim0"), |cfg| {
        cfg.force_rc = force_rc;
        cfg.cq_batch = 4;
    });
    c.connect_all(5 * S);
    c.pause(0, true);
    let before = c.sim.stats().messages_delivered;
    let one = c.btl(1);
    for i in 0..200u32 {
        one.send(0, btlsim::TAG, &i.to_le_bytes(), &[]).unwrap();
    }
    // Every message reached rank 0's HCA (and was acknowledged) while
    // rank 0 was not polling.
    c.run_until(5 * S, |c| c.sim.stats().messages_delivered >= before + 200);
    c.pause(0, false);
    c.exit(1, 10 * S);
    c.run_until(5 * S, |c| c.got_count(0) == 200);
    let zero = c.btl(0);
    if force_rc {
        // Rank 1 told rank 0 it was leaving (an RC peer says so to every
        // rank it is connected with): rank 0 refuses to send to it, and
        // destroys the QP.
        assert!(zero.send(1, btlsim::TAG, &[], b"anyone?").is_err());
        c.run_until(10 * S, |c| {
            c.btl(0).with_manager(|m| m.counters().qps_destroyed) > 0
        });
    }
    c.settle(10 * S);
    c.shutdown(10 * S);
    let st = c.sim.stats();
    assert_eq!(st.srq_qps_destroyed_early, 0, "{st:?}");
    if force_rc {
        // Rank 0 destroyed the QPs that had drawn from its SRQ only after
        // their last receive was reported and the CQ polled dry.
        let d = zero.driver_stats();
        assert!(d.drained_qps >= 1 && d.drain_timeouts == 0, "{d:?}");
    }
}

#[test]
fn messages_of_a_departing_rc_peer_all_arrive() {
    messages_of_a_departing_peer_all_arrive(true);
}

#[test]
fn messages_of_a_departing_xrc_peer_all_arrive() {
    messages_of_a_departing_peer_all_arrive(false);
}

/// osu_bw's window: 64 messages posted back to back to one peer, of every
/// size class the benchmark crosses (inline, eager through a bounce
/// buffer, eager from the caller's buffer, rendezvous), with the device's
/// default queues and the BTL's default settings. None of them waits for
/// a send-queue slot, a bounce buffer or room in the send CQ (iWARP's
/// credits, 16 per peer, hold the rest back there by design). With send
/// queues of 64 entries, as QPs were made before, the window of 1 KiB
/// messages found the queue full 98 times.
#[test]
fn a_window_of_64_never_waits_for_the_send_queue_or_the_cq() {
    for device in [
        SimDevice::ib("sim0"),
        SimDevice::roce("sim0"),
        SimDevice::iwarp("sim0"),
    ] {
        let rnr = device.caps.transport != xrcbtl_fabric::Transport::Iwarp;
        let mut c = Cluster::new(13, 2, 1, device.clone());
        c.connect_all(5 * S);
        let mut want = 0;
        for size in [8, 1024, 8192, 65536, 1 << 20] {
            let data = xrcbtl_btl::Bytes::from(btlsim::pattern(7, size));
            let btl = c.btl(0);
            for _ in 0..64 {
                btl.send_bytes(1, btlsim::TAG, data.clone(), None).unwrap();
            }
            want += 64;
            c.run_until(60 * S, |c| c.got_count(1) == want);
            assert!(c
                .got(1)
                .iter()
                .all(|g| g.data == btlsim::pattern(7, g.data.len())));
        }
        let s = c.btl(0).stats();
        let what = format!("{:?}: {s:?}", device.caps.transport);
        assert_eq!((s.no_resource, s.cq_full, s.spilled), (0, 0, 0), "{what}");
        // iWARP's credits, 16 per peer, hold the rest of a window back.
        assert_eq!(s.credit_stalls > 0, !rnr, "{what}");
        assert!(s.rndv_sent >= 64, "{what}");
        c.sim.check_invariants().unwrap();
    }
}

/// A job of two ranks on iWARP whose node 0 has `held` ports taken by TCP
/// sockets outside the RDMA CM (the simulated CM hands out ephemeral
/// ports from 20001 in order, and rank 0 listens first).
fn iwarp_job_with_ports_held(held: std::ops::RangeInclusive<u16>) -> xrcbtl_fabric::Result<SimJob> {
    let mut cfg = SimConfig::new(11, 2).with_devices(vec![SimDevice::iwarp("iw0")]);
    for p in held {
        cfg = cfg.with_tcp_port_held(0, p);
    }
    SimJob::with(cfg, 1, |_| {})
}

/// siw's `rdma_listen` fails with `EADDRINUSE` when the port the RDMA CM
/// picked is held by a TCP socket it does not see (MPICH's comm/dupic
/// once failed so on siw: "no module (xrcbtl_create): address in use:
/// rdma_listen"). A rank listening on an ephemeral port takes the next
/// one, and its traffic flows.
#[test]
fn an_iwarp_listener_takes_another_port_when_tcp_holds_its_own() {
    let mut job =
        iwarp_job_with_ports_held(20001..=20003).expect("the rank listens on the next port");
    job.sim.set_auto_advance(true);
    assert_eq!(job.btl(0).listen_addr().map(|a| a.port()), Some(20004));
    let got = Arc::new(AtomicUsize::new(0));
    for r in 0..2 {
        let got = got.clone();
        job.btl(r).register_am(9, move |_, _| {
            got.fetch_add(1, Ordering::Relaxed);
        });
    }
    job.btl(1)
        .send(0, 9, &[], b"to the moved listener")
        .unwrap();
    job.btl(0).send(1, 9, &[], b"and back").unwrap();
    job.settle(10 * S).unwrap();
    assert_eq!(got.load(Ordering::Relaxed), 2);
}

/// The tries are bounded: with every port it would try held, the rank
/// fails to start and says why.
#[test]
fn an_iwarp_listener_gives_up_after_its_tries() {
    let Err(err) = iwarp_job_with_ports_held(20001..=20008) else {
        panic!("every port it would try is held, yet the rank started");
    };
    assert!(err.to_string().contains("address in use"), "{err}");
}
