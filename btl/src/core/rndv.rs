//! What arrives, acted on: credits returned and rendezvous control from
//! the receive side, a message's buffer given back once the user consumed
//! it, and the glue between the rendezvous machine and the rest (a sink
//! found and registered for an RTS, its actions turned into work and
//! deliveries).

use bytes::Bytes;
use xrcbtl_fabric::{Access, Context, RecvDone, Result, WorkCompletion};
use xrcbtl_xrc_conn::Rank;

use crate::callbacks::DoneFn;
use crate::config::MAX_RNDV;
use crate::delivery::{Body, Delivery, Short};
use crate::pools::{sink_start, Sink, Source};
use crate::proto::rndv::{Act, Control};
use crate::proto::Local;
use crate::recv::{Credited, Got, ShortView};
use crate::types::{BtlError, Tag};
use crate::wire::{self, HEADER};
use crate::work::{Item, Msg, Store, Work};

use super::Core;

impl<C: Context, H> Core<C, H> {
    /// Polls the receive CQ and reads what it found: the full path's poll
    /// ([`Core::poll_full`]; the quiet path's is made without the lock, and
    /// read by [`Core::quiet_found`]).
    #[inline(always)]
    pub(super) fn poll_recv(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        let n = self.recv.poll(&self.iface.recv_cq, wcs);
        if n > 0 {
            self.read_polled(&wcs[..n]);
        }
        self.repost_due();
        n
    }

    /// [`Core::poll_recv`]'s reading, for a quiet progress call whose poll
    /// found completions (`wcs`): read in the caller's frame. That call saves every
    /// register it may use on entry, the empty ones too, so a frame of
    /// the reading's own would cost the receiving call its set-up and
    /// save nothing on the others. Returns whether any completion took
    /// the general path.
    #[inline(always)]
    pub(super) fn read_found(&mut self, wcs: &[WorkCompletion]) -> bool {
        let general = self.read_all(wcs);
        self.repost_due();
        general
    }

    /// [`Core::read_found`] for exactly one completion, `wc`: a short
    /// message that found no delivery waiting is left in `out` rather than
    /// queued, for the caller to hand to its callback (it is the oldest
    /// delivery: [`crate::delivery::Deliveries::hold_oldest`] puts it back
    /// in line if it cannot be handed on). Returns whether the completion
    /// took the general path.
    #[inline(always)]
    pub(super) fn read_found_one(&mut self, wc: &WorkCompletion, out: &mut Option<Short>) -> bool {
        let general = self.read_one(wc, out);
        self.found_one_rest(out);
        general
    }

    /// [`Core::read_found_one`] for a receive that succeeded, `wc`, read
    /// in place by the poll ([`xrcbtl_fabric::Cq::staged_recv`]): `None`,
    /// having changed nothing, when the straight line declines it (the
    /// caller then reads it whole).
    /// Unlike [`Core::read_found_one`], it leaves the buffers due to be
    /// posted again to the caller ([`Core::repost_due`]), which looks at
    /// them together with the rest of what may be left to do.
    #[inline(always)]
    pub(super) fn read_found_recv(&mut self, wc: RecvDone, out: &mut Option<Short>) -> Option<()> {
        self.read_short(wc, out)?;
        self.queue_behind(out);
        Some(())
    }

    /// The end of reading one completion found alone: a short message
    /// left in `out` goes into line behind the deliveries already there
    /// (it may go straight to its callback only when none is), and the
    /// buffers due are posted again.
    #[inline(always)]
    fn found_one_rest(&mut self, out: &mut Option<Short>) {
        self.queue_behind(out);
        self.repost_due();
    }

    /// A short message left in `out` goes into line behind the deliveries
    /// already there, if any.
    #[inline(always)]
    fn queue_behind(&mut self, out: &mut Option<Short>) {
        if !self.deliveries.is_empty() {
            if let Some(s) = out.take() {
                self.deliveries.push_short(s);
            }
        }
    }

