//! The BTL's API, and how it is safe to call from any thread.
//!
//! Shaped like Open MPI's BTL so that a C ABI maps onto it:
//! [`Btl::add_procs`] / [`Btl::del_procs`] make and drop endpoints; active
//! messages carry a tag whose registered callback runs on receipt
//! ([`Btl::register_am`]); [`Btl::send`] and [`Btl::sendi`] send a header
//! and a payload eagerly (copied, or inline); [`Btl::send_bytes`] also
//! sends larger buffers by rendezvous without a copy; [`Btl::put`],
//! [`Btl::get`] and the atomics work on registered memory
//! ([`Btl::register_mem`], [`Btl::alloc_mem`]); operations report through
//! a completion callback or [`Btl::test`]; [`Btl::flush`] waits for
//! everything outstanding.
//!
//! Delivery guarantees: every message arrives exactly once, eager messages
//! in order per (source, destination), even when connections fail: each
//! carries a sequence number, work that failed with its connection is
//! posted again in its order on the rebuilt one, and the receiver drops
//! what it has seen (`proto/eager.rs`).
//!
//! Threads: every method takes `&self`. The state lives behind one lock,
//! held only inside the BTL and never while user code runs. Progress may
//! run on several threads at once: one at a time polls the receive CQ,
//! holding the poller (a second lock, always taken before the first and
//! never by anything but progress), and what it found is read under the
//! state's lock before the poller is let go, so that no other thread can
//! poll later completions of the same QP and act on them first. While
//! nothing rare waits (the slow-work word), a progress call that finds
//! the CQ empty takes no other lock. What the user must hear of is
//! queued; callbacks then run outside both locks, one at a time
//! (whichever thread finds the queue free runs them, in order), so a
//! callback may send, add endpoints, start operations or call progress
//! (which then only polls: the callbacks it finds run after the current
//! one returns).

mod deliver;
mod rdma;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use xrcbtl_fabric::{Context, Cq, DeviceCaps, Error, IbAddr, RecvDone, Result, WorkCompletion};
use xrcbtl_xrc_conn::{ConnManager, Mode, Notice, Rank};

use crate::callbacks::{AmFn, DoneFn, ErrFn};
use crate::config::BtlConfig;
use crate::conn::DriverStats;
use crate::core::{Core, Facts};
use crate::delivery::{Delivery, Short};
use crate::types::{BtlError, BtlStats, Incoming, OpId, Peer, Receive, Tag};
use crate::wire::HEADER;

/// An active-message callback. It runs with no lock of the BTL held, on a
/// thread that called [`Btl::progress`], and may call back into the BTL
/// (send, add endpoints, start operations). Callbacks run one at a time, in
/// the order the messages arrived.
pub type AmCallback<C> = AmFn<Btl<C>>;

/// An error callback: runs (like [`AmCallback`]) when the endpoint to a
/// rank fails for good: the peer became unreachable or its process died.
/// A peer that leaves cleanly, or an endpoint deleted with
/// [`Btl::del_procs`], fails what was outstanding to it with
/// [`BtlError::Closed`] but is not an error to report.
pub type ErrorCallback<C> = ErrFn<Btl<C>>;

/// An operation's completion callback: runs once (like [`AmCallback`])
/// when the operation ends.
pub type OnDone<C> = DoneFn<Btl<C>>;

/// How many progress calls a yield ([`BtlConfig::idle_yield`]) stands for
/// in the countdown to the next look at connection events. The look is
/// where a rank sees its unsignalled sends to a dead peer fail, so its
/// pace in time matters: a rank that spins without yielding makes its
/// calls fast, one that yields after every empty call (the default on a
/// device the host's kernel emulates) makes them as slow as the
/// scheduler, and in a guest whose four ranks share one emulated CPU,
/// 1,024 calls between looks took rank 0 10.6 s to hear of a SIGKILLed
/// peer (`scripts/guest-faults rxe`, against the 5 s the product
/// promises; 2.4 s at 128). Counting each yield as 8 calls keeps that
/// rank's looks 128 yields apart while a spinning one looks every 1,024
/// calls.
const YIELD_COUNTS_AS: u32 = 8;

