//! In steady state, eager sends, eager receives and `sendi` make no heap
//! allocation: counted by a global allocator that counts this thread's
//! allocations outside the simulated device (which stands for a device's
//! own work), over thousands of round trips on every transport after a
//! warm-up that connects and fills the BTL's pools.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_fabric::sim::{CountingAlloc, SimDevice};

#[path = "util/pingpong.rs"]
mod pingpong;
use pingpong::{Back, PingPong};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const TAG: u8 = 5;

/// Round trips of `payload` after an 8-byte header, as an MPI library
/// sends them, by `send` one way and `sendi` (or `send` when it cannot
/// go at once) back.
fn steady_state_allocates_nothing(device: SimDevice) {
    let label = format!("{} ({})", device.name, device.caps.transport);
    let pp = PingPong::new(device, TAG);
    let header = [0x11u8; 8];
    for len in [0usize, 8, 100, 4000] {
        let payload = vec![0x22u8; len];
        // Connect and fill the pools.
        pp.round_trips(TAG, 300, &header, &payload, Back::Sendi);
        let (_, n) =
            CountingAlloc::count(|| pp.round_trips(TAG, 2000, &header, &payload, Back::Sendi));
        assert_eq!(
            n, 0,
            "{label}: {n} allocations in 2000 round trips of {len} bytes"
        );
    }
    let [a, b] = &pp.btls;
    let s = a.stats();
    assert!(s.inline_sent > 0 && s.eager_sent >= 4 * 2300, "{s:?}");
    assert_eq!(s.spilled, 0, "{s:?}");
    a.shutdown();
    b.shutdown();
    while !(a.is_drained() && b.is_drained()) {
        a.progress();
        b.progress();
    }
}

#[test]
fn eager_send_receive_and_sendi_allocate_nothing_over_xrc() {
    steady_state_allocates_nothing(SimDevice::ib("sim0"));
}

#[test]
fn eager_send_receive_and_sendi_allocate_nothing_over_rc() {
    steady_state_allocates_nothing(SimDevice::roce("sim0"));
}

#[test]
fn eager_send_receive_and_sendi_allocate_nothing_over_iwarp() {
    steady_state_allocates_nothing(SimDevice::iwarp("sim0"));
}

#[test]
fn the_counter_sees_an_allocation() {
    let (v, n) = CountingAlloc::count(|| vec![1u8; 100]);
    assert_eq!(v.len(), 100);
    assert!(n >= 1, "the counting allocator counts");
}

/// A window of 64 rendezvous of 64 KiB in flight at once, as osu_bw
/// sends: once one window has gone, the next finds every sink the
/// receiver needs, and its registration, in the BTL's pool (it used to
/// keep 4 per size, so 60 sinks of every window were allocated, zeroed and
/// registered again).
#[test]
fn a_window_of_rendezvous_reuses_its_sinks_and_registrations() {
    windows_reuse_sinks(&[], 64 * 1024);
}

/// After windows of a smaller size (as an OSU run goes through its sizes),
/// the pool makes room for the size in use now: the smaller sinks must not
/// hold on to its budget (64 MiB, or what the registration cache may keep
/// under the locked-memory limit: 8 MiB here, where 64 sinks of 128 KiB
/// and a page all but fill it).
#[test]
fn the_sink_pool_follows_the_size_in_use() {
    windows_reuse_sinks(&[64 * 1024], 128 * 1024);
}

fn windows_reuse_sinks(before: &[usize], len: usize) {
    const WINDOW: u64 = 64;
    let job = SimJob::new(1, 2, 1, SimDevice::ib("sim0")).unwrap();
    job.sim.set_auto_advance(true);
    let (a, b) = (job.peek(0).clone(), job.peek(1).clone());
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    b.register_am(TAG, move |_, _| {
        g.fetch_add(1, Ordering::Relaxed);
    });
    let window = |data: &xrcbtl_btl::Bytes| {
        let want = got.load(Ordering::Relaxed) + WINDOW;
        for _ in 0..WINDOW {
            a.send_bytes(1, TAG, data.clone(), None).unwrap();
        }
        while got.load(Ordering::Relaxed) < want || !a.is_idle() {
            a.progress();
            b.progress();
        }
    };
    for &n in before {
        window(&xrcbtl_btl::Bytes::from(vec![0x44u8; n]));
    }
    let data = xrcbtl_btl::Bytes::from(vec![0x33u8; len]);
    window(&data);
    window(&data);
    let before = b.rcache_stats();
    let ((), n) = CountingAlloc::count(|| {
        for _ in 0..3 {
            window(&data);
        }
    });
    let after = b.rcache_stats();
    // The sinks of a window that the budget cannot keep are made anew.
    let budget = (64usize << 20).min(xrcbtl_fabric::memlock_limit());
    let kept = (budget / (len + 4096)).min(WINDOW as usize) as u64;
    let fresh = 3 * (WINDOW - kept);
    assert!(
        after.registrations <= before.registrations + fresh,
        "the receiver registered new sinks: {before:?} -> {after:?}"
    );
    assert!(after.hits >= before.hits + 3 * kept, "{after:?}");
    // Allocating sinks again would show as at least one allocation per
    // message.
    assert!(n < WINDOW + fresh, "{n} allocations in 3 windows");
}
