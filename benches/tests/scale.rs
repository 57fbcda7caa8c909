//! Start-up grows linearly (issue 14): the scale harness's job at 128 and
//! at 256 nodes of 128 ranks, all-to-all and sparse, XRC and RC + SRQ. The
//! observed process's start-up time (virtual) and CM messages may grow at
//! most as fast as the peers it talks to (the node count, all-to-all; its
//! stencil and recursive-doubling partners, sparse), with 10% to spare;
//! its connection state must stay within [`BUDGET`] bytes per peer; and
//! the structure must be XRC's: one INI QP per node, one TGT QP on the
//! node per sending process.
//!
//! Heavy: it runs in release builds (scripts/test-all runs it) and is
//! ignored in debug builds. The full table at 1,024 to 10,000 nodes is
//! `scripts/scale` (docs/scale.md).

use xrcbtl_benches::scale::{run, Pattern, Row, Spec, BUDGET};
use xrcbtl_fabric::sim::CountingAlloc;

// The harness measures the observed process's state with it.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn spec(nodes: usize, xrc: bool, pattern: Pattern) -> Spec {
    Spec {
        nodes,
        per_node: 128,
        xrc,
        pattern,
        active: match pattern {
            Pattern::AllToAll => 1,
            Pattern::Sparse => 128,
        },
        seed: 14,
        max_qp: 1 << 24,
    }
}

fn check_shape(r: &Row) {
    let s = &r.spec;
    let what = format!(
        "{} {} at {} nodes",
        s.pattern.name(),
        if s.xrc { "XRC" } else { "RC" },
        s.nodes
    );
    assert_eq!(r.sim.cm_retries, 0, "{what}: the CM resent messages");
    let per_peer = r.state_bytes as f64 / r.endpoints as f64;
    assert!(per_peer > 0.0, "{what}: no state counted");
    if s.pattern == Pattern::AllToAll {
        // With a score of peers, what a process keeps anyway (its route
        // cache, its first table entries) outweighs them: the budget is
        // for many.
        assert!(per_peer <= BUDGET, "{what}: {per_peer:.0} bytes per peer");
        assert_eq!(r.endpoints, (s.ranks() - 1) as u64, "{what}");
        if s.xrc {
            assert_eq!((r.qps_end, r.qps_peak), (s.nodes, s.nodes), "{what}");
            assert_eq!(r.tgt_qps, s.ranks(), "{what}: one TGT QP per sender");
            assert_eq!(r.tgt_handles, s.ranks() - 1, "{what}");
        } else {
            assert_eq!(r.qps_end as u64, r.endpoints, "{what}: an RC QP per peer");
            assert_eq!(r.tgt_qps, 0, "{what}");
        }
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "heavy: run with --release")]
fn startup_grows_at_most_linearly_from_128_to_256_nodes() {
    for pattern in [Pattern::AllToAll, Pattern::Sparse] {
        for xrc in [true, false] {
            let a = run(&spec(128, xrc, pattern)).unwrap();
            let b = run(&spec(256, xrc, pattern)).unwrap();
            check_shape(&a);
            check_shape(&b);
            let peers = b.endpoints as f64 / a.endpoints as f64;
            let time = b.startup.as_secs_f64() / a.startup.as_secs_f64();
            let cm = (b.cm_sent + b.cm_received) as f64 / (a.cm_sent + a.cm_received) as f64;
            println!(
                "{} {}: peers x{peers:.2}, start-up {:?} -> {:?} (x{time:.2}), \
                 CM messages {} -> {} (x{cm:.2}), state {:.0} -> {:.0} bytes per peer",
                pattern.name(),
                if xrc { "XRC" } else { "RC" },
                a.startup,
                b.startup,
                a.cm_sent + a.cm_received,
                b.cm_sent + b.cm_received,
                a.state_bytes as f64 / a.endpoints as f64,
                b.state_bytes as f64 / b.endpoints as f64,
            );
            assert!(
                time <= peers * 1.1,
                "{}: start-up grew x{time:.2}",
                pattern.name()
            );
            assert!(
                cm <= peers * 1.1,
                "{}: CM messages grew x{cm:.2}",
                pattern.name()
            );
        }
    }
}
