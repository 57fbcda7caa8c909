//! The receive side ([`Recv`]): polls the shared receive CQ and judges
//! each message before anything believes it: its header, whether its QP
//! carries its sender's messages, its place in the sender's sequence, the
//! credits it spends and returns, and, for a message sent in parts, the
//! train it joins. A message for the user goes straight to the queue of
//! deliveries, but for a short one taken by the straight line, which comes
//! back to the core copied out (it may go to its callback without being
//! queued); what the core must act on comes back to it one message at a
//! time ([`Got`]): rendezvous control, credits the peer returned. The
//! receive side never names the core.

use std::collections::HashMap;
use std::sync::Arc;

use xrcbtl_fabric::{
    Context, Cq, DmaBuf, ReadInPlace, RecvDone, WcOpcode, WcStatus, WorkCompletion,
};
use xrcbtl_xrc_conn::Rank;

use crate::config::BtlConfig;
use crate::conn::ConnDriver;
use crate::delivery::{Body, Deliveries, Delivery, Short};
use crate::ep::{Endpoint, Endpoints, EpState};
use crate::iface::Iface;
use crate::pools::Pools;
use crate::post::SendQueues;
use crate::proto::eager::Arrival;
use crate::proto::rndv::Control;
use crate::types::{BtlError, BtlStats, Tag};
use crate::wire::{Header, Kind, HEADER, SMALL_BODY};
use crate::work::Item;
use crate::wr_id::{RecvSlot, WrId};

/// A message arriving in parts ([`Kind::Part`]), joined as they come.
struct Train {
    tag: Tag,
    buf: Vec<u8>,
    /// The peer broke the rules (too long): the rest of its parts are
    /// dropped, up to and including the last.
    bad: bool,
}

/// A receive buffer a message arrived in, while it is read.
struct Received<'a, C: Context> {
    chunk: &'a Arc<DmaBuf<C>>,
    /// Where the buffer starts in the chunk.
    at: usize,
    slot: RecvSlot,
    /// The local QP it came on.
    qpn: u32,
}

/// Credits a peer returned with a message: `n` for the messages sent on
/// local QP `qpn`, which have arrived.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Returned {
    pub qpn: u32,
    pub n: u16,
    /// The driver's slot of that QP, when it is the endpoint's path (the
    /// usual case, found with the credits); else the core looks it up.
    pub slot: Option<u32>,
}

/// What the straight line leaves the core to do about the credits a
/// message returned (where credits flow).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Credited {
    /// Nothing: none came back, or they moved their QP's count of arrived
    /// messages and none has both left and arrived yet.
    Settled,
    /// Messages of the QP in the slot it holds have now both left and
    /// arrived: the core retires them.
    Retire(u32),
    /// They came back for a QP other than the endpoint's path (an older
    /// connection draining): the core finds its slot.
    Elsewhere(Returned),
}

/// What a message brought that the core must act on.
pub(crate) struct Got {
    /// Credits the peer returned (any message may carry them, a
    /// duplicate too).
    pub returned: Option<Returned>,
    /// Rendezvous control from `.0`, with tag `.1`.
    pub ctl: Option<(Rank, Tag, Control)>,
}

/// The receive side of a BTL.
pub(crate) struct Recv {
    /// The last poll found the CQ empty before the batch was full.
    dry: bool,
    /// Messages being joined from their parts, by endpoint (at most one
    /// per peer: the parts of a message are consecutive in its sequence).
    trains: HashMap<u32, Train>,
    /// The most bytes a new train's buffer is made for.
    train_cap: usize,
    /// The last QP whose sender was looked up.
    sender_seen: SenderSeen,
}

/// The last QP number whose sender was looked up ([`Recv::sent_by`]), with
/// the driver's [`ConnDriver::qp_gen`] then, the sender, and the index of
/// the sender's endpoint when a message was last believed from it
/// ([`NO_EP`] before). An index is never given to another rank (a
/// deleted endpoint's slot stays, gone), so the straight line reads the
/// endpoint at that index without looking the rank up.
#[derive(Clone, Copy)]
struct SenderSeen {
    gen: u64,
    qpn: u32,
    sender: Rank,
    ei: u32,
}

/// No endpoint known yet, in [`SenderSeen::ei`].
const NO_EP: u32 = u32::MAX;

