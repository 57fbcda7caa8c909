//! The connection manager alone: events in, actions and notices out, in
//! virtual time.

use std::time::Duration;

use xrcbtl_xrc_conn::wire::{Kind, Msg, Reason};
use xrcbtl_xrc_conn::*;

const JOB: u32 = 9;
const T0: Duration = Duration::ZERO;

fn mgr(rank: Rank, node: Node) -> ConnManager {
    let cfg = Config::new(rank, node, JOB, Mode::Xrc, vec![100 + rank]);
    ConnManager::new(cfg, [(0, 0), (1, 1), (2, 1), (3, 1)])
}

fn drain(m: &mut ConnManager) -> Vec<Action> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// The notices, refusals left out (see [`all_notices`]).
fn notices(m: &mut ConnManager) -> Vec<Notice> {
    all_notices(m)
        .into_iter()
        .filter(|n| !matches!(n, Notice::Refused { .. }))
        .collect()
}

fn all_notices(m: &mut ConnManager) -> Vec<Notice> {
    std::iter::from_fn(|| m.poll_notice()).collect()
}

/// The CM id of the `Resolve` action for `rank`.
fn resolve_of(actions: &[Action], rank: Rank) -> CmRef {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Resolve { cm, rank: r, .. } if *r == rank => Some(*cm),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no resolve for {rank} in {actions:?}"))
}

/// The message of the `Connect` action.
/// The route of `cm` is resolved: the connect request that follows.
fn resolved(m: &mut ConnManager, now: Duration, cm: CmRef) -> (CmRef, Option<QpRef>, Msg) {
    m.handle(
        now,
        Event::Resolved {
            cm,
            route: RouteRef(7),
        },
    );
    connect_of(&drain(m))
}

fn connect_of(actions: &[Action]) -> (CmRef, Option<QpRef>, Msg) {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Connect { cm, qp, data } => Some((*cm, *qp, Msg::decode(data, JOB).unwrap())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no connect in {actions:?}"))
}

fn accept(from: Rank, to: Rank, tag: u32, tgt: u32) -> Vec<u8> {
    let mut m = Msg::new(Kind::Accept, JOB, from, to, tag);
    m.tgt = tgt;
    m.srqns = vec![100 + from];
    m.encode()
}

fn refuse(from: Rank, to: Rank, tag: u32, r: Reason) -> Vec<u8> {
    let mut m = Msg::new(Kind::Refuse, JOB, from, to, tag);
    m.reason = Some(r);
    m.encode()
}

/// Connects rank 0 to rank 1 (the anchor of node 1); returns the INI QP, the
/// anchor's CM id and the connection tag.
fn anchored(m: &mut ConnManager) -> (QpRef, CmRef, u32) {
    m.connect(T0, 1);
    let a = drain(m);
    assert!(
        matches!(
            a[0],
            Action::CreateQp {
                kind: QpKind::Ini,
                ..
            }
        ),
        "{a:?}"
    );
    let cm = resolve_of(&a, 1);
    let (c, qp, msg) = resolved(m, T0, cm);
    assert_eq!((c, msg.kind, msg.dst), (cm, Kind::Connect, 1));
    m.handle(
        T0,
        Event::Established {
            cm,
            data: accept(1, 0, msg.tag, 77),
        },
    );
    assert_eq!(
        notices(m),
        vec![Notice::Ready {
            rank: 1,
            path: Path {
                qp: qp.unwrap(),
                srqns: vec![101]
            }
        }]
    );
    (qp.unwrap(), cm, msg.tag)
}

/// Rank 1 serves rank 0's connect request on CM id 500 with TGT QP 77.
/// Rank `src` asks rank 1 to connect on CM id `cm`: the TGT QP that is to
/// be made for it.
fn requested_tgt(m: &mut ConnManager, cm: u64, src: Rank, tag: u32) -> TgtRef {
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(cm),
            data: Msg::new(Kind::Connect, JOB, src, 1, tag).encode(),
            from: None,
        },
    );
    let Action::CreateTgt { tgt } = drain(m)[0] else {
        panic!("a TGT QP is created for a connect request")
    };
    tgt
}

fn serve_anchor(m: &mut ConnManager) -> TgtRef {
    let tgt = requested_tgt(m, 500, 0, 42);
    m.handle(T0, Event::TgtCreated { tgt, qpn: 77 });
    drain(m);
    tgt
}

