//! The memory monitor's thread lives exactly as long as someone uses the
//! monitor: a library unloaded from a process (an Open MPI component) must
//! leave no thread behind. Alone in its test binary, so that no other test
//! holds the monitor.

use std::sync::Arc;

use xrcbtl_fabric::MemMonitor;

/// Threads of this process named like the monitor's.
fn monitor_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("procfs")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "xrcbtl-memmon")
        .count()
}

/// The count once it reaches `want`, or whatever it is after five seconds: a
/// new thread names itself once it runs, so its name shows up a little after
/// the spawn returns, and a joined thread's task can outlive the join by a
/// moment.
fn settle(want: usize) -> usize {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let n = monitor_threads();
        if n == want || std::time::Instant::now() > until {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn the_monitor_thread_ends_with_its_last_user() {
    assert_eq!(monitor_threads(), 0);
    let m = MemMonitor::acquire().expect("userfaultfd on this machine");
    let again = MemMonitor::acquire().expect("the same monitor");
    assert!(Arc::ptr_eq(&m, &again), "one monitor per process at a time");
    assert_eq!(settle(1), 1);
    let sub = m.subscribe().expect("a subscriber");
    drop(m);
    drop(again);
    assert_eq!(settle(1), 1, "a subscriber keeps the monitor");
    drop(sub);
    assert_eq!(settle(0), 0, "joined with its last user");

    // A later user starts a fresh monitor that works.
    let m = MemMonitor::acquire().expect("a new monitor");
    let mut sub = m.subscribe().expect("a subscriber");
    let len = 4096;
    // SAFETY: a fresh anonymous page, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    m.watch(p as usize, len).expect("watch");
    // SAFETY: our own mapping.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    let mut got = Vec::new();
    assert!(sub.drain(&mut got));
    assert_eq!(got.len(), 1, "{got:?}");
    drop((m, sub));
    assert_eq!(settle(0), 0);
}
