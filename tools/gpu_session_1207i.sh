#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, fourth session): the MoE FFN at decode-sized batches
# (64, 256 and 1024 tokens a GPU, W = 1), the regime an inference server (vLLM) runs most steps in
# and that issue 5's shapes (4096+) do not cover. (1) bench/moe_ffn_bench.cu on the three models,
# uniform and Zipf: whole layer, each layer, our grouped GEMMs alone, the fp64 check, the tuner's
# choice; (2) tools/torch_moe_layer_bench.py at W = 1 with --ccfuse-lib: the serial PyTorch layer
# (torch._grouped_mm) and ours in the same rounds on the same inputs, both checked. The weight
# bytes each case must read (its lower bound) are computed afterwards from the records.
# (3) layer 1's tile the other way from the tuner's choice at those sizes (ping-pong 128x128 for
# Qwen3-like, 128x256 for the others), A/B twice. Logs in one tarball, the table last.
#   bash tools/gpu_session_1207i.sh [PART ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2} "
toks=${CCFUSE_DECODE_TOKENS:-64 256 1024}
if [[ $parts == *" 1 "* ]]; then
  timeout 200 $B/ccfuse_moe_ffn_bench --tokens $toks --routing uniform zipf --iters 20 --warmup 5 \
    --json "$O/logs/moe_decode.jsonl" > "$O/logs/moe_decode.log" 2>&1
  table+=("moe_ffn_bench decode: rc=$? $(tail -1 "$O/logs/moe_decode.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^(mixtral|qwen3|deepseek) +T=' "$O/logs/moe_decode.log" | cut -c1-200)
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 150 ]; then
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_layer_bench.py \
    --json "$O/logs/moe_decode_torch.jsonl" --tokens $toks --routing uniform zipf --dispatch alltoall \
    --iters 20 --warmup 5 --ccfuse-lib $B/libccfuse_c.so > "$O/logs/moe_decode_torch.log" 2>&1
  table+=("torch_moe_layer_bench W=1 decode: rc=$?")
  while read -r l; do table+=("  $l"); done < <(python3 - "$O/logs/moe_decode_torch.jsonl" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    s, c = r.get("t_serial_paired_ms"), r.get("t_ccfuse_inproc_ms")
    print("%-8s T=%-5d %-7s serial %.3f  ccfuse %s ms  x%s  err %s / %s" % (
        r["model"], r["tokens_per_rank"], r["routing"], s or float("nan"), "%.3f" % c if c else "-",
        "%.2f" % (s / c) if s and c else "-", r.get("rel_err"), r.get("rel_err_ccfuse")))
PY
)
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 120 ]; then
  # Layer 1's tile at decode sizes (CCFUSE_MOE_L1_PINGPONG: 1 = 128x128 ping-pong, 0 = 128x256),
  # the other way from the tuner's choice for each model, two rounds each (A, B, A, B).
  for round in 1 2; do
    for v in default flip; do
      for m in qwen3 mixtral deepseek; do
        pp=""; [ $v = flip ] && { [ $m = qwen3 ] && pp=1 || pp=0; }
        CCFUSE_MOE_L1_PINGPONG=$pp timeout 120 $B/ccfuse_moe_ffn_bench --model $m --tokens $toks --routing uniform \
          --iters 20 --warmup 5 --json "$O/logs/l1tile_${v}_$round.jsonl" >> "$O/logs/l1tile.log" 2>&1
      done
    done
  done
  table+=("layer 1 tile A/B (flip: qwen3 ping-pong, mixtral / deepseek 128x256), grouped1 and layer1 ms:")
  while read -r l; do table+=("  $l"); done < <(python3 - "$O/logs" <<'PY'
import glob, json, os, sys
rec = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "l1tile_*.jsonl"))):
    v = os.path.basename(f).split("_")[1]
    for r in map(json.loads, open(f)):
        rec.setdefault((r["model"], r["tokens_per_rank"]), {}).setdefault(v, []).append(
            (r["t_grouped1_ccfuse_ms"], r["t_layer1_ms"], r["t_fused_ms"], r["check"]))
for (m, t), d in sorted(rec.items()):
    print("%-8s T=%-5d " % (m, t) + "  ".join("%s g1 %s l1 %s fused %s %s" % (
        v, "/".join("%.3f" % x[0] for x in d[v]), "/".join("%.3f" % x[1] for x in d[v]),
        "/".join("%.3f" % x[2] for x in d[v]), ",".join(x[3] for x in d[v])) for v in sorted(d)))
PY
)
fi
finish gpu_session_1207i
