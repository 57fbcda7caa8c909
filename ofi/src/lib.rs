//! A libfabric provider over xrcbtl (issue 29): the logic
//! that libfabric's contract asks of an FI_EP_RDM endpoint, as safe Rust
//! with no libfabric types, unit-tested without a fabric.
//!
//! - [`addr`]: an endpoint's address (`fi_getname`, `fi_av_insert`), 64
//!   bytes whatever the endpoint, strictly decoded;
//! - [`atomic`]: which atomics the provider does, and as what BTL atomic;
//! - [`av`]: the address vector, FI_AV_TABLE and FI_AV_MAP numbers and the
//!   way back from a peer to its number (FI_SOURCE);
//! - [`cq`]: completion queue entries in order, errors in their place,
//!   places reserved at post time; counters;
//! - [`engine`]: one domain's endpoints driven over its BTL rank
//!   (messages eager and by rendezvous, completions, counters, cancel);
//! - [`flags`]: libfabric's flags as `u64`;
//! - [`devices`]: the devices `fi_getinfo` offers (verbs, or the simulated
//!   fabric with `XRCBTL_OFI_FABRIC=sim`);
//! - [`info`]: what `fi_getinfo` offers on a device and how hints narrow it;
//! - [`keys`]: registrations larger than the device's largest region, cut
//!   into chunks under one compound key that peers look up;
//! - [`matching`]: posted and unexpected receives, tag matching, FI_PEEK /
//!   FI_CLAIM / FI_DISCARD, cancel, multi-receive buffers and truncation;
//! - [`onesided`]: RMA transfers cut into device operations where the
//!   target's chunks or the local side's regions end; compound keys
//!   learnt from peers;
//! - [`rdm`]: one endpoint's messaging (eager, the provider's rendezvous,
//!   delivery complete, truncation, lost peers) as a state machine;
//! - [`wire`]: the provider's header inside the BTL's messages (endpoint,
//!   tag, CQ data, its rendezvous), strictly decoded;
//! - [`world`]: the simulated job whose ranks domains take with
//!   `XRCBTL_OFI_FABRIC=sim`.
//!
//! - [`host`]: the BTL rank behind a domain on a verbs device, numbered by
//!   its listener, and how it finds peers that connect first.
//!
//! Above them, the extern "C" layer (`prov`, private): `fi_prov_ini`, the
//! provider's getinfo and the fids' ops tables, the crate's only unsafe
//! code. It answers getinfo, opens fabrics, event queues, domains (on
//! verbs devices and on the simulated fabric), address vectors, completion
//! queues, counters and endpoints, which send and receive messages
//! (FI_MSG, FI_TAGGED with FI_PEEK, FI_CLAIM and FI_DISCARD) of any size,
//! read and write registered memory (FI_RMA, writes with remote CQ data
//! too) and run 64-bit atomics on it (FI_ATOMIC: [`atomic`]).

pub mod addr;
pub mod atomic;
pub mod av;
pub mod cq;
pub mod devices;
pub mod engine;
pub mod flags;
pub mod host;
pub mod info;
pub mod keys;
pub mod matching;
pub mod onesided;
mod prov;
pub mod rdm;
pub(crate) mod sys;
pub mod wire;
pub mod world;
