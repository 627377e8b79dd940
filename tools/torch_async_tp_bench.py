#!/usr/bin/env python3
"""The peer baseline of the TP ops: PyTorch async-TP on the same shapes and GPUs (DESIGN §5).

Times torch.ops.symm_mem.fused_all_gather_matmul (ag_gemm) and fused_matmul_reduce_scatter
(gemm_rs) with CUDA events (warm-up, median of --iters, a barrier before each run) and appends
one JSON line per (op, shape) from rank 0: {op, world_size, m, n, k, dtype, t_peer_ms,
t_peer_mm_ms, peer}. t_peer_mm_ms is torch.mm of the same local GEMM (cuBLAS), timed in the same
rounds, one run of each in turn: this process runs apart from the ccfuse bench, and the H200's
clocks drift with temperature (up to 20 %), so t_peer_ms / t_peer_mm_ms is the figure that
compares across the two runs (tools/merge_tp_peer.py scales it to the ccfuse run's cuBLAS time).
Shapes follow the ccfuse tool: ag_gemm A_r [M/W, K], B [K, N]; gemm_rs A_r [M, K/W], B [K/W, N]
(--k is the global K). Run one process per GPU:

    python3 -m torch.distributed.run --nproc-per-node 2 tools/torch_async_tp_bench.py \\
        --json OUT.jsonl --shape ag_gemm,8192,14336,8192 --shape gemm_rs,8192,8192,28672

With --ccfuse-lib PATH (libccfuse_c.so, include/ccfuse/c_api.h), ccfuse's fused op runs in this
process on the same tensors and is timed in the same rounds as async-TP and torch.mm: the record
gets t_ccfuse_inproc_ms and rel_diff_vs_peer (||ours - async-TP|| / ||async-TP|| on this rank's
output), the head-to-head that does not depend on two processes' clocks.

With --steady-ms N, each op (async-TP, torch.mm, ccfuse, and serial NCCL + torch.mm) also runs
back to back for ~N ms, alone, two rounds in opposite orders: the GPU at its 700 W power cap, as
in a training step (t_*_steady_ms, and the SM clock and power sampled by nvidia-smi on rank 0).

NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set here if unset).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_shape(text):
    op, m, n, k = text.split(",")
    if op not in ("ag_gemm", "gemm_rs"):
        raise argparse.ArgumentTypeError("op must be ag_gemm or gemm_rs (PyTorch has no fused all-reduce matmul)")
    return op, int(m), int(n), int(k)


def time_ms(fns, iters, warmup, group, lead_us=0):
    """Medians of each of fns, timed in the same rounds (one run of each per round, in turn).

    lead_us > 0: the GPU spins that long (torch.cuda._sleep, ~2000 cycles a microsecond at the
    H200's 1.98 GHz) before each start event, so that the run's launches are queued before the
    GPU reaches the event: the events measure GPU time, not the host's enqueue latency (the
    ccfuse bench does the same, CCFUSE_BENCH_LEAD_US)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = [[] for _ in fns]
    for i in range(warmup + iters):
        for fn, t in zip(fns, times):
            dist.barrier(group=group)
            if lead_us > 0:
                torch.cuda._sleep(int(lead_us * 2000))
            start.record()
            fn()
            end.record()
            end.synchronize()
            if i >= warmup:
                t.append(start.elapsed_time(end))
    return [statistics.median(t) for t in times]


