//! libfabric's structs, ops tables and constants, generated at build time
//! from Debian 12's libfabric-dev 1.17 headers (ofi/build.rs).
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    rustdoc::all
)]

include!(concat!(env!("OUT_DIR"), "/fi_bindings.rs"));
