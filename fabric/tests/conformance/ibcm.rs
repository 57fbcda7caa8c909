//! Rules the kernel's IB CM and the verbs enforce that an XRC HCA would:
//! the stale-connection check on (announced QP number, sending HCA), the
//! timers the CM hands out, the attribute masks allowed per QP type, the
//! QP state table's refusal of RESET to ERR, and the inline limit per QP
//! type. Each reads back from the device what it
//! can.

use std::result::Result;

use xrcbtl_fabric::*;

use super::harness::{Failure, Harness, Need, Outcome};
use super::util::*;
use super::{rule, two, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule(
            "ibcm_stale_connection",
            &[Need::IbFamily],
            ibcm_stale_connection::<H>,
        ),
        rule(
            "ibcm_default_timers",
            &[Need::IbFamily],
            ibcm_default_timers::<H>,
        ),
        rule(
            "ibcm_timers_as_set",
            &[Need::IbFamily],
            ibcm_timers_as_set::<H>,
        ),
        rule(
            "rtr_rc_needs_responder_attributes",
            &[Need::IbFamily],
            rtr_rc_needs_responder_attributes::<H>,
        ),
        rule(
            "rtr_ini_refuses_responder_attributes",
            &[Need::Xrc],
            rtr_ini_refuses_responder_attributes::<H>,
        ),
        rule(
            "reset_to_error_is_refused",
            &[Need::IbFamily],
            reset_to_error_is_refused::<H>,
        ),
        rule(
            "inline_limit_per_qp_type",
            &[],
            inline_limit_per_qp_type::<H>,
        ),
    ]
}

/// A QP-less request announcing `qpn` on a fresh id towards `l`.
fn request<H: Harness, Ch: CmChannel>(
    h: &H,
    ch: &Ch,
    to: std::net::SocketAddr,
    qpn: u32,
) -> Result<Ch::Id, Failure> {
    let id = resolve(h, ch, PortSpace::Tcp, to)?;
    let p = ConnParam {
        qp_num: qpn,
        ..ConnParam::with_data(b"req")
    };
    id.connect(None, &p)?;
    Ok(id)
}

/// While the peer's CM holds a request, a second one from the same node
/// announcing the same QP number is turned away as stale before the
/// application sees it; one announcing another number goes through, and
/// once the first is answered the number is free again.
fn ibcm_stale_connection<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let cha = a.ctx.create_cm_channel()?;
    let chb = b.ctx.create_cm_channel()?;
    let (_l, addr) = listen(h, &b, &chb, PortSpace::Tcp)?;
    let is_req = |k: &CmEventKind| *k == CmEventKind::ConnectRequest;
    let answer = |k: &CmEventKind| matches!(k, CmEventKind::Rejected(_));
    let first = request(h, &cha, addr, 0)?;
    let held = wait_cm(h, &chb, is_req)?;
    let second = request(h, &cha, addr, 0)?;
    let e = wait_cm(h, &cha, answer)?;
    ensure_eq!(e.id, second.key());
    ensure_eq!(e.kind, CmEventKind::Rejected(RejectReason::StaleConnection));
    // Another number is another key.
    let third = request(h, &cha, addr, 0x4242)?;
    let other = wait_cm(h, &chb, is_req)?;
    // Answering the first frees its key.
    let held_id = held.new_id.ok_or_else(|| Failure("no id".into()))?;
    held_id.reject(b"no")?;
    let e = wait_cm(h, &cha, answer)?;
    ensure_eq!(e.id, first.key());
    ensure_eq!(e.kind, CmEventKind::Rejected(RejectReason::Consumer));
    let fourth = request(h, &cha, addr, 0)?;
    let again = wait_cm(h, &chb, is_req)?;
    for r in [other, again] {
        r.new_id
            .ok_or_else(|| Failure("no id".into()))?
            .reject(b"no")?;
    }
    drop((third, fourth));
    Ok(())
}

/// Connects an RC pair through the CM with the given timers on both
/// sides; returns the initiator's and the acceptor's QP attributes.
fn connect_with<H: Harness>(
    h: &H,
    ack_timeout: Option<u8>,
    min_rnr_timer: Option<u8>,
) -> Result<(QpAttr, QpAttr), Failure> {
    let (a, b) = two(h)?;
    let o = Opts {
        ack_timeout,
        min_rnr_timer,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &o, &o)?;
    Ok((ea.qp.query()?, eb.qp.query()?))
}

/// Unless the application says otherwise, the IB CM gives every responder
/// an RNR NAK timer of 0 (655 ms) and derives the ACK timeout from the
/// path: at least 14 (67 ms) on IB and RoCE.
fn ibcm_default_timers<H: Harness>(h: &H) -> Outcome {
    let (ini, acc) = connect_with(h, None, None)?;
    ensure_eq!(acc.min_rnr_timer, 0);
    ensure_eq!(ini.min_rnr_timer, 0);
    ensure!(ini.timeout >= 14, "the CM's ACK timeout {}", ini.timeout);
    Ok(())
}