/// What the receive side works through, lent by the core for one call.
pub(crate) struct RecvView<'a, C: Context, H> {
    pub cfg: &'a BtlConfig,
    pub iface: &'a mut Iface<C>,
    pub drv: &'a mut ConnDriver<C>,
    pub eps: &'a mut Endpoints,
    pub pools: &'a mut Pools,
    /// Where messages for the user go.
    pub deliveries: &'a mut Deliveries<C, H>,
    pub stats: &'a mut BtlStats,
    /// Credit flow control: the device has no RNR (iWARP).
    pub fc: bool,
}

/// What the straight line ([`Recv::short_eager`]) works through: only
/// what it needs, lent by the core per completion. Never passed out of
/// line, so the compiler keeps it in registers, where a [`RecvView`]
/// (handed to the general path, out of line) is stored whole.
pub(crate) struct ShortView<'a, C: Context> {
    pub iface: &'a mut Iface<C>,
    /// The driver's [`ConnDriver::qp_gen`].
    pub qp_gen: u64,
    pub eps: &'a mut Endpoints,
    pub stats: &'a mut BtlStats,
    /// The send queues, whose messages returned credits show arrived.
    pub sends: &'a mut SendQueues,
    /// A connection's credits.
    pub cap: u32,
    /// Credit flow control: the device has no RNR (iWARP).
    pub fc: bool,
}

impl Recv {
    /// A receive side joining trains in buffers made for `train_cap`
    /// bytes.
    pub fn new(train_cap: usize) -> Self {
        Recv {
            dry: true,
            trains: HashMap::new(),
            train_cap,
            sender_seen: SenderSeen {
                gen: u64::MAX,
                qpn: 0,
                sender: 0,
                ei: NO_EP,
            },
        }
    }

    /// Whether the last poll found the CQ empty before its batch was full.
    pub fn dry(&self) -> bool {
        self.dry
    }

    /// Polls the receive CQ, `cq`, once into `wcs`. Returns how many
    /// completions it took, the first entries of `wcs`: the caller reads
    /// each (by [`Recv::short_eager`], else by [`Recv::on_completion`])
    /// before the next poll.
    #[inline(always)]
    pub fn poll<Q: Cq>(&mut self, cq: &Q, wcs: &mut [WorkCompletion]) -> usize {
        let n = cq.poll_quick(wcs);
        self.took(n, wcs.len());
        n
    }

    /// The last poll, made into a buffer of `batch` entries (by
    /// [`Recv::poll`], or without the lock by a quiet progress call),
    /// found `n` completions.
    #[inline(always)]
    pub fn took(&mut self, n: usize, batch: usize) {
        self.dry = n < batch;
    }

    /// Endpoint `ei` failed: its train, if one was open, is dropped.
    pub fn forget(&mut self, pools: &mut Pools, ei: u32) {
        if let Some(t) = self.trains.remove(&ei) {
            pools.recycle(t.buf);
        }
    }

    /// The straight line for the completion a ping-pong brings most, a
    /// receive that succeeded ([`RecvDone`]): a
    /// short eager message (a body of at most [`SMALL_BODY`] bytes),
    /// received whole on a QP last seen carrying its sender's messages,
    /// next in that sender's sequence, on an open endpoint, with no train
    /// open. Its body is copied out and its buffer goes back at once; the
    /// credits it returns are counted as arrivals on its QP. Returns
    /// `None`, having changed nothing, for any other completion:
    /// [`Recv::on_completion`] then judges it step by step. Otherwise puts
    /// the message in `out`, for the caller to deliver (queued, or handed
    /// straight to its callback when nothing waits ahead of it: `out` is
    /// where the caller keeps it, so that it is built once, in place), and
    /// returns what is left to do about those credits.
    #[inline(always)]
    pub fn short_eager<C: Context>(
        &mut self,
        v: &mut ShortView<'_, C>,
        wc: RecvDone,
        out: &mut Option<Short>,
    ) -> Option<Credited> {
        let WrId::Recv(slot) = WrId::of(wc.wr_id) else {
            return None;
        };
        let len = wc.byte_len as usize;
        let seen = self.sender_seen;
        if !(HEADER..=HEADER + SMALL_BODY).contains(&len)
            || (seen.gen, seen.qpn) != (v.qp_gen, wc.qp_num)
            || !self.trains.is_empty()
        {
            return None;
        }
        let body = ShortBody {
            eps: &mut *v.eps,
            sends: &mut *v.sends,
            cap: v.cap,
            fc: v.fc,
            sender: seen.sender,
            ei: seen.ei,
            qpn: wc.qp_num,
            body_len: len - HEADER,
            out,
        };
        // Counted by its class (`Iface::read_whole`), folded into the
        // stats' count by class and of eager messages when they are read.
        let (body_len, credited) = v.iface.read_whole(slot, body)?;
        v.stats.bytes_received += u64::from(body_len);
        Some(credited)
    }

