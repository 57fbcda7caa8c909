//! The domain fid (`fi_domain`): one BTL rank of this process on the
//! device getinfo named, and the factory of address vectors, completion
//! queues, counters, endpoints and memory registrations.
//!
//! On the simulated fabric each domain takes a rank of the process's
//! simulated job ([`crate::world`]); on a verbs device it opens a BTL rank
//! of its own, numbered by its listener ([`crate::host`]).

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::fabric::Fabric;
use super::{av, cq, ep, err, fid_ops, guard, mr, object, Shared};
use crate::addr::EpAddr;
use crate::devices::{self, Which};
use crate::engine::{Engine, Ops};
use crate::sys;
use crate::world::{self, SimRank};
use xrcbtl_btl::addr::Address;

/// Most simulated steps one progress call takes.
const PROGRESS_STEPS: usize = 64;
/// Most rounds of a verbs BTL's progress one progress call takes.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
const PROGRESS_ROUNDS: usize = 16;

/// The BTL rank a domain is.
pub(crate) enum Rank {
    /// A rank of the process's simulated job (held: dropping it frees
    /// the rank).
    Sim(#[allow(dead_code)] SimRank),
    /// A rank on a verbs device.
    #[cfg(feature = "verbs")]
    Verbs(crate::host::VerbsRank),
}

/// The provider's domain: libfabric's `fid_domain` first.
#[repr(C)]
pub(crate) struct Domain {
    domain: sys::fid_domain,
    fabric: *const Fabric,
    /// Objects open on this domain (address vectors, queues, counters,
    /// endpoints, registrations): it closes only when none are left.
    pub(crate) children: AtomicUsize,
    /// Its endpoints' engine (dropped before the rank it runs on).
    pub(crate) engine: Box<dyn Ops>,
    /// The BTL rank it is.
    rank: Rank,
    /// That rank's address.
    address: Address,
    /// Its address vector type when one is opened with FI_AV_UNSPEC.
    pub(crate) av_type: u32,
    /// The threading level the caller asked for.
    pub(crate) threading: u32,
    /// Whether it prints its counters when it closes
    /// (`XRCBTL_OFI_VERBOSE=1`).
    verbose: bool,
    /// Endpoint numbers in use.
    ep_numbers: Mutex<BTreeSet<u16>>,
}

// No event queue binds to it: asynchronous errors come as error
// completions.
static FID_OPS: Shared<sys::fi_ops> = Shared::new(fid_ops(close, None, None));

static DOMAIN_OPS: Shared<sys::fi_ops_domain> = Shared::new(sys::fi_ops_domain {
    size: std::mem::size_of::<sys::fi_ops_domain>(),
    av_open: Some(av::open),
    cq_open: Some(cq::cq_open),
    endpoint: Some(endpoint),
    scalable_ep: Some(no_scalable_ep),
    cntr_open: Some(cq::cntr_open),
    poll_open: Some(no_poll),
    stx_ctx: Some(no_stx),
    srx_ctx: Some(no_srx),
    query_atomic: Some(query_atomic),
    query_collective: Some(no_query_collective),
    endpoint2: Some(ep::open),
});

static MR_OPS: Shared<sys::fi_ops_mr> = Shared::new(sys::fi_ops_mr {
    size: std::mem::size_of::<sys::fi_ops_mr>(),
    reg: Some(mr::reg),
    regv: Some(mr::regv),
    regattr: Some(mr::regattr),
});

impl Domain {
    /// Progress (FI_PROGRESS_MANUAL): what reading a queue or a counter
    /// runs first. On the simulated fabric, steps the job until no rank
    /// finds work; on verbs, runs the BTL's progress until it finds none
    /// (each at most a bounded number of times, so that a read returns).
    pub(crate) fn progress(&self) {
        match &self.rank {
            Rank::Sim(_) => {
                for _ in 0..PROGRESS_STEPS {
                    if world::step() == 0 {
                        break;
                    }
                }
            }
            #[cfg(feature = "verbs")]
            Rank::Verbs(_) => {
                for _ in 0..PROGRESS_ROUNDS {
                    if self.engine.progress() == 0 {
                        break;
                    }
                }
            }
        }
    }

    /// Makes the domain of an inserted address known to the BTL. The
    /// simulated job knows all its ranks already; a verbs rank adds the
    /// peer (connected on first use). An error says why it cannot be
    /// reached (it receives through XRC and this rank through RC, or
    /// through another XRC domain of the same node).
    #[cfg_attr(not(feature = "verbs"), allow(unused_variables))]
    pub(crate) fn know(&self, a: &EpAddr) -> Result<(), String> {
        match &self.rank {
            Rank::Sim(_) => Ok(()),
            #[cfg(feature = "verbs")]
            Rank::Verbs(v) => self
                .engine
                .add_peer(&v.resolver.peer(a))
                .map_err(|e| e.to_string()),
        }
    }

