//! Two endpoints of two domains driven against each other through a fake
//! driver: buffers are byte vectors, the wire is a queue, and each test
//! checks the completions, the bytes that landed, and that nothing is left
//! over afterwards.

use std::collections::{HashMap, VecDeque};

use super::*;

const A: u32 = 0;
const B: u32 = 1;

/// One side: its protocol and its fake memory.
struct Side {
    rdm: Rdm,
    domain: u32,
    /// Send buffers and receive buffers, by operation.
    bufs: HashMap<OpRef, Vec<u8>>,
    /// Exposed send buffers, by key.
    exposed: HashMap<u32, OpRef>,
    sends_done: Vec<(OpRef, Outcome)>,
    recvs_done: Vec<(OpRef, Outcome, Received)>,
    /// Reads waiting for the harness to run them: (read, recv, offset,
    /// remote key, length).
    reads: VecDeque<(u64, OpRef, usize, u32, usize)>,
    /// Places of receives offered to writers, by key: (receive, offset,
    /// length).
    offered: HashMap<u32, (OpRef, usize, usize)>,
    /// Writes waiting for the harness to run them: (message id, send,
    /// remote key, length).
    writes: VecDeque<(u64, OpRef, u32, usize)>,
    /// Bytes this side wrote into its peer's receives, and read from its
    /// peer's sends.
    written: usize,
    read: usize,
    /// Faults: registering a receive's place fails; writes fail.
    refuse_places: bool,
    fail_writes: bool,
}

struct Pair {
    sides: [Side; 2],
    /// Messages in flight: (to domain, from domain, bytes).
    wire: VecDeque<(u32, u32, Vec<u8>)>,
    /// Eager sends whose BTL completion is still to come.
    sent: VecDeque<(u32, OpRef)>,
    /// Domains that are gone: nothing reaches them or comes from them.
    lost: Vec<u32>,
}

fn peer(domain: u32) -> PeerEp {
    PeerEp { domain, ep: 0 }
}

impl Pair {
    /// Two endpoints whose receivers read large messages.
    fn new(eager_max: usize) -> Pair {
        Pair::with(eager_max, false)
    }

    /// Two endpoints whose receivers read large messages, or (`writes`)
    /// have them written.
    fn with(eager_max: usize, writes: bool) -> Pair {
        let side = |domain| Side {
            rdm: Rdm::new(0, eager_max, 1 << 20).with_writes(writes),
            domain,
            bufs: HashMap::new(),
            exposed: HashMap::new(),
            sends_done: Vec::new(),
            recvs_done: Vec::new(),
            reads: VecDeque::new(),
            offered: HashMap::new(),
            writes: VecDeque::new(),
            written: 0,
            read: 0,
            refuse_places: false,
            fail_writes: false,
        };
        Pair {
            sides: [side(A), side(B)],
            wire: VecDeque::new(),
            sent: VecDeque::new(),
            lost: Vec::new(),
        }
    }

    fn send(
        &mut self,
        from: u32,
        op: OpRef,
        space: Space,
        data: Option<u64>,
        bytes: Vec<u8>,
        delivery: bool,
    ) {
        let to = peer(1 - from);
        let s = &mut self.sides[from as usize];
        let req = SendReq {
            to,
            space,
            data,
            len: bytes.len(),
            delivery,
        };
        s.bufs.insert(op, bytes);
        s.rdm.send(op, req);
    }

    fn recv(&mut self, on: u32, op: OpRef, space: Space, want: Want, len: usize) {
        let s = &mut self.sides[on as usize];
        s.bufs.insert(op, vec![0; len]);
        s.rdm.post_recv(op, space, want, len, None).unwrap();
    }

