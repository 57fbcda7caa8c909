//! The API an MPI library drives, end to end on the simulated fabric: put
//! and get on user memory (also after it was unmapped and mapped again),
//! 64-bit atomics and their absence, gathered sends, completion callbacks,
//! and callbacks that send, add endpoints and progress.

mod btlsim;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use btlsim::{pattern, Cluster, TAG};
use xrcbtl_btl::{
    Access, Btl, MappedBuf, MemReg, OpId, OpResult, OpStatus, Peer, RawMemReg, RemoteMem,
};
use xrcbtl_fabric::sim::{SimContext, SimDevice};
use xrcbtl_fabric::Error;

const LIMIT: Duration = Duration::from_secs(30);

type Outcomes = Arc<Mutex<Vec<(OpId, OpResult)>>>;

/// A completion callback that records the outcome.
fn recorder(out: &Outcomes) -> Option<xrcbtl_btl::OnDone<SimContext>> {
    let o = out.clone();
    Some(Box::new(move |_: &Btl<SimContext>, op, r| {
        o.lock().unwrap().push((op, r))
    }))
}

/// Rank `r`'s memory `len` bytes long, told to rank `to` (a remote
/// handle travels as packed bytes, as an MPI library sends it).
fn exposed(
    c: &mut Cluster,
    r: u32,
    to: u32,
    len: usize,
) -> (xrcbtl_btl::RegMem<SimContext>, RemoteMem) {
    let mem = c.btl(r).alloc_mem(len).unwrap();
    c.clear_got(to);
    c.btl(r)
        .send(to, TAG + 1, &mem.remote().pack(), &[])
        .unwrap();
    c.run_until(LIMIT, |c| c.got_count(to) == 1);
    let remote = RemoteMem::unpack(&c.got(to)[0].data).unwrap();
    c.clear_got(to);
    (mem, remote)
}

/// Waits until a message from `from` reached `to` after everything sent
/// before it: on iWARP, where a write completes once it has left, this is
/// when earlier puts have landed.
fn landed(c: &mut Cluster, from: u32, to: u32) {
    let n = c.got_count(to);
    c.btl(from).send(to, TAG, b"landed?", &[]).unwrap();
    c.run_until(LIMIT, |c| c.got_count(to) > n);
}

fn user_memory_follows_a_remapped_buffer(device: SimDevice) {
    let mut c = Cluster::new(21, 2, 2, device);
    let (theirs, remote) = exposed(&mut c, 3, 0, 64 * 1024);
    let b = c.btl(0);
    let mut buf = MappedBuf::new(64 * 1024).unwrap();
    let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let out: Outcomes = Arc::default();

    // Put from user memory.
    buf.fill(0xA1);
    let reg = b.register_mem(buf.user_mem(), access).unwrap();
    b.put(3, reg.at(100), remote.at(0), 40_000, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert_eq!(out.lock().unwrap()[0].1, Ok(None));
    landed(&mut c, 0, 3);
    assert!(theirs.read(0, 40_000).iter().all(|&x| x == 0xA1));
    b.deregister_mem(reg).unwrap();
    assert!(b.deregister_mem(reg).is_err(), "given back once");
    // The same memory again: the cache has it.
    let hits = b.rcache_stats().hits;
    let reg = b.register_mem(buf.user_mem(), access).unwrap();
    assert_eq!(b.rcache_stats().hits, hits + 1);
    b.deregister_mem(reg).unwrap();

    // New pages at the same address: registered afresh, and the new
    // contents (not the old pages, not nothing) travel.
    buf.remap().unwrap();
    buf.fill(0xB2);
    let reg = b.register_mem(buf.user_mem(), access).unwrap();
    assert!(
        b.rcache_stats().invalidations >= 1,
        "{:?}",
        b.rcache_stats()
    );
    b.put(3, reg.at(0), remote.at(0), 40_000, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 2);
    landed(&mut c, 0, 3);
    assert!(
        theirs.read(0, 40_000).iter().all(|&x| x == 0xB2),
        "stale registration: the old pages (or none) were sent"
    );

    // Get into user memory, at an offset.
    let data = pattern(7, 30_000);
    theirs.write(1000, &data);
    let op = b
        .get(3, remote.at(1000), reg.at(512), data.len(), None)
        .unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(op) != OpStatus::Pending);
    assert_eq!(b.test(op), OpStatus::Done);
    assert_eq!(buf.read(512, data.len()), data);
    assert_eq!(
        buf.read(0, 512),
        vec![0xB2; 512],
        "nothing before it changed"
    );

    // Outside the registration, or after it was given back: refused.
    assert!(b
        .get(3, remote.at(0), reg.at(64 * 1024 - 8), 16, None)
        .is_err());
    // A registration in its raw parts (as a C ABI keeps it) works while it
    // lives; a forged key, or the same parts after deregistration, fail
    // before anything is posted.
    let raw = reg.to_raw();
    let op = b
        .put(3, MemReg::from_raw(raw).at(0), remote.at(0), 8, None)
        .unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(op) != OpStatus::Pending);
    assert_eq!(b.test(op), OpStatus::Done);
    let forged = MemReg::from_raw(RawMemReg {
        lkey: raw.lkey ^ 1,
        ..raw
    });
    assert!(b.put(3, forged.at(0), remote.at(0), 8, None).is_err());
    b.deregister_mem(reg).unwrap();
    assert!(b
        .put(3, reg.at(0), remote.at(0), 8, recorder(&out))
        .is_err());
    assert!(b.get(3, remote.at(0), reg.at(0), 8, None).is_err());
    assert_eq!(out.lock().unwrap().len(), 2, "no callback for a refused op");
    c.shutdown(LIMIT);
}

