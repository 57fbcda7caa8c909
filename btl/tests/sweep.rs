//! The sweeper: seed after seed, a random cluster (2 to 4 nodes, 1 to 3
//! ranks each; XRC, RC + SRQ or iWARP; random eager, split and rendezvous
//! settings, sometimes a tiny SRQ) runs random traffic (eager, split and
//! rendezvous messages, one-sided puts, atomics where the device has them)
//! under a random mix of faults: crashes, clean exits, partitions that
//! heal, lost, late and doubled CM messages, forced TGT QP errors (XRC)
//! or connection QP errors (RC, iWARP), a receiver too busy to repost,
//! user memory unmapped and mapped again (or emptied) under a
//! registration its rank holds. After every step the checkers run:
//!
//! - at most one INI QP per (process, node), or one QP per peer with RC;
//! - a TGT QP is held only by live processes, and nothing a dead process
//!   held survives it;
//! - every eager message (split ones included) arrives at most once and in
//!   order per (source, destination); once both sides are quiet and
//!   neither was told the other failed, every one has arrived;
//! - every rendezvous message arrives intact, at most once;
//! - a put's bytes land intact;
//! - no registration is used after its memory went: the simulated device
//!   saw no local work through a region whose pages were replaced; the
//!   held registration is refused once its pages are replaced; puts and
//!   gets on user memory move its present contents; a peer's write through
//!   a handle made before the pages were replaced never reaches the new
//!   ones;
//! - no atomic is executed twice: adds left in flight as faults strike
//!   (some with their two nodes cut for longer than a QP takes to give
//!   up) each add a bit of their own, and the word must hold those that
//!   succeeded, and none but those of unknown outcome.
//!
//! At the end the faults heal, and every pair of live ranks that did not
//! declare each other failed must still talk both ways.
//!
//! `SWEEP_SEEDS` seeds from `SWEEP_FROM` (default: 40 from 1; the test
//! suite runs 300 in release, `scripts/sweep`). A failing seed prints
//! itself and the command that replays it alone, then shrinks: it is run
//! again with fewer and fewer of its first steps, and the shortest prefix
//! that still fails is printed with its own replay command
//! (`SWEEP_STEPS=K`). `SWEEP_ALL=1` runs every seed and lists the failing
//! ones. `SWEEP_VERBOSE=1` prints the steps as they happen, `SWEEP_DUMP=1`
//! every rank's state (and what keeps a busy one busy) after each. Seeds in [`KNOWN_OPEN`] are skipped, and said so.

mod btlsim;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use btlsim::{pattern, Cluster, TAG};
use xrcbtl_btl::{
    Access, BtlConfig, Bytes, EagerLimit, MappedBuf, MemReg, OpId, OpStatus, RemoteMem,
    RndvProtocol, SplitLimit,
};
use xrcbtl_fabric::sim::{CmAction, CmFault, SimDevice, SimProcess};
use xrcbtl_fabric::Error;

const LIMIT: Duration = Duration::from_secs(60);

/// A small deterministic generator (xorshift), one per seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Payload of message `i` from `src` of `len` bytes: kind, index, source,
/// then a pattern they determine.
fn payload(kind: u8, src: u32, i: u32, len: usize) -> Vec<u8> {
    let mut v = pattern(i.wrapping_mul(31) ^ src, len.max(9));
    v[0] = kind;
    v[1..5].copy_from_slice(&i.to_le_bytes());
    v[5..9].copy_from_slice(&src.to_le_bytes());
    v
}

const EAGER: u8 = 1;
const RNDV: u8 = 2;

/// Messages by (source, destination): kind, index, length.
type Streams = BTreeMap<(u32, u32), Vec<(u8, u32, usize)>>;

/// An add's (sender, target), its bit, and whether it succeeded once
/// known.
type AddOutcome = ((u32, u32), u32, Option<bool>);

/// A rank's user memory: a mapping it registered through the cache and
/// holds registered across steps, so that a fault can replace its pages
/// under the registration ([`Run::replace_user_pages`]).
struct UserBuf {
    buf: MappedBuf,
    /// The registration the rank holds.
    held: MemReg,
    /// Times its pages were replaced.
    gen: u32,
    /// The `gen` in which `held` was made.
    held_gen: u32,
    /// The handle its peers last heard of, and the `gen` it was made in.
    told: (RemoteMem, u32),
    /// Operations on it that had not finished when last waited for: the
    /// rank that started each, and its id.
    pending: Vec<(u32, OpId)>,
}

