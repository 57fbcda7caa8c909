//! Rules of XRC: INI QPs reach every SRQ of the target's domain by number;
//! TGT QPs are registered (opened) by the processes that receive through
//! them, outlive their creator, die with their last opener, and report
//! errors to every opener; domains are shared per node through a key.

use std::result::Result;

use xrcbtl_fabric::*;

use super::harness::{Ctx, Failure, Harness, Need, Outcome, Proc};
use super::util::*;
use super::{rule, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule(
            "xrc_ini_reaches_any_srq_of_domain",
            &[Need::Xrc],
            xrc_ini_reaches_any_srq::<H>,
        ),
        rule(
            "xrc_unknown_srqn_fails",
            &[Need::Xrc],
            xrc_unknown_srqn_fails::<H>,
        ),
        rule(
            "xrc_tgt_outlives_creator",
            &[Need::Xrc],
            xrc_tgt_outlives_creator::<H>,
        ),
        rule(
            "xrc_tgt_dies_with_last_opener",
            &[Need::Xrc],
            xrc_tgt_dies_with_last_opener::<H>,
        ),
        rule(
            "xrc_exit_closes_tgt_handles",
            &[Need::Xrc, Need::Introspection],
            xrc_exit_closes_handles::<H>,
        ),
        rule(
            "xrc_crash_closes_tgt_handles",
            &[Need::Xrc, Need::Crash, Need::Introspection],
            xrc_crash_closes_handles::<H>,
        ),
        rule(
            "xrc_tgt_error_reaches_every_opener",
            &[Need::Xrc, Need::Faults],
            xrc_tgt_events_reach_all::<H>,
        ),
        rule(
            "xrc_open_gone_or_foreign_tgt_fails",
            &[Need::Xrc],
            xrc_open_gone_fails::<H>,
        ),
        rule(
            "xrc_domain_shared_by_key_per_node",
            &[Need::Xrc],
            xrc_domain_per_node::<H>,
        ),
        rule(
            "no_xrc_is_unsupported",
            &[Need::NoXrc],
            no_xrc_unsupported::<H>,
        ),
    ]
}

/// A receiving rank: an XRC SRQ in the node's shared domain, with receives
/// posted, and perhaps a handle on a TGT QP.
struct Rank<C: Context> {
    tgt: Option<C::Qp>,
    id: Option<CmIdOf<C>>,
    ch: C::CmChannel,
    srq: C::Srq,
    rbuf: DmaBuf<C>,
    cq: C::Cq,
    xrcd: C::Xrcd,
    pd: C::Pd,
    ctx: C,
}

impl<C: Context> Rank<C> {
    fn new(ctx: &C, key: &XrcdKey) -> Result<Self, Failure> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(256)?;
        let xrcd = ctx.open_xrcd(key)?;
        let srq = ctx.create_xrc_srq(
            &pd,
            &xrcd,
            &cq,
            SrqAttr {
                max_wr: 64,
                max_sge: 1,
                srq_limit: 0,
            },
        )?;
        let rbuf = DmaBuf::new(
            ctx,
            &pd,
            16 * 1024,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        for i in 0..16u32 {
            let sge = [rbuf.sge(i as usize * 1024, 1024)];
            srq.post_recv(&RecvWr {
                wr_id: u64::from(i),
                sgl: &sge,
            })?;
        }
        Ok(Rank {
            tgt: None,
            id: None,
            ch: ctx.create_cm_channel()?,
            srq,
            rbuf,
            cq,
            xrcd,
            pd,
            ctx: ctx.clone(),
        })
    }

    fn srqn(&self) -> u32 {
        self.srq.srq_num().expect("an XRC SRQ has a number")
    }

    /// Registers with a TGT QP: opens it by number.
    fn open(&mut self, qpn: u32) -> Result<(), Failure> {
        self.tgt = Some(self.ctx.open_tgt_qp(&self.xrcd, qpn)?);
        Ok(())
    }
}

/// A sending process's XRC INI QP.
struct Ini<C: Context> {
    qp: C::Qp,
    id: CmIdOf<C>,
    ch: C::CmChannel,
    sbuf: DmaBuf<C>,
    cq: C::Cq,
    pd: C::Pd,
}

impl<C: Context> Ini<C> {
    fn send(&self, wr_id: u64, srqn: u32, data: &[u8]) -> Result<(), Failure> {
        self.sbuf.write(0, data);
        let sge = [self.sbuf.sge(0, data.len() as u32)];
        self.qp.post_send(&SendWr::send(wr_id, &sge).to_srq(srqn))?;
        Ok(())
    }
}

