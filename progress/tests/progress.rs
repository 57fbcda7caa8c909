//! The progress pieces on their own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrcbtl_progress::*;

#[test]
fn slab_ids_find_their_request_once_and_never_a_reused_slot() {
    let mut s = WrSlab::new();
    let a = s.insert("a");
    let b = s.insert("b");
    assert_ne!(a, b);
    assert_eq!(a >> 62, 0, "the top two bits stay free");
    assert_eq!(s.get(a), Some(&"a"));
    assert_eq!(s.remove(a), Some("a"));
    assert_eq!(s.remove(a), None, "a completion is taken once");
    let c = s.insert("c");
    assert_eq!(c & 0xFFFF_FFFF, a & 0xFFFF_FFFF, "the slot is reused");
    assert_ne!(c, a, "with a new generation");
    assert_eq!(s.get(a), None, "the old id does not find the new request");
    *s.get_mut(c).unwrap() = "c2";
    assert_eq!(s.len(), 2);
    let taken = s.extract(|v| v.starts_with('c'));
    assert_eq!(taken, vec![(c, "c2")]);
    assert_eq!(s.iter().map(|(_, v)| *v).collect::<Vec<_>>(), vec!["b"]);
    assert_eq!(s.remove(b), Some("b"));
    assert!(s.is_empty());
    assert_eq!(s.get(u64::MAX), None);
}

#[test]
fn batches_are_bounded() {
    let mut b: Batch<u32> = Batch::new(4);
    let mut source: Vec<u32> = (0..10).collect();
    let mut seen = Vec::new();
    loop {
        let got = b
            .poll::<()>(|out| {
                let n = out.len().min(source.len());
                out[..n].copy_from_slice(&source[..n]);
                source.drain(..n);
                Ok(n)
            })
            .unwrap();
        assert!(got.len() <= 4);
        if got.is_empty() {
            break;
        }
        seen.extend_from_slice(got);
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!(b.poll(|_| Err::<usize, _>("cq overrun")), Err("cq overrun"));
}

#[test]
fn the_thread_progresses_blocks_when_idle_and_stops() {
    let work = Arc::new(AtomicUsize::new(100));
    let done = Arc::new(AtomicUsize::new(0));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let (w, d, ws) = (work.clone(), done.clone(), waits.clone());
    let mut t = ProgressThread::spawn(
        "test-progress",
        ThreadConfig {
            spins: 8,
            block: Duration::from_millis(2),
        },
        move || {
            if w.load(Ordering::Relaxed) > 0 {
                w.fetch_sub(1, Ordering::Relaxed);
                d.fetch_add(1, Ordering::Relaxed);
                1
            } else {
                0
            }
        },
        move |timeout| {
            ws.lock().unwrap().push(timeout);
            std::thread::sleep(timeout);
        },
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while t.blocks() < 3 {
        assert!(std::time::Instant::now() < deadline, "never blocked");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        done.load(Ordering::Relaxed),
        100,
        "all work done before blocking"
    );
    assert!(t.calls() >= 100 + 3 * 8);
    t.stop();
    let blocks = t.blocks();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(t.blocks(), blocks, "stopped");
    assert!(waits
        .lock()
        .unwrap()
        .iter()
        .all(|d| *d == Duration::from_millis(2)));
}
