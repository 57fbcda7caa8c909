#!/usr/bin/env python3
"""Breaks the simulated fabric's rules one at a time and checks that the
conformance suite notices each break.

Each mutation replaces one snippet of the simulator; the suite must then fail
in (at least) the tests named for it. Prints a table and exits non-zero if a
mutation survives. Run from the repository root: scripts/mutate-sim.py
"""
import subprocess, sys, pathlib

SIM = pathlib.Path("fabric/src/sim")

# (rule broken, file, original snippet, broken snippet, tests that must fail)
MUTATIONS = [
    ("IB CM has no stale-connection table", "cm.rs",
     "            if held {\n                self.stats.cm_stale_rejects += 1;",
     "            if held && false {\n                self.stats.cm_stale_rejects += 1;",
     ["ibcm_stale_connection"]),
    ("CM hands responders a kind RNR timer", "cm.rs",
     "Some(timers.min_rnr_timer.unwrap_or(CM_MIN_RNR_TIMER))",
     "Some(timers.min_rnr_timer.unwrap_or(12))",
     ["ibcm_default_timers"]),
    ("CM ignores the application's ACK timeout", "cm.rs",
     "rts.timeout = timers.ack_timeout.unwrap_or(self.cfg.timing.cm_ack_timeout);",
     "rts.timeout = self.cfg.timing.cm_ack_timeout;",
     ["ibcm_timers_as_set"]),
    ("XRC INI takes responder attributes at RTR", "world.rs",
     "if q.ty == QpType::XrcIni && responder.iter().any(Option::is_some) {",
     "if false {",
     ["rtr_ini_refuses_responder_attributes"]),
    ("RC goes to RTR without responder attributes", "world.rs",
     "if q.ty != QpType::XrcIni && responder.iter().any(Option::is_none) {",
     "if false {",
     ["rtr_rc_needs_responder_attributes"]),
    ("a QP in RESET moves to ERR", "world.rs",
     "                if from == QpState::Reset {\n                    return Err(Error::state(\"ERR from Reset\"));",
     "                if false {\n                    return Err(Error::state(\"ERR from Reset\"));",
     ["reset_to_error_is_refused"]),
    ("an iWARP listen binds a port a TCP socket holds", "cm.rs",
     "            && self.cfg.tcp_ports_held.contains(&(node, a.port()))",
     "            && false",
     ["iwarp_listen_fails_on_a_port_tcp_holds"]),
    ("a region beyond max_mr_size registers", "world.rs",
     "        self.devs[dev].caps.check_mr_len(len)?;",
     "",
     ["regions_up_to_max_mr_size"]),
    ("XRC INI inline limit is RC's", "world.rs",
     "let max_inline = dcaps.max_inline_for(ty);",
     "let max_inline = dcaps.max_inline;",
     ["inline_limit_per_qp_type"]),
    ("a connected QP's send queue grows", "handles.rs",
     "if !w.devs[q.dev].resizable_sq && depth > q.caps.max_send_wr {",
     "if false {",
     ["limits_send_queue_resize"]),
    ("retransmitted atomics run again", "transport.rs",
     "        if duplicate && d.op.is_atomic() {",
     "        if duplicate && d.op.is_atomic() && false {",
     ["atomics_retransmitted_run_once"]),
    ("regions need no remote-atomic right", "transport.rs",
     "if !self.remote_ok(dst_dev, pd, &r, 8, Access::REMOTE_ATOMIC) {",
     "if !self.remote_ok(dst_dev, pd, &r, 8, Access::NONE) {",
     ["atomics_need_remote_atomic_access"]),
    ("QPs need no remote-atomic right", "transport.rs",
     "if !qp_access.contains(Access::REMOTE_ATOMIC) {",
     "if false {",
     ["atomics_need_remote_atomic_access"]),
    ("misaligned atomics accepted", "transport.rs",
     "                if r.addr % 8 != 0 {",
     "                if r.addr % 8 == 9 {",
     ["atomics_misaligned_is_refused"]),
    ("atomics on devices without them", "transport.rs",
     "            if !caps.atomics {\n                return Err(Error::Unsupported(\"the device has no atomics\"));",
     "            if !caps.atomics && false {\n                return Err(Error::Unsupported(\"the device has no atomics\"));",
     ["atomics_unsupported_without_caps"]),
    ("unknown rkey accepted", "transport.rs",
     "        else {\n            return false;\n        };\n        Some(mr.pd) == pd\n            && mr.access.contains(need)\n            && r.addr >= mr.addr",
     "        else {\n            return true;\n        };\n        Some(mr.pd) == pd\n            && mr.access.contains(need)\n            && r.addr >= mr.addr",
     ["keys_unknown_rkey"]),
    ("rkey of another PD accepted", "transport.rs",
     "Some(mr.pd) == pd\n            && mr.access.contains(need)\n            && r.addr",
     "true\n            && mr.access.contains(need)\n            && r.addr",
     ["keys_wrong_pd"]),
    ("remote access rights ignored", "transport.rs",
     "Some(mr.pd) == pd\n            && mr.access.contains(need)\n            && r.addr",
     "Some(mr.pd) == pd\n            && true\n            && r.addr",
     ["keys_access_not_granted"]),
    ("remote range unchecked", "transport.rs",
     ".is_some_and(|end| end <= mr.addr + mr.len)",
     ".is_some_and(|_| true)",
     ["keys_out_of_range"]),
    ("local keys unchecked", "transport.rs",
     "    fn local_ok(&self, dev: DevIdx, pd: Option<Id<PdObj>>, sge: &Sge, need: Access) -> bool {\n        if sge.length == 0 {",
     "    fn local_ok(&self, dev: DevIdx, pd: Option<Id<PdObj>>, sge: &Sge, need: Access) -> bool {\n        if sge.length < u32::MAX {",
     ["keys_local_protection"]),
    ("RNR retried forever", "transport.rs",
     "let retry_forever = q.rts.rnr_retry == 7;",
     "let retry_forever = true;",
     ["rnr_retry_exceeded_rq", "rnr_retry_exceeded_srq"]),
    ("RNR not retried", "transport.rs",
     "let retry_forever = q.rts.rnr_retry == 7;",
     "let retry_forever = false; q.rts.rnr_retry = 0;",
     ["rnr_retries_until_receive_posted"]),
    ("vanished peer acknowledges", "transport.rs",
     "let Some(dst) = self.devs[dst_dev].qps.get(&d.dst_qpn).copied() else {\n            self.stats.packets_dropped += 1;\n            return;",
     "let Some(dst) = self.devs[dst_dev].qps.get(&d.dst_qpn).copied() else {\n            self.stats.packets_dropped += 1;\n            self.schedule_in(0, super::world::Event::Response { qp: d.src, from_dev: dst_dev, psn: d.psn, epoch: d.epoch, resp: Resp::Ack });\n            return;",
     ["peer_gone_retry_exceeded"]),
    ("flush out of order", "transport.rs",
     "let sq = std::mem::take(&mut q.sq);",
     "let sq: std::collections::VecDeque<_> = std::mem::take(&mut q.sq).into_iter().rev().collect();",
     ["error_flushes_in_order"]),
    ("receives not flushed", "transport.rs",
     "        for w in rq {\n            self.flush_recv(recv_cq, qpn, w);\n        }\n        if let Some(ev) = ev {",
     "        drop(rq);\n        if let Some(ev) = ev {",
     ["error_flushes_in_order", "fault_force_qp_error"]),
    ("unknown XRC SRQ delivered anyway", "transport.rs",
     "            let Some(srq) = srq else {\n                self.responder_error(",
     "            let srq = srq.or_else(|| self.srqs.iter().find(|(_, s)| s.xrc.is_some()).map(|(i, _)| i));\n            let Some(srq) = srq else {\n                self.responder_error(",
     ["xrc_unknown_srqn_fails"]),
    ("XRC SRQ of another domain reachable", "transport.rs",
     "                .filter(|s| {\n                    self.srqs\n                        .get(*s)\n                        .and_then(|s| s.xrc.as_ref())\n                        .map(|x| x.xrcd)\n                        == xrcd\n                });",
     "                ;",
     ["xrc_domain_shared_by_key_per_node"]),
    ("TGT QP dies with its creator", "world.rs",
     "        q.handles.retain(|x| *x != h);\n        if q.handles.is_empty() {",
     "        let creator = q.handles.first() == Some(&h);\n        q.handles.retain(|x| *x != h);\n        if q.handles.is_empty() || creator {",
     ["xrc_tgt_outlives_creator", "xrc_tgt_dies_with_last_opener"]),
    ("TGT QP outlives its last opener", "world.rs",
     "        q.handles.retain(|x| *x != h);\n        if q.handles.is_empty() {",
     "        q.handles.retain(|x| *x != h);\n        if q.handles.is_empty() && q.ty != QpType::XrcTgt {",
     ["xrc_tgt_dies_with_last_opener", "xrc_exit_closes_tgt_handles", "xrc_crash_closes_tgt_handles", "xrc_open_gone_or_foreign_tgt_fails"]),
    ("exit keeps TGT handles", "world.rs",
     "        for h in self.qp_handles.ids_where(|h| h.ctx == ctx) {",
     "        for h in self.qp_handles.ids_where(|h| h.ctx == ctx && self.qps.get(h.qp).is_some_and(|q| q.ty != QpType::XrcTgt)) {",
     ["xrc_exit_closes_tgt_handles", "xrc_crash_closes_tgt_handles"]),
    ("TGT events reach one opener", "world.rs",
     "        ctxs.dedup();",
     "        ctxs.truncate(1);",
     ["xrc_tgt_error_reaches_every_opener"]),
    ("TGT QP opened from any domain", "world.rs",
     ".is_some_and(|q| q.ty == QpType::XrcTgt && q.xrcd == Some(xrcd))",
     ".is_some_and(|q| q.ty == QpType::XrcTgt)",
     ["xrc_open_gone_or_foreign_tgt_fails"]),
    ("XRC domains shared across nodes", "world.rs",
     "        let xrcd = match self.devs[dev].xrcds.get(&key.0) {",
     "        let shared = self.xrcds.iter().find(|(_, x)| x.key == key.0).map(|(i, _)| i);\n        let xrcd = match shared.as_ref().or(self.devs[dev].xrcds.get(&key.0)) {",
     ["xrc_domain_shared_by_key_per_node"]),
    ("XRC on devices without it", "world.rs",
     "        if !self.devs[dev].caps.xrc {\n            return Err(Error::Unsupported(\"device has no XRC\"));\n        }\n        let xrcd = match",
     "        let xrcd = match",
     ["no_xrc_is_unsupported", "iwarp_caps_have_no_xrc"]),
    ("iWARP responder may speak first", "transport.rs",
     "            && q.iwarp_responder\n            && !q.heard",
     "            && q.iwarp_responder\n            && false",
     ["iwarp_responder_first_tears_down"]),
    ("iWARP responder never may speak", "transport.rs",
     "            && q.iwarp_responder\n            && !q.heard",
     "            && q.iwarp_responder",
     ["iwarp_initiator_speaks_first"]),
    ("iWARP has RNR", "transport.rs",
     "        if self.devs[q.dev].caps.transport == Transport::Iwarp {\n            // iWARP has no RNR",
     "        if false {\n            // iWARP has no RNR",
     ["iwarp_send_without_receive_terminates"]),
    ("send queue unbounded", "transport.rs",
     "if q.sq_used >= q.caps.max_send_wr {",
     "if q.sq_used >= u32::MAX {",
     ["limits_send_queue_full"]),
    ("CQ never overruns", "world.rs",
     "if c.entries.len() as u32 >= c.cap {",
     "if c.entries.len() as u32 >= u32::MAX {",
     ["limits_cq_overrun"]),
    ("inline size unchecked", "transport.rs",
     "if data.len() as u64 > u64::from(q.caps.max_inline) {",
     "if data.len() as u64 > u64::MAX / 2 {",
     ["limits_max_inline"]),
    ("SRQ limit never fires", "transport.rs",
     "if srq_obj.limit > 0 && (srq_obj.wqes.len() as u32) < srq_obj.limit {",
     "if false {",
     ["srq_limit_event"]),
    ("SRQ limit stays armed", "transport.rs",
     "                    srq_obj.limit = 0;\n                    let ctx = srq_obj.ctx;",
     "                    let ctx = srq_obj.ctx;",
     ["srq_limit_event"]),
    ("no last-WQE event", "transport.rs",
     "        if has_srq {\n            if let Some(q) = self.qps.get_mut(qp) {",
     "        if false {\n            if let Some(q) = self.qps.get_mut(qp) {",
     ["srq_last_wqe_reached"]),
    ("a TGT moved to ERR by hand is heard by every opener", "transport.rs",
     "let by_hand_tgt = q.ty == QpType::XrcTgt && ev.is_none();",
     "let by_hand_tgt = false;",
     ["xrc_tgt_error_by_hand_is_silent"]),
    ("a responder's first packet raises no COMM_EST", "transport.rs",
     "if first && self.devs[dst_dev].caps.transport != Transport::Iwarp {",
     "if false {",
     ["xrc_lost_rtu_comm_est"]),
    ("COMM_EST handed to the CM establishes nothing", "cm.rs",
     "        if self.cm(id)?.state == CmState::Accepting {",
     "        if false {",
     ["xrc_lost_rtu_comm_est"]),
    ("AF_IB on a port that routes by IP", "cm.rs",
     "        if self.devs[dev].caps.transport != Transport::Infiniband {\n            return Err(Error::Unsupported(\n                \"AF_IB",
     "        if false {\n            return Err(Error::Unsupported(\n                \"AF_IB",
     ["cm_af_ib_by_gid"]),
    ("an SRQ QP destroyed before its last WQE goes unnoticed", "world.rs",
     "            if early && alive {",
     "            if false {",
     ["srq_qps_destroyed_before_their_last_receive_are_counted"]),
    ("CM duplicates reported twice", "cm.rs",
     "            .and_then(|l| l.children.get(&d.from).copied())\n        {",
     "            .and_then(|l| l.children.get(&d.from).copied())\n            .filter(|_| false)\n        {",
     ["fault_cm_duplicate_seen_once"]),
    ("CM never retries", "cm.rs",
     "            CmState::Connecting | CmState::Accepting if c.retries < max => {",
     "            CmState::Connecting | CmState::Accepting if c.retries < max && false => {",
     ["fault_cm_drop_is_retried"]),
    ("CM retries forever", "cm.rs",
     "            CmState::Connecting | CmState::Accepting if c.retries < max => {",
     "            CmState::Connecting | CmState::Accepting if c.retries < max || true => {",
     ["fault_cm_all_dropped_unreachable"]),
    ("CM delay ignored", "cm.rs",
     "return self.deliver_cm(from, from_dev, to_dev, to, msg, ns);",
     "return self.deliver_cm(from, from_dev, to_dev, to, msg, 0 * ns);",
     ["fault_cm_delay"]),
    ("private data unlimited", "cm.rs",
     "        if data.len() > max {",
     "        if data.len() > max * 100 {",
     ["cm_private_data_limits"]),
    ("IB private data not padded", "cm.rs",
     "        if t.is_ib_family() {\n            v.resize(",
     "        if false {\n            v.resize(",
     ["cm_private_data"]),
    ("reject loses private data", "cm.rs",
     "            private: self.pad(id, CmMessage::Reject, private_data),",
     "            private: self.pad(id, CmMessage::Reject, &[]),",
     ["cm_reject_with_private_data"]),
    ("no listener means silence", "cm.rs",
     "            self.send_cm(d.from, d.from_dev, CmDest::Id(d.from), msg);\n            return;",
     "            let _ = msg;\n            return;",
     ["cm_no_listener"]),
    ("disconnect not heard", "cm.rs",
     "                    self.simple_event(id, CmEventKind::Disconnected, Vec::new());\n                }\n                if let Some(dev) = dev {",
     "                }\n                if let Some(dev) = dev {",
     ["cm_disconnect", "fault_crash_releases_everything"]),
    ("partition ignored", "faults.rs",
     "        a != b && self.partitions.contains(&Self::pair(a, b))",
     "        a != b && self.partitions.contains(&Self::pair(a, b)) && false",
     ["fault_partition"]),
    ("port down ignored", "world.rs",
     "        !self.devs[a].port_up\n            || !self.devs[b].port_up\n            ||",
     "        ",
     ["fault_port_down_up"]),
    ("forced error without event", "mod.rs",
     "        w.qp_to_error(qp, Some(world::QpErrorEvent::Fatal));",
     "        w.qp_to_error(qp, None);",
     ["fault_force_qp_error", "xrc_tgt_error_reaches_every_opener"]),
    ("crash leaves MRs behind", "world.rs",
     "        for m in self.mrs.ids_where(|m| m.ctx == ctx) {\n            self.dereg_mr(m);\n        }",
     "",
     ["fault_crash_releases_everything"]),
    ("introspection miscounts MRs", "mod.rs",
     "            mrs: w.mrs.iter().filter(|(_, m)| mine(&m.ctx)).count(),",
     "            mrs: w.mrs.iter().filter(|(_, m)| mine(&m.ctx)).count().min(1),",
     ["introspect_counts"]),
    ("MPA carries a QP number", "cm.rs",
     "            Ok(Transport::Iwarp) => None,\n            _ => qpn,",
     "            _ => qpn,",
     ["cm_private_data"]),
    ("responses cross a partition", "transport.rs",
     "        if self.path_down(from_dev, q.dev) {\n            self.stats.packets_dropped += 1;\n            return;\n        }\n        let q = self.qps.get_mut(qp).expect(\"live\");",
     "        let q = self.qps.get_mut(qp).expect(\"live\");",
     ["exactly_once_in_order_through_rnr_and_partitions"]),
    ("iWARP retransmission completes again", "transport.rs",
     "            && !q.sq[idx].done\n",
     "\n",
     ["iwarp_exactly_once_in_order_through_partitions"]),
    ("receive data not scattered", "transport.rs",
     "                self.write_local(dst_dev, s, &data[off..off + n]);\n                off += n;\n            }\n            if !ok {",
     "                off += n;\n            }\n            if !ok {",
     ["transfer_send_recv", "xrc_ini_reaches_any_srq_of_domain"]),
    ("regions reach memory mapped after they were made", "transport.rs",
     "                    m.detached = true;",
     "                    m.detached = false;",
     ["regions_never_reach_remapped_memory"]),
]


