//! Rules of the RDMA CM: private data and its limits, rejects, connecting to
//! nobody, disconnects.

use std::net::SocketAddr;

use xrcbtl_fabric::*;

use super::harness::{Failure, Harness, Need, Outcome};
use super::util::*;
use super::{rule, two, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule("cm_private_data", &[], cm_private_data::<H>),
        rule("cm_private_data_limits", &[], cm_private_data_limits::<H>),
        rule("cm_reject_with_private_data", &[], cm_reject::<H>),
        rule("cm_no_listener", &[], cm_no_listener::<H>),
        rule("cm_disconnect", &[], cm_disconnect::<H>),
        rule("cm_cached_route", &[], cm_cached_route::<H>),
        rule("cm_resolve_never_blocks", &[], cm_resolve_never_blocks::<H>),
        rule("cm_af_ib_by_gid", &[], cm_af_ib::<H>),
        rule(
            "cm_ib_port_space_listens",
            &[Need::IbFamily],
            cm_ib_port_space_listens::<H>,
        ),
    ]
}

fn cm_private_data<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let Dial {
        id: ida,
        listener: _l,
        ep: ea,
        cha,
        chb,
    } = dial(h, &a, &b, &Opts::default())?;
    let eb = Ep::new(&b.ctx, &Opts::default())?;
    let req_data = pattern(1, 40);
    ida.connect(Some(&ea.qp), &ConnParam::with_data(&req_data))?;
    let req = wait_cm(h, &chb, |k| *k == CmEventKind::ConnectRequest)?;
    ensure!(
        req.private_data.starts_with(&req_data),
        "request carried {:?}",
        req.private_data
    );
    let t = h.caps().transport;
    // MPA carries no QP number.
    let want_qpn = t.is_ib_family().then(|| ea.qp.qp_num());
    ensure_eq!(req.remote_qpn, want_qpn);
    if t.is_ib_family() {
        // IB CM messages have fixed-size private data.
        ensure_eq!(
            req.private_data.len(),
            max_private_data(t, PortSpace::Tcp, CmMessage::Request)
        );
    } else {
        ensure_eq!(req.private_data.len(), 40);
    }
    let idb = req.new_id.ok_or_else(|| Failure("no id".into()))?;
    let rep_data = pattern(2, 100);
    idb.accept(Some(&eb.qp), &ConnParam::with_data(&rep_data))?;
    let est = wait_cm(h, &cha, |_| true)?;
    ensure_eq!(est.kind, CmEventKind::Established);
    ensure!(
        est.private_data.starts_with(&rep_data),
        "reply carried {:?}",
        est.private_data
    );
    let est = wait_cm(h, &chb, |_| true)?;
    ensure_eq!(est.kind, CmEventKind::Established);
    Ok(())
}

fn cm_private_data_limits<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let Dial {
        id: ida,
        listener: _l,
        ep: ea,
        cha: _cha,
        chb,
    } = dial(h, &a, &b, &Opts::default())?;
    let max = max_private_data(h.caps().transport, PortSpace::Tcp, CmMessage::Request);
    let too_much = vec![7u8; max + 1];
    match ida.connect(Some(&ea.qp), &ConnParam::with_data(&too_much)) {
        Err(Error::InvalidArgument(_)) => {}
        other => {
            return Err(Failure(format!(
                "{} bytes of request data: {other:?}",
                max + 1
            )))
        }
    }
    // Exactly the limit goes through.
    let exact = vec![7u8; max];
    ida.connect(Some(&ea.qp), &ConnParam::with_data(&exact))?;
    let req = wait_cm(h, &chb, |k| *k == CmEventKind::ConnectRequest)?;
    ensure_eq!(req.private_data, exact);
    Ok(())
}

fn cm_reject<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let Dial {
        id: ida,
        listener: _l,
        ep: ea,
        cha,
        chb,
    } = dial(h, &a, &b, &Opts::default())?;
    ida.connect(Some(&ea.qp), &ConnParam::default())?;
    let req = wait_cm(h, &chb, |k| *k == CmEventKind::ConnectRequest)?;
    let idb = req.new_id.ok_or_else(|| Failure("no id".into()))?;
    idb.reject(b"go away: wrong job")?;
    let e = wait_cm(h, &cha, |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Rejected(RejectReason::Consumer));
    ensure!(
        e.private_data.starts_with(b"go away: wrong job"),
        "{:?}",
        e.private_data
    );
    Ok(())
}

