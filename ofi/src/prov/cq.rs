//! Completion queues (`fi_cq_open`) in every format, and counters
//! (`fi_cntr_open`). Reading either drives the domain's progress first
//! (FI_PROGRESS_MANUAL); the queues' order and their errors are
//! [`crate::cq`]'s.
//!
//! Waiting (`fi_cq_sread`, `fi_cntr_wait`) polls progress until the
//! condition holds or the timeout passes: there is no wait object
//! (FI_WAIT_NONE is what the provider offers; FI_WAIT_UNSPEC gets this
//! polling).

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::domain::Domain;
use super::{err, fid_ops, guard, object, Shared};
use crate::cq::{CompletionQueue, Counter, Entry, ErrEntry, ProvErr, Read};
use crate::engine::{SharedCounter, SharedCq};
use crate::info::QUEUE_SIZE;
use crate::sys;

/// The provider's completion queue: libfabric's `fid_cq` first.
#[repr(C)]
pub(crate) struct CqObj {
    cq: sys::fid_cq,
    domain: *const Domain,
    format: sys::fi_cq_format,
    queue: SharedCq,
    /// `fi_cq_signal` was called: a waiting read returns.
    signalled: AtomicBool,
    /// Endpoint bindings to it: it closes only when none are left.
    pub(crate) users: AtomicUsize,
}

/// The provider's counter: libfabric's `fid_cntr` first.
#[repr(C)]
pub(crate) struct CntrObj {
    cntr: sys::fid_cntr,
    domain: *const Domain,
    counter: SharedCounter,
    /// Endpoint bindings to it: it closes only when none are left.
    pub(crate) users: AtomicUsize,
}

// No wait set binds to a queue or counter, and no wait object is handed
// out (FI_GETWAIT): -FI_ENOSYS.
static CQ_FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(cq_close, None, None));

static CQ_OPS: Shared<sys::fi_ops_cq> = Shared::new(sys::fi_ops_cq {
    size: std::mem::size_of::<sys::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
});

static CNTR_FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(cntr_close, None, None));

static CNTR_OPS: Shared<sys::fi_ops_cntr> = Shared::new(sys::fi_ops_cntr {
    size: std::mem::size_of::<sys::fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
});

impl CqObj {
    /// The provider's completion queue behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a CqObj> {
        // SAFETY: the caller's promise; our CQ fids start a `CqObj`.
        unsafe { object(fid, sys::FI_CLASS_CQ, &CQ_FID_OPS) }
    }

    /// Its queue, as the engine shares it.
    pub(crate) fn shared(&self) -> SharedCq {
        Arc::clone(&self.queue)
    }

    /// Its queue, locked.
    pub(crate) fn queue(&self) -> MutexGuard<'_, CompletionQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn domain(&self) -> &Domain {
        // SAFETY: a queue's domain cannot close before it (EBUSY).
        unsafe { &*self.domain }
    }

    /// Its domain.
    pub(crate) fn domain_ptr(&self) -> *const Domain {
        self.domain
    }
}

impl CntrObj {
    /// The provider's counter behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a CntrObj> {
        // SAFETY: the caller's promise; our counter fids start a `CntrObj`.
        unsafe { object(fid, sys::FI_CLASS_CNTR, &CNTR_FID_OPS) }
    }

    /// Its values, as the engine shares them.
    pub(crate) fn shared(&self) -> SharedCounter {
        Arc::clone(&self.counter)
    }

    /// Its values, locked.
    pub(crate) fn counter(&self) -> MutexGuard<'_, Counter> {
        self.counter.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn domain(&self) -> &Domain {
        // SAFETY: a counter's domain cannot close before it (EBUSY).
        unsafe { &*self.domain }
    }

    /// Its domain.
    pub(crate) fn domain_ptr(&self) -> *const Domain {
        self.domain
    }
}

fn wait_ok(wait_obj: sys::fi_wait_obj, wait_set: *mut sys::fid_wait) -> bool {
    matches!(wait_obj, sys::FI_WAIT_NONE | sys::FI_WAIT_UNSPEC) && wait_set.is_null()
}

