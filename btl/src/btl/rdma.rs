//! One-sided work on memory: allocating and registering it for peers,
//! puts, gets and atomics, and where an operation is.

use std::sync::Arc;

use xrcbtl_fabric::{Access, Context, Error, Result, UserMem};
use xrcbtl_xrc_conn::Rank;

use crate::core::Core;
use crate::proto::atomic::{atomic, Atomic};
use crate::proto::rma::transfer;
use crate::types::{LocalPtr, MemReg, OpId, OpStatus, RegMem, RemotePtr};

use super::{Btl, OnDone};

impl<C: Context> Btl<C> {
    /// Allocates and registers `len` bytes for one-sided operations and
    /// atomics.
    pub fn alloc_mem(&self, len: usize) -> Result<RegMem<C>> {
        let mut access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        if self.facts.caps.atomics {
            access |= Access::REMOTE_ATOMIC;
        }
        Ok(RegMem(Arc::new(self.lock().alloc_mem(len, access)?)))
    }

    /// Registers user memory for one-sided operations, through the
    /// registration cache: registering the same memory again is cheap, and
    /// memory unmapped or remapped since is registered afresh. `access`
    /// says what peers may do (`REMOTE_READ`, `REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`; local writes, which gets and remote writes need, are
    /// added, and on iWARP, where the sink of an RDMA read must take remote
    /// writes, so is `REMOTE_WRITE`). Give it back with
    /// [`Btl::deregister_mem`].
    ///
    /// Memory unmapped or remapped while a registration of it is held: the
    /// operations that name the registration afterwards are refused
    /// (`InvalidState`), since it would move the old pages; deregister it
    /// and register the memory again. A peer using the old remote handle
    /// reaches the old pages (pinned by the kernel until deregistration),
    /// never the new ones.
    pub fn register_mem(&self, mem: UserMem, access: Access) -> Result<MemReg> {
        let access = self.user_access(access)?;
        self.lock().register_mem(mem, access)
    }

    /// Gives a user registration back: operations started with it
    /// afterwards are refused; those already posted finish (the cache may
    /// keep the memory registered until it is unmapped).
    pub fn deregister_mem(&self, reg: MemReg) -> Result<()> {
        let exact = self.lock().deregister_mem(reg)?;
        // An exact region is deregistered outside the lock: a device call.
        drop(exact);
        Ok(())
    }

    /// The rights a user registration asked for `access` takes: local
    /// writes always, and on iWARP remote writes (the sink of an RDMA read
    /// must take them); atomics only where the device has them.
    fn user_access(&self, access: Access) -> Result<Access> {
        if access.contains(Access::REMOTE_ATOMIC) && !self.facts.caps.atomics {
            return Err(Error::Unsupported("the device has no atomics"));
        }
        let mut access = access | Access::LOCAL_WRITE;
        if self.facts.caps.transport == xrcbtl_fabric::Transport::Iwarp {
            access |= Access::REMOTE_WRITE;
        }
        Ok(access)
    }

    /// Registers exactly `mem` for `access`, outside the registration
    /// cache: a device region of its own, so that a peer's access is
    /// checked against these bytes rather than the whole pages a cached
    /// registration spans. For memory a caller registers for its peers and
    /// keeps registered (libfabric's `fi_mr_reg`); registering costs a
    /// device call each time. Give it back with [`Btl::deregister_mem`],
    /// which deregisters it at once. Access rights are completed as for
    /// [`Btl::register_mem`].
    pub fn register_exact(&self, mem: UserMem, access: Access) -> Result<MemReg> {
        let access = self.user_access(access)?;
        if mem.len() as u64 > self.facts.caps.max_mr_size {
            return Err(Error::invalid(format!(
                "{} bytes: more than the device registers at once ({})",
                mem.len(),
                self.facts.caps.max_mr_size
            )));
        }
        self.lock().register_exact(mem, access)
    }

    /// Queues (or posts at once) RDMA work for a new operation to `dst`.
    fn start_rdma(
        &self,
        dst: Rank,
        landed: Option<bool>,
        done: Option<OnDone<C>>,
        make: impl FnOnce(&mut Core<C, Btl<C>>, u64) -> Result<crate::proto::Rdma>,
    ) -> Result<OpId> {
        let mut core = self.lock();
        if dst == self.cfg.rank && !core.has_loopback() {
            return Err(Error::Unsupported(
                "one-sided work on this rank's own memory (an iWARP device has no loopback)",
            ));
        }
        let ei = core.endpoint(dst)?;
        let op = core.start_op(dst, done);
        let rdma = match make(&mut core, op) {
            Ok(r) => r,
            Err(e) => {
                // Never started: nobody hears of it. Its callback is
                // dropped outside the lock (user code).
                let cb = core.abandon_op(op);
                drop(core);
                drop(cb);
                return Err(e);
            }
        };
        // An iWARP write completes once it has left: a read behind it says
        // when it has landed, or that the peer refused it.
        let (rdma, fence) = match landed {
            Some(readable) if self.facts.caps.transport == xrcbtl_fabric::Transport::Iwarp => {
                rdma.fenced(readable && rdma.len() > 0)
            }
            _ => (rdma, None),
        };
        core.submit_rdma(ei, rdma, fence);
        Ok(OpId(op))
    }