    /// The general path: judges completion `wc` step by step, and
    /// returns what its message brought the core, if anything.
    #[inline(never)]
    pub fn on_completion<C: Context, H>(
        &mut self,
        v: &mut RecvView<'_, C, H>,
        wc: &WorkCompletion,
    ) -> Option<Got> {
        let WrId::Recv(slot) = WrId::of(wc.wr_id) else {
            return None;
        };
        let (chunk, at) = v.iface.taken(slot)?;
        if wc.status != WcStatus::Success
            || !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
        {
            v.iface.give_back(slot);
            return None;
        }
        if wc.byte_len == 0 {
            // The iWARP initiator's hello: the responder may speak now.
            v.iface.give_back(slot);
            let now = v.cfg.clock.now();
            v.drv.handle_first_receive(now, wc.qp_num);
            return None;
        }
        // One counter per class, made with the classes.
        if let Some(c) = v.stats.received_by_class.get_mut(usize::from(slot.class)) {
            *c += 1;
        }
        let rx = Received {
            chunk: &chunk,
            at,
            slot,
            qpn: wc.qp_num,
        };
        let (kept, got) = chunk.with_slice(at, wc.byte_len as usize, |bytes| {
            self.on_message(v, bytes, rx)
        });
        if !kept {
            v.iface.give_back(slot);
        }
        got
    }

    /// A message arrived in a receive buffer (`bytes`, read in place; the
    /// buffer is not posted while it is read). Returns whether a delivery
    /// keeps the buffer (it is then given back when its consumer is done,
    /// else at once by the caller), and what the message brought.
    fn on_message<C: Context, H>(
        &mut self,
        v: &mut RecvView<'_, C, H>,
        bytes: &[u8],
        rx: Received<'_, C>,
    ) -> (bool, Option<Got>) {
        let Some(h) = Header::decode(bytes) else {
            v.stats.malformed += 1;
            return (false, None);
        };
        let Some(ei) = v.eps.find(h.src) else {
            v.stats.malformed += 1;
            return (false, None);
        };
        if !self.sent_by(v.drv, h.src, ei, rx.qpn) {
            // A peer claiming another's rank: nothing of it is believed.
            v.stats.malformed += 1;
            return (false, None);
        }
        // The endpoint is looked up once: the checks below read it in turn.
        let ep = v.eps.get_mut(ei);
        let open = ep.is_open();
        if !open {
            if let EpState::Gone(BtlError::Unreachable(..)) = ep.state {
                // Failed here, alive there: it must hear of it, or what it
                // waits on from this rank waits forever.
                let now = v.cfg.clock.now();
                v.drv.disown(now, h.src);
            }
        }
        let deliver = h.kind == Kind::Eager && open;
        let arrival = if h.kind == Kind::Credit || !open {
            None
        } else {
            Some(ep.rx.arrive(h.seq))
        };
        // A message joined from parts is copied out: no buffer kept.
        let joining = !self.trains.is_empty() && self.trains.contains_key(&ei);
        let in_order = deliver && arrival == Some(Arrival::Next) && !joining;
        // A short body is copied out, and its buffer goes back at once;
        // a longer one is read in place, and its buffer kept until then.
        let small = bytes.len() - HEADER <= SMALL_BODY;
        let keep = in_order && !small;
        let mut got = Got {
            returned: None,
            ctl: None,
        };
        if v.fc {
            // Every message took one of our receives (duplicates too): the
            // credit is owed back once that receive is free again, now or,
            // for a message delivered in place, when its consumer is done.
            // Returns to us ride on it.
            got.returned = settle(v.eps, ei, rx.qpn, v.cfg.credits, h.credits, keep);
        }
        match arrival {
            None => return (false, nonempty(got)),
            Some(Arrival::Next) => {}
            Some(Arrival::Duplicate) => {
                v.stats.duplicates += 1;
                return (false, nonempty(got));
            }
            Some(Arrival::Ahead) => {
                v.stats.out_of_order += 1;
                v.stats.malformed += 1;
                return (false, nonempty(got));
            }
        }
        if h.kind == Kind::Part || joining {
            self.join(v, ei, &h, &bytes[HEADER..]);
            return (false, nonempty(got));
        }
        if in_order {
            v.stats.eager_received += 1;
            v.stats.bytes_received += u64::from(h.len);
            if small {
                v.deliveries
                    .push_short(Short::new(h.src, h.tag, &bytes[HEADER..]));
            } else {
                v.deliveries.push(Delivery::Message {
                    src: h.src,
                    tag: h.tag,
                    body: Body::Received {
                        chunk: rx.chunk.clone(),
                        slot: rx.slot,
                        credit: v.fc.then_some((h.src, rx.qpn)),
                    },
                    start: rx.at + HEADER,
                    end: rx.at + bytes.len(),
                });
            }
            return (keep, nonempty(got));
        }
        match Control::decode(h.kind, &bytes[HEADER..]) {
            Some(ctl) => got.ctl = Some((h.src, h.tag, ctl)),
            None => v.stats.malformed += 1,
        }
        (false, nonempty(got))
    }

