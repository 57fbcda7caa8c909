//! Memory handed to libfabric, which frees it with the C library's `free`
//! (`fi_freeinfo`): `fi_info` and its attribute structs, their strings, and
//! its addresses.
//!
//! Every struct is allocated larger than this build's headers say and
//! zeroed. A newer libfabric than the one the provider was built against
//! (the MPI wheels bundle 2.5, Intel MPI a 1.21 fork) copies its own
//! structs, which have grown fields at their ends, from the provider's
//! (`fi_dupinfo` copies `sizeof` its own struct): the copy must read
//! zeros, never past the allocation.

use std::ffi::{c_char, c_void};

extern "C" {
    fn calloc(count: usize, size: usize) -> *mut c_void;
    fn free(ptr: *mut c_void);
}

/// Bytes past the end of each struct as this build knows it. libfabric
/// 2.5's largest growth over 1.17 is under 64 bytes (`fi_domain_attr`'s four
/// new fields); this leaves room for many more releases.
const SLACK: usize = 512;

/// A zeroed `T` (with [`SLACK`]) from the C heap, or null.
pub(crate) fn zeroed<T>() -> *mut T {
    // SAFETY: calloc has no preconditions; a null return is passed on.
    unsafe { calloc(1, std::mem::size_of::<T>() + SLACK) }.cast()
}

/// `s` as a NUL-terminated string on the C heap, or null.
pub(crate) fn c_string(s: &str) -> *mut c_char {
    copy(s.as_bytes(), s.len() + 1).cast()
}

/// A copy of `b` on the C heap (an address), or null.
pub(crate) fn bytes(b: &[u8]) -> *mut c_void {
    copy(b, b.len().max(1))
}

/// `b` at the start of `size` zeroed bytes (at least `b.len()`) on the C
/// heap, or null.
fn copy(b: &[u8], size: usize) -> *mut c_void {
    // SAFETY: as in `zeroed`; a null return is passed on.
    let p: *mut u8 = unsafe { calloc(1, size) }.cast();
    if !p.is_null() {
        // SAFETY: p has size >= b.len() bytes, and b does not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, b.len()) };
    }
    p.cast()
}

/// Frees what [`zeroed`], [`c_string`] or [`bytes`] returned (null is
/// fine).
///
/// # Safety
/// `p` is null or came from this module and is not used after.
pub(crate) unsafe fn release<T>(p: *mut T) {
    // SAFETY: the caller's promise; free takes null.
    unsafe { free(p.cast()) }
}
