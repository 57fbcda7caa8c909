//! What one small message costs in calls, counted on the simulated fabric
//! (issue 32's budget for the small-message path): over 2,000 8-byte round
//! trips after a warm-up, on XRC, RC and iWARP, each rank's verbs (the
//! simulator counts them per process and per CQ), the BTL's own counters
//! and the heap allocations of the thread. Per message sent or received:
//!
//! - exactly one post, and no credit-only message (iWARP), no cover;
//! - at most 1 in 16 sends signalled;
//! - one receive-CQ poll that finds it;
//! - at most one call that posts receives again per 16 messages received;
//! - one taking of the BTL's lock per send and per progress call, but
//!   none for a quiet progress call that finds the receive CQ empty (it
//!   takes only the poller's: on devices whose events cost system calls,
//!   run here too);
//! - no delivery queued (the callback runs straight from progress);
//! - no posted-work record (a send log per QP instead of a slab entry);
//! - no allocation.

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::BtlStats;
use xrcbtl_fabric::sim::{CountingAlloc, CqPolls, SimDevice, VerbCounts};

#[path = "util/pingpong.rs"]
mod pingpong;
use pingpong::{Back, PingPong};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const TAG: u8 = 7;
const ROUND_TRIPS: u64 = 2000;
const BODY: [u8; 8] = [0x5a; 8];

/// One rank's counters at a moment.
struct Snapshot {
    verbs: VerbCounts,
    recv_cq: CqPolls,
    stats: BtlStats,
}

fn snapshot(job: &SimJob, r: u32) -> Snapshot {
    let btl = job.peek(r);
    Snapshot {
        verbs: job.get(r).proc.verbs(),
        recv_cq: btl.recv_cq().polls(),
        stats: btl.stats(),
    }
}

fn small_message_costs(device: SimDevice) {
    let label = format!("{} ({})", device.name, device.caps.transport);
    let costly = device.costly_events;
    let pp = PingPong::new(device, TAG);
    if costly {
        // Time waits for a rank that looks at its events every so many
        // calls (see `quiet_path.rs`).
        pp.job.sim.set_causal(true);
    }
    // Connect, and fill the pools and the logs.
    pp.round_trips(TAG, 300, &[], &BODY, Back::Send);
    let job = &pp.job;
    let before = [snapshot(job, 0), snapshot(job, 1)];
    let (calls, allocations) =
        CountingAlloc::count(|| pp.round_trips(TAG, ROUND_TRIPS, &[], &BODY, Back::Send));
    let after = [snapshot(job, 0), snapshot(job, 1)];
    let n = ROUND_TRIPS;
    let mut faults = Vec::new();
    for r in 0..2 {
        let (x, y) = (&before[r], &after[r]);
        let posts = y.verbs.post_send - x.verbs.post_send;
        let signalled = y.verbs.signalled - x.verbs.signalled;
        let reposts = y.verbs.post_recv - x.verbs.post_recv;
        let hits = y.recv_cq.hits - x.recv_cq.hits;
        // The snapshot's own stats() call takes the lock once.
        let locks = y.stats.locks - x.stats.locks - 1;
        let unlocked = y.stats.unlocked_polls - x.stats.unlocked_polls;
        let queued = y.stats.queued_deliveries - x.stats.queued_deliveries;
        let records = y.stats.posted_records - x.stats.posted_records;
        let credit_only = y.stats.credits_returned - x.stats.credits_returned;
        let covers = y.stats.covers - x.stats.covers;
        let mut check = |ok: bool, what: String| {
            if !ok {
                faults.push(format!("rank {r}: {what}"));
            }
        };
        check(posts == n, format!("{posts} posts for {n} messages sent"));
        check(
            signalled <= n / 16 + covers,
            format!("{signalled} of {n} sends signalled ({covers} covers)"),
        );
        check(
            credit_only == 0,
            format!("{credit_only} credit-only messages"),
        );
        check(
            hits == n,
            format!("{hits} receive-CQ hits for {n} messages received"),
        );
        check(
            reposts <= n.div_ceil(16),
            format!("{reposts} calls posting receives for {n} messages received"),
        );
        check(
            locks + unlocked == n + calls[r],
            format!(
                "{locks} lockings for {n} sends and {} progress calls, {unlocked} of them \
                 quiet and empty",
                calls[r]
            ),
        );
        if costly {
            check(
                unlocked > 0,
                format!("no quiet empty call in {} progress calls", calls[r]),
            );
        }
        check(queued == 0, format!("{queued} deliveries queued"));
        check(records == 0, format!("{records} posted-work records"));
    }
    if allocations != 0 {
        faults.push(format!("{allocations} allocations"));
    }
    assert!(
        faults.is_empty(),
        "{label}: {n} round trips of 8 bytes:\n  {}",
        faults.join("\n  ")
    );
}

#[test]
fn a_small_message_costs_one_post_one_poll_and_one_lock_over_xrc() {
    small_message_costs(SimDevice::ib("sim0"));
}

#[test]
fn a_small_message_costs_one_post_one_poll_and_one_lock_over_rc() {
    small_message_costs(SimDevice::roce("sim0"));
}

#[test]
fn a_small_message_costs_one_post_one_poll_and_one_lock_over_iwarp() {
    small_message_costs(SimDevice::iwarp("sim0"));
}

/// As every real device's: connection events cost system calls, and most
/// progress calls are quiet.
fn costly(mut device: SimDevice) -> SimDevice {
    device.costly_events = true;
    device
}

#[test]
fn a_small_message_costs_the_same_through_quiet_progress_over_xrc() {
    small_message_costs(costly(SimDevice::ib("sim0")));
}

#[test]
fn a_small_message_costs_the_same_through_quiet_progress_over_rc() {
    small_message_costs(costly(SimDevice::roce("sim0")));
}

#[test]
fn a_small_message_costs_the_same_through_quiet_progress_over_iwarp() {
    small_message_costs(costly(SimDevice::iwarp("sim0")));
}

/// The counters themselves count: a round trip shows in every one of
/// them that the budget above reads.
#[test]
fn the_counters_count_a_round_trip() {
    let pp = PingPong::new(SimDevice::ib("sim0"), TAG);
    let job = &pp.job;
    let before = [snapshot(job, 0), snapshot(job, 1)];
    // More round trips than a QP's run of unsignalled sends (64), so
    // that a signalled one is among them.
    const N: u64 = 80;
    let calls = pp.round_trips(TAG, N, &[], &BODY, Back::Send);
    let after = [snapshot(job, 0), snapshot(job, 1)];
    for r in 0..2 {
        let (x, y) = (&before[r], &after[r]);
        assert!(
            y.verbs.post_send >= x.verbs.post_send + N,
            "rank {r}: posts"
        );
        assert!(y.verbs.signalled > x.verbs.signalled, "rank {r}: signalled");
        assert!(
            y.verbs.post_recv > x.verbs.post_recv,
            "rank {r}: receives posted"
        );
        assert!(
            y.verbs.recvs_posted >= y.verbs.post_recv,
            "rank {r}: receives per call"
        );
        assert!(
            y.recv_cq.hits >= x.recv_cq.hits + N,
            "rank {r}: receive-CQ hits"
        );
        assert!(y.recv_cq.calls >= y.recv_cq.hits, "rank {r}: polls");
        assert!(
            y.recv_cq.completions >= y.recv_cq.hits,
            "rank {r}: completions"
        );
        assert!(
            y.stats.locks >= x.stats.locks + N + calls[r],
            "rank {r}: locks"
        );
    }
}
