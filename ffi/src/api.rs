//! The entry points on a rank's handle: peers, active messages, memory,
//! one-sided operations and atomics, progress, errors, counters.
//!
//! Every function runs its body in [`guard`]: a panic becomes
//! `XRCBTL_ERR_PANIC`, an error its status with the message kept for
//! `xrcbtl_last_error`.

use std::ffi::{c_char, c_int, c_void, CString};
use std::time::{Duration, Instant};

use xrcbtl_btl::{
    Access, Btl, LocalPtr, MemReg, Mode, OnDone, OpId, OpStatus, RawMemReg, RemoteMem, RemotePtr,
    UserMem,
};
use xrcbtl_fabric::Context;

use crate::handle::{handle, on_btl, xrcbtl_t, Arg, HandlePtr};
use crate::status::*;
use crate::types::*;

/// `len` bytes at `p` (which may be `NULL` when `len` is 0).
///
/// # Safety
/// `p` points to `len` readable bytes that stay unchanged during the call.
#[inline(always)]
unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &'static str) -> Outcome<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null_bytes(what, len));
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// [`bytes`]'s failure, out of line: a send's path then keeps no words
/// of the message on its stack.
#[cold]
#[inline(never)]
fn null_bytes(what: &'static str, len: usize) -> Failure {
    Failure::invalid(format!("{what} is NULL with {len} bytes"))
}

/// Writes through an out-pointer that must not be `NULL`.
///
/// # Safety
/// `p` is `NULL` or valid for a write of `T`.
unsafe fn put_out<T>(p: *mut T, v: T, what: &str) -> Outcome<()> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller's promise.
    unsafe { p.write(v) };
    Ok(())
}

/// The version of the ABI this library implements (`XRCBTL_ABI_VERSION`
/// of its header).
#[no_mangle]
pub extern "C" fn xrcbtl_abi_version() -> u32 {
    XRCBTL_ABI_VERSION
}

/// Releases a rank: every verbs object and registration, the listener,
/// the memory monitor when no other rank uses it. Call `xrcbtl_shutdown`
/// first for a clean exit (peers then see a departure, not a failure).
/// The handle is invalid afterwards. A rank of a simulated job is
/// destroyed with its job (`XRCBTL_ERR_STATE`).
///
/// # Safety
/// `btl` is `NULL` or a live handle no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_destroy(btl: *mut xrcbtl_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        if h.in_sim {
            return Err(Failure::new(
                XRCBTL_ERR_STATE,
                "a rank of a simulated job is destroyed with the job (xrcbtl_sim_destroy)",
            ));
        }
        // SAFETY: a live handle made by Box::into_raw, given back once.
        let mut b = unsafe { Box::from_raw(btl) };
        b.kill();
        drop(b);
        Ok(XRCBTL_OK)
    })
}

/// Writes the address peers need (to pass to their `xrcbtl_add_peer`)
/// into `buf`; `*len` holds its capacity and receives the length
/// (at most `XRCBTL_ADDRESS_MAX`). Too small a buffer: `XRCBTL_ERR_INVALID`
/// with `*len` set to the length needed.
///
/// # Safety
/// `btl` is a live handle; `buf` has `*len` writable bytes; `len` is valid.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_address(
    btl: *mut xrcbtl_t,
    buf: *mut c_void,
    len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        if len.is_null() {
            return Err(Failure::invalid("len is NULL"));
        }
        let a =
            h.me.encode()
                .ok_or_else(|| Failure::invalid("the node key does not fit an address"))?;
        // SAFETY: `len` is valid (checked non-null, the caller's promise).
        let cap = unsafe { *len };
        // SAFETY: as above.
        unsafe { *len = a.len() };
        if cap < a.len() || buf.is_null() {
            return Err(Failure::invalid(format!(
                "the address needs {} bytes, the buffer has {cap}",
                a.len()
            )));
        }
        // SAFETY: `buf` has `cap >= a.len()` writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), buf.cast::<u8>(), a.len()) };
        Ok(XRCBTL_OK)
    })
}

