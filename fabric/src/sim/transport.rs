//! The simulated RC/XRC transport: posting, transmission, delivery,
//! acknowledgements, RNR and transport retries, flushes.
//!
//! Model: each requester QP transmits its send queue in order; a packet
//! reaches the responder after the wire latency plus its serialisation time,
//! never before an earlier packet of the same QP. The responder checks
//! everything the hardware checks (QP state and pairing, PSN, XRC SRQ number,
//! rkey, PD, access, bounds, receive available) and answers with an ACK, read
//! data, an RNR NAK or a fatal NAK. A lost answer leads to the requester's
//! ACK timeout and a go-back-N retransmission; `retry_cnt` timeouts in a row
//! give `RetryExceeded`, `rnr_retry` RNR NAKs for one request give
//! `RnrRetryExceeded`. Duplicates are recognised by PSN and acknowledged
//! again without a second delivery, so every message lands exactly once.

use std::sync::Arc;

use super::arena::Id;
use super::memory::{dma_read, dma_write};
use super::world::{Cqe, DevIdx, PdObj, QpErrorEvent, QpObj, RecvWqe, SqEntry, SrqObj, World};
use crate::types::*;
use crate::{Error, Result};

/// A packet on its way to a responder.
pub(crate) struct Delivery {
    pub src: Id<QpObj>,
    pub src_dev: DevIdx,
    pub src_qpn: u32,
    pub dst_dev: Option<DevIdx>,
    pub dst_qpn: u32,
    pub psn: u64,
    pub epoch: u64,
    pub op: SendOp,
    pub data: Option<Arc<[u8]>>,
    pub len: u32,
    pub srqn: Option<u32>,
}

/// A responder's answer.
pub(crate) enum Resp {
    Ack,
    ReadData(Arc<[u8]>),
    RnrNak { delay_ns: u64 },
    Nak(WcStatus),
}

/// What a detached region transfers in place of memory it no longer
/// reaches (a real device would move the old, still pinned pages).
pub(crate) const DETACHED: u8 = 0xDB;

/// Atomic results a responder keeps for retransmitted requests (a real
/// responder keeps one per outstanding read or atomic it accepts; this is
/// more than any requester here has outstanding).
const ATOMIC_REPLIES: usize = 1024;

/// RNR delay for an encoded timer value.
pub(crate) fn rnr_delay_ns(code: u8) -> u64 {
    rnr_timer_duration(code).as_nanos() as u64
}

/// Local ACK timeout for an encoded value (0 = wait forever).
pub(crate) fn ack_timeout_ns(code: u8) -> Option<u64> {
    ack_timeout_duration(code).map(|d| d.as_nanos() as u64)
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm(_) => WcOpcode::Send,
        SendOp::Write(_) | SendOp::WriteWithImm(..) => WcOpcode::RdmaWrite,
        SendOp::Read(_) => WcOpcode::RdmaRead,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
    }
}

impl World {
    fn latency_ns(&self, a: DevIdx, b: DevIdx) -> u64 {
        let t = &self.cfg.timing;
        if self.devs[a].node == self.devs[b].node {
            t.loopback_latency_ns
        } else {
            t.wire_latency_ns
        }
    }

    /// When `bytes` sent by device `a` now reach device `b`: they wait for
    /// the link behind what `a` is already sending, are serialized, then
    /// cross the wire.
    fn arrival_at(&mut self, a: DevIdx, b: DevIdx, bytes: u64) -> u64 {
        let start = self.now.max(self.devs[a].tx_free_at);
        let end = start + self.serialize_ns(bytes);
        self.devs[a].tx_free_at = end;
        end + self.latency_ns(a, b)
    }

    fn serialize_ns(&self, bytes: u64) -> u64 {
        bytes * 1_000 / self.cfg.timing.bandwidth_bytes_per_us.max(1)
    }

    /// Checks a local SGE: known lkey on this device, same PD, inside the
    /// region, with the access needed.
    fn local_ok(&self, dev: DevIdx, pd: Option<Id<PdObj>>, sge: &Sge, need: Access) -> bool {
        if sge.length == 0 {
            return true;
        }
        let Some(mr) = self.devs[dev]
            .lkeys
            .get(&sge.lkey)
            .and_then(|m| self.mrs.get(*m))
        else {
            return false;
        };
        Some(mr.pd) == pd
            && mr.access.contains(need)
            && sge.addr >= mr.addr
            && sge.addr + u64::from(sge.length) <= mr.addr + mr.len
    }

