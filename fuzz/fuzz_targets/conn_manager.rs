//! The connection manager (sans-IO) under random sequences of commands and
//! driver events: CM requests and replies from any rank (well-formed or
//! not), failures, timeouts, QP and TGT errors, in any order. It must never
//! panic, and the work it asks of the driver must stay consistent:
//!
//! - every reference it hands out (QP, TGT handle, CM id) is fresh, and
//!   every action names a reference that is live (created and not yet
//!   destroyed, closed or failed);
//! - the QPs and TGT handles it says it holds are the ones its actions
//!   created and did not take back;
//! - with XRC, at most one INI QP per remote node lives at once;
//! - a `Ready` notice names a live QP.

#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use xrcbtl_xrc_conn::wire::{Kind, Msg, Reason};
use xrcbtl_xrc_conn::{
    Action, CmFailure, CmRef, Config, ConnManager, Event, Mode, Notice, QpKind, QpRef, RouteRef,
    TgtRef,
};

const JOB: u32 = 7;
/// Ranks 0..8 on nodes 0..4, two per node; this rank is rank 0.
const RANKS: u32 = 8;
const ME: u32 = 0;

fn node_of(rank: u32) -> u32 {
    rank / 2
}

/// A message a peer sends: raw bytes, or a well-formed one from fields.
#[derive(Arbitrary, Debug)]
enum Data {
    Raw(Vec<u8>),
    Msg {
        kind: u8,
        src: u8,
        dst: u8,
        /// A tag this rank used (by index), or any.
        tag: Option<u8>,
        any_tag: u32,
        tgt: u32,
        srqs: u8,
        flags: u8,
        reason: u8,
        wrong_job: bool,
    },
}

#[derive(Arbitrary, Debug)]
enum Step {
    Connect(u8),
    AddPeer(u8),
    UnknownPeer(u8),
    Shutdown,
    Advance(u16),
    QpCreateFailed(u8),
    TgtCreated(u8, u32),
    TgtCreateFailed(u8),
    TgtOpened(u8, bool),
    Resolved(u8, u8),
    ResolveFailed(u8),
    Request(Data),
    Established(u8, Data),
    Failed(u8, u8, Data),
    Disconnected(u8),
    QpFailed(u8),
    TgtFailed(u8),
    FirstReceive(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    mode: u8,
    steps: Vec<Step>,
}

/// What the driver side knows: every reference ever handed out, and the
/// live ones.
#[derive(Default)]
struct Driver {
    qps_ever: BTreeSet<QpRef>,
    qps: BTreeMap<QpRef, QpKind>,
    tgts_ever: BTreeSet<TgtRef>,
    tgts: BTreeSet<TgtRef>,
    /// TGT handles asked for and not answered yet.
    tgts_asked: BTreeSet<TgtRef>,
    cms_ever: BTreeSet<CmRef>,
    cms: BTreeSet<CmRef>,
    /// CM ids the manager asked to resolve, towards which rank.
    resolving: BTreeMap<CmRef, u32>,
    /// INI QPs by the node they were made for (XRC).
    ini_node: BTreeMap<QpRef, u32>,
    tags: Vec<u32>,
    next_cm: u64,
    routes: u64,
}

fn pick<T: Copy>(set: impl IntoIterator<Item = T>, i: u8) -> Option<T> {
    let v: Vec<T> = set.into_iter().collect();
    (!v.is_empty()).then(|| v[usize::from(i) % v.len()])
}

impl Driver {
    fn data(&self, d: &Data) -> Vec<u8> {
        match d {
            Data::Raw(b) => b.clone(),
            Data::Msg {
                kind,
                src,
                dst,
                tag,
                any_tag,
                tgt,
                srqs,
                flags,
                reason,
                wrong_job,
            } => {
                let kind = match kind % 7 {
                    0 => Kind::Connect,
                    1 => Kind::Reuse,
                    2 => Kind::Leave,
                    3 => Kind::Accept,
                    4 => Kind::ReuseOk,
                    5 => Kind::LeaveAck,
                    _ => Kind::Refuse,
                };
                let tag = match tag.and_then(|i| pick(self.tags.iter().copied(), i)) {
                    Some(t) => t,
                    None => *any_tag,
                };
                let job = if *wrong_job { JOB + 1 } else { JOB };
                let mut m = Msg::new(
                    kind,
                    job,
                    u32::from(*src) % (RANKS + 1),
                    u32::from(*dst) % (RANKS + 1),
                    tag,
                );
                m.tgt = *tgt;
                m.flags = *flags & 1;
                if matches!(kind, Kind::Accept | Kind::ReuseOk) {
                    m.srqns = (0..u32::from(srqs % 3)).map(|i| 100 + i).collect();
                }
                if kind == Kind::Refuse {
                    m.reason = Some(match reason % 4 {
                        0 => Reason::NotReady,
                        1 => Reason::Collision,
                        2 => Reason::Leaving,
                        _ => Reason::WrongRank,
                    });
                }
                m.encode()
            }
        }
    }

