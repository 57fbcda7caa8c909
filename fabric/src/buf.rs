//! `DmaBuf`: memory the fabric layer allocates and registers itself, so that
//! code above it (bounce buffers, eager rings, tests) never needs `unsafe`.
//!
//! A buffer may be placed on a NUMA node ([`DmaBuf::new_on`]): the one its
//! device hangs off, so that the device's reads and writes and the CPU's
//! copies stay on one socket.
//!
//! The CPU side reads and writes through copies, or through a shared
//! reference lent to a closure, or to a [`ReadInPlace`], for as long as
//! it runs ([`DmaBuf::with_slice`], [`DmaBuf::read_in_place`]), never
//! through references it could keep: the
//! device may write the memory whenever a receive or an RDMA operation
//! targeting it is outstanding. Read what the device wrote only after
//! polling the completion that covers it, and only while nothing is posted
//! that targets those bytes.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::{Access, Context, Error, Mr, RemoteAddr, Result, Sge};

/// Alignment of every buffer: a page, as registration pins whole pages.
const ALIGN: usize = 4096;

/// Highest NUMA node a buffer may be placed on (the kernel's own limit is
/// lower on most builds; a larger number is a caller's mistake).
pub const NUMA_NODE_MAX: u32 = 1023;

/// get_mempolicy: the policy of the page at the address given.
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// Where the memory came from.
enum Backing {
    /// The allocator.
    Heap(Layout),
    /// An anonymous mapping of this many bytes, bound to a NUMA node.
    Map(usize),
}

/// A zeroed, page-aligned allocation registered with a device.
pub struct DmaBuf<C: Context> {
    // Deregistered before the memory is freed (field order, then Drop).
    mr: Option<C::Mr>,
    ptr: NonNull<u8>,
    backing: Backing,
    len: usize,
    node: Option<u32>,
}

// SAFETY: the buffer owns its allocation outright; the CPU touches it only
// through raw copies in `&self` methods, and the device's accesses are
// ordered by the completions the user polls.
unsafe impl<C: Context> Send for DmaBuf<C> {}
// SAFETY: as above: no method hands out references into the memory.
unsafe impl<C: Context> Sync for DmaBuf<C> {}

impl<C: Context> DmaBuf<C> {
    /// Allocates `len` zeroed bytes and registers them in `pd`.
    pub fn new(ctx: &C, pd: &C::Pd, len: usize, access: Access) -> Result<Self> {
        Self::new_on(ctx, pd, len, access, None)
    }