/// What the one progress call polling the receive CQ holds (the poller,
/// [`Btl::progress`]): the buffer a poll without the state's lock fills,
/// and the counts only progress keeps.
struct Poller<Q: Cq> {
    /// What a quiet call's poll took, as the device wrote it, until it is
    /// converted into `wcs` ([`Cq::poll_staged`]).
    staged: Q::Staged,
    /// The receive CQ's completions, as a poll found them, until the core
    /// has read them (under its lock, before the poller is let go).
    wcs: Vec<WorkCompletion>,
    /// Progress calls left before the next look at connection events.
    left: u32,
    /// Empty progress calls left before the caller yields, counted down
    /// from `yield_after` ([`BtlConfig::idle_yield`]; `u32::MAX` when it
    /// never yields: then once every 2^32 empty calls in a row) and set
    /// back by a call that found work.
    idle_left: u32,
    yield_after: u32,
    /// Times it yielded.
    yields: u64,
    /// Quiet progress calls before the last full one, and the quiet calls
    /// that found completions (and so took the state's lock). A quiet call
    /// counts itself only by counting `left` down: those since the last
    /// full call are `mark - left`.
    quiet: u64,
    found: u64,
    /// `left` as the last full call left it.
    mark: u32,
}

impl<Q: Cq> Poller<Q> {
    /// Quiet progress calls so far.
    fn quiet_calls(&self) -> u64 {
        self.quiet + u64::from(self.mark - self.left)
    }
}

/// The byte transfer layer of one rank on one device.
pub struct Btl<C: Context> {
    /// The receive CQ's poller: taken by progress calls only, before
    /// `core`.
    poller: Mutex<Poller<C::Cq>>,
    core: Mutex<Core<C, Btl<C>>>,
    /// The core's slow-work word ([`Core::raise`]), read without its lock.
    rare: Arc<AtomicBool>,
    delivering: AtomicBool,
    queued: Arc<AtomicUsize>,
    cfg: BtlConfig,
    /// The device and connections, as set up (read without the lock).
    facts: Facts<C>,
}

impl<C: Context> std::fmt::Debug for Btl<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Btl(rank {}, {:?})", self.cfg.rank, self.facts.mode)
    }
}

impl<C: Context> Btl<C> {
    /// Sets the rank up on a device: XRC where the device has it (else RC +
    /// SRQ), receive classes, bounce buffers, the registration cache, the
    /// listener.
    pub fn new(ctx: C, cfg: BtlConfig) -> Result<Self> {
        cfg.validate()?;
        let queued = Arc::new(AtomicUsize::new(0));
        let rare = Arc::new(AtomicBool::new(true));
        let core = Core::new(ctx, cfg.clone(), queued.clone(), rare.clone())?;
        let facts = core.facts();
        let yield_after = match cfg.idle_yield.after(&facts.caps) {
            0 => u32::MAX,
            n => n,
        };
        Ok(Btl {
            poller: Mutex::new(Poller {
                staged: facts.recv_cq.staging(cfg.cq_batch),
                wcs: vec![WorkCompletion::default(); cfg.cq_batch.max(1)],
                left: 0,
                idle_left: yield_after,
                yield_after,
                yields: 0,
                quiet: 0,
                found: 0,
                mark: 0,
            }),
            facts,
            rare,
            core: Mutex::new(core),
            delivering: AtomicBool::new(false),
            queued,
            cfg,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Core<C, Btl<C>>> {
        // Not poisoned by a panic: a panic inside the BTL leaves its state
        // as it was at that point, and the lock is never held while user
        // code runs. (parking_lot's lock: std's checks the panic count
        // when taken and again when let go, on every call.)
        let mut core = self.core.lock();
        core.entered();
        core
    }

    /// Takes the lock for a call that only reads the core (its counters,
    /// its next timer): unlike [`Btl::lock`], it leaves the slow-work word
    /// as it is, since it leaves no work behind.
    fn lock_to_read(&self) -> MutexGuard<'_, Core<C, Btl<C>>> {
        let mut core = self.core.lock();
        core.count_lock();
        core
    }

    /// Takes the lock for an eager send, which sets the slow-work word
    /// itself ([`Core::send_eager`]): a short message posted unsignalled
    /// leaves the next progress call quiet.
    fn lock_to_send(&self) -> MutexGuard<'_, Core<C, Btl<C>>> {
        self.lock_to_read()
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.cfg.rank
    }

    /// The address peers connect to.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.facts.listen
    }

    /// Where the device is, and where the BTL put its buffers and (for
    /// [`crate::Threaded`]) its progress thread.
    pub fn placed(&self) -> &crate::place::Placed {
        &self.facts.placed
    }

