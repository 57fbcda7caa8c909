//! The send queues ([`SendQueues`]): the one place that turns work into a
//! posted work request, for queued work and for work posted at once
//! ([`crate::Btl::send`], [`crate::Btl::sendi`]) alike, the round-robin
//! drain of the pending queues, and the record of posted work until it
//! completes. They work through what the core lends them for a call
//! ([`SendView`]) and never name the core: what completed goes back to it,
//! to judge.
//!
//! A message goes as one work request: its header is written in front of
//! the body in the message's bounce slot and the slot is posted (or the
//! header alone, gathered with a body in the sender's registered memory),
//! or, when the whole message fits the QP's inline limit, header and body
//! are gathered in a scratch buffer and posted inline. The body stays with
//! the message until it completes, in its slot or, when short, in the
//! message itself: it is what a retransmission sends. Before posting,
//! the work must have a path, nothing in flight on an older path, room in
//! the QP's send queue, a bounce slot (messages), and, where the device has
//! no RNR, credits. Otherwise it goes back to its queue.
//!
//! Posted messages wait in their QP's send log ([`SendQueue`]), in posting
//! order, and their wr_id names the QP's slot and their post number: a
//! completion retires the log's front up to itself by moving along it,
//! with no look-up per message. A log is a [`Ring`]: a short message is
//! written in its next place where it stays, and retired ones are left
//! there to be written over. Where credits flow, a completed message
//! stays in the log until the peer's credits show it arrived. Reads,
//! writes and atomics (and messages on a slot past [`LOG_SLOTS`], which
//! no device's QP count reaches) are kept in a slab instead, found by
//! their wr_id.
//!
//! A short eager message to an endpoint with nothing queued takes a
//! shorter way ([`SendQueues::send_small`]): the same checks and records, made
//! in one function, with its body gathered once; whatever that way cannot
//! take (a queue, no path, no credits) it leaves to the general one.

use std::collections::VecDeque;

use xrcbtl_fabric::{Context, Error, Payload, Qp, QpCaps, SendOp, SendWr, Sge, WorkCompletion};
use xrcbtl_progress::{Batch, Ring, Spare, WrSlab};

use crate::config::BtlConfig;
use crate::conn::ConnDriver;
use crate::credits::{MSG_CREDITS, RETURN_CREDITS};
use crate::ep::Endpoints;
use crate::iface::Iface;
use crate::pools::{Sink, Source};
use crate::proto::rndv::Rndv;
use crate::proto::{Owner, Rdma, RdmaOp};
use crate::types::{BtlStats, Tag};
use crate::wire::{copy_short, Header, Kind, HEADER, SMALL_BODY};
use crate::work::{steal_slot, Item, Msg, Store, Work};
use crate::wr_id::{WrId, LOG_SLOTS};

/// What the latency path ([`SendQueues::send_small`]) did with a short
/// message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Small {
    /// Posted unsignalled: it left nothing for a progress call to look at
    /// but the receive CQ (a failure still completes, and is seen on the
    /// send CQ's next look, as any unsignalled one's).
    Quiet,
    /// Posted signalled (the send CQ has a completion to retire), or
    /// refused by its QP and queued (the driver and the queue have work).
    Busy,
    /// Refused by its QP, and dropped (`now_only`).
    Dropped,
}

/// The largest message posted inline (the scratch buffer it is gathered
/// in).
pub(crate) const INLINE_MAX: usize = 1024;

// The latency path gathers a whole small body into the scratch.
const _: () = assert!(HEADER + SMALL_BODY <= INLINE_MAX);

/// Inline messages a QP may carry unsignalled in a row: the next one is
/// signalled, and its completion completes them all. As UCX's and Open
/// MPI's openib: a signalled send makes the next progress call take the
/// full path to retire it, and at 16 those calls cost the ping-pong's
/// receiving call about 37 instructions on siw (688 against 651 at 64,
/// `scripts/sw-cost --gate`).
pub(crate) const SIGNAL_EVERY: usize = 64;

/// What [`SendQueues::send_small`] knows of a message the QP refused.
struct Refused {
    /// Its endpoint.
    ei: u32,
    /// The local QP number it was posted on.
    qpn: u32,
    /// The credits it returned (spent with it).
    returned: u16,
    /// Its wr_id.
    wr_id: u64,
    /// Its QP slot.
    slot: u32,
}

/// Whether a message posted now must ask for a completion, the one rule
/// for every post that may go unsignalled. It must when a cover is wanted
/// (`cover`), when the QP's run of unsignalled posts (`unsignalled`) would
/// reach [`SIGNAL_EVERY`] or half its send queue (`max_send_wr`), when
/// bounce slots are not plenty (`bounce_plenty`), or when the outstanding
/// work (`outstanding`) has reached half the send CQ's budget (`budget`):
/// unsignalled work holds its send queue slots, bounce slots and CQ budget
/// until a later completion retires it.
#[inline(always)]
pub(crate) fn must_signal(
    cover: bool,
    unsignalled: u32,
    max_send_wr: u32,
    bounce_plenty: bool,
    outstanding: usize,
    budget: usize,
) -> bool {
    let every = SIGNAL_EVERY.min(max_send_wr as usize / 2);
    cover || unsignalled as usize + 1 >= every || !bounce_plenty || outstanding >= budget / 2
}

/// The send side of one QP slot of the driver.
///
/// The send log: every message posted on the QP and not known complete
/// waits here, in posting order, with its body (what a resend sends). A
/// QP completes its work in order, so a completion retires the log's front
/// up to and including its own message, and any completion on the QP
/// (a read's, a write's) retires what was posted before it. A destroyed
/// QP's log is taken out whole, to post again; the slot's generation then
/// changes, so that the QP's late completions retire nothing.
///
/// Where credits flow (iWARP), a completion says only that a message left:
/// a connection that breaks may still lose it. Its completion moves a
/// second index instead (`left`): the message stops counting as posted
/// work but stays in the log, body and all, until the peer's returned
/// credits, counted in `arrived`, show it arrived. The peer returns one
/// credit per message it received, and the connection delivers in order,
/// so `n` credits back on a QP mean its next `n` messages arrived
/// (credit-only messages hold their places). Credits often come back
/// before an unsignalled message's completion is seen: `arrived` may run
/// ahead of `left`, and a message retires once both have passed it. A
/// broken connection's log, taken out whole, thus holds every message that
/// may not have arrived, in order, to send again.
///
/// Selective signalling: small inline messages (the latency path) are
/// posted unsignalled, up to [`SIGNAL_EVERY`] in a row, while bounce slots
/// are plentiful; the next signalled completion on the QP retires them. A
/// failed unsignalled request still reports itself (errors always
/// complete). When someone waits for everything to complete
/// ([`SendQueues::ask_cover`]) and a QP has nothing signalled behind its
/// unsignalled work, progress queues a signalled credit-only message (a
/// cover) on it.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    /// Work requests posted and not known complete.
    pub used: u32,
    /// Requests posted on this QP so far (the next one's number).
    pub posts: u64,
    /// Number of the last signalled request.
    pub last_signalled: u64,
    /// Messages posted and not known complete, in posting order.
    log: Ring<PostedWr>,
    /// How many of them went unsignalled.
    unsignalled: u32,
    /// The generation of the slot's QP, in its messages' wr_ids.
    gen: u8,
    /// The wr_id of this slot's message number 0 in generation `gen`
    /// ([`WrId::log`]): a message's is this with its number in the low
    /// bits. Set when the slot's QP comes up and when it goes.
    id_base: u64,
    /// A message was logged since the logs were last trimmed.
    busy: bool,
    /// Where credits flow: how many messages at the log's front have left
    /// (completed) and wait for their arrival.
    left: u32,
    /// Where credits flow: how many messages at the log's front the peer's
    /// credits show arrived (possibly more than have left).
    arrived: u64,
    /// A cover is queued and not yet posted.
    pub cover_queued: bool,
    /// In [`SendQueues::uncovered`].
    listed: bool,
}

