//! A BTL under its own progress thread: messages arrive both ways while
//! the application thread only sends, and the thread blocks on the
//! completion channel once idle.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xrcbtl_btl::{Btl, BtlConfig, Clock, Peer, ThreadConfig, Threaded};
use xrcbtl_fabric::sim::{SimConfig, SimDevice, SimFabric};
use xrcbtl_fabric::{Fabric, XrcdKey};

type Inbox = Arc<Mutex<Vec<Vec<u8>>>>;

#[test]
fn a_threaded_btl_delivers_both_ways_and_blocks_when_idle() {
    let dev = SimDevice::ib("sim0");
    let sim = SimFabric::new(SimConfig::new(7, 2).with_devices(vec![dev.clone()])).unwrap();
    let mut btls = Vec::new();
    let mut inboxes: Vec<Inbox> = Vec::new();
    let mut procs = Vec::new();
    for rank in 0..2u32 {
        let proc = sim.spawn(rank as usize).unwrap();
        let ctx = proc.open(&dev.name).unwrap();
        let listen = SocketAddr::new(ctx.ip(), 0);
        let mut cfg = BtlConfig::new(rank, rank, 1, XrcdKey::new("threaded"), listen);
        let s = sim.clone();
        cfg.clock = Clock::from_fn(move || s.now());
        let mut b = Btl::new(ctx, cfg).unwrap();
        let inbox: Inbox = Arc::default();
        let i = inbox.clone();
        b.register_am(5, move |m| i.lock().unwrap().push(m.data.to_vec()));
        btls.push(b);
        inboxes.push(inbox);
        procs.push(proc);
    }
    let peers: Vec<Peer> = btls
        .iter()
        .map(|b| Peer {
            rank: b.rank(),
            node: b.rank(),
            addr: b.listen_addr().unwrap(),
        })
        .collect();
    for b in &mut btls {
        b.add_procs(&peers);
    }
    let mut one = btls.pop().unwrap();
    let cfg = ThreadConfig {
        spins: 32,
        block: Duration::from_millis(1),
    };
    let zero = Threaded::spawn(btls.pop().unwrap(), "xrcbtl-progress-0", cfg).unwrap();
    let until = |one: &mut Btl<_>, what: &str, done: &dyn Fn() -> bool| {
        let end = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < end, "timed out: {what}");
            one.progress();
        }
    };
    const N: u32 = 200;
    for i in 0..N {
        one.send(0, 5, &i.to_le_bytes()).unwrap();
    }
    until(&mut one, "rank 0 receives", &|| {
        inboxes[0].lock().unwrap().len() == N as usize
    });
    // Rank 0's application thread only sends; its thread does the rest.
    for i in 0..N {
        zero.lock().send(1, 5, &(i + 1000).to_le_bytes()).unwrap();
    }
    until(&mut one, "rank 1 receives", &|| {
        inboxes[1].lock().unwrap().len() == N as usize
    });
    let order = |inbox: &Inbox, base: u32| {
        let got: Vec<u32> = inbox
            .lock()
            .unwrap()
            .iter()
            .map(|d| u32::from_le_bytes(d[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got, (base..base + N).collect::<Vec<_>>());
    };
    order(&inboxes[0], 0);
    order(&inboxes[1], 1000);
    // Idle now: the thread spins a little, then blocks.
    let end = Instant::now() + Duration::from_secs(10);
    while zero.blocks() == 0 {
        assert!(Instant::now() < end, "the idle thread never blocked");
        std::thread::sleep(Duration::from_millis(5));
    }
    let calls = zero.calls();
    std::thread::sleep(Duration::from_millis(50));
    let mut zero = zero.stop();
    assert!(zero.is_idle());
    eprintln!("progress thread: {calls} calls before stopping");
    zero.shutdown();
    one.shutdown();
    let end = Instant::now() + Duration::from_secs(60);
    while !(zero.is_drained() && one.is_drained()) {
        assert!(Instant::now() < end, "no clean exit");
        zero.progress();
        one.progress();
    }
}
