#!/usr/bin/env python3
"""Times torch._grouped_mm on the MoE grouped-GEMM cases of tools/moe_grouped.py (the same rows
per expert as `ccfuse bench --op grouped_gemm`) and appends one JSON line per case.

    python3 tools/torch_grouped_bench.py --json OUT.jsonl [--iters 20] [--warmup 5] [--only NAME]

Per case: A [rows, K] bf16, B [E, K, N] as torch wants it: for b_layout nk (ccfuse's default, a
torch Linear weight [E, N, K]) B is w.transpose(-2, -1), a column-major view (no copy); for kn a
contiguous [E, K, N]. offs = int32 cumulative row ends (offs[-1] = rows); zero-row experts are
repeated offsets (torch accepts them on Hopper). Inputs uniform in [-1, 1) (as ccfuse's), rotated
over enough copies that one pass streams > 256 MB (past the 60 MB L2); CUDA events around each
call, warm-up, median. Needs torch (2.11 on the GPU machine) and nothing else.
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


def run_case(torch, mm, case, iters, warmup):
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
    rel_err = float((out[sel].float() - ref).norm() / ref.norm())
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
    return rows, ms, rel_err, sets


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--only", default="", help="run cases whose name contains this text")
    args = p.parse_args()
    import torch

    mm = grouped_mm_fn(torch)
    gpu = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open(args.json, "a") as f:
        for case in moe_grouped.cases():
            if args.only and args.only not in case["name"]:
                continue
            total = case["tokens"] * case["topk"]
            rec = dict(op="grouped_gemm", source="torch", world_size=1, m=total, n=case["n"], k=case["k"],
                       dtype="bf16", gpu=gpu, date=date, torch=torch.__version__, experts=case["experts"],
                       topk=case["topk"], tokens_per_rank=case["tokens"], routing=case["routing"],
                       b_layout=case["b_layout"], name=case["name"], tokens_per_gpu=case["tokens_per_gpu"])
            try:
                rows, ms, rel_err, sets = run_case(torch, mm, case, args.iters, args.warmup)
                rec.update(t_torch_ms=ms, tflops_torch=2.0 * total * case["n"] * case["k"] / (ms * 1e9),
                           rel_err_torch=rel_err, group_rows=rows, rotated_sets=sets)
                print("%-22s %-10s torch._grouped_mm %8.4f ms %6.1f TFLOP/s rel_err %.2e" %
                      (case["name"], case["routing"], ms, rec["tflops_torch"], rel_err), flush=True)
            except Exception as e:  # noqa: BLE001 - a refused case is recorded, not fatal
                rec.update(t_torch_ms=None, tflops_torch=None, error="%s: %s" % (type(e).__name__, e))
                print("%-22s %-10s torch._grouped_mm failed: %s" % (case["name"], case["routing"], rec["error"]),
                      flush=True)
            f.write(json.dumps(rec) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
