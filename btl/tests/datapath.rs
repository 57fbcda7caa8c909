//! The BTL's data path end to end on the simulated fabric: every size from
//! 0 to 4 MiB, eager and both rendezvous protocols, same node and across
//! nodes, XRC, RC + SRQ and iWARP; pending queues under a tiny send queue;
//! SRQ exhaustion and refill; one-sided put and get; failover without loss;
//! failed peers.

mod btlsim;

use std::time::Duration;

use btlsim::{pattern, Cluster, Got, TAG};
use xrcbtl_btl::{
    BtlConfig, BtlError, Bytes, EagerLimit, Mode, OpStatus, RemoteMem, RndvProtocol, SplitLimit,
};
use xrcbtl_fabric::sim::SimDevice;

const LIMIT: Duration = Duration::from_secs(30);

/// 0, 1, 2, 3, then every power of two up to 4 MiB with its neighbours,
/// and a few odd sizes.
fn sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 2, 3, 7, 13, 100, 1000, 4093, 65_537, 1_000_003];
    let mut p = 4;
    while p <= 4 << 20 {
        v.extend([p - 1, p, p + 1]);
        p *= 2;
    }
    v.retain(|&s| s <= 4 << 20);
    v.sort_unstable();
    v.dedup();
    v
}

/// Sends every size from rank 0 to `dst` (one message at a time, so the
/// sizes interleave eager and rendezvous) and checks each arrives intact.
fn every_size(c: &mut Cluster, dst: u32) {
    let sz = sizes();
    c.clear_got(dst);
    for (i, &len) in sz.iter().enumerate() {
        let data = pattern(i as u32, len);
        let op = c
            .btl(0)
            .send_bytes(dst, TAG, Bytes::from(data), None)
            .unwrap();
        c.run_until(LIMIT, |c| c.got_count(dst) == i + 1);
        c.settle(LIMIT);
        assert_eq!(c.btl(0).test(op), OpStatus::Done);
    }
    let got = c.got(dst);
    for (i, (g, &len)) in got.iter().zip(&sz).enumerate() {
        assert_eq!(g.src, 0);
        assert_eq!(g.tag, TAG);
        assert_eq!(g.data.len(), len, "size #{i}");
        assert!(g.data == pattern(i as u32, len), "size {len}: corrupted");
    }
}

fn check_both_protocols(device: SimDevice, force_rc: bool, expect: Mode) {
    for proto in [RndvProtocol::Get, RndvProtocol::Put] {
        let mut c = Cluster::with(11, 2, 2, device.clone(), |cfg: &mut BtlConfig| {
            cfg.rndv_protocol = proto;
            cfg.force_rc = force_rc;
            // Every size past the eager limit by rendezvous (tests/split.rs
            // splits them).
            cfg.split_limit = SplitLimit::Bytes(0);
            // Small fragments so that large messages pipeline.
            cfg.rndv_frag_size = 256 * 1024;
            cfg.rndv_pipeline = 3;
        });
        assert_eq!(c.btl(0).mode(), expect);
        every_size(&mut c, 1); // same node
        every_size(&mut c, 3); // other node
        let s = c.btl(0).stats();
        assert!(s.inline_sent > 0, "{s:?}");
        assert!(s.rndv_sent > 0 && s.eager_sent > 0, "{s:?}");
        // Eager sizes from zcopy_min up went from the caller's buffer.
        let max = c.btl(0).max_send_size();
        let zcopy = sizes()
            .iter()
            .filter(|&&n| (4096..=max).contains(&n))
            .count() as u64;
        assert_eq!(s.zcopy_sent, 2 * zcopy, "{s:?}");
        assert_eq!(s.retransmits, 0);
        for r in [1, 3] {
            let rs = c.btl(r).stats();
            assert_eq!(
                (rs.duplicates, rs.out_of_order, rs.malformed),
                (0, 0, 0),
                "{rs:?}"
            );
        }
        // 4 MiB in 256 KiB fragments: at least 16 fragments each way.
        let frags = if proto == RndvProtocol::Get {
            c.btl(3).stats().rdma_frags
        } else {
            c.btl(0).stats().rdma_frags
        };
        assert!(frags >= 2 * 16, "fragments {frags}");
        // Every rendezvous source went through the cache.
        let rc = c.btl(0).rcache_stats();
        assert!(rc.misses + rc.hits >= s.rndv_sent, "{rc:?} {s:?}");
        c.shutdown(LIMIT);
    }
}

#[test]
fn every_size_arrives_intact_over_xrc() {
    check_both_protocols(SimDevice::ib("sim0"), false, Mode::Xrc);
}

#[test]
fn every_size_arrives_intact_over_rc_srq() {
    check_both_protocols(SimDevice::roce("sim0"), true, Mode::Rc { p2p: false });
}

#[test]
fn every_size_arrives_intact_over_iwarp() {
    check_both_protocols(SimDevice::iwarp("sim0"), false, Mode::Rc { p2p: true });
}

/// A device whose send requests gather one entry only: a zero-copy eager
/// message is copied into its bounce slot when it is posted after all.
#[test]
fn every_size_arrives_intact_where_sends_gather_one_entry() {
    let mut device = SimDevice::ib("sim0");
    device.caps.max_sge = 1;
    check_both_protocols(device, false, Mode::Xrc);
}

