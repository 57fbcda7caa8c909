//! Building blocks of the rules: waiting on queues in the provider's time,
//! and setting up connected endpoints through the RDMA CM or by hand.

use std::net::SocketAddr;
use std::time::Duration;

use std::result::Result;

use xrcbtl_fabric::*;

use super::harness::{Failure, Harness, Proc};
use crate::{ensure, ensure_eq};

/// The longest local ACK timeout the CM hands a QP whose application sets
/// none: the path's packet lifetime plus one, and InfiniBand subnet
/// managers' default lifetime is 18.
const CM_ACK_TIMEOUT_WORST: u8 = 19;

/// How long a rule waits for something that must happen: the longest a
/// failure can take to show with the timers the rules' QPs may run with,
/// which is a requester giving up on a silent peer after the CM's worst
/// ACK timeout and 7 retries (17.2 s), or an RNR sender after the CM's RNR
/// timer (0: 655 ms) and 7 retries (5.2 s), with a margin for the
/// provider's own slowness. (Simulated time costs nothing; on a real
/// device, only a rule that fails waits this long.)
pub fn patience() -> Duration {
    let transport = failure_detection_time(CM_ACK_TIMEOUT_WORST, 7).expect("a finite timeout");
    let rnr = rnr_timer_duration(0) * 8;
    transport.max(rnr) + Duration::from_secs(2)
}

/// The CM id type of a context.
pub type CmIdOf<C> = <<C as Context>::CmChannel as CmChannel>::Id;

/// Polls `cq` until `n` completions have arrived.
pub fn wait_cq<H: Harness, Q: Cq>(h: &H, cq: &Q, n: usize) -> Result<Vec<WorkCompletion>, Failure> {
    let deadline = h.now() + patience();
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    while got.len() < n {
        let k = cq.poll(&mut buf[..(n - got.len()).min(16)])?;
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            wait_more(h, deadline, n, &got)?;
        }
    }
    Ok(got)
}

/// A poll found nothing with `got` of `n` completions in: fails past
/// `deadline`, else lets others run before the next poll.
pub fn wait_more<H: Harness>(
    h: &H,
    deadline: Duration,
    n: usize,
    got: &[WorkCompletion],
) -> Result<(), Failure> {
    ensure!(
        h.now() < deadline,
        "timed out with {} of {n} completions: {got:?}",
        got.len()
    );
    std::thread::yield_now();
    Ok(())
}

/// Polls `cq` until every id in `wr_ids` has completed; returns those
/// completions in arrival order and ignores others (a QP's receive and send
/// flushes may interleave in a shared CQ in any order).
pub fn wait_wrs<H: Harness, Q: Cq>(
    h: &H,
    cq: &Q,
    wr_ids: &[u64],
) -> Result<Vec<WorkCompletion>, Failure> {
    let deadline = h.now() + patience();
    let mut got: Vec<WorkCompletion> = Vec::new();
    let mut other = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    while got.len() < wr_ids.len() {
        let k = cq.poll(&mut buf)?;
        for w in &buf[..k] {
            if wr_ids.contains(&w.wr_id) {
                got.push(*w);
            } else {
                other.push(*w);
            }
        }
        if k == 0 {
            ensure!(
                h.now() < deadline,
                "timed out waiting for {wr_ids:?}; got {got:?}, and others {other:?}"
            );
            std::thread::yield_now();
        }
    }
    Ok(got)
}

/// Polls `cq` for `d` and fails if anything completes.
pub fn expect_quiet<H: Harness, Q: Cq>(h: &H, cq: &Q, d: Duration) -> Result<(), Failure> {
    let deadline = h.now() + d;
    let mut buf = [WorkCompletion::default(); 4];
    while h.now() < deadline {
        let k = cq.poll(&mut buf)?;
        ensure!(k == 0, "unexpected completion: {:?}", &buf[..k]);
        std::thread::yield_now();
    }
    Ok(())
}

