//! The simulated device's DMA engine: the only place the simulator touches
//! application memory through raw addresses.
//!
//! Callers check every range against a live memory region (lkey or rkey,
//! protection domain, access, bounds) before calling in, under the world
//! lock, and skip regions the memory monitor reported unmapped (detached);
//! registration is `unsafe` and its contract makes the range valid whenever
//! a work request or remote access names it.

/// Reads `len` bytes at `addr` (the device gathering a send or serving a
/// read).
pub(crate) fn dma_read(addr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    if len > 0 {
        // SAFETY: the caller validated [addr, addr+len) against a live,
        // attached memory region; `reg_mr`'s contract keeps that range
        // readable while work names it. Raw copies create no references into
        // the range.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), len) };
    }
    out
}

/// Writes `data` at `addr` (the device scattering a receive, an RDMA write or
/// a read response).
pub(crate) fn dma_write(addr: u64, data: &[u8]) {
    if !data.is_empty() {
        // SAFETY: the caller validated [addr, addr+len) against a live,
        // attached memory region with local or remote write access;
        // `reg_mr`'s contract keeps it writable while work names it. `data`
        // is a separate allocation, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
    }
}
