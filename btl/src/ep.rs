//! Endpoints: one per peer, with the work waiting to be posted to it and
//! the rules that keep that work in order.
//!
//! - Work is posted in the order it was queued ([`Item::order`]); work that
//!   failed with its path goes back to its place in the queue, so a
//!   retransmission never overtakes what came after it.
//! - Nothing is posted on a new path (a rebuilt QP) while work is still in
//!   flight on the old one.
//! - Endpoints with work wait in a ring; posting serves them round robin
//!   (see `post.rs`), so that endpoints sharing an XRC INI QP take turns
//!   on its send queue.
//!
//! Endpoints are found by rank (set up when peers are added, read per
//! message) and then by index: their slots are never reused, so an index
//! stays valid for the life of the BTL. Ranks below [`DENSE_RANKS`] are
//! looked up in a table indexed by rank (4 bytes per rank up to the
//! highest one added), higher ones in a hash map.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use xrcbtl_xrc_conn::Rank;

use crate::credits::Credits;
use crate::proto::eager::{SeqRx, SeqTx};
use crate::types::BtlError;
use crate::work::{Item, Work};

/// How to reach a peer: the QP (the driver's slot for it, and its number)
/// and the peer's SRQ numbers by class (XRC; empty with RC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Path {
    /// The driver's slot of the QP.
    pub slot: u32,
    /// The QP's number.
    pub qpn: u32,
    /// The peer's XRC SRQ numbers by size class.
    pub srqns: Vec<u32>,
    /// The number among `srqns` of the class that short messages take
    /// ([`crate::iface::Iface::small_class`]), looked up once, when the
    /// path is made: the latency path's send reads it without a bounds
    /// check. `None` without XRC, or when short messages take no one class.
    pub small_srqn: Option<u32>,
}

/// Whether an endpoint can still be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EpState {
    /// Usable.
    Open,
    /// Failed or deleted: everything to it fails with this.
    Gone(BtlError),
}

/// The state of one peer.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// The peer.
    pub rank: Rank,
    /// Usable or not.
    pub state: EpState,
    /// A connection was asked for and has not been reported yet.
    pub connecting: bool,
    /// The path messages go on, once connected.
    pub path: Option<Path>,
    /// Sequence numbers of messages to the peer.
    pub tx: SeqTx,
    /// Sequence numbers of messages from the peer.
    pub rx: SeqRx,
    /// The order of the last queued item.
    pub order: u64,
    /// Work waiting to be posted.
    pub pending: VecDeque<Item>,
    /// Work posted and not completed.
    pub in_flight: u32,
    /// The QP slot that work is in flight on.
    pub flight_slot: Option<u32>,
    /// Credit flow control by connection.
    pub credits: Credits,
    /// In the ready ring.
    pub queued: bool,
    /// The sequence number expected from the peer at the last look for
    /// silent peers ([`crate::core::Core::probe_silent`]).
    pub probe_seen: Option<u32>,
}

impl Endpoint {
    fn new(rank: Rank) -> Endpoint {
        Endpoint {
            rank,
            state: EpState::Open,
            connecting: false,
            path: None,
            tx: SeqTx::default(),
            rx: SeqRx::default(),
            order: 0,
            pending: VecDeque::new(),
            in_flight: 0,
            flight_slot: None,
            credits: Credits::default(),
            queued: false,
            probe_seen: None,
        }
    }

    /// Whether it is usable.
    pub fn is_open(&self) -> bool {
        self.state == EpState::Open
    }
}

/// A hasher for ranks: one multiplication (ranks are small, dense
/// integers chosen by the job, not by an adversary).
#[derive(Default)]
pub(crate) struct RankHasher(u64);

impl Hasher for RankHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Ranks found through a table indexed by rank (at most 16 MiB of it);
/// higher ones through a hash map.
pub(crate) const DENSE_RANKS: Rank = 1 << 22;

/// A free entry of the dense table.
const NO_EP: u32 = u32::MAX;