/// Waits until `qp` is in the error state, polling `cq` meanwhile (which
/// also lets a simulated fabric progress); returns the completions seen.
pub fn wait_qp_error<H: Harness, Q: Cq, P: Qp>(
    h: &H,
    cq: &Q,
    qp: &P,
) -> Result<Vec<WorkCompletion>, Failure> {
    let deadline = h.now() + patience();
    let mut seen = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    loop {
        if qp.state()? == QpState::Error {
            return Ok(seen);
        }
        let k = cq.poll(&mut buf)?;
        seen.extend_from_slice(&buf[..k]);
        ensure!(
            h.now() < deadline,
            "the QP never went to the error state; completions: {seen:?}"
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
}

/// Whether the harness's transport is iWARP, where sends and writes complete
/// locally (RDMAP acknowledges nothing) and remote errors arrive later as a
/// TERMINATE that breaks the connection.
pub fn is_iwarp<H: Harness>(h: &H) -> bool {
    h.caps().transport == Transport::Iwarp
}

/// Polls `ctx`'s async events until one satisfies `pred`; returns all seen.
pub fn wait_async<H: Harness, C: Context>(
    h: &H,
    ctx: &C,
    pred: impl Fn(&AsyncEvent) -> bool,
) -> Result<Vec<AsyncEvent>, Failure> {
    let deadline = h.now() + patience();
    let mut seen = Vec::new();
    loop {
        match ctx.poll_async_event() {
            Some(e) => {
                let hit = pred(&e);
                seen.push(e);
                if hit {
                    return Ok(seen);
                }
            }
            None => {
                ensure!(
                    h.now() < deadline,
                    "timed out waiting for an async event; saw {seen:?}"
                );
                std::thread::yield_now();
            }
        }
    }
}

/// Polls `qp`'s state until it is `want`. For a state the device reaches
/// on its own after an event the application saw: siw moves a QP to Error
/// when its TCP connection closes, and the CM's Disconnected event can
/// reach the application before that.
pub fn wait_qp_state<H: Harness, Q: Qp>(h: &H, qp: &Q, want: QpState) -> Result<(), Failure> {
    let deadline = h.now() + patience();
    loop {
        let now = qp.state()?;
        if now == want {
            return Ok(());
        }
        ensure!(
            h.now() < deadline,
            "timed out waiting for the QP to reach {want:?}; it is {now:?}"
        );
        h.settle(Duration::from_millis(1));
    }
}

/// Polls `ch` until an event of `kind` arrives (for ConnectRequest, any
/// rejection counts as a kind match only if asked for exactly).
pub fn wait_cm<H: Harness, Ch: CmChannel>(
    h: &H,
    ch: &Ch,
    pred: impl Fn(&CmEventKind) -> bool,
) -> Result<CmEvent<Ch::Id>, Failure> {
    let deadline = h.now() + patience();
    let mut seen = Vec::new();
    loop {
        match ch.poll_event() {
            Some(e) if pred(&e.kind) => return Ok(e),
            Some(e) => seen.push(e.kind),
            None => {
                ensure!(
                    h.now() < deadline,
                    "timed out waiting for a CM event; saw {seen:?}"
                );
                std::thread::yield_now();
            }
        }
    }
}

/// Resolves `dst` on a fresh id of `ch`.
pub fn resolve<H: Harness, Ch: CmChannel>(
    h: &H,
    ch: &Ch,
    ps: PortSpace,
    dst: SocketAddr,
) -> Result<Ch::Id, Failure> {
    let id = ch.create_id(ps)?;
    id.resolve_addr(dst, 2_000)?;
    let e = wait_cm(h, ch, |k| {
        matches!(k, CmEventKind::AddrResolved | CmEventKind::AddrError)
    })?;
    ensure_eq!(e.kind, CmEventKind::AddrResolved);
    id.resolve_route(2_000)?;
    let e = wait_cm(h, ch, |k| {
        matches!(k, CmEventKind::RouteResolved | CmEventKind::RouteError)
    })?;
    ensure_eq!(e.kind, CmEventKind::RouteResolved);
    Ok(id)
}

/// A listening id on `p`'s device, on a free port.
pub fn listen<H: Harness, Ch: CmChannel>(
    h: &H,
    p: &Proc<H::F>,
    ch: &Ch,
    ps: PortSpace,
) -> Result<(Ch::Id, SocketAddr), Failure> {
    let id = ch.create_id(ps)?;
    id.listen(SocketAddr::new(h.addr(p), 0), 16)?;
    let addr = id
        .local_addr()
        .ok_or_else(|| Failure("listener has no address".into()))?;
    Ok((id, addr))
}

/// How to build an RC endpoint.
#[derive(Clone, Copy)]
pub struct Opts {
    /// Receive through an SRQ instead of a receive queue.
    pub srq: bool,
    /// Requested send queue depth.
    pub max_send_wr: u32,
    /// Receives posted right away (into the RQ or the SRQ).
    pub recvs: u32,
    /// Size of each posted receive, and of the endpoint's buffer slots.
    pub slot: u32,
    /// Requested inline size.
    pub max_inline: u32,
    /// CQ entries.
    pub cqe: u32,
    /// RNR retries the *peer* makes when sending to this side (the value
    /// this side passes to the CM).
    pub rnr_retry: u8,
    /// Transport retries the connection uses.
    pub retry: u8,
    /// What the QP lets remote peers do as responder (set at INIT).
    pub access: Access,
    /// The ACK timeout this side gives the CM for its QP (`None`: the
    /// CM's).
    pub ack_timeout: Option<u8>,
    /// The RNR timer this side gives the CM for its QP (`None`: the CM's).
    pub min_rnr_timer: Option<u8>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            srq: false,
            max_send_wr: 32,
            recvs: 16,
            slot: 4096,
            max_inline: 0,
            cqe: 256,
            rnr_retry: 7,
            retry: 7,
            access: InitAttr::default().access,
            ack_timeout: None,
            min_rnr_timer: None,
        }
    }
}

