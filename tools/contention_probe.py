#!/usr/bin/env python3
"""Does NVLink traffic beside a GEMM slow the GEMM, and through what: the SM clock or the memory?

The fused TP ops' traces (docs/perf-notes.md, 2026-11-30) show the GEMM's mainloop 5-10 % slower
while partials or rows cross NVLink beside it, on the 0.3 ms shapes, also with no send warps
(`rsdirect`). Candidates: the GPU at its power cap lowering the SM clock when the links and HBM
draw more; or HBM / L2 contention from the incoming writes. This script separates them with
no ccfuse code at all: torch.mm (cuBLAS) of a TP shape's local GEMM runs back to back on both GPUs
of one process, and beside it, in turn:
  alone       nothing
  peer        one copy-engine copy of X bytes to the other GPU per GEMM, started with it (both
              GPUs: both directions, as in the fused ops); X = the fused op's bytes per rank
  local       the same bytes copied inside the GPU (the same HBM reads and writes, no link)
  peer_cont   one copy per GEMM of more bytes than the link moves in its time (the link always busy)
Per condition: the GEMM's median time (CUDA events around each), and the SM clock, power and
clock-event reasons sampled by nvidia-smi every 20 ms during it. If `peer` slows the GEMM with
the clock down by as much, the cost is power; with the clock unchanged, the memory system.

    python3 tools/contention_probe.py --json OUT.jsonl [--seconds 1.0] [--shape m,n,k,bytes]...
"""
import argparse
import json
import os
import statistics
import subprocess
import threading
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402

