"""tools/summarize_gemm.py: the last record per problem by default, every record with --all (A/B
runs), and the steady (power-cap) geomean line where records have it.
Run: python3 -m unittest discover -s tests/python"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import summarize_gemm  # noqa: E402

BASE = {"op": "gemm", "dtype": "bf16", "b_layout": "nk", "sms": 132, "gpu_sms": 132}
RECORDS = [
    dict(BASE, m=8192, n=3072, k=4096, tflops=788.0, tflops_cublas=800.0, pct_of_cublas=98.5,
         pct_of_cublas_steady=97.6, config="block=128x192x64"),
    dict(BASE, m=8192, n=3072, k=4096, tflops=790.0, tflops_cublas=800.0, pct_of_cublas=98.75,
         pct_of_cublas_steady=101.2, config="block=128x256x64"),
    dict(BASE, m=1024, n=768, k=4096, tflops=300.0, tflops_cublas=400.0, pct_of_cublas=75.0),
]


class SummarizeGemmTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.path = os.path.join(self.tmp.name, "g.jsonl")
        with open(self.path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in RECORDS) + "\n")

    def run_main(self, *args):
        out = io.StringIO()
        argv = sys.argv
        sys.argv = ["summarize_gemm.py", *args, self.path]
        try:
            with contextlib.redirect_stdout(out):
                self.assertEqual(summarize_gemm.main(), 0)
        finally:
            sys.argv = argv
        return out.getvalue()

    def test_last_record_per_problem_or_all(self):
        self.assertEqual(len(summarize_gemm.load([self.path])), 2)
        kept = summarize_gemm.load([self.path], keep_all=True)
        self.assertEqual([r["config"] for r in kept[:2]], ["block=128x192x64", "block=128x256x64"])

    def test_table_and_means(self):
        out = self.run_main("--table", "--all")
        rows = [l for l in out.splitlines() if "x3072x4096 nk" in l]
        self.assertEqual(len(rows), 2)
        self.assertIn("97.6", rows[0])
        self.assertIn("block=128x256x64", rows[1])
        # a record without the steady figure prints "-" and is left out of the steady mean
        self.assertRegex(out, r"1024x768x4096 .* 75\.0 +- ")
        self.assertIn("geomean pct_of_cublas_steady 99.4% over 2 of them", out)
        self.assertIn("min 75.0% at 1024x768x4096", out)
        # by default the later record of a problem replaces the earlier
        out = self.run_main()
        self.assertIn("geomean pct_of_cublas_steady 101.2% over 1 of them", out)


if __name__ == "__main__":
    unittest.main()
