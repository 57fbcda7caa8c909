//! Two ranks' protocol machines wired to each other through a fake
//! memory, with no fabric: control messages go straight to the other side,
//! RDMA work is carried out on the fake memory and completes in an order
//! the test picks (in order, reversed, or shuffled from a seed). In the
//! style of quinn-proto's `Pair`: tests drive both sides and then look at
//! exactly what each delivered, finished and released, and at what is
//! left (nothing).

use std::collections::{HashMap, VecDeque};

use xrcbtl_xrc_conn::Rank;

use super::rndv::{Act, Control, Rndv, RndvConfig, RESUME};
use super::{Local, Owner, Rdma, RdmaOp};
use crate::types::{BtlError, Tag};

/// Fake registered memory: regions by key (lkey = rkey), at addresses far
/// apart.
#[derive(Default)]
pub(crate) struct FakeMem {
    regions: HashMap<u32, (u64, Vec<u8>)>,
    next: u32,
}

impl FakeMem {
    /// A region holding `bytes`.
    pub fn alloc(&mut self, bytes: Vec<u8>) -> Local {
        self.next += 1;
        let key = self.next;
        let addr = u64::from(key) << 32;
        self.regions.insert(key, (addr, bytes));
        Local {
            addr,
            lkey: key,
            rkey: key,
        }
    }

    fn range(&mut self, key: u32, addr: u64, len: u64) -> Option<&mut [u8]> {
        let (base, bytes) = self.regions.get_mut(&key)?;
        let off = addr.checked_sub(*base)? as usize;
        let end = off.checked_add(len as usize)?;
        bytes.get_mut(off..end)
    }

    /// The bytes of region `key` at `addr`.
    pub fn read(&mut self, key: u32, addr: u64, len: u64) -> Option<Vec<u8>> {
        self.range(key, addr, len).map(|r| r.to_vec())
    }

    /// Carries out `r` issued from the side that owns `r.local`; false when
    /// a key or range is refused.
    pub fn execute(&mut self, r: &Rdma) -> bool {
        let len = u64::from(r.local.length);
        let (from, to) = match r.op {
            RdmaOp::Read => ((r.remote.rkey, r.remote.addr), (r.local.lkey, r.local.addr)),
            RdmaOp::Write => ((r.local.lkey, r.local.addr), (r.remote.rkey, r.remote.addr)),
            RdmaOp::FetchAdd(_) | RdmaOp::CompareSwap { .. } => {
                let Some(w) = self.read(r.remote.rkey, r.remote.addr, 8) else {
                    return false;
                };
                let old = u64::from_le_bytes(w.try_into().expect("8"));
                let new = match r.op {
                    RdmaOp::FetchAdd(a) => Some(old.wrapping_add(a)),
                    RdmaOp::CompareSwap { compare, swap } => (old == compare).then_some(swap),
                    _ => None,
                };
                if let Some(n) = new {
                    self.range(r.remote.rkey, r.remote.addr, 8)
                        .expect("read above")
                        .copy_from_slice(&n.to_le_bytes());
                }
                return match self.range(r.local.lkey, r.local.addr, 8) {
                    Some(dst) => {
                        dst.copy_from_slice(&old.to_le_bytes());
                        true
                    }
                    None => false,
                };
            }
        };
        let Some(data) = self.read(from.0, from.1, len) else {
            return false;
        };
        match self.range(to.0, to.1, len) {
            Some(dst) => {
                dst.copy_from_slice(&data);
                true
            }
            None => false,
        }
    }
}

/// In which order RDMA work completes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Order {
    /// As posted.
    Fifo,
    /// Newest first.
    Lifo,
    /// Shuffled from a seed.
    Shuffled(u64),
}