    /// The lowest endpoint number not in use, now in use; None when all
    /// 65,536 are.
    pub(crate) fn take_ep_number(&self) -> Option<u16> {
        let mut used = self.ep_numbers.lock().unwrap_or_else(|e| e.into_inner());
        let free = (0..=u16::MAX).find(|n| !used.contains(n))?;
        used.insert(free);
        Some(free)
    }

    /// Gives an endpoint number back.
    pub(crate) fn give_ep_number(&self, n: u16) {
        self.ep_numbers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&n);
    }

    /// The address of the domain's endpoint `ep`.
    pub(crate) fn address(&self, ep: u16) -> EpAddr {
        EpAddr::of(&self.address, ep)
    }

    /// The provider's domain behind `fid`, or None.
    ///
    /// # Safety
    /// `fid` is null or points to a live `struct fid`.
    pub(crate) unsafe fn from_fid<'a>(fid: *const sys::fid) -> Option<&'a Domain> {
        // SAFETY: the caller's promise; our domain fids start a `Domain`.
        unsafe { object(fid, sys::FI_CLASS_DOMAIN, &FID_OPS) }
    }
}

/// `fi_domain` / `fi_domain2` on the provider's fabric.
pub(super) unsafe extern "C" fn open(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    dom: *mut *mut sys::fid_domain,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_fabric starts with its fid.
        let Some(parent) = (unsafe { Fabric::from_fid(fabric.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        if info.is_null() || dom.is_null() {
            return err(sys::FI_EINVAL);
        }
        if flags != 0 {
            return err(sys::FI_EBADFLAGS);
        }
        // SAFETY: checked non-null; an fi_info from getinfo (or a copy).
        let info = unsafe { &*info };
        // SAFETY: null or a valid domain_attr.
        let Some(attr) = (unsafe { info.domain_attr.as_ref() }) else {
            return err(sys::FI_EINVAL);
        };
        let name = if attr.name.is_null() {
            None
        } else {
            // SAFETY: a domain name is a C string.
            Some(unsafe { CStr::from_ptr(attr.name as *const c_char) }.to_string_lossy())
        };
        let which = match devices::which(std::env::var(devices::FABRIC_VAR).ok().as_deref()) {
            Ok(w) => w,
            Err(_) => return err(sys::FI_EINVAL),
        };
        let settings = crate::engine::unexpected_max(
            std::env::var(crate::engine::UNEXPECTED_VAR).ok().as_deref(),
        )
        .and_then(|u| {
            crate::engine::verbose(std::env::var(crate::engine::VERBOSE_VAR).ok().as_deref())
                .map(|v| (u, v))
        });
        let (unexpected, verbose) = match settings {
            Ok(s) => s,
            Err(e) => {
                super::warn(&format!("fi_domain: {e}"));
                return err(sys::FI_EINVAL);
            }
        };
        let (engine, rank, address): (Box<dyn Ops>, Rank, Address) = match which {
            Which::Verbs => match verbs_rank(name.as_deref(), listen_port(info), unexpected) {
                Ok(v) => v,
                Err(code) => return err(code),
            },
            Which::Sim | Which::SimIwarp => {
                let device = world::device(which == Which::SimIwarp);
                if name.as_deref().is_some_and(|n| n != device.name) {
                    return err(sys::FI_ENODEV);
                }
                let Ok((nodes, per_node)) = world::shape(
                    std::env::var(world::NODES_VAR).ok().as_deref(),
                    std::env::var(world::RANKS_VAR).ok().as_deref(),
                ) else {
                    return err(sys::FI_EINVAL);
                };
                match world::claim(device, nodes, per_node) {
                    Ok(rank) => {
                        let engine = Engine::new(rank.btl.clone(), unexpected);
                        let address = rank.address.clone();
                        (Box::new(engine), Rank::Sim(rank), address)
                    }
                    Err(_) => return err(sys::FI_ENOSPC),
                }
            }
        };
        let object = Box::new(Domain {
            domain: sys::fid_domain {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_DOMAIN as usize,
                    context,
                    ops: FID_OPS.get(),
                },
                ops: DOMAIN_OPS.get(),
                mr: MR_OPS.get(),
            },
            fabric: parent,
            children: AtomicUsize::new(0),
            engine,
            rank,
            address,
            av_type: attr.av_type,
            threading: attr.threading,
            verbose,
            ep_numbers: Mutex::new(BTreeSet::new()),
        });
        parent.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: libfabric's out-parameter, checked non-null; freed by
        // `close`.
        unsafe { *dom = Box::into_raw(object).cast() };
        0
    })
}

