//! The byte transfer layer: endpoints, active messages, eager and rendezvous
//! protocols, one-sided put and get, over the connection driver.
//!
//! Shaped like Open MPI's BTL so that the C ABI maps onto it:
//! [`Btl::add_procs`] / [`Btl::del_procs`] make and drop endpoints; active
//! messages carry a tag whose registered callback runs on receipt
//! ([`Btl::register_am`]); [`Btl::send`] picks eager (copied through a
//! bounce buffer, or inline) up to the eager limit and rendezvous above it;
//! [`Btl::sendi`] sends inline now or not at all; [`Btl::put`] and
//! [`Btl::get`] move data between registered memory ([`RegMem`]);
//! [`Btl::flush`] waits for everything outstanding.
//!
//! Delivery guarantees: every message arrives exactly once, eager messages in
//! order per (source, destination). Each message carries a sequence number;
//! work that fails with a path (a flushed or retried-out send, a QP the
//! connection manager destroyed) is posted again, in its original order, on
//! the rebuilt path, and the receiver drops what it has already seen. An
//! endpoint never posts on a new path while work is still in flight on the
//! old one, so nothing overtakes. Work to a peer that fails for good fails
//! its operations and runs the endpoint's error callback.
//!
//! Resources: posts that find the QP's send queue full (a shared XRC INI QP
//! serves every endpoint to a node), no bounce buffer, or no path yet wait
//! in the endpoint's pending queue; progress drains the pending queues round
//! robin, one work request per endpoint per turn, so endpoints sharing a QP
//! share it fairly. Receive buffers are reposted in batches, and a class
//! whose SRQ reports its limit is refilled at once and grown up to its
//! maximum depth.
//!
//! Rendezvous: the RTS names the sender's registered data; with `get` the
//! receiver reads it in fragments (`rndv_pipeline` in flight) into a
//! registered sink and answers ATS; with `put` the receiver answers RTR with
//! its sink and the sender writes the fragments, then FIN. Registrations of
//! user data and sinks come from the registration cache
//! ([`xrcbtl_fabric::MemCache`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use xrcbtl_fabric::{
    Access, Context, Cq, DmaBuf, Error, MemCache, Payload, Qp, RecvWr, Registration, RemoteAddr,
    Result, SendOp, SendWr, Sge, Srq, WcOpcode, WcStatus, WorkCompletion,
};
use xrcbtl_progress::{Batch, Callbacks, Keep, SubmitQueue, Submitter, WrSlab};
use xrcbtl_xrc_conn::{FailReason, Mode, Node, Notice, Rank};

use crate::config::{BtlConfig, RndvProtocol};
use crate::conn::{ConnDriver, DriverConfig, SrqClass};
use crate::wire::{self, Header, Kind, Rtr, Rts, HEADER};

/// An active-message tag.
pub type Tag = u8;

/// Names an operation (a send, a put, a get).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(u64);

/// Where an operation is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpStatus {
    /// Still moving.
    Pending,
    /// Done (for a send: the data is the BTL's or the peer's now; for a
    /// rendezvous: the peer has it).
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
    /// The device refused the operation (a key, a length).
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

/// A message delivered to an active-message callback.
pub struct Incoming<'a> {
    /// Sending rank.
    pub src: Rank,
    /// Its tag.
    pub tag: Tag,
    /// Its payload (valid during the callback).
    pub data: &'a [u8],
    /// Sends from inside the callback go through here (they are posted
    /// when the callback returns).
    pub tx: &'a Submitter<Request>,
}

/// Work submitted from another thread or from inside a callback.
#[derive(Debug, Clone)]
pub enum Request {
    /// [`Btl::send_bytes`].
    Send {
        /// Destination.
        dst: Rank,
        /// Tag.
        tag: Tag,
        /// Payload.
        data: Bytes,
    },
}

/// An active-message callback.
pub type AmCallback = Box<dyn FnMut(&Incoming<'_>) + Send>;

/// An endpoint's error callback.
pub type ErrorCallback = Box<dyn FnMut(Rank, &BtlError) + Send>;

/// Memory the BTL allocated and registered for one-sided operations; clones
/// share it, and operations keep it alive until they complete.
pub struct RegMem<C: Context>(Arc<DmaBuf<C>>);

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

    /// What a peer needs to reach this memory.
    pub fn remote(&self) -> RemoteMem {
        let r = self.0.remote(0);
        RemoteMem {
            addr: r.addr,
            rkey: r.rkey,
            len: self.0.len() as u64,
        }
    }
}

/// A peer's registered memory, as it told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMem {
    /// Start address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length.
    pub len: u64,
}

impl RemoteMem {
    /// Encoded length.
    pub const LEN: usize = 20;

    /// Encodes, to send to the peers.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<RemoteMem> {
        if b.len() != Self::LEN {
            return None;
        }
        Some(RemoteMem {
            addr: u64::from_le_bytes(b[0..8].try_into().ok()?),
            rkey: u32::from_le_bytes(b[8..12].try_into().ok()?),
            len: u64::from_le_bytes(b[12..20].try_into().ok()?),
        })
    }
}

/// A peer to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its rank.
    pub rank: Rank,
    /// Its node.
    pub node: Node,
    /// Its listener.
    pub addr: SocketAddr,
}

/// What the BTL counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BtlStats {
    /// Eager messages sent (posted the first time).
    pub eager_sent: u64,
    /// Of which inline.
    pub inline_sent: u64,
    /// Eager messages delivered.
    pub eager_received: u64,
    /// Rendezvous started as sender.
    pub rndv_sent: u64,
    /// Rendezvous delivered as receiver.
    pub rndv_received: u64,
    /// RDMA fragments posted (rendezvous and one-sided).
    pub rdma_frags: u64,
    /// Payload bytes delivered to callbacks.
    pub bytes_received: u64,
    /// Work requests posted again after their path failed.
    pub retransmits: u64,
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
}

// ---- internals -----------------------------------------------------------

const RECV_BIT: u64 = 1 << 63;
/// Give up on a work request after this many failed attempts.
const MAX_TRIES: u32 = 64;
/// Progress calls per look at connection and async events.
const CONTROL_EVERY: u32 = 16;
/// Sink buffers kept per size for reuse.
const SINKS_KEPT: usize = 4;

enum Work<C: Context> {
    /// Returns credits (flow control): header only, outside the sequence,
    /// always at the front of its queue.
    Credit,
    /// A message (eager or control).
    Msg {
        seq: u32,
        kind: Kind,
        tag: Tag,
        body: Vec<u8>,
    },
    /// A fragment of an incoming get rendezvous.
    Read {
        src: Rank,
        msg: u64,
        off: usize,
        len: usize,
    },
    /// A fragment of an outgoing put rendezvous.
    Write { msg: u64, off: usize, len: usize },
    /// A one-sided put or get.
    OneSided {
        op: u64,
        write: bool,
        local: RegMem<C>,
        loff: usize,
        remote: RemoteAddr,
        len: u32,
    },
}

/// What an attempt to post an endpoint's next work request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Post {
    /// Posted (or started what it waits for: a connection).
    Started,
    /// It must wait for a resource or a path.
    Blocked,
    /// Nothing to post.
    Idle,
}

struct Item<C: Context> {
    order: u64,
    tries: u32,
    work: Work<C>,
}

