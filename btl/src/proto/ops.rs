//! The operations in flight (rendezvous sends, puts, gets, atomics): their
//! ids, their completion callbacks, and the outcome of those without one,
//! kept until the user asks ([`crate::Btl::test`]).

use std::collections::HashMap;

use xrcbtl_xrc_conn::Rank;

use crate::types::{BtlError, OpResult, OpStatus};

/// Failed outcomes kept for operations without a callback, at most (the
/// oldest are forgotten first; an unknown id reads as done).
const FAILED_KEPT: usize = 1 << 16;

struct Live<F> {
    peer: Rank,
    cb: Option<F>,
}

/// Operations by id; `F` is the callback type.
pub(crate) struct Ops<F> {
    next: u64,
    live: HashMap<u64, Live<F>>,
    failed: HashMap<u64, BtlError>,
    failed_order: std::collections::VecDeque<u64>,
}

impl<F> Default for Ops<F> {
    fn default() -> Self {
        Ops {
            next: 1,
            live: HashMap::new(),
            failed: HashMap::new(),
            failed_order: Default::default(),
        }
    }
}

impl<F> Ops<F> {
    /// Starts an operation to `peer`; returns its id (never 0).
    pub fn start(&mut self, peer: Rank, cb: Option<F>) -> u64 {
        let op = self.next;
        self.next += 1;
        self.live.insert(op, Live { peer, cb });
        op
    }

    /// Ends an operation. Returns its callback with the result to run it
    /// with; without a callback, a failure is kept for
    /// [`Ops::status`]. An unknown (already ended) operation gives `None`.
    pub fn finish(&mut self, op: u64, result: OpResult) -> Option<(F, OpResult)> {
        let live = self.live.remove(&op)?;
        match live.cb {
            Some(cb) => Some((cb, result)),
            None => {
                if let Err(e) = result {
                    if self.failed_order.len() >= FAILED_KEPT {
                        if let Some(old) = self.failed_order.pop_front() {
                            self.failed.remove(&old);
                        }
                    }
                    self.failed.insert(op, e);
                    self.failed_order.push_back(op);
                }
                None
            }
        }
    }

    /// Where an operation is; a kept failure is reported once.
    pub fn status(&mut self, op: u64) -> OpStatus {
        if self.live.contains_key(&op) {
            OpStatus::Pending
        } else if let Some(e) = self.failed.remove(&op) {
            OpStatus::Failed(e)
        } else {
            OpStatus::Done
        }
    }

    /// The operations to `peer` (to fail them when it goes).
    pub fn of_peer(&self, peer: Rank) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| l.peer == peer)
            .map(|(op, _)| *op)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether none is in flight.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The operations in flight and their peers, in id order.
    pub fn live(&self) -> Vec<(u64, Rank)> {
        let mut v: Vec<(u64, Rank)> = self.live.iter().map(|(op, l)| (*op, l.peer)).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callbacks_are_handed_back_once_and_failures_without_one_are_kept_once() {
        let mut ops: Ops<&'static str> = Ops::default();
        let a = ops.start(1, Some("cb"));
        let b = ops.start(2, None);
        let c = ops.start(2, None);
        assert_eq!(ops.of_peer(2), vec![b, c]);
        assert_eq!(ops.status(a), OpStatus::Pending);
        assert_eq!(ops.finish(a, Ok(Some(5))), Some(("cb", Ok(Some(5)))));
        assert_eq!(ops.finish(a, Ok(None)), None, "ended once");
        assert_eq!(ops.status(a), OpStatus::Done);
        assert_eq!(ops.finish(b, Err(BtlError::Closed(2))), None);
        assert_eq!(ops.finish(c, Ok(None)), None);
        assert_eq!(ops.status(b), OpStatus::Failed(BtlError::Closed(2)));
        assert_eq!(ops.status(b), OpStatus::Done, "reported once");
        assert_eq!(ops.status(c), OpStatus::Done);
        assert!(ops.is_empty());
    }
}