    /// Allocates `len` zeroed bytes on NUMA node `node` (preferred: the
    /// kernel falls back to another node when that one is full) and
    /// registers them in `pd`. When the kernel refuses the placement (no
    /// NUMA support, no such node) the buffer is allocated anyway, unplaced:
    /// [`DmaBuf::node`] tells which happened.
    pub fn new_on(
        ctx: &C,
        pd: &C::Pd,
        len: usize,
        access: Access,
        node: Option<u32>,
    ) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("a DMA buffer needs at least one byte"));
        }
        if node.is_some_and(|n| n > NUMA_NODE_MAX) {
            return Err(Error::invalid(format!(
                "NUMA node {} (at most {NUMA_NODE_MAX})",
                node.unwrap_or_default()
            )));
        }
        let mut buf = match node {
            Some(n) => Self::map_on(len, n)?,
            None => Self::heap(len)?,
        };
        // SAFETY: the allocation is `len` bytes, readable and writable, and
        // is freed only in `drop`, after the region has been deregistered;
        // the CPU never forms references into it.
        buf.mr = Some(unsafe { ctx.reg_mr(pd, buf.ptr.as_ptr(), len, access)? });
        Ok(buf)
    }

    fn heap(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len, ALIGN)
            .map_err(|_| Error::invalid(format!("buffer of {len} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(Error::NoResource("out of memory"))?;
        Ok(DmaBuf {
            mr: None,
            ptr,
            backing: Backing::Heap(layout),
            len,
            node: None,
        })
    }

    /// Maps fresh pages and asks the kernel to take them from `node` when
    /// they are first touched (registration touches them all).
    fn map_on(len: usize, node: u32) -> Result<Self> {
        let map_len = len
            .checked_next_multiple_of(ALIGN)
            .ok_or_else(|| Error::invalid(format!("buffer of {len} bytes")))?;
        // SAFETY: a new private anonymous mapping; no existing memory is
        // affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::NoResource("out of memory (mmap)"));
        }
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or(Error::NoResource("mmap returned null"))?;
        let mut mask = [0 as libc::c_ulong; (NUMA_NODE_MAX as usize + 1) / 64];
        mask[node as usize / 64] |= 1 << (node % 64);
        // Every argument is passed as a full word: the kernel reads
        // unsigned longs, and a narrower variadic argument leaves the upper
        // half of its register undefined.
        // SAFETY: the range is the mapping made above; the mask has
        // NUMA_NODE_MAX + 1 bits (the kernel reads one fewer than maxnode).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                raw as libc::c_ulong,
                map_len as libc::c_ulong,
                libc::MPOL_PREFERRED as libc::c_ulong,
                mask.as_ptr(),
                (mask.len() * 64 + 1) as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        Ok(DmaBuf {
            mr: None,
            ptr,
            backing: Backing::Map(map_len),
            len,
            node: (rc == 0).then_some(node),
        })
    }

    /// The NUMA node the buffer was placed on (`None`: not placed, or the
    /// kernel refused).
    pub fn node(&self) -> Option<u32> {
        self.node
    }

    /// The node the kernel's memory policy prefers for the buffer's first
    /// page, read back with `get_mempolicy` (`None`: the default policy or
    /// another mode). For tests and diagnostics.
    pub fn preferred_node(&self) -> Result<Option<u32>> {
        let mut mode: libc::c_int = 0;
        let mut mask = [0 as libc::c_ulong; (NUMA_NODE_MAX as usize + 1) / 64];
        // SAFETY: the outputs are local and sized as passed; the address is
        // inside this buffer's live allocation.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode as *mut libc::c_int,
                mask.as_mut_ptr(),
                (mask.len() * 64 + 1) as libc::c_ulong,
                self.ptr.as_ptr() as libc::c_ulong,
                MPOL_F_ADDR,
            )
        };
        if rc != 0 {
            return Err(Error::Verbs {
                verb: "get_mempolicy",
                source: std::io::Error::last_os_error(),
            });
        }
        if mode != libc::MPOL_PREFERRED {
            return Ok(None);
        }
        Ok((0..=NUMA_NODE_MAX).find(|&n| mask[n as usize / 64] & (1 << (n % 64)) != 0))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: buffers have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory region.
    pub fn mr(&self) -> &C::Mr {
        self.mr.as_ref().expect("registered until drop")
    }

    /// An SGE over `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        self.mr().sge(offset, len)
    }

    /// The remote address of `offset`.
    pub fn remote(&self, offset: usize) -> RemoteAddr {
        self.mr().remote(offset)
    }

    /// Panics unless `offset..offset + len` is inside the buffer. Inline
    /// (a receive's straight line reads through it), with the panic out of
    /// line.
    #[inline(always)]
    fn check(&self, offset: usize, len: usize) {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            outside(offset, len, self.len);
        }
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: the range is inside the allocation (checked), and `data`
        // cannot overlap it since no reference into the buffer exists.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
    }

    /// Copies `len` bytes at `offset` out of the buffer.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        self.check(offset, len);
        let mut out = vec![0u8; len];
        // SAFETY: the range is inside the allocation (checked); `out` is a
        // fresh allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), len)
        };
        out
    }

    /// Fills `out` with the bytes at `offset`.
    pub fn read_to(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: the range is inside the allocation (checked); `out` is a
        // separate allocation, since no reference into the buffer exists.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
    }

    /// Copies `len` bytes at `offset` into `out` (replacing its contents;
    /// its allocation is reused).
    pub fn read_into(&self, offset: usize, len: usize, out: &mut Vec<u8>) {
        self.check(offset, len);
        out.clear();
        out.reserve(len);
        // SAFETY: the range is inside the allocation (checked); `out` has
        // room for `len` bytes and is a separate allocation; its length is
        // set only after the bytes are written.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), len);
            out.set_len(len);
        }
    }

    /// Lends the `len` bytes at `offset` to `f`, without copying them: a
    /// received message is handed to its consumer in place. The rule of
    /// every read holds: the device has finished writing those bytes (the
    /// completion that covers them was polled), and nothing that targets
    /// them (a receive, an RDMA operation) is posted while `f` runs. Like
    /// posting (whose scatter lists are plain addresses), this relies on
    /// the caller keeping that rule: it is the fabric's soundness boundary,
    /// kept by the layer that owns the buffer (the BTL never writes a
    /// receive buffer from the CPU, and posts it again only after the
    /// message's consumer has returned).
    pub fn with_slice<R>(&self, offset: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        self.read_in_place(offset, len, f)
    }

    /// [`DmaBuf::with_slice`] for a [`ReadInPlace`], whose
    /// [`ReadInPlace::read`] may be inlined where a closure's body may not
    /// (a closure cannot be marked `#[inline]`).
    #[inline(always)]
    pub fn read_in_place<Rd: ReadInPlace>(&self, offset: usize, len: usize, rd: Rd) -> Rd::Out {
        self.check(offset, len);
        // SAFETY: the range is inside the allocation (checked) and stays
        // allocated while `self` is borrowed; the CPU writes the buffer
        // only through `&self` methods that copy, which the caller does not
        // call on this range while `rd` holds it; the device does not write
        // it (the rule above). The reference does not outlive `rd.read`.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) };
        rd.read(bytes)
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole allocation, no references into it exist.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }
}

/// [`DmaBuf::check`]'s panic: range `offset+len` is outside a buffer of
/// `size` bytes.
#[cold]
#[inline(never)]
fn outside(offset: usize, len: usize, size: usize) -> ! {
    panic!("range {offset}+{len} outside a buffer of {size} bytes")
}

/// What reads bytes of a [`DmaBuf`] in place, once
/// ([`DmaBuf::read_in_place`]): a closure (`FnOnce(&[u8]) -> R`), or a
/// type of the caller's whose `read` is marked to be inlined.
pub trait ReadInPlace {
    /// What the reading returns.
    type Out;
    /// Reads `bytes`, lent for the call only.
    fn read(self, bytes: &[u8]) -> Self::Out;
}

impl<R, F: FnOnce(&[u8]) -> R> ReadInPlace for F {
    type Out = R;
    #[inline(always)]
    fn read(self, bytes: &[u8]) -> R {
        self(bytes)
    }
}

impl<C: Context> Drop for DmaBuf<C> {
    fn drop(&mut self) {
        drop(self.mr.take());
        match self.backing {
            // SAFETY: allocated in `heap` with this layout; the region that
            // let the device reach it is gone.
            Backing::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr(), layout) },
            Backing::Map(len) => {
                // SAFETY: the mapping made in `map_on`, of this length; the
                // region that let the device reach it is gone.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), len) };
            }
        }
    }
}