def run_suite():
    """Runs the conformance suite and the simulator's own tests; returns the
    exit status, the names of the failed tests, and the output."""
    failed, out, code = set(), "", 0
    for target in ["conformance_sim", "sim"]:
        r = subprocess.run(["cargo", "test", "-q", "--test", target],
                           capture_output=True, text=True)
        code |= r.returncode
        out += r.stdout + r.stderr
        in_list = False
        for line in r.stdout.splitlines():
            if line.strip() == "failures:":
                in_list = True
                continue
            name = line.strip()
            if in_list and name and " " not in name:
                failed.add(name.split("::", 1)[-1])
    return code, failed, out


def main():
    only = sys.argv[1:]
    survivors = 0
    for name, file, old, new, must_fail in MUTATIONS:
        if only and not any(o in name for o in only):
            continue
        path = SIM / file
        text = path.read_text()
        if text.count(old) != 1:
            print(f"MISSING  {name}: snippet found {text.count(old)} times in {file}")
            survivors += 1
            continue
        path.write_text(text.replace(old, new))
        try:
            code, failed, out = run_suite()
        finally:
            path.write_text(text)
        if "error[" in out:
            print(f"NOBUILD  {name}")
            print(out[-3000:])
            survivors += 1
            continue
        missing = [t for t in must_fail if t not in failed]
        status = "killed" if code != 0 and not missing else "SURVIVED"
        if status != "killed":
            survivors += 1
        print(f"{status:8} {name}: red = {sorted(failed)}" + (f"; expected red: {missing}" if missing else ""))
    print(f"{len(MUTATIONS) if not only else ''} mutations, {survivors} survived")
    sys.exit(1 if survivors else 0)


if __name__ == "__main__":
    main()