/// Every endpoint of the rank, and the ring of those with work to post.
#[derive(Debug, Default)]
pub(crate) struct Endpoints {
    list: Vec<Endpoint>,
    /// Endpoint index by rank, for ranks below [`DENSE_RANKS`] (`NO_EP`:
    /// none).
    dense: Vec<u32>,
    /// Endpoint index by rank, for the others.
    index: HashMap<Rank, u32, BuildHasherDefault<RankHasher>>,
    /// Known (not deleted) endpoints.
    known: usize,
    ready: VecDeque<u32>,
    /// Items waiting in all pending queues.
    pub pending_now: u64,
    /// The most that ever waited at once.
    pub pending_max: u64,
    /// The endpoints whose path an XRC INI QP was, by its slot: what its
    /// destruction must clear (an RC QP's, and the loopback's, is the one
    /// the driver names).
    ini_users: HashMap<u32, Vec<u32>>,
}

impl Endpoints {
    /// Endpoint `ei`'s path is the XRC INI QP in `slot`.
    pub fn uses_ini(&mut self, slot: u32, ei: u32) {
        let users = self.ini_users.entry(slot).or_default();
        if !users.contains(&ei) {
            users.push(ei);
        }
    }

    /// The endpoints whose path the XRC INI QP in `slot` was, now that it
    /// is destroyed.
    pub fn take_ini_users(&mut self, slot: u32) -> Vec<u32> {
        self.ini_users.remove(&slot).unwrap_or_default()
    }

    /// The endpoint of `rank`, made if new (a deleted one is made afresh).
    pub fn add(&mut self, rank: Rank) -> u32 {
        if let Some(i) = self.find(rank) {
            return i;
        }
        let i = u32::try_from(self.list.len())
            .ok()
            .filter(|&i| i != NO_EP)
            .expect("fewer than 2^32 - 1 endpoints");
        self.list.push(Endpoint::new(rank));
        if rank < DENSE_RANKS {
            let at = rank as usize;
            if self.dense.len() <= at {
                self.dense.resize(at + 1, NO_EP);
            }
            self.dense[at] = i;
        } else {
            self.index.insert(rank, i);
        }
        self.known += 1;
        i
    }

    /// Forgets `rank` (its slot stays, gone).
    pub fn remove(&mut self, rank: Rank) {
        let had = if rank < DENSE_RANKS {
            self.dense
                .get_mut(rank as usize)
                .map(|e| std::mem::replace(e, NO_EP))
                .is_some_and(|i| i != NO_EP)
        } else {
            self.index.remove(&rank).is_some()
        };
        if had {
            self.known -= 1;
        }
    }

    /// The index of `rank`'s endpoint.
    #[inline]
    pub fn find(&self, rank: Rank) -> Option<u32> {
        if rank < DENSE_RANKS {
            return self
                .dense
                .get(rank as usize)
                .copied()
                .filter(|&i| i != NO_EP);
        }
        self.find_sparse(rank)
    }

    /// [`Endpoints::find`] of a rank past the dense table: a hash look-up,
    /// kept out of the callers that inline the dense one.
    #[inline(never)]
    fn find_sparse(&self, rank: Rank) -> Option<u32> {
        self.index.get(&rank).copied()
    }

    /// Endpoint `i`.
    pub fn get(&self, i: u32) -> &Endpoint {
        &self.list[i as usize]
    }

    /// Endpoint `i`, mutably.
    pub fn get_mut(&mut self, i: u32) -> &mut Endpoint {
        &mut self.list[i as usize]
    }

    /// Endpoint `i`, mutably, if one was ever made with that index.
    #[inline]
    pub fn try_get_mut(&mut self, i: u32) -> Option<&mut Endpoint> {
        self.list.get_mut(i as usize)
    }

    /// Known (not deleted) endpoints.
    pub fn len(&self) -> usize {
        self.known
    }

    /// Every endpoint ever made, with its index (a deleted one's is no
    /// longer [`Endpoints::find`]'s).
    #[cfg(debug_assertions)]
    pub fn all(&self) -> impl Iterator<Item = (u32, &Endpoint)> {
        (0..).zip(self.list.iter())
    }

    /// Puts endpoint `i` in the ready ring if it has work and is not there.
    pub fn mark_ready(&mut self, i: u32) {
        let e = &mut self.list[i as usize];
        if !e.queued && !e.pending.is_empty() && e.is_open() {
            e.queued = true;
            self.ready.push_back(i);
        }
    }

