//! The endpoint fid (`fi_endpoint`, FI_EP_RDM): its number in its domain
//! and address (`fi_getname`), what it is bound to (one address vector,
//! completion queues and counters of its domain), `fi_enable`, options,
//! and closing.
//!
//! Messages (FI_MSG) and tagged messages (FI_TAGGED, with FI_PEEK,
//! FI_CLAIM and FI_DISCARD) go through the domain's [`crate::engine`] once
//! the endpoint is enabled, and so do RMA reads and writes (with remote CQ
//! data too) and the atomics [`crate::atomic`] lists. A send's I/O vector
//! may have up to [`crate::info::SEND_IOV_LIMIT`] entries, gathered into
//! one buffer the send keeps (Intel MPI sends its active messages in two
//! pieces whatever iov_limit says); receives, RMA and atomics take one
//! entry, and more are -FI_EINVAL (their iov_limit and rma_iov_limit are 1).

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::av::AvObj;
use super::cq::{CntrObj, CqObj};
use super::domain::Domain;
use super::{err, fid_ops, guard, guard_size, object, Shared};
use crate::addr;
use crate::atomic::{self, Class};
use crate::engine::{AtomicArgs, PeekArgs, PostError, RecvArgs, RmaArgs, SendArgs, Targets};
use crate::flags::{
    CLAIM, COMPLETION, DELIVERY_COMPLETE, DISCARD, INJECT, MULTI_RECV, PEEK, READ, RECV,
    REMOTE_CQ_DATA, REMOTE_READ, REMOTE_WRITE, SEND, TRANSMIT, TRANSMIT_COMPLETE, WRITE,
};
use crate::info::{INJECT_SIZE, SEND_IOV_LIMIT};
use crate::rdm::Space;
use crate::sys;
use xrcbtl_btl::UserMem;

/// Completion queue bind flags.
const CQ_FLAGS: u64 = TRANSMIT | RECV | sys::FI_SELECTIVE_COMPLETION;
/// Counter bind flags.
const CNTR_FLAGS: u64 = SEND | RECV | READ | WRITE | REMOTE_READ | REMOTE_WRITE;

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
    /// Default flags of its sends and receives (the info's op_flags).
    tx_flags: u64,
    rx_flags: u64,
    /// Largest message (the info's max_msg_size).
    max_msg: usize,
    /// Whether receives heed their source address (FI_DIRECTED_RECV in
    /// the info's caps); without it a receive takes any peer's message,
    /// whatever `src_addr` says.
    directed: bool,
}

static FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(close, Some(bind), Some(control)));

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

not_yet! {}

/// FI_ADDR_UNSPEC: a receive from anyone.
const ANY_SOURCE: u64 = u64::MAX;

/// What the inject calls (`fi_inject`, `fi_tinject`, their `data` forms,
/// `fi_inject_write`, `fi_inject_writedata`, `fi_inject_atomic`) pass:
/// FI_INJECT, and no completion at all. A send, write or atomic that
/// carries FI_INJECT as a flag (its own or the endpoint's default) still
/// completes as any other. FI_PROV_SPECIFIC's bit, which no caller's flags
/// bring in here ([`caller_flags`]).
const INJECT_CALL: u64 = INJECT | (1 << 63);

/// A caller's flags, without the bit [`INJECT_CALL`] uses.
fn caller_flags(flags: u64) -> u64 {
    flags & !(1 << 63)
}

/// What a post's return says of a refusal.
fn post_rc(r: Result<(), PostError>) -> isize {
    match r {
        Ok(()) => 0,
        Err(PostError::Again) => err(sys::FI_EAGAIN) as isize,
        Err(PostError::State(_)) => err(sys::FI_EOPBADSTATE) as isize,
        Err(PostError::NoAddress | PostError::Invalid(_)) => err(sys::FI_EINVAL) as isize,
    }
}

/// The caller's buffer as user memory the engine may read or write until
/// the operation completes.
///
/// # Safety
/// `buf` is null or `len` bytes the caller lends until the operation
/// completes (libfabric's contract for every data transfer call).
unsafe fn lent(buf: *const c_void, len: usize) -> Result<Option<UserMem>, isize> {
    if len == 0 {
        return Ok(None);
    }
    if buf.is_null() {
        return Err(err(sys::FI_EINVAL) as isize);
    }
    // SAFETY: the caller's promise, which is UserMem's.
    unsafe { UserMem::new(buf as *mut u8, len) }
        .map(Some)
        .map_err(|_| err(sys::FI_EINVAL) as isize)
}