    /// XRC or RC (from the device caps).
    pub fn mode(&self) -> Mode {
        self.facts.mode
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.facts.device
    }

    /// Whether messages are flow-controlled by credits (a device without
    /// RNR: iWARP).
    pub fn uses_credits(&self) -> bool {
        self.facts.credits
    }

    /// The device's capabilities.
    pub fn caps(&self) -> &DeviceCaps {
        &self.facts.caps
    }

    /// The configuration in use.
    pub fn config(&self) -> &BtlConfig {
        &self.cfg
    }

    /// Whether this rank's rendezvous writes the data into the receiver's
    /// memory (put) rather than having the receiver read it (get): its
    /// [`BtlConfig::rndv_protocol`] on this device.
    pub fn rndv_puts(&self) -> bool {
        self.cfg.rndv_protocol.is_put(self.facts.caps.transport)
    }

    /// The most bytes (header and payload together) [`Btl::send`] and
    /// [`Btl::sendi`] take.
    pub fn max_send_size(&self) -> usize {
        self.facts.max_message - HEADER
    }

    /// The NUMA node the kernel prefers for each of the BTL's own
    /// registered buffers (receive, bounce, atomic results), read back
    /// from the kernel's memory policy: shows that [`Btl::placed`] took.
    pub fn buffer_nodes(&self) -> Result<Vec<Option<u32>>> {
        self.lock().buffer_nodes()
    }

    /// Bytes of receive buffers the rank's SRQs own (every size class, the
    /// buffers added as an SRQ grew included).
    pub fn receive_bytes(&self) -> u64 {
        self.lock().receive_bytes()
    }

    /// What the BTL counted.
    pub fn stats(&self) -> BtlStats {
        // The poller first, as progress takes the two locks.
        let (yields, quiet, found) = {
            let p = self.poller.lock();
            (p.yields, p.quiet_calls(), p.found)
        };
        BtlStats {
            idle_yields: yields,
            quiet_polls: quiet,
            unlocked_polls: quiet - found,
            ..self.lock_to_read().stats()
        }
    }

    /// The registration cache's counters.
    pub fn rcache_stats(&self) -> xrcbtl_fabric::rcache::Stats {
        self.lock().rcache_stats()
    }

    /// The connection driver's counters.
    pub fn driver_stats(&self) -> DriverStats {
        self.lock().driver_stats()
    }

    /// Looks at the connection manager (counters, state).
    pub fn with_manager<R>(&self, f: impl FnOnce(&ConnManager) -> R) -> R {
        self.lock().with_manager(f)
    }

    /// Connection notices seen since the last call (the latest
    /// [`crate::conn::NOTICES_KEPT`]), refused connection requests among
    /// them.
    pub fn take_notices(&self) -> Vec<Notice> {
        self.lock().take_notices()
    }

    /// When progress is next needed for a connection timer (a retry, a
    /// deadline), if ever.
    pub fn next_timeout(&self) -> Option<Duration> {
        self.lock_to_read().next_timeout()
    }

    /// Makes endpoints for peers (connected on first use). May be called at
    /// any time, from any thread, also from inside a callback; a peer added
    /// again keeps its endpoint (one deleted is made afresh).
    ///
    /// Each peer's [`Peer::receive`] is checked against this rank's
    /// ([`Btl::receive`]): XRC and RC ranks cannot connect, and the XRC
    /// ranks of one node must share a domain. If any peer disagrees,
    /// `InvalidArgument` names it and no peer of the call is added.
    pub fn add_procs(&self, peers: &[Peer]) -> Result<()> {
        let mut core = self.lock();
        core.check_peers(peers)?;
        for p in peers {
            core.add_peer(p);
        }
        Ok(())
    }

    /// The native InfiniBand address peers reach this rank by (`AF_IB`),
    /// where the port is InfiniBand and librdmacm has `AF_IB` (and
    /// [`BtlConfig::af_ib`] allows it); publish it with the IP address.
    pub fn listen_ib_addr(&self) -> Option<IbAddr> {
        self.lock().listen_ib_addr()
    }

    /// How this rank receives, to publish with its address so that peers
    /// can check that they agree ([`Peer::receive`]).
    pub fn receive(&self) -> Receive {
        self.lock().receive()
    }

