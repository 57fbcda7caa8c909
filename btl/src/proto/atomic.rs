//! 64-bit atomics on a peer's registered memory: fetch-and-add,
//! compare-and-swap, and add without a result (a fetch-and-add whose
//! result nobody reads: verbs has no plain add). The value found lands in
//! one of the rank's 8-byte result slots, read when the atomic completes.

use xrcbtl_fabric::{Error, RemoteAddr, Result};

use super::{Local, Owner, Rdma, RdmaOp};
use crate::types::{inside, RemotePtr};

/// Which atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Atomic {
    /// Add, and return the old value.
    FetchAdd(u64),
    /// Swap if equal, and return the old value.
    CompareSwap {
        /// Expected.
        compare: u64,
        /// Stored if it matches.
        swap: u64,
    },
    /// Add; nothing is returned.
    Add(u64),
}

/// The work of atomic `kind` at `at` for operation `op`, its result landing
/// in `result` (slot `slot`).
pub(crate) fn atomic(
    op: u64,
    kind: Atomic,
    at: RemotePtr,
    result: Local,
    slot: u32,
) -> Result<Rdma> {
    if at.addr % 8 != 0 {
        return Err(Error::invalid(format!(
            "an atomic needs an 8-byte aligned address, not {:#x}",
            at.addr
        )));
    }
    inside("remote", at.mem.addr, at.mem.len, at.addr, 8)?;
    let op_kind = match kind {
        Atomic::FetchAdd(add) | Atomic::Add(add) => RdmaOp::FetchAdd(add),
        Atomic::CompareSwap { compare, swap } => RdmaOp::CompareSwap { compare, swap },
    };
    Ok(Rdma {
        op: op_kind,
        local: result.sge(0, 8),
        remote: RemoteAddr {
            addr: at.addr,
            rkey: at.mem.rkey,
        },
        owner: Owner::Atomic {
            op,
            slot,
            fetch: !matches!(kind, Atomic::Add(_)),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::RemoteMem;

    #[test]
    fn atomics_need_an_aligned_word_inside_the_peers_memory() {
        let peer = RemoteMem {
            addr: 0x1000,
            len: 64,
            rkey: 3,
        };
        let slot = Local {
            addr: 0x5000,
            lkey: 1,
            rkey: 2,
        };
        let w = atomic(9, Atomic::Add(5), peer.at(8), slot, 4).unwrap();
        assert_eq!(w.op, RdmaOp::FetchAdd(5));
        assert_eq!((w.local.addr, w.local.length), (0x5000, 8));
        assert_eq!(
            w.owner,
            Owner::Atomic {
                op: 9,
                slot: 4,
                fetch: false
            }
        );
        let cas = Atomic::CompareSwap {
            compare: 1,
            swap: 2,
        };
        assert!(atomic(9, cas, peer.at(56), slot, 0).is_ok());
        assert!(atomic(9, cas, peer.at(60), slot, 0).is_err(), "unaligned");
        assert!(atomic(9, cas, peer.at(64), slot, 0).is_err(), "outside");
    }
}
