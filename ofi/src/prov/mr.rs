//! Memory registrations (`fi_mr_reg`, `fi_mr_regv`, `fi_mr_regattr`):
//! the caller's memory registered through the BTL's cache for peers to
//! reach with RMA and atomics. FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
//! FI_MR_PROV_KEY: peers name the memory by its virtual address and the
//! key the provider chose: the registration's remote key, or, for memory
//! past the device's largest region, a compound key over several regions
//! ([`crate::keys`]). Each region is exactly the caller's bytes
//! (`Btl::register_exact`, outside the registration cache), and the device
//! checks every access against it and the rights registered. No caller
//! needs to register local buffers (no FI_MR_LOCAL): `fi_mr_desc` is
//! null.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use xrcbtl_btl::{Access, UserMem};

use crate::engine::Region;

use super::domain::Domain;
use super::{err, fid_ops, guard, object, Shared};
use crate::flags::{READ, RECV, REMOTE_READ, REMOTE_WRITE, SEND, WRITE};
use crate::sys;

/// The provider's registration: libfabric's `fid_mr` first.
#[repr(C)]
pub(crate) struct MrObj {
    mr: sys::fid_mr,
    domain: *const Domain,
    region: Region,
}

// FI_MR_ENDPOINT is not a mode of the provider's: a registration binds
// to nothing.
static FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(close, None, None));

/// Every access bit fi_mr_reg knows of.
const ACCESS: u64 = READ | WRITE | REMOTE_READ | REMOTE_WRITE | SEND | RECV;

impl MrObj {
    /// The provider's registration behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a MrObj> {
        // SAFETY: the caller's promise; our MR fids start an `MrObj`.
        unsafe { object(fid, sys::FI_CLASS_MR, &FID_OPS) }
    }
}

/// Registers `len` bytes at `buf` of domain `fid` for `access`.
///
/// # Safety
/// `fid` is null or a live fid; `buf` is `len` bytes of the caller's that
/// stay mapped while registered (libfabric's contract).
unsafe fn register(
    fid: *mut sys::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    flags: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's promise.
    let Some(d) = (unsafe { Domain::from_fid(fid) }) else {
        return err(sys::FI_EINVAL);
    };
    if mr.is_null() || buf.is_null() || len == 0 {
        return err(sys::FI_EINVAL);
    }
    if flags != 0 || access & !ACCESS != 0 {
        return err(sys::FI_EBADFLAGS);
    }
    // SAFETY: the caller's promise, which is UserMem's.
    let Ok(mem) = (unsafe { UserMem::new(buf as *mut u8, len) }) else {
        return err(sys::FI_EINVAL);
    };
    let mut rights = Access::NONE;
    if access & REMOTE_READ != 0 {
        rights |= Access::REMOTE_READ;
    }
    if access & REMOTE_WRITE != 0 {
        rights |= Access::REMOTE_WRITE;
        if d.engine.atomics() {
            // Atomics need FI_REMOTE_WRITE (and read, for fetching ones).
            rights |= Access::REMOTE_ATOMIC;
        }
    }
    let Ok(region) = d.engine.register_region(mem, rights) else {
        return err(sys::FI_ENOMEM);
    };
    let object = Box::new(MrObj {
        mr: sys::fid_mr {
            fid: sys::fid {
                fclass: sys::FI_CLASS_MR as usize,
                context,
                ops: FID_OPS.get(),
            },
            mem_desc: std::ptr::null_mut(),
            key: region.key,
        },
        domain: d,
        region,
    });
    d.children.fetch_add(1, Ordering::AcqRel);
    // SAFETY: libfabric's out-parameter, checked non-null; freed by
    // `close`.
    unsafe { *mr = Box::into_raw(object).cast() };
    0
}

/// `fi_mr_reg`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn reg(
    fid: *mut sys::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    _offset: u64,
    _requested_key: u64,
    flags: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's arguments, as `register` asks.
    guard(|| unsafe { register(fid, buf, len, access, flags, mr, context) })
}

/// `fi_mr_regv`: one entry (mr_iov_limit 1).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn regv(
    fid: *mut sys::fid,
    iov: *const sys::iovec,
    count: usize,
    access: u64,
    _offset: u64,
    _requested_key: u64,
    flags: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if count != 1 || iov.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: one entry, checked non-null; then as `reg`.
        unsafe {
            let v = &*iov;
            register(fid, v.iov_base, v.iov_len, access, flags, mr, context)
        }
    })
}

/// `fi_mr_regattr`: reads only the fields this build's headers have.
pub(super) unsafe extern "C" fn regattr(
    fid: *mut sys::fid,
    attr: *const sys::fi_mr_attr,
    flags: u64,
    mr: *mut *mut sys::fid_mr,
) -> c_int {
    guard(|| {
        // SAFETY: null or the caller's attr.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return err(sys::FI_EINVAL);
        };
        if a.iov_count != 1 || a.mr_iov.is_null() || a.iface != sys::FI_HMEM_SYSTEM {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: one entry, checked non-null; then as `reg`.
        unsafe {
            let v = &*a.mr_iov;
            register(fid, v.iov_base, v.iov_len, a.access, flags, mr, a.context)
        }
    })
}

unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(mr) = (unsafe { MrObj::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        // SAFETY: a registration's domain cannot close before it (EBUSY).
        let d = unsafe { &*mr.domain };
        // SAFETY: ours (checked), made by `register` with Box::into_raw,
        // and not used by libfabric after a successful close.
        let mr = unsafe { Box::from_raw(fid.cast::<MrObj>()) };
        d.engine.deregister_region(mr.region);
        d.children.fetch_sub(1, Ordering::AcqRel);
        0
    })
}
