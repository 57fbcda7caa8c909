//! The BTL's public vocabulary: operations and their outcomes, callbacks,
//! peers, registered memory and the handles peers exchange, counters.

use std::net::SocketAddr;
use std::sync::Arc;

use xrcbtl_fabric::{Context, DmaBuf, Error, IbAddr, Result, WcStatus, XrcdId};
use xrcbtl_xrc_conn::{FailReason, Node, Rank};

/// An active-message tag.
pub type Tag = u8;

/// Names an operation (a rendezvous send, a put, a get, an atomic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub(crate) u64);

impl OpId {
    /// The id of an operation that completed when it was started (an eager
    /// send: the data was copied).
    pub const DONE: OpId = OpId(0);

    /// The raw id (unique per BTL while the operation lives).
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The id whose [`OpId::raw`] is `raw` (for a C ABI).
    pub fn from_raw(raw: u64) -> OpId {
        OpId(raw)
    }
}

/// Where an operation is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpStatus {
    /// Still moving.
    Pending,
    /// Done (for a send: the data is the BTL's or the peer's now; for a
    /// rendezvous: the peer has it; for a get: it has landed; for a put:
    /// the source may be reused, and the data is placed at the peer before
    /// anything this rank sends it afterwards arrives. On InfiniBand and
    /// RoCE the data has landed; on iWARP a write completes when it
    /// leaves, so the peer may not see it yet).
    Done,
    /// Failed for good.
    Failed(BtlError),
}

/// Why an operation or an endpoint failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BtlError {
    /// The peer cannot be reached.
    Unreachable(Rank, FailReason),
    /// The peer left, or was deleted, before the operation finished.
    Closed(Rank),
    /// The device refused the operation (a key, a length, an alignment).
    Transfer(WcStatus),
    /// The peer is not known (never added).
    UnknownPeer(Rank),
}

impl std::fmt::Display for BtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BtlError::Unreachable(r, why) => write!(f, "rank {r} unreachable: {why:?}"),
            BtlError::Closed(r) => write!(f, "rank {r} closed"),
            BtlError::Transfer(s) => write!(f, "transfer failed: {s:?}"),
            BtlError::UnknownPeer(r) => write!(f, "rank {r} is not a known peer"),
        }
    }
}

impl std::error::Error for BtlError {}

/// How an operation ended: for a fetching atomic, the value it found at the
/// remote address; `None` for everything else.
pub type OpResult = std::result::Result<Option<u64>, BtlError>;

/// A message delivered to an active-message callback.
#[derive(Debug)]
pub struct Incoming<'a> {
    /// Sending rank.
    pub src: Rank,
    /// Its tag.
    pub tag: Tag,
    /// What was sent: the header, then the payload, contiguous (valid during
    /// the callback).
    pub data: &'a [u8],
}

/// Finds a rank this rank does not know when it asks for a connection
/// ([`Btl::set_peer_resolver`](crate::Btl::set_peer_resolver)): gets the rank and where its request came
/// from, where the CM said.
pub type PeerResolver = Arc<dyn Fn(Rank, Option<SocketAddr>) -> Option<Peer> + Send + Sync>;

/// A peer to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its rank.
    pub rank: Rank,
    /// Its node: the ranks of one host on one device (the XRC node, whose
    /// ranks share an XRC domain and receive through one INI QP from each
    /// sender).
    pub node: Node,
    /// Its listener.
    pub addr: SocketAddr,
    /// Its native InfiniBand listener ([`Btl::listen_ib_addr`](crate::Btl::listen_ib_addr)),
    /// if it has one: a rank that can use `AF_IB` too reaches it by GID
    /// (no ARP), any other by `addr`.
    pub ib: Option<IbAddr>,
    /// How it receives, as it published ([`Btl::receive`](crate::Btl::receive)),
    /// checked against this rank's when it is added; `None`: not stated,
    /// not checked.
    pub receive: Option<Receive>,
}

/// How a rank receives: what the ranks of a job must agree on. XRC ranks
/// listen in the IB port space and RC ranks in the TCP one, so the two
/// cannot connect; and the XRC ranks of one node must share one XRC domain,
/// or messages sent to one's SRQ through another's TGT QP fail and take the
/// shared INI QP down with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Receive {
    /// XRC, through SRQs of this domain.
    Xrc(XrcdId),
    /// RC QPs on an SRQ.
    Rc,
}

impl std::fmt::Display for Receive {
    /// `xrc/<dev>/<ino>` or `rc`, for text address exchanges.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Receive::Xrc(x) => write!(f, "xrc/{}/{}", x.dev, x.ino),
            Receive::Rc => f.write_str("rc"),
        }
    }
}

impl std::str::FromStr for Receive {
    type Err = Error;

