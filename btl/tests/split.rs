//! Messages split into eager parts (`XRCBTL_SPLIT_LIMIT`): every size
//! arrives whole and intact on every device kind, in order with the eager
//! messages around it, through a failed TGT QP and a partition that makes
//! the sender resend; the default splits on iWARP only; settings outside
//! the bounds are refused.

mod btlsim;

use std::time::Duration;

use btlsim::{pattern, Cluster, Got, TAG};
use xrcbtl_btl::{BtlConfig, Bytes, EagerLimit, Mode, OpStatus, SplitLimit, MAX_SPLIT};
use xrcbtl_fabric::sim::SimDevice;

const LIMIT: Duration = Duration::from_secs(30);

/// Payload of message `i`: its index, then a pattern.
fn numbered(i: u32, len: usize) -> Vec<u8> {
    let mut v = pattern(i, len.max(4));
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

/// The indices rank `r` received from `src`, in arrival order.
fn stream(c: &Cluster, r: u32, src: u32) -> Vec<u32> {
    c.got(r)
        .iter()
        .filter(|g| g.src == src && g.tag == TAG)
        .map(|g: &Got| u32::from_le_bytes(g.data[..4].try_into().unwrap()))
        .collect()
}

/// Sizes around the eager limit and its multiples, up to the most a
/// receiver joins.
fn sizes(max_send: usize) -> Vec<usize> {
    let mut v = vec![1, 100, max_send, max_send + 1, 2 * max_send - 1];
    for k in [2, 3, 8, 64, 512] {
        v.extend([k * max_send, k * max_send + 1]);
    }
    v.extend([65_537, 1_000_003, MAX_SPLIT]);
    v.retain(|&n| n <= MAX_SPLIT);
    v.sort_unstable();
    v.dedup();
    v
}

fn every_size_split(device: SimDevice, force_rc: bool, expect: Mode) {
    let mut c = Cluster::with(41, 2, 2, device, |cfg: &mut BtlConfig| {
        cfg.split_limit = SplitLimit::Bytes(MAX_SPLIT);
        cfg.force_rc = force_rc;
    });
    assert_eq!(c.btl(0).mode(), expect);
    let max_send = c.btl(0).max_send_size();
    let sz = sizes(max_send);
    let split = sz.iter().filter(|&&n| n > max_send).count() as u64;
    for dst in [1, 3] {
        c.clear_got(dst);
        for (i, &len) in sz.iter().enumerate() {
            let data = Bytes::from(pattern(i as u32, len));
            let op = c.btl(0).send_bytes(dst, TAG, data, None).unwrap();
            // Complete at once: the BTL keeps its own reference.
            assert_eq!(c.btl(0).test(op), OpStatus::Done);
            c.run_until(LIMIT, |c| c.got_count(dst) == i + 1);
        }
        let got = c.got(dst);
        for (i, (g, &len)) in got.iter().zip(&sz).enumerate() {
            assert_eq!((g.src, g.tag, g.data.len()), (0, TAG, len), "size #{i}");
            assert!(g.data == pattern(i as u32, len), "size {len}: corrupted");
        }
        let r = c.btl(dst).stats();
        assert_eq!(r.joined, split, "{r:?}");
        assert_eq!((r.malformed, r.duplicates, r.out_of_order), (0, 0, 0));
    }
    c.settle(LIMIT);
    let s = c.btl(0).stats();
    assert_eq!(s.rndv_sent, 0, "nothing went by rendezvous: {s:?}");
    assert_eq!(s.split_sent, 2 * split, "{s:?}");
    // Parts of full size went from the caller's buffer.
    assert!(s.zcopy_sent > 2 * split, "{s:?}");
    c.shutdown(LIMIT);
}

#[test]
fn every_size_arrives_whole_in_parts_over_xrc() {
    every_size_split(SimDevice::ib("sim0"), false, Mode::Xrc);
}

#[test]
fn every_size_arrives_whole_in_parts_over_rc_srq() {
    every_size_split(SimDevice::roce("sim0"), true, Mode::Rc { p2p: false });
}

#[test]
fn every_size_arrives_whole_in_parts_over_iwarp() {
    every_size_split(SimDevice::iwarp("sim0"), false, Mode::Rc { p2p: true });
}

/// `auto` splits up to 16 KiB past XRC's 8 KiB eager limit, and nothing
/// with RC + SRQ (iWARP, RoCE without XRC), whose auto eager limit (64
/// KiB) covers it; 0 never.
#[test]
fn the_default_splits_up_to_16_kib_under_xrc_and_nothing_with_rc() {
    for (device, limit, split) in [
        (SimDevice::iwarp("sim0"), SplitLimit::Auto, 0),
        (SimDevice::roce("sim0"), SplitLimit::Auto, 0),
        (SimDevice::ib("sim0"), SplitLimit::Auto, 16 * 1024),
        (SimDevice::iwarp("sim0"), SplitLimit::Bytes(0), 0),
    ] {
        let mut c = Cluster::with(42, 2, 1, device.clone(), |cfg: &mut BtlConfig| {
            cfg.split_limit = limit;
        });
        let max_send = c.btl(0).max_send_size();
        let lens = [
            max_send + 1,
            16 * 1024,
            16 * 1024 + 1,
            32 * 1024,
            32 * 1024 + 1,
        ];
        for (i, &len) in lens.iter().enumerate() {
            c.btl(0)
                .send_bytes(1, TAG, Bytes::from(pattern(3, len)), None)
                .unwrap();
            c.run_until(LIMIT, |c| c.got_count(1) == i + 1);
        }
        c.settle(LIMIT);
        assert!(c.got(1).iter().all(|g| g.data == pattern(3, g.data.len())));
        let s = c.btl(0).stats();
        let past = |l: usize| l > max_send;
        let n_split = lens.iter().filter(|&&l| past(l) && l <= split).count() as u64;
        let n_rndv = lens.iter().filter(|&&l| past(l) && l > split).count() as u64;
        assert_eq!(
            (s.split_sent, s.rndv_sent),
            (n_split, n_rndv),
            "{device:?} {limit:?}"
        );
        c.shutdown(LIMIT);
    }
}

/// Split messages interleaved with small ones, to three receivers, while
/// a TGT QP they go through fails: every message arrives exactly once and
/// in the order it was sent (parts are eager messages: resent in order,
/// never joined twice).
#[test]
fn split_messages_keep_their_order_through_a_failed_tgt_qp() {
    let mut c = Cluster::with(43, 2, 3, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
        cfg.split_limit = SplitLimit::Bytes(256 * 1024);
    });
    const N: u32 = 60;
    let mut sent = 0;
    for i in 0..N {
        for src in 0..2 {
            for dst in 3..6 {
                let len = if i % 5 == 4 { 40_000 + i as usize } else { 64 };
                c.btl(src)
                    .send_bytes(dst, TAG, Bytes::from(numbered(i, len)), None)
                    .unwrap();
                sent += 1;
            }
        }
        if i == N / 3 {
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
    assert_eq!(got, sent);
    for dst in 3..6 {
        for src in 0..2 {
            assert_eq!(stream(&c, dst, src), (0..N).collect::<Vec<_>>());
        }
        for g in c.got(dst) {
            let i = u32::from_le_bytes(g.data[..4].try_into().unwrap());
            let len = if i % 5 == 4 { 40_000 + i as usize } else { 64 };
            assert!(g.data == numbered(i, len), "message {i}: corrupted");
        }
        let s = c.btl(dst).stats();
        assert_eq!((s.out_of_order, s.malformed), (0, 0), "{s:?}");
    }
    let retrans: u64 = (0..2).map(|r| c.btl(r).stats().retransmits).sum();
    assert!(retrans > 0, "the failure hit nothing in flight");
    assert_eq!((0..2).map(|r| c.btl(r).stats().rndv_sent).sum::<u64>(), 0);
    c.shutdown(LIMIT);
}

/// A partition long enough for the sender's QP to give up loses the
/// acknowledgements of parts that had arrived: they are sent again, and
/// the receiver drops them as duplicates instead of joining them twice.
#[test]
fn parts_resent_after_a_partition_are_dropped_as_duplicates() {
    let mut c = Cluster::with(44, 2, 1, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
        cfg.split_limit = SplitLimit::Bytes(MAX_SPLIT);
    });
    const N: u32 = 40;
    let len = |i: u32| 30_000 + 1000 * i as usize;
    for i in 0..N {
        c.btl(0)
            .send_bytes(1, TAG, Bytes::from(numbered(i, len(i))), None)
            .unwrap();
    }
    c.run_until(LIMIT, |c| c.got_count(1) >= 5);
    c.sim.partition(0, 1);
    c.advance(Duration::from_millis(700));
    c.sim.heal(0, 1);
    c.settle(LIMIT);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>());
    for (i, g) in c.got(1).iter().enumerate() {
        assert!(g.data == numbered(i as u32, len(i as u32)), "message {i}");
    }
    let s = c.btl(1).stats();
    assert!(s.duplicates > 0, "nothing was delivered twice: {s:?}");
    assert_eq!(
        (s.out_of_order, s.malformed, s.joined),
        (0, 0, u64::from(N))
    );
    assert!(c.btl(0).stats().retransmits > 0);
    c.shutdown(LIMIT);
}