/// The timers the application gives the CM are the ones the QPs get.
fn ibcm_timers_as_set<H: Harness>(h: &H) -> Outcome {
    let (ini, acc) = connect_with(h, Some(16), Some(7))?;
    for q in [ini, acc] {
        ensure_eq!(q.state, QpState::Rts);
        ensure_eq!(q.min_rnr_timer, 7);
        ensure_eq!(q.timeout, 16);
    }
    Ok(())
}

fn dest_of<C: Context>(ctx: &C) -> Result<PortAddr, Failure> {
    let p = ctx.query_port(1)?;
    Ok(PortAddr {
        lid: p.lid,
        gid: p.gid,
    })
}

/// An RC QP must set its responder attributes at RTR.
fn rtr_rc_needs_responder_attributes<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let ep = Ep::new(&p.ctx, &Opts::default())?;
    let peer = Ep::new(&p.ctx, &Opts::default())?;
    ep.qp.modify(&QpTransition::Init(InitAttr::default()))?;
    let dest = dest_of(&p.ctx)?;
    let bare = RtrAttr::initiator(dest, peer.qp.qp_num());
    ensure!(
        ep.qp.modify(&QpTransition::Rtr(bare)).is_err(),
        "an RC QP went to RTR without max_dest_rd_atomic and min_rnr_timer"
    );
    ep.qp
        .modify(&QpTransition::Rtr(RtrAttr::new(dest, peer.qp.qp_num())))?;
    ensure_eq!(ep.qp.query()?.min_rnr_timer, DEFAULT_MIN_RNR_TIMER);
    Ok(())
}

/// An XRC INI QP receives nothing: the kernel refuses responder attributes
/// at its RTR.
fn rtr_ini_refuses_responder_attributes<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let pd = p.ctx.alloc_pd()?;
    let cq = p.ctx.create_cq(16)?;
    let ini = ini_qp(&p.ctx, &pd, &cq, 4)?;
    ini.modify(&QpTransition::Init(InitAttr::default()))?;
    let dest = dest_of(&p.ctx)?;
    ensure!(
        ini.modify(&QpTransition::Rtr(RtrAttr::new(dest, 0x99)))
            .is_err(),
        "an INI QP took responder attributes at RTR"
    );
    ini.modify(&QpTransition::Rtr(RtrAttr::initiator(dest, 0x99)))?;
    ensure_eq!(ini.state()?, QpState::Rtr);
    Ok(())
}

/// The kernel's QP state table (`ib_modify_qp_is_ok`, which rxe and the
/// HCA drivers apply) leads from RESET only to RESET or INIT: a QP never
/// initialised cannot be moved to ERR (EINVAL), so a teardown that stops
/// QPs must not count on it. From INIT on, ERR is allowed.
fn reset_to_error_is_refused<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let pd = p.ctx.alloc_pd()?;
    let cq = p.ctx.create_cq(16)?;
    let qp = p.ctx.create_qp(
        &pd,
        &QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: Some(&cq),
            srq: None,
            caps: QpCaps::default(),
        },
    )?;
    ensure_eq!(qp.state()?, QpState::Reset);
    ensure!(
        qp.modify(&QpTransition::Error).is_err(),
        "a QP in RESET was moved to ERR"
    );
    ensure_eq!(qp.state()?, QpState::Reset);
    qp.modify(&QpTransition::Init(InitAttr::default()))?;
    qp.modify(&QpTransition::Error)?;
    ensure_eq!(qp.state()?, QpState::Error);
    Ok(())
}

/// Each QP type takes up to its own inline limit, and the device grants at
/// least what was asked.
fn inline_limit_per_qp_type<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let caps = h.caps();
    let pd = p.ctx.alloc_pd()?;
    let cq = p.ctx.create_cq(16)?;
    let mut types = vec![QpType::Rc];
    if caps.xrc {
        types.push(QpType::XrcIni);
    }
    for ty in types {
        let limit = caps.max_inline_for(ty);
        let make = |max_inline| {
            p.ctx.create_qp(
                &pd,
                &QpInit {
                    qp_type: ty,
                    send_cq: &cq,
                    recv_cq: Some(&cq),
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: 4,
                        max_recv_wr: if ty == QpType::Rc { 4 } else { 0 },
                        max_send_sge: 1,
                        max_recv_sge: if ty == QpType::Rc { 1 } else { 0 },
                        max_inline,
                    },
                },
            )
        };
        let q = make(limit)?;
        let granted = q.query()?.max_inline;
        ensure!(
            granted >= limit,
            "{ty:?}: asked {limit} inline bytes, the device reports {granted}"
        );
        ensure!(
            make(limit + 1).is_err(),
            "{ty:?}: a QP took more inline than the probed limit {limit}"
        );
    }
    Ok(())
}
