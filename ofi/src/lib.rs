//! A libfabric provider over xrcbtl, in the making (issue 29): the logic
//! that libfabric's contract asks of an FI_EP_RDM endpoint, as safe Rust
//! with no libfabric types, unit-tested without a fabric.
//!
//! - [`av`]: the address vector, FI_AV_TABLE and FI_AV_MAP numbers and the
//!   way back from a peer to its number (FI_SOURCE);
//! - [`cq`]: completion queue entries in order, errors in their place,
//!   places reserved at post time; counters;
//! - [`info`]: what `fi_getinfo` offers on a device and how hints narrow it;
//! - [`matching`]: posted and unexpected receives, tag matching, FI_PEEK /
//!   FI_CLAIM / FI_DISCARD, cancel, multi-receive buffers and truncation;
//! - [`rdm`]: one endpoint's messaging (eager, the provider's rendezvous,
//!   delivery complete, truncation, lost peers) as a state machine;
//! - [`wire`]: the provider's header inside the BTL's messages (endpoint,
//!   tag, CQ data, its rendezvous), strictly decoded.

pub mod av;
pub mod cq;
pub mod info;
pub mod matching;
pub mod rdm;
pub(crate) mod sys;
pub mod wire;