/// What one side saw.
#[derive(Default)]
pub(crate) struct Seen {
    /// Rendezvous delivered: (sender, tag, bytes).
    pub delivered: Vec<(Rank, Tag, Vec<u8>)>,
    /// Sends finished: (op, source key, outcome).
    pub finished: Vec<(u64, u32, Result<(), BtlError>)>,
    /// Sinks given up.
    pub released: Vec<u32>,
}

/// Two ranks' rendezvous machines on one fake memory.
pub(crate) struct Pair {
    /// The machines; rank `RANKS[i]` is side `i`.
    pub rndv: [Rndv<u32, u32>; 2],
    /// What each side saw.
    pub seen: [Seen; 2],
    /// The memory both sides' registrations live in.
    pub mem: FakeMem,
    msgs: VecDeque<(usize, Rank, Tag, Control)>,
    flight: Vec<(usize, Rdma, bool)>,
    /// Most fragments of one rendezvous in flight at once.
    pub max_flight: usize,
    /// Work that failed, by side.
    pub refused: usize,
    /// Fragments completed.
    pub frags: usize,
    rng: u64,
    /// Each side's connection, by number: a lost write breaks it.
    conn: [u32; 2],
    /// Writes still to lose with their connection (they never land).
    pub lose: u32,
}

/// The ranks of the two sides.
pub(crate) const RANKS: [Rank; 2] = [10, 20];

fn side_of(r: Rank) -> usize {
    RANKS
        .iter()
        .position(|&x| x == r)
        .expect("a rank of the pair")
}

impl Pair {
    /// Both sides configured alike.
    pub fn new(cfg: RndvConfig) -> Pair {
        Pair {
            rndv: [Rndv::new(cfg), Rndv::new(cfg)],
            seen: Default::default(),
            mem: FakeMem::default(),
            msgs: VecDeque::new(),
            flight: Vec::new(),
            max_flight: 0,
            refused: 0,
            frags: 0,
            rng: 1,
            conn: [1, 1],
            lose: 0,
        }
    }

    /// Side `from` starts sending `data` to the other side.
    pub fn send(&mut self, from: usize, tag: Tag, data: Vec<u8>, op: u64) {
        let len = data.len() as u64;
        let src = self.mem.alloc(data);
        self.rndv[from].send(RANKS[1 - from], tag, len, src, op, src.lkey);
    }

    /// Takes every side's pending acts.
    fn collect(&mut self) {
        for (s, rank) in RANKS.into_iter().enumerate() {
            while let Some(a) = self.rndv[s].poll() {
                match a {
                    Act::Send { peer, tag, ctl } => {
                        // Posted: a FIN decides then whether it resumes.
                        let ctl = match ctl {
                            Control::Fin(m) => Control::Fin(
                                self.rndv[s]
                                    .fin_posted(m.to_le_bytes(), self.conn[s])
                                    .map_or(m, u64::from_le_bytes),
                            ),
                            c => c,
                        };
                        self.msgs.push_back((side_of(peer), rank, tag, ctl))
                    }
                    Act::Rdma { rdma, .. } if self.lose > 0 && rdma.op == RdmaOp::Write => {
                        // Left, then lost with its connection.
                        self.lose -= 1;
                        self.conn[s] += 1;
                        if let Owner::RndvOut { msg } = rdma.owner {
                            self.rndv[s].write_lost(msg);
                        }
                    }
                    Act::Rdma { rdma, .. } => {
                        if let (RdmaOp::Write, Owner::RndvOut { msg }) = (rdma.op, rdma.owner) {
                            self.rndv[s].write_posted(msg, self.conn[s]);
                        }
                        // The data moves now, in order with the messages
                        // on the same connection; the completion comes
                        // later, in the order the test picks.
                        let ok = self.mem.execute(&rdma);
                        self.flight.push((s, rdma, ok));
                        let owner = rdma.owner;
                        let n = self
                            .flight
                            .iter()
                            .filter(|(side, r, _)| *side == s && r.owner == owner)
                            .count();
                        self.max_flight = self.max_flight.max(n);
                    }
                    Act::Deliver {
                        peer,
                        tag,
                        len,
                        sink,
                    } => {
                        let base = u64::from(sink) << 32;
                        let data = self.mem.read(sink, base, len).expect("the sink holds it");
                        self.seen[s].delivered.push((peer, tag, data));
                    }
                    Act::Finished { op, src, result } => {
                        self.seen[s].finished.push((op, src, result))
                    }
                    Act::Release { sink } => self.seen[s].released.push(sink),
                }
            }
        }
    }