#[test]
fn put_and_get_on_user_memory_follow_a_remapped_buffer_over_xrc() {
    user_memory_follows_a_remapped_buffer(SimDevice::ib("sim0"));
}

#[test]
fn put_and_get_on_user_memory_follow_a_remapped_buffer_over_rc() {
    user_memory_follows_a_remapped_buffer(SimDevice::roce("sim0"));
}

#[test]
fn put_and_get_on_user_memory_follow_a_remapped_buffer_over_iwarp() {
    user_memory_follows_a_remapped_buffer(SimDevice::iwarp("sim0"));
}

/// Memory unmapped and mapped again while registrations of it are held:
/// the holder's operations through them are refused (they would move the
/// old pages), and a peer's writes through the old remote handle never
/// reach the new pages.
fn held_registrations_across_a_remap(device: SimDevice) {
    let mut c = Cluster::new(23, 2, 2, device);
    let (theirs, remote) = exposed(&mut c, 3, 0, 16 * 1024);
    let (b, peer) = (c.btl(0), c.btl(3));
    let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mut mine = MappedBuf::new(16 * 1024).unwrap();
    let mut their_buf = MappedBuf::new(16 * 1024).unwrap();
    let held = b.register_mem(mine.user_mem(), access).unwrap();
    let their_reg = peer.register_mem(their_buf.user_mem(), access).unwrap();
    let old_handle = their_reg.remote();
    mine.fill(0x11);
    b.put(3, held.at(0), remote.at(0), 4096, None).unwrap();
    landed(&mut c, 0, 3);
    assert_eq!(theirs.read(0, 4096), vec![0x11; 4096]);

    mine.remap().unwrap();
    mine.fill(0x22);
    their_buf.remap().unwrap();
    their_buf.fill(0x33);
    for r in [
        b.put(3, held.at(0), remote.at(0), 4096, None),
        b.get(3, remote.at(0), held.at(0), 4096, None),
    ] {
        assert!(
            matches!(r, Err(Error::InvalidState(_))),
            "a registration whose memory went is refused: {r:?}"
        );
    }
    // The peer's old handle: the write goes to the old pages (or nowhere),
    // not into the new ones.
    let out: Outcomes = Arc::default();
    let src = b.alloc_mem(4096).unwrap();
    src.write(0, &[0x44; 4096]);
    b.put(3, src.reg().at(0), old_handle.at(0), 4096, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    landed(&mut c, 0, 3);
    assert_eq!(
        their_buf.read(0, 4096),
        vec![0x33; 4096],
        "the old handle reached the new pages"
    );
    // Registered again: the new memory travels, both ways.
    b.deregister_mem(held).unwrap();
    peer.deregister_mem(their_reg).unwrap();
    let fresh = b.register_mem(mine.user_mem(), access).unwrap();
    b.put(3, fresh.at(0), remote.at(0), 4096, None).unwrap();
    landed(&mut c, 0, 3);
    assert_eq!(theirs.read(0, 4096), vec![0x22; 4096]);
    let their_reg = peer.register_mem(their_buf.user_mem(), access).unwrap();
    let op = b
        .put(3, src.reg().at(0), their_reg.remote().at(0), 4096, None)
        .unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(op) != OpStatus::Pending);
    landed(&mut c, 0, 3);
    assert_eq!(their_buf.read(0, 4096), vec![0x44; 4096]);
    b.deregister_mem(fresh).unwrap();
    peer.deregister_mem(their_reg).unwrap();
    c.shutdown(LIMIT);
}

