//! Work-request ids backed by a slab.

/// Bits of an id that hold the slot index.
const INDEX_BITS: u32 = 32;
/// Ids from a slab never have either of the top two bits set: wr_ids with
/// them are free for other uses (receive buffers, control messages).
const GEN_MASK: u64 = (1 << 30) - 1;

struct Slot<T> {
    gen: u64,
    value: Option<T>,
}

/// State of outstanding work requests, found by their wr_id.
///
/// An id is the slot index and a generation; a slot's generation changes
/// every time it is freed, so the id of a completed request never finds the
/// request that reused its slot.
pub struct WrSlab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for WrSlab<T> {
    fn default() -> Self {
        WrSlab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> std::fmt::Debug for WrSlab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrSlab({} outstanding)", self.len)
    }
}

impl<T> WrSlab<T> {
    /// An empty slab.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `value`; returns its wr_id (top two bits clear).
    #[inline]
    pub fn insert(&mut self, value: T) -> u64 {
        self.len += 1;
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    value: None,
                });
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 requests")
            }
        };
        let slot = &mut self.slots[index as usize];
        debug_assert!(slot.value.is_none());
        slot.value = Some(value);
        (slot.gen << INDEX_BITS) | u64::from(index)
    }

    fn slot(&self, id: u64) -> Option<&Slot<T>> {
        let s = self.slots.get((id & u64::from(u32::MAX)) as usize)?;
        (s.gen == id >> INDEX_BITS).then_some(s)
    }

    /// The state of request `id`, if it is outstanding.
    #[inline]
    pub fn get(&self, id: u64) -> Option<&T> {
        self.slot(id)?.value.as_ref()
    }

    /// The state of request `id`, mutably.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let s = self.slots.get_mut((id & u64::from(u32::MAX)) as usize)?;
        if s.gen != id >> INDEX_BITS {
            return None;
        }
        s.value.as_mut()
    }

    /// Takes request `id`'s state out (its completion arrived); `None` for
    /// an id that is not outstanding.
    #[inline]
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let index = (id & u64::from(u32::MAX)) as u32;
        let s = self.slots.get_mut(index as usize)?;
        if s.gen != id >> INDEX_BITS {
            return None;
        }
        let v = s.value.take()?;
        s.gen = (s.gen + 1) & GEN_MASK;
        self.free.push(index);
        self.len -= 1;
        Some(v)
    }

    /// Takes out every request `pick` selects (e.g. those of a QP that was
    /// destroyed, whose completions will never come), in id order.
    pub fn extract(&mut self, mut pick: impl FnMut(&T) -> bool) -> Vec<(u64, T)> {
        let ids: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.value.as_ref().is_some_and(&mut pick))
            .map(|(i, s)| (s.gen << INDEX_BITS) | i as u64)
            .collect();
        ids.into_iter()
            .map(|id| (id, self.remove(id).expect("just found")))
            .collect()
    }

    /// Requests outstanding.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every outstanding request.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.value
                .as_ref()
                .map(|v| ((s.gen << INDEX_BITS) | i as u64, v))
        })
    }
}
