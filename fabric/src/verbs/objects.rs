//! Verbs objects: PD, MR, CQ (with its completion channel), SRQ and XRC SRQ,
//! XRC domain, QPs (RC, XRC INI, XRC TGT created or opened), device and port
//! queries, and the async event reader.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::sys;
use super::{check, errno_error, last_error, VerbsContext};
use crate::types::*;
use crate::{Cq, Error, Mr, Pd, Qp, QpInit, Result, Srq, Xrcd};

/// The vendor id `rdma_rxe` reports (`RXE_VENDOR_ID`, Linux 5.x and later).
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;
/// The vendor id `siw` reports (`SIW_VENDOR_ID`, "bmt").
const SIW_VENDOR_ID: u32 = 0x0062_6d74;

/// Reads the device's capabilities and vendor id.
pub(crate) fn query_caps(ctx: *mut sys::ibv_context) -> Result<(DeviceCaps, u32)> {
    let mut attr = sys::ibv_device_attr_ex::default();
    // SAFETY: `ctx` is a live context; `attr` is a writable out-structure.
    check("ibv_query_device_ex", unsafe {
        sys::ibv_query_device_ex(ctx, null(), &mut attr)
    })?;
    let a = &attr.orig_attr;
    // SAFETY: a live context's device pointer is valid.
    let iwarp = unsafe { (*(*ctx).device).transport_type } == sys::IBV_TRANSPORT_IWARP;
    let mut port = sys::ibv_port_attr::default();
    // SAFETY: as above; port 1 exists on every device.
    check("ibv_query_port", unsafe {
        sys::___ibv_query_port(ctx, 1, &mut port)
    })?;
    let transport = if iwarp {
        Transport::Iwarp
    } else if u32::from(port.link_layer) == sys::IBV_LINK_LAYER_ETHERNET {
        Transport::Roce
    } else {
        Transport::Infiniband
    };
    let pos = |v: i32| v.max(0) as u32;
    let xrc = a.device_cap_flags & sys::IBV_DEVICE_XRC != 0;
    let caps = DeviceCaps {
        transport,
        xrc,
        srq: a.max_srq > 0,
        // iWARP (RFC 5040) carries no immediate data; siw and cxgb4 refuse it.
        imm_data: !iwarp,
        max_qp: pos(a.max_qp),
        max_qp_wr: pos(a.max_qp_wr),
        max_srq: pos(a.max_srq),
        max_srq_wr: pos(a.max_srq_wr),
        max_sge: pos(a.max_sge),
        max_sge_rd: pos(a.max_sge_rd),
        max_cqe: pos(a.max_cqe),
        max_inline: probe_max_inline(ctx, false)?,
        max_inline_xrc: if xrc { probe_max_inline(ctx, true)? } else { 0 },
        max_mr_size: if a.vendor_id == RXE_VENDOR_ID {
            a.max_mr_size.min(crate::RXE_MR_SIZE_MAX)
        } else {
            a.max_mr_size
        },
        max_qp_rd_atom: pos(a.max_qp_rd_atom),
        atomics: a.atomic_cap != sys::IBV_ATOMIC_NONE,
        host_emulated: matches!(a.vendor_id, RXE_VENDOR_ID | SIW_VENDOR_ID),
    };
    Ok((caps, a.vendor_id))
}

/// The device attributes do not carry the inline limit: create a probe QP
/// of the type asked (RC, or XRC INI when `xrc`) asking for less and less
/// until the provider accepts, and read what it granted.
fn probe_max_inline(ctx: *mut sys::ibv_context, xrc: bool) -> Result<u32> {
    // SAFETY: every object made here is destroyed before returning, in
    // reverse order, and only passed to calls on the same context.
    unsafe {
        let pd = sys::ibv_alloc_pd(ctx);
        if pd.is_null() {
            return Err(last_error("ibv_alloc_pd"));
        }
        let cq = sys::ibv_create_cq(ctx, 4, null_mut(), null_mut(), 0);
        if cq.is_null() {
            sys::ibv_dealloc_pd(pd);
            return Err(last_error("ibv_create_cq"));
        }
        let mut granted = 0;
        for want in [1024u32, 512, 256, 220, 128, 96, 64, 32] {
            let mut init = sys::ibv_qp_init_attr_ex {
                send_cq: cq,
                recv_cq: cq,
                qp_type: if xrc {
                    sys::IBV_QPT_XRC_SEND
                } else {
                    sys::IBV_QPT_RC
                },
                comp_mask: sys::IBV_QP_INIT_ATTR_PD,
                pd,
                ..Default::default()
            };
            init.cap.max_send_wr = 1;
            init.cap.max_send_sge = 1;
            if !xrc {
                init.cap.max_recv_wr = 1;
                init.cap.max_recv_sge = 1;
            }
            init.cap.max_inline_data = want;
            let qp = sys::ibv_create_qp_ex(ctx, &mut init);
            if !qp.is_null() {
                granted = init.cap.max_inline_data;
                sys::ibv_destroy_qp(qp);
                break;
            }
        }
        sys::ibv_destroy_cq(cq);
        sys::ibv_dealloc_pd(pd);
        Ok(granted)
    }
}

pub(crate) fn query_port(ctx: *mut sys::ibv_context, port: u8) -> Result<PortAttr> {
    let mut attr = sys::ibv_port_attr::default();
    // SAFETY: `ctx` is live; `attr` is a writable out-structure.
    check("ibv_query_port", unsafe {
        sys::___ibv_query_port(ctx, port, &mut attr)
    })?;
    let mut gid = sys::ibv_gid::default();
    let index = super::source_gid_index(ctx, port);
    // SAFETY: as above; the index is one the port's table holds (or 0,
    // which exists on every active port).
    check("ibv_query_gid", unsafe {
        sys::ibv_query_gid(ctx, port, i32::from(index), &mut gid)
    })?;
    // SAFETY: `raw` views the union's 16 bytes, always initialised.
    let raw = unsafe { gid.raw };
    Ok(PortAttr {
        state: if attr.state == sys::IBV_PORT_ACTIVE {
            PortState::Active
        } else {
            PortState::Down
        },
        lid: attr.lid,
        gid: Gid(raw),
        active_mtu: 128u32 << attr.active_mtu.min(5),
    })
}

