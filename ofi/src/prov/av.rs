//! The address vector fid (`fi_av_open`): peers' endpoint addresses
//! ([`EpAddr`]) under the numbers the caller sends with (FI_AV_TABLE
//! indices or FI_AV_MAP numbers, [`crate::av`]).
//!
//! Insertion is synchronous (no event queue): `fi_av_insert` returns how
//! many addresses went in, and an address that is malformed or foreign
//! fails its own entry (FI_ADDR_NOTAVAIL in `fi_addr`, and with
//! FI_SYNC_ERR its error in the caller's array) while the others go in.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::domain::Domain;
use super::{err, fid_ops, guard, object, Shared};
use crate::addr::{self, EpAddr};
use crate::av::{AvKind, EpAv, EpAvError, NOT_AVAIL};
use crate::engine::SharedAv;
use crate::sys;

/// The provider's address vector: libfabric's `fid_av` first.
#[repr(C)]
pub(crate) struct AvObj {
    av: sys::fid_av,
    domain: *const Domain,
    table: SharedAv,
    /// Endpoints bound to it: it closes only when none are.
    pub(crate) users: AtomicUsize,
}

// No event queue binds to it: insertion is synchronous.
static FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(close, None, None));

static AV_OPS: Shared<sys::fi_ops_av> = Shared::new(sys::fi_ops_av {
    size: std::mem::size_of::<sys::fi_ops_av>(),
    insert: Some(insert),
    insertsvc: Some(no_insertsvc),
    insertsym: Some(no_insertsym),
    remove: Some(remove),
    lookup: Some(lookup),
    straddr: Some(straddr),
    av_set: Some(no_av_set),
});

impl AvObj {
    /// The provider's address vector behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a AvObj> {
        // SAFETY: the caller's promise; our AV fids start an `AvObj`.
        unsafe { object(fid, sys::FI_CLASS_AV, &FID_OPS) }
    }

    /// Its domain.
    pub(crate) fn domain_ptr(&self) -> *const Domain {
        self.domain
    }

    /// Its table, as the engine shares it.
    pub(crate) fn shared(&self) -> SharedAv {
        Arc::clone(&self.table)
    }

    /// Its table, locked (a panic that poisoned it left it consistent).
    pub(crate) fn table(&self) -> MutexGuard<'_, EpAv> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `fi_av_open`.
pub(super) unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_av_attr,
    av: *mut *mut sys::fid_av,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_domain starts with its fid.
        let Some(d) = (unsafe { Domain::from_fid(domain.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if attr.is_null() || av.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: checked non-null.
        let attr = unsafe { &*attr };
        // Shared (named) vectors and asynchronous insertion through an
        // event queue are not offered.
        if !attr.name.is_null() || attr.flags & sys::FI_EVENT as u64 != 0 {
            return err(sys::FI_ENOSYS);
        }
        if attr.rx_ctx_bits != 0 || attr.flags & !(u64::from(sys::FI_READ) | sys::FI_SYMMETRIC) != 0
        {
            return err(sys::FI_EINVAL);
        }
        let kind = match (attr.type_, d.av_type) {
            (sys::FI_AV_TABLE, _) | (sys::FI_AV_UNSPEC, sys::FI_AV_TABLE) => AvKind::Table,
            (sys::FI_AV_MAP | sys::FI_AV_UNSPEC, _) => AvKind::Map,
            _ => return err(sys::FI_EINVAL),
        };
        let object = Box::new(AvObj {
            av: sys::fid_av {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_AV as usize,
                    context,
                    ops: FID_OPS.get(),
                },
                ops: AV_OPS.get(),
            },
            domain: d,
            table: Arc::new(Mutex::new(EpAv::new(kind, u32::MAX as usize))),
            users: AtomicUsize::new(0),
        });
        d.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: libfabric's out-parameter, checked non-null; freed by
        // `close`.
        unsafe { *av = Box::into_raw(object).cast() };
        0
    })
}

unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(av) = (unsafe { AvObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if av.users.load(Ordering::Acquire) != 0 {
            return err(sys::FI_EBUSY);
        }
        // SAFETY: an AV's domain cannot close before it (EBUSY).
        unsafe { &*av.domain }
            .children
            .fetch_sub(1, Ordering::AcqRel);
        // SAFETY: ours (checked), made by `open` with Box::into_raw, and
        // not used by libfabric after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<AvObj>()) });
        0
    })
}