    fn pick(&mut self, order: Order) -> usize {
        match order {
            Order::Fifo => 0,
            Order::Lifo => self.flight.len() - 1,
            Order::Shuffled(seed) => {
                if self.rng == 1 {
                    self.rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                }
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                (self.rng % self.flight.len() as u64) as usize
            }
        }
    }

    /// Carries one message or one RDMA completion; false when nothing is
    /// left to do.
    pub fn step(&mut self, order: Order) -> bool {
        self.collect();
        if let Some((to, from, tag, ctl)) = self.msgs.pop_front() {
            let r = &mut self.rndv[to];
            match ctl {
                Control::Rts(rts) => {
                    let sink = self.mem.alloc(vec![0; rts.len as usize]);
                    if let Err(k) = r.on_rts(from, tag, rts, sink, sink.lkey) {
                        self.seen[to].released.push(k);
                    }
                }
                Control::Rtr(rtr) => {
                    r.on_rtr(from, rtr);
                }
                Control::Ats(m) => {
                    r.on_ats(from, m);
                }
                Control::Fin(m) => {
                    r.on_fin(from, m);
                }
                Control::Nak(m) => {
                    r.on_nak(from, m);
                }
            }
            return true;
        }
        if self.flight.is_empty() {
            return false;
        }
        let i = self.pick(order);
        let (s, rdma, ok) = self.flight.remove(i);
        self.frags += 1;
        if ok {
            self.rndv[s].on_rdma_done(rdma.owner, rdma.len());
        } else {
            self.refused += 1;
            self.rndv[s].on_rdma_failed(
                rdma.owner,
                BtlError::Transfer(xrcbtl_fabric::WcStatus::RemoteAccess),
            );
        }
        true
    }

    /// Steps until nothing is left.
    pub fn drive(&mut self, order: Order) {
        let mut n = 0;
        while self.step(order) {
            n += 1;
            assert!(n < 1_000_000, "the pair never settled");
        }
        self.collect();
    }

    /// Whether both machines are idle and nothing is on the wire.
    pub fn is_idle(&self) -> bool {
        self.msgs.is_empty() && self.flight.is_empty() && self.rndv.iter().all(|r| r.is_idle())
    }

