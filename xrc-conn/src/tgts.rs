//! The XRC TGT QP handles a rank holds, indexed by what the manager looks
//! them up by: the QP number a reuse request or a `Leave` names, the
//! sending process, and the CM connection that anchors one. A process of an
//! all-to-all at 10,000 nodes holds 1.28 million of them; a look through
//! all of them per request, per release or per disconnect would make
//! start-up and exit quadratic.

use std::collections::{BTreeMap, BTreeSet};

use crate::{CmRef, Rank, TgtRef};

/// A TGT QP handle this rank holds (created, or opened by number).
#[derive(Debug)]
pub(crate) struct Tgt {
    /// The QP's number.
    pub qpn: u32,
    /// The sending process.
    pub sender: Rank,
    /// The CM connection if this rank is the anchor.
    pub anchor_cm: Option<CmRef>,
}

/// Every handle, and the indexes over them (kept in step by the methods).
#[derive(Debug, Default)]
pub(crate) struct Tgts {
    all: BTreeMap<TgtRef, Tgt>,
    by_qpn: BTreeSet<(u32, TgtRef)>,
    by_sender: BTreeSet<(Rank, TgtRef)>,
    by_anchor: BTreeMap<CmRef, TgtRef>,
}

impl Tgts {
    /// Holds `tgt` (a reference not held yet).
    pub fn insert(&mut self, r: TgtRef, tgt: Tgt) {
        self.by_qpn.insert((tgt.qpn, r));
        self.by_sender.insert((tgt.sender, r));
        if let Some(cm) = tgt.anchor_cm {
            let other = self.by_anchor.insert(cm, r);
            debug_assert!(other.is_none(), "{cm:?} anchors two handles");
        }
        let old = self.all.insert(r, tgt);
        debug_assert!(old.is_none(), "{r:?} held twice");
    }

    /// Lets go of `r`; what it was.
    pub fn remove(&mut self, r: TgtRef) -> Option<Tgt> {
        let tgt = self.all.remove(&r)?;
        self.by_qpn.remove(&(tgt.qpn, r));
        self.by_sender.remove(&(tgt.sender, r));
        if let Some(cm) = tgt.anchor_cm {
            self.by_anchor.remove(&cm);
        }
        Some(tgt)
    }

    /// Handle `r`.
    pub fn get(&self, r: TgtRef) -> Option<&Tgt> {
        self.all.get(&r)
    }

    /// Whether `r` is held.
    pub fn contains(&self, r: TgtRef) -> bool {
        self.all.contains_key(&r)
    }

    /// Handles held.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Every handle's reference, in order.
    pub fn refs(&self) -> Vec<TgtRef> {
        self.all.keys().copied().collect()
    }

    /// The handles on QP number `qpn`, in order.
    pub fn with_qpn(&self, qpn: u32) -> Vec<TgtRef> {
        keyed(&self.by_qpn, qpn).collect()
    }

    /// Whether a handle on QP number `qpn` is held.
    pub fn holds_qpn(&self, qpn: u32) -> bool {
        keyed(&self.by_qpn, qpn).next().is_some()
    }

    /// Whether a handle on a QP `sender` sends through is held.
    pub fn has_sender(&self, sender: Rank) -> bool {
        keyed(&self.by_sender, sender).next().is_some()
    }

    /// The handle the CM connection `cm` anchors, no longer anchored by it.
    pub fn unanchor(&mut self, cm: CmRef) -> Option<TgtRef> {
        let r = self.by_anchor.remove(&cm)?;
        if let Some(t) = self.all.get_mut(&r) {
            t.anchor_cm = None;
        }
        Some(r)
    }
}

/// The handles an index files under `key`, in order.
fn keyed(index: &BTreeSet<(u32, TgtRef)>, key: u32) -> impl Iterator<Item = TgtRef> + '_ {
    index
        .range((key, TgtRef(0))..=(key, TgtRef(u64::MAX)))
        .map(|&(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tgt(qpn: u32, sender: Rank, anchor: Option<u64>) -> Tgt {
        Tgt {
            qpn,
            sender,
            anchor_cm: anchor.map(CmRef),
        }
    }

    #[test]
    fn the_indexes_follow_inserts_and_removals() {
        let mut t = Tgts::default();
        t.insert(TgtRef(1), tgt(100, 7, Some(50)));
        t.insert(TgtRef(2), tgt(100, 8, None));
        t.insert(TgtRef(3), tgt(101, 7, None));
        assert_eq!(t.with_qpn(100), vec![TgtRef(1), TgtRef(2)]);
        assert_eq!(t.with_qpn(99), vec![]);
        assert!(t.holds_qpn(100) && t.holds_qpn(101) && !t.holds_qpn(99));
        assert!(t.has_sender(7) && t.has_sender(8) && !t.has_sender(9));

        assert_eq!(t.unanchor(CmRef(50)), Some(TgtRef(1)));
        assert_eq!(t.unanchor(CmRef(50)), None);
        assert_eq!(t.get(TgtRef(1)).map(|x| x.anchor_cm), Some(None));

        assert_eq!(t.remove(TgtRef(1)).map(|x| x.qpn), Some(100));
        assert!(t.remove(TgtRef(1)).is_none());
        assert_eq!(t.with_qpn(100), vec![TgtRef(2)]);
        assert!(t.has_sender(7), "still through TGT 3");
        t.remove(TgtRef(3));
        assert!(!t.has_sender(7));
        assert_eq!((t.len(), t.refs()), (1, vec![TgtRef(2)]));
        assert!(t.contains(TgtRef(2)) && !t.contains(TgtRef(3)));
    }

    #[test]
    fn removing_an_anchored_handle_forgets_its_anchor() {
        let mut t = Tgts::default();
        t.insert(TgtRef(1), tgt(100, 7, Some(50)));
        t.remove(TgtRef(1));
        assert_eq!(t.unanchor(CmRef(50)), None);
    }
}