/// The port the info's `src_addr` names, if it is one of the provider's
/// addresses with a port (`fi_getinfo` places one from a service).
fn listen_port(info: &sys::fi_info) -> Option<u16> {
    if info.src_addr.is_null() || info.src_addrlen != crate::addr::LEN {
        return None;
    }
    // SAFETY: libfabric's info holds `src_addrlen` bytes at `src_addr`.
    let b = unsafe { std::slice::from_raw_parts(info.src_addr.cast::<u8>(), crate::addr::LEN) };
    let port = EpAddr::decode(b).ok()?.listen.port();
    (port != 0).then_some(port)
}

/// A rank on the verbs device `name` (getinfo's domain name; the first
/// device it offers when none is named), listening at `port` if given,
/// with its engine; the `FI_E*` code when there is none.
#[cfg(feature = "verbs")]
fn verbs_rank(
    name: Option<&str>,
    port: Option<u16>,
    unexpected: usize,
) -> Result<(Box<dyn Ops>, Rank, Address), u32> {
    let devices = devices::list(Which::Verbs).map_err(|e| {
        super::warn(&e);
        sys::FI_ENODEV
    })?;
    let device = match name {
        Some(n) => devices.iter().find(|d| d.name == n),
        None => devices.first(),
    }
    .ok_or(sys::FI_ENODEV)?;
    let ip = device.ip.ok_or(sys::FI_ENODEV)?;
    let v = crate::host::open(&device.name, ip, port).map_err(|e| {
        super::warn(&format!("fi_domain: {e}"));
        sys::FI_EIO
    })?;
    let engine = Engine::new(v.btl.clone(), unexpected);
    let address = v.address.clone();
    Ok((Box::new(engine), Rank::Verbs(v), address))
}

#[cfg(not(feature = "verbs"))]
fn verbs_rank(
    _: Option<&str>,
    _: Option<u16>,
    _: usize,
) -> Result<(Box<dyn Ops>, Rank, Address), u32> {
    Err(sys::FI_ENODEV)
}

unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the fid being closed.
        let Some(domain) = (unsafe { Domain::from_fid(fid) }) else {
            return err(sys::FI_EINVAL);
        };
        if domain.children.load(Ordering::Acquire) != 0 {
            return err(sys::FI_EBUSY);
        }
        if domain.verbose {
            // One write, so that the lines of ranks sharing a stderr do not
            // interleave (eprintln! may write its pieces apart).
            let line = crate::engine::carried(
                std::process::id(),
                &domain.engine.stats(),
                &domain.engine.rcache_stats(),
            ) + "\n";
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        #[cfg(feature = "verbs")]
        if let Rank::Verbs(v) = &domain.rank {
            v.leave();
        }
        // SAFETY: a domain's fabric cannot close before it (EBUSY).
        unsafe { &*domain.fabric }
            .children
            .fetch_sub(1, Ordering::AcqRel);
        // SAFETY: ours (checked), made by `open` with Box::into_raw, and
        // not used by libfabric after a successful close.
        drop(unsafe { Box::from_raw(fid.cast::<Domain>()) });
        0
    })
}

// What the domain does not offer at all (FI_EP_RDM with one context, no
// wait objects, no collectives): -FI_ENOSYS, as the man pages name it.

unsafe extern "C" fn no_scalable_ep(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_info,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_poll(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_poll_attr,
    _: *mut *mut sys::fid_poll,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_stx(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_tx_attr,
    _: *mut *mut sys::fid_stx,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_srx(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_rx_attr,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn no_query_collective(
    _: *mut sys::fid_domain,
    _: sys::fi_collective_op,
    _: *mut sys::fi_collective_attr,
    _: u64,
) -> c_int {
    err(sys::FI_ENOSYS)
}

unsafe extern "C" fn endpoint(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    ep: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { ep::open(domain, info, ep, 0, context) }
}

/// `fi_query_atomic`: one 64-bit element for what [`crate::atomic`]
/// offers on this device, -FI_EOPNOTSUPP for everything else.
unsafe extern "C" fn query_atomic(
    domain: *mut sys::fid_domain,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    attr: *mut sys::fi_atomic_attr,
    flags: u64,
) -> c_int {
    guard(|| {
        // SAFETY: a fid_domain starts with its fid.
        let Some(d) = (unsafe { Domain::from_fid(domain.cast()) }) else {
            return err(sys::FI_EINVAL);
        };
        let Some(class) = crate::atomic::Class::of_flags(flags) else {
            return err(sys::FI_EBADFLAGS);
        };
        if !crate::atomic::supported(d.engine.atomics(), datatype, op, class) {
            return err(sys::FI_EOPNOTSUPP);
        }
        // SAFETY: null or the caller's attr.
        if let Some(a) = unsafe { attr.as_mut() } {
            a.count = 1;
            a.size = 8;
        }
        0
    })
}
