//! What the provider offers in `fi_getinfo`, and how an offer is narrowed
//! to a caller's hints. Plain Rust structs that mirror the parts of
//! `struct fi_info` the provider reads and fills; the extern "C" layer
//! copies them in and out. Zero means "unspecified" in hints, as in
//! libfabric.
//!
//! The rules (fi_getinfo(3)):
//! - Anything the hints ask that the offer cannot do refuses the whole
//!   offer (FI_ENODATA), naming the attribute ([`Refused`]).
//! - Primary capabilities come back only if asked (all of them with no
//!   hints); secondary ones (FI_SOURCE, FI_MULTI_RECV, ...) only if asked,
//!   except FI_LOCAL_COMM | FI_REMOTE_COMM, which mean both when neither is
//!   given. Capabilities asked with no direction at all get the directions
//!   of their classes (FI_MSG, FI_TAGGED: FI_SEND | FI_RECV; FI_RMA,
//!   FI_ATOMIC: FI_READ | FI_WRITE and their remote pair).
//! - The provider needs no mode bit, and never FI_MR_LOCAL: it registers
//!   local buffers itself. Remote access (FI_RMA, FI_ATOMIC) needs
//!   FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY; hints that name
//!   remote access without them are refused, and hints that leave the
//!   capabilities open get an offer without remote access instead.
//! - Threading comes back exactly as asked (FI_THREAD_DOMAIN when not
//!   asked): MPICH checks it. Progress is FI_PROGRESS_MANUAL.
//! - Callers older than API 1.5 (mr_mode as an enum) are refused.
#![forbid(unsafe_code)]

use crate::sys;

/// libfabric's FI_VERSION(major, minor).
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The API version the provider claims: built on 1.17's headers, and 1.18
/// added only enum values to them.
pub const API_VERSION: u32 = fi_version(1, 18);

/// I/O vector entries a send may have (`tx_attr.iov_limit`): more than
/// one are gathered into one buffer the send keeps. Receives, RMA and
/// atomics take one.
pub const SEND_IOV_LIMIT: usize = 8;

/// The first API version whose `mr_mode` is a set of bits. A caller of an
/// older version (Intel MPI 2021 asks with version 0) reads it as the old
/// enumeration, where FI_MR_BASIC stands for exactly
/// [`MR_MODE_REMOTE`]'s three bits.
pub const API_VERSION_MR_BITS: u32 = fi_version(1, 5);

/// FI_MR_UNSPEC, FI_MR_BASIC and FI_MR_SCALABLE: the values of `mr_mode`
/// before API 1.5.
pub const MR_UNSPEC: u32 = 0;
/// See [`MR_UNSPEC`].
pub const MR_BASIC: u32 = 1;

use std::net::IpAddr;

use crate::addr::EpAddr;
use crate::flags::{
    ATOMIC, MSG, MULTI_RECV, READ, RECV, REMOTE_READ, REMOTE_WRITE, RMA, SEND, TAGGED, WRITE,
};
const LOCAL_COMM: u64 = sys::FI_LOCAL_COMM;
const REMOTE_COMM: u64 = sys::FI_REMOTE_COMM;
const SOURCE: u64 = sys::FI_SOURCE;
const DIRECTED_RECV: u64 = sys::FI_DIRECTED_RECV;

/// Capabilities that name a kind of transfer.
const CLASSES: u64 = MSG | TAGGED | RMA | ATOMIC;
/// Capabilities that name a direction.
const DIRECTIONS: u64 = READ | WRITE | RECV | SEND | REMOTE_READ | REMOTE_WRITE;
/// Secondary capabilities the provider has.
const SECONDARY: u64 = MULTI_RECV | SOURCE | LOCAL_COMM | REMOTE_COMM;
/// What needs registered memory that peers reach.
const REMOTE_ACCESS: u64 = RMA | ATOMIC | REMOTE_READ | REMOTE_WRITE | READ | WRITE;
/// Capabilities of the transmit side and of the receive side (the domain's
/// own, FI_LOCAL_COMM and FI_REMOTE_COMM, are in neither: libfabric's
/// getinfo test refuses them there).
const TX_CAPS: u64 = CLASSES | READ | WRITE | SEND;
const RX_CAPS: u64 =
    CLASSES | REMOTE_READ | REMOTE_WRITE | RECV | MULTI_RECV | SOURCE | DIRECTED_RECV;
/// The domain's capabilities.
const DOMAIN_CAPS: u64 = LOCAL_COMM | REMOTE_COMM;

/// The memory registration modes remote access needs.
pub const MR_MODE_REMOTE: u32 = sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY;