/// One seed's world and what the checkers know.
struct Run {
    c: Cluster,
    rng: Rng,
    /// Steps of the schedule (before the liveness phase).
    steps: u64,
    dead: Vec<SimProcess>,
    /// Messages sent, by (source, destination): kind, index, length.
    sent: Streams,
    next: BTreeMap<(u32, u32), u32>,
    /// (reporter, failed peer) pairs the error callbacks told of.
    failed: Arc<Mutex<BTreeSet<(u32, u32)>>>,
    atomics: bool,
    /// Largest payload sent split into eager parts.
    split: usize,
    /// Memory of one-sided operations, kept for the run: an operation that
    /// did not finish in time may still reach it.
    keep: Vec<xrcbtl_btl::RegMem<xrcbtl_fabric::sim::SimContext>>,
    /// Atomic adds left in flight while the faults go on, by (sender,
    /// target): the target's word, and the next bit to add.
    adds: BTreeMap<(u32, u32), (xrcbtl_btl::RegMem<xrcbtl_fabric::sim::SimContext>, u32)>,
    /// Each add's (sender, target), bit and outcome once known (success
    /// or not).
    add_outcomes: Arc<Mutex<Vec<AddOutcome>>>,
    /// Draws for the adds, apart from `rng`, so that the rest of a seed's
    /// schedule stays what it was.
    add_rng: Rng,
    /// User memory by rank.
    users: BTreeMap<u32, UserBuf>,
    /// Draws for user memory, apart from the others for the same reason.
    mem_rng: Rng,
    log: Vec<String>,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (device, force_rc) = match rng.below(3) {
            0 => (SimDevice::ib("sim0"), false),
            1 => (SimDevice::roce("sim0"), true),
            _ => (SimDevice::iwarp("sim0"), false),
        };
        let atomics = device.caps.atomics;
        let nodes = 2 + rng.below(3) as usize;
        let per_node = 1 + rng.below(3) as usize;
        let split = [0, 16 * 1024, 64 * 1024][rng.below(3) as usize];
        let put = rng.chance(50);
        let tiny_srq = rng.chance(25);
        let log = vec![format!(
            "{:?} {nodes} nodes x {per_node} ranks, split {split}, {}, tiny srq {tiny_srq}",
            device.caps.transport,
            if put { "put" } else { "get" }
        )];
        let c = Cluster::with(seed, nodes, per_node, device, move |cfg: &mut BtlConfig| {
            cfg.force_rc = force_rc;
            cfg.split_limit = SplitLimit::Bytes(split);
            // The eager limit every seed was drawn with (auto is 64 KiB
            // with RC + SRQ, past every split limit drawn here).
            cfg.eager_limit = EagerLimit::Bytes(8192);
            cfg.rndv_protocol = if put {
                RndvProtocol::Put
            } else {
                RndvProtocol::Get
            };
            if tiny_srq {
                cfg.srq_depth = 8;
                cfg.srq_max_depth = 64;
                cfg.srq_refill = 2;
            }
        });
        if std::env::var_os("SWEEP_VERBOSE").is_some() {
            eprintln!("sweep: seed {seed}: {}", log[0]);
        }
        let failed: Arc<Mutex<BTreeSet<(u32, u32)>>> = Arc::default();
        // The schedule's length, drawn first of the steps' draws.
        let steps = 4 + rng.below(8);
        let mut run = Run {
            c,
            rng,
            steps,
            dead: Vec::new(),
            sent: BTreeMap::new(),
            next: BTreeMap::new(),
            failed: failed.clone(),
            atomics,
            split,
            keep: Vec::new(),
            adds: BTreeMap::new(),
            add_outcomes: Arc::default(),
            add_rng: Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1),
            users: BTreeMap::new(),
            mem_rng: Rng(seed.wrapping_mul(0xA076_1D64_78BD_642F) | 1),
            log,
        };
        for r in run.c.live() {
            let f = failed.clone();
            run.c.btl(r).register_error(move |_, peer, _| {
                f.lock().unwrap().insert((r, peer));
            });
        }
        run
    }

    /// Notes a step (printed as it happens with `SWEEP_VERBOSE=1`).
    fn note(&mut self, what: String) {
        if std::env::var_os("SWEEP_VERBOSE").is_some() {
            eprintln!("sweep: t={:?} {what}", self.c.now());
        }
        self.log.push(what);
    }

    fn told(&self, a: u32, b: u32) -> bool {
        let f = self.failed.lock().unwrap();
        f.contains(&(a, b)) || f.contains(&(b, a))
    }

    /// Sends a batch between random live pairs.
    fn traffic(&mut self) {
        let live = self.c.live();
        let n = 1 + self.rng.below(12);
        for _ in 0..n {
            let a = live[self.rng.below(live.len() as u64) as usize];
            let b = live[self.rng.below(live.len() as u64) as usize];
            if a == b || self.told(a, b) {
                continue;
            }
            let (kind, len) = match self.rng.below(10) {
                0..=5 => (EAGER, 9 + self.rng.below(2000) as usize),
                6..=7 => (EAGER, 9_000 + self.rng.below(60_000) as usize),
                _ => (RNDV, 70_000 + self.rng.below(300_000) as usize),
            };
            let i = *self.next.entry((a, b)).or_insert(0);
            let data = payload(kind, a, i, len);
            // How it goes decides whether it keeps eager order: eagerly
            // (split into parts too) or by rendezvous.
            let eager = len <= self.c.btl(a).max_send_size().max(self.split);
            let kind = if eager { EAGER } else { RNDV };
            let r = self.c.btl(a).send_bytes(b, TAG, Bytes::from(data), None);
            if r.is_ok() {
                *self.next.get_mut(&(a, b)).unwrap() += 1;
                self.sent.entry((a, b)).or_default().push((kind, i, len));
            }
        }
        let _ = self.fire_add();
        self.user_memory();
        // Now and then a put and an atomic, checked at once.
        if live.len() >= 2 && self.rng.chance(30) {
            let a = live[0];
            let b = live[1 + self.rng.below(live.len() as u64 - 1) as usize];
            if !self.told(a, b) {
                self.one_sided(a, b);
            }
        }
    }

    /// Now and then an atomic add, not waited for: the faults that follow
    /// may break its connection before its answer comes. Each add of a
    /// pair adds its own bit to the target's word, so that the word shows
    /// which were executed ([`Run::check_adds`]).
    fn fire_add(&mut self) -> Option<(u32, u32)> {
        let live = self.c.live();
        if !self.atomics || live.len() < 2 || !self.add_rng.chance(40) {
            return None;
        }
        let a = live[self.add_rng.below(live.len() as u64) as usize];
        let b = live[self.add_rng.below(live.len() as u64) as usize];
        if a == b || self.told(a, b) {
            return None;
        }
        if !self.adds.contains_key(&(a, b)) {
            let word = self.c.btl(b).alloc_mem(8).expect("memory");
            self.adds.insert((a, b), (word, 0));
        }
        let (word, next) = self.adds.get_mut(&(a, b)).expect("made");
        if *next >= 62 {
            return None;
        }
        let bit = *next;
        *next += 1;
        let remote = word.remote();
        let i = {
            let mut o = self.add_outcomes.lock().unwrap();
            o.push(((a, b), bit, None));
            o.len() - 1
        };
        let outcomes = self.add_outcomes.clone();
        let done = Box::new(move |_: &xrcbtl_btl::Btl<_>, _, r: xrcbtl_btl::OpResult| {
            outcomes.lock().unwrap()[i].2 = Some(r.is_ok());
        });
        if self
            .c
            .btl(a)
            .add(b, remote.at(0), 1 << bit, Some(done))
            .is_err()
        {
            self.add_outcomes.lock().unwrap()[i].2 = Some(false);
        }
        Some((a, b))
    }

    /// Every add that succeeded was executed once, and none was executed
    /// twice: the target's word holds the bits of the successful adds,
    /// perhaps some of those that failed or never finished (their outcome
    /// is unknown), and nothing else (an add done twice carries into the
    /// next bit, or past the last one).
    fn check_adds(&mut self) {
        let live = self.c.live();
        let outcomes = self.add_outcomes.lock().unwrap().clone();
        for ((a, b), (word, _)) in &self.adds {
            if !live.contains(b) {
                continue;
            }
            let mine = outcomes.iter().filter(|o| o.0 == (*a, *b));
            let (mut done, mut maybe) = (0u64, 0u64);
            for &(_, bit, ok) in mine {
                if ok == Some(true) {
                    done |= 1 << bit;
                } else {
                    maybe |= 1 << bit;
                }
            }
            let value = u64::from_le_bytes(word.read(0, 8).try_into().unwrap());
            assert!(
                value & done == done && value & !(done | maybe) == 0,
                "atomic adds {a}->{b}: the word is {value:#x}, the successful adds \
                 {done:#x}, those of unknown outcome {maybe:#x}"
            );
        }
    }

    /// A put of a random length into memory rank `b` exposes, checked when
    /// it completes (if neither side failed meanwhile); an atomic add where
    /// the device has atomics.
    fn one_sided(&mut self, a: u32, b: u32) {
        let len = 1 + self.rng.below(100_000) as usize;
        let target = self.c.btl(b).alloc_mem(len).expect("memory");
        let remote = target.remote();
        let src = self.c.btl(a).alloc_mem(len).expect("memory");
        let data = pattern(len as u32, len);
        src.write(0, &data);
        let Ok(op) = self
            .c
            .btl(a)
            .put(b, src.reg().at(0), remote.at(0), len, None)
        else {
            return;
        };
        let btl = self.c.btl(a);
        let landed = self.settle(a, b, op);
        self.keep.push(src);
        if landed == Some(true) {
            let got = target.read(0, len);
            let first = got.iter().zip(&data).position(|(x, y)| x != y);
            assert!(
                first.is_none(),
                "put {a}->{b} of {len} bytes corrupted from byte {first:?}: {:?}",
                self.c.btl(a).stats()
            );
        }
        if self.atomics && len >= 8 && !self.told(a, b) {
            let before = u64::from_le_bytes(target.read(0, 8).try_into().unwrap());
            if let Ok(op) = btl.add(b, remote.at(0), 5, None) {
                let _ = self.run_until(|_| btl.test(op) != OpStatus::Pending);
                if btl.test(op) == OpStatus::Done {
                    let after = u64::from_le_bytes(target.read(0, 8).try_into().unwrap());
                    assert_eq!(after, before.wrapping_add(5), "atomic add {a}->{b}");
                }
            }
        }
        self.keep.push(target);
    }

    /// Waits for `a`'s operation `op` towards `b` and for its data to land:
    /// completion where it was posted is not landing (iWARP completes a
    /// write when it leaves), but a message after it on the same
    /// connection arrives after its data. `None` if it is still pending,
    /// or the message did not arrive in time; `Some(true)` if it succeeded
    /// and has landed, with neither side told the other failed.
    fn settle(&mut self, a: u32, b: u32, op: OpId) -> Option<bool> {
        let btl = self.c.btl(a);
        if !self.run_until(|_| btl.test(op) != OpStatus::Pending) {
            return None;
        }
        let marks = |c: &Cluster| c.got(b).iter().filter(|g| g.tag == TAG + 1).count();
        let before = marks(&self.c);
        if btl.send(b, TAG + 1, &[], b"after the operation").is_err()
            || !self.run_until(|c| marks(c) > before)
        {
            return None;
        }
        Some(btl.test(op) == OpStatus::Done && !self.told(a, b))
    }

    /// Now and then, user memory of a random rank `a` with a random peer
    /// `b` (drawn from `mem_rng`): `a` puts from its held registration
    /// (made again first if its pages were replaced: the old one must be
    /// refused), `b` writes into it through the handle it last heard of,
    /// and `a` reads into it. Each is checked against the buffer's present
    /// contents.
    fn user_memory(&mut self) {
        let live = self.c.live();
        if live.len() < 2 || !self.mem_rng.chance(25) {
            return;
        }
        let a = live[self.mem_rng.below(live.len() as u64) as usize];
        let b = live[self.mem_rng.below(live.len() as u64) as usize];
        if a == b || self.told(a, b) || self.user_busy(a) {
            return;
        }
        let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
        if !self.users.contains_key(&a) {
            let pages = 1 + self.mem_rng.below(24) as usize;
            let buf = MappedBuf::new(pages * 4096).expect("mapping");
            buf.write(0, &pattern(a ^ 0x5000, buf.len()));
            let held = self
                .c
                .btl(a)
                .register_mem(buf.user_mem(), access)
                .expect("registration");
            let u = UserBuf {
                buf,
                held,
                gen: 0,
                held_gen: 0,
                told: (held.remote(), 0),
                pending: Vec::new(),
            };
            self.users.insert(a, u);
        }
        let len = self.users[&a].buf.len();
        let n = 1 + self.mem_rng.below(len as u64) as usize;
        let off = self.mem_rng.below((len - n + 1) as u64) as usize;
        let target = self.c.btl(b).alloc_mem(n).expect("memory");
        let btl = self.c.btl(a);
        let u = self.users.get_mut(&a).expect("made");
        if u.held_gen != u.gen {
            let r = btl.put(b, u.held.at(off as u64), target.remote().at(0), n, None);
            assert!(
                matches!(r, Err(Error::InvalidState(_))),
                "rank {a} used a registration whose pages were replaced: {r:?}"
            );
            btl.deregister_mem(u.held).expect("held");
            u.held = btl
                .register_mem(u.buf.user_mem(), access)
                .expect("registration");
            u.held_gen = u.gen;
        }
        let (held, want) = (u.held, u.buf.read(off, n));
        // The handle `b` last heard of (made before the pages were
        // replaced, perhaps).
        let (handle, handle_gen) = u.told;
        let gen = u.gen;
        self.note(format!(
            "user memory of rank {a} with {b}: {n} bytes at {off}, pages {gen}, {b}'s handle from {handle_gen}"
        ));

        // From it: its present contents land.
        let fresh = |r: &Result<OpId, Error>| {
            assert!(
                !matches!(r, Err(Error::InvalidState(_))),
                "rank {a}: a registration made since its pages were replaced was refused: {r:?}"
            );
        };
        let r = btl.put(b, held.at(off as u64), target.remote().at(0), n, None);
        fresh(&r);
        if let Ok(op) = r {
            match self.settle(a, b, op) {
                None => self.users.get_mut(&a).expect("made").pending.push((a, op)),
                Some(true) => assert!(
                    target.read(0, n) == want,
                    "put {a}->{b} from user memory ({n} bytes at {off}) did not move its \
                     present contents"
                ),
                Some(false) => {}
            }
        }
        self.keep.push(target);
        if self.user_busy(a) {
            return;
        }

        // Into it, through the handle `b` last heard of.
        let data = pattern(0x7000 ^ n as u32, n);
        let src = self.c.btl(b).alloc_mem(n).expect("memory");
        src.write(0, &data);
        let before = self.users[&a].buf.read(0, len);
        if let Ok(op) = self
            .c
            .btl(b)
            .put(a, src.reg().at(0), handle.at(off as u64), n, None)
        {
            let landed = self.settle(b, a, op);
            let u = self.users.get_mut(&a).expect("made");
            let now = u.buf.read(0, len);
            if handle_gen != u.gen {
                assert!(
                    now == before,
                    "{b}->{a}: a write through a handle made before the pages were \
                     replaced reached the new ones"
                );
            } else if landed == Some(true) {
                let mut want = before;
                want[off..off + n].copy_from_slice(&data);
                assert!(now == want, "put {b}->{a} into user memory did not land");
            }
            if landed.is_none() {
                u.pending.push((b, op));
            }
        }
        self.keep.push(src);
        let u = self.users.get_mut(&a).expect("made");
        u.told = (u.held.remote(), u.held_gen);
        if self.user_busy(a) {
            return;
        }

        // And read into it.
        let from = self.c.btl(b).alloc_mem(n).expect("memory");
        let data = pattern(0x9000 ^ n as u32, n);
        from.write(0, &data);
        let btl = self.c.btl(a);
        let r = btl.get(b, from.remote().at(0), held.at(off as u64), n, None);
        fresh(&r);
        if let Ok(op) = r {
            if !self.run_until(|_| btl.test(op) != OpStatus::Pending) {
                self.users.get_mut(&a).expect("made").pending.push((a, op));
            } else if btl.test(op) == OpStatus::Done && !self.told(a, b) {
                assert!(
                    self.users[&a].buf.read(off, n) == data,
                    "get {a}<-{b} into user memory did not land"
                );
            }
        }
        self.keep.push(from);
    }

    /// Whether an operation on rank `r`'s user memory may still move bytes
    /// (started by a rank still alive and not finished).
    fn user_busy(&mut self, r: u32) -> bool {
        let live = self.c.live();
        let Some(u) = self.users.get_mut(&r) else {
            return false;
        };
        let c = &mut self.c;
        u.pending
            .retain(|&(by, op)| live.contains(&by) && c.btl(by).test(op) == OpStatus::Pending);
        !u.pending.is_empty()
    }

    /// Now and then (drawn from `mem_rng`) a live rank's user memory gets
    /// new pages under the registration it holds: unmapped and mapped
    /// again at the same address, or emptied as an allocator trimming its
    /// heap does. Never under an operation still running on it (one that
    /// does reaches the old pages, which the checkers cannot tell from a
    /// stale registration).
    fn replace_user_pages(&mut self) {
        let live = self.c.live();
        let ranks: Vec<u32> = self
            .users
            .keys()
            .filter(|r| live.contains(r))
            .copied()
            .collect();
        if ranks.is_empty() || !self.mem_rng.chance(40) {
            return;
        }
        let r = ranks[self.mem_rng.below(ranks.len() as u64) as usize];
        let remap = self.mem_rng.chance(50);
        if self.user_busy(r) {
            return;
        }
        let u = self.users.get_mut(&r).expect("listed");
        u.gen += 1;
        if remap {
            u.buf.remap().expect("remap");
        } else {
            u.buf.discard().expect("madvise");
        }
        u.buf.write(0, &pattern(r ^ (u.gen << 8), u.buf.len()));
        self.note(format!(
            "rank {r}: user memory {} under its registration",
            if remap { "remapped" } else { "emptied" }
        ));
    }

    /// Runs until `done` or the limit; `false` at the limit.
    fn run_until(&mut self, mut done: impl FnMut(&mut Cluster) -> bool) -> bool {
        let deadline = self.c.now() + LIMIT;
        while !done(&mut self.c) {
            if self.c.now() >= deadline || self.c.step() == xrcbtl_btl::sim::Step::Stuck {
                return false;
            }
        }
        true
    }

    /// A random fault.
    fn fault(&mut self) {
        self.replace_user_pages();
        // An add under way as the fault strikes: sent, perhaps executed,
        // its answer perhaps on the wire.
        if let Some((a, b)) = self.fire_add() {
            let ns = self.add_rng.below(4000);
            self.c.advance(Duration::from_nanos(ns));
            // Now and then its connection breaks under it: the two nodes
            // are cut for longer than a QP takes to give up.
            let per = self.c.job.per_node() as u32;
            let (na, nb) = ((a / per) as usize, (b / per) as usize);
            if na != nb && self.add_rng.chance(30) {
                self.note(format!("cut {na}-{nb} under an add {a}->{b}"));
                self.c.sim.partition(na, nb);
                self.c.advance(Duration::from_millis(1500));
                self.c.sim.heal(na, nb);
            }
        }
        let live = self.c.live();
        let nodes = self.c.job.nodes();
        match self.rng.below(7) {
            0 | 1 if live.len() > 2 => {
                let r = live[self.rng.below(live.len() as u64) as usize];
                let clean = self.rng.chance(50);
                self.note(format!("{} rank {r}", if clean { "exit" } else { "crash" }));
                let p = self.c.proc(r);
                if clean {
                    // A clean exit flushes first.
                    let _ = self.c.btl(r).flush(Duration::from_secs(5));
                    self.c.exit(r, LIMIT);
                } else {
                    self.c.crash(r);
                }
                self.dead.push(p);
            }
            2 => {
                let a = self.rng.below(nodes as u64) as usize;
                let b = (a + 1 + self.rng.below(nodes as u64 - 1) as usize) % nodes;
                let ms = 1 + self.rng.below(400);
                self.note(format!("partition {a}-{b} for {ms} ms"));
                self.c.sim.partition(a, b);
                self.c.advance(Duration::from_millis(ms));
                self.c.sim.heal(a, b);
            }
            3 => {
                let action = match self.rng.below(3) {
                    0 => CmAction::Drop,
                    1 => CmAction::Delay(1_000_000 + self.rng.below(20_000_000)),
                    _ => CmAction::Duplicate,
                };
                let mut f = CmFault::new(None, action);
                f.probability_ppm = 100_000 + self.rng.below(300_000) as u32;
                f.count = Some(1 + self.rng.below(6) as u32);
                self.note(format!("cm fault {f:?}"));
                self.c.sim.add_cm_fault(f);
            }
            4 => {
                let n = self.rng.below(nodes as u64) as usize;
                let view = self.c.sim.node_view(n);
                let tgts = view.tgt_qps;
                if !tgts.is_empty() {
                    let t = &tgts[self.rng.below(tgts.len() as u64) as usize];
                    self.note(format!("TGT error node {n} qpn {:#x}", t.qpn));
                    let _ = self.c.sim.force_qp_error(n, t.qpn);
                } else if !view.senders.is_empty() {
                    // RC and iWARP (drawn apart, so that the rest of the
                    // schedule stays what it was): a connection's QP fails.
                    let i = self.add_rng.below(view.senders.len() as u64) as usize;
                    let qpn = view.senders[i];
                    self.note(format!("QP error node {n} qpn {qpn:#x}"));
                    let _ = self.c.sim.force_qp_error(n, qpn);
                }
            }
            5 => {
                let r = live[self.rng.below(live.len() as u64) as usize];
                self.note(format!("rank {r} busy"));
                self.c.pause(r, true);
                self.traffic();
                self.c.advance(Duration::from_millis(1 + self.rng.below(5)));
                self.c.pause(r, false);
            }
            _ => {}
        }
    }

    /// Checks what arrived against what was sent; `complete` when every
    /// healthy pair must have everything by now.
    fn check(&mut self, complete: bool) {
        self.c.check_clean(&self.dead);
        let live: BTreeSet<u32> = self.c.live().into_iter().collect();
        let mut got: Streams = BTreeMap::new();
        for &b in &live {
            for g in self.c.got(b).into_iter().filter(|g| g.tag == TAG) {
                let kind = g.data[0];
                let i = u32::from_le_bytes(g.data[1..5].try_into().unwrap());
                let src = u32::from_le_bytes(g.data[5..9].try_into().unwrap());
                assert_eq!(
                    src, g.src,
                    "message {i} to {b} names source {src}, came from {}",
                    g.src
                );
                assert!(
                    g.data == payload(kind, src, i, g.data.len()),
                    "{src}->{b}: message {i} ({} bytes) corrupted",
                    g.data.len()
                );
                got.entry((src, b))
                    .or_default()
                    .push((kind, i, g.data.len()));
            }
        }
        for ((a, b), sent) in &self.sent {
            if !live.contains(b) {
                continue;
            }
            let arrived = got.remove(&(*a, *b)).unwrap_or_default();
            let lens: BTreeMap<u32, usize> = sent.iter().map(|&(_, i, l)| (i, l)).collect();
            let mut seen = BTreeSet::new();
            for &(_, i, l) in &arrived {
                assert!(seen.insert(i), "{a}->{b}: message {i} delivered twice");
                assert_eq!(
                    lens.get(&i),
                    Some(&l),
                    "{a}->{b}: message {i} never sent so"
                );
            }
            let is_eager = |i: &u32| sent.iter().any(|&(k, j, _)| j == *i && k == EAGER);
            let eager: Vec<u32> = arrived
                .iter()
                .map(|&(_, i, _)| i)
                .filter(is_eager)
                .collect();
            assert!(
                eager.windows(2).all(|w| w[0] < w[1]),
                "{a}->{b}: eager messages out of order: {eager:?}"
            );
            if complete && live.contains(a) && !self.told(*a, *b) {
                let want: Vec<u32> = sent.iter().map(|&(_, i, _)| i).collect();
                let mut all: Vec<u32> = arrived.iter().map(|&(_, i, _)| i).collect();
                all.sort_unstable();
                assert_eq!(
                    all,
                    want,
                    "{a}->{b}: messages missing\n{}",
                    self.c.job.dump()
                );
            }
        }
        assert!(got.is_empty(), "messages from nowhere: {:?}", got.keys());
    }

    /// Waits until every live rank is idle (or the limit: faults may keep
    /// work waiting for a peer that is being declared failed).
    fn quiet(&mut self) -> bool {
        // Idle, and a round of progress over every live rank finds nothing
        // (no completion waits in a CQ: idle alone says nothing of what
        // arrived since the last poll).
        let idle = |c: &mut Cluster| {
            let live = c.live();
            let work: usize = live.iter().map(|&r| c.btl(r).progress()).sum();
            work == 0 && live.iter().all(|&r| c.btl(r).is_idle())
        };
        // Idle ranks may still have messages on the wire, delivered or
        // retransmitted (iWARP completes a send when it leaves, so a rank
        // that sent on a connection whose other end is gone is idle until
        // the retransmissions give up and the message goes again on a new
        // one): let the fabric run until nothing is scheduled (at most a
        // few times the time a dead peer takes to find), then wait for the
        // ranks again.
        self.run_until(idle) && {
            let end = self.c.now() + Duration::from_secs(3);
            self.run_until(|c| c.sim.next_event_at().is_none() || c.now() >= end)
                && self.run_until(idle)
        }
    }
}

