"""ccfuse.torch_ops under torch.compile and torch.library.opcheck, on GPUs (any world size W).

    torchrun --nproc_per_node=W tools/torch_compile_check.py --ccfuse-lib build/libccfuse_c.so \
        [--json out.jsonl] [--backends aot_eager,inductor] [--inject-fault]

1. opcheck: torch.library.opcheck on every custom op (torch.ops.ccfuse.ag_gemm, ag_gemm_gathered,
   gemm_rs, gemm_ar, mm, grouped_mm, kgrouped_mm, moe_ffn): schema (no input mutated), fake implementation
   (the output's shape, dtype and strides as the real op's), AOT dispatch with dynamic shapes.
2. A tensor-parallel MLP block (column_parallel_linear -> gelu -> row_parallel_linear, with and
   without sequence parallelism, with a saved gathered input) compiled with fullgraph=True per
   backend: its output and gradients against the same block run eagerly and against an fp64
   reference (the full tensors drawn from one seed on every rank, each rank keeping its shard).
3. The raw ops with autograd (ag_gemm / gemm_rs on b [K, N]) compiled, the same comparisons; and
   grouped_mm with autograd (eager and compiled; b's gradient by ccfuse's K-grouped GEMM), with an empty
   group and padding rows past the groups' total (whose gradient must be 0).
4. Inference under torch.no_grad(): the MoE FFN and grouped_mm compiled (bit-for-bit the eager
   result), and the TP block with mode="reduce-overhead" (CUDA graphs) replayed on new inputs.
   Training: MoeFfn(backward="fused") compiled, forward and backward, against the same eagerly and
   an fp64 reference over every rank's tokens.
Fresh random inputs per case; --inject-fault runs one block case only, with its compiled output
perturbed (the check must fail: exit 1).
One line per case; exit 1 if any case fails (relative error > --tol, 1e-2, or not finite).
"""
import argparse
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import moe_grad  # noqa: E402
from ccfuse import torch_ops as cf  # noqa: E402
import torch_check_common as common  # noqa: E402 (tools/, the script's own folder)