#[test]
fn second_rank_of_a_node_reuses_the_ini_qp() {
    let mut m = mgr(0, 0);
    let (qp, _, _) = anchored(&mut m);
    m.connect(T0, 2);
    let a = drain(&mut m);
    assert!(
        !a.iter().any(|x| matches!(x, Action::CreateQp { .. })),
        "one INI QP per node: {a:?}"
    );
    let cm = resolve_of(&a, 2);
    // The node's route is cached after the first resolution.
    assert!(a.iter().any(|x| matches!(
        x,
        Action::Resolve {
            route: Some(RouteRef(7)),
            ..
        }
    )));
    let (_, q, msg) = resolved(&mut m, T0, cm);
    assert_eq!(
        (q, msg.kind, msg.tgt),
        (None, Kind::Reuse, 77),
        "QP-less reuse of TGT QP 77"
    );
    let mut ok = Msg::new(Kind::ReuseOk, JOB, 2, 0, msg.tag);
    ok.srqns = vec![102];
    m.handle(
        T0,
        Event::Failed {
            cm,
            how: CmFailure::Rejected,
            data: ok.encode(),
        },
    );
    assert_eq!(
        notices(&mut m),
        vec![Notice::Ready {
            rank: 2,
            path: Path {
                qp,
                srqns: vec![102]
            }
        }]
    );
    assert_eq!(m.live_qps(), 1);
}

#[test]
fn not_ready_rebuilds_the_ini_qp_with_a_new_anchor() {
    let mut m = mgr(0, 0);
    let (old_qp, old_cm, _) = anchored(&mut m);
    m.connect(T0, 2);
    let cm = resolve_of(&drain(&mut m), 2);
    let (_, _, msg) = resolved(&mut m, T0, cm);
    // The TGT QP is gone by the time rank 2 looks for it.
    m.handle(
        T0,
        Event::Failed {
            cm,
            how: CmFailure::Rejected,
            data: refuse(2, 0, msg.tag, Reason::NotReady),
        },
    );
    let a = drain(&mut m);
    assert!(a.contains(&Action::DestroyQp { qp: old_qp }), "{a:?}");
    assert!(a.contains(&Action::DestroyCm { cm: old_cm }), "{a:?}");
    let new_qp = a
        .iter()
        .find_map(|x| match x {
            Action::CreateQp {
                qp,
                kind: QpKind::Ini,
                ..
            } => Some(*qp),
            _ => None,
        })
        .expect("a fresh INI QP");
    let cm2 = resolve_of(&a, 2);
    // Rank 1's endpoint used the dead TGT QP: lost, rebuilt on next use.
    assert_eq!(notices(&mut m), vec![Notice::Lost { rank: 1 }]);
    assert_eq!(m.live_qps(), 1);
    let (_, q, msg) = resolved(&mut m, T0, cm2);
    assert_eq!((q, msg.kind, msg.dst), (Some(new_qp), Kind::Connect, 2));
    m.handle(
        T0,
        Event::Established {
            cm: cm2,
            data: accept(2, 0, msg.tag, 88),
        },
    );
    assert_eq!(
        notices(&mut m),
        vec![Notice::Ready {
            rank: 2,
            path: Path {
                qp: new_qp,
                srqns: vec![102]
            }
        }]
    );
    assert_eq!(m.counters().rebuilds, 1);
}

#[test]
fn unreachable_anchor_is_retried_with_backoff_then_fails() {
    let mut m = mgr(0, 0);
    m.connect(T0, 1);
    let mut now = T0;
    let mut gaps = Vec::new();
    let mut cm = resolve_of(&drain(&mut m), 1);
    for _ in 0..=m.config().max_retries {
        m.handle(now, Event::ResolveFailed { cm });
        let a = drain(&mut m);
        if let Some(t) = m.poll_timeout() {
            gaps.push(t - now);
            now = t;
            m.handle_timeout(now);
            cm = resolve_of(&drain(&mut m), 1);
            assert!(
                a.iter().any(|x| matches!(x, Action::DestroyQp { .. })),
                "{a:?}"
            );
        }
    }
    // Doubling back-off, bounded retries, then failure.
    assert_eq!(gaps.len(), m.config().max_retries as usize, "{gaps:?}");
    assert!(
        gaps.windows(2)
            .all(|w| w[1] == (w[0] * 2).min(m.config().backoff_max)),
        "{gaps:?}"
    );
    assert_eq!(
        notices(&mut m),
        vec![Notice::Failed {
            rank: 1,
            reason: FailReason::Unreachable
        }]
    );
    assert_eq!(m.live_qps(), 0);
    assert_eq!(m.counters().retries, u64::from(m.config().max_retries) + 1);
}

#[test]
fn a_reply_from_the_wrong_rank_or_tag_is_not_trusted() {
    let mut m = mgr(0, 0);
    m.connect(T0, 1);
    let cm = resolve_of(&drain(&mut m), 1);
    let (_, _, msg) = resolved(&mut m, T0, cm);
    m.handle(
        T0,
        Event::Established {
            cm,
            data: accept(2, 0, msg.tag, 77),
        },
    );
    assert!(
        notices(&mut m).is_empty(),
        "a reply from rank 2 cannot connect rank 1"
    );
    assert_eq!(m.counters().retries, 1);
    let t = m.poll_timeout().expect("a retry is scheduled");
    m.handle_timeout(t);
    let cm = resolve_of(&drain(&mut m), 1);
    let (_, _, msg2) = resolved(&mut m, t, cm);
    assert_ne!(msg2.tag, msg.tag, "a new attempt has a new tag");
    m.handle(
        t,
        Event::Established {
            cm,
            data: accept(1, 0, msg.tag, 77),
        },
    );
    assert!(notices(&mut m).is_empty(), "a stale tag is refused too");
}

