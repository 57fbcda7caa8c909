//! Ranks leaving (cleanly or by crash) in every state of the connection
//! set-up, TGT QP errors, lost and duplicated CM messages, malformed private
//! data, simultaneous connects, and iWARP's initiator-first rule, on
//! simulated clusters.

mod btlsim;

use std::collections::BTreeSet;
use std::time::Duration;

use btlsim::{Cluster, JOB};
use xrcbtl_fabric::sim::{CmAction, CmFault, CmMsgKind, SimConfig, SimDevice};
use xrcbtl_fabric::*;
use xrcbtl_xrc_conn::wire::{Kind, Msg, Reason};
use xrcbtl_xrc_conn::Notice;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// Every rank connects to every other; at `at`, `victim` leaves (cleanly
/// or by crash). Then the survivors reconnect and exchange, and nothing the
/// victim held, and no dead TGT QP, may be left. Returns the endpoint states
/// the cluster was in when the victim left, and whether the victim held TGT
/// QPs then.
fn exit_during_setup(
    seed: u64,
    victim: u32,
    at: Duration,
    crash: bool,
) -> (BTreeSet<&'static str>, bool) {
    let mut c = Cluster::new(seed, 2, 3, SimDevice::ib("sim0"));
    let all = c.live();
    for &a in &all {
        for &b in &all {
            if a != b {
                c.connect(a, b);
            }
        }
    }
    c.advance(at);
    let mut states = BTreeSet::new();
    for r in c.live() {
        states.extend(
            c.job
                .peek(r)
                .with_manager(|m| m.endpoints_by_state())
                .into_keys(),
        );
    }
    let held_tgts = c.job.peek(victim).with_manager(|m| m.tgt_handles()) > 0;
    let proc = c.proc(victim);
    if crash {
        c.crash(victim);
    } else {
        c.exit(victim, S);
    }
    // Let failures surface and cleanups run.
    c.advance(300 * MS);
    c.connect_all(c.patience());
    c.exchange(2, c.patience());
    c.advance(300 * MS);
    c.check_clean(&[proc]);
    c.check_tgt_per_sender();
    (states, held_tgts)
}

/// Sweeps the victim's exit over the set-up, 3 µs apart, both ways.
fn sweep(victim: u32, seed: u64) {
    let mut seen = BTreeSet::new();
    let mut held = BTreeSet::new();
    for crash in [false, true] {
        for step in 0..90u32 {
            let at = Duration::from_micros(u64::from(step) * 3);
            let (states, h) = exit_during_setup(seed + u64::from(step), victim, at, crash);
            seen.extend(states);
            held.insert(h);
        }
    }
    // The sweep did hit every stage of the set-up.
    for s in ["waiting", "connecting", "ready"] {
        assert!(
            seen.contains(s),
            "no exit while an endpoint was {s}: {seen:?}"
        );
    }
    assert_eq!(
        held.len(),
        2,
        "exits both before and after the victim held TGT QPs"
    );
}

#[test]
fn anchor_leaves_at_every_moment_of_setup() {
    // Rank 3 is the first rank of node 1 that every node-0 process wants, so
    // it anchors their INI QPs there.
    sweep(3, 0);
}

#[test]
fn registrant_leaves_at_every_moment_of_setup() {
    sweep(5, 1000);
}

#[test]
fn sender_leaves_while_connected() {
    for crash in [false, true] {
        let mut c = Cluster::new(7, 2, 3, SimDevice::ib("sim0"));
        c.connect_all(c.patience());
        c.exchange(1, c.patience());
        let proc = c.proc(0);
        if crash {
            c.crash(0);
        } else {
            c.exit(0, S);
        }
        c.advance(300 * MS);
        // Survivors carry on; paths anchored by the sender are rebuilt on
        // their next use.
        c.exchange(2, c.patience());
        c.advance(300 * MS);
        c.check_clean(&[proc]);
        c.check_tgt_per_sender();
    }
}

#[test]
fn tgt_error_reaches_every_holder_and_senders_fail_over() {
    let mut c = Cluster::new(11, 2, 3, SimDevice::ib("sim0"));
    c.connect_all(c.patience());
    c.exchange(1, c.patience());
    // Break one TGT QP on node 1 (a sender's way into that node).
    // A remote sender's TGT QP: all three ranks of node 1 hold it.
    let victim = c
        .sim
        .node_view(1)
        .tgt_qps
        .into_iter()
        .find(|t| t.open_count == 3)
        .expect("a TGT QP of a node-0 sender");
    c.sim.force_qp_error(1, victim.qpn).unwrap();
    c.advance(300 * MS);
    // Every holder let go: the QP is gone.
    assert!(
        c.sim
            .node_view(1)
            .tgt_qps
            .iter()
            .all(|t| t.qpn != victim.qpn),
        "{:?}",
        c.sim.node_view(1)
    );
    let lost: usize = c
        .live()
        .iter()
        .map(|&r| c.job.peek(r).with_manager(|m| m.counters().lost) as usize)
        .sum();
    assert!(
        lost >= 3,
        "the sender's three endpoints into node 1 were lost ({lost})"
    );
    // On next use, the sender reconnects; traffic resumes everywhere.
    c.connect_all(c.patience());
    c.exchange(2, c.patience());
    c.advance(300 * MS);
    c.check_clean(&[]);
    c.check_tgt_per_sender();
}

