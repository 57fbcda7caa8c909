//! The fabric xrcbtl is written against: a verbs-shaped abstraction over
//! RDMA devices, and its providers.
//!
//! The traits map one-to-one onto libibverbs and librdmacm objects so that the
//! verbs provider is a thin translation, and the simulated provider
//! ([`sim::SimFabric`]) reproduces what the hardware and the kernel enforce:
//! keys, RNR, retries, flushes, XRC domains shared through a key, XRC TGT QPs
//! that live exactly as long as some process has them open, iWARP's
//! initiator-speaks-first rule, and an RDMA CM with private data.
//!
//! Objects own what they depend on (`Arc` chains): a QP keeps its PD and CQs
//! alive, a memory region keeps its PD alive, and dropping the last handle
//! destroys the object. A shared XRC TGT QP is destroyed when its last opener
//! drops its handle.
//!
//! This crate depends on no other crate of the workspace but `rcache`, whose
//! registrar and monitor it implements for devices ([`MemCache`]).

#![warn(missing_docs)]

mod buf;
pub mod cm;
mod error;
mod memmon;
mod reg;
pub mod sim;
mod types;
mod usermem;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use buf::{DmaBuf, ReadInPlace, NUMA_NODE_MAX};
pub use cm::{
    max_private_data, CmEvent, CmEventKind, CmMessage, CmRoute, ConnParam, IbAddr, PathRecord,
    PortSpace, RejectReason, DEFAULT_PKEY,
};
pub use error::{Error, Result};
pub use memmon::{Invalidation, MemMonitor, Subscriber};
pub use reg::{memlock_limit, MemCache, Registration};
pub use types::*;
pub use usermem::{MappedBuf, UserMem};
pub use xrcbtl_rcache as rcache;

use std::net::SocketAddr;

/// The devices one process can see, and the way to open them
/// (`ibv_get_device_list` + `ibv_open_device`).
pub trait Fabric {
    /// An opened device.
    type Context: Context;

    /// Devices present; an empty list when there are none.
    fn devices(&self) -> Result<Vec<DeviceInfo>>;

    /// Opens a device by name.
    fn open(&self, name: &str) -> Result<Self::Context>;
}

