"""ccfuse ops on two process groups at once, as Megatron and TorchTitan run them: the TP ops on
init()'s Team and the MoE FFN on an expert-parallel group of its own (torch_ops.MoeFfn(group=),
a second Team on that group's NCCL communicator), at W ranks on GPUs.

    python3 -m torch.distributed.run --nproc-per-node W tools/torch_team_groups_check.py \
        --ccfuse-lib build/libccfuse_c.so [--json OUT.jsonl] [--inject-fault]

init() makes the process's Team from torchrun's environment (its own communicator); the EP group
is dist.new_group(every rank), a second NCCL communicator over the same ranks, so that each layer
below can be compared with the same layer on the process's Team. Per step on every rank, with
fresh random tokens and the same weights: MoeFfn on the process's Team (A) and on the EP group's
(B), forward and backward (fused), interleaved with ag_gemm and gemm_rs on the process's Team
(checked against torch on the gathered / reduced operands). B's output and gradients must equal
A's bit for bit (the same kernels, another Team), the TP ops must be within --tol of an fp32
reference, and nothing may hang (the watchdog's 5 s waits). finalize() then closes both Teams.
--inject-fault perturbs one of B's outputs on rank 0: the check must then fail (exit 1).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import torch_ops as cf  # noqa: E402
import torch_check_common as common  # noqa: E402 (tools/, the script's own folder)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--seed", type=int, default=977)
    ap.add_argument("--inject-fault", action="store_true")
    args = ap.parse_args()
    r, w, dev = common.start(cf, args.ccfuse_lib)
    ep = dist.new_group(list(range(w)))
    meta = common.meta("torch_team_groups_check", dev)
    H, F, epr, k, T = 512, 256, 4, 2, 192
    E = epr * w
    gen = torch.Generator().manual_seed(args.seed)  # the same weights on every rank
    w1 = (torch.randn(E, 2 * F, H, generator=gen) * H ** -0.5).to(torch.bfloat16).to(dev)
    w2 = (torch.randn(E, H, F, generator=gen) * F ** -0.5).to(torch.bfloat16).to(dev)
    mine = slice(r * epr, (r + 1) * epr)
    shards = []
    for _ in range(2):  # A's and B's own parameters (the same values)
        a1 = w1[mine].clone().requires_grad_(True)
        a2 = w2[mine].clone().requires_grad_(True)
        shards.append((a1, a2))
    layer_a = cf.MoeFfn(shards[0][0], shards[0][1], num_experts=E, topk=k, max_tokens=T)
    layer_b = cf.MoeFfn(shards[1][0], shards[1][1], num_experts=E, topk=k, max_tokens=T, group=ep)
    M, N, K = 256 * w, 384, 512  # the TP ops: ag_gemm [M/W, K] x [N, K]^T, gemm_rs [M, K/W] x [N, K/W]^T
    failures, records = 0, []
    for step in range(args.steps):
        sgen = torch.Generator().manual_seed(args.seed + 1000003 * r + 31 * step)
        x = torch.randn(T, H, generator=sgen).to(torch.bfloat16).to(dev)
        ids = torch.stack([torch.randperm(E, generator=sgen)[:k] for _ in range(T)]).to(torch.int32).to(dev)
        wts = torch.softmax(torch.randn(T, k, generator=sgen), -1).to(dev)
        g = torch.randn(T, H, generator=sgen).to(torch.bfloat16).to(dev)
        outs, grads = [], []
        for (p1, p2), layer in zip(shards, (layer_a, layer_b)):
            p1.grad = p2.grad = None
            xa = x.clone().requires_grad_(True)
            y = layer(xa, ids, wts)
            # a TP op of the process's Team between the two layers' calls
            a_tp = torch.randn(M // w, K, generator=sgen).to(torch.bfloat16).to(dev)
            b_tp = (torch.randn(N, K, generator=sgen) * K ** -0.5).to(torch.bfloat16).to(dev)
            c_tp = cf.ag_gemm(a_tp, b_tp, b_is_weight=True)
            gathered = [torch.empty_like(a_tp) for _ in range(w)]
            dist.all_gather(gathered, a_tp)
            tp_err = common.rel(c_tp, torch.cat(gathered).float() @ b_tp.float().t())
            y.backward(g)
            outs.append(y.detach().clone())
            grads.append((xa.grad.clone(), p1.grad.clone(), p2.grad.clone()))
        if args.inject_fault and r == 0 and step == args.steps - 1:
            outs[1][0, 0] += 1.0
        a_rs = torch.randn(M, K // w, generator=sgen).to(torch.bfloat16).to(dev)
        b_rs = (torch.randn(N, K // w, generator=sgen) * K ** -0.5).to(torch.bfloat16).to(dev)
        c_rs = cf.gemm_rs(a_rs, b_rs, b_is_weight=True)
        full = a_rs.float() @ b_rs.float().t()
        dist.all_reduce(full)
        rs_err = common.rel(c_rs, full[r * (M // w):(r + 1) * (M // w)])
        same_y = bool(torch.equal(outs[0], outs[1]))
        same_g = all(bool(torch.equal(u, v)) for u, v in zip(grads[0], grads[1]))
        ok = same_y and same_g and tp_err <= args.tol and rs_err <= args.tol and bool(torch.isfinite(outs[0]).all())
        failures += 0 if ok else 1
        records.append({**meta, "case": "step%d" % step, "tokens": T, "hidden": H, "ffn": F, "experts": E, "topk": k,
                        "ok": ok, "moe_out_equal": same_y, "moe_grads_equal": same_g,
                        "moe_out_rel_diff": 0.0 if same_y else common.rel(outs[1], outs[0]),
                        "ag_gemm_rel_err": tp_err, "gemm_rs_rel_err": rs_err})
        print("rank %d step %d  MoeFfn on the EP Team vs the process's: out %s, grads %s  ag_gemm %.2e  gemm_rs "
              "%.2e  %s" % (r, step, "equal" if same_y else "%.2e" % common.rel(outs[1], outs[0]),
                            "equal" if same_g else "differ", tp_err, rs_err, "ok" if ok else "FAIL"), flush=True)
    layer_a.close()
    layer_b.close()
    common.finish(cf, "torch_team_groups_check", records, failures, args.json, dev)


if __name__ == "__main__":
    main()