/// Adds peer `rank` from the address it published. Connections are made
/// on first use. May be called at any time, from any thread, also from
/// inside a callback; adding a known peer again keeps its endpoint. The
/// address must be `rank`'s own.
///
/// # Safety
/// `btl` is a live handle; `addr` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_add_peer(
    btl: *mut xrcbtl_t,
    rank: u32,
    addr: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let peer = h.peer(rank, unsafe { bytes(addr, len, "addr") }?)?;
        on_btl!(h, b => b.add_procs(&[peer]))?;
        Ok(XRCBTL_OK)
    })
}

/// Sets how this rank finds a peer that asks for a connection before it
/// was added with `xrcbtl_add_peer` (an MPI library adds peers lazily, when
/// it first sends to them, so the first message between two ranks may
/// come from a rank the receiver has not added): `cb` writes the address
/// that rank published, which is checked and added as `xrcbtl_add_peer`
/// would. Without a resolver, or when `cb` returns 0, such connections are
/// refused and the sender sees the rank as unreachable. `cb` `NULL`
/// removes the resolver.
///
/// # Safety
/// `btl` is a live handle; `cb` and `arg` stay usable while the handle
/// lives.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_set_peer_resolver(
    btl: *mut xrcbtl_t,
    cb: xrcbtl_resolve_cb_t,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        let (hp, arg) = (HandlePtr(btl), Arg(arg));
        on_btl!(h, b => b.set_peer_resolver(move |rank| {
            let (hp, arg) = (&hp, &arg);
            let f = cb?;
            let mut buf = [0u8; XRCBTL_ADDRESS_MAX];
            // SAFETY: the C callback with the arguments it was given for;
            // `buf` has `buf.len()` writable bytes.
            let len = unsafe { f(hp.0, rank, buf.as_mut_ptr().cast(), buf.len(), arg.0) };
            // SAFETY: the BTL calling this lives inside the handle, so the
            // handle is live while it runs.
            let h = unsafe { &*hp.0 };
            h.peer(rank, buf.get(..len)?).ok()
        }));
        Ok(XRCBTL_OK)
    })
}

/// Drops peer `rank`: its outstanding operations fail with
/// `XRCBTL_ERR_CLOSED` and the error callback runs. Needs nothing from
/// the peer (which may be gone).
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_del_peer(btl: *mut xrcbtl_t, rank: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        on_btl!(h, b => b.del_procs(&[rank]));
        Ok(XRCBTL_OK)
    })
}

/// Starts connecting to `rank` now (otherwise the first operation does).
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_connect(btl: *mut xrcbtl_t, rank: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        on_btl!(h, b => b.connect(rank))?;
        Ok(XRCBTL_OK)
    })
}

/// 1 if messages to `rank` can be posted now (a connection is up), else 0.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_is_connected(btl: *mut xrcbtl_t, rank: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        Ok(c_int::from(on_btl!(h, b => b.is_connected(rank))))
    })
}

/// Sets (or with `cb` `NULL` removes) the callback of messages with `tag`.
/// A message whose tag has no callback is dropped and counted
/// (`xrcbtl_stats_t.unhandled`).
///
/// # Safety
/// `btl` is a live handle; `cb` and `arg` stay usable while registered.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_register_am(
    btl: *mut xrcbtl_t,
    tag: u8,
    cb: xrcbtl_am_cb_t,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        let Some(f) = cb else {
            on_btl!(h, b => b.deregister_am(tag));
            return Ok(XRCBTL_OK);
        };
        let (hp, arg) = (HandlePtr(btl), Arg(arg));
        on_btl!(h, b => b.register_am(tag, move |_, m| {
            let (hp, arg) = (&hp, &arg);
            // SAFETY: the C callback with the arguments it was registered
            // for; the data is valid during the call.
            unsafe { f(hp.0, m.src, m.tag, m.data.as_ptr().cast(), m.data.len(), arg.0) }
        }));
        Ok(XRCBTL_OK)
    })
}

