//! One FI_EP_RDM endpoint's messaging, as a state machine without I/O:
//! commands (send, receive, cancel) and events (a peer's message, a send
//! or read finished) go in; [`Action`]s (send these bytes, copy this
//! payload there, read that remote buffer here, complete this operation)
//! come out of [`Rdm::poll_action`]. The driver above runs them on the
//! BTL and the caller's memory; no byte of user memory passes through
//! here but eager payloads that arrived before their receive.
//!
//! The protocol ([`crate::wire`]):
//! - A message of at most `eager_max` bytes goes whole (Eager). It
//!   completes when the BTL says it was sent (FI_TRANSMIT_COMPLETE), or
//!   with delivery complete when the receiver's Ack says it was matched and
//!   copied.
//! - A longer one sends only an Rts naming its registered buffer. The
//!   receiver matches it like any message, reads what fits straight into
//!   the posted buffer, and answers Fin; the send completes on Fin (which
//!   is delivery complete).
//! - A receiver made [`Rdm::with_writes`] (where its BTL's rendezvous
//!   writes: iWARP, whose reads soft-iWARP serves from a kernel thread)
//!   does not read: it registers the place in the posted buffer for
//!   remote writes and offers it (Cts). The sender writes its bytes there
//!   and says Written on the same connection, which arrives after the
//!   data is placed; the receiver completes the receive and answers Fin.
//!   Every sender takes either answer to its Rts.
//! - A receive that is shorter than the message completes with FI_ETRUNC
//!   and the bytes that did not fit.
//! - If a peer is lost, every send waiting on it fails, and so does every
//!   read from it; receives stay posted (they may match another peer).
//!
//! The floor: [`crate::matching`] and [`crate::wire`] below; nothing here
//! knows libfabric's structs or the BTL's types.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

pub use crate::addr::PeerEp;
use crate::matching::{Arrival, ClaimId, Header, Matcher, Place, Posted, RecvId, Source, Want};
use crate::wire::{self, flags, Common, Msg};

/// The caller's name for an operation (its `context`, or the driver's
/// slot for it).
pub type OpRef = u64;

/// Which matching space a message is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// FI_MSG.
    Msg,
    /// FI_TAGGED, with the tag.
    Tagged(u64),
}

/// A send, as the caller asks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendReq {
    /// Who to.
    pub to: PeerEp,
    /// Matching space and tag.
    pub space: Space,
    /// Remote CQ data, if any.
    pub data: Option<u64>,
    /// Bytes of the message.
    pub len: usize,
    /// Complete only once the receiver has the message (FI_DELIVERY_COMPLETE).
    pub delivery: bool,
}

/// Where a rendezvous sender's buffer is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exposed {
    /// Its address.
    pub addr: u64,
    /// Its remote key.
    pub key: u32,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// It succeeded.
    Done,
    /// A receive shorter than the message: this many bytes did not fit.
    Truncated(usize),
    /// The peer was lost before it completed.
    PeerLost,
    /// The receiver's read of a large message failed (its status).
    RemoteFailed(u32),
    /// It was cancelled.
    Cancelled,
}

/// A finished receive's details, for its completion entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Who sent it.
    pub from: Source,
    /// Its tag (0 in the FI_MSG space).
    pub tag: u64,
    /// Bytes that landed.
    pub len: usize,
    /// Where in the buffer they start (multi-receive).
    pub offset: usize,
    /// Remote CQ data, if the sender gave some.
    pub data: Option<u64>,
    /// The buffer is released (always for a single receive; for a
    /// multi-receive buffer, its last completion: FI_MULTI_RECV).
    pub released: bool,
}

