//! `fi_getinfo` through the provider: the caller's hints read into
//! [`Info`], each device's offer narrowed to them ([`info::narrow`]), and
//! the answers written out as a chain of `fi_info` that libfabric frees with
//! `fi_freeinfo`.
//!
//! The hints are the structs of the libfabric that loaded the provider,
//! which may be newer than this build's headers: only fields these headers
//! have are read, and libfabric only ever appends fields.

use std::ffi::{c_char, c_int, CStr};

use super::{err, guard, mem};
use crate::devices;
use crate::info::{self, CtxAttr, DomainAttr, EpAttr, FabricAttr, Info};
use crate::sys;

/// The provider's `getinfo`.
///
/// Addresses are opaque (FI_FORMAT_UNSPEC). A node is an IP address and a
/// service a port: they place each answer ([`info::place`]: a source on
/// the device of that address, or a destination), and a device they do
/// not fit gives no answer. -FI_ENODATA when no device is left, as when
/// hints ask what no device can do.
pub(super) unsafe extern "C" fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const sys::fi_info,
    info: *mut *mut sys::fi_info,
) -> c_int {
    guard(|| {
        if info.is_null() {
            return err(sys::FI_EINVAL);
        }
        // SAFETY: `info` is libfabric's out-parameter, checked non-null.
        unsafe { *info = std::ptr::null_mut() };
        // SAFETY: libfabric passes null or C strings.
        let (node, service) = unsafe { (string(node), string(service)) };
        let source = flags & sys::FI_SOURCE != 0;
        let hints = if hints.is_null() {
            None
        } else {
            // SAFETY: libfabric passes hints as a valid fi_info whose
            // attribute pointers are null or valid.
            Some(unsafe { read(&*hints) })
        };
        let which = match devices::which(std::env::var(devices::FABRIC_VAR).ok().as_deref()) {
            Ok(which) => which,
            Err(_) => return err(sys::FI_ENODATA),
        };
        let Ok(devices) = devices::list(which) else {
            return err(sys::FI_ENODATA);
        };
        let answers: Vec<Info> = devices
            .iter()
            .filter_map(|d| {
                let placed =
                    info::narrow(&info::offer(d), hints.as_ref(), version).and_then(|mut i| {
                        info::place(&mut i, d.ip, node.as_deref(), service.as_deref(), source)
                            .map(|()| i)
                    });
                placed
                    .map_err(|why| {
                        super::warn(&format!(
                            "fi_getinfo (api {}.{}): {} refused: {}",
                            version >> 16,
                            version & 0xffff,
                            d.name,
                            why.0
                        ))
                    })
                    .ok()
            })
            .collect();
        if answers.is_empty() {
            return err(sys::FI_ENODATA);
        }
        // Built back to front, so that each links to the one after it.
        let mut head: *mut sys::fi_info = std::ptr::null_mut();
        for answer in answers.iter().rev() {
            let Some(one) = write(answer) else {
                // SAFETY: `head` is a chain this function built.
                unsafe { free_chain(head) };
                return err(sys::FI_ENOMEM);
            };
            // SAFETY: `one` was just allocated and filled by `write`.
            unsafe { (*one).next = head };
            head = one;
        }
        // SAFETY: as above.
        unsafe { *info = head };
        0
    })
}

/// A C string field, or None for null or non-UTF-8 (which matches nothing
/// the provider offers, so it refuses as a mismatch would).
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    let s = unsafe { CStr::from_ptr(p) };
    Some(
        s.to_str()
            .map(str::to_owned)
            .unwrap_or_else(|_| "\u{fffd}".into()),
    )
}