    /// Whether a message claiming to come from `src` (whose endpoint is
    /// `ei`) may have: the QP it arrived on (`qpn`: an RC QP, or an XRC
    /// TGT QP) carries that rank's messages only. A QP the driver no
    /// longer knows (its last messages may be polled after it went) cannot
    /// tell, and does not refuse.
    fn sent_by<C: Context>(&mut self, drv: &ConnDriver<C>, src: Rank, ei: u32, qpn: u32) -> bool {
        let gen = drv.qp_gen();
        let seen = &mut self.sender_seen;
        if (seen.gen, seen.qpn) == (gen, qpn) {
            if seen.sender != src {
                return false;
            }
            // The rank's endpoint may be new (its last one deleted).
            seen.ei = ei;
            return true;
        }
        match drv.sender_of(qpn) {
            Some(r) => {
                *seen = SenderSeen {
                    gen,
                    qpn,
                    sender: r,
                    ei: if r == src { ei } else { NO_EP },
                };
                r == src
            }
            None => true,
        }
    }

    /// A part of a message arrived from endpoint `ei`, in sequence (`h`:
    /// a [`Kind::Part`], or, with a train open, whatever came next). The
    /// last part (an eager message) delivers the whole. A train longer
    /// than [`crate::MAX_SPLIT`], a part of another tag, or a message of
    /// another kind in the middle is the peer's error: counted as
    /// malformed, and the train is dropped.
    fn join<C: Context, H>(
        &mut self,
        v: &mut RecvView<'_, C, H>,
        ei: u32,
        h: &Header,
        body: &[u8],
    ) {
        let mut train = match self.trains.remove(&ei) {
            Some(t) if h.kind != Kind::Part && h.kind != Kind::Eager => {
                // Control in the middle of a train: the parts are
                // consecutive, so the peer broke them.
                v.stats.malformed += 1;
                v.pools.recycle(t.buf);
                return;
            }
            Some(t) => t,
            None => Train {
                tag: h.tag,
                buf: v.pools.joined(self.train_cap),
                bad: false,
            },
        };
        if !train.bad
            && (train.tag != h.tag || train.buf.len() + body.len() > crate::config::MAX_SPLIT)
        {
            v.stats.malformed += 1;
            train.bad = true;
            train.buf.clear();
        }
        if !train.bad {
            train.buf.extend_from_slice(body);
        }
        if h.kind == Kind::Part {
            self.trains.insert(ei, train);
            return;
        }
        if train.bad {
            v.pools.recycle(train.buf);
            return;
        }
        let end = train.buf.len();
        v.stats.joined += 1;
        v.stats.eager_received += 1;
        v.stats.bytes_received += end as u64;
        v.deliveries.push(Delivery::Message {
            src: h.src,
            tag: train.tag,
            body: Body::Heap(train.buf),
            start: 0,
            end,
        });
    }
}

