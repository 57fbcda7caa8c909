//! The RDMA CM on librdmacm, with QPs the application owns: the provider
//! moves them through INIT/RTR/RTS with `rdma_init_qp_attr` as the handshake
//! progresses (on iWARP the kernel's iw_cm does RTR/RTS itself).
//!
//! RC ids use `RDMA_PS_TCP` and are created at once. XRC ids use `RDMA_PS_IB`
//! and must carry the XRC QP type, which librdmacm only sets through
//! `rdma_create_ep`; they are therefore created when their role is known
//! (listen: XRC_RECV, bound to the listening address; resolve: XRC_SEND,
//! bound to the wildcard address) and migrated onto the channel. Both are
//! made passive, which only binds: `rdma_create_ep` on an active address
//! would resolve address and route synchronously, inside progress. The
//! resolution then runs asynchronously like any other id's.
//!
//! A route reused from an earlier id ([`CmId::resolve_cached`]) carries the
//! kernel's path record; on InfiniBand and RoCE it is handed back with
//! `RDMA_OPTION_IB_PATH` in place of a route resolution, so that a node
//! pair costs one path query per process, not one per connection.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::objects::VerbsQp;
use super::sys;
use super::{check, errno_error, last_error, VerbsContext};
use crate::cm::{
    max_private_data, CmEvent, CmEventKind, CmMessage, ConnParam, IbAddr, PathRecord, PortSpace,
    QpTimers, RejectReason,
};
use crate::types::{QpState, QpType, Transport};
use crate::{CmChannel, CmId, Context, Error, Qp, Result};

/// What the channel knows about one of its ids.
struct Entry {
    key: u64,
    ps: PortSpace,
    qp: Option<VerbsQp>,
    /// What the application set in place of the CM's timers.
    timers: QpTimers,
    /// This side asked to disconnect (so a DISCONNECTED event needs no
    /// answer).
    disconnecting: bool,
}

/// An event made by the provider rather than read from librdmacm.
struct Synthetic {
    key: u64,
    kind: CmEventKind,
    private_data: Vec<u8>,
    remote_qpn: Option<u32>,
}

#[derive(Default)]
struct ChanState {
    next_key: u64,
    ids: HashMap<usize, Entry>,
    synthetic: VecDeque<Synthetic>,
}

pub(crate) struct ChanInner {
    ctx: VerbsContext,
    ch: *mut sys::rdma_event_channel,
    state: Mutex<ChanState>,
}

// SAFETY: an event channel is a file descriptor librdmacm reads under its
// own locking; the bookkeeping is behind a mutex.
unsafe impl Send for ChanInner {}
// SAFETY: as above.
unsafe impl Sync for ChanInner {}

impl Drop for ChanInner {
    fn drop(&mut self) {
        // SAFETY: every id of the channel holds it alive, so none is left;
        // every event read was acked.
        unsafe { sys::rdma_destroy_event_channel(self.ch) };
    }
}

impl ChanInner {
    fn state(&self) -> MutexGuard<'_, ChanState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An RDMA CM event channel on librdmacm.
pub struct VerbsCmChannel(Arc<ChanInner>);

impl VerbsCmChannel {
    pub(crate) fn new(ctx: &VerbsContext) -> Result<Self> {
        // SAFETY: plain constructor; the fd is made non-blocking before use.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(last_error("rdma_create_event_channel"));
        }
        // SAFETY: `ch` is a live channel with an open fd.
        unsafe {
            let fd = (*ch).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Ok(VerbsCmChannel(Arc::new(ChanInner {
            ctx: ctx.clone(),
            ch,
            state: Mutex::default(),
        })))
    }

    fn register(&self, id: *mut sys::rdma_cm_id, ps: PortSpace) -> VerbsCmId {
        let mut s = self.0.state();
        s.next_key += 1;
        let key = s.next_key;
        if !id.is_null() {
            s.ids.insert(
                id as usize,
                Entry {
                    key,
                    ps,
                    qp: None,
                    timers: QpTimers::default(),
                    disconnecting: false,
                },
            );
        }
        VerbsCmId {
            chan: self.0.clone(),
            key,
            ps,
            id: AtomicPtr::new(id),
            path: Mutex::new(None),
        }
    }
}

fn transport_of(ctx: &VerbsContext) -> Transport {
    ctx.caps().transport
}

fn reject_reason(transport: Transport, status: i32, private_len: usize) -> RejectReason {
    match (transport, status) {
        (_, s) if s == -libc::ETIMEDOUT => RejectReason::Timeout,
        // IB CM reject reasons (IBA table 112; ib_cm_rej_reason).
        (Transport::Infiniband | Transport::Roce, s) => ib_reject_reason(s),
        // iWARP reports both an MPA reject and a TCP reset as ECONNREFUSED;
        // only a consumer's reject carries private data.
        (Transport::Iwarp, _) if private_len == 0 => RejectReason::NoListener,
        (Transport::Iwarp, _) => RejectReason::Consumer,
    }
}

/// An IB CM reject reason number as the fabric names it.
pub(crate) fn ib_reject_reason(status: i32) -> RejectReason {
    match status {
        // IB_CM_REJ_INVALID_SERVICE_ID: nobody listens.
        8 => RejectReason::NoListener,
        // IB_CM_REJ_CONSUMER_DEFINED: what rdma_reject sends.
        28 => RejectReason::Consumer,
        // IB_CM_REJ_TIMEOUT.
        4 => RejectReason::Timeout,
        // IB_CM_REJ_STALE_CONN.
        10 => RejectReason::StaleConnection,
        s => RejectReason::Other(s),
    }
}

impl CmChannel for VerbsCmChannel {
    type Context = VerbsContext;
    type Id = VerbsCmId;

