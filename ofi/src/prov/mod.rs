//! The extern "C" layer libfabric calls: the provider's entry point
//! (`fi_prov_ini`), its `fi_provider` and the ops tables of its fids. Every
//! `unsafe` of the crate lives here, each block with its `// SAFETY:` line;
//! every entry point runs inside [`guard`], so that a panic becomes a
//! negative `FI_E*` value and never unwinds into C. What the entry points
//! decide is decided by the safe modules beside this one ([`crate::info`]
//! and the rest); this layer only copies between libfabric's structs and
//! theirs.

mod av;
mod cq;
mod domain;
mod ep;
mod eq;
mod fabric;
mod getinfo;
mod mem;
mod mr;

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::info::{API_VERSION, PROVIDER_VERSION};
use crate::sys;

/// The provider's name, as `FI_PROVIDER=xrc` and `fi_info -p xrc` name it.
pub(crate) const NAME: &std::ffi::CStr = c"xrc";

/// A negative `FI_E*` value, as every entry point returns an error. Where
/// the caller asked libfabric for a log, each error but FI_EAGAIN (flow
/// control) and FI_EAVAIL (an error completion to read, which the entry
/// reports) is said with the line that returned it: an application that
/// treats an error as fatal shows nothing else of which check refused it.
#[track_caller]
pub(crate) fn err(code: u32) -> c_int {
    if code != sys::FI_EAGAIN && code != sys::FI_EAVAIL && logging() {
        let at = std::panic::Location::caller();
        warn(&format!("returned -{code} at {}:{}", at.file(), at.line()));
    }
    -(code as c_int)
}

/// Whether `FI_LOG_LEVEL` is set (read once).
fn logging() -> bool {
    static LOGGING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOGGING.get_or_init(|| std::env::var_os("FI_LOG_LEVEL").is_some())
}

/// Says why an object could not be made, on standard error, where the
/// caller asked libfabric for a log (`FI_LOG_LEVEL` set): the error code
/// alone cannot say which port or device failed. One write per line, so
/// that processes sharing a stderr do not interleave their lines.
pub(crate) fn warn(what: &str) {
    if logging() {
        let line = format!("libfabric:{}:xrc: {what}\n", std::process::id());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
}

/// A `strerror` entry point's answer: `text` itself where the caller gave
/// no buffer, else as much of it as `buf`'s `len` bytes hold with its NUL,
/// and `buf`.
///
/// # Safety
/// `buf` is null or has `len` writable bytes.
pub(crate) unsafe fn strerror_into(
    text: &'static std::ffi::CStr,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    if buf.is_null() || len == 0 {
        return text.as_ptr();
    }
    let text = text.to_bytes();
    let n = text.len().min(len - 1);
    // SAFETY: `buf` has `len` bytes (the caller's promise): n of text and
    // the NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    buf
}

/// Runs an entry point's body; a panic in it is `-FI_EOTHER`. (Locks a
/// panic poisons are taken over by the next caller: every object's state
/// stays consistent between the steps of its methods.)
pub(crate) fn guard(body: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| err(sys::FI_EOTHER))
}

/// As [`guard`], for the entry points that return `ssize_t`.
pub(crate) fn guard_size(body: impl FnOnce() -> isize) -> isize {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| err(sys::FI_EOTHER) as isize)
}

/// The provider's object behind `fid`, or None for a null fid, another
/// class's, or another provider's. Every fid of the provider points at a
/// static ops table of its kind, so only the header every fid shares is
/// read until that pointer shows the fid is one of ours.
///
/// # Safety
/// `fid` is null or points to a live `struct fid`; `T` is the `#[repr(C)]`
/// object whose first field holds the fids of class `class` with `ops`.
pub(crate) unsafe fn object<'a, T>(
    fid: *const sys::fid,
    class: u32,
    ops: &Shared<sys::fi_ops>,
) -> Option<&'a T> {
    // SAFETY: the caller's promise.
    let header = unsafe { fid.as_ref() }?;
    if header.fclass != class as usize || header.ops != ops.get() {
        return None;
    }
    // SAFETY: ours, so the first field of a live `T` (the caller's promise
    // about `class` and `ops`).
    Some(unsafe { &*fid.cast::<T>() })
}

/// A value libfabric is handed a `*mut` to and that lives as long as the
/// process: the provider struct (libfabric writes its own bookkeeping into
/// `context`) and the ops tables (never written, but typed `*mut`).
pub(crate) struct Shared<T>(UnsafeCell<T>);

// SAFETY: the provider never reads or writes a `Shared` value after
// building it; libfabric alone writes the provider's `context`, under its
// own initialization lock.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// Wraps a value built at compile time.
    pub(crate) const fn new(value: T) -> Self {
        Shared(UnsafeCell::new(value))
    }

    /// The pointer libfabric keeps.
    pub(crate) const fn get(&self) -> *mut T {
        self.0.get()
    }
}

/// A fid's `close`.
pub(crate) type CloseFn = unsafe extern "C" fn(*mut sys::fid) -> c_int;
/// A fid's `bind`.
pub(crate) type BindFn = unsafe extern "C" fn(*mut sys::fid, *mut sys::fid, u64) -> c_int;
/// A fid's `control`.
pub(crate) type ControlFn = unsafe extern "C" fn(*mut sys::fid, c_int, *mut c_void) -> c_int;

/// The generic ops of one kind of fid: its `close`, its `bind` and
/// `control` where it has them (-FI_ENOSYS where it does not: nothing to
/// bind to it, no commands), and no extensions (`ops_open`).
pub(crate) const fn fid_ops(
    close: CloseFn,
    bind: Option<BindFn>,
    control: Option<ControlFn>,
) -> sys::fi_ops {
    sys::fi_ops {
        size: std::mem::size_of::<sys::fi_ops>(),
        close: Some(close),
        bind: match bind {
            Some(b) => Some(b),
            None => Some(no_bind),
        },
        control: match control {
            Some(c) => Some(c),
            None => Some(no_control),
        },
        ops_open: Some(no_ops_open),
        tostr: None,
        ops_set: None,
    }
}

unsafe extern "C" fn no_bind(_: *mut sys::fid, _: *mut sys::fid, _: u64) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_control(_: *mut sys::fid, _: c_int, _: *mut c_void) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_ops_open(
    _: *mut sys::fid,
    _: *const c_char,
    _: u64,
    _: *mut *mut c_void,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

static PROVIDER: Shared<sys::fi_provider> = Shared::new(sys::fi_provider {
    version: PROVIDER_VERSION,
    fi_version: API_VERSION,
    context: sys::fi_context {
        internal: [std::ptr::null_mut(); 4],
    },
    name: NAME.as_ptr(),
    getinfo: Some(getinfo::getinfo),
    fabric: Some(fabric::open),
    cleanup: Some(cleanup),
});

/// What libfabric looks up in every `*fi.so` of `FI_PROVIDER_PATH`: the
/// provider's description and entry points.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut sys::fi_provider {
    PROVIDER.get()
}

/// Called once when libfabric unloads the provider: nothing of the
/// provider's outlives its fids, which the caller closed.
unsafe extern "C" fn cleanup() {}
