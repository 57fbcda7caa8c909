//! Rules of XRC: INI QPs reach every SRQ of the target's domain by number;
//! TGT QPs are registered (opened) by the processes that receive through
//! them, outlive their creator, die with their last opener, and report
//! errors to every opener; domains are shared per node through a key.

use std::result::Result;
use std::time::Duration;

use xrcbtl_fabric::sim::{CmAction, CmFault, CmMsgKind};
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
            "xrc_rdma_and_atomics_in_the_srq_pd",
            &[Need::Xrc, Need::Atomics],
            xrc_rdma_in_srq_pd::<H>,
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
            "xrc_lost_rtu_comm_est",
            &[Need::Xrc, Need::Faults],
            xrc_lost_rtu_comm_est::<H>,
        ),
        rule(
            "xrc_tgt_error_by_hand_is_silent",
            &[Need::Xrc],
            xrc_tgt_error_by_hand_is_silent::<H>,
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
    let qp = ini_qp(&s.ctx, &pd, &cq, 32)?;
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

/// A sender on node 0 whose one INI QP is connected to a TGT QP created by
/// rank 0 of the receiving node; rank `i` uses the domain `keys[i]`.
struct Scene<H: Harness> {
    ini: Ini<Ctx<H>>,
    ranks: Vec<Option<Rank<Ctx<H>>>>,
    procs: Vec<Option<Proc<H::F>>>,
    sender: Proc<H::F>,
    tgt: u32,
    node: usize,
}

impl<H: Harness> Scene<H> {
    fn new(h: &H, keys: &[&str]) -> Result<Self, Failure> {
        let node = recv_node(h);
        let sender = h.spawn(0).map_err(Failure)?;
        let mut procs = Vec::new();
        let mut ranks = Vec::new();
        for k in keys {
            let p = h.spawn(node).map_err(Failure)?;
            ranks.push(Some(Rank::new(&p.ctx, &h.xrcd_key(k))?));
            procs.push(Some(p));
        }
        let creator = ranks[0].as_mut().expect("just made");
        let ini = xrc_connect(h, &sender, procs[0].as_ref().expect("just made"), creator)?;
        let tgt = creator.tgt.as_ref().expect("connected").qp_num();
        Ok(Scene {
            ini,
            ranks,
            procs,
            sender,
            tgt,
            node,
        })
    }

    fn rank(&mut self, i: usize) -> &mut Rank<Ctx<H>> {
        self.ranks[i].as_mut().expect("rank still running")
    }

    fn proc(&self, i: usize) -> &Proc<H::F> {
        self.procs[i].as_ref().expect("rank still running")
    }

    /// Rank `i` drops its objects and exits.
    fn exit(&mut self, h: &H, i: usize) {
        self.ranks[i] = None;
        h.exit(self.procs[i].take().expect("rank still running"));
    }

    /// Sends to rank `i` and checks the message arrives through the TGT QP.
    fn deliver(&mut self, h: &H, i: usize, wr_id: u64, data: &[u8]) -> Outcome {
        let tgt = self.tgt;
        let r = self.ranks[i].as_ref().expect("rank still running");
        deliver(h, &self.ini, r, tgt, wr_id, data)
    }

    /// Sends to SRQ `srqn` and expects the send to fail with `status`.
    fn send_fails(&self, h: &H, srqn: u32, status: WcStatus) -> Outcome {
        self.ini.send(9, srqn, b"doomed")?;
        check_wc(&wait_cq(h, &self.ini.cq, 1)?[0], 9, status)
    }

    /// Total open handles on the node's TGT QPs, and how many TGT QPs live
    /// (checked only where the provider can look).
    fn expect_open(&self, h: &H, handles: usize) -> Outcome {
        if h.gap(Need::Introspection).is_none() {
            let tgts = h.tgt_qps(self.node).map_err(Failure)?;
            let open: usize = tgts.iter().map(|t| t.open_count).sum();
            ensure_eq!(open, handles);
            ensure_eq!(tgts.len(), usize::from(handles > 0));
        }
        Ok(())
    }
}

fn xrc_ini_reaches_any_srq<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a"])?;
    // One INI QP, one TGT QP, two ranks' SRQs.
    sc.deliver(h, 0, 1, b"to rank one")?;
    sc.deliver(h, 1, 2, b"to rank two")?;
    sc.deliver(h, 0, 3, b"and back to one")
}

