#!/usr/bin/env python3
"""Summarises per-tile GEMM traces (CCFUSE_TILE_TRACE=PREFIX ccfuse bench ... writes
PREFIX.rank<r>.csv; see gemm::TileTrace in include/ccfuse/gemm/gemm.h).

    python3 tools/tile_trace.py [--band-tiles N] [--bins US] PREFIX.rank0.csv [PREFIX.rank1.csv ...]

Per rank: the kernel span (first tile start to last tile stored, over all CTAs), and per CTA on
average the time in each phase of its tiles: mainloop (start -> mma_done: TMA waits, ready
waits and wgmma), addends (mma_done -> addends_ready: waiting for and adding peer partials),
store (addends_ready -> stored: the epilogue stores and the hand-over to the send warps), and
the gaps (span minus the three). With PREFIX.rank<r>.stamps beside a CSV (globaltimer
stamps around the op and around the engine's GEMM, written by the same bench): the op's and the
engine's times in that clock, and the last run's time before its first tile and after its last. With --band-tiles N (128-row tiles per rank's band, M / W / 128),
also the median mainloop of the rank's own-band tiles against the other bands' tiles, and of the
first wave (one tile per CTA) of the other bands: a wait for remote rows would show there. With
--bins US, the tiles grouped by start time: which waves run slow (e.g. while partials are forwarded).
Standard library only."""
import csv
import os
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [{k: (v if k == "op" else int(v)) for k, v in row.items()} for row in csv.DictReader(f)]


def summarise(rows):
    if not rows:
        return None
    t0 = min(r["start_ns"] for r in rows)
    t1 = max(r["stored_ns"] for r in rows)
    span = t1 - t0
    per_cta = defaultdict(lambda: [0, 0, 0, 0, None, None])  # main, addends, store, tiles, first, last
    for r in rows:
        c = per_cta[r["cta"]]
        c[0] += r["mma_done_ns"] - r["start_ns"]
        c[1] += r["addends_ready_ns"] - r["mma_done_ns"]
        c[2] += r["stored_ns"] - r["addends_ready_ns"]
        c[3] += 1
        c[4] = r["start_ns"] if c[4] is None else min(c[4], r["start_ns"])
        c[5] = r["stored_ns"] if c[5] is None else max(c[5], r["stored_ns"])
    n = len(per_cta)
    avg = [sum(c[i] for c in per_cta.values()) / n for i in range(4)]
    late_start = sum(c[4] - t0 for c in per_cta.values()) / n
    early_end = sum(t1 - c[5] for c in per_cta.values()) / n
    return {"ctas": n, "tiles": len(rows), "span_us": span / 1e3, "mainloop_us": avg[0] / 1e3,
            "addends_us": avg[1] / 1e3, "store_us": avg[2] / 1e3, "tiles_per_cta": avg[3],
            "gaps_us": (span - avg[0] - avg[1] - avg[2]) / 1e3, "late_start_us": late_start / 1e3,
            "early_end_us": early_end / 1e3}


def bands(rows, band_tiles):
    """Median mainloop (us) of own-band tiles, other-band tiles, and the first wave of the others."""
    ml = lambda rs: statistics.median(r["mma_done_ns"] - r["start_ns"] for r in rs) / 1e3 if rs else float("nan")
    own = [r for r in rows if r["m_tile"] // band_tiles == r["rank"]]
    other = sorted((r for r in rows if r["m_tile"] // band_tiles != r["rank"]), key=lambda r: r["start_ns"])
    ctas = len({r["cta"] for r in rows})
    return ml(own), ml(other), ml(other[:ctas]), len(own), len(other)


def by_start(rows, bin_us, band_tiles=0):
    """Tiles grouped by start time (bins of bin_us from the first start): per bin the tile count,
    the own-band count (with band_tiles), and the mean mainloop, addends and store in us."""
    if not rows:
        return []
    t0 = min(r["start_ns"] for r in rows)
    bins = defaultdict(list)
    for r in rows:
        bins[int((r["start_ns"] - t0) // (bin_us * 1000))].append(r)
    out = []
    for b in sorted(bins):
        rs = bins[b]
        n = len(rs)
        mean = lambda a, z: sum(r[z] - r[a] for r in rs) / n / 1e3
        own = sum(1 for r in rs if band_tiles > 0 and r["m_tile"] // band_tiles == r["rank"])
        out.append({"start_us": b * bin_us, "tiles": n, "own": own, "mainloop_us": mean("start_ns", "mma_done_ns"),
                    "addends_us": mean("mma_done_ns", "addends_ready_ns"), "store_us": mean("addends_ready_ns", "stored_ns")})
    return out


def main(args):
    band_tiles = 0
    bin_us = 0.0
    while len(args) >= 2 and args[0] in ("--band-tiles", "--bins"):
        if args[0] == "--band-tiles":
            band_tiles = int(args[1])
        else:
            bin_us = float(args[1])
        args = args[2:]
    paths = args
    if not paths:
        print(__doc__)
        return 2
    for path in paths:
        rows = load(path)
        s = summarise(rows)
        if s is None:
            print(f"{path}: no records")
            continue
        span = s["span_us"]
        pct = lambda v: f"{100.0 * v / span:5.1f}%" if span > 0 else "  -"
        print(f"{path}: {s['ctas']} CTAs, {s['tiles']} tiles ({s['tiles_per_cta']:.1f} per CTA), span {span:.1f} us")
        for key in ("mainloop_us", "addends_us", "store_us", "gaps_us", "late_start_us", "early_end_us"):
            print(f"  {key[:-3]:<12} {s[key]:9.1f} us  {pct(s[key])} of the span (per-CTA average)")
        stamps_path = path[:-4] + ".stamps" if path.endswith(".csv") else None
        if stamps_path and os.path.exists(stamps_path):
            st = load(stamps_path)
            t0 = min(r["start_ns"] for r in rows)
            t1 = max(r["stored_ns"] for r in rows)
            fused = [(r["fused_end_ns"] - r["fused_begin_ns"]) / 1e3 for r in st]
            engine = [(r["engine_end_ns"] - r["engine_begin_ns"]) / 1e3 for r in st]
            last = st[-1]
            print(f"  stamps: op {statistics.median(fused):.1f} us (runs {', '.join(f'{v:.1f}' for v in fused)}), "
                  f"engine GEMM {statistics.median(engine):.1f} us (runs {', '.join(f'{v:.1f}' for v in engine)})")
            print(f"  last run: before the first tile {(t0 - last['fused_begin_ns']) / 1e3:.1f} us, tiles "
                  f"{(t1 - t0) / 1e3:.1f} us, after the last tile {(last['fused_end_ns'] - t1) / 1e3:.1f} us")
        if bin_us > 0:
            print(f"  by start time (bins of {bin_us:g} us): start, tiles, own-band tiles, mean mainloop / addends / store (us)")
            for b in by_start(rows, bin_us, band_tiles):
                print(f"    {b['start_us']:7.0f} {b['tiles']:5d} {b['own']:5d}   {b['mainloop_us']:6.1f} {b['addends_us']:6.1f} "
                      f"{b['store_us']:6.1f}")
        if band_tiles > 0:
            own, other, first, n_own, n_other = bands(rows, band_tiles)
            print(f"  mainloop median: own band {own:.1f} us ({n_own} tiles), other bands {other:.1f} us "
                  f"({n_other} tiles), their first wave {first:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