    /// Posts the receive buffers due again. Also after a poll that found
    /// nothing: buffers come back from deliveries after the poll that
    /// found their messages.
    #[inline(always)]
    pub(super) fn repost_due(&mut self) {
        if self.iface.repost_due().is_err() {
            self.stats.no_resource += 1;
        }
    }

    /// Reads what the last poll found, for the full path. Out of line, as
    /// is rendezvous control: an empty poll then sets up no frame for
    /// them.
    #[inline(never)]
    fn read_polled(&mut self, wcs: &[WorkCompletion]) {
        self.read_all(wcs);
    }

    /// Reads the completions a poll found, `wcs`: each by the straight
    /// line, else by the general path. Returns whether any took the
    /// general path.
    #[inline(always)]
    fn read_all(&mut self, wcs: &[WorkCompletion]) -> bool {
        let mut general = false;
        for wc in wcs {
            let mut short = None;
            general |= self.read_one(wc, &mut short);
            if let Some(s) = short {
                self.deliveries.push_short(s);
            }
        }
        general
    }

    /// Reads completion `wc`: by the straight line, which leaves the short
    /// message it copied out in `out` (not queued), else by the general
    /// path, which queues what it delivers. Returns whether it took the
    /// general path.
    #[inline(always)]
    fn read_one(&mut self, wc: &WorkCompletion, out: &mut Option<Short>) -> bool {
        if let Some(done) = wc.recv_done() {
            if self.read_short(done, out).is_some() {
                return false;
            }
        }
        self.read_general(wc);
        true
    }

    /// The straight line for receive `wc` ([`crate::recv::Recv::short_eager`]), with
    /// the credits it brought settled: `None`, having changed nothing,
    /// for a message it does not take.
    #[inline(always)]
    fn read_short(&mut self, wc: RecvDone, out: &mut Option<Short>) -> Option<()> {
        let fc = self.iface.credits();
        let mut short = ShortView {
            iface: &mut self.iface,
            qp_gen: self.drv.qp_gen(),
            eps: &mut self.eps,
            stats: &mut self.stats,
            sends: &mut self.sends,
            cap: self.cfg.credits,
            fc,
        };
        match self.recv.short_eager(&mut short, wc, out)? {
            Credited::Settled => {}
            Credited::Retire(slot) => self.retire_arrived(slot),
            Credited::Elsewhere(returned) => self.arrived(returned),
        }
        Some(())
    }

    /// The general path for completion `wc`, out of line with the view it
    /// lends: the straight line's loop then keeps no address of it
    /// (measured: 15 field addresses worked out before the loop and kept
    /// on the stack, on every receiving call).
    #[inline(never)]
    fn read_general(&mut self, wc: &WorkCompletion) {
        let (recv, mut v) = self.recv();
        if let Some(got) = recv.on_completion(&mut v, wc) {
            self.on_got(got);
        }
    }

    /// Acts on what a message brought: credits returned, then rendezvous
    /// control.
    pub(super) fn on_got(&mut self, got: Got) {
        if let Some(returned) = got.returned {
            self.arrived(returned);
        }
        if let Some((src, tag, ctl)) = got.ctl {
            self.on_control(src, tag, ctl);
        }
    }

    #[inline(never)]
    fn on_control(&mut self, src: Rank, tag: Tag, ctl: Control) {
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
                if self.iface.repost_due().is_err() {
                    self.stats.no_resource += 1;
                }
                let Some((src, qpn)) = credit else { return };
                let Some(ei) = self.eps.find(src) else { return };
                // A connection gone meanwhile took its credits with it:
                // nothing is owed on it any more.
                let cap = self.cfg.credits;
                let owe = self.eps.get_mut(ei).credits.existing(qpn);
                if owe.is_some_and(|c| c.owe(cap)) {
                    self.eps.requeue(ei, Item::credit());
                }
            }
        }
    }

    /// A peer asks to send a rendezvous: find a sink, register it, start.
    pub(super) fn on_rts(&mut self, src: Rank, tag: Tag, rts: wire::Rts) {
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
    pub(super) fn queue_control(&mut self, peer: Rank, tag: Tag, ctl: Control) {
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
}