/// What the driver must do.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `header` and then `payload_len` bytes of send `op`'s buffer
    /// (or no payload) to `to`. `op` names the send the message carries
    /// (its payload, or its rendezvous offer) and is `None` for a control
    /// message; the driver reports how a send's message went with
    /// [`Rdm::handle_sent`].
    Send {
        /// Who to.
        to: PeerEp,
        /// The provider header.
        header: Vec<u8>,
        /// Whose buffer the payload comes from.
        op: Option<OpRef>,
        /// Bytes of it.
        payload_len: usize,
    },
    /// Register send `op`'s buffer for the peer to read; the driver answers
    /// with [`Rdm::handle_exposed`].
    Expose {
        /// The send.
        op: OpRef,
    },
    /// Copy an arrived payload into receive `recv` at `offset`.
    CopyIn {
        /// The receive.
        recv: OpRef,
        /// Where in its buffer.
        offset: usize,
        /// The bytes (already cut to what fits).
        bytes: Vec<u8>,
    },
    /// Register `len` bytes of receive `recv` at `offset` for the peer to
    /// write; the driver answers with [`Rdm::handle_recv_exposed`].
    ExposeRecv {
        /// This offer's number.
        grant: u64,
        /// The receive.
        recv: OpRef,
        /// Where in its buffer.
        offset: usize,
        /// How much.
        len: usize,
    },
    /// Release the registration of offer `grant` (the writes are over).
    UnexposeRecv {
        /// The offer.
        grant: u64,
    },
    /// Write the first `len` bytes of send `op`'s buffer to the place a
    /// receiver offered; the driver answers with [`Rdm::handle_written`]
    /// naming `msg_id`.
    Write {
        /// The message.
        msg_id: u64,
        /// The send.
        op: OpRef,
        /// To whom.
        to: PeerEp,
        /// The place offered.
        remote: Exposed,
        /// How much.
        len: usize,
    },
    /// Read `len` bytes of a peer's buffer into receive `recv` at `offset`;
    /// the driver answers with [`Rdm::handle_read`] naming `read`.
    Read {
        /// This read's number.
        read: u64,
        /// From whom.
        from: PeerEp,
        /// Their buffer.
        remote: Exposed,
        /// Into which receive.
        recv: OpRef,
        /// Where in its buffer.
        offset: usize,
        /// How much.
        len: usize,
    },
    /// A send finished.
    SendDone {
        /// The send.
        op: OpRef,
        /// How.
        outcome: Outcome,
    },
    /// A receive finished (or one message of a multi-receive buffer).
    RecvDone {
        /// The receive.
        recv: OpRef,
        /// How.
        outcome: Outcome,
        /// What arrived (all zeros for a cancelled receive).
        got: Received,
    },
    /// Release send `op`'s registration (after its rendezvous ended).
    Unexpose {
        /// The send.
        op: OpRef,
    },
}

/// A message waiting for its receive.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Arrived {
    Eager {
        from: PeerEp,
        data: Option<u64>,
        ack: Option<u64>,
        payload: Vec<u8>,
    },
    Rts {
        from: PeerEp,
        data: Option<u64>,
        msg_id: u64,
        len: usize,
        remote: Exposed,
    },
}

impl Arrived {
    /// The remote CQ data the sender gave, if any.
    fn data(&self) -> Option<u64> {
        match self {
            Arrived::Eager { data, .. } | Arrived::Rts { data, .. } => *data,
        }
    }
}

#[derive(Debug)]
struct SendState {
    op: OpRef,
    to: PeerEp,
    req: SendReq,
    /// A rendezvous: waiting for Fin.
    rndv: bool,
    /// The receiver's offer, once its Cts came (writing, or written).
    grant: Option<u64>,
}

/// A large message on its way into a receive: read by the receiver, or
/// (an endpoint [`Rdm::with_writes`]) written into the place it offered.
#[derive(Debug)]
struct Pull {
    from: PeerEp,
    msg_id: u64,
    recv: OpRef,
    got: Received,
    truncated: usize,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmError {
    /// The unexpected-message budget is spent (FI_EAGAIN for the sender,
    /// an error for the receiver's side).
    OverBudget,
    /// A multi-receive buffer smaller than its minimum.
    BadMultiRecv,
    /// A peer's message was malformed (the reason).
    Malformed(String),
}

/// One endpoint's messaging state.
pub struct Rdm {
    me: u16,
    eager_max: usize,
    msg: Matcher<Arrived>,
    tagged: Matcher<Arrived>,
    /// Posted receives: the caller's reference by matcher id.
    recvs: FxHashMap<RecvId, (OpRef, Space)>,
    next_recv: u32,
    /// Sends waiting for a Fin or an Ack, by message id.
    sends: FxHashMap<u64, SendState>,
    /// Eager sends waiting for the BTL's send completion (not delivery).
    sent_wait: FxHashSet<OpRef>,
    next_msg_id: u64,
    /// Reads in flight, or (with `writes`) offers waiting for the
    /// sender's Written, by number: the read's, or the offer's grant.
    pulls: FxHashMap<u64, Pull>,
    next_pull: u64,
    /// Large messages are written by their senders into offered places,
    /// not read.
    writes: bool,
    actions: VecDeque<Action>,
}

impl Rdm {
    /// Endpoint `me` of its domain; messages up to `eager_max` bytes go
    /// whole; the unexpected messages of each matching space (FI_MSG,
    /// FI_TAGGED) hold at most `unexpected_max` bytes.
    pub fn new(me: u16, eager_max: usize, unexpected_max: usize) -> Self {
        Rdm {
            me,
            eager_max,
            msg: Matcher::new(unexpected_max),
            tagged: Matcher::new(unexpected_max),
            recvs: FxHashMap::default(),
            next_recv: 0,
            sends: FxHashMap::default(),
            sent_wait: FxHashSet::default(),
            next_msg_id: 1,
            pulls: FxHashMap::default(),
            next_pull: 1,
            writes: false,
            actions: VecDeque::new(),
        }
    }