    /// Sets how to find a rank that asks for a connection before this rank
    /// knows it (an MPI library adds peers lazily, when it first sends to
    /// them, so the first message between two ranks may come from a peer
    /// not added yet). `resolve` gets the rank and returns its [`Peer`]
    /// (from the library's address exchange), or `None` to refuse the
    /// connection. It runs inside progress with the BTL's lock held: it
    /// must not call into the BTL. Without a resolver such requests are
    /// refused.
    pub fn set_peer_resolver(
        &self,
        resolve: impl Fn(Rank) -> Option<Peer> + Send + Sync + 'static,
    ) {
        self.lock()
            .set_resolver(Arc::new(move |rank, _| resolve(rank)));
    }

    /// As [`Btl::set_peer_resolver`], for a library whose address exchange
    /// cannot name every rank: `resolve` also gets where the request came
    /// from, where the CM said (the peer's IP address, with its CM id's
    /// port, not its listener's; `None` for native InfiniBand addresses).
    pub fn set_peer_resolver_by_source(
        &self,
        resolve: impl Fn(Rank, Option<SocketAddr>) -> Option<Peer> + Send + Sync + 'static,
    ) {
        self.lock().set_resolver(Arc::new(resolve));
    }

    /// Drops endpoints: their outstanding operations fail with `Closed`
    /// (error callbacks do not run: nothing failed). A rank added again
    /// afterwards gets a fresh endpoint whose messages start a new
    /// sequence: the peer must have dropped (or never had) its endpoint to
    /// this rank too, as at the end of an MPI job.
    pub fn del_procs(&self, ranks: &[Rank]) {
        let mut core = self.lock();
        for &r in ranks {
            core.remove_peer(r);
        }
    }