fn run_seed(seed: u64) -> Vec<String> {
    run_seed_steps(seed, None)
}

/// How many steps seed `seed` runs.
fn steps_of(seed: u64) -> u64 {
    Run::new(seed).steps
}

/// Runs seed `seed`, its first `limit` steps only if given (then the
/// liveness phase): the steps draw from one generator in turn, so the
/// first `k` are the same whatever follows them.
fn run_seed_steps(seed: u64, limit: Option<u64>) -> Vec<String> {
    let mut run = Run::new(seed);
    let steps = limit.map_or(run.steps, |l| l.min(run.steps));
    for _ in 0..steps {
        if run.rng.chance(60) {
            run.traffic();
        } else {
            run.fault();
        }
        let quiet = run.quiet();
        if std::env::var_os("SWEEP_DUMP").is_some() {
            eprintln!(
                "sweep: after the step, quiet {quiet}:\n{}",
                run.c.job.dump()
            );
        }
        run.check(false);
        if quiet {
            run.check(true);
        }
    }
    // Liveness: faults off, everything healed; every pair that did not
    // declare the other failed talks both ways.
    run.c.sim.clear_cm_faults();
    let nodes = run.c.job.nodes();
    for a in 0..nodes {
        for b in 0..nodes {
            run.c.sim.heal(a, b);
        }
    }
    let live = run.c.live();
    for &a in &live {
        for &b in &live {
            if a != b && !run.told(a, b) {
                let i = *run.next.entry((a, b)).or_insert(0);
                let data = payload(EAGER, a, i, 64);
                if run
                    .c
                    .btl(a)
                    .send_bytes(b, TAG, Bytes::from(data), None)
                    .is_ok()
                {
                    *run.next.get_mut(&(a, b)).unwrap() += 1;
                    run.sent.entry((a, b)).or_default().push((EAGER, i, 64));
                }
            }
        }
    }
    assert!(
        run.quiet(),
        "not quiet after healing:\n{}",
        run.c.job.dump()
    );
    run.check(true);
    run.check_adds();
    run.log
}

