//! A peer that lies in its headers (the simulator rewrites its messages on
//! the wire, [`xrcbtl_fabric::sim::SimFabric::tamper`]): it cannot speak for
//! another rank, and a train of parts that breaks the rules is dropped
//! without disturbing anyone else.

mod btlsim;

use std::time::Duration;

use btlsim::{pattern, Cluster, TAG};
use xrcbtl_btl::{BtlConfig, Mode, SplitLimit, MAX_SPLIT};
use xrcbtl_fabric::sim::SimDevice;

const LIMIT: Duration = Duration::from_secs(30);
/// Header layout (wire.rs): source rank at 0, kind at 8, tag at 9.
const SRC: usize = 0;
const KIND: usize = 8;
const TAG_AT: usize = 9;
/// Kind codes (wire.rs).
const EAGER: u8 = 1;
const PART: u8 = 7;

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

/// Ranks 0 and 1 on node 0, 2 and 3 on node 1. Rank 0 claims to be rank
/// 1 in everything it sends to node 1: rank 2 believes none of it, and
/// rank 1's own messages, sent afterwards, arrive intact and in order.
fn a_claimed_rank_is_checked_against_the_qp(device: SimDevice, force_rc: bool, expect: Mode) {
    let mut c = Cluster::with(51, 2, 2, device, |cfg: &mut BtlConfig| {
        cfg.force_rc = force_rc;
    });
    assert_eq!(c.btl(0).mode(), expect);
    c.connect_all(LIMIT);
    // One true message from each, rank 0's last: rank 2 has seen which QP
    // carries rank 0's messages, and expects the same number from both
    // next, so that only the claimed rank gives the lie away (the receive
    // side's fast path must check it too).
    for (from, i) in [(1, 200), (0, 201)] {
        let before = c.got_count(2);
        c.btl(from).send(2, TAG, &[], &pattern(i, 64)).unwrap();
        c.run_until(LIMIT, |c| c.got_count(2) == before + 1);
    }
    c.sim.tamper(Some(Box::new(|from, to, msg: &mut Vec<u8>| {
        if from == 0 && to == 1 && msg.len() >= 16 && u32_at(msg, SRC) == 0 {
            msg[SRC..SRC + 4].copy_from_slice(&1u32.to_le_bytes());
        }
    })));
    // Fewer than the credits a sender has on iWARP: the receiver returns
    // none for what it refused.
    const N: u32 = 10;
    for i in 0..N {
        c.btl(0).send(2, TAG, &[], &pattern(i, 64)).unwrap();
    }
    c.run_until(LIMIT, |c| c.btl(2).stats().malformed >= u64::from(N));
    c.sim.tamper(None);
    for i in 0..N {
        c.btl(1).send(2, TAG, &[], &pattern(100 + i, 64)).unwrap();
    }
    c.run_until(LIMIT, |c| c.got_count(2) == N as usize + 2);
    let got = c.got(2);
    assert_eq!(got.iter().map(|g| g.src).collect::<Vec<_>>()[..2], [1, 0]);
    let got = &got[2..];
    assert!(got.iter().all(|g| g.src == 1), "a lie was delivered");
    let want: Vec<Vec<u8>> = (0..N).map(|i| pattern(100 + i, 64)).collect();
    let data: Vec<Vec<u8>> = got.iter().map(|g| g.data.clone()).collect();
    assert_eq!(data, want, "rank 1's stream was disturbed");
    let s = c.btl(2).stats();
    assert_eq!(s.duplicates, 0, "{s:?}");
}

#[test]
fn a_claimed_rank_is_checked_against_the_tgt_qp_over_xrc() {
    a_claimed_rank_is_checked_against_the_qp(SimDevice::ib("sim0"), false, Mode::Xrc);
}

#[test]
fn a_claimed_rank_is_checked_against_the_qp_over_rc() {
    a_claimed_rank_is_checked_against_the_qp(
        SimDevice::roce("sim0"),
        true,
        Mode::Rc { p2p: false },
    );
}

#[test]
fn a_claimed_rank_is_checked_against_the_qp_over_iwarp() {
    a_claimed_rank_is_checked_against_the_qp(
        SimDevice::iwarp("sim0"),
        false,
        Mode::Rc { p2p: true },
    );
}

