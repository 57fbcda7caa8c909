//! `MemMonitor`: tells a registration cache when memory it registered is
//! unmapped, remapped or given back to the kernel, so that it never hands out
//! a registration of pages that are no longer the ones at that address.
//!
//! It uses userfaultfd's non-cooperative events (`UNMAP` for munmap, brk
//! shrinking and mmap over an existing mapping, `REMAP` for mremap, `REMOVE`
//! for madvise DONTNEED/REMOVE) on the ranges it watches. Unlike interposing
//! `munmap`, this also sees glibc's allocator giving memory back through its
//! internal `__munmap`, and any other path into the kernel.
//!
//! Ordering: the thread that unmaps blocks until the event has been read.
//! Every read happens under the monitor's lock and its invalidations are
//! queued before the lock is released, and [`MemMonitor::drain`] takes the
//! lock and reads whatever is pending itself; so once `munmap` has returned,
//! the next `drain` reports it. Ranges are watched in write-protect mode,
//! which causes no faults while nothing is write-protected, so watching has
//! no effect on the memory's use; a write-protect fault that comes anyway
//! is answered by lifting the protection, so that no thread waits on it.
//!
//! Lifetime: the monitor lives while someone uses it ([`MemMonitor::acquire`]
//! hands out shared references, each [`Subscriber`] holds one); when the
//! last goes, its thread is woken, reads what is pending, closes the
//! descriptor (which stops the watching and releases any thread still
//! waiting on an event), and only then exits and is joined. The order
//! matters: a thread's exit frees its allocator caches, which can trim a
//! heap whose pages are watched, and the exiting reader would then wait
//! forever for its own event. A library loaded into a process and unloaded
//! again (an Open MPI component) leaves no thread behind.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use crate::{Error, Result};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFD_FEATURE_EVENT_REMAP: u64 = 0x4;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 0x8;
const UFFD_FEATURE_EVENT_UNMAP: u64 = 0x40;
const UFFDIO_REGISTER_MODE_WP: u64 = 0x2;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;
/// `_IOWR(0xAA, 6, struct uffdio_writeprotect)`.
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xc018_aa06;
/// `_IOR(0xAA, 2, struct uffdio_range)`.
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
/// `struct uffd_msg` is 32 bytes: the event byte, padding, three u64 args.
const MSG_LEN: usize = 32;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    start: u64,
    len: u64,
    mode: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

/// An address range whose registrations are no longer valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalidation {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

/// Most subscribers at once.
const MAX_SUBSCRIBERS: usize = 128;
/// Invalidations a subscriber's queue holds when it is made; it doubles
/// when full.
const RING: usize = 256;
/// Invalidations a subscriber's queue grows to at most (16 MiB) before it
/// overflows into "all memory".
const MAX_QUEUED: usize = 1 << 20;
/// Buffers a queue outgrew since it was last drained: one per doubling
/// from `RING` to `MAX_QUEUED`.
const GROWTHS: usize = (MAX_QUEUED / RING).ilog2() as usize;

/// Room for `cap` invalidations, mapped straight from the kernel rather
/// than through the allocator, so that the reader thread may make one
/// while it holds the queue lock (see `Ring`). A fresh anonymous mapping
/// is never watched, so making one reports nothing; it is unmapped only
/// by its drop, which never runs under the lock.
struct Buf {
    base: std::ptr::NonNull<Invalidation>,
    cap: usize,
}

// SAFETY: a `Buf` owns its mapping alone; nothing else points into it.
unsafe impl Send for Buf {}

impl Buf {
    /// `None` when the kernel has no memory for it.
    fn new(cap: usize) -> Option<Buf> {
        // SAFETY: a fresh private anonymous mapping, owned by the `Buf`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap * std::mem::size_of::<Invalidation>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = std::ptr::NonNull::new(p.cast())?;
        Some(Buf { base, cap })
    }

    fn items(&self) -> &[Invalidation] {
        // SAFETY: the mapping holds `cap` invalidations, zero-filled when
        // made (two zero words are a valid `Invalidation`), and lives as
        // long as `self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.cap) }
    }