const OP_FLAGS_TX: u64 = (sys::FI_COMPLETION
    | sys::FI_INJECT
    | sys::FI_INJECT_COMPLETE
    | sys::FI_TRANSMIT_COMPLETE
    | sys::FI_DELIVERY_COMPLETE) as u64;
const OP_FLAGS_RX: u64 = (sys::FI_COMPLETION | sys::FI_MULTI_RECV) as u64;

/// A transmit or receive context's attributes (`fi_tx_attr`, `fi_rx_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtxAttr {
    /// Capabilities of this side.
    pub caps: u64,
    /// Mode bits.
    pub mode: u64,
    /// Default operation flags.
    pub op_flags: u64,
    /// Message ordering (FI_ORDER_*).
    pub msg_order: u64,
    /// Completion ordering.
    pub comp_order: u64,
    /// Largest inject (transmit side only).
    pub inject_size: usize,
    /// Queue depth.
    pub size: usize,
    /// Entries of an IO vector.
    pub iov_limit: usize,
    /// Entries of an RMA IO vector (transmit side only).
    pub rma_iov_limit: usize,
}

/// The endpoint's attributes (`fi_ep_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EpAttr {
    /// FI_EP_*.
    pub ep_type: u32,
    /// FI_PROTO_*.
    pub protocol: u32,
    /// Largest message.
    pub max_msg_size: usize,
    /// Which tag bits carry meaning to the caller (`mem_tag_format`): the
    /// provider matches all 64, so it echoes a format asked for.
    pub mem_tag_format: u64,
    /// Transmit contexts (1).
    pub tx_ctx_cnt: usize,
    /// Receive contexts (1).
    pub rx_ctx_cnt: usize,
    /// Bytes of an authorization key (none).
    pub auth_key_size: usize,
}

/// The domain's attributes (`fi_domain_attr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DomainAttr {
    /// The device's name.
    pub name: Option<String>,
    /// FI_THREAD_*.
    pub threading: u32,
    /// FI_PROGRESS_* of control operations.
    pub control_progress: u32,
    /// FI_PROGRESS_* of data transfers.
    pub data_progress: u32,
    /// FI_RM_*.
    pub resource_mgmt: u32,
    /// FI_AV_*.
    pub av_type: u32,
    /// FI_MR_* bits.
    pub mr_mode: u32,
    /// The domain's capabilities (FI_LOCAL_COMM, FI_REMOTE_COMM,
    /// FI_SHARED_AV).
    pub caps: u64,
    /// Hints only: whether they had a domain attribute at all (one given
    /// with `mr_mode` 0 says the caller takes no registration mode; none
    /// given says nothing).
    pub given: bool,
    /// Bytes of a memory key.
    pub mr_key_size: usize,
    /// Bytes of remote CQ data.
    pub cq_data_size: usize,
    /// Completion queues a domain may open.
    pub cq_cnt: usize,
    /// Endpoints a domain may open.
    pub ep_cnt: usize,
    /// Counters a domain may open.
    pub cntr_cnt: usize,
    /// Entries of a registration's IO vector.
    pub mr_iov_limit: usize,
    /// Registrations a domain may hold.
    pub mr_cnt: usize,
}

/// The fabric's attributes (`fi_fabric_attr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricAttr {
    /// The fabric's name.
    pub name: Option<String>,
    /// The provider's version.
    pub prov_version: u32,
    /// The API version.
    pub api_version: u32,
}

/// One `fi_info`, as far as the provider reads or fills it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Info {
    /// Capabilities.
    pub caps: u64,
    /// Mode bits the caller supports (hints) or the provider needs (offer).
    pub mode: u64,
    /// FI_FORMAT_UNSPEC, FI_SOCKADDR, ...
    pub addr_format: u32,
    /// Transmit attributes.
    pub tx: CtxAttr,
    /// Receive attributes.
    pub rx: CtxAttr,
    /// Endpoint attributes.
    pub ep: EpAttr,
    /// Domain attributes.
    pub domain: DomainAttr,
    /// Fabric attributes.
    pub fabric: FabricAttr,
    /// The local address (`src_addr`, an [`crate::addr`] address), where
    /// the device's is known.
    pub src_addr: Option<[u8; crate::addr::LEN]>,
    /// The destination `node` and `service` named (`dest_addr`).
    pub dest_addr: Option<[u8; crate::addr::LEN]>,
}

/// What a device lets the provider offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its name (the domain's name): `rxe0`, `mlx5_0`, `sim`.
    pub name: String,
    /// Whether it does 64-bit atomics (FI_ATOMIC).
    pub atomics: bool,
    /// Largest message.
    pub max_msg_size: usize,
    /// Largest inject.
    pub inject_size: usize,
    /// Transmit and receive queue depth.
    pub queue_size: usize,
    /// The IP address its domains listen on (none on the simulated
    /// fabric, whose addresses exist only once its job does).
    pub ip: Option<IpAddr>,
}

