//! Credit flow control, for devices without RNR (iWARP), where a send that
//! finds no receive posted breaks the connection and may lose data.
//!
//! Each connection starts with `cap` credits on both sides: a sender may
//! have that many messages in the peer's receives. The receiver owes one
//! credit back per message it takes, and pays them back in the header of
//! any message it sends that way (16 bits), or, when it has nothing to send
//! and half the credits are owed, in a header-only credit message. A
//! message needs [`MSG_CREDITS`]: the last credit is kept for credit
//! messages, which need [`RETURN_CREDITS`], so that two sides that both ran
//! out can always pay each other back.
//!
//! A credit message takes a receive too, owed back like any other; at
//! least four credits make every credit message return at least two, so
//! that two idle sides do not trade credit messages forever.
//!
//! A new connection (a new QP) starts afresh on both sides: credits belong
//! to the QP they were given on.

/// Credits a message needs to go: it leaves the last one for returning
/// credits, so that returns are never stuck.
pub(crate) const MSG_CREDITS: u32 = 2;
/// Credits a credit-only message needs.
pub(crate) const RETURN_CREDITS: u32 = 1;

/// One connection's credits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Credit {
    /// Messages this rank may still send to the peer's receives.
    pub credits: u32,
    /// Messages received from the peer and not yet returned as credits.
    pub to_return: u32,
    /// A credit-only message is queued.
    pub returning: bool,
}

impl Credit {
    /// A fresh connection's credits.
    pub fn new(cap: u32) -> Credit {
        Credit {
            credits: cap,
            to_return: 0,
            returning: false,
        }
    }

    /// The credits a message sent now returns, or `None` when fewer than
    /// `need` are left.
    pub fn offer(&self, need: u32) -> Option<u16> {
        (self.credits >= need).then(|| self.to_return.min(u32::from(u16::MAX)) as u16)
    }

    /// A message went: it took a credit and returned `returned`.
    pub fn spend(&mut self, returned: u16) {
        self.credits -= 1;
        self.to_return -= u32::from(returned);
    }

    /// Takes back [`Credit::spend`] of a message the QP refused.
    pub fn unspend(&mut self, returned: u16) {
        self.credits += 1;
        self.to_return += u32::from(returned);
    }

    /// A message arrived carrying `returned` credits. It took one of our
    /// receives, owed back ([`Credit::owe`]) once that receive is free
    /// again: at once, or when a message delivered in place is consumed.
    pub fn take_returned(&mut self, returned: u16) {
        self.credits = self.credits.saturating_add(u32::from(returned));
    }

    /// A receive the peer filled is free again: one more credit is owed
    /// back. Returns whether a credit-only message should now be queued
    /// (half of `cap` owed, none queued).
    pub fn owe(&mut self, cap: u32) -> bool {
        self.to_return += 1;
        if self.to_return >= (cap / 2).max(1) && !self.returning {
            self.returning = true;
            return true;
        }
        false
    }
}

/// An endpoint's credits, by the local QP number of the connection: the
/// current connection's first (found without a search on the post path),
/// then any older one still draining.
#[derive(Debug, Default)]
pub(crate) struct Credits {
    cur: Option<(u32, Credit)>,
    older: Vec<(u32, Credit)>,
}

impl Credits {
    /// The credits of the connection on local QP `qpn`, `cap` if new; a new
    /// connection becomes the current one.
    #[inline]
    pub fn of(&mut self, qpn: u32, cap: u32) -> &mut Credit {
        if self.cur.as_ref().is_none_or(|(q, _)| *q != qpn) {
            return self.of_other(qpn, cap);
        }
        &mut self.cur.as_mut().expect("checked").1
    }

    /// The credits of the current connection if it is the one on local
    /// QP `qpn`, else `None` (the send's straight line then takes the general
    /// path, which finds or makes them with [`Credits::of`]): a look-up
    /// with no call in it.
    #[inline(always)]
    pub fn current(&mut self, qpn: u32) -> Option<&mut Credit> {
        match &mut self.cur {
            Some((q, c)) if *q == qpn => Some(c),
            _ => None,
        }
    }

    /// [`Credits::of`] for a connection other than the current one.
    #[cold]
    fn of_other(&mut self, qpn: u32, cap: u32) -> &mut Credit {
        if let Some(i) = self.older.iter().position(|(q, _)| *q == qpn) {
            return &mut self.older[i].1;
        }
        if let Some(old) = self.cur.take() {
            self.older.push(old);
        }
        &mut self.cur.insert((qpn, Credit::new(cap))).1
    }

    /// The credits of the connection on local QP `qpn`, if it still has
    /// them (a QP forgotten, or a connection reset, has none).
    pub fn existing(&mut self, qpn: u32) -> Option<&mut Credit> {
        match &mut self.cur {
            Some((q, c)) if *q == qpn => Some(c),
            _ => self
                .older
                .iter_mut()
                .find(|(q, _)| *q == qpn)
                .map(|(_, c)| c),
        }
    }