    fn items_mut(&mut self) -> &mut [Invalidation] {
        // SAFETY: as in `items`; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.cap) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: unmaps the buffer's own mapping, which nothing uses
        // after this.
        unsafe {
            libc::munmap(
                self.base.as_ptr().cast(),
                self.cap * std::mem::size_of::<Invalidation>(),
            )
        };
    }
}

/// A subscriber's queue.
///
/// Nothing may allocate or free while the queue lock is held, nor in the
/// reader thread: a thread blocked in an unmap it made inside the
/// allocator (glibc trims its heaps with `madvise` and `munmap` under an
/// arena lock) waits until its event is read, and the reader must not wait
/// for that arena or that lock. So a full queue grows into a `Buf` mapped
/// from the kernel, and the buffer it outgrew is kept until the next drain
/// unmaps it outside the lock. Reports are never dropped short of
/// `MAX_QUEUED`: a lost report would make the caller distrust all memory,
/// and refuse registrations whose pages never changed, because other users
/// of the process's one monitor unmapped much memory of their own.
struct Ring {
    buf: Buf,
    len: usize,
    /// Outgrown buffers, unmapped by the next drain.
    retired: [Option<Buf>; GROWTHS],
    overflow: bool,
}

impl Ring {
    fn new(buf: Buf) -> Ring {
        Ring {
            buf,
            len: 0,
            retired: std::array::from_fn(|_| None),
            overflow: false,
        }
    }

    fn push(&mut self, inv: Invalidation) {
        // A range that overlaps the last one joins it: the union is exact,
        // and a page given back again and again (a heap trimmed on every
        // free) takes one entry.
        if let Some(last) = self
            .len
            .checked_sub(1)
            .map(|i| &mut self.buf.items_mut()[i])
        {
            if inv.start < last.end && last.start < inv.end {
                last.start = last.start.min(inv.start);
                last.end = last.end.max(inv.end);
                return;
            }
        }
        if self.len == self.buf.cap && !self.grow() {
            self.overflow = true;
            return;
        }
        let i = self.len;
        self.buf.items_mut()[i] = inv;
        self.len += 1;
    }

    /// Doubles the queue; `false` at `MAX_QUEUED` or without memory.
    fn grow(&mut self) -> bool {
        let cap = self.buf.cap * 2;
        let Some(slot) = self.retired.iter().position(Option::is_none) else {
            return false;
        };
        if cap > MAX_QUEUED {
            return false;
        }
        let Some(mut bigger) = Buf::new(cap) else {
            return false;
        };
        bigger.items_mut()[..self.len].copy_from_slice(&self.buf.items()[..self.len]);
        self.retired[slot] = Some(std::mem::replace(&mut self.buf, bigger));
        true
    }
}

/// What the monitor's lock guards.
struct Locked {
    /// The userfaultfd; `None` once the reader thread has closed it on its
    /// way out.
    fd: Option<OwnedFd>,
    /// One queue per live subscriber, indexed by subscriber id.
    queues: [Option<Box<Ring>>; MAX_SUBSCRIBERS],
}