    /// Writes `len` bytes at `from` into the peer's memory at `to`. Its
    /// completion means the source may be reused; on InfiniBand and RoCE
    /// the data has then landed, on iWARP (where a write completes once it
    /// has left) it has landed by the time anything sent to the peer after
    /// it arrives ([`Btl::put_landed`] waits for it). `dst` may be this
    /// rank: one-sided work and atomics on its own memory go through the
    /// device's loopback (`Unsupported` on iWARP), so that they are atomic
    /// with the peers' atomics there.
    ///
    /// Work a broken connection flushed is posted again on the next. On
    /// iWARP a write or read whose key the peer refuses breaks the
    /// connection without saying which work was at fault (a TERMINATE), so
    /// a put or get of the user's in flight at a second break fails with
    /// [`crate::BtlError::Transfer`]`(`[`xrcbtl_fabric::WcStatus::WrFlush`]`)`
    /// rather than break every connection after it; a refused write that
    /// had already left reports success there, as iWARP completes writes
    /// when they leave.
    pub fn put(
        &self,
        dst: Rank,
        from: LocalPtr,
        to: RemotePtr,
        len: usize,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        self.start_rdma(dst, None, done, |core, op| {
            core.check_reg(&from.reg)?;
            transfer(op, true, from, to, len as u64)
        })
    }

    /// As [`Btl::put`], but its completion means the data has landed in
    /// the peer's memory on every transport. On iWARP a zero-length read
    /// follows the write on its connection and the put completes with it
    /// (the peer answers a read only once the writes before it are
    /// placed); a write the peer refuses flushes that read, and the pair
    /// is posted again once, then fails with
    /// [`crate::BtlError::Transfer`]`(`[`xrcbtl_fabric::WcStatus::WrFlush`]`)`
    /// instead of reporting success. For libfabric's delivery-complete
    /// writes.
    ///
    /// `readable` says that the peer lets this rank read `to`'s first
    /// byte. The read behind the write then reads that byte (into a sink
    /// of the BTL's, never the caller's memory); otherwise it reads
    /// nothing, and siw answers zero-length reads wrongly under load (its
    /// kernel log shows a 512-byte response to one; the README says
    /// more), breaking the connection.
    pub fn put_landed(
        &self,
        dst: Rank,
        from: LocalPtr,
        to: RemotePtr,
        len: usize,
        readable: bool,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        self.start_rdma(dst, Some(readable), done, |core, op| {
            core.check_reg(&from.reg)?;
            transfer(op, true, from, to, len as u64)
        })
    }

    /// Reads `len` bytes of the peer's memory at `from` into `to`.
    pub fn get(
        &self,
        dst: Rank,
        from: RemotePtr,
        to: LocalPtr,
        len: usize,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        self.start_rdma(dst, None, done, |core, op| {
            core.check_reg(&to.reg)?;
            transfer(op, false, to, from, len as u64)
        })
    }

    fn start_atomic(
        &self,
        dst: Rank,
        at: RemotePtr,
        kind: Atomic,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        if !self.facts.caps.atomics {
            return Err(Error::Unsupported("the device has no atomics"));
        }
        self.start_rdma(dst, None, done, |core, op| {
            let (slot, result) = core.result_slot()?;
            atomic(op, kind, at, result, slot).inspect_err(|_| core.give_result_slot(slot))
        })
    }

    /// Adds `add` to the 64-bit word at `at` (8-byte aligned); the
    /// completion reports the value found there.
    ///
    /// An atomic is executed at most once. One whose connection breaks
    /// before its answer comes back is not posted again (the peer may have
    /// executed it): it fails with
    /// [`crate::BtlError::Transfer`]`(`[`xrcbtl_fabric::WcStatus::WrFlush`]`)`,
    /// and whether the word changed is unknown. The same holds for
    /// [`Btl::compare_swap`] and [`Btl::add`].
    pub fn fetch_add(
        &self,
        dst: Rank,
        at: RemotePtr,
        add: u64,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        self.start_atomic(dst, at, Atomic::FetchAdd(add), done)
    }

    /// Stores `swap` in the 64-bit word at `at` if it holds `compare`; the
    /// completion reports the value found there (executed at most once:
    /// see [`Btl::fetch_add`]).
    pub fn compare_swap(
        &self,
        dst: Rank,
        at: RemotePtr,
        compare: u64,
        swap: u64,
        done: Option<OnDone<C>>,
    ) -> Result<OpId> {
        self.start_atomic(dst, at, Atomic::CompareSwap { compare, swap }, done)
    }

    /// Adds `add` to the 64-bit word at `at`; nothing is reported back
    /// (executed at most once: see [`Btl::fetch_add`]).
    pub fn add(&self, dst: Rank, at: RemotePtr, add: u64, done: Option<OnDone<C>>) -> Result<OpId> {
        self.start_atomic(dst, at, Atomic::Add(add), done)
    }

    /// Where an operation is. A failure (of an operation without a
    /// callback) is reported once; unknown ids are done.
    pub fn test(&self, op: OpId) -> OpStatus {
        if op == OpId::DONE {
            return OpStatus::Done;
        }
        self.lock().op_status(op.0)
    }
}
