#!/usr/bin/env python3
"""Times torch._grouped_mm on the MoE grouped-GEMM cases of tools/moe_grouped.py (the same rows
per expert as `ccfuse bench --op grouped_gemm`) and appends one JSON line per case.

    python3 tools/torch_grouped_bench.py --json OUT.jsonl [--iters 20] [--warmup 5] [--only NAME]
                                         [--ccfuse-lib build/libccfuse_c.so]

Per case: A [rows, K] bf16, B [E, K, N] as torch wants it: for b_layout nk (ccfuse's default, a
torch Linear weight [E, N, K]) B is w.transpose(-2, -1), a column-major view (no copy); for kn a
contiguous [E, K, N]. offs = int32 cumulative row ends (offs[-1] = rows); zero-row experts are
repeated offsets (torch accepts them on Hopper). Inputs uniform in [-1, 1) (as ccfuse's), rotated
over enough copies that one pass streams > 256 MB (past the 60 MB L2); CUDA events around each
call, warm-up, median. Needs torch (2.11 on the GPU machine) and nothing else.

With --ccfuse-lib, ccfuse's grouped GEMM (the C ABI's ccfuse_grouped_gemm, through
ccfuse.torch_ops.grouped_mm: the engine's default config, its prefix kernel included) runs in the
same process on the same inputs, timed INTERLEAVED with torch (one call of each per round, so both
see the same clocks under the power cap; timed in separate processes, torch's first case ran up to
9 % faster than its later runs), after a 0.2 s warm-up of both; its output is compared with torch's
over all rows (rel_err_ccfuse_vs_torch) and with an fp32 reference on the sampled rows. The record
then carries t_ccfuse_interleaved_ms and pct_ccfuse_of_torch_interleaved.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_grouped  # noqa: E402

ROTATE_BYTES = 256 << 20


def grouped_mm_fn(torch):
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        fn = getattr(torch.nn.functional, "grouped_mm", None)
    if fn is None:
        raise SystemExit("this torch has neither torch._grouped_mm nor torch.nn.functional.grouped_mm")
    return fn


def rel(got, ref):
    return float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def timed_interleaved(torch, fns, rounds, warmup_s=0.2):
    """Median ms of each fn(it), one call of each per round after warmup_s of back-to-back calls."""
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    it = 0
    while True:
        for fn in fns:
            fn(it)
        it += 1
        stop = torch.cuda.Event(enable_timing=True)
        stop.record()
        stop.synchronize()
        if start.elapsed_time(stop) >= warmup_s * 1000 and it >= 3:
            break
    events = [[] for _ in fns]
    for r in range(rounds):
        for i, fn in enumerate(fns):
            s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(it + r)
            t.record()
            events[i].append((s, t))
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(t) for s, t in ev) for ev in events]


def run_case(torch, mm, case, iters, warmup, cf=None, inject_fault=False):
    dev = torch.device("cuda", 0)
    e, n, k = case["experts"], case["n"], case["k"]
    total = case["tokens"] * case["topk"]
    rows = moe_grouped.grouped_rows(e, total, case["routing"])
    offs_list, acc = [], 0
    for r in rows:
        acc += r
        offs_list.append(acc)
    offs = torch.tensor(offs_list, dtype=torch.int32, device=dev)
    set_bytes = 2 * (total * k + e * n * k + total * n)
    free, _ = torch.cuda.mem_get_info(dev)
    sets = max(1, min(-(-ROTATE_BYTES // set_bytes), (free - (2 << 30)) // set_bytes, 64))
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)

    def uniform(*shape):
        return (torch.rand(*shape, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)

    ins = []
    for _ in range(sets):
        a = uniform(total, k)
        if case["b_layout"] == "nk":
            b = uniform(e, n, k).transpose(-2, -1)  # [E, K, N], column-major per expert
        else:
            b = uniform(e, k, n)
        ins.append((a, b))
    # Correctness on a few rows of the largest expert (fp32 reference on the GPU).
    big = max(range(e), key=lambda i: rows[i])
    out = mm(ins[0][0], ins[0][1], offs=offs)
    lo = offs_list[big] - rows[big]
    sel = slice(lo, min(lo + 4, offs_list[big]))
    ref = ins[0][0][sel].float() @ ins[0][1][big].float()
    rel_err = rel(out[sel], ref)
    extra = {}
    if cf is not None:
        counts = torch.tensor(rows, dtype=torch.int32, device=dev)
        # ccfuse takes B as stored: a [E, N, K] Linear weight (nk: torch got its transposed view)
        # or a contiguous [E, K, N] (kn)
        nk = case["b_layout"] == "nk"
        own = lambda b: b.transpose(-2, -1) if nk else b  # noqa: E731 - the storage ccfuse reads
        outs = [torch.full_like(out, float("nan")) for _ in range(2)]
        got = cf.grouped_mm(ins[0][0], own(ins[0][1]), counts, out=outs[0], b_is_weight=nk)
        if inject_fault:  # the check below must catch this
            got[lo, 0] += 1000.0
        extra["rel_err_ccfuse"] = rel(got[sel], ref)
        extra["rel_err_ccfuse_vs_torch"] = rel(got[:total], out[:total])
        # NaN-safe: an unwritten (NaN) or wrong output fails here, and the script exits 3 at the end
        extra["ccfuse_ok"] = bool(extra["rel_err_ccfuse"] <= 1e-2 and extra["rel_err_ccfuse_vs_torch"] <= 1e-2)
        t_torch, t_ours = timed_interleaved(torch, [
            lambda i: mm(ins[i % sets][0], ins[i % sets][1], offs=offs),
            lambda i: cf.grouped_mm(ins[i % sets][0], own(ins[i % sets][1]), counts, out=outs[i % 2], b_is_weight=nk),
        ], iters)
        extra.update(t_torch_interleaved_ms=t_torch, t_ccfuse_interleaved_ms=t_ours,
                     pct_ccfuse_of_torch_interleaved=100.0 * t_torch / t_ours)
    times = []
    torch.cuda.synchronize()
    for it in range(warmup + iters):
        a, b = ins[it % sets]
        s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        mm(a, b, offs=offs)
        t.record()
        times.append((s, t))
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(t) for s, t in times[warmup:])
    del ins, out
    torch.cuda.empty_cache()
    return rows, ms, rel_err, sets, extra


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--only", default="", help="run cases whose name contains this text (or one of its '|'-separated parts)")
    p.add_argument("--ccfuse-lib", default="", help="libccfuse_c.so: time ccfuse's grouped GEMM interleaved with torch")
    p.add_argument("--inject-fault", action="store_true", help="corrupt one element of ccfuse's output (checks the check)")
    args = p.parse_args()
    import torch
    cf = None
    if args.ccfuse_lib:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        from ccfuse import torch_ops as cf  # noqa: E402
        from ccfuse._capi import Ccfuse  # noqa: E402
        cf._local_lib = Ccfuse(args.ccfuse_lib)

    mm = grouped_mm_fn(torch)
    gpu = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    wrong = []
    with open(args.json, "a") as f:
        for case in moe_grouped.cases():
            if args.only and not any(part in case["name"] for part in args.only.split("|")):
                continue
            total = case["tokens"] * case["topk"]
            rec = dict(op="grouped_gemm", source="torch", world_size=1, m=total, n=case["n"], k=case["k"],
                       dtype="bf16", gpu=gpu, date=date, commit=os.environ.get("CCFUSE_COMMIT", "unknown"),
                       command=" ".join(sys.argv), torch=torch.__version__, experts=case["experts"],
                       topk=case["topk"], tokens_per_rank=case["tokens"], routing=case["routing"],
                       b_layout=case["b_layout"], name=case["name"], tokens_per_gpu=case["tokens_per_gpu"])
            try:
                rows, ms, rel_err, sets, extra = run_case(torch, mm, case, args.iters, args.warmup, cf, args.inject_fault)
                rec.update(t_torch_ms=ms, tflops_torch=2.0 * total * case["n"] * case["k"] / (ms * 1e9),
                           rel_err_torch=rel_err, group_rows=rows, rotated_sets=sets, **extra)
                line = "%-22s %-10s torch._grouped_mm %8.4f ms %6.1f TFLOP/s rel_err %.2e" % (
                    case["name"], case["routing"], ms, rec["tflops_torch"], rel_err)
                if extra:
                    line += " | interleaved: torch %.4f ccfuse %.4f ms (%.1f %%), ccfuse rel_err %.2e, vs torch %.2e" % (
                        extra["t_torch_interleaved_ms"], extra["t_ccfuse_interleaved_ms"],
                        extra["pct_ccfuse_of_torch_interleaved"], extra["rel_err_ccfuse"],
                        extra["rel_err_ccfuse_vs_torch"])
                print(line, flush=True)
                if extra and not extra["ccfuse_ok"]:
                    wrong.append("%s %s" % (case["name"], case["routing"]))
            except Exception as e:  # noqa: BLE001 - a refused case is recorded, not fatal
                rec.update(t_torch_ms=None, tflops_torch=None, error="%s: %s" % (type(e).__name__, e))
                print("%-22s %-10s torch._grouped_mm failed: %s" % (case["name"], case["routing"], rec["error"]),
                      flush=True)
            f.write(json.dumps(rec) + "\n")
            f.flush()
    if wrong:
        print("ccfuse's grouped GEMM was WRONG (rel_err > 1e-2 or NaN) on: %s" % ", ".join(wrong), flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