/// One I/O vector of at most one entry, as (buffer, length).
///
/// # Safety
/// `iov` is null or holds `count` entries.
unsafe fn one_iov(iov: *const sys::iovec, count: usize) -> Result<(*const c_void, usize), isize> {
    match count {
        0 => Ok((std::ptr::null(), 0)),
        1 if !iov.is_null() => {
            // SAFETY: the caller's promise: one entry.
            let v = unsafe { &*iov };
            Ok((v.iov_base as *const c_void, v.iov_len))
        }
        _ => Err(err(sys::FI_EINVAL) as isize),
    }
}

/// A send of `len` bytes at `buf` to `dest`.
///
/// # Safety
/// `ep` is null or a live fid; `buf` as [`lent`] asks.
#[allow(clippy::too_many_arguments)]
unsafe fn post_send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    space: Space,
    data: Option<u64>,
    context: *mut c_void,
    flags: u64,
) -> isize {
    let one = sys::iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    };
    // SAFETY: the caller's promise, for the one entry.
    unsafe { post_sendv(ep, &one, 1, dest, space, data, context, flags) }
}

/// A send whose body is in `count` I/O vector entries: none is a message
/// of no bytes, one is sent from where it is, and several are first
/// gathered into a buffer the send keeps (the BTL sends from one place).
///
/// # Safety
/// As [`post_send`], for each entry of `iov`, which holds `count`.
#[allow(clippy::too_many_arguments)]
unsafe fn post_sendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    count: usize,
    dest: u64,
    space: Space,
    data: Option<u64>,
    context: *mut c_void,
    flags: u64,
) -> isize {
    // SAFETY: a fid_ep starts with its fid.
    let Some(ep) = (unsafe { EpObj::from_fid(ep.cast()) }) else {
        return err(sys::FI_EINVAL) as isize;
    };
    let selective = {
        let b = ep.bound();
        if !b.enabled {
            return err(sys::FI_EOPBADSTATE) as isize;
        }
        b.selective
    };
    if count > SEND_IOV_LIMIT || (count > 0 && iov.is_null()) {
        return err(sys::FI_EINVAL) as isize;
    }
    let entries = if count == 0 {
        &[][..]
    } else {
        // SAFETY: the caller's promise: `count` entries, checked non-null.
        unsafe { std::slice::from_raw_parts(iov, count) }
    };
    let Some(len) = entries
        .iter()
        .try_fold(0usize, |sum, v| sum.checked_add(v.iov_len))
    else {
        return err(sys::FI_EINVAL) as isize;
    };
    if len > ep.max_msg || (flags & INJECT != 0 && len > INJECT_SIZE) {
        return err(sys::FI_EINVAL) as isize;
    }
    let (mem, gathered) = if let [one] = entries {
        // SAFETY: the caller's promise: `iov_len` bytes lent at `iov_base`.
        match unsafe { lent(one.iov_base, one.iov_len) } {
            Ok(mem) => (mem, None),
            Err(rc) => return rc,
        }
    } else {
        let mut body = match gather(entries, len) {
            Ok(b) => b,
            Err(rc) => return rc,
        };
        // SAFETY: the box's bytes stay where they are, and the send keeps
        // the box (`gathered`) for as long as it may read them.
        match unsafe { lent(body.as_mut_ptr() as *const c_void, len) } {
            Ok(mem) => (mem, Some(body)),
            Err(rc) => return rc,
        }
    };
    post_rc(ep.domain().engine.send(
        ep.number,
        SendArgs {
            context: context as u64,
            to: dest,
            space,
            data,
            mem,
            completion: flags & INJECT_CALL != INJECT_CALL
                && (!selective || flags & COMPLETION != 0),
            // An eager send otherwise completes once copied into the BTL's
            // buffer (FI_INJECT_COMPLETE): one asked to complete once
            // transmitted waits for the receiver's Ack, as a delivery does,
            // the provider having no sign of transmission short of it.
            delivery: flags & (DELIVERY_COMPLETE | TRANSMIT_COMPLETE) != 0,
            gathered,
        },
    ))
}

/// Several I/O vector entries of `len` bytes in all, copied into one
/// buffer.
fn gather(entries: &[sys::iovec], len: usize) -> Result<Box<[u8]>, isize> {
    let mut body = Vec::with_capacity(len);
    for v in entries {
        if v.iov_len == 0 {
            continue;
        }
        if v.iov_base.is_null() {
            return Err(err(sys::FI_EINVAL) as isize);
        }
        // SAFETY: the caller lends `iov_len` readable bytes at `iov_base`.
        body.extend_from_slice(unsafe {
            std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
        });
    }
    Ok(body.into_boxed_slice())
}

