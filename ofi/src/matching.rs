//! Receive matching for one endpoint and one matching space (FI_MSG or
//! FI_TAGGED: libfabric keeps the two apart): posted receives, unexpected
//! messages, FI_PEEK / FI_CLAIM / FI_DISCARD, cancel and multi-receive
//! buffers. No libfabric types, no buffers and no I/O: receives are named by
//! the caller's [`RecvId`], messages are the caller's `M`, and what comes out
//! says where an arriving message goes and how much of it fits.
//!
//! The rules (fi_msg(3), fi_tagged(3)):
//! - A message matches a receive when their tags agree outside the receive's
//!   ignore bits, `(msg | ignore) == (recv | ignore)`, and the receive takes
//!   any source or names the message's. A message from a source the address
//!   vector does not hold ([`Source::Unknown`]) only matches a receive that
//!   takes any source.
//! - A message goes to the oldest matching posted receive; a receive takes
//!   the oldest matching unexpected message. So messages from one source
//!   are delivered in the order they arrived.
//! - A multi-receive buffer (FI_MULTI_RECV) takes messages one after another
//!   at increasing offsets until less than its minimum free space is left;
//!   the delivery that leaves it so carries `released`. A message larger
//!   than the room left is truncated, as a single receive would be.
//! - A claimed message (FI_PEEK | FI_CLAIM) matches nothing else; only a
//!   FI_CLAIM receive or discard with the same claim takes it.
//! - Unexpected messages hold at most a budget of bytes (what the caller
//!   says each one holds); past it an arrival is refused, not queued.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// An address vector index (fi_addr_t).
pub type Addr = u64;

/// The caller's name for a posted receive (an index into its own table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvId(pub u32);

/// The caller's name for a claim: the context of the FI_PEEK | FI_CLAIM
/// call, given again to the FI_CLAIM receive or discard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimId(pub u64);

/// Where a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A peer in the address vector.
    Known(Addr),
    /// A peer the address vector does not hold (yet): FI_ADDR_NOTAVAIL.
    Unknown,
}

/// What a receive takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// `None` takes any source (FI_ADDR_UNSPEC).
    pub from: Option<Addr>,
    /// The tag (0 in the FI_MSG space).
    pub tag: u64,
    /// Bits of the tag that do not take part (all ones in the FI_MSG space).
    pub ignore: u64,
}

impl Want {
    /// Anything, from anyone: an untagged receive of any source.
    pub const ANY: Want = Want {
        from: None,
        tag: 0,
        ignore: u64::MAX,
    };

    /// Whether a message with this header matches.
    pub fn takes(&self, head: &Header) -> bool {
        let source = match (self.from, head.from) {
            (None, _) => true,
            (Some(want), Source::Known(from)) => want == from,
            (Some(_), Source::Unknown) => false,
        };
        source && (head.tag | self.ignore) == (self.tag | self.ignore)
    }
}

/// What the matching needs of an arriving message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The sender.
    pub from: Source,
    /// Its tag (0 in the FI_MSG space).
    pub tag: u64,
    /// Its length in bytes.
    pub len: usize,
}

/// Where a matched message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The receive it goes to.
    pub recv: RecvId,
    /// Offset into the receive's buffer (nonzero only in a multi-receive
    /// buffer).
    pub offset: usize,
    /// Bytes of the message that land: at most the room there was.
    pub len: usize,
    /// Bytes that did not fit (FI_ETRUNC's `olen` when nonzero).
    pub truncated: usize,
    /// The receive is done with (always for a single receive; for a
    /// multi-receive buffer, when less than its minimum is left: the
    /// completion carries FI_MULTI_RECV).
    pub released: bool,
}

impl Place {
    /// A message of `msg_len` bytes at `offset` of receive `recv`, which has
    /// `room` bytes there: as much lands as fits.
    pub(crate) fn of(
        recv: RecvId,
        offset: usize,
        room: usize,
        msg_len: usize,
        released: bool,
    ) -> Place {
        let len = msg_len.min(room);
        Place {
            recv,
            offset,
            len,
            truncated: msg_len - len,
            released,
        }
    }
}

