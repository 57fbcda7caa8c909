//! The address vector: the numbers (`fi_addr_t`) that the caller uses for
//! its peers, and the way back from a peer to its number (FI_SOURCE). No
//! libfabric types: a peer is the caller's key `K` (what it decoded from an
//! address), and a number is a `u64`.
//!
//! The rules (fi_av(3)):
//! - FI_AV_TABLE numbers are indices, 0 upwards in insertion order. A
//!   removed entry leaves a hole; its index is never given out again, so a
//!   number kept after a remove can never name another peer.
//! - FI_AV_MAP numbers are opaque: here a slot in the low 32 bits and the
//!   slot's generation above. Slots are reused, and a stale number (its slot
//!   since removed or reused) names nothing.
//! - No number is ever [`NOT_AVAIL`] (FI_ADDR_NOTAVAIL, all ones), which
//!   stands for an entry that failed to go in.
//! - A peer inserted twice gets two numbers; FI_SOURCE reports the oldest
//!   that is still there.
#![forbid(unsafe_code)]

use rustc_hash::FxHashMap;
use std::hash::Hash;

use crate::addr::{EpAddr, PeerEp};

/// FI_ADDR_NOTAVAIL: no address (an entry that failed to go in, or a source
/// the vector does not hold).
pub const NOT_AVAIL: u64 = u64::MAX;

/// The two kinds of address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvKind {
    /// FI_AV_TABLE: numbers are indices.
    Table,
    /// FI_AV_MAP: numbers are the provider's own.
    Map,
}

/// Why an address vector refused a number or an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvError {
    /// The number names no entry (never given, removed, or stale).
    NotFound,
    /// The vector holds as many entries as it may.
    Full,
}

/// An address vector of peers named by `K`.
pub struct Av<K> {
    kind: AvKind,
    /// Per slot: its generation (Map) and the peer it holds.
    slots: Vec<(u32, Option<K>)>,
    /// Map: slots free for reuse.
    free: Vec<u32>,
    /// Each peer's live numbers, oldest first.
    by_key: FxHashMap<K, Vec<u64>>,
    len: usize,
    len_max: usize,
}

