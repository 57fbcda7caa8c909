//! A BTL progressed by its own thread: it spins on the CQs while there is
//! work and, once idle, blocks on the receive CQ's completion channel (up to
//! a bounded time, so that work submitted meanwhile is not left waiting).
//! The application sends through [`Threaded::lock`] or, without taking the
//! lock, through the BTL's lock-free submitter ([`Btl::submitter`]).

use std::sync::{Arc, Mutex, MutexGuard};

use xrcbtl_fabric::{Context, Cq, Result};
use xrcbtl_progress::{ProgressThread, ThreadConfig};

use crate::btl::Btl;

/// A BTL and the thread that progresses it.
pub struct Threaded<C: Context> {
    btl: Arc<Mutex<Btl<C>>>,
    thread: ProgressThread,
}

impl<C: Context> std::fmt::Debug for Threaded<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Threaded({:?})", self.thread)
    }
}

impl<C> Threaded<C>
where
    C: Context + 'static,
    Btl<C>: Send,
    C::Cq: Send + 'static,
{
    /// Moves `btl` under a progress thread named `name`.
    pub fn spawn(btl: Btl<C>, name: &str, cfg: ThreadConfig) -> Result<Threaded<C>> {
        let cq = btl.recv_cq();
        let btl = Arc::new(Mutex::new(btl));
        let b = btl.clone();
        let thread = ProgressThread::spawn(
            name,
            cfg,
            move || b.lock().unwrap_or_else(|e| e.into_inner()).progress(),
            // Outside the lock: the application may send meanwhile.
            move |d| {
                let _ = cq.wait(d);
            },
        )
        .map_err(|e| xrcbtl_fabric::Error::Verbs {
            verb: "spawn progress thread",
            source: e,
        })?;
        Ok(Threaded { btl, thread })
    }

    /// The BTL, for calls from the application (the progress thread waits
    /// meanwhile).
    pub fn lock(&self) -> MutexGuard<'_, Btl<C>> {
        self.btl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Progress calls the thread made.
    pub fn calls(&self) -> u64 {
        self.thread.calls()
    }

    /// Times the thread blocked on the completion channel.
    pub fn blocks(&self) -> u64 {
        self.thread.blocks()
    }

    /// Stops the thread and hands the BTL back.
    pub fn stop(mut self) -> Btl<C> {
        self.thread.stop();
        drop(self.thread);
        match Arc::try_unwrap(self.btl) {
            Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
            Err(_) => unreachable!("the stopped thread held the only other reference"),
        }
    }
}