/// The credits of one message from endpoint `ei` on `qpn`: the returns
/// it carries (`returned`) are taken, and the receive it used is owed back
/// now, unless a delivery keeps that receive (`keep`: it is owed when its
/// consumer is done). A credit message is queued once enough is owed.
/// Returns the returns, if any.
#[inline(always)]
fn settle(
    eps: &mut Endpoints,
    ei: u32,
    qpn: u32,
    cap: u32,
    returned: u16,
    keep: bool,
) -> Option<Returned> {
    let (owe, r) = settle_on(eps.get_mut(ei), qpn, cap, returned, keep);
    if owe {
        eps.requeue(ei, Item::credit());
    }
    r
}

/// [`settle`] on endpoint `ep`, already found: returns whether a credit
/// message is to be queued, and the returns.
#[inline(always)]
fn settle_on(
    ep: &mut Endpoint,
    qpn: u32,
    cap: u32,
    returned: u16,
    keep: bool,
) -> (bool, Option<Returned>) {
    let slot = match &ep.path {
        Some(p) if p.qpn == qpn => Some(p.slot),
        _ => None,
    };
    let cr = ep.credits.of(qpn, cap);
    cr.take_returned(returned);
    let owe = !keep && cr.owe(cap);
    let r = (returned > 0).then_some(Returned {
        qpn,
        n: returned,
        slot,
    });
    (owe, r)
}

/// [`Recv::short_eager`]'s look at the message that came from `sender` on
/// local QP `qpn`, read in place ([`ShortBody::read`]). A type rather
/// than a closure, so that its reading is inlined into the straight line
/// (a closure of this size was called out of line, and its frame cost the
/// receiving call about 20 instructions).
struct ShortBody<'a> {
    eps: &'a mut Endpoints,
    sends: &'a mut SendQueues,
    /// A connection's credits.
    cap: u32,
    /// Credits flow.
    fc: bool,
    sender: Rank,
    /// The sender's endpoint, as [`SenderSeen::ei`].
    ei: u32,
    qpn: u32,
    /// The length of the message's body (the completion's, less the
    /// header): the buffer is read at a fixed length, past it.
    body_len: usize,
    /// Where the message goes.
    out: &'a mut Option<Short>,
}

impl ReadInPlace for ShortBody<'_> {
    type Out = Option<(u32, Credited)>;

    /// A short eager message next in the sequence of an open endpoint is
    /// copied out, and the credits it spends and returns are settled
    /// (those returned for the endpoint's path counted as arrivals there).
    /// Puts the message in `out` and returns its body's length and what is
    /// left to do about the credits, or `None`, having changed nothing, for
    /// any other message.
    #[inline(always)]
    fn read(self, bytes: &[u8]) -> Self::Out {
        let ShortBody {
            eps,
            sends,
            cap,
            fc,
            sender,
            ei,
            qpn,
            body_len,
            out,
        } = self;
        let (head, rest) = bytes.split_first_chunk::<HEADER>()?;
        let body = rest.first_chunk::<SMALL_BODY>()?;
        let h = Header::eager_of(head, body_len).filter(|h| h.src == sender)?;
        let ep = eps.try_get_mut(ei)?;
        if !ep.is_open() || ep.rx.expected() != h.seq {
            return None;
        }
        ep.rx.arrive(h.seq);
        // Taken now, before the credits are settled, which cannot turn it
        // back: the message's bytes are not kept through that. The body at
        // its fixed length (`body_len` is at most SMALL_BODY: the straight
        // line's first check).
        *out = Some(Short::of_fixed(h.src, h.tag, body_len as u8, body));
        let credited = if fc {
            let (owe, r) = settle_on(ep, qpn, cap, h.credits, false);
            if owe {
                eps.requeue(ei, Item::credit());
            }
            match r {
                None => Credited::Settled,
                Some(Returned {
                    slot: Some(slot),
                    n,
                    ..
                }) => {
                    if sends.arrive(slot, u64::from(n)) {
                        Credited::Retire(slot)
                    } else {
                        Credited::Settled
                    }
                }
                Some(r) => Credited::Elsewhere(r),
            }
        } else {
            Credited::Settled
        };
        Some((h.len, credited))
    }
}

/// `got`, unless it brings nothing at all.
fn nonempty(got: Got) -> Option<Got> {
    (got.returned.is_some() || got.ctl.is_some()).then_some(got)
}