/// A receive of up to `len` bytes into `buf`.
///
/// # Safety
/// As [`post_send`].
#[allow(clippy::too_many_arguments)]
unsafe fn post_recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    src: u64,
    space: Space,
    ignore: u64,
    context: *mut c_void,
    flags: u64,
) -> isize {
    // SAFETY: a fid_ep starts with its fid.
    let Some(ep) = (unsafe { EpObj::from_fid(ep.cast()) }) else {
        return err(sys::FI_EINVAL) as isize;
    };
    let peek = flags & PEEK != 0;
    let claim = flags & CLAIM != 0;
    let discard = flags & DISCARD != 0;
    if (peek || claim || discard) && !matches!(space, Space::Tagged(_)) {
        return err(sys::FI_EINVAL) as isize;
    }
    // SAFETY: the caller's promise.
    let mem = match unsafe { lent(buf, len) } {
        Ok(m) => m,
        Err(rc) => return rc,
    };
    let (selective, min_free) = {
        let b = ep.bound();
        if !b.enabled {
            return err(sys::FI_EOPBADSTATE) as isize;
        }
        (b.selective, b.min_multi_recv)
    };
    let multi = flags & MULTI_RECV != 0;
    if multi && !matches!(space, Space::Msg) {
        return err(sys::FI_EINVAL) as isize;
    }
    let engine = &ep.domain().engine;
    let from = (ep.directed && src != ANY_SOURCE).then_some(src);
    if peek {
        let Space::Tagged(tag) = space else {
            return err(sys::FI_EINVAL) as isize;
        };
        return post_rc(engine.peek(
            ep.number,
            PeekArgs {
                context: context as u64,
                from,
                tag,
                ignore,
                claim,
                discard,
            },
        ));
    }
    let args = RecvArgs {
        context: context as u64,
        from,
        space,
        ignore,
        mem,
        completion: !selective || flags & COMPLETION != 0,
        multi: multi.then_some(min_free),
    };
    if claim {
        return post_rc(engine.take_claimed(ep.number, args, discard));
    }
    if discard {
        return err(sys::FI_EINVAL) as isize;
    }
    post_rc(engine.recv(ep.number, args))
}

/// The endpoint's default flags for a call without its own.
///
/// # Safety
/// `ep` is null or a live fid.
unsafe fn default_flags(ep: *mut sys::fid_ep, tx: bool) -> u64 {
    // SAFETY: the caller's promise.
    match unsafe { EpObj::from_fid(ep.cast()) } {
        Some(e) if tx => caller_flags(e.tx_flags),
        Some(e) => caller_flags(e.rx_flags),
        None => 0,
    }
}

unsafe extern "C" fn msg_recv(
    ep: Ep,
    buf: Ptr,
    len: usize,
    _desc: Ptr,
    src: u64,
    context: Ptr,
) -> isize {
    // SAFETY: libfabric's arguments (each function below likewise).
    guard_size(|| unsafe {
        post_recv(
            ep,
            buf,
            len,
            src,
            Space::Msg,
            0,
            context,
            default_flags(ep, false),
        )
    })
}

unsafe extern "C" fn msg_recvv(
    ep: Ep,
    iov: Iov,
    _desc: Desc,
    count: usize,
    src: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_iov(iov, count) {
            Ok((buf, len)) => post_recv(
                ep,
                buf as Ptr,
                len,
                src,
                Space::Msg,
                0,
                context,
                default_flags(ep, false),
            ),
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn msg_recvmsg(ep: Ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        let Some(m) = msg.as_ref() else {
            return err(sys::FI_EINVAL) as isize;
        };
        match one_iov(m.msg_iov, m.iov_count) {
            Ok((buf, len)) => {
                post_recv(ep, buf as Ptr, len, m.addr, Space::Msg, 0, m.context, flags)
            }
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn msg_send(
    ep: Ep,
    buf: CPtr,
    len: usize,
    _desc: Ptr,
    dest: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        post_send(
            ep,
            buf,
            len,
            dest,
            Space::Msg,
            None,
            context,
            default_flags(ep, true),
        )
    })
}

unsafe extern "C" fn msg_sendv(
    ep: Ep,
    iov: Iov,
    _desc: Desc,
    count: usize,
    dest: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_sendv(ep, iov, count, dest, Space::Msg, None, context, flags)
    })
}