/// Sends `header` then `payload` (the receiver's callback sees them
/// contiguous) with `tag` to `dst`. Complete when it returns: the bytes
/// are copied (or posted inline), and go as soon as the connection, the
/// send queue and flow control allow. At most `xrcbtl_max_send_size`
/// bytes in all.
///
/// # Safety
/// `btl` is a live handle; the pointers have their lengths of readable
/// bytes (or are `NULL` with length 0).
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_send(
    btl: *mut xrcbtl_t,
    dst: u32,
    tag: u8,
    header: *const c_void,
    header_len: usize,
    payload: *const c_void,
    payload_len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let (hd, pl) = unsafe {
            (
                bytes(header, header_len, "header")?,
                bytes(payload, payload_len, "payload")?,
            )
        };
        on_btl!(h, b => b.send(dst, tag, hd, pl))?;
        Ok(XRCBTL_OK)
    })
}

/// Sends like `xrcbtl_send` if the message can be posted right now;
/// otherwise sends nothing and returns `XRCBTL_ERR_AGAIN` (no connection
/// yet, work already waiting to that peer, no send slot or credit).
///
/// # Safety
/// As `xrcbtl_send`.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sendi(
    btl: *mut xrcbtl_t,
    dst: u32,
    tag: u8,
    header: *const c_void,
    header_len: usize,
    payload: *const c_void,
    payload_len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let (hd, pl) = unsafe {
            (
                bytes(header, header_len, "header")?,
                bytes(payload, payload_len, "payload")?,
            )
        };
        Ok(if on_btl!(h, b => b.sendi(dst, tag, hd, pl))? {
            XRCBTL_OK
        } else {
            XRCBTL_ERR_AGAIN
        })
    })
}

/// The most bytes (header and payload) `xrcbtl_send` takes; 0 for a bad
/// handle.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_max_send_size(btl: *mut xrcbtl_t) -> usize {
    let mut n = 0;
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        n = on_btl!(h, b => b.max_send_size());
        Ok(XRCBTL_OK)
    });
    n
}

/// Registers `len` bytes at `addr` for one-sided operations and atomics
/// (`access`: `XRCBTL_ACCESS_*`, what peers may do; local writes are
/// always allowed) through the registration cache: registering the same
/// memory again is cheap, and memory freed, unmapped or remapped since is
/// registered afresh. Give it back with `xrcbtl_deregister_mem`. If the
/// memory is unmapped or remapped while the registration is held,
/// operations naming it fail with `XRCBTL_ERR_STATE`: deregister it and
/// register the memory again.
///
/// # Safety
/// `btl` is a live handle; `out` is writable. The memory stays mapped
/// while operations use it, and no other code relies on it not changing
/// while peers may write it.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_register_mem(
    btl: *mut xrcbtl_t,
    addr: *mut c_void,
    len: usize,
    access: u32,
    out: *mut xrcbtl_mem_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        if access
            & !(XRCBTL_ACCESS_REMOTE_READ
                | XRCBTL_ACCESS_REMOTE_WRITE
                | XRCBTL_ACCESS_REMOTE_ATOMIC)
            != 0
        {
            return Err(Failure::invalid(format!("unknown access bits {access:#x}")));
        }
        let mut acc = Access::from_bits(0);
        if access & XRCBTL_ACCESS_REMOTE_READ != 0 {
            acc |= Access::REMOTE_READ;
        }
        if access & XRCBTL_ACCESS_REMOTE_WRITE != 0 {
            acc |= Access::REMOTE_WRITE;
        }
        if access & XRCBTL_ACCESS_REMOTE_ATOMIC != 0 {
            acc |= Access::REMOTE_ATOMIC;
        }
        // SAFETY: the caller keeps UserMem's contract (this function's).
        let mem = unsafe { UserMem::new(addr.cast(), len) }?;
        let reg = on_btl!(h, b => b.register_mem(mem, acc))?;
        let r = reg.to_raw();
        // SAFETY: the caller's promise.
        unsafe {
            put_out(
                out,
                xrcbtl_mem_t {
                    addr: r.addr,
                    len: r.len,
                    id: r.id,
                    lkey: r.lkey,
                    rkey: r.rkey,
                },
                "out",
            )
        }?;
        Ok(XRCBTL_OK)
    })
}