/// Connects `s`'s new INI QP to a TGT QP that `r` creates on the request.
fn xrc_connect<H: Harness>(
    h: &H,
    s: &Proc<H::F>,
    rp: &Proc<H::F>,
    r: &mut Rank<Ctx<H>>,
) -> Result<Ini<Ctx<H>>, Failure> {
    let pd = s.ctx.alloc_pd()?;
    let cq = s.ctx.create_cq(256)?;
    let qp = s.ctx.create_qp(
        &pd,
        &QpInit {
            qp_type: QpType::XrcIni,
            send_cq: &cq,
            recv_cq: None,
            srq: None,
            caps: QpCaps {
                max_send_wr: 32,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline: 0,
            },
        },
    )?;
    let sbuf = DmaBuf::new(&s.ctx, &pd, 4096, Access::LOCAL_WRITE)?;
    let ch = s.ctx.create_cm_channel()?;
    let (l, addr) = listen(h, rp, &r.ch, PortSpace::Ib)?;
    let id = resolve(h, &ch, PortSpace::Ib, addr)?;
    id.connect(Some(&qp), &ConnParam::default())?;
    let req = wait_cm(h, &r.ch, |k| *k == CmEventKind::ConnectRequest)?;
    let rid = req.new_id.ok_or_else(|| Failure("no id".into()))?;
    let tgt = r.ctx.create_tgt_qp(&r.xrcd)?;
    rid.accept(Some(&tgt), &ConnParam::default())?;
    ensure_eq!(wait_cm(h, &ch, |_| true)?.kind, CmEventKind::Established);
    ensure_eq!(wait_cm(h, &r.ch, |_| true)?.kind, CmEventKind::Established);
    drop(l);
    r.tgt = Some(tgt);
    r.id = Some(rid);
    Ok(Ini {
        qp,
        id,
        ch,
        sbuf,
        cq,
        pd,
    })
}

fn recv_node<H: Harness>(h: &H) -> usize {
    if h.nodes() > 1 {
        1
    } else {
        0
    }
}

/// Sends `data` to `r` and checks it arrives through TGT QP `tgt_qpn`.
fn deliver<H: Harness>(
    h: &H,
    s: &Ini<Ctx<H>>,
    r: &Rank<Ctx<H>>,
    tgt_qpn: u32,
    wr_id: u64,
    data: &[u8],
) -> Outcome {
    s.send(wr_id, r.srqn(), data)?;
    check_wc(&wait_cq(h, &s.cq, 1)?[0], wr_id, WcStatus::Success)?;
    let wc = wait_cq(h, &r.cq, 1)?[0];
    ensure_eq!(wc.status, WcStatus::Success);
    ensure_eq!(wc.qp_num, tgt_qpn);
    ensure_eq!(wc.byte_len as usize, data.len());
    ensure_eq!(
        r.rbuf.read(wc.wr_id as usize * 1024, data.len()),
        data.to_vec()
    );
    Ok(())
}

fn xrc_ini_reaches_any_srq<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("any-srq");
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(recv_node(h)).map_err(Failure)?;
    let p2 = h.spawn(recv_node(h)).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let r2 = Rank::new(&p2.ctx, &key)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    // One INI QP, one TGT QP, two ranks' SRQs.
    deliver(h, &ini, &r1, tgt, 1, b"to rank one")?;
    deliver(h, &ini, &r2, tgt, 2, b"to rank two")?;
    deliver(h, &ini, &r1, tgt, 3, b"and back to one")?;
    Ok(())
}

fn xrc_unknown_srqn_fails<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("unknown-srqn");
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(recv_node(h)).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let bogus = r1.srqn() ^ 0x5a5a5;
    ini.send(1, bogus, b"nobody")?;
    check_wc(
        &wait_cq(h, &ini.cq, 1)?[0],
        1,
        WcStatus::RemoteInvalidRequest,
    )?;
    ensure_eq!(ini.qp.state()?, QpState::Error);
    Ok(())
}

fn xrc_tgt_outlives_creator<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("outlives");
    let node = recv_node(h);
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(node).map_err(Failure)?;
    let p2 = h.spawn(node).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let mut r2 = Rank::new(&p2.ctx, &key)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    r2.open(tgt)?;
    deliver(h, &ini, &r2, tgt, 1, b"before")?;
    // The creator exits; the opener keeps the TGT QP, traffic goes on.
    drop(r1);
    h.exit(p1);
    if h.gap(Need::Introspection).is_none() {
        let tgts = h.tgt_qps(node).map_err(Failure)?;
        ensure_eq!(
            tgts.iter()
                .map(|t| (t.qpn, t.open_count))
                .collect::<Vec<_>>(),
            vec![(tgt, 1)]
        );
    }
    deliver(h, &ini, &r2, tgt, 2, b"after the creator left")?;
    Ok(())
}