    fn fresh_cm(&mut self) -> CmRef {
        self.next_cm += 1;
        CmRef((1 << 62) + self.next_cm)
    }

    /// Takes the manager's work, checking each action against what lives.
    fn take(&mut self, m: &mut ConnManager) {
        while let Some(a) = m.poll_action() {
            match a {
                Action::CreateQp { qp, kind, sq_depth } => {
                    assert!(self.qps_ever.insert(qp), "{qp:?} handed out twice");
                    assert!(sq_depth > 0);
                    self.qps.insert(qp, kind);
                }
                Action::ResizeQp { qp, .. } => {
                    assert!(self.qps.contains_key(&qp), "resize of dead {qp:?}");
                }
                Action::DestroyQp { qp } => {
                    assert!(self.qps.remove(&qp).is_some(), "destroy of dead {qp:?}");
                    self.ini_node.remove(&qp);
                }
                Action::CreateTgt { tgt } | Action::OpenTgt { tgt, .. } => {
                    assert!(self.tgts_ever.insert(tgt), "{tgt:?} handed out twice");
                    self.tgts_asked.insert(tgt);
                }
                Action::CloseTgt { tgt } => {
                    // Only a handle the driver made: closing one it has not
                    // made yet would leave the QP it makes next open.
                    assert!(self.tgts.remove(&tgt), "close of dead {tgt:?}");
                }
                Action::BreakTgt { tgt } => {
                    assert!(self.tgts.contains(&tgt), "break of dead {tgt:?}");
                }
                Action::Resolve { cm, rank, .. } => {
                    assert!(self.cms_ever.insert(cm), "{cm:?} handed out twice");
                    assert!(rank < RANKS && rank != ME, "resolve of rank {rank}");
                    self.cms.insert(cm);
                    self.resolving.insert(cm, rank);
                }
                Action::Connect { cm, qp, data } => {
                    assert!(self.cms.contains(&cm), "connect on dead {cm:?}");
                    if let Some(qp) = qp {
                        assert!(self.qps.contains_key(&qp), "connect of dead {qp:?}");
                        if let (Some(&rank), Some(QpKind::Ini)) =
                            (self.resolving.get(&cm), self.qps.get(&qp))
                        {
                            self.ini_node.insert(qp, node_of(rank));
                        }
                    }
                    if let Ok(msg) = Msg::decode(&data, JOB) {
                        self.tags.push(msg.tag);
                    }
                }
                Action::Accept { cm, qp, tgt, .. } => {
                    assert!(self.cms.contains(&cm), "accept on dead {cm:?}");
                    if let Some(qp) = qp {
                        assert!(self.qps.contains_key(&qp), "accept with dead {qp:?}");
                    }
                    if let Some(t) = tgt {
                        assert!(self.tgts.contains(&t), "accept with dead {t:?}");
                    }
                }
                Action::Reject { cm, .. } => {
                    assert!(self.cms.contains(&cm), "reject on dead {cm:?}");
                }
                Action::DestroyCm { cm } => {
                    assert!(self.cms.remove(&cm), "destroy of dead {cm:?}");
                }
                Action::SendHello { qp } => {
                    assert!(self.qps.contains_key(&qp), "hello on dead {qp:?}");
                }
            }
        }
        assert_eq!(m.live_qps(), self.qps.len(), "QPs held");
        // One INI QP per remote node.
        let mut nodes = BTreeSet::new();
        for n in self.ini_node.values() {
            assert!(nodes.insert(*n), "two INI QPs to node {n}");
        }
        while let Some(n) = m.poll_notice() {
            if let Notice::Ready { rank, path } = n {
                assert!(rank != ME && rank < RANKS);
                assert!(
                    self.qps.contains_key(&path.qp),
                    "ready on dead {:?}",
                    path.qp
                );
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let mode = match input.mode % 3 {
        0 => Mode::Xrc,
        1 => Mode::Rc { p2p: false },
        _ => Mode::Rc { p2p: true },
    };
    let srqns = if mode == Mode::Xrc {
        vec![11, 12]
    } else {
        Vec::new()
    };
    let cfg = Config::new(ME, node_of(ME), JOB, mode, srqns);
    // Ranks 6 and 7 are unknown at first (an MPI library adds peers
    // lazily).
    let mut m = ConnManager::new(cfg, (0..6).map(|r| (r, node_of(r))));
    let mut d = Driver::default();
    let mut now = Duration::ZERO;
    for step in input.steps.iter().take(256) {
        match step {
            Step::Connect(r) => m.connect(now, u32::from(*r) % (RANKS + 1)),
            Step::AddPeer(r) => {
                let r = u32::from(*r) % RANKS;
                m.add_peer(r, node_of(r));
            }
            Step::UnknownPeer(r) => m.unknown_peer(now, u32::from(*r) % (RANKS + 2)),
            Step::Shutdown => m.shutdown(now),
            Step::Advance(ms) => {
                now += Duration::from_micros(u64::from(*ms) * 100);
                m.handle_timeout(now);
            }
            Step::QpCreateFailed(i) => {
                if let Some(qp) = pick(d.qps.keys().copied(), *i) {
                    d.qps.remove(&qp);
                    d.ini_node.remove(&qp);
                    m.handle(now, Event::QpCreateFailed { qp });
                }
            }
            Step::TgtCreated(i, qpn) => {
                if let Some(tgt) = pick(d.tgts_asked.iter().copied(), *i) {
                    d.tgts_asked.remove(&tgt);
                    d.tgts.insert(tgt);
                    m.handle(now, Event::TgtCreated { tgt, qpn: *qpn });
                }
            }
            Step::TgtCreateFailed(i) => {
                if let Some(tgt) = pick(d.tgts_asked.iter().copied(), *i) {
                    d.tgts_asked.remove(&tgt);
                    m.handle(now, Event::TgtCreateFailed { tgt });
                }
            }
            Step::TgtOpened(i, ok) => {
                if let Some(tgt) = pick(d.tgts_asked.iter().copied(), *i) {
                    d.tgts_asked.remove(&tgt);
                    if *ok {
                        d.tgts.insert(tgt);
                    }
                    m.handle(now, Event::TgtOpened { tgt, ok: *ok });
                }
            }
            Step::Resolved(i, route) => {
                if let Some(cm) = pick(d.resolving.keys().copied(), *i) {
                    d.routes += 1;
                    let route = RouteRef(u64::from(*route % 4) + 1);
                    m.handle(now, Event::Resolved { cm, route });
                }
            }
            Step::ResolveFailed(i) => {
                if let Some(cm) = pick(d.resolving.keys().copied(), *i) {
                    m.handle(now, Event::ResolveFailed { cm });
                }
            }
            Step::Request(data) => {
                let cm = d.fresh_cm();
                d.cms_ever.insert(cm);
                d.cms.insert(cm);
                let data = d.data(data);
                m.handle(
                    now,
                    Event::Request {
                        cm,
                        data,
                        from: None,
                    },
                );
            }
            Step::Established(i, data) => {
                if let Some(cm) = pick(d.cms.iter().copied(), *i) {
                    let data = d.data(data);
                    m.handle(now, Event::Established { cm, data });
                }
            }
            Step::Failed(i, how, data) => {
                if let Some(cm) = pick(d.cms.iter().copied(), *i) {
                    let how = match how % 4 {
                        0 => CmFailure::Rejected,
                        1 => CmFailure::NoListener,
                        2 => CmFailure::Unreachable,
                        _ => CmFailure::Stale,
                    };
                    let data = d.data(data);
                    m.handle(now, Event::Failed { cm, how, data });
                }
            }
            Step::Disconnected(i) => {
                if let Some(cm) = pick(d.cms.iter().copied(), *i) {
                    m.handle(now, Event::Disconnected { cm });
                }
            }
            Step::QpFailed(i) => {
                if let Some(qp) = pick(d.qps.keys().copied(), *i) {
                    m.handle(now, Event::QpFailed { qp });
                }
            }
            Step::TgtFailed(i) => {
                if let Some(tgt) = pick(d.tgts.iter().copied(), *i) {
                    m.handle(now, Event::TgtFailed { tgt });
                }
            }
            Step::FirstReceive(i) => {
                if let Some(qp) = pick(d.qps.keys().copied(), *i) {
                    m.handle(now, Event::FirstReceive { qp });
                }
            }
        }
        d.take(&mut m);
        // Handles count once the driver made them (a TGT asked for and
        // not answered yet is the manager's pending request).
        assert_eq!(m.tgt_handles(), d.tgts.len(), "TGT handles held");
    }
});