fn mem_reg(m: &xrcbtl_mem_t) -> MemReg {
    MemReg::from_raw(RawMemReg {
        id: m.id,
        addr: m.addr,
        len: m.len,
        lkey: m.lkey,
        rkey: m.rkey,
    })
}

/// Gives a registration back. Operations started with it afterwards are
/// refused.
///
/// # Safety
/// `btl` is a live handle; `mem` is readable.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_deregister_mem(
    btl: *mut xrcbtl_t,
    mem: *const xrcbtl_mem_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let m = unsafe { mem.as_ref() }.ok_or_else(|| Failure::invalid("mem is NULL"))?;
        on_btl!(h, b => b.deregister_mem(mem_reg(m)))?;
        Ok(XRCBTL_OK)
    })
}

/// Writes the `XRCBTL_REMOTE_MEM_SIZE` bytes a peer needs to reach the
/// registered memory (address, length, key) into `out`.
///
/// # Safety
/// `mem` is readable; `out` has `XRCBTL_REMOTE_MEM_SIZE` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_mem_pack(mem: *const xrcbtl_mem_t, out: *mut u8) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let m = unsafe { mem.as_ref() }.ok_or_else(|| Failure::invalid("mem is NULL"))?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let packed = mem_reg(m).remote().pack();
        // SAFETY: `out` has room for the packed handle.
        unsafe { std::ptr::copy_nonoverlapping(packed.as_ptr(), out, packed.len()) };
        Ok(XRCBTL_OK)
    })
}

/// Address `addr` of a peer's memory, given by its packed handle.
///
/// # Safety
/// `p` is `NULL` or has `XRCBTL_REMOTE_MEM_SIZE` readable bytes.
unsafe fn remote_at(p: *const u8, addr: u64) -> Outcome<RemotePtr> {
    // SAFETY: the caller's promise.
    let raw = unsafe { bytes(p.cast(), RemoteMem::PACKED_LEN, "remote") }?;
    let r = RemoteMem::unpack(raw).ok_or_else(|| Failure::invalid("not a packed memory handle"))?;
    Ok(r.at(addr.wrapping_sub(r.addr)))
}

/// Address `addr` of a local registration.
///
/// # Safety
/// `m` is `NULL` or readable.
unsafe fn local_at(m: *const xrcbtl_mem_t, addr: *const c_void) -> Outcome<LocalPtr> {
    // SAFETY: the caller's promise.
    let l = mem_reg(unsafe { m.as_ref() }.ok_or_else(|| Failure::invalid("local is NULL"))?);
    Ok(l.at((addr as u64).wrapping_sub(l.addr())))
}

/// The completion closure of a C callback.
fn on_done<C: Context>(
    btl: *mut xrcbtl_t,
    cb: xrcbtl_done_cb_t,
    arg: *mut c_void,
) -> Option<OnDone<C>> {
    let f = cb?;
    let (hp, arg) = (HandlePtr(btl), Arg(arg));
    Some(Box::new(move |_: &Btl<C>, op: OpId, res| {
        let (hp, arg) = (&hp, &arg);
        let (status, value) = match res {
            Ok(v) => (XRCBTL_OK, v.unwrap_or(0)),
            Err(e) => (btl_error_code(&e), 0),
        };
        // SAFETY: the C callback with the arguments it was given for.
        unsafe { f(hp.0, op.raw(), status, value, arg.0) }
    }))
}

/// Stores a started operation's id.
///
/// # Safety
/// `op_out` is `NULL` or writable.
unsafe fn started(op: OpId, op_out: *mut u64) -> Outcome<c_int> {
    if !op_out.is_null() {
        // SAFETY: the caller's promise.
        unsafe { op_out.write(op.raw()) };
    }
    Ok(XRCBTL_OK)
}

