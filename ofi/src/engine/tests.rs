//! Two domains on two nodes of a simulated job, each with an engine and
//! an endpoint whose address vector holds both: messages of every size
//! class land whole in the posted buffers, and the completions say what
//! the libfabric contract says they should.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::MappedBuf;
use xrcbtl_fabric::sim::{SimContext, SimDevice};

use super::*;
use crate::addr::EpAddr;
use crate::av::AvKind;
use crate::cq::Read;

struct Side {
    engine: Engine<SimContext>,
    tx: SharedCq,
    rx: SharedCq,
    /// Address vector numbers: [A, B].
    fi: [u64; 2],
}

struct Two {
    job: SimJob,
    sides: [Side; 2],
}

fn addr_of(btl: &Btl<SimContext>) -> EpAddr {
    EpAddr {
        rank: btl.rank(),
        ep: 0,
        listen: btl.listen_addr().unwrap(),
        receive: Some(btl.receive()),
        ib: btl.listen_ib_addr(),
    }
}

impl Two {
    /// Ranks 0 and 2 of a 2 x 2 job: two nodes.
    fn new(cq_size: usize) -> Two {
        Two::with_budget(cq_size, UNEXPECTED_MAX)
    }

    fn with_budget(cq_size: usize, budget: usize) -> Two {
        Two::on(SimDevice::ib("sim0"), cq_size, budget)
    }

    fn on(device: SimDevice, cq_size: usize, budget: usize) -> Two {
        let mut job = SimJob::new(7, 2, 2, device).unwrap();
        let btls = [job.btl(0).clone(), job.btl(2).clone()];
        let addrs = [addr_of(&btls[0]), addr_of(&btls[1])];
        let sides = btls.map(|btl| {
            let av = Arc::new(Mutex::new(EpAv::new(AvKind::Table, 8)));
            let fi = {
                let mut t = av.lock().unwrap();
                [t.insert(addrs[0]).unwrap(), t.insert(addrs[1]).unwrap()]
            };
            let tx = Arc::new(Mutex::new(CompletionQueue::new(cq_size)));
            let rx = Arc::new(Mutex::new(CompletionQueue::new(cq_size)));
            let engine = Engine::new(btl, budget);
            engine.open(
                0,
                Targets {
                    av: Some(av),
                    tx: Some(tx.clone()),
                    rx: Some(rx.clone()),
                    counters: Vec::new(),
                },
            );
            Side { engine, tx, rx, fi }
        });
        Two { job, sides }
    }

    /// Steps the job until `cq` has something to read (or gives up).
    fn wait(&mut self, cq: &SharedCq) -> Read {
        for _ in 0..100_000 {
            {
                let mut q = cq.lock().unwrap();
                match q.read(16) {
                    Read::Empty => {}
                    other => return other,
                }
            }
            self.job.step();
        }
        panic!("no completion came: {}", self.job.dump());
    }

    fn send(
        &self,
        from: usize,
        to: usize,
        space: Space,
        buf: &MappedBuf,
        len: usize,
        context: u64,
    ) {
        let mem = (len > 0).then(|| buf.user_mem().slice(0, len).unwrap());
        self.sides[from]
            .engine
            .send(
                0,
                SendArgs {
                    context,
                    to: self.sides[from].fi[to],
                    space,
                    data: None,
                    mem,
                    completion: true,
                    delivery: false,
                    gathered: None,
                },
            )
            .unwrap();
    }

