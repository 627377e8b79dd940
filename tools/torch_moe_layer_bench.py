#!/usr/bin/env python3
"""The serial MoE-layer baseline of DESIGN §5 (issue 5): a Megatron-style expert-parallel MoE FFN
in PyTorch + NCCL, timed whole and in parts, one process per GPU:

    python3 -m torch.distributed.run --nproc-per-node 2 tools/torch_moe_layer_bench.py \\
        --json OUT.jsonl [--model mixtral qwen3 deepseek] [--tokens 4096 8192 16384] \\
        [--routing uniform zipf] [--dispatch alltoall allgather] [--iters 20] [--warmup 5]

Per (model, tokens per rank, routing, dispatch) rank 0 appends one JSON line (DESIGN §5 format,
op "moe_layer_serial"; m = tokens per rank, n = H, k = F).

The layer (experts split evenly over the W ranks, E/W contiguous experts each; x [T, H] bf16 and
router logits [T, E] fp32 per rank; per local expert W1 [2F, H] (gate rows, then up rows) and
W2 [H, F], bf16):
  * routing: top-k of the logits, weights = softmax over the chosen k (fp32). The logits are
    log(p_e) + Gumbel noise, so the top-k is a draw of k distinct experts with probabilities
    p_e: uniform, or Zipf p_e ~ 1 / (e + 1) ** 1.2 (tools/moe_grouped.py's exponent).
  * alltoall (Megatron's "alltoall" dispatcher): permute the T*k (token, expert) rows by expert
    (argsort; experts are contiguous per rank, so also by destination rank), all_to_all_single of
    the per-expert counts, a host sync for the split sizes (as Megatron does; counted),
    all_to_all_single of the rows, local sort (source rank, expert) -> (expert, source rank),
    grouped GEMM gate/up (torch._grouped_mm), SwiGLU silu(gate) * up, grouped GEMM down, unsort,
    the inverse all_to_all_single, weighted unpermute (index_add in fp32, then bf16).
  * allgather: all_gather_into_tensor of x, the expert ids and the weights; every rank takes the
    rows routed to its experts (a host sync for their count), the same expert FFN, a weighted
    scatter-add into [W*T, H] (fp32, then bf16), reduce_scatter_tensor back to [T, H].
Timing (CUDA events, a barrier before each run, median of --iters after --warmup; each number is
the max over ranks of the per-rank medians): t_serial the whole layer (routing top-k included,
router GEMM not); t_gemm the two grouped GEMMs + SwiGLU alone on the permuted local rows of the
first run; t_comm the communication calls alone on the same byte counts (the two token
all-to-alls; or the three all-gathers + the reduce-scatter), also apart (t_dispatch/t_combine or
t_allgather/t_reduce_scatter); t_limit = max(t_gemm, t_comm); t_fused and t_peer null.
Weights total > 0.5 GB per rank for every model (past the 60 MB L2), so nothing is rotated.
Correctness: on the first run, 64 tokens per rank against an fp64 dense reference that
regenerates every expert's weights from its own seed (so a remote expert too); rel_err is the max
over ranks of ||out - ref|| / ||ref|| (bf16 tolerance 1e-2).

Without torch._grouped_mm (or when it fails a small probe) the GEMMs run as a loop of matmuls per
expert and the record says grouped_mm "matmul-loop". The torch-free helpers (arguments, cases,
Zipf probabilities, a pure-Python twin of the routing, split sizes, records) import without torch
(tests/python/test_torch_moe_layer_bench.py). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).

With --ccfuse-lib PATH (libccfuse_c.so), ccfuse's fused MoE FFN (C ABI, the MoE tuner's
configuration for the case's routing skew) runs in this process on the same x, routing and
expert weights (W1's rows permuted into ccfuse_swiglu_permutation order), alltoall cases only:
timed in the same rounds as the serial layer (t_serial_paired_ms, t_ccfuse_inproc_ms), checked
against the fp64 reference on the sampled tokens (rel_err_ccfuse) and against the serial layer's
output (rel_diff_ccfuse_vs_serial); its output is NaN-poisoned before the checked run.
"""
import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before torch (NCCL) is imported: multicast stays off
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