# Per-rank GEMMs of the TP set at W = 2 (m, n, k) and the bytes each rank sends per call
# (gemm_rs: half of its fp32->bf16 partial output; ag_gemm: its A rows).
DEFAULT_SHAPES = [
    (8192, 4096, 3072, 8192 * 4096 // 2 * 2),     # gemm_rs 8192x4096x6144
    (4096, 4096, 7168, 4096 * 4096 // 2 * 2),     # gemm_rs 4096x4096x14336
    (1024, 8192, 14336, 1024 * 8192 // 2 * 2),    # gemm_rs 1024x8192x28672
    (8192, 3072, 4096, 4096 * 4096 * 2),          # ag_gemm 8192x3072x4096
    (8192, 8192, 14336, 8192 * 8192 // 2 * 2),    # gemm_rs 8192x8192x28672 (a long GEMM: the control)
]


def parse_shape(text):
    m, n, k, b = (int(x) for x in text.split(","))
    return m, n, k, b


class Sampler:
    """nvidia-smi every 20 ms in the background: (wall time, gpu, sm clock MHz, power W, temp C, reasons)."""

    FIELDS = ["index", "clocks.sm", "power.draw", "temperature.gpu"]

    def __init__(self):
        self.rows = []
        self.reason_field = None
        for f in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
            r = subprocess.run(["nvidia-smi", f"--query-gpu={f}", "--format=csv,noheader"], capture_output=True,
                               text=True)
            if r.returncode == 0:
                self.reason_field = f
                break
        fields = self.FIELDS + ([self.reason_field] if self.reason_field else [])
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits",
                                      "-lms", "20"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.rows.append((time.time(), int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]),
                                  parts[4] if len(parts) > 4 else ""))
            except (ValueError, IndexError):
                pass

    def window(self, t0, t1, gpu):
        rows = [r for r in self.rows if t0 <= r[0] <= t1 and r[1] == gpu]
        if not rows:
            return {}
        reasons = sorted({r[5] for r in rows})
        return {"sm_mhz": statistics.median(r[2] for r in rows), "power_w": statistics.median(r[3] for r in rows),
                "temp_c": max(r[4] for r in rows), "reasons": reasons, "samples": len(rows)}

    def stop(self):
        self.proc.terminate()


def run_condition(cond, tensors, streams, side, iters):
    """Each GPU: iters mm's on its main stream, events around each; copies on its side stream
    (peer_cont: one ungated copy of tx_big per GEMM, more bytes than the link moves in one)."""
    ngpu = len(tensors)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
              for _ in range(ngpu)]
    starts = [[torch.cuda.Event() for _ in range(iters)] for _ in range(ngpu)]
    for g in range(ngpu):
        with torch.cuda.device(g):
            torch.cuda.synchronize()
    # Let the queues fill before the GPUs reach the first timed GEMM.
    for g in range(ngpu):
        with torch.cuda.device(g), torch.cuda.stream(streams[g]):
            torch.cuda._sleep(2_000_000)
    for i in range(iters):
        for g in range(ngpu):
            t = tensors[g]
            peer = (g + 1) % ngpu
            with torch.cuda.device(g):
                with torch.cuda.stream(streams[g]):
                    events[g][i][0].record()
                    starts[g][i].record()
                    torch.mm(t["a"], t["b"], out=t["c"])
                    events[g][i][1].record()
                if cond == "peer":
                    side[g].wait_event(starts[g][i])
                    with torch.cuda.stream(side[g]):
                        tensors[peer]["rx"].copy_(t["tx"], non_blocking=True)
                elif cond == "local":
                    side[g].wait_event(starts[g][i])
                    with torch.cuda.stream(side[g]):
                        t["rx_local"].copy_(t["tx"], non_blocking=True)
                elif cond == "peer_cont":
                    # One copy of n_cont x the bytes per GEMM, not n_cont copies: the host could not
                    # queue that many launches per GEMM (2026-12-01: the GPU idled between them).
                    with torch.cuda.stream(side[g]):
                        tensors[peer]["rx_big"].copy_(t["tx_big"], non_blocking=True)
    for g in range(ngpu):
        with torch.cuda.device(g):
            torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in events[g]) for g in range(ngpu)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--shape", type=parse_shape, action="append", help="m,n,k,bytes per GEMM")
    p.add_argument("--seconds", type=float, default=1.0, help="per condition and shape")
    p.add_argument("--rounds", type=int, default=2, help="the conditions in turn, this many times")
    args = p.parse_args()
    shapes = args.shape or DEFAULT_SHAPES
    ngpu = torch.cuda.device_count()
    if ngpu < 2:
        raise SystemExit("needs 2 GPUs")
    ngpu = 2
    for g in range(ngpu):
        for h in range(ngpu):
            if g != h and not torch.cuda.can_device_access_peer(g, h):
                raise SystemExit(f"GPU {g} cannot access GPU {h} directly")
    sampler = Sampler()
    streams = [torch.cuda.Stream(device=g) for g in range(ngpu)]
    side = [torch.cuda.Stream(device=g) for g in range(ngpu)]
    commit = os.environ.get("CCFUSE_COMMIT", "unknown")
    out = open(args.json, "a")
    rows = []
    for m, n, k, nbytes in shapes:
        tensors = []
        for g in range(ngpu):
            gen = torch.Generator(device=f"cuda:{g}").manual_seed(1234 + g)
            dev = torch.device(f"cuda:{g}")
            tensors.append({
                "a": torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen),
                "b": torch.randn(k, n, device=dev, dtype=torch.bfloat16, generator=gen),
                "c": torch.empty(m, n, device=dev, dtype=torch.bfloat16),
                "tx": torch.randn(nbytes // 2, device=dev, dtype=torch.bfloat16, generator=gen),
                "rx": torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16),
                "rx_local": torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16),
            })
        for g in range(ngpu):  # filled below, once the copy count per GEMM is known
            tensors[g]["tx_big"] = tensors[g]["rx_big"] = tensors[g]["tx"]
        # Iterations for ~seconds of GEMMs, from one timed warm-up.
        run_condition("alone", tensors, streams, side, 20)
        t_one = run_condition("alone", tensors, streams, side, 50)[0]
        iters = max(50, int(args.seconds * 1e3 / t_one))
        # Enough copies per GEMM to keep the link (~390 GB/s one way) busy through it.
        n_cont = max(1, int(1.2 * t_one * 1e-3 * 390e9 / nbytes + 0.999))
        for g in range(ngpu):
            dev = torch.device(f"cuda:{g}")
            tensors[g]["tx_big"] = torch.randn(n_cont * nbytes // 2, device=dev, dtype=torch.bfloat16)
            tensors[g]["rx_big"] = torch.empty(n_cont * nbytes // 2, device=dev, dtype=torch.bfloat16)
        results = {}
        for _ in range(args.rounds):
            for cond in ("alone", "peer", "local", "peer_cont"):
                t0 = time.time()
                ts = run_condition(cond, tensors, streams, side, iters)
                t1 = time.time()
                # The first 100 ms: the queue still filling and the clock settling.
                for g in range(ngpu):
                    results.setdefault((cond, g), []).append((ts[g], sampler.window(t0 + 0.1, t1, g)))
        for (cond, g), runs in sorted(results.items()):
            rec = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(g),
                   "commit": commit, "probe": "contention", "m": m, "n": n, "k": k, "bytes_per_gemm": nbytes,
                   "condition": cond, "device": g, "iters": iters,
                   "t_gemm_ms": statistics.median(r[0] for r in runs), "t_gemm_runs_ms": [r[0] for r in runs]}
            clocks = [r[1] for r in runs if r[1]]
            if clocks:
                rec["sm_mhz"] = statistics.median(c["sm_mhz"] for c in clocks)
                rec["power_w"] = statistics.median(c["power_w"] for c in clocks)
                rec["temp_c"] = max(c["temp_c"] for c in clocks)
                rec["reasons"] = sorted({x for c in clocks for x in c["reasons"]})
                rec["samples"] = sum(c["samples"] for c in clocks)
            out.write(json.dumps(rec) + "\n")
            out.flush()
            rows.append(rec)
        del tensors
        torch.cuda.empty_cache()
    sampler.stop()
    print(f"{'m x n x k':>18} {'cond':>9} gpu {'t_gemm':>8} {'vs alone':>8} {'MHz':>6} {'W':>5}  reasons")
    base = {(r["m"], r["n"], r["k"], r["device"]): r["t_gemm_ms"] for r in rows if r["condition"] == "alone"}
    for r in rows:
        b = base[(r["m"], r["n"], r["k"], r["device"])]
        print(f"{r['m']:>6}x{r['n']}x{r['k']:<6} {r['condition']:>9} {r['device']:>3} {r['t_gemm_ms']:8.4f} "
              f"{r['t_gemm_ms'] / b:8.3f} {r.get('sm_mhz', 0):6.0f} {r.get('power_w', 0):5.0f}  "
              f"{' '.join(r.get('reasons', []))}")


if __name__ == "__main__":
    main()
