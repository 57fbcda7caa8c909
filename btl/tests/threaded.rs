//! BTLs driven by several threads on the simulated fabric, with its causal
//! clock (time moves only while no process has unpolled events, so a slow
//! thread never sees its peers' timers run out): a progress thread that
//! delivers while the application thread only sends, and blocks when idle;
//! and a stress test with two threads per rank that send, progress, and
//! re-enter the BTL from callbacks at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{Btl, ThreadConfig, Threaded};
use xrcbtl_fabric::sim::{SimContext, SimDevice};

type Inbox = Arc<Mutex<Vec<(u32, Vec<u8>)>>>;

/// `n` ranks, one per node, each in its own process, on a causal clock
/// (the job's manual clock is for one thread stepping every rank).
fn ranks(seed: u64, n: u32, dev: SimDevice) -> (SimJob, Vec<Arc<Btl<SimContext>>>) {
    let job = SimJob::new(seed, n as usize, 1, dev).unwrap();
    job.sim.set_auto_advance(true);
    job.sim.set_causal(true);
    let btls = (0..n).map(|r| job.peek(r).clone()).collect();
    (job, btls)
}

fn inbox(b: &Btl<SimContext>, tag: u8) -> Inbox {
    let inbox: Inbox = Arc::default();
    let i = inbox.clone();
    b.register_am(tag, move |_, m| {
        i.lock().unwrap().push((m.src, m.data.to_vec()))
    });
    inbox
}

/// What the application thread of rank 1 does while it waits: poll now
/// and then.
fn idle_step(one: &Arc<Btl<SimContext>>) -> impl FnMut() + '_ {
    move || {
        one.progress();
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[track_caller]
fn until(what: &str, mut step: impl FnMut(), done: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < end, "timed out: {what}");
        step();
    }
}