/// Reads one async event (the descriptor is non-blocking), translating the
/// kinds the fabric knows and skipping the others.
pub(crate) fn read_async_event(c: &VerbsContext) -> Option<AsyncEvent> {
    loop {
        let mut ev = sys::ibv_async_event::default();
        // SAFETY: the context is live; its async fd is non-blocking, so the
        // call returns -1 at once when no event is queued.
        if unsafe { sys::ibv_get_async_event(c.raw(), &mut ev) } != 0 {
            return None;
        }
        // SAFETY: the union member read matches the event type, as verbs(7)
        // specifies; the objects stay valid until the event is acked.
        let out = unsafe {
            let qpn = || (*ev.element.qp).qp_num;
            match ev.event_type {
                sys::IBV_EVENT_QP_FATAL => Some(AsyncEvent::QpFatal { qpn: qpn() }),
                sys::IBV_EVENT_QP_REQ_ERR => Some(AsyncEvent::QpRequestError { qpn: qpn() }),
                sys::IBV_EVENT_QP_ACCESS_ERR => Some(AsyncEvent::QpAccessError { qpn: qpn() }),
                sys::IBV_EVENT_QP_LAST_WQE_REACHED => {
                    Some(AsyncEvent::QpLastWqeReached { qpn: qpn() })
                }
                sys::IBV_EVENT_COMM_EST => Some(AsyncEvent::CommEstablished { qpn: qpn() }),
                sys::IBV_EVENT_SRQ_LIMIT_REACHED => Some(AsyncEvent::SrqLimitReached {
                    srq: ev.element.srq as u64,
                }),
                sys::IBV_EVENT_CQ_ERR => {
                    let cq = ev.element.cq as usize;
                    let flags = c.0.overrun.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some((_, f)) = flags.iter().find(|(p, _)| *p == cq) {
                        f.store(true, Ordering::Release);
                    }
                    Some(AsyncEvent::CqError { cq: cq as u64 })
                }
                sys::IBV_EVENT_PORT_ACTIVE => Some(AsyncEvent::PortActive {
                    port: ev.element.port_num as u8,
                }),
                sys::IBV_EVENT_PORT_ERR => Some(AsyncEvent::PortError {
                    port: ev.element.port_num as u8,
                }),
                _ => None,
            }
        };
        // SAFETY: acknowledges the event just read, exactly once.
        unsafe { sys::ibv_ack_async_event(&mut ev) };
        if out.is_some() {
            return out;
        }
    }
}

// ---- PD ------------------------------------------------------------------

pub(crate) struct PdInner {
    _ctx: VerbsContext,
    pub(crate) pd: *mut sys::ibv_pd,
}

// SAFETY: a PD is a thread-safe verbs object.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_alloc_pd; every object using it holds this
        // PD alive, so nothing uses it any more.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
    }
}

/// A verbs protection domain.
#[derive(Clone)]
pub struct VerbsPd(pub(crate) Arc<PdInner>);

impl Pd for VerbsPd {}

impl VerbsPd {
    pub(crate) fn new(ctx: &VerbsContext) -> Result<Self> {
        // SAFETY: the context is live.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
        if pd.is_null() {
            return Err(last_error("ibv_alloc_pd"));
        }
        Ok(VerbsPd(Arc::new(PdInner {
            _ctx: ctx.clone(),
            pd,
        })))
    }
}

// ---- MR ------------------------------------------------------------------

/// A verbs memory region.
pub struct VerbsMr {
    mr: *mut sys::ibv_mr,
    access: Access,
    _pd: VerbsPd,
}

// SAFETY: an MR is immutable after registration; deregistration is
// thread-safe.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl VerbsMr {
    /// # Safety
    /// As [`crate::Context::reg_mr`].
    pub(crate) unsafe fn new(
        pd: &VerbsPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        // SAFETY: the PD is live; the caller keeps the range valid while the
        // region lives. The access bits are the IBV_ACCESS_* values.
        let mr = unsafe { sys::ibv_reg_mr(pd.0.pd, addr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            return Err(last_error("ibv_reg_mr"));
        }
        Ok(VerbsMr {
            mr,
            access,
            _pd: pd.clone(),
        })
    }

    fn get(&self) -> &sys::ibv_mr {
        // SAFETY: valid from registration until drop.
        unsafe { &*self.mr }
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // SAFETY: registered in `new`, deregistered once.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

impl Mr for VerbsMr {
    fn addr(&self) -> u64 {
        self.get().addr as u64
    }
    fn len(&self) -> usize {
        self.get().length
    }
    fn lkey(&self) -> u32 {
        self.get().lkey
    }
    fn rkey(&self) -> u32 {
        self.get().rkey
    }
    fn access(&self) -> Access {
        self.access
    }
}

/// The error of an `ibv_post_send` that answered `rc` (not 0): a full
/// send queue is `NoResource`.
#[cold]
#[inline(never)]
fn post_error(rc: i32) -> Error {
    match rc {
        libc::ENOMEM => Error::NoResource("send queue full"),
        r => check("ibv_post_send", r).expect_err("a failed call"),
    }
}

// ---- CQ ------------------------------------------------------------------

pub(crate) struct CqInner {
    ctx: VerbsContext,
    pub(crate) cq: *mut sys::ibv_cq,
    chan: *mut sys::ibv_comp_channel,
    overrun: Arc<AtomicBool>,
    cap: u32,
}

// SAFETY: CQs and completion channels are thread-safe verbs objects.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        let key = self.cq as usize;
        self.ctx
            .0
            .overrun
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(p, _)| *p != key);
        // SAFETY: every QP and SRQ using the CQ holds it alive, so none is
        // left; every CQ event taken was acked.
        unsafe {
            sys::ibv_destroy_cq(self.cq);
            sys::ibv_destroy_comp_channel(self.chan);
        }
    }
}

/// A verbs completion queue with its own completion channel.
#[derive(Clone)]
pub struct VerbsCq(pub(crate) Arc<CqInner>);

fn wc_status(s: sys::ibv_wc_status) -> WcStatus {
    match s {
        sys::IBV_WC_SUCCESS => WcStatus::Success,
        sys::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
        sys::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOperation,
        sys::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
        sys::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlush,
        sys::IBV_WC_BAD_RESP_ERR => WcStatus::BadResponse,
        sys::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalAccess,
        sys::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
        sys::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
        sys::IBV_WC_REM_OP_ERR => WcStatus::RemoteOperation,
        sys::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
        sys::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        sys::IBV_WC_FATAL_ERR => WcStatus::Fatal,
        _ => WcStatus::General,
    }
}