#[test]
fn requests_are_served_and_bad_ones_refused() {
    let mut m = mgr(1, 1);
    // A connect: create a TGT QP, then accept with it and our SRQ.
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(500),
            data: Msg::new(Kind::Connect, JOB, 0, 1, 42).encode(),
            from: None,
        },
    );
    let a = drain(&mut m);
    let Action::CreateTgt { tgt } = a[0] else {
        panic!("{a:?}")
    };
    m.handle(T0, Event::TgtCreated { tgt, qpn: 77 });
    let a = drain(&mut m);
    let Action::Accept {
        cm,
        qp: None,
        tgt: Some(t),
        data,
    } = &a[0]
    else {
        panic!("{a:?}")
    };
    assert_eq!((*cm, *t), (CmRef(500), tgt));
    let reply = Msg::decode(data, JOB).unwrap();
    assert_eq!(
        (reply.kind, reply.tgt, reply.srqns.clone(), reply.tag),
        (Kind::Accept, 77, vec![101], 42)
    );
    assert_eq!(m.tgt_handles(), 1);
    // A reuse of a TGT QP we already hold: answered at once.
    let mut r = Msg::new(Kind::Reuse, JOB, 0, 1, 43);
    r.tgt = 77;
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(501),
            data: r.encode(),
            from: None,
        },
    );
    let a = drain(&mut m);
    let Action::Reject { data, .. } = &a[0] else {
        panic!("{a:?}")
    };
    assert_eq!(Msg::decode(data, JOB).unwrap().kind, Kind::ReuseOk);
    // A reuse of a TGT QP that is gone: NotReady.
    r.tgt = 99;
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(502),
            data: r.encode(),
            from: None,
        },
    );
    let a = drain(&mut m);
    let Action::OpenTgt { tgt, qpn: 99 } = a[0] else {
        panic!("{a:?}")
    };
    m.handle(T0, Event::TgtOpened { tgt, ok: false });
    let a = drain(&mut m);
    let Action::Reject { data, .. } = &a[0] else {
        panic!("{a:?}")
    };
    assert_eq!(
        Msg::decode(data, JOB).unwrap().reason,
        Some(Reason::NotReady)
    );
    // Garbage, another job, another rank.
    for (bytes, reason) in [
        (
            b"\x00\x01garbage garbage garbage garbage".to_vec(),
            Reason::Malformed,
        ),
        (
            Msg::new(Kind::Connect, JOB + 1, 0, 1, 1).encode(),
            Reason::WrongJob,
        ),
        (
            Msg::new(Kind::Connect, JOB, 0, 3, 1).encode(),
            Reason::WrongRank,
        ),
        (
            Msg::new(Kind::Accept, JOB, 0, 1, 1).encode(),
            Reason::BadKind,
        ),
    ] {
        m.handle(
            T0,
            Event::Request {
                cm: CmRef(600),
                data: bytes,
                from: None,
            },
        );
        let a = drain(&mut m);
        let Action::Reject { data, .. } = &a[0] else {
            panic!("{a:?}")
        };
        let got = Msg::decode(data, JOB).unwrap();
        assert_eq!(got.reason, Some(reason));
    }
    assert_eq!(m.counters().refused_sent.values().sum::<u64>(), 5);
}

#[test]
fn the_anchor_hears_its_sender_go_and_breaks_the_tgt_qp() {
    let mut m = mgr(1, 1);
    let tgt = serve_anchor(&mut m);
    m.handle(
        T0,
        Event::Established {
            cm: CmRef(500),
            data: vec![],
        },
    );
    m.handle(T0, Event::Disconnected { cm: CmRef(500) });
    let a = drain(&mut m);
    assert!(
        a.contains(&Action::BreakTgt { tgt }),
        "every holder must hear: {a:?}"
    );
    assert!(a.contains(&Action::CloseTgt { tgt }), "{a:?}");
    assert_eq!(m.tgt_handles(), 0);
}

#[test]
fn a_tgt_error_unregisters() {
    let mut m = mgr(2, 1);
    let mut r = Msg::new(Kind::Reuse, JOB, 0, 2, 43);
    r.tgt = 77;
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(501),
            data: r.encode(),
            from: None,
        },
    );
    let Action::OpenTgt { tgt, .. } = drain(&mut m)[0] else {
        panic!()
    };
    m.handle(T0, Event::TgtOpened { tgt, ok: true });
    drain(&mut m);
    assert_eq!(m.tgt_handles(), 1);
    m.handle(T0, Event::TgtFailed { tgt });
    assert_eq!(drain(&mut m), vec![Action::CloseTgt { tgt }]);
    assert_eq!(m.tgt_handles(), 0);
}