#[test]
fn lost_late_and_duplicated_cm_messages() {
    let mut cfg = SimConfig::new(5, 3).with_devices(vec![SimDevice::ib("sim0")]);
    cfg.timing.cm_timeout_ns = 20_000_000;
    let mut c = Cluster::with_config(cfg, 3, |_| {});
    for (kind, action, ppm) in [
        (None, CmAction::Drop, 100_000),
        (None, CmAction::Duplicate, 100_000),
        (None, CmAction::Delay(2_000_000), 100_000),
        (Some(CmMsgKind::Rtu), CmAction::Drop, 300_000),
    ] {
        c.sim
            .add_cm_fault(CmFault::new(kind, action).with_probability_ppm(ppm));
    }
    c.connect_all(30 * S);
    c.exchange(3, 30 * S);
    let st = c.sim.stats();
    assert!(
        st.cm_dropped > 0 && st.cm_duplicated > 0 && st.cm_delayed > 0,
        "{st:?}"
    );
    assert!(st.cm_retries > 0, "{st:?}");
    c.sim.clear_cm_faults();
    c.advance(300 * MS);
    c.check_clean(&[]);
    c.check_tgt_per_sender();
}

/// Sends a raw request with `data` to rank 0's listener and returns the
/// refusal it gets back.
fn refusal(data: &[u8]) -> Option<Reason> {
    let mut c = Cluster::new(3, 1, 2, SimDevice::ib("sim0"));
    let target = c.job.peek(0).listen_addr().unwrap();
    let p = c.sim.spawn(0).unwrap();
    let ctx = p.open("sim0").unwrap();
    let ch = ctx.create_cm_channel().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = ctx
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::XrcIni,
                send_cq: &cq,
                recv_cq: None,
                srq: None,
                caps: QpCaps::default(),
            },
        )
        .unwrap();
    let id = ch.create_id(PortSpace::Ib).unwrap();
    id.resolve_addr(target, 100).unwrap();
    let mut answer = None;
    let deadline = c.now() + S;
    while answer.is_none() && c.now() < deadline {
        c.step();
        if let Some(e) = ch.poll_event() {
            match e.kind {
                CmEventKind::AddrResolved => id.resolve_route(100).unwrap(),
                CmEventKind::RouteResolved => {
                    id.connect(Some(&qp), &ConnParam::with_data(data)).unwrap()
                }
                CmEventKind::Rejected(RejectReason::Consumer) => answer = Some(e.private_data),
                k => panic!("unexpected {k:?}"),
            }
        }
    }
    let reply = answer.expect("no answer to a malformed request");
    // The rank is unharmed: it still connects.
    c.connect_all(S);
    c.exchange(1, S);
    let m = Msg::decode(&reply, JOB).expect("a refusal we can read");
    assert_eq!(m.kind, Kind::Refuse);
    m.reason
}

#[test]
fn malformed_private_data_is_refused_with_a_reason() {
    let good = Msg::new(Kind::Connect, JOB, 1, 0, 9).encode();
    assert_eq!(refusal(b"garbage, not a message"), Some(Reason::Malformed));
    let mut v = good.clone();
    v[2] = 99;
    assert_eq!(refusal(&v), Some(Reason::BadVersion));
    // (A truncated message cannot be told from a whole one on IB, which
    // pads private data; the length field catches the mismatches.)
    let mut v = good.clone();
    v[4] = 17;
    assert_eq!(refusal(&v), Some(Reason::BadLength));
    let mut v = good.clone();
    v[7] = 3; // claims three SRQ numbers it does not carry
    assert_eq!(refusal(&v), Some(Reason::BadLength));
    assert_eq!(
        refusal(&Msg::new(Kind::Connect, JOB + 1, 1, 0, 9).encode()),
        Some(Reason::WrongJob)
    );
    assert_eq!(
        refusal(&Msg::new(Kind::Accept, JOB, 1, 0, 9).encode()),
        Some(Reason::BadKind)
    );
    assert_eq!(
        refusal(&Msg::new(Kind::Connect, JOB, 1, 77, 9).encode()),
        Some(Reason::WrongRank)
    );
}