struct Posted<C: Context> {
    rank: Rank,
    qpn: u32,
    slot: Option<u32>,
    item: Item<C>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum EpState {
    Open,
    Gone(BtlError),
}

struct Endpoint<C: Context> {
    state: EpState,
    connecting: bool,
    seq_out: u32,
    next_in: u32,
    order: u64,
    pending: VecDeque<Item<C>>,
    in_flight: u32,
    flight_qpn: Option<u32>,
    on_error: Option<ErrorCallback>,
    /// Credit flow control, per connection (by local QP number): a new
    /// connection starts afresh on both sides.
    credit: Credits,
}

/// One connection's credits (devices without RNR).
#[derive(Debug, Clone, Copy)]
struct Credit {
    /// Messages this rank may still send to the peer's SRQ.
    credits: u32,
    /// Messages received from the peer and not yet returned as credits.
    to_return: u32,
    /// A [`Work::Credit`] is queued.
    returning: bool,
}

/// Credits a message needs to go: it leaves the last one for returning
/// credits, so that returns are never stuck.
const MSG_CREDITS: u32 = 2;
/// Credits a credit-only message needs.
const RETURN_CREDITS: u32 = 1;

impl Credit {
    fn new(credits: u32) -> Credit {
        Credit {
            credits,
            to_return: 0,
            returning: false,
        }
    }

    /// The credits a message sent now returns, or `None` when fewer than
    /// `need` are left.
    fn offer(&self, need: u32) -> Option<u16> {
        (self.credits >= need).then(|| self.to_return.min(u32::from(u16::MAX)) as u16)
    }

    /// A message went: it took a credit and returned `returned`.
    fn spend(&mut self, returned: u16) {
        self.credits -= 1;
        self.to_return -= u32::from(returned);
    }
}

/// An endpoint's credits, by local QP number.
#[derive(Debug, Default)]
struct Credits(HashMap<u32, Credit>);

impl Credits {
    /// The credits of the connection on local QP `qpn`, `cap` if new.
    fn of(&mut self, qpn: u32, cap: u32) -> &mut Credit {
        self.0.entry(qpn).or_insert_with(|| Credit::new(cap))
    }
}

struct RndvOut {
    rank: Rank,
    data: Bytes,
    reg: Option<Registration>,
    op: u64,
    remote: Option<RemoteAddr>,
    next_off: usize,
    done: usize,
}

struct RndvIn {
    tag: Tag,
    len: usize,
    remote: RemoteAddr,
    sink: Vec<u8>,
    reg: Option<Registration>,
    next_off: usize,
    done: usize,
}

struct RecvClass<C: Context> {
    size: u32,
    chunks: Vec<DmaBuf<C>>,
    /// Buffers in each chunk.
    per_chunk: u32,
    /// Buffers allocated in all.
    total: u32,
    /// The SRQ's capacity.
    capacity: u32,
    posted: u32,
    repost: Vec<(u32, u32)>,
    limit: u32,
}

struct Inner<C: Context> {
    cfg: BtlConfig,
    drv: ConnDriver<C>,
    eps: BTreeMap<Rank, Endpoint<C>>,
    ready: VecDeque<Rank>,
    queued: HashSet<Rank>,
    slab: WrSlab<Posted<C>>,
    sq_used: HashMap<u32, u32>,
    sbuf: DmaBuf<C>,
    slot_size: usize,
    free_slots: Vec<u32>,
    classes: Vec<RecvClass<C>>,
    send_batch: Batch<WorkCompletion>,
    recv_batch: Batch<WorkCompletion>,
    cache: MemCache<C>,
    rndv_out: HashMap<u64, RndvOut>,
    rndv_in: HashMap<(Rank, u64), RndvIn>,
    sinks: HashMap<usize, Vec<Vec<u8>>>,
    next_msg: u64,
    next_op: u64,
    ops: HashMap<u64, Rank>,
    failed: HashMap<u64, BtlError>,
    ams: Vec<Option<AmCallback>>,
    submit: SubmitQueue<Request>,
    tx: Submitter<Request>,
    self_inbox: VecDeque<(Tag, Vec<u8>)>,
    scratch: Vec<u8>,
    pending_now: u64,
    stats: BtlStats,
    /// Credit flow control: the device has no RNR (iWARP), so a send that
    /// finds no receive would break the connection.
    fc: bool,
    /// Progress calls, for spacing out the looks at control events.
    control_tick: u32,
    /// Progress calls per look (1 where events cost nothing).
    control_every: u32,
    notices: Vec<Notice>,
    drained: bool,
}

/// The byte transfer layer of one rank on one device.
pub struct Btl<C: Context> {
    inner: Inner<C>,
    callbacks: Callbacks<Inner<C>>,
}

impl<C: Context> std::fmt::Debug for Btl<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Btl(rank {}, {:?})",
            self.inner.cfg.rank, self.inner.stats
        )
    }
}

impl<C: Context> Btl<C> {
    /// Sets the rank up on a device: the connection driver (XRC where the
    /// device has it, else RC + SRQ), receive classes, bounce buffers, the
    /// registration cache.
    pub fn new(ctx: C, cfg: BtlConfig) -> Result<Self> {
        cfg.validate()?;
        let large = (cfg.eager_limit + HEADER).next_multiple_of(64) as u32;
        let mut classes = Vec::new();
        if cfg.small_size != 0 && cfg.small_size < large {
            classes.push(SrqClass {
                size: cfg.small_size,
                depth: cfg.srq_max_depth,
            });
        }
        classes.push(SrqClass {
            size: large,
            depth: cfg.srq_max_depth,
        });
        let mut dc = DriverConfig::new(
            cfg.rank,
            cfg.node,
            cfg.job,
            cfg.xrcd_key.clone(),
            cfg.listen,
        );
        dc.classes = classes;
        dc.force_rc = cfg.force_rc;
        dc.retries = cfg.retries;
        dc.max_inline = cfg.max_inline;
        dc.sq_max = cfg.sq_max;
        dc.external_data = true;
        let drv = ConnDriver::new(ctx.clone(), dc)?;
        let pd = drv.pd().clone();
        let mut rclasses = Vec::new();
        for (size, capacity) in drv.classes() {
            let depth = cfg.srq_depth.min(capacity);
            let buf = DmaBuf::new(&ctx, &pd, (size * depth) as usize, Access::LOCAL_WRITE)?;
            let limit = (depth / 4).max(1);
            rclasses.push(RecvClass {
                size,
                chunks: vec![buf],
                per_chunk: depth,
                total: depth,
                capacity,
                posted: 0,
                repost: (0..depth).map(|i| (0, i)).collect(),
                limit,
            });
        }
        let slot_size = rclasses.iter().map(|c| c.size).max().expect("a class") as usize;
        let sbuf = DmaBuf::new(
            &ctx,
            &pd,
            cfg.send_slots as usize * slot_size,
            Access::LOCAL_WRITE,
        )?;
        let cache = MemCache::new(ctx, pd, cfg.rcache);
        let submit = SubmitQueue::new();
        let tx = submit.submitter();
        let fc = matches!(drv.mode(), Mode::Rc { p2p: true });
        let control_every = if drv.context().events_cost_syscalls() {
            CONTROL_EVERY
        } else {
            1
        };
        let mut inner = Inner {
            send_batch: Batch::new(cfg.cq_batch),
            recv_batch: Batch::new(cfg.cq_batch),
            free_slots: (0..cfg.send_slots).rev().collect(),
            cfg,
            drv,
            eps: BTreeMap::new(),
            ready: VecDeque::new(),
            queued: HashSet::new(),
            slab: WrSlab::new(),
            sq_used: HashMap::new(),
            sbuf,
            slot_size,
            classes: rclasses,
            cache,
            rndv_out: HashMap::new(),
            rndv_in: HashMap::new(),
            sinks: HashMap::new(),
            next_msg: 1,
            next_op: 1,
            ops: HashMap::new(),
            failed: HashMap::new(),
            ams: (0..256).map(|_| None).collect(),
            submit,
            tx,
            self_inbox: VecDeque::new(),
            scratch: Vec::new(),
            pending_now: 0,
            stats: BtlStats::default(),
            fc,
            control_tick: 0,
            control_every,
            notices: Vec::new(),
            drained: false,
        };
        // Arm the low-watermark once the SRQ holds its receives, so that it
        // fires when they run low, not at once.
        for c in 0..inner.classes.len() {
            inner.repost(c)?;
            let limit = inner.classes[c].limit;
            inner.drv.srq(c).arm_limit(limit)?;
        }
        let mut callbacks = Callbacks::new();
        callbacks.register(|s: &mut Inner<C>| Keep::Yes(s.control()));
        callbacks.register(|s: &mut Inner<C>| Keep::Yes(s.poll_send()));
        callbacks.register(|s: &mut Inner<C>| Keep::Yes(s.poll_recv()));
        callbacks.register(|s: &mut Inner<C>| Keep::Yes(s.drain_submissions()));
        callbacks.register(|s: &mut Inner<C>| Keep::Yes(s.deliver_local()));
        callbacks.register(|s: &mut Inner<C>| Keep::Yes(s.drain_pending()));
        Ok(Btl { inner, callbacks })
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.inner.cfg.rank
    }

