"""Tests of the progress split (cg_calls.found_counts and found_split) on
call trees made here, in callgrind_annotate's --tree=calling format, from
known per-call costs.

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cg_calls  # noqa: E402

OBJ = "[/x/osu_latency]"


def line(cost, mark, name, calls=None):
    n = f" ({calls:,}x)" if calls is not None else ""
    return f"{cost:>12,} ( 1.00%)  {mark}   m.rs:{name}{n} {OBJ}\n"


def run_tree(quiet, found, full, empty=80, extra=20, body=400, poll=(43, 22), full_each=1100):
    """The tree of a run with `quiet` quiet progress calls, `found` of
    them receiving, and `full` full calls: an empty call's head costs
    `empty` (its poll `poll[0]` of it), a receiving call's head `extra`
    more (its poll `poll[1]` more), its progress_found `body`."""
    heads = quiet * empty + found * extra
    polled = quiet * poll[0] + found * poll[1]
    whole = heads + found * body + full * full_each
    p = "xrcbtl_btl::btl::Btl<C>::progress"
    return "".join([
        line(whole + 5000, "*", "xrcbtl_benches::osu::ping_pong"),
        line(whole, ">", p, quiet + full),
        "\n",
        line(whole, "*", p),
        line(found * body, ">", "xrcbtl_btl::btl::Btl<C>::progress_found", found),
        line(full * full_each, ">", "xrcbtl_btl::btl::Btl<C>::progress_full", full),
        line(polled, ">", "ibv_poll_cq__extern", quiet),
        "\n",
        line(found * body, "*", "xrcbtl_btl::btl::Btl<C>::progress_found"),
        "\n",
    ])


class Split(unittest.TestCase):
    def counts(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".tree", delete=False) as f:
            f.write(text)
        self.addCleanup(os.unlink, f.name)
        return cg_calls.found_counts(cg_calls.read_tree(f.name))

    def test_gives_back_the_costs_a_tree_was_made_from(self):
        t = self.counts(run_tree(8055, 3960, 150))
        u = self.counts(run_tree(592652, 3909, 1364))
        receiving, empty, head, body = cg_calls.found_split(t, u)
        self.assertAlmostEqual(empty, 80, places=6)
        self.assertAlmostEqual(head, 100, places=6)
        self.assertAlmostEqual(body, 400, places=6)
        self.assertAlmostEqual(receiving, 500, places=6)
        poll_empty, poll_more = cg_calls.solve(t, u, "poll")
        self.assertAlmostEqual(poll_empty, 43, places=6)
        self.assertAlmostEqual(poll_more, 22, places=6)
        self.assertEqual((t["full"], u["full"]), (150, 1364))

    def test_needs_no_difference_of_two_runs(self):
        # A spinning run of 4000 round trips that made fewer calls than
        # one of 2000: differenced, the calls per round trip would be
        # negative; each run alone still splits.
        t = self.counts(run_tree(8055, 3960, 150))
        u_short = self.counts(run_tree(300000, 1952, 800))
        u_long = self.counts(run_tree(250000, 3909, 700))
        self.assertLess(u_long["quiet"], u_short["quiet"])
        for u in (u_short, u_long):
            receiving, empty, _, _ = cg_calls.found_split(t, u)
            self.assertAlmostEqual(receiving, 500, places=6)
            self.assertAlmostEqual(empty, 80, places=6)

    def test_refuses_runs_too_alike(self):
        t = self.counts(run_tree(8055, 3960, 150))
        u = self.counts(run_tree(8100, 3980, 150))
        self.assertIsNone(cg_calls.found_split(t, u))

    def test_a_tree_without_progress_has_no_counts(self):
        self.assertIsNone(self.counts(line(10, "*", "main") + "\n"))


if __name__ == "__main__":
    unittest.main()