    /// Runs every action and delivers every message until nothing moves.
    fn run(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..2 {
                while let Some(a) = self.sides[i].rdm.poll_action() {
                    moved = true;
                    self.act(i, a);
                }
            }
            if let Some((to, from, bytes)) = self.wire.pop_front() {
                moved = true;
                if !self.lost.contains(&to) && !self.lost.contains(&from) {
                    let source = Source::Known(u64::from(from));
                    self.sides[to as usize]
                        .rdm
                        .handle_message(from, source, &bytes)
                        .unwrap();
                }
            } else if let Some((on, op)) = self.sent.pop_front() {
                moved = true;
                self.sides[on as usize].rdm.handle_sent(op, true);
            } else {
                for i in 0..2 {
                    if let Some((msg_id, op, key, len)) = self.sides[i].writes.pop_front() {
                        moved = true;
                        let ok = !self.lost.contains(&self.sides[1 - i].domain)
                            && !self.lost.contains(&self.sides[i].domain)
                            && !self.sides[i].fail_writes;
                        if ok {
                            self.sides[i].written += len;
                            let (recv, offset, room) = self.sides[1 - i].offered[&key];
                            assert!(len <= room, "a write within the place offered");
                            let bytes = self.sides[i].bufs[&op][..len].to_vec();
                            self.sides[1 - i].bufs.get_mut(&recv).unwrap()[offset..offset + len]
                                .copy_from_slice(&bytes);
                        }
                        self.sides[i].rdm.handle_written(msg_id, ok);
                    }
                    if let Some((read, recv, offset, key, len)) = self.sides[i].reads.pop_front() {
                        moved = true;
                        let other = &self.sides[1 - i];
                        // A read fails when either end is gone.
                        let ok = !self.lost.contains(&other.domain)
                            && !self.lost.contains(&self.sides[i].domain);
                        if ok {
                            let src_op = other.exposed[&key];
                            let bytes = other.bufs[&src_op][..len].to_vec();
                            self.sides[i].read += len;
                            self.sides[i].bufs.get_mut(&recv).unwrap()[offset..offset + len]
                                .copy_from_slice(&bytes);
                        }
                        self.sides[i].rdm.handle_read(read, ok);
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn act(&mut self, i: usize, a: Action) {
        let s = &mut self.sides[i];
        match a {
            Action::Send {
                to,
                mut header,
                op,
                payload_len,
            } => {
                // The BTL refuses a message to an endpoint it knows is gone.
                if self.lost.contains(&to.domain) {
                    if let Some(op) = op {
                        s.rdm.handle_sent(op, false);
                    }
                    return;
                }
                if let Some(op) = op {
                    header.extend_from_slice(&s.bufs[&op][..payload_len]);
                    self.sent.push_back((s.domain, op));
                }
                self.wire.push_back((to.domain, s.domain, header));
            }
            Action::Expose { op } => {
                let key = 1000 + op as u32;
                s.exposed.insert(key, op);
                s.rdm.handle_exposed(
                    op,
                    Some(Exposed {
                        addr: 0x10_0000,
                        key,
                    }),
                );
            }
            Action::Unexpose { op } => {
                let key = 1000 + op as u32;
                assert_eq!(s.exposed.remove(&key), Some(op), "unexposed once");
            }
            Action::CopyIn {
                recv,
                offset,
                bytes,
            } => {
                s.bufs.get_mut(&recv).unwrap()[offset..offset + bytes.len()]
                    .copy_from_slice(&bytes);
            }
            Action::Read {
                read,
                from,
                remote,
                recv,
                offset,
                len,
            } => {
                assert_eq!(from.domain, 1 - s.domain);
                assert_eq!(remote.addr, 0x10_0000);
                s.reads.push_back((read, recv, offset, remote.key, len));
            }
            Action::ExposeRecv {
                grant,
                recv,
                offset,
                len,
            } => {
                let key = 5000 + grant as u32;
                assert!(offset + len <= s.bufs[&recv].len());
                if s.refuse_places {
                    s.rdm.handle_recv_exposed(grant, None);
                    return;
                }
                s.offered.insert(key, (recv, offset, len));
                s.rdm.handle_recv_exposed(
                    grant,
                    Some(Exposed {
                        addr: 0x20_0000,
                        key,
                    }),
                );
            }
            Action::UnexposeRecv { grant } => {
                let key = 5000 + grant as u32;
                assert!(s.offered.remove(&key).is_some(), "unexposed once");
            }
            Action::Write {
                msg_id,
                op,
                to,
                remote,
                len,
            } => {
                assert_eq!(to.domain, 1 - s.domain);
                assert_eq!(remote.addr, 0x20_0000);
                assert!(
                    s.exposed.values().any(|&o| o == op),
                    "writes from a registered buffer"
                );
                s.writes.push_back((msg_id, op, remote.key, len));
            }
            Action::SendDone { op, outcome } => s.sends_done.push((op, outcome)),
            Action::RecvDone { recv, outcome, got } => s.recvs_done.push((recv, outcome, got)),
        }
    }

    /// Nothing in flight, nothing waiting, nothing exposed, no action left.
    fn assert_clean(&mut self) {
        self.run();
        for s in &mut self.sides {
            assert_eq!(s.rdm.in_flight(), (0, 0, 0), "domain {}", s.domain);
            assert_eq!(s.rdm.unexpected_len(), 0, "domain {}", s.domain);
            assert!(s.exposed.is_empty(), "domain {}: {:?}", s.domain, s.exposed);
            assert!(s.offered.is_empty(), "domain {}: {:?}", s.domain, s.offered);
            assert_eq!(s.rdm.poll_action(), None);
        }
    }
}

/// A tagged receive of `tag` from anyone.
fn tag_is(tag: u64) -> Want {
    Want {
        from: None,
        tag,
        ignore: 0,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn messages_of_every_size_around_the_eager_limit_land_whole_posted_first_or_last() {
    for (len, writes) in [0, 1, 63, 64, 65, 4096]
        .into_iter()
        .flat_map(|l| [(l, false), (l, true)])
    {
        for recv_first in [true, false] {
            let mut p = Pair::with(64, writes);
            let tag = Space::Tagged(7);
            if recv_first {
                p.recv(B, 10, tag, tag_is(7), len);
            }
            p.send(A, 1, tag, Some(0xda7a), pattern(len, 3), false);
            p.run();
            if !recv_first {
                p.recv(B, 10, tag, tag_is(7), len);
            }
            p.run();
            assert_eq!(p.sides[0].sends_done, [(1, Outcome::Done)], "len {len}");
            let (recv, outcome, got) = p.sides[1].recvs_done[0];
            assert_eq!((recv, outcome), (10, Outcome::Done));
            assert_eq!(
                got,
                Received {
                    from: Source::Known(0),
                    tag: 7,
                    len,
                    offset: 0,
                    data: Some(0xda7a),
                    released: true
                }
            );
            assert_eq!(
                p.sides[1].bufs[&10],
                pattern(len, 3),
                "len {len}, receive first {recv_first}"
            );
            p.assert_clean();
        }
    }
}

#[test]
fn a_short_receive_gets_what_fits_and_the_bytes_that_did_not() {
    for (len, writes) in [(40, false), (5000, false), (5000, true)] {
        let mut p = Pair::with(64, writes);
        p.recv(B, 10, Space::Msg, Want::ANY, 30);
        p.send(A, 1, Space::Msg, None, pattern(len, 9), false);
        p.run();
        let (_, outcome, got) = p.sides[1].recvs_done[0];
        assert_eq!(outcome, Outcome::Truncated(len - 30));
        assert_eq!((got.len, got.data), (30, None));
        assert_eq!(p.sides[1].bufs[&10], pattern(len, 9)[..30]);
        assert_eq!(p.sides[0].sends_done, [(1, Outcome::Done)]);
        if writes {
            assert_eq!(p.sides[0].written, 30, "only what fits is written");
        }
        p.assert_clean();
    }
}

#[test]
fn delivery_complete_waits_for_the_receivers_match() {
    let mut p = Pair::new(64);
    p.send(A, 1, Space::Tagged(1), None, pattern(8, 0), true);
    p.run();
    assert!(
        p.sides[0].sends_done.is_empty(),
        "sent, but nobody has it yet"
    );
    p.recv(
        B,
        10,
        Space::Tagged(1),
        Want {
            from: Some(0),
            tag: 1,
            ignore: 0,
        },
        8,
    );
    p.run();
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::Done)]);
    p.assert_clean();
}

#[test]
fn a_large_send_completes_only_after_the_receiver_read_it() {
    for writes in [false, true] {
        large_send_completes_after_the_receiver_has_it(writes);
    }
}

fn large_send_completes_after_the_receiver_has_it(writes: bool) {
    let mut p = Pair::with(64, writes);
    p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
    p.run();
    assert!(p.sides[0].sends_done.is_empty());
    assert_eq!(
        p.sides[0].exposed.len(),
        1,
        "its buffer stays exposed while it waits"
    );
    p.recv(
        B,
        10,
        Space::Tagged(1),
        Want {
            from: None,
            tag: 0,
            ignore: u64::MAX,
        },
        1000,
    );
    p.run();
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::Done)]);
    assert_eq!(p.sides[1].bufs[&10], pattern(1000, 1));
    if writes {
        assert_eq!((p.sides[0].written, p.sides[1].read), (1000, 0), "written");
    } else {
        assert_eq!((p.sides[0].written, p.sides[1].read), (0, 1000), "read");
    }
    p.assert_clean();
}