/// An opened device in one process (`ibv_context`): the factory of every
/// verbs object, and the source of asynchronous events.
pub trait Context: Clone + Send + Sync + Sized + 'static {
    /// Protection domain.
    type Pd: Pd;
    /// Memory region.
    type Mr: Mr;
    /// Completion queue.
    type Cq: Cq;
    /// Shared receive queue (plain or XRC).
    type Srq: Srq;
    /// Queue pair (RC, XRC INI, XRC TGT).
    type Qp: Qp;
    /// Handle on an XRC domain.
    type Xrcd: Xrcd;
    /// RDMA CM event channel.
    type CmChannel: CmChannel<Context = Self>;

    /// Device name.
    fn name(&self) -> &str;

    /// Capabilities, read from the device.
    fn caps(&self) -> &DeviceCaps;

    /// Whether looking for CM and async events costs system calls (it does
    /// on real devices, whose events come through file descriptors, while
    /// completions are polled from mapped memory): a progress loop spinning
    /// on its CQs then looks at events less often. The simulated fabric
    /// answers `false` (its events cost nothing, and its virtual time moves
    /// on only once every queue has been looked at and found empty), unless
    /// its device is made to answer `true`
    /// ([`crate::sim::SimDevice::costly_events`]).
    fn events_cost_syscalls(&self) -> bool {
        true
    }

    /// The names this machine's hardware topology may know the device by:
    /// its own, then its network interfaces' (a software device such as
    /// rxe is found through the interface it runs on). The simulated
    /// fabric answers none: its devices are nowhere on this machine.
    fn locality_names(&self) -> Vec<String> {
        vec![self.name().to_string()]
    }

    /// Attributes of a port (1-based).
    fn query_port(&self, port: u8) -> Result<PortAttr>;

    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd>;

    /// Registers `len` bytes at `addr` for the given access.
    ///
    /// A region pins the pages under it. If the memory is later unmapped or
    /// remapped, the region keeps reaching the old pages (the simulated
    /// device, when the process's [`MemMonitor`] runs, detaches it instead):
    /// it never reaches what is mapped at those addresses afterwards. Caches
    /// of regions must therefore drop a region when its memory changes
    /// ([`MemCache`] does), and register through
    /// [`Context::reg_mr_cached`].
    ///
    /// # Safety
    /// The range must be valid memory of this process, readable and (if the
    /// access allows any write) writable, when it is registered and whenever
    /// a work request or a remote access that names it runs: the device
    /// reads and writes it behind the compiler's back. The caller must not
    /// hold Rust references to memory the device may write.
    unsafe fn reg_mr(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr>;

    /// Registers memory for a registration cache, which may keep the region
    /// after the memory is unmapped or remapped (see [`Context::reg_mr`]).
    /// Devices behave the same either way; the simulated device watches
    /// such regions and detaches them when their memory goes, as a real
    /// device keeps reaching only the old pages.
    ///
    /// # Safety
    /// As for [`Context::reg_mr`].
    unsafe fn reg_mr_cached(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr> {
        // SAFETY: the caller keeps `reg_mr`'s contract.
        unsafe { self.reg_mr(pd, addr, len, access) }
    }

    /// Creates a completion queue of at least `cqe` entries, which many QPs
    /// may share.
    fn create_cq(&self, cqe: u32) -> Result<Self::Cq>;

    /// Creates a plain shared receive queue.
    fn create_srq(&self, pd: &Self::Pd, attr: SrqAttr) -> Result<Self::Srq>;

    /// Opens (creating if needed) the XRC domain named by `key`. Every process
    /// of the node that opens the same key gets the same domain.
    /// `Unsupported` on devices without XRC.
    fn open_xrcd(&self, key: &XrcdKey) -> Result<Self::Xrcd>;

    /// Creates an XRC SRQ in a domain; its receives complete on `cq`.
    fn create_xrc_srq(
        &self,
        pd: &Self::Pd,
        xrcd: &Self::Xrcd,
        cq: &Self::Cq,
        attr: SrqAttr,
    ) -> Result<Self::Srq>;

    /// Creates an RC or XRC INI QP.
    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self>) -> Result<Self::Qp>;

    /// Creates an XRC TGT QP in a domain. The creator holds the first
    /// reference; other processes add theirs with [`Context::open_tgt_qp`].
    fn create_tgt_qp(&self, xrcd: &Self::Xrcd) -> Result<Self::Qp>;

    /// Opens an existing XRC TGT QP of the domain by number: the
    /// registration. Dropping the handle is the unregistration; the QP is
    /// destroyed when the last handle goes. Fails when no such QP lives.
    fn open_tgt_qp(&self, xrcd: &Self::Xrcd, qpn: u32) -> Result<Self::Qp>;

    /// The next asynchronous event, if any (never blocks).
    fn poll_async_event(&self) -> Option<AsyncEvent>;

    /// Creates an RDMA CM event channel on this device.
    fn create_cm_channel(&self) -> Result<Self::CmChannel>;
}

/// What a QP is created with.
#[derive(Debug)]
pub struct QpInit<'a, C: Context> {
    /// RC or XRC INI (TGT QPs come from [`Context::create_tgt_qp`]).
    pub qp_type: QpType,
    /// Where send completions go.
    pub send_cq: &'a C::Cq,
    /// Where receive completions go (RC only; ignored for XRC INI).
    pub recv_cq: Option<&'a C::Cq>,
    /// Receive through this SRQ instead of a receive queue of its own.
    pub srq: Option<&'a C::Srq>,
    /// Requested queue sizes.
    pub caps: QpCaps,
}

/// A protection domain.
pub trait Pd: Clone + Send + Sync {}

/// A registered memory region.
pub trait Mr: Send + Sync {
    /// Start address.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Key for local SGEs.
    fn lkey(&self) -> u32;
    /// Key for remote access.
    fn rkey(&self) -> u32;
    /// Granted access.
    fn access(&self) -> Access;