OP = "moe_layer_serial"
ZIPF_EXPONENT = 1.2  # as tools/moe_grouped.py: expert e (0-based) gets p ~ 1 / (e + 1) ** 1.2
REL_TOL = 1e-2  # bf16
# name: (H, E, topk, F)
MODELS = {
    "mixtral": (4096, 8, 2, 14336),   # Mixtral-8x7B
    "qwen3": (2048, 128, 8, 768),     # Qwen3-30B-A3B
    "deepseek": (7168, 256, 8, 2048),  # DeepSeek-V3-like
}
MODEL_ALIASES = {"dsv3": "deepseek"}
TOKENS = (4096, 8192, 16384)
ROUTINGS = ("uniform", "zipf")
DISPATCHES = ("alltoall", "allgather")
SEED = 20261129


# ---- torch-free helpers ---------------------------------------------------------------------

def zipf_probs(experts, routing="zipf", exponent=ZIPF_EXPONENT):
    """Probability of each expert for one draw: uniform, or p_e ~ 1 / (e + 1) ** exponent."""
    if experts < 1:
        raise ValueError("experts must be at least 1")
    if routing == "uniform":
        return [1.0 / experts] * experts
    if routing != "zipf":
        raise ValueError("unknown routing %r (known: %s)" % (routing, ", ".join(ROUTINGS)))
    w = [1.0 / math.pow(e + 1, exponent) for e in range(experts)]
    s = sum(w)
    return [x / s for x in w]


def log_probs(experts, routing):
    return [math.log(p) for p in zipf_probs(experts, routing)]


def softmax(values):
    m = max(values)
    ex = [math.exp(v - m) for v in values]
    s = sum(ex)
    return [v / s for v in ex]


def route_python(rng, tokens, experts, topk, routing):
    """Pure-Python twin of the torch routing: per token, logits log(p_e) + Gumbel noise, the
    top-k of them (k distinct experts drawn with probabilities p_e, without replacement) and
    weights softmax-normalised over those k. rng: random.Random. Returns (ids, weights), lists of
    `tokens` lists of `topk` (ids in decreasing logit order)."""
    if not 1 <= topk <= experts:
        raise ValueError("topk must be in [1, experts]")
    lp = log_probs(experts, routing)
    ids, weights = [], []
    for _ in range(tokens):
        logits = []
        for e in range(experts):
            u = rng.random()
            while u <= 0.0:
                u = rng.random()
            logits.append(lp[e] - math.log(-math.log(u)))
        top, w = topk_softmax(logits, topk)
        ids.append(top)
        weights.append(w)
    return ids, weights


def topk_softmax(logits, topk):
    """One token: the topk largest logits' indices (largest first, ties to the lower index) and
    the softmax over those k values (route_torch's twin)."""
    top = sorted(range(len(logits)), key=lambda e: (-logits[e], e))[:topk]
    return top, softmax([logits[e] for e in top])


def local_experts(experts, world, rank):
    """[lo, hi): the contiguous experts rank `rank` holds (E/W each)."""
    if experts % world:
        raise ValueError("%d experts do not split evenly over %d ranks" % (experts, world))
    n = experts // world
    return rank * n, (rank + 1) * n


def expert_counts(ids, experts):
    """Rows per expert of a routing (ids: lists of expert ids per token)."""
    counts = [0] * experts
    for row in ids:
        for e in row:
            counts[e] += 1
    return counts


def rank_splits(counts, world):
    """Per-expert counts (E) -> rows per destination rank (W); experts contiguous per rank."""
    n = len(counts) // world
    if n * world != len(counts):
        raise ValueError("%d experts do not split evenly over %d ranks" % (len(counts), world))
    return [sum(counts[r * n:(r + 1) * n]) for r in range(world)]


def group_offsets(recv_counts, world):
    """recv_counts: flat [W * E_local] rows received from (source rank, local expert) ->
    (rows per local expert, int32-style cumulative row ends for torch._grouped_mm)."""
    n = len(recv_counts) // world
    if n * world != len(recv_counts):
        raise ValueError("counts do not split evenly over %d ranks" % world)
    rows = [sum(recv_counts[s * n + e] for s in range(world)) for e in range(n)]
    offs, acc = [], 0
    for r in rows:
        acc += r
        offs.append(acc)
    return rows, offs