    /// With `writes`, this endpoint has large messages written into its
    /// receives by their senders (Cts, Written) rather than reading them.
    pub fn with_writes(mut self, writes: bool) -> Self {
        self.writes = writes;
        self
    }

    /// The next thing to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Operations in flight: sends, reads and offers, posted receives.
    pub fn in_flight(&self) -> (usize, usize, usize) {
        (
            self.sends.len() + self.sent_wait.len(),
            self.pulls.len(),
            self.recvs.len(),
        )
    }

    /// Unexpected messages waiting, in both spaces.
    pub fn unexpected_len(&self) -> usize {
        self.msg.unexpected_len() + self.tagged.unexpected_len()
    }

    fn common(&self, to: PeerEp, space: Space, data: Option<u64>, delivery: bool) -> Common {
        let mut f = 0;
        if matches!(space, Space::Tagged(_)) {
            f |= flags::TAGGED;
        }
        if data.is_some() {
            f |= flags::DATA;
        }
        if delivery {
            f |= flags::DELIVERY;
        }
        Common {
            flags: f,
            dst_ep: to.ep,
            src_ep: self.me,
        }
    }

    /// Sends `req` from the caller's buffer, named `op`.
    pub fn send(&mut self, op: OpRef, req: SendReq) {
        let tag = match req.space {
            Space::Msg => 0,
            Space::Tagged(t) => t,
        };
        let msg_id = self.next_msg_id;
        self.next_msg_id += 1;
        let rndv = req.len > self.eager_max;
        if rndv || req.delivery {
            // Completes on the receiver's Fin or Ack.
            let to = req.to;
            self.sends.insert(
                msg_id,
                SendState {
                    op,
                    to,
                    req,
                    rndv,
                    grant: None,
                },
            );
        } else {
            // Completes when the BTL has sent it.
            self.sent_wait.insert(op);
        }
        if rndv {
            self.actions.push_back(Action::Expose { op });
            return;
        }
        let common = self.common(req.to, req.space, req.data, req.delivery);
        let mut header = Vec::with_capacity(wire::COMMON + 16 + 8);
        let ack = req.delivery.then_some(msg_id);
        let data = req.data.unwrap_or(0);
        Msg::Eager {
            common,
            tag,
            data,
            ack,
        }
        .encode(&mut header);
        self.actions.push_back(Action::Send {
            to: req.to,
            header,
            op: Some(op),
            payload_len: req.len,
        });
    }

    /// The driver registered rendezvous send `op`'s buffer (or failed to:
    /// `None`, and the send fails).
    pub fn handle_exposed(&mut self, op: OpRef, exposed: Option<Exposed>) {
        let Some((&msg_id, s)) = self.sends.iter().find(|(_, s)| s.op == op && s.rndv) else {
            return;
        };
        let Some(remote) = exposed else {
            self.sends.remove(&msg_id);
            self.actions.push_back(Action::SendDone {
                op,
                outcome: Outcome::PeerLost,
            });
            return;
        };
        let req = s.req;
        let tag = match req.space {
            Space::Msg => 0,
            Space::Tagged(t) => t,
        };
        let common = self.common(req.to, req.space, req.data, false);
        let mut header = Vec::with_capacity(wire::COMMON + 44);
        Msg::Rts {
            common,
            tag,
            data: req.data.unwrap_or(0),
            msg_id,
            len: req.len as u64,
            addr: remote.addr,
            key: remote.key,
        }
        .encode(&mut header);
        // The offer carries the send: if the BTL refuses it (its peer was
        // lost before it began), no Fin will ever come.
        self.actions.push_back(Action::Send {
            to: req.to,
            header,
            op: Some(op),
            payload_len: 0,
        });
    }

