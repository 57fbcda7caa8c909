//! The core of a BTL: its state behind the one lock, and what progress
//! does with it. It owns the rooms below it and decides between them: the
//! receive side (`recv.rs`) judges what arrives and hands it over, the
//! protocol machines ([`crate::proto`]) turn it into work, the send queues
//! (`post.rs`) post the work and give back what completed, and the core
//! judges completions and failures (requeue, drop, fail an endpoint).
//! Whatever the user must hear of (messages, finished operations, failed
//! peers) is queued as a [`Delivery`], which [`crate::Btl`] hands to the
//! user's callbacks after the lock is released.
//!
//! This file holds the state, the progress order and the lending of rooms;
//! the core's other parts are one file each:
//!
//! | file | part |
//! |---|---|
//! | `peers.rs` | peers checked and added, endpoints connected, connection events acted on |
//! | `complete.rs` | send completions, and the failure policy (requeue, drop, fail an endpoint) |
//! | `rndv.rs` | what arrives acted on, and the rendezvous glue |
//! | `send.rs` | eager messages, one-sided work, and the one `submit` |
//! | `user.rs` | what the user registers and reads: facts, counters, memory, callbacks |

mod complete;
mod peers;
mod rndv;
mod send;
mod user;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xrcbtl_fabric::{Context, DeviceCaps, MemCache, RecvDone, Result, WorkCompletion, Xrcd};
use xrcbtl_xrc_conn::Mode;

use crate::callbacks::{DoneFn, Registry};
use crate::config::BtlConfig;
use crate::conn::ConnDriver;
use crate::delivery::{Deliveries, Delivery, Short};
use crate::domains::Domains;
use crate::ep::Endpoints;
use crate::iface::Iface;
use crate::place::Placed;
use crate::pools::{Pools, Sink, Source};
use crate::post::{SendQueues, SendView};
use crate::proto::ops::Ops;
use crate::proto::rndv::{Rndv, RndvConfig};
use crate::recv::{Recv, RecvView};
use crate::regs::Regs;
use crate::types::{BtlStats, PeerResolver, Receive};
use crate::work::Item;

/// Give up on a work request after this many failed attempts.
const MAX_TRIES: u32 = 64;
/// Progress calls per look at connection and async events, where those
/// cost system calls.
const CONTROL_EVERY: u32 = 16;
/// How many times rarer the look is while every connection is settled:
/// once every 1,024 calls, where a yield after an empty call counts as
/// several (`YIELD_COUNTS_AS` in the API's module: a rank that yields
/// makes its calls slow, and the look is also when it sees its
/// unsignalled sends to a dead peer fail).
const CONTROL_SETTLED: u32 = 64;
/// How often a rank looks for peers it waits on and has not heard from
/// ([`Core::probe_silent`]).
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// What the API keeps of the rank's device and connections
/// ([`Core::facts`]): read without the lock.
pub(crate) struct Facts<C: Context> {
    /// XRC, or RC (with or without peer-to-peer mode).
    pub mode: Mode,
    /// What the device can do.
    pub caps: DeviceCaps,
    /// The listener peers connect to (IP addressing).
    pub listen: Option<SocketAddr>,
    /// The device's name.
    pub device: String,
    /// Whether credits flow ([`Iface::credits`]).
    pub credits: bool,
    /// The largest message, header included.
    pub max_message: usize,
    /// The receive CQ, which a progress thread blocks on when idle.
    pub recv_cq: C::Cq,
    /// Where the device's buffers and progress thread were placed.
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
    /// How requests from unknown ranks are answered.
    resolver: Option<PeerResolver>,
    /// How this rank receives, and the XRC domains of the peers' nodes.
    domains: Domains,
    /// What the user must hear of, until the lock is released.
    deliveries: Deliveries<C, H>,
    stats: BtlStats,
    /// The slow-work word, shared with the BTL, which reads it without the
    /// lock: `false` while nothing rare waits (no control look asked for,
    /// no signalled work out, no cover asked, no receive buffer to post
    /// again, no QP draining, no rendezvous step, no pending work), when a
    /// progress call may poll the receive CQ alone, without this lock
    /// ([`crate::Btl::progress`]'s quiet path). Set by every progress call
    /// that took the lock, once it has done its work ([`Core::set_quiet`]),
    /// but a quiet call that left nothing behind ([`Core::quiet_found`]),
    /// and raised by every other taking of the lock ([`Core::entered`])
    /// and by whatever leaves work behind without it.
    rare: Arc<AtomicBool>,
    control_every: u32,
    /// When to look for silent peers next.
    probe_at: Duration,
    drained: bool,
    /// The receive side.
    recv: Recv,
}