def gemm_flops(rows, hidden, ffn):
    """Useful FLOPs of the expert FFN on `rows` rows: gate/up [rows, H] x [H, 2F] + down."""
    return 2.0 * rows * (2 * ffn * hidden + hidden * ffn)


def parse_model(text):
    """mixtral | qwen3 | deepseek (dsv3), or NAME:H,E,TOPK,F for another shape."""
    if ":" in text:
        name, spec = text.split(":", 1)
        try:
            h, e, topk, f = (int(v) for v in spec.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError("custom model is NAME:H,E,TOPK,F, got %r" % text)
        if min(h, e, topk, f) < 1 or topk > e:
            raise argparse.ArgumentTypeError("bad custom model %r" % text)
        return name, (h, e, topk, f)
    name = MODEL_ALIASES.get(text, text)
    if name not in MODELS:
        raise argparse.ArgumentTypeError("unknown model %r (known: %s, or NAME:H,E,TOPK,F)" %
                                         (text, ", ".join(sorted(MODELS))))
    return name, MODELS[name]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--json", required=True, help="append one JSON line per case (rank 0)")
    p.add_argument("--model", type=parse_model, nargs="+", default=[parse_model(m) for m in MODELS])
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="tokens per rank")
    p.add_argument("--routing", nargs="+", choices=ROUTINGS, default=list(ROUTINGS))
    p.add_argument("--dispatch", nargs="+", choices=DISPATCHES, default=list(DISPATCHES))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sample", type=int, default=64, help="tokens per rank checked against the reference")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--ccfuse-lib", help="libccfuse_c.so: also run ccfuse's fused MoE FFN in the same rounds")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: gloo and wall-clock timing, for testing the logic only")
    args = p.parse_args(argv)
    if min(args.tokens) < 1 or args.iters < 1 or args.warmup < 0 or args.sample < 1:
        p.error("tokens, iters and sample must be positive, warmup not negative")
    return args


def cases(args):
    """Dicts in run order (model outermost, so its weights are made once): model, hidden,
    experts, topk, ffn, tokens, routing, dispatch."""
    out = []
    for name, (h, e, topk, f) in args.model:
        for t in args.tokens:
            for routing in args.routing:
                for dispatch in args.dispatch:
                    out.append(dict(model=name, hidden=h, experts=e, topk=topk, ffn=f, tokens=t,
                                    routing=routing, dispatch=dispatch))
    return out