/// Rank 0 turns its eager messages into parts of one train: past
/// [`MAX_SPLIT`] bytes rank 2 drops the train as malformed instead of
/// holding more, and swallows its remaining parts up to its last; a train
/// whose tag changes midway is dropped too. Nothing of either is
/// delivered, and rank 1's messages to rank 2 meanwhile arrive intact.
#[test]
fn a_train_too_long_or_changing_tag_is_dropped() {
    let mut c = Cluster::with(52, 2, 2, SimDevice::ib("sim0"), |cfg: &mut BtlConfig| {
        cfg.split_limit = SplitLimit::Bytes(0);
    });
    c.connect_all(LIMIT);
    let part = c.btl(0).max_send_size();
    let n = MAX_SPLIT / part + 2;
    // Every eager message of rank 0 but the last becomes a part.
    let mut seen = 0;
    c.sim
        .tamper(Some(Box::new(move |from, to, msg: &mut Vec<u8>| {
            if from == 0 && to == 1 && msg.len() >= 16 && msg[KIND] == EAGER && u32_at(msg, 0) == 0
            {
                seen += 1;
                if seen < n {
                    msg[KIND] = PART;
                }
            }
        })));
    for i in 0..n {
        c.btl(0)
            .send(2, TAG, &[], &pattern(i as u32, part))
            .unwrap();
        if i % 64 == 0 {
            c.btl(1).send(2, TAG, &[], &pattern(7, 100)).unwrap();
        }
    }
    c.settle(LIMIT);
    assert_eq!(
        c.btl(2).stats().malformed,
        1,
        "the long train was not refused"
    );
    // Three messages: a part, a part of another tag, the last.
    let mut seen = 0;
    c.sim
        .tamper(Some(Box::new(move |from, to, msg: &mut Vec<u8>| {
            if from == 0 && to == 1 && msg.len() >= 16 && msg[KIND] == EAGER && u32_at(msg, 0) == 0
            {
                seen += 1;
                if seen <= 2 {
                    msg[KIND] = PART;
                }
                if seen == 2 {
                    msg[TAG_AT] = TAG + 1;
                }
            }
        })));
    for i in 0..3 {
        c.btl(0).send(2, TAG, &[], &pattern(i, part)).unwrap();
    }
    c.settle(LIMIT);
    assert_eq!(
        c.btl(2).stats().malformed,
        2,
        "the changed tag was not refused"
    );
    // And rank 0 is believed again once it tells the truth.
    c.sim.tamper(None);
    c.btl(0).send(2, TAG, &[], &pattern(9, 200)).unwrap();
    c.settle(LIMIT);
    let got = c.got(2);
    let from1: Vec<_> = got.iter().filter(|g| g.src == 1).collect();
    assert_eq!(from1.len(), n.div_ceil(64));
    assert!(from1.iter().all(|g| g.data == pattern(7, 100)));
    let from0: Vec<_> = got.iter().filter(|g| g.src == 0).collect();
    assert_eq!(from0.len(), 1, "rank 0's lies were delivered");
    assert!(from0[0].data == pattern(9, 200));
    assert_eq!(c.btl(2).stats().joined, 0);
}

/// Kind code of a rendezvous request (wire.rs); its length sits at 8 in
/// the body, after the message id.
const RTS: u8 = 2;