unsafe extern "C" fn msg_sendmsg(ep: Ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        let Some(m) = msg.as_ref() else {
            return err(sys::FI_EINVAL) as isize;
        };
        let data = (flags & REMOTE_CQ_DATA != 0).then_some(m.data);
        post_sendv(
            ep,
            m.msg_iov,
            m.iov_count,
            m.addr,
            Space::Msg,
            data,
            m.context,
            flags,
        )
    })
}

unsafe extern "C" fn msg_inject(ep: Ep, buf: CPtr, len: usize, dest: u64) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        post_send(
            ep,
            buf,
            len,
            dest,
            Space::Msg,
            None,
            std::ptr::null_mut(),
            INJECT_CALL,
        )
    })
}

unsafe extern "C" fn msg_senddata(
    ep: Ep,
    buf: CPtr,
    len: usize,
    _desc: Ptr,
    data: u64,
    dest: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_send(ep, buf, len, dest, Space::Msg, Some(data), context, flags)
    })
}

unsafe extern "C" fn msg_injectdata(ep: Ep, buf: CPtr, len: usize, data: u64, dest: u64) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        post_send(
            ep,
            buf,
            len,
            dest,
            Space::Msg,
            Some(data),
            std::ptr::null_mut(),
            INJECT_CALL,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tag_recv(
    ep: Ep,
    buf: Ptr,
    len: usize,
    _desc: Ptr,
    src: u64,
    tag: u64,
    ignore: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, false);
        post_recv(
            ep,
            buf,
            len,
            src,
            Space::Tagged(tag),
            ignore,
            context,
            flags,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tag_recvv(
    ep: Ep,
    iov: Iov,
    _desc: Desc,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_iov(iov, count) {
            Ok((buf, len)) => {
                let flags = default_flags(ep, false);
                post_recv(
                    ep,
                    buf as Ptr,
                    len,
                    src,
                    Space::Tagged(tag),
                    ignore,
                    context,
                    flags,
                )
            }
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn tag_recvmsg(ep: Ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        let Some(m) = msg.as_ref() else {
            return err(sys::FI_EINVAL) as isize;
        };
        match one_iov(m.msg_iov, m.iov_count) {
            Ok((buf, len)) => post_recv(
                ep,
                buf as Ptr,
                len,
                m.addr,
                Space::Tagged(m.tag),
                m.ignore,
                m.context,
                flags,
            ),
            Err(rc) => rc,
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tag_send(
    ep: Ep,
    buf: CPtr,
    len: usize,
    _desc: Ptr,
    dest: u64,
    tag: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_send(ep, buf, len, dest, Space::Tagged(tag), None, context, flags)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tag_sendv(
    ep: Ep,
    iov: Iov,
    _desc: Desc,
    count: usize,
    dest: u64,
    tag: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_sendv(
            ep,
            iov,
            count,
            dest,
            Space::Tagged(tag),
            None,
            context,
            flags,
        )
    })
}

unsafe extern "C" fn tag_sendmsg(ep: Ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        let Some(m) = msg.as_ref() else {
            return err(sys::FI_EINVAL) as isize;
        };
        let data = (flags & REMOTE_CQ_DATA != 0).then_some(m.data);
        let space = Space::Tagged(m.tag);
        post_sendv(
            ep,
            m.msg_iov,
            m.iov_count,
            m.addr,
            space,
            data,
            m.context,
            flags,
        )
    })
}

unsafe extern "C" fn tag_inject(ep: Ep, buf: CPtr, len: usize, dest: u64, tag: u64) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        post_send(
            ep,
            buf,
            len,
            dest,
            Space::Tagged(tag),
            None,
            std::ptr::null_mut(),
            INJECT_CALL,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tag_senddata(
    ep: Ep,
    buf: CPtr,
    len: usize,
    _desc: Ptr,
    data: u64,
    dest: u64,
    tag: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_send(
            ep,
            buf,
            len,
            dest,
            Space::Tagged(tag),
            Some(data),
            context,
            flags,
        )
    })
}

unsafe extern "C" fn tag_injectdata(
    ep: Ep,
    buf: CPtr,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let tagged = Space::Tagged(tag);
        post_send(
            ep,
            buf,
            len,
            dest,
            tagged,
            Some(data),
            std::ptr::null_mut(),
            INJECT_CALL,
        )
    })
}