unsafe extern "C" fn insert(
    av: *mut sys::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut sys::fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_av starts with its fid.
        let Some(av) = (unsafe { AvObj::from_fid(av.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        let sync_err = flags & sys::FI_SYNC_ERR != 0;
        if flags & !(u64::from(sys::FI_MORE) | sys::FI_SYNC_ERR) != 0 {
            return err(sys::FI_EBADFLAGS);
        }
        if count == 0 {
            return 0;
        }
        let Some(total) = count.checked_mul(addr::LEN) else {
            return err(sys::FI_EINVAL);
        };
        if addr.is_null() || (sync_err && context.is_null()) || count > c_int::MAX as usize {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: the caller passes `count` addresses, each of the length
        // fi_getname gave (addr::LEN).
        let bytes = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), total) };
        // SAFETY: an AV's domain cannot close before it (EBUSY).
        let domain = unsafe { &*av.domain };
        let mut inserted = 0;
        for (i, one) in bytes.chunks_exact(addr::LEN).enumerate() {
            let (number, code) = match EpAddr::decode(one) {
                // The BTL learns the peer first, outside the table's lock
                // (the BTL's progress reads the table).
                Ok(a) if domain.know(&a).is_err() => (NOT_AVAIL, err(sys::FI_EINVAL)),
                Ok(a) => match av.table().insert(a) {
                    Ok(n) => (n, 0),
                    Err(EpAvError::Conflict) => (NOT_AVAIL, err(sys::FI_EADDRINUSE)),
                    Err(EpAvError::Av(_)) => (NOT_AVAIL, err(sys::FI_ENOSPC)),
                },
                Err(_) => (NOT_AVAIL, err(sys::FI_EINVAL)),
            };
            if code == 0 {
                inserted += 1;
            }
            if !fi_addr.is_null() {
                // SAFETY: the caller's array has `count` entries.
                unsafe { *fi_addr.add(i) = number };
            }
            if sync_err {
                // SAFETY: with FI_SYNC_ERR, `context` is an array of
                // `count` ints (checked non-null).
                unsafe { *context.cast::<c_int>().add(i) = code };
            }
        }
        inserted
    })
}

unsafe extern "C" fn remove(
    av: *mut sys::fid_av,
    fi_addr: *mut sys::fi_addr_t,
    count: usize,
    flags: u64,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_av starts with its fid.
        let Some(av) = (unsafe { AvObj::from_fid(av.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if flags != 0 {
            return err(sys::FI_EBADFLAGS);
        }
        if count == 0 {
            return 0;
        }
        if fi_addr.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: the caller's array has `count` entries.
        let numbers = unsafe { std::slice::from_raw_parts(fi_addr, count) };
        let mut table = av.table();
        let mut rc = 0;
        for &n in numbers {
            if table.remove(n).is_err() {
                rc = err(sys::FI_EINVAL);
            }
        }
        rc
    })
}

unsafe extern "C" fn lookup(
    av: *mut sys::fid_av,
    fi_addr: sys::fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_av starts with its fid.
        let Some(av) = (unsafe { AvObj::from_fid(av.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if addrlen.is_null() {
            return err(sys::FI_EINVAL);
        }
        let Ok((_, found)) = av.table().lookup(fi_addr) else {
            return err(sys::FI_EINVAL);
        };
        let bytes = found.encode();
        // SAFETY: checked non-null; the caller's buffer size.
        let room = unsafe { *addrlen };
        if !addr.is_null() {
            // SAFETY: `addr` has `room` bytes; what does not fit is cut.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast(), room.min(bytes.len()))
            };
        }
        // SAFETY: as above.
        unsafe { *addrlen = bytes.len() };
        0
    })
}

/// The address as text: `xrc://IP:PORT/RANK.EP`, cut to the buffer and
/// NUL-terminated; `len` becomes the length the whole text needs.
unsafe extern "C" fn straddr(
    _av: *mut sys::fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    let mut out = buf as *const c_char;
    let rc = guard(|| {
        if addr.is_null() || len.is_null() {
            out = std::ptr::null();
            return 0;
        }
        // SAFETY: the caller passes one address of fi_getname's length.
        let raw = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), addr::LEN) };
        let text = match EpAddr::decode(raw) {
            Ok(a) => format!("xrc://{}/{}.{}", a.listen, a.rank, a.ep),
            Err(_) => "xrc://(not an xrc address)".to_string(),
        };
        // SAFETY: checked non-null.
        let room = unsafe { *len };
        if !buf.is_null() && room > 0 {
            let n = text.len().min(room - 1);
            // SAFETY: `buf` has `room` bytes: n of text and the NUL.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        // SAFETY: as above.
        unsafe { *len = text.len() + 1 };
        0
    });
    if rc == 0 {
        out
    } else {
        std::ptr::null()
    }
}

unsafe extern "C" fn no_insertsvc(
    _: *mut sys::fid_av,
    _: *const c_char,
    _: *const c_char,
    _: *mut sys::fi_addr_t,
    _: u64,
    _: *mut c_void,
) -> c_int {
    // Addresses are opaque (FI_FORMAT_UNSPEC): no node or service names.
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_insertsym(
    _: *mut sys::fid_av,
    _: *const c_char,
    _: usize,
    _: *const c_char,
    _: usize,
    _: *mut sys::fi_addr_t,
    _: u64,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_av_set(
    _: *mut sys::fid_av,
    _: *mut sys::fi_av_set_attr,
    _: *mut *mut sys::fid_av_set,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}