/// `auto` (the default) chooses by device: on iWARP the sender writes
/// (put), elsewhere the receiver reads (get). Which side posted the RDMA
/// tells.
#[test]
fn the_default_rendezvous_is_put_on_iwarp_and_get_elsewhere() {
    for (device, put) in [
        (SimDevice::iwarp("sim0"), true),
        (SimDevice::roce("sim0"), false),
        (SimDevice::ib("sim0"), false),
    ] {
        let mut c = Cluster::with(12, 2, 1, device.clone(), |cfg: &mut BtlConfig| {
            assert_eq!(cfg.rndv_protocol, RndvProtocol::Auto);
        });
        let len = 256 * 1024;
        c.btl(0)
            .send_bytes(1, TAG, Bytes::from(pattern(7, len)), None)
            .unwrap();
        c.run_until(LIMIT, |c| c.got_count(1) == 1);
        c.settle(LIMIT);
        assert!(c.got(1)[0].data == pattern(7, len));
        let (sender, receiver) = (c.btl(0).stats().rdma_frags, c.btl(1).stats().rdma_frags);
        if put {
            assert!(
                sender > 0 && receiver == 0,
                "{}: {sender} {receiver}",
                device.name
            );
        } else {
            assert!(
                sender == 0 && receiver > 0,
                "{}: {sender} {receiver}",
                device.name
            );
        }
        c.shutdown(LIMIT);
    }
}

/// Payload of message `i` of a numbered stream: its index, then filler.
fn numbered(i: u32, len: usize) -> Vec<u8> {
    let mut v = pattern(i, len.max(4));
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

fn index_of(g: &Got) -> u32 {
    u32::from_le_bytes(g.data[..4].try_into().unwrap())
}

/// The indices rank `r` received from `src`, in arrival order.
fn stream(c: &Cluster, r: u32, src: u32) -> Vec<u32> {
    c.got(r)
        .iter()
        .filter(|g| g.src == src && g.tag == TAG)
        .map(index_of)
        .collect()
}

/// How many `TAG` messages rank `r` received from `src`.
fn tagged(c: &Cluster, r: u32, src: u32) -> usize {
    stream(c, r, src).len()
}

/// Small (inline) messages go unsignalled, with a signalled one at least
/// every 64 on a QP; asking whether the BTL is idle covers the last ones, and then
/// everything is complete.
#[test]
fn small_messages_go_unsignalled_and_a_cover_completes_the_last() {
    let mut c = Cluster::with(31, 2, 1, SimDevice::ib("sim0"), |_: &mut BtlConfig| {});
    // 101: the last one goes unsignalled whether a QP signals every 4th,
    // 16th or 64th.
    const N: u32 = 101;
    // In bursts of 4, which the send queue takes at once.
    for i in 0..N {
        let data = Bytes::from(numbered(i, 32));
        c.btl(0).send_bytes(1, TAG, data, None).unwrap();
        if i % 4 == 3 {
            c.run_until(LIMIT, |c| c.got_count(1) == i as usize + 1);
        }
    }
    c.run_until(LIMIT, |c| c.got_count(1) == N as usize);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>());
    let s = c.btl(0).stats();
    // One in 64 signalled, or one in half the send queue where that is
    // shorter (an INI QP sized for one peer here).
    assert!(s.unsignalled >= u64::from(N) / 2, "{s:?}");
    assert_eq!(s.covers, 0);
    // The last ones are delivered but not known complete.
    assert!(!c.btl(0).is_idle());
    c.settle(LIMIT);
    assert!(c.btl(0).is_idle());
    assert_eq!(c.btl(0).stats().covers, 1);
    assert_eq!(c.btl(1).stats().malformed, 0);
    c.shutdown(LIMIT);
}

#[test]
fn a_tiny_send_queue_queues_work_and_serves_endpoints_fairly_in_order() {
    let mut c = Cluster::with(5, 2, 4, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
        cfg.sq_max = Some(2);
        cfg.send_slots = 4;
        cfg.max_inline = 0;
    });
    const N: u32 = 100;
    // Connect first, so that the burst measures the queues, not set-up.
    for dst in 4..8 {
        c.btl(0).send(dst, TAG + 1, &[], b"warm-up").unwrap();
    }
    c.settle(LIMIT);
    // Everything for rank 4 first, then rank 5, 6, 7: all four share rank
    // 0's one INI QP to node 1.
    for dst in 4..8 {
        for i in 0..N {
            c.btl(0).send(dst, TAG, &[], &numbered(i, 100)).unwrap();
        }
    }
    c.run_until(LIMIT, |c| tagged(c, 4, 0) == N as usize);
    // FIFO across endpoints would have left rank 7 with nothing yet.
    let last = tagged(&c, 7, 0);
    assert!(
        last >= N as usize / 2,
        "rank 7 got only {last} while rank 4 got all"
    );
    c.settle(LIMIT);
    for dst in 4..8 {
        assert_eq!(stream(&c, dst, 0), (0..N).collect::<Vec<_>>(), "rank {dst}");
    }
    let s = c.btl(0).stats();
    assert!(s.pending_max >= u64::from(3 * N), "{s:?}");
    assert!(s.no_resource > 0, "{s:?}");
    assert_eq!(s.inline_sent, 0);
    let ini = c.btl(0).with_manager(|m| m.live_qps());
    assert_eq!(ini, 1, "one INI QP to node 1");
    c.shutdown(LIMIT);
}

