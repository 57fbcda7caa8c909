"""The layers of an MPI ping-pong client's round trip, from two callgrind
call trees (`callgrind_annotate --inclusive=yes --tree=calling` output)
of runs with N1 and N2 iterations and their two instruction totals:
what MPI and ob1 spend, what the xrc component (its C glue) spends, and
what xrcbtl (behind its C ABI) spends, per round trip.

    python3 cg_mpi.py T1.tree T2.tree TOTAL1 TOTAL2 N1 N2

The layers nest: the component's send and progress call xrcbtl, and
xrcbtl's progress calls the component's receive callback, which calls
ob1's (its matching of the arrived fragment). So

- xrcbtl = xrcbtl_send + xrcbtl_progress - mca_btl_xrc_receive
- component = mca_btl_xrc_sendi + mca_btl_xrc_send + xrc_progress
  - (xrcbtl_send + xrcbtl_progress) + mca_btl_xrc_receive - ob1's
  fragment callbacks (mca_pml_ob1_recv_frag_callback_*)
- MPI and ob1 = the round trip - xrcbtl - component,

each inclusive, per round trip. The round trip is the client's MPI_Send
and MPI_Recv, inclusive (the timed loop calls nothing else); the process
totals' difference is printed beside it, but MPI_Init and MPI_Finalize
wait for the peer by spinning, so it moves from run to run. Prints the
whole calls too, with their number per round trip.
"""
import sys

from cg_calls import tree


def per_rt(a, b, steps, match):
    """(inclusive cost, calls) per round trip of the functions whose name
    `match` accepts, summed (0 when none is there)."""
    (i1, c1), (i2, c2) = a, b
    names = {k for k in set(i1) | set(i2) if match(k)}
    inc = sum(i2.get(k, 0) - i1.get(k, 0) for k in names) / steps
    calls = sum(c2.get(k, 0) - c1.get(k, 0) for k in names) / steps
    return inc, calls


def main():
    t1, t2, total1, total2, n1, n2 = sys.argv[1:]
    steps = int(n2) - int(n1)
    a, b = tree(t1), tree(t2)
    process = (int(total2) - int(total1)) / steps

    def named(*names):
        return per_rt(a, b, steps, lambda k: k in names)

    whole = named("MPI_Send", "PMPI_Send")[0] + named("MPI_Recv", "PMPI_Recv")[0]
    rows = [
        "mca_pml_ob1_send", "mca_pml_ob1_recv", "opal_progress",
        "mca_btl_xrc_sendi", "mca_btl_xrc_send", "xrc_progress", "mca_btl_xrc_receive",
        "xrcbtl_send", "xrcbtl_progress",
    ]
    missing = []
    for name in rows:
        inc, calls = named(name)
        if calls == 0 and inc == 0:
            missing.append(name)
            continue
        per = f"{inc / calls:7.0f} per call" if calls > 0 else ""
        print(f"{name:28s} {inc:7.0f} per round trip, {calls:5.2f} calls {per}")
    if missing:
        print(f"not in the call trees: {' '.join(missing)}")
    component = sum(named(n)[0] for n in ("mca_btl_xrc_sendi", "mca_btl_xrc_send", "xrc_progress"))
    xrcbtl_in = named("xrcbtl_send")[0] + named("xrcbtl_progress")[0]
    receive = named("mca_btl_xrc_receive")[0]
    ob1_cb = per_rt(a, b, steps, lambda k: k.startswith("mca_pml_ob1_recv_frag_callback"))[0]
    if component == 0 or xrcbtl_in == 0 or whole == 0:
        print("MPI_Send and MPI_Recv, the component or xrcbtl is not in the call trees: no layers")
        sys.exit(1)
    xrcbtl = xrcbtl_in - receive
    glue = component - xrcbtl_in + receive - ob1_cb
    mpi = whole - xrcbtl - glue
    print(f"MPI_Send + MPI_Recv {whole:.0f} per round trip (the process totals' difference: {process:.0f})")
    print("layers per round trip:")
    for name, v in (("MPI and ob1", mpi), ("xrc component (C)", glue), ("xrcbtl", xrcbtl)):
        print(f"  {name:20s} {v:7.0f}  {100 * v / whole:5.1f}%")


if __name__ == "__main__":
    main()