/// One-sided operations through an INI QP reach memory in the protection
/// domain of the SRQ they name, and only there.
fn xrc_rdma_in_srq_pd<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a"])?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let r1 = sc.rank(1);
    let mem = DmaBuf::new(&r1.ctx, &r1.pd, 4096, access)?;
    mem.write(64, &7u64.to_le_bytes());
    let (srqn0, srqn1) = (sc.rank(0).srqn(), sc.rank(1).srqn());
    let post = |wr_id: u64, op: SendOp, srqn: u32| -> Outcome {
        let sge = [sc.ini.sbuf.sge(0, 8)];
        sc.ini
            .qp
            .post_send(&SendWr::new(wr_id, op, Payload::Sgl(&sge)).to_srq(srqn))?;
        Ok(())
    };
    post(1, SendOp::Read(mem.remote(64)), srqn1)?;
    check_wc(&wait_cq(h, &sc.ini.cq, 1)?[0], 1, WcStatus::Success)?;
    ensure_eq!(sc.ini.sbuf.read(0, 8), 7u64.to_le_bytes().to_vec());
    let add = SendOp::FetchAdd {
        remote: mem.remote(64),
        add: 3,
    };
    post(2, add, srqn1)?;
    let wc = wait_cq(h, &sc.ini.cq, 1)?[0];
    check_wc(&wc, 2, WcStatus::Success)?;
    ensure_eq!(wc.opcode, WcOpcode::FetchAdd);
    ensure_eq!(mem.read(64, 8), 10u64.to_le_bytes().to_vec());
    // Rank 0's SRQ lives in another PD: its rkeys do not reach rank 1's
    // memory.
    post(3, add, srqn0)?;
    check_wc(&wait_cq(h, &sc.ini.cq, 1)?[0], 3, WcStatus::RemoteAccess)?;
    ensure_eq!(mem.read(64, 8), 10u64.to_le_bytes().to_vec());
    Ok(())
}

fn xrc_unknown_srqn_fails<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a"])?;
    let bogus = sc.rank(0).srqn() ^ 0x5a5a5;
    sc.send_fails(h, bogus, WcStatus::RemoteInvalidRequest)?;
    ensure_eq!(sc.ini.qp.state()?, QpState::Error);
    Ok(())
}

fn xrc_tgt_outlives_creator<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a"])?;
    let tgt = sc.tgt;
    sc.rank(1).open(tgt)?;
    sc.deliver(h, 1, 1, b"before")?;
    // The creator exits; the opener keeps the TGT QP, traffic goes on.
    sc.exit(h, 0);
    sc.expect_open(h, 1)?;
    sc.deliver(h, 1, 2, b"after the creator left")
}

fn xrc_tgt_dies_with_last_opener<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a", "a"])?;
    let tgt = sc.tgt;
    sc.expect_open(h, 1)?;
    sc.rank(1).open(tgt)?;
    sc.rank(2).open(tgt)?;
    sc.expect_open(h, 3)?;
    sc.rank(2).tgt = None;
    sc.expect_open(h, 2)?;
    sc.exit(h, 0);
    sc.expect_open(h, 1)?;
    // Still alive: another rank can register with it.
    sc.rank(2).open(tgt)?;
    sc.rank(2).tgt = None;
    sc.deliver(h, 1, 1, b"still here")?;
    // The last opener lets go: the QP is gone and cannot be opened.
    sc.rank(1).tgt = None;
    sc.expect_open(h, 0)?;
    let r = sc.rank(2);
    match r.ctx.open_tgt_qp(&r.xrcd, tgt) {
        Err(Error::NotFound(_)) => {}
        Err(e) => return Err(Failure(format!("opening a destroyed TGT QP: {e:?}"))),
        Ok(_) => return Err(Failure("a destroyed TGT QP could be opened".into())),
    }
    // The sender finds out: nothing answers at that QP number.
    let srqn = sc.rank(1).srqn();
    sc.send_fails(h, srqn, WcStatus::RetryExceeded)
}

