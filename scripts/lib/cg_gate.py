"""Issue 32's budget for xrcbtl's small-message calls, checked on the call
trees scripts/sw-cost --split counts (osu_latency's client, as is and
spinning, each at N1 and N2 round trips):

    python3 cg_gate.py DEVICE T1 T2 U1 U2 N1 N2

Per call: the send, a progress call that receives, an empty progress
call. On siw the whole call is held to BUDGET. The device's own code (the
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
from cg_calls import per_iteration, split_costs, tree  # noqa: E402

# Whole calls on siw (issue 32): send, receiving progress, empty progress.
BUDGET = {"send": 450, "receiving": 300, "empty": 90}
# What siw's provider spends in them (scripts/sw-cost --gate on siw,
# 2026-11-29: ibv_post_send 209, ibv_poll_cq 52 per call on average; on
# 2026-12-01, ibv_post_srq_recv 33 per receiving call, reposting in
# batches).
SIW_PROVIDER = {"send": 209, "receiving": 52 + 33, "empty": 52}


def per_call(t, steps, name):
    got = per_iteration(*t, steps, name)
    if got is None or got[1] <= 0:
        return None
    return got[0] / got[1], got[1]


def main():
    device, t1, t2, u1, u2, n1, n2 = sys.argv[1:]
    steps = int(n2) - int(n1)
    t, u = (tree(t1), tree(t2)), (tree(u1), tree(u2))
    send = per_call(t, steps, "Btl<C>::send")
    post = per_call(t, steps, "ibv_post_send__extern")
    poll = per_call(u, steps, "ibv_poll_cq__extern")
    a = per_iteration(*t, steps, "Btl<C>::progress")
    b = per_iteration(*u, steps, "Btl<C>::progress")
    costs = None if a is None or b is None else split_costs(a, b)
    if None in (send, post, poll, costs):
        print(f"gate: {device}: a figure is missing (send {send}, post {post}, poll {poll}, progress {a} {b})")
        return 2
    receiving, empty = costs
    # The receive buffers a receiving call gives back are posted again in
    # batches, the provider's ibv_post_srq_recv included: its share of a
    # round trip, which has one receiving call, is the provider's too.
    srq = per_iteration(*t, steps, "ibv_post_srq_recv__extern")
    repost = srq[0] if srq is not None else 0.0
    whole = {"send": send[0], "receiving": receiving, "empty": empty}
    provider = {"send": post[0], "receiving": poll[0] + repost, "empty": poll[0]}
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
        f"gate: {device}: the provider's own per call: ibv_post_send {post[0]:.0f}, ibv_poll_cq {poll[0]:.0f}, "
        f"ibv_post_srq_recv {repost:.0f} per receiving call"
    )
    return status


sys.exit(main())
