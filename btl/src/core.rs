//! The core of a BTL: its state behind the one lock, and what progress
//! does with it. It owns the rooms below it and decides between them: the
//! receive side (`recv.rs`) judges what arrives and hands it over, the
//! protocol machines ([`crate::proto`]) turn it into work, the send queues
//! (`post.rs`) post the work and give back what completed, and the core
//! judges completions and failures (requeue, drop, fail an endpoint).
//! Whatever the user must hear of (messages, finished operations, failed
//! peers) is queued as a [`Delivery`], which [`crate::Btl`] hands to the
//! user's callbacks after the lock is released.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use xrcbtl_fabric::{
    Access, Context, Cq, DeviceCaps, DmaBuf, Error, IbAddr, MemCache, Result, UserMem, WcOpcode,
    WcStatus, WorkCompletion, Xrcd, XrcdId,
};
use xrcbtl_xrc_conn::{ConnManager, Mode, Node, Notice, Rank};

use crate::callbacks::{AmFn, DoneFn, ErrFn, Registry};
use crate::config::{BtlConfig, MAX_RNDV};
use crate::conn::{ConnDriver, ConnEvent, DriverStats};
use crate::delivery::{Body, Deliveries, Delivery};
use crate::ep::{Endpoints, EpState, Kept, Path};
use crate::iface::Iface;
use crate::place::Placed;
use crate::pools::{sink_start, Pools, Sink, Source};
use crate::post::{SendQueues, SendView};
use crate::proto::ops::Ops;
use crate::proto::rndv::{Act, Control, Rndv, RndvConfig};
use crate::proto::{Local, Owner, Rdma};
use crate::recv::{Got, Recv, RecvView};
use crate::regs::Regs;
use crate::types::{
    BtlError, BtlStats, MemReg, OpResult, OpStatus, Peer, PeerResolver, Receive, Tag,
};
use crate::wire::{self, Kind, HEADER};
use crate::work::{Item, Msg, Store, Work};
use crate::wr_id::WrId;

/// Give up on a work request after this many failed attempts.
const MAX_TRIES: u32 = 64;
/// Progress calls per look at connection and async events, where those
/// cost system calls.
const CONTROL_EVERY: u32 = 16;
/// How many times rarer the look is while every connection is settled.
const CONTROL_SETTLED: u32 = 8;
/// How often a rank looks for peers it waits on and has not heard from
/// ([`Core::probe_silent`]).
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// What the API keeps of the rank's device and connections
/// ([`Core::facts`]): read without the lock.
pub(crate) struct Facts<C: Context> {
    pub mode: Mode,
    pub caps: DeviceCaps,
    pub listen: Option<SocketAddr>,
    pub device: String,
    pub credits: bool,
    pub max_message: usize,
    pub recv_cq: C::Cq,
    pub placed: Placed,
}

/// Everything a BTL keeps, behind its lock.
pub(crate) struct Core<C: Context, H> {
    cfg: BtlConfig,
    iface: Iface<C>,
    drv: ConnDriver<C>,
    eps: Endpoints,
    /// Posted work, and the round robin of endpoints with queued work.
    sends: SendQueues,
    rndv: Rndv<Source, Sink>,
    ops: Ops<DoneFn<H>>,
    /// The registration cache, and the user's registrations.
    regs: Regs<C>,
    /// Buffers kept for reuse.
    pools: Pools,
    /// The user's callbacks.
    cbs: Registry<H>,
    resolver: Option<PeerResolver>,
    /// The XRC domain each node's peers stated, and the first peer that
    /// stated it: the ranks of a node share one INI QP from this rank, so
    /// they must share one domain.
    node_domains: HashMap<Node, (XrcdId, Rank)>,
    /// What the user must hear of, until the lock is released.
    deliveries: Deliveries<C, H>,
    stats: BtlStats,
    /// Progress calls left before the next look at connection events.
    control_left: u32,
    control_every: u32,
    /// When to look for silent peers next.
    probe_at: Duration,
    drained: bool,
    /// The receive side.
    recv: Recv,
}

impl<C: Context, H> Core<C, H> {
    /// Makes an endpoint for `p` (connected on first use); a known peer
    /// keeps its endpoint. On iWARP the receive queues grow with the peers.
    /// How this rank receives.
    pub fn receive(&self) -> Receive {
        match &self.iface.xrcd {
            Some(x) => Receive::Xrc(x.id()),
            None => Receive::Rc,
        }
    }

