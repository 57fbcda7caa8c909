//! Registration cache lookups: a hit among 100k cached registrations, and
//! a miss that registers (against a registrar that only counts).

#![forbid(unsafe_code)]

use std::ops::Range;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use xrcbtl_rcache::{Config, Monitor, RegCache, Registrar};

struct Counting(u64);

impl Registrar for Counting {
    type Region = u64;
    type Error = ();
    fn register(&mut self, _: usize, _: usize, _: u32) -> Result<u64, ()> {
        self.0 += 1;
        Ok(self.0)
    }
}

struct Quiet;

impl Monitor for Quiet {
    fn watch(&mut self, _: usize, _: usize) -> bool {
        true
    }
    fn drain(&mut self, _: &mut Vec<Range<usize>>) {}
}

const PAGE: usize = 4096;
const N: usize = 100_000;

fn lookups(c: &mut Criterion) {
    let cfg = Config {
        max_regions: 2 * N,
        max_bytes: usize::MAX,
        ..Config::default()
    };
    let mut cache = RegCache::new(Counting(0), Some(Quiet), cfg);
    // 100k registrations of 2 pages with a page of gap between them.
    for i in 0..N {
        let h = cache.get(0x1000_0000 + i * 3 * PAGE, 2 * PAGE, 1).unwrap();
        cache.put(h);
    }
    assert_eq!(cache.len(), N);
    let mut i = 0usize;
    c.bench_function("rcache hit at 100k registrations", |b| {
        b.iter(|| {
            i = (i + 7919) % N;
            let h = cache
                .get(black_box(0x1000_0000 + i * 3 * PAGE + 100), 1000, 1)
                .unwrap();
            cache.put(h);
        })
    });
    assert_eq!(cache.stats().misses, N as u64, "every timed lookup hit");

    let mut fresh = RegCache::new(Counting(0), Some(Quiet), cfg);
    let mut j = 0usize;
    c.bench_function("rcache miss (register, insert, evict)", |b| {
        b.iter(|| {
            j += 1;
            let h = fresh
                .get(black_box(0x1000_0000 + (j % (2 * N)) * 3 * PAGE), PAGE, 1)
                .unwrap();
            fresh.put(h);
        })
    });
}

// criterion_group! generates an undocumented public function.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, lookups);
}
criterion_main!(group::benches);
