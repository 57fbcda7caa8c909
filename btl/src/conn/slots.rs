//! The QP slot table: every QP the manager made, by slot (the data path's
//! index), by the manager's reference and by QP number.

use std::collections::HashMap;

use xrcbtl_fabric::{Context, Qp, QpCaps};
use xrcbtl_xrc_conn::{QpRef, Rank};

/// A QP the manager made, in its slot.
pub(super) struct Slot<C: Context> {
    /// The QP.
    pub qp: C::Qp,
    /// The manager's name for it.
    pub r: QpRef,
    /// The sizes the device granted.
    pub caps: QpCaps,
    /// The device reported the QP's last receive from the SRQ.
    pub last_wqe: bool,
    /// Handed to the CM (to connect or accept): it may have carried
    /// messages. One that never was carried nothing, and its end is news
    /// to nobody (a request that waited its turn and was dropped unsent).
    pub wired: bool,
    /// The rank whose messages arrive on it (an RC QP's peer), learnt when
    /// it was wired.
    pub peer: Option<Rank>,
}

/// The QPs the manager made, each in a slot: an index that stays valid
/// until the QP is destroyed, found by the manager's reference or the QP's
/// number without a search. Slot numbers are reused once free.
pub(super) struct QpSlots<C: Context> {
    slots: Vec<Option<Slot<C>>>,
    free: Vec<u32>,
    of_ref: HashMap<QpRef, u32>,
    of_num: HashMap<u32, u32>,
}

impl<C: Context> QpSlots<C> {
    /// An empty table.
    pub fn new() -> Self {
        QpSlots {
            slots: Vec::new(),
            free: Vec::new(),
            of_ref: HashMap::new(),
            of_num: HashMap::new(),
        }
    }

    /// A free slot number, kept out of the table (the loopback's) until
    /// [`QpSlots::give_number`].
    pub fn take_number(&mut self) -> u32 {
        match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// A slot number taken with [`QpSlots::take_number`] is free again.
    pub fn give_number(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Puts a QP with number `qpn` in a free slot; returns the slot.
    pub fn insert(&mut self, qpn: u32, s: Slot<C>) -> u32 {
        let slot = self.take_number();
        self.of_ref.insert(s.r, slot);
        self.of_num.insert(qpn, slot);
        self.slots[slot as usize] = Some(s);
        slot
    }

    /// Takes the QP the manager calls `r` out of its slot, which is free
    /// from now on; with its slot and number.
    pub fn remove(&mut self, r: QpRef) -> Option<(u32, u32, Slot<C>)> {
        let slot = self.of_ref.remove(&r)?;
        let s = self.slots[slot as usize]
            .take()
            .expect("a slot named by a reference is live");
        let qpn = s.qp.qp_num();
        self.of_num.remove(&qpn);
        self.free.push(slot);
        Some((slot, qpn, s))
    }

    /// The QP in `slot`.
    #[inline]
    pub fn get(&self, slot: u32) -> Option<&Slot<C>> {
        self.slots.get(slot as usize).and_then(|s| s.as_ref())
    }

    /// The QP the manager calls `r`, and its slot.
    pub fn of_ref(&self, r: QpRef) -> Option<(u32, &Slot<C>)> {
        let slot = *self.of_ref.get(&r)?;
        Some((slot, self.slots[slot as usize].as_ref()?))
    }

    /// The QP the manager calls `r`, to change.
    pub fn of_ref_mut(&mut self, r: QpRef) -> Option<&mut Slot<C>> {
        let slot = *self.of_ref.get(&r)?;
        self.slots[slot as usize].as_mut()
    }

    /// The QP numbered `qpn`, and its slot.
    pub fn of_num(&self, qpn: u32) -> Option<(u32, &Slot<C>)> {
        let slot = *self.of_num.get(&qpn)?;
        Some((slot, self.slots[slot as usize].as_ref()?))
    }

    /// The QP numbered `qpn`, to change.
    pub fn of_num_mut(&mut self, qpn: u32) -> Option<&mut Slot<C>> {
        let slot = *self.of_num.get(&qpn)?;
        self.slots[slot as usize].as_mut()
    }

    /// Every QP in the table.
    pub fn iter(&self) -> impl Iterator<Item = &Slot<C>> {
        self.slots.iter().flatten()
    }
}