/// The hints as [`Info`]; a null attribute struct reads as zeros
/// ("unspecified").
///
/// # Safety
/// Each attribute pointer of `h` is null or points to a valid struct.
unsafe fn read(h: &sys::fi_info) -> Info {
    let mut out = Info {
        caps: h.caps,
        mode: h.mode,
        addr_format: h.addr_format,
        ..Info::default()
    };
    // SAFETY: the caller's promise, for each of these pointers.
    if let Some(t) = unsafe { h.tx_attr.as_ref() } {
        out.tx = CtxAttr {
            caps: t.caps,
            mode: t.mode,
            op_flags: t.op_flags,
            msg_order: t.msg_order,
            comp_order: t.comp_order,
            inject_size: t.inject_size,
            size: t.size,
            iov_limit: t.iov_limit,
            rma_iov_limit: t.rma_iov_limit,
        };
    }
    // SAFETY: as above.
    if let Some(r) = unsafe { h.rx_attr.as_ref() } {
        out.rx = CtxAttr {
            caps: r.caps,
            mode: r.mode,
            op_flags: r.op_flags,
            msg_order: r.msg_order,
            comp_order: r.comp_order,
            size: r.size,
            iov_limit: r.iov_limit,
            ..CtxAttr::default()
        };
    }
    // SAFETY: as above.
    if let Some(e) = unsafe { h.ep_attr.as_ref() } {
        out.ep = EpAttr {
            ep_type: e.type_,
            protocol: e.protocol,
            max_msg_size: e.max_msg_size,
            mem_tag_format: e.mem_tag_format,
            tx_ctx_cnt: e.tx_ctx_cnt,
            rx_ctx_cnt: e.rx_ctx_cnt,
            auth_key_size: e.auth_key_size,
        };
    }
    // SAFETY: as above.
    if let Some(d) = unsafe { h.domain_attr.as_ref() } {
        out.domain = DomainAttr {
            // SAFETY: a hint's name is null or a C string.
            name: unsafe { string(d.name) },
            threading: d.threading,
            control_progress: d.control_progress,
            data_progress: d.data_progress,
            resource_mgmt: d.resource_mgmt,
            av_type: d.av_type,
            mr_mode: d.mr_mode as u32,
            caps: d.caps,
            given: true,
            mr_key_size: d.mr_key_size,
            cq_data_size: d.cq_data_size,
            cq_cnt: d.cq_cnt,
            ep_cnt: d.ep_cnt,
            cntr_cnt: d.cntr_cnt,
            mr_iov_limit: d.mr_iov_limit,
            mr_cnt: d.mr_cnt,
        };
    }
    // SAFETY: as above.
    if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
        out.fabric = FabricAttr {
            // SAFETY: as for the domain's name.
            name: unsafe { string(f.name) },
            prov_version: f.prov_version,
            api_version: f.api_version,
        };
    }
    out
}

/// One answer as a freshly allocated `fi_info` (its `next` null), or None
/// when the C heap is out (nothing is then left allocated).
fn write(i: &Info) -> Option<*mut sys::fi_info> {
    let out = mem::zeroed::<sys::fi_info>();
    if out.is_null() {
        return None;
    }
    // SAFETY: `out` is a zeroed fi_info the provider owns until returned;
    // each attribute struct below is zeroed, non-null when stored, and
    // freed with the chain if anything fails.
    let filled = unsafe { fill(&mut *out, i) };
    if filled.is_none() {
        // SAFETY: `out` and what `fill` stored in it are this module's.
        unsafe { free_chain(out) };
        return None;
    }
    Some(out)
}

