//! The C-visible types: parameter structs (a `field_mask` first, so that
//! fields can be added without breaking callers), registrations, callbacks
//! and constants.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

use crate::handle::xrcbtl_t;

/// The ABI version this header describes; `xrcbtl_abi_version` returns the
/// library's. They must be equal.
pub const XRCBTL_ABI_VERSION: u32 = 3;

/// Longest address `xrcbtl_address` writes.
pub const XRCBTL_ADDRESS_MAX: usize = 322;

/// Bytes of the handle a peer needs to reach registered memory
/// (`xrcbtl_mem_pack`).
pub const XRCBTL_REMOTE_MEM_SIZE: usize = 20;

/// `xrcbtl_params_t.rank` is set (required).
pub const XRCBTL_PARAM_RANK: u64 = 1 << 0;
/// `xrcbtl_params_t.device` is set.
pub const XRCBTL_PARAM_DEVICE: u64 = 1 << 1;
/// `xrcbtl_params_t.job` is set (required).
pub const XRCBTL_PARAM_JOB: u64 = 1 << 2;
/// `xrcbtl_params_t.listen_ip` is set.
pub const XRCBTL_PARAM_LISTEN_IP: u64 = 1 << 3;
/// `xrcbtl_params_t.settings` is set.
pub const XRCBTL_PARAM_SETTINGS: u64 = 1 << 4;
/// `xrcbtl_params_t.flags` is set.
pub const XRCBTL_PARAM_FLAGS: u64 = 1 << 5;

/// `xrcbtl_params_t.flags`: ignore the `XRCBTL_*` environment variables
/// (otherwise they are read, and one that names no setting is refused).
pub const XRCBTL_FLAG_NO_ENV: u32 = 1 << 0;

/// How to open a rank on a verbs device (`xrcbtl_create`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xrcbtl_params_t {
    /// Which of the fields below are set (`XRCBTL_PARAM_*`).
    pub field_mask: u64,
    /// This process's rank (unique in the job).
    pub rank: u32,
    /// The verbs device (default: of the devices with an IPv4 address, the
    /// nearest to where the process runs, from the hardware topology).
    pub device: *const c_char,
    /// The job's name, the same on every rank: the ranks of a node that
    /// give the same name share one XRC domain. Letters, digits, `-`, `_`
    /// and `.` only.
    pub job: *const c_char,
    /// The IP address to listen on (default: the device's interface
    /// address).
    pub listen_ip: *const c_char,
    /// `NULL`-terminated array of `"XRCBTL_NAME=value"` settings, applied
    /// over the environment (see `xrcbtl_settings`).
    pub settings: *const *const c_char,
    /// `XRCBTL_FLAG_*`.
    pub flags: u32,
}

/// A simulated InfiniBand device: XRC, RNR, atomics.
pub const XRCBTL_SIM_IB: u32 = 0;
/// A simulated RoCE device without XRC: RC + SRQ.
pub const XRCBTL_SIM_ROCE: u32 = 1;
/// A simulated iWARP device: RC, no RNR (credit flow control), no atomics.
pub const XRCBTL_SIM_IWARP: u32 = 2;

/// `xrcbtl_sim_params_t.seed` is set.
pub const XRCBTL_SIM_PARAM_SEED: u64 = 1 << 0;
/// `xrcbtl_sim_params_t.nodes` is set.
pub const XRCBTL_SIM_PARAM_NODES: u64 = 1 << 1;
/// `xrcbtl_sim_params_t.ranks_per_node` is set.
pub const XRCBTL_SIM_PARAM_RANKS_PER_NODE: u64 = 1 << 2;
/// `xrcbtl_sim_params_t.device` is set.
pub const XRCBTL_SIM_PARAM_DEVICE: u64 = 1 << 3;
/// `xrcbtl_sim_params_t.settings` is set.
pub const XRCBTL_SIM_PARAM_SETTINGS: u64 = 1 << 4;

/// A simulated job (`xrcbtl_sim_create`): `nodes` x `ranks_per_node` ranks
/// in this process, in virtual time, deterministic from the seed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xrcbtl_sim_params_t {
    /// Which of the fields below are set (`XRCBTL_SIM_PARAM_*`).
    pub field_mask: u64,
    /// The seed (default 1).
    pub seed: u64,
    /// Nodes (default 2).
    pub nodes: u32,
    /// Ranks on each node (default 1). Rank r lives on node r / ranks_per_node.
    pub ranks_per_node: u32,
    /// `XRCBTL_SIM_IB` (default), `XRCBTL_SIM_ROCE` or `XRCBTL_SIM_IWARP`.
    pub device: u32,
    /// `NULL`-terminated `"XRCBTL_NAME=value"` settings for every rank
    /// (the environment is not read).
    pub settings: *const *const c_char,
}

/// Peers may read the memory.
pub const XRCBTL_ACCESS_REMOTE_READ: u32 = 1 << 0;
/// Peers may write the memory.
pub const XRCBTL_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// Peers may run atomics on the memory.
pub const XRCBTL_ACCESS_REMOTE_ATOMIC: u32 = 1 << 2;

/// Registered memory (`xrcbtl_register_mem`): a plain value to keep and
/// pass back unchanged. The library checks it against its live
/// registrations when an operation starts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct xrcbtl_mem_t {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The registration's id.
    pub id: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// An active-message callback: `len` bytes from rank `src` with `tag`
