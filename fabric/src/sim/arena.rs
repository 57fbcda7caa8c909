//! A slab of objects addressed by generation-checked ids.
//!
//! Handles held by user code outlive the objects they name when a simulated
//! process crashes; the generation makes a stale id miss instead of hitting a
//! newer object that reused the slot.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

/// Id of a `T` in an [`Arena<T>`].
pub(crate) struct Id<T> {
    index: u32,
    generation: u32,
    _kind: PhantomData<fn() -> T>,
}

impl<T> Id<T> {
    /// A stable number for the id, unique among live and dead ids of the
    /// arena (used as the public `id()` of CQs and SRQs).
    pub(crate) fn raw(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }
}

impl<T> Clone for Id<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Id<T> {}
impl<T> PartialEq for Id<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index && self.generation == other.generation
    }
}
impl<T> Eq for Id<T> {}
impl<T> PartialOrd for Id<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Id<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.index, self.generation).cmp(&(other.index, other.generation))
    }
}
impl<T> Hash for Id<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw().hash(state);
    }
}
impl<T> fmt::Debug for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}.{}", self.index, self.generation)
    }
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Objects of one kind.
pub(crate) struct Arena<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Arena<T> {
    pub(crate) fn insert(&mut self, value: T) -> Id<T> {
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.generation = slot.generation.wrapping_add(1);
            slot.value = Some(value);
            return Id {
                index,
                generation: slot.generation,
                _kind: PhantomData,
            };
        }
        let index = u32::try_from(self.slots.len()).expect("arena exceeds u32 slots");
        self.slots.push(Slot {
            generation: 0,
            value: Some(value),
        });
        Id {
            index,
            generation: 0,
            _kind: PhantomData,
        }
    }

    pub(crate) fn get(&self, id: Id<T>) -> Option<&T> {
        let slot = self.slots.get(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        slot.value.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: Id<T>) -> Option<&mut T> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        slot.value.as_mut()
    }

    pub(crate) fn remove(&mut self, id: Id<T>) -> Option<T> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        let value = slot.value.take()?;
        self.free.push(id.index);
        Some(value)
    }

    pub(crate) fn contains(&self, id: Id<T>) -> bool {
        self.get(id).is_some()
    }

    /// Live objects in slot order (deterministic).
    /// Every live value, mutably.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (Id<T>, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.value.as_ref().map(|v| {
                (
                    Id {
                        index: i as u32,
                        generation: s.generation,
                        _kind: PhantomData,
                    },
                    v,
                )
            })
        })
    }

    /// Ids of the live objects matching `pred`, in slot order.
    pub(crate) fn ids_where(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<Id<T>> {
        self.iter()
            .filter(|(_, v)| pred(v))
            .map(|(id, _)| id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_id_misses_reused_slot() {
        let mut a = Arena::default();
        let x = a.insert(1);
        assert_eq!(a.remove(x), Some(1));
        let y = a.insert(2);
        assert_eq!(a.get(x), None, "stale id must not reach the new object");
        assert_eq!(a.get(y), Some(&2));
        assert_eq!(a.iter().count(), 1);
        assert_eq!(a.remove(x), None);
        assert_eq!(a.iter().count(), 1);
    }
}
