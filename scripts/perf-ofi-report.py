#!/usr/bin/env python3
"""The tables of scripts/perf-ofi, in Markdown, from one device's raw lines.

    perf-ofi-report.py RAW DEVICE [PNG]

RAW has one line a measurement, `ROUND BENCH SIZE STACK VALUE...`:

- `pingpong`: fi_pingpong's usec/xfer and MB/s;
- `LIB-latency`: osu_mpi latency's microseconds through library LIB;
- `LIB-bw`: osu_mpi bw's MB/s through LIB;
- `own-latency`, `own-bw`: without libfabric, xrcbtl's osu_latency and
  osu_bw (stack `xrcbtl`) and perftest's ib_send_lat (`perftest`: its
  typical, `perftest-avg`: its average) and ib_write_bw (MB/s);

and `instructions STACK N` lines: user-space instructions per 8-byte
round trip. Each table gives a stack's median over the rounds and, for
each xrc row (xrc, and xrc-spin: the same without yielding the CPU when
idle) against each libfabric stack, the xrc row's value over the stack's:
the median of the rounds' ratios with their range (time for pingpong and latency, lower is
better for xrc; bandwidth for bw, higher is better). Then each MPI
library's 8-byte latency over xrc against xrcbtl's own osu_latency, and
against perftest's, the same way.

With PNG, it also draws the medians (matplotlib, Debian's
python3-matplotlib): fi_pingpong's one-way time and bandwidth by size
for each stack, and each MPI library's osu_mpi bandwidth by size over
each stack, xrcbtl's own osu_bw and perftest's ib_write_bw beside them.
"""
import statistics
import sys

BENCH_TITLES = {
    "pingpong": "fi_pingpong -e rdm -m tagged: one-way time (us) and MB/s",
    "latency": "osu_mpi latency through {lib}: one-way time (us)",
    "bw": "osu_mpi bw through {lib}: MB/s",
}
OWN_TITLES = {
    "own-latency": "without libfabric: xrcbtl's osu_latency and perftest's ib_send_lat, one-way time (us)",
    "own-bw": "without libfabric: xrcbtl's osu_bw and perftest's ib_write_bw, MB/s",
}


def order(stacks):
    return sorted(stacks, key=lambda s: (not s.startswith("xrc"), s))


def pairs(stacks):
    """(ours, theirs) for every xrc row against every libfabric stack."""
    ours = [s for s in stacks if s.startswith("xrc")]
    return [(o, s) for o in ours for s in stacks if not s.startswith("xrc")]


def round_ratios(mine, theirs):
    """Round by round, mine's first value over theirs', where both ran."""
    return [mine[k][0] / theirs[k][0] for k in mine if k in theirs and theirs[k][0] > 0]


