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
        self.assertEqual(tile_trace.by_start([], 20), [])

    def test_bins_by_start_time(self):
        rows = [
            # rank 0, band of 2 row tiles: tiles 0-1 its own, tile 2 a peer's
            "gemm_rs,0,0,0,2,0,0,30000,30000,31000",        # bin 0, peer band
            "gemm_rs,0,1,0,3,0,5000,35000,35000,37000",     # bin 0, peer band
            "gemm_rs,0,0,1,0,0,31000,71000,75000,76000",    # bin 1 (20 us bins), own band
        ]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.rank0.csv")
            with open(path, "w") as f:
                f.write(HEADER + "\n".join(rows) + "\n")
            b = tile_trace.by_start(tile_trace.load(path), 20, band_tiles=2)
        self.assertEqual([x["start_us"] for x in b], [0, 20])
        self.assertEqual([x["tiles"] for x in b], [2, 1])
        self.assertEqual([x["own"] for x in b], [0, 1])
        self.assertAlmostEqual(b[0]["mainloop_us"], 30.0)
        self.assertAlmostEqual(b[0]["store_us"], 1.5)
        self.assertAlmostEqual(b[1]["mainloop_us"], 40.0)
        self.assertAlmostEqual(b[1]["addends_us"], 4.0)

    def test_stamps_split_the_op(self):
        rows = ["ag_gemm,0,0,0,0,0,1003000,1200000,1200000,1250000"]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.rank0.csv")
            with open(path, "w") as f:
                f.write(HEADER + "\n".join(rows) + "\n")
            with open(os.path.join(d, "t.rank0.stamps"), "w") as f:
                f.write("fused_begin_ns,fused_end_ns,engine_begin_ns,engine_end_ns\n"
                        "1000000,1254000,2000000,2240000\n")
            import contextlib
            import io
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(tile_trace.main([path]), 0)
        text = out.getvalue()
        self.assertIn("stamps: op 254.0 us", text)
        self.assertIn("engine GEMM 240.0 us", text)
        self.assertIn("before the first tile 3.0 us, tiles 247.0 us, after the last tile 4.0 us", text)


if __name__ == "__main__":
    unittest.main()