/// A rank exits (or crashes) while still holding its objects: the exit
/// itself must release its TGT QP handle. Needs introspection, so it runs
/// where a process can be ended under its handles (the simulator).
fn xrc_exit_case<H: Harness>(h: &H, crash: bool) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a"])?;
    let tgt = sc.tgt;
    sc.rank(1).open(tgt)?;
    sc.expect_open(h, 2)?;
    ensure_eq!(h.process_view(sc.proc(1)).map_err(Failure)?.tgt_handles, 1);
    if crash {
        h.crash(sc.proc(1)).map_err(Failure)?;
        let v = h.process_view(sc.proc(1)).map_err(Failure)?;
        ensure!(!v.alive, "crashed process still alive");
        let held = (
            v.qps,
            v.tgt_handles,
            v.mrs,
            v.srqs,
            v.cqs,
            v.pds,
            v.xrcds,
            v.cm_ids,
        );
        ensure_eq!(held, (0, 0, 0, 0, 0, 0, 0, 0));
    } else {
        h.exit(sc.procs[1].take().expect("running"));
    }
    sc.expect_open(h, 1)?;
    sc.deliver(h, 0, 1, b"survivor")?;
    // The dead rank's handles are dead: dropping them changes nothing.
    sc.ranks[1] = None;
    sc.expect_open(h, 1)?;
    // The creator goes the same way: nothing is left on the node.
    if crash {
        h.crash(sc.proc(0)).map_err(Failure)?;
    } else {
        h.exit(sc.procs[0].take().expect("running"));
    }
    sc.expect_open(h, 0)
}

fn xrc_exit_closes_handles<H: Harness>(h: &H) -> Outcome {
    xrc_exit_case(h, false)
}

fn xrc_crash_closes_handles<H: Harness>(h: &H) -> Outcome {
    xrc_exit_case(h, true)
}

fn xrc_tgt_events_reach_all<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a", "a"])?;
    let tgt = sc.tgt;
    sc.rank(1).open(tgt)?;
    sc.rank(2).open(tgt)?;
    h.force_qp_error(sc.node, tgt).map_err(Failure)?;
    for i in 0..3 {
        let seen = wait_async(h, &sc.proc(i).ctx, |e| {
            *e == AsyncEvent::QpFatal { qpn: tgt }
        })
        .map_err(|f| Failure(format!("opener {i}: {}", f.0)))?;
        ensure!(
            seen.len() == 1,
            "opener {i}: unexpected events before: {seen:?}"
        );
    }
    // Every opener unregisters on the error; the QP goes with the last.
    for i in 0..3 {
        sc.rank(i).tgt = None;
    }
    sc.expect_open(h, 0)?;
    let srqn = sc.rank(1).srqn();
    sc.send_fails(h, srqn, WcStatus::RetryExceeded)
}