/// One side of an RC connection. Fields drop in order: the QP before its
/// CM id, queues and buffers.
pub struct Ep<C: Context> {
    /// The QP.
    pub qp: C::Qp,
    /// Its CM id (None when connected by hand).
    pub id: Option<CmIdOf<C>>,
    /// Its CM channel.
    pub ch: Option<C::CmChannel>,
    /// The SRQ, if it receives through one.
    pub srq: Option<C::Srq>,
    /// Receive buffer: `recvs` slots of `slot` bytes.
    pub rbuf: DmaBuf<C>,
    /// Send buffer of the same size.
    pub sbuf: DmaBuf<C>,
    /// Send and receive completions.
    pub cq: C::Cq,
    /// Protection domain.
    pub pd: C::Pd,
    /// Device context.
    pub ctx: C,
    /// Slot size.
    pub slot: u32,
}

impl<C: Context> Ep<C> {
    /// Builds the QP and buffers, and posts `o.recvs` receives.
    pub fn new(ctx: &C, o: &Opts) -> Result<Self, Failure> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(o.cqe)?;
        let slots = o.recvs.max(16) as usize;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let rbuf = DmaBuf::new(ctx, &pd, slots * o.slot as usize, access)?;
        let sbuf = DmaBuf::new(ctx, &pd, slots * o.slot as usize, access)?;
        let srq = if o.srq {
            Some(ctx.create_srq(
                &pd,
                SrqAttr {
                    max_wr: 64,
                    max_sge: 1,
                    srq_limit: 0,
                },
            )?)
        } else {
            None
        };
        let qp = ctx.create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: Some(&cq),
                srq: srq.as_ref(),
                caps: QpCaps {
                    max_send_wr: o.max_send_wr,
                    max_recv_wr: 64,
                    max_send_sge: 3,
                    max_recv_sge: 1,
                    max_inline: o.max_inline,
                },
            },
        )?;
        // Receives can be posted from INIT on; the CM takes it from here.
        qp.modify(&QpTransition::Init(InitAttr {
            access: o.access,
            ..InitAttr::default()
        }))?;
        let ep = Ep {
            qp,
            id: None,
            ch: None,
            srq,
            rbuf,
            sbuf,
            cq,
            pd,
            ctx: ctx.clone(),
            slot: o.slot,
        };
        for i in 0..o.recvs {
            ep.post_recv(i)?;
        }
        Ok(ep)
    }

    /// Posts a receive into slot `i` (wr_id = 1000 + i).
    pub fn post_recv(&self, i: u32) -> Result<(), Failure> {
        let sge = [self.rbuf.sge((i * self.slot) as usize, self.slot)];
        let wr = RecvWr {
            wr_id: 1000 + u64::from(i),
            sgl: &sge,
        };
        match &self.srq {
            Some(s) => s.post_recv(&wr)?,
            None => self.qp.post_recv(&wr)?,
        }
        Ok(())
    }

    /// Sends `data` from slot `i` of the send buffer (wr_id = i).
    pub fn send(&self, i: u32, data: &[u8]) -> Result<(), Failure> {
        let off = (i * self.slot) as usize;
        self.sbuf.write(off, data);
        let sge = [self.sbuf.sge(off, data.len() as u32)];
        self.qp.post_send(&SendWr::send(u64::from(i), &sge))?;
        Ok(())
    }
}

/// Two connected endpoints of a harness.
pub type EpPair<H> = (Ep<super::harness::Ctx<H>>, Ep<super::harness::Ctx<H>>);

/// An endpoint on one process with a CM id resolved towards a listener on
/// another, not yet connected. Fields drop in order: ids before channels.
pub struct Dial<C: Context> {
    /// The initiator's id, route resolved.
    pub id: CmIdOf<C>,
    /// The listening id.
    pub listener: CmIdOf<C>,
    /// The initiator's endpoint.
    pub ep: Ep<C>,
    /// The initiator's channel.
    pub cha: C::CmChannel,
    /// The listener's channel.
    pub chb: C::CmChannel,
}

