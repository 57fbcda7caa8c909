//! Raw bindings to libibverbs and librdmacm, generated at build time from
//! the system headers (see `build.rs`). Static inline functions are reached
//! through compiled C wrappers.
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

include!(concat!(env!("OUT_DIR"), "/verbs_bindings.rs"));