/// Runs actions and delivers messages, but no read or write.
fn run_but_no_transfer(p: &mut Pair) {
    for _ in 0..20 {
        for i in 0..2 {
            while let Some(a) = p.sides[i].rdm.poll_action() {
                p.act(i, a);
            }
        }
        if let Some((to, from, bytes)) = p.wire.pop_front() {
            p.sides[to as usize]
                .rdm
                .handle_message(from, Source::Known(u64::from(from)), &bytes)
                .unwrap();
        }
    }
}

#[test]
fn a_lost_peer_fails_its_sends_and_reads_and_drops_its_waiting_messages() {
    let mut p = Pair::new(64);
    p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
    p.send(A, 2, Space::Tagged(2), None, pattern(10, 1), true);
    p.send(B, 3, Space::Tagged(3), None, pattern(10, 1), false);
    p.recv(B, 10, Space::Tagged(1), tag_is(1), 1000);
    // Deliver the messages, but run no read yet.
    run_but_no_transfer(&mut p);
    assert_eq!(p.sides[1].reads.len(), 1);
    assert_eq!(p.sides[0].rdm.unexpected_len(), 1, "B's message to A waits");
    p.lost.push(B);
    p.sides[0].rdm.handle_peer_lost(B);
    p.sides[1].rdm.handle_peer_lost(A);
    p.run();
    let mut a_done = p.sides[0].sends_done.clone();
    a_done.sort();
    assert_eq!(a_done, [(1, Outcome::PeerLost), (2, Outcome::PeerLost)]);
    assert_eq!(
        p.sides[1]
            .recvs_done
            .iter()
            .map(|r| (r.0, r.1))
            .collect::<Vec<_>>(),
        [(10, Outcome::PeerLost)]
    );
    p.sides[1].reads.clear();
    p.sides[1].rdm.handle_read(1, false);
    p.sent.clear();
    p.assert_clean();
}