/// Writes `len` bytes at `local_addr` (inside `local`) into rank `dst`'s
/// memory at `remote_addr` (inside the packed handle `remote`). `cb`
/// (optional) runs when the source may be reused; the operation's id goes
/// to `op_out` (optional) for `xrcbtl_test`. On InfiniBand and RoCE the
/// data has landed at completion; on iWARP it has landed by the time
/// anything sent to the peer after it arrives.
///
/// # Safety
/// `btl` is a live handle; `local` readable; `remote` has
/// `XRCBTL_REMOTE_MEM_SIZE` readable bytes; `op_out` `NULL` or writable;
/// `cb` and `arg` stay usable until the callback has run.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_put(
    btl: *mut xrcbtl_t,
    dst: u32,
    local: *const xrcbtl_mem_t,
    local_addr: *const c_void,
    remote: *const u8,
    remote_addr: u64,
    len: usize,
    cb: xrcbtl_done_cb_t,
    arg: *mut c_void,
    op_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let from = unsafe { local_at(local, local_addr) }?;
        // SAFETY: the caller's promise.
        let to = unsafe { remote_at(remote, remote_addr) }?;
        let op = on_btl!(h, b => b.put(dst, from, to, len, on_done(btl, cb, arg)))?;
        // SAFETY: the caller's promise.
        unsafe { started(op, op_out) }
    })
}

/// Reads `len` bytes of rank `dst`'s memory at `remote_addr` (inside
/// `remote`) into `local_addr` (inside `local`). As `xrcbtl_put`
/// otherwise; the data is in place when `cb` runs.
///
/// # Safety
/// As `xrcbtl_put`.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_get(
    btl: *mut xrcbtl_t,
    dst: u32,
    local: *const xrcbtl_mem_t,
    local_addr: *mut c_void,
    remote: *const u8,
    remote_addr: u64,
    len: usize,
    cb: xrcbtl_done_cb_t,
    arg: *mut c_void,
    op_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let to = unsafe { local_at(local, local_addr.cast_const()) }?;
        // SAFETY: the caller's promise.
        let from = unsafe { remote_at(remote, remote_addr) }?;
        let op = on_btl!(h, b => b.get(dst, from, to, len, on_done(btl, cb, arg)))?;
        // SAFETY: the caller's promise.
        unsafe { started(op, op_out) }
    })
}

/// Adds `add` to the 64-bit word at `remote_addr` (8-byte aligned, inside
/// `remote`, registered with `XRCBTL_ACCESS_REMOTE_ATOMIC`) of rank `dst`;
/// `cb` gets the value found there. `XRCBTL_ERR_UNSUPPORTED` on a device
/// without atomics.
///
/// # Safety
/// As `xrcbtl_put` (without `local`).
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_fetch_add(
    btl: *mut xrcbtl_t,
    dst: u32,
    remote: *const u8,
    remote_addr: u64,
    add: u64,
    cb: xrcbtl_done_cb_t,
    arg: *mut c_void,
    op_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let at = unsafe { remote_at(remote, remote_addr) }?;
        let op = on_btl!(h, b => b.fetch_add(dst, at, add, on_done(btl, cb, arg)))?;
        // SAFETY: the caller's promise.
        unsafe { started(op, op_out) }
    })
}

/// Stores `swap` in the 64-bit word at `remote_addr` of rank `dst` if it
/// holds `compare`; `cb` gets the value found there. As
/// `xrcbtl_fetch_add` otherwise.
///
/// # Safety
/// As `xrcbtl_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_compare_swap(
    btl: *mut xrcbtl_t,
    dst: u32,
    remote: *const u8,
    remote_addr: u64,
    compare: u64,
    swap: u64,
    cb: xrcbtl_done_cb_t,
    arg: *mut c_void,
    op_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let at = unsafe { remote_at(remote, remote_addr) }?;
        let op = on_btl!(h, b => b.compare_swap(dst, at, compare, swap, on_done(btl, cb, arg)))?;
        // SAFETY: the caller's promise.
        unsafe { started(op, op_out) }
    })
}

