//! `DmaBuf`: memory the fabric layer allocates and registers itself, so that
//! code above it (bounce buffers, eager rings, tests) never needs `unsafe`.
//!
//! The CPU side reads and writes through copies, never through references,
//! because the device may write the memory whenever a receive or an RDMA
//! operation targeting it is outstanding. Read what the device wrote only
//! after polling the completion that covers it.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::{Access, Context, Error, Mr, RemoteAddr, Result, Sge};

/// Alignment of every buffer: a page, as registration pins whole pages.
const ALIGN: usize = 4096;

/// A zeroed, page-aligned allocation registered with a device.
pub struct DmaBuf<C: Context> {
    // Deregistered before the memory is freed (field order, then Drop).
    mr: Option<C::Mr>,
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
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
        if len == 0 {
            return Err(Error::invalid("a DMA buffer needs at least one byte"));
        }
        let layout = Layout::from_size_align(len, ALIGN)
            .map_err(|_| Error::invalid(format!("buffer of {len} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(Error::NoResource("out of memory"))?;
        let mut buf = DmaBuf {
            mr: None,
            ptr,
            layout,
            len,
        };
        // SAFETY: the allocation is `len` bytes, readable and writable, and
        // is freed only in `drop`, after the region has been deregistered;
        // the CPU never forms references into it.
        buf.mr = Some(unsafe { ctx.reg_mr(pd, ptr.as_ptr(), len, access)? });
        Ok(buf)
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

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "range {offset}+{len} outside a buffer of {} bytes",
            self.len
        );
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

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole allocation, no references into it exist.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }
}

impl<C: Context> Drop for DmaBuf<C> {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: allocated in `new` with this layout; the region that let
        // the device reach it is gone.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
