//! The endpoint fid (`fi_endpoint`, FI_EP_RDM): its number in its domain
//! and address (`fi_getname`), what it is bound to (one address vector,
//! completion queues and counters of its domain), `fi_enable`, options,
//! and closing.
//!
//! Data transfer is not built yet (issue 29 goes on): until it is, every
//! message, tagged, RMA and atomic operation answers -FI_ENOSYS, and
//! `fi_cancel` finds nothing to cancel.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::av::AvObj;
use super::cq::{CntrObj, CqObj};
use super::domain::Domain;
use super::{err, guard, object, Shared};
use crate::addr;
use crate::sys;

// The flags as the u64 they travel in (bindgen types the small ones u32).
const TRANSMIT: u64 = sys::FI_TRANSMIT as u64;
const RECV: u64 = sys::FI_RECV as u64;
const SEND: u64 = sys::FI_SEND as u64;
const READ: u64 = sys::FI_READ as u64;
const WRITE: u64 = sys::FI_WRITE as u64;
/// Completion queue bind flags.
const CQ_FLAGS: u64 = TRANSMIT | RECV | sys::FI_SELECTIVE_COMPLETION;
/// Counter bind flags.
const CNTR_FLAGS: u64 =
    SEND | RECV | READ | WRITE | sys::FI_REMOTE_READ as u64 | sys::FI_REMOTE_WRITE as u64;

/// What an endpoint is bound to (the objects' users counts hold them open).
#[derive(Default)]
struct Bound {
    av: Option<*const AvObj>,
    tx_cq: Option<*const CqObj>,
    rx_cq: Option<*const CqObj>,
    selective: bool,
    cntrs: Vec<(*const CntrObj, u64)>,
    enabled: bool,
    min_multi_recv: usize,
}

/// The provider's endpoint: libfabric's `fid_ep` first.
#[repr(C)]
pub(crate) struct EpObj {
    ep: sys::fid_ep,
    domain: *const Domain,
    /// Its number in its domain.
    number: u16,
    bound: Mutex<Bound>,
}

static FID_OPS: Shared<sys::fi_ops> = Shared::new(sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(bind),
    control: Some(control),
    ops_open: Some(no_ops_open),
    tostr: None,
    ops_set: None,
});

static EP_OPS: Shared<sys::fi_ops_ep> = Shared::new(sys::fi_ops_ep {
    size: std::mem::size_of::<sys::fi_ops_ep>(),
    cancel: Some(cancel),
    getopt: Some(getopt),
    setopt: Some(setopt),
    tx_ctx: Some(no_tx_ctx),
    rx_ctx: Some(no_rx_ctx),
    rx_size_left: Some(no_size_left),
    tx_size_left: Some(no_size_left),
});

static CM_OPS: Shared<sys::fi_ops_cm> = Shared::new(sys::fi_ops_cm {
    size: std::mem::size_of::<sys::fi_ops_cm>(),
    setname: Some(no_setname),
    getname: Some(getname),
    getpeer: Some(no_getpeer),
    connect: Some(no_connect),
    listen: Some(no_listen),
    accept: Some(no_accept),
    reject: Some(no_reject),
    shutdown: Some(no_shutdown),
    join: Some(no_join),
});

/// Defines functions that answer -FI_ENOSYS with the signatures given.
macro_rules! not_yet {
    ($($name:ident($($t:ty),*) -> $ret:ty;)*) => {
        $(unsafe extern "C" fn $name($(_: $t),*) -> $ret {
            err(sys::FI_ENOSYS) as $ret
        })*
    };
}

type Ep = *mut sys::fid_ep;
type Iov = *const sys::iovec;
type Desc = *mut *mut c_void;
type Ptr = *mut c_void;
type CPtr = *const c_void;
type Dt = sys::fi_datatype;
type Op = sys::fi_op;
type Ioc = *const sys::fi_ioc;
type IocMut = *mut sys::fi_ioc;