fn cm_no_listener<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    // A port that was listened on and no longer is.
    let Dial {
        id: ida,
        listener,
        ep: ea,
        cha,
        chb: _chb,
    } = dial(h, &a, &b, &Opts::default())?;
    drop(listener);
    ida.connect(Some(&ea.qp), &ConnParam::default())?;
    let e = wait_cm(h, &cha, |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Rejected(RejectReason::NoListener));
    Ok(())
}

fn cm_disconnect<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    ea.id.as_ref().expect("CM endpoint").disconnect()?;
    ensure_eq!(ea.qp.state()?, QpState::Error);
    let e = wait_cm(h, eb.ch.as_ref().expect("CM endpoint"), |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Disconnected);
    let e = wait_cm(h, ea.ch.as_ref().expect("CM endpoint"), |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Disconnected);
    if h.caps().transport == Transport::Iwarp {
        // The peer's QP goes to Error with its connection, which on siw
        // can close after the Disconnected event was delivered.
        wait_qp_state(h, &eb.qp, QpState::Error)?;
    } else {
        ensure_eq!(eb.qp.state()?, QpState::Rts);
    }
    Ok(())
}

fn cm_cached_route<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let d = dial(h, &a, &b, &Opts::default())?;
    let route =
        d.id.route()
            .ok_or_else(|| Failure("no route after RouteResolved".into()))?;
    // A second id to the same device, from the cached route.
    let addr = d
        .listener
        .local_addr()
        .ok_or_else(|| Failure("no address".into()))?;
    let id = d.cha.create_id(PortSpace::Tcp)?;
    id.resolve_cached(addr, &route, 2_000)?;
    ensure_eq!(
        wait_cm(h, &d.cha, |_| true)?.kind,
        CmEventKind::AddrResolved
    );
    id.resolve_route(2_000)?;
    ensure_eq!(
        wait_cm(h, &d.cha, |_| true)?.kind,
        CmEventKind::RouteResolved
    );
    // The same destination; the kernel may fill in the path's link fields
    // again when it is set.
    ensure_eq!(
        id.route().map(|r| (r.dgid, r.dlid)),
        Some((route.dgid, route.dlid))
    );
    let ep = Ep::new(&a.ctx, &Opts::default())?;
    id.connect(Some(&ep.qp), &ConnParam::default())?;
    let req = wait_cm(h, &d.chb, |k| *k == CmEventKind::ConnectRequest)?;
    let child = req.new_id.ok_or_else(|| Failure("no id".into()))?;
    let eb = Ep::new(&b.ctx, &Opts::default())?;
    child.accept(Some(&eb.qp), &ConnParam::default())?;
    ensure_eq!(wait_cm(h, &d.cha, |_| true)?.kind, CmEventKind::Established);
    Ok(())
}

/// Resolving an address nobody answers returns at once, in either port
/// space, and the failure arrives as an event: resolution must never hold
/// up the caller's progress loop (an XRC id made by `rdma_create_ep` on an
/// active address would resolve synchronously and fail in the call).
fn cm_resolve_never_blocks<H: Harness>(h: &H) -> Outcome {
    let (a, _b) = two(h)?;
    let ch = a.ctx.create_cm_channel()?;
    let nobody = match h.addr(&a) {
        std::net::IpAddr::V4(ip) => {
            let [w, x, y, z] = ip.octets();
            std::net::IpAddr::from([w, x, y, if z == 254 { 253 } else { 254 }])
        }
        ip => return Err(Failure(format!("no unused neighbour of {ip} to ask"))),
    };
    let mut spaces = vec![PortSpace::Tcp];
    if h.caps().transport.is_ib_family() {
        spaces.push(PortSpace::Ib);
    }
    for ps in spaces {
        let id = ch.create_id(ps)?;
        id.resolve_addr(SocketAddr::new(nobody, 4791), 300)?;
        let e = wait_cm(h, &ch, |k| {
            matches!(k, CmEventKind::AddrResolved | CmEventKind::AddrError)
        })?;
        ensure_eq!(e.kind, CmEventKind::AddrError, "{ps:?}");
    }
    Ok(())
}

