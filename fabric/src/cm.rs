//! Types of the RDMA connection manager (librdmacm's shape): port spaces,
//! connection parameters, events, reject reasons and private-data limits.

use std::net::SocketAddr;

use crate::types::{Gid, Transport};

/// The RDMA CM port space of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections over IP addressing; required on
    /// iWARP. Costs 36 bytes of the REQ's private data on IB.
    Tcp,
    /// `RDMA_PS_IB`: native IB service ids; what XRC over the RDMA CM needs.
    Ib,
}

/// Parameters of `connect` and `accept` (`rdma_conn_param`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParam<'a> {
    /// Bytes carried to the peer in the request or the reply.
    pub private_data: &'a [u8],
    /// RDMA reads the peer may have outstanding against us.
    pub responder_resources: u8,
    /// RDMA reads we may have outstanding against the peer.
    pub initiator_depth: u8,
    /// Transport retries of both sides' QPs (connect only; ignored when
    /// accepting).
    pub retry_count: u8,
    /// RNR retries the *peer* makes when sending to us (7 = forever): the
    /// initiator's value goes to the acceptor's QP and the acceptor's to the
    /// initiator's, as the IB CM carries them.
    pub rnr_retry_count: u8,
    /// The QP number a request announces when no QP is given
    /// (`rdma_conn_param.qp_num`; ignored with a QP and on iWARP). The IB
    /// CM keys its stale-connection check on (this number, the sending
    /// HCA): concurrent QP-less requests from one node to another need
    /// distinct numbers, or all but the first are rejected as
    /// [`RejectReason::StaleConnection`].
    pub qp_num: u32,
    /// Local ACK timeout of the QP the CM connects (IB encoding, 4.096 µs ×
    /// 2^n), instead of the one the CM derives from the path
    /// (`RDMA_OPTION_ID_ACK_TIMEOUT`). `None` keeps the CM's (on RoCE about
    /// 18, i.e. 1 s per try). Ignored on iWARP.
    pub ack_timeout: Option<u8>,
    /// RNR NAK timer a responder QP the CM connects advertises (IB
    /// encoding), instead of the CM's 0, which means 655 ms. Applies to RC
    /// QPs and XRC TGT QPs (an XRC INI QP has no receive side). Ignored on
    /// iWARP.
    pub min_rnr_timer: Option<u8>,
}

impl<'a> ConnParam<'a> {
    /// Usual parameters with the given private data.
    pub fn with_data(private_data: &'a [u8]) -> Self {
        ConnParam {
            private_data,
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: 0,
            ack_timeout: None,
            min_rnr_timer: None,
        }
    }

    /// Limits the RDMA read depths to what the device allows
    /// (`max_qp_rd_atom`, or the peer's when known): the CM hands these to
    /// the QPs, and a device refuses larger ones.
    pub fn clamp_rd_atomic(mut self, max: u32) -> Self {
        let m = max.min(u32::from(u8::MAX)) as u8;
        self.responder_resources = self.responder_resources.min(m);
        self.initiator_depth = self.initiator_depth.min(m);
        self
    }
}

/// The QP timers an application gives the CM in place of the CM's own
/// ([`ConnParam::ack_timeout`], [`ConnParam::min_rnr_timer`]), as the
/// providers keep them until the QP is connected.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QpTimers {
    pub ack_timeout: Option<u8>,
    pub min_rnr_timer: Option<u8>,
}

impl From<&ConnParam<'_>> for QpTimers {
    fn from(p: &ConnParam<'_>) -> Self {
        QpTimers {
            ack_timeout: p.ack_timeout,
            min_rnr_timer: p.min_rnr_timer,
        }
    }
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam::with_data(&[])
    }
}

/// Why a connection request was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The peer's application called `reject`; the event carries its private
    /// data.
    Consumer,
    /// Nobody listens at the destination (IB: invalid service id; iWARP:
    /// connection refused).
    NoListener,
    /// The peer's CM gave up waiting (e.g. our reply never arrived).
    Timeout,
    /// The peer's IB CM holds a request or connection with the same (QP
    /// number, sending HCA) (IB reject reason 10, stale connection): the
    /// request never reached the application. Worth retrying, with a
    /// distinct QP number ([`ConnParam::qp_num`]).
    StaleConnection,
    /// Any other reason the peer's CM gave (the IB reject reason number, or
    /// the negated errno on iWARP): the request never reached the
    /// application.
    Other(i32),
}

/// What a CM event reports (`rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    /// `resolve_addr` finished.
    AddrResolved,
    /// `resolve_addr` failed: no route to the address.
    AddrError,
    /// `resolve_route` finished.
    RouteResolved,
    /// `resolve_route` failed.
    RouteError,
    /// A peer asks to connect; the event carries a new id to accept or
    /// reject.
    ConnectRequest,
    /// The connection is up.
    Established,
    /// The peer rejected the request.
    Rejected(RejectReason),
    /// The peer did not answer (request timed out after its retries).
    Unreachable,
    /// The connection failed after it was accepted (reply lost).
    ConnectError,
    /// The connection was closed by either side, or torn down.
    Disconnected,
}

