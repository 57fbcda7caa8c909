//! The registration cache against a counting registrar and a scripted
//! monitor.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::rc::Rc;

use xrcbtl_rcache::{Config, Error, Handle, Monitor, RegCache, Registrar};

const PAGE: usize = 4096;
const R: u32 = 1;
const W: u32 = 2;

/// A registration as the mock hands it out.
#[derive(Debug)]
struct Region {
    id: u64,
    start: usize,
    len: usize,
    access: u32,
    /// The monitor's epoch when it was made.
    epoch: u64,
}

#[derive(Default)]
struct Shared {
    next: u64,
    live: BTreeMap<u64, (usize, usize)>,
    fail_next: u32,
    /// Invalidations queued for the cache.
    reported: Vec<Range<usize>>,
    /// Ranges the monitor refuses to watch.
    unwatchable: Vec<Range<usize>>,
    watched: Vec<Range<usize>>,
    /// Bumped at every reported invalidation, per page.
    page_epoch: BTreeMap<usize, u64>,
    epoch: u64,
}

#[derive(Clone, Default)]
struct Mock(Rc<RefCell<Shared>>);

impl Registrar for Mock {
    type Region = Region;
    type Error = &'static str;
    fn register(&mut self, start: usize, len: usize, access: u32) -> Result<Region, &'static str> {
        let mut s = self.0.borrow_mut();
        if s.fail_next > 0 {
            s.fail_next -= 1;
            return Err("refused");
        }
        s.next += 1;
        let id = s.next;
        s.live.insert(id, (start, len));
        Ok(Region {
            id,
            start,
            len,
            access,
            epoch: s.epoch,
        })
    }
    fn deregister(&mut self, r: Region) {
        assert!(
            self.0.borrow_mut().live.remove(&r.id).is_some(),
            "double deregistration"
        );
    }
}

impl Monitor for Mock {
    fn watch(&mut self, start: usize, len: usize) -> bool {
        let mut s = self.0.borrow_mut();
        let r = start..start + len;
        if s.unwatchable
            .iter()
            .any(|u| u.start < r.end && r.start < u.end)
        {
            return false;
        }
        s.watched.push(r);
        true
    }
    fn drain(&mut self, out: &mut Vec<Range<usize>>) {
        out.append(&mut self.0.borrow_mut().reported);
    }
}

impl Mock {
    fn live(&self) -> usize {
        self.0.borrow().live.len()
    }
    /// The memory of `r` changed: report it and remember when.
    fn unmap(&self, r: Range<usize>) {
        let mut s = self.0.borrow_mut();
        s.epoch += 1;
        let e = s.epoch;
        for p in (r.start / PAGE)..r.end.div_ceil(PAGE) {
            s.page_epoch.insert(p, e);
        }
        s.reported.push(r);
    }
    /// Whether a region made at `epoch` still holds the pages of `r`.
    fn fresh(&self, epoch: u64, r: Range<usize>) -> bool {
        let s = self.0.borrow();
        ((r.start / PAGE)..r.end.div_ceil(PAGE))
            .all(|p| s.page_epoch.get(&p).copied().unwrap_or(0) <= epoch)
    }
}

fn cache(cfg: Config) -> (RegCache<Mock, Mock>, Mock) {
    let m = Mock::default();
    (RegCache::new(m.clone(), Some(m.clone()), cfg), m)
}

fn id(c: &RegCache<Mock, Mock>, h: &Handle) -> u64 {
    c.region(h).id
}