    /// The BTL finished sending send `op`'s message (ok: it was sent; not
    /// ok: the peer is gone). A rendezvous send's offer that went waits
    /// for the receiver's Fin; one that did not fails the send.
    pub fn handle_sent(&mut self, op: OpRef, ok: bool) {
        if self.sent_wait.remove(&op) {
            let outcome = if ok { Outcome::Done } else { Outcome::PeerLost };
            self.actions.push_back(Action::SendDone { op, outcome });
        } else if !ok {
            // A delivery-complete send whose bytes never left, or a
            // rendezvous whose offer never left.
            if let Some((&id, s)) = self.sends.iter().find(|(_, s)| s.op == op) {
                if s.rndv {
                    self.actions.push_back(Action::Unexpose { op });
                }
                self.sends.remove(&id);
                self.actions.push_back(Action::SendDone {
                    op,
                    outcome: Outcome::PeerLost,
                });
            }
        }
    }

    /// Posts a receive of `len` bytes named `recv`; `min_free` makes it a
    /// multi-receive buffer (FI_MSG only).
    pub fn post_recv(
        &mut self,
        recv: OpRef,
        space: Space,
        want: Want,
        len: usize,
        min_free: Option<usize>,
    ) -> Result<(), RdmError> {
        let id = RecvId(self.next_recv);
        self.next_recv = self.next_recv.wrapping_add(1);
        let matcher = match space {
            Space::Msg => &mut self.msg,
            Space::Tagged(_) => &mut self.tagged,
        };
        match matcher
            .post(id, want, len, min_free)
            .map_err(|_| RdmError::BadMultiRecv)?
        {
            Posted::Queued => {
                self.recvs.insert(id, (recv, space));
            }
            Posted::Matched(found) => {
                let released = found.last().is_some_and(|(p, _, _)| p.released);
                if !released {
                    self.recvs.insert(id, (recv, space));
                }
                for (place, head, arrived) in found {
                    self.deliver(recv, place, head, arrived);
                }
            }
        }
        Ok(())
    }

    /// Cancels posted receive `recv`: it completes as cancelled, or false
    /// if it is not posted (already matched, or never posted).
    pub fn cancel_recv(&mut self, recv: OpRef) -> bool {
        let Some((&id, &(_, space))) = self.recvs.iter().find(|(_, (r, _))| *r == recv) else {
            return false;
        };
        let matcher = match space {
            Space::Msg => &mut self.msg,
            Space::Tagged(_) => &mut self.tagged,
        };
        if matcher.cancel(id).is_none() {
            return false;
        }
        self.recvs.remove(&id);
        let got = Received {
            from: Source::Unknown,
            tag: 0,
            len: 0,
            offset: 0,
            data: None,
            released: true,
        };
        self.actions.push_back(Action::RecvDone {
            recv,
            outcome: Outcome::Cancelled,
            got,
        });
        true
    }

    /// FI_PEEK (with `claim`, FI_PEEK | FI_CLAIM) in the tagged space: the
    /// header of the oldest matching message, if one waits, and its remote
    /// CQ data if the sender gave some.
    pub fn peek(&mut self, want: &Want, claim: Option<ClaimId>) -> Option<(Header, Option<u64>)> {
        let found = match claim {
            None => self.tagged.peek(want),
            Some(c) => self.tagged.peek_claim(want, c),
        };
        found.map(|p| (p.head, p.msg.data()))
    }

    /// FI_CLAIM: receive `recv` of `len` bytes takes the message `claim`
    /// claimed; false if there is none.
    pub fn take_claimed(&mut self, recv: OpRef, claim: ClaimId, len: usize) -> bool {
        let Some((head, arrived)) = self.tagged.take_claimed(claim) else {
            return false;
        };
        // A single receive, not one the matcher holds: its id goes unused.
        let place = Place::of(RecvId(u32::MAX), 0, len, head.len, true);
        self.deliver(recv, place, head, arrived);
        true
    }

