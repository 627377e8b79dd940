#!/usr/bin/env python3
"""Joins the fused MoE FFN records (bench/moe_ffn_bench.cu, op "moe_ffn") with the serial PyTorch
baseline's (tools/torch_moe_layer_bench.py, op "moe_layer_serial", dispatch "alltoall") on
(model, m = tokens per rank, routing) and prints a Markdown table:

    python3 tools/merge_moe.py FUSED.jsonl SERIAL.jsonl [--out MERGED.jsonl]

Columns: t_fused, t_serial, t_gemm (torch's two grouped GEMMs + SwiGLU), t_grouped_ccfuse (our plain
grouped GEMMs on the same rows, no communication), t_comm (torch's dispatch + combine
all-to-alls), t_limit = max(min(t_gemm, t_grouped_ccfuse), t_comm), fused/limit (target <= 1.1),
speedup = t_serial / t_fused, the layer-0 / layer-1 times, each layer's overlap efficiency (our grouped
GEMM of the layer alone, t_grouped{0,1}_ccfuse, against the baseline's dispatch / combine all-to-all:
(gemm + comm - layer) / min(gemm, comm); "-" for records without the per-layer GEMM times) and the
check. Then the geometric mean of
the speedups (target >= 1.5) and how many cases meet fused/limit <= 1.1.
--out writes one line per fused record: the record plus t_serial_ms, t_gemm_ms, t_comm_ms,
t_limit_ms, speedup and fused_over_limit (null where the serial record is missing), and
serial_check (the baseline's check).
Standard library only (tests/python/test_merge_moe.py)."""
import argparse
import json
import math
import sys

LIMIT_TARGET = 1.1  # fused within 10 % of the limit
SPEEDUP_TARGET = 1.5  # geometric mean of t_serial / t_fused


def load(path):
    """The JSON records of a JSONL file (blank lines skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def key(r):
    return (r.get("model"), r.get("m"), r.get("routing"))


def _pos(x):
    """x when it is a positive number, else None (missing, null, negative = not measured)."""
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and math.isfinite(x) else None


def serial_index(records):
    """(model, m, routing) -> the last serial alltoall record of that case."""
    out = {}
    for r in records:
        if r.get("op", "moe_layer_serial") != "moe_layer_serial" or r.get("dispatch") != "alltoall":
            continue
        out[key(r)] = r
    return out


def merge_one(fused, serial):
    """The fused record plus the serial times and the derived columns (serial may be None)."""
    m = dict(fused)
    s = serial or {}
    t_fused = _pos(fused.get("t_fused_ms"))
    t_serial, t_gemm, t_comm = _pos(s.get("t_serial_ms")), _pos(s.get("t_gemm_ms")), _pos(s.get("t_comm_ms"))
    t_ours = _pos(fused.get("t_grouped_ccfuse_ms"))
    gemms = [t for t in (t_gemm, t_ours) if t is not None]
    t_limit = max(min(gemms), t_comm) if gemms and t_comm is not None else None
    m.update(t_serial_ms=t_serial, t_gemm_ms=t_gemm, t_comm_ms=t_comm, t_limit_ms=t_limit,
             speedup=t_serial / t_fused if t_serial and t_fused else None,
             fused_over_limit=t_fused / t_limit if t_fused and t_limit else None,
             serial_check=s.get("check"))
    # Per layer: our grouped GEMM of the layer alone with the baseline's all-to-all of that layer
    # (dispatch for layer 0, combine for layer 1): overlap = (serial - fused) / (serial - limit).
    for layer, comm in ((0, "t_dispatch_ms"), (1, "t_combine_ms")):
        m["overlap_eff_layer%d" % layer] = overlap(_pos(fused.get("t_grouped%d_ccfuse_ms" % layer)), _pos(s.get(comm)),
                                                   _pos(fused.get("t_layer%d_ms" % layer)))
    if serial is not None and serial.get("world_size") != fused.get("world_size"):
        m["notes_merge"] = "world sizes differ: fused %s, serial %s" % (fused.get("world_size"),
                                                                        serial.get("world_size"))
    return m


def overlap(t_gemm, t_comm, t_fused):
    """DESIGN §5 overlap efficiency of one layer, or None when a time is missing."""
    if t_gemm is None or t_comm is None or t_fused is None:
        return None
    serial, limit = t_gemm + t_comm, max(t_gemm, t_comm)
    return (serial - t_fused) / (serial - limit)


def merge(fused_records, serial_records):
    index = serial_index(serial_records)
    return [merge_one(r, index.get(key(r))) for r in fused_records if r.get("op", "moe_ffn") == "moe_ffn"]


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(merged):
    """(geometric mean of the speedups or None, cases with a speedup, cases meeting fused/limit <=
    1.1, cases with a fused/limit)."""
    speedups = [r["speedup"] for r in merged if r["speedup"]]
    ratios = [r["fused_over_limit"] for r in merged if r["fused_over_limit"]]
    return geomean(speedups), len(speedups), sum(1 for x in ratios if x <= LIMIT_TARGET + 1e-9), len(ratios)


def table(merged):
    def ms(x):
        return "%.3f" % x if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"

    def ratio(x, fmt="%.2f"):
        return fmt % x if x else "-"

    cols = ["model", "tokens", "routing", "t_fused", "t_serial", "t_gemm(torch)", "t_grouped_ccfuse", "t_comm",
            "t_limit", "fused/limit", "speedup", "layer0", "layer1", "overlap L0", "overlap L1", "check"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in merged:
        check = r.get("check", "-")
        if r.get("serial_check") and r["serial_check"] != "PASS":
            check += " (serial %s)" % r["serial_check"]
        lines.append("| " + " | ".join([
            str(r.get("model")), str(r.get("m")), str(r.get("routing")), ms(r.get("t_fused_ms")),
            ms(r["t_serial_ms"]), ms(r["t_gemm_ms"]), ms(r.get("t_grouped_ccfuse_ms")), ms(r["t_comm_ms"]),
            ms(r["t_limit_ms"]), ratio(r["fused_over_limit"]), ratio(r["speedup"]), ms(r.get("t_layer0_ms")),
            ms(r.get("t_layer1_ms")), ratio(r.get("overlap_eff_layer0")), ratio(r.get("overlap_eff_layer1")),
            check]) + " |")
    gm, n_speed, n_ok, n_ratio = summary(merged)
    lines.append("")
    lines.append("geomean speedup (t_serial / t_fused): %s over %d cases (target >= %.1f: %s)" % (
        "%.3f" % gm if gm else "-", n_speed, SPEEDUP_TARGET, "MET" if gm and gm >= SPEEDUP_TARGET else "NOT MET"))
    lines.append("fused/limit <= %.1f: %d of %d cases" % (LIMIT_TARGET, n_ok, n_ratio))
    missing = [r for r in merged if r["t_serial_ms"] is None]
    if missing:
        lines.append("no serial alltoall record for: " + ", ".join(
            "%s/%s/%s" % key(r) for r in missing))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("fused", help="JSONL of ccfuse_moe_ffn_bench (op moe_ffn)")
    p.add_argument("serial", help="JSONL of tools/torch_moe_layer_bench.py (op moe_layer_serial)")
    p.add_argument("--out", help="write the merged records here (JSONL)")
    args = p.parse_args(argv)
    merged = merge(load(args.fused), load(args.serial))
    print(table(merged))
    if args.out:
        with open(args.out, "w") as f:
            for r in merged:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