#[test]
fn a_lost_peer_fails_a_send_and_a_receive_whose_place_was_offered() {
    let mut p = Pair::with(64, true);
    p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
    p.recv(B, 10, Space::Tagged(1), tag_is(1), 1000);
    run_but_no_transfer(&mut p);
    assert_eq!(p.sides[0].writes.len(), 1, "the offer came");
    assert_eq!(p.sides[1].offered.len(), 1);
    assert_eq!(p.sides[1].rdm.in_flight(), (0, 1, 0), "an offer in flight");
    p.lost.push(B);
    p.sides[0].rdm.handle_peer_lost(B);
    p.sides[1].rdm.handle_peer_lost(A);
    p.run();
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::PeerLost)]);
    assert_eq!(p.sides[1].recvs_done.len(), 1);
    assert_eq!(p.sides[1].recvs_done[0].1, Outcome::PeerLost);
    p.sent.clear();
    p.assert_clean();
}

#[test]
fn sends_begun_after_their_peer_was_lost_fail_eager_or_large() {
    // A send posted between the peer's loss and the user's reading of it
    // (libfabric's kill test: a completion read, the next send posted).
    for writes in [false, true] {
        let mut p = Pair::with(64, writes);
        p.lost.push(B);
        p.sides[0].rdm.handle_peer_lost(B);
        p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
        p.send(A, 2, Space::Tagged(2), None, pattern(10, 1), false);
        p.send(A, 3, Space::Tagged(3), None, pattern(10, 1), true);
        p.run();
        let mut done = p.sides[0].sends_done.clone();
        done.sort();
        assert_eq!(
            done,
            [
                (1, Outcome::PeerLost),
                (2, Outcome::PeerLost),
                (3, Outcome::PeerLost)
            ],
            "writes {writes}"
        );
        p.assert_clean();
    }
}