/// The fabric's name.
pub const FABRIC_NAME: &str = "xrc";
/// The provider's own version.
pub const PROVIDER_VERSION: u32 = fi_version(0, 1);
/// Bytes of remote CQ data a message carries.
pub const CQ_DATA_SIZE: usize = 8;
/// The tag format offered when none is asked: every bit a tag bit, in
/// libfabric's conventional pattern (as its rxm and tcp providers offer).
pub const TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;
/// Largest `fi_inject`: copied into the BTL's send buffer at the call.
pub const INJECT_SIZE: usize = 4096;
/// Deepest transmit or receive queue offered: operations the provider
/// tracks, not device work requests (the BTL queues those).
pub const QUEUE_SIZE: usize = 4096;

impl Device {
    /// What the provider offers on a device with these capabilities: RMA
    /// and messages up to its largest registration (one rendezvous read
    /// lands a whole message), atomics where it has them.
    pub fn of(name: &str, caps: &xrcbtl_fabric::DeviceCaps) -> Device {
        Device {
            name: name.to_string(),
            atomics: caps.atomics,
            max_msg_size: usize::try_from(caps.max_mr_size).unwrap_or(usize::MAX),
            inject_size: INJECT_SIZE,
            queue_size: QUEUE_SIZE,
            ip: None,
        }
    }
}

/// Where `fi_getinfo`'s `node` and `service` put an answer on a device
/// listening on `ip`. With FI_SOURCE (`source`), or with no node, they name
/// the local address: a node must be the device's IP address, and the
/// answer's `src_addr` is that address with the service's port (a domain
/// opened with the answer listens there while the port is free, so that a
/// peer that named it reaches the domain's first endpoint). Without
/// FI_SOURCE a node names the destination, an IP address: `dest_addr` is
/// that listener's first endpoint ([`EpAddr::template`]) and `src_addr`
/// the device's. A service is a port number. Nothing can be
/// placed on a device without a known address (the simulated fabric) but
/// an answer with neither.
pub fn place(
    info: &mut Info,
    ip: Option<IpAddr>,
    node: Option<&str>,
    service: Option<&str>,
    source: bool,
) -> Result<(), Refused> {
    let port = match service {
        None => 0,
        Some(s) => s
            .parse::<u16>()
            .map_err(|_| Refused("service: not a port number"))?,
    };
    let Some(ip) = ip else {
        return match (node, service) {
            (None, None) => Ok(()),
            _ => Err(Refused("node or service on a device without an address")),
        };
    };
    let named = match node {
        None => None,
        Some(n) => Some(
            n.parse::<IpAddr>()
                .map_err(|_| Refused("node: not an IP address"))?,
        ),
    };
    if source || named.is_none() {
        if named.is_some_and(|n| n != ip) {
            return Err(Refused("node: not this device's address"));
        }
        info.src_addr = Some(EpAddr::template(ip, port).encode());
    } else {
        info.src_addr = Some(EpAddr::template(ip, 0).encode());
        info.dest_addr = named.map(|n| EpAddr::template(n, port).encode());
    }
    Ok(())
}

/// Everything the provider can do on `device`.
pub fn offer(device: &Device) -> Info {
    let mut caps = CLASSES | DIRECTIONS | DIRECTED_RECV | SECONDARY;
    if !device.atomics {
        caps &= !ATOMIC;
    }
    let order = sys::FI_ORDER_SAS as u64;
    // A rank's atomics to a peer go out on its one QP to that peer, in the
    // order posted (a pending queue is first in, first out), and the
    // device executes a QP's atomics in the order they arrive: atomics to
    // one address are ordered among themselves, as Intel MPI's hints ask.
    let atomic_order = if device.atomics {
        sys::FI_ORDER_ATOMIC_RAR
            | sys::FI_ORDER_ATOMIC_RAW
            | sys::FI_ORDER_ATOMIC_WAR
            | sys::FI_ORDER_ATOMIC_WAW
    } else {
        0
    };
    Info {
        caps,
        mode: 0,
        addr_format: sys::FI_FORMAT_UNSPEC,
        tx: CtxAttr {
            caps: caps & TX_CAPS,
            msg_order: order | atomic_order,
            inject_size: device.inject_size,
            size: device.queue_size,
            iov_limit: SEND_IOV_LIMIT,
            rma_iov_limit: 1,
            ..CtxAttr::default()
        },
        rx: CtxAttr {
            caps: caps & RX_CAPS,
            msg_order: order,
            size: device.queue_size,
            iov_limit: 1,
            ..CtxAttr::default()
        },
        ep: EpAttr {
            ep_type: sys::FI_EP_RDM,
            protocol: sys::FI_PROTO_UNSPEC,
            max_msg_size: device.max_msg_size,
            mem_tag_format: TAG_FORMAT,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            auth_key_size: 0,
        },
        domain: DomainAttr {
            name: Some(device.name.clone()),
            threading: sys::FI_THREAD_DOMAIN,
            control_progress: sys::FI_PROGRESS_MANUAL,
            data_progress: sys::FI_PROGRESS_MANUAL,
            resource_mgmt: sys::FI_RM_ENABLED,
            av_type: sys::FI_AV_UNSPEC,
            mr_mode: MR_MODE_REMOTE,
            caps: DOMAIN_CAPS,
            given: false,
            mr_key_size: 8,
            cq_data_size: CQ_DATA_SIZE,
            cq_cnt: 1024,
            ep_cnt: 1024,
            cntr_cnt: 1024,
            mr_iov_limit: 1,
            mr_cnt: 1 << 20,
        },
        fabric: FabricAttr {
            name: Some(FABRIC_NAME.into()),
            prov_version: PROVIDER_VERSION,
            api_version: API_VERSION,
        },
        src_addr: None,
        dest_addr: None,
    }
}

