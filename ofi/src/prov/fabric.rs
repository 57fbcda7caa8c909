//! The fabric fid (`fi_fabric`): the root every domain is opened from.
//!
//! Every fid of the provider points at one of the provider's static ops
//! tables; a fid passed back in is known to be the provider's, and of the
//! class the call expects, by that pointer alone ([`Fabric::from_fid`]),
//! without reading past the header every fid shares.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{err, fid_ops, guard, object, Shared};
use crate::info::FABRIC_NAME;
use crate::sys;

/// The provider's fabric: libfabric's `fid_fabric` first, so that a pointer
/// to it is a pointer to this.
#[repr(C)]
pub(crate) struct Fabric {
    fabric: sys::fid_fabric,
    /// Domains and event queues open on this fabric: it closes only when
    /// none are left.
    pub(crate) children: AtomicUsize,
    /// The API version the caller opened it with.
    pub(crate) api_version: u32,
}

// Nothing binds to the fabric.
static FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(close, None, None));

static FABRIC_OPS: Shared<sys::fi_ops_fabric> = Shared::new(sys::fi_ops_fabric {
    size: std::mem::size_of::<sys::fi_ops_fabric>(),
    domain: Some(domain),
    passive_ep: Some(no_passive_ep),
    eq_open: Some(super::eq::open),
    wait_open: Some(no_wait),
    trywait: Some(no_trywait),
    domain2: Some(domain2),
});

impl Fabric {
    /// The provider's fabric behind `fid`, or None for a null fid, another
    /// class's or another provider's.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a Fabric> {
        // SAFETY: the caller's promise; our fabric fids start a `Fabric`.
        unsafe { object(fid, sys::FI_CLASS_FABRIC, &FID_OPS) }
    }
}

/// The provider's `fabric`: opens the fabric `getinfo` named.
pub(super) unsafe extern "C" fn open(
    attr: *mut sys::fi_fabric_attr,
    fabric: *mut *mut sys::fid_fabric,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if attr.is_null() || fabric.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: checked non-null; libfabric passes a valid attr.
        let attr = unsafe { &*attr };
        if !attr.name.is_null() {
            // SAFETY: a fabric name is a C string.
            let name = unsafe { CStr::from_ptr(attr.name as *const c_char) };
            if name.to_bytes() != FABRIC_NAME.as_bytes() {
                return err(sys::FI_ENODATA);
            }
        }
        let object = Box::new(Fabric {
            fabric: sys::fid_fabric {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_FABRIC as usize,
                    context,
                    ops: FID_OPS.get(),
                },
                ops: FABRIC_OPS.get(),
                api_version: attr.api_version,
            },
            children: AtomicUsize::new(0),
            api_version: attr.api_version,
        });
        // SAFETY: `fabric` is libfabric's out-parameter, checked non-null;
        // the fabric is freed by `close`.
        unsafe { *fabric = Box::into_raw(object).cast() };
        0
    })
}

unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(fabric) = (unsafe { Fabric::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if fabric.children.load(Ordering::Acquire) != 0 {
            return err(sys::FI_EBUSY);
        }
        // SAFETY: the fid is ours (checked) and was made by `open` with
        // Box::into_raw; libfabric does not use it after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<Fabric>()) });
        0
    })
}

unsafe extern "C" fn domain(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    dom: *mut *mut sys::fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { super::domain::open(fabric, info, dom, 0, context) }
}

unsafe extern "C" fn domain2(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    dom: *mut *mut sys::fid_domain,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { super::domain::open(fabric, info, dom, flags, context) }
}

unsafe extern "C" fn no_passive_ep(
    _: *mut sys::fid_fabric,
    _: *mut sys::fi_info,
    _: *mut *mut sys::fid_pep,
    _: *mut c_void,
) -> c_int {
    // FI_EP_RDM only: there are no passive endpoints.
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_wait(
    _: *mut sys::fid_fabric,
    _: *mut sys::fi_wait_attr,
    _: *mut *mut sys::fid_wait,
) -> c_int {
    // FI_PROGRESS_MANUAL, no wait objects.
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_trywait(_: *mut sys::fid_fabric, _: *mut *mut sys::fid, _: c_int) -> c_int {
    err(sys::FI_ENOSYS)
}