/// (the header and the payload of the send, contiguous), valid during the
/// call. Runs on a thread in `xrcbtl_progress`, with no lock of the library
/// held: it may send, add peers, start operations and call progress.
pub type xrcbtl_am_cb_t = Option<
    unsafe extern "C" fn(
        btl: *mut xrcbtl_t,
        src: u32,
        tag: u8,
        data: *const c_void,
        len: usize,
        arg: *mut c_void,
    ),
>;

/// An operation's completion: `status` is `XRCBTL_OK` or why it failed;
/// `value` is what a fetching atomic found (0 otherwise). Runs like an
/// active-message callback.
pub type xrcbtl_done_cb_t = Option<
    unsafe extern "C" fn(btl: *mut xrcbtl_t, op: u64, status: c_int, value: u64, arg: *mut c_void),
>;

/// Runs when the endpoint to `rank` fails for good (`status` says why,
/// `reason` in words, valid during the call). Runs like an active-message
/// callback.
pub type xrcbtl_error_cb_t = Option<
    unsafe extern "C" fn(
        btl: *mut xrcbtl_t,
        rank: u32,
        status: c_int,
        reason: *const c_char,
        arg: *mut c_void,
    ),
>;

/// Finds a rank that asks for a connection before this rank added it (an
/// MPI library adds peers lazily): writes the address `rank` published
/// (`xrcbtl_address`) into `buf`, which has `cap` bytes
/// (`XRCBTL_ADDRESS_MAX`), and returns its length, or 0 to refuse the
/// connection. Runs inside `xrcbtl_progress` with the rank's lock held: it
/// must not call into xrcbtl.
pub type xrcbtl_resolve_cb_t = Option<
    unsafe extern "C" fn(
        btl: *mut xrcbtl_t,
        rank: u32,
        buf: *mut c_void,
        cap: usize,
        arg: *mut c_void,
    ) -> usize,
>;

/// The rank uses XRC: one INI QP per remote node, one SRQ per receive
/// class.
pub const XRCBTL_MODE_XRC: u32 = 0;
/// The rank uses RC QPs on its SRQs (the device has no XRC).
pub const XRCBTL_MODE_RC: u32 = 1;

/// `xrcbtl_info_t.flags`: the device has 64-bit atomics.
pub const XRCBTL_INFO_ATOMICS: u32 = 1 << 0;
/// `xrcbtl_info_t.flags`: a simulated rank.
pub const XRCBTL_INFO_SIMULATED: u32 = 1 << 1;
/// `xrcbtl_info_t.flags`: the device has no RNR (iWARP): credit flow
/// control.
pub const XRCBTL_INFO_CREDITS: u32 = 1 << 2;
/// `xrcbtl_info_t.flags`: the rank's rendezvous writes into the receiver's
/// memory (put) rather than reading from the sender's (get), as it does on
/// iWARP unless `XRCBTL_RNDV_PROTOCOL` says otherwise: there a read
/// response waits for the responder's kernel thread (soft-iWARP) and the
/// sink of a read must be open to remote writes. A caller with a
/// rendezvous of its own (Open MPI's ob1) should prefer put too.
pub const XRCBTL_INFO_PREFERS_PUT: u32 = 1 << 3;

/// What a rank is and can do (`xrcbtl_query`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xrcbtl_info_t {
    /// This rank.
    pub rank: u32,
    /// `XRCBTL_MODE_*`.
    pub mode: u32,
    /// `XRCBTL_INFO_*`.
    pub flags: u32,
    /// The most bytes (header and payload) `xrcbtl_send` takes.
    pub max_send_size: u64,
    /// The longest put or get.
    pub max_rma: u64,
    /// Largest inline message.
    pub max_inline: u32,
    /// The device's name, NUL-terminated.
    pub device: [c_char; 64],
    /// The largest region `xrcbtl_register` takes (the device's
    /// `max_mr_size`, lower than it reports on rxe: see the README).
    pub max_registration: u64,
}

/// What a rank counted (`xrcbtl_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xrcbtl_stats_t {
    /// Eager messages sent.
    pub eager_sent: u64,
    /// Of which inline.
    pub inline_sent: u64,
    /// Eager messages delivered.
    pub eager_received: u64,
    /// Payload bytes delivered to callbacks.
    pub bytes_received: u64,
    /// RDMA reads and writes posted.
    pub rdma: u64,
    /// Atomics posted.
    pub atomics: u64,
    /// Work requests posted again after their connection failed.
    pub retransmits: u64,
    /// Times a post found no send-queue slot or buffer.
    pub no_resource: u64,
    /// Messages whose tag had no callback.
    pub unhandled: u64,
    /// Messages to peers that failed for good.
    pub lost: u64,
    /// Sending QPs made (XRC INI or RC).
    pub qps_created: u64,
    /// Sending QPs alive now.
    pub live_qps: u64,
    /// Registrations the cache served from a region it held.
    pub reg_hits: u64,
    /// Registrations that took a new device registration.
    pub reg_misses: u64,
}

/// One setting (`xrcbtl_settings`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xrcbtl_setting_t {
    /// The variable (`XRCBTL_...`).
    pub name: *const c_char,
    /// Its default.
    pub default_value: *const c_char,
    /// What it does.
    pub help: *const c_char,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_address_bound_is_the_encoding_bound() {
        assert_eq!(super::XRCBTL_ADDRESS_MAX, xrcbtl_btl::addr::MAX_LEN);
    }

    #[test]
    fn the_remote_handle_size_is_the_packed_size() {
        assert_eq!(
            super::XRCBTL_REMOTE_MEM_SIZE,
            xrcbtl_btl::RemoteMem::PACKED_LEN
        );
    }
}
