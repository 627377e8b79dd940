#!/usr/bin/env bash
# One device call on one GPU (2026-12-06, late night): (1) where the fused MoE backward's time goes
# (tools/torch_moe_autograd_check.py at W = 1: its correctness cases, then the Qwen3-like timing
# with the fused backward's kernels and its weight gradients timed alone); (2) on an H100 only,
# Mixtral's grouped tile A/B and the plain engine (tools/gpu_session_1206j.sh part 2; on an H200 it
# ran at 23:40); (3) the compile and layers checks (1206j parts 3, 4). Logs in one tarball, the table last.   bash tools/gpu_session_1206k.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O/logs"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
table=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
timeout 150 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_autograd_check.py \
  --ccfuse-lib .carry/bin/libccfuse_c.so ${G1206K_TIMING_ONLY:+--timing-only} --json "$O/logs/moe_autograd.jsonl" \
  > "$O/logs/moe_autograd.log" 2>&1
table+=("MoeFfn autograd W=1: rc=$? $(grep -E '^torch_moe_autograd_check:' "$O/logs/moe_autograd.log")")
while read -r l; do table+=("  $l"); done < <(grep -E 'FAIL|timing|Error' "$O/logs/moe_autograd.log" | cut -c1-400 | head -8)
# the compile and layers checks again (their start and end moved into tools/torch_check_common.py
# since their last GPU run), and on an H100 Mixtral's grouped A/B
jparts="3 4"; [[ $gpu == *H100* ]] && jparts="3 4 2"
OUT="$O/logs/j" CCFUSE_SESSION_BUDGET_S=$(( 560 - SECONDS )) bash tools/gpu_session_1206j.sh $jparts > "$O/logs/j.txt" 2>&1
table+=("1206j parts $jparts: rc=$?")
while read -r l; do table+=("  $l"); done < <(tail -n +2 "$O/logs/j/summary.txt" 2>/dev/null)
{
  echo "== gpu_session_1206k on $gpu, commit $(tr '\n' ' ' < .carry/commit), ${SECONDS} s"
  printf '%s\n' "${table[@]}"
} | tee "$O/summary.txt"
tar -czf "$O/logs.tar.gz" -C "$O" logs && rm -rf "$O/logs"