/// Work posted and not completed.
#[derive(Debug)]
pub(crate) struct PostedWr {
    /// Its endpoint.
    pub ep: u32,
    /// The driver's slot of the QP it went on.
    pub qp: u32,
    /// Its number among the requests posted on that QP.
    pub no: u64,
    /// Whether it reports its success.
    pub signalled: bool,
    /// It completed, and waits in its log for its arrival (credits flow):
    /// it no longer counts as posted work.
    pub left: bool,
    /// The work.
    pub item: Item,
}

// Moves of a posted request stay inline (see `SMALL_BODY`).
const _: () = assert!(std::mem::size_of::<PostedWr>() <= 128);

/// A log's free places hold a short message: what the latency path writes
/// over, field by field ([`SendQueues::send_small`]).
impl Spare for PostedWr {
    fn spare() -> PostedWr {
        PostedWr {
            ep: 0,
            qp: 0,
            no: 0,
            signalled: false,
            left: false,
            item: Item {
                order: 0,
                tries: 0,
                work: Work::Msg(Msg {
                    seq: 0,
                    kind: Kind::Eager,
                    tag: 0,
                    len: 0,
                    store: Store::Small {
                        len: 0,
                        bytes: [0; SMALL_BODY],
                    },
                }),
            },
        }
    }

    /// A short message holds nothing to free.
    fn is_spare(&self) -> bool {
        matches!(
            &self.item.work,
            Work::Msg(Msg {
                store: Store::Small { .. },
                ..
            })
        )
    }
}

/// The posted-work state of a BTL: every request posted and not known
/// complete, the send side of each QP, and the round robin of endpoints
/// with queued work. It turns work into posted requests and gives back
/// what completed; what a completion means (a message kept until its
/// credits come back, work requeued or dropped, an endpoint failed) is for
/// the core to judge.
#[derive(Debug)]
pub(crate) struct SendQueues {
    /// Work posted and not completed that is not in a send log, by its
    /// wr_id's index.
    slab: WrSlab<PostedWr>,
    /// Messages in the send logs, less those that left.
    logged: usize,
    /// Messages that left and wait in the logs for their arrival.
    waiting: usize,
    /// The slots whose logs hold memory, to give back once they are empty.
    held: Vec<u32>,
    /// The slots that posted unsignalled work since they were last found
    /// with none out: what a cover pass looks at, rather than every QP
    /// (one per peer under RC).
    uncovered: Vec<u32>,
    /// The send side of each QP slot of the driver.
    sq: Vec<SendQueue>,
    /// Signalled work requests posted and not completed: the send CQ is
    /// polled only while there are some (and on control ticks).
    signalled_out: usize,
    /// Messages the latency path posted ([`SendQueues::send_small`]), and
    /// how many of them signalled: counted here, once each, and folded into
    /// the stats' eager, inline and unsignalled counts when they are read
    /// ([`SendQueues::small_posts`]).
    small_posted: u64,
    small_signalled: u64,
    /// Someone waits for everything to complete: unsignalled work must be
    /// followed by a signalled message on its QP.
    want_cover: bool,
    /// Where inline messages are gathered.
    inline: Box<[u8; INLINE_MAX]>,
    /// The endpoints a drain pass found blocked, then served (kept to
    /// reuse their memory).
    ring_blocked: VecDeque<u32>,
    ring_served: VecDeque<u32>,
    /// Where the send CQ is polled into (lent out while the core judges
    /// what it found).
    batch: Option<Batch<WorkCompletion>>,
    /// Entries ever put in the slab.
    records: u64,
}

/// [`SendQueue::id_base`] of slot `slot` in generation `gen`; 0 for a
/// slot past [`LOG_SLOTS`], which logs nothing.
fn log_base(slot: u32, gen: u8) -> u64 {
    if slot < LOG_SLOTS {
        WrId::log(slot, gen, 0)
    } else {
        0
    }
}

/// Whether the completion of the request numbered `no` (modulo 2^32) on
/// a QP completes `p`, posted on it: `p` is that request, or came before it
/// (numbers compared across their wrap).
fn completed_by(p: &PostedWr, no: u32) -> bool {
    no.wrapping_sub(p.no as u32) as i32 >= 0
}

/// Whether `p` is a message whose body is kept in memory (short, or on
/// the heap): once over, it needs nothing more done.
fn in_memory(p: &PostedWr) -> bool {
    matches!(
        &p.item.work,
        Work::Msg(Msg {
            store: Store::Small { .. } | Store::Heap(_),
            ..
        })
    )
}

/// `n` requests of endpoint `ei` are over: with none left in flight, it
/// may take another path, and its queue is served.
fn landed(eps: &mut Endpoints, ei: u32, n: u32) {
    let ep = eps.get_mut(ei);
    ep.in_flight = ep.in_flight.saturating_sub(n);
    if ep.in_flight == 0 {
        ep.flight_slot = None;
        eps.mark_ready(ei);
    }
}

/// Requests over on one QP, landed by endpoint: consecutive ones of one
/// endpoint land together.
#[derive(Default)]
struct Landing(Option<(u32, u32)>);

impl Landing {
    /// One more request of endpoint `ei` is over.
    fn add(&mut self, eps: &mut Endpoints, ei: u32) {
        match &mut self.0 {
            Some((ep, n)) if *ep == ei => *n += 1,
            _ => {
                self.finish(eps);
                self.0 = Some((ei, 1));
            }
        }
    }

    /// Lands the last run.
    fn finish(&mut self, eps: &mut Endpoints) {
        if let Some((ep, n)) = self.0.take() {
            landed(eps, ep, n);
        }
    }
}

/// What the send queues work through, lent by the core for one call: the
/// endpoints and their queues, the device's bounce slots and QPs, the
/// rendezvous (a write posted, a FIN that must resume), and the counters.
pub(crate) struct SendView<'a, C: Context> {
    pub cfg: &'a BtlConfig,
    pub iface: &'a mut Iface<C>,
    pub drv: &'a mut ConnDriver<C>,
    pub eps: &'a mut Endpoints,
    pub rndv: &'a mut Rndv<Source, Sink>,
    pub stats: &'a mut BtlStats,
    /// Credit flow control: the device has no RNR (iWARP).
    pub fc: bool,
}

impl<C: Context> SendView<'_, C> {
    /// A fresh view over the same borrows, for a cold path that takes the
    /// view by reference. Handing over the caller's own view would take its
    /// address, and the compiler then stores the whole view on the stack
    /// before the hot path's first test; a view lent anew is built only
    /// where the cold path runs.
    #[cold]
    fn relend(&mut self) -> SendView<'_, C> {
        SendView {
            cfg: self.cfg,
            iface: &mut *self.iface,
            drv: &mut *self.drv,
            eps: &mut *self.eps,
            rndv: &mut *self.rndv,
            stats: &mut *self.stats,
            fc: self.fc,
        }
    }
}

