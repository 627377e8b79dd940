"""ccfuse.layers.MoeLayer (gate, ccfuse's GPU router, the fused MoE FFN) trained at W ranks, on GPUs:
forward and backward against a torch reference in fp32 over every rank's tokens.

    python3 -m torch.distributed.run --nproc-per-node W tools/torch_layers_check.py \
        --ccfuse-lib build/libccfuse_c.so [--json OUT.jsonl] [--inject-fault] [--compile]

Every rank draws every rank's tokens and the whole layer's weights from one seed (fresh per case)
and loads its own shard into the layer, so each can run the reference: all tokens through all
experts in fp32 with torch autograd, the routing ids from ccfuse's router on the same logits (the
router's ids are checked against torch.topk by tools/torch_router_check.py), the weights
differentiable as the layer documents (scores at the ids, normalised over the k chosen before
drops). Compared per rank, relative error (norm) <= 2e-2: the output, d x, d gate (this rank's
tokens only: the gate is replicated, its data-parallel sum is the trainer's), d w1 and d w2 of
this rank's experts (summed over every rank's tokens). Cases: softmax top-2 dropless, softmax
top-2 with capacity 1.0 (drops by position), sigmoid top-4 with an expert bias (DeepSeek-V3's
scoring and balancing); each with backward "fused" (recomputing h, and keeping it: "fused_keep")
and, eagerly, "unfused", and the layers' MoeFfn options passed through (eager): "fused_wt"
(wgrad="torch"), "fused_kb" (kept_rows=64: fewer than a step receives, so the backward recomputes
h on the device) and "fused_mg" (main_grad=True: the weights carry a random fp32 main_grad and
grad_added_to_main_grad = False as MoeExperts documents; d w1 / d w2 are read as main_grad's change,
and the flag must be set and .grad the dummy). --compile: the
fused cases also under torch.compile(fullgraph=True, backend="aot_eager"). --inject-fault
scales the gate's gradient on rank 0 after the backward: the check must then fail (exit 1).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import layers  # noqa: E402
from ccfuse import torch_ops as cf  # noqa: E402
import torch_check_common as common  # noqa: E402 (tools/, the script's own folder)


def reference(xs, gys, gate, w1, w2, bias, rank, args_case):
    """fp32 torch autograd over every rank's tokens; returns this rank's y, d x, d gate and the
    whole w1 / w2 gradients."""
    score, k, capacity = args_case["score"], args_case["topk"], args_case["capacity"]
    f = w2.shape[2]
    gate = gate.float().clone().requires_grad_()
    w1 = w1.float().clone().requires_grad_()
    w2 = w2.float().clone().requires_grad_()
    xr = [x.float().clone().requires_grad_() for x in xs]
    total, own = 0, None
    for q, x in enumerate(xr):
        logits = torch.nn.functional.linear(x, gate)  # as the layer computes them (the same ids)
        ids, _, _, _ = cf.route(logits.detach().contiguous(), k, bias=bias, score=score, normalize=True,
                                capacity_factor=capacity)
        scores = torch.softmax(logits, -1) if score == "softmax" else torch.sigmoid(logits)
        steer = scores.detach() if bias is None else scores.detach() + bias
        chosen = torch.topk(steer, k, dim=1).indices
        w = scores.gather(1, ids.long().clamp_min(0)) / scores.gather(1, chosen).sum(1, keepdim=True)
        w = torch.where(ids >= 0, w, torch.zeros_like(w))
        y = torch.zeros_like(x)
        for j in range(k):
            for e in range(w1.shape[0]):
                sel = torch.nonzero(ids[:, j] == e).squeeze(1)
                if sel.numel():
                    hr = x[sel] @ w1[e].t()
                    a = torch.nn.functional.silu(hr[:, :f]) * hr[:, f:]
                    y = y.index_add(0, sel, w[sel, j:j + 1] * (a @ w2[e].t()))
        term = (y * gys[q].float()).sum()
        total = total + term
        if q == rank:
            own = (y.detach(), term)
    g_x, g_gate = torch.autograd.grad(own[1], (xr[rank], gate), retain_graph=True)
    g_w1, g_w2 = torch.autograd.grad(total, (w1, w2))
    return own[0], g_x, g_gate, g_w1, g_w2


def load_shard(layer, gate, w1, w2, bias, rank, world):
    """Loads the whole layer's gate (and expert bias, if not None) and this rank's experts of w1 / w2
    ([E, ...], all ranks') into the MoeLayer; returns the slice of E that is this rank's."""
    epr = w1.shape[0] // world
    mine = slice(rank * epr, (rank + 1) * epr)
    with torch.no_grad():
        layer.gate.copy_(gate)
        layer.experts.w1.copy_(w1[mine])
        layer.experts.w2.copy_(w2[mine])
        if bias is not None:
            layer.expert_bias.copy_(bias)
    return mine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--experts-per-rank", type=int, default=4)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--seed", type=int, default=97)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--inject-fault", action="store_true")
    args = ap.parse_args()
    r, w, dev = common.start(cf, args.ccfuse_lib)
    E, H, F, T = args.experts_per_rank * w, args.hidden, args.ffn, args.tokens
    meta = common.meta("torch_layers_check", dev)
    cases = [dict(name="softmax_top2", score="softmax", topk=2, capacity=0.0, bias=False),
             dict(name="softmax_top2_capacity1", score="softmax", topk=2, capacity=1.0, bias=False),
             dict(name="sigmoid_top4_bias", score="sigmoid", topk=4, capacity=0.0, bias=True)]
    # "fused_keep": backward "fused" with recompute=False (the forward keeps layer 0's h)
    modes = [("fused", False), ("fused_keep", False), ("unfused", False), ("fused_wt", False), ("fused_kb", False),
             ("fused_mg", False)] + ([("fused", True)] if args.compile else [])
    # the MoeLayer options of each mode (backward, recompute and the pass-through ones)
    options = {"fused": dict(backward="fused", recompute=True), "fused_keep": dict(backward="fused", recompute=False),
               "unfused": dict(backward="unfused", recompute=True),
               "fused_wt": dict(backward="fused", wgrad="torch"), "fused_kb": dict(backward="fused", kept_rows=64),
               "fused_mg": dict(backward="fused", main_grad=True)}
    if args.inject_fault:
        cases, modes = cases[:1], [("fused", False)]
    failures, records = 0, []
    for ci, case in enumerate(cases):
        for mode, compiled in modes:
            gen = torch.Generator().manual_seed(args.seed + 101 * ci)
            xs = [torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev) for _ in range(w)]
            gys = [torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev) for _ in range(w)]
            gate = (torch.randn(E, H, generator=gen) * H ** -0.5).to(dev)
            w1 = (torch.randn(E, 2 * F, H, generator=gen) * H ** -0.5).to(torch.bfloat16).to(dev)
            w2 = (torch.randn(E, H, F, generator=gen) * F ** -0.5).to(torch.bfloat16).to(dev)
            bias = (0.02 * torch.randn(E, generator=gen)).to(dev) if case["bias"] else None
            layer = layers.MoeLayer(H, F, E, case["topk"], max_tokens=T, score=case["score"],
                                    capacity_factor=case["capacity"], bias_update_rate=1e-3 if case["bias"] else 0.0,
                                    device=dev, **options[mode])
            mine = load_shard(layer, gate, w1, w2, bias, r, w)
            ws = (layer.experts.w1, layer.experts.w2)
            main0 = []
            if mode == "fused_mg":  # Megatron DDP's setup (MoeExperts' docstring), from random values
                for wt in ws:
                    wt.main_grad = torch.randn(wt.shape, generator=gen).to(dev)
                    wt.grad_added_to_main_grad = False
                    main0.append(wt.main_grad.clone())
            x = xs[r].clone().requires_grad_()
            fn = torch.compile(layer, fullgraph=True, backend="aot_eager") if compiled else layer
            y = fn(x)
            y.backward(gys[r])
            if args.inject_fault and r == 0:
                layer.gate.grad.mul_(1.5)
            torch.cuda.synchronize()
            ref = reference(xs, gys, gate, w1, w2, bias, r, case)
            if mode == "fused_mg":  # what the backward added; .grad is the dummy, the flag set
                wgrads = [wt.main_grad - m0 for wt, m0 in zip(ws, main0)]
                flags_ok = all(wt.grad_added_to_main_grad is True for wt in ws)
            else:
                wgrads, flags_ok = [wt.grad for wt in ws], True
            errs = {"y": common.rel(y, ref[0]), "x_grad": common.rel(x.grad, ref[1]),
                    "gate_grad": common.rel(layer.gate.grad, ref[2]), "w1_grad": common.rel(wgrads[0], ref[3][mine]),
                    "w2_grad": common.rel(wgrads[1], ref[4][mine])}
            dropped = int(layer.last_dropped.item())
            ok = all(e <= args.tol for e in errs.values()) and (case["capacity"] > 0 or dropped == 0) and flags_ok
            failures += 0 if ok else 1
            label = "%s:%s%s" % (case["name"], mode, ":compiled" if compiled else "")
            records.append({**meta, "case": label, "dropped": dropped, "ok": ok, "main_grad_flags_ok": flags_ok,
                            **{"rel_err_" + k: v for k, v in errs.items()}})
            print("rank %d %-40s %s dropped %d  %s" % (r, label, "  ".join("%s %.2e" % kv for kv in errs.items()),
                                                      dropped, "ok" if ok else "FAIL"), flush=True)
            layer.experts.close()
    common.finish(cf, "torch_layers_check", records, failures, args.json, dev)


if __name__ == "__main__":
    main()
