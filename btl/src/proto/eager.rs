//! The eager protocol's order: every message from one rank to another
//! carries a sequence number (eager messages and rendezvous control alike,
//! one sequence per direction), so the receiver delivers each exactly once
//! and in order even when the sender posts again what a failed connection
//! may or may not have delivered.
//!
//! Nothing can arrive ahead of its turn: a connection delivers in order,
//! and a sender posts nothing on a new connection while work is in flight
//! on the old one. A number from the future is therefore a lie (or a bug)
//! and is refused without moving the receiver's expectation, so that one
//! bad header cannot make every later message look like a duplicate.

/// The sequence numbers a sender gives out to one peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SeqTx(u32);

impl SeqTx {
    /// The number the next message will get.
    pub fn peek(&self) -> u32 {
        self.0
    }

    /// Gives out the next number.
    pub fn take(&mut self) -> u32 {
        let s = self.0;
        self.0 = s.wrapping_add(1);
        s
    }
}

/// What an arriving sequence number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// The next one: deliver it.
    Next,
    /// Seen already (a retransmission): drop it.
    Duplicate,
    /// Ahead of its turn: refuse it.
    Ahead,
}

/// The number a receiver expects next from one peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SeqRx(u32);

impl SeqRx {
    /// Judges an arriving number; only [`Arrival::Next`] moves the
    /// expectation on. Numbers are compared by their signed distance, so
    /// they may wrap.
    pub fn arrive(&mut self, seq: u32) -> Arrival {
        match seq.wrapping_sub(self.0) as i32 {
            0 => {
                self.0 = seq.wrapping_add(1);
                Arrival::Next
            }
            d if d < 0 => Arrival::Duplicate,
            _ => Arrival::Ahead,
        }
    }

    /// The number expected next.
    pub fn expected(&self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_with_retransmissions_is_delivered_once_in_order() {
        let mut tx = SeqTx::default();
        let mut rx = SeqRx::default();
        let sent: Vec<u32> = (0..10).map(|_| tx.take()).collect();
        // 0..6 arrive; the connection fails; 4..10 are posted again.
        let wire = sent[..6].iter().chain(&sent[4..]);
        let delivered: Vec<u32> = wire
            .filter(|&&s| rx.arrive(s) == Arrival::Next)
            .copied()
            .collect();
        assert_eq!(delivered, sent);
        assert_eq!(rx.expected(), 10);
    }

    #[test]
    fn numbers_wrap_and_a_lie_from_the_future_moves_nothing() {
        let mut tx = SeqTx(u32::MAX - 1);
        let mut rx = SeqRx(u32::MAX - 1);
        for _ in 0..4 {
            assert_eq!(rx.arrive(tx.take()), Arrival::Next);
        }
        assert_eq!(rx.expected(), 2);
        assert_eq!(rx.arrive(1 << 30), Arrival::Ahead);
        assert_eq!(rx.arrive(3), Arrival::Ahead);
        assert_eq!(rx.arrive(1), Arrival::Duplicate);
        assert_eq!(rx.arrive(2), Arrival::Next, "the liar did not move it");
    }
}