#[test]
fn clean_exit_tells_senders_and_waits_for_them() {
    let mut m = mgr(1, 1);
    let tgt = serve_anchor(&mut m);
    m.shutdown(T0);
    let a = drain(&mut m);
    let cm = resolve_of(&a, 0);
    assert!(
        !a.iter().any(|x| matches!(x, Action::CloseTgt { .. })),
        "nothing released before the sender stops"
    );
    // A request arriving meanwhile is refused.
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(700),
            data: Msg::new(Kind::Connect, JOB, 2, 1, 1).encode(),
            from: None,
        },
    );
    let a = drain(&mut m);
    let Action::Reject { data, .. } = &a[0] else {
        panic!("{a:?}")
    };
    assert_eq!(
        Msg::decode(data, JOB).unwrap().reason,
        Some(Reason::Leaving)
    );
    m.handle(
        T0,
        Event::Resolved {
            cm,
            route: RouteRef(1),
        },
    );
    let (_, q, msg) = connect_of(&drain(&mut m));
    assert_eq!((q, msg.kind, msg.tgt), (None, Kind::Leave, 0));
    let ack = Msg::new(Kind::LeaveAck, JOB, 0, 1, msg.tag).encode();
    m.handle(
        T0,
        Event::Failed {
            cm,
            how: CmFailure::Rejected,
            data: ack,
        },
    );
    let a = drain(&mut m);
    assert!(a.contains(&Action::CloseTgt { tgt }), "{a:?}");
    assert_eq!(notices(&mut m), vec![Notice::Drained]);
    assert!(m.is_drained());
}

#[test]
fn clean_exit_gives_up_on_silent_peers() {
    let mut m = mgr(1, 1);
    let tgt = serve_anchor(&mut m);
    m.shutdown(T0);
    drain(&mut m);
    let t = m.poll_timeout().expect("the leave deadline");
    assert_eq!(t, m.config().leave_timeout);
    m.handle_timeout(t);
    assert!(drain(&mut m).contains(&Action::CloseTgt { tgt }));
    assert_eq!(notices(&mut m), vec![Notice::Drained]);
}

#[test]
fn each_acknowledged_leave_gives_the_clean_exit_its_timeout_again() {
    let mut m = mgr(1, 1);
    serve_anchor(&mut m);
    let tgt = requested_tgt(&mut m, 501, 3, 43);
    m.handle(T0, Event::TgtCreated { tgt, qpn: 78 });
    drain(&mut m);
    m.shutdown(T0);
    let a = drain(&mut m);
    let to = m.config().leave_timeout;
    let cm0 = resolve_of(&a, 0);
    resolve_of(&a, 3); // both senders are told
                       // Rank 0 acknowledges late, but within the timeout.
    let t1 = T0 + to * 4 / 5;
    m.handle(
        t1,
        Event::Resolved {
            cm: cm0,
            route: RouteRef(1),
        },
    );
    let (_, _, msg) = connect_of(&drain(&mut m));
    m.handle(
        t1,
        Event::Failed {
            cm: cm0,
            how: CmFailure::Rejected,
            data: Msg::new(Kind::LeaveAck, JOB, 0, 1, msg.tag).encode(),
        },
    );
    drain(&mut m);
    assert_eq!(m.poll_timeout(), Some(t1 + to), "the wait starts again");
    // The first deadline passes: rank 3 is still waited for.
    m.handle_timeout(T0 + to);
    drain(&mut m);
    assert!(!m.is_drained() && notices(&mut m).is_empty());
    // Silent for a whole timeout since: given up.
    assert_eq!(m.counters().leaves_abandoned, 0);
    m.handle_timeout(t1 + to);
    drain(&mut m);
    assert_eq!(notices(&mut m), vec![Notice::Drained]);
    assert_eq!(m.counters().leaves_abandoned, 1);
    assert!(m.is_drained());
}

#[test]
fn a_leaving_receiver_closes_our_endpoint() {
    let mut m = mgr(0, 0);
    anchored(&mut m);
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(800),
            data: Msg::new(Kind::Leave, JOB, 1, 0, 5).encode(),
            from: None,
        },
    );
    let a = drain(&mut m);
    assert!(
        a.iter().any(|x| matches!(x, Action::Reject { .. })),
        "acknowledged: {a:?}"
    );
    assert_eq!(notices(&mut m), vec![Notice::Closed { rank: 1 }]);
    assert!(m.path(1).is_none());
    // A closed peer stays closed.
    m.connect(T0, 1);
    assert!(drain(&mut m).is_empty());
}

