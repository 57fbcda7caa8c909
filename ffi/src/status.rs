//! Status codes, the per-thread message of the last failure, and the guard
//! every entry point runs its body in: a panic becomes `XRCBTL_ERR_PANIC`,
//! never an unwind into C.

use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use xrcbtl_btl::BtlError;
use xrcbtl_fabric::Error;

/// Success.
pub const XRCBTL_OK: c_int = 0;
/// An argument is wrong (a null pointer, a length, a range outside a
/// registration, an unknown setting).
pub const XRCBTL_ERR_INVALID: c_int = -1;
/// Not now: a queue, a buffer or a table is full, or (`xrcbtl_sendi`) the
/// message cannot go at once. Nothing was done; try again after progress.
pub const XRCBTL_ERR_AGAIN: c_int = -2;
/// The device or this build cannot do it (atomics on a device without
/// them, verbs in a library built without the provider).
pub const XRCBTL_ERR_UNSUPPORTED: c_int = -3;
/// A named thing does not exist (a device, a peer).
pub const XRCBTL_ERR_NOT_FOUND: c_int = -4;
/// The peer cannot be reached (connection attempts failed).
pub const XRCBTL_ERR_UNREACHABLE: c_int = -5;
/// The peer left, or was deleted, before the operation finished.
pub const XRCBTL_ERR_CLOSED: c_int = -6;
/// The device refused the transfer (a key, a range, an alignment).
pub const XRCBTL_ERR_TRANSFER: c_int = -7;
/// It did not finish in the time given.
pub const XRCBTL_ERR_TIMEOUT: c_int = -8;
/// The object is not in a state that allows it (an endpoint that failed, a
/// handle owned by a simulated job).
pub const XRCBTL_ERR_STATE: c_int = -9;
/// A verbs, RDMA CM or system call failed.
pub const XRCBTL_ERR_DEVICE: c_int = -10;
/// An internal error (a bug in xrcbtl): the handle should not be used any
/// more except to destroy it.
pub const XRCBTL_ERR_PANIC: c_int = -11;

/// What a failed call returns, and the message kept for
/// `xrcbtl_last_error`.
#[derive(Debug)]
pub(crate) struct Failure {
    pub code: c_int,
    pub msg: String,
}

impl Failure {
    pub fn new(code: c_int, msg: impl Into<String>) -> Self {
        Failure {
            code,
            msg: msg.into(),
        }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Failure::new(XRCBTL_ERR_INVALID, msg)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::Unsupported(_) => XRCBTL_ERR_UNSUPPORTED,
            Error::NoResource(_) => XRCBTL_ERR_AGAIN,
            Error::InvalidArgument(_) => XRCBTL_ERR_INVALID,
            Error::InvalidState(_) | Error::ProcessGone => XRCBTL_ERR_STATE,
            Error::NotFound(_) => XRCBTL_ERR_NOT_FOUND,
            Error::Timeout(_) => XRCBTL_ERR_TIMEOUT,
            _ => XRCBTL_ERR_DEVICE,
        };
        Failure::new(code, e.to_string())
    }
}

/// The status an operation's completion reports for a BTL error.
pub(crate) fn btl_error_code(e: &BtlError) -> c_int {
    match e {
        BtlError::Unreachable(..) => XRCBTL_ERR_UNREACHABLE,
        BtlError::Closed(_) => XRCBTL_ERR_CLOSED,
        BtlError::Transfer(_) => XRCBTL_ERR_TRANSFER,
        BtlError::UnknownPeer(_) => XRCBTL_ERR_NOT_FOUND,
    }
}

pub(crate) type Outcome<T> = std::result::Result<T, Failure>;

/// Longest message kept (longer ones are cut at a character boundary).
const LAST_MAX: usize = 512;

thread_local! {
    // A plain array: no destructor to register, so the library can be
    // unloaded from a process whose threads called it.
    static LAST: RefCell<(usize, [u8; LAST_MAX])> = const { RefCell::new((0, [0; LAST_MAX])) };
}