/// Every RTU is lost: the TGT QP (in RTR, where a responder that never
/// heard the RTU stays) still receives the first message and reports it
/// (COMM_EST) to its openers; handed to the CM, that establishes the
/// connection the RTU never confirmed.
fn xrc_lost_rtu_comm_est<H: Harness>(h: &H) -> Outcome {
    let s = h.spawn(0).map_err(Failure)?;
    let rp = h.spawn(recv_node(h)).map_err(Failure)?;
    let mut r = Rank::new(&rp.ctx, &h.xrcd_key("rtu"))?;
    h.cm_fault(CmFault::new(Some(CmMsgKind::Rtu), CmAction::Drop))
        .map_err(Failure)?;
    let pd = s.ctx.alloc_pd()?;
    let cq = s.ctx.create_cq(256)?;
    let qp = ini_qp(&s.ctx, &pd, &cq, 32)?;
    let sbuf = DmaBuf::new(&s.ctx, &pd, 4096, Access::LOCAL_WRITE)?;
    let ch = s.ctx.create_cm_channel()?;
    let (_l, addr) = listen(h, &rp, &r.ch, PortSpace::Ib)?;
    let id = resolve(h, &ch, PortSpace::Ib, addr)?;
    id.connect(Some(&qp), &ConnParam::default())?;
    let req = wait_cm(h, &r.ch, |k| *k == CmEventKind::ConnectRequest)?;
    let rid = req.new_id.ok_or_else(|| Failure("no id".into()))?;
    let tgt = r.ctx.create_tgt_qp(&r.xrcd)?;
    rid.accept(Some(&tgt), &ConnParam::default())?;
    ensure_eq!(wait_cm(h, &ch, |_| true)?.kind, CmEventKind::Established);
    ensure!(r.ch.poll_event().is_none(), "established without an RTU");
    let ini = Ini {
        qp,
        id,
        ch,
        sbuf,
        cq,
        pd,
    };
    ini.send(1, r.srqn(), b"first")?;
    ensure_eq!(wait_cq(h, &r.cq, 1)?[0].status, WcStatus::Success);
    let qpn = tgt.qp_num();
    wait_async(h, &r.ctx, |e| *e == AsyncEvent::CommEstablished { qpn })?;
    rid.notify_established()?;
    ensure_eq!(wait_cm(h, &r.ch, |_| true)?.kind, CmEventKind::Established);
    // Said again, it changes nothing.
    rid.notify_established()?;
    ensure!(r.ch.poll_event().is_none(), "established twice");
    r.tgt = Some(tgt);
    r.id = Some(rid);
    Ok(())
}

/// One opener moves the shared TGT QP to the error state by hand: the verbs
/// promise the other openers no event for that (a device may raise
/// LAST_WQE_REACHED, none has to), so they can only learn it by asking the
/// QP's state. The simulator models the device that stays silent.
fn xrc_tgt_error_by_hand_is_silent<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "a", "a"])?;
    let tgt = sc.tgt;
    sc.rank(1).open(tgt)?;
    sc.rank(2).open(tgt)?;
    let q = sc.rank(0).tgt.as_ref().expect("the creator holds it");
    q.modify(&QpTransition::Error)?;
    h.settle(Duration::from_millis(100));
    for i in 1..3 {
        let mut seen = Vec::new();
        while let Some(e) = sc.proc(i).ctx.poll_async_event() {
            seen.push(e);
        }
        ensure!(seen.is_empty(), "opener {i} heard {seen:?}");
        let held = sc.rank(i).tgt.as_ref().expect("opened");
        ensure_eq!(held.state()?, QpState::Error, "opener {i} asks");
    }
    Ok(())
}

fn xrc_open_gone_fails<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "b"])?;
    let tgt = sc.tgt;
    let r0 = sc.rank(0);
    ensure!(
        r0.ctx.open_tgt_qp(&r0.xrcd, tgt ^ 0x1234).is_err(),
        "opened a TGT QP that never existed"
    );
    let r1 = sc.rank(1);
    ensure!(
        r1.ctx.open_tgt_qp(&r1.xrcd, tgt).is_err(),
        "opened a TGT QP of another domain"
    );
    // A TGT QP that died with its only holder.
    let r0 = sc.rank(0);
    r0.tgt = None;
    ensure!(
        r0.ctx.open_tgt_qp(&r0.xrcd, tgt).is_err(),
        "opened a destroyed TGT QP"
    );
    Ok(())
}

fn xrc_domain_per_node<H: Harness>(h: &H) -> Outcome {
    let mut sc = Scene::new(h, &["a", "b"])?;
    if sc.node != 0 {
        // The same key on another node is another domain.
        let elsewhere = Rank::new(&sc.sender.ctx, &h.xrcd_key("a"))?;
        ensure!(
            elsewhere.ctx.open_tgt_qp(&elsewhere.xrcd, sc.tgt).is_err(),
            "a TGT QP was opened from another node's domain"
        );
        if h.gap(Need::Introspection).is_none() {
            ensure_eq!(h.node_view(0).map_err(Failure)?.xrcds, 1);
            ensure_eq!(h.node_view(sc.node).map_err(Failure)?.xrcds, 2);
        }
    }
    // An SRQ of another domain is not reachable through this TGT QP.
    let other = sc.rank(1).srqn();
    sc.send_fails(h, other, WcStatus::RemoteInvalidRequest)
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