    /// Checks a remote access: known rkey on this device, the PD the
    /// responder works in, the right granted, the range inside the region.
    fn remote_ok(
        &self,
        dev: DevIdx,
        pd: Option<Id<PdObj>>,
        r: &RemoteAddr,
        len: u32,
        need: Access,
    ) -> bool {
        if len == 0 {
            return true;
        }
        let Some(mr) = self.devs[dev]
            .rkeys
            .get(&r.rkey)
            .and_then(|m| self.mrs.get(*m))
        else {
            return false;
        };
        Some(mr.pd) == pd
            && mr.access.contains(need)
            && r.addr >= mr.addr
            && r.addr
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= mr.addr + mr.len)
    }

    /// Detaches every region whose memory the monitor reported gone.
    pub(crate) fn apply_unmaps(&mut self) {
        let Some(u) = &mut self.unmaps else { return };
        if !u.drain(&mut self.unmapped) {
            // Reports were lost (more than a million unread, or no memory
            // to queue them): detaching every region would break healthy
            // traffic, so the simulator keeps them attached and counts it.
            self.stats.unmap_reports_lost += 1;
        }
        for inv in std::mem::take(&mut self.unmapped) {
            let (lo, hi) = (inv.start as u64, inv.end as u64);
            for m in self.mrs.values_mut() {
                if m.tracked && m.addr < hi && lo < m.addr + m.len {
                    m.detached = true;
                }
            }
        }
    }

    /// Whether the region a key names is detached from its memory.
    fn detached(&mut self, dev: DevIdx, key: u32, remote: bool) -> bool {
        self.apply_unmaps();
        let d = &self.devs[dev];
        let keys = if remote { &d.rkeys } else { &d.lkeys };
        keys.get(&key)
            .and_then(|m| self.mrs.get(*m))
            .is_some_and(|m| m.detached)
    }

    /// The device gathers an SGE (checked by the caller).
    fn read_local(&mut self, dev: DevIdx, s: &Sge) -> Vec<u8> {
        if self.detached(dev, s.lkey, false) {
            self.stats.detached_local += 1;
            return vec![DETACHED; s.length as usize];
        }
        dma_read(s.addr, s.length as usize)
    }

    /// The device scatters into an SGE's memory (checked by the caller).
    fn write_local(&mut self, dev: DevIdx, s: &Sge, data: &[u8]) {
        if self.detached(dev, s.lkey, false) {
            self.stats.detached_local += 1;
        } else {
            dma_write(s.addr, data);
        }
    }

    /// The responder reads remote memory (checked by the caller).
    fn read_remote(&mut self, dev: DevIdx, r: &RemoteAddr, len: usize) -> Vec<u8> {
        if self.detached(dev, r.rkey, true) {
            self.stats.detached_remote += 1;
            return vec![DETACHED; len];
        }
        dma_read(r.addr, len)
    }

    /// The responder writes remote memory (checked by the caller).
    fn write_remote(&mut self, dev: DevIdx, r: &RemoteAddr, data: &[u8]) {
        if self.detached(dev, r.rkey, true) {
            self.stats.detached_remote += 1;
        } else {
            dma_write(r.addr, data);
        }
    }

    // ---- posting ---------------------------------------------------------

    pub(crate) fn post_send(&mut self, qp: Id<QpObj>, wr: &SendWr<'_>) -> Result<()> {
        let q = self.qps.get(qp).ok_or(Error::ProcessGone)?;
        let caps = &self.devs[q.dev].caps;
        match q.ty {
            QpType::XrcTgt => return Err(Error::invalid("an XRC TGT QP has no send queue")),
            QpType::XrcIni if wr.remote_srqn.is_none() => {
                return Err(Error::invalid("XRC INI sends must name the remote SRQ"))
            }
            _ => {}
        }
        if matches!(wr.op, SendOp::SendWithImm(_) | SendOp::WriteWithImm(..)) && !caps.imm_data {
            return Err(Error::invalid("the device has no immediate data"));
        }
        if wr.op.is_atomic() {
            if !caps.atomics {
                return Err(Error::Unsupported("the device has no atomics"));
            }
            if !matches!(wr.payload, Payload::Sgl(_)) || wr.payload.len() != 8 {
                return Err(Error::invalid(
                    "an atomic returns its 8 bytes into an SGE list of 8 bytes",
                ));
            }
        }
        let sgl: &[Sge] = match wr.payload {
            Payload::Sgl(sgl) => {
                let max = if wr.op.fetches() {
                    q.caps.max_send_sge.min(caps.max_sge_rd)
                } else {
                    q.caps.max_send_sge
                };
                if sgl.len() as u32 > max {
                    return Err(Error::invalid(format!(
                        "{} SGEs exceed the limit of {max}",
                        sgl.len()
                    )));
                }
                sgl
            }
            Payload::Inline(data) => {
                if wr.op.fetches() {
                    return Err(Error::invalid("an RDMA read cannot be inline"));
                }
                if data.len() as u64 > u64::from(q.caps.max_inline) {
                    return Err(Error::invalid(format!(
                        "inline payload of {} bytes exceeds max_inline {}",
                        data.len(),
                        q.caps.max_inline
                    )));
                }
                &[]
            }
        };
        let len = wr.payload.len();
        if len > u64::from(u32::MAX >> 1) {
            return Err(Error::invalid("message longer than 2 GiB"));
        }
        match q.state {
            QpState::Rts | QpState::Error => {}
            s => return Err(Error::state(format!("post_send in {s:?}"))),
        }
        if q.sq_used >= q.caps.max_send_wr {
            return Err(Error::NoResource("send queue full"));
        }
        let violation = self.devs[q.dev].caps.transport == Transport::Iwarp
            && q.iwarp_responder
            && !q.heard
            && q.state == QpState::Rts;
        let q = self.qps.get_mut(qp).expect("checked");
        let entry = SqEntry {
            wr_id: wr.wr_id,
            psn: q.next_psn,
            op: wr.op,
            signaled: wr.signaled,
            srqn: wr.remote_srqn,
            sgl: sgl.to_vec(),
            data: match wr.payload {
                Payload::Inline(d) => Some(Arc::from(d)),
                Payload::Sgl(_) => None,
            },
            len: len as u32,
            rnr_tries: 0,
            done: false,
        };
        q.next_psn += 1;
        q.sq_used += 1;
        if q.state == QpState::Error {
            self.complete_send(qp, entry, WcStatus::WrFlush);
            return Ok(());
        }
        q.sq.push_back(entry);
        if violation {
            // MPA without peer-to-peer mode: the responder spoke first.
            self.stats.iwarp_violations += 1;
            self.iwarp_teardown(qp);
            return Ok(());
        }
        if !q.tx_scheduled {
            q.tx_scheduled = true;
            let epoch = q.epoch;
            self.schedule_in(0, super::world::Event::Tx { qp, epoch });
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, qp: Id<QpObj>, wr: &RecvWr<'_>) -> Result<()> {
        let q = self.qps.get_mut(qp).ok_or(Error::ProcessGone)?;
        if q.ty != QpType::Rc {
            return Err(Error::invalid(format!(
                "{:?} QPs have no receive queue",
                q.ty
            )));
        }
        if q.srq.is_some() {
            return Err(Error::invalid("the QP receives through its SRQ"));
        }
        if wr.sgl.len() as u32 > q.caps.max_recv_sge {
            return Err(Error::invalid(format!(
                "{} SGEs exceed max_recv_sge {}",
                wr.sgl.len(),
                q.caps.max_recv_sge
            )));
        }
        if q.state == QpState::Reset {
            return Err(Error::state("post_recv in Reset"));
        }
        if q.rq.len() as u32 >= q.caps.max_recv_wr {
            return Err(Error::NoResource("receive queue full"));
        }
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sgl: wr.sgl.to_vec(),
        };
        if q.state == QpState::Error {
            let (cq, qpn) = (q.recv_cq, q.qpn);
            self.flush_recv(cq, qpn, wqe);
        } else {
            q.rq.push_back(wqe);
        }
        Ok(())
    }

    // ---- completions -------------------------------------------------------

    /// Completes a send-queue entry (already removed from the queue).
    fn complete_send(&mut self, qp: Id<QpObj>, e: SqEntry, status: WcStatus) {
        if e.done {
            return; // completed when it went on the wire (iWARP)
        }
        self.emit_send_cqe(qp, &e, status);
    }

    fn emit_send_cqe(&mut self, qp: Id<QpObj>, e: &SqEntry, status: WcStatus) {
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        if status == WcStatus::Success && !e.signaled {
            q.uncovered += 1;
            return;
        }
        let slots = q.uncovered + 1;
        q.uncovered = 0;
        let wc = WorkCompletion {
            wr_id: e.wr_id,
            status,
            opcode: wc_opcode(&e.op),
            byte_len: e.len,
            qp_num: q.qpn,
            src_qp: 0,
            imm: None,
        };
        if let Some(cq) = q.send_cq {
            self.push_cqe(
                cq,
                Cqe {
                    wc,
                    qp: Some(qp),
                    slots,
                },
                Some(qp),
            );
        }
    }

    fn flush_recv(&mut self, cq: Option<Id<super::world::CqObj>>, qpn: u32, wqe: RecvWqe) {
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::WrFlush,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            qp_num: qpn,
            src_qp: 0,
            imm: None,
        };
        if let Some(cq) = cq {
            self.push_cqe(
                cq,
                Cqe {
                    wc,
                    qp: None,
                    slots: 0,
                },
                None,
            );
        }
    }

    /// Moves a QP to the error state: every outstanding send and receive
    /// completes with a flush error, in order; the QP's holders hear `ev`
    /// (and, if it drew from an SRQ, last-WQE-reached).
    pub(crate) fn qp_to_error(&mut self, qp: Id<QpObj>, ev: Option<QpErrorEvent>) {
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        if q.state == QpState::Error {
            return;
        }
        q.state = QpState::Error;
        q.epoch += 1;
        q.timer_gen += 1;
        q.timer_armed = false;
        q.tx_scheduled = false;
        q.sent = 0;
        let sq = std::mem::take(&mut q.sq);
        let rq = std::mem::take(&mut q.rq);
        let (qpn, recv_cq, dev) = (q.qpn, q.recv_cq, q.dev);
        // A QP drawing from an SRQ reports its last WQE; a TGT QP that an
        // application moved to the error state by hand raises nothing the
        // verbs promise, so its other openers hear of it only where the
        // modelled device says so.
        let by_hand_tgt = q.ty == QpType::XrcTgt && ev.is_none();
        let has_srq = (q.srq.is_some() || q.ty == QpType::XrcTgt)
            && (!by_hand_tgt || self.devs[dev].tgt_error_events);
        for e in sq {
            self.complete_send(qp, e, WcStatus::WrFlush);
        }
        for w in rq {
            self.flush_recv(recv_cq, qpn, w);
        }
        if let Some(ev) = ev {
            let event = match ev {
                QpErrorEvent::Fatal => AsyncEvent::QpFatal { qpn },
                QpErrorEvent::Request => AsyncEvent::QpRequestError { qpn },
                QpErrorEvent::Access => AsyncEvent::QpAccessError { qpn },
            };
            self.push_qp_async(qp, event);
        }
        if has_srq {
            if let Some(q) = self.qps.get_mut(qp) {
                q.last_wqe = true;
            }
            self.push_qp_async(qp, AsyncEvent::QpLastWqeReached { qpn });
        }
    }

    /// Fails the send-queue entry at `idx` with `status`: the entries before
    /// it are flushed first so completions stay in posting order, then the
    /// QP goes to the error state and flushes the rest.
    fn fail_entry(&mut self, qp: Id<QpObj>, idx: usize, status: WcStatus) {
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        let before: Vec<SqEntry> = q.sq.drain(..idx).collect();
        let Some(failed) = q.sq.pop_front() else {
            return;
        };
        for e in before {
            self.complete_send(qp, e, WcStatus::WrFlush);
        }
        self.complete_send(qp, failed, status);
        self.terminate_if_iwarp(qp);
        self.qp_to_error(qp, None);
    }

    /// On iWARP an error ends the stream: a TERMINATE breaks both QPs and
    /// both CM ids see the connection go.
    fn terminate_if_iwarp(&mut self, qp: Id<QpObj>) {
        let Some(q) = self.qps.get(qp) else { return };
        if self.devs[q.dev].caps.transport != Transport::Iwarp {
            return;
        }
        let cm = q.cm_id;
        self.qp_to_error(qp, Some(QpErrorEvent::Fatal));
        if let Some(id) = cm {
            self.cm_torn_down(id);
        }
    }

    // ---- requester -----------------------------------------------------------

    fn arm_timer(&mut self, qp: Id<QpObj>) {
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        q.timer_gen += 1;
        q.timer_armed = false;
        if let Some(t) = ack_timeout_ns(q.rts.timeout) {
            q.timer_armed = true;
            let gen = q.timer_gen;
            self.schedule_in(t, super::world::Event::AckTimeout { qp, gen });
        }
    }

    pub(crate) fn on_tx(&mut self, qp: Id<QpObj>, epoch: u64) {
        let Some(q) = self.qps.get(qp) else { return };
        if q.epoch != epoch {
            return;
        }
        if q.state != QpState::Rts || q.sent >= q.sq.len() {
            self.qps.get_mut(qp).expect("live").tx_scheduled = false;
            return;
        }
        let idx = q.sent;
        let (dev, pd, transport) = (q.dev, q.pd, self.devs[q.dev].caps.transport);
        let e = &q.sq[idx];
        // The device reads the request's memory when it first processes it.
        if !e.op.fetches() && e.data.is_none() {
            if !e
                .sgl
                .iter()
                .all(|s| self.local_ok(dev, pd, s, Access::NONE))
            {
                self.fail_entry(qp, idx, WcStatus::LocalProtection);
                return;
            }
            let mut buf = Vec::with_capacity(e.len as usize);
            for s in e.sgl.clone() {
                buf.extend_from_slice(&self.read_local(dev, &s));
            }
            let data: Arc<[u8]> = Arc::from(buf);
            self.qps.get_mut(qp).expect("live").sq[idx].data = Some(data);
        } else if e.op.fetches() {
            // iWARP writes read responses into the sink through its STag,
            // which therefore needs remote write access.
            let need = if transport == Transport::Iwarp && !e.op.is_atomic() {
                Access::LOCAL_WRITE | Access::REMOTE_WRITE
            } else {
                Access::LOCAL_WRITE
            };
            if !e.sgl.iter().all(|s| self.local_ok(dev, pd, s, need)) {
                self.fail_entry(qp, idx, WcStatus::LocalProtection);
                return;
            }
        }
        let q = self.qps.get(qp).expect("live");
        let e = &q.sq[idx];
        let (peer_dev, peer_qpn) = q.peer.unwrap_or((None, 0));
        let wire_bytes = if e.op.fetches() { 0 } else { u64::from(e.len) };
        let last_arrival = q.last_arrival;
        let arrival = match peer_dev {
            Some(p) => self.arrival_at(dev, p, wire_bytes),
            None => self.now + self.cfg.timing.wire_latency_ns,
        }
        .max(last_arrival);
        let q = self.qps.get(qp).expect("live");
        let e = &q.sq[idx];
        let delivery = Delivery {
            src: qp,
            src_dev: dev,
            src_qpn: q.qpn,
            dst_dev: peer_dev,
            dst_qpn: peer_qpn,
            psn: e.psn,
            epoch,
            op: e.op,
            data: e.data.clone(),
            len: e.len,
            srqn: e.srqn,
        };
        let serialize = self.serialize_ns(wire_bytes);
        self.stats.packets += 1;
        self.schedule(arrival, super::world::Event::Deliver(Box::new(delivery)));
        let q = self.qps.get_mut(qp).expect("live");
        q.last_arrival = arrival;
        q.sent += 1;
        // RDMAP acknowledges nothing: on iWARP a send or write completes once
        // it is on the wire (in order: not before an earlier read).
        let local = transport == Transport::Iwarp
            && !q.sq[idx].done
            && !q.sq[idx].op.fetches()
            && q.sq.iter().take(idx).all(|e| e.done);
        if local {
            q.sq[idx].done = true;
            let e = &q.sq[idx];
            let early = SqEntry {
                wr_id: e.wr_id,
                psn: e.psn,
                op: e.op,
                signaled: e.signaled,
                srqn: None,
                sgl: Vec::new(),
                data: None,
                len: e.len,
                rnr_tries: 0,
                done: false,
            };
            self.emit_send_cqe(qp, &early, WcStatus::Success);
        }
        let q = self.qps.get_mut(qp).expect("live");
        let more = q.sent < q.sq.len();
        let arm = !q.timer_armed;
        if more {
            self.schedule_in(serialize, super::world::Event::Tx { qp, epoch });
        } else {
            q.tx_scheduled = false;
        }
        if arm {
            self.arm_timer(qp);
        }
    }

    pub(crate) fn on_ack_timeout(&mut self, qp: Id<QpObj>, gen: u64) {
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        if q.timer_gen != gen || !q.timer_armed || q.state != QpState::Rts {
            return;
        }
        q.timer_armed = false;
        if q.sq.is_empty() || q.sent == 0 {
            return;
        }
        q.timeouts += 1;
        q.retries += 1;
        self.stats.retransmits += 1;
        if q.retries > q.rts.retry_cnt {
            self.fail_entry(qp, 0, WcStatus::RetryExceeded);
            return;
        }
        q.epoch += 1;
        q.sent = 0;
        q.tx_scheduled = true;
        let epoch = q.epoch;
        self.schedule_in(0, super::world::Event::Tx { qp, epoch });
    }

    pub(crate) fn on_response(
        &mut self,
        qp: Id<QpObj>,
        from_dev: DevIdx,
        psn: u64,
        epoch: u64,
        resp: Resp,
    ) {
        let Some(q) = self.qps.get(qp) else {
            return;
        };
        if self.path_down(from_dev, q.dev) {
            self.stats.packets_dropped += 1;
            return;
        }
        let q = self.qps.get_mut(qp).expect("live");
        if q.state != QpState::Rts {
            return;
        }
        match resp {
            Resp::Ack | Resp::ReadData(_) => {
                let data = match resp {
                    Resp::ReadData(d) => Some(d),
                    _ => None,
                };
                let mut progressed = false;
                loop {
                    let Some(q) = self.qps.get_mut(qp) else {
                        return;
                    };
                    if q.state != QpState::Rts {
                        return;
                    }
                    let Some(front) = q.sq.front() else { break };
                    if front.psn > psn {
                        break;
                    }
                    if front.op.fetches() {
                        // A read or an atomic completes only with its own
                        // response.
                        let Some(d) = data.as_ref().filter(|_| front.psn == psn) else {
                            break;
                        };
                        let (dev, pd) = (q.dev, q.pd);
                        let sgl = front.sgl.clone();
                        if !sgl
                            .iter()
                            .all(|s| self.local_ok(dev, pd, s, Access::LOCAL_WRITE))
                        {
                            self.fail_entry(qp, 0, WcStatus::LocalProtection);
                            return;
                        }
                        let mut off = 0usize;
                        for s in &sgl {
                            let n = (s.length as usize).min(d.len() - off);
                            self.write_local(dev, s, &d[off..off + n]);
                            off += n;
                        }
                    }
                    let q = self.qps.get_mut(qp).expect("live");
                    let e = q.sq.pop_front().expect("front");
                    // Acknowledged entries were transmitted, perhaps in an
                    // earlier epoch than the current count covers.
                    q.sent = q.sent.saturating_sub(1);
                    progressed = true;
                    self.complete_send(qp, e, WcStatus::Success);
                }
                if progressed {
                    let Some(q) = self.qps.get_mut(qp) else {
                        return;
                    };
                    q.retries = 0;
                    if q.sent > 0 {
                        self.arm_timer(qp);
                    } else {
                        q.timer_gen += 1;
                        q.timer_armed = false;
                    }
                }
            }
            Resp::RnrNak { delay_ns } => {
                if q.epoch != epoch {
                    return;
                }
                let Some(idx) = q.sq.iter().position(|e| e.psn == psn) else {
                    return;
                };
                q.rnr_naks += 1;
                q.sq[idx].rnr_tries = q.sq[idx].rnr_tries.saturating_add(1);
                let retry_forever = q.rts.rnr_retry == 7;
                if !retry_forever && q.sq[idx].rnr_tries > q.rts.rnr_retry {
                    self.fail_entry(qp, idx, WcStatus::RnrRetryExceeded);
                    return;
                }
                // Go back to the refused request after the RNR delay.
                q.epoch += 1;
                q.sent = idx;
                q.timer_gen += 1;
                q.timer_armed = false;
                q.tx_scheduled = true;
                let epoch = q.epoch;
                self.schedule_in(delay_ns, super::world::Event::Tx { qp, epoch });
            }
            Resp::Nak(status) => {
                let Some(idx) = q.sq.iter().position(|e| e.psn == psn) else {
                    return;
                };
                self.fail_entry(qp, idx, status);
            }
        }
    }

    // ---- responder -----------------------------------------------------------

    fn respond(&mut self, responder: Id<QpObj>, d: &Delivery, resp: Resp) {
        let Some(q) = self.qps.get_mut(responder) else {
            return;
        };
        let bytes = match &resp {
            Resp::ReadData(data) => data.len() as u64,
            _ => 0,
        };
        let dev = q.dev;
        let last = q.last_response;
        let at = self.arrival_at(dev, d.src_dev, bytes).max(last);
        self.qps.get_mut(responder).expect("live").last_response = at;
        self.schedule(
            at,
            super::world::Event::Response {
                qp: d.src,
                from_dev: dev,
                psn: d.psn,
                epoch: d.epoch,
                resp,
            },
        );
    }

    /// A responder-side error: NAK the requester, break the responder QP, and
    /// tell every holder of it.
    fn responder_error(
        &mut self,
        responder: Id<QpObj>,
        d: &Delivery,
        status: WcStatus,
        ev: QpErrorEvent,
    ) {
        self.stats.responder_errors += 1;
        self.respond(responder, d, Resp::Nak(status));
        self.qp_to_error(responder, Some(ev));
        self.terminate_if_iwarp(responder);
    }

    pub(crate) fn on_deliver(&mut self, mut d: Delivery) {
        if let Some(src) = self.qps.get(d.src) {
            if src.epoch != d.epoch {
                return; // superseded by a retransmission
            }
        }
        let Some(dst_dev) = d.dst_dev else {
            self.stats.packets_dropped += 1;
            return;
        };
        if self.path_down(d.src_dev, dst_dev) {
            self.stats.packets_dropped += 1;
            return;
        }
        let Some(dst) = self.devs[dst_dev].qps.get(&d.dst_qpn).copied() else {
            self.stats.packets_dropped += 1;
            return;
        };
        let q = self.qps.get(dst).expect("indexed");
        let paired = q.peer == Some((Some(d.src_dev), d.src_qpn));
        if !matches!(q.state, QpState::Rtr | QpState::Rts) || !paired {
            self.stats.packets_dropped += 1;
            return;
        }
        if d.psn > q.expected_psn {
            self.stats.packets_dropped += 1;
            return;
        }
        let duplicate = d.psn < q.expected_psn;
        if duplicate {
            self.stats.duplicates += 1;
        }
        if duplicate && !d.op.fetches() {
            self.respond(dst, &d, Resp::Ack);
            return;
        }
        if duplicate && d.op.is_atomic() {
            // Executed once already: answer with what it returned then.
            let q = self.qps.get(dst).expect("indexed");
            match q.atomic_replies.iter().find(|(p, _)| *p == d.psn) {
                Some((_, old)) => {
                    let old: Arc<[u8]> = Arc::from(&old[..]);
                    self.respond(dst, &d, Resp::ReadData(old));
                }
                None => self.responder_error(
                    dst,
                    &d,
                    WcStatus::RemoteInvalidRequest,
                    QpErrorEvent::Request,
                ),
            }
            return;
        }
        let (ty, qp_access, xrcd) = (q.ty, q.access, q.xrcd);
        let first = !q.heard && q.state == QpState::Rtr;
        self.qps.get_mut(dst).expect("indexed").heard = true;
        if first && self.devs[dst_dev].caps.transport != Transport::Iwarp {
            let qpn = d.dst_qpn;
            self.push_qp_async(dst, AsyncEvent::CommEstablished { qpn });
        }

        // Which SRQ, PD and CQ the message works with.
        let (pd, srq, recv_cq): (Option<Id<PdObj>>, Option<Id<SrqObj>>, _) = if ty == QpType::XrcTgt
        {
            let srq = d
                .srqn
                .and_then(|n| self.devs[dst_dev].xrc_srqs.get(&n).copied())
                .filter(|s| {
                    self.srqs
                        .get(*s)
                        .and_then(|s| s.xrc.as_ref())
                        .map(|x| x.xrcd)
                        == xrcd
                });
            let Some(srq) = srq else {
                self.responder_error(
                    dst,
                    &d,
                    WcStatus::RemoteInvalidRequest,
                    QpErrorEvent::Request,
                );
                return;
            };
            let s = self.srqs.get(srq).expect("found");
            (Some(s.pd), Some(srq), s.xrc.as_ref().map(|x| x.cq))
        } else {
            let q = self.qps.get(dst).expect("indexed");
            (q.pd, q.srq, q.recv_cq)
        };

        match d.op {
            SendOp::Send | SendOp::SendWithImm(_) => {
                if let (Some(t), Some(data)) = (self.tamper.as_mut(), &d.data) {
                    // A peer that lies: its message as the test rewrites it.
                    let mut bytes = data.to_vec();
                    t(
                        self.devs[d.src_dev].node,
                        self.devs[dst_dev].node,
                        &mut bytes,
                    );
                    d.len = bytes.len() as u32;
                    d.data = Some(Arc::from(bytes));
                }
                let imm = match d.op {
                    SendOp::SendWithImm(i) => Some(i),
                    _ => None,
                };
                if !self.consume_recv(
                    dst,
                    &d,
                    dst_dev,
                    pd,
                    srq,
                    recv_cq,
                    WcOpcode::Recv,
                    imm,
                    true,
                ) {
                    return;
                }
            }
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) => {
                if !qp_access.contains(Access::REMOTE_WRITE) {
                    return self.not_enabled(dst, &d);
                }
                if !self.remote_ok(dst_dev, pd, &r, d.len, Access::REMOTE_WRITE) {
                    self.responder_error(dst, &d, WcStatus::RemoteAccess, QpErrorEvent::Access);
                    return;
                }
                if let SendOp::WriteWithImm(_, imm) = d.op {
                    // Needs a receive before anything is written.
                    if !self.has_recv(dst, srq) {
                        self.rnr(dst, &d);
                        return;
                    }
                    if let Some(data) = &d.data {
                        self.write_remote(dst_dev, &r, data);
                    }
                    if !self.consume_recv(
                        dst,
                        &d,
                        dst_dev,
                        pd,
                        srq,
                        recv_cq,
                        WcOpcode::RecvRdmaWithImm,
                        Some(imm),
                        false,
                    ) {
                        return;
                    }
                } else if let Some(data) = &d.data {
                    self.write_remote(dst_dev, &r, data);
                }
            }
            SendOp::Read(r) => {
                if !qp_access.contains(Access::REMOTE_READ) {
                    return self.not_enabled(dst, &d);
                }
                if !self.remote_ok(dst_dev, pd, &r, d.len, Access::REMOTE_READ) {
                    self.responder_error(dst, &d, WcStatus::RemoteAccess, QpErrorEvent::Access);
                    return;
                }
                let data: Arc<[u8]> = Arc::from(self.read_remote(dst_dev, &r, d.len as usize));
                if !duplicate {
                    self.qps.get_mut(dst).expect("indexed").expected_psn += 1;
                }
                self.respond(dst, &d, Resp::ReadData(data));
                return;
            }
            SendOp::FetchAdd { remote: r, .. } | SendOp::CompareSwap { remote: r, .. } => {
                if !qp_access.contains(Access::REMOTE_ATOMIC) {
                    return self.not_enabled(dst, &d);
                }
                if !self.remote_ok(dst_dev, pd, &r, 8, Access::REMOTE_ATOMIC) {
                    self.responder_error(dst, &d, WcStatus::RemoteAccess, QpErrorEvent::Access);
                    return;
                }
                if r.addr % 8 != 0 {
                    self.responder_error(
                        dst,
                        &d,
                        WcStatus::RemoteInvalidRequest,
                        QpErrorEvent::Request,
                    );
                    return;
                }
                let found = self.read_remote(dst_dev, &r, 8);
                let old: [u8; 8] = found[..8].try_into().expect("8 bytes");
                let value = u64::from_le_bytes(old);
                let new = match d.op {
                    SendOp::FetchAdd { add, .. } => Some(value.wrapping_add(add)),
                    SendOp::CompareSwap { compare, swap, .. } => (value == compare).then_some(swap),
                    _ => None,
                };
                if let Some(v) = new {
                    self.write_remote(dst_dev, &r, &v.to_le_bytes());
                }
                let q = self.qps.get_mut(dst).expect("indexed");
                q.expected_psn += 1;
                if q.atomic_replies.len() >= ATOMIC_REPLIES {
                    q.atomic_replies.pop_front();
                }
                q.atomic_replies.push_back((d.psn, old));
                self.respond(dst, &d, Resp::ReadData(Arc::from(&old[..])));
                return;
            }
        }
        self.qps.get_mut(dst).expect("indexed").expected_psn += 1;
        self.respond(dst, &d, Resp::Ack);
    }

    /// The responder QP does not enable this class of operation (its
    /// remote-access rights): an invalid request, as the IB transport and
    /// rdma_rxe answer it (a key the region does not grant is a remote
    /// access error instead).
    fn not_enabled(&mut self, dst: Id<QpObj>, d: &Delivery) {
        self.responder_error(
            dst,
            d,
            WcStatus::RemoteInvalidRequest,
            QpErrorEvent::Request,
        );
    }

    fn has_recv(&self, dst: Id<QpObj>, srq: Option<Id<SrqObj>>) -> bool {
        match srq {
            Some(s) => self.srqs.get(s).is_some_and(|s| !s.wqes.is_empty()),
            None => self.qps.get(dst).is_some_and(|q| !q.rq.is_empty()),
        }
    }

    fn rnr(&mut self, dst: Id<QpObj>, d: &Delivery) {
        let Some(q) = self.qps.get(dst) else { return };
        if self.devs[q.dev].caps.transport == Transport::Iwarp {
            // iWARP has no RNR: DDP finds no receive buffer and terminates
            // the connection.
            self.responder_error(dst, d, WcStatus::RemoteOperation, QpErrorEvent::Fatal);
            return;
        }
        self.stats.rnr_naks += 1;
        let code = self.qps.get(dst).map_or(12, |q| q.min_rnr_timer);
        self.respond(
            dst,
            d,
            Resp::RnrNak {
                delay_ns: rnr_delay_ns(code),
            },
        );
    }

    /// Takes a receive for an incoming message and scatters the payload
    /// into it. Returns false when the message was refused (RNR or error),
    /// in which case the answer has been sent.
    #[allow(clippy::too_many_arguments)]
    fn consume_recv(
        &mut self,
        dst: Id<QpObj>,
        d: &Delivery,
        dst_dev: DevIdx,
        pd: Option<Id<PdObj>>,
        srq: Option<Id<SrqObj>>,
        recv_cq: Option<Id<super::world::CqObj>>,
        opcode: WcOpcode,
        imm: Option<u32>,
        scatter: bool,
    ) -> bool {
        let wqe = match srq {
            Some(s) => {
                let Some(srq_obj) = self.srqs.get_mut(s) else {
                    self.rnr(dst, d);
                    return false;
                };
                let Some(w) = srq_obj.wqes.pop_front() else {
                    self.rnr(dst, d);
                    return false;
                };
                if srq_obj.limit > 0 && (srq_obj.wqes.len() as u32) < srq_obj.limit {
                    srq_obj.limit = 0;
                    let ctx = srq_obj.ctx;
                    self.push_async(ctx, AsyncEvent::SrqLimitReached { srq: s.raw() });
                }
                w
            }
            None => {
                let Some(w) = self.qps.get_mut(dst).and_then(|q| q.rq.pop_front()) else {
                    self.rnr(dst, d);
                    return false;
                };
                w
            }
        };
        let qpn = d.dst_qpn;
        let mut wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len: d.len,
            qp_num: qpn,
            src_qp: 0,
            imm,
        };
        if scatter {
            let room: u64 = wqe.sgl.iter().map(|s| u64::from(s.length)).sum();
            if u64::from(d.len) > room {
                wc.status = WcStatus::LocalLength;
                if let Some(cq) = recv_cq {
                    self.push_cqe(
                        cq,
                        Cqe {
                            wc,
                            qp: None,
                            slots: 0,
                        },
                        Some(dst),
                    );
                }
                self.responder_error(
                    dst,
                    d,
                    WcStatus::RemoteInvalidRequest,
                    QpErrorEvent::Request,
                );
                return false;
            }
            let data = d.data.clone().unwrap_or_else(|| Arc::from(Vec::new()));
            let mut off = 0usize;
            let mut ok = true;
            for s in &wqe.sgl {
                if off >= data.len() {
                    break;
                }
                let n = (s.length as usize).min(data.len() - off);
                let part = Sge {
                    length: n as u32,
                    ..*s
                };
                if !self.local_ok(dst_dev, pd, &part, Access::LOCAL_WRITE) {
                    ok = false;
                    break;
                }
                self.write_local(dst_dev, s, &data[off..off + n]);
                off += n;
            }
            if !ok {
                wc.status = WcStatus::LocalProtection;
                if let Some(cq) = recv_cq {
                    self.push_cqe(
                        cq,
                        Cqe {
                            wc,
                            qp: None,
                            slots: 0,
                        },
                        Some(dst),
                    );
                }
                self.responder_error(dst, d, WcStatus::RemoteOperation, QpErrorEvent::Fatal);
                return false;
            }
        }
        if let Some(cq) = recv_cq {
            self.push_cqe(
                cq,
                Cqe {
                    wc,
                    qp: None,
                    slots: 0,
                },
                Some(dst),
            );
        }
        self.stats.messages_delivered += 1;
        true
    }

    /// Tears down an iWARP connection whose responder sent before hearing
    /// from the initiator: both QPs break and both CM ids disconnect.
    fn iwarp_teardown(&mut self, qp: Id<QpObj>) {
        let Some(q) = self.qps.get(qp) else { return };
        let peer = q
            .peer
            .and_then(|(dev, qpn)| dev.and_then(|d| self.devs[d].qps.get(&qpn).copied()));
        let cm = q.cm_id;
        self.qp_to_error(qp, Some(QpErrorEvent::Fatal));
        if let Some(p) = peer {
            self.qp_to_error(p, Some(QpErrorEvent::Fatal));
        }
        if let Some(id) = cm {
            self.cm_torn_down(id);
        }
    }
}