/// On iWARP every part spends a credit: a window of 64 messages of 32 KiB
/// (four parts each past an 8 KiB eager limit) waits for credits, and
/// arrives whole.
#[test]
fn a_window_of_split_messages_waits_for_credits_on_iwarp() {
    let mut c = Cluster::with(45, 2, 1, SimDevice::iwarp("sim0"), |cfg: &mut BtlConfig| {
        cfg.eager_limit = EagerLimit::Bytes(8192);
        cfg.split_limit = SplitLimit::Bytes(32 * 1024);
    });
    const N: u32 = 64;
    for i in 0..N {
        c.btl(0)
            .send_bytes(1, TAG, Bytes::from(numbered(i, 32 * 1024)), None)
            .unwrap();
    }
    c.run_until(LIMIT, |c| c.got_count(1) == N as usize);
    assert_eq!(stream(&c, 1, 0), (0..N).collect::<Vec<_>>());
    assert!(c
        .got(1)
        .iter()
        .enumerate()
        .all(|(i, g)| g.data == numbered(i as u32, 32 * 1024)));
    let s = c.btl(0).stats();
    assert_eq!((s.split_sent, s.rndv_sent), (u64::from(N), 0), "{s:?}");
    assert!(s.credit_stalls > 0, "{s:?}");
    c.settle(LIMIT);
    c.shutdown(LIMIT);
}

#[test]
fn split_limits_beyond_what_a_receiver_joins_are_refused() {
    let base = || {
        BtlConfig::new(
            0,
            0,
            1,
            xrcbtl_fabric::XrcdKey::new("k"),
            "127.0.0.1:0".parse().unwrap(),
        )
    };
    let get = |v: &'static str| move |k: &str| (k == "XRCBTL_SPLIT_LIMIT").then(|| v.to_string());
    assert_eq!(
        base().with_vars(get("65536")).unwrap().split_limit,
        SplitLimit::Bytes(65536)
    );
    assert_eq!(
        base().with_vars(get("auto")).unwrap().split_limit,
        SplitLimit::Auto
    );
    let e = base().with_vars(get("4194305")).unwrap_err().to_string();
    assert!(e.contains("XRCBTL_SPLIT_LIMIT=4194305"), "{e}");
    let e = base().with_vars(get("lots")).unwrap_err().to_string();
    assert!(e.contains("XRCBTL_SPLIT_LIMIT"), "{e}");
}