    /// Refuses a peer that disagrees with this rank on how ranks receive:
    /// XRC against RC anywhere in the job, or another XRC domain on this
    /// rank's node.
    pub fn check_peer(&self, p: &Peer) -> Result<()> {
        let Some(theirs) = p.receive else {
            return Ok(());
        };
        let mine = self.receive();
        let word = |r: Receive| match r {
            Receive::Xrc(_) => "XRC",
            Receive::Rc => "RC",
        };
        let known = if p.node == self.cfg.node {
            match mine {
                Receive::Xrc(a) => Some((a, self.cfg.rank)),
                Receive::Rc => None,
            }
        } else {
            self.node_domains.get(&p.node).copied()
        };
        match (mine, theirs) {
            (Receive::Xrc(_), Receive::Xrc(b)) => match known {
                Some((a, other)) if a != b && other != p.rank => Err(Error::invalid(format!(
                    "rank {} on node {} opened another XRC domain than rank {other} there \
                     (key file dev {} inode {}, rank {other}'s dev {} inode {}): every rank \
                     of a node must find the same key file (one XRCBTL_XRCD_DIR on one file \
                     system)",
                    p.rank, p.node, b.dev, b.ino, a.dev, a.ino
                ))),
                _ => Ok(()),
            },
            (Receive::Xrc(_), Receive::Rc) | (Receive::Rc, Receive::Xrc(_)) => {
                Err(Error::invalid(format!(
                    "rank {} receives by {} and rank {} by {}: the ranks of a job must agree \
                     (XRCBTL_FORCE_RC=1 on every rank where some device lacks XRC)",
                    p.rank,
                    word(theirs),
                    self.cfg.rank,
                    word(mine)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Checks peers as [`Core::check_peer`] does, each also against those
    /// before it, and remembers the domains they state; on a refusal,
    /// forgets what this call learnt.
    pub fn check_peers(&mut self, peers: &[Peer]) -> Result<()> {
        let mut learnt = Vec::new();
        for p in peers {
            if let Err(e) = self.check_peer(p) {
                for n in learnt {
                    self.node_domains.remove(&n);
                }
                return Err(e);
            }
            if let Some(Receive::Xrc(x)) = p.receive {
                if let std::collections::hash_map::Entry::Vacant(v) =
                    self.node_domains.entry(p.node)
                {
                    v.insert((x, p.rank));
                    learnt.push(p.node);
                }
            }
        }
        Ok(())
    }

    pub fn add_peer(&mut self, p: &Peer) {
        if p.rank != self.cfg.rank {
            self.drv.add_peer(p.rank, p.node, p.addr, p.ib);
        }
        self.eps.add(p.rank);
        if self.iface.credits() {
            let peers = self.eps.len().saturating_sub(1) as u32;
            match self
                .iface
                .provision(peers, self.cfg.credits, self.cfg.srq_refill)
            {
                Ok((added, short)) => {
                    self.stats.srq_grown += u64::from(added);
                    self.stats.overcommitted = u64::from(short);
                }
                Err(_) => self.stats.no_resource += 1,
            }
        }
    }

    /// Sets the rank up on its device.
    pub fn new(ctx: C, cfg: BtlConfig, queued: Arc<AtomicUsize>) -> Result<Self> {
        let iface = Iface::new(ctx.clone(), &cfg)?;
        let drv = ConnDriver::new(iface.lend(), &cfg)?;
        let control_every = if ctx.events_cost_syscalls() {
            CONTROL_EVERY
        } else {
            1
        };
        let cache = MemCache::new(ctx, iface.pd.clone(), cfg.rcache);
        let pools = Pools::new(iface.max_message(), cache.bytes_max());
        let put = cfg.rndv_protocol.is_put(iface.caps.transport);
        // Reads beyond the initiator depth would only queue in the device.
        let pipeline = if put {
            cfg.rndv_pipeline
        } else {
            cfg.rndv_pipeline.min(iface.caps.max_qp_rd_atom.max(1))
        };
        let rndv = Rndv::new(RndvConfig {
            put,
            frag: cfg.rndv_frag_size as u64,
            pipeline,
        });
        // A rank always knows itself: messages to it are copied, one-sided
        // work goes through the loopback.
        let mut eps = Endpoints::default();
        eps.add(cfg.rank);
        Ok(Core {
            sends: SendQueues::new(cfg.cq_batch),
            recv: Recv::new(
                cfg.cq_batch,
                cfg.split_limit.bytes().max(2 * iface.max_message()),
            ),
            cfg,
            iface,
            drv,
            eps,
            rndv,
            ops: Ops::default(),
            regs: Regs::new(cache),
            pools,
            cbs: Registry::new(),
            resolver: None,
            node_domains: HashMap::new(),
            deliveries: Deliveries::new(queued),
            stats: BtlStats::default(),
            control_left: 0,
            probe_at: Duration::ZERO,
            control_every,
            drained: false,
        })
    }

    /// What the API keeps of the rank's device and connections, read once
    /// at set-up.
    pub fn facts(&self) -> Facts<C> {
        Facts {
            mode: self.iface.mode,
            caps: self.iface.caps.clone(),
            listen: self.drv.listen_addr(),
            device: self.iface.ctx.name().to_string(),
            credits: self.iface.credits(),
            max_message: self.iface.max_message(),
            recv_cq: self.iface.recv_cq.clone(),
            placed: self.iface.placed.clone(),
        }
    }

    /// What the BTL counted so far.
    pub fn stats(&self) -> BtlStats {
        BtlStats {
            pending_max: self.eps.pending_max,
            ..self.stats.clone()
        }
    }

    /// The NUMA node of each of the BTL's own buffers
    /// ([`Iface::buffer_nodes`]).
    pub fn buffer_nodes(&self) -> Result<Vec<Option<u32>>> {
        self.iface.buffer_nodes()
    }

    /// Bytes of receive buffers the rank's SRQs own.
    pub fn receive_bytes(&self) -> u64 {
        self.iface
            .classes
            .iter()
            .map(|c| u64::from(c.total) * u64::from(c.size))
            .sum()
    }

    /// The connection driver's counters.
    pub fn driver_stats(&self) -> DriverStats {
        self.drv.stats().clone()
    }

    /// Runs `f` on the connection manager (counters, state).
    pub fn with_manager<R>(&self, f: impl FnOnce(&ConnManager) -> R) -> R {
        f(self.drv.manager())
    }

    /// Connection notices seen since the last call.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        self.drv.take_notices()
    }

    /// When progress is next needed for a connection timer, if ever.
    pub fn next_timeout(&self) -> Option<Duration> {
        self.drv.next_timeout()
    }

    /// The native InfiniBand address peers reach this rank by, if any.
    pub fn listen_ib_addr(&self) -> Option<IbAddr> {
        self.drv.listen_ib_addr()
    }

    /// Where operation `op` is.
    pub fn op_status(&mut self, op: u64) -> OpStatus {
        self.ops.status(op)
    }

    /// Sets how requests from unknown ranks are answered.
    pub fn set_resolver(&mut self, resolver: PeerResolver) {
        self.resolver = Some(resolver);
    }

    /// The endpoint of `rank`, if it is usable.
    pub fn endpoint(&self, rank: Rank) -> Result<u32> {
        let ei = self
            .eps
            .find(rank)
            .ok_or_else(|| Error::invalid(format!("rank {rank} is not a known peer")))?;
        if let EpState::Gone(e) = &self.eps.get(ei).state {
            return Err(Error::state(format!(
                "endpoint to rank {rank} is gone: {e}"
            )));
        }
        Ok(ei)
    }

    /// Starts connecting endpoint `ei` unless it has a path or is on its
    /// way to one.
    pub fn connect(&mut self, ei: u32) {
        let ep = self.eps.get_mut(ei);
        if ep.path.is_none() && !ep.connecting {
            ep.connecting = true;
            let rank = ep.rank;
            let now = self.cfg.clock.now();
            self.drv.connect(now, rank);
        }
    }

    /// Whether messages to `rank` can be posted now (a connection is up).
    pub fn is_connected(&self, rank: Rank) -> bool {
        self.eps
            .find(rank)
            .is_some_and(|ei| self.eps.get(ei).path.is_some())
    }

    /// Whether one-sided work can reach this rank's own memory (the
    /// device has a loopback).
    pub fn has_loopback(&self) -> bool {
        self.drv.has_loopback()
    }

    /// Allocates `len` bytes on the device's NUMA node, registered for
    /// `access`.
    pub fn alloc_mem(&self, len: usize, access: Access) -> Result<DmaBuf<C>> {
        DmaBuf::new(&self.iface.ctx, &self.iface.pd, len, access)
    }

    /// Starts the clean exit: the driver says goodbye to every peer.
    pub fn shutdown(&mut self) {
        let now = self.cfg.clock.now();
        self.drv.shutdown(now);
        self.control_now();
    }

    /// Whether the clean exit has completed.
    pub fn is_drained(&self) -> bool {
        self.drained
    }

    /// Queues something for the user.
    pub fn deliver(&mut self, d: Delivery<C, H>) {
        self.deliveries.push(d);
    }

    /// Takes the next thing for the user.
    pub fn next_delivery(&mut self) -> Option<Delivery<C, H>> {
        self.deliveries.pop()
    }

    /// The send queues, with what they work through lent for one call.
    fn sends(&mut self) -> (&mut SendQueues, SendView<'_, C>) {
        let view = SendView {
            cfg: &self.cfg,
            drv: &mut self.drv,
            eps: &mut self.eps,
            rndv: &mut self.rndv,
            fc: self.iface.credits(),
            iface: &mut self.iface,
            stats: &mut self.stats,
        };
        (&mut self.sends, view)
    }

    /// Posts `item` to endpoint `ei` if it can go now ([`SendQueues::post`]);
    /// gives it back if it must wait.
    // By value, as `SendQueues::post` takes and returns it.
    #[allow(clippy::result_large_err)]
    fn post(&mut self, ei: u32, item: Item) -> std::result::Result<(), Item> {
        let (sends, mut v) = self.sends();
        sends.post(&mut v, ei, item)
    }

    /// Drains the pending queues round robin ([`SendQueues::drain_pending`]);
    /// returns the posts made.
    pub fn drain_pending(&mut self) -> usize {
        let (sends, mut v) = self.sends();
        sends.drain_pending(&mut v)
    }

    // ---- progress ----------------------------------------------------------

    /// Does what is due: connection events, completions, pending work.
    /// Returns how much it found.
    pub fn poll(&mut self) -> usize {
        // Connection and async events cost system calls (the CM's and the
        // device's event descriptors); completions do not. A progress loop
        // spinning on a CQ looks at them every `CONTROL_EVERY` calls only,
        // and while every connection is settled (no attempt, retry or
        // departure under way: judged at each look) `CONTROL_SETTLED` times
        // less often still. Work a command just gave the driver (a connect,
        // a failed send) is looked at on the next call.
        let due = self.control_left == 0 || self.drv.wants_look();
        let mut n = 0;
        if due {
            n += self.control_now();
            let every = if self.control_every > 1 && self.drv.settled() {
                self.control_every * CONTROL_SETTLED
            } else {
                self.control_every
            };
            self.control_left = every - 1;
        } else {
            self.control_left -= 1;
        }
        // The send CQ holds completions of signalled work (and, rarely, of
        // the driver's hello, seen on the control ticks).
        if due || self.sends.signalled_out() > 0 {
            n += self.poll_send();
        }
        if self.sends.wants_cover() {
            self.sends.cover_unsignalled(&mut self.eps);
        }
        n += self.poll_recv();
        if self.drv.draining() && self.recv.dry() {
            self.drv.recv_cq_dry(self.cfg.clock.now());
        }
        // Both cost a call when idle: most spins have neither.
        if self.rndv.has_acts() {
            n += self.run_rndv();
        }
        if self.eps.any_ready() {
            n += self.drain_pending();
        }
        n
    }

    /// Looks at connection and async events now.
    pub fn control_now(&mut self) -> usize {
        let now = self.cfg.clock.now();
        if now >= self.probe_at {
            self.probe_at = now + PROBE_EVERY;
            self.probe_silent();
        }
        let mut work = self.drv.progress(now);
        while let Some(ev) = self.drv.poll_event() {
            work += 1;
            self.on_conn_event(ev);
        }
        work
    }

    fn on_conn_event(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::Ready {
                rank,
                slot,
                qpn,
                srqns,
            } => {
                self.sends.slot_ready(slot);
                if let Some(ei) = self.eps.find(rank) {
                    let ep = self.eps.get_mut(ei);
                    ep.connecting = false;
                    ep.path = Some(Path { slot, qpn, srqns });
                    self.eps.mark_ready(ei);
                    if self.iface.mode == Mode::Xrc && rank != self.cfg.rank {
                        self.eps.uses_ini(slot, ei);
                    }
                }
            }
            ConnEvent::Notice(Notice::Lost { rank }) => {
                if let Some(ei) = self.eps.find(rank) {
                    let ep = self.eps.get_mut(ei);
                    ep.path = None;
                    // Rebuilt at once, with or without work waiting: a rank
                    // that only waits for this peer must hear of its death
                    // (the rebuild fails, and the peer with it) within the
                    // connection retries, not at its next send.
                    ep.connecting = ep.is_open();
                    if ep.connecting {
                        let now = self.cfg.clock.now();
                        self.drv.connect(now, rank);
                    }
                    self.eps.mark_ready(ei);
                }
            }
            ConnEvent::Notice(Notice::Closed { rank }) => {
                self.fail_rank(rank, BtlError::Closed(rank))
            }
            ConnEvent::Notice(Notice::Failed { rank, reason }) => {
                self.fail_rank(rank, BtlError::Unreachable(rank, reason))
            }
            ConnEvent::Notice(Notice::Drained) => self.drained = true,
            ConnEvent::Notice(Notice::UnknownPeer { rank }) => {
                // The resolver runs under the lock: it must not call into
                // the BTL (it reads the library's address exchange).
                let from = self.drv.unknown_source(rank);
                let found = self.resolver.as_ref().and_then(|f| f(rank, from));
                match found {
                    Some(p) if p.rank == rank && self.check_peers(&[p]).is_ok() => {
                        self.stats.peers_resolved += 1;
                        self.add_peer(&p);
                    }
                    _ => {
                        let now = self.cfg.clock.now();
                        self.drv.unknown_peer(now, rank);
                    }
                }
            }
            ConnEvent::Notice(Notice::Ready { .. } | Notice::Refused { .. }) => {}
            ConnEvent::Destroyed { slot, qpn, peer } => {
                self.sends.slot_destroyed(slot);
                // Only the endpoints that used the QP hold anything of it:
                // its peer's (RC, loopback), or those whose path it was
                // (XRC INI). Not a look through every endpoint: a million
                // RC QPs going at exit would make that quadratic.
                let mut users = self.eps.take_ini_users(slot);
                users.extend(peer.and_then(|r| self.eps.find(r)));
                let mut left = Vec::new();
                for &ei in &users {
                    let ep = self.eps.get_mut(ei);
                    ep.credits.forget(qpn);
                    if ep.path.as_ref().is_some_and(|p| p.slot == slot) {
                        ep.path = None;
                    }
                    if let Some(i) = ep.kept.iter().position(|k| k.qpn == qpn) {
                        left.push((ei, ep.kept.swap_remove(i)));
                    }
                }
                #[cfg(debug_assertions)]
                for (ei, ep) in self.eps.all() {
                    let live = self.eps.find(ep.rank) == Some(ei);
                    assert!(
                        !live
                            || ep.path.as_ref().is_none_or(|p| p.slot != slot)
                                && ep.kept.iter().all(|k| k.qpn != qpn)
                                && !ep.credits.has(qpn),
                        "rank {}'s endpoint still uses destroyed QP {qpn} (slot {slot})",
                        ep.rank
                    );
                }
                // Messages that left on it and may not have arrived go
                // again, first (they are older than what was in flight).
                for (ei, kept) in left {
                    for item in kept.sent.into_iter().flatten() {
                        self.requeue(ei, item);
                    }
                }
                // Work on a destroyed QP never completes: post it again.
                for p in self.sends.take(&mut self.eps, |p| p.qp == slot) {
                    self.requeue(p.ep, p.item);
                }
            }
            ConnEvent::SrqLimit { srq } => {
                if let Some(class) = self.iface.class_of_srq(srq) {
                    self.stats.srq_limit_events += 1;
                    match self.iface.refill(class) {
                        Ok(n) => self.stats.srq_grown += u64::from(n),
                        Err(_) => self.stats.no_resource += 1,
                    }
                }
            }
        }
    }

    /// A rendezvous waits on its peer for an answer (RTR, ATS, FIN), and a
    /// peer may have given this rank up without a word reaching it: it
    /// declared this rank failed while this rank was stopped, or cut off,
    /// for longer than its retries, and its Leave found nobody. Such a
    /// peer says so when it next hears from this rank (`disown`). So every
    /// [`PROBE_EVERY`], a peer waited on that has sent nothing since the
    /// last look gets an empty credit message; a live peer ignores it.
    fn probe_silent(&mut self) {
        for rank in self.rndv.waiting_on() {
            let Some(ei) = self.eps.find(rank) else {
                continue;
            };
            let ep = self.eps.get_mut(ei);
            if !ep.is_open() {
                continue;
            }
            let heard = ep.rx.expected();
            if ep.probe_seen.replace(heard) == Some(heard) {
                self.stats.probes += 1;
                self.eps.requeue(ei, crate::post::credit_item());
            }
        }
    }

    /// Puts work that failed with its path back into its queue, in order,
    /// or drops it when its endpoint is gone or it failed too often.
    fn requeue(&mut self, ei: u32, mut item: Item) {
        if item.is_credit() {
            // Credits belong to the connection that failed.
            if let Work::Msg(m) = item.work {
                self.let_go(m.store);
            }
            self.eps.get_mut(ei).credits = Default::default();
            return;
        }
        if let Work::Rdma(Rdma { owner, .. }) = item.work {
            match owner {
                // Never written again on another connection: the receiver
                // may have delivered and reused the sink. The rendezvous
                // resumes (or, its endpoint gone, fails with it).
                Owner::RndvOut { msg } => return self.rndv.write_lost(msg),
                // Executed there perhaps, its answer lost: an atomic is not
                // done twice. Its outcome is unknown, and the user is told.
                Owner::Atomic { .. } => {
                    return self.drop_item(ei, item, BtlError::Transfer(WcStatus::WrFlush))
                }
                // On iWARP the peer's TERMINATE names no culprit: a write or
                // read whose key the peer refuses breaks the connection
                // again each time it is posted, with everything else on
                // it. The user's operation in flight at a second break
                // fails instead (whether a write landed is unknown).
                Owner::Op { .. } | Owner::Fence { .. }
                    if item.tries >= 1
                        && self.iface.caps.transport == xrcbtl_fabric::Transport::Iwarp =>
                {
                    return self.drop_item(ei, item, BtlError::Transfer(WcStatus::WrFlush));
                }
                // Its fence, flushed behind it, brings it back; a fence
                // not yet posted follows it again from the queue.
                Owner::Fenced { op } if !self.fence_waits(ei, op) => return,
                Owner::RndvIn { .. }
                | Owner::Op { .. }
                | Owner::Fence { .. }
                | Owner::Fenced { .. } => {}
            }
        }
        // A fence goes again with its write before it, in the order just
        // before the fence's.
        let rewrite = match &item.work {
            Work::Rdma(r) => r.refenced(),
            Work::Msg(_) => None,
        };
        item.tries += 1;
        if let EpState::Gone(e) = &self.eps.get(ei).state {
            let e = e.clone();
            return self.drop_item(ei, item, e);
        }
        if item.tries > MAX_TRIES {
            let e = BtlError::Transfer(WcStatus::RetryExceeded);
            if matches!(item.work, Work::Msg(_)) {
                // A message given up leaves a hole in its sequence, which
                // the peer would wait on forever: the endpoint fails, and
                // the user hears of it.
                self.drop_item(ei, item, e.clone());
                return self.fail_endpoint(ei, e);
            }
            return self.drop_item(ei, item, e);
        }
        self.stats.retransmits += 1;
        if let Some(write) = rewrite {
            let write = Item {
                order: item.order - 1,
                tries: item.tries,
                work: Work::Rdma(write),
            };
            self.eps.requeue(ei, write);
        }
        self.eps.requeue(ei, item);
    }

    /// Whether the fence of operation `op` waits in endpoint `ei`'s
    /// queue (never posted).
    fn fence_waits(&self, ei: u32, op: u64) -> bool {
        self.eps.get(ei).pending.iter().any(|i| {
            matches!(i.work, Work::Rdma(Rdma { owner: Owner::Fence { op: o, .. }, .. }) if o == op)
        })
    }

    fn poll_send(&mut self) -> usize {
        let mut batch = self.sends.take_batch();
        let n = match batch.poll(|b| self.iface.send_cq.poll(b)) {
            Ok(wcs) => {
                for wc in wcs {
                    self.on_send_completion(wc);
                }
                wcs.len()
            }
            Err(_) => 0,
        };
        self.sends.put_batch(batch);
        n
    }

    fn on_send_completion(&mut self, wc: &WorkCompletion) {
        match WrId::of(wc.wr_id) {
            WrId::Hello => {
                if wc.status != WcStatus::Success {
                    let now = self.cfg.clock.now();
                    self.drv.handle_send_failure_qpn(now, wc.qp_num);
                }
            }
            WrId::Recv(_) => {}
            WrId::Send(id) => {
                let Some((qp, no)) = self.sends.find(id) else {
                    return;
                };
                // A QP's work completes in order: whatever went unsignalled
                // before this request is done.
                while let Some(p) = self.sends.pop_unsignalled_before(&mut self.eps, qp, no) {
                    self.sent_ok(p.ep, p.item, wc);
                }
                let Some(p) = self.sends.complete(&mut self.eps, id) else {
                    return;
                };
                if wc.status == WcStatus::Success {
                    return self.sent_ok(p.ep, p.item, wc);
                }
                self.stats.send_errors += 1;
                let now = self.cfg.clock.now();
                self.drv.handle_send_failure(now, p.qp);
                let fatal = matches!(
                    wc.status,
                    WcStatus::RemoteAccess
                        | WcStatus::RemoteInvalidRequest
                        | WcStatus::LocalProtection
                        | WcStatus::LocalLength
                        | WcStatus::LocalAccess
                );
                if fatal {
                    self.drop_item(p.ep, p.item, BtlError::Transfer(wc.status));
                } else {
                    self.requeue(p.ep, p.item);
                }
            }
        }
    }

    /// Work of endpoint `ei` completed successfully. Where credits flow, a
    /// message has only left: it is kept until the peer's credits show it
    /// arrived ([`Kept`]).
    fn sent_ok(&mut self, ei: u32, mut item: Item, wc: &WorkCompletion) {
        if !self.iface.credits() || !matches!(item.work, Work::Msg(_)) {
            return self.on_sent(item, wc);
        }
        if item.is_credit() {
            // It holds its place, and is never sent again.
            Kept::of(&mut self.eps.get_mut(ei).kept, wc.qp_num).completed(None);
            return self.on_sent(item, wc);
        }
        self.spare_slot(&mut item);
        if let Some(item) =
            Kept::of(&mut self.eps.get_mut(ei).kept, wc.qp_num).completed(Some(item))
        {
            self.on_sent(item, wc);
        }
    }

    /// A message to keep gives its bounce slot back when slots run short:
    /// its body moves to the heap. Else peers that return no credits for
    /// a while (half of them are owed before any goes back) could hold
    /// every slot.
    fn spare_slot(&mut self, item: &mut Item) {
        if let Work::Msg(m) = &mut item.work {
            if let Store::Slot(s) = m.store {
                if self.iface.bounce.free() < self.iface.bounce.count() / 4 {
                    let mut body = vec![0u8; m.len as usize];
                    self.iface.bounce.read_to(s, HEADER, &mut body);
                    self.iface.bounce.give(s);
                    m.store = Store::Heap(body);
                }
            }
        }
    }

    /// `n` credits came back from endpoint `ei` on local QP `qpn`: as many
    /// more of the messages sent on it arrived, and need not be kept.
    fn arrived(&mut self, ei: u32, qpn: u32, n: u16) {
        let mut n = u64::from(n);
        while let Some(item) = Kept::of(&mut self.eps.get_mut(ei).kept, qpn).next_arrived(&mut n) {
            self.let_go_kept(item);
        }
    }

    /// A kept message is no longer needed (it arrived, or its peer is
    /// gone).
    fn let_go_kept(&mut self, item: Item) {
        if let Work::Msg(m) = item.work {
            self.let_go(m.store);
        }
    }

    /// Work completed successfully.
    fn on_sent(&mut self, item: Item, wc: &WorkCompletion) {
        match item.work {
            Work::Msg(m) => self.let_go(m.store),
            Work::Rdma(r) => match r.owner {
                Owner::RndvIn { .. } | Owner::RndvOut { .. } => {
                    self.rndv.on_rdma_done(r.owner, r.len())
                }
                Owner::Op { op } | Owner::Fence { op, .. } => self.finish_op(op, Ok(None)),
                Owner::Fenced { .. } => {}
                Owner::Atomic { op, slot, fetch } => {
                    debug_assert!(matches!(
                        wc.opcode,
                        WcOpcode::FetchAdd | WcOpcode::CompareSwap
                    ));
                    let mut v = [0u8; 8];
                    self.iface.results.read_to(slot, 0, &mut v);
                    self.iface.results.give(slot);
                    let found = u64::from_le_bytes(v);
                    self.finish_op(op, Ok(fetch.then_some(found)));
                }
            },
        }
    }

    /// A message's body is no longer needed: its slot goes back, a user
    /// buffer's registration goes back to the cache and the buffer to its
    /// owner (dropped outside the lock: its drop is user code).
    pub(crate) fn let_go(&mut self, store: Store) {
        match store {
            Store::Slot(s) => self.iface.bounce.give(s),
            Store::Heap(_) | Store::Small { .. } => {}
            Store::User { slot, data, reg } => {
                if let Some(s) = slot {
                    self.iface.bounce.give(s);
                }
                self.regs.cache.release(reg);
                self.deliver(Delivery::Release(data));
            }
        }
    }

    /// Work that will never be done: fail what it belongs to.
    fn drop_item(&mut self, ei: u32, item: Item, e: BtlError) {
        let peer = self.eps.get(ei).rank;
        match item.work {
            Work::Msg(m) => {
                let mut body = [0u8; wire::CONTROL_MAX];
                let n = (m.len as usize).min(body.len());
                m.store.copy_to(&self.iface.bounce, &mut body[..n]);
                self.let_go(m.store);
                if m.kind != Kind::Credit {
                    self.stats.lost += 1;
                }
                if let Some(ctl) = Control::decode(m.kind, &body[..n]) {
                    self.rndv.on_control_lost(peer, ctl, e);
                }
            }
            Work::Rdma(r) => match r.owner {
                Owner::RndvIn { .. } | Owner::RndvOut { .. } => {
                    self.rndv.on_rdma_failed(r.owner, e)
                }
                Owner::Op { op } | Owner::Fenced { op } | Owner::Fence { op, .. } => {
                    self.finish_op(op, Err(e))
                }
                Owner::Atomic { op, slot, .. } => {
                    self.iface.results.give(slot);
                    self.finish_op(op, Err(e));
                }
            },
        }
    }

    /// An operation ended: its callback runs at delivery.
    pub fn finish_op(&mut self, op: u64, result: OpResult) {
        if let Some((cb, result)) = self.ops.finish(op, result) {
            self.deliver(Delivery::Done { op, result, cb });
        }
    }

    /// Sets (or with `None` removes) the callback of messages with `tag`.
    pub fn set_am(&mut self, tag: Tag, cb: Option<AmFn<H>>) {
        self.cbs.set_am(tag, cb);
    }

    /// The callback of a message with `tag` being delivered; one without
    /// is counted ([`BtlStats::unhandled`]).
    pub fn am(&mut self, tag: Tag) -> Option<AmFn<H>> {
        let cb = self.cbs.am(tag);
        self.stats.unhandled += u64::from(cb.is_none());
        cb
    }

    /// Sets the callback run when the endpoint to `rank`, a known peer,
    /// fails.
    pub fn set_on_error(&mut self, rank: Rank, cb: ErrFn<H>) -> Result<()> {
        if self.eps.find(rank).is_none() {
            return Err(Error::invalid(format!("rank {rank} is not a known peer")));
        }
        self.cbs.set_on_error(rank, cb);
        Ok(())
    }

    /// Sets the callback run when any endpoint fails.
    pub fn set_on_any_error(&mut self, cb: ErrFn<H>) {
        self.cbs.set_on_any_error(cb);
    }

    /// What runs when the endpoint to `rank` failed ([`Registry::on_error`]).
    pub fn on_error(&self, rank: Rank) -> [Option<ErrFn<H>>; 2] {
        self.cbs.on_error(rank)
    }

    /// Deletes the endpoint to `rank`: its work fails with `Closed`, and
    /// its own error callback is forgotten.
    pub fn remove_peer(&mut self, rank: Rank) {
        self.fail_rank(rank, BtlError::Closed(rank));
        self.eps.remove(rank);
        self.cbs.forget(rank);
    }

    /// Starts an operation to `dst`, whose `done` runs when it ends.
    pub fn start_op(&mut self, dst: Rank, done: Option<DoneFn<H>>) -> u64 {
        self.ops.start(dst, done)
    }

    /// Forgets an operation that never started (nobody hears of it); its
    /// callback comes back, to be dropped outside the lock.
    pub fn abandon_op(&mut self, op: u64) -> Option<DoneFn<H>> {
        self.ops.finish(op, Ok(None)).map(|(cb, _)| cb)
    }

    /// A slot for an atomic's result, and where the device writes it.
    pub fn result_slot(&mut self) -> Result<(u32, Local)> {
        let slot = self
            .iface
            .results
            .take()
            .ok_or(Error::NoResource("atomics in flight"))?;
        let sge = self.iface.results.sge(slot, 8);
        let result = Local {
            addr: sge.addr,
            lkey: sge.lkey,
            rkey: 0,
        };
        Ok((slot, result))
    }

    /// Gives back a result slot whose atomic never started.
    pub fn give_result_slot(&mut self, slot: u32) {
        self.iface.results.give(slot);
    }

    /// Submits one-sided work (and the fence behind it) to endpoint `ei`.
    pub fn submit_rdma(&mut self, ei: u32, rdma: Rdma, fence: Option<Rdma>) {
        self.stats.rdma_frags += u64::from(!rdma.is_atomic());
        self.stats.atomics += u64::from(rdma.is_atomic());
        for rdma in std::iter::once(rdma).chain(fence) {
            self.submit(ei, Work::Rdma(rdma));
        }
    }

    /// The endpoint to `rank` is gone for good.
    pub fn fail_rank(&mut self, rank: Rank, e: BtlError) {
        if let Some(ei) = self.eps.find(rank) {
            self.fail_endpoint(ei, e);
        }
    }

    /// The endpoint is gone for good: everything to and from it fails, and
    /// unless it closed (the peer left cleanly, or this rank deleted it) its
    /// error callbacks run.
    pub fn fail_endpoint(&mut self, ei: u32, e: BtlError) {
        let ep = self.eps.get_mut(ei);
        if matches!(ep.state, EpState::Gone(_)) {
            return;
        }
        ep.state = EpState::Gone(e.clone());
        let rank = ep.rank;
        self.recv.forget(&mut self.pools, ei);
        for item in self.eps.drain(ei) {
            self.drop_item(ei, item, e.clone());
        }
        // Sent, arrived or not: nothing more is owed to them.
        for kept in std::mem::take(&mut self.eps.get_mut(ei).kept) {
            for item in kept.sent.into_iter().flatten() {
                self.let_go_kept(item);
            }
        }
        for p in self.sends.take(&mut self.eps, |p| p.ep == ei) {
            self.drop_item(ei, p.item, e.clone());
        }
        self.rndv.fail_peer(rank, &e);
        for op in self.ops.of_peer(rank) {
            self.finish_op(op, Err(e.clone()));
        }
        self.run_rndv();
        if !matches!(e, BtlError::Closed(_)) {
            self.deliver(Delivery::Failed { rank, err: e });
        }
    }

    // ---- receiving ---------------------------------------------------------

    /// The receive side, with what it works through lent for one call.
    fn recv(&mut self) -> (&mut Recv, RecvView<'_, C, H>) {
        let view = RecvView {
            cfg: &self.cfg,
            fc: self.iface.credits(),
            iface: &mut self.iface,
            drv: &mut self.drv,
            eps: &mut self.eps,
            pools: &mut self.pools,
            deliveries: &mut self.deliveries,
            stats: &mut self.stats,
        };
        (&mut self.recv, view)
    }

    fn poll_recv(&mut self) -> usize {
        let (recv, mut v) = self.recv();
        let n = recv.poll(&mut v);
        loop {
            let (recv, mut v) = self.recv();
            let Some(got) = recv.next(&mut v) else { break };
            self.on_got(got);
        }
        // Also with nothing new: buffers come back from deliveries after
        // the poll that found their messages.
        if self.iface.repost_due(self.cfg.srq_refill).is_err() {
            self.stats.no_resource += 1;
        }
        n
    }

    /// Acts on what a message brought: credits returned, then rendezvous
    /// control.
    fn on_got(&mut self, got: Got) {
        if let Some((ei, qpn, n)) = got.returned {
            self.arrived(ei, qpn, n);
        }
        let Some((src, tag, ctl)) = got.ctl else {
            return;
        };
        match ctl {
            Control::Rts(rts) => self.on_rts(src, tag, rts),
            Control::Rtr(rtr) => {
                self.rndv.on_rtr(src, rtr);
            }
            Control::Ats(msg) => {
                self.rndv.on_ats(src, msg);
            }
            Control::Fin(msg) => {
                self.rndv.on_fin(src, msg);
            }
            Control::Nak(msg) => {
                self.rndv.on_nak(src, msg);
            }
        }
    }

    /// A message delivered with `body` is consumed: its buffer is recycled,
    /// or its receive is given back (with, where credits flow, the credit
    /// it owes its sender).
    pub fn consumed(&mut self, body: Body<C>) {
        match body {
            Body::Heap(buf) => self.pools.recycle(buf),
            Body::Received { slot, credit, .. } => {
                self.iface.give_back(slot);
                // Posted again now when a batch is due: the receiver may
                // not poll again for a long while.
                if self.iface.repost_due(self.cfg.srq_refill).is_err() {
                    self.stats.no_resource += 1;
                }
                let Some((src, qpn)) = credit else { return };
                let Some(ei) = self.eps.find(src) else { return };
                // A connection gone meanwhile took its credits with it:
                // nothing is owed on it any more.
                let cap = self.cfg.credits;
                let owe = self.eps.get_mut(ei).credits.existing(qpn);
                if owe.is_some_and(|c| c.owe(cap)) {
                    self.eps.requeue(ei, crate::post::credit_item());
                }
            }
        }
    }

    /// A peer asks to send a rendezvous: find a sink, register it, start.
    fn on_rts(&mut self, src: Rank, tag: Tag, rts: wire::Rts) {
        if rts.len == 0 {
            self.stats.malformed += 1;
            return;
        }
        // Longer than this rank takes, or nothing to land it in: the
        // sender is told, and its operation fails.
        let sink = if rts.len > self.cfg.rndv_max.min(MAX_RNDV) {
            None
        } else {
            self.pools.sink(rts.len as usize)
        };
        let Some(mut buf) = sink else {
            self.stats.rndv_refused += 1;
            self.rndv.refuse(src, rts.msg);
            return;
        };
        // The peer writes a put's sink; a get's is written by this side's
        // reads, which on iWARP need the sink open to remote writes too.
        let access =
            if self.rndv.puts() || self.iface.caps.transport == xrcbtl_fabric::Transport::Iwarp {
                Access::LOCAL_WRITE | Access::REMOTE_WRITE
            } else {
                Access::LOCAL_WRITE
            };
        let start = sink_start(&buf);
        let reg = match self
            .regs
            .cache
            .register_mut(&mut buf[start..start + rts.len as usize], access)
        {
            Ok(r) => r,
            Err(_) => {
                self.stats.lost += 1;
                return self.pools.recycle(buf);
            }
        };
        let sink = Local {
            addr: buf[start..].as_ptr() as u64,
            lkey: reg.lkey(),
            rkey: reg.rkey(),
        };
        if let Err(s) = self.rndv.on_rts(src, tag, rts, sink, Sink { buf, reg }) {
            self.stats.malformed += 1;
            self.regs.cache.release(s.reg);
            self.pools.recycle(s.buf);
        }
    }

    /// Starts a rendezvous of `data` to `dst` with `tag` (operation `done`),
    /// sent from where it is: registered through the cache (for peers to
    /// read, unless the rendezvous writes), kept until the peer has it.
    pub fn send_rndv(
        &mut self,
        dst: Rank,
        tag: Tag,
        data: Bytes,
        done: Option<DoneFn<H>>,
    ) -> Result<u64> {
        // Peers read a get's source; a put's is only sent from.
        let reg = if self.rndv.puts() {
            self.regs.cache.register_local(&data)?
        } else {
            self.regs.cache.register(&data)?
        };
        let src = Local {
            addr: data.as_ptr() as u64,
            lkey: reg.lkey(),
            rkey: reg.rkey(),
        };
        let op = self.ops.start(dst, done);
        let len = data.len() as u64;
        self.rndv.send(dst, tag, len, src, op, Source { data, reg });
        self.stats.rndv_sent += 1;
        self.run_rndv();
        self.drain_pending();
        Ok(op)
    }

    /// Turns what the rendezvous machine asks into queued work and
    /// deliveries.
    pub fn run_rndv(&mut self) -> usize {
        let mut n = 0;
        while let Some(act) = self.rndv.poll() {
            n += 1;
            match act {
                Act::Send { peer, tag, ctl } => self.queue_control(peer, tag, ctl),
                Act::Rdma { peer, rdma } => match self.eps.find(peer) {
                    Some(ei) if self.eps.get(ei).is_open() => {
                        self.stats.rdma_frags += 1;
                        self.eps.enqueue(ei, Work::Rdma(rdma));
                    }
                    _ => self.rndv.on_rdma_failed(rdma.owner, BtlError::Closed(peer)),
                },
                Act::Deliver {
                    peer,
                    tag,
                    len,
                    sink,
                } => {
                    self.regs.cache.release(sink.reg);
                    self.stats.rndv_received += 1;
                    self.stats.bytes_received += len;
                    let start = sink_start(&sink.buf);
                    self.deliver(Delivery::Message {
                        src: peer,
                        tag,
                        body: Body::Heap(sink.buf),
                        start,
                        end: start + len as usize,
                    });
                }
                Act::Finished { op, src, result } => {
                    self.regs.cache.release(src.reg);
                    self.finish_op(op, result.map(|()| None));
                    self.deliver(Delivery::Release(src.data));
                }
                Act::Release { sink } => {
                    self.regs.cache.release(sink.reg);
                    self.pools.recycle(sink.buf);
                }
            }
        }
        n
    }

    /// Queues a rendezvous control message to `peer`, in its sequence.
    fn queue_control(&mut self, peer: Rank, tag: Tag, ctl: Control) {
        let ei = match self.eps.find(peer) {
            Some(ei) if self.eps.get(ei).is_open() => ei,
            _ => return self.rndv.on_control_lost(peer, ctl, BtlError::Closed(peer)),
        };
        let mut body = [0u8; wire::CONTROL_MAX];
        let len = ctl.encode(&mut body);
        let store = match self.iface.bounce.take() {
            Some(s) => {
                self.iface.bounce.write(s, HEADER, &body[..len]);
                Store::Slot(s)
            }
            None => Store::Heap(body[..len].to_vec()),
        };
        let seq = self.eps.get_mut(ei).tx.take();
        self.eps.enqueue(
            ei,
            Work::Msg(Msg {
                seq,
                kind: ctl.kind(),
                tag,
                len: len as u32,
                store,
            }),
        );
    }

    /// A message to this rank itself: delivered by copy.
    pub fn deliver_to_self(&mut self, tag: Tag, parts: [&[u8]; 2]) {
        let mut buf = self.pools.buf();
        buf.clear();
        buf.extend_from_slice(parts[0]);
        buf.extend_from_slice(parts[1]);
        self.stats.bytes_received += buf.len() as u64;
        let (src, end) = (self.cfg.rank, buf.len());
        self.deliver(Delivery::Message {
            src,
            tag,
            body: Body::Heap(buf),
            start: 0,
            end,
        });
    }

    /// Sends an eager message of `parts` (header, then payload) to
    /// endpoint `ei`: copied into the message itself when it is short
    /// enough to go inline, else into a bounce slot, and posted now if it
    /// can go, else queued (in a heap copy if no slot is free). With `now_only`
    /// nothing is queued: `false` if it cannot go at once.
    pub fn send_eager(&mut self, ei: u32, tag: Tag, parts: [&[u8]; 2], now_only: bool) -> bool {
        self.send_copy(ei, Kind::Eager, tag, parts, now_only)
    }

    /// [`Core::send_eager`] of a message of `kind` (an eager message or a
    /// part of one).
    fn send_copy(
        &mut self,
        ei: u32,
        kind: Kind,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> bool {
        let len = parts[0].len() + parts[1].len();
        if HEADER + len <= self.cfg.max_inline as usize {
            if kind == Kind::Eager {
                let (sends, mut v) = self.sends();
                if let Some(went) = sends.send_small(&mut v, ei, tag, parts, now_only) {
                    return went;
                }
            }
            if let Some(store) = Store::small(parts) {
                return self.send_msg(ei, kind, tag, len, store, now_only);
            }
        }
        let store = match self.iface.bounce.take() {
            Some(s) => {
                self.iface.bounce.write(s, HEADER, parts[0]);
                self.iface
                    .bounce
                    .write(s, HEADER + parts[0].len(), parts[1]);
                Store::Slot(s)
            }
            None if now_only => return false,
            None => {
                self.stats.spilled += 1;
                Store::Heap([parts[0], parts[1]].concat())
            }
        };
        self.send_msg(ei, kind, tag, len, store, now_only)
    }

    /// Sends `data` eagerly to endpoint `ei` from where it is, without a
    /// copy: registered through the cache, kept until the message
    /// completes. Falls back to a copy when the memory cannot be
    /// registered.
    pub fn send_eager_zcopy(&mut self, ei: u32, tag: Tag, data: Bytes) {
        self.send_user(ei, Kind::Eager, tag, data);
    }

    /// [`Core::send_eager_zcopy`] of a message of `kind`.
    fn send_user(&mut self, ei: u32, kind: Kind, tag: Tag, data: Bytes) {
        let len = data.len();
        // Sent from, never read by the peer: no remote rights.
        match self.regs.cache.register_local(&data) {
            Ok(reg) => {
                self.stats.zcopy_sent += 1;
                let store = Store::User {
                    slot: None,
                    data,
                    reg,
                };
                self.send_msg(ei, kind, tag, len, store, false);
            }
            Err(_) => {
                self.send_copy(ei, kind, tag, [&data, &[]], false);
                self.deliver(Delivery::Release(data));
            }
        }
    }

    /// Sends `data` (longer than an eager message, at most
    /// [`BtlConfig::split_limit`]) to endpoint `ei` as eager messages back to
    /// back: parts of the largest eager size ([`Kind::Part`]), the last
    /// one an ordinary eager message, with consecutive sequence numbers.
    /// The receiver joins them. Parts go from `data` itself where they are
    /// long enough to be worth it, as [`Core::send_eager_zcopy`] does.
    pub fn send_split(&mut self, ei: u32, tag: Tag, data: Bytes) {
        let part = self.iface.max_message() - HEADER;
        self.stats.split_sent += 1;
        let mut at = 0;
        while at < data.len() {
            let end = (at + part).min(data.len());
            let kind = if end == data.len() {
                Kind::Eager
            } else {
                Kind::Part
            };
            if end - at >= self.cfg.zcopy_min {
                self.send_user(ei, kind, tag, data.slice(at..end));
            } else {
                self.send_copy(ei, kind, tag, [&data[at..end], &[]], false);
            }
            at = end;
        }
    }

    /// Posts a message of `kind` with its body in `store` now, or queues it
    /// behind the endpoint's pending work (with `now_only`, gives the store
    /// back and answers `false` instead).
    fn send_msg(
        &mut self,
        ei: u32,
        kind: Kind,
        tag: Tag,
        len: usize,
        store: Store,
        now_only: bool,
    ) -> bool {
        let msg = Msg {
            seq: self.eps.get(ei).tx.peek(),
            kind,
            tag,
            len: len as u32,
            store,
        };
        if now_only {
            if let Err(work) = self.submit_now(ei, Work::Msg(msg)) {
                if let Work::Msg(m) = work {
                    self.let_go(m.store);
                }
                return false;
            }
        } else {
            self.submit(ei, Work::Msg(msg));
        }
        self.eps.get_mut(ei).tx.take();
        self.stats.eager_sent += 1;
        true
    }

    /// Posts `work` to endpoint `ei` at once if nothing waits before it
    /// and it can go; else it waits in the endpoint's queue, in order. (An
    /// endpoint without a path is connected on demand.)
    pub fn submit(&mut self, ei: u32, work: Work) {
        if !self.eps.get(ei).pending.is_empty() {
            return self.eps.enqueue(ei, work);
        }
        let item = Item {
            order: self.eps.next_order(ei),
            tries: 0,
            work,
        };
        if let Err(item) = self.post(ei, item) {
            self.eps.requeue(ei, item);
        }
    }

    /// [`Core::submit`] of work that goes now or not at all: it is given
    /// back if anything waits before it or it cannot be posted at once.
    // By value, as `SendQueues::post` takes and returns it.
    #[allow(clippy::result_large_err)]
    fn submit_now(&mut self, ei: u32, work: Work) -> std::result::Result<(), Work> {
        if !self.eps.get(ei).pending.is_empty() {
            return Err(work);
        }
        let item = Item {
            order: self.eps.next_order(ei),
            tries: 0,
            work,
        };
        self.post(ei, item).map_err(|item| item.work)
    }

    /// Registers user memory through the cache ([`Regs::register`]).
    pub fn register_mem(&mut self, mem: UserMem, access: Access) -> Result<MemReg> {
        self.regs.register(mem, access)
    }

    /// Registers exactly `mem` ([`Regs::register_exact`]).
    pub fn register_exact(&mut self, mem: UserMem, access: Access) -> Result<MemReg> {
        self.regs.register_exact(mem, access)
    }

    /// Gives a user's registration back ([`Regs::deregister`]): an exact
    /// one comes back, to be dropped outside the lock.
    pub fn deregister_mem(&mut self, reg: MemReg) -> Result<Option<C::Mr>> {
        self.regs.deregister(reg)
    }

    /// Checks a user registration an operation names ([`Regs::check`]).
    pub fn check_reg(&mut self, reg: &MemReg) -> Result<()> {
        self.regs.check(reg)
    }

    /// The registration cache's counters.
    pub fn rcache_stats(&self) -> xrcbtl_fabric::rcache::Stats {
        self.regs.cache.stats()
    }

    /// Whether nothing is outstanding: no pending or in-flight work, no
    /// rendezvous in progress, no operation, nothing to deliver. Asking
    /// covers unsignalled work (see [`SendQueue`]) at once.
    pub fn is_idle(&mut self) -> bool {
        if self.sends.ask_cover(&mut self.eps) {
            self.drain_pending();
        }
        self.sends.is_empty()
            && self.eps.pending_now == 0
            && self.rndv.is_idle()
            && self.ops.is_empty()
            && self.deliveries.is_empty()
    }

    /// What keeps it from idle, in words (for failure reports).
    pub fn busy(&self) -> String {
        let (outs, ins, acts) = self.rndv.counts();
        format!(
            "work requests {} ({} signalled), pending {}, rendezvous out {outs} in {ins} \
             asked {acts}, operations {:?}, deliveries {}",
            self.sends.len(),
            self.sends.signalled_out(),
            self.eps.pending_now,
            self.ops.live(),
            self.deliveries.len()
        )
    }
}