fn wc_opcode(o: sys::ibv_wc_opcode) -> WcOpcode {
    match o {
        sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        sys::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        sys::IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
        sys::IBV_WC_RECV => WcOpcode::Recv,
        sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

/// How many entries one `ibv_poll_cq` takes at most: the room on the
/// stack of a poll.
const RAW_WCS: usize = 32;

/// A poll's room on the stack for the provider's entries, written by the
/// provider before they are read.
type RawWcs = [std::mem::MaybeUninit<sys::ibv_wc>; RAW_WCS];

/// How many entries a poll asks the provider for when `room` are free in
/// its caller's slice: the one clamp of every `ibv_poll_cq` call.
#[inline(always)]
fn asked(room: usize) -> usize {
    room.min(RAW_WCS)
}

/// Converts the entries `ibv_poll_cq` wrote (`raw`, as many as `out`).
#[inline]
fn convert_all(out: &mut [WorkCompletion], raw: &[std::mem::MaybeUninit<sys::ibv_wc>]) {
    for (slot, w) in out.iter_mut().zip(raw) {
        // SAFETY: ibv_poll_cq wrote the entries it returned, and the
        // callers pass only those.
        *slot = convert_wc(unsafe { w.assume_init_ref() });
    }
}

#[inline(always)]
fn convert_wc(w: &sys::ibv_wc) -> WorkCompletion {
    let imm = (w.wc_flags & sys::IBV_WC_WITH_IMM != 0)
        // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate.
        .then(|| u32::from_be(unsafe { w.__bindgen_anon_1.imm_data }));
    // The usual entry, a receive that succeeded, is told by one test of
    // each field; the tables take the rest.
    let status = if w.status == sys::IBV_WC_SUCCESS {
        WcStatus::Success
    } else {
        wc_status(w.status)
    };
    let opcode = if w.opcode == sys::IBV_WC_RECV {
        WcOpcode::Recv
    } else {
        wc_opcode(w.opcode)
    };
    WorkCompletion {
        wr_id: w.wr_id,
        status,
        opcode,
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        imm,
    }
}

/// [`Cq::Staged`] of a verbs CQ: room for the provider's entries, with the
/// CQ and the batch to ask for read once, so that a staged poll loads
/// nothing but what it passes to `ibv_poll_cq`.
pub struct VerbsStaged {
    /// Keeps the CQ that `cq` points to alive.
    _held: VerbsCq,
    cq: *mut sys::ibv_cq,
    ask: i32,
    raw: RawWcs,
}

// SAFETY: `cq` is the CQ `_held` keeps alive, a thread-safe verbs object;
// the entries are plain data.
unsafe impl Send for VerbsStaged {}

impl VerbsCq {
    pub(crate) fn new(ctx: &VerbsContext, cqe: u32) -> Result<Self> {
        let max = ctx.0.caps.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::invalid(format!("cqe {cqe} not in 1..={max}")));
        }
        // SAFETY: the context is live; the channel's fd is made non-blocking
        // before anyone reads it; the CQ is bound to the channel it owns.
        unsafe {
            let chan = sys::ibv_create_comp_channel(ctx.raw());
            if chan.is_null() {
                return Err(last_error("ibv_create_comp_channel"));
            }
            let fd = (*chan).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            let cq = sys::ibv_create_cq(ctx.raw(), cqe as i32, null_mut(), chan, 0);
            if cq.is_null() {
                let e = last_error("ibv_create_cq");
                sys::ibv_destroy_comp_channel(chan);
                return Err(e);
            }
            let overrun = Arc::new(AtomicBool::new(false));
            ctx.0
                .overrun
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((cq as usize, overrun.clone()));
            Ok(VerbsCq(Arc::new(CqInner {
                ctx: ctx.clone(),
                cq,
                chan,
                overrun,
                cap: (*cq).cqe.max(0) as u32,
            })))
        }
    }

    /// One `ibv_poll_cq` of [`asked`]`(room)` entries into `raw`: what the
    /// provider answered.
    #[inline(always)]
    fn poll_into(&self, raw: &mut RawWcs, room: usize) -> i32 {
        // SAFETY: the CQ is live; `raw` has room for `asked(room)` entries
        // (MaybeUninit<ibv_wc> has ibv_wc's layout).
        unsafe {
            sys::ibv_poll_cq(
                self.0.cq,
                asked(room) as i32,
                raw.as_mut_ptr().cast::<sys::ibv_wc>(),
            )
        }
    }

    #[inline]
    fn poll_raw(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        // Left uninitialised: this runs on every spin of a progress loop,
        // and the provider writes each entry it returns.
        let mut raw = [const { std::mem::MaybeUninit::<sys::ibv_wc>::uninit() }; RAW_WCS];
        // An empty `out` asks for no entry, and the provider answers 0.
        let n = self.poll_into(&mut raw, out.len());
        if n == 0 {
            // Empty, the usual answer of a spinning poll: nothing more to
            // do, and the rest (conversion, polling on) kept out of line.
            return Ok(0);
        }
        self.poll_found(out, &mut raw, n)
    }

    /// The rest of [`VerbsCq::poll_raw`] when its first `ibv_poll_cq`
    /// answered `n` (an error when negative): [`VerbsCq::took`].
    #[inline(never)]
    fn poll_found(&self, out: &mut [WorkCompletion], raw: &mut RawWcs, n: i32) -> Result<usize> {
        if n < 0 {
            return Err(self.poll_error(n));
        }
        Ok(self.took(out, raw, n as usize))
    }

    /// The first `ibv_poll_cq` of a poll took `n` > 0 entries into `raw`:
    /// converts them into `out`. A poll that filled what it asked for
    /// polls on ([`VerbsCq::poll_more`]); the usual one, a few entries, is
    /// done here. Returns how many `out` holds. Without an error to
    /// return, so that [`Cq::poll_quick`] builds and tests none.
    #[inline(never)]
    fn took(&self, out: &mut [WorkCompletion], raw: &mut RawWcs, n: usize) -> usize {
        let want = asked(out.len());
        // The provider returns at most what it was asked for.
        assert!(n <= want, "ibv_poll_cq returned more than asked");
        convert_all(&mut out[..n], &raw[..n]);
        if n < want {
            return n;
        }
        self.poll_more(out, raw, n)
    }

    /// [`VerbsCq::took`] after a poll that filled all it asked for, with
    /// `done` entries of `out` converted: polls on while `out` has room
    /// and each poll fills what it asks for.
    #[inline(never)]
    fn poll_more(&self, out: &mut [WorkCompletion], raw: &mut RawWcs, mut done: usize) -> usize {
        while done < out.len() {
            let room = out.len() - done;
            let n = self.poll_into(raw, room);
            if n < 0 {
                // The entries taken already are not lost: they go up now,
                // and the next poll meets the error.
                return done;
            }
            let n = n as usize;
            let want = asked(room);
            assert!(n <= want, "ibv_poll_cq returned more than asked");
            convert_all(&mut out[done..done + n], &raw[..n]);
            done += n;
            if n < want {
                break;
            }
        }
        done
    }

    /// Whether [`Cq::poll`] must take [`VerbsCq::poll_rare`]: the CQ
    /// overran.
    #[inline(always)]
    fn rare(&self) -> bool {
        self.0.overrun.load(Ordering::Acquire)
    }

    /// [`Cq::poll`] when the CQ overran or `out` has no room.
    #[cold]
    #[inline(never)]
    fn poll_rare(&self) -> Result<usize> {
        if self.0.overrun.load(Ordering::Acquire) {
            return Err(Error::CqOverrun);
        }
        Ok(0)
    }

    /// The error of an `ibv_poll_cq` that answered `n` < 0.
    #[cold]
    fn poll_error(&self, n: i32) -> Error {
        if self.0.overrun.load(Ordering::Acquire) {
            return Error::CqOverrun;
        }
        errno_error("ibv_poll_cq", -n)
    }
}

impl Cq for VerbsCq {
    fn id(&self) -> u64 {
        self.0.cq as u64
    }

    fn capacity(&self) -> u32 {
        self.0.cap
    }

