//! The handle C holds for a rank: its BTL on a simulated or a verbs device
//! (where the generic `Btl<C>` is fixed), its published address, and the
//! numbers it gave the nodes it has heard of.

use std::ffi::c_void;
use std::sync::Arc;

use xrcbtl_btl::{Btl, Peer};
use xrcbtl_fabric::sim::SimContext;
#[cfg(feature = "verbs")]
use xrcbtl_fabric::verbs::VerbsContext;

use crate::status::{Failure, Outcome};
use xrcbtl_btl::addr::{Address, NodeNumbers};

/// A rank's BTL, on either provider.
pub(crate) enum AnyBtl {
    Sim(Arc<Btl<SimContext>>),
    #[cfg(feature = "verbs")]
    Verbs(Arc<Btl<VerbsContext>>),
}

/// Runs `$body` with `$b` bound to the handle's `Arc<Btl<_>>`, whichever
/// provider it is on.
macro_rules! on_btl {
    ($h:expr, $b:ident => $body:expr) => {
        match &$h.btl {
            $crate::handle::AnyBtl::Sim($b) => $body,
            #[cfg(feature = "verbs")]
            $crate::handle::AnyBtl::Verbs($b) => $body,
        }
    };
}
pub(crate) use on_btl;

const LIVE: u64 = 0x7872_6362_746c_0001;
const DEAD: u64 = 0x7872_6362_746c_dead;

/// One rank on one device (opaque to C). Safe to use from any thread;
/// destroyed once, by its creator, when no other call on it runs.
#[allow(non_camel_case_types)]
pub struct xrcbtl_t {
    magic: u64,
    pub(crate) btl: AnyBtl,
    /// What this rank publishes.
    pub(crate) me: Address,
    /// Owned by a simulated job (which destroys it).
    pub(crate) in_sim: bool,
    nodes: NodeNumbers,
}

impl xrcbtl_t {
    /// A handle for `btl`, publishing `me`, whose own node is `node`.
    pub(crate) fn new(btl: AnyBtl, me: Address, node: u32, in_sim: bool) -> Box<xrcbtl_t> {
        let nodes = NodeNumbers::new(&me.node_key, node, in_sim);
        Box::new(xrcbtl_t {
            magic: LIVE,
            btl,
            me,
            in_sim,
            nodes,
        })
    }

    /// Peer `rank` from the address it published (which must be its own).
    pub(crate) fn peer(&self, rank: u32, raw: &[u8]) -> Outcome<Peer> {
        let a = Address::decode(raw).map_err(Failure::invalid)?;
        if a.rank != rank {
            return Err(Failure::invalid(format!(
                "the address is rank {}'s, not rank {rank}'s",
                a.rank
            )));
        }
        Ok(a.to_peer(&self.nodes))
    }

    /// Marks the handle destroyed (a later use is caught while the memory
    /// is still ours to read, which is all a check can promise).
    pub(crate) fn kill(&mut self) {
        self.magic = DEAD;
    }
}

/// The handle behind a pointer C passed, if it is a live one.
///
/// # Safety
/// `p` is `NULL` or was returned by this library and not destroyed.
pub(crate) unsafe fn handle<'a>(p: *mut xrcbtl_t) -> Outcome<&'a xrcbtl_t> {
    // SAFETY: the caller passes NULL or a live handle.
    let h = unsafe { p.as_ref() }.ok_or_else(|| Failure::invalid("the handle is NULL"))?;
    if h.magic != LIVE {
        return Err(Failure::invalid("not a live xrcbtl handle (destroyed?)"));
    }
    Ok(h)
}

/// A handle's address, carried into callbacks (which may run on any
/// thread).
#[derive(Clone, Copy)]
pub(crate) struct HandlePtr(pub *mut xrcbtl_t);

// SAFETY: the handle is thread-safe (every field is Sync), and C promises
// that it outlives the callbacks registered on it.
unsafe impl Send for HandlePtr {}
// SAFETY: as above.
unsafe impl Sync for HandlePtr {}

/// The user's argument of a C callback.
#[derive(Clone, Copy)]
pub(crate) struct Arg(pub *mut c_void);

// SAFETY: the header documents that callbacks run on whichever thread
// calls progress; the caller's argument must be usable there.
unsafe impl Send for Arg {}
// SAFETY: as above.
unsafe impl Sync for Arg {}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_handle(in_sim: bool) -> Box<xrcbtl_t> {
        let job = xrcbtl_btl::sim::SimJob::new(1, 1, 1, xrcbtl_fabric::sim::SimDevice::ib("d"))
            .expect("a job");
        let btl = job.peek(0).clone();
        let me = Address {
            rank: 0,
            listen: btl.listen_addr().expect("a listener"),
            node_key: "sim/0".into(),
            receive: btl.receive(),
            ib: btl.listen_ib_addr(),
        };
        xrcbtl_t::new(AnyBtl::Sim(btl), me, 0, in_sim)
    }

    #[test]
    fn dead_and_null_handles_are_refused() {
        let mut h = job_handle(true);
        let p: *mut xrcbtl_t = &mut *h;
        // SAFETY: a live handle.
        assert!(unsafe { handle(p) }.is_ok());
        // SAFETY: NULL is allowed.
        assert!(unsafe { handle(std::ptr::null_mut()) }.is_err());
        h.kill();
        // SAFETY: the memory is still ours; the handle is marked dead.
        assert!(unsafe { handle(p) }.is_err());
    }
}
