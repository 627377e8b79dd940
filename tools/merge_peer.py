#!/usr/bin/env python3
"""Merges torch._grouped_mm times (tools/torch_grouped_bench.py) into ccfuse's grouped_gemm records
and prints the comparison table.

    python3 tools/merge_peer.py CCFUSE.jsonl TORCH.jsonl [--out MERGED.jsonl] [--table]

Records match on (op, experts, topk, tokens_per_rank, n, k, routing, b_layout, dtype). Each matched
ccfuse record gets `t_torch_grouped_mm_ms` and `tflops_torch`, and its baseline fields are recomputed
against the best of (cuBLAS grouped = t_gemm_ms as the tool measured it, torch): `t_gemm_ms`,
`tflops_baseline`, `baseline`, `pct_of_baseline` (ccfuse throughput as a % of the best);
`t_cublas_grouped_ms` keeps the cuBLAS time.

Each ratio in the same clocks: where the torch record was made with --ccfuse-lib (ccfuse's grouped
GEMM timed interleaved with torch in torch's process), `pct_of_baseline_interleaved` = the lower of
ccfuse vs cuBLAS grouped (interleaved in ccfuse's bench) and ccfuse vs torch (interleaved in torch's
bench), and `baseline_interleaved` names which; `pct_of_baseline` compares times from different
processes (torch's first case runs at a cooler GPU's clocks). Standard library only.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_grouped  # noqa: E402


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def case_names():
    return {moe_grouped.case_key(dict(op="grouped_gemm", experts=c["experts"], topk=c["topk"],
                                      tokens_per_rank=c["tokens"], n=c["n"], k=c["k"], routing=c["routing"],
                                      b_layout=c["b_layout"], dtype="bf16")): c["name"]
            for c in moe_grouped.cases()}


def merge(ccfuse, torch_recs):
    torch_by_key = {}
    for r in torch_recs:
        if r.get("t_torch_ms"):
            torch_by_key[moe_grouped.case_key(r)] = r
    out = []
    for r in ccfuse:
        r = dict(r)
        if r.get("op") == "grouped_gemm":
            flops = 2.0 * r["m"] * r["n"] * r["k"]
            t_cublas = r.get("t_cublas_grouped_ms", r.get("t_gemm_ms") if r.get("baseline") == "cublas_grouped" else None)
            r["t_cublas_grouped_ms"] = t_cublas
            t = torch_by_key.get(moe_grouped.case_key(r))
            if t is not None:
                if t.get("group_rows") and r.get("group_rows") and t["group_rows"] != r["group_rows"]:
                    raise SystemExit("rows per expert differ between ccfuse and torch for %s" % (moe_grouped.case_key(r),))
                r["t_torch_grouped_mm_ms"] = t["t_torch_ms"]
                r["tflops_torch"] = flops / (t["t_torch_ms"] * 1e9)
                for f in ("t_torch_interleaved_ms", "t_ccfuse_interleaved_ms", "pct_ccfuse_of_torch_interleaved",
                          "rel_err_ccfuse_vs_torch"):
                    if t.get(f) is not None:
                        r[f] = t[f]
            options = [(v, name) for v, name in ((t_cublas, "cublas_grouped"),
                                                 (r.get("t_torch_grouped_mm_ms"), "torch_grouped_mm")) if v]
            if options:
                best, name = min(options)
                r["t_gemm_ms"] = best
                r["baseline"] = name
                r["tflops_baseline"] = flops / (best * 1e9)
                if r.get("t_fused_ms"):
                    r["pct_of_baseline"] = 100.0 * best / r["t_fused_ms"]
            same_clock = [(p, name) for p, name in (
                (100.0 * t_cublas / r["t_fused_ms"] if t_cublas and r.get("t_fused_ms") else None, "cublas_grouped"),
                (r.get("pct_ccfuse_of_torch_interleaved"), "torch_grouped_mm")) if p]
            if len(same_clock) == 2:
                r["pct_of_baseline_interleaved"], r["baseline_interleaved"] = min(same_clock)
        out.append(r)
    return out


def table(recs):
    names = case_names()
    lines = ["%-20s %-10s %7s %9s %9s %9s %8s %9s %9s %8s" % (
        "shape", "routing", "rows", "ccfuse", "cublas_g", "torch", "pct_best", "ccfuse_il", "torch_il", "pct_il"),
             "%-20s %-10s %7s %9s %9s %9s %8s %9s %9s %8s" % (
        "", "", "", "TFLOP/s", "TFLOP/s", "TFLOP/s", "%", "TFLOP/s", "TFLOP/s", "%")]
    pcts, pcts_il, mixtral, variant = [], [], [], []
    fmt = lambda v: "-" if v is None else "%.1f" % v  # noqa: E731
    for r in recs:
        if r.get("op") != "grouped_gemm":
            continue
        flops = 2.0 * r["m"] * r["n"] * r["k"]
        tf = lambda ms: flops / (ms * 1e9) if ms else None  # noqa: E731
        name = names.get(moe_grouped.case_key(r), "E%d-n%d-k%d" % (r["experts"], r["n"], r["k"]))
        pct, pct_il = r.get("pct_of_baseline"), r.get("pct_of_baseline_interleaved")
        lines.append("%-20s %-10s %7d %9s %9s %9s %8s %9s %9s %8s" % (
            name, r["routing"], r["m"], fmt(tf(r.get("t_fused_ms"))), fmt(tf(r.get("t_cublas_grouped_ms"))),
            fmt(tf(r.get("t_torch_grouped_mm_ms"))), fmt(pct), fmt(tf(r.get("t_ccfuse_interleaved_ms"))),
            fmt(tf(r.get("t_torch_interleaved_ms"))), fmt(pct_il)))
        if pct:
            pcts.append(pct)
        if pct_il:
            pcts_il.append(pct_il)
        if r.get("t_variant_ms") and r.get("t_fused_ms"):
            # An A/B variant timed in the same interleaved rounds as the engine's config.
            variant.append((name, r["routing"], r["t_fused_ms"] / r["t_variant_ms"], r.get("variant_config", "")))
        if name.startswith("mixtral") and r.get("t_fused_ms"):
            mixtral.append(tf(r["t_fused_ms"]))
    geo = lambda v: math.exp(sum(math.log(p) for p in v) / len(v)) if v else float("nan")  # noqa: E731
    lines.append("geomean pct of best baseline: %.1f%% over %d cases; Mixtral ccfuse TFLOP/s: %s" %
                 (geo(pcts), len(pcts), " ".join("%.0f" % v for v in mixtral) or "-"))
    if pcts_il:
        lines.append("same-clock pct of best baseline (each interleaved with ccfuse): geomean %.1f%%, min %.1f%% "
                     "over %d cases" % (geo(pcts_il), min(pcts_il), len(pcts_il)))
    if variant:
        lines.append("variant against the engine's config, same rounds (speed ratio: t_engine / t_variant):")
        for name, routing, ratio, cfg in variant:
            lines.append("  %-20s %-10s %6.3f  %s" % (name, routing, ratio, cfg))
        ratios = [v[2] for v in variant]
        lines.append("variant speed ratio: geomean %.3f, min %.3f, max %.3f over %d cases" % (
            geo(ratios), min(ratios), max(ratios), len(ratios)))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ccfuse")
    p.add_argument("torch")
    p.add_argument("--out", default="")
    p.add_argument("--table", action="store_true")
    args = p.parse_args()
    torch_recs = read(args.torch) if os.path.exists(args.torch) else []
    merged = merge(read(args.ccfuse), torch_recs)
    if args.out:
        with open(args.out, "w") as f:
            for r in merged:
                f.write(json.dumps(r) + "\n")
    if args.table:
        print(table(merged))


if __name__ == "__main__":
    main()