    /// An SGE over `len` bytes at `offset` into the region.
    fn sge(&self, offset: usize, len: u32) -> Sge {
        debug_assert!(offset + len as usize <= self.len(), "SGE outside region");
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        }
    }

    /// The remote address of `offset` into the region.
    fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr() + offset as u64,
            rkey: self.rkey(),
        }
    }
}

/// A completion queue, shared by any number of QPs.
pub trait Cq: Clone + Send + Sync {
    /// Identity used in [`AsyncEvent::CqError`].
    fn id(&self) -> u64;
    /// Entries it holds before overrunning.
    fn capacity(&self) -> u32;
    /// Moves up to `out.len()` completions into `out`, oldest first, and
    /// returns how many. `Err(CqOverrun)` once the queue has overrun.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize>;

    /// [`Cq::poll`] for a caller that spins on the queue and learns of its
    /// failure by other means (an overrun is also an [`AsyncEvent`]):
    /// an error counts as nothing found. Its usual answer, nothing, then
    /// costs no error value to build and test.
    #[inline]
    fn poll_quick(&self, out: &mut [WorkCompletion]) -> usize {
        self.poll(out).unwrap_or(0)
    }

    /// Where [`Cq::poll_staged`] leaves the completions it took, as the
    /// device wrote them, until [`Cq::take_staged`] converts them.
    type Staged: Send;

    /// A staging area for polls of up to `batch` completions (at least
    /// one), kept by the caller that spins on the queue.
    fn staging(&self, batch: usize) -> Self::Staged;

    /// [`Cq::poll_quick`] cut in two, for a caller that spins on the
    /// queue: takes up to the staging's batch of completions into `st`,
    /// unconverted, and returns how many (an error counts as nothing
    /// found). The usual answer, nothing, then costs the device's poll
    /// and a test, with nothing of the caller's kept across it; what a
    /// poll found is handed to [`Cq::take_staged`] before the next poll.
    fn poll_staged(&self, st: &mut Self::Staged) -> usize;

    /// Converts the `n` completions the last [`Cq::poll_staged`] left in
    /// `st` into `out` (room for the staging's batch) and, when that poll
    /// filled the batch, polls on while `out` has room, as
    /// [`Cq::poll_quick`] does. Returns how many `out` holds: none once
    /// the queue has overrun (what the poll took counts as nothing found,
    /// as [`Cq::poll_quick`] finds nothing).
    fn take_staged(&self, st: &mut Self::Staged, n: usize, out: &mut [WorkCompletion]) -> usize;

    /// The one completion a [`Cq::poll_staged`] that returned 1 left in
    /// `st`, read in place, when it is a receive that succeeded without
    /// immediate data ([`RecvDone`]); `None` for any other completion, or
    /// once the queue has overrun. It stays in `st` either way: a caller
    /// that cannot use the answer hands the entry to [`Cq::take_staged`],
    /// which converts it whole.
    fn staged_recv(&self, st: &Self::Staged) -> Option<RecvDone>;

    /// Arms the queue: the next completion added to it wakes
    /// [`Cq::sleep`]. One that came before the arming does not, so a
    /// caller about to sleep arms, polls once more (and acts on what that
    /// finds) and only then sleeps. Nothing is taken off the queue: its
    /// poller keeps every completion, in order.
    fn arm(&self) -> Result<()>;

    /// Blocks until the queue, armed by [`Cq::arm`], has a completion to
    /// report or `timeout` passes (on real verbs through the CQ's
    /// completion channel; on the simulator in virtual time, where a
    /// completion already queued also counts). Returns whether it woke for
    /// a completion; either way, the next poll tells.
    fn sleep(&self, timeout: std::time::Duration) -> Result<bool>;
}

