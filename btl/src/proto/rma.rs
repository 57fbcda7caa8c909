//! One-sided put and get between registered local memory and a peer's
//! registered memory: each is one RDMA write or read, checked against both
//! registrations before anything is posted, and done when it completes.

use xrcbtl_fabric::{RemoteAddr, Result};

use super::{Owner, Rdma, RdmaOp};
use crate::types::{inside, LocalPtr, RemotePtr};

/// The longest one-sided transfer (verbs carries up to 2^31 bytes per work
/// request).
pub const MAX_RMA: u64 = 1 << 30;

/// The work of put (`write`) or get for operation `op`: `len` bytes between
/// `local` and `remote`.
pub(crate) fn transfer(
    op: u64,
    write: bool,
    local: LocalPtr,
    remote: RemotePtr,
    len: u64,
) -> Result<Rdma> {
    if len == 0 || len > MAX_RMA {
        return Err(xrcbtl_fabric::Error::invalid(format!(
            "one-sided length {len} outside 1..=1 GiB"
        )));
    }
    inside("local", local.reg.addr, local.reg.len, local.addr, len)?;
    inside("remote", remote.mem.addr, remote.mem.len, remote.addr, len)?;
    Ok(Rdma {
        op: if write { RdmaOp::Write } else { RdmaOp::Read },
        local: xrcbtl_fabric::Sge {
            addr: local.addr,
            length: len as u32,
            lkey: local.reg.lkey,
        },
        remote: RemoteAddr {
            addr: remote.addr,
            rkey: remote.mem.rkey,
        },
        owner: Owner::Op { op },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{MemReg, RemoteMem};

    #[test]
    fn ranges_are_checked_on_both_sides() {
        let reg = MemReg {
            id: 1,
            addr: 0x1000,
            len: 4096,
            lkey: 7,
            rkey: 8,
        };
        let peer = RemoteMem {
            addr: 0x9000,
            len: 100,
            rkey: 9,
        };
        let w = transfer(3, true, reg.at(10), peer.at(20), 80).unwrap();
        assert_eq!(w.op, RdmaOp::Write);
        assert_eq!(
            (w.local.addr, w.local.length, w.local.lkey),
            (0x100a, 80, 7)
        );
        assert_eq!((w.remote.addr, w.remote.rkey), (0x9014, 9));
        assert_eq!(w.owner, Owner::Op { op: 3 });
        assert!(
            transfer(3, false, reg.at(10), peer.at(20), 81).is_err(),
            "past the peer's end"
        );
        assert!(
            transfer(3, false, reg.at(4090), peer.at(0), 7).is_err(),
            "past ours"
        );
        assert!(
            transfer(3, false, reg.at(0), peer.at(0), 0).is_err(),
            "empty"
        );
        assert!(
            transfer(3, false, reg.at(0), peer.at(u64::MAX - 0x9000), 8).is_err(),
            "wraps"
        );
        let below = LocalPtr { reg, addr: 0x800 };
        assert!(
            transfer(3, false, below, peer.at(0), 8).is_err(),
            "below ours"
        );
    }
}
