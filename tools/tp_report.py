#!/usr/bin/env python3
"""Report on TP benchmark records (JSON Lines, as written by `ccfuse bench --json` and merged
with PyTorch async-TP times by tools/merge_tp_peer.py): a Markdown table, an optional bar chart
and an optional JSON summary.

Usage:
  python3 tools/tp_report.py RESULTS.jsonl [MORE.jsonl ...] [--md FILE] [--plot FILE.png|.svg]
                             [--log] [--normalize] [--json-summary FILE]

One table row per record: op, W, M, N, K, ccfuse fused, serial NCCL+cuBLAS, PyTorch async-TP
(t_peer), async-TP at this run's clocks (t_peer_scaled: t_peer / its own torch.mm time * this run's
cuBLAS time, tools/merge_tp_peer.py; the peer runs in another process, at other clocks), ccfuse /
async-TP in one process (t_ccfuse_inproc_ms / t_peer_ms: tools/torch_async_tp_bench.py --ccfuse-lib
times both in the same rounds on the same tensors), t_limit (all ms), fused/limit, speedup = t_serial/t_fused, overlap efficiency =
(t_serial - t_fused)/(t_serial - t_limit) (only when t_serial > t_limit), and a verdict. A time
that is null, missing or negative was not measured and prints "-". Verdict rules:
  ag_gemm, gemm_rs: fused < serial; faster than async-TP (in one process when the record has
                    t_ccfuse_inproc_ms, "(1 proc)" in the verdict; else the raw t_peer, when
                    measured: two processes at two clock states); overlap >= 0.8; and, when
                    M >= 8192 and K >= 4096 (the record's k as is), fused/limit <= 1.05.
  gemm_ar:          fused < serial; when K >= 4096, overlap >= 0.7.
A rule that cannot be checked (e.g. no t_limit) counts as missed ("... n/a"). Records without
t_fused_ms get "no fused op". Above the table: the distinct dates, GPUs and commits found.
The chart (--plot) needs matplotlib (Agg backend); without it the chart is skipped with a notice.
"""
import argparse
import json
import math
import sys

COLUMNS = ["op", "W", "M", "N", "K", "ccfuse fused (ms)", "serial NCCL+cuBLAS (ms)",
           "PyTorch async-TP (ms)", "async-TP at this run's clocks (ms)", "ccfuse / async-TP, one process",
           "t_limit (ms)", "fused/limit", "speedup vs serial",
           "overlap efficiency", "verdict"]


def load(paths):
    """All records of the given JSON Lines files, in order (blank and '#' lines skipped)."""
    records = []
    for path in paths:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    try:
                        records.append(json.loads(line))
                    except ValueError as e:
                        raise SystemExit(f"{path}:{lineno}: bad JSON: {e}")
    return records


