"""ccfuse.torch_ops.MoeFfn with autograd (the fused forward, the recomputed backward of
ccfuse.moe_grad) at W ranks: checked against torch autograd of an fp32 reference, then timed.

    python3 -m torch.distributed.run --nproc-per-node W tools/torch_moe_autograd_check.py \
        --ccfuse-lib build/libccfuse_c.so --json OUT.jsonl [--inject-fault]

Every rank draws every rank's inputs from one seed (fresh per case), so each can run the whole
reference (all tokens through all experts, fp32, torch autograd; loss = sum over ranks of
<out_r, g_r>) and compare its own share: the output, d x, d topk_w, d w1 and d w2 of its experts,
relative error (norm) <= 2e-2 (bf16 kernels; the weight gradients sum over all ranks' rows).
Cases: uniform top-2, ragged tokens per rank with dropped slots, every token's first slot on one
expert (the other experts mostly empty), top-8 of 16 experts, a rank with no tokens (W > 1).
Each case with each --backward mode (unfused: ccfuse.moe_grad; fused: ccfuse's MoeFfnBackward;
fused_keep: the same with recompute=False, the forward keeping layer 0's pre-activation; a
suffix _kw: the weight gradients by ccfuse's K-grouped GEMM, wgrad="ccfuse"; fused_kw_mg: the same
added into the weights' fp32 main_grad, main_grad=True, Megatron's gradient-accumulation fusion:
main_grad starts as random values, the gradient checked is what was added, and the weight's
grad_added_to_main_grad must be set).
Then the timing (CUDA events, interleaved rounds, medians) on a Qwen3-30B-A3B-like layer (H 2048,
F 768, 128 experts, top-8, 4096 tokens a rank): the forward alone, forward + backward per mode, the
fused backward's kernels (d x, d topk_w) and weight gradients (torch._grouped_mm; with a _kw mode
also ccfuse's K-grouped GEMM on the same rows) alone, the
forward that keeps h and the kernels that read it (fused_keep); at W = 1 also
a pure torch layer (sort, torch._grouped_mm, SwiGLU, index_add; torch autograd) for scale.
--inject-fault scales one row of d x after the backward: the check must then fail (exit 1).
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import moe_grad  # noqa: E402
from ccfuse import torch_ops as cf  # noqa: E402


def rel(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def make_inputs(world, experts, topk, tokens, h, f, routing, drop, seed, dev):
    gen = torch.Generator().manual_seed(seed)
    xs, ids, ws, gs = [], [], [], []
    for r in range(world):
        t = tokens[r]
        scores = torch.rand(t, experts, generator=gen)
        if routing == "one_expert":
            scores[:, 1] = 2.0
        i = torch.topk(scores, topk, dim=1).indices
        if drop:
            i[torch.rand(i.shape, generator=gen) < drop] = -1
        ids.append(i.to(torch.int32).to(dev))
        ws.append(torch.rand(t, topk, generator=gen).to(dev))
        xs.append(torch.randn(t, h, generator=gen).to(torch.bfloat16).to(dev))
        gs.append(torch.randn(t, h, generator=gen).to(torch.bfloat16).to(dev))
    w1 = (torch.randn(experts, 2 * f, h, generator=gen) * h ** -0.5).to(torch.bfloat16).to(dev)
    w2 = (torch.randn(experts, h, f, generator=gen) * f ** -0.5).to(torch.bfloat16).to(dev)
    return xs, ids, ws, gs, w1, w2


def torch_layer(x, ids, w, w1, w2):
    """A pure torch MoE FFN on one GPU (all experts local), differentiable: the timing's scale."""
    t, k = ids.shape
    f = w2.shape[2]
    flat = ids.reshape(-1).long()
    keep = torch.nonzero(flat >= 0).squeeze(1)
    order = keep[torch.argsort(flat[keep], stable=True)]
    counts = torch.bincount(flat[order], minlength=w1.shape[0])
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    tok = torch.div(order, k, rounding_mode="floor")
    hr = torch._grouped_mm(x[tok], w1.transpose(-2, -1), offs=offs)
    a = torch.nn.functional.silu(hr[:, :f]) * hr[:, f:]
    y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
    y = y.float() * w.reshape(-1)[order][:, None]
    return torch.zeros((t, x.shape[1]), dtype=torch.float32, device=x.device).index_add(0, tok, y).to(x.dtype)