#[test]
fn a_covering_registration_is_reused_and_a_wider_request_merges() {
    let (mut c, m) = cache(Config::default());
    let a = c.get(0x10_0000 + 100, 5000, R).unwrap();
    assert_eq!(c.range(&a), 0x10_0000..0x10_0000 + 2 * PAGE, "whole pages");
    // Inside: a hit, the same region.
    let b = c.get(0x10_0000 + 4000, 100, R).unwrap();
    assert_eq!(id(&c, &a), id(&c, &b));
    assert_eq!(c.stats().hits, 1);
    // More access than granted: a miss that merges into one region with both.
    let w = c.get(0x10_0000 + PAGE, 10, W).unwrap();
    assert_ne!(id(&c, &w), id(&c, &a));
    assert_eq!(c.region(&w).access, R | W);
    assert_eq!(c.range(&w), 0x10_0000..0x10_0000 + 2 * PAGE);
    assert_eq!(c.stats().merges, 1);
    assert_eq!(c.len(), 1);
    // The old region left the index but lives while referenced.
    assert_eq!(m.live(), 2);
    c.put(a);
    assert_eq!(m.live(), 2, "b still uses the old region");
    c.put(b);
    assert_eq!(
        m.live(),
        1,
        "the merged-away region goes with its last user"
    );
    // Now a read request hits the merged region.
    let r = c.get(0x10_0000, 10, R).unwrap();
    assert_eq!(id(&c, &r), id(&c, &w));
    // A request spanning two regions and a gap merges all three.
    let far = c.get(0x10_0000 + 5 * PAGE, PAGE, R).unwrap();
    let span = c.get(0x10_0000 + PAGE, 6 * PAGE, R).unwrap();
    assert_eq!(c.range(&span), 0x10_0000..0x10_0000 + 7 * PAGE);
    assert_eq!(c.region(&span).access, R | W);
    assert_eq!(c.len(), 1);
    c.check();
    for h in [w, r, far, span] {
        c.put(h);
    }
    c.check();
    assert_eq!(m.live(), 1);
    c.flush();
    assert_eq!(m.live(), 0);
    assert_eq!(c.stats().registrations, c.stats().deregistrations);
}

#[test]
fn unused_registrations_are_evicted_oldest_first_beyond_each_limit() {
    // By count.
    let (mut c, m) = cache(Config {
        max_regions: 3,
        ..Config::default()
    });
    for i in 0..3 {
        let h = c.get(i * 0x10_0000, PAGE, R).unwrap();
        c.put(h);
    }
    // Touch the first so that the second is the oldest.
    let h = c.get(0, PAGE, R).unwrap();
    c.put(h);
    let h = c.get(3 * 0x10_0000, PAGE, R).unwrap();
    assert_eq!(c.stats().evictions, 1);
    assert_eq!(c.len(), 3);
    let again = c.get(0x10_0000, PAGE, R).unwrap();
    assert_eq!(c.stats().misses, 5, "the second was evicted");
    c.check();
    c.put(h);
    c.put(again);
    assert!(m.live() <= 3);

    // By bytes, and regions in use are never evicted.
    let (mut c, m) = cache(Config {
        max_bytes: 4 * PAGE,
        ..Config::default()
    });
    let held = c.get(0, 2 * PAGE, R).unwrap();
    let x = c.get(0x10_0000, 2 * PAGE, R).unwrap();
    c.put(x);
    let y = c.get(0x20_0000, 2 * PAGE, R).unwrap();
    assert_eq!(c.stats().evictions, 1, "x made room for y");
    assert_eq!(c.bytes(), 4 * PAGE);
    // Over the limit with nothing unused: registered anyway (in use).
    let z = c.get(0x30_0000, 2 * PAGE, R).unwrap();
    assert_eq!(c.bytes(), 6 * PAGE);
    c.put(z);
    assert_eq!(
        c.bytes(),
        4 * PAGE,
        "back under the limit as soon as it is unused"
    );
    c.check();
    c.put(held);
    c.put(y);
    drop(c);
    assert_eq!(m.live(), 0, "the cache deregisters everything when dropped");

    // By the locked-memory limit.
    let (mut c, _m) = cache(Config {
        memlock_bytes: 3 * PAGE,
        ..Config::default()
    });
    let a = c.get(0, 2 * PAGE, R).unwrap();
    c.put(a);
    let b = c.get(0x10_0000, 2 * PAGE, R).unwrap();
    assert_eq!(c.stats().evictions, 1);
    c.put(b);
}