struct Inner {
    /// Written to wake the reader thread when the monitor stops.
    wake: OwnedFd,
    state: Mutex<Locked>,
    /// Bumped after every batch of events is queued.
    generation: AtomicU64,
    /// Set while the reader thread is between `read` and bumping
    /// `generation` (see [`Subscriber::drain`]).
    reading: AtomicBool,
    stop: AtomicBool,
    events: AtomicU64,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Locked> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads every queued event into every subscriber's queue; the caller
    /// holds the lock.
    fn read_events(&self, state: &mut Locked) {
        let Some(fd) = state.fd.as_ref().map(|f| f.as_raw_fd()) else {
            return;
        };
        let mut buf = [0u8; MSG_LEN * 64];
        loop {
            self.reading.store(true, Ordering::SeqCst);
            // SAFETY: reads into a local buffer of the given length from the
            // monitor's own descriptor (non-blocking), which the lock keeps
            // open.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                self.reading.store(false, Ordering::SeqCst);
                return;
            }
            for msg in buf[..n as usize].chunks_exact(MSG_LEN) {
                let arg = |i: usize| {
                    u64::from_ne_bytes(msg[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"))
                };
                let range = match msg[0] {
                    UFFD_EVENT_UNMAP | UFFD_EVENT_REMOVE => (arg(0), arg(1)),
                    UFFD_EVENT_REMAP => (arg(0), arg(0) + arg(2)),
                    UFFD_EVENT_PAGEFAULT => {
                        release_fault(fd, arg(1));
                        continue;
                    }
                    _ => continue,
                };
                self.events.fetch_add(1, Ordering::Relaxed);
                let inv = Invalidation {
                    start: range.0 as usize,
                    end: range.1 as usize,
                };
                for q in state.queues.iter_mut().flatten() {
                    q.push(inv);
                }
            }
            self.generation.fetch_add(1, Ordering::SeqCst);
            self.reading.store(false, Ordering::SeqCst);
        }
    }
}

/// Lets a thread stopped by a write-protect fault at `addr` go on: the
/// monitor protects nothing, but a watched range is registered in
/// write-protect mode, and a fault that nobody answers would stop its
/// thread for good. The page loses its protection (which also wakes the
/// thread); where the kernel cannot, the thread is woken to try again.
fn release_fault(fd: i32, addr: u64) {
    let page = page_size() as u64;
    let mut wp = UffdioWriteprotect {
        start: addr & !(page - 1),
        len: page,
        mode: 0,
    };
    // SAFETY: UFFDIO_WRITEPROTECT with a valid uffdio_writeprotect on the
    // monitor's open descriptor; mode 0 removes protection and wakes.
    if unsafe { libc::ioctl(fd, UFFDIO_WRITEPROTECT, &mut wp) } != 0 {
        let mut range = [wp.start, wp.len];
        // SAFETY: UFFDIO_WAKE with a valid uffdio_range (two u64s).
        unsafe { libc::ioctl(fd, UFFDIO_WAKE, range.as_mut_ptr()) };
    }
}

/// Watches memory ranges and reports when they stop holding the pages they
/// held (see the module documentation). One per process at a time:
/// userfaultfd lets a range be watched by one descriptor only, so every user
/// (the registration cache, the simulated device) shares the one
/// [`MemMonitor::acquire`] returns, through its own [`Subscriber`].
pub struct MemMonitor {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MemMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemMonitor({} events)", self.events())
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The process's monitor while anyone holds it.
static CURRENT: Mutex<Weak<MemMonitor>> = Mutex::new(Weak::new());

impl MemMonitor {
    /// The process's monitor, started if nobody holds one; `None` where
    /// the kernel or its settings do not allow userfaultfd
    /// (`vm.unprivileged_userfaultfd`, seccomp): registrations are then not
    /// cached. It stops when the last reference (and subscriber) is gone.
    pub fn acquire() -> Option<Arc<MemMonitor>> {
        let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cur.upgrade() {
            return Some(m);
        }
        let m = Arc::new(MemMonitor::new().ok()?);
        *cur = Arc::downgrade(&m);
        Some(m)
    }

