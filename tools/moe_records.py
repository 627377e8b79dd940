#!/usr/bin/env python3
"""One line per record of ccfuse_moe_ffn_bench JSON (fused, each layer, our grouped GEMMs alone, ms).

    python3 tools/moe_records.py FILE.jsonl [FILE.jsonl ...]

The config column is the record's CCFUSE_MOE_DIAG variant (diagnostics) or "default"; a file's
name is printed before its lines when several are given (e.g. the variants of gpu_run.sh moe_ab).
"""
import json
import sys


def rows(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        cfg = r.get("config", "")
        d = cfg.split("DIAG=")[1].split("(")[0] if "DIAG=" in cfg else "default"
        out.append("%-9s %6s %-8s %-16s %8.3f %8.3f %8.3f %8.3f %8.3f %8s" % (
            r["model"], r.get("tokens_per_rank", r.get("m", "")), r.get("routing", ""), d, r["t_fused_ms"],
            r["t_layer0_ms"], r["t_layer1_ms"], r.get("t_grouped0_ccfuse_ms", 0), r.get("t_grouped1_ccfuse_ms", 0),
            r.get("check", "-")))
    return out


def main():
    print("%-9s %6s %-8s %-16s %8s %8s %8s %8s %8s %8s  (ms)" % (
        "model", "tokens", "routing", "config DIAG", "fused", "layer0", "layer1", "grp0", "grp1", "check"))
    for path in sys.argv[1:]:
        if len(sys.argv) > 2:
            print("# " + path)
        for line in rows(path):
            print(line)


if __name__ == "__main__":
    main()