    /// Inline, into the progress loop that spins on it: its usual answer,
    /// nothing, then costs no call frame of its own.
    #[inline]
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        if self.rare() || out.is_empty() {
            return self.poll_rare();
        }
        self.poll_raw(out)
    }

    /// As [`VerbsCq::poll`], with the empty answer returned straight from
    /// the provider's: its own test of it, not `VerbsCq::poll_raw`'s,
    /// so that the caller's test of the count folds into it (through
    /// `poll_raw`, the empty progress call set a zero and tested it again:
    /// 3 more instructions, seen in the disassembly).
    #[inline(always)]
    fn poll_quick(&self, out: &mut [WorkCompletion]) -> usize {
        if self.rare() {
            return self.poll_rare().unwrap_or(0);
        }
        let mut raw = [const { std::mem::MaybeUninit::<sys::ibv_wc>::uninit() }; RAW_WCS];
        let n = self.poll_into(&mut raw, out.len());
        // Empty, or an error, which counts as nothing found.
        if n <= 0 {
            return 0;
        }
        if n == 1 && out.len() > 1 {
            // The usual find of a ping-pong, one entry of the several asked
            // for: converted in the caller's frame, and no polling on.
            // SAFETY: ibv_poll_cq wrote the entry it returned.
            out[0] = convert_wc(unsafe { raw[0].assume_init_ref() });
            return 1;
        }
        self.took(out, &mut raw, n as usize)
    }

    type Staged = VerbsStaged;

    fn staging(&self, batch: usize) -> VerbsStaged {
        VerbsStaged {
            _held: self.clone(),
            cq: self.0.cq,
            ask: asked(batch.max(1)) as i32,
            raw: [const { std::mem::MaybeUninit::<sys::ibv_wc>::uninit() }; RAW_WCS],
        }
    }

    #[inline(always)]
    fn poll_staged(&self, st: &mut VerbsStaged) -> usize {
        // SAFETY: `st.cq` is live (held by `st`); `st.raw` has room for
        // `st.ask` entries (MaybeUninit<ibv_wc> has ibv_wc's layout).
        let n =
            unsafe { sys::ibv_poll_cq(st.cq, st.ask, st.raw.as_mut_ptr().cast::<sys::ibv_wc>()) };
        // Empty, or an error, which counts as nothing found.
        if n <= 0 {
            return 0;
        }
        n as usize
    }

    #[inline(always)]
    fn take_staged(&self, st: &mut VerbsStaged, n: usize, out: &mut [WorkCompletion]) -> usize {
        // Looked at here, not before the poll: the empty poll, the usual
        // one, then pays nothing for it.
        if self.rare() {
            return 0;
        }
        if n == 1 && out.len() > 1 {
            // The usual find of a ping-pong, one entry of the several asked
            // for: converted in the caller's frame, and no polling on.
            // SAFETY: ibv_poll_cq wrote the entry it returned.
            out[0] = convert_wc(unsafe { st.raw[0].assume_init_ref() });
            return 1;
        }
        self.took(out, &mut st.raw, n)
    }

    #[inline(always)]
    fn staged_recv(&self, st: &VerbsStaged) -> Option<RecvDone> {
        // SAFETY: `poll_staged` returned at least one entry, which
        // ibv_poll_cq wrote (the trait's contract: called only then).
        let w = unsafe { st.raw[0].assume_init_ref() };
        if self.rare()
            || w.status != sys::IBV_WC_SUCCESS
            || w.opcode != sys::IBV_WC_RECV
            || w.wc_flags & sys::IBV_WC_WITH_IMM != 0
        {
            return None;
        }
        Some(RecvDone {
            wr_id: w.wr_id,
            byte_len: w.byte_len,
            qp_num: w.qp_num,
        })
    }

    fn arm(&self) -> Result<()> {
        // SAFETY: the CQ is live.
        check("ibv_req_notify_cq", unsafe {
            sys::ibv_req_notify_cq(self.0.cq, 0)
        })
    }

    fn sleep(&self, timeout: Duration) -> Result<bool> {
        let mut pfd = libc::pollfd {
            // SAFETY: the channel is live.
            fd: unsafe { (*self.0.chan).fd },
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            return Err(last_error("poll(comp_channel)"));
        }
        if r == 0 {
            return Ok(false);
        }
        let mut cq = null_mut();
        let mut cq_ctx = null_mut();
        // SAFETY: the fd is readable, so an event is queued; it belongs to
        // this CQ (the channel is private to it) and is acked at once.
        unsafe {
            if sys::ibv_get_cq_event(self.0.chan, &mut cq, &mut cq_ctx) == 0 {
                sys::ibv_ack_cq_events(cq, 1);
            }
        }
        Ok(true)
    }
}

// ---- XRC domain ----------------------------------------------------------

struct XrcdInner {
    _ctx: VerbsContext,
    xrcd: *mut sys::ibv_xrcd,
    domain: XrcdId,
}

// SAFETY: an XRC domain is a thread-safe verbs object.
unsafe impl Send for XrcdInner {}
// SAFETY: as above.
unsafe impl Sync for XrcdInner {}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // SAFETY: opened in `open`; SRQs and QPs in it hold it alive.
        unsafe { sys::ibv_close_xrcd(self.xrcd) };
    }
}

/// A handle on a verbs XRC domain, shared through its key file.
#[derive(Clone)]
pub struct VerbsXrcd(Arc<XrcdInner>);

impl Xrcd for VerbsXrcd {
    fn id(&self) -> XrcdId {
        self.0.domain
    }
}

impl VerbsXrcd {
    pub(crate) fn open(ctx: &VerbsContext, key: &XrcdKey) -> Result<Self> {
        // Owner-only: the file names the domain; whoever opens it joins.
        let file = super::open_key_file(key)?;
        let mut attr = sys::ibv_xrcd_init_attr {
            comp_mask: sys::IBV_XRCD_INIT_ATTR_FD | sys::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: file.as_raw_fd(),
            oflags: libc::O_CREAT,
        };
        // SAFETY: the context is live, the fd open for the call; the kernel
        // keeps its own reference to the inode.
        let xrcd = unsafe { sys::ibv_open_xrcd(ctx.raw(), &mut attr) };
        if xrcd.is_null() {
            return Err(last_error("ibv_open_xrcd"));
        }
        // The kernel shares the domain by the key file's inode: that is
        // its identity.
        let meta = file.metadata().map_err(|e| Error::Verbs {
            verb: "fstat(xrcd key)",
            source: e,
        })?;
        Ok(VerbsXrcd(Arc::new(XrcdInner {
            _ctx: ctx.clone(),
            xrcd,
            domain: XrcdId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
        })))
    }
}

// ---- SRQ -----------------------------------------------------------------

pub(crate) struct SrqInner {
    pub(crate) srq: *mut sys::ibv_srq,
    srqn: Option<u32>,
    max_wr: u32,
    _pd: VerbsPd,
    _cq: Option<VerbsCq>,
    _xrcd: Option<VerbsXrcd>,
}

// SAFETY: an SRQ is a thread-safe verbs object.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: created in `new`; QPs attached to it hold it alive.
        unsafe { sys::ibv_destroy_srq(self.srq) };
    }
}

/// A verbs shared receive queue (plain or XRC).
#[derive(Clone)]
pub struct VerbsSrq(pub(crate) Arc<SrqInner>);

/// SGEs a work request carries without a heap allocation.
const SGE_STACK: usize = 4;

/// A work request's SGE list in verbs layout: on the stack up to
/// [`SGE_STACK`] entries (every post of the BTL has one), on the heap past
/// that. Posting is on the data path's hot path.
enum SgeList {
    Stack([sys::ibv_sge; SGE_STACK], usize),
    Heap(Vec<sys::ibv_sge>),
}

impl SgeList {
    fn new(sgl: &[Sge]) -> SgeList {
        let raw = |s: &Sge| sys::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        if sgl.len() <= SGE_STACK {
            let mut a = [sys::ibv_sge::default(); SGE_STACK];
            for (d, s) in a.iter_mut().zip(sgl) {
                *d = raw(s);
            }
            SgeList::Stack(a, sgl.len())
        } else {
            SgeList::Heap(sgl.iter().map(raw).collect())
        }
    }