/// Why hints refused an offer: the attribute, for the provider's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

fn at_most(asked: usize, offered: usize, what: &'static str) -> Result<(), Refused> {
    if asked > offered {
        Err(Refused(what))
    } else {
        Ok(())
    }
}

fn subset(asked: u64, offered: u64, what: &'static str) -> Result<(), Refused> {
    if asked & !offered != 0 {
        Err(Refused(what))
    } else {
        Ok(())
    }
}

/// The capabilities to return for `asked` out of `offered` (see the rules).
fn narrow_caps(asked: u64, offered: u64) -> u64 {
    if asked == 0 {
        return offered;
    }
    let mut caps = asked;
    if caps & DIRECTIONS == 0 {
        if caps & (MSG | TAGGED) != 0 {
            caps |= SEND | RECV;
        }
        if caps & (RMA | ATOMIC) != 0 {
            caps |= READ | WRITE | REMOTE_READ | REMOTE_WRITE;
        }
    }
    if caps & (LOCAL_COMM | REMOTE_COMM) == 0 {
        caps |= LOCAL_COMM | REMOTE_COMM;
    }
    caps & offered
}

/// The offer narrowed to `hints` for a caller of API `version`.
pub fn narrow(offer: &Info, hints: Option<&Info>, version: u32) -> Result<Info, Refused> {
    let old = version < API_VERSION_MR_BITS;
    let Some(h) = hints else {
        let mut out = offer.clone();
        if old && out.domain.mr_mode == MR_MODE_REMOTE {
            out.domain.mr_mode = MR_BASIC;
        }
        return Ok(out);
    };
    let mut out = offer.clone();

    // Remote access needs the caller to take the registration modes: before
    // API 1.5, FI_MR_BASIC or FI_MR_UNSPEC (the provider's choice, which is
    // FI_MR_BASIC); since, the three bits or (with no domain hints) nothing.
    let mr_ok = if old {
        matches!(h.domain.mr_mode, MR_UNSPEC | MR_BASIC)
    } else {
        (h.domain.mr_mode == 0 && !h.domain.given && !has_domain_hints(h))
            || h.domain.mr_mode & MR_MODE_REMOTE == MR_MODE_REMOTE
    };
    let mut offered_caps = offer.caps;
    if !mr_ok {
        if h.caps & REMOTE_ACCESS != 0 {
            return Err(Refused(
                "mr_mode: remote access needs FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY",
            ));
        }
        offered_caps &= !REMOTE_ACCESS;
    }
    subset(h.caps, offered_caps, "caps")?;
    out.caps = narrow_caps(h.caps, offered_caps);
    out.mode = 0;
    out.domain.mr_mode = match (out.caps & REMOTE_ACCESS != 0, old) {
        (true, false) => MR_MODE_REMOTE,
        (true, true) => MR_BASIC,
        (false, _) => 0,
    };
    if h.addr_format != sys::FI_FORMAT_UNSPEC {
        return Err(Refused("addr_format"));
    }

    // Transmit and receive sides.
    // A side's hints may name the domain's capabilities too; they are
    // the domain's, not the side's, and are not returned there.
    subset(h.tx.caps & !DOMAIN_CAPS, out.caps & TX_CAPS, "tx_attr caps")?;
    subset(h.rx.caps & !DOMAIN_CAPS, out.caps & RX_CAPS, "rx_attr caps")?;
    out.tx.caps = if h.tx.caps & !DOMAIN_CAPS != 0 {
        h.tx.caps & !DOMAIN_CAPS
    } else {
        out.caps & TX_CAPS
    };
    out.rx.caps = if h.rx.caps & !DOMAIN_CAPS != 0 {
        h.rx.caps & !DOMAIN_CAPS
    } else {
        out.caps & RX_CAPS
    };
    subset(h.tx.op_flags, OP_FLAGS_TX, "tx_attr op_flags")?;
    subset(h.rx.op_flags, OP_FLAGS_RX, "rx_attr op_flags")?;
    out.tx.op_flags = h.tx.op_flags;
    out.rx.op_flags = h.rx.op_flags;
    subset(h.tx.msg_order, offer.tx.msg_order, "tx_attr msg_order")?;
    subset(h.rx.msg_order, offer.rx.msg_order, "rx_attr msg_order")?;
    subset(h.tx.comp_order, 0, "tx_attr comp_order")?;
    subset(h.rx.comp_order, 0, "rx_attr comp_order")?;
    out.tx.mode = 0;
    out.rx.mode = 0;
    at_most(
        h.tx.inject_size,
        offer.tx.inject_size,
        "tx_attr inject_size",
    )?;
    at_most(h.tx.size, offer.tx.size, "tx_attr size")?;
    at_most(h.rx.size, offer.rx.size, "rx_attr size")?;
    at_most(h.tx.iov_limit, offer.tx.iov_limit, "tx_attr iov_limit")?;
    at_most(h.rx.iov_limit, offer.rx.iov_limit, "rx_attr iov_limit")?;
    at_most(
        h.tx.rma_iov_limit,
        offer.tx.rma_iov_limit,
        "tx_attr rma_iov_limit",
    )?;

    // The endpoint.
    if h.ep.ep_type != sys::FI_EP_UNSPEC && h.ep.ep_type != sys::FI_EP_RDM {
        return Err(Refused("ep_type"));
    }
    if h.ep.protocol != sys::FI_PROTO_UNSPEC {
        return Err(Refused("protocol"));
    }
    at_most(h.ep.max_msg_size, offer.ep.max_msg_size, "max_msg_size")?;
    if h.ep.mem_tag_format != 0 {
        out.ep.mem_tag_format = h.ep.mem_tag_format;
    }
    at_most(h.ep.tx_ctx_cnt, offer.ep.tx_ctx_cnt, "tx_ctx_cnt")?;
    at_most(h.ep.rx_ctx_cnt, offer.ep.rx_ctx_cnt, "rx_ctx_cnt")?;
    at_most(h.ep.auth_key_size, 0, "auth_key")?;

    // The domain.
    if h.domain.name.is_some() && h.domain.name != offer.domain.name {
        return Err(Refused("domain name"));
    }
    subset(h.domain.caps, DOMAIN_CAPS, "domain caps (no FI_SHARED_AV)")?;
    out.domain.caps = out.caps & DOMAIN_CAPS;
    if h.domain.threading != sys::FI_THREAD_UNSPEC {
        out.domain.threading = h.domain.threading;
    }
    for progress in [h.domain.control_progress, h.domain.data_progress] {
        if progress != sys::FI_PROGRESS_UNSPEC && progress != sys::FI_PROGRESS_MANUAL {
            return Err(Refused("progress: only FI_PROGRESS_MANUAL"));
        }
    }
    if h.domain.av_type != sys::FI_AV_UNSPEC {
        out.domain.av_type = h.domain.av_type;
    }
    at_most(
        h.domain.cq_data_size,
        offer.domain.cq_data_size,
        "cq_data_size",
    )?;
    at_most(
        h.domain.mr_key_size,
        offer.domain.mr_key_size,
        "mr_key_size",
    )?;
    at_most(h.domain.cq_cnt, offer.domain.cq_cnt, "cq_cnt")?;
    at_most(h.domain.ep_cnt, offer.domain.ep_cnt, "ep_cnt")?;
    at_most(h.domain.cntr_cnt, offer.domain.cntr_cnt, "cntr_cnt")?;
    at_most(
        h.domain.mr_iov_limit,
        offer.domain.mr_iov_limit,
        "mr_iov_limit",
    )?;
    at_most(h.domain.mr_cnt, offer.domain.mr_cnt, "mr_cnt")?;

    // The fabric.
    if h.fabric.name.is_some() && h.fabric.name != offer.fabric.name {
        return Err(Refused("fabric name"));
    }
    Ok(out)
}

