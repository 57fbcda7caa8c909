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
//! A short eager message to an endpoint with nothing queued takes a
//! shorter way ([`SendQueues::send_small`]): the same checks and records, made
//! in one function, with its body gathered once; whatever that way cannot
//! take (a queue, no path, no credits) it leaves to the general one.

use std::collections::VecDeque;

use xrcbtl_fabric::{Context, Error, Payload, Qp, QpCaps, SendOp, SendWr, Sge, WorkCompletion};
use xrcbtl_progress::{Batch, WrSlab};

use crate::config::BtlConfig;
use crate::conn::ConnDriver;
use crate::credits::{MSG_CREDITS, RETURN_CREDITS};
use crate::ep::Endpoints;
use crate::iface::Iface;
use crate::pools::{Sink, Source};
use crate::proto::rndv::Rndv;
use crate::proto::{Owner, Rdma, RdmaOp};
use crate::types::{BtlStats, Tag};
use crate::wire::{Header, Kind, HEADER, SMALL_BODY};
use crate::work::{small_body, steal_slot, Item, Msg, Store, Work};
use crate::wr_id::WrId;

/// The largest message posted inline (the scratch buffer it is gathered
/// in).
pub(crate) const INLINE_MAX: usize = 1024;

// The latency path gathers a whole small body into the scratch.
const _: () = assert!(HEADER + SMALL_BODY <= INLINE_MAX);

/// Inline messages a QP may carry unsignalled in a row: the next one is
/// signalled, and its completion completes them all.
pub(crate) const SIGNAL_EVERY: usize = 16;

/// The send side of one QP slot of the driver.
///
/// Selective signalling: small inline messages (the latency path) are
/// posted unsignalled, up to [`SIGNAL_EVERY`] in a row, while bounce slots
/// are plentiful. They stay in the slab, and listed here, until a later
/// signalled request on the same QP completes: a QP completes its work in
/// order, so that completion is theirs too. A failed unsignalled request
/// still reports itself (errors always complete), and a destroyed QP
/// gives all of its work back for posting again. When someone waits for
/// everything to complete ([`SendQueues::ask_cover`]) and a QP has nothing
/// signalled behind its unsignalled work, progress queues a signalled
/// credit-only message (a cover) on it.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    /// Work requests posted and not known complete.
    pub used: u32,
    /// Requests posted on this QP so far (the next one's number).
    pub posts: u64,
    /// Number of the last signalled request.
    pub last_signalled: u64,
    /// (number, wr_id) of each unsignalled request not known complete, in
    /// posting order.
    pub unsignalled: VecDeque<(u64, u64)>,
    /// A cover is queued and not yet posted.
    pub cover_queued: bool,
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
    /// The work.
    pub item: Item,
}

// Moves of a posted request stay inline (see `SMALL_BODY`).
const _: () = assert!(std::mem::size_of::<PostedWr>() <= 128);

