//! Memory the application lends to the device: [`UserMem`] names a range
//! of the process's own memory for registration through the cache
//! ([`crate::MemCache::register_user`]), and [`MappedBuf`] is an anonymous
//! mapping the application owns, whose contents can be replaced at the same
//! address (what a registration cache must notice).
//!
//! Registering memory the fabric does not own is where RDMA meets Rust's
//! aliasing rules: the device reads and writes it behind the compiler's
//! back. `UserMem::new` is therefore `unsafe`; a `MappedBuf` discharges the
//! contract itself, because it never hands out references into its memory.

use std::ptr::NonNull;

use crate::{Error, Result};

/// A range of this process's memory, lent to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserMem {
    addr: usize,
    len: usize,
}

impl UserMem {
    /// Names `len` bytes at `ptr`.
    ///
    /// # Safety
    /// While any registration of the range is named by a work request or a
    /// remote access that can run (from registration until the operations
    /// that use it have completed, and, for memory registered with remote
    /// access, until it is deregistered or unmapped), and whenever the
    /// library copies into or out of it ([`UserMem::write`],
    /// [`UserMem::read`]: a buffer it was lent for an operation, until that
    /// operation completes):
    /// - the range is mapped memory of this process, readable, and writable
    ///   if a write access is asked for (or the library writes into it);
    /// - no Rust reference points into the parts the device or the library
    ///   may write.
    ///
    /// Unmapping or remapping the range is allowed: the registration cache
    /// hears of it and registers afresh on the next use, and operations
    /// already running reach the old pages (pinned by the kernel) or, on the
    /// simulated device, nothing.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<UserMem> {
        if ptr.is_null() || len == 0 {
            return Err(Error::invalid(format!(
                "user memory of {len} bytes at {ptr:p}: needs a non-null address and a length"
            )));
        }
        (ptr as usize)
            .checked_add(len)
            .ok_or_else(|| Error::invalid("user memory wraps around the address space"))?;
        Ok(UserMem {
            addr: ptr as usize,
            len,
        })
    }

    /// First byte.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` into the range at `off` (a receive landing in the
    /// caller's buffer), under the promise [`UserMem::new`] took.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        // SAFETY: inside the range (checked), which the creator promised is
        // writable and unaliased while the library writes it; `data` is a
        // Rust slice, so not a part of the range anyone may write.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (self.addr + off) as *mut u8, data.len())
        };
        Ok(())
    }

    /// Copies `len` bytes out of the range at `off` (a send taken from the
    /// caller's buffer), under the promise [`UserMem::new`] took.
    pub fn read(&self, off: usize, len: usize) -> Result<Vec<u8>> {
        self.check(off, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: inside the range (checked), readable by the creator's
        // promise; `out` is a fresh allocation.
        unsafe {
            std::ptr::copy_nonoverlapping((self.addr + off) as *const u8, out.as_mut_ptr(), len)
        };
        Ok(out)
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::invalid(format!(
                "{off}+{len} outside user memory of {} bytes",
                self.len
            ))),
        }
    }

    /// The part `off..off + len` of the range.
    pub fn slice(&self, off: usize, len: usize) -> Result<UserMem> {
        match off.checked_add(len) {
            Some(end) if end <= self.len && len > 0 => Ok(UserMem {
                addr: self.addr + off,
                len,
            }),
            _ => Err(Error::invalid(format!(
                "{off}+{len} outside user memory of {} bytes",
                self.len
            ))),
        }
    }
}

/// An anonymous, private, page-aligned mapping owned by the application:
/// user memory for tests and examples. The CPU side reads and writes it
/// through copies only, so the device may access it at any time.
pub struct MappedBuf {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: the mapping is owned outright; no method hands out references into
// it, and the CPU touches it only through raw copies.
unsafe impl Send for MappedBuf {}
// SAFETY: as above.
unsafe impl Sync for MappedBuf {}

impl std::fmt::Debug for MappedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedBuf({} bytes at {:p})", self.len, self.ptr)
    }
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(1)
}