/// What [`Matcher::arrive`] did with a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<M> {
    /// It matched a posted receive: deliver it there.
    Matched(Place, M),
    /// No receive matched; it waits in the unexpected queue.
    Queued,
    /// No receive matched and the unexpected queue's budget is spent; the
    /// caller keeps the message and reports the overrun.
    OverBudget(M),
}

/// What [`Matcher::post`] did with a receive.
#[derive(Debug, PartialEq, Eq)]
pub enum Posted<M> {
    /// Unexpected messages matched it: each goes to its place, in order. A
    /// single receive takes at most one; a multi-receive buffer takes
    /// messages until it is released.
    Matched(Vec<(Place, Header, M)>),
    /// Nothing waiting matched; it is posted.
    Queued,
}

/// What FI_PEEK saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peeked<'a, M> {
    /// The matching message's header.
    pub head: Header,
    /// The message itself, still waiting (what else a completion reports
    /// of it, its remote CQ data, is there).
    pub msg: &'a M,
}

struct Receive {
    id: RecvId,
    want: Want,
    /// Bytes the buffer holds.
    size: usize,
    /// Multi-receive: bytes used so far, and the free space below which it
    /// is released. `None` for a single receive.
    multi: Option<(usize, usize)>,
}

struct Waiting<M> {
    head: Header,
    msg: M,
    /// Bytes of the budget it holds.
    held: usize,
    claim: Option<ClaimId>,
}

/// The matching state of one endpoint's matching space.
pub struct Matcher<M> {
    posted: VecDeque<Receive>,
    unexpected: VecDeque<Waiting<M>>,
    held_bytes: usize,
    held_bytes_max: usize,
}

/// Why a receive could not be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// A multi-receive buffer smaller than its own minimum free space, which
    /// would be released before it took anything.
    MultiTooSmall,
}

impl<M> Matcher<M> {
    /// Empty, holding at most `held_bytes_max` bytes of unexpected messages.
    pub fn new(held_bytes_max: usize) -> Self {
        Matcher {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            held_bytes: 0,
            held_bytes_max,
        }
    }

    /// Posted receives waiting.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// Unexpected messages waiting, claimed ones included.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    /// Budget bytes the unexpected messages hold.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// A message arrives; `held` is what it holds of the budget while it
    /// waits (its eager payload; a rendezvous only its header).
    pub fn arrive(&mut self, head: Header, msg: M, held: usize) -> Arrival<M> {
        if let Some(i) = self.posted.iter().position(|r| r.want.takes(&head)) {
            let place = self.place(i, head.len);
            return Arrival::Matched(place, msg);
        }
        if self.held_bytes + held > self.held_bytes_max {
            return Arrival::OverBudget(msg);
        }
        self.held_bytes += held;
        self.unexpected.push_back(Waiting {
            head,
            msg,
            held,
            claim: None,
        });
        Arrival::Queued
    }

    /// Posts a receive of `size` bytes; `min_free` makes it a multi-receive
    /// buffer released once less than `min_free` bytes are left.
    pub fn post(
        &mut self,
        id: RecvId,
        want: Want,
        size: usize,
        min_free: Option<usize>,
    ) -> Result<Posted<M>, PostError> {
        if let Some(min) = min_free {
            if size < min || size == 0 {
                return Err(PostError::MultiTooSmall);
            }
        }
        self.posted.push_back(Receive {
            id,
            want,
            size,
            multi: min_free.map(|min| (0, min)),
        });
        let i = self.posted.len() - 1;
        let mut matched = Vec::new();
        while let Some(w) = self
            .unexpected
            .iter()
            .position(|w| w.claim.is_none() && want.takes(&w.head))
        {
            let waiting = self.take_unexpected(w);
            let place = self.place(i, waiting.head.len);
            matched.push((place, waiting.head, waiting.msg));
            if place.released {
                break;
            }
        }
        Ok(if matched.is_empty() {
            Posted::Queued
        } else {
            Posted::Matched(matched)
        })
    }