/// Whether hints say anything about the domain (a NULL `domain_attr` reads
/// as all zeros).
fn has_domain_hints(h: &Info) -> bool {
    h.domain != DomainAttr::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rxe() -> Info {
        offer(&Device {
            name: "rxe0".into(),
            atomics: true,
            max_msg_size: 1 << 30,
            inject_size: 64,
            queue_size: 1024,
            ip: None,
        })
    }

    fn siw() -> Info {
        offer(&Device {
            name: "siw0".into(),
            atomics: false,
            max_msg_size: 1 << 30,
            inject_size: 64,
            queue_size: 1024,
            ip: None,
        })
    }

    const V1_18: u32 = fi_version(1, 18);

    #[test]
    fn node_and_service_place_an_answer_on_its_device() {
        let ip: IpAddr = "10.0.2.15".parse().unwrap();
        let decode = |b: Option<[u8; 64]>| EpAddr::decode(&b.unwrap()).unwrap();
        // Nothing named: the device's address.
        let mut i = rxe();
        place(&mut i, Some(ip), None, None, false).unwrap();
        assert_eq!(decode(i.src_addr).listen, "10.0.2.15:0".parse().unwrap());
        assert_eq!(i.dest_addr, None);
        // FI_SOURCE with the device's address and a port.
        let mut i = rxe();
        place(&mut i, Some(ip), Some("10.0.2.15"), Some("9228"), true).unwrap();
        let src = decode(i.src_addr);
        assert_eq!(src.listen.port(), 9228);
        assert_eq!(src.rank, crate::addr::rank_of(ip, 9228).unwrap());
        // Another host's address as a source: not this device.
        assert!(place(&mut rxe(), Some(ip), Some("10.0.2.16"), None, true).is_err());
        // A destination.
        let mut i = rxe();
        place(&mut i, Some(ip), Some("10.0.2.16"), Some("9228"), false).unwrap();
        assert_eq!(
            decode(i.dest_addr).listen,
            "10.0.2.16:9228".parse().unwrap()
        );
        assert_eq!(decode(i.src_addr).listen.ip(), ip);
        // Names the provider cannot resolve, and the simulated fabric.
        assert!(place(&mut rxe(), Some(ip), Some("host"), None, false).is_err());
        assert!(place(&mut rxe(), Some(ip), None, Some("http"), true).is_err());
        assert!(place(&mut rxe(), None, None, Some("9228"), true).is_err());
        let mut i = rxe();
        place(&mut i, None, None, None, false).unwrap();
        assert_eq!(i.src_addr, None);
    }

    #[test]
    fn no_hints_get_the_whole_offer_in_the_callers_mr_mode() {
        assert_eq!(narrow(&rxe(), None, V1_18), Ok(rxe()));
        for old in [0, fi_version(1, 4)] {
            let got = narrow(&rxe(), None, old).unwrap();
            assert_eq!(got.domain.mr_mode, MR_BASIC);
            assert_eq!(got.caps, rxe().caps);
        }
        assert_eq!(rxe().caps & ATOMIC, ATOMIC);
        assert_eq!(siw().caps & ATOMIC, 0);
    }

    /// Open MPI 4.1's mtl/ofi: tagged only, mr_mode 0, two mode bits.
    #[test]
    fn tagged_only_with_no_registration_modes_comes_back_without_remote_access() {
        let mut h = Info {
            caps: TAGGED | DIRECTED_RECV,
            mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
            ..Info::default()
        };
        h.ep.ep_type = sys::FI_EP_RDM;
        h.domain.threading = sys::FI_THREAD_DOMAIN;
        h.domain.av_type = sys::FI_AV_MAP;
        h.domain.cq_data_size = 4;
        h.tx.msg_order = sys::FI_ORDER_SAS as u64;
        h.tx.op_flags = sys::FI_COMPLETION as u64;
        let got = narrow(&rxe(), Some(&h), fi_version(1, 5)).unwrap();
        assert_eq!(
            got.caps,
            TAGGED | DIRECTED_RECV | SEND | RECV | LOCAL_COMM | REMOTE_COMM
        );
        assert_eq!(got.mode, 0, "the provider needs no mode bit");
        assert_eq!(got.domain.mr_mode, 0);
        assert_eq!(got.domain.av_type, sys::FI_AV_MAP);
        assert_eq!(got.domain.threading, sys::FI_THREAD_DOMAIN);
        assert_eq!(got.tx.op_flags, sys::FI_COMPLETION as u64);
        assert_eq!(got.tx.caps & (RMA | ATOMIC | READ | WRITE), 0);
    }

    /// What libfabric's own getinfo test (fabtests' fi_getinfo_test) asks
    /// of every provider: a side's caps hold no domain capability; a domain
    /// attribute given with `mr_mode` 0 takes no mode bit back (and so no
    /// remote access); domain caps come back as asked, FI_SHARED_AV
    /// refused.
    #[test]
    fn the_shape_libfabrics_getinfo_test_checks() {
        let all = narrow(&rxe(), None, V1_18).unwrap();
        assert_eq!(all.tx.caps & (LOCAL_COMM | REMOTE_COMM), 0);
        assert_eq!(all.rx.caps & (LOCAL_COMM | REMOTE_COMM), 0);
        assert_eq!(all.rx.caps & !all.caps, 0, "a side's caps are the info's");
        let mut h = Info::default();
        h.domain.given = true;
        let got = narrow(&rxe(), Some(&h), V1_18).unwrap();
        assert_eq!(got.domain.mr_mode, 0);
        assert_eq!(got.caps & REMOTE_ACCESS, 0);
        h.domain.caps = LOCAL_COMM | REMOTE_COMM;
        let got = narrow(&rxe(), Some(&h), V1_18).unwrap();
        assert_eq!(got.domain.caps, LOCAL_COMM | REMOTE_COMM);
        h.domain.caps = sys::FI_SHARED_AV;
        assert!(narrow(&rxe(), Some(&h), V1_18).is_err());
        // A side's hints naming a domain capability are not refused for it.
        let mut h = Info::default();
        h.tx.caps = MSG | SEND | LOCAL_COMM;
        let got = narrow(&rxe(), Some(&h), V1_18).unwrap();
        assert_eq!(got.tx.caps, MSG | SEND);
    }

    /// Open MPI 4.1's btl/ofi: RMA and atomics with the three modes and
    /// delivery complete.
    #[test]
    fn remote_access_with_the_registration_modes_is_offered_where_the_device_has_it() {
        let mut h = Info {
            caps: RMA | ATOMIC,
            ..Info::default()
        };
        h.ep.ep_type = sys::FI_EP_RDM;
        h.domain.mr_mode = MR_MODE_REMOTE | sys::FI_MR_LOCAL;
        h.tx.op_flags = sys::FI_DELIVERY_COMPLETE as u64;
        let got = narrow(&rxe(), Some(&h), fi_version(1, 5)).unwrap();
        assert_eq!(
            got.caps & (RMA | ATOMIC | READ | WRITE | REMOTE_READ | REMOTE_WRITE),
            RMA | ATOMIC | DIRECTIONS & REMOTE_ACCESS
        );
        assert_eq!(got.domain.mr_mode, MR_MODE_REMOTE, "never FI_MR_LOCAL");
        assert_eq!(narrow(&siw(), Some(&h), V1_18), Err(Refused("caps")));
        h.domain.mr_mode = sys::FI_MR_VIRT_ADDR;
        assert!(narrow(&rxe(), Some(&h), V1_18)
            .unwrap_err()
            .0
            .starts_with("mr_mode"));
    }

    /// Intel MPI 2021 asks with API version 0 and mr_mode 0: before 1.5
    /// that is FI_MR_UNSPEC (the provider picks), and the answer is
    /// FI_MR_BASIC, never the later bits; FI_MR_SCALABLE cannot have remote
    /// access, and the later bits mean nothing to such a caller.
    #[test]
    fn callers_before_api_1_5_get_mr_mode_as_the_old_enumeration() {
        let mut h = Info {
            caps: MSG | TAGGED | RMA | ATOMIC,
            ..Info::default()
        };
        h.ep.ep_type = sys::FI_EP_RDM;
        h.domain.threading = sys::FI_THREAD_DOMAIN;
        for version in [0, fi_version(1, 4)] {
            for asked in [MR_UNSPEC, MR_BASIC] {
                h.domain.mr_mode = asked;
                let got = narrow(&rxe(), Some(&h), version).unwrap();
                assert_eq!(got.domain.mr_mode, MR_BASIC);
                assert_eq!(got.caps & (RMA | ATOMIC), RMA | ATOMIC);
            }
            h.domain.mr_mode = 2; // FI_MR_SCALABLE
            assert!(narrow(&rxe(), Some(&h), version)
                .unwrap_err()
                .0
                .starts_with("mr_mode"));
            h.domain.mr_mode = MR_MODE_REMOTE;
            assert!(narrow(&rxe(), Some(&h), version).is_err());
            h.caps = MSG | TAGGED;
            h.domain.mr_mode = MR_UNSPEC;
            assert_eq!(narrow(&rxe(), Some(&h), version).unwrap().domain.mr_mode, 0);
            h.caps = MSG | TAGGED | RMA | ATOMIC;
        }
    }

    /// MPICH ch4:ofi's default set, with FI_MR_ENDPOINT offered.
    #[test]
    fn mpich_hints_get_threading_exactly_as_asked() {
        let mut h = Info {
            caps: MSG | MULTI_RECV | TAGGED | DIRECTED_RECV | RMA,
            ..Info::default()
        };
        h.mode = sys::FI_CONTEXT | sys::FI_ASYNC_IOV | sys::FI_RX_CQ_DATA | sys::FI_CONTEXT2;
        h.domain.mr_mode = MR_MODE_REMOTE | sys::FI_MR_ENDPOINT;
        h.domain.threading = sys::FI_THREAD_DOMAIN;
        h.domain.control_progress = sys::FI_PROGRESS_MANUAL;
        h.domain.data_progress = sys::FI_PROGRESS_MANUAL;
        h.domain.av_type = sys::FI_AV_TABLE;
        h.tx.op_flags = (sys::FI_COMPLETION | sys::FI_DELIVERY_COMPLETE) as u64;
        h.tx.msg_order = sys::FI_ORDER_SAS as u64;
        let got = narrow(&siw(), Some(&h), V1_18).unwrap();
        assert_eq!(got.domain.threading, sys::FI_THREAD_DOMAIN);
        assert_eq!(
            got.caps & (MULTI_RECV | SOURCE),
            MULTI_RECV,
            "secondary caps only when asked"
        );
        h.domain.threading = sys::FI_THREAD_SAFE;
        assert_eq!(
            narrow(&siw(), Some(&h), V1_18).unwrap().domain.threading,
            sys::FI_THREAD_SAFE
        );
        h.domain.data_progress = sys::FI_PROGRESS_AUTO;
        assert!(narrow(&siw(), Some(&h), V1_18).is_err());
    }

    #[test]
    fn each_thing_the_offer_cannot_do_refuses_it_by_name() {
        type Spoil = fn(&mut Info);
        let cases: [(&str, Spoil); 14] = [
            ("caps", |h| h.caps = sys::FI_MULTICAST as u64),
            ("addr_format", |h| h.addr_format = sys::FI_SOCKADDR_IN),
            ("tx_attr op_flags", |h| {
                h.tx.op_flags = sys::FI_COMMIT_COMPLETE as u64
            }),
            ("rx_attr comp_order", |h| {
                h.rx.comp_order = sys::FI_ORDER_STRICT as u64
            }),
            ("tx_attr msg_order", |h| {
                h.tx.msg_order = sys::FI_ORDER_RAW as u64
            }),
            ("tx_attr inject_size", |h| h.tx.inject_size = 65),
            ("ep_type", |h| h.ep.ep_type = sys::FI_EP_MSG),
            ("protocol", |h| h.ep.protocol = sys::FI_PROTO_RXM),
            ("max_msg_size", |h| h.ep.max_msg_size = (1 << 30) + 1),
            ("rx_ctx_cnt", |h| h.ep.rx_ctx_cnt = 2),
            ("domain name", |h| h.domain.name = Some("mlx5_0".into())),
            ("cq_data_size", |h| h.domain.cq_data_size = 16),
            ("fabric name", |h| h.fabric.name = Some("IB-0xfe80".into())),
            ("auth_key", |h| h.ep.auth_key_size = 8),
        ];
        for (what, spoil) in cases {
            let mut h = Info::default();
            h.domain.mr_mode = MR_MODE_REMOTE;
            assert!(narrow(&rxe(), Some(&h), V1_18).is_ok());
            spoil(&mut h);
            assert_eq!(narrow(&rxe(), Some(&h), V1_18), Err(Refused(what)));
        }
    }

    #[test]
    fn the_tag_format_asked_is_echoed_and_all_bits_are_offered() {
        let offer = rxe();
        assert_eq!(offer.ep.mem_tag_format, TAG_FORMAT);
        let mut hints = Info::default();
        hints.ep.mem_tag_format = 0x0000_FFFF_FFFF_FFFF;
        let out = narrow(&offer, Some(&hints), API_VERSION).unwrap();
        assert_eq!(out.ep.mem_tag_format, 0x0000_FFFF_FFFF_FFFF);
        let out = narrow(&offer, Some(&Info::default()), API_VERSION).unwrap();
        assert_eq!(out.ep.mem_tag_format, TAG_FORMAT);
    }

    #[test]
    fn a_class_without_a_direction_gets_every_direction_and_names_match() {
        let mut h = Info {
            caps: MSG | SEND,
            ..Info::default()
        };
        h.domain.name = Some("rxe0".into());
        h.fabric.name = Some("xrc".into());
        let got = narrow(&rxe(), Some(&h), V1_18).unwrap();
        assert_eq!(got.caps, MSG | SEND | LOCAL_COMM | REMOTE_COMM);
        assert_eq!(got.rx.caps & RECV, 0);
        h.caps = MSG | LOCAL_COMM;
        assert_eq!(
            narrow(&rxe(), Some(&h), V1_18).unwrap().caps,
            MSG | LOCAL_COMM | SEND | RECV
        );
    }
}