#[test]
fn a_place_that_cannot_be_registered_fails_the_receive_and_the_send() {
    let mut p = Pair::with(64, true);
    p.sides[1].refuse_places = true;
    p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
    p.recv(B, 10, Space::Tagged(1), tag_is(1), 1000);
    p.run();
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::RemoteFailed(2))]);
    assert_eq!(p.sides[1].recvs_done[0].1, Outcome::PeerLost);
    assert_eq!(p.sides[0].written, 0);
    p.assert_clean();
}

#[test]
fn a_failed_write_fails_the_send_and_the_receive() {
    let mut p = Pair::with(64, true);
    p.sides[0].fail_writes = true;
    p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
    p.recv(B, 10, Space::Tagged(1), tag_is(1), 1000);
    p.run();
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::PeerLost)]);
    assert_eq!(p.sides[1].recvs_done[0].1, Outcome::PeerLost);
    p.assert_clean();
}

/// A reader and a writer side by side: each sender takes the answer its
/// receiver chose.
#[test]
fn a_reading_and_a_writing_receiver_each_get_their_large_messages() {
    let mut p = Pair::new(64);
    p.sides[1].rdm = Rdm::new(0, 64, 1 << 20).with_writes(true);
    p.send(A, 1, Space::Tagged(1), None, pattern(3000, 1), false);
    p.send(B, 2, Space::Tagged(2), None, pattern(2000, 2), false);
    p.recv(B, 10, Space::Tagged(1), tag_is(1), 3000);
    p.recv(A, 11, Space::Tagged(2), tag_is(2), 2000);
    p.run();
    assert_eq!(p.sides[1].bufs[&10], pattern(3000, 1));
    assert_eq!(p.sides[0].bufs[&11], pattern(2000, 2));
    assert_eq!((p.sides[0].written, p.sides[0].read), (3000, 2000));
    assert_eq!((p.sides[1].written, p.sides[1].read), (0, 0));
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::Done)]);
    assert_eq!(p.sides[1].sends_done, [(2, Outcome::Done)]);
    p.assert_clean();
}

/// A reading receiver offered no place: a peer's Written naming one of
/// its reads changes nothing, and the read still completes the receive.
#[test]
fn a_written_notice_to_a_reading_receiver_is_ignored() {
    let mut p = Pair::new(64);
    p.send(A, 1, Space::Tagged(1), None, pattern(1000, 1), false);
    p.recv(B, 10, Space::Tagged(1), tag_is(1), 1000);
    run_but_no_transfer(&mut p);
    assert_eq!(p.sides[1].reads.len(), 1, "a read waits");
    let mut written = Vec::new();
    Msg::Written {
        common: Common {
            flags: 0,
            dst_ep: 0,
            src_ep: 0,
        },
        grant: 1,
        status: 0,
    }
    .encode(&mut written);
    p.sides[1]
        .rdm
        .handle_message(A, Source::Known(0), &written)
        .unwrap();
    assert_eq!(p.sides[1].rdm.poll_action(), None);
    assert_eq!(p.sides[1].rdm.in_flight(), (0, 1, 0));
    p.run();
    assert_eq!(p.sides[1].bufs[&10], pattern(1000, 1));
    assert_eq!(p.sides[0].sends_done, [(1, Outcome::Done)]);
    p.assert_clean();
}

