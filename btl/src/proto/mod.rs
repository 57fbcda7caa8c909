//! The BTL's protocols, as state machines without I/O: a message or a
//! completion goes in, work comes out. None of them touches a fabric: the
//! BTL's core registers memory, posts the work they ask for, and feeds
//! them what arrives, and the unit tests drive two of them against each
//! other through a fake memory (`pair.rs`).
//!
//! - [`eager`]: sequence numbers, and what an arriving number means;
//! - [`rndv`]: rendezvous, get (RTS, reads, ATS) and put (RTS, RTR, writes,
//!   FIN), pipelined in fragments;
//! - [`rma`]: one-sided put and get on registered memory;
//! - [`atomic`]: 64-bit fetch-add, compare-and-swap and add;
//! - [`ops`]: the operations in flight, their callbacks and outcomes.

pub(crate) mod atomic;
pub(crate) mod eager;
pub(crate) mod ops;
#[cfg(test)]
pub(crate) mod pair;
pub(crate) mod rma;
pub(crate) mod rndv;

pub use rma::MAX_RMA;

use xrcbtl_fabric::{RemoteAddr, SendOp, Sge};
use xrcbtl_xrc_conn::Rank;

/// A rendezvous message id (the sender's).
pub(crate) type MsgId = u64;

/// Registered local memory a protocol works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Local {
    /// First byte.
    pub addr: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

impl Local {
    /// An SGE over `len` bytes at `off`.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + off,
            length: len,
            lkey: self.lkey,
        }
    }
}

/// What an RDMA work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RdmaOp {
    /// Read remote into local.
    Read,
    /// Write local into remote.
    Write,
    /// Fetch-and-add; the old value lands in the local SGE.
    FetchAdd(u64),
    /// Compare-and-swap; the old value lands in the local SGE.
    CompareSwap {
        /// Expected value.
        compare: u64,
        /// Stored if it matches.
        swap: u64,
    },
}

/// Who waits for an RDMA work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A fragment of a rendezvous this rank receives (get).
    RndvIn {
        /// The sender.
        peer: Rank,
        /// The sender's message id.
        msg: MsgId,
    },
    /// A fragment of a rendezvous this rank sends (put).
    RndvOut {
        /// This rank's message id.
        msg: MsgId,
    },
    /// A one-sided put or get.
    Op {
        /// The operation.
        op: u64,
    },
    /// An iWARP put's write, whose fence ([`Owner::Fence`]) follows it:
    /// the write's own success says only that it left, so it reports
    /// nothing but a failure, and is never posted again by itself.
    Fenced {
        /// The operation.
        op: u64,
    },
    /// The read that follows an iWARP put's write on its connection: it
    /// completes once the write has been placed (the peer answers a read
    /// only after the writes before it), or it is flushed when the peer
    /// refused the write (a TERMINATE). Posted again, it brings its write
    /// with it, so its [`Rdma::local`] is the write's, and what it reads
    /// into is chosen when it is posted ([`Rdma::sge`]): one byte of the
    /// write's target into the rank's fence sink where the target is
    /// readable, nothing otherwise (siw was seen to answer a zero-length
    /// read with another read's length).
    Fence {
        /// The operation.
        op: u64,
        /// Whether it reads a byte.
        byte: bool,
    },
    /// An atomic.
    Atomic {
        /// The operation.
        op: u64,
        /// The result slot the old value lands in.
        slot: u32,
        /// Whether the operation reports the old value.
        fetch: bool,
    },
}

/// One RDMA work request a protocol asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rdma {
    /// What it does.
    pub op: RdmaOp,
    /// The local side (the source of a write, the sink of a read or an
    /// atomic's result).
    pub local: Sge,
    /// The remote side.
    pub remote: RemoteAddr,
    /// Who waits for it.
    pub owner: Owner,
}

impl Rdma {
    /// The verbs operation.
    pub fn send_op(&self) -> SendOp {
        match self.op {
            RdmaOp::Read => SendOp::Read(self.remote),
            RdmaOp::Write => SendOp::Write(self.remote),
            RdmaOp::FetchAdd(add) => SendOp::FetchAdd {
                remote: self.remote,
                add,
            },
            RdmaOp::CompareSwap { compare, swap } => SendOp::CompareSwap {
                remote: self.remote,
                compare,
                swap,
            },
        }
    }

    /// Whether it is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(self.op, RdmaOp::FetchAdd(_) | RdmaOp::CompareSwap { .. })
    }

    /// Bytes it moves.
    pub fn len(&self) -> u64 {
        u64::from(self.local.length)
    }

    /// An iWARP put as the write and the fence that follow each other on
    /// one connection; any other work unchanged, alone. `byte`: the fence
    /// reads one byte of the target (else nothing).
    pub fn fenced(self, byte: bool) -> (Rdma, Option<Rdma>) {
        let (RdmaOp::Write, Owner::Op { op }) = (self.op, self.owner) else {
            return (self, None);
        };
        let fence = Rdma {
            op: RdmaOp::Read,
            owner: Owner::Fence { op, byte },
            ..self
        };
        (
            Rdma {
                owner: Owner::Fenced { op },
                ..self
            },
            Some(fence),
        )
    }

    /// The write a flushed fence brings back with it.
    pub fn refenced(&self) -> Option<Rdma> {
        let Owner::Fence { op, .. } = self.owner else {
            return None;
        };
        Some(Rdma {
            op: RdmaOp::Write,
            owner: Owner::Fenced { op },
            ..*self
        })
    }

    /// The local SGE it is posted with: [`Rdma::local`], but a fence's own
    /// (`sink`: the one byte of the fence sink).
    pub fn sge(&self, sink: impl FnOnce() -> Option<Sge>) -> Sge {
        match self.owner {
            Owner::Fence { byte: true, .. } => sink().expect("a fence sink on iWARP"),
            Owner::Fence { byte: false, .. } => Sge {
                length: 0,
                ..self.local
            },
            _ => self.local,
        }
    }
}
