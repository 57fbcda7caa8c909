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

--found splits `Btl<C>::progress` within each run instead, which needs no
second difference: its receiving calls are the ones that call
`Btl<C>::progress_found` (never inlined, called once per receiving
call), so callgrind's own counts give both kinds' numbers in each tree;
see `found_split`.

    python3 cg_calls.py --found T.txt U.txt
"""
import re
import sys

# "  1,234 (12.3%)  *  file:function [object]" opens a function's entry;
# "  1,234 (12.3%)  >   file:function (56x) [object]" is one of its callees.
ENTRY = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+\*\s+(\S.*?)(?:\s+\[[^\]]*\])?\s*$")
EDGE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+>\s+(\S.*?)\s+\(([\d,]+)x\)")


def num(s):
    return int(s.replace(",", ""))


def read_tree(path):
    """A call tree, read once: (inclusive, calls, edges). `inclusive` is
    each function's whole cost, `calls` how often it was called,
    `edges` {caller: {callee: [inclusive cost, calls]}}, a function's
    edges summed over its entries (inlined code repeats it under the
    files it came from, each with the calls made from there)."""
    inclusive, calls, edges = {}, {}, {}
    caller = None
    with open(path, errors="replace") as f:
        for line in f:
            m = ENTRY.match(line)
            if m:
                # The largest of a function's entries is the whole function.
                caller = m.group(2).partition(":")[2]
                inclusive[caller] = max(inclusive.get(caller, 0), num(m.group(1)))
                continue
            m = EDGE.match(line)
            if m:
                callee, cost, n = m.group(2).partition(":")[2], num(m.group(1)), num(m.group(3))
                calls[callee] = calls.get(callee, 0) + n
                if caller is not None:
                    e = edges.setdefault(caller, {}).setdefault(callee, [0, 0])
                    e[0] += cost
                    e[1] += n
    return inclusive, calls, edges


def tree(path):
    """(inclusive, calls) of a call tree (see `read_tree`)."""
    inclusive, calls, _ = read_tree(path)
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


# The quiet progress call's parts: the function, the one its receiving
# calls make (once each), and the ones it calls for rarer work, whose
# costs are not a quiet call's.
PROGRESS = "Btl<C>::progress"
FOUND = "Btl<C>::progress_found"
RARE = ("Btl<C>::progress_full", "Btl<C>::idle_yield")


def callees(es, caller):
    """The edges of the function whose name ends with `caller`: the
    largest such entry's, by its calls' cost."""
    found = [k for k in es if k.endswith(caller)]
    if not found:
        return None
    return es[max(found, key=lambda k: sum(c for c, _ in es[k].values()))]


def edge(out, callee):
    """(cost, calls) of the edges to functions whose names end with
    `callee`, summed."""
    cost = calls = 0
    for k, (c, n) in out.items():
        if k.endswith(callee):
            cost += c
            calls += n
    return cost, calls


# The poll every quiet call makes once (the provider's, on a device).
POLL = "ibv_poll_cq__extern"


def found_counts(parsed, poll=POLL):
    """One run's quiet progress calls, from its tree as `read_tree` gives
    it, counted whole (not differenced), or
    None when the tree lacks them: a dict of the heads' cost (what every
    quiet call spends outside progress_found and the rare work: its
    prologue, its checks and its poll of the receive CQ), the quiet calls
    (each polls once: the poll's calls from `Btl<C>::progress`, when the
    tree has the poll; else the function's calls less the rare ones), the
    receiving calls and their progress_found's cost, the rare calls and
    their cost, and the poll's own cost from the heads."""
    inclusive, calls, edges = parsed
    out = callees(edges, PROGRESS)
    names = [k for k in inclusive if k.endswith(PROGRESS)]
    if out is None or not names:
        return None
    name = max(names, key=lambda k: inclusive[k])
    found, f = edge(out, FOUND)
    rare = [edge(out, r) for r in RARE]
    full, full_calls = rare[0]
    polled, polls = edge(out, poll)
    # The rare calls' own heads (a lock, a test) stay in the heads and
    # are charged to the quiet calls: a little too much, never too little.
    return {
        "head": inclusive[name] - found - sum(c for c, _ in rare),
        "quiet": polls if polls else calls.get(name, 0) - full_calls,
        "found": f,
        "found_cost": found,
        "full": full_calls,
        "full_cost": full,
        "poll": polled,
    }


def solve(t, u, key):
    """(on an empty call, more on a receiving one) of the part `key` of
    the heads, from two runs: in each, it costs n E + f X over n quiet
    calls of which f receive. None when the runs' mixes are too alike."""
    n_t, f_t, n_u, f_u = t["quiet"], t["found"], u["quiet"], u["found"]
    if min(f_t, f_u) == 0 or abs(n_t / f_t - n_u / f_u) < 0.5:
        return None
    empty = (t[key] * f_u - u[key] * f_t) / (n_t * f_u - n_u * f_t)
    return empty, (t[key] - n_t * empty) / f_t


def found_split(t, u):
    """(receiving call, empty call, its head, its progress_found) of the
    quiet progress call from two runs' `found_counts` with different
    numbers of empty calls per receiving one, or None when they are too
    alike. A receiving call costs an empty call's head, what its head
    spends more (its poll found a completion), and its progress_found,
    per call, from the run with more receiving calls. The counts are each
    run's own, whole: no count is the difference of two runs, which a
    spinning client's timing can make negative."""
    got = solve(t, u, "head")
    if got is None:
        return None
    empty, extra = got
    big = t if t["found"] >= u["found"] else u
    body = big["found_cost"] / big["found"]
    return empty + extra + body, empty, empty + extra, body


def found_main(t_path, u_path):
    t, u = found_counts(read_tree(t_path)), found_counts(read_tree(u_path))
    if t is None or u is None:
        print(f"{PROGRESS}: not in the call trees")
        return 1
    got = found_split(t, u)
    if got is None:
        print(f"{PROGRESS}: both runs made about {t['quiet'] / max(t['found'], 1):.2f} quiet calls "
              "per receiving one: no split")
        return 1
    receiving, empty, head, body = got
    print(f"{PROGRESS:28s} receiving call {receiving:7.0f}, empty call {empty:5.0f} "
          f"(a receiving call's head {head:.0f}, its progress_found {body:.0f}; quiet calls per "
          f"receiving one {t['quiet'] / t['found']:.2f} and {u['quiet'] / u['found']:.2f})")
    for what, r in (("as is", t), ("spinning", u)):
        if r["full"]:
            print(f"{PROGRESS:28s} {what}: {r['full']} full calls (rare work) beside {r['quiet']} quiet ones, "
                  f"{r['full_cost'] / r['full']:.0f} each")
    return 0


def main():
    if sys.argv[1:2] == ["--found"]:
        sys.exit(found_main(*sys.argv[2:4]))
    if sys.argv[1:2] == ["--split"]:
        t1, t2, u1, u2, n1, n2, *names = sys.argv[2:]
        sys.exit(split(t1, t2, u1, u2, n1, n2, names))
    t1, t2, n1, n2, *names = sys.argv[1:]
    calls(t1, t2, n1, n2, names)


if __name__ == "__main__":
    main()