#[test]
fn an_offer_that_names_no_rendezvous_of_that_peer_is_refused() {
    let cts = |msg_id, len, src_ep| {
        let mut b = Vec::new();
        Msg::Cts {
            common: Common {
                flags: 0,
                dst_ep: 0,
                src_ep,
            },
            msg_id,
            grant: 1,
            len,
            addr: 0x1000,
            key: 1,
        }
        .encode(&mut b);
        b
    };
    let mut r = Rdm::new(0, 64, 1 << 20);
    let req = |len, delivery| SendReq {
        to: peer(1),
        space: Space::Tagged(1),
        data: None,
        len,
        delivery,
    };
    r.send(1, req(8, true));
    r.send(2, req(500, false));
    while r.poll_action().is_some() {}
    r.handle_exposed(
        2,
        Some(Exposed {
            addr: 0x9000,
            key: 9,
        }),
    );
    while r.poll_action().is_some() {}
    let malformed = |r: &mut Rdm, b: &[u8]| {
        matches!(
            r.handle_message(1, Source::Unknown, b),
            Err(RdmError::Malformed(_))
        )
    };
    assert!(malformed(&mut r, &cts(1, 8, 0)), "an eager send");
    assert!(malformed(&mut r, &cts(2, 501, 0)), "more than the message");
    assert!(
        malformed(&mut r, &cts(2, 500, 1)),
        "another endpoint of the peer"
    );
    assert_eq!(r.poll_action(), None, "nothing written");
    // An offer for a send that already ended is dropped quietly.
    assert!(r.handle_message(1, Source::Unknown, &cts(77, 8, 0)).is_ok());
    assert_eq!(r.poll_action(), None);
    // The right one starts the write.
    assert!(r
        .handle_message(1, Source::Unknown, &cts(2, 500, 0))
        .is_ok());
    assert!(matches!(
        r.poll_action(),
        Some(Action::Write {
            op: 2,
            len: 500,
            ..
        })
    ));
    assert!(malformed(&mut r, &cts(2, 500, 0)), "a second offer");
}

#[test]
fn a_cancelled_receive_completes_once_and_leaves_the_message_for_another() {
    let mut p = Pair::new(64);
    p.recv(B, 10, Space::Msg, Want::ANY, 8);
    assert!(p.sides[1].rdm.cancel_recv(10));
    assert!(!p.sides[1].rdm.cancel_recv(10));
    p.send(A, 1, Space::Msg, None, pattern(8, 2), false);
    p.run();
    assert_eq!(p.sides[1].recvs_done.len(), 1);
    assert_eq!(p.sides[1].recvs_done[0].1, Outcome::Cancelled);
    assert_eq!(p.sides[1].rdm.unexpected_len(), 1);
    p.recv(B, 11, Space::Msg, Want::ANY, 8);
    p.run();
    assert_eq!(p.sides[1].recvs_done[1].0, 11);
    assert_eq!(p.sides[1].bufs[&11], pattern(8, 2));
    p.assert_clean();
}

#[test]
fn a_multi_receive_buffer_takes_several_messages_and_says_when_it_is_released() {
    for (eager_max, writes) in [(1 << 20, false), (10, false), (10, true)] {
        multi_receive(eager_max, writes);
    }
}

fn multi_receive(eager_max: usize, writes: bool) {
    let mut p = Pair::with(eager_max, writes);
    p.sides[1].bufs.insert(10, vec![0; 100]);
    p.sides[1]
        .rdm
        .post_recv(10, Space::Msg, Want::ANY, 100, Some(30))
        .unwrap();
    for (op, len) in [(1, 40), (2, 25), (3, 20)] {
        p.send(A, op, Space::Msg, None, pattern(len, op as u8), false);
    }
    p.run();
    let got: Vec<(usize, usize, bool)> = p.sides[1]
        .recvs_done
        .iter()
        .map(|(_, _, g)| (g.offset, g.len, g.released))
        .collect();
    assert_eq!(got, [(0, 40, false), (40, 25, false), (65, 20, true)]);
    let buf = &p.sides[1].bufs[&10];
    assert_eq!(buf[..40], pattern(40, 1));
    assert_eq!(buf[40..65], pattern(25, 2));
    assert_eq!(buf[65..85], pattern(20, 3));
    p.assert_clean();
}

#[test]
fn a_claimed_message_goes_to_its_claim_and_a_discarded_large_one_releases_its_sender() {
    for writes in [false, true] {
        claimed_and_discarded(writes);
    }
}