/// An RMA read or write of `len` bytes at `buf` with the target's memory
/// at `addr` under `key`.
///
/// # Safety
/// As [`post_send`].
#[allow(clippy::too_many_arguments)]
unsafe fn post_rma(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
    write: bool,
    data: Option<u64>,
    context: *mut c_void,
    flags: u64,
) -> isize {
    // SAFETY: a fid_ep starts with its fid.
    let Some(ep) = (unsafe { EpObj::from_fid(ep.cast()) }) else {
        return err(sys::FI_EINVAL) as isize;
    };
    let inject = flags & INJECT != 0;
    if len > ep.max_msg || (inject && (len > INJECT_SIZE || !write)) {
        return err(sys::FI_EINVAL) as isize;
    }
    // SAFETY: the caller's promise.
    let mem = match unsafe { lent(buf, len) } {
        Ok(m) => m,
        Err(rc) => return rc,
    };
    let selective = {
        let b = ep.bound();
        if !b.enabled {
            return err(sys::FI_EOPBADSTATE) as isize;
        }
        b.selective
    };
    post_rc(ep.domain().engine.rma(
        ep.number,
        RmaArgs {
            context: context as u64,
            to: dest,
            mem,
            addr,
            key,
            write,
            data,
            inject,
            completion: flags & INJECT_CALL != INJECT_CALL
                && (!selective || flags & COMPLETION != 0),
        },
    ))
}

