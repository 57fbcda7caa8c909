//! A registration cache: registering memory with an RDMA device pins its
//! pages and costs tens of microseconds, so a transport keeps registrations
//! and reuses one whenever a later transfer falls inside it.
//!
//! The danger of such a cache is a *stale* registration: the application
//! frees memory, the address is mapped again with other pages, and a cached
//! region still pins (and transfers) the old ones. This cache therefore
//! caches only memory a [`Monitor`] watches, and drops every registration a
//! reported unmap, remap or page removal touches before it looks anything
//! up. Memory the monitor cannot watch is registered for one use and
//! deregistered when that use ends.
//!
//! Shape:
//! - the index holds non-overlapping registrations by start address (whole
//!   pages); a lookup is one ordered-map search;
//! - a registration that covers the request with at least the access asked
//!   for is a hit; otherwise the request is merged with every registration
//!   it overlaps into one new registration (the old ones leave the index and
//!   are deregistered when their last user lets go);
//! - every handed-out [`Handle`] holds a reference; registrations without
//!   references wait in a least-recently-used list, evicted beyond the
//!   configured count, bytes, or the locked-memory limit;
//! - statistics: hits, misses, evictions, invalidations.
//!
//! It is generic over a [`Registrar`] (register / deregister) and a
//! [`Monitor`] (watch / drain), so tests use counting mocks; the fabric
//! crate implements both for real devices. It depends on no other crate of
//! the workspace and holds no `unsafe`.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

/// Registers memory with a device.
pub trait Registrar {
    /// A registration (a memory region).
    type Region;
    /// Why a registration failed.
    type Error: fmt::Debug;

    /// Registers `[start, start+len)` for `access` (a bit mask; a region
    /// serves any request whose bits it contains). The cache calls it only
    /// for whole pages of memory its caller asked for, possibly merged with
    /// ranges it registered before.
    fn register(
        &mut self,
        start: usize,
        len: usize,
        access: u32,
    ) -> Result<Self::Region, Self::Error>;

    /// Deregisters a region (the default drops it).
    fn deregister(&mut self, region: Self::Region) {
        drop(region);
    }
}

/// Reports when memory stops being backed by the pages it had.
pub trait Monitor {
    /// Starts watching `[start, start+len)`; `false` when the range cannot be
    /// watched (its registration is then not cached).
    fn watch(&mut self, start: usize, len: usize) -> bool;

    /// Appends every range unmapped, remapped or emptied since the last call.
    /// After an unmap has returned, the next call must report it.
    fn drain(&mut self, out: &mut Vec<Range<usize>>);
}

/// Limits and granularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Most registrations kept in the index (in use or not).
    pub max_regions: usize,
    /// Most bytes kept registered through the index.
    pub max_bytes: usize,
    /// The process's locked-memory limit (`RLIMIT_MEMLOCK`); the cache keeps
    /// its registered bytes below it (`usize::MAX`: unlimited).
    pub memlock_bytes: usize,
    /// Registration granularity (the page size); a power of two.
    pub page: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_regions: 4096,
            max_bytes: 1 << 32,
            memlock_bytes: usize::MAX,
            page: 4096,
        }
    }
}

/// What the cache counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups served by a cached registration.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Unused registrations dropped to respect a limit.
    pub evictions: u64,
    /// Registrations dropped because their memory was unmapped, remapped or
    /// emptied.
    pub invalidations: u64,
    /// Calls to [`Registrar::register`] that succeeded.
    pub registrations: u64,
    /// Calls to [`Registrar::deregister`].
    pub deregistrations: u64,
    /// Misses that absorbed overlapping registrations.
    pub merges: u64,
    /// Misses that overlapped registrations but did not absorb them (the
    /// union would have been more than twice the request): the request
    /// was registered alone and the others left the index.
    pub unmerged: u64,
    /// Registrations made for one use only (memory the monitor cannot watch,
    /// or no monitor).
    pub uncached: u64,
}

/// Why a lookup failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error<E> {
    /// A zero-length range has nothing to register.
    Empty,
    /// The range wraps around the address space.
    Overflow,
    /// The registrar refused (after the cache had let go of every unused
    /// registration and tried again).
    Register(E),
}