/// Native InfiniBand addressing (`AF_IB`): only on an InfiniBand port
/// (RoCE and iWARP route by IP, and say so). There, a listener bound to the
/// port's GID is reached by GID, in either port space, and not by IP: the
/// CM matches listeners by address family.
fn cm_af_ib<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let cha = a.ctx.create_cm_channel()?;
    let chb = b.ctx.create_cm_channel()?;
    let gid = b.ctx.query_port(1)?.gid;
    let at = IbAddr {
        gid,
        pkey: DEFAULT_PKEY,
        port: 0,
    };
    if h.caps().transport != Transport::Infiniband {
        for ps in [PortSpace::Tcp, PortSpace::Ib] {
            let l = chb.create_id(ps)?;
            ensure!(
                matches!(l.listen_ib(at, 4), Err(Error::Unsupported(_))),
                "{ps:?}: listened by GID on {:?}",
                h.caps().transport
            );
            let id = cha.create_id(ps)?;
            ensure!(
                matches!(id.resolve_ib(at, None, 100), Err(Error::Unsupported(_))),
                "{ps:?}: resolved a GID on {:?}",
                h.caps().transport
            );
        }
        return Ok(());
    }
    let l = chb.create_id(PortSpace::Tcp)?;
    l.listen_ib(at, 4)?;
    let bound = l
        .local_ib_addr()
        .ok_or_else(|| Failure("no AF_IB address".into()))?;
    ensure_eq!((bound.gid, bound.pkey), (gid, DEFAULT_PKEY));
    ensure!(bound.port != 0, "no port picked");
    ensure!(
        l.local_addr().is_none(),
        "an AF_IB listener has an IP address"
    );
    // By IP, the same port number reaches nobody.
    let ip = SocketAddr::new(h.addr(&b), bound.port);
    let by_ip = cha.create_id(PortSpace::Tcp)?;
    by_ip.resolve_addr(ip, 2_000)?;
    ensure_eq!(wait_cm(h, &cha, |_| true)?.kind, CmEventKind::AddrResolved);
    by_ip.resolve_route(2_000)?;
    ensure_eq!(wait_cm(h, &cha, |_| true)?.kind, CmEventKind::RouteResolved);
    let ep0 = Ep::new(&a.ctx, &Opts::default())?;
    by_ip.connect(Some(&ep0.qp), &ConnParam::default())?;
    ensure_eq!(
        wait_cm(h, &cha, |_| true)?.kind,
        CmEventKind::Rejected(RejectReason::NoListener)
    );
    // By GID it connects, and a second id reuses the first one's route.
    let mut route = None;
    for _ in 0..2 {
        let id = cha.create_id(PortSpace::Tcp)?;
        id.resolve_ib(bound, route.as_ref(), 2_000)?;
        ensure_eq!(wait_cm(h, &cha, |_| true)?.kind, CmEventKind::AddrResolved);
        id.resolve_route(2_000)?;
        ensure_eq!(wait_cm(h, &cha, |_| true)?.kind, CmEventKind::RouteResolved);
        route = id.route();
        ensure!(route.is_some_and(|r| r.dgid == gid), "route {route:?}");
        let ea = Ep::new(&a.ctx, &Opts::default())?;
        id.connect(Some(&ea.qp), &ConnParam::default())?;
        let req = wait_cm(h, &chb, |k| *k == CmEventKind::ConnectRequest)?;
        ensure!(req.peer.is_none(), "an AF_IB request has no IP peer");
        let child = req.new_id.ok_or_else(|| Failure("no id".into()))?;
        let eb = Ep::new(&b.ctx, &Opts::default())?;
        child.accept(Some(&eb.qp), &ConnParam::default())?;
        ensure_eq!(wait_cm(h, &cha, |_| true)?.kind, CmEventKind::Established);
        ensure_eq!(wait_cm(h, &chb, |_| true)?.kind, CmEventKind::Established);
        ea.send(0, b"by gid")?;
        check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1000, WcStatus::Success)?;
    }
    Ok(())
}

/// An id of the IB port space (the XRC one) listens at the device's
/// address on a port of its own choosing, and a second id cannot take the
/// same port.
fn cm_ib_port_space_listens<H: Harness>(h: &H) -> Outcome {
    let (_a, b) = two(h)?;
    let ch = b.ctx.create_cm_channel()?;
    let (_l, addr) = listen(h, &b, &ch, PortSpace::Ib)?;
    ensure_eq!(addr.ip(), h.addr(&b));
    ensure!(addr.port() != 0, "no port picked");
    let again = ch.create_id(PortSpace::Ib)?;
    ensure!(again.listen(addr, 4).is_err(), "two listeners on {addr}");
    Ok(())
}
