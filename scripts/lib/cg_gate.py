"""Issue 32's budget for xrcbtl's small-message calls, checked on the call
trees scripts/sw-cost --split counts (osu_latency's client, as is and
spinning, each at N1 and N2 round trips):

    python3 cg_gate.py DEVICE T1 T2 U1 U2 N1 N2

Per call: the send, a progress call that receives, an empty progress
call. The progress calls are the quiet ones (the full call every so
many, which looks at connection events, is printed beside them), split
within each N2 run by callgrind's own counts (cg_calls.found_split); the
N1 runs' split is printed too, as a check that the two agree. On siw the
whole call is held to BUDGET. The device's own code (the
provider library's ibv_post_send, ibv_poll_cq and, in the receiving
call, its share of the batched ibv_post_srq_recv) differs between devices,
so on every device xrcbtl's part (the call less what the provider spent in
it) is also held to BUDGET less siw's provider cost (SIW_PROVIDER,
measured by this script on siw and printed there). Prints each figure
against its budget; exits 1 if any is over, 2 if a figure is missing.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cg_calls import found_counts, found_split, per_iteration, read_tree, solve  # noqa: E402

# Whole calls on siw (issue 32): send, receiving progress, empty progress.
BUDGET = {"send": 450, "receiving": 300, "empty": 90}
# What siw's provider spends in them (scripts/sw-cost --gate on siw,
# 2026-12-03, at 99acc1c, with the split within each run: ibv_post_send
# 209 per send; ibv_poll_cq 50 in an empty call and 83 in a receiving
# one, whose poll copies out a completion; ibv_post_srq_recv 33 per
# receiving call, reposting in batches).
SIW_PROVIDER = {"send": 209, "receiving": 83 + 33, "empty": 50}


def per_call(t, steps, name):
    got = per_iteration(*t, steps, name)
    if got is None or got[1] <= 0:
        return None
    return got[0] / got[1], got[1]


def main():
    device, t1, t2, u1, u2, n1, n2 = sys.argv[1:]
    steps = int(n2) - int(n1)
    # Each tree read once: the per-iteration figures take its costs and
    # calls, the progress split its edges too.
    parsed = {p: read_tree(p) for p in (t1, t2, u1, u2)}
    t, u = (parsed[t1][:2], parsed[t2][:2]), (parsed[u1][:2], parsed[u2][:2])
    send = per_call(t, steps, "Btl<C>::send")
    post = per_call(t, steps, "ibv_post_send__extern")
    runs = {n: (found_counts(parsed[a]), found_counts(parsed[b])) for n, a, b in ((n1, t1, u1), (n2, t2, u2))}
    splits = {n: None if None in r else (found_split(*r), solve(*r, "poll")) for n, r in runs.items()}
    costs, polls = splits[n2] if splits[n2] is not None else (None, None)
    if None in (send, post, costs, polls):
        print(f"gate: {device}: a figure is missing (send {send}, post {post}, progress {splits[n2]})")
        return 2
    receiving, empty, _, _ = costs
    for n, r in runs.items():
        got = splits[n][0] if splits[n] is not None else None
        if got is not None:
            print(f"gate: {device}: progress at {n} round trips: receiving call {got[0]:.0f} (head {got[2]:.0f}, "
                  f"progress_found {got[3]:.0f}), empty call {got[1]:.0f}, from {r[0]['quiet']} and "
                  f"{r[1]['quiet']} quiet calls, {r[0]['found']} and {r[1]['found']} receiving")
    full, quiet = runs[n2][0]["full"], runs[n2][0]["quiet"]
    if full:
        print(f"gate: {device}: beside them, as is, {full} full calls of {runs[n2][0]['full_cost'] / full:.0f} "
              f"each to {quiet} quiet ones (not held to a budget)")
    # The receive buffers a receiving call gives back are posted again in
    # batches, the provider's ibv_post_srq_recv included: its share of a
    # round trip, which has one receiving call, is the provider's too.
    srq = per_iteration(*t, steps, "ibv_post_srq_recv__extern")
    repost = srq[0] if srq is not None else 0.0
    whole = {"send": send[0], "receiving": receiving, "empty": empty}
    poll_empty, poll_more = polls
    provider = {"send": post[0], "receiving": poll_empty + poll_more + repost, "empty": poll_empty}
    status = 0
    for k in ("send", "receiving", "empty"):
        checks = []
        if device == "siw":
            checks.append(("whole", whole[k], BUDGET[k]))
        checks.append(("xrcbtl's part", whole[k] - provider[k], BUDGET[k] - SIW_PROVIDER[k]))
        for what, got, budget in checks:
            ok = got <= budget
            status |= 0 if ok else 1
            print(f"gate: {device}: {k:9s} {what:13s} {got:6.0f} (budget {budget}): {'ok' if ok else 'OVER'}")
    print(
        f"gate: {device}: the provider's own per call: ibv_post_send {post[0]:.0f}, ibv_poll_cq {poll_empty:.0f} "
        f"empty and {poll_empty + poll_more:.0f} receiving, ibv_post_srq_recv {repost:.0f} per receiving call"
    )
    return status


sys.exit(main())