    /// FI_PEEK: the oldest unclaimed unexpected message a receive would take.
    pub fn peek(&self, want: &Want) -> Option<Peeked<'_, M>> {
        self.unexpected
            .iter()
            .find(|w| w.claim.is_none() && want.takes(&w.head))
            .map(|w| Peeked {
                head: w.head,
                msg: &w.msg,
            })
    }

    /// FI_PEEK | FI_CLAIM: as [`peek`](Self::peek), and the message is then
    /// kept for `claim` alone.
    pub fn peek_claim(&mut self, want: &Want, claim: ClaimId) -> Option<Peeked<'_, M>> {
        let w = self
            .unexpected
            .iter_mut()
            .find(|w| w.claim.is_none() && want.takes(&w.head))?;
        w.claim = Some(claim);
        Some(Peeked {
            head: w.head,
            msg: &w.msg,
        })
    }

    /// FI_PEEK | FI_DISCARD: drops the oldest unclaimed message a receive
    /// would take, returning its header.
    pub fn peek_discard(&mut self, want: &Want) -> Option<(Header, M)> {
        let w = self
            .unexpected
            .iter()
            .position(|w| w.claim.is_none() && want.takes(&w.head))?;
        let waiting = self.take_unexpected(w);
        Some((waiting.head, waiting.msg))
    }

    /// FI_CLAIM (a receive, or with FI_DISCARD a drop): takes the message
    /// that `claim` claimed. The caller places it in the receive's buffer
    /// with [`Place`]'s rules of a single receive.
    pub fn take_claimed(&mut self, claim: ClaimId) -> Option<(Header, M)> {
        let w = self
            .unexpected
            .iter()
            .position(|w| w.claim == Some(claim))?;
        let waiting = self.take_unexpected(w);
        Some((waiting.head, waiting.msg))
    }

    /// fi_cancel of a posted receive. For a multi-receive buffer already
    /// partly used, the returned offset says how much it holds.
    pub fn cancel(&mut self, id: RecvId) -> Option<Cancelled> {
        let i = self.posted.iter().position(|r| r.id == id)?;
        let r = self.posted.remove(i).expect("the position was found");
        Some(Cancelled {
            used: r.multi.map_or(0, |(used, _)| used),
        })
    }

    /// Every posted receive, oldest first, removed (closing the endpoint).
    pub fn drain_posted(&mut self) -> Vec<RecvId> {
        self.posted.drain(..).map(|r| r.id).collect()
    }

    /// Every unexpected message, oldest first, removed (closing the endpoint).
    pub fn drain_unexpected(&mut self) -> Vec<(Header, M)> {
        self.held_bytes = 0;
        self.unexpected.drain(..).map(|w| (w.head, w.msg)).collect()
    }

    /// Keeps only the unexpected messages `keep` accepts (a peer was lost),
    /// in their order and with their claims.
    pub fn retain_unexpected(&mut self, mut keep: impl FnMut(&M) -> bool) {
        let mut freed = 0;
        self.unexpected.retain(|w| {
            let kept = keep(&w.msg);
            if !kept {
                freed += w.held;
            }
            kept
        });
        self.held_bytes -= freed;
    }

    fn take_unexpected(&mut self, i: usize) -> Waiting<M> {
        let waiting = self.unexpected.remove(i).expect("the position was found");
        self.held_bytes -= waiting.held;
        waiting
    }

    /// Places a message of `len` bytes in posted receive `i`, removing the
    /// receive once it is released.
    fn place(&mut self, i: usize, len: usize) -> Place {
        let r = &mut self.posted[i];
        let place = match &mut r.multi {
            None => Place::of(r.id, 0, r.size, len, true),
            Some((used, min)) => {
                let offset = *used;
                let room = r.size - offset;
                let landed = len.min(room);
                *used += landed;
                Place::of(r.id, offset, room, len, r.size - *used < *min)
            }
        };
        if place.released {
            self.posted.remove(i);
        }
        place
    }
}

