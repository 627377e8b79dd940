"""ccfuse.layers.MoeLayer for inference under CUDA graphs, as a serving engine (vLLM, SGLang) runs its
decode steps: the whole layer (gate, ccfuse's GPU router, the fused MoE FFN) captured once per
token count with torch.cuda.graph and replayed on new tokens, at W ranks, on GPUs.

    python3 -m torch.distributed.run --nproc-per-node W tools/torch_moe_graph_check.py \
        --ccfuse-lib build/libccfuse_c.so [--json OUT.jsonl] [--inject-fault]

Per case (a layer shape, a router setting, a token count T <= max_tokens) on every rank: a few eager
calls (warm-up: lazy allocations happen outside the capture), one capture under torch.no_grad(),
then --replays replays, each on fresh random tokens copied into the captured input and with the
captured output poisoned (NaN) first. Each replay's output must equal an eager call's on the same
tokens bit for bit (the layer is deterministic) and be within --tol (relative, norm) of an fp32
torch reference over all experts (every rank draws the whole layer's weights from one seed and
loads its own shard; the reference takes the routing ids from ccfuse's router on the same logits,
which tools/torch_router_check.py checks against torch.topk), and the router's dropped count must
be 0 where dropless. Then the per-call time of the eager layer and of a replay, wall clock over
--iters back-to-back calls (one host sync at the end: what a decode step's host costs, not only
its GPU time) and by CUDA events. --inject-fault perturbs one replay's output on rank 0 before
the checks: they must then fail (exit 1). The capture runs in torch's default "global" error mode
(any unsafe CUDA call during it fails it); if that fails the case fails, and it is captured again in
"thread_local" mode so that the rest is still measured.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from ccfuse import layers  # noqa: E402
from ccfuse import torch_ops as cf  # noqa: E402
import torch_check_common as common  # noqa: E402 (tools/, the script's own folder)
from torch_layers_check import load_shard  # noqa: E402 (the same folder)


def reference(x, gate, w1, w2, topk, score, capacity, bias):
    """fp32 forward of the whole layer (all experts) for this rank's tokens x [T, H]."""
    f = w2.shape[2]
    xf = x.float()
    logits = torch.nn.functional.linear(xf, gate)
    ids, _, _, _ = cf.route(logits.contiguous(), topk, bias=bias, score=score, normalize=True,
                            capacity_factor=capacity)
    scores = torch.softmax(logits, -1) if score == "softmax" else torch.sigmoid(logits)
    steer = scores if bias is None else scores + bias
    chosen = torch.topk(steer, topk, dim=1).indices
    w = scores.gather(1, ids.long().clamp_min(0)) / scores.gather(1, chosen).sum(1, keepdim=True)
    w = torch.where(ids >= 0, w, torch.zeros_like(w))
    y = torch.zeros_like(xf)
    for e in range(w1.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel():
            hr = xf[tok] @ w1[e].float().t()
            a = torch.nn.functional.silu(hr[:, :f]) * hr[:, f:]
            y.index_add_(0, tok, w[tok, slot].unsqueeze(1) * (a @ w2[e].float().t()))
    return y


def per_call_ms(fn, iters):
    """(wall-clock ms a call over `iters` back-to-back calls, median CUDA-event ms of single calls)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / iters
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return wall, statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ccfuse-lib", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--seed", type=int, default=131)
    ap.add_argument("--small", action="store_true", help="only the small shape (quick)")
    ap.add_argument("--inject-fault", action="store_true")
    args = ap.parse_args()
    r, w, dev = common.start(cf, args.ccfuse_lib)
    meta = common.meta("torch_moe_graph_check", dev)
    # (name, H, F, experts per rank, top-k, score, capacity factor, expert bias, max_tokens, token counts)
    shapes = [("small_softmax_top2", 512, 256, 4, 2, "softmax", 0.0, False, 256, (1, 64, 256)),
              ("small_softmax_top2_capacity1", 512, 256, 4, 2, "softmax", 1.0, False, 256, (64, 256)),
              ("small_sigmoid_top4_bias", 512, 256, 4, 4, "sigmoid", 0.0, True, 256, (64,))]
    if not args.small:  # Qwen3-30B-A3B-like: 128 experts over the ranks, top-8
        shapes.append(("qwen3_like", 2048, 768, 128 // w, 8, "softmax", 0.0, False, 256, (64, 256)))
    if args.inject_fault:
        shapes = shapes[:1]
    failures, records = 0, []
    for si, (name, H, F, epr, k, score, capacity, has_bias, max_tokens, token_counts) in enumerate(shapes):
        E = epr * w
        gen = torch.Generator().manual_seed(args.seed + 7919 * si)
        gate = (torch.randn(E, H, generator=gen) * H ** -0.5).to(dev)
        w1 = (torch.randn(E, 2 * F, H, generator=gen) * H ** -0.5).to(torch.bfloat16).to(dev)
        w2 = (torch.randn(E, H, F, generator=gen) * F ** -0.5).to(torch.bfloat16).to(dev)
        bias = (0.02 * torch.randn(E, generator=gen)).to(dev) if has_bias else None
        layer = layers.MoeLayer(H, F, E, k, max_tokens=max_tokens, score=score, capacity_factor=capacity,
                                bias_update_rate=1e-3 if has_bias else 0.0, device=dev)
        layer.eval()
        load_shard(layer, gate, w1, w2, bias, r, w)
        for t in token_counts:
            tgen = torch.Generator().manual_seed(args.seed + 1000003 * r + 101 * si + t)
            fresh = lambda: torch.randn(t, H, generator=tgen).to(torch.bfloat16).to(dev)  # noqa: E731
            x_static = fresh()
            with torch.no_grad():
                side = torch.cuda.Stream(dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):  # warm-up as torch's graph docs ask: on a side stream
                    for _ in range(3):
                        layer(x_static)
                torch.cuda.current_stream(dev).wait_stream(side)
                # "global" (torch's default, what serving engines use: any unsafe CUDA call by any
                # thread during the capture fails it); "thread_local" only if that failed (recorded).
                mode, capture_error = "global", None
                try:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, capture_error_mode="global"):
                        y_static = layer(x_static)
                except RuntimeError as exc:
                    capture_error, mode = str(exc)[:300], "thread_local"
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                        y_static = layer(x_static)
                case_ok, errs, diffs, dropped = True, [], [], 0
                for rep in range(args.replays):
                    x_static.copy_(fresh())
                    y_static.fill_(float("nan"))
                    graph.replay()
                    got = y_static.clone()
                    if args.inject_fault and r == 0 and rep == args.replays - 1:
                        got[0, 0] += 1.0
                    eager = layer(x_static)
                    dropped = int(layer.last_dropped.item())
                    same = bool(torch.equal(got, eager))
                    err = common.rel(got, reference(x_static, gate, w1, w2, k, score, capacity, bias))
                    ok = same and err <= args.tol and bool(torch.isfinite(got).all()) and (capacity > 0 or dropped == 0)
                    case_ok &= ok
                    errs.append(err)
                    diffs.append(0.0 if same else common.rel(got, eager))
                t_eager = per_call_ms(lambda: layer(x_static), args.iters)
                t_graph = per_call_ms(graph.replay, args.iters)
            case_ok &= capture_error is None
            failures += 0 if case_ok else 1
            label = "%s:T%d" % (name, t)
            records.append({**meta, "case": label, "tokens": t, "max_tokens": max_tokens, "hidden": H, "ffn": F,
                            "experts": E, "topk": k, "ok": case_ok, "replays": args.replays, "capture_mode": mode,
                            "capture_global_error": capture_error,
                            "rel_err_fp32_max": max(errs), "rel_diff_vs_eager_max": max(diffs), "dropped": dropped,
                            "t_eager_wall_ms": t_eager[0], "t_eager_event_ms": t_eager[1],
                            "t_graph_wall_ms": t_graph[0], "t_graph_event_ms": t_graph[1]})
            print("rank %d %-36s rel_err(fp32) %.2e  vs eager %s  eager %.3f ms (events %.3f)  graph %.3f ms "
                  "(events %.3f)  %s%s" % (r, label, max(errs), "bitwise" if max(diffs) == 0 else "%.2e" % max(diffs),
                                           t_eager[0], t_eager[1], t_graph[0], t_graph[1], "ok" if case_ok else "FAIL",
                                           "" if capture_error is None else "  (global capture failed: %s)" %
                                           capture_error[:120]), flush=True)
            del graph
        layer.experts.close()
    common.finish(cf, "torch_moe_graph_check", records, failures, args.json, dev)


if __name__ == "__main__":
    main()
