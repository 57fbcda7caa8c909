//! The eager path's software cost: one 8-byte active message from rank 0
//! to rank 1 on the simulated fabric (post, the simulator's delivery,
//! completion, receive, callback), in wall-clock time per message. The
//! simulator's own work is included; compare runs of this bench, not this
//! bench with hardware (scripts/sw-cost counts instructions on devices).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use xrcbtl_btl::sim::SimJob;
use xrcbtl_fabric::sim::SimDevice;

fn eager(c: &mut Criterion) {
    for (name, device) in [
        ("xrc", SimDevice::ib("sim0")),
        ("rc", SimDevice::roce("sim0")),
    ] {
        let job = SimJob::new(1, 2, 1, device).unwrap();
        let (a, b) = (job.peek(0).clone(), job.peek(1).clone());
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        b.register_am(1, move |_, _| {
            g.fetch_add(1, Ordering::Relaxed);
        });
        // The simulator's clock moves on empty polls here: two ranks
        // polled in turn need no scheduler.
        job.sim.set_auto_advance(true);
        let mut want = 0;
        c.bench_function(&format!("eager 8 B one way ({name}, sim)"), |bench| {
            bench.iter(|| {
                want += 1;
                a.send(1, 1, &[], &[7u8; 8]).unwrap();
                while got.load(Ordering::Relaxed) < want {
                    a.progress();
                    b.progress();
                }
            })
        });
    }
}

// criterion_group! generates an undocumented public function.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, eager);
}
criterion_main!(group::benches);
