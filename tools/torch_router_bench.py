#!/usr/bin/env python3
"""Times the PyTorch equivalent of ccfuse's GPU MoE router + layout (bench/router_bench.cu) and
appends one JSON line per case with the same fields (t_torch_ms instead of t_ccfuse_ms).

    python3 tools/torch_router_bench.py --json OUT.jsonl [--tokens 16384] [--experts 256] [--topk 8] [--iters 50]

Per call, on fp32 logits [T, E] (N(0, 2), as the ccfuse bench): softmax, topk, renormalise the
chosen weights; with a capacity factor, drop by position (stable argsort of the expert ids, rank
inside the expert = position - expert start, keep rank < capacity); then the layout: stable
argsort of the (kept) expert ids (dropped entries last), bincount(minlength=E) and cumsum (bins).
torch.bincount on CUDA reads the maximum back to the host (a sync inside the call), as a user's
code would pay it; t_torch_nosync_ms is the same pipeline with the counts from a scatter_add_
(no sync), so the comparison can be read both ways. CUDA events around each call, warm-up,
median of --iters. Needs torch only.
"""
import argparse
import datetime
import json
import math
import os
import statistics


def router_layout(torch, logits, topk, cf, sync_free):
    t, e = logits.shape
    probs = torch.softmax(logits, dim=-1)  # fp32, as PyTorch MoE code does (ccfuse does double)
    w, ids = torch.topk(probs, topk, dim=-1)  # sorted: slot 0 = best
    w = w / w.sum(dim=-1, keepdim=True)
    flat = ids.reshape(-1)
    n = flat.numel()

    def counts_of(x, length):
        if sync_free:
            return torch.zeros(length, dtype=torch.int64, device=x.device).scatter_add_(
                0, x, torch.ones_like(x, dtype=torch.int64))
        return torch.bincount(x, minlength=length)

    if cf > 0:
        cap = min(t, math.ceil(cf * t * topk / e))
        order = torch.argsort(flat, stable=True)
        counts = counts_of(flat, e)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(n, device=flat.device) - starts[flat[order]]
        keep = torch.empty_like(rank, dtype=torch.bool)
        keep[order] = rank < cap
        flat = torch.where(keep, flat, torch.full_like(flat, -1))
        w = torch.where(keep.view_as(w), w, torch.zeros_like(w))
    key = torch.where(flat < 0, torch.full_like(flat, e), flat)  # dropped entries sort last
    indices = torch.argsort(key, stable=True)
    tokens_per_expert = counts_of(key, e + 1)[:e]
    bins = torch.cumsum(tokens_per_expert, 0)
    return flat, w, indices, bins


def time_ms(torch, fn, iters, warmup):
    times = []
    torch.cuda.synchronize()
    for it in range(warmup + iters):
        s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        t.record()
        times.append((s, t))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(t) for s, t in times[warmup:])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    import torch

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    logits = torch.randn(args.tokens, args.experts, device=dev, generator=gen) * 2.0
    gpu = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit = os.environ.get("CCFUSE_COMMIT", "unknown")
    with open(args.json, "a") as f:
        for cf in (0.0, 1.25):
            ms = time_ms(torch, lambda: router_layout(torch, logits, args.topk, cf, False), args.iters, args.warmup)
            ms_ns = time_ms(torch, lambda: router_layout(torch, logits, args.topk, cf, True), args.iters, args.warmup)
            ids, _, _, bins = router_layout(torch, logits, args.topk, cf, True)
            dropped = int((ids < 0).sum())
            rec = dict(bench="moe_router", source="torch", tokens=args.tokens, experts=args.experts, topk=args.topk,
                       capacity_factor=cf, drop_policy="position" if cf > 0 else "none", score="softmax",
                       t_torch_ms=ms, t_torch_nosync_ms=ms_ns, dropped=dropped, rows=int(bins[-1]),
                       iters=args.iters, date=date, gpu=gpu, commit=commit, torch=torch.__version__)
            print("torch router+layout T=%d E=%d k=%d cf=%.2f: %.4f ms (counts without sync %.4f ms), dropped %d" %
                  (args.tokens, args.experts, args.topk, cf, ms, ms_ns, dropped), flush=True)
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