not_yet! {
    msg_recv(Ep, Ptr, usize, Ptr, u64, Ptr) -> isize;
    msg_recvv(Ep, Iov, Desc, usize, u64, Ptr) -> isize;
    msg_recvmsg(Ep, *const sys::fi_msg, u64) -> isize;
    msg_send(Ep, CPtr, usize, Ptr, u64, Ptr) -> isize;
    msg_sendv(Ep, Iov, Desc, usize, u64, Ptr) -> isize;
    msg_sendmsg(Ep, *const sys::fi_msg, u64) -> isize;
    msg_inject(Ep, CPtr, usize, u64) -> isize;
    msg_senddata(Ep, CPtr, usize, Ptr, u64, u64, Ptr) -> isize;
    msg_injectdata(Ep, CPtr, usize, u64, u64) -> isize;
    tag_recv(Ep, Ptr, usize, Ptr, u64, u64, u64, Ptr) -> isize;
    tag_recvv(Ep, Iov, Desc, usize, u64, u64, u64, Ptr) -> isize;
    tag_recvmsg(Ep, *const sys::fi_msg_tagged, u64) -> isize;
    tag_send(Ep, CPtr, usize, Ptr, u64, u64, Ptr) -> isize;
    tag_sendv(Ep, Iov, Desc, usize, u64, u64, Ptr) -> isize;
    tag_sendmsg(Ep, *const sys::fi_msg_tagged, u64) -> isize;
    tag_inject(Ep, CPtr, usize, u64, u64) -> isize;
    tag_senddata(Ep, CPtr, usize, Ptr, u64, u64, u64, Ptr) -> isize;
    tag_injectdata(Ep, CPtr, usize, u64, u64, u64) -> isize;
    rma_read(Ep, Ptr, usize, Ptr, u64, u64, u64, Ptr) -> isize;
    rma_readv(Ep, Iov, Desc, usize, u64, u64, u64, Ptr) -> isize;
    rma_readmsg(Ep, *const sys::fi_msg_rma, u64) -> isize;
    rma_write(Ep, CPtr, usize, Ptr, u64, u64, u64, Ptr) -> isize;
    rma_writev(Ep, Iov, Desc, usize, u64, u64, u64, Ptr) -> isize;
    rma_writemsg(Ep, *const sys::fi_msg_rma, u64) -> isize;
    rma_inject(Ep, CPtr, usize, u64, u64, u64) -> isize;
    rma_writedata(Ep, CPtr, usize, Ptr, u64, u64, u64, u64, Ptr) -> isize;
    rma_injectdata(Ep, CPtr, usize, u64, u64, u64, u64) -> isize;
    amo_write(Ep, CPtr, usize, Ptr, u64, u64, u64, Dt, Op, Ptr) -> isize;
    amo_writev(Ep, Ioc, Desc, usize, u64, u64, u64, Dt, Op, Ptr) -> isize;
    amo_writemsg(Ep, *const sys::fi_msg_atomic, u64) -> isize;
    amo_inject(Ep, CPtr, usize, u64, u64, u64, Dt, Op) -> isize;
    amo_readwrite(Ep, CPtr, usize, Ptr, Ptr, Ptr, u64, u64, u64, Dt, Op, Ptr) -> isize;
    amo_readwritev(Ep, Ioc, Desc, usize, IocMut, Desc, usize, u64, u64, u64, Dt, Op, Ptr) -> isize;
    amo_readwritemsg(Ep, *const sys::fi_msg_atomic, IocMut, Desc, usize, u64) -> isize;
    amo_compwrite(Ep, CPtr, usize, Ptr, CPtr, Ptr, Ptr, Ptr, u64, u64, u64, Dt, Op, Ptr) -> isize;
    amo_compwritev(Ep, Ioc, Desc, usize, Ioc, Desc, usize, IocMut, Desc, usize, u64, u64, u64, Dt, Op, Ptr) -> isize;
    amo_compwritemsg(Ep, *const sys::fi_msg_atomic, Ioc, Desc, usize, IocMut, Desc, usize, u64) -> isize;
    amo_writevalid(Ep, Dt, Op, *mut usize) -> c_int;
    amo_readwritevalid(Ep, Dt, Op, *mut usize) -> c_int;
    amo_compwritevalid(Ep, Dt, Op, *mut usize) -> c_int;
}