/// `fi_cq_open`.
pub(super) unsafe extern "C" fn cq_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cq_attr,
    cq: *mut *mut sys::fid_cq,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_domain starts with its fid.
        let Some(d) = (unsafe { Domain::from_fid(domain.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if attr.is_null() || cq.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: checked non-null.
        let attr = unsafe { &*attr };
        let format = match attr.format {
            sys::FI_CQ_FORMAT_UNSPEC => sys::FI_CQ_FORMAT_CONTEXT,
            f @ (sys::FI_CQ_FORMAT_CONTEXT
            | sys::FI_CQ_FORMAT_MSG
            | sys::FI_CQ_FORMAT_DATA
            | sys::FI_CQ_FORMAT_TAGGED) => f,
            _ => return err(sys::FI_ENOSYS),
        };
        if !wait_ok(attr.wait_obj, attr.wait_set) || attr.wait_cond != sys::FI_CQ_COND_NONE {
            return err(sys::FI_ENOSYS);
        }
        if attr.flags != 0 {
            return err(sys::FI_EBADFLAGS);
        }
        let size = if attr.size == 0 {
            QUEUE_SIZE
        } else {
            attr.size
        };
        let object = Box::new(CqObj {
            cq: sys::fid_cq {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_CQ as usize,
                    context,
                    ops: CQ_FID_OPS.get(),
                },
                ops: CQ_OPS.get(),
            },
            domain: d,
            format,
            queue: Arc::new(Mutex::new(CompletionQueue::new(size))),
            signalled: AtomicBool::new(false),
            users: AtomicUsize::new(0),
        });
        d.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: libfabric's out-parameter, checked non-null; freed by
        // `cq_close`.
        unsafe { *cq = Box::into_raw(object).cast() };
        0
    })
}

unsafe extern "C" fn cq_close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(cq) = (unsafe { CqObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if cq.users.load(Ordering::Acquire) != 0 {
            return err(sys::FI_EBUSY);
        }
        cq.domain().children.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: ours (checked), made by `cq_open` with Box::into_raw,
        // and not used by libfabric after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<CqObj>()) });
        0
    })
}

/// Writes `e` at index `i` of the caller's array of `format` entries.
///
/// # Safety
/// `buf` holds at least `i + 1` entries of `format`.
unsafe fn put_entry(buf: *mut c_void, i: usize, format: sys::fi_cq_format, e: &Entry) {
    let context = e.context as usize as *mut c_void;
    // SAFETY: the caller's promise, for the format's own entry type.
    unsafe {
        match format {
            sys::FI_CQ_FORMAT_MSG => {
                *buf.cast::<sys::fi_cq_msg_entry>().add(i) = sys::fi_cq_msg_entry {
                    op_context: context,
                    flags: e.flags,
                    len: e.len,
                }
            }
            sys::FI_CQ_FORMAT_DATA => {
                *buf.cast::<sys::fi_cq_data_entry>().add(i) = sys::fi_cq_data_entry {
                    op_context: context,
                    flags: e.flags,
                    len: e.len,
                    buf: e.buf as usize as *mut c_void,
                    data: e.data,
                }
            }
            sys::FI_CQ_FORMAT_TAGGED => {
                *buf.cast::<sys::fi_cq_tagged_entry>().add(i) = sys::fi_cq_tagged_entry {
                    op_context: context,
                    flags: e.flags,
                    len: e.len,
                    buf: e.buf as usize as *mut c_void,
                    data: e.data,
                    tag: e.tag,
                }
            }
            _ => {
                *buf.cast::<sys::fi_cq_entry>().add(i) = sys::fi_cq_entry {
                    op_context: context,
                }
            }
        }
    }
}

/// A read of up to `count` entries (and their sources): the count read,
/// -FI_EAGAIN for none, -FI_EAVAIL when an error is next.
///
/// # Safety
/// `cq` is null or a live fid; `buf` holds `count` entries of the queue's
/// format; `src` is null or holds `count` addresses.
unsafe fn read_into(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut sys::fi_addr_t,
) -> isize {
    // SAFETY: the caller's promise; a fid_cq starts with its fid.
    let Some(cq) = (unsafe { CqObj::from_fid(cq.cast()) }) else {
        return err(sys::FI_EINVAL) as isize;
    };
    if buf.is_null() && count > 0 {
        return err(sys::FI_EINVAL) as isize;
    }
    cq.domain().progress();
    let read = cq.queue().read(count.min(isize::MAX as usize));
    match read {
        Read::Empty => err(sys::FI_EAGAIN) as isize,
        Read::ErrorFirst => err(sys::FI_EAVAIL) as isize,
        Read::Entries(entries) => {
            for (i, e) in entries.iter().enumerate() {
                // SAFETY: i < count, the caller's promise on the arrays.
                unsafe {
                    put_entry(buf, i, cq.format, e);
                    if !src.is_null() {
                        *src.add(i) = e.source;
                    }
                }
            }
            entries.len() as isize
        }
    }
}