def make_ffn(p1, p2, experts, topk, max_tokens, mode):
    """torch_ops.MoeFfn for a backward mode: unfused, fused, fused_keep (recompute=False), the
    fused ones with _kw (wgrad="ccfuse"), _mg (main_grad=True), and fused_keep_b1 (a kept h of one
    row: every backward recomputes h after all, decided on the device)."""
    return cf.MoeFfn(p1, p2, num_experts=experts, topk=topk, max_tokens=max_tokens,
                     backward="unfused" if mode == "unfused" else "fused", recompute="keep" not in mode,
                     wgrad="ccfuse" if "_kw" in mode else "torch", main_grad=mode.endswith("_mg"),
                     kept_rows=1 if mode.endswith("_b1") else None)


def give_main_grads(mode, params, seed):
    """_mg modes: each weight gets Megatron's fp32 main_grad (random start values, returned) and
    grad_added_to_main_grad = False."""
    if not mode.endswith("_mg"):
        return None
    gen = torch.Generator(device=params[0].device)
    gen.manual_seed(seed)
    starts = []
    for p in params:
        p.main_grad = torch.rand(p.shape, device=p.device, generator=gen) * 2 - 1
        p.grad_added_to_main_grad = False
        starts.append(p.main_grad.clone())
    return starts