#[test]
fn held_registrations_across_a_remap_over_xrc() {
    held_registrations_across_a_remap(SimDevice::ib("sim0"));
}

#[test]
fn held_registrations_across_a_remap_over_rc() {
    held_registrations_across_a_remap(SimDevice::roce("sim0"));
}

#[test]
fn held_registrations_across_a_remap_over_iwarp() {
    held_registrations_across_a_remap(SimDevice::iwarp("sim0"));
}

/// One-sided work and atomics on a rank's own memory go through the
/// device's loopback: atomics from the rank itself and from a peer on the
/// same word are atomic with each other; an error breaks the loopback's
/// QPs, and the next operation gets fresh ones. iWARP has no loopback.
fn own_memory_through_the_loopback(device: SimDevice) {
    let mut c = Cluster::new(29, 2, 1, device);
    let mine = c.btl(0).alloc_mem(8192).unwrap();
    let remote = mine.remote();
    let src = c.btl(0).alloc_mem(4096).unwrap();
    src.write(0, &pattern(4, 4096));
    let out: Outcomes = Arc::default();
    let b = c.btl(0);
    b.put(0, src.reg().at(0), remote.at(1000), 4096, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert_eq!(out.lock().unwrap()[0].1, Ok(None));
    assert_eq!(mine.read(1000, 4096), pattern(4, 4096));
    let back = c.btl(0).alloc_mem(4096).unwrap();
    let op = b
        .get(0, remote.at(1000), back.reg().at(0), 4096, None)
        .unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(op) != OpStatus::Pending);
    assert_eq!(back.read(0, 4096), pattern(4, 4096));

    // 50 fetch-adds from the rank itself and 50 from its peer, interleaved,
    // on one word: every value is seen once.
    mine.write(0, &0u64.to_le_bytes());
    for _ in 0..50 {
        c.btl(0)
            .fetch_add(0, remote.at(0), 1, recorder(&out))
            .unwrap();
        c.btl(1)
            .fetch_add(0, remote.at(0), 1, recorder(&out))
            .unwrap();
    }
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 101);
    let mut seen: Vec<u64> = out.lock().unwrap()[1..]
        .iter()
        .map(|(_, r)| r.clone().unwrap().unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
    assert_eq!(mine.read_u64(0), 100);

    // A bad key fails its operation and the loopback's QPs; the next
    // operation goes on fresh ones.
    let forged = RemoteMem {
        rkey: remote.rkey ^ 0x5555,
        ..remote
    };
    out.lock().unwrap().clear();
    let b = c.btl(0);
    b.put(0, src.reg().at(0), forged.at(0), 8, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert!(
        out.lock().unwrap()[0].1.is_err(),
        "{:?}",
        out.lock().unwrap()
    );
    b.compare_swap(0, remote.at(0), 100, 7, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 2);
    assert_eq!(out.lock().unwrap()[1].1, Ok(Some(100)));
    assert_eq!(mine.read_u64(0), 7);
    c.shutdown(LIMIT);
}

#[test]
fn own_memory_through_the_loopback_over_xrc() {
    own_memory_through_the_loopback(SimDevice::ib("sim0"));
}

#[test]
fn own_memory_through_the_loopback_over_rc() {
    own_memory_through_the_loopback(SimDevice::roce("sim0"));
}

#[test]
fn no_loopback_on_iwarp() {
    let mut c = Cluster::new(31, 2, 1, SimDevice::iwarp("sim0"));
    let mine = c.btl(0).alloc_mem(4096).unwrap();
    let err = c
        .btl(0)
        .put(0, mine.reg().at(0), mine.remote().at(64), 8, None)
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    c.shutdown(LIMIT);
}

/// A get lands in user memory registered for local use only: on iWARP
/// the BTL adds the remote write access an RDMA read's sink needs.
fn get_into_local_only_memory(device: SimDevice) {
    let mut c = Cluster::new(23, 2, 1, device);
    let (theirs, remote) = exposed(&mut c, 1, 0, 8192);
    let data = pattern(3, 8192);
    theirs.write(0, &data);
    let buf = MappedBuf::new(8192).unwrap();
    let b = c.btl(0);
    let reg = b
        .register_mem(buf.user_mem(), Access::from_bits(0))
        .unwrap();
    let op = b.get(1, remote.at(0), reg.at(0), 8192, None).unwrap();
    c.run_until(LIMIT, |c| c.btl(0).test(op) != OpStatus::Pending);
    assert_eq!(c.btl(0).test(op), OpStatus::Done);
    assert_eq!(buf.read(0, 8192), data);
    c.shutdown(LIMIT);
}

#[test]
fn a_get_lands_in_local_only_memory_over_xrc() {
    get_into_local_only_memory(SimDevice::ib("sim0"));
}

#[test]
fn a_get_lands_in_local_only_memory_over_iwarp() {
    get_into_local_only_memory(SimDevice::iwarp("sim0"));
}

fn atomics(device: SimDevice) {
    let mut c = Cluster::new(5, 2, 2, device);
    let (theirs, remote) = exposed(&mut c, 3, 0, 4096);
    // Ranks 0 and 1 (one node) both add to one counter on rank 3 (the
    // other node), 50 times each, and ask for the old value.
    let out: Outcomes = Arc::default();
    let counter = remote.at(64);
    for _ in 0..50 {
        for r in [0, 1] {
            c.btl(r).fetch_add(3, counter, 3, recorder(&out)).unwrap();
        }
    }
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 100);
    assert_eq!(theirs.read_u64(64), 300);
    let mut seen: Vec<u64> = out
        .lock()
        .unwrap()
        .iter()
        .map(|(_, r)| r.clone().unwrap().expect("a fetched value"))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..100).map(|i| i * 3).collect::<Vec<_>>(),
        "each saw its own value"
    );
    // Compare-and-swap: one wins.
    out.lock().unwrap().clear();
    for r in [0, 1] {
        c.btl(r)
            .compare_swap(3, counter, 300, 1000 + u64::from(r), recorder(&out))
            .unwrap();
    }
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 2);
    let found: Vec<u64> = out
        .lock()
        .unwrap()
        .iter()
        .map(|(_, r)| r.clone().unwrap().unwrap())
        .collect();
    let now = theirs.read_u64(64);
    assert!(now == 1000 || now == 1001, "{now}");
    assert!(
        found.contains(&300) && found.iter().filter(|&&f| f == 300).count() == 1,
        "{found:?}"
    );
    // A plain add reports nothing back.
    out.lock().unwrap().clear();
    c.btl(0).add(3, remote.at(8), 5, recorder(&out)).unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert_eq!(out.lock().unwrap()[0].1, Ok(None));
    assert_eq!(theirs.read_u64(8), 5);
    // Misaligned, or outside the peer's memory: refused before posting.
    let b = c.btl(0);
    assert!(b.fetch_add(3, remote.at(4), 1, None).is_err());
    assert!(b.fetch_add(3, remote.at(4096), 1, None).is_err());
    // A forged key fails the operation, not the endpoint.
    let forged = RemoteMem {
        rkey: remote.rkey ^ 0x77,
        ..remote
    };
    out.lock().unwrap().clear();
    b.fetch_add(3, forged.at(64), 1, recorder(&out)).unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert!(out.lock().unwrap()[0].1.is_err());
    assert_eq!(theirs.read_u64(64), now);
    b.send(3, TAG, &[], b"still here").unwrap();
    c.run_until(LIMIT, |c| c.got(3).iter().any(|g| g.data == b"still here"));
    // On user memory the peer registered, across a remap of it.
    let mut buf = MappedBuf::new(4096).unwrap();
    let peer = c.btl(3);
    let reg = peer
        .register_mem(buf.user_mem(), Access::REMOTE_ATOMIC)
        .unwrap();
    out.lock().unwrap().clear();
    b.fetch_add(3, reg.remote().at(16), 9, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert_eq!(out.lock().unwrap()[0].1, Ok(Some(0)));
    assert_eq!(buf.read(16, 8), 9u64.to_le_bytes());
    peer.deregister_mem(reg).unwrap();
    buf.remap().unwrap();
    buf.write(16, &100u64.to_le_bytes());
    let reg = peer
        .register_mem(buf.user_mem(), Access::REMOTE_ATOMIC)
        .unwrap();
    b.compare_swap(3, reg.remote().at(16), 100, 5, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 2);
    assert_eq!(
        out.lock().unwrap()[1].1,
        Ok(Some(100)),
        "the new pages were reached"
    );
    assert_eq!(buf.read(16, 8), 5u64.to_le_bytes());
    peer.deregister_mem(reg).unwrap();
    c.shutdown(LIMIT);
}