/// The one RMA I/O vector entry of a message (rma_iov_limit 1).
///
/// # Safety
/// `msg` is null or a valid message whose vectors hold their counts.
unsafe fn one_rma<'a>(
    msg: *const sys::fi_msg_rma,
) -> Result<(&'a sys::fi_msg_rma, *const c_void, usize, u64, u64), isize> {
    // SAFETY: the caller's promise.
    let m = unsafe { msg.as_ref() }.ok_or_else(|| err(sys::FI_EINVAL) as isize)?;
    // SAFETY: as above.
    let (buf, len) = unsafe { one_iov(m.msg_iov, m.iov_count) }?;
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(err(sys::FI_EINVAL) as isize);
    }
    // SAFETY: one entry, checked non-null.
    let r = unsafe { &*m.rma_iov };
    if r.len != len {
        return Err(err(sys::FI_EINVAL) as isize);
    }
    Ok((m, buf, len, r.addr, r.key))
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_read(
    ep: Ep,
    buf: Ptr,
    len: usize,
    _desc: Ptr,
    src: u64,
    addr: u64,
    key: u64,
    context: Ptr,
) -> isize {
    // SAFETY: libfabric's arguments (each function below likewise).
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_rma(ep, buf, len, src, addr, key, false, None, context, flags)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_readv(
    ep: Ep,
    iov: Iov,
    _desc: Desc,
    count: usize,
    src: u64,
    addr: u64,
    key: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_iov(iov, count) {
            Ok((buf, len)) => {
                let flags = default_flags(ep, true);
                post_rma(ep, buf, len, src, addr, key, false, None, context, flags)
            }
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn rma_readmsg(ep: Ep, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_rma(msg) {
            Ok((m, buf, len, addr, key)) => post_rma(
                ep, buf, len, m.addr, addr, key, false, None, m.context, flags,
            ),
            Err(rc) => rc,
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_write(
    ep: Ep,
    buf: CPtr,
    len: usize,
    _desc: Ptr,
    dest: u64,
    addr: u64,
    key: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_rma(ep, buf, len, dest, addr, key, true, None, context, flags)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_writev(
    ep: Ep,
    iov: Iov,
    _desc: Desc,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_iov(iov, count) {
            Ok((buf, len)) => {
                let flags = default_flags(ep, true);
                post_rma(ep, buf, len, dest, addr, key, true, None, context, flags)
            }
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn rma_writemsg(ep: Ep, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_rma(msg) {
            Ok((m, buf, len, addr, key)) => {
                let data = (flags & REMOTE_CQ_DATA != 0).then_some(m.data);
                post_rma(
                    ep, buf, len, m.addr, addr, key, true, data, m.context, flags,
                )
            }
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn rma_inject(
    ep: Ep,
    buf: CPtr,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let null = std::ptr::null_mut();
        post_rma(ep, buf, len, dest, addr, key, true, None, null, INJECT_CALL)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_writedata(
    ep: Ep,
    buf: CPtr,
    len: usize,
    _desc: Ptr,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_rma(
            ep,
            buf,
            len,
            dest,
            addr,
            key,
            true,
            Some(data),
            context,
            flags,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_injectdata(
    ep: Ep,
    buf: CPtr,
    len: usize,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let null = std::ptr::null_mut();
        post_rma(
            ep,
            buf,
            len,
            dest,
            addr,
            key,
            true,
            Some(data),
            null,
            INJECT_CALL,
        )
    })
}

/// Reads the 8-byte operand at `p` (zero for null, as FI_ATOMIC_READ may
/// pass).
///
/// # Safety
/// `p` is null or 8 readable bytes.
unsafe fn operand(p: *const c_void) -> u64 {
    if p.is_null() {
        0
    } else {
        // SAFETY: the caller's promise; unaligned reads are fine.
        unsafe { p.cast::<u64>().read_unaligned() }
    }
}

/// One atomic of `count` elements (1) of `dt` with `op`.
///
/// # Safety
/// As [`post_send`]; `buf`, `compare` and `result` are null or hold one
/// element each.
#[allow(clippy::too_many_arguments)]
unsafe fn post_atomic(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    compare: *const c_void,
    result: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    class: Class,
    context: *mut c_void,
    flags: u64,
) -> isize {
    // SAFETY: a fid_ep starts with its fid.
    let Some(ep) = (unsafe { EpObj::from_fid(ep.cast()) }) else {
        return err(sys::FI_EINVAL) as isize;
    };
    if !atomic::supported(ep.domain().engine.atomics(), dt, op, class) {
        return err(sys::FI_EOPNOTSUPP) as isize;
    }
    if count != 1 || (class == Class::Compare && compare.is_null()) {
        return err(sys::FI_EINVAL) as isize;
    }
    if op != sys::FI_ATOMIC_READ && buf.is_null() {
        return err(sys::FI_EINVAL) as isize;
    }
    let selective = {
        let b = ep.bound();
        if !b.enabled {
            return err(sys::FI_EOPBADSTATE) as isize;
        }
        b.selective
    };
    // SAFETY: the caller's promise, for each.
    let (value, expected) = unsafe { (operand(buf), operand(compare)) };
    let Some(what) = atomic::op_of(op, class, value, expected) else {
        return err(sys::FI_EOPNOTSUPP) as isize;
    };
    // SAFETY: the caller's promise: the result lives until completion.
    let result = match unsafe { lent(result, if class == Class::Plain { 0 } else { 8 }) } {
        Ok(m) => m,
        Err(rc) => return rc,
    };
    post_rc(ep.domain().engine.atomic(
        ep.number,
        AtomicArgs {
            context: context as u64,
            to: dest,
            addr,
            key,
            op: what,
            result,
            completion: flags & INJECT_CALL != INJECT_CALL
                && (!selective || flags & COMPLETION != 0),
        },
    ))
}

/// The one element of an atomic message: (origin, target address, key).
///
/// # Safety
/// `msg` is null or a valid message whose vectors hold their counts.
unsafe fn one_atomic<'a>(
    msg: *const sys::fi_msg_atomic,
) -> Result<(&'a sys::fi_msg_atomic, *const c_void, usize, u64, u64), isize> {
    // SAFETY: the caller's promise.
    let m = unsafe { msg.as_ref() }.ok_or_else(|| err(sys::FI_EINVAL) as isize)?;
    if m.iov_count != 1 || m.msg_iov.is_null() || m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(err(sys::FI_EINVAL) as isize);
    }
    // SAFETY: one entry each, checked non-null.
    let (o, t) = unsafe { (&*m.msg_iov, &*m.rma_iov) };
    Ok((m, o.addr as *const c_void, o.count, t.addr, t.key))
}

/// The one element of a result or compare vector.
///
/// # Safety
/// `ioc` is null or holds `count` entries.
unsafe fn one_ioc(ioc: *const sys::fi_ioc, count: usize) -> Result<*mut c_void, isize> {
    if count != 1 || ioc.is_null() {
        return Err(err(sys::FI_EINVAL) as isize);
    }
    // SAFETY: one entry, checked non-null.
    Ok(unsafe { &*ioc }.addr)
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_write(
    ep: Ep,
    buf: CPtr,
    count: usize,
    _desc: Ptr,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    context: Ptr,
) -> isize {
    // SAFETY: libfabric's arguments (each function below likewise).
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        let null = std::ptr::null_mut();
        post_atomic(
            ep,
            buf,
            count,
            null,
            null,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Plain,
            context,
            flags,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_writev(
    ep: Ep,
    iov: Ioc,
    _desc: Desc,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        if count != 1 || iov.is_null() {
            return err(sys::FI_EINVAL) as isize;
        }
        let v = &*iov;
        let flags = default_flags(ep, true);
        let null = std::ptr::null_mut();
        post_atomic(
            ep,
            v.addr,
            v.count,
            null,
            null,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Plain,
            context,
            flags,
        )
    })
}

unsafe extern "C" fn amo_writemsg(ep: Ep, msg: *const sys::fi_msg_atomic, flags: u64) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        match one_atomic(msg) {
            Ok((m, buf, count, addr, key)) => {
                let null = std::ptr::null_mut();
                let (dt, op) = (m.datatype, m.op);
                post_atomic(
                    ep,
                    buf,
                    count,
                    null,
                    null,
                    m.addr,
                    addr,
                    key,
                    dt,
                    op,
                    Class::Plain,
                    m.context,
                    flags,
                )
            }
            Err(rc) => rc,
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_inject(
    ep: Ep,
    buf: CPtr,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let null = std::ptr::null_mut();
        post_atomic(
            ep,
            buf,
            count,
            null,
            null,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Plain,
            null,
            INJECT_CALL,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_readwrite(
    ep: Ep,
    buf: CPtr,
    count: usize,
    _desc: Ptr,
    result: Ptr,
    _result_desc: Ptr,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        let null = std::ptr::null();
        post_atomic(
            ep,
            buf,
            count,
            null,
            result,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Fetch,
            context,
            flags,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_readwritev(
    ep: Ep,
    iov: Ioc,
    _desc: Desc,
    count: usize,
    resultv: IocMut,
    _result_desc: Desc,
    result_count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let result = match one_ioc(resultv, result_count) {
            Ok(r) => r,
            Err(rc) => return rc,
        };
        let (buf, n) = match (count, iov.is_null()) {
            (0, _) => (std::ptr::null(), 1),
            (1, false) => ((*iov).addr as CPtr, (*iov).count),
            _ => return err(sys::FI_EINVAL) as isize,
        };
        let flags = default_flags(ep, true);
        let null = std::ptr::null();
        post_atomic(
            ep,
            buf,
            n,
            null,
            result,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Fetch,
            context,
            flags,
        )
    })
}

unsafe extern "C" fn amo_readwritemsg(
    ep: Ep,
    msg: *const sys::fi_msg_atomic,
    resultv: IocMut,
    _result_desc: Desc,
    result_count: usize,
    flags: u64,
) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        let result = match one_ioc(resultv, result_count) {
            Ok(r) => r,
            Err(rc) => return rc,
        };
        match one_atomic(msg) {
            Ok((m, buf, count, addr, key)) => {
                let null = std::ptr::null();
                let (dt, op) = (m.datatype, m.op);
                post_atomic(
                    ep,
                    buf,
                    count,
                    null,
                    result,
                    m.addr,
                    addr,
                    key,
                    dt,
                    op,
                    Class::Fetch,
                    m.context,
                    flags,
                )
            }
            Err(rc) => rc,
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_compwrite(
    ep: Ep,
    buf: CPtr,
    count: usize,
    _desc: Ptr,
    compare: CPtr,
    _compare_desc: Ptr,
    result: Ptr,
    _result_desc: Ptr,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let flags = default_flags(ep, true);
        post_atomic(
            ep,
            buf,
            count,
            compare,
            result,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Compare,
            context,
            flags,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn amo_compwritev(
    ep: Ep,
    iov: Ioc,
    _desc: Desc,
    count: usize,
    comparev: Ioc,
    _compare_desc: Desc,
    compare_count: usize,
    resultv: IocMut,
    _result_desc: Desc,
    result_count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Op,
    context: Ptr,
) -> isize {
    // SAFETY: as above.
    guard_size(|| unsafe {
        let (compare, result) = match (
            one_ioc(comparev, compare_count),
            one_ioc(resultv, result_count),
        ) {
            (Ok(c), Ok(r)) => (c, r),
            (Err(rc), _) | (_, Err(rc)) => return rc,
        };
        if count != 1 || iov.is_null() {
            return err(sys::FI_EINVAL) as isize;
        }
        let v = &*iov;
        let flags = default_flags(ep, true);
        post_atomic(
            ep,
            v.addr,
            v.count,
            compare,
            result,
            dest,
            addr,
            key,
            dt,
            op,
            Class::Compare,
            context,
            flags,
        )
    })
}

unsafe extern "C" fn amo_compwritemsg(
    ep: Ep,
    msg: *const sys::fi_msg_atomic,
    comparev: Ioc,
    _compare_desc: Desc,
    compare_count: usize,
    resultv: IocMut,
    _result_desc: Desc,
    result_count: usize,
    flags: u64,
) -> isize {
    let flags = caller_flags(flags);
    // SAFETY: as above.
    guard_size(|| unsafe {
        let (compare, result) = match (
            one_ioc(comparev, compare_count),
            one_ioc(resultv, result_count),
        ) {
            (Ok(c), Ok(r)) => (c, r),
            (Err(rc), _) | (_, Err(rc)) => return rc,
        };
        match one_atomic(msg) {
            Ok((m, buf, count, addr, key)) => {
                let (dt, op) = (m.datatype, m.op);
                post_atomic(
                    ep,
                    buf,
                    count,
                    compare,
                    result,
                    m.addr,
                    addr,
                    key,
                    dt,
                    op,
                    Class::Compare,
                    m.context,
                    flags,
                )
            }
            Err(rc) => rc,
        }
    })
}

/// `fi_atomicvalid` and its fetch and compare forms: one element where the
/// provider does the operation, -FI_EOPNOTSUPP where it does not.
///
/// # Safety
/// `ep` is null or a live fid; `count` is null or writable.
unsafe fn valid(ep: Ep, dt: Dt, op: Op, count: *mut usize, class: Class) -> c_int {
    // SAFETY: the caller's promise.
    let Some(ep) = (unsafe { EpObj::from_fid(ep.cast()) }) else {
        return err(sys::FI_EINVAL);
    };
    if count.is_null() {
        return err(sys::FI_EINVAL);
    }
    if !atomic::supported(ep.domain().engine.atomics(), dt, op, class) {
        return err(sys::FI_EOPNOTSUPP);
    }
    // SAFETY: checked non-null.
    unsafe { *count = 1 };
    0
}

unsafe extern "C" fn amo_writevalid(ep: Ep, dt: Dt, op: Op, count: *mut usize) -> c_int {
    // SAFETY: as above.
    guard(|| unsafe { valid(ep, dt, op, count, Class::Plain) })
}

unsafe extern "C" fn amo_readwritevalid(ep: Ep, dt: Dt, op: Op, count: *mut usize) -> c_int {
    // SAFETY: as above.
    guard(|| unsafe { valid(ep, dt, op, count, Class::Fetch) })
}

unsafe extern "C" fn amo_compwritevalid(ep: Ep, dt: Dt, op: Op, count: *mut usize) -> c_int {
    // SAFETY: as above.
    guard(|| unsafe { valid(ep, dt, op, count, Class::Compare) })
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
        let max_msg = match unsafe { info.ep_attr.as_ref() } {
            Some(attr) if attr.type_ != sys::FI_EP_RDM && attr.type_ != sys::FI_EP_UNSPEC => {
                return err(sys::FI_EINVAL);
            }
            Some(attr) if attr.max_msg_size > 0 => attr.max_msg_size,
            _ => usize::MAX,
        };
        // SAFETY: null or valid attribute structs.
        let tx_flags = unsafe { info.tx_attr.as_ref() }.map_or(0, |a| a.op_flags);
        // SAFETY: as above.
        let rx_flags = unsafe { info.rx_attr.as_ref() }.map_or(0, |a| a.op_flags);
        // SAFETY: as above.
        let rx_caps = unsafe { info.rx_attr.as_ref() }.map_or(0, |a| a.caps);
        let directed = (info.caps | rx_caps) & sys::FI_DIRECTED_RECV != 0;
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
            tx_flags,
            rx_flags,
            max_msg,
            directed,
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
        ep.domain().engine.close(ep.number);
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
        let mut targets = Targets::default();
        // SAFETY (each): bound objects are live while bound (their users
        // count keeps them from closing).
        if let Some(av) = b.av {
            // SAFETY: as above.
            targets.av = Some(unsafe { &*av }.shared());
        }
        if let Some(cq) = b.tx_cq {
            // SAFETY: as above.
            targets.tx = Some(unsafe { &*cq }.shared());
        }
        if let Some(cq) = b.rx_cq {
            // SAFETY: as above.
            targets.rx = Some(unsafe { &*cq }.shared());
        }
        for &(c, flags) in &b.cntrs {
            // SAFETY: as above.
            targets.counters.push((unsafe { &*c }.shared(), flags));
        }
        ep.domain().engine.open(ep.number, targets);
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

/// Cancels the posted receive of `context`: it completes with
/// FI_ECANCELED; -FI_ENOENT when none is posted (sends run to their end).
unsafe extern "C" fn cancel(fid: *mut sys::fid, context: *mut c_void) -> isize {
    guard_size(|| {
        // SAFETY: libfabric passes the endpoint's fid.
        let Some(ep) = (unsafe { EpObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL) as isize;
        };
        if ep.domain().engine.cancel(ep.number, context as u64) {
            0
        } else {
            err(sys::FI_ENOENT) as isize
        }
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
