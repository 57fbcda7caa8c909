//! Rendezvous, for messages above the eager limit. Both ends of every
//! rendezvous of a rank live here, keyed by the sender's message id.
//!
//! - **get**: the sender's RTS names its registered data; the receiver
//!   reads it into a registered sink in fragments, `pipeline` in flight at
//!   once, delivers it, and answers ATS, upon which the sender's operation
//!   is done.
//! - **put**: the RTS carries only the length; the receiver answers RTR
//!   with its sink; the sender writes the fragments and sends FIN after the
//!   last one, on the same connection, so that when FIN arrives the data
//!   has landed; the receiver delivers on FIN and answers ATS, upon which
//!   the sender's operation is done.
//!
//! A put whose connection broke may have lost writes that had completed
//! (on iWARP a write completes when it leaves). Its FIN then goes out
//! marked [`RESUME`] (decided when it is posted: some write went on
//! another connection than the FIN, or was lost with one), and the
//! receiver, which has not delivered, answers with its RTR again: the
//! sender writes everything anew and sends a plain FIN. If the receiver
//! had the first FIN already, the marked one is a duplicate and dropped,
//! and the ATS it sent completes the sender. Writes lost with their
//! connection are never posted again on another: the receiver may have
//! delivered and reused the sink.
//!
//! Replies are matched by message id *and* peer: a reply from anyone but
//! the rendezvous's peer is ignored.
//!
//! The machine does no I/O: the caller registers the source and the sink
//! and passes them in ([`Local`]) with an opaque payload (`S` for the
//! sender's source, `K` for the receiver's sink) that comes back when the
//! machine is done with it, and it posts the work the machine asks for
//! ([`Act`]).

use std::collections::{HashMap, VecDeque};

use xrcbtl_fabric::RemoteAddr;
use xrcbtl_xrc_conn::Rank;

use super::{Local, MsgId, Owner, Rdma, RdmaOp};
use crate::types::{BtlError, Tag};
use crate::wire::{self, Kind, Rtr, Rts};

/// The bit of a FIN's message id that asks the receiver for its RTR again
/// (message ids count from 1 and never reach it).
pub(crate) const RESUME: MsgId = 1 << 63;

/// How rendezvous are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RndvConfig {
    /// The sender asks for put (else get).
    pub put: bool,
    /// Bytes per fragment.
    pub frag: u64,
    /// Fragments of one rendezvous in flight at once.
    pub pipeline: u32,
}

/// A rendezvous control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Request to send.
    Rts(Rts),
    /// Ready to receive (put).
    Rtr(Rtr),
    /// Everything was read (get).
    Ats(MsgId),
    /// Everything was written (put).
    Fin(MsgId),
    /// The rendezvous is refused.
    Nak(MsgId),
}

impl Control {
    /// The message kind that carries it.
    pub fn kind(&self) -> Kind {
        match self {
            Control::Rts(_) => Kind::Rts,
            Control::Rtr(_) => Kind::Rtr,
            Control::Ats(_) => Kind::Ats,
            Control::Fin(_) => Kind::Fin,
            Control::Nak(_) => Kind::Nak,
        }
    }

    /// Writes the payload into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8; wire::CONTROL_MAX]) -> usize {
        let mut put = |b: &[u8]| {
            out[..b.len()].copy_from_slice(b);
            b.len()
        };
        match self {
            Control::Rts(r) => put(&r.encode()),
            Control::Rtr(r) => put(&r.encode()),
            Control::Ats(m) | Control::Fin(m) | Control::Nak(m) => put(&wire::encode_msg_id(*m)),
        }
    }

    /// Reads a control message of `kind`; `None` when malformed.
    pub fn decode(kind: Kind, body: &[u8]) -> Option<Control> {
        match kind {
            Kind::Rts => Rts::decode(body).map(Control::Rts),
            Kind::Rtr => Rtr::decode(body).map(Control::Rtr),
            Kind::Ats => wire::decode_msg_id(body).map(Control::Ats),
            Kind::Fin => wire::decode_msg_id(body).map(Control::Fin),
            Kind::Nak => wire::decode_msg_id(body).map(Control::Nak),
            Kind::Eager | Kind::Credit | Kind::Part => None,
        }
    }
}