#[test]
fn an_exhausted_srq_is_refilled_and_grown_without_losing_a_message() {
    let mut c = Cluster::with(9, 2, 2, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
        cfg.srq_depth = 4;
        cfg.srq_max_depth = 64;
        cfg.srq_refill = 2;
    });
    const N: u32 = 300;
    for src in 1..4 {
        c.btl(src).send(0, TAG + 1, &[], b"warm-up").unwrap();
    }
    c.settle(LIMIT);
    // The receiver is busy elsewhere while the senders burst: its posted
    // receives go, the senders wait out RNR, the SRQ reports its limit.
    c.pause(0, true);
    for i in 0..N {
        for src in 1..4 {
            c.btl(src).send(0, TAG, &[], &numbered(i, 200)).unwrap();
        }
    }
    c.advance(Duration::from_millis(5));
    c.pause(0, false);
    c.settle(LIMIT);
    for src in 1..4 {
        assert_eq!(stream(&c, 0, src), (0..N).collect::<Vec<_>>(), "from {src}");
    }
    let s = c.btl(0).stats();
    assert!(s.srq_limit_events > 0, "{s:?}");
    assert!(s.srq_grown > 0, "{s:?}");
    assert_eq!((s.duplicates, s.out_of_order), (0, 0));
    c.shutdown(LIMIT);
}

#[test]
fn on_iwarp_credits_keep_a_busy_receivers_srq_from_running_dry() {
    // iWARP has no RNR: a send that finds no receive posted tears the
    // connection down. Senders must hold back by credits instead.
    let mut c = Cluster::with(9, 2, 2, SimDevice::iwarp("sim0"), |cfg: &mut BtlConfig| {
        cfg.srq_depth = 4;
        cfg.srq_max_depth = 64;
        cfg.srq_refill = 2;
        cfg.credits = 6;
    });
    const N: u32 = 300;
    for src in 1..4 {
        c.btl(src).send(0, TAG + 1, &[], b"warm-up").unwrap();
        c.btl(0).send(src, TAG + 1, &[], b"warm-up").unwrap();
    }
    c.settle(LIMIT);
    c.pause(0, true);
    for i in 0..N {
        for src in 1..4 {
            c.btl(src).send(0, TAG, &[], &numbered(i, 200)).unwrap();
        }
    }
    c.advance(Duration::from_millis(5));
    c.pause(0, false);
    // Rank 0 talks back meanwhile: returns ride on these too.
    for i in 0..N {
        for dst in 1..4 {
            c.btl(0).send(dst, TAG, &[], &numbered(i, 50)).unwrap();
        }
    }
    c.run_until(LIMIT, |c| {
        (1..4).all(|r| tagged(c, 0, r) == N as usize && tagged(c, r, 0) == N as usize)
    });
    c.settle(LIMIT);
    for src in 1..4 {
        assert_eq!(stream(&c, 0, src), (0..N).collect::<Vec<_>>(), "from {src}");
        assert_eq!(stream(&c, src, 0), (0..N).collect::<Vec<_>>(), "to {src}");
        let s = c.btl(src).stats();
        assert_eq!((s.send_errors, s.retransmits), (0, 0), "rank {src}: {s:?}");
        assert!(s.credit_stalls > 0, "rank {src} never waited: {s:?}");
    }
    let s = c.btl(0).stats();
    assert_eq!(
        (s.duplicates, s.out_of_order, s.send_errors),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(s.credits_returned > 0, "{s:?}");
    c.shutdown(LIMIT);
}

#[test]
fn one_sided_put_and_get_move_registered_memory() {
    let mut c = Cluster::new(3, 2, 2, SimDevice::ib("sim0"));
    let mine = c.btl(0).alloc_mem(64 * 1024).unwrap();
    let back = c.btl(0).alloc_mem(64 * 1024).unwrap();
    let theirs = c.btl(3).alloc_mem(64 * 1024).unwrap();
    // The target tells the origin where its memory is.
    let adv = theirs.remote();
    c.btl(3).send(0, TAG + 1, &adv.pack(), &[]).unwrap();
    c.run_until(LIMIT, |c| c.got_count(0) == 1);
    let remote = RemoteMem::unpack(&c.got(0)[0].data).unwrap();
    assert_eq!(remote, adv);

    let data = pattern(42, 40_000);
    mine.write(0, &data);
    let records = c.btl(0).stats().posted_records;
    let put = c
        .btl(0)
        .put(3, mine.reg().at(0), remote.at(1000), data.len(), None)
        .unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(put) != OpStatus::Pending);
    assert_eq!(theirs.read(1000, data.len()), data);
    let get = c
        .btl(0)
        .get(3, remote.at(1000), back.reg().at(5), data.len(), None)
        .unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(get) != OpStatus::Pending);
    assert_eq!(back.read(5, data.len()), data);
    // Messages wait in their QP's send log; reads and writes are recorded
    // one by one.
    assert!(
        c.btl(0).stats().posted_records >= records + 2,
        "{:?}",
        c.btl(0).stats()
    );

    // Bad ranges are refused before anything is posted.
    let b = c.btl(0);
    assert!(b
        .put(3, mine.reg().at(0), remote.at(60 * 1024), 8 * 1024, None)
        .is_err());
    assert!(b
        .get(3, remote.at(0), back.reg().at(64 * 1024 - 1), 2, None)
        .is_err());
    assert!(b.put(3, mine.reg().at(0), remote.at(0), 0, None).is_err());
    assert!(
        b.put(99, mine.reg().at(0), remote.at(0), 8, None).is_err(),
        "unknown peer"
    );

    // A key the peer never issued fails the operation, not the endpoint.
    let forged = RemoteMem {
        rkey: remote.rkey ^ 0x5555,
        ..remote
    };
    let bad = b.put(3, mine.reg().at(0), forged.at(0), 64, None).unwrap();
    c.run_until(LIMIT, |c| c.btl(0).stats().send_errors > 0);
    c.settle(LIMIT);
    assert!(matches!(c.btl(0).test(bad), OpStatus::Failed(_)));
    c.btl(0).send(3, TAG, &[], b"still here").unwrap();
    c.run_until(LIMIT, |c| c.got(3).iter().any(|g| g.data == b"still here"));
    c.shutdown(LIMIT);
}