fn xrc_tgt_dies_with_last_opener<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("last-opener");
    let node = recv_node(h);
    let count = |n: usize| -> Result<(), Failure> {
        if h.gap(Need::Introspection).is_none() {
            let tgts = h.tgt_qps(node).map_err(Failure)?;
            let open: usize = tgts.iter().map(|t| t.open_count).sum();
            ensure_eq!(open, n);
            ensure_eq!(tgts.len(), usize::from(n > 0));
        }
        Ok(())
    };
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(node).map_err(Failure)?;
    let p2 = h.spawn(node).map_err(Failure)?;
    let p3 = h.spawn(node).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let mut r2 = Rank::new(&p2.ctx, &key)?;
    let mut r3 = Rank::new(&p3.ctx, &key)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    count(1)?;
    r2.open(tgt)?;
    r3.open(tgt)?;
    count(3)?;
    r3.tgt = None;
    count(2)?;
    drop(r1);
    h.exit(p1);
    count(1)?;
    // Still alive: another rank can register with it.
    r3.open(tgt)?;
    r3.tgt = None;
    deliver(h, &ini, &r2, tgt, 1, b"still here")?;
    // The last opener lets go: the QP is gone and cannot be opened.
    r2.tgt = None;
    count(0)?;
    match r3.ctx.open_tgt_qp(&r3.xrcd, tgt) {
        Err(Error::NotFound(_)) => {}
        Err(e) => {
            return Err(Failure(format!(
                "opening a destroyed TGT QP: {e:?}, expected NotFound"
            )))
        }
        Ok(_) => return Err(Failure("a destroyed TGT QP could be opened".into())),
    }
    // The sender finds out: nothing answers at that QP number.
    ini.send(2, r2.srqn(), b"gone")?;
    check_wc(&wait_cq(h, &ini.cq, 1)?[0], 2, WcStatus::RetryExceeded)?;
    Ok(())
}

fn xrc_exit_case<H: Harness>(h: &H, crash: bool) -> Outcome {
    let key = h.xrcd_key("exit");
    let node = recv_node(h);
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(node).map_err(Failure)?;
    let p2 = h.spawn(node).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let mut r2 = Rank::new(&p2.ctx, &key)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    r2.open(tgt)?;
    ensure_eq!(h.tgt_qps(node).map_err(Failure)?[0].open_count, 2);
    // r2 leaves while its handles are still held: the exit itself must
    // release them.
    ensure_eq!(h.process_view(&p2).map_err(Failure)?.tgt_handles, 1);
    if crash {
        h.crash(&p2).map_err(Failure)?;
        let v = h.process_view(&p2).map_err(Failure)?;
        ensure!(!v.alive, "crashed process still alive");
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
    } else {
        h.exit(p2);
    }
    ensure_eq!(h.tgt_qps(node).map_err(Failure)?[0].open_count, 1);
    deliver(h, &ini, &r1, tgt, 1, b"survivor")?;
    // r2's handles are dead, dropping them later changes nothing.
    drop(r2);
    ensure_eq!(h.tgt_qps(node).map_err(Failure)?[0].open_count, 1);
    // The creator goes too: nothing is left on the node.
    ensure_eq!(h.process_view(&p1).map_err(Failure)?.tgt_handles, 1);
    if crash {
        h.crash(&p1).map_err(Failure)?;
    } else {
        h.exit(p1);
    }
    ensure!(
        h.tgt_qps(node).map_err(Failure)?.is_empty(),
        "TGT QP left behind"
    );
    drop(r1);
    Ok(())
}

fn xrc_exit_closes_handles<H: Harness>(h: &H) -> Outcome {
    xrc_exit_case(h, false)
}

fn xrc_crash_closes_handles<H: Harness>(h: &H) -> Outcome {
    xrc_exit_case(h, true)
}