#[test]
fn atomics_over_xrc() {
    atomics(SimDevice::ib("sim0"));
}

#[test]
fn atomics_over_rc() {
    atomics(SimDevice::roce("sim0"));
}

#[test]
fn atomics_are_unsupported_where_the_device_has_none() {
    let mut c = Cluster::new(5, 2, 1, SimDevice::iwarp("sim0"));
    let (_theirs, remote) = exposed(&mut c, 1, 0, 4096);
    let b = c.btl(0);
    assert!(!b.caps().atomics);
    assert!(matches!(
        b.fetch_add(1, remote.at(0), 1, None),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        b.compare_swap(1, remote.at(0), 1, 2, None),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        b.add(1, remote.at(0), 1, None),
        Err(Error::Unsupported(_))
    ));
    let buf = MappedBuf::new(4096).unwrap();
    assert!(matches!(
        b.register_mem(buf.user_mem(), Access::REMOTE_ATOMIC),
        Err(Error::Unsupported(_))
    ));
    c.shutdown(LIMIT);
}

#[test]
fn header_and_payload_are_gathered_in_every_combination() {
    let mut c = Cluster::new(2, 2, 1, SimDevice::ib("sim0"));
    let b = c.btl(0);
    let max = b.max_send_size();
    let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (vec![], vec![]),
        (b"h".to_vec(), vec![]),
        (vec![], b"p".to_vec()),
        (pattern(1, 56), pattern(2, 8)),
        (pattern(3, 56), pattern(4, 4000)),
        (pattern(5, 100), pattern(6, max - 100)),
    ];
    for (i, (h, p)) in cases.iter().enumerate() {
        if i % 2 == 0 {
            b.send(1, TAG, h, p).unwrap();
        } else {
            while !b.sendi(1, TAG, h, p).unwrap() {
                c.step();
            }
        }
        c.run_until(LIMIT, |c| c.got_count(1) == i + 1);
        assert_eq!(
            c.got(1)[i].data,
            [h.as_slice(), p.as_slice()].concat(),
            "case {i}"
        );
    }
    c.shutdown(LIMIT);
}

