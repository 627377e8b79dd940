#!/usr/bin/env python3
"""The MoE experts' weight gradients: ccfuse's K-grouped GEMM (ccfuse_kgrouped_gemm) against
torch._grouped_mm(a.t(), b, offs) on the cases of tools/moe_grouped.py, in one process, timed
interleaved (one call of each per round, the same clocks), with one JSON line per case.

    python3 tools/torch_wgrad_bench.py --ccfuse-lib build/libccfuse_c.so --json OUT.jsonl
                                       [--iters 20] [--only NAME] [--inject-fault]

Each grouped-GEMM case (expert e's rows of x [rows, K] times its weight [N, K]) has the weight
gradient d W_e [N, K] = d y_e^T x_e: a = d y [rows, N] (m = N), b = x [rows, K] (n = K), the
contraction over the expert's rows (the up case gives d W1 [2F, H], the down case d W2 [H, F]).
Rows per expert from the case's routing; inputs uniform in [-1, 1), rotated over enough copies
that one pass streams > 256 MB of inputs. Correct when both outputs agree (rel_err <= 1e-2 over
every element, NaN fails) and ccfuse's matches an fp32 reference on the largest, the smallest and
an empty expert (exactly 0 there); --inject-fault corrupts one element (the check must catch it:
exit 3). Output bytes (experts x m x n x 2) bound the time from below: reported as GB/s.

--accumulate: the fp32 main_grad form (Megatron's gradient-accumulation fusion): ccfuse adds into
an fp32 [experts, m, n] buffer (ccfuse_kgrouped_gemm_accumulate) against what Megatron does without
the fusion, main_grad.add_(torch._grouped_mm(a.t(), b, offs)) (a bf16 gradient, then an fp32 add),
and, where this torch has it, torch._grouped_mm(..., out_dtype=torch.float32) then the add. The
buffers start as fresh random values c0; ccfuse's sum (buffer - c0) must match the fp32 reference
within 1e-3 (fp32 accumulation: ~1e-6; a bf16 rounding would give ~2e-3) and leave an empty
expert's c0 bit-equal. Bytes: the buffer read and written (experts x m x n x 8).
"""
import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import moe_grouped  # noqa: E402
from torch_grouped_bench import ROTATE_BYTES, rel, timed_interleaved  # noqa: E402


def check_experts(got, ref_t, ins0, rows, tol):
    """ccfuse's per-expert result `got` [e, m, n] against torch's `ref_t` (all of it, 1e-2) and an
    fp32 reference on the largest and the smallest non-empty expert (tol): (res dict, ok, the
    empty experts)."""
    e = len(rows)
    res = dict(rel_err_ccfuse_vs_torch=rel(got, ref_t))
    a0, b0 = ins0
    starts = [0]
    for r in rows:
        starts.append(starts[-1] + r)
    checked = {"largest": max(range(e), key=lambda g: rows[g])}
    nonzero = [g for g in range(e) if rows[g] > 0]
    if nonzero:
        checked["smallest"] = min(nonzero, key=lambda g: rows[g])
    ok = res["rel_err_ccfuse_vs_torch"] <= 1e-2
    for what, g in checked.items():
        ref = a0[starts[g]:starts[g + 1]].float().t() @ b0[starts[g]:starts[g + 1]].float()
        res["rel_err_ccfuse_%s" % what] = rel(got[g], ref)
        res["rel_err_torch_%s" % what] = rel(ref_t[g], ref)
        ok = ok and res["rel_err_ccfuse_%s" % what] <= tol
    return res, ok, [g for g in range(e) if rows[g] == 0]


def case_setup(torch, case, out_elem_bytes, seed):
    """A case's device, sizes, rows per expert (list, and on the device with their offsets), a
    generator of uniform [-1, 1) tensors, and the rotated input sets (a [rows, m], b [rows, n]) that
    fit beside three outputs of out_elem_bytes an element."""
    dev = torch.device("cuda", 0)
    e, m, n = case["experts"], case["n"], case["k"]
    total = case["tokens"] * case["topk"]
    rows = moe_grouped.grouped_rows(e, total, case["routing"])
    counts = torch.tensor(rows, dtype=torch.int32, device=dev)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    set_bytes = 2 * total * (m + n)
    free, _ = torch.cuda.mem_get_info(dev)
    sets = max(1, min(-(-ROTATE_BYTES // set_bytes), (free - 3 * out_elem_bytes * e * m * n - (2 << 30)) // set_bytes,
                      32))
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)

    def uniform(*shape, dtype=torch.bfloat16):
        return (torch.rand(*shape, device=dev, generator=gen) * 2 - 1).to(dtype)

    ins = [(uniform(total, m), uniform(total, n)) for _ in range(sets)]
    return dev, e, m, n, total, rows, counts, offs, sets, uniform, ins


