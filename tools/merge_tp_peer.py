#!/usr/bin/env python3
"""Merges the PyTorch async-TP times (tools/torch_async_tp_bench.py) into the ccfuse TP records as
t_peer_ms (matched on op, world_size, m, n, k, dtype), rewriting the ccfuse JSONL in place, and
prints the DESIGN §5 table: ccfuse fused, serial, PyTorch async-TP, t_limit, speedup, overlap.

The peer runs in its own process, apart from the ccfuse rounds, and the GPUs' clocks drift with
temperature; when the peer record has t_peer_mm_ms (torch.mm of the same local GEMM, timed in the
peer's rounds), the table also shows peer/mm, to read against ccfuse's fused/t_gemm (both against
cuBLAS at their own run's clocks), and the record gets t_peer_scaled_ms = t_peer_ms / t_peer_mm_ms
* t_gemm_ms: async-TP at the ccfuse run's clocks."""
import json
import sys


def key(r):
    return (r.get("op"), r.get("world_size"), r.get("m"), r.get("n"), r.get("k"), r.get("dtype"))


def main(ccfuse_path, peer_path):
    peers = {}
    with open(peer_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                peers[key(r)] = r
    with open(ccfuse_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for r in records:
        p = peers.get(key(r))
        if p is not None:
            r["t_peer_ms"] = p["t_peer_ms"]
            r["peer"] = p.get("peer")
            for name in ("t_ccfuse_inproc_ms", "rel_diff_vs_peer"):  # the in-process head-to-head
                if p.get(name) is not None:
                    r[name] = p[name]
            if p.get("t_peer_mm_ms") and r.get("t_gemm_ms"):
                r["t_peer_mm_ms"] = p["t_peer_mm_ms"]
                r["t_peer_scaled_ms"] = p["t_peer_ms"] / p["t_peer_mm_ms"] * r["t_gemm_ms"]
    with open(ccfuse_path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")

    def fmt(x):
        return "%8.3f" % x if isinstance(x, (int, float)) and x >= 0 else "       -"

    print("%-8s %6s %6s %6s %8s %8s %8s %8s %7s %7s %10s %8s" % ("op", "m", "n", "k", "fused", "serial", "async-tp", "limit",
                                                                   "speedup", "overlap", "fused/gemm", "peer/mm"))
    for r in records:
        fused, serial, limit = r.get("t_fused_ms"), r.get("t_serial_ms"), r.get("t_limit_ms")
        speed = serial / fused if fused and serial else None
        overlap = (serial - fused) / (serial - limit) if fused and serial and limit and serial > limit else None
        gemm = r.get("t_gemm_ms")
        peer_mm = r["t_peer_ms"] / r["t_peer_mm_ms"] if r.get("t_peer_mm_ms") else None
        print("%-8s %6d %6d %6d %s %s %s %s %7s %7s %10s %8s" % (
            r["op"], r["m"], r["n"], r["k"], fmt(fused), fmt(serial), fmt(r.get("t_peer_ms")), fmt(limit),
            "%.3f" % speed if speed else "-", "%.2f" % overlap if overlap is not None else "-",
            "%.3f" % (fused / gemm) if fused and gemm else "-", "%.3f" % peer_mm if peer_mm else "-"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: merge_tp_peer.py CCFUSE.jsonl PEER.jsonl")
    main(sys.argv[1], sys.argv[2])
