#!/usr/bin/env python3
"""Summarizes `ccfuse bench --op gemm` records (JSON Lines, e.g. $OUT/gemm.jsonl).

  full-chip rows (sms == gpu_sms): geometric mean and minimum of pct_of_cublas (ccfuse
      throughput as a percentage of the best cuBLASLt algorithm), per B layout
  SM-budget rows (sms < gpu_sms): ccfuse TFLOP/s relative to the full-chip row of the same
      problem, against the share of SMs kept (sms / gpu_sms; 1.0 = throughput scales with SMs)
  --table: first one line per record: shape, layout, SMs, ccfuse and cuBLASLt TFLOP/s, %, and
      "% steady" (pct_of_cublas_steady: each alone, back to back, at the power cap;
      CCFUSE_BENCH_STEADY_MS) where the record has it
  records with pct_of_cublas_steady get its geometric mean and minimum too

A later record of the same (m, n, k, dtype, b_layout, sms) replaces an earlier one, except with
--all (A/B runs, tools/gpu_run.sh gemm_ab: each shape's default and variant rows in turn, both
in the table and the means).
Usage: python3 tools/summarize_gemm.py [--table] [--all] FILE.jsonl [FILE.jsonl ...]
"""
import argparse
import json
import math
import sys

DEFAULT_SMS = 132  # H200/H100 SXM, for records written before gpu_sms existed


def load(paths, keep_all=False):
    records = {}
    for path in paths:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"{path}:{lineno}: not JSON ({e}); skipped", file=sys.stderr)
                    continue
                if r.get("op") != "gemm":
                    continue
                r.setdefault("gpu_sms", DEFAULT_SMS)
                if r.get("sms") is None:
                    r["sms"] = r["gpu_sms"]
                r.setdefault("b_layout", "nk")
                records[(len(records),) if keep_all else key(r)] = r
    return list(records.values())


def key(r, sms=None):
    return (r["m"], r["n"], r["k"], r.get("dtype"), r.get("b_layout"), r["sms"] if sms is None else sms)


def shape(r):
    return f"{r['m']}x{r['n']}x{r['k']}"


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--table", action="store_true", help="print one line per record first")
    parser.add_argument("--all", action="store_true", help="keep every record (A/B runs), not the last per problem")
    args = parser.parse_args()
    records = load(args.files, args.all)
    if not records:
        print("no gemm records")
        return 1

    if args.table:
        print(f"{'m x n x k':>20} {'B':>2} {'dtype':>5} {'sms':>7} {'ccfuse':>8} {'cuBLASLt':>8} {'%':>6} "
              f"{'% steady':>8}  (TFLOP/s)  config")
        for r in records:
            print(f"{shape(r):>20} {r['b_layout']:>2} {r.get('dtype', '?'):>5} {str(r['sms']) + '/' + str(r['gpu_sms']):>7} "
                  f"{fmt(r.get('tflops')):>8} {fmt(r.get('tflops_cublas')):>8} {fmt(r.get('pct_of_cublas')):>6} "
                  f"{fmt(r.get('pct_of_cublas_steady')):>8}  {r.get('config', '')}")
        print()

    full = [r for r in records if r["sms"] >= r["gpu_sms"]]
    for layout in sorted({r["b_layout"] for r in full}, key=lambda l: (l != "nk", l)):  # nk (the main set) first
        rows = [r for r in full if r["b_layout"] == layout and r.get("pct_of_cublas")]
        if not rows:
            continue
        worst = min(rows, key=lambda r: r["pct_of_cublas"])
        print(f"geomean pct_of_cublas {geomean([r['pct_of_cublas'] for r in rows]):.1f}% over {len(rows)} full-chip "
              f"b_layout={layout} shapes; min {worst['pct_of_cublas']:.1f}% at {shape(worst)} "
              f"({fmt(worst.get('tflops'))} vs {fmt(worst.get('tflops_cublas'))} TFLOP/s)")
        steady = [r for r in rows if r.get("pct_of_cublas_steady")]
        if steady:
            worst = min(steady, key=lambda r: r["pct_of_cublas_steady"])
            print(f"geomean pct_of_cublas_steady {geomean([r['pct_of_cublas_steady'] for r in steady]):.1f}% over "
                  f"{len(steady)} of them (each alone, back to back, at the power cap); min "
                  f"{worst['pct_of_cublas_steady']:.1f}% at {shape(worst)}")

    by_key = {key(r): r for r in records}
    budget = [r for r in records if r["sms"] < r["gpu_sms"]]
    if budget:
        print()
        print("SM budget: ccfuse TFLOP/s relative to the full chip, against the share of SMs kept")
        print(f"{'m x n x k':>20} {'B':>2} {'sms':>7} {'TFLOP/s':>8} {'full':>8} {'ratio':>6} {'sms/all':>7} {'ratio/share':>11}")
        for r in sorted(budget, key=lambda r: (r["m"], r["n"], r["k"], r["b_layout"], -r["sms"])):
            ref = by_key.get(key(r, sms=r["gpu_sms"]))
            share = r["sms"] / r["gpu_sms"]
            ratio = r["tflops"] / ref["tflops"] if ref and ref.get("tflops") and r.get("tflops") else None
            print(f"{shape(r):>20} {r['b_layout']:>2} {str(r['sms']) + '/' + str(r['gpu_sms']):>7} "
                  f"{fmt(r.get('tflops')):>8} {fmt(ref.get('tflops') if ref else None):>8} {fmt(ratio, '.3f'):>6} "
                  f"{share:>7.3f} {fmt(ratio / share if ratio else None, '.3f'):>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