/// Runs `read` until it finds something, the queue is signalled, or
/// `timeout` ms pass (negative: no limit).
fn wait_read(cq: *mut sys::fid_cq, timeout: c_int, mut read: impl FnMut() -> isize) -> isize {
    let start = Instant::now();
    let limit = u64::try_from(timeout).ok().map(Duration::from_millis);
    loop {
        let n = read();
        if n != err(sys::FI_EAGAIN) as isize {
            return n;
        }
        // SAFETY: `read` just found the fid to be a live queue of ours.
        if let Some(cq) = unsafe { CqObj::from_fid(cq.cast()) } {
            if cq.signalled.swap(false, Ordering::AcqRel) {
                return err(sys::FI_EAGAIN) as isize;
            }
        }
        if limit.is_some_and(|l| start.elapsed() >= l) {
            return err(sys::FI_EAGAIN) as isize;
        }
        std::thread::yield_now();
    }
}

unsafe extern "C" fn cq_read(cq: *mut sys::fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: libfabric's arguments, as `read_into` asks.
    super::guard_size(|| unsafe { read_into(cq, buf, count, std::ptr::null_mut()) })
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut sys::fi_addr_t,
) -> isize {
    // SAFETY: as above.
    super::guard_size(|| unsafe { read_into(cq, buf, count, src_addr) })
}

unsafe extern "C" fn cq_sread(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    super::guard_size(|| {
        // SAFETY: as above.
        wait_read(cq, timeout, || unsafe {
            read_into(cq, buf, count, std::ptr::null_mut())
        })
    })
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut sys::fi_addr_t,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    super::guard_size(|| {
        // SAFETY: as above.
        wait_read(cq, timeout, || unsafe {
            read_into(cq, buf, count, src_addr)
        })
    })
}