def time_steady_ms(fns, steady_ms, est_ms, rounds, group, sampler=None):
    """Each of fns back to back for ~steady_ms (a steady state: the GPU at its power cap, as in a
    training step's layers), CUDA events between the calls, in turn for `rounds` rounds (every other
    one in reverse order); medians of the per-call times. est_ms: each fn's time from the
    interleaved rounds, the same on every rank (sets the call count: each call is a collective).
    With a sampler (rank 0), the median SM clock and power during each fn's runs as well."""
    times = [[] for _ in fns]
    clocks = [[] for _ in fns]
    for rnd in range(rounds):
        # Every other round in reverse order: the GPU warms over the rounds (a warmer GPU reaches a
        # lower clock at the same power), which would otherwise favour the first fns.
        for j in (range(len(fns)) if rnd % 2 == 0 else reversed(range(len(fns)))):
            fn = fns[j]
            n = max(20, int(steady_ms / max(est_ms[j], 1e-3)))
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            dist.barrier(group=group)
            torch.cuda.synchronize()
            torch.cuda._sleep(20_000_000)  # ~10 ms: the queue fills before the GPU reaches the first call
            t0 = time.time()
            ev[0].record()
            for i in range(n):
                fn()
                ev[i + 1].record()
            torch.cuda.synchronize()
            t1 = time.time()
            per_call = [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]
            times[j].append(statistics.median(per_call[n // 10:]))  # the first tenth: clocks settling
            if sampler is not None:
                # The run's GPU time is its last (t1 - t0) seconds less the host's tail; its samples from the
                # middle of the window are what the clock settled at.
                w = sampler.window(t0 + 0.5 * (t1 - t0), t1, torch.cuda.current_device())
                if w:
                    clocks[j].append((w["sm_mhz"], w["power_w"]))
    med = [statistics.median(t) for t in times]
    clk = [(statistics.median(c[0] for c in cs), statistics.median(c[1] for c in cs)) if cs else None for cs in clocks]
    return med, clk


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--shape", type=parse_shape, action="append", required=True, help="op,m,n,k")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lead-us", type=int, default=100,
                   help="GPU spin before each timed run's start event (0: time the host's enqueue too)")
    p.add_argument("--ccfuse-lib", help="libccfuse_c.so: also time ccfuse's fused op in the same rounds")
    p.add_argument("--steady-ms", type=float, default=0,
                   help="also time each op back to back for this long (the GPU at its power cap), and the "
                        "serial NCCL + torch.mm op; t_*_steady_ms in the records")
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    group = dist.group.WORLD
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.enable_symm_mem_for_group(group.group_name)
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    ccfuse = None
    if args.ccfuse_lib:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
        from ccfuse import _capi
        ccfuse = _capi.Ccfuse(args.ccfuse_lib)
        ccfuse.init_from_env()
    sampler = None
    if args.steady_ms > 0 and rank == 0:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from contention_probe import Sampler
        sampler = Sampler()
    records = []
    for op, m, n, k in args.shape:
        if op == "ag_gemm":
            a = torch.rand(m // world, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1
            b = torch.rand(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1

            def run():
                return torch.ops.symm_mem.fused_all_gather_matmul(a, [b], gather_dim=0, group_name=group.group_name)[1][0]

            out_rows = m

            a_full = torch.rand(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)

            def mm():
                torch.mm(a_full, b)

            gathered = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)

            def serial():
                dist.all_gather_into_tensor(gathered, a, group=group)
                return torch.mm(gathered, b)
        else:
            a = torch.rand(m, k // world, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1
            b = torch.rand(k // world, n, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1

            def run():
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0,
                                                                     group_name=group.group_name)

            out_rows = m // world

            def mm():
                torch.mm(a, b)

            rs_out = torch.empty(m // world, n, device="cuda", dtype=torch.bfloat16)

            def serial():
                dist.reduce_scatter_tensor(rs_out, torch.mm(a, b), group=group)
                return rs_out

        fns = [run, mm]
        if ccfuse is not None:
            fused = ccfuse.tp_create(op, m, n, k, b_kn=True)
            c = torch.full((out_rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)

            def ours():
                fused.run(a.data_ptr(), b.data_ptr(), c.data_ptr(), torch.cuda.current_stream().cuda_stream)

            fns.append(ours)
        t = time_ms(fns, args.iters, args.warmup, group, args.lead_us)
        # A collective op finishes with its slowest rank (the local GEMM: the slowest GPU too).
        t_all = [None] * world
        dist.all_gather_object(t_all, t)
        t_peer, t_mm = max(x[0] for x in t_all), max(x[1] for x in t_all)
        rec = {"op": op, "world_size": world, "m": m, "n": n, "k": k, "dtype": "bf16",
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "gpu": "%d x %s" % (world, torch.cuda.get_device_name()), "command": " ".join(sys.argv),
               "t_peer_ms": t_peer, "t_peer_mm_ms": t_mm,
               "peer": "torch.ops.symm_mem (PyTorch %s)" % torch.__version__, "lead_us": args.lead_us}
        line = "%-8s m=%d n=%d k=%d  PyTorch async-TP %.4f ms, torch.mm of the local GEMM %.4f ms (ratio %.3f)" % (
            op, m, n, k, t_peer, t_mm, t_peer / t_mm)
        if args.steady_ms > 0:
            sfns = fns + [serial]
            names = ["peer", "mm", "ccfuse", "serial"] if ccfuse is not None else ["peer", "mm", "serial"]
            # One call count for all ranks (each call is a collective): from the slowest rank's times.
            est = [max(x[j] for x in t_all) for j in range(len(t))] + [t_peer]
            ts, clk = time_steady_ms(sfns, args.steady_ms, est, 2, group, sampler)
            t_all_s = [None] * world
            dist.all_gather_object(t_all_s, ts)
            rec["steady_ms"] = args.steady_ms
            for j, name in enumerate(names):
                rec["t_%s_steady_ms" % name] = max(x[j] for x in t_all_s)
                if clk[j] is not None:
                    rec["sm_mhz_%s_steady" % name], rec["power_w_%s_steady" % name] = clk[j]
            line += "\n    steady %.0f ms: " % args.steady_ms + ", ".join(
                "%s %.4f ms%s" % (nm, rec["t_%s_steady_ms" % nm],
                                  " @%.0f MHz" % rec["sm_mhz_%s_steady" % nm] if "sm_mhz_%s_steady" % nm in rec else "")
                for nm in names)
        if ccfuse is not None:
            # Correctness against async-TP on fresh outputs (c poisoned with NaN first).
            c.fill_(float("nan"))
            dist.barrier(group=group)
            ours()
            ref = run().float()
            torch.cuda.synchronize()
            diff = ((c.float() - ref).norm() / ref.norm()).item()
            diffs = [None] * world
            dist.all_gather_object(diffs, diff)
            t_ours = max(x[2] for x in t_all)
            rec.update({"t_ccfuse_inproc_ms": t_ours, "rel_diff_vs_peer": max(diffs),
                        "ccfuse": "libccfuse_c.so (%s)" % os.environ.get("CCFUSE_COMMIT", "?")})
            line += ", ccfuse in-process %.4f ms (ours/async-TP %.3f, ours/mm %.3f, rel diff %.1e)" % (
                t_ours, t_ours / t_peer, t_ours / t_mm, max(diffs))
            fused.close()
        records.append(rec)
        if rank == 0:
            print(line, flush=True)
    if ccfuse is not None:
        dist.barrier(group=group)
        torch.cuda.synchronize()
        ccfuse.finalize()
    if sampler is not None:
        sampler.stop()
    if rank == 0:
        with open(args.json, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
