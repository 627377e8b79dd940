"""The Python routing (tools/moe_grouped.py) against the checked-in counts that the C++ routing
(src/tool/routing.cpp) is also tested against, plus the merge of torch times into ccfuse records.
Run: python3 -m unittest discover -s tests/python"""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import merge_peer  # noqa: E402
import moe_grouped  # noqa: E402


class RoutingTest(unittest.TestCase):
    def test_checked_in_counts(self):
        cases = moe_grouped.read_expected(os.path.join(ROOT, "tests", "data", "grouped_routing_cases.txt"))
        self.assertGreaterEqual(len(cases), 10)
        for experts, total, routing, want in cases:
            self.assertEqual(moe_grouped.grouped_rows(experts, total, routing), want, (experts, total, routing))

    def test_sums_and_shapes(self):
        for e in (1, 2, 3, 8, 64, 128):
            for total in (0, 1, 7, 100, 65536):
                for routing in moe_grouped.ROUTINGS:
                    if routing == "empty_some" and e < 2:
                        continue
                    rows = moe_grouped.grouped_rows(e, total, routing)
                    self.assertEqual(sum(rows), total)
                    if routing in ("zipf", "one_hot"):
                        self.assertEqual(rows, sorted(rows, reverse=True))
                    if routing == "empty_some":
                        self.assertTrue(all(r == 0 for r in rows[0::2]))
        with self.assertRaises(ValueError):
            moe_grouped.grouped_rows(1, 3, "empty_some")

    def test_cases_are_whole_and_distinct(self):
        cs = moe_grouped.cases()
        self.assertEqual(len(cs), 37)
        keys = {(c["name"], c["routing"]) for c in cs}
        self.assertEqual(len(keys), len(cs))
        mixtral = [c for c in cs if c["name"] == "mixtral-up-T8192"][0]
        self.assertEqual((mixtral["experts"], mixtral["tokens"], mixtral["topk"], mixtral["n"], mixtral["k"]),
                         (4, 8192, 2, 28672, 4096))


class MergeTest(unittest.TestCase):
    def test_best_baseline_is_recomputed(self):
        base = dict(op="grouped_gemm", experts=4, topk=2, tokens_per_rank=8192, n=28672, k=4096, routing="zipf",
                    b_layout="nk", dtype="bf16", m=16384)
        ccfuse = dict(base, t_fused_ms=6.0, t_gemm_ms=15.0, baseline="cublas_grouped", group_rows=[8659, 3769, 2316, 1640])
        torch = dict(base, source="torch", t_torch_ms=5.0, group_rows=[8659, 3769, 2316, 1640])
        (r,) = merge_peer.merge([ccfuse], [torch])
        self.assertEqual(r["t_torch_grouped_mm_ms"], 5.0)
        self.assertEqual(r["t_cublas_grouped_ms"], 15.0)
        self.assertEqual(r["baseline"], "torch_grouped_mm")
        self.assertAlmostEqual(r["pct_of_baseline"], 100.0 * 5.0 / 6.0)
        self.assertIn("mixtral-up-T8192", merge_peer.table([r]))
        # Merging twice keeps the cuBLAS time (t_gemm_ms now holds the best).
        (r2,) = merge_peer.merge([r], [torch])
        self.assertEqual(r2["t_cublas_grouped_ms"], 15.0)
        self.assertNotIn("pct_of_baseline_interleaved", r2)  # no interleaved torch figures

    def test_same_clock_ratio(self):
        # ccfuse vs torch interleaved in torch's process, vs cuBLAS interleaved in ccfuse's bench:
        # the lower of the two ratios, each measured in one set of clocks.
        base = dict(op="grouped_gemm", experts=4, topk=2, tokens_per_rank=8192, n=28672, k=4096, routing="uniform",
                    b_layout="nk", dtype="bf16", m=16384)
        ccfuse = dict(base, t_fused_ms=6.0, t_gemm_ms=9.0, baseline="cublas_grouped")
        torch = dict(base, source="torch", t_torch_ms=5.5, t_torch_interleaved_ms=5.8, t_ccfuse_interleaved_ms=6.1,
                     pct_ccfuse_of_torch_interleaved=100.0 * 5.8 / 6.1)
        (r,) = merge_peer.merge([ccfuse], [torch])
        self.assertAlmostEqual(r["pct_of_baseline"], 100.0 * 5.5 / 6.0)
        self.assertAlmostEqual(r["pct_of_baseline_interleaved"], 100.0 * 5.8 / 6.1)
        self.assertEqual(r["baseline_interleaved"], "torch_grouped_mm")
        t = merge_peer.table([r])
        self.assertIn("same-clock pct of best baseline (each interleaved with ccfuse): geomean 95.1%, min 95.1%", t)
        (r,) = merge_peer.merge([dict(ccfuse, t_gemm_ms=5.0)], [torch])  # cuBLAS the closer one now
        self.assertEqual((r["baseline_interleaved"], round(r["pct_of_baseline_interleaved"], 2)), ("cublas_grouped", 83.33))


if __name__ == "__main__":
    unittest.main()

class VariantTest(unittest.TestCase):
    def test_variant_ratio_lines(self):
        # An A/B variant timed in the engine's rounds (CCFUSE_GROUPED_AB_*): its speed ratio per case
        # and their geomean; none without variant records.
        base = dict(op="grouped_gemm", experts=64, topk=8, tokens_per_rank=4096, n=2048, k=768, routing="uniform",
                    b_layout="nk", dtype="bf16", m=32768, t_gemm_ms=0.4, baseline="cublas_grouped")
        a = dict(base, t_fused_ms=0.20, t_variant_ms=0.19, variant_config="block=128x128x64 stages=6 pingpong")
        b = dict(base, routing="zipf", t_fused_ms=0.30, t_variant_ms=0.32, variant_config="x")
        t = merge_peer.table(merge_peer.merge([a, b], []))
        self.assertIn("qwen3-down-T4096", t)
        self.assertIn("1.053  block=128x128x64 stages=6 pingpong", t)
        self.assertIn("variant speed ratio: geomean %.3f, min 0.938, max 1.053 over 2 cases" %
                      ((0.20 / 0.19 * 0.30 / 0.32) ** 0.5), t)
        self.assertNotIn("variant", merge_peer.table(merge_peer.merge([dict(base, t_fused_ms=0.2)], [])))