fn claimed_and_discarded(writes: bool) {
    let mut p = Pair::with(64, writes);
    p.send(A, 1, Space::Tagged(5), None, pattern(16, 5), false);
    p.send(A, 2, Space::Tagged(6), None, pattern(500, 6), false);
    p.run();
    let want5 = tag_is(5);
    assert_eq!(
        p.sides[1].rdm.peek(&want5, None).map(|(h, _)| h.len),
        Some(16)
    );
    assert_eq!(
        p.sides[1]
            .rdm
            .peek(&want5, Some(ClaimId(1)))
            .map(|(h, _)| h.len),
        Some(16)
    );
    assert_eq!(p.sides[1].rdm.peek(&want5, None), None, "claimed");
    p.sides[1].bufs.insert(10, vec![0; 16]);
    assert!(p.sides[1].rdm.take_claimed(10, ClaimId(1), 16));
    let want6 = tag_is(6);
    assert!(p.sides[1].rdm.peek(&want6, Some(ClaimId(2))).is_some());
    assert!(p.sides[1].rdm.discard_claimed(ClaimId(2)));
    p.run();
    assert_eq!(p.sides[1].bufs[&10], pattern(16, 5));
    let mut done = p.sides[0].sends_done.clone();
    done.sort();
    assert_eq!(done, [(1, Outcome::Done), (2, Outcome::Done)]);
    p.assert_clean();
}

/// MPICH passes the sender's rank as remote CQ data and reads it from
/// the completion of its MPI_Probe (FI_PEEK): a peek reports the data of
/// the message it found, eager or rendezvous, claimed or not.
#[test]
fn a_peek_reports_the_remote_cq_data_of_the_message_it_found() {
    for writes in [false, true] {
        peek_reports_data(writes);
    }
}

fn peek_reports_data(writes: bool) {
    let mut p = Pair::with(64, writes);
    p.send(A, 1, Space::Tagged(5), Some(0x2a), pattern(16, 5), false);
    p.send(A, 2, Space::Tagged(6), Some(3), pattern(500, 6), false);
    p.send(A, 3, Space::Tagged(7), None, pattern(8, 7), false);
    p.run();
    let peek = |p: &mut Pair, tag, claim| {
        p.sides[1]
            .rdm
            .peek(&tag_is(tag), claim)
            .map(|(h, d)| (h.len, d))
    };
    assert_eq!(peek(&mut p, 5, None), Some((16, Some(0x2a))), "eager");
    assert_eq!(peek(&mut p, 6, None), Some((500, Some(3))), "rendezvous");
    assert_eq!(peek(&mut p, 7, None), Some((8, None)), "no data");
    assert_eq!(
        peek(&mut p, 6, Some(ClaimId(1))),
        Some((500, Some(3))),
        "claimed"
    );
    p.sides[1].bufs.insert(10, vec![0; 500]);
    assert!(p.sides[1].rdm.take_claimed(10, ClaimId(1), 500));
    assert!(p.sides[1].rdm.peek(&tag_is(5), Some(ClaimId(2))).is_some());
    assert!(p.sides[1].rdm.discard_claimed(ClaimId(2)));
    assert!(p.sides[1].rdm.peek(&tag_is(7), Some(ClaimId(3))).is_some());
    assert!(p.sides[1].rdm.discard_claimed(ClaimId(3)));
    p.run();
    assert_eq!(p.sides[1].bufs[&10], pattern(500, 6));
    p.assert_clean();
}

#[test]
fn malformed_and_misaddressed_messages_are_refused_without_changing_state() {
    let mut r = Rdm::new(3, 64, 1 << 20);
    assert!(matches!(
        r.handle_message(0, Source::Unknown, b"junk"),
        Err(RdmError::Malformed(_))
    ));
    let mut b = Vec::new();
    Msg::Eager {
        common: Common {
            flags: 0,
            dst_ep: 4,
            src_ep: 0,
        },
        tag: 0,
        data: 0,
        ack: None,
    }
    .encode(&mut b);
    let Err(RdmError::Malformed(why)) = r.handle_message(0, Source::Unknown, &b) else {
        panic!()
    };
    assert!(why.contains("endpoint 4"), "{why}");
    assert_eq!(r.unexpected_len(), 0);
    assert_eq!(r.poll_action(), None);
}