    /// FI_CLAIM | FI_DISCARD: drops the message `claim` claimed.
    pub fn discard_claimed(&mut self, claim: ClaimId) -> bool {
        match self.tagged.take_claimed(claim) {
            Some((_, arrived)) => {
                self.finish_unread(arrived);
                true
            }
            None => false,
        }
    }

    /// A dropped message's sender still waits: a dropped Rts gets its Fin
    /// (nothing read), a dropped eager message with delivery its Ack.
    fn finish_unread(&mut self, arrived: Arrived) {
        match arrived {
            Arrived::Rts { from, msg_id, .. } => self.control(from, |c| Msg::Fin {
                common: c,
                msg_id,
                status: 0,
            }),
            Arrived::Eager {
                from,
                ack: Some(msg_id),
                ..
            } => self.control(from, |c| Msg::Ack { common: c, msg_id }),
            Arrived::Eager { .. } => {}
        }
    }

    fn control(&mut self, to: PeerEp, make: impl FnOnce(Common) -> Msg) {
        let mut header = Vec::with_capacity(wire::COMMON + 12);
        make(Common {
            flags: 0,
            dst_ep: to.ep,
            src_ep: self.me,
        })
        .encode(&mut header);
        self.actions.push_back(Action::Send {
            to,
            header,
            op: None,
            payload_len: 0,
        });
    }

    /// A message from peer domain `domain` arrived (provider header and
    /// payload); `source` is its address vector entry, if it has one.
    pub fn handle_message(
        &mut self,
        domain: u32,
        source: Source,
        bytes: &[u8],
    ) -> Result<(), RdmError> {
        let (msg, payload) = Msg::decode(bytes).map_err(RdmError::Malformed)?;
        let c = msg.common();
        if c.dst_ep != self.me {
            return Err(RdmError::Malformed(format!(
                "for endpoint {}, this is {}",
                c.dst_ep, self.me
            )));
        }
        let from = PeerEp {
            domain,
            ep: c.src_ep,
        };
        let has_data = c.flags & flags::DATA != 0;
        match msg {
            Msg::Eager { tag, data, ack, .. } => {
                let arrived = Arrived::Eager {
                    from,
                    data: has_data.then_some(data),
                    ack,
                    payload: payload.to_vec(),
                };
                self.arrive(c.flags, source, tag, payload.len(), payload.len(), arrived)
            }
            Msg::Rts {
                tag,
                data,
                msg_id,
                len,
                addr,
                key,
                ..
            } => {
                let len = usize::try_from(len)
                    .map_err(|_| RdmError::Malformed("length beyond this machine".into()))?;
                let arrived = Arrived::Rts {
                    from,
                    data: has_data.then_some(data),
                    msg_id,
                    len,
                    remote: Exposed { addr, key },
                };
                self.arrive(c.flags, source, tag, len, wire::COMMON + 44, arrived)
            }
            Msg::Fin { msg_id, status, .. } => {
                if let Some(s) = self.sends.remove(&msg_id) {
                    debug_assert!(s.to == from);
                    let outcome = if status == 0 {
                        Outcome::Done
                    } else {
                        Outcome::RemoteFailed(status)
                    };
                    if s.rndv {
                        self.actions.push_back(Action::Unexpose { op: s.op });
                    }
                    self.actions
                        .push_back(Action::SendDone { op: s.op, outcome });
                }
                Ok(())
            }
            Msg::Cts {
                msg_id,
                grant,
                len,
                addr,
                key,
                ..
            } => self.handle_cts(from, msg_id, grant, len, Exposed { addr, key }),
            Msg::Written { grant, status, .. } => {
                self.handle_written_notice(from, grant, status);
                Ok(())
            }
            Msg::WriteData { .. } | Msg::KeyQuery { .. } | Msg::KeyReply { .. } => {
                Err(RdmError::Malformed(
                    "an RMA notice or key lookup is the driver's, not a message to match".into(),
                ))
            }
            Msg::Ack { msg_id, .. } => {
                if let Some(s) = self.sends.remove(&msg_id) {
                    self.actions.push_back(Action::SendDone {
                        op: s.op,
                        outcome: Outcome::Done,
                    });
                }
                Ok(())
            }
        }
    }

