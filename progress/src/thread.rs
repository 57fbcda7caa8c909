//! The optional progress thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the thread behaves when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadConfig {
    /// Progress calls that found nothing before it blocks.
    pub spins: u32,
    /// Longest single block (work submitted meanwhile waits at most this).
    pub block: Duration,
}

impl Default for ThreadConfig {
    fn default() -> Self {
        ThreadConfig {
            spins: 64,
            block: Duration::from_millis(1),
        }
    }
}

/// A thread that calls progress until stopped, blocking when idle.
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    blocks: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ProgressThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProgressThread({} calls, {} blocks)",
            self.calls(),
            self.blocks()
        )
    }
}

impl ProgressThread {
    /// Starts a thread that calls `progress` (which returns the work it
    /// found); after `cfg.spins` idle calls it calls `block(cfg.block)`,
    /// which should wait for a completion (on a completion channel) for at
    /// most that long.
    pub fn spawn(
        name: &str,
        cfg: ThreadConfig,
        mut progress: impl FnMut() -> usize + Send + 'static,
        mut block: impl FnMut(Duration) + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let blocks = Arc::new(AtomicU64::new(0));
        let (s, c, b) = (stop.clone(), calls.clone(), blocks.clone());
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut idle = 0u32;
                while !s.load(Ordering::Acquire) {
                    c.fetch_add(1, Ordering::Relaxed);
                    if progress() > 0 {
                        idle = 0;
                        continue;
                    }
                    idle += 1;
                    if idle >= cfg.spins {
                        b.fetch_add(1, Ordering::Relaxed);
                        block(cfg.block);
                        idle = 0;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })?;
        Ok(ProgressThread {
            stop,
            calls,
            blocks,
            handle: Some(handle),
        })
    }

    /// Progress calls so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Times it blocked.
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Relaxed)
    }

    /// Stops the thread and waits for it (also done on drop).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop();
    }
}