#[test]
fn a_threaded_btl_delivers_both_ways_and_blocks_when_idle() {
    let (_job, btls) = ranks(7, 2, SimDevice::ib("sim0"));
    let inboxes: Vec<Inbox> = btls.iter().map(|b| inbox(b, 5)).collect();
    let one = btls[1].clone();
    let cfg = ThreadConfig {
        spins: 32,
        block: Duration::from_millis(1),
    };
    let zero = Threaded::spawn(btls[0].clone(), "xrcbtl-progress-0", cfg).unwrap();
    const N: u32 = 200;
    for i in 0..N {
        one.send(0, 5, &i.to_le_bytes(), &[]).unwrap();
    }
    until(
        "rank 0 receives",
        || {
            one.progress();
        },
        || inboxes[0].lock().unwrap().len() == N as usize,
    );
    // Rank 0's application thread only sends; its thread does the rest.
    for i in 0..N {
        zero.btl()
            .send(1, 5, &(i + 1000).to_le_bytes(), &[])
            .unwrap();
    }
    until(
        "rank 1 receives",
        || {
            one.progress();
        },
        || inboxes[1].lock().unwrap().len() == N as usize,
    );
    let order = |inbox: &Inbox, base: u32| {
        let got: Vec<u32> = inbox
            .lock()
            .unwrap()
            .iter()
            .map(|(_, d)| u32::from_le_bytes(d[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got, (base..base + N).collect::<Vec<_>>());
    };
    order(&inboxes[0], 0);
    order(&inboxes[1], 1000);
    // Idle now: the thread spins `spins` calls, then blocks, again and
    // again. (Rank 1 goes on polling, as a live process does: the causal
    // clock waits for every process.)
    until("the idle thread blocks", idle_step(&one), || {
        zero.blocks() > 10
    });
    let (c0, b0) = (zero.calls(), zero.blocks());
    until("it blocks more", idle_step(&one), || {
        zero.blocks() > b0 + 20
    });
    let (c1, b1) = (zero.calls(), zero.blocks());
    let per_block = (c1 - c0) as f64 / (b1 - b0) as f64;
    // `spins` empty calls, then a block; a call that found work (rank 1's
    // polls make some) starts the count again.
    assert!(
        per_block <= 2.0 * f64::from(cfg.spins + 1),
        "an idle thread made {per_block:.1} calls per block (spins {})",
        cfg.spins
    );
    let zero = zero.stop();
    // Asking covers the sends that went unsignalled; their completion
    // makes it idle.
    until(
        "rank 0 is idle",
        || {
            zero.progress();
            one.progress();
        },
        || zero.is_idle(),
    );
    zero.shutdown();
    one.shutdown();
    until(
        "a clean exit",
        || {
            zero.progress();
            one.progress();
        },
        || zero.is_drained() && one.is_drained(),
    );
}

/// Two ranks, two threads each: every thread sends to the other rank and
/// progresses its own; a callback answers every tenth message from inside
/// the callback, and now and then calls progress from inside it. Every
/// message arrives exactly once, each thread's in the order it sent them,
/// short ones (copied out and handed straight over) and longer ones (read
/// in place, often queued behind others) alike, and no two callbacks of a
/// rank ever run at once.
/// Where events cost system calls (`dev.costly_events`), then waits until
/// every rank's idle threads poll without the core's lock, and pings rank
/// 1 until a quiet poll finds a message: returns how many did.
fn stress(dev: SimDevice, seed: u64) -> u64 {
    let costly = dev.costly_events;
    const PER_THREAD: u32 = 400;
    const THREADS: u32 = 2;
    let (_job, btls) = ranks(seed, 2, dev);
    let got: Vec<Inbox> = btls.iter().map(|b| inbox(b, 3)).collect();
    let replies: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::default()).collect();
    for (r, b) in btls.iter().enumerate() {
        let rep = replies[r].clone();
        // Every tenth message is answered from inside the callback.
        let seen = Arc::new(AtomicU64::new(0));
        let g = got[r].clone();
        let inside = AtomicBool::new(false);
        b.register_am(3, move |btl, m| {
            assert!(!inside.swap(true, Ordering::SeqCst), "callbacks overlap");
            g.lock().unwrap().push((m.src, m.data.to_vec()));
            let n = seen.fetch_add(1, Ordering::Relaxed);
            if n % 10 == 0 {
                btl.send(m.src, 4, b"re", &m.data[..8]).unwrap();
            }
            if n % 25 == 0 {
                // Re-entrant progress polls but delivers nothing now.
                btl.progress();
            }
            inside.store(false, Ordering::SeqCst);
        });
        b.register_am(4, move |_, _| {
            rep.fetch_add(1, Ordering::Relaxed);
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for r in 0..2u32 {
        for t in 0..THREADS {
            let b = btls[r as usize].clone();
            let stop = stop.clone();
            handles.push(std::thread::spawn(move || {
                for i in 0..PER_THREAD {
                    let mut msg = [0u8; 8];
                    msg[..4].copy_from_slice(&t.to_le_bytes());
                    msg[4..].copy_from_slice(&i.to_le_bytes());
                    // Some gathered, some at once, some through the queue.
                    match i % 3 {
                        0 => b.send(1 - r, 3, &msg[..4], &msg[4..]).unwrap(),
                        1 => {
                            if !b.sendi(1 - r, 3, &msg, &[]).unwrap() {
                                b.send(1 - r, 3, &msg, &[]).unwrap();
                            }
                        }
                        // Longer than a body copied out (64 bytes).
                        _ => b.send(1 - r, 3, &msg, &[b'-'; 100]).unwrap(),
                    }
                    b.progress();
                }
                while !stop.load(Ordering::Relaxed) {
                    b.progress();
                }
            }));
        }
    }
    let total = (THREADS * PER_THREAD) as usize;
    let end = Instant::now() + Duration::from_secs(120);
    while !(got.iter().all(|g| g.lock().unwrap().len() == total)
        && replies
            .iter()
            .all(|r| r.load(Ordering::Relaxed) as usize == total / 10))
    {
        assert!(
            Instant::now() < end,
            "timed out: got {:?}, replies {:?}\n{:?}\n{:?}",
            got.iter()
                .map(|g| g.lock().unwrap().len())
                .collect::<Vec<_>>(),
            replies,
            btls[0].stats(),
            btls[1].stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut found = 0;
    if costly {
        // Idle, each rank's spinning threads go quiet: they poll without
        // the core's lock.
        until(
            "every rank polls without the lock",
            || std::thread::sleep(Duration::from_millis(1)),
            || btls.iter().all(|b| b.stats().unlocked_polls > 0),
        );
        // A message to a quiet rank is found by a quiet poll, which hands
        // it over under the lock (or, now and then, by a control look:
        // then another goes).
        let quiet_found = |b: &Btl<SimContext>| {
            let s = b.stats();
            s.quiet_polls - s.unlocked_polls
        };
        let before = quiet_found(&btls[1]);
        let pings = inbox(&btls[1], 5);
        let mut sent = 0;
        until(
            "a quiet poll finds a message",
            || {
                if pings.lock().unwrap().len() == sent {
                    btls[0].send(1, 5, b"ping", &[]).unwrap();
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            },
            || quiet_found(&btls[1]) > before,
        );
        found = quiet_found(&btls[1]) - before;
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    for (r, g) in got.iter().enumerate() {
        let g = g.lock().unwrap();
        for t in 0..THREADS {
            let seq: Vec<u32> = g
                .iter()
                .filter(|(_, d)| u32::from_le_bytes(d[..4].try_into().unwrap()) == t)
                .map(|(src, d)| {
                    assert_eq!(*src, 1 - r as u32);
                    u32::from_le_bytes(d[4..8].try_into().unwrap())
                })
                .collect();
            assert_eq!(
                seq,
                (0..PER_THREAD).collect::<Vec<_>>(),
                "rank {r} from thread {t}"
            );
        }
        let s = btls[r].stats();
        assert_eq!(
            (s.duplicates, s.out_of_order, s.malformed),
            (0, 0, 0),
            "{s:?}"
        );
    }
    found
}

#[test]
fn two_threads_per_rank_send_progress_and_reenter_without_loss_or_reordering() {
    for seed in 1..4 {
        stress(SimDevice::ib("sim0"), seed);
        stress(SimDevice::iwarp("sim0"), seed);
    }
}

/// As above, on devices whose events cost system calls: progress calls
/// are often quiet, and four threads poll the receive CQs without the
/// core's lock ([`Btl::progress`]'s quiet path), handing what they found
/// over under it.
#[test]
fn quiet_progress_from_two_threads_per_rank_loses_and_reorders_nothing() {
    for seed in 1..4 {
        for mut dev in [SimDevice::ib("sim0"), SimDevice::iwarp("sim0")] {
            dev.costly_events = true;
            assert!(stress(dev, seed) > 0);
        }
    }
}

/// Registers for `tag` a callback that panics on its first message and
/// keeps the first byte of each one after it, in the returned list.
fn panics_once_then_keeps(btl: &Btl<SimContext>, tag: u8) -> Arc<Mutex<Vec<u8>>> {
    let got: Arc<Mutex<Vec<u8>>> = Arc::default();
    let first = AtomicBool::new(true);
    let g = got.clone();
    btl.register_am(tag, move |_, m| {
        if first.swap(false, Ordering::SeqCst) {
            panic!("the user's callback panics (expected by this test)");
        }
        g.lock().unwrap().push(m.data[0]);
    });
    got
}

/// A callback that panics leaves the BTL working: the panic reaches the
/// caller of progress, and the next messages, short (copied out) and
/// longer (read in place), still arrive, in order.
#[test]
fn a_callback_that_panics_once_does_not_wedge_the_btl() {
    for len in [8usize, 100] {
        let job = SimJob::new(1, 2, 1, SimDevice::ib("sim0")).unwrap();
        job.sim.set_auto_advance(true);
        let (a, b) = (job.peek(0).clone(), job.peek(1).clone());
        let got = panics_once_then_keeps(&b, 3);
        let pad = vec![0u8; len - 1];
        for i in 0..20u8 {
            a.send(1, 3, &[i], &pad).unwrap();
        }
        let mut panics = 0;
        for _ in 0..100_000 {
            if got.lock().unwrap().len() == 19 {
                break;
            }
            a.progress();
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.progress())).is_err() {
                panics += 1;
            }
        }
        assert_eq!(panics, 1, "{len} bytes");
        assert_eq!(
            *got.lock().unwrap(),
            (1..20).collect::<Vec<u8>>(),
            "{len} bytes"
        );
    }
}

/// The deliveries queued behind a callback that panics are run by the
/// next progress call, also when that call could be quiet: the panic
/// raises the slow-work word. (Before, the calls after the panic polled
/// the empty receive CQ alone and left the queue to the next control
/// look, many calls later.) Messages to itself: all are queued at once.
#[test]
fn deliveries_queued_behind_a_panicking_callback_run_on_the_next_call() {
    for costly in [false, true] {
        let mut dev = SimDevice::ib("sim0");
        dev.costly_events = costly;
        let mut job = SimJob::new(1, 1, 1, dev).unwrap();
        let btl = job.btl(0).clone();
        let got = panics_once_then_keeps(&btl, 3);
        // Settled: the calls from here on may be quiet.
        for _ in 0..50 {
            btl.progress();
        }
        for i in 0..5u8 {
            btl.send(0, 3, &[i], &[]).unwrap();
        }
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| btl.progress()));
        assert!(
            caught.is_err(),
            "costly events {costly}: the first callback panics"
        );
        btl.progress();
        assert_eq!(
            *got.lock().unwrap(),
            vec![1, 2, 3, 4],
            "costly events {costly}: the messages behind the panic, one call later"
        );
    }
}

/// A callback that panics on a message read in place (longer than a
/// short body) still gives its receive buffer back: on iWARP, where each
/// buffer holds a credit its sender spent, 40 such panics in a row would
/// otherwise leave the sender without credits after 16 and the rest of
/// the messages unsent.
#[test]
fn a_panicking_callback_gives_its_receive_buffer_back() {
    let job = SimJob::new(1, 2, 1, SimDevice::iwarp("sim0")).unwrap();
    job.sim.set_auto_advance(true);
    let (a, b) = (job.peek(0).clone(), job.peek(1).clone());
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    b.register_am(3, move |_, _| {
        c.fetch_add(1, Ordering::SeqCst);
        panic!("the user's callback panics (expected by this test)");
    });
    let body = vec![7u8; 200];
    for _ in 0..40 {
        a.send(1, 3, &[], &body).unwrap();
    }
    let mut panics = 0;
    for _ in 0..200_000 {
        if calls.load(Ordering::SeqCst) == 40 {
            break;
        }
        a.progress();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.progress())).is_err() {
            panics += 1;
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 40, "{}", a.busy());
    assert_eq!(panics, 40);
}