impl<E: fmt::Debug> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Empty => f.write_str("nothing to register: zero-length range"),
            Error::Overflow => f.write_str("range wraps the address space"),
            Error::Register(e) => write!(f, "registration failed: {e:?}"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for Error<E> {}

/// A reference to a registration; give it back with [`RegCache::put`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a handle holds a reference until put back"]
pub struct Handle {
    slot: u32,
    gen: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    /// In the index: lookups may find it.
    Indexed,
    /// Out of the index (invalidated, merged away, or never cacheable):
    /// deregistered when its last reference goes.
    Orphan,
}

struct Entry<G> {
    start: usize,
    end: usize,
    access: u32,
    region: G,
    refs: u32,
    at: Where,
    /// Its key in the LRU list while indexed and unused.
    lru: Option<u64>,
    /// Some of its memory was reported unmapped, remapped or emptied since
    /// it was registered.
    gone: bool,
}

struct Slot<G> {
    gen: u32,
    entry: Option<Entry<G>>,
}

/// The registration cache (see the crate documentation).
pub struct RegCache<R: Registrar, M: Monitor> {
    registrar: R,
    monitor: Option<M>,
    cfg: Config,
    slots: Vec<Slot<R::Region>>,
    free: Vec<u32>,
    /// Start address → slot, for indexed entries (non-overlapping).
    index: BTreeMap<usize, u32>,
    /// Use tick → slot, for indexed entries without references.
    lru: BTreeMap<u64, u32>,
    tick: u64,
    /// Bytes of indexed entries.
    indexed_bytes: usize,
    /// Bytes of every live registration (indexed or orphan).
    live_bytes: usize,
    stats: Stats,
    scratch: Vec<Range<usize>>,
}

impl<R: Registrar, M: Monitor> fmt::Debug for RegCache<R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache")
            .field("regions", &self.index.len())
            .field("bytes", &self.indexed_bytes)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<R: Registrar, M: Monitor> RegCache<R, M> {
    /// A cache over `registrar`. Without a monitor nothing is cached: every
    /// registration lives for one use.
    pub fn new(registrar: R, monitor: Option<M>, cfg: Config) -> Self {
        assert!(
            cfg.page.is_power_of_two(),
            "page size must be a power of two"
        );
        RegCache {
            registrar,
            monitor,
            cfg,
            slots: Vec::new(),
            free: Vec::new(),
            index: BTreeMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            indexed_bytes: 0,
            live_bytes: 0,
            stats: Stats::default(),
            scratch: Vec::new(),
        }
    }

    /// What the cache counted.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Registrations in the index.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes registered through the index.
    pub fn bytes(&self) -> usize {
        self.indexed_bytes
    }

    /// Registrations alive (indexed, or orphans still in use).
    pub fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.entry.is_some()).count()
    }

    /// The most bytes it keeps registered: the configured bytes, or the
    /// locked-memory limit if lower.
    pub fn bytes_max(&self) -> usize {
        self.cfg.max_bytes.min(self.cfg.memlock_bytes)
    }

    /// The registrar (for its own counters).
    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// A registration covering `[addr, addr+len)` with at least `access`,
    /// holding a reference until [`RegCache::put`].
    pub fn get(&mut self, addr: usize, len: usize, access: u32) -> Result<Handle, Error<R::Error>> {
        if len == 0 {
            return Err(Error::Empty);
        }
        let end = addr.checked_add(len).ok_or(Error::Overflow)?;
        self.invalidate_reported();
        let start = addr & !(self.cfg.page - 1);
        let end = end
            .checked_next_multiple_of(self.cfg.page)
            .ok_or(Error::Overflow)?;
        // The only entry that can cover `start` is the last one starting at
        // or before it (entries do not overlap).
        if let Some((_, &slot)) = self.index.range(..=start).next_back() {
            let e = self.entry_mut(slot);
            if e.end >= end && e.access & access == access {
                e.refs += 1;
                if let Some(t) = e.lru.take() {
                    self.lru.remove(&t);
                }
                self.stats.hits += 1;
                return Ok(self.handle(slot));
            }
        }
        self.stats.misses += 1;
        // Absorb every registration the request overlaps, unless that would
        // more than double what is registered: the fragments of one large
        // transfer, each overlapping the last one's final page (a buffer
        // that does not start on a page), would otherwise re-register an
        // ever larger region, pinning quadratically many pages. The
        // overlapping ones then leave the index (their holders keep them)
        // and the request is registered alone.
        let (mut lo, mut hi, mut want) = (start, end, access);
        let overlapping: Vec<u32> = self
            .index
            .range(..end)
            .rev()
            .map(|(_, &s)| s)
            .take_while(|&s| self.entry(s).end > start)
            .collect();
        for &s in &overlapping {
            let e = self.entry(s);
            lo = lo.min(e.start);
            hi = hi.max(e.end);
            want |= e.access;
        }
        if hi - lo > 2 * (end - start) {
            (lo, hi, want) = (start, end, access);
            self.stats.unmerged += 1;
        } else if !overlapping.is_empty() {
            self.stats.merges += 1;
        }
        for s in overlapping {
            self.unindex(s);
        }
        self.make_room(hi - lo);
        let watched = match self.monitor.as_mut() {
            Some(m) => m.watch(lo, hi - lo),
            None => false,
        };
        let region = match self.register(lo, hi - lo, want) {
            Ok(r) => r,
            // The merged range may reach memory that is gone: register just
            // what was asked for.
            Err(_) if (lo, hi, want) != (start, end, access) => {
                (lo, hi, want) = (start, end, access);
                self.register(lo, hi - lo, want)?
            }
            Err(e) => return Err(e),
        };
        let slot = self.alloc(Entry {
            start: lo,
            end: hi,
            access: want,
            region,
            refs: 1,
            at: if watched {
                Where::Indexed
            } else {
                Where::Orphan
            },
            lru: None,
            gone: false,
        });
        if watched {
            self.index.insert(lo, slot);
            self.indexed_bytes += hi - lo;
        } else {
            self.stats.uncached += 1;
        }
        Ok(self.handle(slot))
    }

    /// The registration a handle refers to.
    pub fn region(&self, h: &Handle) -> &R::Region {
        &self.checked(h).region
    }

    /// The registered range a handle refers to (whole pages, at least the
    /// range asked for).
    pub fn range(&self, h: &Handle) -> Range<usize> {
        let e = self.checked(h);
        e.start..e.end
    }

    /// Whether the memory of a held registration is still the memory it
    /// registered: `false` once an unmap, remap or page removal reported
    /// since touched any of it (the region then reaches the old, pinned
    /// pages, or nothing). Applies pending reports first. Memory the
    /// monitor could not watch is never reported, so it stays `true`.
    pub fn is_current(&mut self, h: &Handle) -> bool {
        self.invalidate_reported();
        !self.checked(h).gone
    }

    /// Gives a reference back. An unused registration stays cached (within
    /// the limits) unless it was invalidated or could not be cached.
    pub fn put(&mut self, h: Handle) {
        let slot = h.slot;
        let _ = self.checked(&h);
        let e = self.entry_mut(slot);
        e.refs -= 1;
        if e.refs > 0 {
            return;
        }
        match e.at {
            Where::Orphan => self.release(slot),
            Where::Indexed => {
                self.tick += 1;
                let t = self.tick;
                self.entry_mut(slot).lru = Some(t);
                self.lru.insert(t, slot);
                self.make_room(0);
            }
        }
    }

    /// Drops every unused registration.
    pub fn flush(&mut self) {
        self.invalidate_reported();
        while let Some((_, slot)) = self.lru.pop_first() {
            self.entry_mut(slot).lru = None;
            self.unindex(slot);
        }
    }

    /// Applies the monitor's reports now (a lookup does it anyway).
    pub fn invalidate_reported(&mut self) {
        let Some(m) = self.monitor.as_mut() else {
            return;
        };
        m.drain(&mut self.scratch);
        let ranges = std::mem::take(&mut self.scratch);
        for r in &ranges {
            self.invalidate(r.clone());
        }
        self.scratch = ranges;
        self.scratch.clear();
    }

    /// Drops every registration overlapping `r` from the index, and marks
    /// every live one it touches gone (see [`RegCache::is_current`]).
    fn invalidate(&mut self, r: Range<usize>) {
        if r.is_empty() {
            return;
        }
        // Orphans still in use (merged away, or invalidated before) are
        // out of the index: look for them only when there are any.
        if self.slots.len() - self.free.len() > self.index.len() {
            for e in self.slots.iter_mut().filter_map(|s| s.entry.as_mut()) {
                if e.at == Where::Orphan && e.start < r.end && r.start < e.end {
                    e.gone = true;
                }
            }
        }
        let hit: Vec<u32> = self
            .index
            .range(..r.end)
            .rev()
            .map(|(_, &s)| s)
            .take_while(|&s| self.entry(s).end > r.start)
            .collect();
        for s in hit {
            self.stats.invalidations += 1;
            self.entry_mut(s).gone = true;
            self.unindex(s);
        }
    }

    /// Takes an entry out of the index; deregisters it if nobody uses it.
    fn unindex(&mut self, slot: u32) {
        let e = self.entry_mut(slot);
        debug_assert_eq!(e.at, Where::Indexed);
        e.at = Where::Orphan;
        let (start, len, lru, refs) = (e.start, e.end - e.start, e.lru.take(), e.refs);
        self.index.remove(&start);
        self.indexed_bytes -= len;
        if let Some(t) = lru {
            self.lru.remove(&t);
        }
        if refs == 0 {
            self.release(slot);
        }
    }

    /// Evicts unused registrations until one more of `len` bytes fits.
    fn make_room(&mut self, len: usize) {
        let bytes_max = self.cfg.max_bytes.min(self.cfg.memlock_bytes);
        while self.index.len() + usize::from(len > 0) > self.cfg.max_regions
            || self.indexed_bytes + len > bytes_max
            || self.live_bytes + len > self.cfg.memlock_bytes
        {
            let Some((_, slot)) = self.lru.pop_first() else {
                return;
            };
            self.entry_mut(slot).lru = None;
            self.stats.evictions += 1;
            self.unindex(slot);
        }
    }

    /// Registers, letting go of every unused registration and trying once
    /// more if the registrar refuses.
    fn register(
        &mut self,
        start: usize,
        len: usize,
        access: u32,
    ) -> Result<R::Region, Error<R::Error>> {
        match self.registrar.register(start, len, access) {
            Ok(r) => {
                self.stats.registrations += 1;
                self.live_bytes += len;
                Ok(r)
            }
            Err(e) if self.lru.is_empty() => Err(Error::Register(e)),
            Err(_) => {
                while let Some((_, slot)) = self.lru.pop_first() {
                    self.entry_mut(slot).lru = None;
                    self.stats.evictions += 1;
                    self.unindex(slot);
                }
                let r = self
                    .registrar
                    .register(start, len, access)
                    .map_err(Error::Register)?;
                self.stats.registrations += 1;
                self.live_bytes += len;
                Ok(r)
            }
        }
    }

    /// Deregisters an unused entry and frees its slot.
    fn release(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        let e = s.entry.take().expect("live entry");
        debug_assert_eq!(e.refs, 0);
        s.gen = s.gen.wrapping_add(1);
        self.free.push(slot);
        self.live_bytes -= e.end - e.start;
        self.stats.deregistrations += 1;
        self.registrar.deregister(e.region);
    }

    fn alloc(&mut self, e: Entry<R::Region>) -> u32 {
        match self.free.pop() {
            Some(s) => {
                self.slots[s as usize].entry = Some(e);
                s
            }
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    entry: Some(e),
                });
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn handle(&self, slot: u32) -> Handle {
        Handle {
            slot,
            gen: self.slots[slot as usize].gen,
        }
    }

    fn checked(&self, h: &Handle) -> &Entry<R::Region> {
        let s = &self.slots[h.slot as usize];
        assert_eq!(s.gen, h.gen, "handle of another cache or already put back");
        s.entry.as_ref().expect("live entry")
    }

    fn entry(&self, slot: u32) -> &Entry<R::Region> {
        self.slots[slot as usize]
            .entry
            .as_ref()
            .expect("live entry")
    }

    fn entry_mut(&mut self, slot: u32) -> &mut Entry<R::Region> {
        self.slots[slot as usize]
            .entry
            .as_mut()
            .expect("live entry")
    }

    /// Checks the cache's internal invariants (tests): indexed entries do
    /// not overlap, unused indexed entries are exactly the LRU list, the
    /// byte counts add up.
    pub fn check(&self) {
        let mut prev_end = 0;
        let mut bytes = 0;
        for (&start, &slot) in &self.index {
            let e = self.entry(slot);
            assert_eq!(e.start, start);
            assert_eq!(e.at, Where::Indexed);
            assert!(e.start >= prev_end, "indexed registrations overlap");
            assert_eq!(
                e.lru.is_some(),
                e.refs == 0,
                "LRU membership follows the references"
            );
            prev_end = e.end;
            bytes += e.end - e.start;
        }
        assert_eq!(bytes, self.indexed_bytes);
        assert_eq!(
            self.lru.len(),
            self.index
                .values()
                .filter(|&&s| self.entry(s).refs == 0)
                .count()
        );
        let live: usize = self
            .slots
            .iter()
            .filter_map(|s| s.entry.as_ref())
            .map(|e| e.end - e.start)
            .sum();
        assert_eq!(live, self.live_bytes);
        for s in self.slots.iter().filter_map(|s| s.entry.as_ref()) {
            if s.at == Where::Orphan {
                assert!(s.refs > 0, "an unused orphan is deregistered at once");
            }
        }
    }
}

impl<R: Registrar, M: Monitor> Drop for RegCache<R, M> {
    fn drop(&mut self) {
        // Registrations still referenced die with the cache: the handles'
        // owners must have stopped using them (the transport flushes first).
        for s in &mut self.slots {
            if let Some(e) = s.entry.take() {
                self.stats.deregistrations += 1;
                self.registrar.deregister(e.region);
            }
        }
    }
}