    fn arrive(
        &mut self,
        f: u16,
        source: Source,
        tag: u64,
        len: usize,
        held: usize,
        arrived: Arrived,
    ) -> Result<(), RdmError> {
        let head = Header {
            from: source,
            tag,
            len,
        };
        let matcher = if f & flags::TAGGED != 0 {
            &mut self.tagged
        } else {
            &mut self.msg
        };
        match matcher.arrive(head, arrived, held) {
            Arrival::Queued => Ok(()),
            Arrival::OverBudget(arrived) => {
                // Refused: an Rts gets a failed Fin, so its send fails; an
                // eager message is dropped, and the caller reports the
                // overrun (this returns OverBudget).
                if let Arrived::Rts { from, msg_id, .. } = arrived {
                    self.control(from, |c| Msg::Fin {
                        common: c,
                        msg_id,
                        status: 1,
                    });
                }
                Err(RdmError::OverBudget)
            }
            Arrival::Matched(place, arrived) => {
                let (recv, _) = *self
                    .recvs
                    .get(&place.recv)
                    .expect("a matched receive is posted");
                if place.released {
                    self.recvs.remove(&place.recv);
                }
                self.deliver(recv, place, head, arrived);
                Ok(())
            }
        }
    }

    fn deliver(&mut self, recv: OpRef, place: Place, head: Header, arrived: Arrived) {
        let outcome = if place.truncated > 0 {
            Outcome::Truncated(place.truncated)
        } else {
            Outcome::Done
        };
        let data = arrived.data();
        let got = Received {
            from: head.from,
            tag: head.tag,
            len: place.len,
            offset: place.offset,
            data,
            released: place.released,
        };
        match arrived {
            Arrived::Eager {
                from,
                ack,
                mut payload,
                ..
            } => {
                payload.truncate(place.len);
                if !payload.is_empty() {
                    self.actions.push_back(Action::CopyIn {
                        recv,
                        offset: place.offset,
                        bytes: payload,
                    });
                }
                self.actions
                    .push_back(Action::RecvDone { recv, outcome, got });
                if let Some(msg_id) = ack {
                    self.control(from, |c| Msg::Ack { common: c, msg_id });
                }
            }
            Arrived::Rts { from, msg_id, .. } if place.len == 0 => {
                self.actions
                    .push_back(Action::RecvDone { recv, outcome, got });
                self.control(from, |c| Msg::Fin {
                    common: c,
                    msg_id,
                    status: 0,
                });
            }
            Arrived::Rts {
                from,
                msg_id,
                remote,
                ..
            } => {
                let pull = Pull {
                    from,
                    msg_id,
                    recv,
                    got,
                    truncated: place.truncated,
                };
                let id = self.next_pull;
                self.next_pull += 1;
                self.pulls.insert(id, pull);
                let (offset, len) = (place.offset, place.len);
                if self.writes {
                    self.actions.push_back(Action::ExposeRecv {
                        grant: id,
                        recv,
                        offset,
                        len,
                    });
                } else {
                    self.actions.push_back(Action::Read {
                        read: id,
                        from,
                        remote,
                        recv,
                        offset,
                        len,
                    });
                }
            }
        }
    }

    /// Read `read` finished (ok, or failed: the peer is gone or refused).
    pub fn handle_read(&mut self, read: u64, ok: bool) {
        if let Some(r) = self.pulls.remove(&read) {
            self.finish_pull(r, ok);
        }
    }

    /// The driver registered the place of offer `grant` (or failed to:
    /// `None`, and the receive fails, and so does the send).
    pub fn handle_recv_exposed(&mut self, grant: u64, exposed: Option<Exposed>) {
        let Some(g) = self.pulls.get(&grant) else {
            return;
        };
        let Some(place) = exposed else {
            let g = self.pulls.remove(&grant).expect("found");
            self.finish_pull(g, false);
            return;
        };
        let (from, msg_id, len) = (g.from, g.msg_id, g.got.len as u64);
        self.control(from, |c| Msg::Cts {
            common: c,
            msg_id,
            grant,
            len,
            addr: place.addr,
            key: place.key,
        });
    }

