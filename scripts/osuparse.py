"""Readers of benchmark output, shared by scripts/osu-side-by-side and
scripts/perf-report."""
import glob
import math
import re


def osu(path, col=1):
    """size -> number in column `col` (default the first after the size) of
    an OSU-format file ({} if it is missing; a row without it, or with
    '-' there, is left out)."""
    rows = {}
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) > col and not line.startswith("#") and p[0].isdigit() and p[col] != "-":
                    rows[int(p[0])] = float(p[col])
    except OSError:
        pass
    return rows


# perftest's bandwidth columns are in MiB/s (its --help: "MiB=2^20 byte"),
# the OSU benchmarks' in MB/s (10^6 bytes a second): a perftest bandwidth
# is read in MB/s, so that the two compare.
MIB_IN_MB = 1048576 / 1e6


def perftest(pattern, column):
    """size -> the named column of the perftest result rows in the files
    matching `pattern` (a run's .err, .server and .client-err files left aside); a
    bandwidth column (BW_...[MB/sec], which perftest counts in MiB/s)
    converted to MB/s. A row whose value is not a finite number (perftest
    printed "inf" when its clock readings went wrong) is left out."""
    scale = MIB_IN_MB if column.startswith("BW_") else 1.0
    rows = {}
    for path in glob.glob(pattern):
        if path.endswith((".err", ".server", ".client-err")):
            continue
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("#bytes") and i + 1 < len(lines):
                # Multi-word column names become one word each.
                head = re.sub(r"(BW|99%|99\.9%) (peak|average|percentile)", r"\1_\2", line).split()
                vals = lines[i + 1].split()
                if column in head and len(vals) == len(head):
                    v = float(vals[head.index(column)])
                    if math.isfinite(v):
                        rows[int(vals[0])] = v * scale
    return rows
