"""MoE grouped-GEMM benchmark cases and routing, shared by tools/torch_grouped_bench.py,
tools/merge_peer.py and the `grouped` section of tools/gpu_run.sh (docs/grouped-bench.md).

grouped_rows() is the Python twin of ccfuse::tool::grouped_rows (src/tool/routing.cpp): both must
give exactly the same rows per expert; tests/data/grouped_routing_cases.txt pins them (checked by
tests/cpp/tool/test_cli_grouped.cpp and tests/python/test_moe_grouped.py). Standard library only.
"""
import math

ZIPF_EXPONENT = 1.2  # expert e (0-based) gets a share ~ 1 / (e + 1) ** ZIPF_EXPONENT
ROUTINGS = ("uniform", "zipf", "one_hot", "empty_some")


def _even(total, parts, index):
    return total // parts + (1 if index < total % parts else 0)


def grouped_rows(experts, total_rows, routing):
    """Rows per expert of `total_rows` (tokens * topk) routed over `experts` experts."""
    if experts < 1:
        raise ValueError("experts must be at least 1")
    if total_rows < 0:
        raise ValueError("total_rows must not be negative")
    rows = [0] * experts
    if routing == "uniform":
        rows = [_even(total_rows, experts, e) for e in range(experts)]
    elif routing == "one_hot":
        rows[0] = total_rows
    elif routing == "empty_some":
        if experts < 2:
            raise ValueError("empty_some needs at least 2 experts")
        odd = experts // 2
        for i in range(odd):
            rows[2 * i + 1] = _even(total_rows, odd, i)
    elif routing == "zipf":
        # Same integer weights as the C++ (llround of a positive value = floor(x + 0.5)).
        w = [int(math.floor(1073741824.0 / math.pow(float(e + 1), ZIPF_EXPONENT) + 0.5)) for e in range(experts)]
        s = sum(w)
        rows = [total_rows * we // s for we in w]
        given = sum(rows)
        e = 0
        while given < total_rows:
            rows[e] += 1
            given += 1
            e += 1
    else:
        raise ValueError("unknown routing %r (known: %s)" % (routing, ", ".join(ROUTINGS)))
    return rows


def read_expected(path):
    """(experts, total, routing, rows) per line of tests/data/grouped_routing_cases.txt."""
    cases = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            head, counts = line.split(":")
            e, total, routing = head.split()
            cases.append((int(e), int(total), routing, [int(x) for x in counts.split()]))
    return cases


# ---- the benchmark cases (DESIGN §5 MoE shapes at EP = 2, one GPU's view) -------------------
#
# All-gather dispatch: every GPU sees the tokens of all W GPUs (T_total = tokens_per_gpu * W)
# and computes its E_local = E / W experts; with routing spread over all E experts, its local
# experts receive T_total * topk * E_local / E rows, i.e. `--tokens tokens_per_gpu * W * E_local / E
# --topk topk` spread over E_local experts by the routing (uniform or zipf within the GPU).
EP = 2
MODELS = [
    # name, H, E, topk, F
    ("mixtral", 4096, 8, 2, 14336),
    ("qwen3", 2048, 128, 8, 768),
    ("dsv3", 7168, 256, 8, 2048),
]
TOKENS_PER_GPU = (4096, 8192, 16384)


def cases():
    """Dicts: name, model, gemm (up|down), tokens_per_gpu, experts, tokens, topk, n, k, routing, b_layout."""
    out = []
    for model, h, e, topk, f in MODELS:
        e_local = e // EP
        for t in TOKENS_PER_GPU:
            tokens = t * EP * e_local // e
            for gemm, n, k in (("up", 2 * f, h), ("down", h, f)):
                for routing in ("uniform", "zipf"):
                    out.append(dict(model=model, gemm=gemm, tokens_per_gpu=t, experts=e_local, tokens=tokens,
                                    topk=topk, n=n, k=k, routing=routing, b_layout="nk"))
    # Empty experts on one shape (half of them get no rows).
    model, h, e, topk, f = MODELS[1]
    out.append(dict(model=model, gemm="up", tokens_per_gpu=8192, experts=e // EP, tokens=8192 * EP * (e // EP) // e,
                    topk=topk, n=2 * f, k=h, routing="empty_some", b_layout="nk"))
    for c in out:
        c["name"] = "%s-%s-T%d" % (c["model"], c["gemm"], c["tokens_per_gpu"])
    return out


def case_key(rec):
    """What identifies a case in a JSON record (ccfuse's or torch's)."""
    return (rec.get("op"), rec.get("experts"), rec.get("topk"), rec.get("tokens_per_rank"), rec.get("n"),
            rec.get("k"), rec.get("routing"), rec.get("b_layout"), rec.get("dtype", "bf16"))


if __name__ == "__main__":
    # `python3 tools/moe_grouped.py [--only TEXT]` prints one case per line: the ccfuse options
    # (gpu_run.sh reads them); --only keeps the cases whose name contains TEXT (or one of TEXT's
    # '|'-separated parts, e.g. "qwen3|dsv3").
    import sys
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    for c in cases():
        if not any(part in c["name"] for part in only.split("|")):
            continue
        print("--experts %d --tokens %d --topk %d --n %d --k %d --routing %s --b-layout %s" %
              (c["experts"], c["tokens"], c["topk"], c["n"], c["k"], c["routing"], c["b_layout"]))