    /// A receiver offered `len` bytes at `place` for message `msg_id`.
    fn handle_cts(
        &mut self,
        from: PeerEp,
        msg_id: u64,
        grant: u64,
        len: u64,
        place: Exposed,
    ) -> Result<(), RdmError> {
        let Some(s) = self.sends.get_mut(&msg_id) else {
            // The send already ended (its peer was lost): nothing to write.
            return Ok(());
        };
        if s.to != from || !s.rndv || s.grant.is_some() || len > s.req.len as u64 {
            return Err(RdmError::Malformed(format!(
                "an offer of {len} bytes for message {msg_id}, which is not a {}-byte \
                 rendezvous to that peer waiting for one",
                s.req.len
            )));
        }
        s.grant = Some(grant);
        let (op, to) = (s.op, s.to);
        self.actions.push_back(Action::Write {
            msg_id,
            op,
            to,
            remote: place,
            len: len as usize,
        });
        Ok(())
    }

    /// The writes of message `msg_id` finished (ok, or failed: the peer is
    /// gone or refused). The receiver hears it; a failed send ends here.
    pub fn handle_written(&mut self, msg_id: u64, ok: bool) {
        let Some(s) = self.sends.get(&msg_id) else {
            return;
        };
        let (to, op) = (s.to, s.op);
        let Some(grant) = s.grant else {
            return;
        };
        let status = if ok { 0 } else { 2 };
        self.control(to, |c| Msg::Written {
            common: c,
            grant,
            status,
        });
        if !ok {
            self.sends.remove(&msg_id);
            self.actions.push_back(Action::Unexpose { op });
            self.actions.push_back(Action::SendDone {
                op,
                outcome: Outcome::PeerLost,
            });
        }
    }

    /// The sender of offer `grant` wrote into it (status 0) or failed.
    fn handle_written_notice(&mut self, from: PeerEp, grant: u64, status: u32) {
        // A reading endpoint offered nothing: its reads are not the
        // peer's to end.
        if self.writes && self.pulls.get(&grant).is_some_and(|g| g.from == from) {
            let g = self.pulls.remove(&grant).expect("found");
            self.actions.push_back(Action::UnexposeRecv { grant });
            self.finish_pull(g, status == 0);
        }
    }

    /// A large message's bytes are in (ok) or will not come: the receive
    /// completes and the sender hears it (Fin).
    fn finish_pull(&mut self, r: Pull, ok: bool) {
        let outcome = match (ok, r.truncated) {
            (false, _) => Outcome::PeerLost,
            (true, 0) => Outcome::Done,
            (true, t) => Outcome::Truncated(t),
        };
        self.actions.push_back(Action::RecvDone {
            recv: r.recv,
            outcome,
            got: r.got,
        });
        let status = if ok { 0 } else { 2 };
        self.control(r.from, |c| Msg::Fin {
            common: c,
            msg_id: r.msg_id,
            status,
        });
    }

    /// Peer domain `domain` is lost: every send to it, read from it and
    /// offer to it fails, and its unexpected messages are dropped.
    pub fn handle_peer_lost(&mut self, domain: u32) {
        let mut lost: Vec<(u64, OpRef, bool)> = self
            .sends
            .iter()
            .filter(|(_, s)| s.to.domain == domain)
            .map(|(&id, s)| (id, s.op, s.rndv))
            .collect();
        lost.sort_unstable();
        for (id, op, rndv) in lost {
            self.sends.remove(&id);
            if rndv {
                self.actions.push_back(Action::Unexpose { op });
            }
            self.actions.push_back(Action::SendDone {
                op,
                outcome: Outcome::PeerLost,
            });
        }
        // Its reads and offers, in the order they began.
        let mut pulls: Vec<u64> = self
            .pulls
            .iter()
            .filter(|(_, r)| r.from.domain == domain)
            .map(|(&id, _)| id)
            .collect();
        pulls.sort_unstable();
        for id in pulls {
            let r = self.pulls.remove(&id).expect("listed");
            if self.writes {
                self.actions.push_back(Action::UnexposeRecv { grant: id });
            }
            self.actions.push_back(Action::RecvDone {
                recv: r.recv,
                outcome: Outcome::PeerLost,
                got: r.got,
            });
        }
        for matcher in [&mut self.msg, &mut self.tagged] {
            matcher.retain_unexpected(|a| match a {
                Arrived::Eager { from, .. } | Arrived::Rts { from, .. } => from.domain != domain,
            });
        }
    }
}

#[cfg(test)]
mod tests;