/// Seeds that found a bug, each red before its fix: 553 and 623 (RC
/// requests arriving together each left a QP behind), 230 and 833 (a rank
/// that had declared a peer failed after a long partition went on dropping
/// its messages without a word, and the peer's rendezvous waited forever;
/// now the peer is told, `ConnManager::disown`), 969, 1070 and 1103 (the
/// same peer, asking to connect again, was served as new: a failed peer's
/// requests are now refused), 124 (iWARP: a message lost with its
/// connection after its send had completed was never sent again), 21 (an
/// atomic add whose answer was lost with its connection was posted again
/// on the next, and executed twice), 1005 (iWARP: a put to a key the peer
/// refused was posted again on every new connection, breaking each, and a
/// rendezvous whose reads gave up left its sender waiting), 3695 (a rank
/// stopped for a minute was given up by a peer that could not tell it,
/// and its rendezvous to that peer waited forever, as at 7190: it now probes a silent
/// peer it waits on).
#[test]
fn seeds_that_found_bugs() {
    for seed in [
        21, 124, 230, 553, 623, 833, 969, 1005, 1070, 1103, 3695, 7190,
    ] {
        run_seed(seed);
    }
}

/// Seeds that fail for a reason known and not fixed yet, skipped by the
/// sweep (and listed when it skips them). None now: seed 124 and 16 other
/// iWARP seeds lost a message whose connection broke after its send had
/// completed (it had only left); messages are now kept until the peer's
/// credits show they arrived, and sent again if their connection breaks
/// first ([`seeds_that_found_bugs`] replays it).
const KNOWN_OPEN: [u64; 0] = [];