    /// Opens a userfaultfd with the unmap, remap and remove events and
    /// starts the thread that reads them. `Unsupported` where the kernel or
    /// its settings do not allow it.
    fn new() -> Result<Self> {
        // SAFETY: the userfaultfd syscall takes flags only; user-mode-only
        // (1) keeps it available to unprivileged processes on 5.11+.
        let mut raw = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | libc::O_NONBLOCK | 1,
            )
        };
        if raw < 0 {
            // SAFETY: as above, without the user-mode-only flag.
            raw =
                unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        }
        if raw < 0 {
            return Err(Error::Unsupported(
                "userfaultfd is not available to this process",
            ));
        }
        // SAFETY: the syscall returned a new descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_EVENT_UNMAP
                | UFFD_FEATURE_EVENT_REMAP
                | UFFD_FEATURE_EVENT_REMOVE,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API with a valid, writable uffdio_api.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            return Err(Error::Unsupported(
                "userfaultfd without unmap/remap/remove events",
            ));
        }
        // SAFETY: eventfd takes a count and flags only.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(Error::NoResource("eventfd for the memory monitor"));
        }
        // SAFETY: eventfd returned a new descriptor we now own.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let raw = fd.as_raw_fd();
        let inner = Arc::new(Inner {
            wake,
            state: Mutex::new(Locked {
                fd: Some(fd),
                queues: std::array::from_fn(|_| None),
            }),
            generation: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            events: AtomicU64::new(0),
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("xrcbtl-memmon".into())
            .spawn(move || {
                // Unmapping threads wait for their event to be read: read
                // promptly; the wake descriptor says when to stop. Only
                // this thread closes the descriptor, so `raw` stays valid
                // in the loop.
                while !worker.stop.load(Ordering::Acquire) {
                    let mut pfd = [raw, worker.wake.as_raw_fd()].map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    // SAFETY: two valid pollfds.
                    let r = unsafe { libc::poll(pfd.as_mut_ptr(), 2, -1) };
                    if r > 0 && pfd[0].revents != 0 {
                        worker.read_events(&mut worker.lock());
                    }
                }
                // Closed before this thread's exit frees anything (see the
                // module documentation): from here on nothing waits for a
                // reader.
                let fd = {
                    let mut state = worker.lock();
                    worker.read_events(&mut state);
                    state.fd.take()
                };
                drop(fd);
                #[cfg(test)]
                tests::run_exit_hook();
            })
            .map_err(|e| Error::Verbs {
                verb: "spawn(memmon)",
                source: e,
            })?;
        Ok(MemMonitor {
            inner,
            thread: Some(thread),
        })
    }

    /// A new subscriber: it receives every invalidation from now on.
    /// `None` when `MAX_SUBSCRIBERS` (128) are alive, or when the kernel
    /// has no memory for its queue.
    pub fn subscribe(self: &Arc<Self>) -> Option<Subscriber> {
        // Made before the lock is taken (see `Ring`).
        let ring = Box::new(Ring::new(Buf::new(RING)?));
        let spare = Buf::new(RING)?;
        let mut state = self.inner.lock();
        // Events read before now belong to the existing subscribers.
        self.inner.read_events(&mut state);
        let id = state.queues.iter().position(Option::is_none)?;
        state.queues[id] = Some(ring);
        Some(Subscriber {
            monitor: self.clone(),
            id,
            seen: self.inner.generation.load(Ordering::SeqCst),
            spare,
        })
    }

    /// Watches `[start, start+len)` (whole pages). Fails for memory
    /// userfaultfd cannot watch (file mappings other than shmem): such
    /// memory must not be cached.
    pub fn watch(&self, start: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let page = page_size();
        let first = start & !(page - 1);
        let last = (start + len).div_ceil(page) * page;
        let mut reg = UffdioRegister {
            start: first as u64,
            len: (last - first) as u64,
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        let state = self.inner.lock();
        let fd = state
            .fd
            .as_ref()
            .ok_or(Error::Unsupported("the memory monitor has stopped"))?;
        // SAFETY: UFFDIO_REGISTER with a valid uffdio_register on a
        // descriptor the lock keeps open; the kernel checks the range
        // against the process's mappings.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) } != 0 {
            let e = io::Error::last_os_error();
            return Err(Error::Verbs {
                verb: "UFFDIO_REGISTER",
                source: e,
            });
        }
        Ok(())
    }

    /// Events seen since the monitor started.
    pub fn events(&self) -> u64 {
        self.inner.events.load(Ordering::Relaxed)
    }
}

/// One user's view of the [`MemMonitor`]: its own queue of invalidations.
pub struct Subscriber {
    monitor: Arc<MemMonitor>,
    id: usize,
    /// The generation last drained.
    seen: u64,
    /// The buffer the next drain swaps in for the queue's (the one the
    /// last drain took out), so that draining maps nothing.
    spare: Buf,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Subscriber({})", self.id)
    }
}

impl Subscriber {
    /// The monitor it listens to.
    pub fn monitor(&self) -> &MemMonitor {
        &self.monitor
    }