    fn recv(&self, on: usize, space: Space, buf: &MappedBuf, len: usize, context: u64) {
        let mem = (len > 0).then(|| buf.user_mem().slice(0, len).unwrap());
        self.sides[on]
            .engine
            .recv(
                0,
                RecvArgs {
                    context,
                    from: None,
                    space,
                    ignore: 0,
                    mem,
                    completion: true,
                    multi: None,
                },
            )
            .unwrap();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn one(r: Read) -> Entry {
    match r {
        Read::Entries(v) if v.len() == 1 => v[0],
        other => panic!("{other:?}"),
    }
}

#[test]
fn messages_of_each_size_class_land_whole_with_their_completions() {
    // The two messages past the eager size go by the provider's
    // rendezvous: on InfiniBand the receiver reads them, on iWARP (where
    // the BTL's rendezvous writes) the sender writes them.
    each_size_class(SimDevice::ib("sim0"), [0, 2]);
    each_size_class(SimDevice::iwarp("sim0"), [2, 0]);
}

/// `rdma`: the RDMA fragments the sender and the receiver posted.
fn each_size_class(device: SimDevice, rdma: [u64; 2]) {
    let mut t = Two::on(device, 64, UNEXPECTED_MAX);
    let eager = t.sides[0].engine.eager_max();
    for (i, len) in [0, 1, 100, eager, eager + 1, 256 << 10]
        .into_iter()
        .enumerate()
    {
        let src = MappedBuf::new((len + 1).max(4096)).unwrap();
        let dst = MappedBuf::new((len + 1).max(4096)).unwrap();
        let bytes = pattern(len, i as u8);
        src.write(0, &bytes);
        let tag = 100 + i as u64;
        // Half the receives are posted first, half after the send.
        let early = i % 2 == 0;
        if early {
            t.recv(1, Space::Tagged(tag), &dst, len + 1, 10 + i as u64);
        }
        t.send(0, 1, Space::Tagged(tag), &src, len, 20 + i as u64);
        if !early {
            t.recv(1, Space::Tagged(tag), &dst, len + 1, 10 + i as u64);
        }
        let rx = t.sides[1].rx.clone();
        let got = one(t.wait(&rx));
        assert_eq!(got.context, 10 + i as u64, "{len} B");
        assert_eq!(got.len, len, "{len} B");
        assert_eq!(got.tag, tag);
        assert_eq!(got.flags, RECV | TAGGED);
        assert_eq!(
            got.source, t.sides[1].fi[0],
            "FI_SOURCE: A's number in B's vector"
        );
        assert_eq!(dst.read(0, len), bytes, "{len} B");
        assert_eq!(dst.read(len, 1), [0], "nothing past the message");
        let tx = t.sides[0].tx.clone();
        let sent = one(t.wait(&tx));
        assert_eq!((sent.context, sent.flags), (20 + i as u64, SEND | TAGGED));
    }
    let frags = t
        .sides
        .each_ref()
        .map(|s| s.engine.btl().stats().rdma_frags);
    assert_eq!(frags, rdma, "RDMA by the sender and the receiver");
    for s in &t.sides {
        assert_eq!(s.engine.in_flight(0), (0, 0, 0), "nothing left over");
        assert_eq!(s.tx.lock().unwrap().reserved(), 0);
        assert_eq!(s.rx.lock().unwrap().reserved(), 0);
    }
}

#[test]
fn a_short_receive_truncates_and_a_cancelled_one_says_so() {
    let mut t = Two::new(8);
    let eager = t.sides[0].engine.eager_max();
    for len in [200, eager + 500] {
        let src = MappedBuf::new(len).unwrap();
        let dst = MappedBuf::new(4096).unwrap();
        src.write(0, &pattern(len, 3));
        t.recv(1, Space::Msg, &dst, 100, 1);
        t.send(0, 1, Space::Msg, &src, len, 2);
        let rx = t.sides[1].rx.clone();
        assert_eq!(t.wait(&rx), Read::ErrorFirst);
        let e = rx.lock().unwrap().read_err().unwrap();
        assert_eq!(e.err, sys::FI_ETRUNC as i32);
        assert_eq!(e.olen, len - 100);
        assert_eq!(e.entry.len, 100);
        assert_eq!(dst.read(0, 100), pattern(len, 3)[..100]);
        assert_eq!(dst.read(100, 1), [0]);
        let tx = t.sides[0].tx.clone();
        assert_eq!(one(t.wait(&tx)).context, 2, "the sender completes normally");
    }
    let dst = MappedBuf::new(4096).unwrap();
    t.recv(1, Space::Tagged(5), &dst, 64, 77);
    assert!(t.sides[1].engine.cancel(0, 77));
    assert!(!t.sides[1].engine.cancel(0, 77), "once");
    let rx = t.sides[1].rx.clone();
    assert_eq!(t.wait(&rx), Read::ErrorFirst);
    let e = rx.lock().unwrap().read_err().unwrap();
    assert_eq!((e.entry.context, e.err), (77, sys::FI_ECANCELED as i32));
}

#[test]
fn a_large_send_posted_after_its_peer_died_completes_in_error() {
    // libfabric's kill test (ofi/tests/c/kill.c) on rxe: a send posted
    // once the survivor knew its peer was gone waited for a Fin forever.
    let mut t = Two::new(8);
    let len = t.sides[0].engine.eager_max() + 500;
    let src = MappedBuf::new(len).unwrap();
    src.write(0, &pattern(len, 5));
    // A rendezvous the peer holds unread (its offer arrived), then the
    // peer dies.
    t.send(0, 1, Space::Tagged(1), &src, len, 1);
    t.job
        .run_until(Duration::from_secs(5), |j| {
            j.peek(2).stats().eager_received > 0
        })
        .unwrap();
    t.job.crash(2);
    let tx = t.sides[0].tx.clone();
    assert_eq!(t.wait(&tx), Read::ErrorFirst);
    let e = tx.lock().unwrap().read_err().unwrap();
    assert_eq!((e.entry.context, e.err), (1, sys::FI_EIO as i32));
    // The BTL knows the endpoint is gone: it refuses the next offer.
    t.send(0, 1, Space::Tagged(1), &src, len, 2);
    assert_eq!(t.wait(&tx), Read::ErrorFirst);
    let e = tx.lock().unwrap().read_err().unwrap();
    assert_eq!((e.entry.context, e.err), (2, sys::FI_EIO as i32));
}

#[test]
fn a_full_queue_refuses_the_post_and_takes_it_once_read() {
    let mut t = Two::new(2);
    let dst = MappedBuf::new(4096).unwrap();
    t.recv(1, Space::Msg, &dst, 16, 1);
    t.recv(1, Space::Msg, &dst, 16, 2);
    let third = t.sides[1].engine.recv(
        0,
        RecvArgs {
            context: 3,
            from: None,
            space: Space::Msg,
            ignore: 0,
            mem: Some(dst.user_mem().slice(0, 16).unwrap()),
            completion: true,
            multi: None,
        },
    );
    assert_eq!(third, Err(PostError::Again));
    // An unknown destination is refused at the call.
    let src = MappedBuf::new(4096).unwrap();
    let far = t.sides[0].engine.send(
        0,
        SendArgs {
            context: 9,
            to: 55,
            space: Space::Msg,
            data: None,
            mem: Some(src.user_mem().slice(0, 8).unwrap()),
            completion: true,
            delivery: false,
            gathered: None,
        },
    );
    assert_eq!(far, Err(PostError::NoAddress));
    t.send(0, 1, Space::Msg, &src, 8, 4);
    let rx = t.sides[1].rx.clone();
    assert_eq!(one(t.wait(&rx)).context, 1);
    t.recv(1, Space::Msg, &dst, 16, 3);
}

#[test]
fn a_message_past_the_unexpected_budget_is_dropped_and_reported() {
    assert_eq!(unexpected_max(None), Ok(UNEXPECTED_MAX));
    assert_eq!(unexpected_max(Some("8192")), Ok(8192));
    assert!(unexpected_max(Some("10"))
        .unwrap_err()
        .contains(UNEXPECTED_VAR));
    let mut t = Two::with_budget(16, 4096);
    let src = MappedBuf::new(4096).unwrap();
    src.write(0, &pattern(3000, 1));
    // Two unexpected messages of 3000 B: the first is held, the second
    // would pass 4096 B.
    t.send(0, 1, Space::Tagged(1), &src, 3000, 1);
    t.send(0, 1, Space::Tagged(2), &src, 3000, 2);
    let rx = t.sides[1].rx.clone();
    assert_eq!(t.wait(&rx), Read::ErrorFirst);
    let e = rx.lock().unwrap().read_err().unwrap();
    assert_eq!(e.err, sys::FI_EOVERRUN as i32);
    assert_eq!(e.prov_errno, ProvErr::Overrun as i32);
    assert_eq!(e.entry.source, t.sides[1].fi[0]);
    // The held one is still there for its receive.
    let dst = MappedBuf::new(4096).unwrap();
    t.recv(1, Space::Tagged(1), &dst, 4096, 3);
    let got = one(t.wait(&rx));
    assert_eq!((got.context, got.len), (3, 3000));
    assert_eq!(dst.read(0, 3000), pattern(3000, 1));
    // Both eager sends completed at the sender.
    let tx = t.sides[0].tx.clone();
    let mut sent = Vec::new();
    while sent.len() < 2 {
        match t.wait(&tx) {
            Read::Entries(v) => sent.extend(v.iter().map(|e| e.context)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sent, [1, 2]);
}

/// Several provider endpoints per node, each sending to every endpoint of
/// the other nodes: under them, each process holds one XRC INI QP per
/// remote node, and each node one TGT QP per sending process, opened by
/// every rank of the node that receives through it; all of it goes when
/// the job shuts down.
#[test]
fn endpoints_of_a_node_share_its_xrc_connections() {
    const NODES: usize = 3;
    const PER_NODE: usize = 2;
    const EPS: u16 = 2;
    let mut job = SimJob::new(11, NODES, PER_NODE, SimDevice::ib("sim0")).unwrap();
    let ranks = (NODES * PER_NODE) as u32;
    let btls: Vec<_> = (0..ranks).map(|r| job.btl(r).clone()).collect();
    let mut addrs = Vec::new();
    for b in &btls {
        for ep in 0..EPS {
            addrs.push(EpAddr { ep, ..addr_of(b) });
        }
    }
    let node = |r: u32| r as usize / PER_NODE;
    // Each rank: its engine, one vector of every endpoint, one queue.
    let mut sides = Vec::new();
    for b in &btls {
        let av = Arc::new(Mutex::new(EpAv::new(AvKind::Table, 64)));
        for a in &addrs {
            av.lock().unwrap().insert(*a).unwrap();
        }
        let cq = Arc::new(Mutex::new(CompletionQueue::new(1024)));
        let engine = Engine::new(b.clone(), UNEXPECTED_MAX);
        for ep in 0..EPS {
            engine.open(
                ep,
                Targets {
                    av: Some(av.clone()),
                    tx: Some(cq.clone()),
                    rx: Some(cq.clone()),
                    counters: Vec::new(),
                },
            );
        }
        sides.push((engine, cq));
    }
    let bufs: Vec<MappedBuf> = (0..addrs.len())
        .map(|_| MappedBuf::new(4096).unwrap())
        .collect();
    let mut expected = 0;
    for (i, from) in addrs.iter().enumerate() {
        for (j, to) in addrs.iter().enumerate() {
            if node(from.rank) == node(to.rank) {
                continue;
            }
            let (engine, _) = &sides[from.rank as usize];
            let tag = (i * 100 + j) as u64;
            engine
                .send(
                    from.ep,
                    SendArgs {
                        context: tag,
                        to: j as u64,
                        space: Space::Tagged(tag),
                        data: None,
                        mem: Some(bufs[i].user_mem().slice(0, 16).unwrap()),
                        completion: true,
                        delivery: false,
                        gathered: None,
                    },
                )
                .unwrap();
            let (engine, _) = &sides[to.rank as usize];
            engine
                .recv(
                    to.ep,
                    RecvArgs {
                        context: 1 << 32 | tag,
                        from: Some(i as u64),
                        space: Space::Tagged(tag),
                        ignore: 0,
                        mem: Some(bufs[j].user_mem().slice(64 + 16 * (i % 200), 16).unwrap()),
                        completion: true,
                        multi: None,
                    },
                )
                .unwrap();
            expected += 2;
        }
    }
    let mut got = 0;
    for _ in 0..200_000 {
        for (_, cq) in &sides {
            if let Read::Entries(v) = cq.lock().unwrap().read(64) {
                got += v.len();
            }
        }
        if got == expected {
            break;
        }
        job.step();
    }
    assert_eq!(got, expected, "every send and receive completed");
    for r in 0..ranks {
        assert_eq!(
            btls[r as usize].with_manager(|m| m.live_qps()),
            NODES - 1,
            "rank {r}: one INI QP per remote node, for all its endpoints"
        );
    }
    for n in 0..NODES {
        let opens: Vec<usize> = job
            .sim
            .node_view(n)
            .tgt_qps
            .iter()
            .map(|t| t.open_count)
            .collect();
        assert_eq!(
            opens,
            vec![PER_NODE; (NODES - 1) * PER_NODE],
            "node {n}: a TGT QP per sending process, opened by each rank here"
        );
    }
    drop(sides);
    job.shutdown(std::time::Duration::from_secs(5)).unwrap();
    for n in 0..NODES {
        assert!(
            job.sim.node_view(n).tgt_qps.is_empty(),
            "node {n}: TGT QPs released"
        );
    }
}

/// A message from an endpoint the receiver's vector does not hold lands
/// all the same, its source FI_ADDR_NOTAVAIL; a receive directed to a
/// known peer does not take it.
#[test]
fn a_sender_missing_from_the_vector_is_received_as_not_available() {
    let mut t = Two::new(8);
    // B's vector forgets A.
    {
        let st = t.sides[1].engine.state.lock().unwrap();
        let av = st.eps[&0].targets.av.clone().unwrap();
        drop(st);
        av.lock().unwrap().remove(t.sides[1].fi[0]).unwrap();
    }
    let src = MappedBuf::new(4096).unwrap();
    let dst = MappedBuf::new(4096).unwrap();
    src.write(0, b"from nowhere");
    // Directed to B itself (in its vector): A's message must not match.
    t.sides[1]
        .engine
        .recv(
            0,
            RecvArgs {
                context: 5,
                from: Some(t.sides[1].fi[1]),
                space: Space::Msg,
                ignore: 0,
                mem: Some(dst.user_mem().slice(0, 64).unwrap()),
                completion: true,
                multi: None,
            },
        )
        .unwrap();
    t.send(0, 1, Space::Msg, &src, 12, 6);
    t.recv(1, Space::Msg, &dst, 64, 7);
    let rx = t.sides[1].rx.clone();
    let got = one(t.wait(&rx));
    assert_eq!((got.context, got.len), (7, 12), "the receive from anyone");
    assert_eq!(got.source, NOT_AVAIL);
    assert_eq!(dst.read(0, 12), b"from nowhere");
    assert!(
        t.sides[1].engine.cancel(0, 5),
        "the directed one still waits"
    );
}

/// A registration past the device's largest region (here 4 MiB) is
/// cut into chunks under one compound key. A peer learns the chunks once
/// (one query, whatever waits on it) and then reads, writes and runs
/// atomics across chunk boundaries, from a local buffer that itself spans
/// several regions; a compound key the owner never gave fails the
/// operation through an error completion.
#[test]
fn a_registration_past_the_device_limit_is_reached_across_its_chunks() {
    let max = 4 << 20;
    let mut device = SimDevice::ib("sim0");
    device.caps.max_mr_size = max;
    let mut t = Two::on(device, 64, UNEXPECTED_MAX);
    let target = MappedBuf::new(300 << 16).unwrap();
    // Starts mid-page, 290 x 64 KiB: five chunks.
    let mem = target.user_mem().slice(100, 290 << 16).unwrap();
    let rights = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    let region = t.sides[1].engine.register_region(mem, rights).unwrap();
    assert_ne!(region.key & COMPOUND, 0, "a compound key");
    assert_eq!(region.regs.len(), 5);
    for r in &region.regs {
        assert!(keys::fits(r.addr(), r.len(), max));
    }
    assert!(
        t.sides[1].engine.btl().register_mem(mem, rights).is_err(),
        "the device takes no region this large"
    );
    let base = mem.addr() as u64;

    // Two writes posted before the answer: one query, both wait on it.
    let len = 150 << 16;
    let src = MappedBuf::new(len + 8192).unwrap();
    let data = pattern(len, 9);
    src.write(77, &data);
    let local = src.user_mem().slice(77, len).unwrap();
    let peer = t.sides[0].fi[1];
    let key = region.key;
    let rma = move |context, write, mem: UserMem, addr| RmaArgs {
        context,
        to: peer,
        mem: Some(mem),
        addr,
        key,
        write,
        data: None,
        inject: false,
        completion: true,
    };
    let at = base + 20_000;
    let e0 = &t.sides[0].engine;
    e0.rma(0, rma(1, true, local, at)).unwrap();
    e0.rma(
        0,
        rma(
            2,
            true,
            local.slice(0, 4096).unwrap(),
            base + (12 << 20) - 2000,
        ),
    )
    .unwrap();
    assert_eq!(lock(&e0.lookups).asked(), 1, "asked once");
    let tx = t.sides[0].tx.clone();
    let mut done: Vec<u64> = Vec::new();
    while done.len() < 2 {
        match t.wait(&tx) {
            Read::Entries(v) => done.extend(v.iter().map(|e| e.context)),
            other => panic!("{other:?}"),
        }
    }
    done.sort();
    assert_eq!(done, [1, 2]);
    assert!(
        target.read(100 + 20_000, len) == data,
        "the first write, across two chunk boundaries"
    );
    assert!(
        target.read(100 + (12 << 20) - 2000, 4096) == data[..4096],
        "the second write, across a third"
    );

    // A read back across four chunks, into a buffer of several regions.
    let back = MappedBuf::new(len).unwrap();
    let t0 = &t.sides[0].engine;
    t0.rma(0, rma(3, false, back.user_mem(), at)).unwrap();
    assert_eq!(one(t.wait(&tx)).context, 3);
    assert!(back.read(0, len) == data, "read back whole");

    // An atomic in the fourth chunk.
    let word = (base + (200 << 16)) / 8 * 8;
    let off = (word - target.addr() as u64) as usize;
    target.write(off, &40u64.to_ne_bytes());
    let result = MappedBuf::new(4096).unwrap();
    t.sides[0]
        .engine
        .atomic(
            0,
            AtomicArgs {
                context: 4,
                to: t.sides[0].fi[1],
                addr: word,
                key: region.key,
                op: crate::atomic::Op::FetchAdd(2),
                result: Some(result.user_mem().slice(0, 8).unwrap()),
                completion: true,
            },
        )
        .unwrap();
    assert_eq!(one(t.wait(&tx)).context, 4);
    assert_eq!(result.read(0, 8), 40u64.to_ne_bytes());
    assert_eq!(target.read(off, 8), 42u64.to_ne_bytes());

    // Outside the registration: refused at the call, nothing posted.
    let e0 = &t.sides[0].engine;
    assert!(e0
        .rma(
            0,
            rma(5, true, local.slice(0, 8).unwrap(), base + (290 << 16) - 4)
        )
        .is_err());
    // A compound key never given: the owner says so, the write fails.
    let mut bad = rma(6, true, local.slice(0, 8).unwrap(), at);
    bad.key = COMPOUND | 999;
    e0.rma(0, bad).unwrap();
    assert!(matches!(t.wait(&tx), Read::ErrorFirst));
    let e = t.sides[0].tx.lock().unwrap().read_err().unwrap();
    assert_eq!(e.entry.context, 6);

    t.sides[1].engine.deregister_region(region);
    assert!(lock(&t.sides[1].engine.lookups).mine(key).is_none());
}

#[test]
fn the_verbose_line_counts_what_the_rank_carried() {
    assert_eq!(verbose(None), Ok(false));
    assert_eq!(verbose(Some("0")), Ok(false));
    assert_eq!(verbose(Some("1")), Ok(true));
    assert!(verbose(Some("yes")).unwrap_err().contains(VERBOSE_VAR));
    let mut t = Two::new(16);
    let src = MappedBuf::new(64).unwrap();
    src.write(0, &pattern(64, 5));
    let dst = MappedBuf::new(64).unwrap();
    for n in 0..3 {
        t.recv(1, Space::Msg, &dst, 64, 10 + n);
        t.send(0, 1, Space::Msg, &src, 64, n);
        let rx = t.sides[1].rx.clone();
        assert_eq!(one(t.wait(&rx)).context, 10 + n);
    }
    let (sent, got) = (t.sides[0].engine.stats(), t.sides[1].engine.stats());
    assert_eq!(sent.eager_sent, 3);
    assert_eq!(got.eager_received, 3);
    let line = carried(42, &got, &t.sides[1].engine.rcache_stats());
    assert!(line.starts_with("xrc: pid 42 carried: sends "), "{line}");
    assert!(
        line.contains(", received 3, rendezvous sent 0 received 0,"),
        "{line}"
    );
    let line = carried(7, &sent, &t.sides[0].engine.rcache_stats());
    assert!(
        line.starts_with("xrc: pid 7 carried: sends 3 (inline "),
        "{line}"
    );
    let reg = xrcbtl_fabric::rcache::Stats {
        registrations: 4,
        hits: 9,
        uncached: 1,
        invalidations: 2,
        ..Default::default()
    };
    let line = carried(7, &sent, &reg);
    assert!(
        line.ends_with("; registrations 4 (cache hits 9, for one use 1, invalidated 2)"),
        "{line}"
    );
}