/// A shared receive queue (plain or XRC).
pub trait Srq: Clone + Send + Sync {
    /// Identity used in [`AsyncEvent::SrqLimitReached`].
    fn id(&self) -> u64;
    /// The XRC SRQ number senders address (`None` for a plain SRQ).
    fn srq_num(&self) -> Option<u32>;
    /// Posts a receive.
    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()>;
    /// Receives prepared once, one per buffer, and posted again by number
    /// (see [`RecvSet`]).
    type Recvs: RecvSet;
    /// Posts the receives numbered `which` of `set`, in order, in as few
    /// calls into the device as it allows (verbs: one chained
    /// `ibv_post_srq_recv` per 16, linked in place: nothing is built). A
    /// number must not appear twice among receives posted and not yet
    /// completed. On failure, says how many of `which` were posted before
    /// it.
    fn post_set(
        &self,
        set: &mut Self::Recvs,
        which: &[u32],
    ) -> std::result::Result<(), (usize, Error)>;
    /// Arms the limit event at `limit` receives (0 disarms).
    fn arm_limit(&self, limit: u32) -> Result<()>;
}

/// Receives prepared once and posted many times: one per receive buffer,
/// each with its wr_id and its one SGE, in the form the device takes, so
/// that posting one again only links it into a chain.
pub trait RecvSet: Default + Send + Sync {
    /// Adds a receive of `sge` completing with `wr_id`; returns its number
    /// (numbers count up from 0).
    fn add(&mut self, wr_id: u64, sge: Sge) -> u32;
    /// Receives prepared.
    fn len(&self) -> usize;
    /// Whether none is prepared.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A handle on an XRC domain.
pub trait Xrcd: Clone + Send + Sync {
    /// Which domain this is (equal for every handle on one domain).
    fn id(&self) -> XrcdId;
}

/// A queue pair, or a handle on a shared XRC TGT QP.
pub trait Qp: Send + Sync {
    /// A send request built once, for [`Qp::post_inline`] to fill in per
    /// message (its id, bytes, target SRQ and signalling) rather than
    /// building a whole request each time. It holds nothing of one QP: one
    /// may serve every QP of a provider, but one post at a time (the
    /// caller lends it mutably).
    type Inline: Default + Send + Sync + std::fmt::Debug;

    /// QP number.
    fn qp_num(&self) -> u32;
    /// Kind.
    fn qp_type(&self) -> QpType;
    /// Granted queue sizes.
    fn caps(&self) -> QpCaps;
    /// Current state.
    fn state(&self) -> Result<QpState>;
    /// The attributes the device reports (`ibv_query_qp`): state, timers,
    /// retry counts, inline limit.
    fn query(&self) -> Result<QpAttr>;
    /// Changes state.
    fn modify(&self, t: &QpTransition) -> Result<()>;
    /// Posts to the send queue. `NoResource` when the queue is full.
    fn post_send(&self, wr: &SendWr<'_>) -> Result<()>;
    /// Posts a two-sided send of `data` inline (the latency path's short
    /// message), to SRQ `remote_srqn` at the target of an XRC INI QP,
    /// generating a completion on success if `signaled`. The same as
    /// [`Qp::post_send`] of that request, with the same errors; a provider
    /// may build it with less work, filling in `wr`, which the caller
    /// keeps from one post to the next.
    fn post_inline(
        &self,
        wr: &mut Self::Inline,
        wr_id: u64,
        data: &[u8],
        remote_srqn: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let _ = wr;
        self.post_send(&SendWr::inline(wr_id, data, remote_srqn, signaled))
    }
    /// Posts to the receive queue (RC QPs without an SRQ).
    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()>;

    /// Grows the send queue to at least `depth` entries and returns the new
    /// depth. Most verbs devices cannot resize a QP (`Unsupported`).
    fn resize_send_queue(&self, depth: u32) -> Result<u32>;
}

/// An RDMA CM event channel: creates ids and delivers their events.
pub trait CmChannel: Send + Sync {
    /// The device context the channel's ids use.
    type Context: Context;
    /// Connection identifier.
    type Id: CmId<Context = Self::Context>;

    /// Creates an id in a port space.
    fn create_id(&self, ps: PortSpace) -> Result<Self::Id>;

