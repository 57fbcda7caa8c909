//! Placement near the device: a BTL told where its device is puts every
//! registered buffer on that NUMA node (the kernel's memory policy, read
//! back) and binds its progress thread to those CPUs; one told nothing, or
//! on a simulated device, places nothing.

use std::sync::Arc;

use xrcbtl_btl::place::{IndexSet, Place, Placement};
use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{ThreadConfig, Threaded};
use xrcbtl_fabric::sim::{SimConfig, SimDevice};

fn job(place: Place) -> SimJob {
    let cfg = SimConfig::new(3, 1).with_devices(vec![SimDevice::ib("sim0")]);
    SimJob::with(cfg, 1, move |c| c.place = place.clone()).unwrap()
}

/// The CPUs a thread of this process named `name` may run on, from /proc.
fn cpus_of_thread(name: &str) -> Option<IndexSet> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).ok()?;
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
        return list.trim().parse().ok();
    }
    None
}

#[test]
fn buffers_go_to_the_given_numa_node() {
    let mut job = job(Place::Given(Placement {
        numa_node: Some(0),
        cpus: None,
    }));
    let btl = job.btl(0).clone();
    assert_eq!(btl.placed().placement.numa_node, Some(0));
    let nodes = btl.buffer_nodes().unwrap();
    assert!(
        nodes.len() >= 3,
        "receive, bounce and result buffers: {nodes:?}"
    );
    assert!(nodes.iter().all(|n| *n == Some(0)), "{nodes:?}");
}

#[test]
fn a_simulated_device_places_nothing_by_default() {
    let mut job = job(Place::Auto);
    let btl = job.btl(0).clone();
    let placed = btl.placed();
    assert_eq!(
        (&placed.locality, &placed.placement.numa_node),
        (&None, &None)
    );
    assert_eq!(placed.why_not.as_deref(), Some("a simulated device"));
    assert!(btl.buffer_nodes().unwrap().iter().all(Option::is_none));
}

#[test]
fn the_progress_thread_binds_to_the_device_cpus() {
    let all: IndexSet = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let one = IndexSet::new([*all.as_slice().last().unwrap()]);
    let mut job = job(Place::Given(Placement {
        numa_node: None,
        cpus: Some(one.clone()),
    }));
    job.sim.set_auto_advance(true);
    job.sim.set_causal(true);
    let btl = job.btl(0).clone();
    let t = Threaded::spawn(Arc::clone(&btl), "xrcbtl-placed", ThreadConfig::default()).unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The thread counts a call before making it: the second count means
    // the first call, which binds, has returned.
    while t.calls() < 2 {
        assert!(std::time::Instant::now() < end, "the thread never ran");
        std::thread::yield_now();
    }
    assert_eq!(cpus_of_thread("xrcbtl-placed"), Some(one));
    t.stop();
}
