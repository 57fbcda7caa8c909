//! The C ABI of xrcbtl: `libxrcbtl.so` / `libxrcbtl.a` and the header
//! `include/xrcbtl.h` generated from this crate (cbindgen, checked in; CI
//! fails when it drifts). This crate holds the workspace's only exported
//! `extern "C"` functions; MPI libraries (the Open MPI component under
//! `ffi/ompi/`, MVAPICH, others) and C programs call xrcbtl through it.
//!
//! | file | what |
//! |---|---|
//! | `status.rs` | status codes, `xrcbtl_strerror`, `xrcbtl_last_error`, the panic guard |
//! | `types.rs` | the C-visible structs, callbacks and constants |
//! | `handle.rs` | the rank handle: a `Btl` on the simulated or the verbs provider |
//! | `addr.rs` | the address a rank publishes and its peers decode |
//! | `create.rs` | `xrcbtl_create` on a verbs device; settings |
//! | `api.rs` | everything on a rank: peers, messages, memory, one-sided, atomics, progress |
//! | `sim.rs` | simulated jobs, so that C code runs with no device |
//!
//! Rules every entry point keeps:
//! - it catches panics (`XRCBTL_ERR_PANIC`) and never unwinds into C;
//! - it returns a status (`XRCBTL_OK` or a negative `XRCBTL_ERR_*`, whose
//!   message `xrcbtl_last_error` gives on the same thread), a count, or a
//!   documented sentinel;
//! - objects are opaque handles, checked on every call (a destroyed one is
//!   refused while its memory is still the library's to read);
//! - any thread may call, several at once, also from inside callbacks;
//!   callbacks run on a thread that calls progress, with no lock held.
//!
//! What the caller provides: the exchange of addresses between ranks
//! (`xrcbtl_address` out, `xrcbtl_add_peer` in, through PMIx, a file or
//! a socket) and calls to `xrcbtl_progress` (nothing moves without them).

mod api;
mod create;
mod handle;
mod sim;
mod status;
mod types;

pub use api::*;
pub use create::{xrcbtl_create, xrcbtl_settings};
pub use handle::xrcbtl_t;
pub use sim::*;
pub use status::{
    xrcbtl_last_error, xrcbtl_strerror, XRCBTL_ERR_AGAIN, XRCBTL_ERR_CLOSED, XRCBTL_ERR_DEVICE,
    XRCBTL_ERR_INVALID, XRCBTL_ERR_NOT_FOUND, XRCBTL_ERR_PANIC, XRCBTL_ERR_STATE,
    XRCBTL_ERR_TIMEOUT, XRCBTL_ERR_TRANSFER, XRCBTL_ERR_UNREACHABLE, XRCBTL_ERR_UNSUPPORTED,
    XRCBTL_OK,
};
pub use types::*;

/// Decodes `bytes` as a peer's published address and, when they are one,
/// checks that the address encodes back to the very same bytes: for the
/// fuzz targets (`fuzz/`), which reach the decoder of what peers publish
/// only through this. `Err` says what broke; a refused input is `Ok`.
#[doc(hidden)]
pub fn check_address_roundtrip(bytes: &[u8]) -> Result<(), String> {
    let Ok(a) = xrcbtl_btl::addr::Address::decode(bytes) else {
        return Ok(());
    };
    match a.encode() {
        Some(b) if b == bytes => Ok(()),
        other => Err(format!(
            "{bytes:?} decodes to {a:?}, which encodes to {other:?}"
        )),
    }
}