    /// The next event, if any (never blocks).
    fn poll_event(&self) -> Option<CmEvent<Self::Id>>;
}

/// An RDMA CM connection identifier (`rdma_cm_id`). Dropping it destroys it:
/// a connected id sends a disconnect (without touching the local QP), a
/// pending request is rejected. A process's exit does the same for all its
/// ids.
pub trait CmId: Send + Sync {
    /// The device context whose QPs it connects.
    type Context: Context;

    /// Identity matched against [`CmEvent::id`].
    fn key(&self) -> u64;

    /// Binds to a local address and listens.
    fn listen(&self, addr: SocketAddr, backlog: u32) -> Result<()>;

    /// Starts address resolution; completes with `AddrResolved` or
    /// `AddrError`.
    fn resolve_addr(&self, dst: SocketAddr, timeout_ms: u32) -> Result<()>;

    /// Binds to a native InfiniBand address (`AF_IB`: the GID of this id's
    /// device, a partition, a port; port 0 picks a free one, see
    /// [`CmId::local_ib_addr`]) and listens. Such a listener hears only
    /// requests addressed by GID (as the kernel's CM matches listeners by
    /// address family). `Unsupported` where the port is not InfiniBand
    /// (RoCE, iWARP) or librdmacm has no `AF_IB`.
    fn listen_ib(&self, addr: IbAddr, backlog: u32) -> Result<()>;

    /// Starts address resolution of a native InfiniBand address: no ARP,
    /// the GID is the address. With `route` (cached from an earlier id to
    /// the same device), the following `resolve_route` sets that path
    /// instead of asking the subnet administrator. `Unsupported` as for
    /// [`CmId::listen_ib`].
    fn resolve_ib(&self, dst: IbAddr, route: Option<&CmRoute>, timeout_ms: u32) -> Result<()>;

    /// The native InfiniBand address a listener bound with
    /// [`CmId::listen_ib`] is bound to.
    fn local_ib_addr(&self) -> Option<IbAddr>;

    /// Starts route resolution; completes with `RouteResolved` or
    /// `RouteError`.
    fn resolve_route(&self, timeout_ms: u32) -> Result<()>;

    /// The route this id resolved, to reuse for other ids to the same
    /// device (`None` before `RouteResolved`).
    fn route(&self) -> Option<CmRoute>;

    /// Address resolution for `dst` from a route cached from another id to
    /// the same device: completes with `AddrResolved`, and the following
    /// `resolve_route` completes without a path query. Providers that cannot
    /// skip the queries resolve normally.
    fn resolve_cached(&self, dst: SocketAddr, route: &CmRoute, timeout_ms: u32) -> Result<()>;

    /// Sends a connection request. With a QP, the CM moves it through
    /// INIT/RTR/RTS when the reply arrives; without, only private data is
    /// exchanged.
    fn connect(
        &self,
        qp: Option<&<Self::Context as Context>::Qp>,
        param: &ConnParam<'_>,
    ) -> Result<()>;

    /// Accepts a connect request (on the id the request created). With a
    /// QP, the CM moves it to RTR (and RTS unless it is an XRC TGT QP).
    fn accept(
        &self,
        qp: Option<&<Self::Context as Context>::Qp>,
        param: &ConnParam<'_>,
    ) -> Result<()>;

    /// Rejects a connect request, with private data.
    fn reject(&self, private_data: &[u8]) -> Result<()>;

    /// Disconnects. The local QP goes to the error state; the peer hears
    /// `Disconnected`, and on iWARP (where the stream under the QP closes)
    /// its QP goes to the error state too, while on InfiniBand and RoCE the
    /// CM leaves the peer's QP alone.
    fn disconnect(&self) -> Result<()>;

    /// Tells the CM that the accepted connection is established because
    /// its QP received a packet ([`AsyncEvent::CommEstablished`]), so that a
    /// lost RTU does not leave it waiting for the reply's retransmission;
    /// `Established` follows as if the RTU had come. Does nothing on an id
    /// that is not waiting for an RTU.
    fn notify_established(&self) -> Result<()>;

    /// The local address: a listener's bound address, or the source
    /// address picked by address resolution.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// The peer's address, once known.
    fn peer_addr(&self) -> Option<SocketAddr>;
}
