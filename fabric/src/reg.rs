//! `MemCache`: the registration cache ([`xrcbtl_rcache`]) over a device's
//! `reg_mr`, fed by the process's [`MemMonitor`].
//!
//! This is the one place where memory the fabric does not own is
//! registered. A registration is asked for with a borrow of the memory, so
//! the memory is valid when it is registered; the cache may keep the region
//! after the borrow ends, and then only its monitor keeps it honest: when
//! the memory is unmapped, remapped or given back to the kernel, the next
//! lookup drops the region. Between uses a cached region reaches the same
//! pages the process has at those addresses, or none (the kernel pins the
//! old pages of a region whose memory went away; the simulated device
//! detaches such a region).

use std::ops::Range;

use xrcbtl_rcache::{Config, Handle, Monitor, RegCache, Registrar, Stats};

use crate::{Access, Context, Error, MemMonitor, Mr, RemoteAddr, Result, Sge, Subscriber, UserMem};

/// Registers with a device for the cache.
struct MrRegistrar<C: Context> {
    ctx: C,
    pd: C::Pd,
}

impl<C: Context> Registrar for MrRegistrar<C> {
    type Region = C::Mr;
    type Error = Error;

    fn register(&mut self, start: usize, len: usize, access: u32) -> Result<C::Mr> {
        // SAFETY: the cache registers whole pages of ranges that callers of
        // `MemCache::register*` borrowed (readable, and writable when a
        // write access was asked for through a mutable borrow) or lent as
        // `UserMem` (under its contract), possibly merged with ranges
        // registered before and not reported unmapped since; the kernel (or
        // the simulator) checks that the pages are mapped. Work requests name a region only for memory their poster
        // holds while they run; a region that outlives its memory reaches
        // the old pinned pages or, on the simulator, nothing.
        unsafe {
            self.ctx
                .reg_mr_cached(&self.pd, start as *mut u8, len, Access::from_bits(access))
        }
    }
}

impl Monitor for Subscriber {
    fn watch(&mut self, start: usize, len: usize) -> bool {
        self.monitor().watch(start, len).is_ok()
    }

    fn drain(&mut self, out: &mut Vec<Range<usize>>) {
        let mut got = Vec::new();
        if Subscriber::drain(self, &mut got) {
            out.extend(got.into_iter().map(|i| i.start..i.end));
        } else {
            // Reports were lost: nothing cached can be trusted.
            out.push(0..usize::MAX);
        }
    }
}

/// A registration held from the cache; give it back with
/// [`MemCache::release`].
#[derive(Debug)]
#[must_use = "a registration holds a reference until released"]
pub struct Registration {
    handle: Handle,
    lkey: u32,
    rkey: u32,
}

impl Registration {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

/// How many bytes the process may have registered: its locked-memory
/// limit (`RLIMIT_MEMLOCK`), or `usize::MAX` when that is unlimited or
/// does not apply. It does not apply to a process with `CAP_IPC_LOCK` in
/// its effective set (root, usually): the kernel pins its registrations
/// without counting them against the limit (`ib_umem_get`, siw's own
/// `siw_umem_get`).
pub fn memlock_limit() -> usize {
    let ipc_lock = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| effective_caps(&s))
        .is_some_and(|c| c & CAP_IPC_LOCK != 0);
    if ipc_lock {
        return usize::MAX;
    }
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return usize::MAX;
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
}

/// `CAP_IPC_LOCK`'s bit in a capability set.
const CAP_IPC_LOCK: u64 = 1 << 14;

/// The effective capability set from the text of `/proc/self/status`.
fn effective_caps(status: &str) -> Option<u64> {
    let v = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(v.trim(), 16).ok()
}

/// The registration cache of one protection domain.
pub struct MemCache<C: Context> {
    cache: RegCache<MrRegistrar<C>, Subscriber>,
    caching: bool,
}

impl<C: Context> std::fmt::Debug for MemCache<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemCache({:?})", self.cache)
    }
}

impl<C: Context> MemCache<C> {
    /// A cache registering in `pd`. `cfg.memlock_bytes` is lowered to the
    /// process's limit. Without userfaultfd, nothing is cached.
    pub fn new(ctx: C, pd: C::Pd, mut cfg: Config) -> Self {
        cfg.memlock_bytes = cfg.memlock_bytes.min(memlock_limit());
        let monitor = MemMonitor::acquire().and_then(|m| m.subscribe());
        MemCache {
            caching: monitor.is_some(),
            cache: RegCache::new(MrRegistrar { ctx, pd }, monitor, cfg),
        }
    }

    /// The most bytes it keeps registered (the configured bytes, or the
    /// process's locked-memory limit if lower).
    pub fn bytes_max(&self) -> usize {
        self.cache.bytes_max()
    }

