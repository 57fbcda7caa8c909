//! The eager path's software cost: one 8-byte active message from rank 0
//! to rank 1 on the simulated fabric (post, the simulator's delivery,
//! completion, receive, callback), in wall-clock time per message. The
//! simulator's own work is included; compare runs of this bench, not this
//! bench with hardware.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use xrcbtl_btl::{Btl, BtlConfig, Clock, Peer};
use xrcbtl_fabric::sim::{SimConfig, SimDevice, SimFabric};
use xrcbtl_fabric::{Fabric, XrcdKey};

fn eager(c: &mut Criterion) {
    for (name, device) in [
        ("xrc", SimDevice::ib("sim0")),
        ("rc", SimDevice::roce("sim0")),
    ] {
        let sim = SimFabric::new(SimConfig::new(1, 2).with_devices(vec![device])).unwrap();
        let mut btls = Vec::new();
        let mut procs = Vec::new();
        for rank in 0..2u32 {
            let proc = sim.spawn(rank as usize).unwrap();
            let ctx = proc.open("sim0").unwrap();
            let listen = std::net::SocketAddr::new(ctx.ip(), 0);
            let mut cfg = BtlConfig::new(rank, rank, 1, XrcdKey::new("bench"), listen);
            let s = sim.clone();
            cfg.clock = Clock::from_fn(move || s.now());
            btls.push(Btl::new(ctx, cfg).unwrap());
            procs.push(proc);
        }
        let peers: Vec<Peer> = btls
            .iter()
            .enumerate()
            .map(|(r, b)| Peer {
                rank: r as u32,
                node: r as u32,
                addr: b.listen_addr().unwrap(),
            })
            .collect();
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        btls[1].register_am(1, move |_| {
            g.fetch_add(1, Ordering::Relaxed);
        });
        for b in &mut btls {
            b.add_procs(&peers);
        }
        let (a, rest) = btls.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut rest[0]);
        let mut want = 0;
        c.bench_function(&format!("eager 8 B one way ({name}, sim)"), |bench| {
            bench.iter(|| {
                want += 1;
                a.send(1, 1, &[7u8; 8]).unwrap();
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
