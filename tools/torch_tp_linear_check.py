"""Checks ccfuse.torch_ops' tensor-parallel linears with autograd (column_parallel_linear,
row_parallel_linear, with and without sequence parallelism) and ag_gemm's gathered view on GPUs,
against an fp64 reference built from the full tensors (every rank draws the same full tensors from
one seed and keeps its shard). Outputs given by the caller are poisoned with NaN first.

    torchrun --nproc_per_node=W tools/torch_tp_linear_check.py --ccfuse-lib build/libccfuse_c.so \
        [--json out.jsonl] [--tokens S] [--hidden H] [--ffn N]

Prints one line per case (relative errors of y, x.grad, weight.grad) and exits 1 if any exceeds
--tol (1e-2) or is not finite. W = 1 checks the wiring (shapes, transposes, the ops each backward
calls); W >= 2 also the communication each backward transposes into."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import torch_ops as cf  # noqa: E402
import torch_check_common as common  # noqa: E402 (tools/, the script's own folder)


def rel_err(got, ref):
    got, ref = got.detach().double().cpu(), ref.double().cpu()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--tol", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    r, w, dev = common.start(cf, args.ccfuse_lib)
    S, H, N = args.tokens, args.hidden, args.ffn
    assert S % w == 0 and N % w == 0, "tokens and ffn must be multiples of the world size"
    rows, cols = slice(r * S // w, (r + 1) * S // w), slice(r * N // w, (r + 1) * N // w)
    failures, records = 0, []
    meta = common.meta("torch_tp_linear_check", dev)
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale)  # noqa: E731
        X, Wc = rnd(S, H), rnd(N, H, scale=H ** -0.5)       # column-parallel: input, weight [N, H]
        Gc = rnd(S, N)                                     # d loss / d y of the column layer
        Xr, Wr = rnd(S, N), rnd(H, N, scale=N ** -0.5)      # row-parallel: input [S, N], weight [H, N]
        Gr = rnd(S, H)
        on = lambda t: t.to(dev, dtype).contiguous()  # noqa: E731

        def case(name, fn, x, wt, gy, y_ref, gx_ref, gw_ref, bias=None):
            nonlocal failures
            x = on(x).requires_grad_()
            wt = on(wt).requires_grad_()
            b = on(bias).requires_grad_() if bias is not None else None
            y = fn(x, wt) if b is None else fn(x, wt, b)
            y.backward(on(gy))
            torch.cuda.synchronize()
            errs = {"y": rel_err(y, y_ref + (bias if bias is not None else 0)), "x_grad": rel_err(x.grad, gx_ref),
                    "w_grad": rel_err(wt.grad, gw_ref)}
            if b is not None:  # this rank's rows of gy summed (with sequence parallelism, its rows only)
                errs["b_grad"] = rel_err(b.grad, gy.sum(0))
            ok = all(e <= args.tol for e in errs.values())
            failures += 0 if ok else 1
            rec = {**meta, "case": name, "dtype": str(dtype).replace("torch.", ""), "world_size": w, "rank": r,
                   "tokens": S, "hidden": H, "ffn": N, **{"rel_err_" + k: v for k, v in errs.items()}, "ok": ok}
            records.append(rec)
            if r == 0:
                print("%-28s %-8s W=%d  y %.2e  x.grad %.2e  w.grad %.2e%s  %s" % (
                    name, rec["dtype"], w, errs["y"], errs["x_grad"], errs["w_grad"],
                    "  b.grad %.2e" % errs["b_grad"] if "b_grad" in errs else "", "ok" if ok else "FAIL"), flush=True)

        # Megatron's column-parallel layer: rank r holds output features cols of Wc.
        for save in (False, True):
            case("column_sp" + ("_saved" if save else ""),
                 lambda x, wt, save=save: cf.column_parallel_linear(x, wt, save_gathered=save),
                 X[rows], Wc[cols], Gc[:, cols], X @ Wc[cols].T, (Gc @ Wc)[rows], Gc[:, cols].T @ X)
        case("column", lambda x, wt: cf.column_parallel_linear(x, wt, sequence_parallel=False),
             X, Wc[cols], Gc[:, cols], X @ Wc[cols].T, Gc @ Wc, Gc[:, cols].T @ X)
        # Row-parallel: rank r holds input features cols of Wr.
        case("row_sp", cf.row_parallel_linear, Xr[:, cols], Wr[:, cols], Gr[rows], (Xr @ Wr.T)[rows],
             Gr @ Wr[:, cols], Gr.T @ Xr[:, cols])
        case("row", lambda x, wt: cf.row_parallel_linear(x, wt, sequence_parallel=False), Xr[:, cols], Wr[:, cols],
             Gr, Xr @ Wr.T, Gr @ Wr[:, cols], Gr.T @ Xr[:, cols])
        # With biases (added by torch after the fused op): the column layer's shard, the row layer's whole.
        Bc, Br = rnd(N), rnd(H)
        case("column_sp_bias", lambda x, wt, b: cf.column_parallel_linear(x, wt, b), X[rows], Wc[cols], Gc[:, cols],
             X @ Wc[cols].T, (Gc @ Wc)[rows], Gc[:, cols].T @ X, bias=Bc[cols])
        case("row_sp_bias", lambda x, wt, b: cf.row_parallel_linear(x, wt, b), Xr[:, cols], Wr[:, cols], Gr[rows],
             (Xr @ Wr.T)[rows], Gr @ Wr[:, cols], Gr.T @ Xr[:, cols], bias=Br)

        # ag_gemm's gathered view: every rank's rows, bit for bit; c into a poisoned buffer.
        out = torch.full((S, N // w), float("nan"), dtype=dtype, device=dev)
        c, gathered = cf.ag_gemm(on(X[rows]), on(Wc[cols]), out=out, b_is_weight=True, return_gathered=True)
        exact = bool(torch.equal(gathered.cpu(), on(X).cpu()))
        e = rel_err(c, X @ Wc[cols].T)
        ok = exact and e <= args.tol and c.data_ptr() == out.data_ptr()
        failures += 0 if ok else 1
        records.append({**meta, "case": "ag_gemm_gathered", "dtype": str(dtype).replace("torch.", ""), "world_size": w,
                        "rank": r, "gathered_exact": exact, "rel_err_y": e, "ok": ok})
        if r == 0:
            print("%-28s %-8s W=%d  y %.2e  gathered %s  %s" % ("ag_gemm_gathered", str(dtype).replace("torch.", ""),
                                                                w, e, "exact" if exact else "DIFFERS",
                                                                "ok" if ok else "FAIL"), flush=True)
    common.finish(cf, "torch_tp_linear_check", records, failures, args.json, dev)


if __name__ == "__main__":
    main()