    /// Reads what [`Receive`]'s `Display` writes.
    fn from_str(s: &str) -> Result<Self> {
        if s == "rc" {
            return Ok(Receive::Rc);
        }
        let bad = || Error::invalid(format!("{s:?} is neither rc nor xrc/<dev>/<ino>"));
        let mut f = s.strip_prefix("xrc/").ok_or_else(bad)?.split('/');
        let (Some(dev), Some(ino), None) = (f.next(), f.next(), f.next()) else {
            return Err(bad());
        };
        Ok(Receive::Xrc(XrcdId {
            dev: dev.parse().map_err(|_| bad())?,
            ino: ino.parse().map_err(|_| bad())?,
        }))
    }
}

/// Registered local memory: a user registration
/// ([`Btl::register_mem`](crate::Btl::register_mem)) or memory the BTL allocated
/// ([`Btl::alloc_mem`](crate::Btl::alloc_mem)). A plain handle: operations started with a user
/// registration given back ([`Btl::deregister_mem`](crate::Btl::deregister_mem)) are refused, and
/// dropping an allocation while operations use it makes them fail; neither
/// reaches other memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemReg {
    /// The user registration's id (0 for BTL-allocated memory).
    pub(crate) id: u64,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

impl MemReg {
    /// First byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address `off` bytes in.
    pub fn at(&self, off: u64) -> LocalPtr {
        LocalPtr {
            reg: *self,
            addr: self.addr.wrapping_add(off),
        }
    }

    /// What a peer needs to reach this memory (send it [`RemoteMem::pack`]ed).
    pub fn remote(&self) -> RemoteMem {
        RemoteMem {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }

    /// Its parts, for a C ABI that hands registrations out as plain values.
    pub fn to_raw(&self) -> RawMemReg {
        RawMemReg {
            id: self.id,
            addr: self.addr,
            len: self.len,
            lkey: self.lkey,
            rkey: self.rkey,
        }
    }

    /// A registration from its parts. Operations check a user
    /// registration's id and key against the live registrations of the BTL
    /// they run on: parts that were never handed out, or belong to a
    /// registration given back since, make the operation fail before
    /// anything is posted.
    pub fn from_raw(raw: RawMemReg) -> MemReg {
        MemReg {
            id: raw.id,
            addr: raw.addr,
            len: raw.len,
            lkey: raw.lkey,
            rkey: raw.rkey,
        }
    }
}

/// The parts of a [`MemReg`] (see [`MemReg::to_raw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMemReg {
    /// The user registration's id (0 for BTL-allocated memory).
    pub id: u64,
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// A place in registered local memory (checked against the registration
/// when an operation starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPtr {
    pub(crate) reg: MemReg,
    pub(crate) addr: u64,
}

/// A peer's registered memory, as it told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMem {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteMem {
    /// Bytes of a packed handle (a fixed size, as MPI libraries want).
    pub const PACKED_LEN: usize = 20;

    /// Packs the handle to send to a peer: address, length, key,
    /// little-endian.
    pub fn pack(&self) -> [u8; Self::PACKED_LEN] {
        let mut b = [0u8; Self::PACKED_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Unpacks a handle a peer sent; `None` unless exactly
    /// [`RemoteMem::PACKED_LEN`] bytes describing a range that does not
    /// wrap around.
    pub fn unpack(b: &[u8]) -> Option<RemoteMem> {
        if b.len() != Self::PACKED_LEN {
            return None;
        }
        let m = RemoteMem {
            addr: u64::from_le_bytes(b[0..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..16].try_into().ok()?),
            rkey: u32::from_le_bytes(b[16..20].try_into().ok()?),
        };
        m.addr.checked_add(m.len).map(|_| m)
    }

    /// The address `off` bytes in.
    pub fn at(&self, off: u64) -> RemotePtr {
        RemotePtr {
            mem: *self,
            addr: self.addr.wrapping_add(off),
        }
    }
}

/// A place in a peer's registered memory (checked against its handle when
/// an operation starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemotePtr {
    pub(crate) mem: RemoteMem,
    pub(crate) addr: u64,
}

/// Memory the BTL allocated and registered for one-sided operations and
/// atomics; clones share it. Keep it alive until the operations on it have
/// completed.
pub struct RegMem<C: Context>(pub(crate) Arc<DmaBuf<C>>);

impl<C: Context> Clone for RegMem<C> {
    fn clone(&self) -> Self {
        RegMem(self.0.clone())
    }
}

impl<C: Context> std::fmt::Debug for RegMem<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegMem({} bytes)", self.0.len())
    }
}