/// Maps `len` bytes of fresh zero pages, at `at` if given (replacing what
/// is mapped there).
///
/// # Safety
/// With `at`, the range must be a mapping the caller owns and to which no
/// references exist.
unsafe fn map_anon(at: Option<NonNull<u8>>, len: usize) -> Result<NonNull<u8>> {
    let (addr, fixed) = match at {
        Some(p) => (p.as_ptr().cast(), libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: an anonymous private mapping; with MAP_FIXED the caller owns
    // the range being replaced.
    let p = unsafe {
        libc::mmap(
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::Verbs {
            verb: "mmap",
            source: std::io::Error::last_os_error(),
        });
    }
    NonNull::new(p.cast()).ok_or(Error::NoResource("mmap returned null"))
}

impl MappedBuf {
    /// Maps `len` zeroed bytes (rounded up to whole pages).
    pub fn new(len: usize) -> Result<MappedBuf> {
        if len == 0 {
            return Err(Error::invalid("a mapping needs at least one byte"));
        }
        let map_len = len
            .checked_next_multiple_of(page())
            .ok_or_else(|| Error::invalid(format!("mapping of {len} bytes")))?;
        // SAFETY: a fresh mapping anywhere.
        let ptr = unsafe { map_anon(None, map_len)? };
        Ok(MappedBuf { ptr, len, map_len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its first byte's address.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The whole buffer as user memory.
    pub fn user_mem(&self) -> UserMem {
        UserMem {
            addr: self.addr(),
            len: self.len,
        }
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len),
            "range {off}+{len} outside a mapping of {} bytes",
            self.len
        );
    }

    /// Copies `data` in at `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        // SAFETY: inside the mapping (checked); `data` is not in it, since no
        // reference into the mapping exists.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }

    /// Copies `len` bytes out at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        self.check(off, len);
        let mut out = vec![0u8; len];
        // SAFETY: inside the mapping (checked); `out` is a fresh allocation.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), len) };
        out
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole buffer; no references into it exist.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }

    /// Replaces the memory with fresh zero pages at the same address, as
    /// `munmap` followed by an `mmap` that lands there again would: the old
    /// pages go back to the kernel, and a registration of them must not be
    /// used for the new ones.
    pub fn remap(&mut self) -> Result<()> {
        // SAFETY: the range is this buffer's own mapping, and `&mut self`
        // means nothing borrows it.
        let p = unsafe { map_anon(Some(self.ptr), self.map_len)? };
        if p != self.ptr {
            return Err(Error::state("MAP_FIXED moved the mapping"));
        }
        Ok(())
    }

    /// Gives the pages back to the kernel (`madvise(MADV_DONTNEED)`), as an
    /// allocator trimming its heap does: the memory stays mapped and reads
    /// as zeros, and a registration of the old pages must not be used for
    /// it.
    pub fn discard(&mut self) -> Result<()> {
        // SAFETY: advice on this buffer's own mapping; `&mut self` means
        // nothing borrows it.
        let r =
            unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.map_len, libc::MADV_DONTNEED) };
        if r != 0 {
            return Err(Error::Verbs {
                verb: "madvise",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

impl Drop for MappedBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_in_and_out_stay_inside_the_range() {
        let buf = MappedBuf::new(4096).unwrap();
        let mem = buf.user_mem().slice(100, 50).unwrap();
        mem.write(10, b"hello").unwrap();
        assert_eq!(buf.read(110, 5), b"hello");
        assert_eq!(mem.read(10, 5).unwrap(), b"hello");
        assert!(mem.write(46, b"hello").is_err(), "past the end");
        assert!(mem.read(usize::MAX, 2).is_err(), "wrapping");
        mem.write(50, b"").unwrap();
        assert_eq!(buf.read(150, 1), [0], "nothing past the slice was written");
    }
}