def run_case(torch, lib, case, iters, inject_fault, accumulate=False, ab_env=None):
    """ab_env: environment variables (the library's A/B switches) of a second ccfuse variant timed
    in the same rounds (and, with accumulate, checked as the default is)."""
    if accumulate:
        return run_accumulate_case(torch, lib, case, iters, inject_fault, ab_env)
    dev, e, m, n, total, rows, counts, offs, sets, _, ins = case_setup(torch, case, 2, 7)
    out_bytes = 2 * e * m * n
    ws = torch.empty(lib.grouped_gemm_workspace_bytes(e), dtype=torch.uint8, device=dev)
    outs = [torch.full((e, m, n), float("nan"), dtype=torch.bfloat16, device=dev) for _ in range(2)]
    stream = torch.cuda.current_stream(dev).cuda_stream

    def ours(i, out):
        a, b = ins[i % sets]
        lib.kgrouped_gemm(e, total, m, n, a.data_ptr(), b.data_ptr(), out.data_ptr(), counts.data_ptr(),
                          ws.data_ptr(), stream)

    def theirs(i):
        a, b = ins[i % sets]
        return torch._grouped_mm(a.t(), b, offs=offs)

    ours(0, outs[0])
    ref_t = theirs(0)
    if inject_fault:
        outs[0][max(range(e), key=lambda g: rows[g]), 0, 0] += 1000.0
    got = outs[0]
    res, ok, empty = check_experts(got, ref_t, ins[0], rows, 1e-2)
    if empty:
        res["empty_expert_zero"] = bool((got[empty[0]] == 0).all().item())
        ok = ok and res["empty_expert_zero"]
    res["ccfuse_ok"] = bool(ok)
    del ref_t
    fns = [theirs, lambda i: ours(i, outs[i % 2])]
    if ab_env:  # the same launch with the A/B variant, in the same rounds
        fns.append(with_env(ab_env, lambda i: ours(i, outs[i % 2])))
    times = timed_interleaved(torch, fns, iters)
    t_torch, t_ours = times[0], times[1]
    if ab_env:  # > 1: the default is faster than the variant
        kb = [-(-r // 64) for r in rows]
        res.update(ab_env=ab_env, t_ccfuse_ab_ms=times[2], speedup_vs_ab=times[2] / t_ours,
                   mean_kblocks_per_tile=sum(kb) / len(kb))
    flops = 2.0 * total * m * n
    res.update(t_torch_ms=t_torch, t_ccfuse_ms=t_ours, speedup_vs_torch=t_torch / t_ours,
               tflops_torch=flops / (t_torch * 1e9), tflops_ccfuse=flops / (t_ours * 1e9),
               out_gbps_torch=out_bytes / (t_torch * 1e6), out_gbps_ccfuse=out_bytes / (t_ours * 1e6),
               group_rows=rows, rotated_sets=sets)
    del ins, outs
    torch.cuda.empty_cache()
    return res


def with_env(env, fn):
    """fn with the environment variables of dict `env` set for its call (the library reads its A/B
    switches per call)."""
    def run(i):
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            fn(i)
        finally:
            for k, v in old.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    return run


def run_accumulate_case(torch, lib, case, iters, inject_fault, ab_env=None):
    dev, e, m, n, total, rows, counts, offs, sets, uniform, ins = case_setup(torch, case, 4, 11)
    acc_bytes = 4 * e * m * n
    ws = torch.empty(lib.grouped_gemm_workspace_bytes(e), dtype=torch.uint8, device=dev)
    c0 = uniform(e, m, n, dtype=torch.float32)
    acc = [c0.clone()]  # ccfuse's main_grad buffer (one: a DeepSeek-like dW1's is 14 GiB)
    theirs_acc = [c0.clone()]
    stream = torch.cuda.current_stream(dev).cuda_stream

    def ours(i):
        a, b = ins[i % sets]
        lib.kgrouped_gemm(e, total, m, n, a.data_ptr(), b.data_ptr(), acc[0].data_ptr(), counts.data_ptr(),
                          ws.data_ptr(), stream, accumulate=True)

    def theirs(i):  # Megatron without the fusion: the bf16 gradient, then main_grad += it
        a, b = ins[i % sets]
        theirs_acc[0].add_(torch._grouped_mm(a.t(), b, offs=offs))

    def theirs_f32(i):  # torch's fp32-output grouped GEMM, then the add
        a, b = ins[i % sets]
        theirs_acc[0].add_(torch._grouped_mm(a.t(), b, offs=offs, out_dtype=torch.float32))

    ours(0)
    if inject_fault:
        acc[0][max(range(e), key=lambda g: rows[g]), 0, 0] += 1000.0
    got = acc[0].sub_(c0)  # in place (memory): what was added; the buffer's later values do not matter
    del c0
    ref_t = torch._grouped_mm(ins[0][0].t(), ins[0][1], offs=offs)  # torch's bf16 gradient
    res, ok, empty = check_experts(got, ref_t, ins[0], rows, 1e-3)
    if empty:  # left as it was: c0 - c0, exactly 0
        res["empty_expert_unchanged"] = bool((got[empty[0]] == 0).all().item())
        ok = ok and res["empty_expert_unchanged"]
    if ab_env:  # the A/B variant is checked the same way: one call into the zeroed buffer
        got.zero_()
        if empty:
            got[empty[0]].fill_(float("nan"))  # must stay NaN: a group without rows adds nothing
        with_env(ab_env, ours)(0)
        ok_ab = True
        if empty:
            res["empty_expert_unchanged_ab"] = bool(torch.isnan(got[empty[0]]).all().item())
            ok_ab = res["empty_expert_unchanged_ab"]
            got[empty[0]].zero_()  # torch's gradient there: zeros
        res_ab, ok_check, _ = check_experts(got, ref_t, ins[0], rows, 1e-3)
        res.update({k + "_ab": v for k, v in res_ab.items()})
        ok = ok and ok_ab and ok_check
    res["ccfuse_ok"] = bool(ok)
    del ref_t, got
    fns = {"torch": theirs, "ccfuse": ours}
    try:
        theirs_f32(0)
        fns["torch_f32"] = theirs_f32
    except Exception as ex:  # noqa: BLE001 - this torch's grouped GEMM has no fp32 output
        res["torch_f32_out"] = "unsupported: %s" % (str(ex).splitlines() or [type(ex).__name__])[0][:160]
    if ab_env:  # the same launch with another epilogue and/or tile, in the same rounds
        fns["ab"] = with_env(ab_env, ours)
    times = dict(zip(fns, timed_interleaved(torch, list(fns.values()), iters)))
    t_torch, t_ours = times["torch"], times["ccfuse"]
    flops = 2.0 * total * m * n
    res.update(t_torch_ms=t_torch, t_ccfuse_ms=t_ours, speedup_vs_torch=t_torch / t_ours,
               tflops_torch=flops / (t_torch * 1e9), tflops_ccfuse=flops / (t_ours * 1e9),
               out_gbps_torch=2 * acc_bytes / (t_torch * 1e6), out_gbps_ccfuse=2 * acc_bytes / (t_ours * 1e6),
               group_rows=rows, rotated_sets=sets, accum_mode=os.environ.get("CCFUSE_KGROUPED_ACCUM", "tma"))
    if "torch_f32" in times:
        res.update(t_torch_f32_ms=times["torch_f32"], speedup_vs_torch_f32=times["torch_f32"] / t_ours)
    if "ab" in times:  # > 1: the default (accum_mode, the tile rule's) is faster than the ab variant
        res.update(ab_env=ab_env, t_ccfuse_ab_ms=times["ab"], speedup_vs_ab=times["ab"] / t_ours)
    del ins, acc, theirs_acc
    torch.cuda.empty_cache()
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--ccfuse-lib", required=True, help="libccfuse_c.so")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="", help="cases whose name contains this text (or one of its '|'-separated parts)")
    p.add_argument("--inject-fault", action="store_true", help="corrupt one element of ccfuse's output")
    p.add_argument("--accumulate", action="store_true",
                   help="the fp32 main_grad form: ccfuse's += against main_grad.add_(torch._grouped_mm(...))")
    p.add_argument("--ab-tile", default="", choices=["", "pingpong", "128", "256"],
                   help="also time ccfuse with CCFUSE_KGROUPED_TILE=this (same rounds; with --accumulate "
                        "together with --ab-accum's switch)")
    p.add_argument("--ab-env", action="append", default=[], metavar="NAME=VALUE",
                   help="also time ccfuse with this environment variable set (repeatable; e.g. "
                        "CCFUSE_KGROUPED_ORDER=interleave), with --ab-tile / --ab-accum's")
    p.add_argument("--ab-accum", default="", choices=["", "red", "rmw", "tma"],
                   help="with --accumulate: also time ccfuse with CCFUSE_KGROUPED_ACCUM=this (same rounds)")
    args = p.parse_args()
    ab_env = dict(kv.split("=", 1) for kv in args.ab_env)
    ab_env.update({k: v for k, v in (("CCFUSE_KGROUPED_ACCUM", args.ab_accum),
                                     ("CCFUSE_KGROUPED_TILE", args.ab_tile)) if v})
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    from ccfuse._capi import Ccfuse  # noqa: E402
    lib = Ccfuse(args.ccfuse_lib)
    gpu = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    wrong, ratios = [], []
    with open(args.json, "a") as f:
        for case in moe_grouped.cases():
            if args.only and not any(part in case["name"] for part in args.only.split("|")):
                continue
            total = case["tokens"] * case["topk"]
            rec = dict(op="moe_wgrad_accum_f32" if args.accumulate else "moe_wgrad", source="ccfuse+torch", world_size=1, m=case["n"], n=case["k"], k=total,
                       dtype="bf16", gpu=gpu, date=date, commit=os.environ.get("CCFUSE_COMMIT", "unknown"),
                       command=" ".join(sys.argv), torch=torch.__version__, experts=case["experts"],
                       topk=case["topk"], tokens_per_rank=case["tokens"], routing=case["routing"],
                       name=case["name"].replace("-up-", "-dW1-").replace("-down-", "-dW2-"),
                       tokens_per_gpu=case["tokens_per_gpu"])
            try:
                rec.update(run_case(torch, lib, case, args.iters, args.inject_fault, args.accumulate, ab_env))
                ratios.append(rec["speedup_vs_torch"])
                print("%-22s %-10s torch %8.4f ms (%5.1f TFLOP/s, %5.0f GB/s out)  ccfuse %8.4f ms (%5.1f TFLOP/s, "
                      "%5.0f GB/s out)  x%.3f  %s" % (
                          rec["name"], rec["routing"], rec["t_torch_ms"], rec["tflops_torch"], rec["out_gbps_torch"],
                          rec["t_ccfuse_ms"], rec["tflops_ccfuse"], rec["out_gbps_ccfuse"], rec["speedup_vs_torch"],
                          "ok" if rec["ccfuse_ok"] else "WRONG")
                      + ("  (torch fp32-out %.4f ms)" % rec["t_torch_f32_ms"] if "t_torch_f32_ms" in rec else "")
                      + ("  (ccfuse %s %.4f ms: x%.3f)" % (
                          " ".join("%s=%s" % (k.replace("CCFUSE_KGROUPED_", ""), v) for k, v in rec["ab_env"].items()),
                          rec["t_ccfuse_ab_ms"],
                          rec["speedup_vs_ab"]) if "t_ccfuse_ab_ms" in rec else ""),
                      flush=True)
                if not rec["ccfuse_ok"]:
                    wrong.append("%s %s" % (rec["name"], rec["routing"]))
            except Exception as e:  # noqa: BLE001 - a refused case is recorded, not fatal
                rec.update(error="%s: %s" % (type(e).__name__, e))
                wrong.append("%s %s (error)" % (rec["name"], rec["routing"]))
                print("%-22s %-10s failed: %s" % (rec["name"], rec["routing"], rec["error"]), flush=True)
            f.write(json.dumps(rec) + "\n")
            f.flush()
    if ratios:
        geo = 1.0
        for r in ratios:
            geo *= r
        print("geomean speedup of ccfuse's K-grouped GEMM over torch._grouped_mm: x%.3f over %d cases" % (
            geo ** (1.0 / len(ratios)), len(ratios)), flush=True)
    if wrong:
        print("ccfuse's K-grouped GEMM was WRONG on: %s" % ", ".join(wrong), flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
