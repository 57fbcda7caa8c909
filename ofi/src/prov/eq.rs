//! Event queues (`fi_eq_open`). The provider reports nothing through one:
//! FI_EP_RDM has no connection events, address vectors insert
//! synchronously, and asynchronous errors come as error completions on
//! the queues of the operations they fail. An event queue still opens, as
//! fi_pingpong and fabtests open one whatever the endpoint type, and it
//! carries what the application writes into it (`fi_eq_write`), in order;
//! `fi_eq_sread` waits for such a write.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::fabric::Fabric;
use super::{err, fid_ops, guard, guard_size, object, Shared};
use crate::flags::PEEK;
use crate::sys;

/// Most events an event queue holds (writes past it are -FI_EAGAIN).
const EQ_SIZE: usize = 1024;
/// Most bytes of one event.
const EVENT_MAX: usize = 4096;

/// One written event.
struct Event {
    kind: u32,
    data: Vec<u8>,
}

/// The provider's event queue: libfabric's `fid_eq` first.
#[repr(C)]
struct EqObj {
    eq: sys::fid_eq,
    fabric: *const Fabric,
    events: Mutex<VecDeque<Event>>,
    written: Condvar,
}

static FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(close, None, None));

static EQ_OPS: Shared<sys::fi_ops_eq> = Shared::new(sys::fi_ops_eq {
    size: std::mem::size_of::<sys::fi_ops_eq>(),
    read: Some(read),
    readerr: Some(readerr),
    write: Some(write),
    sread: Some(sread),
    strerror: Some(strerror),
});

impl EqObj {
    /// The provider's event queue behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a EqObj> {
        // SAFETY: the caller's promise; our EQ fids start an `EqObj`.
        unsafe { object(fid, sys::FI_CLASS_EQ, &FID_OPS) }
    }

    fn events(&self) -> MutexGuard<'_, VecDeque<Event>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `fi_eq_open` on the provider's fabric.
pub(super) unsafe extern "C" fn open(
    fabric: *mut sys::fid_fabric,
    attr: *mut sys::fi_eq_attr,
    eq: *mut *mut sys::fid_eq,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_fabric starts with its fid.
        let Some(parent) = (unsafe { Fabric::from_fid(fabric.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if attr.is_null() || eq.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: checked non-null; the caller's attributes.
        let attr = unsafe { &*attr };
        if attr.flags & !u64::from(sys::FI_WRITE) != 0 {
            return err(sys::FI_EBADFLAGS);
        }
        if !matches!(attr.wait_obj, sys::FI_WAIT_NONE | sys::FI_WAIT_UNSPEC)
            || !attr.wait_set.is_null()
        {
            return err(sys::FI_ENOSYS);
        }
        let object = Box::new(EqObj {
            eq: sys::fid_eq {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_EQ as usize,
                    context,
                    ops: FID_OPS.get(),
                },
                ops: EQ_OPS.get(),
            },
            fabric: parent,
            events: Mutex::new(VecDeque::new()),
            written: Condvar::new(),
        });
        parent.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: libfabric's out-parameter, checked non-null; freed by
        // `close`.
        unsafe { *eq = Box::into_raw(object).cast() };
        0
    })
}

unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(eq) = (unsafe { EqObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        // SAFETY: an EQ's fabric cannot close before it (EBUSY).
        unsafe { &*eq.fabric }
            .children
            .fetch_sub(1, Ordering::AcqRel);
        // SAFETY: ours (checked), made by `open` with Box::into_raw, and
        // not used by libfabric after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<EqObj>()) });
        0
    })
}

/// Takes (or with FI_PEEK, copies) the oldest event into `event` and
/// `buf`; -FI_EAGAIN when there is none, -FI_ETOOSMALL when `len` cannot
/// hold it (it stays).
///
/// # Safety
/// `event` is null or writable; `buf` has `len` writable bytes.
unsafe fn take(
    events: &mut VecDeque<Event>,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    let Some(head) = events.front() else {
        return err(sys::FI_EAGAIN) as isize;
    };
    if head.data.len() > len || (buf.is_null() && !head.data.is_empty()) {
        return err(sys::FI_ETOOSMALL) as isize;
    }
    let n = head.data.len();
    // SAFETY: the caller's promise; `n` fits `len` (checked).
    unsafe {
        if !event.is_null() {
            *event = head.kind;
        }
        if n > 0 {
            std::ptr::copy_nonoverlapping(head.data.as_ptr(), buf.cast::<u8>(), n);
        }
    }
    if flags & PEEK == 0 {
        events.pop_front();
    }
    n as isize
}

unsafe extern "C" fn read(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    // SAFETY: forwarded as received; a read waits for nothing.
    unsafe { sread(eq, event, buf, len, 0, flags) }
}

/// Waits up to `timeout` ms (negative: no limit; 0: not at all) for an
/// event written into the queue, and takes it.
unsafe extern "C" fn sread(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    guard_size(|| {
        // SAFETY: a fid_eq starts with its fid.
        let Some(eq) = (unsafe { EqObj::from_fid(eq.cast()) }) else {
            return err(sys::FI_EINVAL) as isize;
        };
        if flags & !PEEK != 0 {
            return err(sys::FI_EBADFLAGS) as isize;
        }
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        let mut events = eq.events();
        while events.is_empty() {
            events = match deadline {
                None => eq.written.wait(events).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return err(sys::FI_EAGAIN) as isize;
                    }
                    eq.written
                        .wait_timeout(events, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        // SAFETY: the caller's buffers.
        unsafe { take(&mut events, event, buf, len, flags) }
    })
}

unsafe extern "C" fn readerr(
    eq: *mut sys::fid_eq,
    buf: *mut sys::fi_eq_err_entry,
    _flags: u64,
) -> isize {
    guard_size(|| {
        // SAFETY: a fid_eq starts with its fid.
        if unsafe { EqObj::from_fid(eq.cast()) }.is_none() || buf.is_null() {
            return err(sys::FI_EINVAL) as isize;
        }
        // The provider reports no errors through an event queue.
        err(sys::FI_EAGAIN) as isize
    })
}

unsafe extern "C" fn write(
    eq: *mut sys::fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    flags: u64,
) -> isize {
    guard_size(|| {
        // SAFETY: a fid_eq starts with its fid.
        let Some(eq) = (unsafe { EqObj::from_fid(eq.cast()) }) else {
            return err(sys::FI_EINVAL) as isize;
        };
        if flags != 0 {
            return err(sys::FI_EBADFLAGS) as isize;
        }
        if len > EVENT_MAX || (buf.is_null() && len > 0) {
            return err(sys::FI_EINVAL) as isize;
        }
        let data = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller's `len` readable bytes (checked non-null).
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec()
        };
        let mut events = eq.events();
        if events.len() >= EQ_SIZE {
            return err(sys::FI_EAGAIN) as isize;
        }
        events.push_back(Event { kind: event, data });
        drop(events);
        eq.written.notify_all();
        len as isize
    })
}

unsafe extern "C" fn strerror(
    _eq: *mut sys::fid_eq,
    _prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: libfabric passes null or a buffer of `len` bytes.
    unsafe {
        super::strerror_into(
            c"the xrc provider reports no errors on event queues",
            buf,
            len,
        )
    }
}
