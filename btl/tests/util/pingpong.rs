//! Two ranks on two nodes of the simulated fabric, polled in turn by one
//! thread, each counting the messages of one tag that reach it: what the
//! steady-state tests ping-pong over.

// Each test binary that includes this uses a part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::Btl;
use xrcbtl_fabric::sim::{SimContext, SimDevice};

/// The job, its two ranks, and what each has received.
pub struct PingPong {
    pub job: SimJob,
    pub btls: [Arc<Btl<SimContext>>; 2],
    got: [Arc<AtomicU64>; 2],
}

/// How the answer goes back.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Back {
    /// By `send`, as the message went.
    Send,
    /// By `sendi`, or `send` when it cannot go at once.
    Sendi,
}

impl PingPong {
    /// Ranks 0 and 1 over `device`, each counting messages of `tag`.
    pub fn new(device: SimDevice, tag: u8) -> PingPong {
        let job = SimJob::new(1, 2, 1, device).unwrap();
        // Two ranks polled in turn: the clock moves on empty polls.
        job.sim.set_auto_advance(true);
        let btls = [job.peek(0).clone(), job.peek(1).clone()];
        let got = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
        for (btl, g) in btls.iter().zip(&got) {
            let g = g.clone();
            btl.register_am(tag, move |_, _| {
                g.fetch_add(1, Ordering::Relaxed);
            });
        }
        PingPong { job, btls, got }
    }

    /// `n` round trips of `header` then `payload` with `tag`, from rank 0
    /// and back; returns the progress calls each rank made.
    pub fn round_trips(
        &self,
        tag: u8,
        n: u64,
        header: &[u8],
        payload: &[u8],
        back: Back,
    ) -> [u64; 2] {
        let [a, b] = &self.btls;
        let mut calls = [0u64; 2];
        for _ in 0..n {
            for (from, to) in [(0usize, 1usize), (1, 0)] {
                let want = self.got[to].load(Ordering::Relaxed) + 1;
                let btl = &self.btls[from];
                let dst = to as u32;
                if from == 0 || back == Back::Send || !btl.sendi(dst, tag, header, payload).unwrap()
                {
                    btl.send(dst, tag, header, payload).unwrap();
                }
                while self.got[to].load(Ordering::Relaxed) < want {
                    a.progress();
                    b.progress();
                    calls[0] += 1;
                    calls[1] += 1;
                }
            }
        }
        calls
    }
}