    /// Moves every invalidation seen so far into `out`. Once `munmap` (or
    /// `mremap`, `madvise`) has returned in any thread, the next `drain`
    /// reports it.
    ///
    /// The common case (nothing happened) costs two atomic loads: an
    /// unmapping thread is released by the reader's `read`, which the reader
    /// brackets with `reading`, and it bumps `generation` before clearing
    /// `reading`; so after the unmap has returned, this sees either
    /// `reading` set or a new generation, and then takes the lock (which the
    /// reader holds until its events are queued) and reads the descriptor
    /// itself.
    ///
    /// Returns `false` when reports were lost since the last call: the
    /// queue holds up to `MAX_QUEUED` (about a million) ranges, joining
    /// each with the one before when they overlap, and drops
    /// reports beyond that or when the kernel has no memory to grow it; the
    /// caller must then assume that any memory may have changed. It maps
    /// and unmaps nothing unless the queue grew since the last call.
    pub fn drain(&mut self, out: &mut Vec<Invalidation>) -> bool {
        let inner = &self.monitor.inner;
        if !inner.reading.load(Ordering::SeqCst)
            && inner.generation.load(Ordering::SeqCst) == self.seen
        {
            return true;
        }
        // Swapped under the lock, read and unmapped after it (see `Ring`).
        let (n, overflow, retired) = {
            let mut state = inner.lock();
            inner.read_events(&mut state);
            self.seen = inner.generation.load(Ordering::SeqCst);
            match state.queues[self.id].as_mut() {
                Some(q) => {
                    std::mem::swap(&mut q.buf, &mut self.spare);
                    let retired = std::mem::replace(&mut q.retired, std::array::from_fn(|_| None));
                    (
                        std::mem::take(&mut q.len),
                        std::mem::take(&mut q.overflow),
                        Some(retired),
                    )
                }
                None => (0, false, None),
            }
        };
        drop(retired);
        out.extend_from_slice(&self.spare.items()[..n]);
        !overflow
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        // Freed after the lock is released (see `Ring`).
        let ring = self.monitor.inner.lock().queues[self.id].take();
        drop(ring);
    }
}

