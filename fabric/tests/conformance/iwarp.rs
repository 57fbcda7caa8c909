//! Rules of iWARP: no XRC, MPA's initiator-speaks-first ordering, and no RNR
//! (a send without a receive posted terminates the connection).

use xrcbtl_fabric::*;

use super::harness::{Failure, Harness, Need, Outcome};
use super::util::*;
use super::{rule, two, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule("iwarp_caps_have_no_xrc", &[Need::Iwarp], iwarp_caps::<H>),
        rule(
            "iwarp_initiator_speaks_first",
            &[Need::Iwarp],
            iwarp_initiator_first::<H>,
        ),
        rule(
            "iwarp_responder_first_tears_down",
            &[Need::Iwarp, Need::P2pEnforced],
            iwarp_responder_first::<H>,
        ),
        rule(
            "iwarp_send_without_receive_terminates",
            &[Need::Iwarp],
            iwarp_no_rnr::<H>,
        ),
    ]
}

fn iwarp_caps<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let caps = p.ctx.caps();
    ensure_eq!(caps.transport, Transport::Iwarp);
    ensure!(!caps.xrc, "an iWARP device reports XRC");
    match p.ctx.open_xrcd(&h.xrcd_key("iwarp")) {
        Err(Error::Unsupported(_)) => Ok(()),
        other => Err(Failure(format!(
            "open_xrcd on iWARP: {:?}",
            other.map(|_| ())
        ))),
    }
}

fn iwarp_initiator_first<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    // The initiator's zero-length send opens the stream for the responder.
    ea.send(0, &[])?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::Success)?;
    let wc = wait_cq(h, &eb.cq, 1)?[0];
    check_wc(&wc, 1000, WcStatus::Success)?;
    ensure_eq!(wc.byte_len, 0);
    eb.send(1, b"now I may speak")?;
    check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1, WcStatus::Success)?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 1000, WcStatus::Success)?;
    ensure_eq!(ea.rbuf.read(0, 15), b"now I may speak".to_vec());
    Ok(())
}

fn iwarp_responder_first<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    eb.send(1, b"too early")?;
    let wc = wait_cq(h, &eb.cq, 1)?[0];
    ensure!(
        wc.wr_id == 1 && wc.status != WcStatus::Success,
        "early send completed: {wc:?}"
    );
    ensure_eq!(eb.qp.state()?, QpState::Error);
    ensure_eq!(ea.qp.state()?, QpState::Error);
    for (side, ch) in [("initiator", &ea.ch), ("responder", &eb.ch)] {
        let e = wait_cm(h, ch.as_ref().expect("CM endpoint"), |_| true)
            .map_err(|f| Failure(format!("{side}: {}", f.0)))?;
        ensure!(e.kind == CmEventKind::Disconnected, "{side}: {:?}", e.kind);
    }
    Ok(())
}

fn iwarp_no_rnr<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let ob = Opts {
        recvs: 0,
        ..Opts::default()
    };
    let (ea, _eb) = connect_rc(h, &a, &b, &Opts::default(), &ob)?;
    // The send completes once sent (RDMAP acknowledges nothing); the peer
    // finds no buffer and terminates the connection.
    ea.send(0, b"no buffer")?;
    wait_qp_error(h, &ea.cq, &ea.qp)?;
    Ok(())
}