impl<C: Context, H> Core<C, H> {
    /// Sets the rank up on its device.
    pub fn new(
        ctx: C,
        cfg: BtlConfig,
        queued: Arc<AtomicUsize>,
        rare: Arc<AtomicBool>,
    ) -> Result<Self> {
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
        let receive = match &iface.xrcd {
            Some(x) => Receive::Xrc(x.id()),
            None => Receive::Rc,
        };
        let domains = Domains::new(receive, cfg.node, cfg.rank);
        let classes = iface.classes.len();
        Ok(Core {
            sends: SendQueues::new(cfg.cq_batch),
            recv: Recv::new(cfg.split_limit.bytes().max(2 * iface.max_message())),
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
            domains,
            deliveries: Deliveries::new(queued),
            stats: BtlStats {
                received_by_class: vec![0; classes],
                ..BtlStats::default()
            },
            rare,
            probe_at: Duration::ZERO,
            control_every,
            drained: false,
        })
    }

    /// Queues something for the user.
    pub fn deliver(&mut self, d: Delivery<C, H>) {
        self.deliveries.push(d);
    }

    /// Takes the next thing for the user.
    pub fn next_delivery(&mut self) -> Option<Delivery<C, H>> {
        self.deliveries.pop()
    }

    /// Whether a short message waits in a slot of its own (see
    /// [`Core::next_short`]).
    #[inline]
    pub fn has_short(&self) -> bool {
        self.deliveries.has_short()
    }

    /// Takes the short message waiting in a slot of its own, ahead of
    /// every other delivery, if one does.
    #[inline]
    pub fn next_short(&mut self) -> Option<Short> {
        self.deliveries.pop_short()
    }

    /// [`Core::next_short`] when [`Core::has_short`] said one waits.
    #[inline]
    pub fn next_short_held(&mut self) -> Short {
        self.deliveries.take_short()
    }