def time_ms(fns, iters, warmup):
    times = {name: [] for name in fns}
    torch.cuda.synchronize()
    for it in range(warmup + iters):
        for name, fn in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if dist.is_initialized():
                dist.barrier()
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
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--inject-fault", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--timing-only", action="store_true", help="skip the correctness cases")
    ap.add_argument("--backward", default="unfused,fused,fused_keep,fused_keep_kw",
                    help="MoeFfn backward modes to check (comma-separated: unfused, fused, fused_keep = "
                         "backward='fused' with recompute=False, fused[_keep]_kw = with wgrad='ccfuse', "
                         "fused_kw_mg = that adding into fp32 main_grad, fused_keep_b1 = a kept h of one row)")
    ap.add_argument("--borrow-comm", action="store_true",
                    help="ccfuse's Team on torch's NCCL communicator (cf.init(process_group=WORLD))")
    args = ap.parse_args()
    if args.ccfuse_lib:
        os.environ["CCFUSE_C_LIB"] = args.ccfuse_lib
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    cf.init(args.ccfuse_lib, process_group=dist.group.WORLD if args.borrow_comm else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    meta = {"tool": "torch_moe_autograd_check", "gpu": torch.cuda.get_device_name(dev), "world_size": world,
            "team": "borrowed torch NCCL communicator" if args.borrow_comm else "own communicator",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": os.environ.get("CCFUSE_COMMIT", "unknown"), "torch": torch.__version__}
    records, failures = [], 0
    cases = [  # name, experts, topk, tokens per rank, H, F, routing, drop
        ("uniform_top2", 8, 2, [256] * world, 512, 256, "uniform", 0.0),
        ("ragged_drops", 8, 2, [256 + 61 * r for r in range(world)], 512, 256, "uniform", 0.2),
        ("one_expert", 8, 2, [192] * world, 512, 256, "one_expert", 0.0),
        ("top8_of_16", 16, 8, [128] * world, 256, 128, "uniform", 0.1),
    ]
    if world > 1:
        cases.append(("rank0_no_tokens", 8, 2, [0] + [200] * (world - 1), 512, 256, "uniform", 0.0))
    modes = args.backward.split(",")
    known = ("unfused", "fused", "fused_keep", "fused_kw", "fused_keep_kw", "fused_kw_mg", "fused_keep_b1")
    if any(m not in known for m in modes):
        ap.error("--backward %r: each mode must be one of %s" % (args.backward, ", ".join(known)))
    if args.timing_only:
        cases = []
    for ci, (name, experts, topk, tokens, h, f, routing, drop) in enumerate(
            [c for c in cases for _ in modes]):
        mode = modes[ci % len(modes)]
        ci //= len(modes)
        e_local = experts // world
        xs, ids, ws, gs, w1, w2 = make_inputs(world, experts, topk, tokens, h, f, routing, drop, 100 + ci, dev)
        mine = slice(rank * e_local, (rank + 1) * e_local)
        p1 = w1[mine].clone().requires_grad_()
        p2 = w2[mine].clone().requires_grad_()
        x = xs[rank].clone().requires_grad_()
        wt = ws[rank].clone().requires_grad_()
        ffn = make_ffn(p1, p2, experts, topk, max(max(tokens), 1), mode)
        mg_start = give_main_grads(mode, (p1, p2), 300 + ci)
        y = ffn(x, ids[rank], wt)
        y.backward(gs[rank])
        flags_ok = True
        if mg_start is not None:  # the gradient is what went into main_grad; p.grad is Megatron's dummy
            flags_ok = p1.grad_added_to_main_grad is True and p2.grad_added_to_main_grad is True
            dw1_got, dw2_got = p1.main_grad - mg_start[0], p2.main_grad - mg_start[1]
        else:
            dw1_got, dw2_got = p1.grad, p2.grad
        if args.inject_fault and ci == 0 and x.grad.shape[0]:
            x.grad[0] *= 1.5
        # the reference: every rank's tokens through all experts, fp32
        X = [t.float().requires_grad_() for t in xs]
        P = [t.clone().requires_grad_() for t in ws]
        W1, W2 = w1.float().requires_grad_(), w2.float().requires_grad_()
        outs = [moe_grad.reference_forward(X[r], ids[r], P[r], W1, W2, 0, experts) for r in range(world)]
        sum((o * g.float()).sum() for o, g in zip(outs, gs)).backward()
        errs = {"out": rel(y, outs[rank]) if tokens[rank] else 0.0,
                "dx": rel(x.grad, X[rank].grad) if tokens[rank] else float(x.grad.abs().sum()),
                "dtopk_w": rel(wt.grad, P[rank].grad) if tokens[rank] else float(wt.grad.abs().sum()),
                "dw1": rel(dw1_got, W1.grad[mine]), "dw2": rel(dw2_got, W2.grad[mine])}
        dropped_ok = bool((wt.grad[ids[rank] < 0] == 0).all())
        ok = all(v <= 2e-2 for v in errs.values()) and dropped_ok and flags_ok
        ffn.close()
        failures += 0 if ok else 1
        rec = {**meta, "case": name, "backward": mode, "experts": experts, "topk": topk, "tokens": tokens[rank], "hidden": h, "ffn": f,
               **{"rel_err_" + k: v for k, v in errs.items()}, "dropped_grad_zero": dropped_ok, "ok": ok}
        records.append(rec)
        print("rank %d %-16s %-7s %s %s" % (rank, name, mode, " ".join("%s %.1e" % kv for kv in errs.items()),
                                       "ok" if ok else "FAIL"), flush=True)

    if not args.no_timing and not args.inject_fault:
        experts, topk, t, h, f = 128, 8, 4096, 2048, 768
        xs, ids, ws, gs, w1, w2 = make_inputs(world, experts, topk, [t] * world, h, f, "uniform", 0.0, 7, dev)
        e_local = experts // world
        mine = slice(rank * e_local, (rank + 1) * e_local)
        p1, p2 = w1[mine].clone().requires_grad_(), w2[mine].clone().requires_grad_()
        x, wt = xs[rank].clone().requires_grad_(), ws[rank].clone().requires_grad_()
        ffns = {mode: make_ffn(p1, p2, experts, topk, t, mode) for mode in modes}
        for mg in [m for m in modes if m.endswith("_mg")][:1]:  # the weights' main_grad (the modes share p1, p2)
            give_main_grads(mg, (p1, p2), 1)

        def fwd():
            with torch.no_grad():
                ffns[modes[0]](x, ids[rank], wt)

        def fwd_bwd(mode):
            def run():
                x.grad = wt.grad = p1.grad = p2.grad = None
                ffns[mode](x, ids[rank], wt).backward(gs[rank])
            return run
        fns = {"ccfuse_fwd": fwd, **{"ccfuse_fwd_bwd_" + mode: fwd_bwd(mode) for mode in modes}}
        if "fused" in modes:  # the fused backward's two halves alone (its handle exists by then)
            ff, xd, wd, p1d, p2d = ffns["fused"], x.detach(), wt.detach(), p1.detach(), p2.detach()
            fns["fused_bwd_kernels"] = lambda: ff._fused_backward_kernels(xd, ids[rank], wd, gs[rank], p1d, p2d)
            fns["fused_bwd_wgrad"] = lambda: ff._fused_wgrad(xd, p1d)
        for kw in [m for m in modes if m.endswith("_kw")][:1]:  # the K-grouped GEMM on its own rows
            fw, xd, p1d = ffns[kw], x.detach(), p1.detach()
            fns["fused_bwd_wgrad_kgrouped"] = lambda: fw._fused_wgrad(xd, p1d)
        for mg in [m for m in modes if m.endswith("_mg")][:1]:  # the same, adding into the fp32 main_grad
            fm, xd, p1d = ffns[mg], x.detach(), p1.detach()
            fns["fused_bwd_wgrad_kgrouped_mg"] = lambda: fm._fused_wgrad(xd, p1d)
        if "fused_keep" in modes:  # the training forward that keeps h, and the kernels that read it
            fk, xd, wd, p1d, p2d = ffns["fused_keep"], x.detach(), wt.detach(), p1.detach(), p2.detach()
            kept = fk._run(xd, ids[rank], wd, keep_h=True)[1]
            fns["ccfuse_fwd_keep"] = lambda: fk._run(xd, ids[rank], wd, keep_h=True)
            fns["fused_keep_bwd_kernels"] = lambda: fk._fused_backward_kernels(xd, ids[rank], wd, gs[rank], p1d, p2d,
                                                                               kept)
        if world == 1:
            def t_fwd():
                with torch.no_grad():
                    torch_layer(x, ids[0], wt, p1, p2)

            def t_fwd_bwd():
                x.grad = wt.grad = p1.grad = p2.grad = None
                torch_layer(x, ids[0], wt, p1, p2).backward(gs[0])
            fns.update(torch_fwd=t_fwd, torch_fwd_bwd=t_fwd_bwd)
        ms = time_ms(fns, args.iters, args.warmup)
        for ffn in ffns.values():
            ffn.close()
        rec = {**meta, "case": "timing_qwen3_like", "experts": experts, "topk": topk, "tokens": t, "hidden": h,
               "ffn": f, **{"t_%s_ms" % k: v for k, v in ms.items()}, "iters": args.iters}
        records.append(rec)
        print("rank %d timing qwen3-like T=%d: %s" % (rank, t, "  ".join("%s %.3f ms" % kv for kv in ms.items())),
              flush=True)
    if args.json and rank == 0:
        with open(args.json, "a") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")
    failed = torch.tensor([failures], device=dev)
    dist.all_reduce(failed)
    if rank == 0:
        print("torch_moe_autograd_check: %d case(s) failed on some rank" % int(failed) if int(failed) else
              "torch_moe_autograd_check: all cases pass", flush=True)
    cf.finalize()
    dist.destroy_process_group()
    sys.exit(1 if int(failed) else 0)


if __name__ == "__main__":
    main()
