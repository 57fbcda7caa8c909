//! Programs that use xrcbtl, each runnable and checked in CI:
//!
//! - `btl_pingpong` (`src/bin/btl_pingpong.rs`): a Rust program on the BTL
//!   itself, on the simulated fabric: active messages, a rendezvous, a put
//!   into registered user memory and an atomic, with completion callbacks.
//! - `mpi_pingpong` (`src/bin/mpi_pingpong.rs`, feature `mpi`): a Rust MPI
//!   program (the `mpi` crate) that runs over Open MPI with the `xrc` BTL.
//! - `c/hello.c`: a C program on the header and the installed library,
//!   ranks of a simulated job in one process.
//!
//! `scripts/run-examples` builds and runs the first and the third;
//! `scripts/guest-ompi` runs the second on rxe and siw.

#![forbid(unsafe_code)]