#[test]
fn messages_in_flight_when_a_tgt_qp_fails_arrive_once_and_in_order() {
    for proto in [RndvProtocol::Get, RndvProtocol::Put] {
        let mut c = Cluster::with(21, 2, 3, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
            cfg.rndv_protocol = proto;
        });
        const N: u32 = 60;
        let mut sent = 0;
        for i in 0..N {
            for src in 0..2 {
                for dst in 3..6 {
                    // Every tenth message is a rendezvous.
                    let len = if i % 10 == 9 { 20_000 } else { 64 };
                    let data = Bytes::from(numbered(i, len));
                    c.btl(src).send_bytes(dst, TAG, data, None).unwrap();
                    sent += 1;
                }
            }
            if i == N / 3 {
                // Let traffic flow, then break the TGT QP that node 0's
                // first sender reaches node 1 through.
                c.run_until(LIMIT, |c| (3..6).all(|r| c.got_count(r) > 10));
                let victim = c
                    .sim
                    .node_view(1)
                    .tgt_qps
                    .into_iter()
                    .find(|t| t.open_count == 3)
                    .expect("a TGT QP held by the three receivers");
                c.sim.force_qp_error(1, victim.qpn).unwrap();
            }
        }
        c.settle(LIMIT);
        let got: usize = (3..6).map(|r| c.got_count(r)).sum();
        assert_eq!(got, sent, "{proto:?}");
        for dst in 3..6 {
            for src in 0..2 {
                // Eager messages in order; rendezvous ones (every tenth)
                // when their data is in; each exactly once.
                let s = stream(&c, dst, src);
                let eager: Vec<u32> = s.iter().copied().filter(|i| i % 10 != 9).collect();
                let want: Vec<u32> = (0..N).filter(|i| i % 10 != 9).collect();
                assert_eq!(eager, want, "{src}->{dst} {proto:?}");
                let mut all = s;
                all.sort_unstable();
                assert_eq!(all, (0..N).collect::<Vec<_>>(), "{src}->{dst} {proto:?}");
            }
            assert_eq!(c.btl(dst).stats().out_of_order, 0);
        }
        let retrans: u64 = (0..2).map(|r| c.btl(r).stats().retransmits).sum();
        assert!(retrans > 0, "the failure hit nothing in flight");
        // The small ones went unsignalled: the failure took some of those.
        assert!((0..2).all(|r| c.btl(r).stats().unsignalled > 0));
        c.shutdown(LIMIT);
    }
}

/// Fifteen small messages go unsignalled and wait in their QP's send log;
/// the QP fails before any signalled completion retires them. They are
/// posted again on the rebuilt connection, in order, and each arrives
/// exactly once (the receiver drops any copy that had arrived already).
fn unsignalled_messages_on_a_failed_qp(device: SimDevice) {
    let name = device.name.clone();
    // Credits for them all on iWARP (the default lets 13 go).
    let mut c = Cluster::with(41, 2, 1, device, |cfg: &mut BtlConfig| cfg.credits = 64);
    // The connection comes up, and a cover retires the first message.
    c.btl(0).send(1, TAG + 1, b"hello", &[]).unwrap();
    c.run_until(LIMIT, |c| c.got_count(1) == 1);
    c.settle(LIMIT);
    const N: u32 = 15;
    let before = c.btl(0).stats();
    for i in 0..N {
        let data = Bytes::from(numbered(i, 16));
        c.btl(0).send_bytes(1, TAG, data, None).unwrap();
    }
    let after = c.btl(0).stats();
    assert_eq!(
        after.unsignalled - before.unsignalled,
        u64::from(N),
        "{name}"
    );
    assert!(!c.btl(0).is_idle(), "{name}: the messages are not retired");
    let senders = c.sim.node_view(0).senders;
    assert_eq!(senders.len(), 1, "{name}: one QP from node 0");
    c.sim.force_qp_error(0, senders[0]).unwrap();
    // Every rank idle does not mean every message received: wait for them.
    c.run_until(LIMIT, |c| tagged(c, 1, 0) >= N as usize);
    c.settle(LIMIT);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>(), "{name}");
    let s = c.btl(0).stats();
    assert!(s.retransmits >= u64::from(N), "{name}: {s:?}");
    assert_eq!(s.lost, 0, "{name}");
    assert_eq!(c.btl(1).stats().out_of_order, 0, "{name}");
    c.shutdown(LIMIT);
}