#[test]
fn an_ini_is_made_deep_enough_for_its_node_and_grows_only_for_ranks_added_later() {
    let cfg = mgr(0, 0).config().clone();
    let depths = |m: &mut ConnManager, ranks: std::ops::Range<Rank>, add: bool| {
        let (mut created, mut grown) = (Vec::new(), Vec::new());
        for r in ranks {
            if add {
                m.add_peer(r, 1);
            }
            m.connect(T0, r);
            for a in drain(m) {
                match a {
                    Action::CreateQp { sq_depth, .. } => created.push(sq_depth),
                    Action::ResizeQp { sq_depth, .. } => grown.push(sq_depth),
                    _ => {}
                }
            }
        }
        (created, grown)
    };
    // All 50 ranks of node 1 known at the start: one INI of 50 x 16
    // entries, never grown (most devices cannot grow a connected QP).
    let mut peers: Vec<(Rank, Node)> = (10..60).map(|r| (r, 1)).collect();
    peers.push((0, 0));
    let mut m = ConnManager::new(cfg.clone(), peers);
    assert_eq!(depths(&mut m, 10..60, false), (vec![800], vec![]));
    // Ranks made known one by one (an MPI library adding peers lazily):
    // the INI starts at 256 and asks to double as they join.
    let mut m = ConnManager::new(cfg, [(0, 0)]);
    assert_eq!(depths(&mut m, 10..60, true), (vec![256], vec![512, 1024]));
}

#[test]
fn a_gone_anchor_is_replaced_by_the_next_rank_of_its_node() {
    let mut m = mgr(0, 0);
    m.connect(T0, 1);
    m.connect(T0, 2);
    let cm = resolve_of(&drain(&mut m), 1);
    let (c, _, _) = resolved(&mut m, T0, cm);
    // Nobody listens at rank 1's address: its process is gone.
    m.handle(
        T0,
        Event::Failed {
            cm: c,
            how: CmFailure::NoListener,
            data: Vec::new(),
        },
    );
    assert_eq!(
        notices(&mut m),
        vec![Notice::Failed {
            rank: 1,
            reason: FailReason::NoListener
        }]
    );
    // Rank 2, wanted there too, anchors a fresh INI QP.
    let mut a = drain(&mut m);
    let now = m.poll_timeout().expect("a retry is scheduled");
    m.handle_timeout(now);
    a.extend(drain(&mut m));
    let cm = resolve_of(&a, 2);
    let (c, qp, msg) = resolved(&mut m, now, cm);
    assert_eq!((msg.kind, msg.dst), (Kind::Connect, 2));
    m.handle(
        now,
        Event::Established {
            cm: c,
            data: accept(2, 0, msg.tag, 78),
        },
    );
    assert_eq!(
        notices(&mut m),
        vec![Notice::Ready {
            rank: 2,
            path: Path {
                qp: qp.unwrap(),
                srqns: vec![102]
            }
        }]
    );
    assert_eq!(m.counters().reanchors, 1);
    assert_eq!(m.live_qps(), 1);
}

/// The CM ids and reasons of the `Reject`s in `actions`.
fn rejected(actions: &[Action]) -> Vec<(CmRef, Option<Reason>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Reject { cm, data, .. } => Some((*cm, Msg::decode(data, JOB).unwrap().reason)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_request_from_an_unknown_rank_waits_for_it_to_be_added_or_refused() {
    let mut m = mgr(1, 1);
    // Each request comes from its rank's host (where the CM says).
    let host = |src: Rank| std::net::SocketAddr::from(([10, 0, 0, src as u8], 40_000));
    let request = |m: &mut ConnManager, cm: u64, src: Rank| {
        m.handle(
            T0,
            Event::Request {
                cm: CmRef(cm),
                data: Msg::new(Kind::Connect, JOB, src, 1, cm as u32).encode(),
                from: Some(host(src)),
            },
        );
    };
    // Rank 7 asks twice (a retry): one notice, with where it asked from,
    // nothing answered yet.
    request(&mut m, 700, 7);
    request(&mut m, 701, 7);
    assert!(drain(&mut m).is_empty());
    assert_eq!(notices(&mut m), vec![Notice::UnknownPeer { rank: 7 }]);
    // Rank 8 cannot be found: refused as a wrong rank.
    request(&mut m, 800, 8);
    assert_eq!(notices(&mut m), vec![Notice::UnknownPeer { rank: 8 }]);
    assert_eq!(m.unknown_source(8), Some(host(8)));
    m.unknown_peer(T0, 8);
    assert_eq!(m.unknown_source(8), None, "forgotten with its requests");
    assert_eq!(
        rejected(&drain(&mut m)),
        [(CmRef(800), Some(Reason::WrongRank))]
    );
    // Rank 7 is added: its first request is served first.
    m.add_peer(7, 2);
    assert_eq!(m.unknown_source(7), None);
    let a = drain(&mut m);
    assert!(
        matches!(a.first(), Some(Action::CreateTgt { .. })),
        "the oldest request makes the TGT QP: {a:?}"
    );
    // Rank 9 is still unknown when the rank leaves: refused, leaving.
    request(&mut m, 900, 9);
    assert_eq!(notices(&mut m), vec![Notice::UnknownPeer { rank: 9 }]);
    m.shutdown(T0);
    let a = drain(&mut m);
    assert!(
        rejected(&a).contains(&(CmRef(900), Some(Reason::Leaving))),
        "{a:?}"
    );
}

fn rc_mgr(rank: Rank) -> ConnManager {
    let cfg = Config::new(rank, rank, JOB, Mode::Rc { p2p: false }, vec![100 + rank]);
    ConnManager::new(cfg, [(0, 0), (1, 1), (2, 2)])
}

/// RC: `from`'s connect request (tag `tag`, sent under its connection
/// count `epoch`) reaches rank 0 on CM id `cm`.
fn rc_request(m: &mut ConnManager, from: Rank, tag: u32, epoch: u32, cm: CmRef) {
    let mut r = Msg::new(Kind::Connect, JOB, from, 0, tag);
    r.flags = wire::FLAG_RECIPROCAL;
    r.tgt = epoch;
    m.handle(
        T0,
        Event::Request {
            cm,
            data: r.encode(),
            from: None,
        },
    );
}

/// RC: rank 1 and rank 0 connect at once. Rank 0's request wins at rank
/// 1, which drops its own; but rank 1's request was on the wire already
/// and reaches rank 0 only after rank 0's connection is up. That request
/// is older than the connection (it carries the connection count it was
/// sent under): refused, the connection kept. A request sent after a
/// connection was lost carries the newer count and replaces it.
#[test]
fn rc_a_crossing_request_that_arrives_late_does_not_undo_the_connection() {
    let mut m = rc_mgr(0);
    m.connect(T0, 1);
    let a = drain(&mut m);
    let cm = resolve_of(&a, 1);
    let (_, qp, msg) = resolved(&mut m, T0, cm);
    assert_eq!(msg.tgt, 0, "the first connection's request carries count 0");
    m.handle(
        T0,
        Event::Established {
            cm,
            data: accept(1, 0, msg.tag, 0),
        },
    );
    let ready = notices(&mut m);
    assert!(
        matches!(ready[..], [Notice::Ready { rank: 1, .. }]),
        "{ready:?}"
    );
    // Rank 1's request from before (count 0) arrives now.
    rc_request(&mut m, 1, 5, 0, CmRef(900));
    let acts = drain(&mut m);
    assert_eq!(rejected(&acts), vec![(CmRef(900), Some(Reason::Collision))]);
    assert!(
        !acts.iter().any(|a| matches!(a, Action::DestroyQp { .. })),
        "the connection stays: {acts:?}"
    );
    // The refusal is told, with its reason.
    assert_eq!(
        all_notices(&mut m),
        vec![Notice::Refused {
            rank: Some(1),
            reason: Reason::Collision
        }]
    );
    // Rank 1 lost the connection and asks again, under count 1: it wins.
    rc_request(&mut m, 1, 6, 1, CmRef(901));
    let acts = drain(&mut m);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::DestroyQp { qp: q } if Some(*q) == qp)),
        "the old connection goes: {acts:?}"
    );
    assert!(rejected(&acts).is_empty(), "{acts:?}");
}