/// Adds `add` to the 64-bit word at `remote_addr` of rank `dst`, reporting
/// nothing back but completion. As `xrcbtl_fetch_add` otherwise.
///
/// # Safety
/// As `xrcbtl_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_atomic_add(
    btl: *mut xrcbtl_t,
    dst: u32,
    remote: *const u8,
    remote_addr: u64,
    add: u64,
    cb: xrcbtl_done_cb_t,
    arg: *mut c_void,
    op_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        // SAFETY: the caller's promise.
        let at = unsafe { remote_at(remote, remote_addr) }?;
        let op = on_btl!(h, b => b.add(dst, at, add, on_done(btl, cb, arg)))?;
        // SAFETY: the caller's promise.
        unsafe { started(op, op_out) }
    })
}

/// Where operation `op` is: 1 done, 0 still moving, or the status it
/// failed with (reported once). Unknown ids are done.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_test(btl: *mut xrcbtl_t, op: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        match on_btl!(h, b => b.test(OpId::from_raw(op))) {
            OpStatus::Done => Ok(1),
            OpStatus::Pending => Ok(0),
            OpStatus::Failed(e) => Err(Failure::new(btl_error_code(&e), e.to_string())),
        }
    })
}

/// Does what is due (connection events, completions, queued work), then
/// runs the callbacks of what arrived. Returns how many events it handled.
/// Any thread may call it, several at once; callbacks run one at a time.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_progress(btl: *mut xrcbtl_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        let n = on_btl!(h, b => b.progress());
        Ok(n.min(c_int::MAX as usize) as c_int)
    })
}

/// 1 if nothing is outstanding (no queued or in-flight work, no operation,
/// nothing to deliver), else 0.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_is_idle(btl: *mut xrcbtl_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        Ok(c_int::from(on_btl!(h, b => b.is_idle())))
    })
}

fn wall_only(h: &xrcbtl_t, what: &str) -> Outcome<()> {
    if h.in_sim {
        return Err(Failure::new(
            XRCBTL_ERR_STATE,
            format!("{what} waits in wall-clock time; a simulated job moves by xrcbtl_sim_step"),
        ));
    }
    Ok(())
}

/// Progresses until nothing is outstanding (everything started before and
/// during the call has completed), or fails with `XRCBTL_ERR_TIMEOUT`
/// after `timeout_us` microseconds.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_flush(btl: *mut xrcbtl_t, timeout_us: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        wall_only(h, "xrcbtl_flush")?;
        on_btl!(h, b => b.flush(Duration::from_micros(timeout_us)))?;
        Ok(XRCBTL_OK)
    })
}

/// Leaves cleanly: tells the peers this rank is going, and progresses
/// until they know (or `timeout_us` passes: `XRCBTL_ERR_TIMEOUT`). Then
/// `xrcbtl_destroy`.
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_shutdown(btl: *mut xrcbtl_t, timeout_us: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        wall_only(h, "xrcbtl_shutdown")?;
        let end = Instant::now() + Duration::from_micros(timeout_us);
        on_btl!(h, b => {
            b.shutdown();
            while !b.is_drained() {
                if Instant::now() >= end {
                    return Err(Failure::new(XRCBTL_ERR_TIMEOUT, "peers did not confirm the departure in time"));
                }
                if b.progress() == 0 {
                    std::thread::yield_now();
                }
            }
        });
        Ok(XRCBTL_OK)
    })
}

/// Microseconds until progress is next needed for a connection timer, or
/// -1 if no timer is set (for a caller that sleeps between progress
/// calls).
///
/// # Safety
/// `btl` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_next_timeout_us(btl: *mut xrcbtl_t) -> i64 {
    let mut t = -1;
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        if let Some(d) = on_btl!(h, b => b.next_timeout()) {
            t = d.as_micros().min(i64::MAX as u128) as i64;
        }
        Ok(XRCBTL_OK)
    });
    t
}

