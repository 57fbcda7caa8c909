//! `xrcbtl_mesh`: one rank of the fault mesh ([`xrcbtl_benches::mesh`])
//! on a verbs device, one process per rank, introduced through a shared
//! directory. Every rank sends checked payloads to every other for
//! `--seconds`, then closes with each; the ranks named with `--victim` are
//! meant to be killed from outside meanwhile, and the survivors check that
//! they heard of it and went on with everyone else. `scripts/guest-faults`
//! runs it under SIGKILL and SIGSTOP.
//!
//! ```text
//! xrcbtl_mesh --dir DIR --ranks N --rank R [--node K] [--device D] [--bind IP]
//!             [--seconds S] [--until-stopped] [--window W] [--victim R]...
//!             [--silent-after-failure]
//! ```
//!
//! `--silent-after-failure` makes a broken rank that stops sending at the
//! first failure it hears of: for showing that the survivors' check (and
//! a harness waiting on them) finds it.
//!
//! The harness steers a run through files in DIR, which every rank looks
//! for every 50 ms: with `--until-stopped`, the traffic goes on until
//! `DIR/stop` exists (`--seconds` is then the longest it waits for it, and
//! reaching that fails the run as the harness's fault), and `DIR/mark-N`
//! (N = 1, 2, ...) marks a moment: the rank prints `heard from every live
//! peer since mark N` once each live peer's payloads have come again. So
//! a harness acts on what the ranks report, never on a guess at how fast
//! they run.
//!
//! Exit status: 0 if the run checks out, 1 if it does not (the reason on
//! stderr), 2 for bad options.

#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xrcbtl_benches::mesh::{Mesh, MeshOptions};
use xrcbtl_benches::osu::pick_verbs_device;
use xrcbtl_benches::world::exchange_dir;
use xrcbtl_btl::{Btl, BtlConfig, Peer};
use xrcbtl_fabric::verbs::{job_xrcd_key, VerbsFabric};
use xrcbtl_fabric::{Error, Fabric, Result};

const USAGE: &str = "usage: xrcbtl_mesh --dir DIR --ranks N --rank R [--node K] [--device D] \
[--bind IP] [--seconds S] [--until-stopped] [--window W] [--victim R]... [--silent-after-failure]";

/// How often a rank looks for the harness's files.
const LOOK_EVERY: Duration = Duration::from_millis(50);

struct Args {
    dir: PathBuf,
    ranks: u32,
    rank: u32,
    node: u32,
    device: Option<String>,
    bind: Option<IpAddr>,
    opts: MeshOptions,
    until_stopped: bool,
    victims: Vec<u32>,
}

fn parse(mut it: impl Iterator<Item = String>) -> std::result::Result<Args, String> {
    let (mut dir, mut ranks, mut rank) = (None, None, None);
    let mut a = Args {
        dir: PathBuf::new(),
        ranks: 0,
        rank: 0,
        node: 0,
        device: None,
        bind: None,
        opts: MeshOptions::default(),
        until_stopped: false,
        victims: Vec::new(),
    };
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> std::result::Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag} {v}: not a valid value"))
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(num::<String>("--dir", it.next())?)),
            "--ranks" => ranks = Some(num::<u32>("--ranks", it.next())?),
            "--rank" => rank = Some(num::<u32>("--rank", it.next())?),
            "--node" => a.node = num("--node", it.next())?,
            "--device" => a.device = Some(num("--device", it.next())?),
            "--bind" => a.bind = Some(num("--bind", it.next())?),
            "--seconds" => {
                let s: f64 = num("--seconds", it.next())?;
                if !(0.0..=3600.0).contains(&s) {
                    return Err(format!("--seconds {s}: outside 0..=3600"));
                }
                a.opts.traffic = Duration::from_secs_f64(s);
            }
            "--window" => {
                a.opts.window = num("--window", it.next())?;
                if !(4..=4096).contains(&a.opts.window) {
                    return Err(format!("--window {}: outside 4..=4096", a.opts.window));
                }
            }
            "--until-stopped" => a.until_stopped = true,
            "--silent-after-failure" => a.opts.silent_after_failure = true,
            "--victim" => a.victims.push(num("--victim", it.next())?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    a.dir = dir.ok_or("--dir is required")?;
    a.ranks = ranks.ok_or("--ranks is required")?;
    a.rank = rank.ok_or("--rank is required")?;
    if !(2..=1024).contains(&a.ranks) || a.rank >= a.ranks {
        return Err(format!(
            "--rank {} of --ranks {}: needs 2..=1024 ranks and a rank below them",
            a.rank, a.ranks
        ));
    }
    if let Some(v) = a.victims.iter().find(|&&v| v >= a.ranks) {
        return Err(format!("--victim {v}: no such rank"));
    }
    Ok(a)
}