#[test]
fn an_invalidated_registration_is_never_handed_out_again() {
    let (mut c, m) = cache(Config::default());
    let a = c.get(0, 4 * PAGE, R).unwrap();
    let first = id(&c, &a);
    c.put(a);
    // Unused: dropped at the next lookup.
    m.unmap(PAGE..2 * PAGE);
    let b = c.get(0, PAGE, R).unwrap();
    assert_ne!(id(&c, &b), first);
    assert_eq!(c.stats().invalidations, 1);
    assert_eq!(m.live(), 1);
    // In use: it leaves the index and is deregistered when put back.
    m.unmap(0..PAGE);
    let c2 = c.get(0, PAGE, R).unwrap();
    assert_ne!(id(&c, &c2), id(&c, &b));
    assert_eq!(m.live(), 2);
    c.put(b);
    assert_eq!(m.live(), 1);
    // An unmap that touches nothing registered changes nothing.
    m.unmap(0x100_0000..0x100_1000);
    let d = c.get(0, PAGE, R).unwrap();
    assert_eq!(id(&c, &d), id(&c, &c2));
    c.put(c2);
    c.put(d);
    c.check();
    // A held registration whose memory went says so, and one merged
    // away (out of the index, still held) too.
    let e = c.get(8 * PAGE, PAGE, R).unwrap();
    let f = c.get(8 * PAGE, 2 * PAGE, R).unwrap();
    assert_ne!(id(&c, &e), id(&c, &f), "merged into a new one");
    assert!(c.is_current(&e) && c.is_current(&f));
    m.unmap(9 * PAGE..9 * PAGE + 1);
    assert!(c.is_current(&e), "its page did not change");
    assert!(!c.is_current(&f));
    m.unmap(8 * PAGE..8 * PAGE + 1);
    assert!(!c.is_current(&e), "the orphan heard of it too");
    c.put(e);
    c.put(f);
    // `invalidate_reported` applies reports without a lookup.
    m.unmap(0..1);
    c.invalidate_reported();
    assert_eq!(m.live(), 0);
}

#[test]
fn memory_that_cannot_be_watched_is_registered_for_one_use() {
    let (mut c, m) = cache(Config::default());
    m.0.borrow_mut().unwatchable.push(0..PAGE);
    let a = c.get(0, 10, R).unwrap();
    let b = c.get(0, 10, R).unwrap();
    assert_ne!(id(&c, &a), id(&c, &b));
    assert_eq!(c.stats().uncached, 2);
    assert!(c.is_empty());
    c.put(a);
    c.put(b);
    assert_eq!(m.live(), 0);

    // No monitor at all: nothing is cached.
    let m = Mock::default();
    let mut c: RegCache<Mock, Mock> = RegCache::new(m.clone(), None, Config::default());
    let a = c.get(0, 10, R).unwrap();
    c.put(a);
    let a = c.get(0, 10, R).unwrap();
    c.put(a);
    assert_eq!((c.stats().registrations, c.stats().hits), (2, 0));
    assert_eq!(m.live(), 0);
}

#[test]
fn a_refused_registration_is_retried_once_after_letting_go_of_unused_ones() {
    let (mut c, m) = cache(Config::default());
    let a = c.get(0, PAGE, R).unwrap();
    c.put(a);
    m.0.borrow_mut().fail_next = 1;
    let b = c.get(0x10_0000, PAGE, R).unwrap();
    assert_eq!(c.stats().evictions, 1);
    c.put(b);
    // Nothing to let go of: the error is reported.
    let held = c.get(0x20_0000, PAGE, R).unwrap();
    c.flush();
    m.0.borrow_mut().fail_next = 1;
    assert_eq!(c.get(0x30_0000, PAGE, R), Err(Error::Register("refused")));
    assert_eq!(c.get(0, 0, R), Err(Error::Empty));
    assert_eq!(c.get(usize::MAX - 10, 100, R), Err(Error::Overflow));
    c.put(held);
    c.check();
}

