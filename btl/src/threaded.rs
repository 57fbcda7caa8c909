//! A BTL progressed by its own thread: it spins on the CQs while there is
//! work and, once idle, blocks on the receive CQ's completion channel (up to
//! a bounded time, so that work submitted meanwhile is not left waiting).
//! The application keeps calling the BTL (it takes `&self`) from its own
//! threads meanwhile, and may progress it too.
//!
//! The thread binds itself to the CPUs of the BTL's placement (the device's
//! CPUs, [`crate::place`]) before its first progress call.

use std::sync::Arc;

use xrcbtl_fabric::{Context, Result};
use xrcbtl_progress::{ProgressThread, ThreadConfig};

use crate::btl::Btl;

/// A BTL and the thread that progresses it.
pub struct Threaded<C: Context> {
    btl: Arc<Btl<C>>,
    thread: ProgressThread,
}

impl<C: Context> std::fmt::Debug for Threaded<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Threaded({:?})", self.thread)
    }
}

impl<C: Context> Threaded<C> {
    /// Starts a progress thread named `name` for `btl`.
    pub fn spawn(btl: Arc<Btl<C>>, name: &str, cfg: ThreadConfig) -> Result<Threaded<C>> {
        let b = btl.clone();
        let waiter = btl.clone();
        let mut placement = Some(btl.placed().placement.clone());
        let thread = ProgressThread::spawn(
            name,
            cfg,
            move || {
                if let Some(p) = placement.take() {
                    // Unbound, the thread still works: only slower.
                    let _ = crate::place::bind_this_thread(&p);
                }
                b.progress()
            },
            move |d| {
                // A failed wait only means the thread polls again sooner.
                let _ = waiter.wait_for_work(d);
            },
        )
        .map_err(|e| xrcbtl_fabric::Error::Verbs {
            verb: "spawn a progress thread",
            source: e,
        })?;
        Ok(Threaded { btl, thread })
    }

    /// The BTL.
    pub fn btl(&self) -> &Arc<Btl<C>> {
        &self.btl
    }

    /// Progress calls the thread made.
    pub fn calls(&self) -> u64 {
        self.thread.calls()
    }

    /// Times the thread blocked on the completion channel.
    pub fn blocks(&self) -> u64 {
        self.thread.blocks()
    }

    /// Stops the thread (waiting for it) and hands the BTL back.
    pub fn stop(mut self) -> Arc<Btl<C>> {
        self.thread.stop();
        self.btl
    }
}