fn simultaneous(device: SimDevice, seed: u64) {
    let mut c = Cluster::with_config(
        SimConfig::new(seed, 2).with_devices(vec![device]),
        1,
        |cfg| cfg.force_rc = true,
    );
    // Both sides connect at the same instant.
    c.connect(0, 1);
    c.connect(1, 0);
    c.run_until(c.patience(), |c| c.ready(0, 1) && c.ready(1, 0));
    c.advance(300 * MS);
    for r in [0, 1] {
        assert_eq!(
            c.job.peek(r).with_manager(|m| m.live_qps()),
            1,
            "rank {r}: one RC QP per peer"
        );
    }
    let collisions: u64 = [0, 1]
        .iter()
        .map(|&r| {
            c.job.peek(r).with_manager(|m| {
                m.counters()
                    .refused_sent
                    .get(&Reason::Collision)
                    .copied()
                    .unwrap_or(0)
            })
        })
        .sum();
    assert_eq!(collisions, 1, "exactly one request lost the race");
    c.exchange(5, c.patience());
    assert_eq!(c.sim.stats().iwarp_violations, 0);
    c.check_clean(&[]);
}

#[test]
fn simultaneous_connects_make_one_connection() {
    for seed in 0..5 {
        simultaneous(SimDevice::roce("sim0"), seed);
        simultaneous(SimDevice::iwarp("sim0"), seed);
    }
}

#[test]
fn iwarp_initiator_speaks_first() {
    let mut c = Cluster::new(8, 2, 2, SimDevice::iwarp("sim0"));
    assert!(matches!(
        c.job.peek(0).mode(),
        xrcbtl_xrc_conn::Mode::Rc { p2p: true }
    ));
    c.connect_all(c.patience());
    // Traffic both ways right away: a responder that spoke before hearing
    // from the initiator would have torn its connection down.
    c.exchange(4, c.patience());
    assert_eq!(c.sim.stats().iwarp_violations, 0);
    for r in c.live() {
        let lost: Vec<_> = c
            .notices(r)
            .iter()
            .filter(|n| matches!(n, Notice::Lost { .. }))
            .cloned()
            .collect();
        assert!(lost.is_empty(), "rank {r}: {lost:?}");
    }
    c.check_clean(&[]);
}

#[test]
fn rc_mode_ranks_leave_and_the_rest_continue() {
    for device in [SimDevice::roce("sim0"), SimDevice::iwarp("sim0")] {
        for crash in [false, true] {
            let mut c = Cluster::new(21, 2, 3, device.clone());
            c.connect_all(c.patience());
            c.exchange(1, c.patience());
            let proc = c.proc(4);
            if crash {
                c.crash(4);
            } else {
                c.exit(4, S);
            }
            c.advance(300 * MS);
            c.connect_all(c.patience());
            c.exchange(2, c.patience());
            c.check_clean(&[proc]);
        }
    }
}

#[test]
fn an_anchor_gone_before_anyone_connects_does_not_cut_its_node_off() {
    for crash in [false, true] {
        let mut c = Cluster::new(0, 2, 3, SimDevice::ib("sim0"));
        if crash {
            c.crash(3);
        } else {
            c.exit(3, S);
        }
        // Rank 3 is wanted first: it anchors node 1 for every node-0 rank.
        for r in 0..3 {
            c.connect(r, 3);
            c.connect(r, 4);
            c.connect(r, 5);
        }
        c.connect_all(c.patience());
        c.exchange(2, c.patience());
        for r in c.live() {
            let failed: Vec<Notice> = c
                .notices(r)
                .into_iter()
                .filter(|n| matches!(n, Notice::Failed { .. }))
                .collect();
            assert!(
                failed
                    .iter()
                    .all(|n| matches!(n, Notice::Failed { rank: 3, .. })),
                "crash {crash}: rank {r} gave up on a live rank: {failed:?}"
            );
        }
        let reanchors: u64 = c
            .live()
            .iter()
            .map(|&r| c.job.peek(r).with_manager(|m| m.counters().reanchors))
            .sum();
        assert!(
            reanchors >= 3,
            "crash {crash}: node-0 ranks re-anchored ({reanchors})"
        );
        c.check_tgt_per_sender();
    }
}

#[test]
fn a_hung_anchor_fails_alone_and_its_node_stays_reachable() {
    let mut c = Cluster::new(2, 2, 3, SimDevice::ib("sim0"));
    // Rank 3 stops answering (a stopped process), and is wanted first.
    c.pause(3, true);
    for r in 0..3 {
        c.connect(r, 3);
        c.connect(r, 4);
        c.connect(r, 5);
    }
    c.run_until(60 * S, |c| (0..3).all(|a| c.ready(a, 4) && c.ready(a, 5)));
    for r in 0..3 {
        let n = c.notices(r);
        assert!(
            n.iter()
                .any(|n| matches!(n, Notice::Failed { rank: 3, .. })),
            "rank {r} never gave up on the hung anchor: {n:?}"
        );
        assert!(
            !n.iter()
                .any(|n| matches!(n, Notice::Failed { rank: 4 | 5, .. })),
            "rank {r} gave up on a live rank: {n:?}"
        );
    }
}