/// A CM event. `Id` is the provider's id type; a connect request hands the
/// new id over in `new_id`.
#[derive(Debug)]
pub struct CmEvent<Id> {
    /// [`CmId::key`](crate::CmId::key) of the id the event is about; for a
    /// connect request, the listening id.
    pub id: u64,
    /// What happened.
    pub kind: CmEventKind,
    /// Private data of the request, reply or reject. On IB the CM message has
    /// fixed-size private data, so this is zero-padded to the message size
    /// and the application must carry its own length; on iWARP it has the
    /// sender's exact length.
    pub private_data: Vec<u8>,
    /// The peer's QP number (connect request and reply).
    pub remote_qpn: Option<u32>,
    /// The peer's address (connect request).
    pub peer: Option<SocketAddr>,
    /// The id created for a connect request.
    pub new_id: Option<Id>,
}

/// A resolved route to a remote device, taken from one CM id
/// ([`CmId::route`](crate::CmId::route)) and reused for further ids to the
/// same device ([`CmId::resolve_cached`](crate::CmId::resolve_cached)), so
/// that address and path resolution happen once per remote node, not once
/// per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Destination LID (InfiniBand; 0 on Ethernet).
    pub dlid: u16,
    /// The path the kernel resolved, where it keeps one (InfiniBand and
    /// RoCE): a further id to the same device is given this path instead of
    /// asking the subnet administrator again.
    pub path: Option<PathRecord>,
}

/// A native InfiniBand address for the RDMA CM (`AF_IB`): a port's GID, a
/// partition, and a port number in the id's port space (the low 16 bits of
/// the service id by which the CM finds listeners). The GID is the address:
/// no ARP (IPoIB neighbour query) resolves it, and no IP address is
/// matched, so it scales where IP addressing does not (a job of N nodes
/// asks N² neighbour queries otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IbAddr {
    /// The port's GID.
    pub gid: Gid,
    /// The partition key (0xffff: the default, full-membership partition).
    pub pkey: u16,
    /// The port number in the id's port space (0 to bind: any free one).
    pub port: u16,
}

/// The default partition's key.
pub const DEFAULT_PKEY: u16 = 0xffff;

impl std::fmt::Display for IbAddr {
    /// `ib:<gid as 32 hex digits>/<pkey hex>/<port>`, for text exchanges.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ib:")?;
        for b in self.gid.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, "/{:04x}/{}", self.pkey, self.port)
    }
}

impl std::str::FromStr for IbAddr {
    type Err = crate::Error;

    /// Reads what `Display` writes.
    fn from_str(s: &str) -> crate::Result<Self> {
        let bad = || crate::Error::invalid(format!("{s:?} is not ib:<gid>/<pkey>/<port>"));
        let mut f = s.strip_prefix("ib:").ok_or_else(bad)?.split('/');
        let (Some(gid), Some(pkey), Some(port), None) = (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        if gid.len() != 32 || !gid.is_ascii() {
            return Err(bad());
        }
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(IbAddr {
            gid: Gid(g),
            pkey: u16::from_str_radix(pkey, 16).map_err(|_| bad())?,
            port: port.parse().map_err(|_| bad())?,
        })
    }
}

/// An InfiniBand path record in the subnet administrator's wire format
/// (`struct ibv_path_record`: 64 bytes, big-endian fields), as route
/// resolution produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathRecord(pub [u8; 64]);

/// What kind of CM message carries private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// Connection request (IB REQ, MPA request).
    Request,
    /// Accept (IB REP, MPA reply).
    Reply,
    /// Reject (IB REJ, MPA reply with the reject bit).
    Reject,
}

/// Largest private data an application may put in a CM message. On IB and
/// RoCE these are protocol constants: IB CM REQ 92 bytes, of which the RDMA
/// CM takes 36 for its header in every port space (only AF_IB addressing
/// spares it, which xrcbtl does not use), so 56; REP 196; REJ 148. On
/// iWARP, MPA v2 takes 4 of its private data bytes for IRD/ORD; siw (Linux
/// 6.12) delivers 251 bytes and refuses 252, so 251 is the portable limit.
pub fn max_private_data(transport: Transport, _ps: PortSpace, msg: CmMessage) -> usize {
    match (transport, msg) {
        (Transport::Iwarp, _) => 251,
        (_, CmMessage::Request) => 56,
        (_, CmMessage::Reply) => 196,
        (_, CmMessage::Reject) => 148,
    }
}