    /// Counts the short message in its own slot among the deliveries
    /// waiting ([`crate::delivery::Deliveries::count_short`]), before the
    /// lock is let go with it still there.
    #[inline]
    pub fn count_short(&mut self) {
        self.deliveries.count_short();
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

    /// The rest of a quiet progress call ([`crate::Btl::progress`]),
    /// whose poll of the receive CQ, made without this lock, found `n`
    /// completions in `wcs`: the receive side reads them, then what they
    /// brought is done. Returns how much it found.
    ///
    /// The call began with the slow-work word down. Completions that all
    /// took the straight line can leave behind only pending work (credits
    /// to return) or a failed repost: without either, nothing is left to
    /// do and the word is left as it is (down, or raised meanwhile by
    /// another taking of the lock, for a reason of its own).
    #[inline(always)]
    pub fn quiet_found(&mut self, wcs: &[WorkCompletion], n: usize) -> usize {
        self.recv.took(n, wcs.len());
        let general = self.read_found(&wcs[..n]);
        self.quiet_rest(general, n)
    }

    /// The end of a quiet call that read `n` completions, `general` if any
    /// took the general path: what they brought is done, when anything
    /// can be left (see [`Core::quiet_found`]). Returns how much it found.
    #[inline(always)]
    fn quiet_rest(&mut self, general: bool, n: usize) -> usize {
        if general || self.eps.any_ready() || self.iface.repost_wanted {
            return n + self.after_recv();
        }
        n
    }

    /// [`Core::quiet_found`] for exactly one completion, `wc`, polled into
    /// a buffer of `batch` entries: a short message that found no delivery
    /// waiting is left in `out`, for the caller to hand to its callback
    /// ([`Core::read_found_one`]).
    #[inline(always)]
    pub fn quiet_found_one(
        &mut self,
        wc: &WorkCompletion,
        batch: usize,
        out: &mut Option<Short>,
    ) -> usize {
        self.recv.took(1, batch);
        let general = self.read_found_one(wc, out);
        self.quiet_rest(general, 1)
    }

    /// [`Core::quiet_found_one`] for a receive that succeeded, `wc`, read
    /// in place by the poll ([`xrcbtl_fabric::Cq::staged_recv`]) into a
    /// buffer of `batch` entries: `None`, having changed nothing, when the
    /// straight line declines it, for the caller to read it whole.
    #[inline(always)]
    pub fn quiet_found_recv(
        &mut self,
        wc: RecvDone,
        batch: usize,
        out: &mut Option<Short>,
    ) -> Option<usize> {
        self.read_found_recv(wc, out)?;
        self.recv.took(1, batch);
        // Buffers due to be posted again (one call in a batch's worth)
        // and pending work, told by two looks.
        if self.iface.repost_wanted || self.eps.any_ready() {
            return Some(1 + self.found_recv_rest());
        }
        Some(1)
    }

    /// The end of [`Core::quiet_found_recv`] when buffers are due to be
    /// posted again or work is pending: out of line.
    #[inline(never)]
    fn found_recv_rest(&mut self) -> usize {
        self.repost_due();
        self.quiet_rest(false, 0)
    }

    /// Puts short message `s`, which [`Core::quiet_found_one`] returned
    /// and its caller could not hand on, back in line, ahead of every
    /// delivery queued since.
    #[inline]
    pub fn hold_short(&mut self, s: Short) {
        self.deliveries.hold_oldest(s);
    }

    /// The slow-work word ([`Core::rare`]'s doc): raised, so that the next
    /// progress call takes the full path.
    #[inline(always)]
    pub(crate) fn raise(&self) {
        self.rare.store(true, Ordering::Relaxed);
    }

    /// Does what is due: connection events (when `left`, the progress
    /// calls before the next look, kept by the caller, has run out),
    /// completions (the receive CQ's polled into `wcs`), pending work.
    /// Returns how much it found. Then sets the slow-work word.
    #[inline(never)]
    pub fn poll_full(&mut self, left: &mut u32, wcs: &mut [WorkCompletion]) -> usize {
        // Connection and async events cost system calls (the CM's and the
        // device's event descriptors); completions do not. A progress loop
        // spinning on a CQ looks at them every `CONTROL_EVERY` calls only,
        // and while every connection is settled (no attempt, retry or
        // departure under way: judged at each look) `CONTROL_SETTLED` times
        // less often still. Work a command just gave the driver (a connect,
        // a failed send) is looked at on the next call.
        let due = *left == 0 || self.drv.wants_look();
        let mut n = 0;
        if due {
            n += self.control_now();
            let every = if self.control_every > 1 && self.drv.settled() {
                self.control_every * CONTROL_SETTLED
            } else {
                self.control_every
            };
            *left = every - 1;
        } else {
            *left -= 1;
        }
        // The send CQ holds completions of signalled work (and, rarely, of
        // the driver's hello, seen on the control ticks).
        if due || self.sends.signalled_out() > 0 {
            n += self.poll_send();
        }
        if self.sends.wants_cover() {
            self.sends.cover_unsignalled(&mut self.eps);
        }
        n += self.poll_recv(wcs);
        n + self.after_recv()
    }

    /// What follows a poll of the receive CQ: a draining QP's end,
    /// rendezvous steps, pending work. Then sets the slow-work word.
    #[inline]
    fn after_recv(&mut self) -> usize {
        // Most calls have none of the three rare conditions: one look, and
        // no call frame.
        if !self.drv.draining() && !self.rndv.has_acts() && !self.eps.any_ready() {
            self.set_quiet(false);
            return 0;
        }
        self.after_recv_rare()
    }

    /// [`Core::after_recv`] when a QP drains, rendezvous acts or pending
    /// work wait.
    #[inline(never)]
    fn after_recv_rare(&mut self) -> usize {
        let mut n = 0;
        if self.drv.draining() && self.recv.dry() {
            self.drv.recv_cq_dry(self.cfg.clock.now());
        }
        if self.rndv.has_acts() {
            n += self.run_rndv();
        }
        if self.eps.any_ready() {
            n += self.drain_pending();
        }
        let rare = self.drv.draining() || self.rndv.has_acts() || self.eps.any_ready();
        self.set_quiet(rare);
        n
    }

    /// Sets the slow-work word: the next calls may poll the receive CQ
    /// alone until the control look is due unless the driver, a signalled
    /// send, a cover, receive buffers to post again or `rare` work waits.
    #[inline]
    fn set_quiet(&mut self, rare: bool) {
        let quiet = !rare
            && !self.drv.wants_look()
            && self.sends.signalled_out() == 0
            && !self.sends.wants_cover()
            && !self.iface.repost_wanted;
        self.rare.store(!quiet, Ordering::Relaxed);
    }

    /// Looks at connection and async events now.
    pub fn control_now(&mut self) -> usize {
        let now = self.cfg.clock.now();
        if now >= self.probe_at {
            self.probe_at = now + PROBE_EVERY;
            self.probe_silent();
            // A QP's send log idle since the last look gives its memory
            // back (a busy one keeps it: no allocation per message).
            self.sends.trim_logs();
        }
        let mut work = self.drv.progress(now);
        while let Some(ev) = self.drv.poll_event() {
            work += 1;
            self.on_conn_event(ev);
        }
        work
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

    /// Whether nothing is outstanding: no pending or in-flight work, no
    /// rendezvous in progress, no operation, nothing to deliver. Asking
    /// covers unsignalled work (see [`SendQueues::ask_cover`]) at once.
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
            "work requests {} ({} signalled, {} more left and wait for credits), pending {}, \
             rendezvous out {outs} in {ins} asked {acts}, operations {:?}, deliveries {}",
            self.sends.len(),
            self.sends.signalled_out(),
            self.sends.waiting(),
            self.eps.pending_now,
            self.ops.live(),
            self.deliveries.len()
        )
    }
}