impl<C: Context> RegMem<C> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Copies `data` in at `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.0.write(off, data)
    }

    /// Copies `len` bytes out at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        self.0.read(off, len)
    }

    /// The 64-bit word at `off` (what atomics change), host order.
    pub fn read_u64(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.0.read(off, 8).try_into().expect("8 bytes"))
    }

    /// The registration, for one-sided operations.
    pub fn reg(&self) -> MemReg {
        let r = self.0.remote(0);
        MemReg {
            id: 0,
            addr: r.addr,
            len: self.0.len() as u64,
            lkey: xrcbtl_fabric::Mr::lkey(self.0.mr()),
            rkey: r.rkey,
        }
    }

    /// What a peer needs to reach this memory.
    pub fn remote(&self) -> RemoteMem {
        self.reg().remote()
    }
}

/// Checks that `len` bytes at `addr` lie inside `[base, base + size)`.
pub(crate) fn inside(what: &str, base: u64, size: u64, addr: u64, len: u64) -> Result<()> {
    let end = addr.checked_add(len);
    if addr < base || end.is_none_or(|e| e > base.saturating_add(size)) {
        return Err(Error::invalid(format!(
            "{what} range {addr:#x}+{len} outside {base:#x}+{size}"
        )));
    }
    Ok(())
}

/// What the BTL counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BtlStats {
    /// Times an idle progress loop yielded its CPU
    /// ([`crate::BtlConfig::idle_yield`]).
    pub idle_yields: u64,
    /// Eager messages sent (posted the first time).
    pub eager_sent: u64,
    /// Of which inline.
    pub inline_sent: u64,
    /// Of which sent from the sender's own registered memory, without a
    /// copy (`send_bytes` from [`crate::BtlConfig::zcopy_min`] bytes).
    pub zcopy_sent: u64,
    /// Messages `send_bytes` sent split into eager parts
    /// ([`crate::BtlConfig::split_limit`]).
    pub split_sent: u64,
    /// Messages received in parts and joined.
    pub joined: u64,
    /// Messages posted unsignalled (completed by a later signalled request
    /// on their QP).
    pub unsignalled: u64,
    /// Signalled credit-only messages posted to complete unsignalled work
    /// when something waited for it.
    pub covers: u64,
    /// Eager messages delivered.
    pub eager_received: u64,
    /// Messages received, by receive size class (smallest first).
    pub received_by_class: Vec<u64>,
    /// Rendezvous started as sender.
    pub rndv_sent: u64,
    /// Rendezvous delivered as receiver.
    pub rndv_received: u64,
    /// RDMA reads and writes posted (rendezvous fragments and one-sided).
    pub rdma_frags: u64,
    /// Atomics posted.
    pub atomics: u64,
    /// Payload bytes delivered to callbacks.
    pub bytes_received: u64,
    /// Work requests posted again after their path failed.
    pub retransmits: u64,
    /// Empty messages sent to peers a rendezvous waited on and that had
    /// sent nothing for a while (a peer that gave this rank up says so
    /// when it hears from it).
    pub probes: u64,
    /// Messages received twice (dropped).
    pub duplicates: u64,
    /// Messages that arrived ahead of their sequence (must stay 0).
    pub out_of_order: u64,
    /// Messages that failed the header checks.
    pub malformed: u64,
    /// Messages whose tag had no callback.
    pub unhandled: u64,
    /// Sends that completed with an error.
    pub send_errors: u64,
    /// Times a post found no send-queue slot or bounce buffer.
    pub no_resource: u64,
    /// Times a post waited because the send CQ could not take another
    /// completion (as much work outstanding as the CQ holds, less the room
    /// kept for the connection driver's own sends).
    pub cq_full: u64,
    /// Peers made known by the resolver when they asked for a connection
    /// ([`Btl::set_peer_resolver`](crate::Btl::set_peer_resolver)).
    pub peers_resolved: u64,
    /// Eager messages that found no free bounce buffer when sent and waited
    /// in a heap copy.
    pub spilled: u64,
    /// Most work waiting in pending queues at once.
    pub pending_max: u64,
    /// SRQ limit events.
    pub srq_limit_events: u64,
    /// Times a message waited for credits (devices without RNR).
    pub credit_stalls: u64,
    /// Credit-only messages sent.
    pub credits_returned: u64,
    /// Receives short of what credit flow control needs (the SRQ's
    /// capacity is smaller than peers × (credits + 1) + refill): a burst
    /// from every peer at once could still break a connection.
    pub overcommitted: u64,
    /// Receive buffers added to a class beyond its start depth.
    pub srq_grown: u64,
    /// Messages to peers that failed for good.
    pub lost: u64,
    /// Rendezvous requests refused (longer than
    /// [`crate::BtlConfig::rndv_max`], or no memory for the sink): each
    /// failed its sender's operation.
    pub rndv_refused: u64,
    /// Times the BTL's lock was taken: API calls (this one's included),
    /// progress calls but the quiet ones that found nothing
    /// ([`BtlStats::unlocked_polls`]), and the hand-over of queued
    /// callbacks.
    pub locks: u64,
    /// Deliveries for the user (messages, finished operations, failures,
    /// releases) that waited in the queue behind another: the oldest one
    /// waits in a slot of its own and is handed straight to the thread
    /// that runs it.
    pub queued_deliveries: u64,
    /// Posted work requests recorded one slab entry each until they
    /// complete: reads, writes and atomics (messages wait in their QP's
    /// send log instead).
    pub posted_records: u64,
    /// Progress calls that looked at the receive CQ alone, nothing rare
    /// waiting (on devices whose events cost system calls: between two
    /// looks at connection events).
    pub quiet_polls: u64,
    /// Quiet progress calls that found the receive CQ empty and so took
    /// no lock but the poller's (see [`crate::Btl::progress`]).
    pub unlocked_polls: u64,
}