/// A request for a rendezvous longer than the receiver takes
/// (`XRCBTL_RNDV_MAX`), whether the sender lies about its length (2^40 and
/// 3 GiB on the wire) or means it (2 MiB to a receiver that takes 1 MiB):
/// the receiver allocates nothing and says no, the sender's operation
/// fails with `RemoteInvalidRequest` instead of waiting forever, and the
/// pair goes on talking. A sender refuses at once what its own bound
/// forbids. Over XRC, RC + SRQ and iWARP (put).
#[test]
fn a_rendezvous_longer_than_the_receiver_takes_fails_the_sender_and_nothing_else() {
    use std::sync::{Arc, Mutex};
    use xrcbtl_btl::{BtlError, Bytes};
    use xrcbtl_fabric::WcStatus;
    for device in [
        SimDevice::ib("sim0"),
        SimDevice::roce("sim0"),
        SimDevice::iwarp("sim0"),
    ] {
        // Rank 0 sends up to 4 MiB, rank 1 takes up to 1 MiB.
        let mut c = Cluster::with(57, 2, 1, device.clone(), |cfg: &mut BtlConfig| {
            cfg.rndv_max = if cfg.rank == 0 { 4 << 20 } else { 1 << 20 };
            cfg.split_limit = SplitLimit::Bytes(0);
        });
        c.connect_all(LIMIT);
        let refused = BtlError::Transfer(WcStatus::RemoteInvalidRequest);
        for lie in [Some(1u64 << 40), Some(3 << 30), None] {
            let len = if lie.is_some() { 100_000 } else { 2 << 20 };
            c.sim.tamper(lie.map(|claim| -> xrcbtl_fabric::sim::Tamper {
                Box::new(move |_, _, msg: &mut Vec<u8>| {
                    if msg.len() == 16 + 29 && msg[KIND] == RTS {
                        msg[16 + 8..16 + 16].copy_from_slice(&claim.to_le_bytes());
                    }
                })
            }));
            let outcome = Arc::new(Mutex::new(None));
            let o = outcome.clone();
            c.btl(0)
                .send_bytes(
                    1,
                    TAG,
                    Bytes::from(pattern(3, len)),
                    Some(Box::new(move |_, _, r| *o.lock().unwrap() = Some(r))),
                )
                .unwrap();
            c.run_until(LIMIT, |_| outcome.lock().unwrap().is_some());
            c.sim.tamper(None);
            c.settle(LIMIT);
            let got = outcome.lock().unwrap().take();
            assert!(
                matches!(&got, Some(Err(e)) if *e == refused),
                "{lie:?}: {got:?}"
            );
            // Nothing was delivered, and the pair still talks.
            assert_eq!(c.got_count(1), 0, "{lie:?}");
            c.btl(0).send(1, TAG, &[], b"still here").unwrap();
            c.run_until(LIMIT, |c| c.got_count(1) == 1);
            c.clear_got(1);
        }
        let s = c.btl(1).stats();
        assert_eq!(s.rndv_refused, 3, "{:?}: {s:?}", device.caps.transport);
        // Past the sender's own bound: refused before anything is sent.
        let e = c
            .btl(0)
            .send_bytes(1, TAG, Bytes::from(vec![1u8; 5 << 20]), None);
        assert!(e.unwrap_err().to_string().contains("XRCBTL_RNDV_MAX"));
        c.shutdown(LIMIT);
    }
}

/// A header whose sequence number lies far ahead (2^30) is refused, not
/// believed: it is not delivered, the receiver's place in that stream does
/// not move (nothing after it is taken for a duplicate), and the other
/// peers' streams are untouched. (The liar's own stream then stalls: its
/// message with that number never came.)
#[test]
fn a_sequence_number_far_ahead_is_refused_and_moves_nothing() {
    for device in [
        SimDevice::ib("sim0"),
        SimDevice::roce("sim0"),
        SimDevice::iwarp("sim0"),
    ] {
        let mut c = Cluster::with(59, 3, 1, device.clone(), |_: &mut BtlConfig| {});
        c.connect_all(LIMIT);
        let lie = pattern(7, 64);
        let marker = lie.clone();
        c.sim.tamper(Some(Box::new(move |_, _, msg: &mut Vec<u8>| {
            if msg.len() == 16 + 64 && msg[KIND] == EAGER && msg[16..] == marker[..] {
                let seq = u32_at(msg, 4).wrapping_add(1 << 30);
                msg[4..8].copy_from_slice(&seq.to_le_bytes());
            }
        })));
        for i in 0..3 {
            c.btl(0).send(1, TAG, &[], &pattern(i, 64)).unwrap();
        }
        c.btl(0).send(1, TAG, &[], &lie).unwrap();
        c.run_until(LIMIT, |c| c.btl(1).stats().malformed >= 1);
        // Rank 0's next ones are ahead of the hole, not duplicates.
        c.btl(0).send(1, TAG, &[], &pattern(8, 64)).unwrap();
        for i in 0..3 {
            c.btl(2).send(1, TAG, &[], &pattern(100 + i, 64)).unwrap();
        }
        c.run_until(LIMIT, |c| {
            c.got(1).iter().filter(|g| g.src == 2).count() == 3
        });
        c.advance(Duration::from_millis(50));
        c.settle(LIMIT);
        c.sim.tamper(None);
        let from0: Vec<Vec<u8>> = c
            .got(1)
            .into_iter()
            .filter(|g| g.src == 0)
            .map(|g| g.data)
            .collect();
        let want: Vec<Vec<u8>> = (0..3).map(|i| pattern(i, 64)).collect();
        assert_eq!(
            from0, want,
            "{:?}: the lie or what followed it was delivered",
            device.caps.transport
        );
        let s = c.btl(1).stats();
        assert_eq!(
            s.duplicates, 0,
            "{:?}: the lie moved the stream: {s:?}",
            device.caps.transport
        );
    }
}