    /// Queues work at the end of endpoint `i`'s order.
    pub fn enqueue(&mut self, i: u32, work: Work) {
        let e = &mut self.list[i as usize];
        e.order += 1;
        let item = Item {
            order: e.order,
            tries: 0,
            work,
        };
        first_room(&mut e.pending);
        e.pending.push_back(item);
        self.pending_now += 1;
        self.pending_max = self.pending_max.max(self.pending_now);
        self.mark_ready(i);
    }

    /// Takes the next order number of endpoint `i` (for work that is posted
    /// at once, without queueing).
    pub fn next_order(&mut self, i: u32) -> u64 {
        let e = &mut self.list[i as usize];
        e.order += 1;
        e.order
    }

    /// Puts an item that could not be posted back at its place (the front,
    /// unless a credit message was queued meanwhile).
    pub fn unpop(&mut self, i: u32, item: Item) {
        self.put(i, item);
    }

    /// Queues an item that was never queued, or that failed in flight, at
    /// its place in the order.
    pub fn requeue(&mut self, i: u32, item: Item) {
        self.put(i, item);
        self.mark_ready(i);
    }

    /// Puts `item` in endpoint `i`'s queue at its place in the order.
    fn put(&mut self, i: u32, item: Item) {
        let e = &mut self.list[i as usize];
        first_room(&mut e.pending);
        let at = e.pending.partition_point(|x| x.order < item.order);
        e.pending.insert(at, item);
        self.pending_now += 1;
        self.pending_max = self.pending_max.max(self.pending_now);
    }

    /// Takes the head of endpoint `i`'s queue.
    pub fn pop(&mut self, i: u32) -> Option<Item> {
        let pending = &mut self.list[i as usize].pending;
        let item = pending.pop_front();
        if item.is_some() {
            self.pending_now -= 1;
            // The one item's room of a queue that never held more goes
            // back with its item (a burst of one message to every peer
            // leaves nothing queued behind); a queue that grew keeps its
            // room, for the next burst to that peer.
            if pending.is_empty() && pending.capacity() == 1 {
                *pending = VecDeque::new();
            }
        }
        item
    }

    /// Takes every queued item of endpoint `i`.
    pub fn drain(&mut self, i: u32) -> Vec<Item> {
        let items: Vec<Item> = self.list[i as usize].pending.drain(..).collect();
        self.pending_now -= items.len() as u64;
        items
    }

    /// Whether any endpoint waits in the ring.
    pub fn any_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The ring of endpoints with work, taken for a round.
    pub fn take_ready(&mut self) -> VecDeque<u32> {
        std::mem::take(&mut self.ready)
    }

    /// Gives the ring back after a round (ahead of endpoints that became
    /// ready meanwhile).
    pub fn restore_ready(&mut self, mut ring: VecDeque<u32>) {
        ring.append(&mut self.ready);
        self.ready = ring;
    }
}

/// Gives an endpoint's queue that holds no memory room for one item: a
/// burst to every peer of a large job (one message each, queued behind
/// the CQ budget) then holds one item's room per endpoint, not the four a
/// first push would make, and gives it back as each drains
/// ([`Endpoints::pop`]).
#[inline]
fn first_room(pending: &mut VecDeque<Item>) {
    if pending.capacity() == 0 {
        pending.reserve_exact(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks below and above the dense table are found, forgotten and
    /// counted alike, and a rank never added is not found, whether its
    /// entry in the table exists or not.
    #[test]
    fn ranks_are_found_in_the_table_and_beyond_it() {
        let mut eps = Endpoints::default();
        let high = DENSE_RANKS + 7;
        let (a, b, c) = (eps.add(5), eps.add(high), eps.add(0));
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(eps.add(5), a, "added twice, one endpoint");
        assert_eq!(eps.len(), 3);
        assert_eq!(eps.find(5), Some(a));
        assert_eq!(eps.find(high), Some(b));
        assert_eq!(eps.find(0), Some(c));
        assert_eq!(eps.find(3), None, "an entry of the table, never added");
        assert_eq!(eps.find(6), None, "past the table's end");
        assert_eq!(eps.find(high + 1), None);
        eps.remove(5);
        eps.remove(high);
        eps.remove(5);
        eps.remove(4);
        assert_eq!(eps.len(), 1);
        assert_eq!((eps.find(5), eps.find(high)), (None, None));
        assert_eq!(eps.get(a).rank, 5, "the slot stays");
        assert_eq!(eps.add(5), 3, "made afresh");
        assert_eq!(eps.len(), 2);
    }
}