/// Ranks of one node added at once share one route query: the first
/// resolves, the others wait for its route (and resolve on their own only
/// if it fails).
#[test]
fn concurrent_first_resolutions_to_a_node_share_one_query() {
    let cfg = Config::new(0, 0, JOB, Mode::Rc { p2p: false }, vec![100]);
    let mut m = ConnManager::new(cfg, [(0, 0), (1, 1), (2, 1), (3, 1)]);
    for r in 1..4 {
        m.connect(T0, r);
    }
    let a = drain(&mut m);
    let asked: Vec<_> = a
        .iter()
        .filter_map(|x| match x {
            Action::Resolve { cm, rank, route } => Some((*cm, *rank, *route)),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 1, "one query for node 1: {a:?}");
    let (first, _, route) = asked[0];
    assert_eq!(route, None);
    // It fails: the next waiter asks, the last still waits.
    m.handle(T0, Event::ResolveFailed { cm: first });
    let again: Vec<_> = drain(&mut m)
        .into_iter()
        .filter_map(|x| match x {
            Action::Resolve { cm, rank, route } => Some((cm, rank, route)),
            _ => None,
        })
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    let (second, _, _) = again[0];
    m.handle(
        T0,
        Event::Resolved {
            cm: second,
            route: RouteRef(3),
        },
    );
    let released: Vec<_> = drain(&mut m)
        .into_iter()
        .filter_map(|x| match x {
            Action::Resolve { rank, route, .. } => Some((rank, route)),
            _ => None,
        })
        .collect();
    assert_eq!(released.len(), 1, "the last waiter: {released:?}");
    assert_eq!(released[0].1, Some(RouteRef(3)));
}

/// An endpoint that fails while its CM id waits for its node's route
/// (another rank's resolution is under way) takes the id back without
/// asking the driver to destroy it: the driver never heard of it. Found by
/// the conn_manager fuzz target.
#[test]
fn an_id_waiting_for_its_route_is_never_destroyed_by_the_driver() {
    let cfg = Config::new(0, 0, 7, Mode::Rc { p2p: true }, Vec::new());
    let mut m = ConnManager::new(cfg, (0..6).map(|r| (r, r / 2)));
    let t = Duration::ZERO;
    m.connect(t, 4);
    let first = drain(&mut m);
    assert!(first
        .iter()
        .any(|a| matches!(a, Action::Resolve { rank: 4, .. })));
    // Rank 5 shares rank 4's node: its id waits for that route.
    m.connect(t, 5);
    let second = drain(&mut m);
    let qp = second
        .iter()
        .find_map(|a| match a {
            Action::CreateQp { qp, .. } => Some(*qp),
            _ => None,
        })
        .expect("a QP for rank 5");
    assert!(!second.iter().any(|a| matches!(a, Action::Resolve { .. })));
    m.handle(t, Event::QpCreateFailed { qp });
    let after = drain(&mut m);
    assert!(
        !after.iter().any(|a| matches!(a, Action::DestroyCm { .. })),
        "{after:?}"
    );
    assert!(notices(&mut m)
        .iter()
        .any(|n| matches!(n, Notice::Failed { rank: 5, .. })));
}

/// A request that claims to come from the rank it reaches is forged (a rank
/// reaches itself in process): refused, with no QP or endpoint made; and
/// the BTL asking to connect a rank to itself is refused too. Found by the
/// conn_manager fuzz target.
#[test]
fn a_request_from_oneself_is_refused() {
    for mode in [Mode::Xrc, Mode::Rc { p2p: false }, Mode::Rc { p2p: true }] {
        let srqns = if mode == Mode::Xrc {
            vec![11]
        } else {
            Vec::new()
        };
        let mut m = ConnManager::new(
            Config::new(0, 0, JOB, mode, srqns),
            (0..4).map(|r| (r, r / 2)),
        );
        let t = Duration::ZERO;
        let data = Msg::new(Kind::Connect, JOB, 0, 0, 1).encode();
        m.handle(
            t,
            Event::Request {
                cm: CmRef(1 << 62),
                data,
                from: None,
            },
        );
        let a = drain(&mut m);
        assert_eq!(
            rejected(&a),
            vec![(CmRef(1 << 62), Some(Reason::WrongRank))],
            "{mode:?}: {a:?}"
        );
        assert!(!a
            .iter()
            .any(|x| matches!(x, Action::CreateQp { .. } | Action::CreateTgt { .. })));
        m.connect(t, 0);
        assert!(drain(&mut m).is_empty());
        assert!(notices(&mut m).iter().any(|n| matches!(
            n,
            Notice::Failed {
                rank: 0,
                reason: FailReason::Refused(Reason::WrongRank)
            }
        )));
    }
}

/// A connect request whose connection goes away while its TGT QP is being
/// made: the QP, once the driver reports it made, is closed at once, not
/// left open with nobody holding it (the handle used to be closed before
/// it existed, and the QP made afterwards leaked).
#[test]
fn a_tgt_made_for_a_request_that_went_away_is_closed() {
    let mut m = mgr(1, 1);
    let tgt = requested_tgt(&mut m, 500, 0, 42);
    m.handle(T0, Event::Disconnected { cm: CmRef(500) });
    let gone = drain(&mut m);
    assert!(
        !gone.iter().any(|a| matches!(a, Action::CloseTgt { .. })),
        "closed before it exists: {gone:?}"
    );
    m.handle(T0, Event::TgtCreated { tgt, qpn: 77 });
    let made = drain(&mut m);
    assert!(made.contains(&Action::CloseTgt { tgt }), "{made:?}");
    assert_eq!(m.tgt_handles(), 0);
}

/// RC: a peer whose requests time out asks again and again; when they all
/// reach this rank at once (it was not polling), each supersedes the one
/// before, and only one QP stays. Every request used to leave a QP behind.
/// Found by the sweeper (seed 553).
#[test]
fn rc_repeated_requests_from_one_peer_leave_one_qp() {
    let mut m = rc_mgr(2);
    for (i, tag) in [3u32, 7, 11, 15].into_iter().enumerate() {
        m.handle(
            T0,
            Event::Request {
                cm: CmRef((1 << 62) + i as u64),
                data: Msg::new(Kind::Connect, JOB, 1, 2, tag).encode(),
                from: None,
            },
        );
        drain(&mut m);
        assert_eq!(m.live_qps(), 1, "after request {tag}");
    }
}

/// The fuzzer's find: a peer leaves while this rank's connection to it is
/// still coming up, then the connection comes up. The endpoint stays
/// closed: it was made ready with no QP under it, and the next `connect`
/// panicked ("ready endpoints have a path").
#[test]
fn a_connection_that_comes_up_after_its_peer_left_readies_nothing() {
    let mut m = mgr(0, 0);
    m.connect(T0, 1);
    let cm = resolve_of(&drain(&mut m), 1);
    let (cm, _, req) = resolved(&mut m, T0, cm);
    m.handle(
        T0,
        Event::Request {
            cm: CmRef(800),
            data: Msg::new(Kind::Leave, JOB, 1, 0, 5).encode(),
            from: None,
        },
    );
    assert_eq!(notices(&mut m), vec![Notice::Closed { rank: 1 }]);
    m.handle(
        T0,
        Event::Established {
            cm,
            data: accept(1, 0, req.tag, 77),
        },
    );
    let n = notices(&mut m);
    assert!(
        !n.iter().any(|x| matches!(x, Notice::Ready { rank: 1, .. })),
        "{n:?}"
    );
    assert!(m.path(1).is_none());
    m.connect(T0, 1);
    assert!(m.path(1).is_none());
}

/// Connection requests beyond the window wait their turn, in order: none
/// is handed to the driver until an exchange in flight is over (answered,
/// failed or given up), and one dropped while it waits is never handed to
/// the driver at all.
#[test]
fn requests_beyond_the_window_wait_their_turn() {
    let mut cfg = Config::new(0, 0, JOB, Mode::Rc { p2p: false }, vec![100]);
    cfg.connect_window = 2;
    let mut m = ConnManager::new(cfg, (0..6).map(|r| (r, r)));
    for r in 1..6 {
        m.connect(T0, r);
    }
    let a = drain(&mut m);
    let resolving = |a: &[Action]| -> Vec<Rank> {
        a.iter()
            .filter_map(|x| match x {
                Action::Resolve { rank, .. } => Some(*rank),
                _ => None,
            })
            .collect()
    };
    assert_eq!(resolving(&a), vec![1, 2], "{a:?}");
    assert_eq!(m.counters().paced, 3);
    assert_eq!(m.exchanges(), (2, 3));
    // Rank 1 answers: rank 3's turn.
    let (cm1, _, msg1) = resolved(&mut m, T0, resolve_of(&a, 1));
    m.handle(
        T0,
        Event::Established {
            cm: cm1,
            data: accept(1, 0, msg1.tag, 0),
        },
    );
    let b = drain(&mut m);
    assert_eq!(resolving(&b), vec![3], "{b:?}");
    // Rank 4, still waiting, fails for good: its id is never the driver's,
    // and rank 5 does not start in its place while the window is full.
    m.handle(T0, Event::QpCreateFailed { qp: qp_of(&a, 4) });
    let c = drain(&mut m);
    assert!(
        !c.iter()
            .any(|x| matches!(x, Action::Resolve { .. } | Action::DestroyCm { .. })),
        "{c:?}"
    );
    // Rank 2's request fails (unreachable): a retry is armed, and rank 5
    // starts.
    let cm2 = resolve_of(&a, 2);
    m.handle(
        T0,
        Event::Failed {
            cm: cm2,
            how: CmFailure::Unreachable,
            data: Vec::new(),
        },
    );
    let d = drain(&mut m);
    assert_eq!(resolving(&d), vec![5], "{d:?}");
    assert_eq!(m.exchanges(), (2, 0));
    assert_eq!(m.counters().peak_in_flight, 2);
}

/// The QP created for `rank` (RC: one per peer, in order of `connect`).
fn qp_of(actions: &[Action], rank: Rank) -> QpRef {
    let creates: Vec<QpRef> = actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateQp { qp, .. } => Some(*qp),
            _ => None,
        })
        .collect();
    creates[rank as usize - 1]
}