impl Drop for MemMonitor {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a local buffer to our eventfd.
        let _ = unsafe { libc::write(self.inner.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Hook = Box<dyn FnOnce() + Send>;
    /// Run by the next reader thread to exit, after it closed its
    /// descriptor: stands for the frees of a thread's exit.
    static EXIT_HOOK: Mutex<Option<Hook>> = Mutex::new(None);

    /// Taken by every test here: one test's unmaps would leave holes that
    /// another's mappings fill (and its subscribers' queues count).
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn run_exit_hook() {
        let hook = EXIT_HOOK.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = hook {
            f();
        }
    }

    /// An anonymous private mapping of `pages` pages.
    fn map(pages: usize) -> (usize, usize) {
        let len = pages * page_size();
        // SAFETY: a fresh anonymous mapping; the tests unmap what they map.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (p as usize, len)
    }

    fn drained(m: &mut Subscriber) -> Vec<Invalidation> {
        let mut v = Vec::new();
        assert!(m.drain(&mut v), "no overflow");
        v
    }

    /// What `m` heard of `[a, a+len)`: the other tests of this binary
    /// unmap watched memory of their own meanwhile, and every subscriber
    /// hears of everything.
    fn drained_in(m: &mut Subscriber, a: usize, len: usize) -> Vec<Invalidation> {
        let mut v = drained(m);
        v.retain(|i| i.start < a + len && a < i.end);
        v
    }

    #[test]
    fn munmap_madvise_mremap_and_map_fixed_are_reported() {
        let _serial = serial();
        let mon = MemMonitor::acquire().expect("userfaultfd on this machine");
        let mut m = mon.subscribe().unwrap();
        let mut other = mon.subscribe().unwrap();
        let page = page_size();
        let (a, len) = map(8);
        // All `m` heard, one drain at a time.
        let mut heard = Vec::new();
        let mut drained_in = |m: &mut Subscriber, a, len| {
            let got = drained_in(m, a, len);
            heard.extend_from_slice(&got);
            got
        };
        // SAFETY: writes inside the mapping.
        unsafe { std::ptr::write_bytes(a as *mut u8, 1, len) };
        mon.watch(a, len).unwrap();
        assert!(
            drained_in(&mut m, a, len).is_empty(),
            "watching alone reports nothing"
        );
        // The memory is untouched by watching.
        // SAFETY: reads inside the mapping.
        assert_eq!(unsafe { *((a + 3 * page) as *const u8) }, 1);

        // munmap of two pages: reported as soon as munmap returns.
        // SAFETY: unmaps part of our own mapping.
        let r = unsafe { libc::munmap((a + 6 * page) as *mut _, 2 * page) };
        assert_eq!(r, 0);
        assert_eq!(
            drained_in(&mut m, a, len),
            vec![Invalidation {
                start: a + 6 * page,
                end: a + 8 * page
            }]
        );

        // madvise(DONTNEED): the pages' contents are gone.
        // SAFETY: advice on our own mapping.
        let r = unsafe { libc::madvise(a as *mut _, page, libc::MADV_DONTNEED) };
        assert_eq!(r, 0);
        assert_eq!(
            drained_in(&mut m, a, len),
            vec![Invalidation {
                start: a,
                end: a + page
            }]
        );

        // mmap MAP_FIXED over a watched page: an implicit unmap.
        // SAFETY: replaces one page of our own mapping.
        let p = unsafe {
            libc::mmap(
                (a + page) as *mut _,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p as usize, a + page);
        assert!(drained_in(&mut m, a, len).contains(&Invalidation {
            start: a + page,
            end: a + 2 * page
        }));

        // mremap moves pages away.
        // SAFETY: moves two pages of our own mapping to a new place.
        let q = unsafe {
            libc::mremap(
                (a + 2 * page) as *mut _,
                2 * page,
                2 * page,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                (a + 6 * page) as *mut libc::c_void,
            )
        };
        assert_ne!(q, libc::MAP_FAILED);
        let got = drained_in(&mut m, a, len);
        assert!(
            got.iter()
                .any(|i| i.start == a + 2 * page && i.end == a + 4 * page),
            "{got:?}"
        );
        // SAFETY: unmaps the whole area (some pages already gone).
        unsafe { libc::munmap(a as *mut _, 8 * page) };
        assert!(!drained_in(&mut m, a, len).is_empty());
        assert!(mon.events() >= 5);
        // Every subscriber hears every event: what `other` heard in one
        // drain at the end covers each range `m` heard (overlapping ones
        // were joined in `other`'s queue).
        let all = drained(&mut other);
        for h in &heard {
            assert!(
                all.iter().any(|o| o.start <= h.start && h.end <= o.end),
                "{h:?} not in {all:?}"
            );
        }
        drop(other);
    }

    /// A subscriber that drains late still hears every report: its queue
    /// grows past its first capacity instead of dropping them (the sweep's
    /// worlds share the monitor, and one world's teardown unmapped more
    /// than `RING` ranges before another drained, which then refused a
    /// registration whose pages had not changed).
    #[test]
    fn a_flood_of_reports_is_kept_whole() {
        let _serial = serial();
        let mon = MemMonitor::acquire().expect("userfaultfd on this machine");
        let mut m = mon.subscribe().unwrap();
        let page = page_size();
        let pages = 4 * RING + 2;
        let (a, len) = map(pages);
        mon.watch(a, len).unwrap();
        // Every other page on its own: ranges that neither overlap nor
        // touch. Given back rather than unmapped, so that no other test's
        // mapping lands in the holes.
        for i in (0..pages).step_by(2) {
            // SAFETY: advice on one page of our own mapping.
            let r = unsafe { libc::madvise((a + i * page) as *mut _, page, libc::MADV_DONTNEED) };
            assert_eq!(r, 0);
        }
        let mut got = drained_in(&mut m, a, len);
        got.sort_by_key(|i| i.start);
        let want: Vec<_> = (0..pages)
            .step_by(2)
            .map(|i| Invalidation {
                start: a + i * page,
                end: a + (i + 1) * page,
            })
            .collect();
        assert_eq!(got, want);
        // SAFETY: unmaps our mapping.
        unsafe { libc::munmap(a as *mut _, len) };
    }

    /// A page given back again and again before a drain takes one entry,
    /// not one per report (other tests' reports may fall between them).
    #[test]
    fn repeated_reports_of_one_range_are_joined() {
        let _serial = serial();
        let mon = MemMonitor::acquire().expect("userfaultfd on this machine");
        let mut m = mon.subscribe().unwrap();
        let (a, len) = map(1);
        mon.watch(a, len).unwrap();
        let times = 4 * RING as u64;
        let before = mon.events();
        for _ in 0..times {
            // SAFETY: advice on our own mapping.
            let r = unsafe { libc::madvise(a as *mut _, len, libc::MADV_DONTNEED) };
            assert_eq!(r, 0);
        }
        // Counted by the reader after it has released the unmapping
        // thread: all counted once a drain has taken the lock.
        let got = drained_in(&mut m, a, len);
        let foreign = (mon.events() - before).saturating_sub(times);
        assert!(!got.is_empty());
        assert!(
            got.iter().all(|i| *i
                == Invalidation {
                    start: a,
                    end: a + len
                }),
            "{got:?}"
        );
        assert!(
            got.len() as u64 <= 1 + foreign,
            "{} entries for {times} reports of one page, {foreign} reports of others between",
            got.len()
        );
        // SAFETY: unmaps our mapping.
        unsafe { libc::munmap(a as *mut _, len) };
    }

    /// A reader thread's exit frees its allocator caches, and glibc may
    /// then trim a heap whose pages are watched (the benches tests hung so,
    /// 2 runs in 16). The exit must not wait for its own event.
    #[test]
    fn the_reader_thread_may_unmap_watched_memory_as_it_exits() {
        let _serial = serial();
        let mon = MemMonitor::acquire().expect("userfaultfd on this machine");
        let (a, len) = map(4);
        mon.watch(a, len).unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        *EXIT_HOOK.lock().unwrap() = Some(Box::new(move || {
            // SAFETY: unmaps the test's own mapping, which nothing else uses.
            let r = unsafe { libc::munmap(a as *mut _, len) };
            let _ = done_tx.send(r);
        }));
        // Dropped on another thread: it would wait forever on the join.
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(mon);
            let _ = dropped_tx.send(());
        });
        // Other tests of this binary may hold the monitor a little longer.
        let limit = std::time::Duration::from_secs(30);
        let r = done_rx
            .recv_timeout(limit)
            .expect("the exiting reader's unmap returned");
        assert_eq!(r, 0);
        dropped_rx
            .recv_timeout(limit)
            .expect("the monitor's drop returned");
    }

    /// A write-protect fault on watched memory (the monitor protects
    /// nothing itself; here the test does) never stops the writer: the
    /// monitor's reader lifts the protection.
    #[test]
    fn a_write_protect_fault_on_watched_memory_does_not_stop_the_writer() {
        let _serial = serial();
        let mon = MemMonitor::acquire().expect("userfaultfd on this machine");
        let (a, len) = map(2);
        // SAFETY: writes inside the mapping (populates the pages).
        unsafe { std::ptr::write_bytes(a as *mut u8, 1, len) };
        mon.watch(a, len).unwrap();
        let fd = mon.inner.lock().fd.as_ref().unwrap().as_raw_fd();
        let mut wp = UffdioWriteprotect {
            start: a as u64,
            len: len as u64,
            mode: 1,
        };
        // The kernel refuses with EAGAIN while an event of the descriptor
        // (another test's unmap of watched memory) waits for the monitor's
        // reader: tried again until the reader has taken it.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let (r, err) = loop {
            // SAFETY: write-protects the test's own watched mapping.
            let r = unsafe { libc::ioctl(fd, UFFDIO_WRITEPROTECT, &mut wp) };
            let err = io::Error::last_os_error();
            if r == 0
                || err.raw_os_error() != Some(libc::EAGAIN)
                || std::time::Instant::now() >= end
            {
                break (r, err);
            }
            std::thread::yield_now();
        };
        assert_eq!(r, 0, "{err}");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: writes inside the test's mapping, which nothing else
            // uses.
            unsafe { *((a + 100) as *mut u8) = 7 };
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the write went through");
        // SAFETY: reads inside the mapping.
        assert_eq!(unsafe { *((a + 100) as *const u8) }, 7);
        // SAFETY: unmaps the test's own mapping.
        unsafe { libc::munmap(a as *mut _, len) };
    }

    #[test]
    fn memory_that_cannot_be_watched_is_refused() {
        let _serial = serial();
        let m = MemMonitor::acquire().expect("userfaultfd on this machine");
        // A read-only file mapping.
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        // SAFETY: maps a page of a file read-only; unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(m.watch(p as usize, 4096).is_err());
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 4096) };
    }
}