/// Sets the callback run when the endpoint to a peer fails for good (the
/// peer's process died, it became unreachable). `NULL` removes it.
///
/// # Safety
/// `btl` is a live handle; `cb` and `arg` stay usable while registered.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_set_error_callback(
    btl: *mut xrcbtl_t,
    cb: xrcbtl_error_cb_t,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        let (hp, arg) = (HandlePtr(btl), Arg(arg));
        on_btl!(h, b => b.register_error(move |_, rank, err| {
            let (hp, arg) = (&hp, &arg);
            if let Some(f) = cb {
                let reason = CString::new(err.to_string().replace('\0', " ")).unwrap_or_default();
                // SAFETY: the C callback with the arguments it was given
                // for; the reason lives through the call.
                unsafe { f(hp.0, rank, btl_error_code(err), reason.as_ptr(), arg.0) }
            }
        }));
        Ok(XRCBTL_OK)
    })
}

/// Copies `src` into a fixed C string field (cut to fit, NUL-terminated).
fn c_field(dst: &mut [c_char], src: &str) {
    let n = src.len().min(dst.len() - 1);
    for (d, s) in dst.iter_mut().zip(src.as_bytes()[..n].iter()) {
        *d = *s as c_char;
    }
    dst[n] = 0;
}

/// Fills `out` with what the rank is and can do.
///
/// # Safety
/// `btl` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_query(btl: *mut xrcbtl_t, out: *mut xrcbtl_info_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        let mut info = xrcbtl_info_t {
            rank: 0,
            mode: XRCBTL_MODE_XRC,
            flags: 0,
            max_send_size: 0,
            max_rma: xrcbtl_btl::MAX_RMA,
            max_inline: 0,
            device: [0; 64],
            max_registration: 0,
        };
        on_btl!(h, b => {
            info.rank = b.rank();
            info.mode = match b.mode() {
                Mode::Xrc => XRCBTL_MODE_XRC,
                Mode::Rc { .. } => XRCBTL_MODE_RC,
            };
            let caps = b.caps();
            info.flags |= if caps.atomics { XRCBTL_INFO_ATOMICS } else { 0 };
            info.flags |= if b.uses_credits() { XRCBTL_INFO_CREDITS } else { 0 };
            info.flags |= if h.in_sim { XRCBTL_INFO_SIMULATED } else { 0 };
            info.flags |= if b.rndv_puts() { XRCBTL_INFO_PREFERS_PUT } else { 0 };
            info.max_send_size = b.max_send_size() as u64;
            info.max_inline = b.config().max_inline.min(caps.max_inline);
            info.max_registration = caps.max_mr_size;
            c_field(&mut info.device, b.device());
        });
        // SAFETY: the caller's promise.
        unsafe { put_out(out, info, "out") }?;
        Ok(XRCBTL_OK)
    })
}

/// Fills `out` with the rank's counters.
///
/// # Safety
/// `btl` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_stats(btl: *mut xrcbtl_t, out: *mut xrcbtl_stats_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let h = unsafe { handle(btl) }?;
        let s = on_btl!(h, b => {
            let s = b.stats();
            let (created, live) = b.with_manager(|m| (m.counters().qps_created, m.live_qps()));
            let cache = b.rcache_stats();
            xrcbtl_stats_t {
                eager_sent: s.eager_sent,
                inline_sent: s.inline_sent,
                eager_received: s.eager_received,
                bytes_received: s.bytes_received,
                rdma: s.rdma_frags,
                atomics: s.atomics,
                retransmits: s.retransmits,
                no_resource: s.no_resource,
                unhandled: s.unhandled,
                lost: s.lost,
                qps_created: created,
                live_qps: live as u64,
                reg_hits: cache.hits,
                reg_misses: cache.misses,
            }
        });
        // SAFETY: the caller's promise.
        unsafe { put_out(out, s, "out") }?;
        Ok(XRCBTL_OK)
    })
}