#[test]
fn fifteen_unsignalled_messages_on_a_failed_xrc_qp_arrive_once_and_in_order() {
    unsignalled_messages_on_a_failed_qp(SimDevice::ib("sim0"));
}

#[test]
fn fifteen_unsignalled_messages_on_a_failed_rc_qp_arrive_once_and_in_order() {
    unsignalled_messages_on_a_failed_qp(SimDevice::roce("sim0"));
}

#[test]
fn fifteen_unsignalled_messages_on_a_failed_iwarp_qp_arrive_once_and_in_order() {
    unsignalled_messages_on_a_failed_qp(SimDevice::iwarp("sim0"));
}

#[test]
fn a_crashed_peer_fails_its_operations_and_calls_the_error_callbacks() {
    let mut c = Cluster::new(4, 2, 2, SimDevice::ib("sim0"));
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let e = errors.clone();
    let b = c.btl(0);
    b.set_error_callback(3, move |_, r, err| e.lock().unwrap().push((r, err.clone())))
        .unwrap();
    let all = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let a = all.clone();
    b.register_error(move |_, r, _| a.lock().unwrap().push(r));
    let done = std::sync::Arc::new(std::sync::Mutex::new(None));
    b.send(3, TAG, &[], b"hello").unwrap();
    c.run_until(LIMIT, |c| c.got_count(3) == 1);
    c.crash(3);
    let d = done.clone();
    let op = b
        .send_bytes(
            3,
            TAG,
            Bytes::from(pattern(1, 100_000)),
            Some(Box::new(move |_, _, r| *d.lock().unwrap() = Some(r))),
        )
        .unwrap();
    b.send(3, TAG, &[], b"lost").unwrap();
    b.send(2, TAG, &[], b"unaffected").unwrap();
    c.run_until(LIMIT, |_| done.lock().unwrap().is_some());
    c.settle(LIMIT);
    assert!(
        matches!(*done.lock().unwrap(), Some(Err(_))),
        "the rendezvous failed"
    );
    assert_eq!(b.test(op), OpStatus::Done, "reported through its callback");
    assert_eq!(c.got(2).len(), 1);
    let errs = errors.lock().unwrap().clone();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, 3);
    assert_eq!(*all.lock().unwrap(), vec![3], "the global callback ran too");
    assert!(
        b.send(3, TAG, &[], b"after").is_err(),
        "the endpoint is gone"
    );
    assert!(b.send(99, TAG, &[], b"nobody").is_err(), "unknown peer");
    assert!(b.stats().lost >= 1);
}

#[test]
fn a_peer_leaving_cleanly_or_deleted_is_not_an_error() {
    let mut c = Cluster::new(6, 2, 2, SimDevice::ib("sim0"));
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    for r in 0..3 {
        let e = errors.clone();
        c.btl(r).register_error(move |b, peer, err| {
            e.lock().unwrap().push((b.rank(), peer, err.clone()))
        });
    }
    c.connect_all(LIMIT);
    c.btl(0).send(3, TAG, &[], b"hello").unwrap();
    c.run_until(LIMIT, |c| c.got_count(3) == 1);
    // Rank 3 leaves cleanly: its peers hear of it.
    c.exit(3, LIMIT);
    c.settle(LIMIT);
    assert!(
        c.btl(0).send(3, TAG, &[], b"after").is_err(),
        "rank 3 is gone"
    );
    // Rank 0 deletes its endpoint to rank 2, with a rendezvous in flight.
    let done = std::sync::Arc::new(std::sync::Mutex::new(None));
    let d = done.clone();
    c.btl(0)
        .send_bytes(
            2,
            TAG,
            Bytes::from(pattern(2, 100_000)),
            Some(Box::new(move |_, _, r| *d.lock().unwrap() = Some(r))),
        )
        .unwrap();
    c.btl(0).del_procs(&[2]);
    c.settle(LIMIT);
    assert_eq!(
        *done.lock().unwrap(),
        Some(Err(BtlError::Closed(2))),
        "what was outstanding fails"
    );
    assert_eq!(*errors.lock().unwrap(), vec![], "but nothing is an error");
    // A crash is one.
    c.crash(1);
    c.btl(0).send(1, TAG, &[], b"to the dead").unwrap();
    c.run_until(LIMIT, |_| !errors.lock().unwrap().is_empty());
    let errs = errors.lock().unwrap().clone();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!((errs[0].0, errs[0].1), (0, 1));
}