unsafe extern "C" fn cq_signal(cq: *mut sys::fid_cq) -> c_int {
    guard(|| {
        // SAFETY: a fid_cq starts with its fid.
        let Some(cq) = (unsafe { CqObj::from_fid(cq.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        cq.signalled.store(true, Ordering::Release);
        0
    })
}

unsafe extern "C" fn cq_readerr(
    cq: *mut sys::fid_cq,
    buf: *mut sys::fi_cq_err_entry,
    flags: u64,
) -> isize {
    super::guard_size(|| {
        // SAFETY: a fid_cq starts with its fid.
        let Some(cq) = (unsafe { CqObj::from_fid(cq.cast()) }) else {
            return err(sys::FI_EINVAL) as isize;
        };
        if buf.is_null() {
            return err(sys::FI_EINVAL) as isize;
        }
        if flags != 0 {
            return err(sys::FI_EBADFLAGS) as isize;
        }
        cq.domain().progress();
        let Some(e) = cq.queue().read_err() else {
            return err(sys::FI_EAGAIN) as isize;
        };
        // SAFETY: checked non-null; the caller's entry (API >= 1.5, so
        // with err_data and err_data_size).
        let out = unsafe { &mut *buf };
        write_err(out, &e);
        1
    })
}

/// Fills the caller's error entry; the provider has no error data, so
/// `err_data_size` becomes 0 and the caller's buffer is left alone.
fn write_err(out: &mut sys::fi_cq_err_entry, e: &ErrEntry) {
    out.op_context = e.entry.context as usize as *mut c_void;
    out.flags = e.entry.flags;
    out.len = e.entry.len;
    out.buf = e.entry.buf as usize as *mut c_void;
    out.data = e.entry.data;
    out.tag = e.entry.tag;
    out.olen = e.olen;
    out.err = e.err;
    out.prov_errno = e.prov_errno;
    out.err_data_size = 0;
}

unsafe extern "C" fn cq_strerror(
    _cq: *mut sys::fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: libfabric passes null or a buffer of `len` bytes.
    unsafe { super::strerror_into(ProvErr::text_c(prov_errno), buf, len) }
}

/// `fi_cntr_open`.
pub(super) unsafe extern "C" fn cntr_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cntr_attr,
    cntr: *mut *mut sys::fid_cntr,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_domain starts with its fid.
        let Some(d) = (unsafe { Domain::from_fid(domain.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if cntr.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: null (defaults) or a valid attr.
        if let Some(attr) = unsafe { attr.as_ref() } {
            if attr.events != sys::FI_CNTR_EVENTS_COMP || !wait_ok(attr.wait_obj, attr.wait_set) {
                return err(sys::FI_ENOSYS);
            }
            if attr.flags != 0 {
                return err(sys::FI_EBADFLAGS);
            }
        }
        let object = Box::new(CntrObj {
            cntr: sys::fid_cntr {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_CNTR as usize,
                    context,
                    ops: CNTR_FID_OPS.get(),
                },
                ops: CNTR_OPS.get(),
            },
            domain: d,
            counter: Arc::new(Mutex::new(Counter::default())),
            users: AtomicUsize::new(0),
        });
        d.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: libfabric's out-parameter, checked non-null; freed by
        // `cntr_close`.
        unsafe { *cntr = Box::into_raw(object).cast() };
        0
    })
}

unsafe extern "C" fn cntr_close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(c) = (unsafe { CntrObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if c.users.load(Ordering::Acquire) != 0 {
            return err(sys::FI_EBUSY);
        }
        c.domain().children.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: ours (checked), made by `cntr_open` with Box::into_raw,
        // and not used by libfabric after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<CntrObj>()) });
        0
    })
}

/// Runs `f` on the counter behind `cntr` (after progress, if `progress`);
/// a fid that is not one of ours gives `bad`.
fn with_counter<R>(
    cntr: *mut sys::fid_cntr,
    progress: bool,
    bad: impl FnOnce() -> R,
    f: impl FnOnce(&mut Counter) -> R,
) -> R {
    // SAFETY: libfabric passes a live fid; a fid_cntr starts with its fid.
    let Some(c) = (unsafe { CntrObj::from_fid(cntr.cast()) }) else {
        return bad();
    };
    if progress {
        c.domain().progress();
    }
    f(&mut c.counter())
}

unsafe extern "C" fn cntr_read(cntr: *mut sys::fid_cntr) -> u64 {
    let mut v = 0;
    guard(|| {
        v = with_counter(cntr, true, || 0, |c| c.ok);
        0
    });
    v
}

unsafe extern "C" fn cntr_readerr(cntr: *mut sys::fid_cntr) -> u64 {
    let mut v = 0;
    guard(|| {
        v = with_counter(cntr, true, || 0, |c| c.err);
        0
    });
    v
}

unsafe extern "C" fn cntr_add(cntr: *mut sys::fid_cntr, value: u64) -> c_int {
    guard(|| {
        with_counter(
            cntr,
            false,
            || err(sys::FI_EINVAL),
            |c| {
                c.ok = c.ok.wrapping_add(value);
                0
            },
        )
    })
}

unsafe extern "C" fn cntr_set(cntr: *mut sys::fid_cntr, value: u64) -> c_int {
    guard(|| {
        with_counter(
            cntr,
            false,
            || err(sys::FI_EINVAL),
            |c| {
                c.ok = value;
                0
            },
        )
    })
}

unsafe extern "C" fn cntr_adderr(cntr: *mut sys::fid_cntr, value: u64) -> c_int {
    guard(|| {
        with_counter(
            cntr,
            false,
            || err(sys::FI_EINVAL),
            |c| {
                c.err = c.err.wrapping_add(value);
                0
            },
        )
    })
}

unsafe extern "C" fn cntr_seterr(cntr: *mut sys::fid_cntr, value: u64) -> c_int {
    guard(|| {
        with_counter(
            cntr,
            false,
            || err(sys::FI_EINVAL),
            |c| {
                c.err = value;
                0
            },
        )
    })
}

/// Waits until the counter reaches `threshold` (0), an error is counted
/// while waiting (-FI_EAVAIL), or `timeout` ms pass (-FI_ETIMEDOUT;
/// negative: no limit).
unsafe extern "C" fn cntr_wait(cntr: *mut sys::fid_cntr, threshold: u64, timeout: c_int) -> c_int {
    guard(|| {
        let Some(errors) = with_counter(cntr, false, || None, |c| Some(c.err)) else {
            return err(sys::FI_EINVAL);
        };
        let start = Instant::now();
        let limit = u64::try_from(timeout).ok().map(Duration::from_millis);
        loop {
            let (ok, now_err) = with_counter(cntr, true, || (0, 0), |c| (c.ok, c.err));
            if ok >= threshold {
                return 0;
            }
            if now_err != errors {
                return err(sys::FI_EAVAIL);
            }
            if limit.is_some_and(|l| start.elapsed() >= l) {
                return err(sys::FI_ETIMEDOUT);
            }
            std::thread::yield_now();
        }
    })
}
