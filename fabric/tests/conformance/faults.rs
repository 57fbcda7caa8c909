//! Rules of fault injection: crashes, lost, late and duplicated CM
//! messages, forced QP errors, partitions and port events.

use std::time::Duration;

use xrcbtl_fabric::sim::{CmAction, CmFault, CmMsgKind};
use xrcbtl_fabric::*;

use super::harness::{Failure, Harness, Need, Outcome};
use super::util::*;
use super::{rule, two, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule(
            "fault_crash_releases_everything",
            &[Need::Crash, Need::Introspection],
            fault_crash::<H>,
        ),
        rule(
            "fault_cm_drop_is_retried",
            &[Need::Faults],
            fault_cm_drop::<H>,
        ),
        rule(
            "fault_cm_all_dropped_unreachable",
            &[Need::Faults],
            fault_cm_unreachable::<H>,
        ),
        rule("fault_cm_delay", &[Need::Faults], fault_cm_delay::<H>),
        rule(
            "fault_cm_duplicate_seen_once",
            &[Need::Faults],
            fault_cm_duplicate::<H>,
        ),
        rule(
            "fault_force_qp_error",
            &[Need::Faults],
            fault_force_qp_error::<H>,
        ),
        rule(
            "fault_partition",
            &[Need::Faults, Need::TwoNodes, Need::IbFamily],
            fault_partition::<H>,
        ),
        rule("fault_port_down_up", &[Need::Faults], fault_port::<H>),
    ]
}

fn fault_crash<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(
        h,
        &a,
        &b,
        &Opts::default(),
        &Opts {
            srq: true,
            ..Opts::default()
        },
    )?;
    let before = h.node_qps(b.node).map_err(Failure)?;
    h.crash(&b).map_err(Failure)?;
    let v = h.process_view(&b).map_err(Failure)?;
    ensure!(!v.alive, "crashed process alive");
    ensure_eq!(
        (
            v.qps,
            v.tgt_handles,
            v.mrs,
            v.srqs,
            v.cqs,
            v.pds,
            v.xrcds,
            v.cm_ids
        ),
        (0, 0, 0, 0, 0, 0, 0, 0)
    );
    let after = h.node_qps(b.node).map_err(Failure)?;
    ensure_eq!(after + 1, before);
    // The kernel closed the dead process's CM id: the peer hears of it.
    let e = wait_cm(h, ea.ch.as_ref().expect("CM endpoint"), |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Disconnected);
    // The dead process's handles answer, they do not crash the caller.
    ensure!(
        eb.qp.state().is_err(),
        "a crashed process's QP still answers"
    );
    drop(eb);
    Ok(())
}

fn fault_cm_drop<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    h.cm_fault(CmFault::new(Some(CmMsgKind::Req), CmAction::Drop).times(1))
        .map_err(Failure)?;
    h.cm_fault(CmFault::new(Some(CmMsgKind::Rep), CmAction::Drop).times(1))
        .map_err(Failure)?;
    h.cm_fault(CmFault::new(Some(CmMsgKind::Rtu), CmAction::Drop).times(1))
        .map_err(Failure)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    ea.send(0, b"made it")?;
    check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1000, WcStatus::Success)?;
    Ok(())
}

fn fault_cm_unreachable<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    h.cm_fault(CmFault::new(Some(CmMsgKind::Req), CmAction::Drop))
        .map_err(Failure)?;
    let d = dial(h, &a, &b, &Opts::default())?;
    d.id.connect(Some(&d.ep.qp), &ConnParam::default())?;
    let (cha, chb) = (&d.cha, &d.chb);
    let e = wait_cm(h, cha, |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Unreachable);
    ensure!(
        chb.poll_event().is_none(),
        "the listener heard a dropped request"
    );
    Ok(())
}

fn fault_cm_delay<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let delay = Duration::from_millis(3);
    h.cm_fault(CmFault::new(
        Some(CmMsgKind::Req),
        CmAction::Delay(delay.as_nanos() as u64),
    ))
    .map_err(Failure)?;
    let start = h.now();
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let took = h.now() - start;
    ensure!(
        took >= delay,
        "connected in {took:?} despite a {delay:?} delay"
    );
    ea.send(0, b"late but fine")?;
    check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1000, WcStatus::Success)?;
    Ok(())
}

fn fault_cm_duplicate<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    for k in [CmMsgKind::Req, CmMsgKind::Rep, CmMsgKind::Rtu] {
        h.cm_fault(CmFault::new(Some(k), CmAction::Duplicate))
            .map_err(Failure)?;
    }
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    h.settle(Duration::from_millis(20));
    for (side, ch) in [("initiator", &ea.ch), ("listener", &eb.ch)] {
        if let Some(e) = ch.as_ref().expect("CM endpoint").poll_event() {
            return Err(Failure(format!("{side} saw a duplicate: {:?}", e.kind)));
        }
    }
    ea.send(0, b"once")?;
    check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1000, WcStatus::Success)?;
    expect_quiet(h, &eb.cq, Duration::from_millis(1))?;
    Ok(())
}

fn fault_force_qp_error<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let oa = Opts {
        recvs: 3,
        ..Opts::default()
    };
    let (ea, _eb) = connect_rc(h, &a, &b, &oa, &Opts::default())?;
    let qpn = ea.qp.qp_num();
    h.force_qp_error(a.node, qpn).map_err(Failure)?;
    wait_async(h, &a.ctx, |e| *e == AsyncEvent::QpFatal { qpn })?;
    let wcs = wait_cq(h, &ea.cq, 3)?;
    ensure!(wcs.iter().all(|w| w.status == WcStatus::WrFlush), "{wcs:?}");
    ensure_eq!(ea.qp.state()?, QpState::Error);
    Ok(())
}

fn fault_partition<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let oa = Opts {
        retry: 2,
        ..Opts::default()
    };
    let (ea, _eb) = connect_rc(h, &a, &b, &oa, &Opts::default())?;
    h.partition(a.node, b.node, true).map_err(Failure)?;
    ea.send(0, b"across the cut")?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::RetryExceeded)?;
    // No new connection across the cut either.
    let d = dial(h, &a, &b, &Opts::default())?;
    d.id.connect(Some(&d.ep.qp), &ConnParam::default())?;
    ensure_eq!(wait_cm(h, &d.cha, |_| true)?.kind, CmEventKind::Unreachable);
    // Healed, the nodes talk again.
    h.partition(a.node, b.node, false).map_err(Failure)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    ea.send(0, b"healed")?;
    check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1000, WcStatus::Success)?;
    Ok(())
}

fn fault_port<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(
        h,
        &a,
        &b,
        &Opts {
            retry: 2,
            ..Opts::default()
        },
        &Opts::default(),
    )?;
    h.set_port(b.node, false).map_err(Failure)?;
    wait_async(h, &b.ctx, |e| *e == AsyncEvent::PortError { port: 1 })?;
    ensure_eq!(b.ctx.query_port(1)?.state, PortState::Down);
    ea.send(0, b"port down")?;
    if is_iwarp(h) {
        // Sent is completed on iWARP; the stream then times out.
        wait_qp_error(h, &ea.cq, &ea.qp)?;
    } else {
        let wc = wait_cq(h, &ea.cq, 1)?[0];
        ensure!(
            wc.status != WcStatus::Success,
            "a send through a down port succeeded"
        );
    }
    h.set_port(b.node, true).map_err(Failure)?;
    wait_async(h, &b.ctx, |e| *e == AsyncEvent::PortActive { port: 1 })?;
    ensure_eq!(b.ctx.query_port(1)?.state, PortState::Active);
    drop(eb);
    Ok(())
}