    /// The address peers connect to.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.drv.listen_addr()
    }

    /// XRC or RC (from the device caps).
    pub fn mode(&self) -> Mode {
        self.inner.drv.mode()
    }

    /// The configuration in use.
    pub fn config(&self) -> &BtlConfig {
        &self.inner.cfg
    }

    /// The connection driver (counters, state).
    pub fn driver(&self) -> &ConnDriver<C> {
        &self.inner.drv
    }

    /// What the BTL counted.
    pub fn stats(&self) -> &BtlStats {
        &self.inner.stats
    }

    /// The registration cache's counters.
    pub fn rcache_stats(&self) -> xrcbtl_fabric::rcache::Stats {
        self.inner.cache.stats()
    }

    /// Connection notices seen since the last call.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.inner.notices)
    }

    /// Makes endpoints for peers (connected on first use).
    pub fn add_procs(&mut self, peers: &[Peer]) {
        for p in peers {
            if p.rank != self.inner.cfg.rank {
                self.inner.drv.add_peer(p.rank, p.node, p.addr);
            }
            self.inner.eps.entry(p.rank).or_insert_with(|| Endpoint {
                state: EpState::Open,
                connecting: false,
                seq_out: 0,
                next_in: 0,
                order: 0,
                pending: VecDeque::new(),
                in_flight: 0,
                flight_qpn: None,
                on_error: None,
                credit: Credits::default(),
            });
        }
        self.inner.provision();
    }

    /// Drops endpoints: their outstanding operations fail with `Closed`.
    pub fn del_procs(&mut self, ranks: &[Rank]) {
        for &r in ranks {
            self.inner.fail_endpoint(r, BtlError::Closed(r));
            self.inner.eps.remove(&r);
        }
    }

    /// Sets the callback run for messages with `tag` (replacing any).
    pub fn register_am(&mut self, tag: Tag, cb: impl FnMut(&Incoming<'_>) + Send + 'static) {
        self.inner.ams[tag as usize] = Some(Box::new(cb));
    }

    /// Sets the callback run when the endpoint to `rank` fails for good.
    pub fn set_error_callback(
        &mut self,
        rank: Rank,
        cb: impl FnMut(Rank, &BtlError) + Send + 'static,
    ) -> Result<()> {
        let ep = self
            .inner
            .eps
            .get_mut(&rank)
            .ok_or_else(|| Error::invalid(format!("rank {rank} is not a known peer")))?;
        ep.on_error = Some(Box::new(cb));
        Ok(())
    }

    /// A sending end for other threads (and callbacks).
    pub fn submitter(&self) -> Submitter<Request> {
        self.inner.tx.clone()
    }

    /// Sends `data` with `tag` to `dst`: eager (copied now) up to the eager
    /// limit, rendezvous (copied into a shared buffer) above. Use
    /// [`Btl::send_bytes`] to hand over a buffer without a copy.
    pub fn send(&mut self, dst: Rank, tag: Tag, data: &[u8]) -> Result<OpId> {
        if data.len() <= self.inner.cfg.eager_limit {
            self.inner.send_eager(dst, tag, data)
        } else {
            self.inner.send_rndv(dst, tag, Bytes::copy_from_slice(data))
        }
    }

    /// Sends a shared buffer: eager up to the eager limit, else rendezvous
    /// straight from `data` (registered through the cache, no copy).
    pub fn send_bytes(&mut self, dst: Rank, tag: Tag, data: Bytes) -> Result<OpId> {
        if data.len() <= self.inner.cfg.eager_limit {
            self.inner.send_eager(dst, tag, &data)
        } else {
            self.inner.send_rndv(dst, tag, data)
        }
    }

    /// Sends `data` inline right now, or not at all (`Ok(false)`: no path
    /// yet, work already waiting, no send-queue slot, or too large to go
    /// inline); the caller then uses [`Btl::send`].
    pub fn sendi(&mut self, dst: Rank, tag: Tag, data: &[u8]) -> Result<bool> {
        self.inner.sendi(dst, tag, data)
    }

    /// Allocates and registers `len` bytes for one-sided operations.
    pub fn alloc_mem(&mut self, len: usize) -> Result<RegMem<C>> {
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        Ok(RegMem(Arc::new(DmaBuf::new(
            self.inner.drv.context(),
            self.inner.drv.pd(),
            len,
            access,
        )?)))
    }

    /// Writes `len` bytes of `local` at `loff` into `remote` at `roff` on
    /// `dst`.
    pub fn put(
        &mut self,
        dst: Rank,
        local: &RegMem<C>,
        loff: usize,
        remote: &RemoteMem,
        roff: u64,
        len: usize,
    ) -> Result<OpId> {
        self.inner
            .one_sided(dst, true, local, loff, remote, roff, len)
    }

    /// Reads `len` bytes of `remote` at `roff` on `dst` into `local` at
    /// `loff`.
    pub fn get(
        &mut self,
        dst: Rank,
        local: &RegMem<C>,
        loff: usize,
        remote: &RemoteMem,
        roff: u64,
        len: usize,
    ) -> Result<OpId> {
        self.inner
            .one_sided(dst, false, local, loff, remote, roff, len)
    }

    /// Where an operation is. A failure is reported once; unknown ids are
    /// done.
    pub fn test(&mut self, op: OpId) -> OpStatus {
        if let Some(e) = self.inner.failed.remove(&op.0) {
            OpStatus::Failed(e)
        } else if self.inner.ops.contains_key(&op.0) {
            OpStatus::Pending
        } else {
            OpStatus::Done
        }
    }

    /// Whether nothing is outstanding: no pending or in-flight work, no
    /// rendezvous in progress, nothing submitted.
    pub fn is_idle(&self) -> bool {
        let s = &self.inner;
        s.slab.is_empty()
            && s.pending_now == 0
            && s.rndv_out.is_empty()
            && s.rndv_in.is_empty()
            && s.submit.is_empty()
            && s.self_inbox.is_empty()
    }

    /// Does everything that is due: connection events, completions,
    /// submissions, pending work. Returns how much it found.
    pub fn progress(&mut self) -> usize {
        self.callbacks.run(&mut self.inner)
    }

    /// Progresses until [`Btl::is_idle`] or `timeout` of the BTL's clock
    /// (wall-clock fabrics; a simulated cluster steps its ranks instead).
    pub fn flush(&mut self, timeout: Duration) -> Result<()> {
        let end = self.inner.cfg.clock.now() + timeout;
        while !self.is_idle() {
            if self.progress() == 0 {
                if self.inner.cfg.clock.now() >= end {
                    return Err(Error::Timeout("flush"));
                }
                let _ = self.inner.drv.recv_cq().wait(Duration::from_micros(100));
            }
        }
        Ok(())
    }

    /// Starts the clean exit (after the caller has flushed); progress until
    /// [`Btl::is_drained`].
    pub fn shutdown(&mut self) {
        let now = self.inner.cfg.clock.now();
        self.inner.drv.shutdown(now);
    }

    /// Whether the clean exit has completed.
    pub fn is_drained(&self) -> bool {
        self.inner.drained
    }

    /// The receive CQ (a progress thread blocks on it when idle).
    pub fn recv_cq(&self) -> C::Cq {
        self.inner.drv.recv_cq().clone()
    }
}

