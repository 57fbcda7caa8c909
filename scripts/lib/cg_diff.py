"""Per-function cost of one iteration: the difference of two callgrind
annotations (`callgrind_annotate` output) of runs with N1 and N2
iterations, over N2 - N1; prints the TOP functions by self cost.

    python3 cg_diff.py A1.txt A2.txt N1 N2 TOP
"""
import re
import sys

LINE = re.compile(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*?)\s*$")


def costs(path):
    out = {}
    started = False
    with open(path, errors="replace") as f:
        for line in f:
            if "file:function" in line:
                started = True
                continue
            if not started or line.startswith("-----"):
                continue
            if not line.strip():
                if out:
                    break
                continue
            m = LINE.match(line)
            if m and ":" in m.group(2):
                name = m.group(2)
                name = re.sub(r"\s*\[[^\]]*\]$", "", name)
                # A function's self cost is split by the file each part
                # came from (inlined code), and callgrind does not always
                # name that file the same way in two runs (`???` where it
                # lacks the line table): summed by function, so that the
                # difference of two runs does not move cost between names.
                func = name.partition(":")[2]
                out[func] = out.get(func, 0) + int(m.group(1).replace(",", ""))
    return out


def main():
    a1, a2, n1, n2, top = sys.argv[1:6]
    n1, n2, top = int(n1), int(n2), int(top)
    c1, c2 = costs(a1), costs(a2)
    diff = {k: (c2.get(k, 0) - c1.get(k, 0)) / (n2 - n1) for k in set(c1) | set(c2)}
    total = sum(v for v in diff.values())
    print(f"per round trip, by function (self), total {total:.0f}:")
    for func, v in sorted(diff.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{v:8.1f}  {func[:110]}")


main()
