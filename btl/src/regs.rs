//! Memory registrations: the registration cache that every transfer
//! registers through, and the registrations a user holds by handle
//! ([`MemReg`]) for one-sided work.
//!
//! A user's registration is either whole pages held from the cache, or
//! exactly the bytes asked for in a device region of its own. An operation
//! that names one is checked against what is held: a handle deregistered
//! or never handed out is refused, and so is memory unmapped or remapped
//! since it was registered (its region would reach the old pages).

use xrcbtl_fabric::{Access, Context, Error, MemCache, Mr, Registration, Result, UserMem};
use xrcbtl_progress::WrSlab;

use crate::types::MemReg;

/// A user's registration ([`crate::Btl::register_mem`] or
/// [`crate::Btl::register_exact`]).
enum UserReg<C: Context> {
    /// Whole pages, held from the cache.
    Cached(Registration),
    /// Exactly the bytes asked for, a device region of its own.
    Exact(C::Mr),
}

/// The registration cache and the user's registrations.
pub(crate) struct Regs<C: Context> {
    /// Every registration of the BTL's own (eager sources sent in place,
    /// rendezvous sources and sinks) and the user's cached ones.
    pub cache: MemCache<C>,
    /// The user's registrations, by handle id less one.
    user: WrSlab<UserReg<C>>,
}

impl<C: Context> Regs<C> {
    /// No user registration yet, and `cache` for everything.
    pub fn new(cache: MemCache<C>) -> Self {
        Regs {
            cache,
            user: WrSlab::new(),
        }
    }

    /// Registers `mem` for `access` through the cache, held until
    /// [`Regs::deregister`].
    pub fn register(&mut self, mem: UserMem, access: Access) -> Result<MemReg> {
        let reg = self.cache.register_user(&mem, access)?;
        let keys = (reg.lkey(), reg.rkey());
        Ok(self.hold(mem, keys, UserReg::Cached(reg)))
    }

    /// Registers exactly `mem` for `access` in a region of its own, held
    /// until [`Regs::deregister`].
    pub fn register_exact(&mut self, mem: UserMem, access: Access) -> Result<MemReg> {
        let mr = self.cache.register_exact(&mem, access)?;
        let keys = (mr.lkey(), mr.rkey());
        Ok(self.hold(mem, keys, UserReg::Exact(mr)))
    }

    fn hold(&mut self, mem: UserMem, (lkey, rkey): (u32, u32), reg: UserReg<C>) -> MemReg {
        MemReg {
            id: self.user.insert(reg) + 1,
            addr: mem.addr() as u64,
            len: mem.len() as u64,
            lkey,
            rkey,
        }
    }

    /// Gives a user's registration back. A cached one returns to the
    /// cache; an exact one is handed back, for the caller to deregister
    /// (a device call) outside the lock.
    pub fn deregister(&mut self, reg: MemReg) -> Result<Option<C::Mr>> {
        if reg.id == 0 {
            return Err(Error::invalid(
                "memory from alloc_mem is deregistered by dropping it",
            ));
        }
        match self.user.remove(reg.id - 1) {
            Some(UserReg::Cached(r)) => {
                self.cache.release(r);
                Ok(None)
            }
            Some(UserReg::Exact(mr)) => Ok(Some(mr)),
            None => Err(Error::invalid("not a live registration of this BTL")),
        }
    }

    /// Checks that a user registration named by an operation is a live one
    /// (memory from `alloc_mem`, id 0, is its own proof), and that its
    /// memory was not unmapped or remapped since: the region would move
    /// the old pages (or, on the simulator, nothing).
    pub fn check(&mut self, reg: &MemReg) -> Result<()> {
        if reg.id == 0 {
            return Ok(());
        }
        match self.user.get(reg.id - 1) {
            Some(UserReg::Exact(mr)) if mr.lkey() == reg.lkey => Ok(()),
            Some(UserReg::Cached(r)) if r.lkey() == reg.lkey => {
                if self.cache.is_current(r) {
                    Ok(())
                } else {
                    Err(Error::state(
                        "the registered memory was unmapped or remapped since it was \
                         registered: deregister it and register it again",
                    ))
                }
            }
            _ => Err(Error::invalid(
                "not a live registration of this BTL (deregistered, or never handed out)",
            )),
        }
    }
}
