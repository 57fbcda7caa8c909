"""The cost of whole calls per iteration: for the functions named, the
instructions spent in them and in everything they call (inclusive), and
how often they were called, per iteration, from the difference of two
callgrind call trees (`callgrind_annotate --inclusive=yes --tree=calling`
output) of runs with N1 and N2 iterations.

    python3 cg_calls.py T1.txt T2.txt N1 N2 FUNCTION...
    python3 cg_calls.py --split T1.txt T2.txt U1.txt U2.txt N1 N2 FUNCTION...

A FUNCTION matches the end of a function's name. The number of calls
says how much of a progress function's cost is spinning: a waiting client
calls progress more often the longer the answer takes, and every empty
call costs, so its inclusive cost per iteration moves with the timing;
its cost per call at a known number of calls does not.

--split separates a progress function's two kinds of call, from two
pairs of trees whose runs called it a different number of times per
iteration (T from one setting, U from another, such as a client that
yields its CPU after an empty call and one that does not): each
iteration makes c calls, of which one receives (cost R) and c - 1 find
nothing (cost E each), so its cost is E (c - 1) + R. Two runs with
different c give E and R.
"""
import re
import sys

# "  1,234 (12.3%)  *  file:function [object]" opens a function's entry;
# "  1,234 (12.3%)  >   file:function (56x) [object]" is one of its callees.
ENTRY = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+\*\s+(\S.*?)(?:\s+\[[^\]]*\])?\s*$")
CALL = re.compile(r"^\s*[\d,]+\s+\([^)]*\)\s+>\s+(\S.*?)\s+\(([\d,]+)x\)")


def num(s):
    return int(s.replace(",", ""))


def tree(path):
    inclusive, calls = {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            m = ENTRY.match(line)
            if m:
                # Inlined code repeats a function under the files it came
                # from; the largest entry is the whole function.
                name = m.group(2).partition(":")[2]
                inclusive[name] = max(inclusive.get(name, 0), num(m.group(1)))
                continue
            m = CALL.match(line)
            if m:
                name = m.group(1).partition(":")[2]
                calls[name] = calls.get(name, 0) + num(m.group(2))
    return inclusive, calls


def per_iteration(t1, t2, steps, want):
    """(inclusive cost, calls) of the function named `want` per
    iteration, or None when the trees do not have it."""
    (i1, c1), (i2, c2) = t1, t2
    found = [k for k in set(i1) | set(i2) if k.endswith(want)]
    if not found:
        return None
    k = max(found, key=lambda k: i2.get(k, 0))
    return (i2.get(k, 0) - i1.get(k, 0)) / steps, (c2.get(k, 0) - c1.get(k, 0)) / steps


def calls(t1, t2, n1, n2, names):
    steps = int(n2) - int(n1)
    a, b = tree(t1), tree(t2)
    for want in names:
        got = per_iteration(a, b, steps, want)
        if got is None:
            print(f"{want}: not in the call trees")
            continue
        inc, n = got
        per = f"{inc / n:7.0f} per call" if n > 0 else "        no calls"
        print(f"{want:28s} {inc:7.0f} per round trip, {n:5.2f} calls, {per}")


def split_costs(a, b):
    """(receiving call, empty call) from two runs' (inclusive cost,
    calls) per iteration of one progress function, or None when their
    numbers of calls are too close to tell the two kinds apart (the
    difference would be noise divided by noise)."""
    (inc_a, c_a), (inc_b, c_b) = a, b
    if abs(c_a - c_b) < 0.5:
        return None
    empty = (inc_a - inc_b) / (c_a - c_b)
    return inc_a - empty * (c_a - 1), empty


def split(t1, t2, u1, u2, n1, n2, names):
    steps = int(n2) - int(n1)
    t, u = (tree(t1), tree(t2)), (tree(u1), tree(u2))
    status = 0
    for want in names:
        a, b = per_iteration(*t, steps, want), per_iteration(*u, steps, want)
        if a is None or b is None:
            print(f"{want}: not in the call trees")
            status = 1
            continue
        (inc_a, c_a), (inc_b, c_b) = a, b
        costs = split_costs(a, b)
        if costs is None:
            print(f"{want}: both runs made about {c_a:.2f} calls per iteration: no split")
            status = 1
            continue
        receiving, empty = costs
        print(f"{want:28s} receiving call {receiving:7.0f}, empty call {empty:5.0f} "
              f"(from {c_a:.2f} and {c_b:.2f} calls per round trip: {inc_a:.0f} and {inc_b:.0f})")
    return status


def main():
    if sys.argv[1:2] == ["--split"]:
        t1, t2, u1, u2, n1, n2, *names = sys.argv[2:]
        sys.exit(split(t1, t2, u1, u2, n1, n2, names))
    t1, t2, n1, n2, *names = sys.argv[1:]
    calls(t1, t2, n1, n2, names)


if __name__ == "__main__":
    main()
