//! The xrcbtl byte transfer layer: puts the fabric, the connection manager,
//! the registration cache and the progress engine together.
//!
//! - [`btl::Btl`]: the BTL API (endpoints, active messages, eager and
//!   rendezvous sends, one-sided put and get, flush), shaped like Open MPI's
//!   BTL;
//! - [`config::BtlConfig`]: its settings, and the `XRCBTL_*` environment
//!   variables;
//! - [`conn::ConnDriver`]: runs the XRC connection manager against a
//!   fabric: it owns the verbs objects (INI, RC and TGT QPs, SRQs, CM ids)
//!   the manager names by reference, executes the manager's actions, and
//!   feeds it the fabric's CM events, async events and failed completions;
//! - [`wire`]: the message header and rendezvous control messages.

#![warn(missing_docs)]

pub mod btl;
pub mod config;
pub mod conn;
pub mod threaded;
pub mod wire;

pub use crate::btl::{
    AmCallback, Btl, BtlError, BtlStats, ErrorCallback, Incoming, OpId, OpStatus, Peer, RegMem,
    RemoteMem, Request, Tag,
};
pub use crate::config::{BtlConfig, Clock, RndvProtocol};
pub use crate::threaded::Threaded;
pub use bytes::Bytes;
pub use xrcbtl_progress::ThreadConfig;
pub use xrcbtl_xrc_conn::Mode;
