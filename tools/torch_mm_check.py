#!/usr/bin/env python3
"""ccfuse.torch_ops.mm on one GPU: checked against an fp64 reference and timed against torch.mm.

    python3 tools/torch_mm_check.py --ccfuse-lib build/libccfuse_c.so --json OUT.jsonl [--inject-fault]

For each case (the engine's config classes: wide tiles, ping-pong at small K, split-K / stream-K
one-wave shapes that need a workspace, B [K, N] and a Linear weight B [N, K], bf16 and fp16):
fresh random inputs, the output poisoned with NaN before the call, the result compared with an
fp64 product of the same inputs (the larger of the relative Frobenius error and the largest element
error over the largest reference element, tolerance 1e-2) and with torch.mm;
then ccfuse's mm and torch.mm timed interleaved (CUDA events, median of --iters rounds after
--warmup). Also: two streams at once (each call's split-K workspace from torch's allocator on
its own stream), and a call captured into a CUDA graph and replayed. One JSON record per case;
exit status 3 when a check fails (--inject-fault corrupts one output element of the first case:
the check must then fail).
"""
import argparse
import datetime
import json
import os
import statistics
import sys


CASES = [
    # name, m, n, k, b_is_weight, dtype
    ("wide_8192x8192x4096_kn", 8192, 8192, 4096, False, "bf16"),
    ("wide_8192x8192x4096_nk", 8192, 8192, 4096, True, "bf16"),
    ("pingpong_16384x4096x512_nk", 16384, 4096, 512, True, "bf16"),
    ("pingpong_16384x4096x1024_kn", 16384, 4096, 1024, False, "bf16"),
    ("onewave_1024x768x4096_nk", 1024, 768, 4096, True, "bf16"),
    ("onewave_1024x1280x8192_nk", 1024, 1280, 8192, True, "bf16"),
    ("fp16_4096x4096x4096_nk", 4096, 4096, 4096, True, "fp16"),
    ("ragged_1000x1032x520_kn", 1000, 1032, 520, False, "bf16"),
]


def rel_err(got, want):
    """The larger of the relative Frobenius error and the largest element error over the largest
    reference element: a single corrupted element must fail too (it hides in the norm)."""
    d = got.double() - want
    den, peak = want.norm(), want.abs().max()
    fro = float(d.norm() / den) if den > 0 else float(d.norm())
    worst = float(d.abs().max() / peak) if peak > 0 else float(d.abs().max())
    return max(fro, worst)


def time_interleaved(torch, runs, warmup, iters, lead_cycles=0):
    """Medians of CUDA-event times, the runs interleaved (order reversed every other round). With
    lead_cycles, the GPU spins that long before each start event, so that the host has enqueued
    the call by then and the events time the GPU's work, not the host's enqueue latency."""
    for _ in range(warmup):
        for r in runs:
            r()
    times = [[] for _ in runs]
    for it in range(iters):
        order = list(range(len(runs))) if it % 2 == 0 else list(reversed(range(len(runs))))
        for i in order:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if lead_cycles:
                torch.cuda._sleep(lead_cycles)
            s.record()
            runs[i]()
            e.record()
            e.synchronize()
            times[i].append(s.elapsed_time(e))
    return [statistics.median(t) for t in times]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ccfuse-lib", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--inject-fault", action="store_true")
    p.add_argument("--only", default="")
    args = p.parse_args()
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from ccfuse import torch_ops as cf  # noqa: E402
    from ccfuse._capi import Ccfuse  # noqa: E402
    cf._local_lib = Ccfuse(args.ccfuse_lib)
    tol = 1e-2
    gpu = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    failed = []
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
    with open(args.json, "a") as f:
        for ci, (name, m, n, k, weight, dt) in enumerate(CASES):
            if args.only and args.only not in name:
                continue
            dtype = torch.bfloat16 if dt == "bf16" else torch.float16
            a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
            b = torch.randn((n, k) if weight else (k, n), device="cuda", generator=gen).to(dtype)
            bm = b.t() if weight else b
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            got = cf.mm(a, b, out=out, b_is_weight=weight)
            torch.cuda.synchronize()
            if args.inject_fault and ci == 0:
                got.view(-1)[got.numel() // 2] += 1000.0
            want = a.double() @ bm.double()
            nonfinite = int((~torch.isfinite(got)).sum())
            err = rel_err(got, want) if nonfinite == 0 else float("inf")
            ref = torch.mm(a, bm)
            err_torch = rel_err(ref, want)
            # Two streams at once, and a graph replay, must give the same bits as the first call.
            s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
            torch.cuda.synchronize()
            with torch.cuda.stream(s1):
                c1 = cf.mm(a, b, b_is_weight=weight)
            with torch.cuda.stream(s2):
                c2 = cf.mm(a, b, b_is_weight=weight)
            torch.cuda.synchronize()
            streams_equal = bool(torch.equal(c1, got) and torch.equal(c2, got)) if not (args.inject_fault and ci == 0) \
                else bool(torch.equal(c1, c2))
            g = torch.cuda.CUDAGraph()
            gout = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            cs = torch.cuda.Stream()
            cs.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(cs):
                cf.mm(a, b, out=gout, b_is_weight=weight)  # warm (library state) outside the capture
            torch.cuda.current_stream().wait_stream(cs)
            gout.fill_(float("nan"))
            with torch.cuda.graph(g):
                cf.mm(a, b, out=gout, b_is_weight=weight)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            graph_equal = bool(torch.equal(gout, c1))
            runs = [lambda: cf.mm(a, b, out=out, b_is_weight=weight), lambda: torch.mm(a, bm, out=ref)]
            # Host-inclusive (what a lone call costs, enqueue latency included) and GPU time (after
            # a 200 us spin: what the kernels cost once a stream has work queued ahead of them).
            t_cf_host, t_torch_host = time_interleaved(torch, runs, args.warmup, args.iters)
            t_cf, t_torch = time_interleaved(torch, runs, args.warmup, args.iters, lead_cycles=400000)
            ok = err <= tol and streams_equal and graph_equal
            if not ok:
                failed.append(name)
            flops = 2.0 * m * n * k
            rec = dict(op="mm", source="ccfuse.torch_ops.mm", case=name, m=m, n=n, k=k, dtype=dt,
                       b_layout="nk" if weight else "kn", gpu=gpu, date=date, world_size=1,
                       commit=os.environ.get("CCFUSE_COMMIT", "unknown"), command=" ".join(sys.argv),
                       torch=torch.__version__, rel_err=err, rel_err_torch=err_torch, tol=tol,
                       nonfinite=nonfinite, streams_equal=streams_equal, graph_equal=graph_equal,
                       t_fused_ms=t_cf, t_torch_ms=t_torch, t_fused_host_ms=t_cf_host, t_torch_host_ms=t_torch_host,
                       timing="t_*_ms: GPU time (200 us spin before each start event); t_*_host_ms: without it",
                       tflops=flops / t_cf / 1e9,
                       tflops_torch=flops / t_torch / 1e9, pct_of_torch=100.0 * t_torch / t_cf,
                       check="PASS" if ok else "FAIL", inject_fault=bool(args.inject_fault and ci == 0))
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print("%-30s rel_err %.2e (torch %.2e) streams %s graph %s  GPU time: ccfuse %.4f torch.mm %.4f ms "
                  "%5.1f %%; with host: %.4f / %.4f ms  %s"
                  % (name, err, err_torch, streams_equal, graph_equal, t_cf, t_torch, rec["pct_of_torch"],
                     t_cf_host, t_torch_host, rec["check"]), flush=True)
    if failed:
        print("FAILED: " + " ".join(failed))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