def git_commit():
    # The staged build's commit first (tools/gpu_run.sh exports it): the GPU machine's copy of the
    # tree may carry an older .git.
    if os.environ.get("CCFUSE_COMMIT"):
        return os.environ["CCFUSE_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                           text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def utc_date():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_record(case, world, gpu, commit, date, times, rel_err, grouped_mm, rows_per_rank, notes, **extra):
    """One DESIGN §5 record. times: t_serial, t_gemm, t_comm (ms, max over ranks) and any more
    t_* parts; rows_per_rank: rows each rank's experts computed (tflops_gemm uses the busiest)."""
    t_gemm, t_comm = times["t_gemm"], times["t_comm"]
    rows = max(rows_per_rank) if rows_per_rank else 0
    rec = dict(op=OP, world_size=world, m=case["tokens"], n=case["hidden"], k=case["ffn"], dtype="bf16",
               gpu=gpu, commit=commit, date=date, model=case["model"], experts=case["experts"],
               topk=case["topk"], tokens_per_rank=case["tokens"], routing=case["routing"],
               dispatch=case["dispatch"], t_fused_ms=None, t_serial_ms=times["t_serial"], t_gemm_ms=t_gemm,
               t_comm_ms=t_comm, t_limit_ms=max(t_gemm, t_comm), t_peer_ms=None, rel_err=rel_err,
               rel_tol=REL_TOL, check="PASS" if rel_err is not None and rel_err <= REL_TOL else "FAIL",
               grouped_mm=grouped_mm,
               tflops_gemm=gemm_flops(rows, case["hidden"], case["ffn"]) / (t_gemm * 1e9) if t_gemm > 0 else None,
               rows_per_rank=list(rows_per_rank), notes=notes)
    for key, value in sorted(times.items()):
        if key not in ("t_serial", "t_gemm", "t_comm"):
            rec[key + "_ms"] = value
    rec.update(extra)
    return rec


def format_line(rec):
    parts = " ".join("%s %.3f" % (k[2:-3], v) for k, v in sorted(rec.items())
                     if k.startswith("t_") and k.endswith("_ms") and v is not None
                     and k not in ("t_serial_ms", "t_gemm_ms", "t_comm_ms", "t_limit_ms"))
    return ("%-9s T=%-5d %-7s %-9s serial %8.3f  gemm %8.3f (%4.0f TFLOP/s)  comm %6.3f [%s]  limit %8.3f  "
            "rel_err %.2e %s  rows %s" %
            (rec["model"], rec["tokens_per_rank"], rec["routing"], rec["dispatch"], rec["t_serial_ms"],
             rec["t_gemm_ms"], rec["tflops_gemm"] or 0.0, rec["t_comm_ms"], parts, rec["t_limit_ms"],
             rec["rel_err"] if rec["rel_err"] is not None else float("nan"), rec["check"], rec["rows_per_rank"]) +
            ("  ccfuse rel_err %.2e, vs serial %.2e" % (rec["rel_err_ccfuse"], rec["rel_diff_ccfuse_vs_serial"])
             if rec.get("rel_err_ccfuse") is not None else ""))


NOTES = {
    "alltoall": "Megatron alltoall dispatcher; t_serial includes routing top-k+softmax (no router GEMM), the "
                "counts all_to_all and its host sync for the split sizes; t_comm = dispatch + combine "
                "all_to_all_single of the token rows on the same splits",
    "allgather": "Megatron allgather dispatcher; t_serial includes routing top-k+softmax (no router GEMM) and a "
                 "host sync for the local row count; t_comm = all_gather_into_tensor of x, ids, weights + "
                 "reduce_scatter_tensor of the bf16 partial outputs",
}


# ---- the layer (torch) ----------------------------------------------------------------------

def route_torch(torch, logits, topk):
    """Top-k of the router logits; weights = softmax over the chosen k (fp32)."""
    vals, ids = torch.topk(logits.float(), topk, dim=-1)
    return ids, torch.softmax(vals, dim=-1)


class Bench:
    def __init__(self, args):
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        self.torch, self.dist, self.F = torch, dist, F
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if args.device == "cuda":
            local = int(os.environ.get("LOCAL_RANK", self.rank))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            dist.init_process_group("nccl", device_id=self.device)
            self.gpu = torch.cuda.get_device_name(self.device)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo")
            self.gpu = "cpu"
        self.bf16 = torch.bfloat16
        self.model = None  # name of the model whose weights are loaded
        self.ccfuse = None
        if getattr(args, "ccfuse_lib", None):
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
            from ccfuse import _capi
            self.ccfuse = _capi.Ccfuse(args.ccfuse_lib)
            self.ccfuse.init_from_env()
        self.grouped_mm = self._probe_grouped_mm()

    # -- helpers
    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _probe_grouped_mm(self):
        """torch._grouped_mm when it exists and gets a small uneven case right on every rank."""
        torch = self.torch
        fn = getattr(torch, "_grouped_mm", None)
        ok = 0
        if fn is not None:
            try:
                g = torch.Generator(device=self.device).manual_seed(7)
                a = torch.randn(40, 64, generator=g, device=self.device).to(self.bf16)
                w = torch.randn(3, 48, 64, generator=g, device=self.device).to(self.bf16)  # [G, N, K]
                offs_host = [13, 13, 40]  # uneven, one empty group
                out = fn(a, w.transpose(-2, -1), offs=torch.tensor(offs_host, dtype=torch.int32, device=self.device))
                ref = self._matmul_loop(a, w.transpose(-2, -1), offs_host)
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                ok = 1 if err < 1e-2 else 0
            except Exception as e:  # noqa: BLE001 - any refusal means the fallback
                if self.rank == 0:
                    print("torch._grouped_mm probe failed (%s: %s): using a matmul loop" % (type(e).__name__, e),
                          flush=True)
        flag = torch.tensor([ok], dtype=torch.int32, device=self.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN)
        return "torch._grouped_mm" if int(flag.item()) else "matmul-loop"

    def _matmul_loop(self, a, bt, offs_host):
        out = a.new_empty(a.shape[0], bt.shape[-1])
        lo = 0
        for g, hi in enumerate(offs_host):
            if hi > lo:
                out[lo:hi] = a[lo:hi] @ bt[g]
            lo = hi
        return out

    def gmm(self, a, bt, offs, offs_host):
        """a [rows, K] @ bt[g] [K, N] per group g of rows (offs: int32 cumulative ends)."""
        if a.shape[0] == 0:
            return a.new_empty(0, bt.shape[-1])
        if self.grouped_mm == "torch._grouped_mm":
            return self.torch._grouped_mm(a, bt, offs=offs)
        return self._matmul_loop(a, bt, offs_host)

    def expert_ffn(self, xs, offs, offs_host):
        """SwiGLU expert FFN on rows sorted by local expert."""
        h = self.gmm(xs, self.w1t, offs, offs_host)  # [rows, 2F]: gate | up
        f = self.w1t.shape[-1] // 2
        a = self.F.silu(h[:, :f]) * h[:, f:]
        return self.gmm(a, self.w2t, offs, offs_host)  # [rows, H]

    def expert_weights(self, e, h, f):
        """Expert e's (W1 [2F, H], W2 [H, F]) bf16, from its own seed (any rank can remake it)."""
        torch = self.torch
        g = torch.Generator(device=self.device).manual_seed(self.args.seed * 1000 + 17 + e)
        w1 = (torch.randn(2 * f, h, generator=g, device=self.device) * (1.0 / math.sqrt(h))).to(self.bf16)
        w2 = (torch.randn(h, f, generator=g, device=self.device) * (1.0 / math.sqrt(f))).to(self.bf16)
        return w1, w2

    def load_model(self, case):
        if self.model == case["model"]:
            return
        torch = self.torch
        self.w1t = self.w2t = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        h, e, f = case["hidden"], case["experts"], case["ffn"]
        self.lo, self.hi = local_experts(e, self.world, self.rank)
        n = self.hi - self.lo
        w1 = torch.empty(n, 2 * f, h, dtype=self.bf16, device=self.device)
        w2 = torch.empty(n, h, f, dtype=self.bf16, device=self.device)
        for i in range(n):
            a, b = self.expert_weights(self.lo + i, h, f)
            w1[i].copy_(a)
            w2[i].copy_(b)
        self.w1t = w1.transpose(-2, -1)  # [E_local, H, 2F], column-major per expert (no copy)
        if self.ccfuse is not None:  # ccfuse's W1: rows in its SwiGLU tile order, W2 as is ([H, F])
            perm = torch.tensor(self.ccfuse.swiglu_permutation(f), dtype=torch.long, device=self.device)
            self.w1_ccfuse = w1.index_select(1, perm).contiguous()
            self.w2_ccfuse = w2.contiguous()
        self.w2t = w2.transpose(-2, -1)  # [E_local, F, H]
        # (source rank, local expert) -> local expert, for the local sort after the all-to-all
        self.pattern = torch.arange(n, device=self.device).repeat(self.world)
        self.model = case["model"]

    def make_inputs(self, case):
        torch = self.torch
        t, h, e = case["tokens"], case["hidden"], case["experts"]
        g = torch.Generator(device=self.device).manual_seed(self.args.seed + 7919 * self.rank + t)
        x = torch.randn(t, h, generator=g, device=self.device).to(self.bf16)
        lp = torch.tensor(log_probs(e, case["routing"]), dtype=torch.float32, device=self.device)
        u = torch.rand(t, e, generator=g, device=self.device).clamp_(min=1e-20, max=1.0 - 1e-7)
        logits = lp - torch.log(-torch.log(u))  # Gumbel-top-k: k distinct experts drawn with p_e
        return x, logits

    def route(self, logits, topk):
        return route_torch(self.torch, logits, topk)

    # -- the serial layers
    def layer_alltoall(self, x, logits, topk, keep=None):
        torch, dist = self.torch, self.dist
        t, h = x.shape
        e = logits.shape[1]
        ids, w = self.route(logits, topk)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # by expert, hence by destination rank
        tok = order // topk
        w_sorted = w.reshape(-1)[order]
        x_perm = x.index_select(0, tok)  # [T*k, H]
        counts = torch.bincount(flat, minlength=e)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)  # [W * E_local] from (source rank, local expert)
        host = torch.cat([counts, recv_counts]).tolist()  # the host sync for the split sizes
        in_splits = rank_splits(host[:e], self.world)
        out_splits = rank_splits(host[e:], self.world)  # rows from each source rank
        rows = sum(out_splits)
        recv = x.new_empty(rows, h)
        dist.all_to_all_single(recv, x_perm, out_splits, in_splits)
        _, offs_host = group_offsets(host[e:], self.world)
        offs = torch.tensor(offs_host, dtype=torch.int32).to(self.device, non_blocking=True)
        row_e = torch.repeat_interleave(self.pattern, recv_counts, output_size=rows)
        perm = torch.argsort(row_e, stable=True)  # (source, expert) -> (expert, source)
        xs = recv.index_select(0, perm)
        y = self.expert_ffn(xs, offs, offs_host)
        y_recv = torch.empty_like(y).index_copy_(0, perm, y)
        back = x.new_empty(t * topk, h)
        dist.all_to_all_single(back, y_recv, in_splits, out_splits)
        out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
        out.index_add_(0, tok, back.float() * w_sorted.unsqueeze(1))
        if keep is not None:
            keep.update(xs=xs, offs=offs, offs_host=offs_host, rows=rows, x_perm=x_perm, recv=recv,
                        y_recv=y_recv, back=back, in_splits=in_splits, out_splits=out_splits)
        return out.to(self.bf16)

    def layer_allgather(self, x, logits, topk, keep=None):
        torch, dist = self.torch, self.dist
        t, h = x.shape
        n = self.hi - self.lo
        ids, w = self.route(logits, topk)
        x_all = x.new_empty(self.world * t, h)
        ids_all = torch.empty(self.world * t, topk, dtype=torch.int32, device=x.device)
        w_all = torch.empty(self.world * t, topk, dtype=torch.float32, device=x.device)
        ids32 = ids.to(torch.int32)
        dist.all_gather_into_tensor(x_all, x)
        dist.all_gather_into_tensor(ids_all, ids32)
        dist.all_gather_into_tensor(w_all, w)
        local = ids_all.reshape(-1).long() - self.lo
        key = torch.where((local >= 0) & (local < n), local, torch.full_like(local, n))  # n = not here
        order = torch.argsort(key, stable=True)
        counts = torch.bincount(key, minlength=n + 1)
        host = counts.tolist()  # the host sync for the local row count
        rows = sum(host[:n])
        sel = order[:rows]
        tok = sel // topk
        offs_host, acc = [], 0
        for r in host[:n]:
            acc += r
            offs_host.append(acc)
        offs = torch.tensor(offs_host, dtype=torch.int32).to(self.device, non_blocking=True)
        xs = x_all.index_select(0, tok)
        y = self.expert_ffn(xs, offs, offs_host)
        part = torch.zeros(self.world * t, h, dtype=torch.float32, device=x.device)
        part.index_add_(0, tok, y.float() * w_all.reshape(-1)[sel].unsqueeze(1))
        part = part.to(self.bf16)
        out = x.new_empty(t, h)
        dist.reduce_scatter_tensor(out, part)
        if keep is not None:
            keep.update(xs=xs, offs=offs, offs_host=offs_host, rows=rows, x=x, ids32=ids32, w=w, x_all=x_all,
                        ids_all=ids_all, w_all=w_all, part=part, out=out)
        return out

    # -- reference and timing
    def reference(self, x, logits, topk, idx, h, f):
        """fp64 dense MoE FFN of tokens idx, every expert's weights remade from its seed."""
        torch = self.torch
        ids, w = self.route(logits[idx], topk)
        xs = x[idx].double()
        ref = torch.zeros_like(xs)
        for e in sorted(set(ids.reshape(-1).tolist())):
            w1, w2 = self.expert_weights(e, h, f)
            w1, w2 = w1.double(), w2.double()
            ti, slot = (ids == e).nonzero(as_tuple=True)
            hh = xs[ti] @ w1.t()
            a = self.F.silu(hh[:, :f]) * hh[:, f:]
            ref.index_add_(0, ti, (a @ w2.t()) * w[ti, slot].double().unsqueeze(1))
        return ref

    def time_ms(self, fn):
        torch, dist = self.torch, self.dist
        times = []
        for i in range(self.args.warmup + self.args.iters):
            dist.barrier()
            if self.device.type == "cuda":
                s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                t.record()
                t.synchronize()
                ms = s.elapsed_time(t)
            else:
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
            if i >= self.args.warmup:
                times.append(ms)
        return statistics.median(times)

    def time_paired_ms(self, fns):
        """Medians of each of fns, one run of each per round, in turn (CUDA events)."""
        torch, dist = self.torch, self.dist
        times = [[] for _ in fns]
        for i in range(self.args.warmup + self.args.iters):
            for fn, ts in zip(fns, times):
                dist.barrier()
                s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                t.record()
                t.synchronize()
                if i >= self.args.warmup:
                    ts.append(s.elapsed_time(t))
        return [statistics.median(ts) for ts in times]

    def ccfuse_case(self, case, x, logits, topk, layer, idx, ref):
        """ccfuse's fused MoE FFN on the same inputs: its figures for the record."""
        torch, dist = self.torch, self.dist
        t, h, f, e = case["tokens"], case["hidden"], case["ffn"], case["experts"]
        ids, w = self.route(logits, topk)
        ids32 = ids.to(torch.int32).contiguous()
        w32 = w.to(torch.float32).contiguous()
        # The routing skew for the tuner: the most rows a rank receives over the mean.
        counts = torch.bincount(ids32.reshape(-1).long(), minlength=e).to(torch.float64)
        dist.all_reduce(counts)
        per_rank = counts.reshape(self.world, -1).sum(1)
        imbalance = float(per_rank.max() / per_rank.mean()) if float(per_rank.sum()) > 0 else 1.0
        ffn = self.ccfuse.moe_ffn_create(t, h, f, e, topk, swiglu=True, b_kn=False, imbalance=imbalance)
        out = torch.full((t, h), float("nan"), dtype=self.bf16, device=self.device)
        stream = torch.cuda.current_stream().cuda_stream

        def ours():
            ffn.run(x.data_ptr(), t, ids32.data_ptr(), w32.data_ptr(), self.w1_ccfuse.data_ptr(),
                    self.w2_ccfuse.data_ptr(), out.data_ptr(), stream)
        dist.barrier()
        ours()
        serial_out = layer(x, logits, topk)
        torch.cuda.synchronize()
        rel_err = float((out[idx].double() - ref).norm() / ref.norm())
        diff = float((out.float() - serial_out.float()).norm() / serial_out.float().norm())
        t_serial, t_ours = self.time_paired_ms([lambda: layer(x, logits, topk), ours])
        config = ffn.describe()
        ffn.close()
        return {"t_serial_paired": t_serial, "t_ccfuse_inproc": t_ours}, rel_err, diff, config, imbalance

    def max_over_ranks(self, values):
        v = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(v, op=self.dist.ReduceOp.MAX)
        return v.tolist()

    def all_ranks(self, value):
        v = self.torch.tensor([value], dtype=self.torch.int64, device=self.device)
        out = self.torch.empty(self.world, dtype=self.torch.int64, device=self.device)
        self.dist.all_gather_into_tensor(out, v)
        return out.tolist()

    def run_case(self, case, commit):
        torch, dist = self.torch, self.dist
        self.load_model(case)
        topk, h, f = case["topk"], case["hidden"], case["ffn"]
        x, logits = self.make_inputs(case)
        layer = self.layer_alltoall if case["dispatch"] == "alltoall" else self.layer_allgather
        keep = {}
        dist.barrier()
        out = layer(x, logits, topk, keep)  # the first run: checked
        t = case["tokens"]
        ns = min(self.args.sample, t)
        idx = torch.tensor(sorted({(i * t) // ns for i in range(ns)}), device=self.device)
        ref = self.reference(x, logits, topk, idx, h, f)
        rel_err = float((out[idx].double() - ref).norm() / ref.norm())
        inproc = None
        if self.ccfuse is not None and case["dispatch"] == "alltoall" and self.device.type == "cuda":
            inproc = self.ccfuse_case(case, x, logits, topk, layer, idx, ref)
        del out, ref
        times = {"t_serial": self.time_ms(lambda: layer(x, logits, topk))}
        xs, offs, offs_host = keep["xs"], keep["offs"], keep["offs_host"]
        times["t_gemm"] = self.time_ms(lambda: self.expert_ffn(xs, offs, offs_host))
        a2a, k = dist.all_to_all_single, keep
        if case["dispatch"] == "alltoall":
            def dispatch():
                a2a(k["recv"], k["x_perm"], k["out_splits"], k["in_splits"])

            def combine():
                a2a(k["back"], k["y_recv"], k["in_splits"], k["out_splits"])
            parts = {"t_dispatch": dispatch, "t_combine": combine}
        else:
            def gather():
                dist.all_gather_into_tensor(k["x_all"], k["x"])
                dist.all_gather_into_tensor(k["ids_all"], k["ids32"])
                dist.all_gather_into_tensor(k["w_all"], k["w"])

            def scatter():
                dist.reduce_scatter_tensor(k["out"], k["part"])
            parts = {"t_allgather": gather, "t_reduce_scatter": scatter}
        fns = list(parts.values())
        times["t_comm"] = self.time_ms(lambda: [fn() for fn in fns])
        for name, fn in parts.items():
            times[name] = self.time_ms(fn)
        extra = {}
        if inproc is not None:
            paired, err_c, diff_c, config_c, imbalance = inproc
            times.update(paired)
            worst_c = self.max_over_ranks([err_c, diff_c])
            extra = dict(rel_err_ccfuse=worst_c[0], rel_diff_ccfuse_vs_serial=worst_c[1], ccfuse_config=config_c,
                         routing_imbalance=imbalance)
        names = sorted(times)
        worst = self.max_over_ranks([times[n] for n in names] + [rel_err])
        times, rel_err = dict(zip(names, worst[:-1])), worst[-1]
        rows_per_rank = self.all_ranks(keep["rows"])
        rec = build_record(case, self.world, self.gpu, commit, utc_date(), times, rel_err, self.grouped_mm,
                           rows_per_rank, NOTES[case["dispatch"]], hidden=h, ffn=f, torch=torch.__version__,
                           iters=self.args.iters, warmup=self.args.warmup, sample_tokens=int(idx.numel()),
                           zipf_exponent=ZIPF_EXPONENT if case["routing"] == "zipf" else None, **extra)
        del keep, x, logits, xs, offs
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return rec


def main(argv=None):
    import json
    args = parse_args(argv)
    bench = Bench(args)
    commit = git_commit()
    if bench.rank == 0:
        print("world %d, %s, %s, torch %s" % (bench.world, bench.gpu, bench.grouped_mm, bench.torch.__version__),
              flush=True)
    for case in cases(args):
        if case["experts"] % bench.world:
            raise SystemExit("%s: %d experts do not split over %d ranks" % (case["model"], case["experts"], bench.world))
        rec = bench.run_case(case, commit)
        if bench.rank == 0:
            print(format_line(rec), flush=True)
            with open(args.json, "a") as f:
                f.write(json.dumps(rec) + "\n")
    bench.dist.barrier()
    if bench.ccfuse is not None:
        bench.sync()
        bench.ccfuse.finalize()
    bench.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