def rel_err(got, ref):
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if got.shape != ref.shape or not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--backends", default="aot_eager,inductor")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--tol", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--inject-fault", action="store_true")
    args = ap.parse_args()
    r, w, dev = common.start(cf, args.ccfuse_lib)
    S, H, N = args.tokens, args.hidden, args.ffn
    assert S % w == 0 and N % w == 0, "tokens and ffn must be multiples of the world size"
    rows, cols = slice(r * S // w, (r + 1) * S // w), slice(r * N // w, (r + 1) * N // w)
    meta = common.meta("torch_compile_check", dev, custom_ops_registered=cf.custom_ops_registered)
    records, failures = [], 0
    g = torch.Generator(device="cpu").manual_seed(args.seed)

    def rnd(*shape, scale=1.0):  # the same full tensor on every rank (one seed, drawn in the same order)
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    def on(t, grad=False):
        t = t.to(dev, torch.bfloat16).contiguous()
        return t.requires_grad_() if grad else t

    def record(case, errs, extra=None):
        nonlocal failures
        ok = all(e <= args.tol for e in errs.values())
        failures += 0 if ok else 1
        rec = {**meta, "case": case, **{"rel_err_" + k: v for k, v in errs.items()}, **(extra or {}), "ok": ok}
        records.append(rec)
        if r == 0:
            print("%-44s %s  %s" % (case, "  ".join("%s %.2e" % kv for kv in errs.items()), "ok" if ok else "FAIL"),
                  flush=True)

    def guarded(case, fn):
        nonlocal failures
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (a case that throws is a failing case, the rest still run)
            failures += 1
            msg = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
            records.append({**meta, "case": case, "ok": False, "error": msg})
            if r == 0:
                print("%-44s FAIL  %s" % (case, msg), flush=True)
                traceback.print_exc(limit=6)

    # 1. opcheck on every custom op (the inputs need no gradient: the ops carry none themselves)
    if cf.custom_ops_registered and not args.inject_fault:
        X, Wc, Wr = rnd(S, H), rnd(N, H, scale=H ** -0.5), rnd(H, N, scale=N ** -0.5)
        ops = torch.ops.ccfuse
        grp_rows = torch.tensor([S // 4, 0, S // 2, S // 4], dtype=torch.int32, device=dev)
        experts = on(rnd(4, N // 4, H, scale=H ** -0.5))
        for name, op, a in [
            ("ag_gemm", ops.ag_gemm.default, (on(X[rows]), on(Wc[cols]), True)),
            ("ag_gemm_gathered", ops.ag_gemm_gathered.default, (on(X[rows]), on(Wc[cols]), True)),
            ("gemm_rs", ops.gemm_rs.default, (on(rnd(S, N)[:, cols]), on(Wr[:, cols]), True)),
            ("gemm_ar", ops.gemm_ar.default, (on(rnd(S, N)[:, cols]), on(Wr[:, cols]), True)),
            ("mm", ops.mm.default, (on(X), on(Wc[cols]), True)),
            ("grouped_mm", ops.grouped_mm.default, (on(X), experts, grp_rows, True)),
            ("kgrouped_mm", ops.kgrouped_mm.default, (on(X), on(rnd(S, N // 4)), grp_rows)),
        ]:
            def run_opcheck(name=name, op=op, a=a):
                res = torch.library.opcheck(op, a)
                bad = {k: v for k, v in res.items() if v != "SUCCESS"}
                record("opcheck:" + name, {"failed_tests": float(len(bad))}, {"opcheck": res})
            guarded("opcheck:" + name, run_opcheck)

    # 2. the TP MLP block: y = row(gelu(column(x)))
    def block(x, w1, w2, sp, save):
        h = cf.column_parallel_linear(x, w1, sequence_parallel=sp, save_gathered=save)
        return cf.row_parallel_linear(F.gelu(h), w2, sequence_parallel=sp)

    def block_case(case, backend, sp, save):
        X, W1, W2 = rnd(S, H), rnd(N, H, scale=H ** -0.5), rnd(H, N, scale=N ** -0.5)
        GY = rnd(S, H)
        x_rows = rows if sp else slice(0, S)
        # fp64 reference on the full tensors
        Xr, W1r, W2r = (t.clone().requires_grad_() for t in (X, W1, W2))
        Yr = F.gelu(Xr @ W1r.T) @ W2r.T
        Yr.backward(GY)
        outs = {}
        for mode in ("eager", "compiled"):
            x, w1, w2 = on(X[x_rows], True), on(W1[cols], True), on(W2[:, cols], True)
            fn = block if mode == "eager" else torch.compile(block, fullgraph=True, backend=backend)
            y = fn(x, w1, w2, sp, save)
            if mode == "compiled" and case.startswith("fault:"):
                # ~0.1 % of the elements off by half the largest (fp32 draws: bf16's below 1 stop at 0.996)
                y = y + 0.5 * y.detach().abs().max() * (torch.rand(y.shape, device=y.device) > 0.999)
            y.backward(on(GY[x_rows]))
            torch.cuda.synchronize()
            outs[mode] = (y, x.grad, w1.grad, w2.grad)
        ref = (Yr[x_rows], Xr.grad[x_rows], W1r.grad[cols], W2r.grad[:, cols])
        errs = {}
        for i, k in enumerate(("y", "x_grad", "w1_grad", "w2_grad")):
            errs[k] = rel_err(outs["compiled"][i], ref[i])
            errs[k + "_vs_eager"] = rel_err(outs["compiled"][i], outs["eager"][i])
        record(case, errs, {"backend": backend, "sequence_parallel": sp, "save_gathered": save})

    backends = [b for b in args.backends.split(",") if b]
    if args.inject_fault:  # only the faulty case: it must fail (exit 1)
        guarded("fault:block", lambda: block_case("fault:block", backends[0], True, False))
        backends = []
    for backend in backends:
        for sp, save in ((True, False), (True, True), (False, False)):
            case = "block:%s:%s%s" % (backend, "sp" if sp else "nosp", "_saved" if save else "")
            guarded(case, lambda: block_case(case, backend, sp, save))

    # 3. the raw ops with autograd, b [K, N] (b_is_weight=False)
    def raw_case(backend):
        A, B, C = rnd(S, H), rnd(H, N, scale=H ** -0.5), rnd(N, H, scale=N ** -0.5)
        GY = rnd(S, H)
        Ar, Br, Cr = (t.clone().requires_grad_() for t in (A, B, C))
        Yr = (Ar @ Br) @ Cr
        Yr.backward(GY)

        def f(a, b, c):  # AllGather(a) @ b -> [S, N/W]; then ReduceScatter(. @ c) -> [S/W, H]
            return cf.gemm_rs(cf.ag_gemm(a, b), c)
        a, b, c = on(A[rows], True), on(B[:, cols], True), on(C[cols], True)
        y = torch.compile(f, fullgraph=True, backend=backend)(a, b, c)
        y.backward(on(GY[rows]))
        torch.cuda.synchronize()
        errs = {"y": rel_err(y, Yr[rows]), "a_grad": rel_err(a.grad, Ar.grad[rows]),
                "b_grad": rel_err(b.grad, Br.grad[:, cols]), "c_grad": rel_err(c.grad, Cr.grad[cols])}
        record("raw_kn:" + backend, errs, {"backend": backend})
    for backend in backends:
        guarded("raw_kn:" + backend, lambda: raw_case(backend))

    # 3b. grouped_mm with autograd (a's gradient by the grouped GEMM, b's by the K-grouped one), eager and
    # compiled: 4 groups, one empty, 64 padding rows past the groups' total (their gradient: 0)
    def grouped_case(mode, b_is_weight):
        counts = [S // 4, 0, S // 2, S // 4 - 64]
        ng = N // 4
        A, GY = rnd(S, H), rnd(S, ng)
        B = rnd(4, ng, H, scale=H ** -0.5) if b_is_weight else rnd(4, H, ng, scale=H ** -0.5)
        Ar, Br = A.clone().requires_grad_(), B.clone().requires_grad_()
        outs, start = [], 0
        for gi, n_g in enumerate(counts):
            bg = Br[gi].T if b_is_weight else Br[gi]
            outs.append(Ar[start:start + n_g] @ bg)
            start += n_g
        Yr = torch.cat(outs)
        Yr.backward(GY[:start])
        grp = torch.tensor(counts, dtype=torch.int32, device=dev)
        a, b = on(A, True), on(B, True)

        def f(a, b):
            return cf.grouped_mm(a, b, grp, b_is_weight=b_is_weight)
        fn = f if mode == "eager" else torch.compile(f, fullgraph=True, backend=mode)
        y = fn(a, b)
        y.backward(on(GY))
        torch.cuda.synchronize()
        errs = {"y": rel_err(y[:start], Yr), "a_grad": rel_err(a.grad[:start], Ar.grad[:start]),
                "b_grad": rel_err(b.grad, Br.grad),
                "a_grad_padding_nonzero": float((a.grad[start:] != 0).sum())}
        record("grouped_autograd:%s:%s" % (mode, "nk" if b_is_weight else "kn"), errs, {"backend": mode})
    for mode in ["eager"] + backends:
        for bw in (True, False):
            guarded("grouped_autograd:%s:%s" % (mode, "nk" if bw else "kn"), lambda: grouped_case(mode, bw))

    # 4. inference: the MoE FFN and grouped_mm compiled (bit for bit), the TP block in CUDA graphs
    def moe_case(backend):
        E, k, T, F_ = 8 * w, 2, 512, 512
        w1 = on(rnd(E // w, 2 * F_, H, scale=H ** -0.5))
        w2 = on(rnd(E // w, H, F_, scale=F_ ** -0.5))
        moe = cf.MoeFfn(w1, w2, num_experts=E, topk=k, max_tokens=T)
        x = on(rnd(T, H))
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(dev, torch.int32)
        tw = torch.rand(T, k, generator=g).to(dev)
        tw = tw / tw.sum(1, keepdim=True)
        grp = torch.tensor([T // 2, 0, T // 4, T // 4], dtype=torch.int32, device=dev)
        ex = on(rnd(4, 768, H, scale=H ** -0.5))
        with torch.no_grad():
            want_moe, want_grp = moe(x, ids, tw), cf.grouped_mm(x, ex, grp, b_is_weight=True)

            def f(x, ids, tw):
                return moe(x, ids, tw), cf.grouped_mm(x, ex, grp, b_is_weight=True)
            got_moe, got_grp = torch.compile(f, fullgraph=True, backend=backend)(x, ids, tw)
        torch.cuda.synchronize()
        same = bool(torch.equal(got_moe, want_moe)) and bool(torch.equal(got_grp, want_grp))
        record("moe_grouped_nograd:" + backend, {"moe": rel_err(got_moe, want_moe), "grouped": rel_err(got_grp, want_grp)},
               {"backend": backend, "bitwise_equal": same})
        moe.close()
    for backend in backends:
        guarded("moe_grouped_nograd:" + backend, lambda: moe_case(backend))

    # 4b. training: MoeFfn(backward="fused") with forward and backward compiled (no host sync in
    # either: torch.ops.ccfuse.moe_ffn / moe_ffn_backward; with recompute=False moe_ffn_keep and the
    # kept h into the backward op), against the same run eagerly and an fp64
    # reference over every rank's tokens (y, d x, d topk_w, d w1, d w2 of this rank's experts)
    def moe_train_case(backend, recompute=True):
        E, k, T, F_ = 8 * w, 2, 512, 512
        el, mine = E // w, slice(r * (E // w), (r + 1) * (E // w))
        W1, W2 = rnd(E, 2 * F_, H, scale=H ** -0.5), rnd(E, H, F_, scale=F_ ** -0.5)
        X, GY = [rnd(T, H) for _ in range(w)], [rnd(T, H) for _ in range(w)]
        ids = [torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(dev, torch.int32) for _ in range(w)]
        P = [torch.rand(T, k, generator=g, dtype=torch.float64) + 0.05 for _ in range(w)]
        P = [p / p.sum(1, keepdim=True) for p in P]
        W1r, W2r = W1.to(dev).requires_grad_(), W2.to(dev).requires_grad_()
        Xr, Pr = [t.to(dev).requires_grad_() for t in X], [p.to(dev).requires_grad_() for p in P]
        loss = 0
        for q in range(w):
            yq = moe_grad.reference_forward(Xr[q], ids[q], Pr[q], W1r, W2r, 0, E)
            loss = loss + (yq * GY[q].to(dev)).sum()
            if q == r:
                y_ref = yq.detach()
        loss.backward()
        ref = (y_ref, Xr[r].grad, Pr[r].grad, W1r.grad[mine], W2r.grad[mine])
        outs = {}
        for mode in ("eager", "compiled"):
            w1, w2 = on(W1[mine], True), on(W2[mine], True)
            moe = cf.MoeFfn(w1, w2, num_experts=E, topk=k, max_tokens=T, backward="fused", recompute=recompute)
            x, tw = on(X[r], True), P[r].to(dev, torch.float32).requires_grad_()

            def f(x, ids, tw):
                return moe(x, ids, tw)
            fn = f if mode == "eager" else torch.compile(f, fullgraph=True, backend=backend)
            y = fn(x, ids[r], tw)
            y.backward(on(GY[r]))
            torch.cuda.synchronize()
            outs[mode] = (y, x.grad, tw.grad, w1.grad, w2.grad)
            moe.close()
        errs = {}
        names = ("y", "x_grad", "topk_w_grad", "w1_grad", "w2_grad")
        for i, name in enumerate(names):
            errs[name] = rel_err(outs["compiled"][i], ref[i])
            errs[name + "_vs_eager"] = rel_err(outs["compiled"][i], outs["eager"][i])
        same = all(bool(torch.equal(outs["compiled"][i], outs["eager"][i])) for i in range(len(names)))
        name = "moe_train_fused" if recompute else "moe_train_keep"
        record(name + ":" + backend, errs, {"backend": backend, "bitwise_equal_to_eager": same,
                                            "recompute": recompute})
    for backend in backends:
        guarded("moe_train_fused:" + backend, lambda: moe_train_case(backend))
        # recompute=False: the forward op keeps h (moe_ffn_keep) and the backward op reads it
        guarded("moe_train_keep:" + backend, lambda: moe_train_case(backend, recompute=False))

    def graphs_case():  # noqa: the block's weights are constants of the compiled function
        W1, W2 = rnd(N, H, scale=H ** -0.5), rnd(H, N, scale=N ** -0.5)
        w1, w2 = on(W1[cols]), on(W2[:, cols])
        fn = torch.compile(lambda x: block(x, w1, w2, True, False), mode="reduce-overhead", fullgraph=True)
        errs = {}
        with torch.no_grad():
            for i in range(4):  # warm-up runs, then replays of the recorded graph, each on new inputs
                X = rnd(S, H)
                y = fn(on(X[rows])).clone()
                torch.cuda.synchronize()
                errs["y_call%d" % i] = rel_err(y, (F.gelu(X @ W1.T) @ W2.T)[rows])
        record("block_nograd_cudagraphs:inductor", errs)
    if "inductor" in backends:
        guarded("block_nograd_cudagraphs:inductor", graphs_case)

    common.finish(cf, "torch_compile_check", records, failures, args.json, dev)


if __name__ == "__main__":
    main()
