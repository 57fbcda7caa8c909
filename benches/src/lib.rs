//! OSU-style benchmarks over the xrcbtl BTL.
//!
//! Every benchmark is written once, as what one rank does (an `async` body,
//! SPMD style), and runs on three kinds of world:
//!
//! - `--fabric sim` (the default): every rank in this process on the
//!   simulated fabric, driven from one thread in virtual time; the numbers
//!   are the simulated hardware's (deterministic from `--seed`), not the
//!   simulator's speed;
//! - `--fabric verbs --device NAME --bind IP`: one rank per process on a
//!   real device; one side runs with `-s`, the other with `--connect HOST`
//!   (perftest-style out-of-band exchange over TCP);
//! - under `mpirun` (feature `mpi`): one rank per process, MPI does the
//!   exchange.
//!
//! Output follows OSU Micro-Benchmarks 7.4: a header, a `# Size` column
//! line, and `%-10d%20.2f` rows.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod mesh;
pub mod osu;
pub mod scale;
pub mod world;

pub use osu::{Bench, Options};
