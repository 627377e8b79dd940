"""tools/tile_trace.py on a hand-made trace (two CTAs, known phases)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import tile_trace  # noqa: E402

HEADER = "op,rank,cta,index,m_tile,n_tile,start_ns,mma_done_ns,addends_ready_ns,stored_ns\n"


class TileTraceTest(unittest.TestCase):
    def test_phases(self):
        rows = [
            # cta 0: two tiles, 100 us mainloop each, one with 10 us of addends, 5 us stores
            "gemm_rs,0,0,0,0,0,0,100000,100000,105000",
            "gemm_rs,0,0,1,1,0,105000,205000,215000,220000",
            # cta 1: one tile, starts 20 us late, ends at the span's end
            "gemm_rs,0,1,0,2,0,20000,200000,200000,220000",
        ]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.rank0.csv")
            with open(path, "w") as f:
                f.write(HEADER + "\n".join(rows) + "\n")
            s = tile_trace.summarise(tile_trace.load(path))
        self.assertEqual(s["ctas"], 2)
        self.assertEqual(s["tiles"], 3)
        self.assertAlmostEqual(s["span_us"], 220.0)
        self.assertAlmostEqual(s["mainloop_us"], (200.0 + 180.0) / 2)
        self.assertAlmostEqual(s["addends_us"], 10.0 / 2)
        self.assertAlmostEqual(s["store_us"], (10.0 + 20.0) / 2)
        self.assertAlmostEqual(s["gaps_us"], 220.0 - 190.0 - 5.0 - 15.0)
        self.assertAlmostEqual(s["late_start_us"], 10.0)
        self.assertAlmostEqual(s["early_end_us"], 0.0)

    def test_empty(self):
        self.assertIsNone(tile_trace.summarise([]))


if __name__ == "__main__":
    unittest.main()