#[test]
fn callbacks_send_add_endpoints_and_progress_from_inside() {
    let mut c = Cluster::new(3, 3, 1, SimDevice::ib("sim0"));
    // Rank 0 forgets rank 2; rank 1 then tells it where rank 2 is, and
    // rank 0 adds it from inside the callback and greets it there.
    let b0 = c.btl(0);
    b0.del_procs(&[2]);
    assert!(b0.send(2, TAG, &[], b"early").is_err());
    let p2 = {
        let b2 = c.btl(2);
        Peer {
            rank: 2,
            node: 2,
            addr: b2.listen_addr().unwrap(),
            ib: None,
            receive: Some(b2.receive()),
        }
    };
    b0.register_am(40, |btl, m| {
        let addr = std::str::from_utf8(m.data).unwrap().parse().unwrap();
        btl.add_procs(&[Peer {
            rank: 2,
            node: 2,
            addr,
            ib: None,
            receive: None,
        }])
        .unwrap();
        btl.send(2, TAG, b"hello from ", b"a callback").unwrap();
        // Progress from inside a callback polls but cannot run this
        // callback again.
        btl.progress();
    });
    let echoes = Arc::new(AtomicU64::new(0));
    let e = echoes.clone();
    // Rank 2 answers every greeting from inside its callback.
    c.btl(2).register_am(TAG, move |btl, m| {
        btl.send(m.src, 41, b"re: ", m.data).unwrap();
    });
    b0.register_am(41, move |_, m| {
        assert_eq!(m.data, b"re: hello from a callback");
        e.fetch_add(1, Ordering::Relaxed);
    });
    c.btl(1)
        .send(0, 40, p2.addr.to_string().as_bytes(), &[])
        .unwrap();
    c.run_until(LIMIT, |_| echoes.load(Ordering::Relaxed) == 1);
    let s = c.btl(0).stats();
    assert_eq!(s.unhandled, 0, "{s:?}");
    c.shutdown(LIMIT);
}