    fn as_mut_ptr(&mut self) -> *mut sys::ibv_sge {
        match self {
            SgeList::Stack(a, _) => a.as_mut_ptr(),
            SgeList::Heap(v) => v.as_mut_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            SgeList::Stack(_, n) => *n,
            SgeList::Heap(v) => v.len(),
        }
    }
}

impl VerbsSrq {
    pub(crate) fn new(
        ctx: &VerbsContext,
        pd: &VerbsPd,
        xrc: Option<(&VerbsXrcd, &VerbsCq)>,
        attr: SrqAttr,
    ) -> Result<Self> {
        if !ctx.0.caps.srq {
            return Err(Error::Unsupported("the device caps report no SRQ"));
        }
        let sattr = sys::ibv_srq_attr {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            srq_limit: attr.srq_limit,
        };
        let (srq, srqn) = match xrc {
            None => {
                let mut init = sys::ibv_srq_init_attr {
                    attr: sattr,
                    ..Default::default()
                };
                // SAFETY: the PD is live; `init` is a valid in/out structure.
                let srq = unsafe { sys::ibv_create_srq(pd.0.pd, &mut init) };
                (srq, None)
            }
            Some((x, cq)) => {
                let mut init = sys::ibv_srq_init_attr_ex {
                    attr: sattr,
                    comp_mask: sys::IBV_SRQ_INIT_ATTR_TYPE
                        | sys::IBV_SRQ_INIT_ATTR_PD
                        | sys::IBV_SRQ_INIT_ATTR_XRCD
                        | sys::IBV_SRQ_INIT_ATTR_CQ,
                    srq_type: sys::IBV_SRQT_XRC,
                    pd: pd.0.pd,
                    xrcd: x.0.xrcd,
                    cq: cq.0.cq,
                    ..Default::default()
                };
                // SAFETY: context, PD, domain and CQ are live.
                let srq = unsafe { sys::ibv_create_srq_ex(ctx.raw(), &mut init) };
                let mut n = 0u32;
                if !srq.is_null() {
                    // ibv_get_srq_num returns the errno value itself.
                    // SAFETY: a non-null XRC SRQ has a number.
                    let rc = unsafe { sys::ibv_get_srq_num(srq, &mut n) };
                    if let Err(e) = check("ibv_get_srq_num", rc) {
                        // SAFETY: created just above, not shared yet.
                        unsafe { sys::ibv_destroy_srq(srq) };
                        return Err(e);
                    }
                }
                (srq, Some(n))
            }
        };
        if srq.is_null() {
            return Err(last_error("ibv_create_srq"));
        }
        Ok(VerbsSrq(Arc::new(SrqInner {
            srq,
            srqn,
            max_wr: attr.max_wr,
            _pd: pd.clone(),
            _cq: xrc.map(|(_, c)| c.clone()),
            _xrcd: xrc.map(|(x, _)| x.clone()),
        })))
    }
}

/// Receives prepared for a [`VerbsSrq`]: an `ibv_recv_wr` and its SGE per
/// buffer, filled once. Each request points at its own SGE from the moment
/// it is added (all of them again when adding one moves the SGEs), so that
/// posting only links the chosen ones through `next`; the links mean
/// nothing between posts.
#[derive(Default)]
pub struct VerbsRecvs {
    wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
    marks: crate::types::ChainMarks,
}

// SAFETY: the raw pointers in `wrs` point into this same set (or are null)
// and are only dereferenced by the provider within `VerbsSrq::post_set`,
// which borrows the set mutably; nothing else dereferences them.
unsafe impl Send for VerbsRecvs {}
// SAFETY: a shared borrow reads only lengths, never the pointers.
unsafe impl Sync for VerbsRecvs {}

impl crate::RecvSet for VerbsRecvs {
    fn add(&mut self, wr_id: u64, sge: Sge) -> u32 {
        let was = self.sges.as_ptr();
        self.sges.push(sys::ibv_sge {
            addr: sge.addr,
            length: sge.length,
            lkey: sge.lkey,
        });
        let sges = self.sges.as_mut_ptr();
        self.wrs.push(sys::ibv_recv_wr {
            wr_id,
            next: null_mut(),
            // SAFETY: the SGE just pushed, the last of `sges`.
            sg_list: unsafe { sges.add(self.sges.len() - 1) },
            num_sge: 1,
        });
        if sges.cast_const() != was {
            // The SGEs moved: every request is pointed at its own again.
            for (i, wr) in self.wrs.iter_mut().enumerate() {
                // SAFETY: `i` is below the length of `sges`, which gains an
                // SGE with each request.
                wr.sg_list = unsafe { sges.add(i) };
            }
        }
        self.marks.grow(self.wrs.len());
        (self.wrs.len() - 1) as u32
    }

    fn len(&self) -> usize {
        self.wrs.len()
    }
}

impl Srq for VerbsSrq {
    fn id(&self) -> u64 {
        self.0.srq as u64
    }

    fn srq_num(&self) -> Option<u32> {
        self.0.srqn
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        let mut list = SgeList::new(wr.sgl);
        let mut raw = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: null_mut(),
            sg_list: list.as_mut_ptr(),
            num_sge: list.len() as i32,
        };
        let mut bad = null_mut();
        // SAFETY: the SRQ is live; the work request and its SGE list are
        // valid for the call (the provider copies them).
        check("ibv_post_srq_recv", unsafe {
            sys::ibv_post_srq_recv(self.0.srq, &mut raw, &mut bad)
        })
    }

    type Recvs = VerbsRecvs;

    fn post_set(
        &self,
        set: &mut VerbsRecvs,
        which: &[u32],
    ) -> std::result::Result<(), (usize, Error)> {
        const CHAIN: usize = crate::types::RECV_CHAIN;
        let mut done = 0;
        for chunk in which.chunks(CHAIN) {
            // Every link is made through this pointer, so that none is
            // invalidated by a later borrow of the vector.
            let base = set.wrs.as_mut_ptr();
            // The marks admit only numbers below their length: the unsafe
            // links below rely on its being that of `wrs`, and each request
            // points at its own SGE in `sges` (`add`).
            assert!(set.marks.len() == set.wrs.len() && set.sges.len() == set.wrs.len());
            // Linked back to front, so that each request points at the one
            // after it and the last one ends the chain.
            let mut head: *mut sys::ibv_recv_wr = null_mut();
            set.marks.start();
            for &n in chunk.iter().rev() {
                let n = n as usize;
                // Nothing of a chain that breaks the rule was posted.
                set.marks.admit(n).map_err(|e| (done, e))?;
                // SAFETY: `n` is below the length of `wrs` (admitted, under
                // the assertion above); nothing else borrows the set
                // meanwhile.
                unsafe {
                    let wr = base.add(n);
                    (*wr).next = head;
                    head = wr;
                }
            }
            let mut bad: *mut sys::ibv_recv_wr = null_mut();
            // SAFETY: the SRQ is live; the chain and its SGEs live in `set`,
            // which is borrowed for the call and not moved during it (the
            // provider copies them).
            let rc = unsafe { sys::ibv_post_srq_recv(self.0.srq, head, &mut bad) };
            if rc != 0 {
                // `bad` is the first request not posted; the ones before it
                // in the chain were.
                let posted = if bad.is_null() {
                    0
                } else {
                    // SAFETY: the provider points `bad` into the chain, which
                    // lies within `wrs`.
                    let n = unsafe { bad.offset_from(base) };
                    chunk.iter().position(|&m| m as isize == n).unwrap_or(0)
                };
                return Err((
                    done + posted,
                    check("ibv_post_srq_recv", rc).expect_err("a failed call"),
                ));
            }
            done += chunk.len();
        }
        Ok(())
    }

    fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit > self.0.max_wr {
            return Err(Error::invalid(format!(
                "limit {limit} exceeds max_wr {}",
                self.0.max_wr
            )));
        }
        let mut attr = sys::ibv_srq_attr {
            srq_limit: limit,
            ..Default::default()
        };
        // SAFETY: the SRQ is live.
        check("ibv_modify_srq", unsafe {
            sys::ibv_modify_srq(self.0.srq, &mut attr, sys::IBV_SRQ_LIMIT as i32)
        })
    }
}