static MSG_OPS: Shared<sys::fi_ops_msg> = Shared::new(sys::fi_ops_msg {
    size: std::mem::size_of::<sys::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
});

static TAGGED_OPS: Shared<sys::fi_ops_tagged> = Shared::new(sys::fi_ops_tagged {
    size: std::mem::size_of::<sys::fi_ops_tagged>(),
    recv: Some(tag_recv),
    recvv: Some(tag_recvv),
    recvmsg: Some(tag_recvmsg),
    send: Some(tag_send),
    sendv: Some(tag_sendv),
    sendmsg: Some(tag_sendmsg),
    inject: Some(tag_inject),
    senddata: Some(tag_senddata),
    injectdata: Some(tag_injectdata),
});

static RMA_OPS: Shared<sys::fi_ops_rma> = Shared::new(sys::fi_ops_rma {
    size: std::mem::size_of::<sys::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
});

static ATOMIC_OPS: Shared<sys::fi_ops_atomic> = Shared::new(sys::fi_ops_atomic {
    size: std::mem::size_of::<sys::fi_ops_atomic>(),
    write: Some(amo_write),
    writev: Some(amo_writev),
    writemsg: Some(amo_writemsg),
    inject: Some(amo_inject),
    readwrite: Some(amo_readwrite),
    readwritev: Some(amo_readwritev),
    readwritemsg: Some(amo_readwritemsg),
    compwrite: Some(amo_compwrite),
    compwritev: Some(amo_compwritev),
    compwritemsg: Some(amo_compwritemsg),
    writevalid: Some(amo_writevalid),
    readwritevalid: Some(amo_readwritevalid),
    compwritevalid: Some(amo_compwritevalid),
});

impl EpObj {
    /// The provider's endpoint behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a EpObj> {
        // SAFETY: the caller's promise; our endpoint fids start an `EpObj`.
        unsafe { object(fid, sys::FI_CLASS_EP, &FID_OPS) }
    }

    fn domain(&self) -> &Domain {
        // SAFETY: an endpoint's domain cannot close before it (EBUSY).
        unsafe { &*self.domain }
    }

    fn bound(&self) -> std::sync::MutexGuard<'_, Bound> {
        self.bound.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `fi_endpoint` / `fi_endpoint2`.
pub(super) unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    ep: *mut *mut sys::fid_ep,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_domain starts with its fid.
        let Some(d) = (unsafe { Domain::from_fid(domain.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if info.is_null() || ep.is_null() {
            return err(sys::FI_EINVAL);
        }
        if flags != 0 {
            return err(sys::FI_EBADFLAGS);
        }
        // SAFETY: checked non-null; an fi_info from getinfo (or a copy).
        let info = unsafe { &*info };
        // SAFETY: null or a valid ep_attr.
        if let Some(attr) = unsafe { info.ep_attr.as_ref() } {
            if attr.type_ != sys::FI_EP_RDM && attr.type_ != sys::FI_EP_UNSPEC {
                return err(sys::FI_EINVAL);
            }
        }
        let Some(number) = d.take_ep_number() else {
            return err(sys::FI_ENOSPC);
        };
        let object = Box::new(EpObj {
            ep: sys::fid_ep {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_EP as usize,
                    context,
                    ops: FID_OPS.get(),
                },
                ops: EP_OPS.get(),
                cm: CM_OPS.get(),
                msg: MSG_OPS.get(),
                rma: RMA_OPS.get(),
                tagged: TAGGED_OPS.get(),
                atomic: ATOMIC_OPS.get(),
                collective: std::ptr::null_mut(),
            },
            domain: d,
            number,
            bound: Mutex::new(Bound::default()),
        });
        d.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: libfabric's out-parameter, checked non-null; freed by
        // `close`.
        unsafe { *ep = Box::into_raw(object).cast() };
        0
    })
}

unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        {
            // A bound object cannot close while its users count holds it
            // (EBUSY): every pointer below is live.
            let b = ep.bound();
            if let Some(av) = b.av {
                // SAFETY: live, as above.
                unsafe { &*av }.users.fetch_sub(1, Ordering::AcqRel);
            }
            for cq in [b.tx_cq, b.rx_cq].into_iter().flatten() {
                // SAFETY: live, as above.
                unsafe { &*cq }.users.fetch_sub(1, Ordering::AcqRel);
            }
            for &(c, _) in &b.cntrs {
                // SAFETY: live, as above.
                unsafe { &*c }.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        ep.domain().give_ep_number(ep.number);
        ep.domain().children.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: ours (checked), made by `open` with Box::into_raw, and
        // not used by libfabric after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<EpObj>()) });
        0
    })
}

unsafe extern "C" fn bind(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        let mut b = ep.bound();
        if b.enabled {
            return err(sys::FI_EOPBADSTATE);
        }
        let same_domain = |d: *const Domain| std::ptr::eq(d, ep.domain);
        // SAFETY: libfabric passes a null or live fid to bind.
        if let Some(av) = unsafe { AvObj::from_fid(bfid) } {
            if flags != 0 {
                return err(sys::FI_EBADFLAGS);
            }
            if !same_domain(av.domain_ptr()) || b.av.is_some() {
                return err(sys::FI_EINVAL);
            }
            av.users.fetch_add(1, Ordering::AcqRel);
            b.av = Some(av);
            return 0;
        }
        // SAFETY: as above.
        if let Some(cq) = unsafe { CqObj::from_fid(bfid) } {
            if flags & !CQ_FLAGS != 0 {
                return err(sys::FI_EBADFLAGS);
            }
            let tx = flags & TRANSMIT != 0;
            let rx = flags & RECV != 0;
            if !same_domain(cq.domain_ptr())
                || !(tx || rx)
                || (tx && b.tx_cq.is_some())
                || (rx && b.rx_cq.is_some())
            {
                return err(sys::FI_EINVAL);
            }
            if tx {
                cq.users.fetch_add(1, Ordering::AcqRel);
                b.tx_cq = Some(cq);
            }
            if rx {
                cq.users.fetch_add(1, Ordering::AcqRel);
                b.rx_cq = Some(cq);
            }
            b.selective |= flags & sys::FI_SELECTIVE_COMPLETION != 0;
            return 0;
        }
        // SAFETY: as above.
        if let Some(c) = unsafe { CntrObj::from_fid(bfid) } {
            if flags == 0 || flags & !CNTR_FLAGS != 0 {
                return err(sys::FI_EBADFLAGS);
            }
            if !same_domain(c.domain_ptr()) {
                return err(sys::FI_EINVAL);
            }
            c.users.fetch_add(1, Ordering::AcqRel);
            b.cntrs.push((c, flags));
            return 0;
        }
        // A null fid, another class (an event queue: none is offered), or
        // another provider's object.
        err(sys::FI_EINVAL)
    })
}

unsafe extern "C" fn control(fid: *mut sys::fid, command: c_int, _arg: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if command != sys::FI_ENABLE as c_int {
            return err(sys::FI_ENOSYS);
        }
        let mut b = ep.bound();
        if b.av.is_none() {
            return err(sys::FI_ENOAV);
        }
        let counts = |f: u64| b.cntrs.iter().any(|&(_, g)| g & f != 0);
        if b.tx_cq.is_none() && !counts(SEND | WRITE | READ) || b.rx_cq.is_none() && !counts(RECV) {
            return err(sys::FI_ENOCQ);
        }
        b.enabled = true;
        0
    })
}

