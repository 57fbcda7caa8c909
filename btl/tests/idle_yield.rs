//! Yielding the CPU when idle: a progress loop that keeps finding nothing
//! yields after the configured number of empty calls in a row (counted in
//! `BtlStats::idle_yields`), starts counting again after a call that found
//! work, and by default yields only on a device the host's kernel emulates.

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{BtlConfig, IdleYield};
use xrcbtl_fabric::sim::{SimConfig, SimDevice};
use xrcbtl_fabric::Transport;

fn job(idle: IdleYield) -> SimJob {
    let cfg = SimConfig::new(5, 2).with_devices(vec![SimDevice::ib("sim0")]);
    SimJob::with(cfg, 1, move |c| c.idle_yield = idle).unwrap()
}

#[test]
fn an_idle_loop_yields_after_the_set_number_of_empty_calls() {
    let mut job = job(IdleYield::After(3));
    let btl = job.btl(0).clone();
    let before = btl.stats().idle_yields;
    // The model: a call that found work starts the count again, and the
    // third empty call in a row yields and starts it again too.
    let (mut empties, mut want) = (0u32, 0u64);
    for _ in 0..100 {
        if btl.progress() > 0 {
            empties = 0;
        } else {
            empties += 1;
            if empties == 3 {
                empties = 0;
                want += 1;
            }
        }
    }
    let got = btl.stats().idle_yields - before;
    assert_eq!(got, want);
    assert!(
        want >= 20,
        "an idle BTL's calls are mostly empty: {want} yields"
    );
}

#[test]
fn by_default_only_a_device_the_kernel_emulates_yields() {
    let mut job = job(IdleYield::Auto);
    let btl = job.btl(0).clone();
    for _ in 0..100 {
        btl.progress();
    }
    assert_eq!(
        btl.stats().idle_yields,
        0,
        "a simulated device never yields"
    );
    let mut caps = SimDevice::roce("r").caps;
    assert_eq!(IdleYield::Auto.after(&caps), 0, "hardware RoCE");
    caps.host_emulated = true;
    assert_eq!(IdleYield::Auto.after(&caps), 1, "Soft-RoCE");
    caps.transport = Transport::Iwarp;
    assert_eq!(
        IdleYield::Auto.after(&caps),
        1,
        "soft-iWARP: requests posted while the QP sends wait for its thread"
    );
    caps.host_emulated = false;
    assert_eq!(IdleYield::Auto.after(&caps), 0, "hardware iWARP");
    assert_eq!(IdleYield::Off.after(&caps), 0);
    assert_eq!(IdleYield::After(4).after(&caps), 4);
}

#[test]
fn the_setting_reads_auto_off_and_counts() {
    let parse = |v: &str| {
        let v = v.to_string();
        BtlConfig::new(
            0,
            0,
            1,
            xrcbtl_fabric::XrcdKey::new("k"),
            "127.0.0.1:0".parse().unwrap(),
        )
        .with_vars(move |k| (k == "XRCBTL_IDLE_YIELD").then(|| v.clone()))
        .map(|c| c.idle_yield)
    };
    assert_eq!(parse("auto").unwrap(), IdleYield::Auto);
    assert_eq!(parse("off").unwrap(), IdleYield::Off);
    assert_eq!(parse("0").unwrap(), IdleYield::Off);
    assert_eq!(parse(" 8 ").unwrap(), IdleYield::After(8));
    let err = parse("sometimes").unwrap_err().to_string();
    assert!(err.contains("XRCBTL_IDLE_YIELD"), "{err}");
}

/// A message to itself is delivered by the next progress call even when
/// that call found nothing else and yields (the delivery is work): once
/// the call had yielded without delivering, the next calls took the quiet
/// path, which does not look at deliveries, and the message waited for
/// good (seen through Open MPI 5's collectives, whose ranks send to
/// themselves, on rxe and siw, which yield after every empty call).
#[test]
fn a_message_to_itself_is_delivered_when_every_empty_call_yields() {
    for costly in [false, true] {
        let mut device = SimDevice::ib("sim0");
        device.costly_events = costly;
        let cfg = SimConfig::new(5, 2).with_devices(vec![device]);
        let mut job = SimJob::with(cfg, 1, |c| c.idle_yield = IdleYield::After(1)).unwrap();
        let btl = job.btl(0).clone();
        let got = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let g = got.clone();
        btl.register_am(9, move |_, _| {
            g.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        for _ in 0..50 {
            btl.progress();
        }
        for i in 0..20u32 {
            assert!(btl.sendi(0, 9, &i.to_le_bytes(), &[]).unwrap());
            btl.progress();
            btl.progress();
            assert_eq!(
                got.load(std::sync::atomic::Ordering::SeqCst),
                i + 1,
                "costly events {costly}: message {i} to itself not delivered by two progress calls"
            );
        }
    }
}

/// Connection events are looked at every 1,024 progress calls while every
/// connection is settled, on a device whose events cost system calls, and
/// a yield counts as 8 of those calls: a rank that yields after every
/// empty call looks 8 times as often per call (its calls are as slow as
/// the scheduler, and the look is where it hears of a dead peer). The
/// count of quiet calls stays exact: every call is either quiet or full.
#[test]
fn a_yield_brings_the_next_look_at_connection_events_eight_calls_nearer() {
    let calls = 8 * 1024u64;
    let mut full_by = Vec::new();
    for idle in [IdleYield::Off, IdleYield::After(1)] {
        let mut device = SimDevice::ib("sim0");
        device.costly_events = true;
        let cfg = SimConfig::new(5, 2).with_devices(vec![device]);
        let mut job = SimJob::with(cfg, 1, move |c| c.idle_yield = idle).unwrap();
        let btl = job.btl(0).clone();
        // Settled: the first looks are behind it.
        for _ in 0..4096 {
            btl.progress();
        }
        let before = btl.stats();
        let mut found = 0;
        for _ in 0..calls {
            found += btl.progress();
        }
        let after = btl.stats();
        assert_eq!(found, 0, "{idle:?}: an idle rank finds nothing");
        let quiet = after.quiet_polls - before.quiet_polls;
        let yields = after.idle_yields - before.idle_yields;
        assert!(
            quiet <= calls,
            "{idle:?}: {quiet} quiet calls counted in {calls}"
        );
        let full = calls - quiet;
        let want_yields = if idle == IdleYield::Off { 0 } else { calls };
        assert_eq!(yields, want_yields, "{idle:?}: yields");
        full_by.push(full);
    }
    // Exact: a look every 1,024 calls, or every 128 yielding calls; the
    // counted quiet calls (calls less looks) land on those numbers only if
    // the calls a yield stands for are not counted as quiet calls.
    assert_eq!(
        full_by,
        vec![calls / 1024, calls / 128],
        "full calls, as-is"
    );
}