#[test]
fn every_operation_runs_its_callback_once_with_no_lock_held() {
    let mut c = Cluster::new(9, 2, 1, SimDevice::ib("sim0"));
    let (_theirs, remote) = exposed(&mut c, 1, 0, 1 << 20);
    let mine = c.btl(0).alloc_mem(1 << 20).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let mk = |calls: &Arc<AtomicU64>| -> Option<xrcbtl_btl::OnDone<SimContext>> {
        let calls = calls.clone();
        Some(Box::new(move |btl: &Btl<SimContext>, _, r: OpResult| {
            assert!(r.is_ok(), "{r:?}");
            // The BTL is callable from here: nothing of it is locked.
            let _ = btl.stats();
            btl.send(1, TAG, b"from a completion", &[]).unwrap();
            calls.fetch_add(1, Ordering::Relaxed);
        }))
    };
    let b = c.btl(0);
    b.put(1, mine.reg().at(0), remote.at(0), 1 << 20, mk(&calls))
        .unwrap();
    b.get(1, remote.at(0), mine.reg().at(0), 4096, mk(&calls))
        .unwrap();
    b.fetch_add(1, remote.at(0), 1, mk(&calls)).unwrap();
    b.send_bytes(
        1,
        TAG,
        xrcbtl_btl::Bytes::from(pattern(1, 200_000)),
        mk(&calls),
    )
    .unwrap();
    b.send_bytes(1, TAG, xrcbtl_btl::Bytes::from(pattern(1, 20)), mk(&calls))
        .unwrap();
    c.run_until(LIMIT, |_| calls.load(Ordering::Relaxed) == 5);
    c.settle(LIMIT);
    assert_eq!(calls.load(Ordering::Relaxed), 5);
    let from_completions = c
        .got(1)
        .iter()
        .filter(|g| g.data == b"from a completion")
        .count();
    assert_eq!(from_completions, 5);
    c.shutdown(LIMIT);
}

/// An atomic is not idempotent: one whose connection breaks before its
/// answer came may have been executed, and must not be executed again on
/// the next connection. The request reaches rank 1, the link then goes
/// down both ways (the answer is lost), the QP gives up, the link heals:
/// the counter moved by one add, not two, and the operation failed (its
/// outcome unknown to the sender) instead of reporting a value. Over XRC
/// and RC + SRQ (iWARP has no atomics).
#[test]
fn an_atomic_whose_answer_was_lost_is_not_executed_twice() {
    for (device, force_rc) in [
        (SimDevice::ib("sim0"), false),
        (SimDevice::roce("sim0"), true),
    ] {
        let mut c = Cluster::with(8, 2, 1, device, |cfg: &mut xrcbtl_btl::BtlConfig| {
            cfg.force_rc = force_rc
        });
        let (theirs, remote) = exposed(&mut c, 1, 0, 4096);
        let out: Outcomes = Arc::default();
        // Connected, and one add through to set the counter.
        c.btl(0)
            .fetch_add(1, remote.at(0), 10, recorder(&out))
            .unwrap();
        c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
        assert_eq!(theirs.read_u64(0), 10);
        out.lock().unwrap().clear();
        c.btl(0)
            .fetch_add(1, remote.at(0), 1, recorder(&out))
            .unwrap();
        // Until the request has been executed there (the answer is on
        // its way back), then cut.
        c.run_until(LIMIT, |_| theirs.read_u64(0) == 11);
        c.sim.partition(0, 1);
        c.advance(Duration::from_secs(3));
        c.sim.heal(0, 1);
        c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
        c.settle(LIMIT);
        assert_eq!(theirs.read_u64(0), 11, "the add was executed twice");
        let r = out.lock().unwrap()[0].1.clone();
        assert!(r.is_err(), "{r:?}");
        // The pair goes on: a new atomic works.
        out.lock().unwrap().clear();
        c.btl(0)
            .fetch_add(1, remote.at(0), 1, recorder(&out))
            .unwrap();
        c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
        assert_eq!(out.lock().unwrap()[0].1, Ok(Some(11)));
        c.shutdown(LIMIT);
    }
}