    fn create_id(&self, ps: PortSpace) -> Result<VerbsCmId> {
        if ps == PortSpace::Ib {
            // Created with its XRC type once listen or resolve says which.
            return Ok(self.register(null_mut(), ps));
        }
        let mut id = null_mut();
        // SAFETY: the channel is live; `id` receives the new id.
        if unsafe { sys::rdma_create_id(self.0.ch, &mut id, null_mut(), sys::RDMA_PS_TCP) } != 0 {
            return Err(last_error("rdma_create_id"));
        }
        Ok(self.register(id, ps))
    }

    fn poll_event(&self) -> Option<CmEvent<VerbsCmId>> {
        if let Some(s) = self.0.state().synthetic.pop_front() {
            return Some(CmEvent {
                id: s.key,
                kind: s.kind,
                private_data: s.private_data,
                remote_qpn: s.remote_qpn,
                peer: None,
                new_id: None,
            });
        }
        // Most looks find nothing: a poll of the channel's descriptor says
        // so, where rdma_get_cm_event allocates an event, writes its
        // command to the kernel and frees the event again (about 390
        // user-space instructions a look, measured on siw).
        if !self.readable() {
            return None;
        }
        loop {
            let mut ev = null_mut();
            // SAFETY: the channel is live and non-blocking.
            if unsafe { sys::rdma_get_cm_event(self.0.ch, &mut ev) } != 0 {
                return None;
            }
            let out = self.translate(ev);
            // SAFETY: acks the event just read, exactly once, after every
            // field needed was copied out.
            unsafe { sys::rdma_ack_cm_event(ev) };
            let Some(e) = out else { continue };
            if let Some(new) = &e.new_id {
                // A listener bound to the wildcard address hears requests
                // on every device; one on another device than this
                // channel's cannot use its QPs or XRC domain. Refuse it
                // (the id is destroyed with the event, now acked).
                if new.raw().and_then(|id| new.check_device(id)).is_err() {
                    let _ = new.reject(&[]);
                    continue;
                }
            }
            return Some(e);
        }
    }
}

impl VerbsCmChannel {
    /// Whether the channel's descriptor has something to read (or a
    /// poll of it failed, which the read then reports).
    fn readable(&self) -> bool {
        let mut pfd = libc::pollfd {
            // SAFETY: the channel is live.
            fd: unsafe { (*self.0.ch).fd },
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a timeout of 0 never blocks.
        unsafe { libc::poll(&mut pfd, 1, 0) != 0 }
    }

    /// Copies an event out and performs what the provider owes the
    /// application's QP; `None` for events the fabric does not report.
    fn translate(&self, ev: *mut sys::rdma_cm_event) -> Option<CmEvent<VerbsCmId>> {
        // SAFETY: `ev` is a live, unacked event; for connection events the
        // `conn` member of the parameter union is the one filled in.
        let (id, listen_id, kind, status, private_data, remote_qpn) = unsafe {
            let e = &*ev;
            let c = &e.param.conn;
            let data = if c.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    c.private_data.cast::<u8>(),
                    usize::from(c.private_data_len),
                )
                .to_vec()
            };
            (e.id, e.listen_id, e.event, e.status, data, c.qp_num)
        };
        let transport = transport_of(&self.0.ctx);
        // MPA carries no QP number.
        let remote_qpn = (transport != Transport::Iwarp).then_some(remote_qpn);
        let key_of = |p: *mut sys::rdma_cm_id| self.0.state().ids.get(&(p as usize)).map(|e| e.key);
        let simple = |key: u64, kind: CmEventKind, data: Vec<u8>| CmEvent {
            id: key,
            kind,
            private_data: data,
            remote_qpn: None,
            peer: None,
            new_id: None,
        };
        match kind {
            sys::RDMA_CM_EVENT_CONNECT_REQUEST => {
                let lkey = key_of(listen_id)?;
                let ps = self
                    .0
                    .state()
                    .ids
                    .get(&(listen_id as usize))
                    .map(|e| e.ps)?;
                let new = self.register(id, ps);
                Some(CmEvent {
                    id: lkey,
                    kind: CmEventKind::ConnectRequest,
                    private_data,
                    remote_qpn,
                    peer: peer_of(id),
                    new_id: Some(new),
                })
            }
            sys::RDMA_CM_EVENT_CONNECT_RESPONSE => {
                // IB with an application QP: finish the handshake here.
                let key = key_of(id)?;
                let (qp, timers) = self
                    .0
                    .state()
                    .ids
                    .get(&(id as usize))
                    .map_or((None, QpTimers::default()), |e| (e.qp.clone(), e.timers));
                // INIT again first, as librdmacm's ucma_modify_qp_rtr does:
                // only now does the CM grant remote reads and atomics (from
                // the connection's responder resources); before the reply
                // it granted remote writes alone.
                let states = [sys::IBV_QPS_INIT, sys::IBV_QPS_RTR, sys::IBV_QPS_RTS];
                let done = qp
                    .map_or(Ok(()), |qp| cm_transition(id, &qp, &states, timers))
                    // SAFETY: `id` is live; RTU goes out on success.
                    .and_then(|_| check("rdma_establish", unsafe { sys::rdma_establish(id) }));
                let kind = if done.is_ok() {
                    CmEventKind::Established
                } else {
                    // SAFETY: `id` is live; refuse the half-made connection.
                    unsafe { sys::rdma_reject(id, std::ptr::null(), 0) };
                    CmEventKind::ConnectError
                };
                Some(CmEvent {
                    remote_qpn,
                    ..simple(key, kind, private_data)
                })
            }
            sys::RDMA_CM_EVENT_ESTABLISHED => Some(CmEvent {
                remote_qpn,
                ..simple(key_of(id)?, CmEventKind::Established, private_data)
            }),
            sys::RDMA_CM_EVENT_REJECTED => {
                let reason = reject_reason(transport, status, private_data.len());
                Some(simple(
                    key_of(id)?,
                    CmEventKind::Rejected(reason),
                    private_data,
                ))
            }
            sys::RDMA_CM_EVENT_ADDR_RESOLVED => {
                Some(simple(key_of(id)?, CmEventKind::AddrResolved, vec![]))
            }
            sys::RDMA_CM_EVENT_ADDR_ERROR => {
                Some(simple(key_of(id)?, CmEventKind::AddrError, vec![]))
            }
            sys::RDMA_CM_EVENT_ROUTE_RESOLVED => {
                Some(simple(key_of(id)?, CmEventKind::RouteResolved, vec![]))
            }
            sys::RDMA_CM_EVENT_ROUTE_ERROR => {
                Some(simple(key_of(id)?, CmEventKind::RouteError, vec![]))
            }
            sys::RDMA_CM_EVENT_UNREACHABLE => {
                Some(simple(key_of(id)?, CmEventKind::Unreachable, vec![]))
            }
            sys::RDMA_CM_EVENT_CONNECT_ERROR => {
                Some(simple(key_of(id)?, CmEventKind::ConnectError, vec![]))
            }
            sys::RDMA_CM_EVENT_DISCONNECTED | sys::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                let answered = self
                    .0
                    .state()
                    .ids
                    .get(&(id as usize))
                    .is_some_and(|e| e.disconnecting);
                if !answered && kind == sys::RDMA_CM_EVENT_DISCONNECTED {
                    // The peer's DREQ waits for our DREP, which only
                    // rdma_disconnect sends; the application's QP is left
                    // alone (the fabric's IB semantics).
                    // SAFETY: `id` is live.
                    unsafe { sys::rdma_disconnect(id) };
                }
                Some(simple(key_of(id)?, CmEventKind::Disconnected, vec![]))
            }
            _ => None,
        }
    }
}

