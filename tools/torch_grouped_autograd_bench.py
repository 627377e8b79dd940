"""ccfuse.torch_ops.grouped_mm with autograd against torch._grouped_mm (its own autograd) on MoE
expert shapes, one GPU: forward alone, a's gradient alone (b read with N
contiguous: ccfuse's "kn" path) and forward + backward (a's and b's gradients), CUDA events,
interleaved rounds, medians. Checks both against each other first (relative error <= 1e-2 on the
output and both gradients; fresh random inputs, uniform or Zipf-skewed group sizes).

    python3 tools/torch_grouped_autograd_bench.py --ccfuse-lib build/libccfuse_c.so --json OUT.jsonl

Shapes: the experts of one rank at EP = 2 for Qwen3-30B-A3B (64 experts, H 2048, F 768), a
DeepSeek-V3-like layer (128 experts, H 7168, F 2048) and Mixtral-8x7B (4 experts, H 4096, F 14336),
tokens x top-k rows: the up/gate projection (K = H, N = 2F) and the down projection (K = F, N = H).
b holds Linear weights [G, N, K] (b_is_weight=True), as torch._grouped_mm takes their transpose.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import torch_ops as cf  # noqa: E402

CASES = [  # name, groups, rows, K, N
    ("qwen3_up", 64, 32768, 2048, 1536), ("qwen3_down", 64, 32768, 768, 2048),
    ("deepseek_up", 128, 32768, 7168, 4096), ("deepseek_down", 128, 32768, 2048, 7168),
    ("mixtral_up", 4, 8192, 4096, 28672), ("mixtral_down", 4, 8192, 14336, 4096),
]


def group_sizes(g, rows, routing, gen):
    if routing == "uniform":
        w = torch.ones(g)
    else:  # Zipf, exponent 1.2, experts in random order
        w = (torch.arange(1, g + 1, dtype=torch.float64) ** -1.2)[torch.randperm(g, generator=gen)]
    sizes = torch.floor(w / w.sum() * rows).long()
    sizes[0] += rows - int(sizes.sum())
    return sizes


def rel_err(got, ref):
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--routing", default="uniform,zipf")
    args = ap.parse_args()
    if args.ccfuse_lib:
        os.environ["CCFUSE_C_LIB"] = args.ccfuse_lib
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    gen = torch.Generator().manual_seed(11)
    dgen = torch.Generator(device=dev)
    dgen.manual_seed(12)
    meta = {"tool": "torch_grouped_autograd_bench", "gpu": torch.cuda.get_device_name(dev),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": os.environ.get("CCFUSE_COMMIT", "unknown"), "torch": torch.__version__}
    failures, out = 0, []
    for routing in args.routing.split(","):
        for name, g, rows, k, n in CASES:
            sizes = group_sizes(g, rows, routing, gen)
            counts = sizes.to(dev, torch.int32)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            a = torch.randn(rows, k, generator=dgen, device=dev, dtype=torch.bfloat16).requires_grad_()
            b = (torch.randn(g, n, k, generator=dgen, device=dev, dtype=torch.bfloat16) * k ** -0.5).requires_grad_()
            gy = torch.randn(rows, n, generator=dgen, device=dev, dtype=torch.bfloat16)

            def ours():
                return cf.grouped_mm(a, b, counts, b_is_weight=True)

            def theirs():
                return torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
            results = {}
            for label, fn in (("ccfuse", ours), ("torch", theirs)):
                a.grad = b.grad = None
                y = fn()
                y.backward(gy)
                results[label] = (y.detach().clone(), a.grad.clone(), b.grad.clone())
            errs = {k2: rel_err(results["ccfuse"][i], results["torch"][i]) for i, k2 in enumerate(("y", "a_grad", "b_grad"))}
            ok = all(e <= 1e-2 for e in errs.values())
            failures += 0 if ok else 1

            def fwd(fn):
                with torch.no_grad():
                    fn()

            def fwd_bwd(fn):
                a.grad = b.grad = None
                fn().backward(gy)
            # a's gradient alone: gy [rows, N] @ b[g] [N, K], b read with its K contiguous (ccfuse's
            # b_is_weight=False path: "kn", B [K', N'] with N' contiguous)
            fns = {"ccfuse_dgrad": lambda: fwd(lambda: cf.grouped_mm(gy, b, counts)),
                   "torch_dgrad": lambda: fwd(lambda: torch._grouped_mm(gy, b, offs=offs)),
                   "ccfuse_fwd": lambda: fwd(ours), "torch_fwd": lambda: fwd(theirs),
                   "ccfuse_fwd_bwd": lambda: fwd_bwd(ours), "torch_fwd_bwd": lambda: fwd_bwd(theirs)}
            times = {key: [] for key in fns}
            torch.cuda.synchronize()
            for it in range(args.warmup + args.iters):
                for key, fn in fns.items():
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    if it >= args.warmup:
                        times[key].append((s, e))
            torch.cuda.synchronize()
            ms = {key: statistics.median(s.elapsed_time(e) for s, e in ts) for key, ts in times.items()}
            rec = {**meta, "case": name, "routing": routing, "groups": g, "rows": rows, "k": k, "n": n,
                   **{"t_%s_ms" % key: v for key, v in ms.items()}, **{"rel_err_" + k2: v for k2, v in errs.items()},
                   "ok": ok, "iters": args.iters}
            out.append(rec)
            print("%-14s %-7s dgrad(kn) %.3f / %.3f ms (%.2fx)  fwd %.3f / %.3f ms (%.2fx)  fwd+bwd %.3f / %.3f ms (%.2fx)  err y %.1e da %.1e db %.1e %s" % (
                name, routing, ms["ccfuse_dgrad"], ms["torch_dgrad"], ms["torch_dgrad"] / ms["ccfuse_dgrad"], ms["ccfuse_fwd"], ms["torch_fwd"], ms["torch_fwd"] / ms["ccfuse_fwd"],
                ms["ccfuse_fwd_bwd"], ms["torch_fwd_bwd"], ms["torch_fwd_bwd"] / ms["ccfuse_fwd_bwd"],
                errs["y"], errs["a_grad"], errs["b_grad"], "ok" if ok else "FAIL"), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for rec in out:
                f.write(json.dumps(rec) + "\n")
    print("torch_grouped_autograd_bench: %d failing case(s)" % failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
