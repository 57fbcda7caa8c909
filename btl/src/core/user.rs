//! What the user registers with the core and reads of it: the device's
//! facts, counters, memory and its registrations, and the callbacks.

use xrcbtl_fabric::{Access, Context, DmaBuf, Error, Result, UserMem};
use xrcbtl_xrc_conn::Rank;

use crate::callbacks::{AmFn, ErrFn};
use crate::types::{BtlStats, MemReg, Tag};

use super::{Core, Facts};

impl<C: Context, H> Core<C, H> {
    /// What the API keeps of the rank's device and connections, read once
    /// at set-up.
    pub fn facts(&self) -> Facts<C> {
        Facts {
            mode: self.iface.mode,
            caps: self.iface.caps.clone(),
            listen: self.drv.listen_addr(),
            device: self.iface.ctx.name().to_string(),
            credits: self.iface.credits(),
            max_message: self.iface.max_message(),
            recv_cq: self.iface.recv_cq.clone(),
            placed: self.iface.placed.clone(),
        }
    }

    /// What the BTL counted so far, with the counts kept elsewhere on
    /// the straight lines folded in.
    pub fn stats(&self) -> BtlStats {
        let mut s = BtlStats {
            pending_max: self.eps.pending_max,
            queued_deliveries: self.deliveries.pushed(),
            posted_records: self.sends.records(),
            ..self.stats.clone()
        };
        for (by_class, n) in s
            .received_by_class
            .iter_mut()
            .zip(self.iface.read_whole_counts())
        {
            *by_class += n;
            s.eager_received += n;
        }
        let (small, signalled) = self.sends.small_posts();
        s.eager_sent += small;
        s.inline_sent += small;
        s.unsignalled += small - signalled;
        s
    }

    /// Counts a taking of the lock by a progress call
    /// ([`BtlStats::locks`]).
    #[inline]
    pub fn count_lock(&mut self) {
        self.stats.locks += 1;
    }

    /// Counts a taking of the lock by anything but a progress call, which
    /// may leave rare work behind (a send queued, a connection asked for,
    /// a rendezvous begun, a cover asked): the next progress call takes
    /// the full path.
    #[inline]
    pub fn entered(&mut self) {
        self.stats.locks += 1;
        self.raise();
    }

    /// The NUMA node of each of the BTL's own buffers
    /// ([`crate::iface::Iface::buffer_nodes`]).
    pub fn buffer_nodes(&self) -> Result<Vec<Option<u32>>> {
        self.iface.buffer_nodes()
    }

    /// Bytes of receive buffers the rank's SRQs own.
    pub fn receive_bytes(&self) -> u64 {
        self.iface
            .classes
            .iter()
            .map(|c| u64::from(c.total) * u64::from(c.size))
            .sum()
    }

    /// Allocates `len` bytes on the device's NUMA node, registered for
    /// `access`.
    pub fn alloc_mem(&self, len: usize, access: Access) -> Result<DmaBuf<C>> {
        DmaBuf::new(&self.iface.ctx, &self.iface.pd, len, access)
    }

    /// Registers user memory through the cache ([`crate::regs::Regs::register`]).
    pub fn register_mem(&mut self, mem: UserMem, access: Access) -> Result<MemReg> {
        self.regs.register(mem, access)
    }

    /// Registers exactly `mem` ([`crate::regs::Regs::register_exact`]).
    pub fn register_exact(&mut self, mem: UserMem, access: Access) -> Result<MemReg> {
        self.regs.register_exact(mem, access)
    }

    /// Gives a user's registration back ([`crate::regs::Regs::deregister`]): an exact
    /// one comes back, to be dropped outside the lock.
    pub fn deregister_mem(&mut self, reg: MemReg) -> Result<Option<C::Mr>> {
        self.regs.deregister(reg)
    }

    /// Checks a user registration an operation names ([`crate::regs::Regs::check`]).
    pub fn check_reg(&mut self, reg: &MemReg) -> Result<()> {
        self.regs.check(reg)
    }

    /// The registration cache's counters.
    pub fn rcache_stats(&self) -> xrcbtl_fabric::rcache::Stats {
        self.regs.cache.stats()
    }

    /// Sets (or with `None` removes) the callback of messages with `tag`.
    pub fn set_am(&mut self, tag: Tag, cb: Option<AmFn<H>>) {
        self.cbs.set_am(tag, cb);
    }

    /// The callback of a message with `tag` being delivered; one without
    /// is counted ([`BtlStats::unhandled`]).
    pub fn am(&mut self, tag: Tag) -> Option<AmFn<H>> {
        let cb = self.cbs.am(tag);
        self.stats.unhandled += u64::from(cb.is_none());
        cb
    }

    /// Sets the callback run when the endpoint to `rank`, a known peer,
    /// fails.
    pub fn set_on_error(&mut self, rank: Rank, cb: ErrFn<H>) -> Result<()> {
        if self.eps.find(rank).is_none() {
            return Err(Error::invalid(format!("rank {rank} is not a known peer")));
        }
        self.cbs.set_on_error(rank, cb);
        Ok(())
    }

    /// Sets the callback run when any endpoint fails.
    pub fn set_on_any_error(&mut self, cb: ErrFn<H>) {
        self.cbs.set_on_any_error(cb);
    }

    /// What runs when the endpoint to `rank` failed ([`crate::callbacks::Registry::on_error`]).
    pub fn on_error(&self, rank: Rank) -> [Option<ErrFn<H>>; 2] {
        self.cbs.on_error(rank)
    }
}