#[test]
fn sendi_posts_now_or_not_at_all_and_self_sends_are_delivered() {
    let mut c = Cluster::new(8, 2, 2, SimDevice::ib("sim0"));
    let b = c.btl(0);
    assert!(!b.sendi(3, TAG, &[], b"too early").unwrap(), "no path yet");
    b.send(3, TAG, b"fir", b"st").unwrap();
    c.run_until(LIMIT, |c| c.got_count(3) == 1);
    assert_eq!(c.got(3)[0].data, b"first", "header and payload gathered");
    assert!(b.sendi(3, TAG, b"n", b"ow").unwrap());
    let big = vec![1u8; 4096];
    assert!(
        b.sendi(3, TAG, &[], &big).unwrap(),
        "not inline, but at once"
    );
    let too_big = vec![1u8; b.max_send_size() + 1];
    assert!(b.sendi(3, TAG, &[], &too_big).is_err());
    c.run_until(LIMIT, |c| c.got_count(3) == 3);
    assert_eq!(c.got(3)[1].data, b"now");
    assert_eq!(c.got(3)[2].data, big);
    assert!(b.stats().inline_sent >= 2);
    // To itself, eager and rendezvous sizes.
    b.send(0, TAG, b"m", b"e").unwrap();
    b.send_bytes(0, TAG, Bytes::from(pattern(3, 50_000)), None)
        .unwrap();
    c.run_until(LIMIT, |c| c.got_count(0) == 2);
    assert_eq!(c.got(0)[0].data, b"me");
    assert_eq!(c.got(0)[1].data, pattern(3, 50_000));
    c.shutdown(LIMIT);
}

#[test]
fn configuration_comes_from_the_environment_and_bad_values_are_refused() {
    use std::collections::HashMap;
    let base = || {
        BtlConfig::new(
            0,
            0,
            1,
            xrcbtl_fabric::XrcdKey::new("k"),
            "127.0.0.1:0".parse().unwrap(),
        )
    };
    let vars = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    };
    let cfg = base()
        .with_vars(vars(&[
            ("XRCBTL_EAGER_LIMIT", "4096"),
            ("XRCBTL_RNDV_PROTOCOL", "put"),
            ("XRCBTL_FORCE_RC", "1"),
            ("XRCBTL_SQ_MAX", "32"),
        ]))
        .unwrap();
    assert_eq!(cfg.eager_limit, EagerLimit::Bytes(4096));
    assert_eq!(cfg.rndv_protocol, RndvProtocol::Put);
    assert!(RndvProtocol::Auto.is_put(xrcbtl_fabric::Transport::Iwarp));
    assert!(!RndvProtocol::Auto.is_put(xrcbtl_fabric::Transport::Roce));
    assert!(!RndvProtocol::Get.is_put(xrcbtl_fabric::Transport::Iwarp));
    assert!(RndvProtocol::Put.is_put(xrcbtl_fabric::Transport::Infiniband));
    assert!(cfg.force_rc);
    assert_eq!(cfg.sq_max, Some(32));
    for bad in [
        ("XRCBTL_EAGER_LIMIT", "lots"),
        ("XRCBTL_EAGER_LIMIT", "0"),
        ("XRCBTL_RNDV_PROTOCOL", "teleport"),
        ("XRCBTL_FORCE_RC", "maybe"),
        ("XRCBTL_SRQ_DEPTH", "5000"),
        ("XRCBTL_RNDV_FRAG_SIZE", "12"),
    ] {
        let e = base().with_vars(vars(&[bad])).unwrap_err();
        assert!(
            e.to_string().contains(bad.0)
                || e.to_string().contains("depth")
                || e.to_string().contains("fragment")
                || e.to_string().contains("eager"),
            "{bad:?}: {e}"
        );
    }
}

/// Rank 0 sends `n` numbered messages to rank 1 on `device`, cut by a
/// partition once 100 have arrived, while messages and their
/// acknowledgements are on the wire, and healed once the sender's QP has
/// given up (7 retries of ~67 ms); returns once rank 1 has them all and
/// both are idle.
fn stream_across_a_partition(device: SimDevice, n: u32) -> Cluster {
    let mut c = Cluster::new(31, 2, 1, device);
    for i in 0..n {
        c.btl(0).send(1, TAG, &[], &numbered(i, 64)).unwrap();
    }
    c.run_until(LIMIT, |c| tagged(c, 1, 0) >= 100);
    c.sim.partition(0, 1);
    c.advance(Duration::from_millis(700));
    c.sim.heal(0, 1);
    // A message that left makes no work for its sender, whose idleness
    // then says nothing of the receiver's.
    c.run_until(LIMIT, |c| tagged(c, 1, 0) >= n as usize);
    c.settle(LIMIT);
    c
}

#[test]
fn messages_whose_acks_a_partition_lost_are_resent_and_dropped_as_duplicates() {
    const N: u32 = 400;
    let mut c = stream_across_a_partition(SimDevice::ib("sim0"), N);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>());
    let s = c.btl(1).stats();
    assert!(s.duplicates > 0, "nothing was delivered twice: {s:?}");
    assert_eq!(s.out_of_order, 0);
    assert!(c.btl(0).stats().retransmits > 0);
    c.shutdown(LIMIT);
}

/// On iWARP a send completes once the message is on the wire: a message
/// whose connection a partition breaks may have completed and never
/// arrived. It stays in its QP's log until the receiver's credits show it
/// arrived, so the next connection sends it again. A partition in the
/// middle of a stream: every message arrives once, in order.
#[test]
fn messages_that_left_on_a_broken_iwarp_connection_arrive_once_and_in_order() {
    const N: u32 = 400;
    let mut c = stream_across_a_partition(SimDevice::iwarp("sim0"), N);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>());
    assert_eq!(c.btl(1).stats().out_of_order, 0);
    assert!(c.btl(0).stats().retransmits > 0, "nothing was sent again");
    c.shutdown(LIMIT);
}