/// RC: a peer's request that crosses ours while ours still waits for its
/// turn in the window is accepted, although this rank is the lower: ours
/// has not left, so nothing crosses on the wire, and it is dropped unsent.
#[test]
fn rc_a_request_crossing_one_that_waits_its_turn_is_taken() {
    let mut cfg = Config::new(0, 0, JOB, Mode::Rc { p2p: false }, vec![100]);
    cfg.connect_window = 1;
    let mut m = ConnManager::new(cfg, (0..3).map(|r| (r, r)));
    m.connect(T0, 1);
    m.connect(T0, 2);
    let a = drain(&mut m);
    let first = resolve_of(&a, 1);
    assert_eq!(m.exchanges(), (1, 1));
    // Rank 2's request arrives while ours to it waits.
    rc_request(&mut m, 2, 8, 0, CmRef(900));
    let b = drain(&mut m);
    assert!(rejected(&b).is_empty(), "{b:?}");
    assert!(
        b.iter().any(|x| matches!(
            x,
            Action::Accept {
                cm: CmRef(900),
                qp: Some(_),
                ..
            }
        )),
        "{b:?}"
    );
    assert!(
        !b.iter().any(|x| matches!(x, Action::DestroyCm { .. })),
        "our request was never the driver's: {b:?}"
    );
    assert_eq!(m.exchanges(), (1, 0));
    m.handle(
        T0,
        Event::Established {
            cm: CmRef(900),
            data: Vec::new(),
        },
    );
    assert!(
        matches!(notices(&mut m)[..], [Notice::Ready { rank: 2, .. }]),
        "rank 2 is ready through its own request"
    );
    // Our request to rank 1 ends: nothing is left to start.
    m.handle(
        T0,
        Event::Failed {
            cm: first,
            how: CmFailure::Unreachable,
            data: Vec::new(),
        },
    );
    let c = drain(&mut m);
    assert!(
        !c.iter().any(|x| matches!(x, Action::Resolve { .. })),
        "{c:?}"
    );
    assert_eq!(m.exchanges(), (0, 0));
}
