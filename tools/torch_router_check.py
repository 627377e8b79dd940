"""ccfuse.torch_ops.route (the GPU MoE router through the C ABI) on one GPU: checked against a
PyTorch reference on the same logits and timed against it.

    python3 tools/torch_router_check.py --ccfuse-lib build/libccfuse_c.so --json OUT.jsonl [--inject-fault]

Cases (fresh N(0, 2) fp32 logits per case, T tokens x E experts, top-k):
- softmax / sigmoid (+ a bias), dropless: the chosen expert set per token equal to torch.topk's on
  score + bias (ties have probability ~0 with random fp32 logits; mismatching tokens are counted
  and must be 0), weights (the unbiased scores, normalised) within 1e-5 of torch's in fp64,
  tokens_per_expert equal to the ids' bincount, dropped 0;
- capacity 1.25 by position: the ids equal the PyTorch drop-by-position pipeline
  (tools/torch_router_bench.py's), dropped equal to its count;
- capacity 1.25 by probability: the invariants (no expert over its capacity, every kept entry one
  of the dropless choices with its weight, dropped = T*k - kept, the kept weight per expert at
  least as high as any dropped one's for that expert);
- the router captured in a CUDA graph (capacity, so with a workspace) and replayed on new logits;
- update_router_bias against its formula.
Then ccfuse's route against torch (softmax, topk, normalise, counts by scatter_add: no host sync)
timed interleaved (CUDA events, median of --iters). Exit 1 if a check fails; --inject-fault flips
one id of the first case (the check must then fail).
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ccfuse import torch_ops as cf  # noqa: E402
from torch_router_bench import router_layout  # noqa: E402  (the PyTorch pipeline the bench times)


def torch_route(logits, k, score, bias):
    s = torch.softmax(logits.double(), -1) if score == "softmax" else torch.sigmoid(logits.double())
    sel = s + bias.double() if bias is not None else s
    _, ids = torch.topk(sel, k, dim=-1)
    w = torch.gather(s, 1, ids)
    return ids, w / w.sum(-1, keepdim=True)


def time_ms(fns, iters, warmup):
    """Interleaved: each round runs every fn once; the median per fn."""
    times = {name: [] for name in fns}
    torch.cuda.synchronize()
    for it in range(warmup + iters):
        for name, fn in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            if it >= warmup:
                times[name].append((s, e))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in ts) for name, ts in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--inject-fault", action="store_true")
    args = ap.parse_args()
    if args.ccfuse_lib:
        os.environ["CCFUSE_C_LIB"] = args.ccfuse_lib
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    T, E, K = args.tokens, args.experts, args.topk
    gen = torch.Generator(device=dev)
    gen.manual_seed(7)
    meta = {"tool": "torch_router_check", "gpu": torch.cuda.get_device_name(dev), "tokens": T, "experts": E,
            "topk": K, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": os.environ.get("CCFUSE_COMMIT", "unknown"), "torch": torch.__version__}
    records, failures = [], 0

    def logits_():
        return torch.randn(T, E, device=dev, generator=gen) * 2.0

    def record(case, ok, **fields):
        nonlocal failures
        failures += 0 if ok else 1
        records.append({**meta, "case": case, **fields, "ok": bool(ok)})
        print("%-34s %s  %s" % (case, "  ".join("%s=%s" % kv for kv in fields.items()), "ok" if ok else "FAIL"),
              flush=True)

    # dropless, softmax and sigmoid + bias
    for i, (score, with_bias) in enumerate((("softmax", False), ("sigmoid", True))):
        lg = logits_()
        bias = (torch.randn(E, device=dev, generator=gen) * 0.1) if with_bias else None
        ids, w, counts, dropped = cf.route(lg, K, bias=bias, score=score)
        if args.inject_fault and i == 0:
            ids[0, 0] = (ids[0, 0] + 1) % E
        rid, rw = torch_route(lg, K, score, bias)
        ids_s, order = torch.sort(ids.long(), -1)
        rid_s, rorder = torch.sort(rid, -1)
        mismatch = int((ids_s != rid_s).any(-1).sum())
        werr = float((torch.gather(w.double(), 1, order) - torch.gather(rw, 1, rorder)).abs().max())
        want_counts = torch.bincount(ids.long().reshape(-1), minlength=E).int()
        ok = (mismatch == 0 and werr <= 1e-5 and torch.equal(counts, want_counts) and int(dropped) == 0)
        record("dropless_%s%s" % (score, "_bias" if with_bias else ""), ok, tokens_mismatched=mismatch,
               weight_max_abs_err=werr, counts_equal=bool(torch.equal(counts, want_counts)), dropped=int(dropped))

    cap = min(T, math.ceil(1.25 * T * K / E))
    # capacity by position against the PyTorch pipeline
    lg = logits_()
    ids, w, counts, dropped = cf.route(lg, K, capacity_factor=1.25, drop="position")
    rflat, _, _, _ = router_layout(torch, lg, K, 1.25, True)
    rid = rflat.view(T, K)
    # the same experts chosen per token (both sorted by score; ccfuse's slot order may differ)
    ids_s, _ = torch.sort(ids.long(), -1)
    rid_s, _ = torch.sort(rid, -1)
    mismatch = int((ids_s != rid_s).any(-1).sum())
    want_dropped = int((rid < 0).sum())
    ok = mismatch == 0 and int(dropped) == want_dropped and int(counts.max()) <= cap
    record("capacity_position", ok, tokens_mismatched=mismatch, dropped=int(dropped), torch_dropped=want_dropped,
           capacity=cap, max_count=int(counts.max()))

    # capacity by probability: the invariants
    lg = logits_()
    ids0, w0, _, _ = cf.route(lg, K)
    ids, w, counts, dropped = cf.route(lg, K, capacity_factor=1.25, drop="probability")
    kept = ids >= 0
    same_choice = bool(torch.equal(torch.where(kept, ids, ids0), ids0))
    same_weight = bool(torch.equal(torch.where(kept, w, w0), w0)) and bool((w[~kept] == 0).all())
    per_expert = torch.bincount(ids[kept].long(), minlength=E)
    # the lowest kept weight of each expert >= the highest dropped weight of the same expert
    inf = torch.full((E,), float("inf"), device=dev)
    low_kept = inf.scatter_reduce(0, ids0[kept].long(), w0[kept], "amin")
    high_dropped = torch.full((E,), -1.0, device=dev).scatter_reduce(0, ids0[~kept].long(), w0[~kept], "amax")
    order_ok = bool((high_dropped <= low_kept).all())
    ok = (same_choice and same_weight and int(per_expert.max()) <= cap and torch.equal(per_expert.int(), counts)
          and int(dropped) == T * K - int(kept.sum()) and order_ok)
    record("capacity_probability", ok, dropped=int(dropped), capacity=cap, max_count=int(per_expert.max()),
           same_choice=same_choice, same_weight=same_weight, highest_weights_kept=order_ok)

    # a CUDA graph: captured once, replayed on new logits (static buffers)
    static = logits_()
    cf.route(static, K, capacity_factor=1.25)  # warm-up: the workspace size is asked outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out = cf.route(static, K, capacity_factor=1.25)
    ok = True
    for _ in range(3):
        static.copy_(logits_())
        graph.replay()
        want = cf.route(static, K, capacity_factor=1.25)
        ok = ok and all(torch.equal(a, b) for a, b in zip(g_out, want))
    torch.cuda.synchronize()
    record("cuda_graph_replays", ok, replays=3)

    # update_router_bias
    bias = torch.zeros(E, device=dev)
    counts = torch.randint(0, 100, (E,), device=dev, generator=gen, dtype=torch.int32)
    cf.update_router_bias(bias, counts, 1e-3)
    mean = counts.double().mean()
    want = 1e-3 * torch.sign(mean - counts.double())
    record("update_router_bias", bool(torch.allclose(bias.double(), want)), max_abs_err=float((bias - want).abs().max()))

    # timing: ccfuse's route against torch's softmax + topk + normalise (+ counts, no host sync)
    lg = logits_()

    def torch_dropless():
        p = torch.softmax(lg, -1)
        w, ids = torch.topk(p, K, -1)
        w = w / w.sum(-1, keepdim=True)
        return ids, w, torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(
            0, ids.reshape(-1), torch.ones(T * K, dtype=torch.int64, device=dev))

    def torch_capacity():
        return router_layout(torch, lg, K, 1.25, True)
    ms = time_ms({"ccfuse_dropless": lambda: cf.route(lg, K), "torch_dropless": torch_dropless,
                  "ccfuse_capacity": lambda: cf.route(lg, K, capacity_factor=1.25),
                  "torch_capacity_with_layout": torch_capacity}, args.iters, args.warmup)
    for what in ("dropless", "capacity"):
        tname = "torch_" + what + ("_with_layout" if what == "capacity" else "")
        rec = {**meta, "case": "timing_" + what, "t_ccfuse_ms": ms["ccfuse_" + what], "t_torch_ms": ms[tname],
               "torch_pipeline": tname, "speedup": ms[tname] / ms["ccfuse_" + what], "iters": args.iters}
        records.append(rec)
        print("timing %-9s ccfuse %.4f ms  %s %.4f ms  speedup %.2fx" % (
            what, ms["ccfuse_" + what], tname, ms[tname], rec["speedup"]), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    print("torch_router_check: %d failing case(s)" % failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