    /// Whether the connection on local QP `qpn` has credits here.
    #[cfg(debug_assertions)]
    pub fn has(&self, qpn: u32) -> bool {
        self.cur.as_ref().is_some_and(|(q, _)| *q == qpn)
            || self.older.iter().any(|(q, _)| *q == qpn)
    }

    /// The QP is gone: its credits with it.
    pub fn forget(&mut self, qpn: u32) {
        if self.cur.as_ref().is_some_and(|(q, _)| *q == qpn) {
            self.cur = None;
        }
        self.older.retain(|(q, _)| *q != qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sides of one connection exchange messages in random order; each
    /// side has `cap + 1 + REFILL` receives (what the BTL provisions per
    /// peer) and reposts consumed ones now and then, at the latest when
    /// `REFILL` wait. A message may be held in its receive for a while (a
    /// delivery in place): its credit is owed only once it is let go. No
    /// side may ever send into an empty receive queue, and every message
    /// must get through.
    #[test]
    fn credits_never_overrun_the_receiver_and_never_deadlock() {
        for seed in 1..200u64 {
            let cap = 4 + (seed % 7) as u32;
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            // Per side: its credits, receives free at it, messages it still
            // wants to send, messages in flight to it (each carrying
            // returned credits), receives consumed but not yet reposted.
            let mut cr = [Credit::new(cap), Credit::new(cap)];
            const REFILL: u32 = 3;
            let mut free = [cap + 1 + REFILL, cap + 1 + REFILL];
            let mut todo = [300u32, 200u32];
            let mut wire: [Vec<(bool, u16)>; 2] = [Vec::new(), Vec::new()];
            let mut unposted = [0u32, 0u32];
            let mut held = [0u32, 0u32];
            let mut got = [0u32, 0u32];
            let mut stuck = 0;
            while todo != [0, 0]
                || wire.iter().any(|w| !w.is_empty())
                || held != [0, 0]
                || cr.iter().any(|c| c.returning)
            {
                stuck += 1;
                assert!(stuck < 100_000, "seed {seed}: no progress {cr:?} {todo:?}");
                let s = next(2) as usize;
                let p = 1 - s;
                match next(5) {
                    // Send a message, or a queued credit message.
                    0 | 1 => {
                        let credit_only = cr[s].returning && cr[s].to_return > 0;
                        let need = if credit_only {
                            RETURN_CREDITS
                        } else {
                            MSG_CREDITS
                        };
                        if !credit_only && todo[s] == 0 {
                            continue;
                        }
                        if cr[s].returning && cr[s].to_return == 0 {
                            cr[s].returning = false;
                            continue;
                        }
                        if let Some(r) = cr[s].offer(need) {
                            cr[s].spend(r);
                            if credit_only {
                                cr[s].returning = false;
                            } else {
                                todo[s] -= 1;
                            }
                            assert!(free[p] > 0, "seed {seed}: side {s} overran side {p}");
                            free[p] -= 1;
                            wire[p].push((credit_only, r));
                        }
                    }
                    // Take a message off the wire.
                    2 => {
                        if unposted[s] >= REFILL {
                            free[s] += unposted[s];
                            unposted[s] = 0;
                        }
                        if let Some((credit_only, r)) = wire[s].pop() {
                            cr[s].take_returned(r);
                            if !credit_only {
                                got[s] += 1;
                            }
                            if !credit_only && next(2) == 0 {
                                held[s] += 1;
                            } else {
                                unposted[s] += 1;
                                cr[s].owe(cap);
                            }
                        }
                    }
                    // A message delivered in place is let go.
                    3 => {
                        if held[s] > 0 {
                            held[s] -= 1;
                            unposted[s] += 1;
                            cr[s].owe(cap);
                        }
                    }
                    // Repost what was consumed.
                    _ => {
                        free[s] += unposted[s];
                        unposted[s] = 0;
                    }
                }
            }
            assert_eq!(got, [200, 300], "seed {seed}");
        }
    }

    /// A message delivered in place owes its credit when its consumer is
    /// done; if its connection went meanwhile, nothing is owed, and the
    /// gone QP must not come back as the current connection.
    #[test]
    fn a_late_credit_of_a_gone_connection_is_owed_to_nobody() {
        let mut c = Credits::default();
        c.of(7, 4).take_returned(0);
        c.forget(7);
        c.of(9, 4);
        assert!(c.existing(7).is_none());
        assert!(c.existing(9).is_some());
        assert_eq!(c.cur.as_ref().map(|(q, _)| *q), Some(9));
    }

    #[test]
    fn the_current_connection_is_found_first_and_new_ones_start_afresh() {
        let mut c = Credits::default();
        c.of(10, 4).spend(0);
        assert_eq!(c.of(10, 4).credits, 3);
        assert_eq!(c.of(11, 4).credits, 4, "a new QP starts afresh");
        assert_eq!(c.of(10, 4).credits, 3, "the old one still drains");
        c.forget(10);
        assert_eq!(c.of(10, 4).credits, 4);
    }
}