/// On iWARP a write to a key the peer refuses ends the connection with a
/// TERMINATE that names no culprit, and everything in flight on it is
/// flushed. Posted again each time, the write would break every new
/// connection too, and the work behind it (here the reads of a rendezvous)
/// would give up with it. The user's operation fails at the second break
/// instead, and the rendezvous completes.
#[test]
fn on_iwarp_a_write_the_peer_refuses_does_not_take_the_connection_down_for_good() {
    // Get: the receiver reads, on the connection the bad write takes.
    let mut c = Cluster::with(5, 2, 1, SimDevice::iwarp("sim0"), |cfg| {
        cfg.rndv_protocol = xrcbtl_btl::RndvProtocol::Get;
    });
    let (_theirs, remote) = exposed(&mut c, 1, 0, 64 * 1024);
    let forged = RemoteMem {
        rkey: remote.rkey ^ 0x77,
        ..remote
    };
    let data = pattern(3, 4_000_000);
    c.btl(1)
        .send_bytes(0, TAG, xrcbtl_btl::Bytes::from(data.clone()), None)
        .unwrap();
    // Once rank 0 has posted its first reads, the bad write goes behind
    // them.
    c.run_until(LIMIT, |c| c.btl(0).stats().rdma_frags > 0);
    let b = c.btl(0);
    let src = b.alloc_mem(40_000).unwrap();
    let out: Outcomes = Arc::default();
    b.put(1, src.reg().at(0), forged.at(0), 40_000, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |c| {
        out.lock().unwrap().len() == 1 && c.got(0).iter().any(|g| g.data == data)
    });
    assert_eq!(
        c.got(0).iter().filter(|g| g.data == data).count(),
        1,
        "the rendezvous behind the bad write was delivered once"
    );
    let r = out.lock().unwrap()[0].1.clone();
    assert_eq!(
        r,
        Err(xrcbtl_btl::BtlError::Transfer(
            xrcbtl_fabric::WcStatus::WrFlush
        ))
    );
    // Two breaks' worth: the reads in flight at each, and the write once.
    assert!(
        b.stats().retransmits <= 20,
        "the bad write was posted again and again: {:?}",
        b.stats()
    );
    b.send(1, TAG, &[], b"still here").unwrap();
    c.run_until(LIMIT, |c| c.got(1).iter().any(|g| g.data == b"still here"));
    c.shutdown(LIMIT);
}