/// What [`Matcher::cancel`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled {
    /// Bytes a multi-receive buffer had taken (0 for a single receive).
    pub used: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(from: Addr, tag: u64, len: usize) -> Header {
        Header {
            from: Source::Known(from),
            tag,
            len,
        }
    }

    fn tagged(from: Option<Addr>, tag: u64, ignore: u64) -> Want {
        Want { from, tag, ignore }
    }

    fn single(place: Place, recv: u32, len: usize) -> bool {
        place
            == Place {
                recv: RecvId(recv),
                offset: 0,
                len,
                truncated: 0,
                released: true,
            }
    }

    #[test]
    fn a_message_goes_to_the_oldest_matching_receive() {
        let mut m = Matcher::<u32>::new(1 << 20);
        assert_eq!(
            m.post(RecvId(1), tagged(Some(7), 5, 0), 64, None),
            Ok(Posted::Queued)
        );
        assert_eq!(
            m.post(RecvId(2), tagged(None, 5, 0), 64, None),
            Ok(Posted::Queued)
        );
        assert_eq!(
            m.post(RecvId(3), tagged(None, 5, 0), 64, None),
            Ok(Posted::Queued)
        );
        // From 8: receive 1 names 7, so the oldest that takes it is 2.
        let Arrival::Matched(p, 100) = m.arrive(head(8, 5, 10), 100, 10) else {
            panic!()
        };
        assert!(single(p, 2, 10));
        let Arrival::Matched(p, 101) = m.arrive(head(7, 5, 10), 101, 10) else {
            panic!()
        };
        assert!(single(p, 1, 10));
        let Arrival::Matched(p, 102) = m.arrive(head(7, 5, 10), 102, 10) else {
            panic!()
        };
        assert!(single(p, 3, 10));
        assert_eq!(
            (m.posted_len(), m.unexpected_len(), m.held_bytes()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_receive_takes_the_oldest_matching_unexpected_message_in_arrival_order() {
        let mut m = Matcher::<u32>::new(1 << 20);
        for (i, tag) in [3u64, 4, 3, 4].into_iter().enumerate() {
            assert_eq!(m.arrive(head(1, tag, 8), i as u32, 8), Arrival::Queued);
        }
        assert_eq!(m.held_bytes(), 32);
        let taken: Vec<u32> = (0..4)
            .map(|r| {
                let tag = if r < 2 { 4 } else { 3 };
                let Ok(Posted::Matched(v)) = m.post(RecvId(r), tagged(Some(1), tag, 0), 8, None)
                else {
                    panic!()
                };
                assert_eq!(v.len(), 1);
                v[0].2
            })
            .collect();
        assert_eq!(taken, [1, 3, 0, 2]);
        assert_eq!(
            (m.posted_len(), m.unexpected_len(), m.held_bytes()),
            (0, 0, 0)
        );
    }

    #[test]
    fn ignore_bits_and_any_source_are_wildcards_and_an_unknown_source_matches_only_any() {
        let w = tagged(None, 0xab00, 0x00ff);
        assert!(w.takes(&head(3, 0xab42, 0)));
        assert!(!w.takes(&head(3, 0xac42, 0)));
        assert!(tagged(Some(3), 1, 0).takes(&head(3, 1, 0)));
        assert!(!tagged(Some(3), 1, 0).takes(&head(4, 1, 0)));
        let stranger = Header {
            from: Source::Unknown,
            tag: 1,
            len: 0,
        };
        assert!(tagged(None, 1, 0).takes(&stranger));
        assert!(!tagged(Some(0), 1, 0).takes(&stranger));
        assert!(Want::ANY.takes(&head(9, 0, 0)));
        // Bits outside the ignore mask take part, whatever the receive's
        // ignored bits hold.
        assert!(tagged(None, 0xffff, 0x00ff).takes(&head(0, 0xff00, 0)));
    }

    #[test]
    fn a_short_receive_is_truncated_with_the_bytes_that_did_not_fit() {
        let mut m = Matcher::<()>::new(1 << 20);
        m.post(RecvId(0), Want::ANY, 100, None).unwrap();
        let Arrival::Matched(p, ()) = m.arrive(head(0, 0, 250), (), 0) else {
            panic!()
        };
        assert_eq!(
            p,
            Place {
                recv: RecvId(0),
                offset: 0,
                len: 100,
                truncated: 150,
                released: true
            }
        );
        // And the other way round: an unexpected message into a short receive.
        assert_eq!(m.arrive(head(0, 0, 9), (), 9), Arrival::Queued);
        let Ok(Posted::Matched(v)) = m.post(RecvId(1), Want::ANY, 4, None) else {
            panic!()
        };
        assert_eq!(
            v[0].0,
            Place {
                recv: RecvId(1),
                offset: 0,
                len: 4,
                truncated: 5,
                released: true
            }
        );
        assert_eq!(
            (m.posted_len(), m.unexpected_len(), m.held_bytes()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_multi_receive_buffer_fills_in_order_and_is_released_below_its_minimum() {
        let mut m = Matcher::<u32>::new(1 << 20);
        m.post(RecvId(0), Want::ANY, 100, Some(30)).unwrap();
        let places: Vec<Place> = [40usize, 25, 20]
            .into_iter()
            .enumerate()
            .map(|(i, len)| match m.arrive(head(0, 0, len), i as u32, len) {
                Arrival::Matched(p, _) => p,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            places[0],
            Place {
                recv: RecvId(0),
                offset: 0,
                len: 40,
                truncated: 0,
                released: false
            }
        );
        assert_eq!(
            places[1],
            Place {
                recv: RecvId(0),
                offset: 40,
                len: 25,
                truncated: 0,
                released: false
            }
        );
        // 35 left before, 15 after: below 30, so this one releases it.
        assert_eq!(
            places[2],
            Place {
                recv: RecvId(0),
                offset: 65,
                len: 20,
                truncated: 0,
                released: true
            }
        );
        assert_eq!(m.posted_len(), 0);
        assert_eq!(m.arrive(head(0, 0, 1), 9, 1), Arrival::Queued);
    }

    #[test]
    fn a_multi_receive_buffer_posted_late_takes_waiting_messages_until_released() {
        let mut m = Matcher::<u32>::new(1 << 20);
        for i in 0..5u32 {
            assert_eq!(m.arrive(head(0, 0, 30), i, 30), Arrival::Queued);
        }
        let Ok(Posted::Matched(v)) = m.post(RecvId(0), Want::ANY, 100, Some(20)) else {
            panic!()
        };
        // 30, 60, 90 taken; 10 left < 20 releases it after the third.
        let got: Vec<(usize, bool, u32)> = v
            .iter()
            .map(|(p, _, msg)| (p.offset, p.released, *msg))
            .collect();
        assert_eq!(got, [(0, false, 0), (30, false, 1), (60, true, 2)]);
        assert_eq!(
            (m.posted_len(), m.unexpected_len(), m.held_bytes()),
            (0, 2, 60)
        );
    }

    #[test]
    fn a_message_larger_than_a_multi_receive_buffers_room_is_truncated_and_releases_it() {
        let mut m = Matcher::<()>::new(1 << 20);
        m.post(RecvId(0), Want::ANY, 64, Some(8)).unwrap();
        let Arrival::Matched(p, ()) = m.arrive(head(0, 0, 50), (), 0) else {
            panic!()
        };
        assert!(!p.released);
        let Arrival::Matched(p, ()) = m.arrive(head(0, 0, 50), (), 0) else {
            panic!()
        };
        assert_eq!(
            p,
            Place {
                recv: RecvId(0),
                offset: 50,
                len: 14,
                truncated: 36,
                released: true
            }
        );
    }

    #[test]
    fn a_multi_receive_buffer_smaller_than_its_minimum_is_refused() {
        let mut m = Matcher::<()>::new(0);
        assert_eq!(
            m.post(RecvId(0), Want::ANY, 10, Some(11)),
            Err(PostError::MultiTooSmall)
        );
        assert_eq!(
            m.post(RecvId(0), Want::ANY, 0, Some(0)),
            Err(PostError::MultiTooSmall)
        );
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn peek_sees_without_taking_and_claim_keeps_the_message_for_its_claimer() {
        let mut m = Matcher::<u32>::new(1 << 20);
        assert_eq!(m.peek(&tagged(None, 1, 0)), None);
        m.arrive(head(2, 1, 16), 10, 16);
        m.arrive(head(2, 1, 17), 11, 17);
        assert_eq!(m.peek(&tagged(None, 1, 0)).map(|p| p.head.len), Some(16));
        assert_eq!(m.peek(&tagged(None, 1, 0)).map(|p| p.head.len), Some(16));
        assert_eq!(
            m.peek_claim(&tagged(None, 1, 0), ClaimId(77))
                .map(|p| p.head.len),
            Some(16)
        );
        // Claimed: neither peek nor a new receive sees it any more.
        assert_eq!(m.peek(&tagged(None, 1, 0)).map(|p| p.head.len), Some(17));
        let Ok(Posted::Matched(v)) = m.post(RecvId(0), tagged(None, 1, 0), 64, None) else {
            panic!()
        };
        assert_eq!(v[0].2, 11);
        assert_eq!(m.arrive(head(2, 1, 18), 12, 18), Arrival::Queued);
        assert_eq!(m.take_claimed(ClaimId(5)), None);
        assert_eq!(m.take_claimed(ClaimId(77)), Some((head(2, 1, 16), 10)));
        assert_eq!(m.take_claimed(ClaimId(77)), None);
        assert_eq!((m.unexpected_len(), m.held_bytes()), (1, 18));
    }

    #[test]
    fn peek_with_discard_drops_the_message_and_frees_its_budget() {
        let mut m = Matcher::<u32>::new(1 << 20);
        m.arrive(head(2, 1, 16), 10, 16);
        m.arrive(head(2, 2, 16), 11, 16);
        assert_eq!(
            m.peek_discard(&tagged(None, 2, 0)),
            Some((head(2, 2, 16), 11))
        );
        assert_eq!(m.peek_discard(&tagged(None, 2, 0)), None);
        assert_eq!((m.unexpected_len(), m.held_bytes()), (1, 16));
    }

    #[test]
    fn cancel_removes_a_posted_receive_once() {
        let mut m = Matcher::<u32>::new(1 << 20);
        m.post(RecvId(4), tagged(None, 1, 0), 8, None).unwrap();
        m.post(RecvId(5), Want::ANY, 100, Some(10)).unwrap();
        m.arrive(head(0, 9, 30), 0, 30);
        assert_eq!(m.cancel(RecvId(4)), Some(Cancelled { used: 0 }));
        assert_eq!(m.cancel(RecvId(4)), None);
        assert_eq!(m.cancel(RecvId(5)), Some(Cancelled { used: 30 }));
        // Cancelled: a message for it waits as unexpected.
        assert_eq!(m.arrive(head(0, 1, 8), 1, 8), Arrival::Queued);
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn arrivals_past_the_budget_are_handed_back_and_the_queue_is_unchanged() {
        let mut m = Matcher::<u32>::new(100);
        assert_eq!(m.arrive(head(0, 0, 60), 0, 60), Arrival::Queued);
        assert_eq!(m.arrive(head(0, 0, 60), 1, 60), Arrival::OverBudget(1));
        // A rendezvous header holds little and still fits.
        assert_eq!(m.arrive(head(0, 0, 1 << 30), 2, 40), Arrival::Queued);
        assert_eq!((m.unexpected_len(), m.held_bytes()), (2, 100));
        // A posted receive still takes a message whatever the budget.
        m.post(RecvId(0), tagged(None, 5, 0), 8, None).unwrap();
        assert!(matches!(
            m.arrive(head(0, 5, 8), 3, 8),
            Arrival::Matched(_, 3)
        ));
        let drained: Vec<u32> = m
            .drain_unexpected()
            .into_iter()
            .map(|(_, msg)| msg)
            .collect();
        assert_eq!(drained, [0, 2]);
        assert_eq!(m.held_bytes(), 0);
    }

    #[test]
    fn retain_drops_a_lost_peers_messages_and_keeps_the_rest_with_their_claims() {
        let mut m = Matcher::<u64>::new(1 << 20);
        for (from, tag) in [(1, 1), (2, 1), (1, 2), (2, 2)] {
            m.arrive(head(from, tag, 10), from, 10);
        }
        assert!(m.peek_claim(&tagged(Some(2), 2, 0), ClaimId(9)).is_some());
        m.retain_unexpected(|&from| from != 1);
        assert_eq!((m.unexpected_len(), m.held_bytes()), (2, 20));
        assert_eq!(
            m.peek(&tagged(None, 0, u64::MAX)).map(|p| p.head.tag),
            Some(1)
        );
        assert_eq!(m.take_claimed(ClaimId(9)).map(|(h, _)| h.tag), Some(2));
    }

    #[test]
    fn closing_drains_posted_receives_oldest_first() {
        let mut m = Matcher::<()>::new(0);
        for i in 0..3 {
            m.post(RecvId(i), Want::ANY, 1, None).unwrap();
        }
        assert_eq!(m.drain_posted(), [RecvId(0), RecvId(1), RecvId(2)]);
        assert_eq!(m.posted_len(), 0);
    }

    /// A seeded mix of posts and arrivals against a plain model: every
    /// message goes to the oldest open receive that takes it, each is
    /// delivered once, in arrival order per (source, tag), and at the end
    /// nothing waiting could have matched anything posted.
    #[test]
    fn a_random_mix_delivers_each_message_once_in_order_to_the_oldest_receive() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut m = Matcher::<(u64, u32)>::new(usize::MAX);
        let mut open: Vec<(RecvId, Want)> = Vec::new();
        let mut seq = [0u32; 3];
        let mut last_seen = [[0u32; 4]; 3];
        let (mut sent, mut delivered) = (0u32, 0u32);
        for step in 0..20_000u32 {
            let r = next();
            let tag = (r >> 8) % 4;
            let mut got = Vec::new();
            if r % 2 == 0 {
                let src = (r >> 16) % 3;
                seq[src as usize] += 1;
                sent += 1;
                let h = head(src, tag, 1);
                let oldest = open.iter().position(|(_, w)| w.takes(&h));
                match m.arrive(h, (src, seq[src as usize]), 1) {
                    Arrival::Matched(p, msg) => {
                        assert_eq!(Some(p.recv), oldest.map(|i| open[i].0));
                        got.push((p, h, msg));
                    }
                    Arrival::Queued => assert_eq!(oldest, None),
                    Arrival::OverBudget(_) => panic!("no budget limit here"),
                }
            } else {
                let from = if (r >> 20) % 2 == 0 {
                    None
                } else {
                    Some((r >> 24) % 3)
                };
                let want = tagged(from, tag, 0);
                open.push((RecvId(step), want));
                if let Ok(Posted::Matched(v)) = m.post(RecvId(step), want, 1, None) {
                    assert_eq!(v.len(), 1);
                    got.extend(v);
                }
            }
            for (p, h, (src, s)) in got {
                assert!(p.released && p.truncated == 0);
                let i = open
                    .iter()
                    .position(|(id, _)| *id == p.recv)
                    .expect("an open receive");
                assert!(open.remove(i).1.takes(&h));
                let prev = &mut last_seen[src as usize][h.tag as usize];
                assert!(*prev < s, "source {src} tag {}: {s} after {prev}", h.tag);
                *prev = s;
                delivered += 1;
            }
        }
        assert!(
            delivered > 5_000,
            "the mix delivered too little to mean anything: {delivered}"
        );
        assert_eq!(sent, delivered + m.unexpected_len() as u32);
        assert_eq!(m.posted_len(), open.len());
        for (_, want) in &open {
            assert_eq!(m.peek(want), None);
        }
    }
}