/// The same, with the break forced while every message has left and none
/// arrived: the sender is idle (its completions came as the messages went
/// on the wire), and everything it sent is still to be sent again.
#[test]
fn messages_completed_before_an_iwarp_partition_are_sent_again() {
    let mut c = Cluster::new(32, 2, 1, SimDevice::iwarp("sim0"));
    c.btl(0).send(1, TAG, &[], &numbered(0, 64)).unwrap();
    c.run_until(LIMIT, |c| tagged(c, 1, 0) >= 1);
    c.sim.partition(0, 1);
    const N: u32 = 12;
    for i in 1..N {
        c.btl(0).send(1, TAG, &[], &numbered(i, 64)).unwrap();
    }
    c.run_until(LIMIT, |c| c.btl(0).is_idle());
    // The messages (and a cover, and the first, whose credit is not
    // back) wait in the log.
    let busy = c.btl(0).busy();
    let left: u32 = busy
        .split(" more left")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{busy}"));
    assert!(left >= N - 1, "{busy}");
    assert_eq!(tagged(&c, 1, 0), 1, "nothing crossed the partition");
    c.advance(Duration::from_millis(700));
    c.sim.heal(0, 1);
    c.run_until(LIMIT, |c| tagged(c, 1, 0) >= N as usize);
    c.settle(LIMIT);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>());
    assert!(c.btl(0).stats().retransmits >= u64::from(N - 1));
    c.shutdown(LIMIT);
}

/// Messages are delivered in place, from the receive buffer they arrived
/// in, which is posted again only once the consumer is done. A consumer
/// that progresses the BTL from inside its callback keeps every message
/// that arrives meanwhile in its receive (their deliveries wait for the
/// callback to return). On iWARP, where a send that finds no receive breaks
/// the connection, the credits of those messages must not go back to the
/// sender before their receives do.
#[test]
fn receives_held_by_a_consumer_in_a_callback_are_not_credited_back_on_iwarp() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};
    use xrcbtl_btl::sim::SimJob;
    use xrcbtl_fabric::sim::SimConfig;
    const N: u32 = 400;
    let cfg = SimConfig::new(4, 2).with_devices(vec![SimDevice::iwarp("sim0")]);
    let job = SimJob::with(cfg, 1, |c: &mut BtlConfig| {
        c.srq_depth = 4;
        c.srq_max_depth = 16;
        c.srq_refill = 2;
        c.credits = 6;
    })
    .unwrap();
    job.sim.set_auto_advance(true);
    let (a, b) = (job.peek(0).clone(), job.peek(1).clone());
    let got = Arc::new(Mutex::new(Vec::new()));
    let depth = Arc::new(AtomicU32::new(0));
    let (g, d, sender) = (got.clone(), depth.clone(), a.clone());
    b.register_am(TAG, move |btl, m| {
        g.lock()
            .unwrap()
            .push(u32::from_le_bytes(m.data[..4].try_into().unwrap()));
        // Every tenth message, the consumer progresses from inside its
        // callback (and the sender meanwhile) until more has arrived
        // behind it.
        let n = g.lock().unwrap().len();
        if n % 10 == 0 && d.fetch_add(1, Ordering::Relaxed) == 0 {
            for _ in 0..200 {
                btl.progress();
                sender.progress();
            }
        }
        d.store(0, Ordering::Relaxed);
    });
    for i in 0..N {
        a.send(1, TAG, &[], &numbered(i, 100)).unwrap();
    }
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while got.lock().unwrap().len() < N as usize || !a.is_idle() {
        assert!(std::time::Instant::now() < end, "stuck: {:?}", a.stats());
        a.progress();
        b.progress();
    }
    assert_eq!(*got.lock().unwrap(), (0..N).collect::<Vec<_>>());
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.send_errors, sa.retransmits), (0, 0), "{sa:?}");
    assert_eq!((sb.duplicates, sb.malformed), (0, 0), "{sb:?}");
    assert!(sa.credit_stalls > 0, "the sender never waited: {sa:?}");
}

/// A rank that only waits for a peer (it sends nothing more) hears of the
/// peer's crash through its error callback within a bounded time: the
/// connection the crash breaks is rebuilt at once, and the rebuild fails.
/// Over XRC, RC + SRQ and iWARP.
#[test]
fn a_pure_waiter_hears_of_a_crashed_peer_in_bounded_time() {
    for (device, force_rc) in [
        (SimDevice::ib("sim0"), false),
        (SimDevice::roce("sim0"), true),
        (SimDevice::iwarp("sim0"), false),
    ] {
        let mut c = Cluster::with(61, 2, 1, device.clone(), |cfg: &mut BtlConfig| {
            cfg.force_rc = force_rc;
        });
        let failed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let f = failed.clone();
        c.btl(0)
            .register_error(move |_, r, e| f.lock().unwrap().push((r, e.clone())));
        c.btl(0).send(1, TAG, &[], b"ping").unwrap();
        c.run_until(LIMIT, |c| c.got_count(1) == 1);
        c.btl(1).send(0, TAG, &[], b"pong").unwrap();
        c.run_until(LIMIT, |c| c.got_count(0) == 1);
        c.settle(LIMIT);
        let start = c.now();
        c.crash(1);
        c.run_until(LIMIT, |_| !failed.lock().unwrap().is_empty());
        let took = c.now() - start;
        let errs = failed.lock().unwrap().clone();
        assert_eq!(errs.len(), 1, "{device:?}: {errs:?}");
        assert_eq!(errs[0].0, 1);
        // The connection retries, each within a few dead-peer times.
        let bound = c.btl(0).config().dead_peer_after() * 4 * c.btl(0).config().retries;
        assert!(took <= bound, "{device:?}: {took:?} > {bound:?}");
        eprintln!(
            "{:?}: the crash was reported after {took:?}",
            device.caps.transport
        );
    }
}