fn remember(msg: &str) {
    let mut n = msg.len().min(LAST_MAX);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        l.1[..n].copy_from_slice(&msg.as_bytes()[..n]);
        l.0 = n;
    });
}

/// Runs an entry point's body: its value, or the failure's code with the
/// message remembered for this thread.
pub(crate) fn guard(body: impl FnOnce() -> Outcome<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(f)) => {
            remember(&f.msg);
            f.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            remember(&format!("internal error: {what}"));
            XRCBTL_ERR_PANIC
        }
    }
}

/// The name and meaning of a status code, as a static string.
#[no_mangle]
pub extern "C" fn xrcbtl_strerror(status: c_int) -> *const c_char {
    let s: &'static [u8] = match status {
        XRCBTL_OK => b"success\0",
        XRCBTL_ERR_INVALID => b"invalid argument\0",
        XRCBTL_ERR_AGAIN => b"resources temporarily exhausted: try again after progress\0",
        XRCBTL_ERR_UNSUPPORTED => b"not supported by the device or this build\0",
        XRCBTL_ERR_NOT_FOUND => b"not found\0",
        XRCBTL_ERR_UNREACHABLE => b"peer unreachable\0",
        XRCBTL_ERR_CLOSED => b"peer closed\0",
        XRCBTL_ERR_TRANSFER => b"transfer refused by the device\0",
        XRCBTL_ERR_TIMEOUT => b"timed out\0",
        XRCBTL_ERR_STATE => b"invalid state\0",
        XRCBTL_ERR_DEVICE => b"device or system call failed\0",
        XRCBTL_ERR_PANIC => b"internal error\0",
        _ => b"unknown status\0",
    };
    s.as_ptr().cast()
}

/// Copies the message of the last call that failed on this thread into
/// `buf` (NUL-terminated, cut to fit `len`), and returns its length (the
/// message is kept up to 512 bytes). A `NULL` `buf` only measures.
///
/// # Safety
/// `buf` is `NULL` or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST.with(|l| {
        let l = l.borrow();
        let n = l.0;
        if !buf.is_null() && len > 0 {
            let k = n.min(len - 1);
            // SAFETY: the caller gave `len` writable bytes at `buf`; we write
            // `k + 1 <= len` of them.
            unsafe {
                std::ptr::copy_nonoverlapping(l.1.as_ptr(), buf.cast::<u8>(), k);
                *buf.add(k) = 0;
            }
        }
        n
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let rc = guard(|| panic!("boom {}", 7));
        assert_eq!(rc, XRCBTL_ERR_PANIC);
        let mut buf = [0 as c_char; 64];
        // SAFETY: a local buffer of its own length.
        let n = unsafe { xrcbtl_last_error(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated by xrcbtl_last_error.
        let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(s.to_str().unwrap(), "internal error: boom 7");
        assert_eq!(n, s.to_bytes().len());
    }

    #[test]
    fn messages_are_cut_to_the_buffer_and_measured_whole() {
        let rc = guard(|| Err(Failure::invalid("é".repeat(300))));
        assert_eq!(rc, XRCBTL_ERR_INVALID);
        // SAFETY: NULL only measures.
        let whole = unsafe { xrcbtl_last_error(std::ptr::null_mut(), 0) };
        assert_eq!(whole, LAST_MAX, "cut at a character boundary of 512 bytes");
        let mut small = [1 as c_char; 5];
        // SAFETY: a local buffer of its own length.
        unsafe { xrcbtl_last_error(small.as_mut_ptr(), small.len()) };
        assert_eq!(small[4], 0);
    }

    #[test]
    fn every_status_has_a_name() {
        for code in XRCBTL_ERR_PANIC..=XRCBTL_OK {
            // SAFETY: static NUL-terminated strings.
            let s = unsafe { std::ffi::CStr::from_ptr(xrcbtl_strerror(code)) };
            assert_ne!(s.to_str().unwrap(), "unknown status", "{code}");
        }
    }
}
