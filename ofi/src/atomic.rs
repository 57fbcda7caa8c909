//! Which libfabric atomics the provider does, and as what BTL atomic.
//!
//! The BTL has 64-bit add, fetch-and-add and compare-and-swap, atomic with
//! respect to each other through the device (where the device has atomics:
//! rxe and InfiniBand, not iWARP). So the provider offers, on FI_UINT64 and
//! FI_INT64, one element per operation:
//! - `fi_atomic`: FI_SUM (an add);
//! - `fi_fetch_atomic`: FI_SUM (fetch-and-add) and FI_ATOMIC_READ (a
//!   fetch-and-add of zero);
//! - `fi_compare_atomic`: FI_CSWAP.
//!
//! Everything else is refused, FI_ATOMIC_WRITE (swap) included: the
//! device has no swap, and the compare-and-swap loop that would make one
//! retries without bound under contention; it is not offered (yet).
//! `fi_query_atomic` says exactly this.
#![forbid(unsafe_code)]

use crate::sys;

/// Which call an atomic comes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `fi_atomic`: no result.
    Plain,
    /// `fi_fetch_atomic`: the old value comes back.
    Fetch,
    /// `fi_compare_atomic`: with a compare value; the old value comes back.
    Compare,
}

impl Class {
    /// From `fi_query_atomic`'s flags; None for other bits.
    pub fn of_flags(flags: u64) -> Option<Class> {
        match flags {
            0 => Some(Class::Plain),
            sys::FI_FETCH_ATOMIC => Some(Class::Fetch),
            sys::FI_COMPARE_ATOMIC => Some(Class::Compare),
            _ => None,
        }
    }
}

/// What the BTL does for one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Add, nothing back.
    Add(u64),
    /// Add, the old value back.
    FetchAdd(u64),
    /// Store `swap` if the word holds `compare`; the old value back.
    CompareSwap {
        /// The expected value.
        compare: u64,
        /// The new value.
        swap: u64,
    },
}

/// Whether the provider does `op` on `datatype` through `class` on a
/// device with (or without) atomics.
pub fn supported(atomics: bool, datatype: u32, op: u32, class: Class) -> bool {
    atomics
        && matches!(datatype, sys::FI_UINT64 | sys::FI_INT64)
        && matches!(
            (class, op),
            (Class::Plain, sys::FI_SUM)
                | (Class::Fetch, sys::FI_SUM | sys::FI_ATOMIC_READ)
                | (Class::Compare, sys::FI_CSWAP)
        )
}

/// The BTL operation of a supported atomic, from the operand (and the
/// compare value).
pub fn op_of(op: u32, class: Class, operand: u64, compare: u64) -> Option<Op> {
    Some(match (class, op) {
        (Class::Plain, sys::FI_SUM) => Op::Add(operand),
        (Class::Fetch, sys::FI_SUM) => Op::FetchAdd(operand),
        (Class::Fetch, sys::FI_ATOMIC_READ) => Op::FetchAdd(0),
        (Class::Compare, sys::FI_CSWAP) => Op::CompareSwap {
            compare,
            swap: operand,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_device_does_is_offered() {
        let all = [Class::Plain, Class::Fetch, Class::Compare];
        let mut yes = Vec::new();
        for dt in 0..16 {
            for op in 0..20 {
                for c in all {
                    if supported(true, dt, op, c) {
                        yes.push((dt, op, c));
                        assert!(op_of(op, c, 5, 6).is_some());
                    } else {
                        assert!(!supported(false, dt, op, c));
                    }
                    assert!(!supported(false, dt, op, c), "nothing without atomics");
                }
            }
        }
        assert_eq!(yes.len(), 8, "{yes:?}");
        assert!(!supported(
            true,
            sys::FI_UINT64,
            sys::FI_ATOMIC_WRITE,
            Class::Fetch
        ));
        assert!(!supported(true, sys::FI_UINT32, sys::FI_SUM, Class::Plain));
        assert_eq!(
            op_of(sys::FI_CSWAP, Class::Compare, 9, 4),
            Some(Op::CompareSwap {
                compare: 4,
                swap: 9
            })
        );
        assert_eq!(
            op_of(sys::FI_ATOMIC_READ, Class::Fetch, 77, 0),
            Some(Op::FetchAdd(0))
        );
        assert_eq!(Class::of_flags(sys::FI_FETCH_ATOMIC), Some(Class::Fetch));
        assert_eq!(Class::of_flags(1), None);
    }
}