def cell(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def medians(cells, stack, col=0):
    """(sizes, medians over the rounds) of one stack's column."""
    sizes = sorted(n for n, s in cells if s == stack)
    return sizes, [statistics.median(v[col] for v in cells[(n, stack)].values()) for n in sizes]


# One colour per stack in every panel.
COLOURS = {"xrc": "tab:blue", "xrc-spin": "tab:cyan", "xrcbtl": "tab:blue", "verbs;ofi_rxm": "tab:red",
           "tcp;ofi_rxm": "tab:green", "perftest": "tab:purple"}


def plot(path, device, got):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("perf-ofi-report: no matplotlib (apt install python3-matplotlib): no plot", file=sys.stderr)
        return False
    ping = got.get("pingpong", {})
    bws = sorted(b for b in got if b.endswith("-bw"))
    n = 2 + len(bws)
    rows = (n + 2) // 3
    fig, grid = plt.subplots(rows, 3, figsize=(18, 4.5 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    panels = [(axes[0], ping, 0, "fi_pingpong one-way time (us)"), (axes[1], ping, 1, "fi_pingpong MB/s")]
    panels += [(ax, got[b], 0, f"{b.rsplit('-', 1)[0]}: MB/s" if b != "own-bw" else "without libfabric: MB/s")
               for ax, b in zip(axes[2:], bws)]
    for ax, cells, col, title in panels:
        for stack in order({s for _, s in cells}):
            xs, ys = medians(cells, stack, col)
            # A bandwidth that rounds to 0 has no place on a log scale.
            xs, ys = zip(*[(x, y) for x, y in zip(xs, ys) if y > 0]) if any(y > 0 for y in ys) else ((), ())
            ax.plot(xs, ys, "s-" if stack.startswith("xrc") else "o--", label=stack, markersize=4,
                    color=COLOURS.get(stack))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"{device}: {title}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main(raw, device, png=None):
    got, instr = {}, {}
    for line in open(raw):
        f = line.split()
        if not f:
            continue
        if f[0] == "instructions":
            instr[f[1]] = int(f[2])
            continue
        rnd, bench, size, stack = int(f[0]), f[1], int(f[2]), f[3]
        got.setdefault(bench, {}).setdefault((size, stack), {})[rnd] = [float(v) for v in f[4:]]
    rounds = max((max(r) for b in got.values() for r in b.values()), default=0)
    print(f"### {device}, {rounds} round(s)\n")
    for bench in sorted(got, key=lambda b: (b != "pingpong", b)):
        cells = got[bench]
        kind = bench.rsplit("-", 1)[-1]
        lib = bench.rsplit("-", 1)[0]
        stacks = order({s for _, s in cells})
        versus = pairs(stacks)
        print(f"#### {OWN_TITLES.get(bench) or BENCH_TITLES[kind].format(lib=lib)}\n")
        head = ["size"]
        for s in stacks:
            head += [f"{s} us", f"{s} MB/s"] if kind == "pingpong" else [s]
        head += [f"{o}/{s}" for o, s in versus]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for size in sorted({n for n, _ in cells}):
            row = [str(size)]
            for s in stacks:
                v = list(cells.get((size, s), {}).values())
                width = 2 if kind == "pingpong" else 1
                row += [f"{statistics.median(x[i] for x in v):.2f}" if v else "-" for i in range(width)]
            for mine, s in versus:
                r = round_ratios(cells.get((size, mine), {}), cells.get((size, s), {}))
                row.append(cell(r) if r else "-")
            print("| " + " | ".join(row) + " |")
        print()
    own = got.get("own-latency", {})
    mpi = sorted(b for b in got if b.endswith("-latency") and b != "own-latency")
    if own and mpi:
        print("#### 8-byte latency through each MPI over xrc, against xrcbtl's own and perftest's\n")
        refs = [s for s in ("xrcbtl", "perftest", "perftest-avg") if (8, s) in own]
        print("| MPI | " + " | ".join(f"over xrc / {r}" for r in refs) + " |")
        print("|" + "---|" * (len(refs) + 1))
        for bench in mpi:
            x = got[bench].get((8, "xrc"), {})
            row = [bench.rsplit("-", 1)[0]]
            for ref in refs:
                r = round_ratios(x, own[(8, ref)])
                row.append(cell(r) if r else "-")
            print("| " + " | ".join(row) + " |")
        print()
    if instr:
        print("#### user-space instructions per 8-byte fi_pingpong round trip (client, callgrind)\n")
        stacks = order(instr)
        versus = pairs(stacks)
        print("| " + " | ".join(stacks + [f"{o}/{s}" for o, s in versus]) + " |")
        print("|" + "---|" * (len(stacks) + len(versus)))
        # A count of 0 or less is a pair of runs whose polling outweighed
        # the extra round trips (an older perf-ofi recorded it): no count.
        ok = {s: n for s, n in instr.items() if n > 0}
        ratios = [f"{ok[o] / ok[s]:.2f}" if o in ok and s in ok else "-" for o, s in versus]
        print("| " + " | ".join([str(ok[s]) if s in ok else "n/a" for s in stacks] + ratios) + " |")
        print()
        if len(ok) < len(instr):
            print("n/a: the run of more iterations counted fewer instructions (its client polled less).\n")
    if png and plot(png, device, got):
        print(f"![{device}]({png.rsplit('/', 1)[-1]})\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