/// Fills a zeroed `fi_info`; None when an allocation failed (what was
/// allocated is in `o`, for [`free_chain`]).
///
/// # Safety
/// `o` is zeroed and owned by the caller.
unsafe fn fill(o: &mut sys::fi_info, i: &Info) -> Option<()> {
    o.caps = i.caps;
    o.mode = i.mode;
    o.addr_format = i.addr_format;
    if let Some(a) = &i.src_addr {
        o.src_addr = mem::bytes(a);
        o.src_addrlen = a.len();
        if o.src_addr.is_null() {
            return None;
        }
    }
    if let Some(a) = &i.dest_addr {
        o.dest_addr = mem::bytes(a);
        o.dest_addrlen = a.len();
        if o.dest_addr.is_null() {
            return None;
        }
    }
    o.tx_attr = mem::zeroed();
    o.rx_attr = mem::zeroed();
    o.ep_attr = mem::zeroed();
    o.domain_attr = mem::zeroed();
    o.fabric_attr = mem::zeroed();
    // SAFETY: each pointer is null or a zeroed struct of its type.
    let (tx, rx, ep, domain, fabric) = unsafe {
        (
            o.tx_attr.as_mut()?,
            o.rx_attr.as_mut()?,
            o.ep_attr.as_mut()?,
            o.domain_attr.as_mut()?,
            o.fabric_attr.as_mut()?,
        )
    };
    tx.caps = i.tx.caps;
    tx.mode = i.tx.mode;
    tx.op_flags = i.tx.op_flags;
    tx.msg_order = i.tx.msg_order;
    tx.comp_order = i.tx.comp_order;
    tx.inject_size = i.tx.inject_size;
    tx.size = i.tx.size;
    tx.iov_limit = i.tx.iov_limit;
    tx.rma_iov_limit = i.tx.rma_iov_limit;

    rx.caps = i.rx.caps;
    rx.mode = i.rx.mode;
    rx.op_flags = i.rx.op_flags;
    rx.msg_order = i.rx.msg_order;
    rx.comp_order = i.rx.comp_order;
    rx.size = i.rx.size;
    rx.iov_limit = i.rx.iov_limit;

    ep.type_ = i.ep.ep_type;
    ep.protocol = i.ep.protocol;
    ep.max_msg_size = i.ep.max_msg_size;
    ep.mem_tag_format = i.ep.mem_tag_format;
    ep.tx_ctx_cnt = i.ep.tx_ctx_cnt;
    ep.rx_ctx_cnt = i.ep.rx_ctx_cnt;

    if let Some(name) = &i.domain.name {
        domain.name = mem::c_string(name);
        if domain.name.is_null() {
            return None;
        }
    }
    domain.threading = i.domain.threading;
    domain.control_progress = i.domain.control_progress;
    domain.data_progress = i.domain.data_progress;
    domain.resource_mgmt = i.domain.resource_mgmt;
    domain.av_type = i.domain.av_type;
    domain.mr_mode = i.domain.mr_mode as c_int;
    domain.mr_key_size = i.domain.mr_key_size;
    domain.cq_data_size = i.domain.cq_data_size;
    domain.cq_cnt = i.domain.cq_cnt;
    domain.ep_cnt = i.domain.ep_cnt;
    domain.tx_ctx_cnt = i.ep.tx_ctx_cnt;
    domain.rx_ctx_cnt = i.ep.rx_ctx_cnt;
    domain.max_ep_tx_ctx = i.ep.tx_ctx_cnt;
    domain.max_ep_rx_ctx = i.ep.rx_ctx_cnt;
    domain.cntr_cnt = i.domain.cntr_cnt;
    domain.mr_iov_limit = i.domain.mr_iov_limit;
    domain.caps = i.domain.caps;
    domain.mr_cnt = i.domain.mr_cnt;

    if let Some(name) = &i.fabric.name {
        fabric.name = mem::c_string(name);
        if fabric.name.is_null() {
            return None;
        }
    }
    // prov_name stays null: libfabric fills it in for a core provider.
    fabric.prov_version = i.fabric.prov_version;
    fabric.api_version = i.fabric.api_version;
    Some(())
}

/// Frees a chain this module built, as `fi_freeinfo` would.
///
/// # Safety
/// `head` is null or a chain from [`write`], not used after.
unsafe fn free_chain(mut head: *mut sys::fi_info) {
    while !head.is_null() {
        // SAFETY: the caller's promise; each pointer freed is one `fill`
        // allocated (or null).
        unsafe {
            let i = &mut *head;
            let next = i.next;
            if let Some(d) = i.domain_attr.as_mut() {
                mem::release(d.name);
            }
            if let Some(f) = i.fabric_attr.as_mut() {
                mem::release(f.name);
            }
            mem::release(i.src_addr);
            mem::release(i.dest_addr);
            mem::release(i.tx_attr);
            mem::release(i.rx_attr);
            mem::release(i.ep_attr);
            mem::release(i.domain_attr);
            mem::release(i.fabric_attr);
            mem::release(head);
            head = next;
        }
    }
}
