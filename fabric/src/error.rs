//! The one error type of the fabric layer.
//!
//! Every provider maps its failures onto these variants so that the layers
//! above can make decisions (fall back, retry, give up) without knowing which
//! provider they run on. `Unsupported` in particular is a normal answer: a
//! device without XRC says so, and the BTL falls back to RC + SRQ.

use std::io;

/// Result of a fabric operation.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong in a fabric operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device or provider cannot do this at all (`EOPNOTSUPP`), e.g. XRC
    /// on an iWARP device.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A queue or table is full (`ENOMEM` from a post, no free QP numbers);
    /// retry once completions have been polled.
    #[error("no resource: {0}")]
    NoResource(&'static str),
    /// An argument is outside what the device or object accepts (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The object is not in a state that allows the operation.
    #[error("invalid state: {0}")]
    InvalidState(String),
    /// A named object (a TGT QP number, an address, a device) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The address is already bound by another listener (`EADDRINUSE`).
    #[error("address in use: {0}")]
    AddrInUse(String),
    /// The completion queue overran; completions were lost and the queue is
    /// unusable.
    #[error("completion queue overrun")]
    CqOverrun,
    /// An operation did not finish in the time it was given.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The process that owned the object has exited (simulated fabric only:
    /// a real process cannot outlive itself).
    #[error("the owning process has exited")]
    ProcessGone,
    /// A verbs or RDMA CM call failed with an OS error.
    #[error("{verb} failed: {source}")]
    Verbs {
        /// The library call that failed.
        verb: &'static str,
        /// The errno it returned.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    /// Shorthand for [`Error::InvalidState`].
    pub fn state(msg: impl Into<String>) -> Self {
        Error::InvalidState(msg.into())
    }

    /// Shorthand for [`Error::NotFound`].
    pub fn not_found(msg: impl Into<String>) -> Self {
        Error::NotFound(msg.into())
    }
}