impl<C: Context> Inner<C> {
    fn now(&self) -> Duration {
        self.cfg.clock.now()
    }

    fn new_op(&mut self, rank: Rank) -> u64 {
        let op = self.next_op;
        self.next_op += 1;
        self.ops.insert(op, rank);
        op
    }

    fn complete_op(&mut self, op: u64) {
        self.ops.remove(&op);
    }

    fn fail_op(&mut self, op: u64, e: BtlError) {
        if self.ops.remove(&op).is_some() {
            self.failed.insert(op, e);
        }
    }

    fn endpoint(&mut self, rank: Rank) -> Result<&mut Endpoint<C>> {
        let ep = self
            .eps
            .get_mut(&rank)
            .ok_or_else(|| Error::invalid(format!("rank {rank} is not a known peer")))?;
        if let EpState::Gone(e) = &ep.state {
            return Err(Error::state(format!(
                "endpoint to rank {rank} is gone: {e}"
            )));
        }
        Ok(ep)
    }

    /// Queues work at the end of an endpoint's pending queue.
    fn enqueue(&mut self, rank: Rank, work: Work<C>) {
        let ep = self.eps.get_mut(&rank).expect("checked endpoint");
        ep.order += 1;
        ep.pending.push_back(Item {
            order: ep.order,
            tries: 0,
            work,
        });
        self.pending_now += 1;
        self.stats.pending_max = self.stats.pending_max.max(self.pending_now);
        if self.queued.insert(rank) {
            self.ready.push_back(rank);
        }
    }

    /// Puts work that failed back into its endpoint's queue, in order.
    fn requeue(&mut self, rank: Rank, mut item: Item<C>) {
        if matches!(item.work, Work::Credit) {
            // Credits belong to the connection that failed.
            return;
        }
        item.tries += 1;
        let Some(ep) = self.eps.get_mut(&rank) else {
            return self.drop_item(rank, item, BtlError::Closed(rank));
        };
        if let EpState::Gone(e) = &ep.state {
            let e = e.clone();
            return self.drop_item(rank, item, e);
        }
        if item.tries > MAX_TRIES {
            return self.drop_item(rank, item, BtlError::Transfer(WcStatus::RetryExceeded));
        }
        let at = ep.pending.partition_point(|i| i.order < item.order);
        ep.pending.insert(at, item);
        self.pending_now += 1;
        self.stats.retransmits += 1;
        if self.queued.insert(rank) {
            self.ready.push_back(rank);
        }
    }

    fn next_seq(&mut self, rank: Rank) -> u32 {
        let ep = self.eps.get_mut(&rank).expect("checked endpoint");
        let s = ep.seq_out;
        ep.seq_out = s.wrapping_add(1);
        s
    }

    fn send_msg(&mut self, rank: Rank, kind: Kind, tag: Tag, body: Vec<u8>) {
        let seq = self.next_seq(rank);
        self.enqueue(
            rank,
            Work::Msg {
                seq,
                kind,
                tag,
                body,
            },
        );
    }

    fn send_eager(&mut self, dst: Rank, tag: Tag, data: &[u8]) -> Result<OpId> {
        if dst == self.cfg.rank {
            self.endpoint(dst)?;
            self.self_inbox.push_back((tag, data.to_vec()));
            return Ok(OpId(0));
        }
        self.endpoint(dst)?;
        self.stats.eager_sent += 1;
        self.send_msg(dst, Kind::Eager, tag, data.to_vec());
        // The data is ours now: the operation is complete for the caller.
        Ok(OpId(0))
    }

    fn send_rndv(&mut self, dst: Rank, tag: Tag, data: Bytes) -> Result<OpId> {
        if dst == self.cfg.rank {
            self.endpoint(dst)?;
            self.self_inbox.push_back((tag, data.to_vec()));
            return Ok(OpId(0));
        }
        self.endpoint(dst)?;
        let reg = self.cache.register(&data)?;
        let msg = self.next_msg;
        self.next_msg += 1;
        let op = self.new_op(dst);
        let put = self.cfg.rndv_protocol == RndvProtocol::Put;
        let rts = Rts {
            msg,
            len: data.len() as u64,
            addr: if put { 0 } else { data.as_ptr() as u64 },
            rkey: if put { 0 } else { reg.rkey() },
            put,
        };
        self.rndv_out.insert(
            msg,
            RndvOut {
                rank: dst,
                data,
                reg: Some(reg),
                op,
                remote: None,
                next_off: 0,
                done: 0,
            },
        );
        self.stats.rndv_sent += 1;
        self.send_msg(dst, Kind::Rts, tag, rts.encode());
        Ok(OpId(op))
    }

