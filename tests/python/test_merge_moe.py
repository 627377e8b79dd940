"""tools/merge_moe.py: the join of the fused MoE FFN records (bench/moe_ffn_bench.cu) with the serial
PyTorch baseline's alltoall records on (model, m, routing), the derived columns (t_limit,
fused/limit, speedup), the Markdown table, the summary lines and the --out records.
Run: python3 -m unittest discover -s tests/python"""
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import merge_moe  # noqa: E402

FUSED = [
    # speedup 10 / 5 = 2; limit = max(min(4.5, 4.0), 3.0) = 4.0 (ours faster); fused/limit 1.25
    dict(op="moe_ffn", backend="gpu", world_size=2, model="mixtral", m=4096, n=4096, k=14336, experts=8, topk=2,
         routing="uniform", dispatch="alltoall", dtype="bf16", t_fused_ms=5.0, t_layer0_ms=3.2, t_layer1_ms=1.9,
         t_grouped_ccfuse_ms=4.0, rel_err=3e-3, check="PASS", rows_per_rank=[8192, 8192]),
    # speedup 4.4 / 2.2 = 2; limit = max(min(1.8, 2.5), 2.0) = 2.0 (comm bound); fused/limit 1.1
    dict(op="moe_ffn", backend="gpu", world_size=2, model="qwen3", m=8192, n=2048, k=768, experts=128, topk=8,
         routing="zipf", dispatch="alltoall", dtype="bf16", t_fused_ms=2.2, t_layer0_ms=1.2, t_layer1_ms=1.0,
         t_grouped_ccfuse_ms=2.5, rel_err=4e-3, check="PASS", rows_per_rank=[120000, 11072]),
    # no serial record for this case
    dict(op="moe_ffn", backend="gpu", world_size=2, model="deepseek", m=4096, n=7168, k=2048, experts=256, topk=8,
         routing="uniform", dispatch="alltoall", dtype="bf16", t_fused_ms=3.0, t_layer0_ms=2.0, t_layer1_ms=1.0,
         t_grouped_ccfuse_ms=2.9, rel_err=0.5, check="FAIL", rows_per_rank=[32768, 32768]),
]
SERIAL = [
    dict(op="moe_layer_serial", world_size=2, model="mixtral", m=4096, routing="uniform", dispatch="alltoall",
         t_fused_ms=None, t_serial_ms=10.0, t_gemm_ms=4.5, t_comm_ms=3.0, t_limit_ms=4.5, check="PASS"),
    # the allgather record of the same case must not be taken
    dict(op="moe_layer_serial", world_size=2, model="mixtral", m=4096, routing="uniform", dispatch="allgather",
         t_fused_ms=None, t_serial_ms=99.0, t_gemm_ms=4.5, t_comm_ms=50.0, t_limit_ms=50.0, check="PASS"),
    dict(op="moe_layer_serial", world_size=2, model="qwen3", m=8192, routing="zipf", dispatch="alltoall",
         t_fused_ms=None, t_serial_ms=4.4, t_gemm_ms=1.8, t_comm_ms=2.0, t_limit_ms=2.0, check="FAIL"),
    # same model and tokens, other routing: no match for anything
    dict(op="moe_layer_serial", world_size=2, model="qwen3", m=8192, routing="uniform", dispatch="alltoall",
         t_fused_ms=None, t_serial_ms=7.0, t_gemm_ms=1.0, t_comm_ms=1.0, t_limit_ms=1.0, check="PASS"),
]


class MergeMoeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.fused = os.path.join(self.tmp.name, "fused.jsonl")
        self.serial = os.path.join(self.tmp.name, "serial.jsonl")
        self.out = os.path.join(self.tmp.name, "merged.jsonl")
        with open(self.fused, "w") as f:
            f.write("\n".join(json.dumps(r) for r in FUSED) + "\n\n")
        with open(self.serial, "w") as f:
            f.write("\n".join(json.dumps(r) for r in SERIAL) + "\n")

    def test_join_and_derived_columns(self):
        mix, qwen, ds = merge_moe.merge(FUSED, SERIAL)
        self.assertEqual(mix["t_serial_ms"], 10.0)  # alltoall, not allgather's 99
        self.assertEqual(mix["t_gemm_ms"], 4.5)
        self.assertEqual(mix["t_comm_ms"], 3.0)
        self.assertAlmostEqual(mix["t_limit_ms"], 4.0)  # our grouped GEMMs are the faster GEMM time
        self.assertAlmostEqual(mix["fused_over_limit"], 1.25)
        self.assertAlmostEqual(mix["speedup"], 2.0)
        self.assertEqual(mix["t_layer0_ms"], 3.2)  # the fused record's fields stay
        self.assertAlmostEqual(qwen["t_limit_ms"], 2.0)  # communication bound
        self.assertAlmostEqual(qwen["fused_over_limit"], 1.1)
        self.assertEqual(qwen["serial_check"], "FAIL")
        for k in ("t_serial_ms", "t_gemm_ms", "t_comm_ms", "t_limit_ms", "speedup", "fused_over_limit"):
            self.assertIsNone(ds[k])
        gm, n_speed, n_ok, n_ratio = merge_moe.summary([mix, qwen, ds])
        self.assertAlmostEqual(gm, 2.0)
        self.assertEqual((n_speed, n_ok, n_ratio), (2, 1, 2))

    def test_limit_without_our_gemm_time(self):
        r = merge_moe.merge_one(dict(FUSED[0], t_grouped_ccfuse_ms=None), SERIAL[0])
        self.assertAlmostEqual(r["t_limit_ms"], 4.5)
        self.assertAlmostEqual(r["fused_over_limit"], 5.0 / 4.5)

    def test_cli_table_and_out(self):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = merge_moe.main([self.fused, self.serial, "--out", self.out])
        self.assertEqual(rc, 0)
        text = buf.getvalue()
        lines = text.splitlines()
        self.assertTrue(lines[0].startswith("| model | tokens | routing | t_fused | t_serial |"))
        self.assertIn("| mixtral | 4096 | uniform | 5.000 | 10.000 | 4.500 | 4.000 | 3.000 | 4.000 | 1.25 | 2.00 |"
                      " 3.200 | 1.900 | - | - | PASS |", text)
        self.assertIn("PASS (serial FAIL)", text)
        self.assertIn("| deepseek | 4096 | uniform | 3.000 | - |", text)
        self.assertIn("geomean speedup (t_serial / t_fused): 2.000 over 2 cases (target >= 1.5: MET)", text)
        self.assertIn("fused/limit <= 1.1: 1 of 2 cases", text)
        self.assertIn("no serial alltoall record for: deepseek/4096/uniform", text)
        with open(self.out) as f:
            merged = [json.loads(line) for line in f]
        self.assertEqual(len(merged), 3)
        self.assertEqual(merged[0]["op"], "moe_ffn")
        self.assertEqual(merged[0]["rows_per_rank"], [8192, 8192])
        self.assertAlmostEqual(merged[1]["speedup"], 2.0)
        self.assertIsNone(merged[2]["speedup"])

    def test_geomean(self):
        self.assertIsNone(merge_moe.geomean([]))
        self.assertAlmostEqual(merge_moe.geomean([1.0, 4.0]), 2.0)
        self.assertTrue(math.isclose(merge_moe.geomean([2.0, None, 8.0]), 4.0))


if __name__ == "__main__":
    unittest.main()


class PerLayerOverlap(unittest.TestCase):
    def test_overlap_of_each_layer(self):
        fused = dict(FUSED[0], t_grouped0_ccfuse_ms=3.0, t_grouped1_ccfuse_ms=1.5, t_layer0_ms=3.1, t_layer1_ms=1.9)
        serial = dict(SERIAL[0], t_dispatch_ms=0.5, t_combine_ms=0.5)
        m = merge_moe.merge_one(fused, serial)
        # layer 0: serial 3.5, limit 3.0, fused 3.1 -> (3.5 - 3.1) / 0.5 = 0.8
        self.assertAlmostEqual(m["overlap_eff_layer0"], 0.8)
        # layer 1: serial 2.0, limit 1.5, fused 1.9 -> 0.2
        self.assertAlmostEqual(m["overlap_eff_layer1"], 0.2)

    def test_missing_per_layer_times_give_none(self):
        m = merge_moe.merge_one(FUSED[0], SERIAL[0])
        self.assertIsNone(m["overlap_eff_layer0"])
        self.assertIsNone(m["overlap_eff_layer1"])
        self.assertIn("| overlap L0 | overlap L1 |", merge_moe.table([m]))