/// A small deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_lookups_unmaps_and_releases_never_give_a_stale_or_short_region() {
    for seed in 1..=40u64 {
        let (mut c, m) = cache(Config {
            max_regions: 8,
            max_bytes: 40 * PAGE,
            ..Config::default()
        });
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut held: Vec<(Handle, Range<usize>)> = Vec::new();
        for step in 0..2_000 {
            match rng.below(10) {
                0..=4 => {
                    let start = rng.below(64 * PAGE as u64) as usize;
                    let len = 1 + rng.below(6 * PAGE as u64) as usize;
                    let access = 1 + rng.below(3) as u32;
                    let h = c.get(start, len, access).unwrap();
                    let reg = c.region(&h);
                    let r = start..start + len;
                    assert!(
                        reg.start <= r.start && reg.start + reg.len >= r.end,
                        "seed {seed} step {step}: short"
                    );
                    assert_eq!(
                        reg.access & access,
                        access,
                        "seed {seed} step {step}: access"
                    );
                    assert!(
                        m.fresh(reg.epoch, r.clone()),
                        "seed {seed} step {step}: stale region"
                    );
                    held.push((h, r));
                }
                5..=7 if !held.is_empty() => {
                    let i = rng.below(held.len() as u64) as usize;
                    // A held registration is current exactly while none
                    // of its pages changed.
                    let reg = c.region(&held[i].0);
                    let (epoch, range) = (reg.epoch, reg.start..reg.start + reg.len);
                    assert_eq!(
                        c.is_current(&held[i].0),
                        m.fresh(epoch, range),
                        "seed {seed} step {step}: currency"
                    );
                    let (h, _) = held.swap_remove(i);
                    c.put(h);
                }
                8 => {
                    let start = rng.below(64 * PAGE as u64) as usize;
                    let len = 1 + rng.below(4 * PAGE as u64) as usize;
                    m.unmap(start..start + len);
                }
                _ => c.flush(),
            }
            c.check();
        }
        for (h, _) in held.drain(..) {
            c.put(h);
        }
        c.flush();
        assert_eq!(m.live(), 0, "seed {seed}: leaked registrations");
        let s = c.stats();
        assert_eq!(s.registrations, s.deregistrations);
        assert!(
            s.hits > 0 && s.invalidations > 0 && s.evictions > 0 && s.merges > 0,
            "seed {seed}: {s:?}"
        );
    }
}

/// The fragments of one large transfer from a buffer that does not start
/// on a page (a 1 MiB pipeline through a malloc'd buffer): each overlaps the
/// last one's final page. Absorbing each into the next would re-register an
/// ever larger region, pinning quadratically many pages; the cache
/// registers each fragment about once instead, and still never hands out a
/// region short of what was asked.
#[test]
fn a_pipeline_of_overlapping_fragments_registers_each_once() {
    let (mut c, m) = cache(Config::default());
    const FRAG: usize = 1 << 20;
    let base = 0x4000_0000 + 16;
    let mut registered = 0;
    for k in 0..256 {
        let before = c.stats().registrations;
        let h = c.get(base + k * FRAG, FRAG, R).unwrap();
        let r = c.range(&h);
        assert!(r.start <= base + k * FRAG && r.end >= base + (k + 1) * FRAG);
        if c.stats().registrations > before {
            registered += r.len();
        }
        c.put(h);
        c.check();
    }
    // 256 fragments of 1 MiB (and a page): about 256 MiB registered, not
    // the 32 GiB that growing one region would cost.
    assert!(
        registered <= 2 * 256 * (FRAG + PAGE),
        "{registered} bytes registered for 256 MiB"
    );
    assert!(c.stats().unmerged > 0);
    c.flush();
    assert_eq!(m.live(), 0);
}