// ---- QP ------------------------------------------------------------------

pub(crate) struct QpInner {
    pub(crate) ctx: VerbsContext,
    pub(crate) qp: *mut sys::ibv_qp,
    ty: QpType,
    caps: QpCaps,
    /// The send queue depth as last granted (it may grow).
    send_depth: std::sync::atomic::AtomicU32,
    _pd: Option<VerbsPd>,
    _send_cq: Option<VerbsCq>,
    _recv_cq: Option<VerbsCq>,
    srq: Option<VerbsSrq>,
    _xrcd: Option<VerbsXrcd>,
}

// SAFETY: a QP is a thread-safe verbs object (posting and modifying take the
// provider's locks).
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: created or opened in this module, destroyed once; for an
        // opened XRC TGT QP this closes this process's handle only.
        unsafe { sys::ibv_destroy_qp(self.qp) };
    }
}

/// A verbs QP, or a handle on a shared XRC TGT QP.
#[derive(Clone)]
pub struct VerbsQp(pub(crate) Arc<QpInner>);

/// [`Qp::Inline`] of verbs: a send of one inline SGE, built once, which
/// each [`Qp::post_inline`] fills in with its id, bytes, signalling and
/// target SRQ (five stores, where building the request whole zeroes its
/// 128 bytes and writes eight fields). Its pointers, to its SGE and the
/// SGE's to the bytes, are written just before each post; between posts
/// they point nowhere in particular and nothing reads them.
pub struct VerbsInline {
    wr: sys::ibv_send_wr,
    sge: sys::ibv_sge,
}

// SAFETY: the pointers it holds own nothing, and are read only by the
// provider within a post, which holds the request mutably.
unsafe impl Send for VerbsInline {}
// SAFETY: as above; a shared reference reads nothing through them.
unsafe impl Sync for VerbsInline {}

impl Default for VerbsInline {
    fn default() -> Self {
        VerbsInline {
            wr: sys::ibv_send_wr {
                num_sge: 1,
                opcode: sys::IBV_WR_SEND,
                send_flags: sys::IBV_SEND_INLINE,
                ..Default::default()
            },
            sge: sys::ibv_sge::default(),
        }
    }
}

impl std::fmt::Debug for VerbsInline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsInline")
            .field("last_wr_id", &self.wr.wr_id)
            .finish_non_exhaustive()
    }
}

fn qp_state(s: sys::ibv_qp_state) -> QpState {
    match s {
        sys::IBV_QPS_RESET => QpState::Reset,
        sys::IBV_QPS_INIT => QpState::Init,
        sys::IBV_QPS_RTR => QpState::Rtr,
        sys::IBV_QPS_RTS | sys::IBV_QPS_SQD => QpState::Rts,
        _ => QpState::Error,
    }
}

impl VerbsQp {
    /// Posts `raw`, built by the caller, to the send queue, with the
    /// target SRQ of an XRC INI QP.
    #[inline]
    fn post_raw(&self, raw: &mut sys::ibv_send_wr, remote_srqn: Option<u32>) -> Result<()> {
        if let Some(srqn) = remote_srqn {
            raw.qp_type.xrc.remote_srqn = srqn;
        }
        let mut bad = null_mut();
        // SAFETY: the QP is live; the work request, its SGE list and any
        // inline bytes are valid for the call (the provider copies them
        // before it returns); registered memory named by the SGEs is the
        // caller's contract.
        let rc = unsafe { sys::ibv_post_send(self.0.qp, raw, &mut bad) };
        match rc {
            0 => Ok(()),
            r => Err(post_error(r)),
        }
    }

    /// [`Qp::post_send`], out of the inline post's line: for a request it
    /// does not take (a TGT QP, an INI QP without a target SRQ, too long
    /// to go inline).
    #[cold]
    #[inline(never)]
    fn post_send_cold(&self, wr: &SendWr<'_>) -> Result<()> {
        self.post_send(wr)
    }

    pub(crate) fn create(
        ctx: &VerbsContext,
        pd: &VerbsPd,
        init: &QpInit<'_, VerbsContext>,
    ) -> Result<Self> {
        let caps = &ctx.0.caps;
        if init.qp_type == QpType::XrcTgt {
            return Err(Error::invalid(
                "XRC TGT QPs are created in an XRC domain (create_tgt_qp)",
            ));
        }
        let max_inline = caps.max_inline_for(init.qp_type);
        if init.caps.max_inline > max_inline {
            return Err(Error::invalid(format!(
                "max_inline {} exceeds the device's {max_inline} for {:?} QPs",
                init.caps.max_inline, init.qp_type
            )));
        }
        let rc = init.qp_type == QpType::Rc;
        if rc && init.srq.is_none() && init.recv_cq.is_none() {
            return Err(Error::invalid("an RC QP needs a receive CQ"));
        }
        let send_cq = init.send_cq.0.cq;
        let mut attr = sys::ibv_qp_init_attr_ex {
            send_cq,
            recv_cq: init.recv_cq.map_or(send_cq, |c| c.0.cq),
            srq: init.srq.map_or(null_mut(), |s| s.0.srq),
            qp_type: if rc {
                sys::IBV_QPT_RC
            } else {
                sys::IBV_QPT_XRC_SEND
            },
            comp_mask: sys::IBV_QP_INIT_ATTR_PD,
            pd: pd.0.pd,
            ..Default::default()
        };
        attr.cap.max_send_wr = init.caps.max_send_wr;
        attr.cap.max_send_sge = init.caps.max_send_sge;
        attr.cap.max_inline_data = init.caps.max_inline;
        if rc && init.srq.is_none() {
            attr.cap.max_recv_wr = init.caps.max_recv_wr;
            attr.cap.max_recv_sge = init.caps.max_recv_sge;
        }
        // SAFETY: the context, PD, CQs and SRQ are live; `attr` is a valid
        // in/out structure (the granted sizes come back in `cap`).
        let qp = unsafe { sys::ibv_create_qp_ex(ctx.raw(), &mut attr) };
        if qp.is_null() {
            return Err(last_error("ibv_create_qp_ex"));
        }
        let granted = QpCaps {
            max_send_wr: attr.cap.max_send_wr,
            max_recv_wr: attr.cap.max_recv_wr,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            max_inline: attr.cap.max_inline_data,
        };
        Ok(VerbsQp(Arc::new(QpInner {
            ctx: ctx.clone(),
            qp,
            ty: init.qp_type,
            caps: granted,
            send_depth: std::sync::atomic::AtomicU32::new(granted.max_send_wr),
            _pd: Some(pd.clone()),
            _send_cq: Some(init.send_cq.clone()),
            _recv_cq: init.recv_cq.cloned(),
            srq: init.srq.cloned(),
            _xrcd: None,
        })))
    }