    fn sendi(&mut self, dst: Rank, tag: Tag, data: &[u8]) -> Result<bool> {
        let total = HEADER + data.len();
        let me = self.cfg.rank;
        let ep = self.endpoint(dst)?;
        if !ep.pending.is_empty() || dst == me {
            return Ok(false);
        }
        let (in_flight, flight_qpn) = (ep.in_flight, ep.flight_qpn);
        let Some((qp, srqns)) = self.drv.path(dst) else {
            return Ok(false);
        };
        let qpn = qp.qp_num();
        let caps = qp.caps();
        let used = self.sq_used.get(&qpn).copied().unwrap_or(0);
        if total > caps.max_inline as usize
            || used >= caps.max_send_wr
            || (in_flight > 0 && flight_qpn != Some(qpn))
        {
            return Ok(false);
        }
        let mut returned = 0u16;
        if self.fc {
            let cap = self.cfg.credits;
            let ep = self.eps.get_mut(&dst).expect("checked");
            match ep.credit.of(qpn, cap).offer(MSG_CREDITS) {
                Some(r) => returned = r,
                None => return Ok(false),
            }
        }
        let class = self.class_for(total);
        let srqn = srqns.get(class).copied();
        let seq = self.eps[&dst].seq_out;
        let mut msg = vec![0u8; total];
        Header {
            src: self.cfg.rank,
            seq,
            kind: Kind::Eager,
            tag,
            credits: returned,
            len: data.len() as u32,
        }
        .encode(&mut msg);
        msg[HEADER..].copy_from_slice(data);
        let ep = self.eps.get_mut(&dst).expect("checked");
        ep.order += 1;
        let item = Item {
            order: ep.order,
            tries: 0,
            work: Work::Msg {
                seq,
                kind: Kind::Eager,
                tag,
                body: data.to_vec(),
            },
        };
        let wr_id = self.slab.insert(Posted {
            rank: dst,
            qpn,
            slot: None,
            item,
        });
        let mut wr = SendWr::new(wr_id, SendOp::Send, Payload::Inline(&msg));
        wr.remote_srqn = srqn;
        match qp.post_send(&wr) {
            Ok(()) => {
                *self.sq_used.entry(qpn).or_default() += 1;
                let ep = self.eps.get_mut(&dst).expect("checked");
                ep.seq_out = seq.wrapping_add(1);
                ep.in_flight += 1;
                ep.flight_qpn = Some(qpn);
                if let Some(cr) = ep.credit.0.get_mut(&qpn) {
                    cr.spend(returned);
                }
                self.stats.eager_sent += 1;
                self.stats.inline_sent += 1;
                Ok(true)
            }
            Err(Error::NoResource(_)) => {
                self.slab.remove(wr_id);
                Ok(false)
            }
            Err(e) => {
                self.slab.remove(wr_id);
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn one_sided(
        &mut self,
        dst: Rank,
        write: bool,
        local: &RegMem<C>,
        loff: usize,
        remote: &RemoteMem,
        roff: u64,
        len: usize,
    ) -> Result<OpId> {
        self.endpoint(dst)?;
        if len == 0 || len > u32::MAX as usize >> 1 {
            return Err(Error::invalid(format!(
                "one-sided length {len} outside 1..2 GiB"
            )));
        }
        if loff.checked_add(len).is_none_or(|e| e > local.len()) {
            return Err(Error::invalid("local range outside the registered memory"));
        }
        if roff.checked_add(len as u64).is_none_or(|e| e > remote.len) {
            return Err(Error::invalid("remote range outside the peer's memory"));
        }
        let op = self.new_op(dst);
        self.stats.rdma_frags += 1;
        self.enqueue(
            dst,
            Work::OneSided {
                op,
                write,
                local: local.clone(),
                loff,
                remote: RemoteAddr {
                    addr: remote.addr + roff,
                    rkey: remote.rkey,
                },
                len: len as u32,
            },
        );
        Ok(OpId(op))
    }

    /// The smallest receive class that holds `total` bytes.
    fn class_for(&self, total: usize) -> usize {
        self.classes
            .iter()
            .position(|c| c.size as usize >= total)
            .unwrap_or(self.classes.len() - 1)
    }

    // ---- posting ---------------------------------------------------------

    /// Posts the head of `rank`'s pending queue if it can go now.
    fn post_one(&mut self, rank: Rank) -> Post {
        let now = self.now();
        let Some(ep) = self.eps.get_mut(&rank) else {
            return Post::Idle;
        };
        if ep.state != EpState::Open || ep.pending.is_empty() {
            return Post::Idle;
        }
        let Some((qp, srqns)) = self.drv.path(rank) else {
            if ep.connecting {
                return Post::Blocked;
            }
            // Connected on demand: the driver acts on it at the next
            // progress (counted as work so that it comes).
            ep.connecting = true;
            self.drv.connect(now, rank);
            return Post::Started;
        };
        let qpn = qp.qp_num();
        if ep.in_flight > 0 && ep.flight_qpn != Some(qpn) {
            // Work is still out on the old path: nothing may overtake it.
            return Post::Blocked;
        }
        let caps = qp.caps();
        let used = self.sq_used.get(&qpn).copied().unwrap_or(0);
        if used >= caps.max_send_wr {
            self.stats.no_resource += 1;
            return Post::Blocked;
        }
        let item = ep.pending.front().expect("non-empty");
        // Credit flow control (see MSG_CREDITS).
        let mut returned = 0u16;
        if self.fc && matches!(item.work, Work::Msg { .. } | Work::Credit) {
            let cr = ep.credit.of(qpn, self.cfg.credits);
            let is_credit = matches!(item.work, Work::Credit);
            if is_credit && cr.to_return == 0 {
                // A message already carried them.
                cr.returning = false;
                ep.pending.pop_front();
                self.pending_now -= 1;
                return Post::Started;
            }
            let need = if is_credit {
                RETURN_CREDITS
            } else {
                MSG_CREDITS
            };
            match cr.offer(need) {
                Some(r) => returned = r,
                None => {
                    self.stats.credit_stalls += 1;
                    return Post::Blocked;
                }
            }
        }
        let srqn0 = srqns.first().copied();
        let mut slot = None;
        let mut inline = Vec::new();
        let sge: Sge;
        let (op, srqn) = match &item.work {
            Work::Msg { .. } | Work::Credit => {
                let (h, body): (Header, &[u8]) = match &item.work {
                    Work::Msg {
                        seq,
                        kind,
                        tag,
                        body,
                    } => (
                        Header {
                            src: self.cfg.rank,
                            seq: *seq,
                            kind: *kind,
                            tag: *tag,
                            credits: returned,
                            len: body.len() as u32,
                        },
                        body,
                    ),
                    _ => (
                        Header {
                            src: self.cfg.rank,
                            seq: 0,
                            kind: Kind::Credit,
                            tag: 0,
                            credits: returned,
                            len: 0,
                        },
                        &[],
                    ),
                };
                let total = HEADER + body.len();
                let class = self
                    .classes
                    .iter()
                    .position(|c| c.size as usize >= total)
                    .unwrap_or(self.classes.len() - 1);
                if total <= caps.max_inline as usize {
                    inline.resize(total, 0);
                    h.encode(&mut inline);
                    inline[HEADER..].copy_from_slice(body);
                    sge = Sge::default();
                } else {
                    let Some(s) = self.free_slots.pop() else {
                        self.stats.no_resource += 1;
                        return Post::Blocked;
                    };
                    let off = s as usize * self.slot_size;
                    let mut hdr = [0u8; HEADER];
                    h.encode(&mut hdr);
                    self.sbuf.write(off, &hdr);
                    self.sbuf.write(off + HEADER, body);
                    sge = self.sbuf.sge(off, total as u32);
                    slot = Some(s);
                }
                (SendOp::Send, srqns.get(class).copied())
            }
            Work::Read { src, msg, off, len } => {
                let Some(r) = self.rndv_in.get(&(*src, *msg)) else {
                    // The rendezvous was abandoned.
                    let ep = self.eps.get_mut(&rank).expect("live");
                    ep.pending.pop_front();
                    self.pending_now -= 1;
                    return Post::Started;
                };
                let reg = r.reg.as_ref().expect("registered while reading");
                sge = self
                    .cache
                    .sge(reg, r.sink.as_ptr() as usize + off, *len as u32);
                let remote = RemoteAddr {
                    addr: r.remote.addr + *off as u64,
                    rkey: r.remote.rkey,
                };
                (SendOp::Read(remote), srqn0)
            }
            Work::Write { msg, off, len } => {
                let Some(r) = self.rndv_out.get(msg) else {
                    let ep = self.eps.get_mut(&rank).expect("live");
                    ep.pending.pop_front();
                    self.pending_now -= 1;
                    return Post::Started;
                };
                let reg = r.reg.as_ref().expect("registered while writing");
                sge = self
                    .cache
                    .sge(reg, r.data.as_ptr() as usize + off, *len as u32);
                let base = r.remote.expect("RTR before writes");
                let remote = RemoteAddr {
                    addr: base.addr + *off as u64,
                    rkey: base.rkey,
                };
                (SendOp::Write(remote), srqn0)
            }
            Work::OneSided {
                write,
                local,
                loff,
                remote,
                len,
                ..
            } => {
                sge = local.0.sge(*loff, *len);
                let op = if *write {
                    SendOp::Write(*remote)
                } else {
                    SendOp::Read(*remote)
                };
                (op, srqn0)
            }
        };
        let sgl = [sge];
        let payload = if inline.is_empty() {
            Payload::Sgl(&sgl)
        } else {
            Payload::Inline(&inline)
        };
        let item = ep.pending.pop_front().expect("non-empty");
        let first = item.tries == 0;
        let is_msg = matches!(item.work, Work::Msg { .. });
        let is_credit = matches!(item.work, Work::Credit);
        let wr_id = self.slab.insert(Posted {
            rank,
            qpn,
            slot,
            item,
        });
        let mut wr = SendWr::new(wr_id, op, payload);
        wr.remote_srqn = srqn;
        match qp.post_send(&wr) {
            Ok(()) => {
                *self.sq_used.entry(qpn).or_default() += 1;
                ep.in_flight += 1;
                ep.flight_qpn = Some(qpn);
                self.pending_now -= 1;
                if first && is_msg && !inline.is_empty() {
                    self.stats.inline_sent += 1;
                }
                if self.fc && (is_msg || is_credit) {
                    let cr = ep.credit.0.get_mut(&qpn).expect("checked above");
                    cr.spend(returned);
                    if is_credit {
                        cr.returning = false;
                        self.stats.credits_returned += 1;
                    }
                }
                Post::Started
            }
            Err(e) => {
                let p = self.slab.remove(wr_id).expect("just inserted");
                ep.pending.push_front(p.item);
                if let Some(s) = slot {
                    self.free_slots.push(s);
                }
                if !matches!(e, Error::NoResource(_)) {
                    // The QP is unusable: let the manager rebuild the path.
                    self.drv.handle_send_failure(now, qpn);
                }
                self.stats.no_resource += 1;
                Post::Blocked
            }
        }
    }

    /// Drains the pending queues round robin: each pass gives every
    /// endpoint with work one post; an endpoint that got its post goes to
    /// the back, one that was blocked (its QP's send queue full, no bounce
    /// buffer, no path) keeps its place at the front, so that endpoints
    /// sharing a QP take turns on its slots.
    fn drain_pending(&mut self) -> usize {
        let mut work = 0;
        loop {
            let mut blocked = VecDeque::new();
            let mut served = VecDeque::new();
            let mut posted = false;
            while let Some(rank) = self.ready.pop_front() {
                let r = self.post_one(rank);
                if r == Post::Started {
                    posted = true;
                    work += 1;
                }
                let more = self
                    .eps
                    .get(&rank)
                    .is_some_and(|e| e.state == EpState::Open && !e.pending.is_empty());
                match r {
                    _ if !more => {
                        self.queued.remove(&rank);
                    }
                    Post::Started => served.push_back(rank),
                    Post::Blocked | Post::Idle => blocked.push_back(rank),
                }
            }
            blocked.append(&mut served);
            self.ready = blocked;
            if !posted {
                return work;
            }
        }
    }

    fn drain_submissions(&mut self) -> usize {
        let mut reqs = Vec::new();
        self.submit.drain(1024, |r| reqs.push(r));
        let n = reqs.len();
        for r in reqs {
            match r {
                Request::Send { dst, tag, data } => {
                    let res = if data.len() <= self.cfg.eager_limit {
                        self.send_eager(dst, tag, &data)
                    } else {
                        self.send_rndv(dst, tag, data)
                    };
                    if res.is_err() {
                        self.stats.lost += 1;
                    }
                }
            }
        }
        n
    }

    fn deliver_local(&mut self) -> usize {
        let mut n = 0;
        while let Some((tag, data)) = self.self_inbox.pop_front() {
            n += 1;
            self.deliver(self.cfg.rank, tag, &data);
        }
        n
    }

    fn deliver(&mut self, src: Rank, tag: Tag, data: &[u8]) {
        self.stats.bytes_received += data.len() as u64;
        match self.ams[tag as usize].as_mut() {
            Some(cb) => cb(&Incoming {
                src,
                tag,
                data,
                tx: &self.tx,
            }),
            None => self.stats.unhandled += 1,
        }
    }

    // ---- connection events ----------------------------------------------

    fn control(&mut self) -> usize {
        // Connection and async events cost system calls (the CM's and the
        // device's event descriptors); completions do not. A progress loop
        // spinning on a CQ looks at them every CONTROL_EVERY calls only.
        let due = self.control_tick % self.control_every == 0;
        self.control_tick = self.control_tick.wrapping_add(1);
        if !due {
            return 0;
        }
        let now = self.now();
        let mut work = self.drv.progress(now);
        while let Some(n) = self.drv.poll_notice() {
            work += 1;
            match &n {
                Notice::Ready { rank, .. } => {
                    if let Some(ep) = self.eps.get_mut(rank) {
                        ep.connecting = false;
                        if !ep.pending.is_empty() && self.queued.insert(*rank) {
                            self.ready.push_back(*rank);
                        }
                    }
                }
                Notice::Lost { rank } => {
                    if let Some(ep) = self.eps.get_mut(rank) {
                        ep.connecting = false;
                    }
                }
                Notice::Closed { rank } => self.fail_endpoint(*rank, BtlError::Closed(*rank)),
                Notice::Failed { rank, reason } => {
                    self.fail_endpoint(*rank, BtlError::Unreachable(*rank, *reason))
                }
                Notice::Drained => self.drained = true,
            }
            self.notices.push(n);
        }
        for qpn in self.drv.take_destroyed() {
            work += 1;
            self.sq_used.remove(&qpn);
            for ep in self.eps.values_mut() {
                ep.credit.0.remove(&qpn);
            }
            // Work on a destroyed QP never completes: post it again.
            for (_, p) in self.slab.extract(|p| p.qpn == qpn) {
                self.release_posted(&p);
                self.requeue(p.rank, p.item);
            }
        }
        for class in self.drv.take_srq_limits() {
            work += 1;
            self.stats.srq_limit_events += 1;
            if let Err(e) = self.refill(class) {
                debug_assert!(false, "SRQ refill failed: {e}");
            }
        }
        work
    }

    /// Undoes the accounting of a posted work request that is over.
    fn release_posted(&mut self, p: &Posted<C>) {
        if let Some(s) = p.slot {
            self.free_slots.push(s);
        }
        if let Some(u) = self.sq_used.get_mut(&p.qpn) {
            *u = u.saturating_sub(1);
        }
        if let Some(ep) = self.eps.get_mut(&p.rank) {
            ep.in_flight = ep.in_flight.saturating_sub(1);
            if ep.in_flight == 0 {
                ep.flight_qpn = None;
                if !ep.pending.is_empty() && self.queued.insert(p.rank) {
                    self.ready.push_back(p.rank);
                }
            }
        }
    }

    /// The endpoint is gone for good: everything to and from it fails.
    fn fail_endpoint(&mut self, rank: Rank, e: BtlError) {
        let Some(ep) = self.eps.get_mut(&rank) else {
            return;
        };
        if matches!(ep.state, EpState::Gone(_)) {
            return;
        }
        ep.state = EpState::Gone(e.clone());
        let pending: Vec<Item<C>> = ep.pending.drain(..).collect();
        self.pending_now -= pending.len() as u64;
        for item in pending {
            self.drop_item(rank, item, e.clone());
        }
        for (_, p) in self.slab.extract(|p| p.rank == rank) {
            self.release_posted(&p);
            self.drop_item(rank, p.item, e.clone());
        }
        let outs: Vec<u64> = self
            .rndv_out
            .iter()
            .filter(|(_, r)| r.rank == rank)
            .map(|(m, _)| *m)
            .collect();
        for m in outs {
            let r = self.rndv_out.remove(&m).expect("listed");
            self.finish_out(r, Some(e.clone()));
        }
        let ins: Vec<(Rank, u64)> = self
            .rndv_in
            .keys()
            .filter(|k| k.0 == rank)
            .copied()
            .collect();
        for k in ins {
            let r = self.rndv_in.remove(&k).expect("listed");
            self.recycle(r);
        }
        let mut cb = self.eps.get_mut(&rank).and_then(|ep| ep.on_error.take());
        if let Some(cb) = cb.as_mut() {
            cb(rank, &e);
        }
        if let Some(ep) = self.eps.get_mut(&rank) {
            ep.on_error = cb;
        }
    }

    /// Work that will never be done: fail what it belongs to.
    fn drop_item(&mut self, rank: Rank, item: Item<C>, e: BtlError) {
        match item.work {
            Work::Credit => {}
            Work::Msg { kind, body, .. } => {
                self.stats.lost += 1;
                if kind == Kind::Rts {
                    if let Some(rts) = Rts::decode(&body) {
                        if let Some(r) = self.rndv_out.remove(&rts.msg) {
                            self.finish_out(r, Some(e));
                        }
                    }
                }
            }
            Work::Read { src, msg, .. } => {
                if let Some(r) = self.rndv_in.remove(&(src, msg)) {
                    self.recycle(r);
                }
            }
            Work::Write { msg, .. } => {
                if let Some(r) = self.rndv_out.remove(&msg) {
                    self.finish_out(r, Some(e));
                }
            }
            Work::OneSided { op, .. } => self.fail_op(op, e),
        }
        let _ = rank;
    }

    fn finish_out(&mut self, mut r: RndvOut, e: Option<BtlError>) {
        if let Some(reg) = r.reg.take() {
            self.cache.release(reg);
        }
        match e {
            None => self.complete_op(r.op),
            Some(e) => self.fail_op(r.op, e),
        }
    }

    fn recycle(&mut self, mut r: RndvIn) {
        if let Some(reg) = r.reg.take() {
            self.cache.release(reg);
        }
        let cap = r.sink.len();
        let pool = self.sinks.entry(cap).or_default();
        if pool.len() < SINKS_KEPT {
            pool.push(r.sink);
        }
    }

    // ---- completions -----------------------------------------------------

    fn poll_send(&mut self) -> usize {
        let cq = self.drv.send_cq().clone();
        let wcs: Vec<WorkCompletion> = match self.send_batch.poll(|b| cq.poll(b)) {
            Ok([]) | Err(_) => return 0,
            Ok(w) => w.to_vec(),
        };
        let now = self.now();
        for wc in &wcs {
            if wc.wr_id & RECV_BIT != 0 {
                // The connection driver's hello.
                if wc.status != WcStatus::Success {
                    self.drv.handle_send_failure(now, wc.qp_num);
                }
                continue;
            }
            let Some(p) = self.slab.remove(wc.wr_id) else {
                continue;
            };
            self.release_posted(&p);
            if wc.status == WcStatus::Success {
                self.on_sent(p);
                continue;
            }
            self.stats.send_errors += 1;
            self.drv.handle_send_failure(now, p.qpn);
            let fatal = matches!(
                wc.status,
                WcStatus::RemoteAccess
                    | WcStatus::LocalProtection
                    | WcStatus::LocalLength
                    | WcStatus::LocalAccess
            );
            if fatal {
                let e = BtlError::Transfer(wc.status);
                self.drop_item(p.rank, p.item, e);
            } else {
                self.requeue(p.rank, p.item);
            }
        }
        wcs.len()
    }

    /// A work request completed successfully.
    fn on_sent(&mut self, p: Posted<C>) {
        match p.item.work {
            Work::Credit => {}
            Work::Msg { kind, body, .. } => {
                if kind == Kind::Fin {
                    if let Some(m) = wire::decode_msg_id(&body) {
                        if let Some(r) = self.rndv_out.remove(&m) {
                            self.finish_out(r, None);
                        }
                    }
                }
            }
            Work::Read { src, msg, len, .. } => {
                let Some(r) = self.rndv_in.get_mut(&(src, msg)) else {
                    return;
                };
                r.done += len;
                if r.done == r.len {
                    let r = self.rndv_in.remove(&(src, msg)).expect("live");
                    self.stats.rndv_received += 1;
                    self.deliver(src, r.tag, &r.sink[..r.len]);
                    self.recycle(r);
                    self.send_msg(src, Kind::Ats, 0, wire::encode_msg_id(msg));
                } else {
                    self.next_fragment_in(src, msg);
                }
            }
            Work::Write { msg, len, .. } => {
                let Some(r) = self.rndv_out.get_mut(&msg) else {
                    return;
                };
                r.done += len;
                self.next_fragment_out(msg);
            }
            Work::OneSided { op, .. } => self.complete_op(op),
        }
    }

    /// Queues the next read of an incoming get rendezvous, if any is left.
    fn next_fragment_in(&mut self, src: Rank, msg: u64) {
        let frag = self.cfg.rndv_frag_size;
        let Some(r) = self.rndv_in.get_mut(&(src, msg)) else {
            return;
        };
        if r.next_off >= r.len {
            return;
        }
        let off = r.next_off;
        let len = frag.min(r.len - off);
        r.next_off += len;
        self.stats.rdma_frags += 1;
        self.enqueue(src, Work::Read { src, msg, off, len });
    }

    /// Queues the next write of an outgoing put rendezvous, and the FIN
    /// after the last one.
    fn next_fragment_out(&mut self, msg: u64) {
        let frag = self.cfg.rndv_frag_size;
        let Some(r) = self.rndv_out.get_mut(&msg) else {
            return;
        };
        let total = r.data.len();
        let rank = r.rank;
        if r.next_off >= total {
            return;
        }
        let off = r.next_off;
        let len = frag.min(total - off);
        r.next_off += len;
        let last = r.next_off == total;
        self.stats.rdma_frags += 1;
        self.enqueue(rank, Work::Write { msg, off, len });
        if last {
            // On the same QP after the writes: when the peer sees it, the
            // data has landed.
            self.send_msg(rank, Kind::Fin, 0, wire::encode_msg_id(msg));
        }
    }

    fn poll_recv(&mut self) -> usize {
        let cq = self.drv.recv_cq().clone();
        let wcs: Vec<WorkCompletion> = match self.recv_batch.poll(|b| cq.poll(b)) {
            Ok([]) | Err(_) => return 0,
            Ok(w) => w.to_vec(),
        };
        let now = self.now();
        for wc in &wcs {
            if wc.wr_id & RECV_BIT == 0 {
                continue;
            }
            let class = ((wc.wr_id >> 48) & 0x7FFF) as usize;
            let chunk = ((wc.wr_id >> 32) & 0xFFFF) as u32;
            let idx = wc.wr_id as u32;
            let Some(c) = self.classes.get_mut(class) else {
                continue;
            };
            c.posted = c.posted.saturating_sub(1);
            c.repost.push((chunk, idx));
            if wc.status != WcStatus::Success
                || !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            {
                continue;
            }
            if wc.byte_len == 0 {
                self.drv.handle_first_receive(now, wc.qp_num);
                continue;
            }
            let size = c.size as usize;
            let mut msg = std::mem::take(&mut self.scratch);
            c.chunks[chunk as usize].read_into(idx as usize * size, wc.byte_len as usize, &mut msg);
            self.on_message(&msg, wc.qp_num);
            self.scratch = msg;
        }
        for class in 0..self.classes.len() {
            let c = &self.classes[class];
            if c.repost.len() as u32 >= self.cfg.srq_refill || c.posted <= c.limit * 2 {
                if let Err(e) = self.repost(class) {
                    debug_assert!(false, "repost failed: {e}");
                }
            }
        }
        wcs.len()
    }

    /// A message arrived on local QP `qpn`.
    fn on_message(&mut self, msg: &[u8], qpn: u32) {
        let Some(h) = Header::decode(msg) else {
            self.stats.malformed += 1;
            return;
        };
        let Some(ep) = self.eps.get_mut(&h.src) else {
            self.stats.malformed += 1;
            return;
        };
        if self.fc {
            // Every message took one of our receives (duplicates too): it
            // is owed back once reposted. Returns to us ride on it.
            let cap = self.cfg.credits;
            let cr = ep.credit.of(qpn, cap);
            cr.credits = cr.credits.saturating_add(u32::from(h.credits));
            cr.to_return += 1;
            if cr.to_return >= (cap / 2).max(1) && !cr.returning {
                cr.returning = true;
                ep.pending.push_front(Item {
                    order: 0,
                    tries: 0,
                    work: Work::Credit,
                });
                self.pending_now += 1;
                if self.queued.insert(h.src) {
                    self.ready.push_back(h.src);
                }
            }
        }
        if h.kind == Kind::Credit {
            return;
        }
        let ahead = h.seq.wrapping_sub(ep.next_in) as i32;
        if ahead < 0 {
            self.stats.duplicates += 1;
            return;
        }
        if ahead > 0 {
            self.stats.out_of_order += 1;
        }
        ep.next_in = h.seq.wrapping_add(1);
        let body = &msg[HEADER..];
        match h.kind {
            Kind::Eager => {
                self.stats.eager_received += 1;
                self.deliver(h.src, h.tag, body);
            }
            Kind::Rts => match Rts::decode(body) {
                Some(rts) => self.start_rndv_in(h.src, h.tag, rts),
                None => self.stats.malformed += 1,
            },
            Kind::Rtr => match Rtr::decode(body) {
                Some(rtr) => {
                    if let Some(r) = self.rndv_out.get_mut(&rtr.msg) {
                        r.remote = Some(RemoteAddr {
                            addr: rtr.addr,
                            rkey: rtr.rkey,
                        });
                        for _ in 0..self.cfg.rndv_pipeline {
                            self.next_fragment_out(rtr.msg);
                        }
                    }
                }
                None => self.stats.malformed += 1,
            },
            Kind::Ats => match wire::decode_msg_id(body) {
                Some(m) => {
                    if let Some(r) = self.rndv_out.remove(&m) {
                        self.finish_out(r, None);
                    }
                }
                None => self.stats.malformed += 1,
            },
            Kind::Fin => match wire::decode_msg_id(body) {
                Some(m) => {
                    if let Some(r) = self.rndv_in.remove(&(h.src, m)) {
                        self.stats.rndv_received += 1;
                        self.deliver(h.src, r.tag, &r.sink[..r.len]);
                        self.recycle(r);
                    }
                }
                None => self.stats.malformed += 1,
            },
            Kind::Credit => {}
        }
    }

    fn start_rndv_in(&mut self, src: Rank, tag: Tag, rts: Rts) {
        let len = rts.len as usize;
        if len == 0 || rts.len > 1 << 40 {
            self.stats.malformed += 1;
            return;
        }
        let cap = len.next_power_of_two();
        let mut sink = self
            .sinks
            .get_mut(&cap)
            .and_then(|p| p.pop())
            .unwrap_or_else(|| vec![0u8; cap]);
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let reg = match self.cache.register_mut(&mut sink[..len], access) {
            Ok(r) => r,
            Err(_) => {
                // Nothing can land: the sender's operation waits until the
                // peer is failed; count it.
                self.stats.lost += 1;
                return;
            }
        };
        let (addr, rkey) = (sink.as_ptr() as u64, reg.rkey());
        self.rndv_in.insert(
            (src, rts.msg),
            RndvIn {
                tag,
                len,
                remote: RemoteAddr {
                    addr: rts.addr,
                    rkey: rts.rkey,
                },
                sink,
                reg: Some(reg),
                next_off: 0,
                done: 0,
            },
        );
        if rts.put {
            let rtr = Rtr {
                msg: rts.msg,
                addr,
                rkey,
            };
            self.send_msg(src, Kind::Rtr, 0, rtr.encode());
        } else {
            for _ in 0..self.cfg.rndv_pipeline {
                self.next_fragment_in(src, rts.msg);
            }
        }
    }

    // ---- receive buffers -------------------------------------------------

    /// Posts every consumed buffer of `class` again.
    fn repost(&mut self, class: usize) -> Result<()> {
        let c = &mut self.classes[class];
        let srq = self.drv.srq(class);
        while let Some((chunk, idx)) = c.repost.pop() {
            let sge = [c.chunks[chunk as usize].sge(idx as usize * c.size as usize, c.size)];
            let wr_id =
                RECV_BIT | ((class as u64) << 48) | (u64::from(chunk) << 32) | u64::from(idx);
            if let Err(e) = srq.post_recv(&RecvWr { wr_id, sgl: &sge }) {
                c.repost.push((chunk, idx));
                return Err(e);
            }
            c.posted += 1;
        }
        Ok(())
    }

    /// The SRQ of `class` ran low: post everything consumed, grow the class
    /// by a chunk (up to its SRQ's capacity: the burst that emptied it may
    /// come again), and arm the limit again.
    fn refill(&mut self, class: usize) -> Result<()> {
        self.repost(class)?;
        let c = &self.classes[class];
        let n = c.per_chunk.min(c.capacity - c.total);
        self.grow(class, n)?;
        let limit = self.classes[class].limit;
        self.drv.srq(class).arm_limit(limit)
    }

    /// Adds `n` receive buffers to `class` (one new chunk) and posts them.
    fn grow(&mut self, class: usize, n: u32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let c = &mut self.classes[class];
        let buf = DmaBuf::new(
            self.drv.context(),
            self.drv.pd(),
            (c.size * n) as usize,
            Access::LOCAL_WRITE,
        )?;
        let chunk = c.chunks.len() as u32;
        c.chunks.push(buf);
        c.repost.extend((0..n).map(|i| (chunk, i)));
        c.total += n;
        self.stats.srq_grown += u64::from(n);
        self.repost(class)
    }

    /// With credit flow control, every peer may fill its credits at once
    /// (plus the zero-length first message of a connection), while up to a
    /// refill batch of consumed receives waits to be reposted: keep that
    /// many buffers in the (one, RC) class, as far as its SRQ allows.
    fn provision(&mut self) {
        if !self.fc {
            return;
        }
        let peers = self.eps.len().saturating_sub(1) as u32;
        let need = peers
            .saturating_mul(self.cfg.credits + 1)
            .saturating_add(self.cfg.srq_refill);
        let c = &self.classes[0];
        let n = need.min(c.capacity).saturating_sub(c.total);
        if need > c.capacity {
            self.stats.overcommitted = u64::from(need - c.capacity);
        }
        if let Err(e) = self.grow(0, n) {
            debug_assert!(false, "provisioning receives failed: {e}");
        }
    }
}