impl<K: Clone + Eq + Hash> Av<K> {
    /// An empty vector of `kind` holding at most `len_max` entries.
    pub fn new(kind: AvKind, len_max: usize) -> Self {
        Av {
            kind,
            slots: Vec::new(),
            free: Vec::new(),
            by_key: FxHashMap::default(),
            len: 0,
            len_max: len_max.min(u32::MAX as usize),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> AvKind {
        self.kind
    }

    /// Entries it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts a peer and returns its number.
    pub fn insert(&mut self, key: K) -> Result<u64, AvError> {
        if self.len >= self.len_max {
            return Err(AvError::Full);
        }
        let slot = match (self.kind, self.free.pop()) {
            (AvKind::Map, Some(slot)) => slot,
            _ if self.slots.len() >= u32::MAX as usize => return Err(AvError::Full),
            _ => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.1 = Some(key.clone());
        let number = match self.kind {
            AvKind::Table => u64::from(slot),
            AvKind::Map => (u64::from(entry.0) << 32) | u64::from(slot),
        };
        debug_assert_ne!(number, NOT_AVAIL);
        self.by_key.entry(key).or_default().push(number);
        self.len += 1;
        Ok(number)
    }

    /// The peer a number names.
    pub fn lookup(&self, number: u64) -> Result<&K, AvError> {
        let slot = self.slot_of(number)?;
        self.slots[slot].1.as_ref().ok_or(AvError::NotFound)
    }

    /// Removes the entry a number names and returns its peer.
    pub fn remove(&mut self, number: u64) -> Result<K, AvError> {
        let slot = self.slot_of(number)?;
        let entry = &mut self.slots[slot];
        let key = entry.1.take().ok_or(AvError::NotFound)?;
        if self.kind == AvKind::Map {
            // The next number of this slot differs from every earlier one
            // until the generation wraps, after 2^32 reuses of one slot.
            // (No number is all ones: slots stop below u32::MAX.)
            entry.0 = entry.0.wrapping_add(1);
            self.free.push(slot as u32);
        }
        let numbers = self
            .by_key
            .get_mut(&key)
            .expect("every live entry is indexed by its peer");
        numbers.retain(|&n| n != number);
        if numbers.is_empty() {
            self.by_key.remove(&key);
        }
        self.len -= 1;
        Ok(key)
    }

    /// FI_SOURCE: the number of a peer, the oldest if it was inserted more
    /// than once; [`NOT_AVAIL`] if it is not there.
    pub fn source(&self, key: &K) -> u64 {
        self.by_key
            .get(key)
            .and_then(|n| n.first().copied())
            .unwrap_or(NOT_AVAIL)
    }

    fn slot_of(&self, number: u64) -> Result<usize, AvError> {
        let (slot, generation) = (number as u32 as usize, (number >> 32) as u32);
        let expected = match self.kind {
            AvKind::Table => 0,
            AvKind::Map => self.slots.get(slot).map_or(0, |s| s.0),
        };
        if slot >= self.slots.len() || generation != expected {
            return Err(AvError::NotFound);
        }
        Ok(slot)
    }
}

/// The address vector of provider endpoints: numbers for peers (as an
/// [`Av`] of [`PeerEp`], so that an arriving message's source is found by
/// the endpoint that sent it) and each peer's full address.
pub struct EpAv {
    numbers: Av<PeerEp>,
    /// Each peer's address and how many entries hold it.
    addrs: FxHashMap<PeerEp, (EpAddr, usize)>,
}

/// Why an address did not go into an [`EpAv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpAvError {
    /// The vector's own refusal.
    Av(AvError),
    /// Another address already names the same endpoint (rank and number)
    /// with another listener or XRC domain: one of them is stale or
    /// foreign.
    Conflict,
}

impl EpAv {
    /// An empty vector of `kind` holding at most `len_max` entries.
    pub fn new(kind: AvKind, len_max: usize) -> Self {
        EpAv {
            numbers: Av::new(kind, len_max),
            addrs: FxHashMap::default(),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> AvKind {
        self.numbers.kind()
    }

    /// Inserts an endpoint's address and returns its number.
    pub fn insert(&mut self, a: EpAddr) -> Result<u64, EpAvError> {
        let peer = a.peer();
        if self.addrs.get(&peer).is_some_and(|(known, _)| *known != a) {
            return Err(EpAvError::Conflict);
        }
        let n = self.numbers.insert(peer).map_err(EpAvError::Av)?;
        self.addrs.entry(peer).or_insert((a, 0)).1 += 1;
        Ok(n)
    }

    /// The endpoint a number names, with its address.
    pub fn lookup(&self, number: u64) -> Result<(PeerEp, EpAddr), AvError> {
        let peer = *self.numbers.lookup(number)?;
        let (a, _) = self.addrs.get(&peer).ok_or(AvError::NotFound)?;
        Ok((peer, *a))
    }

    /// Removes the entry a number names.
    pub fn remove(&mut self, number: u64) -> Result<(), AvError> {
        let peer = self.numbers.remove(number)?;
        if let Some(e) = self.addrs.get_mut(&peer) {
            e.1 -= 1;
            if e.1 == 0 {
                self.addrs.remove(&peer);
            }
        }
        Ok(())
    }

    /// FI_SOURCE: the number of the endpoint a message came from
    /// ([`NOT_AVAIL`] if it is not in the vector).
    pub fn source(&self, peer: &PeerEp) -> u64 {
        self.numbers.source(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_numbers_are_indices_in_insertion_order_and_holes_are_never_refilled() {
        let mut av = Av::new(AvKind::Table, 100);
        assert_eq!(av.insert("a"), Ok(0));
        assert_eq!(av.insert("b"), Ok(1));
        assert_eq!(av.remove(0), Ok("a"));
        assert_eq!(av.lookup(0), Err(AvError::NotFound));
        assert_eq!(av.remove(0), Err(AvError::NotFound));
        assert_eq!(av.insert("c"), Ok(2));
        assert_eq!(av.lookup(1), Ok(&"b"));
        assert_eq!(av.lookup(2), Ok(&"c"));
        assert_eq!(av.lookup(3), Err(AvError::NotFound));
        assert_eq!(av.lookup(1 << 32 | 1), Err(AvError::NotFound));
        assert_eq!(av.len(), 2);
    }

    #[test]
    fn a_stale_map_number_names_nothing_after_its_slot_is_reused() {
        let mut av = Av::new(AvKind::Map, 100);
        let a = av.insert("a").unwrap();
        assert_eq!(av.remove(a), Ok("a"));
        let b = av.insert("b").unwrap();
        assert_ne!(a, b);
        assert_eq!(a as u32, b as u32, "the slot is reused");
        assert_eq!(av.lookup(a), Err(AvError::NotFound));
        assert_eq!(av.remove(a), Err(AvError::NotFound));
        assert_eq!(av.lookup(b), Ok(&"b"));
        assert_eq!(av.lookup(NOT_AVAIL), Err(AvError::NotFound));
    }

    #[test]
    fn source_names_the_oldest_live_entry_of_a_peer() {
        for kind in [AvKind::Table, AvKind::Map] {
            let mut av = Av::new(kind, 100);
            assert_eq!(av.source(&7), NOT_AVAIL);
            let first = av.insert(7).unwrap();
            let second = av.insert(7).unwrap();
            av.insert(8).unwrap();
            assert_eq!(av.source(&7), first);
            av.remove(first).unwrap();
            assert_eq!(av.source(&7), second);
            av.remove(second).unwrap();
            assert_eq!(av.source(&7), NOT_AVAIL);
        }
    }

    #[test]
    fn a_full_vector_refuses_until_an_entry_goes() {
        let mut av = Av::new(AvKind::Map, 2);
        let a = av.insert(1).unwrap();
        av.insert(2).unwrap();
        assert_eq!(av.insert(3), Err(AvError::Full));
        av.remove(a).unwrap();
        assert!(av.insert(3).is_ok());
        assert_eq!(av.len(), 2);
    }

    #[test]
    fn no_number_is_ever_not_avail_however_often_a_slot_is_reused() {
        let mut av = Av::new(AvKind::Map, 1);
        // Walk slot 0's generation to the top and past it.
        av.slots.push((u32::MAX - 2, None));
        av.free.push(0);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let n = av.insert(()).unwrap();
            assert_ne!(n, NOT_AVAIL);
            seen.push(n >> 32);
            av.remove(n).unwrap();
        }
        assert_eq!(
            seen,
            [
                u64::from(u32::MAX - 2),
                u64::from(u32::MAX - 1),
                u64::from(u32::MAX),
                0
            ]
        );
    }

    #[test]
    fn endpoint_vectors_find_sources_and_refuse_a_second_address_for_one_endpoint() {
        let a = EpAddr {
            rank: 5,
            ep: 1,
            listen: "10.0.0.5:4791".parse().unwrap(),
            receive: Some(xrcbtl_btl::Receive::Rc),
            ib: None,
        };
        let mut av = EpAv::new(AvKind::Table, 8);
        let n = av.insert(a).unwrap();
        let m = av.insert(a).unwrap();
        assert_eq!(av.lookup(m), Ok((a.peer(), a)));
        assert_eq!(av.source(&a.peer()), n, "the oldest entry");
        let moved = EpAddr {
            listen: "10.0.0.6:4791".parse().unwrap(),
            ..a
        };
        assert_eq!(av.insert(moved), Err(EpAvError::Conflict));
        av.remove(n).unwrap();
        assert_eq!(av.source(&a.peer()), m);
        av.remove(m).unwrap();
        assert_eq!(av.source(&a.peer()), NOT_AVAIL);
        assert_eq!(
            av.insert(moved).map(|_| ()),
            Ok(()),
            "gone, so the new address goes in"
        );
    }
}