/// Every receive a message used is posted again as it is consumed: a
/// receive queue that may not grow carries any number of messages, many
/// times its depth, on every device kind, without ever running low (the
/// hand-made mutation "no reposting", which left it to the SRQ limit
/// event, survived every other test).
#[test]
fn a_fixed_depth_srq_carries_many_times_its_depth() {
    for (device, force_rc) in [
        (SimDevice::ib("sim0"), false),
        (SimDevice::roce("sim0"), true),
        (SimDevice::iwarp("sim0"), false),
    ] {
        let mut c = Cluster::with(62, 2, 1, device.clone(), |cfg: &mut BtlConfig| {
            cfg.force_rc = force_rc;
            cfg.srq_depth = 32;
            cfg.srq_max_depth = 32;
            cfg.srq_refill = 4;
            cfg.small_size = 0;
        });
        const N: u32 = 2_000;
        for i in 0..N {
            c.btl(0).send(1, TAG, &[], &numbered(i, 100)).unwrap();
            if i % 16 == 15 {
                c.run_until(LIMIT, |c| c.got_count(1) == i as usize + 1);
            }
        }
        c.settle(LIMIT);
        assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>(), "{device:?}");
        let s = c.btl(1).stats();
        assert_eq!(s.srq_grown, 0, "{device:?}: the queue grew: {s:?}");
        // Posted again as they are consumed, not only when the SRQ runs
        // low and reports its limit.
        assert_eq!(s.srq_limit_events, 0, "{device:?}: {s:?}");
        c.shutdown(LIMIT);
    }
}

/// With a small receive class shorter than some short messages, each
/// goes to the class its length needs: the latency path, which addresses
/// short messages' one class without looking, leaves them to the general
/// path, which looks (a message sent to a class too small for it fails the
/// receive, and the peer with it). Every length from 4 to 64 bytes, whole
/// and in order. The small class's chunks are of a few buffers, so that
/// its last buffers are used too: the latency path reads a buffer at a
/// fixed length, longer than these, and must leave them alone.
#[test]
fn short_messages_take_the_class_their_length_needs() {
    let mut c = Cluster::with(64, 2, 1, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
        cfg.small_size = 48;
        cfg.srq_depth = 8;
    });
    // Connected first, so that the messages go at once, not queued.
    let mut sizes = vec![4];
    c.btl(0).send(1, TAG, &[], &numbered(0, 4)).unwrap();
    c.run_until(LIMIT, |c| tagged(c, 1, 0) == 1);
    for len in 4..=64 {
        c.btl(0)
            .send(1, TAG, &[], &numbered(sizes.len() as u32, len))
            .unwrap();
        sizes.push(len);
    }
    c.run_until(LIMIT, |c| tagged(c, 1, 0) == sizes.len());
    let got = c.got(1);
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(got[i].data, numbered(i as u32, len), "message {i}");
    }
    let (sent, received) = (c.btl(0).stats(), c.btl(1).stats());
    assert_eq!(sent.inline_sent, sizes.len() as u64, "all went inline");
    // Bodies up to 48 - 16 bytes fit the small class: 1 + 29 of them.
    assert_eq!(received.received_by_class, [30, 32]);
    assert_eq!(sent.send_errors, 0);
    c.shutdown(LIMIT);
}

/// A peer that exits cleanly is not reported as failed, even to a rank
/// whose connection to it breaks with the exit (which it now rebuilds at
/// once): an RC peer says it is leaving to every rank it is connected
/// with, as an XRC one does to the ranks that send to it. Over XRC, RC +
/// SRQ and iWARP.
#[test]
fn a_peer_leaving_cleanly_is_never_reported_failed() {
    for (device, force_rc) in [
        (SimDevice::ib("sim0"), false),
        (SimDevice::roce("sim0"), true),
        (SimDevice::iwarp("sim0"), false),
    ] {
        let mut c = Cluster::with(63, 2, 1, device.clone(), |cfg: &mut BtlConfig| {
            cfg.force_rc = force_rc;
        });
        let failed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let f = failed.clone();
        c.btl(0)
            .register_error(move |_, r, e| f.lock().unwrap().push((r, e.clone())));
        c.btl(0).send(1, TAG, &[], b"ping").unwrap();
        c.run_until(LIMIT, |c| c.got_count(1) == 1);
        c.btl(1).send(0, TAG, &[], b"pong").unwrap();
        c.run_until(LIMIT, |c| c.got_count(0) == 1);
        c.settle(LIMIT);
        c.exit(1, LIMIT);
        c.advance(Duration::from_secs(2));
        c.settle(LIMIT);
        let errs = failed.lock().unwrap().clone();
        assert!(errs.is_empty(), "{:?}: {errs:?}", device.caps.transport);
        let e = c.btl(0).send(1, TAG, &[], b"anyone?").unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
        c.shutdown(LIMIT);
    }
}