    /// Owners of the fragments in flight.
    pub fn in_flight(&self) -> Vec<Owner> {
        self.flight.iter().map(|(_, r, _)| r.owner).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Rtr;

    fn pattern(seed: u32, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    fn cfg(put: bool) -> RndvConfig {
        RndvConfig {
            put,
            frag: 1000,
            pipeline: 3,
        }
    }

    #[test]
    fn get_and_put_move_every_size_intact_whatever_the_completion_order() {
        for put in [false, true] {
            for order in [
                Order::Fifo,
                Order::Lifo,
                Order::Shuffled(7),
                Order::Shuffled(99),
            ] {
                let mut p = Pair::new(cfg(put));
                let sizes = [1usize, 999, 1000, 1001, 2999, 3000, 3001, 10_003];
                for (i, &len) in sizes.iter().enumerate() {
                    p.send(i % 2, i as Tag, pattern(i as u32, len), 100 + i as u64);
                }
                p.drive(order);
                assert!(p.is_idle(), "{put} {order:?}");
                assert!(p.max_flight <= 3, "pipeline exceeded: {}", p.max_flight);
                assert!(p.max_flight == 3, "the pipeline was never full");
                let frags: usize = sizes.iter().map(|l| l.div_ceil(1000)).sum();
                assert_eq!(p.frags, frags);
                for (i, &len) in sizes.iter().enumerate() {
                    let (s, r) = (i % 2, 1 - i % 2);
                    let got = p.seen[r]
                        .delivered
                        .iter()
                        .find(|d| d.1 == i as Tag)
                        .unwrap_or_else(|| panic!("size {len} not delivered"));
                    assert_eq!(got.0, RANKS[s]);
                    assert!(got.2 == pattern(i as u32, len), "size {len} corrupted");
                    assert!(p.seen[s]
                        .finished
                        .iter()
                        .any(|f| f.0 == 100 + i as u64 && f.2.is_ok()));
                }
                for s in &p.seen {
                    assert!(s.released.is_empty());
                }
            }
        }
    }

    /// A put whose writes are lost with their connection (as on iWARP,
    /// after they completed) is never delivered short: its FIN asks for
    /// the RTR again, everything is written anew, and the receiver
    /// delivers once, intact; the sender finishes on the ATS.
    #[test]
    fn a_put_whose_writes_were_lost_starts_over_and_delivers_once() {
        for (lose, order) in [(1, Order::Fifo), (2, Order::Lifo), (5, Order::Shuffled(3))] {
            let mut p = Pair::new(cfg(true));
            p.lose = lose;
            p.send(0, 4, pattern(9, 10_003), 77);
            p.drive(order);
            assert!(p.is_idle(), "{lose}");
            assert_eq!(p.seen[1].delivered.len(), 1, "{lose}");
            assert!(
                p.seen[1].delivered[0].2 == pattern(9, 10_003),
                "{lose}: corrupted"
            );
            assert_eq!(p.seen[0].finished.len(), 1);
            assert!(p.seen[0].finished[0].2.is_ok());
            assert!(p.frags > 11, "{lose}: nothing was written again");
        }
    }

    /// The FIN of a put whose receiver delivered already and answered ATS
    /// may be sent again after its connection broke (it was kept): it asks
    /// for the RTR again, the receiver's transport drops it as a
    /// duplicate, and the ATS completes the sender all the same.
    /// A FIN already marked to resume (posted again after a break) goes
    /// as it is, and decides nothing.
    #[test]
    fn a_fin_already_marked_goes_as_it_is() {
        let mut p = Pair::new(cfg(true));
        p.send(0, 4, pattern(3, 2500), 5);
        p.step(Order::Fifo); // RTS
        p.step(Order::Fifo); // RTR
        p.collect(); // the writes, posted on connection 1
        assert_eq!(p.rndv[0].fin_posted((1 | RESUME).to_le_bytes(), 2), None);
        // The rendezvous is still to be resumed by its unmarked FIN.
        assert_eq!(
            p.rndv[0].fin_posted(1u64.to_le_bytes(), 2),
            Some((1 | RESUME).to_le_bytes())
        );
    }

    #[test]
    fn a_resumed_fin_that_was_a_duplicate_still_completes_on_ats() {
        let mut p = Pair::new(cfg(true));
        p.send(0, 4, pattern(3, 2500), 5);
        p.drive(Order::Fifo);
        assert_eq!(p.seen[1].delivered.len(), 1);
        assert_eq!(p.seen[0].finished.len(), 1);
        // Unknown by now on both sides: nothing happens.
        assert_eq!(p.rndv[0].fin_posted(1u64.to_le_bytes(), 9), None);
        assert!(!p.rndv[1].on_fin(RANKS[0], 1 | RESUME));
        // Before the ATS, a FIN posted on another connection than the
        // writes resumes, once.
        let mut p = Pair::new(cfg(true));
        p.send(0, 4, pattern(3, 2500), 5);
        p.step(Order::Fifo); // RTS
        p.step(Order::Fifo); // RTR
        p.collect(); // the writes, posted on connection 1
        assert_eq!(
            p.rndv[0].fin_posted(1u64.to_le_bytes(), 2),
            Some((1 | RESUME).to_le_bytes())
        );
        assert_eq!(p.rndv[0].fin_posted(1u64.to_le_bytes(), 2), None);
        // The ATS of the first delivery completes it.
        assert!(p.rndv[0].on_ats(RANKS[1], 1));
        assert_eq!(p.seen[0].finished.len(), 0);
        p.collect();
        assert_eq!(p.seen[0].finished.len(), 1);
    }

    /// A refused request fails the sender's operation; a refusal from
    /// anyone else, or for another message, changes nothing.
    #[test]
    fn a_refused_rendezvous_fails_its_sender() {
        let mut p = Pair::new(cfg(true));
        p.send(0, 4, pattern(1, 3000), 8);
        assert!(!p.rndv[0].on_nak(99, 1));
        assert!(!p.rndv[0].on_nak(RANKS[1], 2));
        p.rndv[1].refuse(RANKS[0], 1);
        p.collect();
        p.step(Order::Fifo); // the RTS
        p.step(Order::Fifo); // the refusal
        p.collect();
        assert_eq!(p.seen[0].finished.len(), 1);
        assert!(matches!(
            p.seen[0].finished[0],
            (
                8,
                _,
                Err(BtlError::Transfer(
                    xrcbtl_fabric::WcStatus::RemoteInvalidRequest
                ))
            )
        ));
    }

    #[test]
    fn replies_from_another_peer_or_for_another_message_are_ignored() {
        let mut p = Pair::new(cfg(true));
        p.send(0, 1, pattern(1, 5000), 7);
        // Let the RTS and the RTR through, nothing else.
        p.step(Order::Fifo);
        let rtr_to_0 = Rtr {
            msg: 1,
            addr: 0,
            rkey: 0,
        };
        assert!(!p.rndv[0].on_rtr(99, rtr_to_0), "RTR from a stranger");
        assert!(
            !p.rndv[0].on_rtr(RANKS[1], Rtr { msg: 2, ..rtr_to_0 }),
            "unknown message"
        );
        assert!(!p.rndv[0].on_ats(99, 1), "ATS from a stranger");
        assert!(!p.rndv[1].on_fin(99, 1), "FIN from a stranger");
        p.drive(Order::Fifo);
        assert_eq!(p.seen[1].delivered.len(), 1);
        assert!(p.seen[1].delivered[0].2 == pattern(1, 5000));
        // A second RTR for a rendezvous already under way changes nothing.
        assert!(!p.rndv[0].on_rtr(RANKS[1], rtr_to_0));
    }

    #[test]
    fn a_repeated_or_empty_request_is_refused_and_its_sink_given_back() {
        let mut p = Pair::new(cfg(false));
        let sink = p.mem.alloc(vec![0; 10]);
        let rts = crate::wire::Rts {
            msg: 5,
            len: 10,
            addr: 0,
            rkey: 0,
            put: false,
        };
        assert!(p.rndv[1].on_rts(RANKS[0], 0, rts, sink, 1).is_ok());
        assert_eq!(
            p.rndv[1].on_rts(RANKS[0], 0, rts, sink, 2),
            Err(2),
            "same id twice"
        );
        assert_eq!(
            p.rndv[1].on_rts(
                RANKS[0],
                0,
                crate::wire::Rts {
                    msg: 6,
                    len: 0,
                    ..rts
                },
                sink,
                3
            ),
            Err(3)
        );
        // The other peer may use the same id.
        assert!(p.rndv[1].on_rts(77, 0, rts, sink, 4).is_ok());
    }

    #[test]
    fn a_peer_failing_mid_rendezvous_ends_every_one_and_frees_everything() {
        for put in [false, true] {
            let mut p = Pair::new(RndvConfig {
                put,
                frag: 100,
                pipeline: 2,
            });
            p.send(0, 1, pattern(1, 1000), 1);
            p.send(1, 2, pattern(2, 1000), 2);
            for _ in 0..6 {
                p.step(Order::Fifo);
            }
            assert!(!p.in_flight().is_empty() || !p.is_idle());
            let e = BtlError::Closed(RANKS[1]);
            p.rndv[0].fail_peer(RANKS[1], &e);
            p.collect();
            // Side 0's send failed, its receive released.
            assert_eq!(p.seen[0].finished.len(), 1, "{put}");
            assert_eq!(p.seen[0].finished[0].2, Err(e));
            assert_eq!(p.seen[0].released.len(), 1, "{put}");
            assert!(p.rndv[0].is_idle());
        }
    }

    #[test]
    fn a_refused_fragment_ends_the_rendezvous() {
        // get: the receiver's read is refused (the source is gone).
        let mut p = Pair::new(cfg(false));
        p.send(0, 1, pattern(1, 5000), 1);
        p.step(Order::Fifo);
        p.mem.regions.clear();
        p.drive(Order::Fifo);
        assert!(p.refused > 0);
        assert_eq!(p.seen[1].released.len(), 1);
        assert!(p.seen[1].delivered.is_empty());
        // The sender hears of it: its operation fails, and nothing of the
        // rendezvous is left on either side.
        assert!(
            matches!(p.seen[0].finished[..], [(1, _, Err(_))]),
            "{:?}",
            p.seen[0].finished
        );
        assert!(p.rndv[0].is_idle() && p.rndv[1].is_idle());
        // put: the sender's write is refused.
        let mut p = Pair::new(cfg(true));
        p.send(0, 1, pattern(1, 5000), 1);
        p.step(Order::Fifo);
        p.step(Order::Fifo);
        p.mem.regions.retain(|k, _| *k == 1);
        p.drive(Order::Fifo);
        assert!(matches!(p.seen[0].finished[..], [(1, _, Err(_))]));
    }

    #[test]
    fn one_sided_and_atomic_work_runs_on_the_fake_memory() {
        use crate::proto::atomic::{atomic, Atomic};
        use crate::proto::rma::transfer;
        use crate::types::{MemReg, RemoteMem};
        let mut mem = FakeMem::default();
        let a = mem.alloc(pattern(3, 64));
        let b = mem.alloc(vec![0; 64]);
        let reg = MemReg {
            id: 1,
            addr: a.addr,
            len: 64,
            lkey: a.lkey,
            rkey: a.rkey,
        };
        let peer = RemoteMem {
            addr: b.addr,
            len: 64,
            rkey: b.rkey,
        };
        let put = transfer(1, true, reg.at(0), peer.at(8), 32).unwrap();
        assert!(mem.execute(&put));
        assert_eq!(
            mem.read(b.lkey, b.addr + 8, 32).unwrap(),
            pattern(3, 64)[..32]
        );
        let slot = mem.alloc(vec![0; 8]);
        let fa = atomic(2, Atomic::FetchAdd(5), peer.at(48), slot, 0).unwrap();
        assert!(mem.execute(&fa));
        assert!(mem.execute(&fa));
        assert_eq!(
            mem.read(slot.lkey, slot.addr, 8).unwrap(),
            5u64.to_le_bytes()
        );
        assert_eq!(
            mem.read(b.lkey, b.addr + 48, 8).unwrap(),
            10u64.to_le_bytes()
        );
        let cas = atomic(
            3,
            Atomic::CompareSwap {
                compare: 10,
                swap: 1,
            },
            peer.at(48),
            slot,
            0,
        )
        .unwrap();
        assert!(mem.execute(&cas));
        assert_eq!(
            mem.read(b.lkey, b.addr + 48, 8).unwrap(),
            1u64.to_le_bytes()
        );
        let bad = RemoteMem { rkey: 99, ..peer };
        assert!(!mem.execute(&transfer(4, false, reg.at(0), bad.at(0), 8).unwrap()));
    }
}
