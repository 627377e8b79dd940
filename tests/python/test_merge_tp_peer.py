"""tools/merge_tp_peer.py: PyTorch async-TP records merged into ccfuse's TP records (t_peer_ms,
the in-process head-to-head fields, t_peer_scaled_ms), records without a peer left alone, and the
table printed. Run: python3 -m unittest discover -s tests/python"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import merge_tp_peer  # noqa: E402

KEY = {"world_size": 2, "dtype": "bf16"}
OURS = [
    dict(KEY, op="ag_gemm", m=8192, n=14336, k=8192, t_fused_ms=2.9, t_serial_ms=3.06, t_limit_ms=2.75,
         t_gemm_ms=2.75, t_peer_ms=None),
    dict(KEY, op="gemm_ar", m=1024, n=8192, k=28672, t_fused_ms=0.365, t_serial_ms=0.392, t_limit_ms=0.324,
         t_gemm_ms=0.324, t_peer_ms=None),
]
PEERS = [
    # the in-process head-to-head (ccfuse through the C ABI in the peer's rounds)
    dict(KEY, op="ag_gemm", m=8192, n=14336, k=8192, t_peer_ms=2.945, t_peer_mm_ms=2.5,
         peer="torch.ops.symm_mem", t_ccfuse_inproc_ms=2.8, rel_diff_vs_peer=0.0),
    # a peer record for a shape ccfuse did not run: ignored
    dict(KEY, op="gemm_rs", m=4096, n=4096, k=14336, t_peer_ms=0.59),
]


class MergeTpPeer(unittest.TestCase):
    def test_merges_matching_records_and_keeps_the_rest(self):
        with tempfile.TemporaryDirectory() as d:
            ours, peers = os.path.join(d, "ours.jsonl"), os.path.join(d, "peer.jsonl")
            with open(ours, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in OURS)
            with open(peers, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in PEERS)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                merge_tp_peer.main(ours, peers)
            with open(ours) as f:
                merged = [json.loads(line) for line in f]
        self.assertEqual(len(merged), 2)
        ag, ar = merged
        self.assertAlmostEqual(ag["t_peer_ms"], 2.945)
        self.assertEqual(ag["peer"], "torch.ops.symm_mem")
        self.assertAlmostEqual(ag["t_ccfuse_inproc_ms"], 2.8)
        self.assertEqual(ag["rel_diff_vs_peer"], 0.0)
        # async-TP at this run's clocks: its ratio to its own torch.mm times our cuBLAS time
        self.assertAlmostEqual(ag["t_peer_scaled_ms"], 2.945 / 2.5 * 2.75)
        self.assertIsNone(ar["t_peer_ms"])
        self.assertNotIn("t_peer_scaled_ms", ar)
        table = out.getvalue().splitlines()
        self.assertTrue(table[0].startswith("op"))
        self.assertIn("2.945", table[1])   # async-TP column
        self.assertIn("1.178", table[1])   # peer/mm
        self.assertTrue(table[2].rstrip().endswith("-"))  # gemm_ar: no peer


if __name__ == "__main__":
    unittest.main()