    /// Sets the callback run for messages with `tag` (replacing any).
    pub fn register_am(
        &self,
        tag: Tag,
        cb: impl Fn(&Btl<C>, &Incoming<'_>) + Send + Sync + 'static,
    ) {
        self.lock().set_am(tag, Some(Arc::new(cb)));
    }

    /// Removes the callback of `tag`: its messages are then dropped (and
    /// counted in [`BtlStats::unhandled`]).
    pub fn deregister_am(&self, tag: Tag) {
        self.lock().set_am(tag, None);
    }

    /// Sets the callback run when the endpoint to `rank` fails for good
    /// (unreachable, its process gone); not when the peer leaves cleanly or
    /// the endpoint is deleted.
    pub fn set_error_callback(
        &self,
        rank: Rank,
        cb: impl Fn(&Btl<C>, Rank, &BtlError) + Send + Sync + 'static,
    ) -> Result<()> {
        self.lock().set_on_error(rank, Arc::new(cb))
    }

    /// Sets the callback run when any endpoint fails for good (after the
    /// endpoint's own).
    pub fn register_error(&self, cb: impl Fn(&Btl<C>, Rank, &BtlError) + Send + Sync + 'static) {
        self.lock().set_on_any_error(Arc::new(cb));
    }

    /// Starts connecting to `rank` now (connections are otherwise made on
    /// first use).
    pub fn connect(&self, rank: Rank) -> Result<()> {
        let mut core = self.lock();
        let ei = core.endpoint(rank)?;
        if rank == self.cfg.rank {
            return Ok(());
        }
        core.connect(ei);
        Ok(())
    }

    /// Whether messages to `rank` can be posted now (a connection is up).
    pub fn is_connected(&self, rank: Rank) -> bool {
        self.lock().is_connected(rank)
    }

    fn check_eager(&self, len: usize) -> Result<()> {
        if len > self.max_send_size() {
            return Err(Error::invalid(format!(
                "{len} bytes exceed the {} an eager send takes (use send_bytes)",
                self.max_send_size()
            )));
        }
        Ok(())
    }

    /// Sends `header` then `payload` (gathered: the receiver sees them
    /// contiguous) with `tag` to `dst`, eagerly: copied now into a bounce
    /// buffer and posted, or queued until the connection, the send queue
    /// or flow control allows. Complete when it returns. At most
    /// [`Btl::max_send_size`] bytes.
    pub fn send(&self, dst: Rank, tag: Tag, header: &[u8], payload: &[u8]) -> Result<()> {
        let mut core = self.lock_to_send();
        // The latency path in this frame alone; the rest out of line
        // (Btl::send_rest), so that the frame keeps its values in
        // registers. The path takes nothing longer than a small body,
        // which every eager send may be (`Iface::small_limit`): the
        // length is checked against the eager limit out of line.
        if dst != self.cfg.rank
            && core
                .send_small_to(dst, tag, [header, payload], false)
                .is_some()
        {
            return Ok(());
        }
        self.send_rest(core, dst, tag, [header, payload])
    }

    /// [`Btl::send`] of a message the latency path did not take: one
    /// longer than an eager send may be (refused), to this rank, or by
    /// the general path.
    #[inline(never)]
    fn send_rest(
        &self,
        mut core: MutexGuard<'_, Core<C, Btl<C>>>,
        dst: Rank,
        tag: Tag,
        parts: [&[u8]; 2],
    ) -> Result<()> {
        self.check_eager(parts[0].len() + parts[1].len())?;
        if dst == self.cfg.rank {
            core.endpoint(dst)?;
            core.deliver_to_self(tag, parts);
            return Ok(());
        }
        core.send_general_to(dst, tag, parts, false)?;
        Ok(())
    }

    /// Sends like [`Btl::send`] if the message can be posted right now,
    /// else sends nothing and returns `Ok(false)` (no connection yet, work
    /// already waiting to that peer, no send-queue slot, bounce buffer or
    /// credit): the caller then uses [`Btl::send`] or tries later.
    pub fn sendi(&self, dst: Rank, tag: Tag, header: &[u8], payload: &[u8]) -> Result<bool> {
        self.check_eager(header.len() + payload.len())?;
        let mut core = self.lock_to_send();
        if dst == self.cfg.rank {
            core.endpoint(dst)?;
            core.deliver_to_self(tag, [header, payload]);
            return Ok(true);
        }
        core.send_eager_to(dst, tag, [header, payload], true)
    }

    /// Sends a shared buffer with `tag` to `dst`: eagerly up to
    /// [`Btl::max_send_size`] (copied into a bounce buffer below
    /// [`BtlConfig::zcopy_min`] bytes, else posted straight from `data`),
    /// up to [`BtlConfig::split_limit`] as several eager messages back to
    /// back that the receiver joins, else by rendezvous straight from
    /// `data`. Sent from `data`, it is
    /// registered through the cache and kept until the peer has it. `done`
    /// runs when the send is complete (`data` may be dropped at once:
    /// the BTL holds its own reference). A rendezvous longer than
    /// [`BtlConfig::rndv_max`] is refused at once; one the peer refuses
    /// (longer than its own bound, or no memory for it) or cannot finish
    /// (its reads of `data` failed for good) completes with
    /// [`BtlError::Transfer`]`(`[`xrcbtl_fabric::WcStatus::RemoteInvalidRequest`]`)`,
    /// and the message is not delivered.
    pub fn send_bytes(
        &self,
        dst: Rank,
        tag: Tag,
        data: Bytes,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        let mut core = self.lock();
        let ei = core.endpoint(dst)?;
        if data.len() <= self.max_send_size() || dst == self.cfg.rank {
            if dst == self.cfg.rank {
                core.deliver_to_self(tag, [&data, &[]]);
            } else if data.len() >= self.cfg.zcopy_min {
                core.send_eager_zcopy(ei, tag, data.clone());
            } else {
                core.send_eager(ei, tag, [&data, &[]], false);
            }
            if let Some(cb) = done {
                core.deliver(Delivery::Done {
                    op: 0,
                    result: Ok(None),
                    cb,
                });
            }
            drop(core);
            drop(data);
            return Ok(OpId::DONE);
        }
        if data.len() <= self.cfg.split_limit.bytes() {
            core.send_split(ei, tag, data);
            if let Some(cb) = done {
                core.deliver(Delivery::Done {
                    op: 0,
                    result: Ok(None),
                    cb,
                });
            }
            drop(core);
            return Ok(OpId::DONE);
        }
        if data.len() as u64 > self.cfg.rndv_max {
            return Err(Error::invalid(format!(
                "send_bytes of {} bytes: longer than XRCBTL_RNDV_MAX ({} bytes)",
                data.len(),
                self.cfg.rndv_max
            )));
        }
        let op = core.send_rndv(dst, tag, data, done)?;
        Ok(OpId(op))
    }

    /// Whether nothing is outstanding: no pending or in-flight work, no
    /// rendezvous or operation in progress, nothing left to deliver.
    pub fn is_idle(&self) -> bool {
        self.lock().is_idle()
    }

    /// What keeps it from idle, in words: work requests posted, work
    /// pending, rendezvous in progress, operations in flight (id and
    /// peer), deliveries waiting. For diagnostics; the format may change.
    pub fn busy(&self) -> String {
        self.lock_to_read().busy()
    }

    /// Does everything that is due: connection events, completions,
    /// pending work, then the callbacks of what arrived. Returns how much it
    /// found.
    ///
    /// While nothing rare waits (the core's slow-work word) and no look at
    /// connection events is due, the call is quiet: it polls the receive
    /// CQ holding the poller alone, and takes the core's lock only when it
    /// found completions. The empty answer, a spinning caller's usual one,
    /// then costs no lock but the poller's.
    ///
    /// Never inlined: a Rust caller's spin loop makes the same call as the
    /// C ABI's, and scripts/sw-cost finds it by name to cost it per call.
    #[inline(never)]
    pub fn progress(&self) -> usize {
        let mut p = self.poller.lock();
        if p.left == 0 || self.rare.load(Ordering::Relaxed) {
            return self.progress_full(p);
        }
        p.left -= 1;
        let n = self.facts.recv_cq.poll_staged(&mut p.staged);
        if n == 0 {
            p.idle_left -= 1;
            if p.idle_left != 0 {
                return 0;
            }
            self.idle_yield(p);
            return 0;
        }
        self.progress_found(p, n)
    }

    /// [`Btl::progress`]'s quiet call when its poll found `n` completions:
    /// the core reads them under its lock, taken before the poller is let
    /// go (no other thread may poll later completions of the same QPs
    /// and act on them first). Out of line, with the reading of what was
    /// found in its frame: the empty call then saves fewer registers.
    #[inline(never)]
    fn progress_found(&self, mut p: MutexGuard<'_, Poller<C::Cq>>, n: usize) -> usize {
        // One receive that succeeded, a ping-pong's usual find, is read
        // where the poll left it, not converted whole first. Anything else
        // is read out of line: this frame then holds the straight line
        // alone, and keeps its values in registers.
        let one = if n == 1 {
            self.facts.recv_cq.staged_recv(&p.staged)
        } else {
            None
        };
        let Some(wc) = one else {
            return self.found_many(p, n);
        };
        p.found += 1;
        p.idle_left = p.yield_after;
        let mut core = self.core.lock();
        core.count_lock();
        // A short message that found nothing waiting comes back from the
        // straight line, to go straight to its callback.
        let mut short = None;
        let n = match core.quiet_found_recv(wc, 1, &mut short) {
            Some(n) => n,
            None => self.found_whole(&mut core, wc, &mut short),
        };
        drop(p);
        if let Some(s) = &short {
            return n + self.hand_short(core, s);
        }
        self.found_rest(core, n)
    }

    /// The end of [`Btl::progress_found`] when its message was not handed
    /// straight to its callback: out of line, as [`Btl::found_many`].
    #[inline(never)]
    fn found_rest(&self, core: MutexGuard<'_, Core<C, Btl<C>>>, n: usize) -> usize {
        self.deliver_after(core, n)
    }

    /// [`Btl::progress_found`] when its poll found more than one
    /// completion, or one it did not read in place: each converted whole
    /// first, then read under the core's lock, taken before the poller is
    /// let go.
    #[inline(never)]
    fn found_many(&self, mut p: MutexGuard<'_, Poller<C::Cq>>, n: usize) -> usize {
        let poller = &mut *p;
        let n = self
            .facts
            .recv_cq
            .take_staged(&mut poller.staged, n, &mut poller.wcs);
        if n == 0 {
            // The queue overran: nothing found.
            return 0;
        }
        p.found += 1;
        p.idle_left = p.yield_after;
        let mut core = self.core.lock();
        core.count_lock();
        // One completion, read by a copy of the reading made for exactly
        // one: no loop around the straight line.
        if n == 1 {
            let mut short = None;
            let n = core.quiet_found_one(&p.wcs[0], 1, &mut short);
            drop(p);
            if let Some(s) = &short {
                return n + self.hand_short(core, s);
            }
            return self.deliver_after(core, n);
        }
        let n = core.quiet_found(&p.wcs, n);
        drop(p);
        self.deliver_after(core, n)
    }

    /// [`Btl::progress_found`]'s receive `wc`, read in place, when the
    /// straight line declined it: read whole, out of line.
    #[cold]
    #[inline(never)]
    fn found_whole(
        &self,
        core: &mut Core<C, Btl<C>>,
        wc: RecvDone,
        short: &mut Option<Short>,
    ) -> usize {
        core.quiet_found_one(&wc.completion(), 1, short)
    }

    /// [`Btl::progress`]'s full call: everything due, under both locks.
    #[inline(never)]
    fn progress_full(&self, mut p: MutexGuard<'_, Poller<C::Cq>>) -> usize {
        let mut core = self.core.lock();
        core.count_lock();
        let poller = &mut *p;
        poller.quiet = poller.quiet_calls();
        let n = core.poll_full(&mut poller.left, &mut poller.wcs);
        poller.mark = poller.left;
        // Deliveries waiting are work too (a message to itself, queued by
        // a send): this call runs them, since the quiet calls after it
        // will not look.
        if n > 0 || self.queued.load(Ordering::SeqCst) != 0 {
            p.idle_left = p.yield_after;
            drop(p);
            return self.deliver_after(core, n);
        }
        p.idle_left -= 1;
        if p.idle_left == 0 {
            drop(core);
            self.idle_yield(p);
            return 0;
        }
        0
    }

    /// The end of a progress call that found `n` under `core`: runs the
    /// callbacks of what it queued, if anything was queued.
    #[inline(always)]
    fn deliver_after(&self, core: MutexGuard<'_, Core<C, Btl<C>>>, n: usize) -> usize {
        // Most empty calls have nothing to deliver: they pay for no more
        // than these looks (a short message in its slot is not counted in
        // `queued` yet).
        if !core.has_short() && self.queued.load(Ordering::SeqCst) == 0 {
            drop(core);
            return n;
        }
        n + self.deliver_all(core)
    }

    /// Yields the CPU after [`BtlConfig::idle_yield`] empty progress calls
    /// in a row (`p` holds the count): on a device the host's kernel
    /// emulates, the completion this rank spins for is produced by a kernel
    /// thread that needs a CPU, and with every CPU spinning it waits for
    /// the scheduler to preempt one (measured on Soft-RoCE in a 2-CPU
    /// guest: osu_latency's 8 B average fell from about 105 to 77 us).
    ///
    /// A yield also counts as [`YIELD_COUNTS_AS`] calls towards the next
    /// look at connection events: see there.
    #[cold]
    #[inline(never)]
    fn idle_yield(&self, mut p: MutexGuard<'_, Poller<C::Cq>>) {
        p.idle_left = p.yield_after;
        p.yields += 1;
        // `mark` moves with `left`: the calls skipped are not quiet calls.
        let skip = p.left.min(YIELD_COUNTS_AS - 1);
        p.left -= skip;
        p.mark -= skip;
        drop(p);
        std::thread::yield_now();
    }

    /// Blocks until the receive CQ has a completion or `timeout` passes,
    /// for a caller with nothing else to do (a progress thread, idle): it
    /// arms the CQ, makes one more progress call for what came before
    /// the arming, and only if that found nothing, sleeps on the CQ.
    /// Returns whether the progress call found work.
    pub fn wait_for_work(&self, timeout: Duration) -> Result<bool> {
        self.facts.recv_cq.arm()?;
        if self.progress() > 0 {
            return Ok(true);
        }
        self.facts.recv_cq.sleep(timeout)?;
        Ok(false)
    }

    /// Progresses until [`Btl::is_idle`], or fails after `timeout` of the
    /// BTL's clock (wall-clock fabrics; a simulated job steps its ranks
    /// instead).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let end = self.cfg.clock.now() + timeout;
        while !self.is_idle() {
            if self.progress() == 0 {
                if self.cfg.clock.now() >= end {
                    return Err(Error::Timeout("flush"));
                }
                // Nothing to do: the answer is on the wire.
                let _ = self.wait_for_work(Duration::from_micros(100));
            }
        }
        Ok(())
    }

    /// Starts the clean exit (after the caller has flushed); progress until
    /// [`Btl::is_drained`].
    pub fn shutdown(&self) {
        self.lock().shutdown();
    }

    /// Whether the clean exit has completed.
    pub fn is_drained(&self) -> bool {
        self.lock().is_drained()
    }

    /// The receive CQ (a caller with nothing to do blocks through
    /// [`Btl::wait_for_work`], not on the CQ itself: a poll of it outside
    /// [`Btl::progress`] could take completions out of order).
    pub fn recv_cq(&self) -> C::Cq {
        self.facts.recv_cq.clone()
    }
}
