#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, fourth session): the MoE FFN at decode-sized batches
# (64, 256 and 1024 tokens a GPU, W = 1), the regime an inference server (vLLM) runs most steps in
# and that issue 5's shapes (4096+) do not cover. (1) bench/moe_ffn_bench.cu on the three models,
# uniform and Zipf: whole layer, each layer, our grouped GEMMs alone, the fp64 check, the tuner's
# choice; (2) tools/torch_moe_layer_bench.py at W = 1 with --ccfuse-lib: the serial PyTorch layer
# (torch._grouped_mm) and ours in the same rounds on the same inputs, both checked. The weight
# bytes each case must read (its lower bound) are computed afterwards from the records.
# Logs in one tarball, the table last.   bash tools/gpu_session_1207i.sh [PART ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2} "
toks=${CCFUSE_DECODE_TOKENS:-64 256 1024}
if [[ $parts == *" 1 "* ]]; then
  timeout 200 $B/ccfuse_moe_ffn_bench --tokens $toks --routing uniform zipf --iters 20 --warmup 5 \
    --print-config --json "$O/logs/moe_decode.jsonl" > "$O/logs/moe_decode.log" 2>&1
  table+=("moe_ffn_bench decode: rc=$? $(tail -1 "$O/logs/moe_decode.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^(mixtral|qwen3|deepseek) ' "$O/logs/moe_decode.log" | cut -c1-200)
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
finish gpu_session_1207i
