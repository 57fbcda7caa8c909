//! One row of the scale table: a simulated job of `--nodes` × `--per-node`
//! ranks whose node 0 is whole, running `--pattern` under `--mode`, printed
//! as a tab-separated line (`--header` prints the column names first).
//! After start-up the observed process sends one 8-byte message to every
//! peer, and the `sent_` columns say what its state kept from that (empty
//! with `--no-send`). With `--exit` it then leaves cleanly, and the `exit_`
//! columns say what that cost it (empty without).
//! `scripts/scale` runs every row and writes docs/scale.md.

use std::process::ExitCode;
use std::time::Duration;

use xrcbtl_benches::scale::{self, Pattern, Row, Spec};
use xrcbtl_fabric::sim::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const USAGE: &str = "usage: scale --nodes N [--per-node 128] [--mode xrc|rc] \
[--pattern all-to-all|sparse] [--active K] [--seed S] [--max-qp Q] \
[--cm-timeout-ms 4096] [--connect-window 64] [--no-send] [--exit] [--header]
       scale --columns (the column names only)";

/// The column names, in the order [`line()`] prints them.
const COLUMNS: &[&str] = &[
    "pattern",
    "mode",
    "nodes",
    "per_node",
    "active",
    "endpoints",
    "qps_end",
    "qps_peak",
    "tgt_qps_node",
    "tgt_handles",
    "srq_bytes",
    "state_bytes",
    "cm_sent",
    "cm_received",
    "arp_node",
    "path_node",
    "cm_total",
    "cm_resends",
    "cm_req_resends",
    "startup_ms",
    "responders",
    "wall_s",
    "sent_messages",
    "sent_bytes",
    "sent_cq_full",
    "sent_locks",
    "sent_ms",
    "sent_wall_s",
    "exit_ms",
    "exit_wall_s",
    "exit_cm_sent",
    "exit_cm_received",
    "exit_qps_left",
    "exit_leaves",
    "exit_leaves_abandoned",
];

fn line(r: &Row) -> String {
    let s = &r.spec;
    [
        s.pattern.name().to_string(),
        if s.xrc { "xrc" } else { "rc" }.into(),
        s.nodes.to_string(),
        s.per_node.to_string(),
        s.active.to_string(),
        r.endpoints.to_string(),
        r.qps_end.to_string(),
        r.qps_peak.to_string(),
        r.tgt_qps.to_string(),
        r.tgt_handles.to_string(),
        r.srq_bytes.to_string(),
        r.state_bytes.to_string(),
        r.cm_sent.to_string(),
        r.cm_received.to_string(),
        r.arp.to_string(),
        r.path.to_string(),
        r.cm_total.to_string(),
        r.sim.cm_retries.to_string(),
        r.sim.cm_req_retries.to_string(),
        format!("{:.3}", r.startup.as_secs_f64() * 1e3),
        r.responders.to_string(),
        format!("{:.1}", r.wall.as_secs_f64()),
    ]
    .into_iter()
    .chain(match &r.sent {
        Some(x) => [
            x.messages.to_string(),
            x.bytes.to_string(),
            x.cq_full.to_string(),
            x.locks.to_string(),
            format!("{:.3}", x.time.as_secs_f64() * 1e3),
            format!("{:.1}", x.wall.as_secs_f64()),
        ],
        None => Default::default(),
    })
    .chain(match &r.exit {
        Some(e) => [
            format!("{:.3}", e.time.as_secs_f64() * 1e3),
            format!("{:.1}", e.wall.as_secs_f64()),
            e.cm_sent.to_string(),
            e.cm_received.to_string(),
            e.qps_left.to_string(),
            e.leaves.to_string(),
            e.leaves_abandoned.to_string(),
        ],
        None => Default::default(),
    })
    .collect::<Vec<_>>()
    .join("\t")
}

fn parse(args: &[String]) -> Result<(Spec, bool), String> {
    let mut spec = Spec::new(0, true, Pattern::AllToAll);
    spec.active = 0;
    let mut header = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        let num = |v: &String| {
            v.parse::<u64>()
                .map_err(|_| format!("{a}: not a number: {v}"))
        };
        match a.as_str() {
            "--nodes" => spec.nodes = num(val()?)? as usize,
            "--per-node" => spec.per_node = num(val()?)? as usize,
            "--active" => spec.active = num(val()?)? as usize,
            "--seed" => spec.seed = num(val()?)?,
            "--max-qp" => spec.max_qp = u32::try_from(num(val()?)?).map_err(|e| e.to_string())?,
            "--cm-timeout-ms" => spec.cm_timeout = Duration::from_millis(num(val()?)?),
            "--connect-window" => spec.connect_window = num(val()?)? as usize,
            "--mode" => {
                spec.xrc = match val()?.as_str() {
                    "xrc" => true,
                    "rc" => false,
                    m => return Err(format!("--mode: xrc or rc, not {m}")),
                }
            }
            "--pattern" => {
                spec.pattern = match val()?.as_str() {
                    "all-to-all" => Pattern::AllToAll,
                    "sparse" => Pattern::Sparse,
                    p => return Err(format!("--pattern: all-to-all or sparse, not {p}")),
                }
            }
            "--exit" => spec.exit = true,
            "--no-send" => spec.send = false,
            "--header" => header = true,
            "--columns" => {
                println!("{}", COLUMNS.join("\t"));
                std::process::exit(0);
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if spec.nodes == 0 || spec.per_node == 0 {
        return Err(USAGE.into());
    }
    if spec.active == 0 {
        spec.active = spec.pattern.default_active(spec.per_node);
    }
    Ok((spec, header))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (spec, header) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if header {
        println!("{}", COLUMNS.join("\t"));
    }
    match scale::run(&spec) {
        Ok(row) => {
            println!("{}", line(&row));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scale: {e}");
            ExitCode::FAILURE
        }
    }
}