/// What the machine asks of its caller.
#[derive(Debug)]
pub(crate) enum Act<S, K> {
    /// Send a control message to `peer` (in its sequence).
    Send {
        /// To whom.
        peer: Rank,
        /// The tag (the RTS carries the user's; the others 0).
        tag: Tag,
        /// What.
        ctl: Control,
    },
    /// Post an RDMA fragment to `peer`.
    Rdma {
        /// To whom.
        peer: Rank,
        /// What.
        rdma: Rdma,
    },
    /// A rendezvous from `peer` is complete: `len` bytes in the sink.
    Deliver {
        /// The sender.
        peer: Rank,
        /// Its tag.
        tag: Tag,
        /// Bytes.
        len: u64,
        /// The sink.
        sink: K,
    },
    /// A rendezvous this rank sent is over, well or not: the source is
    /// free.
    Finished {
        /// The sender's operation.
        op: u64,
        /// The source.
        src: S,
        /// How it ended.
        result: Result<(), BtlError>,
    },
    /// A rendezvous this rank received was abandoned: the sink is free.
    Release {
        /// The sink.
        sink: K,
    },
}

struct Out<S> {
    peer: Rank,
    op: u64,
    len: u64,
    src: Local,
    /// The receiver's sink (put, once RTR came).
    remote: Option<RemoteAddr>,
    next: u64,
    done: u64,
    payload: S,
    /// Put: the local QP number the writes since the last RTR went on.
    qp: Option<u32>,
    /// Put: a write went on another connection, or was lost with one.
    mixed: bool,
}

impl<S> Out<S> {
    /// Put: the FIN after the last write is asked for (nothing is left to
    /// write since the last RTR).
    fn fin_asked(&self) -> bool {
        self.next >= self.len
    }
}

struct In<K> {
    tag: Tag,
    len: u64,
    put: bool,
    remote: RemoteAddr,
    sink: Local,
    next: u64,
    done: u64,
    payload: K,
}

/// Every rendezvous of one rank.
pub(crate) struct Rndv<S, K> {
    cfg: RndvConfig,
    next_msg: MsgId,
    outs: HashMap<MsgId, Out<S>>,
    ins: HashMap<(Rank, MsgId), In<K>>,
    acts: VecDeque<Act<S, K>>,
}

impl<S, K> Rndv<S, K> {
    /// Whether the sender writes the data (put), else the receiver reads
    /// it (get).
    pub fn puts(&self) -> bool {
        self.cfg.put
    }

    /// No rendezvous yet.
    pub fn new(cfg: RndvConfig) -> Self {
        assert!(cfg.frag > 0 && cfg.pipeline > 0, "{cfg:?}");
        Rndv {
            cfg,
            next_msg: 1,
            outs: HashMap::new(),
            ins: HashMap::new(),
            acts: VecDeque::new(),
        }
    }

    /// The next thing to do.
    pub fn poll(&mut self) -> Option<Act<S, K>> {
        self.acts.pop_front()
    }

    /// Whether an action waits for [`Rndv::poll`].
    #[inline]
    pub fn has_acts(&self) -> bool {
        !self.acts.is_empty()
    }

    /// Whether no rendezvous is in progress and nothing is asked.
    pub fn is_idle(&self) -> bool {
        self.outs.is_empty() && self.ins.is_empty() && self.acts.is_empty()
    }

