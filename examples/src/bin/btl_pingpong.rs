//! The smallest complete BTL program: two ranks on two simulated
//! InfiniBand nodes (XRC) exchange active messages, a rendezvous, a put
//! into registered user memory and an atomic, with completion callbacks,
//! and checks what arrived.
//!
//! ```sh
//! cargo run -p xrcbtl-examples --bin btl_pingpong
//! ```

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{Access, Bytes, MappedBuf, RemoteMem};
use xrcbtl_fabric::sim::SimDevice;

const PING: u8 = 1;
const PONG: u8 = 2;
const LIMIT: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Rank 0 on node 0, rank 1 on node 1; every peer known to every rank.
    let mut job = SimJob::new(1, 2, 1, SimDevice::ib("sim0"))?;
    let (zero, one) = (job.peek(0).clone(), job.peek(1).clone());
    println!("rank 0 talks to rank 1 over {:?}", zero.mode());

    // Rank 1 answers every ping from inside its callback.
    one.register_am(PING, |btl, m| {
        btl.send(m.src, PONG, b"pong: ", &m.data[..m.data.len().min(16)])
            .expect("a reply");
    });
    let pongs = Arc::new(AtomicU64::new(0));
    let p = pongs.clone();
    zero.register_am(PONG, move |_, m| {
        println!("rank 0 got {:?}", String::from_utf8_lossy(m.data));
        let n = p.fetch_add(1, Ordering::Relaxed);
        let want: &[u8] = if n == 0 { b"ping eager" } else { &[7; 16] };
        assert_eq!(&m.data[..6], b"pong: ");
        assert_eq!(&m.data[6..], want, "pong {n}");
    });

    // An eager message: a header and a payload, gathered.
    zero.send(1, PING, b"ping ", b"eager")?;
    // A 1 MiB message by rendezvous, straight from the buffer.
    let big = Bytes::from(vec![7u8; 1 << 20]);
    zero.send_bytes(1, PING, big, None)?;
    job.run_until(LIMIT, |_| pongs.load(Ordering::Relaxed) == 2)?;

    // One-sided: rank 1 exposes memory, rank 0 puts user memory into it
    // and adds to a counter there.
    let exposed = one.alloc_mem(4096)?;
    let remote = RemoteMem::unpack(&exposed.remote().pack()).expect("a handle");
    let mine = MappedBuf::new(4096)?;
    mine.write(0, b"written by a put");
    let reg = zero.register_mem(mine.user_mem(), Access::REMOTE_READ)?;
    let done = Arc::new(Mutex::new(Vec::new()));
    let d = done.clone();
    zero.put(
        1,
        reg.at(0),
        remote.at(100),
        16,
        Some(Box::new(move |_, op, r| d.lock().unwrap().push((op, r)))),
    )?;
    let d = done.clone();
    zero.fetch_add(
        1,
        remote.at(8),
        42,
        Some(Box::new(move |_, op, r| d.lock().unwrap().push((op, r)))),
    )?;
    job.run_until(LIMIT, |_| done.lock().unwrap().len() == 2)?;
    println!(
        "rank 1's memory now holds {:?} and a counter of {}",
        String::from_utf8_lossy(&exposed.read(100, 16)),
        exposed.read_u64(8)
    );
    for (op, result) in done.lock().unwrap().iter() {
        assert!(result.is_ok(), "operation {op:?}: {result:?}");
    }
    assert_eq!(exposed.read(100, 16), b"written by a put");
    assert_eq!(exposed.read_u64(8), 42);
    zero.deregister_mem(reg)?;
    job.shutdown(LIMIT)?;
    println!("PASS btl_pingpong");
    Ok(())
}
