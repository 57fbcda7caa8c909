//! Memory regions grant peers only what the protocol needs: a send's
//! source (eager without a copy, or a put's source) opens nothing to the
//! peer; a get's source lets it read; a put's sink, and on iWARP every
//! rendezvous sink, let it write; a get's sink elsewhere lets nobody in.
//! On iWARP one more region of each rank is writable from the start: the
//! 64 bytes its landed puts' fences read into, which hold nothing else.
//! Counted on the simulator's own record of each region's rights.

use std::time::Duration;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::Bytes;
use xrcbtl_fabric::sim::{ProcessView, SimConfig, SimDevice};

fn job(device: SimDevice) -> SimJob {
    let cfg = SimConfig::new(11, 2).with_devices(vec![device]);
    let mut job = SimJob::with(cfg, 1, |_| {}).unwrap();
    job.sim.set_auto_advance(true);
    for r in 0..2 {
        job.btl(r).register_am(9, |_, _| {});
    }
    job
}

fn view(job: &mut SimJob, r: u32) -> ProcessView {
    let p = job.rank(r).proc.clone();
    job.sim.process_view(&p)
}

/// (regions the peer may read on rank 0, regions the peer may write on
/// rank 1) after sending `len` bytes from rank 0 to rank 1 with
/// `send_bytes`.
fn rights_after(job: &mut SimJob, len: usize) -> (usize, usize) {
    let data = Bytes::from(vec![7u8; len]);
    job.btl(0).send_bytes(1, 9, data, None).unwrap();
    job.settle(Duration::from_secs(10)).unwrap();
    (view(job, 0).mrs_remote_read, view(job, 1).mrs_remote_write)
}

#[test]
fn get_sources_are_readable_and_nothing_else_is_open() {
    let mut job = job(SimDevice::ib("ib0"));
    assert_eq!(rights_after(&mut job, 16), (0, 0), "a copied eager message");
    assert_eq!(
        rights_after(&mut job, 6000),
        (0, 0),
        "eager, sent without a copy"
    );
    assert_eq!(
        rights_after(&mut job, 1 << 20),
        (1, 0),
        "get: the source is readable, the sink is written by local reads"
    );
    assert_eq!(job.btl(0).stats().zcopy_sent, 1);
}

#[test]
fn put_sources_open_nothing_and_sinks_take_writes() {
    let mut job = job(SimDevice::iwarp("iw0"));
    let fence_sink = 1;
    assert_eq!(
        rights_after(&mut job, 6000),
        (0, fence_sink),
        "eager, sent without a copy"
    );
    let (read, write) = rights_after(&mut job, 1 << 20);
    assert_eq!(read, 0, "put: the peer never reads the source");
    assert!(write > fence_sink, "put: the peer writes the sink");
}
