//! The connection driver on a real device (`XRCBTL_TEST_DEVICE`, set by
//! scripts/softrdma-vm): ranks connect on demand, exchange messages, one
//! leaves cleanly and one vanishes abruptly, and the rest carry on. On rxe
//! this is the RC + SRQ path (the caps say no XRC), on siw the same with
//! iWARP's initiator-speaks-first rule. Without the variable no device is
//! promised and the tests say so and do nothing; with it, a missing device
//! fails them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use xrcbtl_btl::conn::{ConnDriver, DriverConfig};
use xrcbtl_fabric::verbs::{VerbsContext, VerbsFabric};
use xrcbtl_fabric::{Fabric, Transport};
use xrcbtl_xrc_conn::{Mode, Notice};

struct Ranks {
    drv: BTreeMap<u32, ConnDriver<VerbsContext>>,
    start: Instant,
    got: BTreeMap<(u32, u32), Vec<u32>>,
}

fn setup(n: u32) -> Option<Ranks> {
    let Ok(device) = std::env::var("XRCBTL_TEST_DEVICE") else {
        eprintln!("XRCBTL_TEST_DEVICE is not set: no device promised, nothing to run");
        return None;
    };
    let ip: IpAddr = std::env::var("XRCBTL_NODE_ADDRS")
        .ok()
        .and_then(|a| a.split_whitespace().next().and_then(|s| s.parse().ok()))
        .unwrap_or(IpAddr::from([10, 0, 2, 15]));
    let key =
        xrcbtl_fabric::verbs::job_xrcd_key(&format!("lifecycle-{}", std::process::id()), &device)
            .unwrap();
    let mut drv = BTreeMap::new();
    for r in 0..n {
        let ctx = VerbsFabric::new()
            .unwrap()
            .open(&device)
            .unwrap_or_else(|e| panic!("XRCBTL_TEST_DEVICE={device}: {e}"));
        let cfg = DriverConfig::new(r, 0, 77, key.clone(), SocketAddr::new(ip, 0));
        drv.insert(r, ConnDriver::new(ctx, cfg).unwrap());
    }
    let dir: Vec<(u32, SocketAddr)> = drv
        .iter()
        .map(|(r, d)| (*r, d.listen_addr().unwrap()))
        .collect();
    for d in drv.values_mut() {
        for (r, a) in &dir {
            d.add_peer(*r, 0, *a);
        }
    }
    Some(Ranks {
        drv,
        start: Instant::now(),
        got: BTreeMap::new(),
    })
}

impl Ranks {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn step(&mut self) {
        let now = self.now();
        for (r, d) in self.drv.iter_mut() {
            d.progress(now);
            while let Some(m) = d.recv() {
                self.got.entry((m.src, *r)).or_default().push(m.seq);
            }
        }
    }

    fn until(&mut self, what: &str, mut done: impl FnMut(&Ranks) -> bool) {
        let deadline = self.now() + Duration::from_secs(30);
        while !done(self) {
            assert!(self.now() < deadline, "timed out: {what}");
            self.step();
        }
    }

    /// Every pair sends `count` messages; all arrive once, in order.
    fn exchange(&mut self, count: u32) {
        let ranks: Vec<u32> = self.drv.keys().copied().collect();
        let base: BTreeMap<(u32, u32), usize> = ranks
            .iter()
            .flat_map(|&a| ranks.iter().map(move |&b| (a, b)))
            .map(|k| (k, self.got.get(&k).map_or(0, |v| v.len())))
            .collect();
        let mut next: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        let deadline = self.now() + Duration::from_secs(30);
        loop {
            let now = self.now();
            let mut pending = false;
            for &a in &ranks {
                for &b in &ranks {
                    if a == b {
                        continue;
                    }
                    let i = next.entry((a, b)).or_insert(0);
                    if *i >= count {
                        continue;
                    }
                    pending = true;
                    let d = self.drv.get_mut(&a).unwrap();
                    if !d.is_ready(b) {
                        d.connect(now, b);
                    } else if d.send(b, &i.to_le_bytes()).unwrap() {
                        *i += 1;
                    }
                }
            }
            if !pending {
                break;
            }
            assert!(self.now() < deadline, "timed out sending");
            self.step();
        }
        self.until("receiving", |s| {
            ranks.iter().all(|&a| {
                ranks.iter().all(|&b| {
                    a == b
                        || s.got.get(&(a, b)).map_or(0, |v| v.len())
                            >= base[&(a, b)] + count as usize
                })
            })
        });
        for (k, v) in &self.got {
            assert!(v.windows(2).all(|w| w[1] == w[0] + 1), "{k:?}: {v:?}");
        }
    }
}

#[test]
fn ranks_connect_exchange_and_survive_departures() {
    let Some(mut s) = setup(4) else { return };
    let caps = s.drv[&0].mode();
    let transport = VerbsFabric::new()
        .unwrap()
        .devices()
        .unwrap()
        .into_iter()
        .find(|d| Some(&d.name) == std::env::var("XRCBTL_TEST_DEVICE").ok().as_ref())
        .unwrap()
        .caps
        .transport;
    // The mode comes from the caps: no XRC on rxe or siw.
    match transport {
        Transport::Iwarp => assert_eq!(caps, Mode::Rc { p2p: true }),
        _ => assert!(matches!(caps, Mode::Rc { p2p: false } | Mode::Xrc)),
    }
    s.exchange(20);
    // Rank 3 leaves cleanly.
    let now = s.now();
    s.drv.get_mut(&3).unwrap().shutdown(now);
    s.until("rank 3 drained", |s| s.drv[&3].manager().is_drained());
    s.drv.remove(&3);
    // Rank 2 vanishes without a word (its CM ids and QPs just go).
    s.drv.remove(&2);
    s.until("peers hear of the departures", |s| {
        [0u32, 1]
            .iter()
            .all(|r| !s.drv[r].is_ready(2) && !s.drv[r].is_ready(3))
    });
    s.exchange(20);
    for r in [0u32, 1] {
        let m = s.drv[&r].manager();
        assert_eq!(
            m.live_qps(),
            1,
            "rank {r} keeps only its QP to the survivor"
        );
    }
    let mut notices = Vec::new();
    for d in s.drv.values_mut() {
        while let Some(n) = d.poll_notice() {
            notices.push(n);
        }
    }
    assert!(notices
        .iter()
        .any(|n| matches!(n, Notice::Lost { rank: 2 } | Notice::Closed { rank: 2 })));
}