unsafe extern "C" fn getname(fid: *mut sys::fid, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if addrlen.is_null() {
            return err(sys::FI_EINVAL);
        }
        let bytes = ep.domain().address(ep.number).encode();
        // SAFETY: checked non-null: the caller's buffer size.
        let room = unsafe { *addrlen };
        // SAFETY: as above; the length the whole address needs.
        unsafe { *addrlen = addr::LEN };
        if !addr.is_null() {
            // SAFETY: `addr` has `room` bytes; what does not fit is cut.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast(), room.min(addr::LEN))
            };
        }
        if room < addr::LEN || addr.is_null() {
            return err(sys::FI_ETOOSMALL);
        }
        0
    })
}

/// Nothing can be posted yet, so nothing is found to cancel.
unsafe extern "C" fn cancel(fid: *mut sys::fid, _context: *mut c_void) -> isize {
    super::guard_size(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        if unsafe { EpObj::from_fid(fid) }.is_none() {
            return err(sys::FI_EINVAL) as isize;
        }
        err(sys::FI_ENOENT) as isize
    })
}

unsafe extern "C" fn getopt(
    fid: *mut sys::fid,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if level != sys::FI_OPT_ENDPOINT as c_int {
            return err(sys::FI_ENOPROTOOPT);
        }
        let value = match optname as u32 {
            sys::FI_OPT_MIN_MULTI_RECV => ep.bound().min_multi_recv,
            sys::FI_OPT_CM_DATA_SIZE => 0,
            _ => return err(sys::FI_ENOPROTOOPT),
        };
        if optval.is_null() || optlen.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: checked non-null; the caller's buffer and its size.
        unsafe {
            if *optlen < std::mem::size_of::<usize>() {
                *optlen = std::mem::size_of::<usize>();
                return err(sys::FI_ETOOSMALL);
            }
            *optval.cast::<usize>() = value;
            *optlen = std::mem::size_of::<usize>();
        }
        0
    })
}

unsafe extern "C" fn setopt(
    fid: *mut sys::fid,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if level != sys::FI_OPT_ENDPOINT as c_int || optname as u32 != sys::FI_OPT_MIN_MULTI_RECV {
            return err(sys::FI_ENOPROTOOPT);
        }
        if optval.is_null() || optlen != std::mem::size_of::<usize>() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: checked: a size_t of the caller's.
        ep.bound().min_multi_recv = unsafe { *optval.cast::<usize>() };
        0
    })
}

unsafe extern "C" fn no_ops_open(
    _: *mut sys::fid,
    _: *const std::ffi::c_char,
    _: u64,
    _: *mut *mut c_void,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

// What an FI_EP_RDM endpoint with one context does not have.

unsafe extern "C" fn no_tx_ctx(
    _: *mut sys::fid_ep,
    _: c_int,
    _: *mut sys::fi_tx_attr,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_rx_ctx(
    _: *mut sys::fid_ep,
    _: c_int,
    _: *mut sys::fi_rx_attr,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_size_left(_: *mut sys::fid_ep) -> isize {
    // Deprecated since API 1.5.
    err(sys::FI_ENOSYS) as isize
}

unsafe extern "C" fn no_setname(_: *mut sys::fid, _: *mut c_void, _: usize) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_getpeer(_: *mut sys::fid_ep, _: *mut c_void, _: *mut usize) -> c_int {
    // Connectionless.
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_connect(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: *const c_void,
    _: usize,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_listen(_: *mut sys::fid_pep) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_accept(_: *mut sys::fid_ep, _: *const c_void, _: usize) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_reject(
    _: *mut sys::fid_pep,
    _: *mut sys::fid,
    _: *const c_void,
    _: usize,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_shutdown(_: *mut sys::fid_ep, _: u64) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_join(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: u64,
    _: *mut *mut sys::fid_mc,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}