fn xrc_tgt_events_reach_all<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("events");
    let node = recv_node(h);
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(node).map_err(Failure)?;
    let p2 = h.spawn(node).map_err(Failure)?;
    let p3 = h.spawn(node).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let mut r2 = Rank::new(&p2.ctx, &key)?;
    let mut r3 = Rank::new(&p3.ctx, &key)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    r2.open(tgt)?;
    r3.open(tgt)?;
    h.force_qp_error(node, tgt).map_err(Failure)?;
    for (i, p) in [&p1, &p2, &p3].into_iter().enumerate() {
        let seen = wait_async(h, &p.ctx, |e| *e == AsyncEvent::QpFatal { qpn: tgt })
            .map_err(|f| Failure(format!("opener {}: {}", i + 1, f.0)))?;
        ensure!(
            seen.len() == 1,
            "opener {}: unexpected events before: {seen:?}",
            i + 1
        );
    }
    // Every opener unregisters on the error; the QP goes with the last.
    for r in [&mut r1, &mut r2, &mut r3] {
        r.tgt = None;
    }
    if h.gap(Need::Introspection).is_none() {
        ensure!(
            h.tgt_qps(node).map_err(Failure)?.is_empty(),
            "TGT QP left behind"
        );
    }
    ini.send(1, r2.srqn(), b"into the void")?;
    check_wc(&wait_cq(h, &ini.cq, 1)?[0], 1, WcStatus::RetryExceeded)?;
    Ok(())
}

fn xrc_open_gone_fails<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("gone");
    let other = h.xrcd_key("gone-other");
    let node = recv_node(h);
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(node).map_err(Failure)?;
    let p2 = h.spawn(node).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let r2 = Rank::new(&p2.ctx, &other)?;
    let _ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    // A number nobody created.
    ensure!(
        r1.ctx.open_tgt_qp(&r1.xrcd, tgt ^ 0x1234).is_err(),
        "opened a TGT QP that never existed"
    );
    // A TGT QP of another domain.
    ensure!(
        r2.ctx.open_tgt_qp(&r2.xrcd, tgt).is_err(),
        "opened a TGT QP of another domain"
    );
    // A TGT QP that died with its only holder.
    r1.tgt = None;
    ensure!(
        r1.ctx.open_tgt_qp(&r1.xrcd, tgt).is_err(),
        "opened a destroyed TGT QP"
    );
    Ok(())
}

fn xrc_domain_per_node<H: Harness>(h: &H) -> Outcome {
    let key = h.xrcd_key("domain");
    let other = h.xrcd_key("domain-other");
    let node = recv_node(h);
    let s = h.spawn(0).map_err(Failure)?;
    let p1 = h.spawn(node).map_err(Failure)?;
    let p2 = h.spawn(node).map_err(Failure)?;
    let mut r1 = Rank::new(&p1.ctx, &key)?;
    let r2 = Rank::new(&p2.ctx, &other)?;
    let ini = xrc_connect(h, &s, &p1, &mut r1)?;
    let tgt = r1.tgt.as_ref().expect("connected").qp_num();
    if node != 0 {
        // The same key on another node is another domain.
        let elsewhere = Rank::new(&s.ctx, &key)?;
        ensure!(
            elsewhere.ctx.open_tgt_qp(&elsewhere.xrcd, tgt).is_err(),
            "a TGT QP was opened from another node's domain"
        );
        if h.gap(Need::Introspection).is_none() {
            ensure_eq!(h.node_view(0).map_err(Failure)?.xrcds, 1);
            ensure_eq!(h.node_view(node).map_err(Failure)?.xrcds, 2);
        }
    }
    // An SRQ of another domain is not reachable through this TGT QP.
    ini.send(1, r2.srqn(), b"wrong domain")?;
    check_wc(
        &wait_cq(h, &ini.cq, 1)?[0],
        1,
        WcStatus::RemoteInvalidRequest,
    )?;
    Ok(())
}

fn no_xrc_unsupported<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    ensure!(!p.ctx.caps().xrc, "caps report XRC");
    match p.ctx.open_xrcd(&h.xrcd_key("none")) {
        Err(Error::Unsupported(_)) => {}
        other => {
            return Err(Failure(format!(
                "open_xrcd without XRC: {:?}",
                other.map(|_| ())
            )))
        }
    }
    let pd = p.ctx.alloc_pd()?;
    let cq = p.ctx.create_cq(16)?;
    let ini = p.ctx.create_qp(
        &pd,
        &QpInit {
            qp_type: QpType::XrcIni,
            send_cq: &cq,
            recv_cq: None,
            srq: None,
            caps: QpCaps::default(),
        },
    );
    match ini {
        Err(Error::Unsupported(_)) => Ok(()),
        other => Err(Failure(format!(
            "XRC INI QP without XRC: {:?}",
            other.map(|_| ())
        ))),
    }
}
