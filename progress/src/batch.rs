//! Bounded completion batches.

/// A reusable buffer that completions are polled into, at most `max` per
/// poll.
#[derive(Debug)]
pub struct Batch<W> {
    buf: Vec<W>,
}

impl<W: Copy + Default> Batch<W> {
    /// A batch of at most `max` completions (at least one).
    pub fn new(max: usize) -> Self {
        Batch {
            buf: vec![W::default(); max.max(1)],
        }
    }

    /// The most completions one poll takes.
    pub fn max(&self) -> usize {
        self.buf.len()
    }

    /// Polls once through `poll` (which fills a slice and says how many it
    /// wrote) and returns the completions taken.
    pub fn poll<E>(&mut self, poll: impl FnOnce(&mut [W]) -> Result<usize, E>) -> Result<&[W], E> {
        let n = poll(&mut self.buf)?;
        assert!(n <= self.buf.len(), "a poll wrote past its buffer");
        Ok(&self.buf[..n])
    }
}