/// Moves an application QP through `states` with the attributes the CM
/// computed for this connection, except the timers the application set:
/// the CM hands every responder an RNR NAK timer of 0 (655 ms; on XRC that
/// stalls a whole shared INI QP) and derives the ACK timeout from the path.
/// Each is replaced only where the CM's mask carries it (the RNR timer at
/// RC and TGT RTR, never at an INI's; the timeout at RTS), so the masks
/// stay the ones the kernel allows for the QP type.
fn cm_transition(
    id: *mut sys::rdma_cm_id,
    qp: &VerbsQp,
    states: &[sys::ibv_qp_state],
    timers: QpTimers,
) -> Result<()> {
    for &s in states {
        let mut attr = sys::ibv_qp_attr {
            qp_state: s,
            ..Default::default()
        };
        let mut mask = 0;
        // SAFETY: `id` is live and bound to a device.
        check("rdma_init_qp_attr", unsafe {
            sys::rdma_init_qp_attr(id, &mut attr, &mut mask)
        })?;
        if let Some(t) = timers.min_rnr_timer {
            if mask & sys::IBV_QP_MIN_RNR_TIMER as i32 != 0 {
                attr.min_rnr_timer = t;
            }
        }
        if let Some(t) = timers.ack_timeout {
            if mask & sys::IBV_QP_TIMEOUT as i32 != 0 {
                attr.timeout = t;
            }
        }
        qp.modify_raw(&mut attr, mask)?;
    }
    Ok(())
}

fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // sockaddr.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Reads a socket address librdmacm filled in.
///
/// # Safety
/// `sa` is null or points to a valid sockaddr of its family's size.
unsafe fn from_sockaddr(sa: *const sys::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family tells the layout.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// The size of a `sockaddr_ib`.
const SOCKADDR_IB_LEN: u32 = std::mem::size_of::<sys::sockaddr_ib>() as u32;

/// A native InfiniBand address as the kernel takes it: the service id is
/// the port space's base and the port, matched in full.
fn sockaddr_ib(a: IbAddr, sid_base: u64) -> sys::sockaddr_ib {
    let mut sib = sys::sockaddr_ib {
        sib_family: sys::AF_IB as u16,
        sib_pkey: a.pkey.to_be(),
        ..Default::default()
    };
    sib.sib_addr.ib_u.uib_addr8 = a.gid.0;
    if a.port != 0 {
        sib.sib_sid = (sid_base | u64::from(a.port)).to_be();
        sib.sib_sid_mask = u64::MAX.to_be();
    }
    sib
}

/// Packs the path librdmacm keeps for an id into the SA's wire format.
fn pack_path(p: &sys::ibv_sa_path_rec) -> PathRecord {
    let mut b = [0u8; 64];
    // SAFETY: the GID unions are plain bytes.
    let (dgid, sgid) = unsafe { (p.dgid.raw, p.sgid.raw) };
    b[8..24].copy_from_slice(&dgid);
    b[24..40].copy_from_slice(&sgid);
    // The LIDs, flow label and P_Key are kept in network order already.
    b[40..42].copy_from_slice(&p.dlid.to_ne_bytes());
    b[42..44].copy_from_slice(&p.slid.to_ne_bytes());
    let flow = u32::from_be(p.flow_label) & 0xf_ffff;
    let word = (u32::from(p.raw_traffic != 0) << 31) | (flow << 8) | u32::from(p.hop_limit);
    b[44..48].copy_from_slice(&word.to_be_bytes());
    b[48] = p.traffic_class;
    b[49] = (u8::from(p.reversible != 0) << 7) | (p.numb_path & 0x7f);
    b[50..52].copy_from_slice(&p.pkey.to_ne_bytes());
    b[52..54].copy_from_slice(&u16::from(p.sl & 0xf).to_be_bytes());
    b[54] = (p.mtu_selector << 6) | (p.mtu & 0x3f);
    b[55] = (p.rate_selector << 6) | (p.rate & 0x3f);
    b[56] = (p.packet_life_time_selector << 6) | (p.packet_life_time & 0x3f);
    b[57] = p.preference;
    PathRecord(b)
}

/// The wire-format record as librdmacm's `struct ibv_path_record`.
fn unpack_path(p: &PathRecord) -> sys::ibv_path_record {
    let b = &p.0;
    let be16 = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let mut r = sys::ibv_path_record::default();
    let gid = |i: usize| {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(&b[i..i + 16]);
        sys::ibv_gid { raw }
    };
    r.dgid = gid(8);
    r.sgid = gid(24);
    r.dlid = be16(40);
    r.slid = be16(42);
    r.flowlabel_hoplimit = u32::from_ne_bytes([b[44], b[45], b[46], b[47]]);
    r.tclass = b[48];
    r.reversible_numpath = b[49];
    r.pkey = be16(50);
    r.qosclass_sl = be16(52);
    r.mtu = b[54];
    r.rate = b[55];
    r.packetlifetime = b[56];
    r.preference = b[57];
    r
}

fn peer_of(id: *mut sys::rdma_cm_id) -> Option<SocketAddr> {
    // SAFETY: `id` is live; librdmacm returns its stored address.
    unsafe { from_sockaddr(sys::rdma_get_peer_addr(id)) }
}

/// An RDMA CM id on librdmacm.
pub struct VerbsCmId {
    chan: Arc<ChanInner>,
    key: u64,
    ps: PortSpace,
    /// Null until created, for XRC ids.
    id: AtomicPtr<sys::rdma_cm_id>,
    /// The cached path to set in place of resolving the route.
    path: Mutex<Option<PathRecord>>,
}

// SAFETY: the id pointer is only used in calls librdmacm makes thread-safe;
// the bookkeeping lives in the channel behind its mutex.
unsafe impl Send for VerbsCmId {}
// SAFETY: as above.
unsafe impl Sync for VerbsCmId {}

impl Drop for VerbsCmId {
    fn drop(&mut self) {
        let id = self.id.load(Ordering::Acquire);
        if id.is_null() {
            return;
        }
        self.chan.state().ids.remove(&(id as usize));
        // SAFETY: created (or handed over in a connect request) for this
        // handle only; every event naming it was acked.
        unsafe { sys::rdma_destroy_id(id) };
    }
}

impl VerbsCmId {
    fn raw(&self) -> Result<*mut sys::rdma_cm_id> {
        let id = self.id.load(Ordering::Acquire);
        if id.is_null() {
            return Err(Error::state(
                "the XRC CM id has not been bound or resolved yet",
            ));
        }
        Ok(id)
    }

    /// The id's device must be this channel's: its QPs live there.
    fn check_device(&self, id: *mut sys::rdma_cm_id) -> Result<()> {
        // SAFETY: `id` is live.
        let verbs = unsafe { (*id).verbs };
        if !verbs.is_null() && verbs != self.chan.ctx.raw() {
            return Err(Error::invalid(format!(
                "the address belongs to another device than {}",
                self.chan.ctx.name()
            )));
        }
        Ok(())
    }

    fn check_private(&self, msg: CmMessage, data: &[u8]) -> Result<()> {
        let t = transport_of(&self.chan.ctx);
        let max = max_private_data(t, self.ps, msg);
        if data.len() > max {
            return Err(Error::invalid(format!(
                "{} bytes of private data exceed the {msg:?} limit of {max} on {t}",
                data.len()
            )));
        }
        Ok(())
    }

    /// Creates an XRC id with `rdma_create_ep` (the only way librdmacm sets
    /// its QP type), bound to the local address `src` (`len` bytes, of
    /// `family`: IP or AF_IB) and nothing more, and moves it onto the
    /// channel. The `rdma_addrinfo` is built here: RAI_PASSIVE makes
    /// rdma_create_ep only bind to its source address (and
    /// rdma_getaddrinfo names no GIDs).
    ///
    /// # Safety
    /// `src` points to a valid socket address of `len` bytes.
    unsafe fn create_xrc(
        &self,
        src: *mut sys::sockaddr,
        len: u32,
        family: u32,
        qp_type: u32,
    ) -> Result<*mut sys::rdma_cm_id> {
        let mut ai = sys::rdma_addrinfo {
            ai_flags: sys::RAI_PASSIVE as i32,
            ai_family: family as i32,
            ai_qp_type: qp_type as i32,
            ai_port_space: sys::RDMA_PS_IB as i32,
            ai_src_len: len,
            ai_src_addr: src,
            ..Default::default()
        };
        let mut id = null_mut();
        // SAFETY: `ai` describes a passive address that lives for the call
        // (the caller's promise); no PD or QP is attached.
        if unsafe { sys::rdma_create_ep(&mut id, &mut ai, null_mut(), null_mut()) } != 0 {
            return Err(last_error("rdma_create_ep"));
        }
        self.adopt_xrc(id)
    }

    /// Binds the id to a local address: an XRC id is created there as
    /// `qp_type` ([`VerbsCmId::create_xrc`]), an RC id is bound.
    ///
    /// # Safety
    /// As [`VerbsCmId::create_xrc`].
    unsafe fn bind_local(
        &self,
        src: *mut sys::sockaddr,
        len: u32,
        family: u32,
        qp_type: u32,
    ) -> Result<*mut sys::rdma_cm_id> {
        if self.ps == PortSpace::Ib {
            // SAFETY: the caller's promise.
            return unsafe { self.create_xrc(src, len, family, qp_type) };
        }
        let id = self.raw()?;
        // SAFETY: `id` is live; the address is valid (the caller's promise;
        // librdmacm takes its length from the family).
        if unsafe { sys::rdma_bind_addr(id, src) } != 0 {
            return Err(last_error("rdma_bind_addr"));
        }
        Ok(id)
    }

    /// Starts resolving `dst` asynchronously. An XRC id not made yet is
    /// first created passive at `any` (`len` bytes, of `family`: the
    /// wildcard of the destination's family); any other id resolves as it
    /// is.
    ///
    /// # Safety
    /// `any` points to a valid socket address of `len` bytes, `dst` to a
    /// valid one of its family.
    unsafe fn start_resolve(
        &self,
        any: *mut sys::sockaddr,
        len: u32,
        family: u32,
        dst: *mut sys::sockaddr,
        timeout_ms: u32,
        verb: &'static str,
    ) -> Result<()> {
        let id = if self.ps == PortSpace::Ib && self.id.load(Ordering::Acquire).is_null() {
            // SAFETY: the caller's promise.
            unsafe { self.create_xrc(any, len, family, sys::IBV_QPT_XRC_SEND) }?
        } else {
            self.raw()?
        };
        // SAFETY: `id` is live; `dst` is valid (the caller's promise).
        if unsafe { sys::rdma_resolve_addr(id, null_mut(), dst, timeout_ms as i32) } != 0 {
            return Err(last_error(verb));
        }
        Ok(())
    }

    /// Listens on an id bound to this channel's device.
    fn start_listening(&self, id: *mut sys::rdma_cm_id, backlog: u32) -> Result<()> {
        self.check_device(id)?;
        // SAFETY: `id` is live and bound.
        if unsafe { sys::rdma_listen(id, backlog as i32) } != 0 {
            return Err(last_error("rdma_listen"));
        }
        Ok(())
    }

    /// Moves a new synchronous XRC id onto the channel and makes it this
    /// handle's.
    fn adopt_xrc(&self, id: *mut sys::rdma_cm_id) -> Result<*mut sys::rdma_cm_id> {
        // SAFETY: `id` is a live synchronous id; migrating makes its events
        // arrive on this channel.
        if unsafe { sys::rdma_migrate_id(id, self.chan.ch) } != 0 {
            let e = last_error("rdma_migrate_id");
            // SAFETY: created by the caller, not yet shared.
            unsafe { sys::rdma_destroy_ep(id) };
            return Err(e);
        }
        self.id.store(id, Ordering::Release);
        self.chan.state().ids.insert(
            id as usize,
            Entry {
                key: self.key,
                ps: self.ps,
                qp: None,
                timers: QpTimers::default(),
                disconnecting: false,
            },
        );
        Ok(id)
    }

    /// `AF_IB` needs an InfiniBand port: RoCE and iWARP route by IP.
    fn check_af_ib(&self) -> Result<()> {
        if transport_of(&self.chan.ctx) != Transport::Infiniband {
            return Err(Error::Unsupported(
                "AF_IB addresses need an InfiniBand port (RoCE and iWARP route by IP)",
            ));
        }
        Ok(())
    }

    /// The service id base of this id's port space.
    fn sid_base(&self) -> u64 {
        let ps = match self.ps {
            PortSpace::Ib => sys::RDMA_PS_IB,
            PortSpace::Tcp => sys::RDMA_PS_TCP,
        };
        u64::from(ps) << 16
    }

    fn remember_qp(&self, id: *mut sys::rdma_cm_id, qp: &VerbsQp, timers: QpTimers) {
        if let Some(e) = self.chan.state().ids.get_mut(&(id as usize)) {
            e.qp = Some(qp.clone());
            e.timers = timers;
        }
    }

    fn conn_param(p: &ConnParam<'_>, qp: Option<&VerbsQp>) -> sys::rdma_conn_param {
        sys::rdma_conn_param {
            private_data: p.private_data.as_ptr().cast(),
            private_data_len: p.private_data.len() as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 1,
            retry_count: p.retry_count.min(7),
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: 0,
            qp_num: qp.map_or(p.qp_num, |q| q.qp_num()),
        }
    }
}

impl CmId for VerbsCmId {
    type Context = VerbsContext;

    fn key(&self) -> u64 {
        self.key
    }

    fn listen(&self, addr: SocketAddr, backlog: u32) -> Result<()> {
        let (mut ss, len) = to_sockaddr(addr);
        let family = u32::from(ss.ss_family);
        let sa = (&mut ss as *mut libc::sockaddr_storage).cast();
        // SAFETY: `sa` is the valid address just built, of `len` bytes.
        let id = unsafe { self.bind_local(sa, len, family, sys::IBV_QPT_XRC_RECV) }?;
        self.start_listening(id, backlog)
    }

    fn resolve_addr(&self, dst: SocketAddr, timeout_ms: u32) -> Result<()> {
        let any = match dst {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        let (mut any, len) = to_sockaddr(any);
        let family = u32::from(any.ss_family);
        let (mut ss, _) = to_sockaddr(dst);
        // SAFETY: both addresses were just built, the wildcard of `len`
        // bytes.
        unsafe {
            self.start_resolve(
                (&mut any as *mut libc::sockaddr_storage).cast(),
                len,
                family,
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
                "rdma_resolve_addr",
            )
        }
    }

    fn listen_ib(&self, addr: IbAddr, backlog: u32) -> Result<()> {
        self.check_af_ib()?;
        let mut sib = sockaddr_ib(addr, self.sid_base());
        let sa = (&mut sib as *mut sys::sockaddr_ib).cast();
        // SAFETY: `sa` is the valid sockaddr_ib just built.
        let id =
            unsafe { self.bind_local(sa, SOCKADDR_IB_LEN, sys::AF_IB, sys::IBV_QPT_XRC_RECV) }?;
        self.start_listening(id, backlog)
    }

    fn resolve_ib(
        &self,
        dst: IbAddr,
        route: Option<&crate::cm::CmRoute>,
        timeout_ms: u32,
    ) -> Result<()> {
        self.check_af_ib()?;
        *self.path.lock().unwrap_or_else(|e| e.into_inner()) = route.and_then(|r| r.path);
        // An XRC id is bound to the AF_IB wildcard, in the destination's
        // partition. The kernel resolves a GID without a query on the wire.
        let any = IbAddr {
            gid: crate::types::Gid::default(),
            pkey: dst.pkey,
            port: 0,
        };
        let mut any = sockaddr_ib(any, self.sid_base());
        let mut sib = sockaddr_ib(dst, self.sid_base());
        // SAFETY: both sockaddr_ib were just built.
        unsafe {
            self.start_resolve(
                (&mut any as *mut sys::sockaddr_ib).cast(),
                SOCKADDR_IB_LEN,
                sys::AF_IB,
                (&mut sib as *mut sys::sockaddr_ib).cast(),
                timeout_ms,
                "rdma_resolve_addr(AF_IB)",
            )
        }
    }

    fn local_ib_addr(&self) -> Option<IbAddr> {
        let id = self.raw().ok()?;
        // SAFETY: `id` is live; librdmacm returns its stored address, whose
        // family says its layout.
        unsafe {
            let sa = sys::rdma_get_local_addr(id);
            if sa.is_null() || u32::from((*sa).sa_family) != sys::AF_IB {
                return None;
            }
            let sib = &*(sa as *const sys::sockaddr_ib);
            Some(IbAddr {
                gid: crate::types::Gid(sib.sib_addr.ib_u.uib_addr8),
                pkey: u16::from_be(sib.sib_pkey),
                port: (u64::from_be(sib.sib_sid) & 0xffff) as u16,
            })
        }
    }

    fn resolve_route(&self, timeout_ms: u32) -> Result<()> {
        let id = self.raw()?;
        let path = self.path.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(path) = path {
            let mut data = sys::ibv_path_data {
                flags: sys::IBV_PATH_FLAG_GMP
                    | sys::IBV_PATH_FLAG_PRIMARY
                    | sys::IBV_PATH_FLAG_BIDIRECTIONAL,
                reserved: 0,
                path: unpack_path(&path),
            };
            // SAFETY: `id` is live with a resolved address; the option is a
            // path record of the size given. The kernel answers with a
            // ROUTE_RESOLVED event.
            let rc = unsafe {
                sys::rdma_set_option(
                    id,
                    sys::RDMA_OPTION_IB as i32,
                    sys::RDMA_OPTION_IB_PATH as i32,
                    (&mut data as *mut sys::ibv_path_data).cast(),
                    std::mem::size_of::<sys::ibv_path_data>(),
                )
            };
            if rc == 0 {
                return Ok(());
            }
            // A kernel that refuses the path resolves as usual.
        }
        // SAFETY: `id` is live with a resolved address.
        if unsafe { sys::rdma_resolve_route(id, timeout_ms as i32) } != 0 {
            return Err(last_error("rdma_resolve_route"));
        }
        Ok(())
    }

    fn connect(&self, qp: Option<&VerbsQp>, p: &ConnParam<'_>) -> Result<()> {
        let id = self.raw()?;
        self.check_device(id)?;
        self.check_private(CmMessage::Request, p.private_data)?;
        if let Some(qp) = qp {
            if !matches!(qp.qp_type(), QpType::Rc | QpType::XrcIni) {
                return Err(Error::invalid(format!(
                    "a {:?} QP cannot initiate",
                    qp.qp_type()
                )));
            }
            let timers = QpTimers::from(p);
            match qp.state()? {
                QpState::Reset => cm_transition(id, qp, &[sys::IBV_QPS_INIT], timers)?,
                QpState::Init => {}
                s => {
                    return Err(Error::state(format!(
                        "the CM needs a QP in RESET or INIT, not {s:?}"
                    )))
                }
            }
            self.remember_qp(id, qp, timers);
        }
        let mut param = Self::conn_param(p, qp);
        // SAFETY: `id` is live with a resolved route; the parameters and
        // private data are valid for the call.
        if unsafe { sys::rdma_connect(id, &mut param) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ECONNREFUSED) {
                // iWARP's TCP connect is refused at once; report it the way
                // the IB CM does, as a rejection by nobody listening.
                self.chan.state().synthetic.push_back(Synthetic {
                    key: self.key,
                    kind: CmEventKind::Rejected(RejectReason::NoListener),
                    private_data: Vec::new(),
                    remote_qpn: None,
                });
                return Ok(());
            }
            return Err(errno_error(
                "rdma_connect",
                e.raw_os_error().unwrap_or(libc::EIO),
            ));
        }
        Ok(())
    }

    fn accept(&self, qp: Option<&VerbsQp>, p: &ConnParam<'_>) -> Result<()> {
        let id = self.raw()?;
        self.check_private(CmMessage::Reply, p.private_data)?;
        if let Some(qp) = qp {
            let iwarp = transport_of(&self.chan.ctx) == Transport::Iwarp;
            let mut states = Vec::new();
            if qp.state()? == QpState::Reset {
                states.push(sys::IBV_QPS_INIT);
            }
            // On iWARP the kernel's iw_cm moves the QP to RTS itself.
            if !iwarp {
                states.push(sys::IBV_QPS_RTR);
                if qp.qp_type() != QpType::XrcTgt {
                    states.push(sys::IBV_QPS_RTS);
                }
            }
            let timers = QpTimers::from(p);
            cm_transition(id, qp, &states, timers)?;
            self.remember_qp(id, qp, timers);
        }
        let mut param = Self::conn_param(p, qp);
        // SAFETY: `id` is a live connect-request id.
        if unsafe { sys::rdma_accept(id, &mut param) } != 0 {
            return Err(last_error("rdma_accept"));
        }
        Ok(())
    }

    fn route(&self) -> Option<crate::cm::CmRoute> {
        let id = self.raw().ok()?;
        // SAFETY: `id` is live; the route is plain data filled in by route
        // resolution.
        let path = unsafe {
            let r = &(*id).route;
            (r.num_paths >= 1 && !r.path_rec.is_null()).then(|| *r.path_rec)
        };
        if let Some(p) = path {
            // SAFETY: the GID union is plain bytes.
            let dgid = unsafe { p.dgid.raw };
            return Some(crate::cm::CmRoute {
                dgid: crate::types::Gid(dgid),
                dlid: u16::from_be(p.dlid),
                path: Some(pack_path(&p)),
            });
        }
        // iWARP (and RoCE without a path record): the peer's IP address,
        // IPv4-mapped, names the destination.
        let ip = match self.peer_addr()?.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Some(crate::cm::CmRoute {
            dgid: crate::types::Gid(ip.octets()),
            dlid: 0,
            path: None,
        })
    }

    fn resolve_cached(
        &self,
        dst: SocketAddr,
        route: &crate::cm::CmRoute,
        timeout_ms: u32,
    ) -> Result<()> {
        // The address still resolves (the kernel's neighbour cache answers
        // it without a query once one id has asked); the route is then set
        // from the cached path instead of asking the SA. iWARP has no path
        // records: its route is the kernel's IP route.
        if transport_of(&self.chan.ctx) != Transport::Iwarp {
            *self.path.lock().unwrap_or_else(|e| e.into_inner()) = route.path;
        }
        self.resolve_addr(dst, timeout_ms)
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        let id = self.raw()?;
        self.check_private(CmMessage::Reject, private_data)?;
        // SAFETY: `id` is a live connect-request id; the data is valid.
        if unsafe { sys::rdma_reject(id, private_data.as_ptr().cast(), private_data.len() as u8) }
            != 0
        {
            return Err(last_error("rdma_reject"));
        }
        Ok(())
    }

    fn disconnect(&self) -> Result<()> {
        let id = self.raw()?;
        if let Some(e) = self.chan.state().ids.get_mut(&(id as usize)) {
            e.disconnecting = true;
        }
        // SAFETY: `id` is live.
        if unsafe { sys::rdma_disconnect(id) } != 0 {
            return Err(last_error("rdma_disconnect"));
        }
        let qp = self
            .chan
            .state()
            .ids
            .get(&(id as usize))
            .and_then(|e| e.qp.clone());
        if let Some(qp) = qp {
            qp.modify(&crate::QpTransition::Error)?;
        }
        Ok(())
    }

    fn notify_established(&self) -> Result<()> {
        let id = self.raw()?;
        // SAFETY: `id` is live. The kernel ignores the notice for an id
        // that is not waiting for an RTU.
        if unsafe { sys::rdma_notify(id, sys::IBV_EVENT_COMM_EST) } != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: not an id of a connection being accepted.
            if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EISCONN)) {
                return Err(errno_error(
                    "rdma_notify",
                    e.raw_os_error().unwrap_or(libc::EIO),
                ));
            }
        }
        Ok(())
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        let id = self.raw().ok()?;
        // SAFETY: `id` is live; librdmacm returns its stored address.
        let a = unsafe { from_sockaddr(sys::rdma_get_local_addr(id)) }?;
        // A listener bound to the unspecified address reports port only.
        Some(a)
            .filter(|a| !matches!(a.ip(), IpAddr::V4(ip) if ip.is_unspecified()) || a.port() != 0)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        peer_of(self.raw().ok()?)
    }
}
