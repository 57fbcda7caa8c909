//! The buffers the BTL keeps for reuse: message buffers (a copy of an
//! eager message the user is handed), the buffers messages sent in parts
//! are joined in, and rendezvous sinks; and what a rendezvous holds on to
//! while it runs, its source and its sink.
//!
//! One [`Pools::recycle`] takes back any of them: a buffer's capacity says
//! which pool it belongs to, so a delivery hands back what it was given
//! without saying where it came from.

use std::collections::HashMap;

use bytes::Bytes;
use xrcbtl_fabric::Registration;

/// Message buffers kept for reuse.
const BUFS_KEPT: usize = 256;
/// Joined messages' buffers kept for reuse.
const JOINED_KEPT: usize = 8;
/// Bytes of rendezvous sinks kept for reuse, all sizes together (at most
/// what the registration cache keeps registered): a window of 64 messages
/// of 1 MiB in flight (osu_bw's) finds its sinks, and their registrations,
/// again on the next window instead of allocating, zeroing and registering
/// each.
const SINK_BYTES_KEPT: usize = 64 << 20;
/// Rendezvous sinks hold at least this much.
const SINK_MIN: usize = 64 * 1024;
/// A sink's data starts on a page of its own and fills whole pages:
/// registrations pin whole pages, and two sinks sharing a page would have
/// their registrations merged by the cache (a new registration, and an old
/// one kept pinned, at every use). A sink is allocated one page larger than
/// its size, and its data starts at the first page boundary inside.
const PAGE: usize = 4096;

/// The size of the sink a buffer of capacity `cap` is, if it is one.
fn sink_size(cap: usize) -> Option<usize> {
    cap.checked_sub(PAGE)
        .filter(|c| *c >= SINK_MIN && c.is_power_of_two())
}

/// Where a sink's data starts in its buffer: its first page boundary.
pub(crate) fn sink_start(buf: &[u8]) -> usize {
    buf.as_ptr().align_offset(PAGE)
}

/// The source of a rendezvous this rank sends: the data, kept alive and
/// registered until the peer has it.
pub(crate) struct Source {
    pub data: Bytes,
    pub reg: Registration,
}

/// The sink of a rendezvous this rank receives.
pub(crate) struct Sink {
    pub buf: Vec<u8>,
    pub reg: Registration,
}

/// The buffers kept for reuse.
#[derive(Debug)]
pub(crate) struct Pools {
    /// Message buffers, each of capacity `max_message`.
    bufs: Vec<Vec<u8>>,
    /// The largest message a receive buffer holds: a message buffer's
    /// capacity, so that no message ever grows one.
    max_message: usize,
    /// Buffers of joined messages.
    joined: Vec<Vec<u8>>,
    /// Sinks, by size.
    sinks: HashMap<usize, Vec<Vec<u8>>>,
    /// Bytes held in `sinks`.
    sink_bytes: usize,
    /// The most `sinks` may hold.
    sink_budget: usize,
}

impl Pools {
    /// Empty pools for messages of up to `max_message` bytes, keeping at
    /// most `registered_max` bytes of sinks (what the registration cache
    /// keeps registered).
    pub fn new(max_message: usize, registered_max: usize) -> Self {
        Pools {
            bufs: Vec::new(),
            max_message,
            joined: Vec::new(),
            sinks: HashMap::new(),
            sink_bytes: 0,
            sink_budget: SINK_BYTES_KEPT.min(registered_max),
        }
    }

    /// A buffer for a message (reused; sized for the largest eager
    /// message, so that no message ever grows it).
    pub fn buf(&mut self) -> Vec<u8> {
        let cap = self.max_message;
        self.bufs.pop().unwrap_or_else(|| Vec::with_capacity(cap))
    }

    /// An empty buffer to join a message's parts in, of at least `cap`
    /// bytes when new.
    pub fn joined(&mut self, cap: usize) -> Vec<u8> {
        let mut buf = self.joined.pop().unwrap_or_else(|| Vec::with_capacity(cap));
        buf.clear();
        buf
    }

    /// Takes back a buffer a delivery is done with, into the pool its
    /// capacity names (or lets it go when that pool is full).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if let Some(size) = sink_size(cap) {
            if buf.len() != cap {
                return;
            }
            // The pool follows the sizes in use now: sinks of other sizes
            // make room (a run that went through smaller sizes first must
            // not leave the budget to them).
            if self.sink_bytes + cap > self.sink_budget {
                for (other, pool) in self.sinks.iter_mut().filter(|(s, _)| **s != size) {
                    while self.sink_bytes + cap > self.sink_budget {
                        let Some(old) = pool.pop() else { break };
                        debug_assert_eq!(sink_size(old.capacity()), Some(*other));
                        self.sink_bytes -= old.capacity();
                    }
                }
            }
            if self.sink_bytes + cap <= self.sink_budget {
                self.sink_bytes += cap;
                self.sinks.entry(size).or_default().push(buf);
            }
        } else if cap > self.max_message {
            if self.joined.len() < JOINED_KEPT {
                self.joined.push(buf);
            }
        } else if self.bufs.len() < BUFS_KEPT && cap > 0 {
            self.bufs.push(buf);
        }
    }

    /// A rendezvous sink for `len` bytes: a buffer from the pool, or a new
    /// one (`None` when the memory cannot be had). Its data starts at
    /// [`sink_start`].
    pub fn sink(&mut self, len: usize) -> Option<Vec<u8>> {
        let size = len.checked_next_power_of_two()?.max(SINK_MIN);
        if let Some(b) = self.sinks.get_mut(&size).and_then(|p| p.pop()) {
            self.sink_bytes -= b.capacity();
            return Some(b);
        }
        let cap = size.checked_add(PAGE)?;
        let mut b = Vec::new();
        b.try_reserve_exact(cap).ok()?;
        b.resize(b.capacity(), 0);
        // An allocator that gave more than asked makes no sink: the pool
        // could not tell it apart from another buffer.
        (sink_size(b.capacity()) == Some(size)).then_some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_buffer_goes_back_to_its_own_pool() {
        let mut p = Pools::new(4096, usize::MAX);
        let m = p.buf();
        assert_eq!(m.capacity(), 4096);
        p.recycle(m);
        assert_eq!(p.bufs.len(), 1);
        let j = p.joined(3 * 4096);
        p.recycle(j);
        assert_eq!((p.bufs.len(), p.joined.len()), (1, 1));
        let s = p.sink(100_000).expect("memory for a sink");
        assert_eq!(sink_size(s.capacity()), Some(128 * 1024));
        assert_eq!((s.as_ptr() as usize + sink_start(&s)) % PAGE, 0);
        p.recycle(s);
        assert_eq!(p.sink_bytes, 128 * 1024 + PAGE);
        let again = p.sink(128 * 1024).expect("the pooled sink");
        assert_eq!(p.sink_bytes, 0);
        assert_eq!(again.len(), again.capacity());
    }

    #[test]
    fn sinks_of_the_size_in_use_push_out_others_past_the_budget() {
        let big = SINK_MIN * 2 + PAGE;
        let mut p = Pools::new(4096, 2 * big);
        let small = p.sink(SINK_MIN).unwrap();
        p.recycle(small);
        let (a, b) = (p.sink(SINK_MIN * 2).unwrap(), p.sink(SINK_MIN * 2).unwrap());
        p.recycle(a);
        p.recycle(b);
        assert_eq!(p.sink_bytes, 2 * big);
        assert!(p.sinks.get(&SINK_MIN).is_none_or(|v| v.is_empty()));
    }
}