    fn tgt(ctx: &VerbsContext, xrcd: &VerbsXrcd, qp: *mut sys::ibv_qp) -> Self {
        VerbsQp(Arc::new(QpInner {
            ctx: ctx.clone(),
            qp,
            ty: QpType::XrcTgt,
            caps: QpCaps {
                max_send_wr: 0,
                max_recv_wr: 0,
                max_send_sge: 0,
                max_recv_sge: 0,
                max_inline: 0,
            },
            send_depth: std::sync::atomic::AtomicU32::new(0),
            _pd: None,
            _send_cq: None,
            _recv_cq: None,
            srq: None,
            _xrcd: Some(xrcd.clone()),
        }))
    }

    pub(crate) fn create_tgt(ctx: &VerbsContext, xrcd: &VerbsXrcd) -> Result<Self> {
        let mut attr = sys::ibv_qp_init_attr_ex {
            qp_type: sys::IBV_QPT_XRC_RECV,
            comp_mask: sys::IBV_QP_INIT_ATTR_XRCD,
            xrcd: xrcd.0.xrcd,
            ..Default::default()
        };
        // SAFETY: the context and domain are live.
        let qp = unsafe { sys::ibv_create_qp_ex(ctx.raw(), &mut attr) };
        if qp.is_null() {
            return Err(last_error("ibv_create_qp_ex(XRC_RECV)"));
        }
        Ok(Self::tgt(ctx, xrcd, qp))
    }

    pub(crate) fn open_tgt(ctx: &VerbsContext, xrcd: &VerbsXrcd, qpn: u32) -> Result<Self> {
        let mut attr = sys::ibv_qp_open_attr {
            comp_mask: sys::IBV_QP_OPEN_ATTR_NUM
                | sys::IBV_QP_OPEN_ATTR_XRCD
                | sys::IBV_QP_OPEN_ATTR_TYPE,
            qp_num: qpn,
            xrcd: xrcd.0.xrcd,
            qp_context: null_mut(),
            qp_type: sys::IBV_QPT_XRC_RECV,
        };
        // SAFETY: the context and domain are live.
        let qp = unsafe { sys::ibv_open_qp(ctx.raw(), &mut attr) };
        if qp.is_null() {
            return Err(match last_error("ibv_open_qp") {
                // The kernel answers EINVAL for a number not in the domain.
                Error::InvalidArgument(_) | Error::NotFound(_) => {
                    Error::not_found(format!("XRC TGT QP {qpn:#x} in this domain"))
                }
                e => e,
            });
        }
        Ok(Self::tgt(ctx, xrcd, qp))
    }

    /// Applies raw attributes (the CM computes them with rdma_init_qp_attr).
    pub(crate) fn modify_raw(&self, attr: &mut sys::ibv_qp_attr, mask: i32) -> Result<()> {
        // SAFETY: the QP is live; `attr` is valid for `mask`.
        check("ibv_modify_qp", unsafe {
            sys::ibv_modify_qp(self.0.qp, attr, mask)
        })
    }
}

