"""The cost of whole calls per iteration: for the functions named, the
instructions spent in them and in everything they call (inclusive), and
how often they were called, per iteration, from the difference of two
callgrind call trees (`callgrind_annotate --inclusive=yes --tree=calling`
output) of runs with N1 and N2 iterations.

    python3 cg_calls.py T1.txt T2.txt N1 N2 FUNCTION...

A FUNCTION matches the end of a function's name. The number of calls
says how much of a progress function's cost is spinning: a waiting client
calls progress more often the longer the answer takes, and every empty
call costs, so its inclusive cost per iteration moves with the timing;
its cost per call at a known number of calls does not.
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


def main():
    t1, t2, n1, n2, *names = sys.argv[1:]
    steps = int(n2) - int(n1)
    (i1, c1), (i2, c2) = tree(t1), tree(t2)
    for want in names:
        found = [k for k in set(i1) | set(i2) if k.endswith(want)]
        if not found:
            print(f"{want}: not in the call trees")
            continue
        k = max(found, key=lambda k: i2.get(k, 0))
        inc = (i2.get(k, 0) - i1.get(k, 0)) / steps
        n = (c2.get(k, 0) - c1.get(k, 0)) / steps
        per = f"{inc / n:7.0f} per call" if n > 0 else "        no calls"
        print(f"{want:28s} {inc:7.0f} per round trip, {n:5.2f} calls, {per}")


main()