/// On iWARP a write completes once it has left, placed or not, and a peer
/// that refuses its key says so only by ending the connection. A landed put
/// completes once its data has landed (a read follows the write: of
/// nothing, or of the target's first byte where the caller says it is
/// readable), and one the peer refuses fails, however small, while the
/// connection after it carries on.
#[test]
fn on_iwarp_a_put_completes_once_landed_and_a_refused_one_fails() {
    let mut c = Cluster::with(6, 2, 1, SimDevice::iwarp("sim0"), |_| {});
    let (theirs, remote) = exposed(&mut c, 1, 0, 64 * 1024);
    let b = c.btl(0);
    let src = b.alloc_mem(8192).unwrap();
    let put = |c: &mut Cluster, at: RemoteMem, len: usize, readable: bool| {
        let out: Outcomes = Arc::default();
        c.btl(0)
            .put_landed(1, src.reg().at(0), at.at(0), len, readable, recorder(&out))
            .unwrap();
        c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
        let r = out.lock().unwrap()[0].1.clone();
        r
    };
    let refused = Err(xrcbtl_btl::BtlError::Transfer(
        xrcbtl_fabric::WcStatus::WrFlush,
    ));
    for readable in [false, true] {
        for (i, len) in [1usize, 64, 8192].into_iter().enumerate() {
            let data = pattern(i as u32 + 1, len);
            src.write(0, &data);
            assert_eq!(
                put(&mut c, remote, len, readable),
                Ok(None),
                "{len} B, readable: {readable}"
            );
            assert_eq!(
                theirs.read(0, len),
                data,
                "{len} B landed by the put's completion (readable: {readable})"
            );
        }
        let forged = RemoteMem {
            rkey: remote.rkey ^ 0x77,
            ..remote
        };
        assert_eq!(
            put(&mut c, forged, 8, readable),
            refused,
            "an 8-byte write the peer refused, gone before the refusal"
        );
        let data = pattern(9, 100);
        src.write(0, &data);
        assert_eq!(
            put(&mut c, remote, 100, readable),
            Ok(None),
            "good work after it"
        );
        assert_eq!(theirs.read(0, 100), data);
    }
    // A window the peer lets this rank write but not read: an empty fence
    // passes; a one-byte fence reads, and is refused.
    let buf = MappedBuf::new(4096).unwrap();
    let reg = c
        .btl(1)
        .register_mem(buf.user_mem(), Access::REMOTE_WRITE)
        .unwrap();
    let write_only = reg.remote();
    assert_eq!(put(&mut c, write_only, 64, false), Ok(None));
    assert_eq!(buf.read(0, 64), src.read(0, 64));
    assert_eq!(
        put(&mut c, write_only, 64, true),
        refused,
        "a one-byte fence from a target the peer does not let this rank read"
    );
    assert_eq!(
        put(&mut c, remote, 100, true),
        Ok(None),
        "good work after it"
    );
    c.btl(1).deregister_mem(reg).unwrap();
    c.shutdown(LIMIT);
}

/// An exact registration is a device region of just the bytes asked for:
/// a peer reaches them, and one byte past them (inside their last page,
/// which a cached registration would cover) is refused. It bypasses the
/// cache, and is given back once.
#[test]
fn an_exact_registration_lets_peers_reach_its_bytes_and_no_more() {
    let mut c = Cluster::new(22, 2, 1, SimDevice::ib("sim0"));
    let buf = MappedBuf::new(8192).unwrap();
    let b1 = c.btl(1);
    let misses = b1.rcache_stats().misses;
    let mem = buf.user_mem().slice(100, 1000).unwrap();
    let reg = b1
        .register_exact(mem, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(b1.rcache_stats().misses, misses, "not through the cache");
    let remote = reg.remote();
    let b0 = c.btl(0);
    let src = b0.alloc_mem(4096).unwrap();
    src.write(0, &pattern(3, 1000));
    let out: Outcomes = Arc::default();
    b0.put(1, src.reg().at(0), remote.at(0), 1000, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert_eq!(out.lock().unwrap()[0].1, Ok(None));
    assert_eq!(buf.read(100, 1000), pattern(3, 1000), "its bytes, reached");
    // The handle itself refuses a range past the end; a peer that forges
    // one meets the device's check.
    let past = RemoteMem {
        len: 1001,
        ..remote
    };
    out.lock().unwrap().clear();
    b0.put(1, src.reg().at(0), past.at(1000), 1, recorder(&out))
        .unwrap();
    c.run_until(LIMIT, |_| out.lock().unwrap().len() == 1);
    assert!(
        out.lock().unwrap()[0].1.is_err(),
        "one byte past the registration, inside its page"
    );
    assert_eq!(buf.read(1100, 1), [0], "nothing landed there");
    b1.deregister_mem(reg).unwrap();
    assert!(b1.deregister_mem(reg).is_err(), "given back once");
    c.shutdown(LIMIT);
}