impl Qp for VerbsQp {
    type Inline = VerbsInline;

    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; qp_num never changes.
        unsafe { (*self.0.qp).qp_num }
    }

    fn qp_type(&self) -> QpType {
        self.0.ty
    }

    fn caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.0.send_depth.load(Ordering::Relaxed),
            ..self.0.caps
        }
    }

    fn state(&self) -> Result<QpState> {
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: the QP is live; both structures are writable.
        check("ibv_query_qp", unsafe {
            sys::ibv_query_qp(self.0.qp, &mut attr, sys::IBV_QP_STATE as i32, &mut init)
        })?;
        Ok(qp_state(attr.qp_state))
    }

    fn query(&self) -> Result<QpAttr> {
        let mut a = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_MIN_RNR_TIMER
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_CAP;
        // SAFETY: the QP is live; both structures are writable.
        check("ibv_query_qp", unsafe {
            sys::ibv_query_qp(self.0.qp, &mut a, mask as i32, &mut init)
        })?;
        Ok(QpAttr {
            state: qp_state(a.qp_state),
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_inline: a.cap.max_inline_data,
        })
    }

    fn modify(&self, t: &QpTransition) -> Result<()> {
        let mut a = sys::ibv_qp_attr::default();
        let mask = match *t {
            QpTransition::Init(i) => {
                a.qp_state = sys::IBV_QPS_INIT;
                a.pkey_index = 0;
                a.port_num = i.port;
                a.qp_access_flags = i.access.bits();
                sys::IBV_QP_STATE
                    | sys::IBV_QP_PKEY_INDEX
                    | sys::IBV_QP_PORT
                    | sys::IBV_QP_ACCESS_FLAGS
            }
            QpTransition::Rtr(r) => {
                let mut port = sys::ibv_port_attr::default();
                // SAFETY: the context is live.
                check("ibv_query_port", unsafe {
                    sys::___ibv_query_port(self.0.ctx.raw(), 1, &mut port)
                })?;
                a.qp_state = sys::IBV_QPS_RTR;
                a.path_mtu = port.active_mtu;
                a.dest_qp_num = r.dest_qpn;
                a.rq_psn = r.rq_psn;
                a.ah_attr.dlid = r.dest.lid;
                a.ah_attr.port_num = 1;
                // Ethernet has no LIDs: route by GID, from a RoCE v2 source
                // GID (index 0 is the link-local RoCE v1 one on mlx5).
                if r.dest.lid == 0 {
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh.dgid.raw = r.dest.gid.0;
                    a.ah_attr.grh.sgid_index = super::source_gid_index(self.0.ctx.raw(), 1);
                    a.ah_attr.grh.hop_limit = 64;
                }
                // The mask the kernel allows for the QP type: responder
                // attributes for RC and TGT QPs, none for an INI QP
                // (qp_state_table; EINVAL otherwise).
                let mut mask = sys::IBV_QP_STATE
                    | sys::IBV_QP_AV
                    | sys::IBV_QP_PATH_MTU
                    | sys::IBV_QP_DEST_QPN
                    | sys::IBV_QP_RQ_PSN;
                if let Some(v) = r.max_dest_rd_atomic {
                    a.max_dest_rd_atomic = v;
                    mask |= sys::IBV_QP_MAX_DEST_RD_ATOMIC;
                }
                if let Some(v) = r.min_rnr_timer {
                    a.min_rnr_timer = v;
                    mask |= sys::IBV_QP_MIN_RNR_TIMER;
                }
                mask
            }
            QpTransition::Rts(r) => {
                if self.0.ty == QpType::XrcTgt {
                    return Err(Error::invalid("an XRC TGT QP does not send: RTR is final"));
                }
                a.qp_state = sys::IBV_QPS_RTS;
                a.sq_psn = r.sq_psn;
                a.timeout = r.timeout;
                a.retry_cnt = r.retry_cnt;
                a.rnr_retry = r.rnr_retry;
                a.max_rd_atomic = r.max_rd_atomic;
                sys::IBV_QP_STATE
                    | sys::IBV_QP_SQ_PSN
                    | sys::IBV_QP_TIMEOUT
                    | sys::IBV_QP_RETRY_CNT
                    | sys::IBV_QP_RNR_RETRY
                    | sys::IBV_QP_MAX_QP_RD_ATOMIC
            }
            QpTransition::Error => {
                a.qp_state = sys::IBV_QPS_ERR;
                sys::IBV_QP_STATE
            }
            QpTransition::Reset => {
                a.qp_state = sys::IBV_QPS_RESET;
                sys::IBV_QP_STATE
            }
        };
        self.modify_raw(&mut a, mask as i32)
    }

    fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        let caps = &self.0.ctx.0.caps;
        match self.0.ty {
            QpType::XrcTgt => return Err(Error::invalid("an XRC TGT QP has no send queue")),
            QpType::XrcIni if wr.remote_srqn.is_none() => {
                return Err(Error::invalid("XRC INI sends must name the remote SRQ"))
            }
            _ => {}
        }
        let mut flags = 0;
        let mut list = match wr.payload {
            Payload::Sgl(sgl) => SgeList::new(sgl),
            Payload::Inline(data) => {
                if wr.op.fetches() {
                    return Err(Error::invalid("an RDMA read cannot be inline"));
                }
                if data.len() > self.0.caps.max_inline as usize {
                    return Err(Error::invalid(format!(
                        "inline payload of {} bytes exceeds max_inline {}",
                        data.len(),
                        self.0.caps.max_inline
                    )));
                }
                flags |= sys::IBV_SEND_INLINE;
                SgeList::new(&[Sge {
                    addr: data.as_ptr() as u64,
                    length: data.len() as u32,
                    lkey: 0,
                }])
            }
        };
        let mut raw = sys::ibv_send_wr {
            wr_id: wr.wr_id,
            sg_list: list.as_mut_ptr(),
            num_sge: list.len() as i32,
            ..Default::default()
        };
        if wr.signaled {
            flags |= sys::IBV_SEND_SIGNALED;
        }
        if wr.fence {
            flags |= sys::IBV_SEND_FENCE;
        }
        raw.send_flags = flags;
        let remote = |raw: &mut sys::ibv_send_wr, r: RemoteAddr| {
            raw.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        };
        match wr.op {
            SendOp::Send => raw.opcode = sys::IBV_WR_SEND,
            SendOp::SendWithImm(_) | SendOp::WriteWithImm(..) if !caps.imm_data => {
                return Err(Error::invalid("the device has no immediate data"));
            }
            SendOp::SendWithImm(imm) => {
                raw.opcode = sys::IBV_WR_SEND_WITH_IMM;
                raw.__bindgen_anon_1.imm_data = imm.to_be();
            }
            SendOp::Write(r) => {
                raw.opcode = sys::IBV_WR_RDMA_WRITE;
                remote(&mut raw, r);
            }
            SendOp::WriteWithImm(r, imm) => {
                raw.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
                raw.__bindgen_anon_1.imm_data = imm.to_be();
                remote(&mut raw, r);
            }
            SendOp::Read(r) => {
                raw.opcode = sys::IBV_WR_RDMA_READ;
                remote(&mut raw, r);
            }
            SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. } if !caps.atomics => {
                return Err(Error::Unsupported("the device has no atomics"));
            }
            SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. } if wr.payload.len() != 8 => {
                return Err(Error::invalid(
                    "an atomic returns its 8 bytes into an SGE list of 8 bytes",
                ));
            }
            SendOp::FetchAdd { remote: r, add } => {
                raw.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
                raw.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: r.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: r.rkey,
                };
            }
            SendOp::CompareSwap {
                remote: r,
                compare,
                swap,
            } => {
                raw.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
                raw.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: r.addr,
                    compare_add: compare,
                    swap,
                    rkey: r.rkey,
                };
            }
        }
        self.post_raw(&mut raw, wr.remote_srqn)
    }

    /// Inline into the caller, the latency path's send: a call of its
    /// own cost its frame, its arguments' moves and the `Result` written
    /// and read back through memory (about 20 instructions on siw).
    #[inline(always)]
    fn post_inline(
        &self,
        wr: &mut VerbsInline,
        wr_id: u64,
        data: &[u8],
        remote_srqn: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let ok = match self.0.ty {
            QpType::XrcIni => remote_srqn.is_some(),
            QpType::Rc => true,
            QpType::XrcTgt => false,
        };
        if !ok || data.len() > self.0.caps.max_inline as usize {
            // The general path says what is wrong.
            return self.post_send_cold(&SendWr::inline(wr_id, data, remote_srqn, signaled));
        }
        wr.sge.addr = data.as_ptr() as u64;
        wr.sge.length = data.len() as u32;
        let raw = &mut wr.wr;
        raw.wr_id = wr_id;
        raw.sg_list = &mut wr.sge;
        raw.send_flags = sys::IBV_SEND_INLINE | if signaled { sys::IBV_SEND_SIGNALED } else { 0 };
        // Read on an XRC INI QP only, which has one (checked above).
        raw.qp_type.xrc.remote_srqn = remote_srqn.unwrap_or(0);
        let mut bad = null_mut();
        // SAFETY: the QP is live; the request (one SGE, no `next`), its SGE
        // and the inline bytes are valid for the call (the provider copies
        // them before it returns).
        let rc = unsafe { sys::ibv_post_send(self.0.qp, raw, &mut bad) };
        if rc != 0 {
            return Err(post_error(rc));
        }
        Ok(())
    }

    fn resize_send_queue(&self, depth: u32) -> Result<u32> {
        let unsupported = Error::Unsupported("resizing a QP's send queue");
        let mut a = sys::ibv_qp_attr::default();
        a.cap.max_send_wr = depth;
        match self.modify_raw(&mut a, sys::IBV_QP_CAP as i32) {
            Ok(()) => {}
            // Most providers refuse IBV_QP_CAP on a live QP.
            Err(Error::InvalidArgument(_)) | Err(Error::Unsupported(_)) => return Err(unsupported),
            Err(e) => return Err(e),
        }
        // Some accept the call and change nothing: believe only the query.
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: the QP is live; both structures are writable.
        check("ibv_query_qp", unsafe {
            sys::ibv_query_qp(self.0.qp, &mut attr, sys::IBV_QP_CAP as i32, &mut init)
        })?;
        let granted = attr.cap.max_send_wr;
        if granted < depth {
            return Err(unsupported);
        }
        self.0.send_depth.fetch_max(granted, Ordering::Relaxed);
        Ok(granted)
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        if self.0.ty != QpType::Rc {
            return Err(Error::invalid(format!(
                "{:?} QPs have no receive queue",
                self.0.ty
            )));
        }
        if self.0.srq.is_some() {
            return Err(Error::invalid("the QP receives through its SRQ"));
        }
        let mut list = SgeList::new(wr.sgl);
        let mut raw = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: null_mut(),
            sg_list: list.as_mut_ptr(),
            num_sge: list.len() as i32,
        };
        let mut bad = null_mut();
        // SAFETY: the QP is live; the work request is valid for the call.
        let rc = unsafe { sys::ibv_post_recv(self.0.qp, &mut raw, &mut bad) };
        match rc {
            0 => Ok(()),
            libc::ENOMEM => Err(Error::NoResource("receive queue full")),
            r => check("ibv_post_recv", r),
        }
    }
}