    /// The peers a rendezvous in progress waits on (for its RTR, ATS or
    /// FIN), each once, in order.
    pub fn waiting_on(&self) -> Vec<Rank> {
        let mut v: Vec<Rank> = self
            .outs
            .values()
            .map(|o| o.peer)
            .chain(self.ins.keys().map(|k| k.0))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Rendezvous sent and received in progress, and actions asked.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.outs.len(), self.ins.len(), self.acts.len())
    }

    /// Sender: starts sending `len` bytes of registered `src` to `peer`
    /// for operation `op`.
    pub fn send(
        &mut self,
        peer: Rank,
        tag: Tag,
        len: u64,
        src: Local,
        op: u64,
        payload: S,
    ) -> MsgId {
        let msg = self.next_msg;
        self.next_msg += 1;
        let put = self.cfg.put;
        self.outs.insert(
            msg,
            Out {
                peer,
                op,
                len,
                src,
                remote: None,
                next: 0,
                done: 0,
                payload,
                qp: None,
                mixed: false,
            },
        );
        let rts = Rts {
            msg,
            len,
            addr: if put { 0 } else { src.addr },
            rkey: if put { 0 } else { src.rkey },
            put,
        };
        self.acts.push_back(Act::Send {
            peer,
            tag,
            ctl: Control::Rts(rts),
        });
        msg
    }

    /// Receiver: `peer` asks to send `rts.len` bytes into `sink` (which the
    /// caller registered for them). The sink comes back if the request is
    /// refused (empty, or a message id already in progress).
    pub fn on_rts(
        &mut self,
        peer: Rank,
        tag: Tag,
        rts: Rts,
        sink: Local,
        payload: K,
    ) -> Result<(), K> {
        if rts.len == 0 || self.ins.contains_key(&(peer, rts.msg)) {
            return Err(payload);
        }
        self.ins.insert(
            (peer, rts.msg),
            In {
                tag,
                len: rts.len,
                put: rts.put,
                remote: RemoteAddr {
                    addr: rts.addr,
                    rkey: rts.rkey,
                },
                sink,
                next: 0,
                done: 0,
                payload,
            },
        );
        if rts.put {
            self.send_rtr(peer, rts.msg);
        } else {
            for _ in 0..self.cfg.pipeline {
                self.next_read(peer, rts.msg);
            }
        }
        Ok(())
    }

    /// Sender: `peer` offers its sink (put). Returns whether it matched a
    /// rendezvous waiting for it.
    pub fn on_rtr(&mut self, peer: Rank, rtr: Rtr) -> bool {
        match self.outs.get_mut(&rtr.msg) {
            Some(o) if o.peer == peer && self.cfg.put && o.remote.is_none() => {
                o.remote = Some(RemoteAddr {
                    addr: rtr.addr,
                    rkey: rtr.rkey,
                });
            }
            _ => return false,
        }
        for _ in 0..self.cfg.pipeline {
            self.next_write(rtr.msg);
        }
        true
    }

    /// Receiver: the request `msg` from `peer` cannot be taken (too long,
    /// no memory): the sender is told.
    pub fn refuse(&mut self, peer: Rank, msg: MsgId) {
        self.answer(peer, Control::Nak(msg));
    }

    /// Sender: `peer` refused `msg`. Returns whether it matched.
    pub fn on_nak(&mut self, peer: Rank, msg: MsgId) -> bool {
        let e = BtlError::Transfer(xrcbtl_fabric::WcStatus::RemoteInvalidRequest);
        self.finish_from(peer, msg, Err(e))
    }

    /// Sender: `peer` has the data (read it, or was written it and saw
    /// FIN). Returns whether it matched.
    pub fn on_ats(&mut self, peer: Rank, msg: MsgId) -> bool {
        self.finish_from(peer, msg, Ok(()))
    }

    /// Receiver: `peer` has written everything (put), or asks for the RTR
    /// again ([`RESUME`]). Returns whether it matched.
    pub fn on_fin(&mut self, peer: Rank, msg: MsgId) -> bool {
        let resume = msg & RESUME != 0;
        let msg = msg & !RESUME;
        if !self.ins.get(&(peer, msg)).is_some_and(|i| i.put) {
            return false;
        }
        if resume {
            self.send_rtr(peer, msg);
        } else {
            self.deliver(peer, msg);
        }
        true
    }

    /// Sender: a write of `msg` is posted on local QP `qpn`.
    pub fn write_posted(&mut self, msg: MsgId, qpn: u32) {
        if let Some(o) = self.outs.get_mut(&msg) {
            if *o.qp.get_or_insert(qpn) != qpn {
                o.mixed = true;
            }
        }
    }

    /// Sender: a write of `msg` was lost with its connection (it is not
    /// posted again). The FIN, asked for now if it was not yet, will ask
    /// the receiver for its RTR again.
    pub fn write_lost(&mut self, msg: MsgId) {
        let Some(o) = self.outs.get_mut(&msg) else {
            return;
        };
        o.mixed = true;
        if !o.fin_asked() {
            // No more writes until the receiver answers.
            o.next = o.len;
            let peer = o.peer;
            self.answer(peer, Control::Fin(msg));
        }
    }

    /// Sender: a FIN whose body is `body` is about to be posted on local
    /// QP `qpn`. Returns the body to post instead when it must ask for the
    /// RTR again (marked [`RESUME`]): some write may not have landed. A
    /// body already marked, or of no rendezvous of this side's, goes as
    /// it is.
    pub fn fin_posted(&mut self, body: [u8; 8], qpn: u32) -> Option<[u8; 8]> {
        let msg = MsgId::from_le_bytes(body);
        (msg & RESUME == 0 && self.fin_resumes(msg, qpn)).then(|| (msg | RESUME).to_le_bytes())
    }

    /// Sender: the FIN of `msg` is about to be posted on local QP `qpn`.
    /// Returns whether it must ask for the RTR again ([`RESUME`]): some
    /// write may not have landed. The rendezvous then starts over when the
    /// RTR comes.
    fn fin_resumes(&mut self, msg: MsgId, qpn: u32) -> bool {
        let Some(o) = self.outs.get_mut(&msg) else {
            return false;
        };
        if !o.mixed && o.qp.is_none_or(|q| q == qpn) {
            return false;
        }
        o.remote = None;
        o.next = 0;
        o.qp = None;
        o.mixed = false;
        true
    }

    /// A fragment completed.
    pub fn on_rdma_done(&mut self, owner: Owner, len: u64) {
        match owner {
            Owner::RndvIn { peer, msg } => {
                let Some(i) = self.ins.get_mut(&(peer, msg)) else {
                    return;
                };
                i.done += len;
                if i.done < i.len {
                    self.next_read(peer, msg);
                    return;
                }
                self.deliver(peer, msg);
            }
            Owner::RndvOut { msg } => {
                if let Some(o) = self.outs.get_mut(&msg) {
                    o.done += len;
                    self.next_write(msg);
                }
            }
            Owner::Op { .. }
            | Owner::Fenced { .. }
            | Owner::Fence { .. }
            | Owner::Atomic { .. } => {}
        }
    }

    /// A fragment failed for good (a key or a range the device refused, or
    /// too many broken connections): the rendezvous is over. A receiver
    /// gives up its sink and, unless its peer is gone, tells the sender
    /// with a NAK, which fails the sender's operation.
    pub fn on_rdma_failed(&mut self, owner: Owner, e: BtlError) {
        match owner {
            Owner::RndvIn { peer, msg } => {
                if let Some(i) = self.ins.remove(&(peer, msg)) {
                    self.acts.push_back(Act::Release { sink: i.payload });
                    if matches!(e, BtlError::Transfer(_)) {
                        self.answer(peer, Control::Nak(msg));
                    }
                }
            }
            Owner::RndvOut { msg } => {
                if self.outs.contains_key(&msg) {
                    self.finish(msg, Err(e));
                }
            }
            Owner::Op { .. }
            | Owner::Fenced { .. }
            | Owner::Fence { .. }
            | Owner::Atomic { .. } => {}
        }
    }

    /// A rendezvous message this rank sent could not be delivered: the
    /// rendezvous it starts or ends is over.
    pub fn on_control_lost(&mut self, peer: Rank, ctl: Control, e: BtlError) {
        match ctl {
            Control::Rts(Rts { msg, .. }) | Control::Fin(msg) => {
                self.finish_from(peer, msg, Err(e));
            }
            Control::Rtr(r) => {
                if let Some(i) = self.ins.remove(&(peer, r.msg)) {
                    self.acts.push_back(Act::Release { sink: i.payload });
                }
            }
            Control::Ats(_) | Control::Nak(_) => {}
        }
    }

    /// `peer` is gone: every rendezvous with it is over.
    pub fn fail_peer(&mut self, peer: Rank, e: &BtlError) {
        let mut outs: Vec<MsgId> = self
            .outs
            .iter()
            .filter(|(_, o)| o.peer == peer)
            .map(|(m, _)| *m)
            .collect();
        outs.sort_unstable();
        for m in outs {
            self.finish(m, Err(e.clone()));
        }
        let mut ins: Vec<(Rank, MsgId)> =
            self.ins.keys().filter(|k| k.0 == peer).copied().collect();
        ins.sort_unstable();
        for k in ins {
            let i = self.ins.remove(&k).expect("listed");
            self.acts.push_back(Act::Release { sink: i.payload });
        }
    }

    /// Ends the rendezvous `msg` this rank sends, if `peer` is its
    /// receiver; returns whether it was.
    fn finish_from(&mut self, peer: Rank, msg: MsgId, result: Result<(), BtlError>) -> bool {
        let ok = self.outs.get(&msg).is_some_and(|o| o.peer == peer);
        if ok {
            self.finish(msg, result);
        }
        ok
    }

    /// Sends `ctl` to `peer` (control messages carry no tag).
    fn answer(&mut self, peer: Rank, ctl: Control) {
        self.acts.push_back(Act::Send { peer, tag: 0, ctl });
    }

    /// Receiver: offers `peer` the sink of `msg` (put).
    fn send_rtr(&mut self, peer: Rank, msg: MsgId) {
        let sink = self.ins[&(peer, msg)].sink;
        self.answer(
            peer,
            Control::Rtr(Rtr {
                msg,
                addr: sink.addr,
                rkey: sink.rkey,
            }),
        );
    }

    /// Receiver: the data of `msg` from `peer` is all in the sink: it is
    /// delivered, and the sender told (ATS).
    fn deliver(&mut self, peer: Rank, msg: MsgId) {
        let i = self
            .ins
            .remove(&(peer, msg))
            .expect("checked by the caller");
        self.acts.push_back(Act::Deliver {
            peer,
            tag: i.tag,
            len: i.len,
            sink: i.payload,
        });
        self.answer(peer, Control::Ats(msg));
    }

    fn finish(&mut self, msg: MsgId, result: Result<(), BtlError>) {
        let o = self.outs.remove(&msg).expect("checked by the caller");
        self.acts.push_back(Act::Finished {
            op: o.op,
            src: o.payload,
            result,
        });
    }

    fn next_read(&mut self, peer: Rank, msg: MsgId) {
        let frag = self.cfg.frag;
        let Some(i) = self.ins.get_mut(&(peer, msg)) else {
            return;
        };
        if i.next >= i.len {
            return;
        }
        let off = i.next;
        let len = frag.min(i.len - off);
        i.next += len;
        let rdma = Rdma {
            op: RdmaOp::Read,
            local: i.sink.sge(off, len as u32),
            remote: RemoteAddr {
                addr: i.remote.addr + off,
                rkey: i.remote.rkey,
            },
            owner: Owner::RndvIn { peer, msg },
        };
        self.acts.push_back(Act::Rdma { peer, rdma });
    }

    fn next_write(&mut self, msg: MsgId) {
        let frag = self.cfg.frag;
        let Some(o) = self.outs.get_mut(&msg) else {
            return;
        };
        let Some(remote) = o.remote else { return };
        if o.next >= o.len {
            return;
        }
        let off = o.next;
        let len = frag.min(o.len - off);
        o.next += len;
        let peer = o.peer;
        let rdma = Rdma {
            op: RdmaOp::Write,
            local: o.src.sge(off, len as u32),
            remote: RemoteAddr {
                addr: remote.addr + off,
                rkey: remote.rkey,
            },
            owner: Owner::RndvOut { msg },
        };
        let last = o.fin_asked();
        self.acts.push_back(Act::Rdma { peer, rdma });
        if last {
            // After the last write, on the same connection: when the peer
            // sees FIN, the data has landed.
            self.answer(peer, Control::Fin(msg));
        }
    }
}
