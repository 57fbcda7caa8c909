//! The xrcbtl byte transfer layer: puts the fabric, the connection manager,
//! the registration cache and the progress pieces together.
//!
//! A newcomer finds each concept in one file. The files stand on floors
//! (the README's layout lists them): a file imports only from its own
//! floor or below, never in a circle, and `tests/floors.rs` checks it.
//!
//! | file | concept |
//! |---|---|
//! | [`btl`] | the API ([`Btl`]), and how it is safe from any thread; its memory, one-sided work and deliveries in files of their own |
//! | [`addr`] | the address a rank publishes for its peers, encoded and strictly decoded |
//! | `types.rs` | the API's vocabulary: operations, registered memory, counters |
//! | `callbacks.rs` | the user's callbacks, generic over the handle they receive |
//! | `core/` | the state behind the lock: the progress order, connection events, the failure policy, the rendezvous glue, sending (one file per part) |
//! | `domains.rs` | how ranks receive: XRC or RC across the job, one XRC domain per node, checked as peers are added |
//! | `delivery.rs` | what the user must hear of (messages and where their bytes are, finished operations, failed peers), queued until the lock is released |
//! | `iface.rs` | the device resources: PD, CQs, XRC domain, receive classes, bounce and atomic result slots |
//! | [`conn`] | the connection driver: runs the XRC connection manager on the fabric (connections only) |
//! | `work.rs` | work for a peer: messages, where their bodies are kept, RDMA operations, the credit and cover messages |
//! | `ep.rs` | endpoints, their pending queues and ordering rules |
//! | `credits.rs` | credit flow control where the device has no RNR |
//! | `wr_id.rs` | the wr_id space |
//! | `pools.rs` | buffers kept for reuse: message buffers, joined messages, rendezvous sinks; a rendezvous' source and sink |
//! | `regs.rs` | memory registrations: the registration cache, and the user's registrations by handle, checked when an operation names one |
//! | `post.rs` | the send queues: the one place that turns work into a posted work request, and what completed given back |
//! | `recv.rs` | the receive side: the CQ poll, and each message judged (header, sender, order, credits, trains) before the core acts on it |
//! | `proto/` | eager order, rendezvous, one-sided, atomics, operations: state machines without I/O |
//! | [`wire`] | the message header and the rendezvous control payloads |
//! | [`config`] | settings and their `XRCBTL_*` variables, and the values of settings that are more than a number |
//! | [`place`] | the device's locality: the nearest device, buffers on its NUMA node, the progress thread on its CPUs |
//! | [`threaded`] | a BTL progressed by its own thread |
//! | [`sim`] | a simulated job (N nodes × M ranks) for tests, benches and examples |

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod addr;
pub mod btl;
mod callbacks;
pub mod config;
pub mod conn;
mod core;
mod credits;
mod delivery;
mod domains;
mod ep;
mod iface;
pub mod place;
mod pools;
mod post;
mod proto;
mod recv;
mod regs;
pub mod sim;
pub mod threaded;
mod types;
pub mod wire;
mod work;
mod wr_id;

pub use crate::btl::{AmCallback, Btl, ErrorCallback, OnDone};
pub use crate::config::{
    BtlConfig, Clock, EagerLimit, IdleYield, RndvProtocol, Setting, SplitLimit, MAX_SPLIT, SETTINGS,
};
pub use crate::proto::MAX_RMA;
pub use crate::threaded::Threaded;
pub use crate::types::{
    BtlError, BtlStats, Incoming, LocalPtr, MemReg, OpId, OpResult, OpStatus, Peer, PeerResolver,
    RawMemReg, Receive, RegMem, RemoteMem, RemotePtr, Tag,
};
pub use bytes::Bytes;
pub use xrcbtl_fabric::{Access, IbAddr, MappedBuf, UserMem, XrcdId};
pub use xrcbtl_progress::ThreadConfig;
pub use xrcbtl_xrc_conn::{Mode, Notice};