impl SendQueue {
    /// Counts request `no`, which it took: its send queue, and its last
    /// signalled request or its run of unsignalled ones. An unsignalled
    /// one lists the QP, in slot `slot`, in `uncovered` (once).
    #[inline(always)]
    fn count_post(&mut self, no: u64, signalled: bool, slot: u32, uncovered: &mut Vec<u32>) {
        self.used += 1;
        self.posts += 1;
        if signalled {
            self.last_signalled = no;
        } else {
            self.unsignalled += 1;
            if !self.listed {
                self.listed = true;
                uncovered.push(slot);
            }
        }
    }

    /// Logs a short eager message of endpoint `ei` (header `seq` and
    /// `tag`, `len` bytes of `body`) as it is posted on this QP, in slot
    /// `slot`: written field by field in the log's next place, which most
    /// often holds a short message already, so that only its body is
    /// copied, at a fixed length. Returns its wr_id and its number. The
    /// caller counts it logged.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn log_small(
        &mut self,
        slot: u32,
        ei: u32,
        signalled: bool,
        order: u64,
        seq: u32,
        tag: Tag,
        len: usize,
        body: &[u8; SMALL_BODY],
    ) -> (u64, u64) {
        let no = self.posts;
        let id = self.id_base | u64::from(no as u32);
        debug_assert_eq!(id, WrId::log(slot, self.gen, no));
        self.busy = true;
        let e = self.log.push_place();
        (e.ep, e.qp, e.no, e.signalled, e.left) = (ei, slot, no, signalled, false);
        (e.item.order, e.item.tries) = (order, 0);
        match &mut e.item.work {
            Work::Msg(Msg {
                seq: s,
                kind,
                tag: t,
                len: l,
                store: Store::Small { len: n, bytes },
            }) => {
                (*s, *kind, *t, *l, *n) = (seq, Kind::Eager, tag, len as u32, len as u8);
                bytes.copy_from_slice(body);
            }
            w => {
                *w = Work::Msg(Msg {
                    seq,
                    kind: Kind::Eager,
                    tag,
                    len: len as u32,
                    store: Store::Small {
                        len: len as u8,
                        bytes: *body,
                    },
                })
            }
        }
        (id, no)
    }
}

impl SendQueues {
    /// Empty send queues, polling `cq_batch` completions at a time.
    pub fn new(cq_batch: usize) -> Self {
        SendQueues {
            slab: WrSlab::new(),
            logged: 0,
            waiting: 0,
            held: Vec::new(),
            uncovered: Vec::new(),
            sq: Vec::new(),
            signalled_out: 0,
            small_posted: 0,
            small_signalled: 0,
            want_cover: false,
            inline: Box::new([0; INLINE_MAX]),
            ring_blocked: VecDeque::new(),
            ring_served: VecDeque::new(),
            batch: Some(Batch::new(cq_batch)),
            records: 0,
        }
    }

    /// The batch the send CQ is polled into, lent until
    /// [`SendQueues::put_batch`].
    pub fn take_batch(&mut self) -> Batch<WorkCompletion> {
        self.batch.take().expect("one poll at a time")
    }

    /// Gives the batch back.
    pub fn put_batch(&mut self, batch: Batch<WorkCompletion>) {
        self.batch = Some(batch);
    }

    /// Work requests posted and not known complete.
    pub fn len(&self) -> usize {
        self.slab.len() + self.logged
    }

    /// Posted work requests ever recorded in the slab.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Whether no work request is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Signalled work requests outstanding: while there are none, the
    /// send CQ has nothing for this rank but on control ticks.
    pub fn signalled_out(&self) -> usize {
        self.signalled_out
    }

    /// The messages the latency path posted, and how many of them
    /// signalled: each is an eager message sent inline, and the rest
    /// went unsignalled.
    pub fn small_posts(&self) -> (u64, u64) {
        (self.small_posted, self.small_signalled)
    }

    /// Whether someone waits for the unsignalled work to complete.
    pub fn wants_cover(&self) -> bool {
        self.want_cover
    }

    /// A QP came up in driver slot `slot`: it gets a send side.
    pub fn slot_ready(&mut self, slot: u32) {
        if self.sq.len() <= slot as usize {
            self.sq.resize_with(slot as usize + 1, SendQueue::default);
        }
        let q = &mut self.sq[slot as usize];
        q.id_base = log_base(slot, q.gen);
    }

    /// The QP in `slot` was destroyed: nothing is outstanding on it any
    /// more (its work is taken out with [`SendQueues::take`]), and its late
    /// completions find nothing of the next QP in the slot.
    pub fn slot_destroyed(&mut self, slot: u32) {
        if let Some(q) = self.sq.get_mut(slot as usize) {
            q.used = 0;
            q.cover_queued = false;
            q.gen = q.gen.wrapping_add(1);
            q.id_base = log_base(slot, q.gen);
            // Credits the peer returned ahead of completions belong to
            // the connection that went.
            q.arrived = 0;
        }
    }

    /// Takes out the posted work `pick` chooses, as if it had completed
    /// (it never will: its QP or its endpoint is gone), for the core to
    /// post again or drop. Messages are looked for only in the log of QP
    /// slot `at`, where they must be if anywhere.
    pub fn take(
        &mut self,
        eps: &mut Endpoints,
        at: Option<u32>,
        mut pick: impl FnMut(&PostedWr) -> bool,
    ) -> Vec<PostedWr> {
        let mut taken: Vec<PostedWr> = self
            .slab
            .extract(&mut pick)
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        if let Some(q) = at.and_then(|slot| self.sq.get_mut(slot as usize)) {
            let mut i = 0;
            while i < q.log.len() {
                if pick(&q.log[i]) {
                    let p = q.log.remove(i).expect("in the log");
                    // The indices count from the front: one place less.
                    if (i as u64) < q.arrived {
                        q.arrived -= 1;
                    }
                    if p.left {
                        q.left -= 1;
                        self.waiting -= 1;
                    } else {
                        self.logged -= 1;
                        if !p.signalled {
                            q.unsignalled -= 1;
                        }
                    }
                    taken.push(p);
                } else {
                    i += 1;
                }
            }
        }
        for p in &taken {
            // A message that left was counted out then.
            if p.left {
                continue;
            }
            if p.signalled {
                self.signalled_out -= 1;
            }
            self.release(eps, p);
        }
        taken
    }

    /// Where credits flow: the messages of QP slot `slot`'s log (in
    /// generation `gen`) that a successful completion of its post `no`
    /// (modulo 2^32) completes and that had not left yet have left: they
    /// stop counting as posted work (their endpoints' flight, the send
    /// queue, the signalled work) and stay in the log until
    /// [`SendQueues::pop_arrived`] finds them arrived. `spare` sees each
    /// (it may move a body out of its bounce slot). Returns how many left.
    pub fn leave(
        &mut self,
        eps: &mut Endpoints,
        slot: u32,
        gen: u8,
        no: u32,
        mut spare: impl FnMut(&mut Item),
    ) -> usize {
        let k = self.complete_run(eps, slot, gen, no, |p| {
            p.left = true;
            spare(&mut p.item);
            true
        });
        if k > 0 {
            self.sq[slot as usize].left += k as u32;
            self.waiting += k;
        }
        k
    }