/// Builds an endpoint on `a`, listens on `b` and resolves the way there.
pub fn dial<H: Harness>(
    h: &H,
    a: &Proc<H::F>,
    b: &Proc<H::F>,
    oa: &Opts,
) -> Result<Dial<super::harness::Ctx<H>>, Failure> {
    let ep = Ep::new(&a.ctx, oa)?;
    let cha = a.ctx.create_cm_channel()?;
    let chb = b.ctx.create_cm_channel()?;
    let (listener, addr) = listen(h, b, &chb, PortSpace::Tcp)?;
    let id = resolve(h, &cha, PortSpace::Tcp, addr)?;
    Ok(Dial {
        id,
        listener,
        ep,
        cha,
        chb,
    })
}

/// Connects an RC pair through the RDMA CM: `a` initiates, `b` listens.
pub fn connect_rc<H: Harness>(
    h: &H,
    a: &Proc<H::F>,
    b: &Proc<H::F>,
    oa: &Opts,
    ob: &Opts,
) -> Result<EpPair<H>, Failure> {
    let Dial {
        id: ida,
        listener,
        ep: mut ea,
        cha,
        chb,
    } = dial(h, a, b, oa)?;
    let mut eb = Ep::new(&b.ctx, ob)?;
    let mut pa = ConnParam::with_data(b"hello");
    pa.rnr_retry_count = oa.rnr_retry;
    pa.retry_count = oa.retry;
    pa.ack_timeout = oa.ack_timeout;
    pa.min_rnr_timer = oa.min_rnr_timer;
    ida.connect(Some(&ea.qp), &pa)?;
    let req = wait_cm(h, &chb, |k| *k == CmEventKind::ConnectRequest)?;
    let idb = req
        .new_id
        .ok_or_else(|| Failure("request without an id".into()))?;
    let mut pb = ConnParam::with_data(b"welcome");
    pb.rnr_retry_count = ob.rnr_retry;
    pb.ack_timeout = ob.ack_timeout;
    pb.min_rnr_timer = ob.min_rnr_timer;
    idb.accept(Some(&eb.qp), &pb)?;
    let e = wait_cm(h, &cha, |k| !matches!(k, CmEventKind::ConnectRequest))?;
    ensure_eq!(e.kind, CmEventKind::Established);
    let e = wait_cm(h, &chb, |_| true)?;
    ensure_eq!(e.kind, CmEventKind::Established);
    drop(listener);
    ea.id = Some(ida);
    ea.ch = Some(cha);
    eb.id = Some(idb);
    eb.ch = Some(chb);
    Ok((ea, eb))
}

/// Connects an RC pair by hand (INIT, RTR, RTS with each other's address):
/// InfiniBand-family devices only.
pub fn connect_manual<H: Harness>(
    a: &Proc<H::F>,
    b: &Proc<H::F>,
    oa: &Opts,
    ob: &Opts,
) -> Result<EpPair<H>, Failure> {
    let ea = Ep::new(&a.ctx, oa)?;
    let eb = Ep::new(&b.ctx, ob)?;
    let pa = a.ctx.query_port(1)?;
    let pb = b.ctx.query_port(1)?;
    // As through the CM: a side's rnr_retry governs its peer's QP.
    for (e, peer_port, peer_qpn, o, peer_o) in [
        (&ea, &pb, eb.qp.qp_num(), oa, ob),
        (&eb, &pa, ea.qp.qp_num(), ob, oa),
    ] {
        e.qp.modify(&QpTransition::Init(InitAttr::default()))?;
        let dest = PortAddr {
            lid: peer_port.lid,
            gid: peer_port.gid,
        };
        e.qp.modify(&QpTransition::Rtr(RtrAttr::new(dest, peer_qpn)))?;
        e.qp.modify(&QpTransition::Rts(RtsAttr {
            rnr_retry: peer_o.rnr_retry,
            retry_cnt: o.retry,
            timeout: 12,
            ..RtsAttr::default()
        }))?;
    }
    Ok((ea, eb))
}

/// Creates an XRC INI QP (send queue only) of `max_send_wr` entries.
pub fn ini_qp<C: Context>(
    ctx: &C,
    pd: &C::Pd,
    cq: &C::Cq,
    max_send_wr: u32,
) -> Result<C::Qp, Failure> {
    let init = QpInit {
        qp_type: QpType::XrcIni,
        send_cq: cq,
        recv_cq: None,
        srq: None,
        caps: QpCaps {
            max_send_wr,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline: 0,
        },
    };
    Ok(ctx.create_qp(pd, &init)?)
}

/// Asserts a completion's status (and wr_id).
pub fn check_wc(wc: &WorkCompletion, wr_id: u64, status: WcStatus) -> Result<(), Failure> {
    ensure!(
        wc.wr_id == wr_id && wc.status == status,
        "completion {wc:?}, expected wr_id {wr_id} with {status:?}"
    );
    Ok(())
}

/// A recognisable pattern of `len` bytes.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