/// The fewest first steps, of `n`, with which `fails` still fails: the
/// shortest failing schedule that cutting the tail finds (`None` if none
/// fails, not even all `n`).
fn shortest_failing_prefix(n: u64, mut fails: impl FnMut(u64) -> bool) -> Option<u64> {
    (0..=n).find(|&k| fails(k))
}

/// Whether seed `seed` fails with its first `k` steps (quietly: the
/// failures are expected).
fn fails_with(seed: u64, k: u64) -> bool {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let failed = std::panic::catch_unwind(|| run_seed_steps(seed, Some(k))).is_err();
    std::panic::set_hook(hook);
    failed
}

#[test]
fn shrinking_finds_the_shortest_failing_prefix() {
    assert_eq!(shortest_failing_prefix(9, |k| k >= 3), Some(3));
    assert_eq!(shortest_failing_prefix(9, |k| k == 9), Some(9));
    assert_eq!(shortest_failing_prefix(9, |_| false), None);
    // A seed that passes passes with any prefix of its steps.
    assert!(!fails_with(1, 2));
}

#[test]
fn sweep() {
    let var = |k: &str, d: u64| std::env::var(k).ok().map_or(d, |v| v.parse().expect(k));
    let from = var("SWEEP_FROM", 1);
    let seeds = var("SWEEP_SEEDS", 40);
    // SWEEP_ALL=1: every seed runs, and the failing ones are listed.
    let all = std::env::var_os("SWEEP_ALL").is_some();
    // SWEEP_STEPS=K: each seed runs its first K steps only.
    let limit = std::env::var("SWEEP_STEPS")
        .ok()
        .map(|v| v.parse().expect("SWEEP_STEPS"));
    let mut failed = Vec::new();
    for seed in from..from + seeds {
        if KNOWN_OPEN.contains(&seed) {
            eprintln!("sweep: seed {seed} skipped: known open (see KNOWN_OPEN)");
            continue;
        }
        let r = std::panic::catch_unwind(|| run_seed_steps(seed, limit));
        if let Err(e) = r {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let first = why.lines().next().unwrap_or_default().to_string();
            eprintln!(
                "sweep: seed {seed} failed: {first}\nreplay: SWEEP_FROM={seed} SWEEP_SEEDS=1 \
                 cargo test --release -p xrcbtl-btl --test sweep -- --nocapture"
            );
            let n = steps_of(seed);
            match shortest_failing_prefix(n, |k| fails_with(seed, k)) {
                Some(k) if k < n => eprintln!(
                    "sweep: seed {seed} shrinks to its first {k} of {n} steps: replay: \
                     SWEEP_FROM={seed} SWEEP_SEEDS=1 SWEEP_STEPS={k} cargo test --release \
                     -p xrcbtl-btl --test sweep -- --nocapture"
                ),
                Some(_) => eprintln!("sweep: seed {seed} needs all its {n} steps to fail"),
                None => eprintln!("sweep: seed {seed} did not fail again when shrinking"),
            }
            failed.push(seed);
            if !all {
                panic!("sweep: seed {seed} failed: {why}");
            }
        }
    }
    assert!(
        failed.is_empty(),
        "sweep: {} of {seeds} seeds failed: {failed:?}",
        failed.len()
    );
    eprintln!("sweep: seeds {from}..{} passed", from + seeds);
}