def num(v):
    """A measured time: a finite number >= 0, else None (null, missing, negative, not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def ratio(a, b):
    return a / b if a is not None and b else None


def verdict(op, m, k, fused, serial, peer, over, overlap, inproc=None):
    if fused is None:
        return "no fused op"
    if op not in ("ag_gemm", "gemm_rs", "gemm_ar"):
        return "-"
    miss = []
    if serial is None:
        miss.append("serial n/a")
    elif not fused < serial:
        miss.append(">=serial")
    big_k = num(k) is not None and k >= 4096
    if op == "gemm_ar":
        if big_k and (overlap is None or overlap < 0.7):
            miss.append("overlap n/a" if overlap is None else "overlap<0.7")
    else:
        if inproc is not None:  # ours / async-TP timed in the same rounds of one process
            if not inproc < 1.0:
                miss.append(">=async-TP (1 proc)")
        elif peer is not None and not fused < peer:
            miss.append(">=async-TP")
        if overlap is None or overlap < 0.8:
            miss.append("overlap n/a" if overlap is None else "overlap<0.8")
        if num(m) is not None and m >= 8192 and big_k and (over is None or over > 1.05):
            miss.append("limit n/a" if over is None else ">1.05·limit")
    return "ok" if not miss else "miss: " + ", ".join(miss)


def compute(rec):
    """One report row (a dict of numbers/None plus the verdict) from one record."""
    fused, serial = num(rec.get("t_fused_ms")), num(rec.get("t_serial_ms"))
    peer, limit = num(rec.get("t_peer_ms")), num(rec.get("t_limit_ms"))
    op, m, k = rec.get("op"), rec.get("m"), rec.get("k")
    overlap = None
    if fused is not None and serial is not None and limit is not None and serial > limit:
        overlap = (serial - fused) / (serial - limit)
    over, speedup = ratio(fused, limit), ratio(serial, fused)
    inproc = ratio(num(rec.get("t_ccfuse_inproc_ms")), peer)
    return {"op": op, "W": rec.get("world_size"), "M": m, "N": rec.get("n"), "K": k,
            "t_fused_ms": fused, "t_serial_ms": serial, "t_peer_ms": peer,
            "t_peer_scaled_ms": num(rec.get("t_peer_scaled_ms")), "inproc_over_peer": inproc, "t_limit_ms": limit,
            "fused_over_limit": over, "speedup": speedup, "overlap_eff": overlap,
            # The CPU reference world's times are thread wall-clock, not GPU performance.
            "verdict": ("cpu reference world: not judged" if rec.get("backend") == "cpu"
                        else verdict(op, m, k, fused, serial, peer, over, overlap, inproc))}


def rows_of(records):
    return [compute(r) for r in records]


def provenance(records):
    """'dates: ...; gpus: ...; commits: ...' with the distinct values, in order of appearance."""
    def distinct(field, cut=None):
        seen = []
        for r in records:
            v = r.get(field)
            if v not in (None, ""):
                v = str(v)[:cut] if cut else str(v)
                if v not in seen:
                    seen.append(v)
        return ", ".join(seen) or "-"
    # ISO timestamps are cut to the day, so one run's records give one date.
    return (f"dates: {distinct('date', 10)}; gpus: {distinct('gpu')}; "
            f"commits: {distinct('commit')}")


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows, records=()):
    """The Markdown report: the provenance line (when records are given), then the table."""
    out = [provenance(records), ""] if records else []
    out.append("| " + " | ".join(COLUMNS) + " |")
    out.append("|" + "|".join("---" if i < 1 or i == len(COLUMNS) - 1 else "---:"
                              for i in range(len(COLUMNS))) + "|")
    for r in rows:
        cells = [str(r["op"] or "-")] + ["-" if r[c] is None else str(r[c])
                                         for c in ("W", "M", "N", "K")]
        cells += [fmt(r[c], ".3f") for c in ("t_fused_ms", "t_serial_ms", "t_peer_ms",
                                             "t_peer_scaled_ms", "inproc_over_peer", "t_limit_ms")]
        cells += [fmt(r["fused_over_limit"], ".3f"), fmt(r["speedup"], ".2f"),
                  fmt(r["overlap_eff"], ".2f"), r["verdict"]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot(rows, path, log=False, normalize=False):
    """Grouped bars (fused, serial, async-TP) with a t_limit segment per group; with `normalize`,
    every time is divided by the row's t_limit (the limit is the line at 1). Returns False
    (with a notice on stderr) when matplotlib is not installed, True once the file is written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("tp_report: matplotlib not installed; skipping the plot", file=sys.stderr)
        return False
    series = [("t_fused_ms", "ccfuse fused"), ("t_serial_ms", "serial NCCL+cuBLAS"),
              ("t_peer_ms", "PyTorch async-TP")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) + 2), 4.5))
    def value(r, key):
        if r[key] is None:
            return None
        if normalize:
            return r[key] / r["t_limit_ms"] if r["t_limit_ms"] else None
        return r[key]

    for j, (key, label) in enumerate(series):
        xs = [i - 0.4 + width * (j + 0.5) for i, r in enumerate(rows) if value(r, key) is not None]
        ys = [value(r, key) for r in rows if value(r, key) is not None]
        if ys:
            ax.bar(xs, ys, width, label=label)
    lim = [(i, 1.0 if normalize else r["t_limit_ms"]) for i, r in enumerate(rows) if r["t_limit_ms"] is not None]
    if lim:
        ax.hlines([y for _, y in lim], [i - 0.45 for i, _ in lim], [i + 0.45 for i, _ in lim],
                  colors="black", linestyles="--", label="t_limit")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['op']} {r['M']}×{r['N']}×{r['K']}" for r in rows],
                       rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time / t_limit" if normalize else "ms")
    if normalize:
        ax.set_ylim(bottom=0.8)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


STEADY_COLUMNS = ["op", "M", "N", "K", "ccfuse fused (ms)", "serial NCCL+cuBLAS (ms)", "cuBLAS GEMM alone (ms)",
                  "ccfuse GEMM alone (ms)", "fused / serial", "fused / GEMM", "ccfuse GEMM / cuBLAS",
                  "same, interleaved"]


def steady_table(records):
    """Records with t_fused_steady_ms (CCFUSE_BENCH_STEADY_MS): each part back to back, alone, at the
    GPU's power cap. Empty when none has it. 'same, interleaved': ccfuse GEMM / cuBLAS GEMM in the
    interleaved rounds, where both run at the same clock."""
    rows = [r for r in records if num(r.get("t_fused_steady_ms")) is not None]
    if not rows:
        return ""
    out = ["| " + " | ".join(STEADY_COLUMNS) + " |",
           "|" + "|".join("---" if i < 1 else "---:" for i in range(len(STEADY_COLUMNS))) + "|"]
    for r in rows:
        f, s, g, go = (num(r.get(k)) for k in ("t_fused_steady_ms", "t_serial_steady_ms", "t_gemm_steady_ms",
                                               "t_gemm_ccfuse_steady_ms"))
        inter = ratio(num(r.get("t_gemm_ccfuse_ms")), num(r.get("t_gemm_ms")))
        cells = [str(r.get("op", "-"))] + [str(r.get(c, "-")) for c in ("m", "n", "k")]
        cells += [fmt(v, ".3f") for v in (f, s, g, go)]
        cells += [fmt(ratio(f, s), ".3f"), fmt(ratio(f, g), ".3f"), fmt(ratio(go, g), ".3f"), fmt(inter, ".3f")]
        out.append("| " + " | ".join(cells) + " |")
    return ("\nBack to back, each alone, for %s ms (the GPU at its power cap):\n\n" % rows[0].get("steady_ms", "?")
            + "\n".join(out) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", nargs="+", help="JSON Lines files of TP benchmark records")
    p.add_argument("--md", help="write the Markdown table here instead of stdout")
    p.add_argument("--plot", help="write a grouped bar chart (.png or .svg)")
    p.add_argument("--log", action="store_true", help="log-scale y axis on the chart")
    p.add_argument("--normalize", action="store_true", help="chart times divided by t_limit")
    p.add_argument("--json-summary", help="write the computed rows as JSON")
    a = p.parse_args(argv)
    records = load(a.jsonl)
    rows = rows_of(records)
    md = table(rows, records) + steady_table(records)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if a.json_summary:
        with open(a.json_summary, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
    if a.plot:
        plot(rows, a.plot, a.log, a.normalize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
