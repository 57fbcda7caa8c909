//! A Rust MPI program (the `mpi` crate, rsmpi) that runs over Open MPI with
//! the `xrc` BTL: ranks pair up, exchange messages of every power of two
//! up to 4 MiB with every byte checked, reduce across all ranks, and rank 0
//! prints the round-trip time of small messages.
//!
//! ```sh
//! scripts/build-ompi-btl        # installs mca_btl_xrc.so in ~/.openmpi/components
//! cargo build --release -p xrcbtl-examples --features mpi --bin mpi_pingpong
//! mpirun -np 2 --mca pml ob1 --mca btl self,xrc target/release/mpi_pingpong
//! ```
//!
//! Nothing here names xrcbtl: which BTL carries the traffic is Open MPI's
//! choice (`--mca btl_xrc_verbose 1` prints what xrc carried).

#![forbid(unsafe_code)]

use mpi::collective::SystemOperation;
use mpi::traits::*;

/// The byte `i` of a message of `len` bytes from rank `src`.
fn byte(src: i32, len: usize, i: usize) -> u8 {
    (src as usize * 131 + len * 7 + i * 13 + 1) as u8
}

fn message(src: i32, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte(src, len, i)).collect()
}

fn main() {
    let universe = mpi::initialize().expect("MPI is initialised once");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    assert!(
        size % 2 == 0,
        "mpi_pingpong pairs ranks up: run an even number"
    );
    let peer = world.process_at_rank(rank ^ 1);

    // Every power of two from 0 to 4 MiB, both ways: eager, then
    // rendezvous through the BTL's put or get.
    for len in std::iter::once(0).chain((0..=22).map(|s| 1usize << s)) {
        let mine = message(rank, len);
        let theirs = if rank % 2 == 0 {
            peer.send(&mine[..]);
            peer.receive_vec::<u8>().0
        } else {
            let got = peer.receive_vec::<u8>().0;
            peer.send(&mine[..]);
            got
        };
        assert_eq!(
            theirs.len(),
            len,
            "rank {rank}: length of the {len}-byte message"
        );
        if let Some(i) = (0..len).find(|&i| theirs[i] != byte(rank ^ 1, len, i)) {
            panic!("rank {rank}: byte {i} of the {len}-byte message is wrong");
        }
    }

    // A reduction over every rank.
    let mut sum = 0u64;
    world.all_reduce_into(&(rank as u64), &mut sum, SystemOperation::sum());
    let n = size as u64;
    assert_eq!(sum, n * (n - 1) / 2, "rank {rank}: allreduce");

    // Round trips of 8 bytes between ranks 0 and 1.
    let iters = 200;
    let buf = [0u8; 8];
    world.barrier();
    let t0 = mpi::time();
    for _ in 0..iters {
        if rank == 0 {
            peer.send(&buf[..]);
            let _ = peer.receive_vec::<u8>();
        } else if rank == 1 {
            let _ = peer.receive_vec::<u8>();
            peer.send(&buf[..]);
        }
    }
    let half_rtt_us = (mpi::time() - t0) / f64::from(iters) / 2.0 * 1e6;
    world.barrier();
    if rank == 0 {
        println!("mpi_pingpong: {size} ranks, 8-byte latency {half_rtt_us:.2} us");
        println!("PASS mpi_pingpong");
    }
}
