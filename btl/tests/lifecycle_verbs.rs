//! Connections on a real device (`XRCBTL_TEST_DEVICE`, set by
//! scripts/softrdma-vm): ranks (BTLs of this process) connect on demand
//! and exchange messages, one leaves cleanly and one vanishes abruptly, and
//! the rest carry on. On rxe this is the RC + SRQ path (the caps say no
//! XRC), on siw the same with iWARP's initiator-speaks-first rule. Ignored
//! unless asked for (`--ignored`, as scripts/guest-tests does); asked for
//! without a device, it fails.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xrcbtl_btl::{Btl, BtlConfig, Mode, Notice, Peer};
use xrcbtl_fabric::verbs::{VerbsContext, VerbsFabric};
use xrcbtl_fabric::{Fabric, Transport};

type Streams = Arc<Mutex<BTreeMap<(u32, u32), Vec<u32>>>>;

struct Ranks {
    btl: BTreeMap<u32, Btl<VerbsContext>>,
    got: Streams,
    sent: BTreeMap<(u32, u32), u32>,
}

fn setup(n: u32) -> Ranks {
    let device = std::env::var("XRCBTL_TEST_DEVICE")
        .expect("XRCBTL_TEST_DEVICE names the device these tests were promised");
    let ip: IpAddr = std::env::var("XRCBTL_NODE_ADDRS")
        .ok()
        .and_then(|a| a.split_whitespace().next().and_then(|s| s.parse().ok()))
        .unwrap_or(IpAddr::from([10, 0, 2, 15]));
    let key = xrcbtl_fabric::verbs::job_xrcd_key(
        &format!("lifecycle-{}", std::process::id()),
        &device,
        None,
    )
    .unwrap();
    let got: Streams = Arc::default();
    let mut btl = BTreeMap::new();
    for r in 0..n {
        let ctx = VerbsFabric::new()
            .unwrap()
            .open(&device)
            .unwrap_or_else(|e| panic!("XRCBTL_TEST_DEVICE={device}: {e}"));
        let cfg = BtlConfig::new(r, 0, 77, key.clone(), SocketAddr::new(ip, 0));
        let b = Btl::new(ctx, cfg).unwrap();
        let g = got.clone();
        b.register_am(1, move |btl, m| {
            let i = u32::from_le_bytes(m.data.try_into().unwrap());
            g.lock()
                .unwrap()
                .entry((m.src, btl.rank()))
                .or_default()
                .push(i);
        });
        btl.insert(r, b);
    }
    let peers: Vec<Peer> = btl
        .values()
        .map(|b| Peer {
            rank: b.rank(),
            node: 0,
            addr: b.listen_addr().unwrap(),
            ib: b.listen_ib_addr(),
            receive: Some(b.receive()),
        })
        .collect();
    for b in btl.values() {
        b.add_procs(&peers).unwrap();
    }
    Ranks {
        btl,
        got,
        sent: BTreeMap::new(),
    }
}

impl Ranks {
    fn step(&self) {
        for b in self.btl.values() {
            b.progress();
        }
    }

    #[track_caller]
    fn until(&self, what: &str, mut done: impl FnMut(&Ranks) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out: {what}");
            self.step();
        }
    }

    /// Every pair sends `count` messages; all arrive once, in order.
    fn exchange(&mut self, count: u32) {
        let ranks: Vec<u32> = self.btl.keys().copied().collect();
        for &a in &ranks {
            for &b in &ranks {
                if a != b {
                    let next = self.sent.entry((a, b)).or_insert(0);
                    for _ in 0..count {
                        self.btl[&a].send(b, 1, &next.to_le_bytes(), &[]).unwrap();
                        *next += 1;
                    }
                }
            }
        }
        let want = self.sent.clone();
        self.until("receiving", |s| {
            let got = s.got.lock().unwrap();
            want.iter().all(|(k, n)| {
                !ranks.contains(&k.0)
                    || !ranks.contains(&k.1)
                    || got.get(k).map_or(0, |v| v.len()) as u32 >= *n
            })
        });
        for (k, v) in self.got.lock().unwrap().iter() {
            assert_eq!(
                *v,
                (0..v.len() as u32).collect::<Vec<_>>(),
                "{k:?}: out of order or duplicated"
            );
        }
    }
}

#[test]
#[ignore = "needs a device: XRCBTL_TEST_DEVICE (scripts/guest-tests runs these)"]
fn ranks_connect_exchange_and_survive_departures() {
    let mut s = setup(4);
    let mode = s.btl[&0].mode();
    let transport = s.btl[&0].caps().transport;
    // The mode comes from the caps: no XRC on rxe or siw.
    match transport {
        Transport::Iwarp => assert_eq!(mode, Mode::Rc { p2p: true }),
        _ => assert!(matches!(mode, Mode::Rc { p2p: false } | Mode::Xrc)),
    }
    s.exchange(20);
    // Rank 3 leaves cleanly.
    s.btl[&3].shutdown();
    s.until("rank 3 drained", |s| s.btl[&3].is_drained());
    s.btl.remove(&3);
    // Rank 2 vanishes without a word (its CM ids and QPs just go).
    s.btl.remove(&2);
    s.until("peers hear of the departures", |s| {
        [0u32, 1]
            .iter()
            .all(|r| !s.btl[r].is_connected(2) && !s.btl[r].is_connected(3))
    });
    s.exchange(20);
    // A lost connection is rebuilt at once (so that a rank that only
    // waits hears of a crash): the attempt towards rank 2 fails, and its
    // QP goes with it.
    s.until("only the QPs to the survivor stay", |s| {
        [0u32, 1]
            .iter()
            .all(|r| s.btl[r].with_manager(|m| m.live_qps()) == 1)
    });
    let notices: Vec<Notice> = s.btl.values().flat_map(|b| b.take_notices()).collect();
    assert!(notices.iter().any(|n| matches!(
        n,
        Notice::Lost { rank: 2 } | Notice::Closed { rank: 2 } | Notice::Failed { rank: 2, .. }
    )));
}