/// The posted-work state of a BTL: every request posted and not known
/// complete, the send side of each QP, and the round robin of endpoints
/// with queued work. It turns work into posted requests and gives back
/// what completed; what a completion means (a message kept until its
/// credits come back, work requeued or dropped, an endpoint failed) is for
/// the core to judge.
#[derive(Debug)]
pub(crate) struct SendQueues {
    /// Work posted and not completed, by its wr_id's index.
    slab: WrSlab<PostedWr>,
    /// The send side of each QP slot of the driver.
    sq: Vec<SendQueue>,
    /// Signalled work requests posted and not completed: the send CQ is
    /// polled only while there are some (and on control ticks).
    signalled_out: usize,
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

impl SendQueues {
    /// Empty send queues, polling `cq_batch` completions at a time.
    pub fn new(cq_batch: usize) -> Self {
        SendQueues {
            slab: WrSlab::new(),
            sq: Vec::new(),
            signalled_out: 0,
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
        self.slab.len()
    }

    /// Posted work requests ever recorded in the slab.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Whether no work request is outstanding.
    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// Signalled work requests outstanding: while there are none, the
    /// send CQ has nothing for this rank but on control ticks.
    pub fn signalled_out(&self) -> usize {
        self.signalled_out
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
    }

    /// The QP in `slot` was destroyed: nothing is outstanding on it any
    /// more (its work is taken out with [`SendQueues::take`]).
    pub fn slot_destroyed(&mut self, slot: u32) {
        if let Some(q) = self.sq.get_mut(slot as usize) {
            q.used = 0;
            q.unsignalled.clear();
            q.cover_queued = false;
        }
    }

    /// Takes out the posted work `pick` chooses, as if it had completed
    /// (it never will: its QP or its endpoint is gone), for the core to
    /// post again or drop.
    pub fn take(
        &mut self,
        eps: &mut Endpoints,
        pick: impl FnMut(&PostedWr) -> bool,
    ) -> Vec<PostedWr> {
        let taken: Vec<PostedWr> = self
            .slab
            .extract(pick)
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        for p in &taken {
            // A signalled request no longer awaits its completion (an
            // unsignalled one's id stays in its queue's list and finds
            // nothing when popped).
            if p.signalled {
                self.signalled_out -= 1;
            }
            self.release(eps, p);
        }
        taken
    }

    /// Where request `id`, whose completion came, went: its QP slot and its
    /// number there. `None` if it is no longer outstanding.
    pub fn find(&self, id: u64) -> Option<(u32, u64)> {
        self.slab.get(id).map(|p| (p.qp, p.no))
    }

    /// The oldest unsignalled request posted on QP slot `qp` before its
    /// request number `no`, which a later completion there completed (a
    /// QP completes its work in order).
    #[inline]
    pub fn pop_unsignalled_before(
        &mut self,
        eps: &mut Endpoints,
        qp: u32,
        no: u64,
    ) -> Option<PostedWr> {
        loop {
            let q = self.sq.get_mut(qp as usize)?;
            let &(n, id) = q.unsignalled.front()?;
            if n >= no {
                return None;
            }
            q.unsignalled.pop_front();
            if let Some(p) = self.slab.remove(id) {
                self.release(eps, &p);
                return Some(p);
            }
        }
    }

    /// Request `id`'s completion came (a success, or any request's
    /// failure): it is no longer outstanding.
    pub fn complete(&mut self, eps: &mut Endpoints, id: u64) -> Option<PostedWr> {
        let p = self.slab.remove(id)?;
        if p.signalled {
            self.signalled_out -= 1;
        } else if let Some(q) = self.sq.get_mut(p.qp as usize) {
            // An unsignalled request reports only its failure.
            q.unsignalled.retain(|&(_, i)| i != id);
        }
        self.release(eps, &p);
        Some(p)
    }

    /// Undoes the accounting of posted work that is over.
    fn release(&mut self, eps: &mut Endpoints, p: &PostedWr) {
        if let Some(q) = self.sq.get_mut(p.qp as usize) {
            q.used = q.used.saturating_sub(1);
        }
        let ep = eps.get_mut(p.ep);
        ep.in_flight = ep.in_flight.saturating_sub(1);
        if ep.in_flight == 0 {
            ep.flight_slot = None;
            eps.mark_ready(p.ep);
        }
    }

    /// Asks that all unsignalled work complete: covers are queued now,
    /// and unsignalled posting stops until everything has completed.
    /// Returns whether there was unsignalled work to cover (covers may
    /// wait to be posted).
    pub fn ask_cover(&mut self, eps: &mut Endpoints) -> bool {
        if self.slab.len() == self.signalled_out {
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
        for slot in 0..self.sq.len() {
            // Work its endpoint's failure took away is no longer waited for.
            let slab = &self.slab;
            let q = &mut self.sq[slot];
            q.unsignalled.retain(|&(_, id)| slab.get(id).is_some());
            let Some(&(n, id)) = q.unsignalled.back() else {
                q.cover_queued = false;
                continue;
            };
            any = true;
            if q.cover_queued || q.last_signalled > n {
                continue;
            }
            if let Some(ei) = self.slab.get(id).map(|p| p.ep) {
                self.sq[slot].cover_queued = true;
                eps.requeue(ei, Item::cover());
            }
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
        if self.slab.len() >= v.iface.send_budget as usize {
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
        self.records += 1;
        let wr_id = WrId::send(self.slab.insert(PostedWr {
            ep: ei,
            qp: slot,
            no,
            signalled,
            item,
        }));
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
                self.posted(v, ei, slot, no, wr_id, signalled);
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
    /// taken back out of the slab and its work returned; a QP that refused
    /// for any reason but a full queue is unusable, and the manager
    /// rebuilds the path.
    #[cold]
    fn refused<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        wr_id: u64,
        slot: u32,
        e: Error,
    ) -> Item {
        let p = self.slab.remove(wr_id).expect("just inserted");
        v.stats.no_resource += 1;
        if !matches!(e, Error::NoResource(_)) {
            let now = v.cfg.clock.now();
            v.drv.handle_send_failure(now, slot);
        }
        p.item
    }

    /// Whether an inline message posted now on QP slot `slot` may go
    /// unsignalled: fewer than [`SIGNAL_EVERY`] (at most half the send
    /// queue) in a row, no cover wanted, and bounce slots and the send CQ's
    /// budget far from short (unsignalled work holds both until a later
    /// completion).
    fn may_skip_signal<C: Context>(&self, iface: &Iface<C>, slot: u32, caps: QpCaps) -> bool {
        let every = SIGNAL_EVERY.min(caps.max_send_wr as usize / 2);
        !self.want_cover
            && self.sq[slot as usize].unsignalled.len() + 1 < every
            && iface.bounce.free() > iface.bounce.count() / 4
            && self.slab.len() < iface.send_budget as usize / 2
    }

    /// Records a request the QP in `slot` took: its send queue, the
    /// signalled work or the unsignalled list, and its endpoint's flight.
    fn posted<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        ei: u32,
        slot: u32,
        no: u64,
        wr_id: u64,
        signalled: bool,
    ) {
        let q = &mut self.sq[slot as usize];
        q.used += 1;
        q.posts += 1;
        if signalled {
            q.last_signalled = no;
            self.signalled_out += 1;
        } else {
            q.unsignalled.push_back((no, wr_id));
            v.stats.unsignalled += 1;
        }
        let ep = v.eps.get_mut(ei);
        ep.in_flight += 1;
        ep.flight_slot = Some(slot);
    }

    /// The latency path of an eager send: a message whose header and body
    /// fit the QP's inline limit and a [`Store::Small`], to an endpoint
    /// with a path and nothing queued, is numbered, gathered and posted
    /// here at once, without the general path's steps for bounce slots,
    /// queued work and rendezvous control ([`SendQueues::post`] does the same
    /// for it, slower). Returns `None`, having changed nothing, when
    /// anything stands in the way (no path, work on an older path or
    /// queued, a full send queue or CQ budget, no credits, too long): the
    /// caller then takes the general path, which decides what waits.
    /// Otherwise returns `Some` of what the core's `send_eager` returns: the
    /// message went, or, if the QP refused it, waits in its queue
    /// (`Some(true)`), or, with `now_only`, was dropped (`Some(false)`).
    pub(crate) fn send_small<C: Context>(
        &mut self,
        v: &mut SendView<'_, C>,
        ei: u32,
        tag: Tag,
        parts: [&[u8]; 2],
        now_only: bool,
    ) -> Option<bool> {
        let len = parts[0].len() + parts[1].len();
        let total = HEADER + len;
        let ep = v.eps.get_mut(ei);
        let path = ep.path.as_ref()?;
        let (slot, qpn) = (path.slot, path.qpn);
        if !ep.pending.is_empty() || (ep.in_flight > 0 && ep.flight_slot != Some(slot)) {
            return None;
        }
        let (_, caps) = v.drv.qp(slot)?;
        if total > caps.max_inline as usize
            || self.sq[slot as usize].used >= caps.max_send_wr
            || self.slab.len() >= v.iface.send_budget as usize
        {
            return None;
        }
        // The body gathered once: the copy kept for a resend, and what goes
        // inline (copied from it at a fixed length, without a call).
        let bytes = small_body(parts)?;
        // Spent now, taken back if the QP refuses the message.
        let mut returned = 0;
        if v.fc {
            let cr = ep.credits.of(qpn, v.cfg.credits);
            returned = cr.offer(MSG_CREDITS)?;
            cr.spend(returned);
        }
        let srqn = path.srqns.get(v.iface.class_for(total)).copied();
        let seq = ep.tx.peek();
        Header {
            src: v.cfg.rank,
            seq,
            kind: Kind::Eager,
            tag,
            credits: returned,
            len: len as u32,
        }
        .encode(&mut self.inline[..HEADER]);
        self.inline[HEADER..HEADER + SMALL_BODY].copy_from_slice(&bytes);
        let signalled = !self.may_skip_signal(v.iface, slot, caps);
        let no = self.sq[slot as usize].posts;
        let order = v.eps.next_order(ei);
        self.records += 1;
        let wr_id = WrId::send(self.slab.insert(PostedWr {
            ep: ei,
            qp: slot,
            no,
            signalled,
            item: Item {
                order,
                tries: 0,
                work: Work::Msg(Msg {
                    seq,
                    kind: Kind::Eager,
                    tag,
                    len: len as u32,
                    store: Store::Small {
                        len: len as u8,
                        bytes,
                    },
                }),
            },
        }));
        let mut wr = SendWr::new(wr_id, SendOp::Send, Payload::Inline(&self.inline[..total]));
        wr.remote_srqn = srqn;
        if !signalled {
            wr = wr.unsignaled();
        }
        let (qp, _) = v.drv.qp(slot).expect("looked up above");
        match qp.post_send(&wr) {
            Ok(()) => {
                self.posted(v, ei, slot, no, wr_id, signalled);
                v.stats.inline_sent += 1;
            }
            Err(e) => {
                if v.fc {
                    let cr = v.eps.get_mut(ei).credits.of(qpn, v.cfg.credits);
                    cr.unspend(returned);
                }
                let item = self.refused(v, wr_id, slot, e);
                if now_only {
                    return Some(false);
                }
                // It waits in its queue, as one the general path refused.
                v.eps.requeue(ei, item);
            }
        }
        v.eps.get_mut(ei).tx.take();
        v.stats.eager_sent += 1;
        Some(true)
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
                    }
                }
            }
            for ei in blocked.drain(..).chain(served.drain(..)) {
                let e = v.eps.get_mut(ei);
                if !e.queued && e.is_open() && !e.pending.is_empty() {
                    e.queued = true;
                    ring.push_back(ei);
                }
            }
            self.ring_blocked = blocked;
            self.ring_served = served;
            v.eps.restore_ready(ring);
            if !posted {
                return work;
            }
        }
    }
}