    /// Whether registrations are cached (a memory monitor runs).
    pub fn caches(&self) -> bool {
        self.caching
    }

    /// A registration of `data` that remote peers may read.
    pub fn register(&mut self, data: &[u8]) -> Result<Registration> {
        self.get(data.as_ptr() as usize, data.len(), Access::REMOTE_READ)
    }

    /// A registration of `data` for this process's own sends and writes
    /// only: its rkey lets no peer in.
    pub fn register_local(&mut self, data: &[u8]) -> Result<Registration> {
        self.get(data.as_ptr() as usize, data.len(), Access::NONE)
    }

    /// A registration of `data` with `access` (which may include writes).
    pub fn register_mut(&mut self, data: &mut [u8], access: Access) -> Result<Registration> {
        self.get(data.as_ptr() as usize, data.len(), access)
    }

    /// A registration of user memory with `access`.
    pub fn register_user(&mut self, mem: &UserMem, access: Access) -> Result<Registration> {
        self.get(mem.addr(), mem.len(), access)
    }

    fn get(&mut self, addr: usize, len: usize, access: Access) -> Result<Registration> {
        let handle = self
            .cache
            .get(addr, len, access.bits())
            .map_err(|e| match e {
                xrcbtl_rcache::Error::Register(e) => e,
                e => Error::invalid(e.to_string()),
            })?;
        let mr = self.cache.region(&handle);
        Ok(Registration {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            handle,
        })
    }

    /// A device region of exactly `mem` with `access`, outside the cache:
    /// the device checks every access against these bytes, not the whole
    /// pages a cached region spans. For memory a caller registers for its
    /// peers and holds (libfabric's `fi_mr_reg`); dropping the region
    /// deregisters it. Like a cached region, it may outlive its memory:
    /// it then reaches the old pages the kernel pinned or, on the
    /// simulated device, nothing.
    pub fn register_exact(&self, mem: &UserMem, access: Access) -> Result<C::Mr> {
        let r = self.cache.registrar();
        // SAFETY: `mem` was lent under UserMem's contract, which covers a
        // registration from now until it is deregistered or the memory is
        // unmapped; registered as the cache's regions are, the simulated
        // device detaches it when the memory goes.
        unsafe {
            r.ctx
                .reg_mr_cached(&r.pd, mem.addr() as *mut u8, mem.len(), access)
        }
    }

    /// An SGE over `len` bytes at `addr`, which the registration covers.
    pub fn sge(&self, reg: &Registration, addr: usize, len: u32) -> Sge {
        debug_assert!(
            self.covers(reg, addr, len as usize),
            "SGE outside the registration"
        );
        Sge {
            addr: addr as u64,
            length: len,
            lkey: reg.lkey,
        }
    }

    /// The remote address of `addr`, which the registration covers.
    pub fn remote(&self, reg: &Registration, addr: usize) -> RemoteAddr {
        debug_assert!(
            self.covers(reg, addr, 0),
            "address outside the registration"
        );
        RemoteAddr {
            addr: addr as u64,
            rkey: reg.rkey,
        }
    }

    fn covers(&self, reg: &Registration, addr: usize, len: usize) -> bool {
        let r = self.cache.range(&reg.handle);
        addr >= r.start && addr + len <= r.end
    }

    /// Whether the memory of a held registration is still the memory it
    /// registered (no unmap, remap or page removal reported since touched
    /// it; see [`xrcbtl_rcache::RegCache::is_current`]). Without a memory
    /// monitor nothing is ever reported, and it says `true`.
    pub fn is_current(&mut self, reg: &Registration) -> bool {
        self.cache.is_current(&reg.handle)
    }

    /// Gives a registration back.
    pub fn release(&mut self, reg: Registration) {
        self.cache.put(reg.handle);
    }

    /// Drops every unused registration.
    pub fn flush(&mut self) {
        self.cache.flush();
    }

    /// What the cache counted.
    pub fn stats(&self) -> Stats {
        self.cache.stats()
    }

    /// Registrations cached.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_capabilities_say_whether_memlock_applies() {
        let root = "Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(root), Some(0x1ff_ffff_ffff));
        assert!(effective_caps(root).unwrap() & CAP_IPC_LOCK != 0);
        let user = "CapInh:\t0000000000000000\nCapEff:\t0000000000000000\n";
        assert_eq!(effective_caps(user), Some(0));
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
        assert_eq!(effective_caps("Name:\tx\n"), None);
        // This process, if it holds CAP_IPC_LOCK (root here): unlimited.
        let mine = std::fs::read_to_string("/proc/self/status").unwrap();
        if effective_caps(&mine).unwrap() & CAP_IPC_LOCK != 0 {
            assert_eq!(memlock_limit(), usize::MAX);
        }
    }
}