/// A job number from the directory's path (every rank of a run names the
/// same directory; two runs at once use two).
fn job_of(dir: &std::path::Path) -> u32 {
    xrcbtl_btl::addr::job_number(&dir.to_string_lossy())
}

fn run(a: &Args) -> Result<bool> {
    let (device, bind, chosen) = pick_verbs_device(a.device.as_deref(), a.bind)?;
    let ctx = VerbsFabric::new()?.open(&device)?;
    let job = job_of(&a.dir);
    let key = job_xrcd_key(&format!("mesh-{job:08x}"), &device, None)?;
    let cfg = BtlConfig::new(a.rank, a.node, job, key, SocketAddr::new(bind, 0)).from_env()?;
    let dead_after = cfg.dead_peer_after();
    let btl = Btl::new(ctx, cfg)?;
    let me = Peer {
        rank: a.rank,
        node: a.node,
        addr: btl
            .listen_addr()
            .ok_or_else(|| Error::state("no listener"))?,
        ib: btl.listen_ib_addr(),
        receive: Some(btl.receive()),
    };
    eprintln!(
        "mesh: rank {} of {} on node {}: pid {}, device {chosen}, {:?}, listening at {}; \
         a silent peer is found dead after {dead_after:?}",
        a.rank,
        a.ranks,
        a.node,
        std::process::id(),
        btl.mode(),
        me.addr
    );
    let peers = exchange_dir(me, &a.dir, a.ranks, Duration::from_secs(120))?;
    btl.add_procs(&peers)?;
    let btl = Arc::new(btl);
    let mut mesh =
        Mesh::new(btl.clone(), a.ranks, a.opts.clone()).report_every(Duration::from_secs(2));
    let stop_file = a.dir.join("stop");
    let mut stopped = false;
    let mut next_look = Instant::now();
    let report = loop {
        if let Some(r) = mesh.step() {
            break r;
        }
        if Instant::now() >= next_look {
            next_look = Instant::now() + LOOK_EVERY;
            if a.until_stopped && !stopped && stop_file.exists() {
                stopped = true;
                mesh.end_traffic();
            }
            let mark = a.dir.join(format!("mark-{}", mesh.marks() + 1));
            if mark.exists() {
                mesh.mark();
            }
        }
    };
    let refused = btl.with_manager(|m| m.counters().refused_sent.clone());
    // The mesh is done once it has heard every peer's last message, but its
    // own answers (the FIN to a peer's DONE) may still be queued, behind
    // credits on iWARP: the clean exit starts only once they have left,
    // or a peer would wait for its FIN in vain.
    if let Err(e) = btl.flush(Duration::from_secs(10)) {
        eprintln!("mesh: rank {}: before the clean exit: {e}", a.rank);
    }
    btl.shutdown();
    let end = Instant::now() + Duration::from_secs(10);
    while !btl.is_drained() && Instant::now() < end {
        btl.progress();
    }
    eprintln!("mesh: {}", report.summary());
    if !refused.is_empty() {
        eprintln!(
            "mesh: rank {}: connection requests refused: {refused:?}",
            a.rank
        );
    }
    if !btl.is_drained() {
        eprintln!(
            "mesh: rank {}: FAIL: the clean exit did not finish within 10 s",
            a.rank
        );
        return Ok(false);
    }
    if a.until_stopped && !stopped {
        eprintln!(
            "mesh: rank {}: FAIL: {} did not appear within {:?} of traffic: the harness, \
             not the product, was too slow",
            a.rank,
            stop_file.display(),
            a.opts.traffic
        );
        return Ok(false);
    }
    match report.check(&a.victims) {
        Ok(()) => {
            eprintln!("mesh: rank {}: ok", a.rank);
            Ok(true)
        }
        Err(why) => {
            eprintln!(
                "mesh: rank {}: connection counters: {:?}",
                a.rank,
                btl.with_manager(|m| m.counters().clone())
            );
            eprintln!("mesh: rank {}: FAIL: {why}", a.rank);
            Ok(false)
        }
    }
}

fn main() {
    let a = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("xrcbtl_mesh: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    match run(&a) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("xrcbtl_mesh: rank {}: {e}", a.rank);
            std::process::exit(1);
        }
    }
}