    /// The run of QP slot `slot`'s log (in generation `gen`), from its
    /// first message that has not left, that a successful completion of
    /// post `no` (modulo 2^32) completes, as far as `each` accepts its
    /// messages: they stop counting as posted work (their endpoints'
    /// flight, the send queue, the signalled and unsignalled work). They
    /// stay in the log, for the caller. Returns how many.
    fn complete_run(
        &mut self,
        eps: &mut Endpoints,
        slot: u32,
        gen: u8,
        no: u32,
        mut each: impl FnMut(&mut PostedWr) -> bool,
    ) -> usize {
        let Some(q) = self.sq.get_mut(slot as usize) else {
            return 0;
        };
        if q.gen != gen {
            return 0;
        }
        let (mut k, mut signalled) = (0, 0);
        let mut landing = Landing::default();
        let (a, b) = q.log.runs_mut(q.left as usize..q.log.len());
        'runs: for run in [a, b] {
            for p in run {
                if !completed_by(p, no) || !each(p) {
                    break 'runs;
                }
                k += 1;
                signalled += usize::from(p.signalled);
                landing.add(eps, p.ep);
            }
        }
        landing.finish(eps);
        q.used = q.used.saturating_sub(k as u32);
        q.unsignalled -= (k - signalled) as u32;
        self.signalled_out -= signalled;
        self.logged -= k;
        k
    }

    /// The generation of the QP in slot `slot`, for [`SendQueues::leave`].
    pub fn gen_of(&self, slot: u32) -> u8 {
        self.sq.get(slot as usize).map_or(0, |q| q.gen)
    }

    /// Where credits flow: the message whose post `no` (modulo 2^32) in
    /// generation `gen` failed on QP slot `slot`, taken out of the log
    /// (those before it have left: [`SendQueues::leave`] first).
    pub fn pop_failed(
        &mut self,
        eps: &mut Endpoints,
        slot: u32,
        gen: u8,
        no: u32,
    ) -> Option<PostedWr> {
        let q = self.sq.get_mut(slot as usize)?;
        let at = q.left as usize;
        if q.gen != gen || q.log.get(at)?.no as u32 != no {
            return None;
        }
        self.unlog(eps, slot, at)
    }

    /// Where credits flow: the peer's credits show that `n` more of the
    /// messages posted on QP slot `slot` arrived ([`SendQueues::pop_arrived`]
    /// then retires those that have also left). Returns whether some have
    /// now both left and arrived.
    #[inline]
    pub fn arrive(&mut self, slot: u32, n: u64) -> bool {
        let Some(q) = self.sq.get_mut(slot as usize) else {
            return false;
        };
        q.arrived += n;
        q.arrived.min(u64::from(q.left)) != 0
    }

    /// Retires, from the front of QP slot `slot`'s log, the messages that
    /// have left and arrived: those whose body is in memory (short, or on
    /// the heap) at once, and returns the first that needs more done (its
    /// bounce slot given back, its user buffer let go), or `None` when no
    /// more are over.
    ///
    /// The look is inlined: most calls (credits back for a message whose
    /// completion, unsignalled, is not seen yet) find nothing over.
    #[inline]
    pub fn pop_arrived(&mut self, slot: u32) -> Option<PostedWr> {
        let q = self.sq.get(slot as usize)?;
        if q.arrived.min(u64::from(q.left)) == 0 {
            return None;
        }
        self.pop_over(slot)
    }

    /// [`SendQueues::pop_arrived`] once some messages are over.
    #[inline(never)]
    fn pop_over(&mut self, slot: u32) -> Option<PostedWr> {
        let q = &mut self.sq[slot as usize];
        let over = q.arrived.min(u64::from(q.left)) as usize;
        // Those in memory go in one walk, without a move each.
        let k = q.log.retire_front_while(over, in_memory);
        let p = if k < over { q.log.pop_front() } else { None };
        let n = k + usize::from(p.is_some());
        q.left -= n as u32;
        q.arrived -= n as u64;
        self.waiting -= n;
        p
    }

    /// Messages that left and wait for their arrival, in every log.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Where request `id` of the slab, whose completion came, went: its QP
    /// slot and its number there. `None` if it is no longer outstanding.
    pub fn find(&self, id: u64) -> Option<(u32, u64)> {
        self.slab.get(id).map(|p| (p.qp, p.no))
    }

    /// The oldest message in QP slot `qp`'s log if it was posted before
    /// request number `no`, which a later completion there completed (a
    /// QP completes its work in order).
    #[inline]
    pub fn pop_logged_before(&mut self, eps: &mut Endpoints, qp: u32, no: u64) -> Option<PostedWr> {
        let q = self.sq.get_mut(qp as usize)?;
        if q.log.front()?.no >= no {
            return None;
        }
        self.pop_logged(eps, qp)
    }

    /// The oldest message in QP slot `slot`'s log if the completion of its
    /// message numbered `no` (modulo 2^32) in generation `gen` completes
    /// it: it is that message, or was posted before it.
    #[inline]
    pub fn pop_logged_until(
        &mut self,
        eps: &mut Endpoints,
        slot: u32,
        gen: u8,
        no: u32,
    ) -> Option<PostedWr> {
        let q = self.sq.get_mut(slot as usize)?;
        if q.gen != gen || !completed_by(q.log.front()?, no) {
            return None;
        }
        self.pop_logged(eps, slot)
    }

    /// Retires at once, from the front of QP slot `slot`'s log, the
    /// messages that a successful completion of its post `no` (modulo
    /// 2^32) in generation `gen` completes and that need nothing done once
    /// they have left: their body kept in memory (short, or on the heap),
    /// where credits do not keep sent messages (the caller's to know).
    /// The log's front moves by their number, and their endpoints' flight
    /// by theirs; the first one that needs more stops it, for
    /// [`SendQueues::pop_logged_until`]. Returns how many it retired.
    pub fn retire_left(&mut self, eps: &mut Endpoints, slot: u32, gen: u8, no: u32) -> usize {
        // Without credits nothing waits at the front: the run starts there.
        // One walk: a body on the heap is let go as the run passes it, so
        // that the front then moves over values that hold nothing.
        let k = self.complete_run(eps, slot, gen, no, |p| match &mut p.item.work {
            Work::Msg(Msg {
                store: Store::Small { .. },
                ..
            }) => true,
            Work::Msg(Msg { store, .. }) if matches!(store, Store::Heap(_)) => {
                *store = Store::Small {
                    len: 0,
                    bytes: [0; SMALL_BODY],
                };
                true
            }
            _ => false,
        });
        if k > 0 {
            self.sq[slot as usize].log.skip_front(k);
        }
        k
    }

    /// Retires the oldest message of QP slot `slot`'s log (where credits do
    /// not flow: none has left).
    fn pop_logged(&mut self, eps: &mut Endpoints, slot: u32) -> Option<PostedWr> {
        self.unlog(eps, slot, 0)
    }

    /// Takes the message at index `at` of QP slot `slot`'s log, which has
    /// not left, out of it and of the posted work.
    fn unlog(&mut self, eps: &mut Endpoints, slot: u32, at: usize) -> Option<PostedWr> {
        let q = &mut self.sq[slot as usize];
        let p = q.log.remove(at)?;
        debug_assert!(!p.left, "a message that left is not posted work");
        // The arrivals count from the front: one place less.
        if (at as u64) < q.arrived {
            q.arrived -= 1;
        }
        if p.signalled {
            self.signalled_out -= 1;
        } else {
            q.unsignalled -= 1;
        }
        self.logged -= 1;
        self.release(eps, &p);
        Some(p)
    }

    /// Request `id` of the slab completed (a success, or a failure): it is
    /// no longer outstanding.
    pub fn complete(&mut self, eps: &mut Endpoints, id: u64) -> Option<PostedWr> {
        let p = self.slab.remove(id)?;
        if p.signalled {
            self.signalled_out -= 1;
        }
        self.release(eps, &p);
        Some(p)
    }

    /// Gives back the memory of the send logs that are empty and took
    /// nothing since the last call (made every few seconds): a QP idle
    /// that long holds none, and a busy one keeps its log between messages.
    pub fn trim_logs(&mut self) {
        let sq = &mut self.sq;
        self.held.retain(|&slot| {
            let q = &mut sq[slot as usize];
            if q.log.is_empty() && !q.busy {
                q.log = Ring::new();
                false
            } else {
                q.busy = false;
                true
            }
        });
    }

    /// Pushes message `p` into the log of its QP, whose slot is below
    /// [`LOG_SLOTS`]; returns its wr_id.
    #[inline(always)]
    fn push_log(&mut self, p: PostedWr) -> u64 {
        let slot = p.qp;
        let q = &mut self.sq[slot as usize];
        let id = WrId::log(slot, q.gen, p.no);
        q.busy = true;
        q.log.push_back(p);
        self.logged += 1;
        id
    }

    /// Keeps posted work until it completes: in its QP's log if it is a
    /// message (and the slot has one), else in the slab. Returns its wr_id.
    fn record(&mut self, p: PostedWr) -> u64 {
        let slot = p.qp;
        if matches!(p.item.work, Work::Msg(_)) && slot < LOG_SLOTS {
            if self.sq[slot as usize].log.capacity() == 0 {
                self.held.push(slot);
            }
            self.push_log(p)
        } else {
            self.records += 1;
            WrId::send(self.slab.insert(p))
        }
    }

    /// Takes back the record of request `wr_id`, just made: its QP refused
    /// it.
    fn unrecord(&mut self, wr_id: u64) -> PostedWr {
        match WrId::of(wr_id) {
            WrId::Log { slot, .. } => {
                self.logged -= 1;
                self.sq[slot as usize].log.pop_back().expect("just logged")
            }
            _ => self.slab.remove(wr_id).expect("just recorded"),
        }
    }

    /// Undoes the accounting of posted work that is over.
    fn release(&mut self, eps: &mut Endpoints, p: &PostedWr) {
        if let Some(q) = self.sq.get_mut(p.qp as usize) {
            q.used = q.used.saturating_sub(1);
        }
        landed(eps, p.ep, 1);
    }

    /// Asks that all unsignalled work complete: covers are queued now,
    /// and unsignalled posting stops until everything has completed.
    /// Returns whether there was unsignalled work to cover (covers may
    /// wait to be posted).
    pub fn ask_cover(&mut self, eps: &mut Endpoints) -> bool {
        if self.len() == self.signalled_out {
            return false;
        }
        self.want_cover = true;
        self.cover_unsignalled(eps);
        true
    }

    /// Queues a signalled message behind the unsignalled work of every QP
    /// that has nothing signalled after it, so that all of it completes.
    pub fn cover_unsignalled(&mut self, eps: &mut Endpoints) {
        let mut any = false;
        let mut i = 0;
        while let Some(&slot) = self.uncovered.get(i) {
            let q = &mut self.sq[slot as usize];
            // Messages that left need no cover.
            let out = q.log.range(q.left as usize..q.log.len());
            let Some(last) = out.rev().find(|p| !p.signalled) else {
                q.cover_queued = false;
                q.listed = false;
                self.uncovered.swap_remove(i);
                continue;
            };
            i += 1;
            any = true;
            if q.cover_queued || q.last_signalled > last.no {
                continue;
            }
            q.cover_queued = true;
            eps.requeue(last.ep, Item::cover());
        }
        self.want_cover = any;
    }

    /// Posts `item` to endpoint `ei` if it can go now; gives it back if it
    /// must wait. An endpoint without a path is connected (on demand).
    // The item comes back by value to wait in its queue: moving its 104
    // bytes costs less than the allocation boxing it would take per message.
    #[allow(clippy::result_large_err)]
    pub(crate) fn post<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        ei: u32,
        mut item: Item,
    ) -> Result<(), Item> {
        let ep = v.eps.get_mut(ei);
        let Some(path) = ep.path.as_ref() else {
            if !ep.connecting {
                ep.connecting = true;
                let (now, rank) = (v.cfg.clock.now(), ep.rank);
                v.drv.connect(now, rank);
            }
            return Err(item);
        };
        let (slot, qpn) = (path.slot, path.qpn);
        if ep.in_flight > 0 && ep.flight_slot != Some(slot) {
            // Work is still out on the old path: nothing may overtake it.
            return Err(item);
        }
        let Some((qp, caps)) = v.drv.qp(slot) else {
            return Err(item);
        };
        if self.sq[slot as usize].used >= caps.max_send_wr {
            v.stats.no_resource += 1;
            return Err(item);
        }
        // Signalled requests complete on the one send CQ that all QPs
        // share: past its capacity the CQ overruns and takes every QP down
        // with it. The work waits in the pending queue. (Counted over all
        // posted work: an unsignalled request still completes with an error.)
        if self.len() >= v.iface.send_budget as usize {
            v.stats.cq_full += 1;
            return Err(item);
        }
        let mut sgl = [Sge::default(); 2];
        let mut sges = 1;
        let mut inline_len = 0;
        let mut returned = 0u16;
        let (op, srqn) = match &mut item.work {
            Work::Msg(m) => {
                let credit = m.kind == Kind::Credit;
                if v.fc {
                    let cr = ep.credits.of(qpn, v.cfg.credits);
                    if credit && cr.to_return == 0 && !m.is_cover() {
                        // A message already carried them: nothing to send.
                        cr.returning = false;
                        if let Store::Slot(s) = m.store {
                            v.iface.bounce.give(s);
                        }
                        return Ok(());
                    }
                    let need = if credit { RETURN_CREDITS } else { MSG_CREDITS };
                    match cr.offer(need) {
                        Some(r) => returned = r,
                        None => {
                            v.stats.credit_stalls += 1;
                            return Err(item);
                        }
                    }
                }
                let total = HEADER + m.len as usize;
                let mut hdr = [0u8; HEADER];
                Header {
                    src: v.cfg.rank,
                    seq: m.seq,
                    kind: m.kind,
                    // A credit message's tag only marks a cover, locally.
                    tag: if credit { 0 } else { m.tag },
                    credits: returned,
                    len: m.len,
                }
                .encode(&mut hdr);
                if m.kind == Kind::Fin && m.len as usize == 8 {
                    // Decided as it goes (Rndv::fin_posted): a put some of
                    // whose writes went on another connection asks for its
                    // RTR again.
                    let mut body = [0u8; 8];
                    m.store.copy_to(&v.iface.bounce, &mut body);
                    if let Some(marked) = v.rndv.fin_posted(body, qpn) {
                        match &mut m.store {
                            Store::Slot(s) => v.iface.bounce.write(*s, HEADER, &marked),
                            store => *store = Store::Heap(marked.to_vec()),
                        }
                    }
                }
                if total <= caps.max_inline as usize && total <= INLINE_MAX {
                    // Gathered in the core's scratch: a body kept on the
                    // heap needs no slot.
                    let inline = &mut self.inline[..total];
                    inline[..HEADER].copy_from_slice(&hdr);
                    m.store.copy_to(&v.iface.bounce, &mut inline[HEADER..]);
                    inline_len = total;
                } else {
                    let s = match &mut m.store {
                        Store::Slot(s) | Store::User { slot: Some(s), .. } => *s,
                        Store::Heap(_) | Store::Small { .. } | Store::User { slot: None, .. } => {
                            // The last slots are kept for credit messages,
                            // which must always be able to go. With none
                            // free, a message queued behind this one gives
                            // up its slot (or they would wait for each
                            // other forever).
                            let s = match v.iface.bounce.take_for(credit) {
                                Some(s) => s,
                                None => match steal_slot(&mut ep.pending, &v.iface.bounce) {
                                    Some(s) => s,
                                    None => {
                                        v.stats.no_resource += 1;
                                        return Err(item);
                                    }
                                },
                            };
                            match &mut m.store {
                                Store::User { slot, .. } => *slot = Some(s),
                                store => {
                                    if let Some(body) = store.bytes() {
                                        v.iface.bounce.write(s, HEADER, body);
                                    }
                                    *store = Store::Slot(s);
                                }
                            }
                            s
                        }
                    };
                    v.iface.bounce.write(s, 0, &hdr);
                    match &m.store {
                        Store::User { data, .. } if caps.max_send_sge < 2 => {
                            // The QP gathers nothing: copy after all.
                            v.iface.bounce.write(s, HEADER, data);
                            sgl[0] = v.iface.bounce.sge(s, total as u32);
                        }
                        Store::User { data, reg, .. } => {
                            // Header from the slot, body from where it is.
                            sgl[0] = v.iface.bounce.sge(s, HEADER as u32);
                            sgl[1] = Sge {
                                addr: data.as_ptr() as u64,
                                length: data.len() as u32,
                                lkey: reg.lkey(),
                            };
                            sges = 2;
                        }
                        _ => sgl[0] = v.iface.bounce.sge(s, total as u32),
                    }
                }
                let class = v.iface.class_for(total);
                (SendOp::Send, path.srqns.get(class).copied())
            }
            Work::Rdma(r) => {
                sgl[0] = r.sge(|| v.iface.fence_sink.as_ref().map(|b| b.sge(0, 1)));
                (r.send_op(), path.srqns.first().copied())
            }
        };
        let first_eager =
            item.tries == 0 && matches!(&item.work, Work::Msg(m) if m.kind == Kind::Eager);
        let rndv_write = match &item.work {
            Work::Rdma(Rdma {
                op: RdmaOp::Write,
                owner: Owner::RndvOut { msg },
                ..
            }) => Some(*msg),
            _ => None,
        };
        let credit = item.is_credit();
        let cover = matches!(&item.work, Work::Msg(m) if m.is_cover());
        let is_msg = matches!(item.work, Work::Msg(_));
        let signalled =
            !(is_msg && inline_len > 0 && !cover && self.may_skip_signal(v.iface, slot, caps));
        let no = self.sq[slot as usize].posts;
        let wr_id = self.record(PostedWr {
            ep: ei,
            qp: slot,
            no,
            signalled,
            left: false,
            item,
        });
        let payload = if inline_len > 0 {
            Payload::Inline(&self.inline[..inline_len])
        } else {
            Payload::Sgl(&sgl[..sges])
        };
        let mut wr = SendWr::new(wr_id, op, payload);
        wr.remote_srqn = srqn;
        if !signalled {
            wr = wr.unsignaled();
        }
        match qp.post_send(&wr) {
            Ok(()) => {
                if cover {
                    self.sq[slot as usize].cover_queued = false;
                    v.stats.covers += 1;
                }
                self.posted(v, ei, slot, no, signalled);
                if v.fc && is_msg {
                    let cr = v.eps.get_mut(ei).credits.of(qpn, v.cfg.credits);
                    cr.spend(returned);
                    if credit {
                        cr.returning = false;
                        v.stats.credits_returned += 1;
                    }
                }
                if first_eager && inline_len > 0 {
                    v.stats.inline_sent += 1;
                }
                if let Some(msg) = rndv_write {
                    v.rndv.write_posted(msg, qpn);
                }
                Ok(())
            }
            Err(e) => Err(self.refused(v, wr_id, slot, e)),
        }
    }

    /// The QP in `slot` refused request `wr_id` with `e`: its record is
    /// taken back (from its log or the slab) and its work returned; a QP
    /// that refused for any reason but a full queue is unusable, and the
    /// manager rebuilds the path.
    #[cold]
    fn refused<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        wr_id: u64,
        slot: u32,
        e: Error,
    ) -> Item {
        let p = self.unrecord(wr_id);
        v.stats.no_resource += 1;
        if !matches!(e, Error::NoResource(_)) {
            let now = v.cfg.clock.now();
            v.drv.handle_send_failure(now, slot);
        }
        p.item
    }

    /// Whether an inline message posted now on QP slot `slot` may go
    /// unsignalled, by [`must_signal`]'s rule; a slot past [`LOG_SLOTS`]
    /// keeps no log, so each of its messages is signalled.
    #[inline(always)]
    fn may_skip_signal<C: Context>(&self, iface: &Iface<C>, slot: u32, caps: QpCaps) -> bool {
        slot < LOG_SLOTS
            && !must_signal(
                self.want_cover,
                self.sq[slot as usize].unsignalled,
                caps.max_send_wr,
                iface.bounce.plenty(),
                self.len(),
                iface.send_budget as usize,
            )
    }

    /// Counts a request the QP in `slot` took: its send queue, the
    /// signalled work or the QP's unsignalled messages, and its endpoint's
    /// flight.
    fn posted<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        ei: u32,
        slot: u32,
        no: u64,
        signalled: bool,
    ) {
        if !signalled {
            v.stats.unsignalled += 1;
        }
        self.count_posted(v.eps, ei, slot, no, signalled);
    }

    /// [`SendQueues::posted`]'s accounting, without the counters.
    #[inline(always)]
    fn count_posted(&mut self, eps: &mut Endpoints, ei: u32, slot: u32, no: u64, signalled: bool) {
        self.sq[slot as usize].count_post(no, signalled, slot, &mut self.uncovered);
        self.signalled_out += usize::from(signalled);
        let ep = eps.get_mut(ei);
        ep.in_flight += 1;
        ep.flight_slot = Some(slot);
    }

    /// The latency path of an eager send: a message whose header and body
    /// fit the configured and the QP's inline limits and a [`Store::Small`]
    /// ([`Iface::small_limit`]), to an open
    /// endpoint with a path and nothing queued, is numbered, gathered and posted
    /// here at once, without the general path's steps for bounce slots,
    /// queued work and rendezvous control ([`SendQueues::post`] does the same
    /// for it, slower). Returns `None`, having changed nothing, when
    /// anything stands in the way (not open, no path, work on an older path or
    /// queued, a full send queue or CQ budget, no credits or none yet on
    /// this connection, too long, short
    /// messages in more than one receive class, a QP slot past
    /// [`LOG_SLOTS`]): the caller then takes the general path, which
    /// decides what waits.
    /// Otherwise returns `Some` of what became of it ([`Small`]).
    #[inline(always)]
    pub(crate) fn send_small<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        ei: u32,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> Option<Small> {
        let len = parts[0].len() + parts[1].len();
        let total = HEADER + len;
        if len >= v.iface.small_limit {
            return None;
        }
        // The body gathered first, where it goes inline (the scratch is
        // ours, and a message that turns back leaves nothing of it there
        // that counts): `parts` are not kept through the looks below. The
        // copy kept for a resend is taken from there at a fixed length.
        let body = &mut self.inline[HEADER..HEADER + SMALL_BODY];
        copy_short(&mut body[..parts[0].len()], parts[0]);
        copy_short(&mut body[parts[0].len()..len], parts[1]);
        let (cfg, fc) = (v.cfg, v.fc);
        // The endpoint, the QP and its send side, each looked up once.
        let ep = v.eps.get_mut(ei);
        if !ep.is_open() {
            return None;
        }
        let path = ep.path.as_ref()?;
        let (slot, qpn) = (path.slot, path.qpn);
        let srqn = path.small_srqn;
        if !ep.pending.is_empty()
            || (ep.in_flight > 0 && ep.flight_slot != Some(slot))
            || slot >= LOG_SLOTS
        {
            return None;
        }
        let (qp, caps) = v.drv.qp(slot)?;
        let q = self.sq.get_mut(slot as usize)?;
        let outstanding = self.slab.len() + self.logged;
        let budget = v.iface.send_budget as usize;
        if total > caps.max_inline as usize || q.used >= caps.max_send_wr || outstanding >= budget {
            return None;
        }
        // Spent now, taken back if the QP refuses the message.
        let mut returned = 0;
        if fc {
            let cr = ep.credits.current(qpn)?;
            returned = cr.offer(MSG_CREDITS)?;
            cr.spend(returned);
        }
        let seq = ep.tx.peek();
        Header {
            src: cfg.rank,
            seq,
            kind: Kind::Eager,
            tag,
            credits: returned,
            len: len as u32,
        }
        .encode(&mut self.inline[..HEADER]);
        let signalled = must_signal(
            self.want_cover,
            q.unsignalled,
            caps.max_send_wr,
            v.iface.bounce.plenty(),
            outstanding,
            budget,
        );
        ep.order += 1;
        let order = ep.order;
        if q.log.capacity() == 0 {
            self.held.push(slot);
        }
        let body: &[u8; SMALL_BODY] = (&self.inline[HEADER..HEADER + SMALL_BODY])
            .try_into()
            .expect("the scratch holds a small body");
        let (wr_id, no) = q.log_small(slot, ei, signalled, order, seq, tag, len, body);
        self.logged += 1;
        match qp.post_inline(
            &mut v.iface.inline_wr,
            wr_id,
            &self.inline[..total],
            srqn,
            signalled,
        ) {
            Ok(()) => {
                // As `posted` counts it.
                q.count_post(no, signalled, slot, &mut self.uncovered);
                // Its stats: one count, read by `small_posts`.
                self.small_posted += 1;
                if signalled {
                    self.signalled_out += 1;
                    self.small_signalled += 1;
                }
                ep.in_flight += 1;
                ep.flight_slot = Some(slot);
                ep.tx.take();
                Some(if signalled { Small::Busy } else { Small::Quiet })
            }
            Err(e) => {
                let refused = Refused {
                    ei,
                    qpn,
                    returned,
                    wr_id,
                    slot,
                };
                // A view lent anew, so that `v` keeps its fields in
                // registers on the path that posts.
                Some(self.refused_small(&mut v.relend(), refused, e, now_only))
            }
        }
    }

    /// [`SendQueues::send_small`] when the QP refused the message: the
    /// credit it spent is taken back, and it is dropped (`now_only`) or
    /// waits in its queue, as one the general path refused. Out of line.
    #[cold]
    #[inline(never)]
    fn refused_small<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        r: Refused,
        e: Error,
        now_only: bool,
    ) -> Small {
        if v.fc {
            let cr = v.eps.get_mut(r.ei).credits.of(r.qpn, v.cfg.credits);
            cr.unspend(r.returned);
        }
        let item = self.refused(v, r.wr_id, r.slot, e);
        if now_only {
            return Small::Dropped;
        }
        v.eps.requeue(r.ei, item);
        v.eps.get_mut(r.ei).tx.take();
        v.stats.eager_sent += 1;
        Small::Busy
    }

    /// Drains the pending queues round robin: each pass gives every
    /// endpoint with work one post; an endpoint that got its post goes to
    /// the back, one that was blocked (its QP's send queue full, no bounce
    /// slot, no path) keeps its place at the front, so that endpoints
    /// sharing a QP take turns on its slots. Passes repeat while posts are
    /// made. Returns the posts made.
    pub(crate) fn drain_pending<C: Context>(&mut self, v: &mut SendView<'_, C>) -> usize {
        let mut work = 0;
        loop {
            if !v.eps.any_ready() {
                return work;
            }
            let mut ring = v.eps.take_ready();
            if ring.is_empty() {
                v.eps.restore_ready(ring);
                return work;
            }
            let mut blocked = std::mem::take(&mut self.ring_blocked);
            let mut served = std::mem::take(&mut self.ring_served);
            let mut posted = false;
            let budget = v.iface.send_budget as usize;
            let mut full = false;
            while let Some(ei) = ring.pop_front() {
                v.eps.get_mut(ei).queued = false;
                if !v.eps.get(ei).is_open() {
                    continue;
                }
                let Some(item) = v.eps.pop(ei) else {
                    continue;
                };
                match self.post(v, ei, item) {
                    Ok(()) => {
                        posted = true;
                        work += 1;
                        served.push_back(ei);
                    }
                    Err(item) => {
                        v.eps.unpop(ei, item);
                        blocked.push_back(ei);
                        // The CQ budget is every QP's: past it, no other
                        // endpoint can post either, and trying each of
                        // them (thousands, after a burst to every peer)
                        // on every call would cost the job's size per call.
                        if self.len() >= budget {
                            full = true;
                            break;
                        }
                    }
                }
            }
            // The blocked keep their places at the front, ahead of those
            // the pass did not reach, which stay ahead of the served.
            for ei in blocked.drain(..).rev() {
                let e = v.eps.get_mut(ei);
                if !e.queued && e.is_open() && !e.pending.is_empty() {
                    e.queued = true;
                    ring.push_front(ei);
                }
            }
            for ei in served.drain(..) {
                let e = v.eps.get_mut(ei);
                if !e.queued && e.is_open() && !e.pending.is_empty() {
                    e.queued = true;
                    ring.push_back(ei);
                }
            }
            self.ring_blocked = blocked;
            self.ring_served = served;
            v.eps.restore_ready(ring);
            if !posted || full {
                return work;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signal rule: a run of unsignalled posts ends at the smaller of
    /// [`SIGNAL_EVERY`] and half the send queue, and each of a wanted
    /// cover, short bounce slots and half the CQ budget outstanding asks
    /// for a completion on its own.
    #[test]
    fn signals_by_one_rule() {
        let quiet = |run, wr, plenty, out| !must_signal(false, run, wr, plenty, out, 64);
        let every = SIGNAL_EVERY as u32;
        assert!(quiet(0, 256, true, 0));
        assert!(quiet(every - 2, 256, true, 0));
        assert!(
            !quiet(every - 1, 256, true, 0),
            "the run ends at SIGNAL_EVERY"
        );
        assert!(quiet(2, 8, true, 0));
        assert!(!quiet(3, 8, true, 0), "the run ends at half a short queue");
        assert!(!quiet(0, 256, false, 0), "bounce slots run short");
        assert!(quiet(0, 256, true, 31));
        assert!(!quiet(0, 256, true, 32), "half the CQ budget is out");
        assert!(must_signal(true, 0, 256, true, 0, 64), "a cover is wanted");
    }

    /// A message with its body in `store`, posted on slot 0 for endpoint
    /// `ei` as the send path records and counts it; returns its number.
    fn post(
        sq: &mut SendQueues,
        eps: &mut Endpoints,
        ei: u32,
        store: Store,
        signalled: bool,
    ) -> u32 {
        let no = sq.sq[0].posts;
        let item = Item {
            order: no,
            tries: 0,
            work: Work::Msg(Msg {
                seq: no as u32,
                kind: Kind::Eager,
                tag: 0,
                len: 0,
                store,
            }),
        };
        sq.record(PostedWr {
            ep: ei,
            qp: 0,
            no,
            signalled,
            left: false,
            item,
        });
        sq.count_posted(eps, ei, 0, no, signalled);
        no as u32
    }

    fn order(p: &PostedWr) -> u64 {
        p.item.order
    }

    /// Where credits flow, a completed message leaves the posted work but
    /// stays in its log until credits show it arrived, whichever comes
    /// first; a broken QP's log gives back, in order, what left and what
    /// was in flight; a destroyed QP's late completion moves nothing.
    #[test]
    fn messages_that_left_wait_in_the_log_for_their_arrival() {
        let mut eps = Endpoints::default();
        let ei = eps.add(1);
        let mut sq = SendQueues::new(16);
        sq.slot_ready(0);
        let heap = || Store::Heap(Vec::new());
        let mut spared = 0;

        // Left, then arrived: those in memory retire by themselves, a
        // bounce slot's comes back to be given back.
        post(&mut sq, &mut eps, ei, heap(), false);
        sq.record(PostedWr {
            ep: ei,
            qp: 0,
            no: 1,
            signalled: false,
            left: false,
            item: Item::credit(),
        });
        sq.count_posted(&mut eps, ei, 0, 1, false);
        let last = post(&mut sq, &mut eps, ei, Store::Slot(5), true);
        assert_eq!(sq.leave(&mut eps, 0, 0, last, |_| spared += 1), 3);
        assert_eq!((sq.len(), sq.signalled_out(), sq.waiting()), (0, 0, 3));
        assert_eq!((eps.get(ei).in_flight, sq.sq[0].used), (0, 0));
        assert!(sq.pop_arrived(0).is_none(), "nothing arrived yet");
        assert!(sq.arrive(0, 2), "two left and arrived");
        assert!(
            sq.pop_arrived(0).is_none(),
            "in memory, and a credit's place"
        );
        assert_eq!(sq.waiting(), 1);
        assert!(sq.arrive(0, 1));
        assert_eq!(sq.pop_arrived(0).map(|p| order(&p)), Some(2));
        assert_eq!(sq.waiting(), 0);

        // Arrived before their completion was seen.
        let a = post(&mut sq, &mut eps, ei, Store::Slot(6), false);
        let b = post(&mut sq, &mut eps, ei, Store::Slot(7), true);
        assert!(!sq.arrive(0, 2), "arrived, not left yet");
        assert!(sq.pop_arrived(0).is_none(), "not left yet");
        assert_eq!(sq.leave(&mut eps, 0, 0, a, |_| spared += 1), 1);
        assert_eq!(sq.pop_arrived(0).map(|p| order(&p)), Some(u64::from(a)));
        assert!(sq.pop_arrived(0).is_none());
        assert_eq!(sq.leave(&mut eps, 0, 0, b, |_| spared += 1), 1);
        assert_eq!(sq.pop_arrived(0).map(|p| order(&p)), Some(u64::from(b)));
        assert_eq!(spared, 5, "each message seen once as it left");

        // A broken QP: what left and what is in flight, in order.
        let c = post(&mut sq, &mut eps, ei, heap(), false);
        let d = post(&mut sq, &mut eps, ei, heap(), true);
        assert_eq!(sq.leave(&mut eps, 0, 0, c, |_| {}), 1);
        sq.slot_destroyed(0);
        let taken = sq.take(&mut eps, Some(0), |p| p.qp == 0);
        let got: Vec<(u64, bool)> = taken.iter().map(|p| (order(p), p.left)).collect();
        assert_eq!(got, [(u64::from(c), true), (u64::from(d), false)]);
        assert_eq!((sq.len(), sq.waiting(), sq.signalled_out()), (0, 0, 0));
        assert_eq!(eps.get(ei).in_flight, 0);
        assert_eq!(sq.leave(&mut eps, 0, 0, d, |_| {}), 0, "an old generation");
    }

    /// A cover pass looks at the QPs that posted unsignalled work, not at
    /// every QP (under RC, one per peer: a pass over a million QPs per
    /// progress call while a cover is wanted), and forgets a QP once its
    /// unsignalled work is complete.
    #[test]
    fn covers_look_only_at_qps_with_unsignalled_work() {
        let mut eps = Endpoints::default();
        let ei = eps.add(1);
        let mut sq = SendQueues::new(16);
        for slot in 0..1000 {
            sq.slot_ready(slot);
        }
        let log =
            |sq: &mut SendQueues, eps: &mut Endpoints, slot: u32, no: u64, signalled: bool| {
                sq.record(PostedWr {
                    ep: ei,
                    qp: slot,
                    no,
                    signalled,
                    left: false,
                    item: Item::credit(),
                });
                sq.count_posted(eps, ei, slot, no, signalled);
            };
        log(&mut sq, &mut eps, 7, 0, false);
        log(&mut sq, &mut eps, 7, 1, false);
        log(&mut sq, &mut eps, 500, 0, true);
        assert_eq!(sq.uncovered, [7], "listed once, signalled work not");
        assert!(sq.ask_cover(&mut eps));
        assert!(sq.wants_cover());
        let cover = eps.pop(ei).expect("a cover queued");
        assert!(matches!(&cover.work, Work::Msg(m) if m.is_cover()));
        assert!(eps.pop(ei).is_none(), "one cover, for QP 7 alone");
        // The cover's completion retires QP 7's log.
        log(&mut sq, &mut eps, 7, 2, true);
        sq.retire_left(&mut eps, 7, 0, 2);
        sq.cover_unsignalled(&mut eps);
        assert!(sq.uncovered.is_empty(), "QP 7 has nothing left to cover");
        assert!(!sq.wants_cover());
    }
}
