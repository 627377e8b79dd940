"""tools/tp_report.py: the derived columns (speedup, overlap efficiency, fused/limit), the verdict
rules, missing/null/negative times, the Markdown table, the JSON summary and the optional plot.
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
import tp_report  # noqa: E402

BASE = {"world_size": 2, "dtype": "bf16", "gpu": "NVIDIA H200", "commit": "abc1234"}
RECORDS = [
    # all rules met: speedup 1.2, overlap 0.5/0.6, fused/limit 2.5/2.4
    dict(BASE, op="ag_gemm", m=8192, n=14336, k=8192, date="2026-11-29T10:00:00Z",
         t_fused_ms=2.5, t_serial_ms=3.0, t_limit_ms=2.4, t_peer_ms=2.8),
    # no t_peer_ms key at all; overlap 0.14/0.17 passes but fused/limit 0.30/0.27 does not
    dict(BASE, op="gemm_rs", m=8192, n=4096, k=6144, date="2026-11-29T10:01:00Z",
         t_fused_ms=0.30, t_serial_ms=0.44, t_limit_ms=0.27),
    # null fused: still a row
    dict(BASE, op="gemm_ar", m=4096, n=4096, k=14336, date="2026-11-30T09:00:00Z", commit="def5678",
         t_fused_ms=None, t_serial_ms=0.456, t_limit_ms=0.310, t_peer_ms=None),
    # peer faster, overlap 0.02/0.16; M < 8192 so no limit rule
    dict(BASE, op="ag_gemm", m=4096, n=7168, k=4096, date="2026-11-29T10:02:00Z",
         t_fused_ms=0.40, t_serial_ms=0.42, t_limit_ms=0.26, t_peer_ms=0.35),
    # gemm_ar with K >= 4096: overlap 0.38/0.79 < 0.7; negative t_peer means "not measured"
    dict(BASE, op="gemm_ar", m=8192, n=8192, k=28672, date="2026-11-29T10:03:00Z",
         t_fused_ms=2.9, t_serial_ms=3.28, t_limit_ms=2.49, t_peer_ms=-1),
]


class TpReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        # two files, to check that records from several inputs are concatenated in order
        self.paths = [os.path.join(self.tmp.name, n) for n in ("a.jsonl", "b.jsonl")]
        for path, recs in zip(self.paths, (RECORDS[:2], RECORDS[2:])):
            with open(path, "w") as f:
                f.write("\n".join(json.dumps(r) for r in recs) + "\n\n")
        self.records = tp_report.load(self.paths)
        self.rows = tp_report.rows_of(self.records)

    def test_numbers_and_verdicts(self):
        self.assertEqual(len(self.rows), 5)
        ok, rs, null, slow, ar = self.rows
        self.assertAlmostEqual(ok["speedup"], 1.2)
        self.assertAlmostEqual(ok["overlap_eff"], 0.5 / 0.6)
        self.assertAlmostEqual(ok["fused_over_limit"], 2.5 / 2.4)
        self.assertEqual(ok["verdict"], "ok")
        self.assertIsNone(rs["t_peer_ms"])
        self.assertAlmostEqual(rs["speedup"], 0.44 / 0.30)
        self.assertAlmostEqual(rs["overlap_eff"], 0.14 / 0.17)
        self.assertEqual(rs["verdict"], "miss: >1.05·limit")
        self.assertIsNone(null["t_fused_ms"])
        self.assertIsNone(null["speedup"])
        self.assertIsNone(null["overlap_eff"])
        self.assertEqual(null["verdict"], "no fused op")
        self.assertAlmostEqual(slow["overlap_eff"], 0.125)
        self.assertEqual(slow["verdict"], "miss: >=async-TP, overlap<0.8")
        self.assertIsNone(ar["t_peer_ms"])
        self.assertAlmostEqual(ar["overlap_eff"], 0.38 / 0.79)
        self.assertEqual(ar["verdict"], "miss: overlap<0.7")

    def test_edge_rules(self):
        # serial not above limit: overlap undefined, so the overlap rule is missed
        r = tp_report.compute(dict(op="ag_gemm", m=1024, k=1024, t_fused_ms=1.0, t_serial_ms=2.0,
                                   t_limit_ms=2.0))
        self.assertIsNone(r["overlap_eff"])
        self.assertEqual(r["verdict"], "miss: overlap n/a")
        # gemm_ar with small K needs only fused < serial
        r = tp_report.compute(dict(op="gemm_ar", m=8192, k=2048, t_fused_ms=1.0, t_serial_ms=1.1,
                                   t_limit_ms=0.2))
        self.assertEqual(r["verdict"], "ok")
        r = tp_report.compute(dict(op="gemm_ar", m=8192, k=2048, t_fused_ms=1.2, t_serial_ms=1.1))
        self.assertEqual(r["verdict"], "miss: >=serial")
        # the CPU reference world's thread times are not judged
        r = tp_report.compute(dict(op="gemm_ar", m=8192, k=2048, t_fused_ms=1.2, t_serial_ms=1.1, backend="cpu"))
        self.assertEqual(r["verdict"], "cpu reference world: not judged")

    def test_table(self):
        md = tp_report.table(self.rows, self.records)
        lines = md.splitlines()
        self.assertEqual(lines[0], "dates: 2026-11-29, 2026-11-30; gpus: NVIDIA H200; "
                                   "commits: abc1234, def5678")
        self.assertTrue(lines[2].startswith("| op | W | M | N | K | ccfuse fused (ms) |"))
        self.assertEqual(len(lines), 4 + 5)
        self.assertEqual(lines[4], "| ag_gemm | 2 | 8192 | 14336 | 8192 | 2.500 | 3.000 | 2.800 | - | - | "
                                   "2.400 | 1.042 | 1.20 | 0.83 | ok |")
        self.assertEqual(lines[6], "| gemm_ar | 2 | 4096 | 4096 | 14336 | - | 0.456 | - | - | - | 0.310 | "
                                   "- | - | - | no fused op |")
        self.assertIn("| 0.300 | 0.440 | - | - | - | 0.270 | 1.111 | 1.47 | 0.82 | miss: >1.05·limit |",
                      lines[5])
        # async-TP scaled to this run's clocks (merge_tp_peer.py) gets its own column
        r = tp_report.compute(dict(op="ag_gemm", m=8192, k=8192, t_fused_ms=2.9, t_serial_ms=3.1,
                                   t_limit_ms=2.8, t_peer_ms=2.85, t_peer_scaled_ms=3.2))
        self.assertIn("| 2.900 | 3.100 | 2.850 | 3.200 | - | 2.800 |", tp_report.table([r]))
        # ... and ours against async-TP in one process: its ratio decides the rule when present
        # (here the raw cross-process time says async-TP is faster, the same rounds say not)
        r = tp_report.compute(dict(op="ag_gemm", m=8192, k=8192, t_fused_ms=2.9, t_serial_ms=3.5,
                                   t_limit_ms=2.8, t_peer_ms=2.85, t_ccfuse_inproc_ms=2.565))
        self.assertAlmostEqual(r["inproc_over_peer"], 0.9)
        self.assertEqual(r["verdict"], "ok")
        self.assertIn("| 2.850 | - | 0.900 | 2.800 |", tp_report.table([r]))
        r = tp_report.compute(dict(op="gemm_rs", m=1024, k=8192, t_fused_ms=0.30, t_serial_ms=0.50,
                                   t_limit_ms=0.29, t_peer_ms=0.35, t_ccfuse_inproc_ms=0.35))
        self.assertEqual(r["verdict"], "miss: >=async-TP (1 proc)")

    def test_steady_table(self):
        # none of the records has steady times: no second table
        self.assertEqual(tp_report.steady_table(self.records), "")
        rec = dict(RECORDS[1], steady_ms=300, t_fused_steady_ms=0.36, t_serial_steady_ms=0.45,
                   t_gemm_steady_ms=0.30, t_gemm_ccfuse_steady_ms=0.33, t_gemm_ms=0.26, t_gemm_ccfuse_ms=0.26)
        md = tp_report.steady_table(self.records + [rec])
        lines = md.strip().splitlines()
        self.assertIn("for 300 ms", lines[0])
        self.assertTrue(lines[2].startswith("| op | M | N | K | ccfuse fused (ms) |"))
        self.assertEqual(len(lines), 5)  # title, blank, header, rule, one row
        self.assertEqual(lines[4], "| gemm_rs | 8192 | 4096 | 6144 | 0.360 | 0.450 | 0.300 | 0.330 | 0.800 | "
                                   "1.200 | 1.100 | 1.000 |")
        # a missing part prints "-" and its ratios too
        rec2 = dict(rec, t_gemm_ccfuse_steady_ms=None)
        self.assertIn("| 0.300 | - | 0.800 | 1.200 | - | 1.000 |", tp_report.steady_table([rec2]))

    def test_main_outputs(self):
        md_path = os.path.join(self.tmp.name, "r.md")
        js_path = os.path.join(self.tmp.name, "r.json")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(tp_report.main(self.paths + ["--md", md_path,
                                                          "--json-summary", js_path]), 0)
        self.assertEqual(out.getvalue(), "")
        with open(md_path) as f:
            self.assertEqual(f.read(), tp_report.table(self.rows, self.records))
        with open(js_path) as f:
            summary = json.load(f)
        self.assertEqual([r["verdict"] for r in summary],
                         ["ok", "miss: >1.05·limit", "no fused op",
                          "miss: >=async-TP, overlap<0.8", "miss: overlap<0.7"])
        self.assertAlmostEqual(summary[0]["speedup"], 1.2)

    def test_plot_written_or_skipped(self):
        for name, log in (("p.png", False), ("p.svg", True)):
            path = os.path.join(self.tmp.name, name)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                written = tp_report.plot(self.rows, path, log=log)
            if written:
                self.assertGreater(os.path.getsize(path), 0)
            else:
                self.assertFalse(os.path.exists(path))
                self.assertIn("skipping the plot", err.getvalue())
                self.assertEqual(err.getvalue().count("\n"), 1)


if __name__ == "__main__":
    unittest.main()
