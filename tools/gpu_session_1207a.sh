#!/usr/bin/env bash
# One device call on one GPU (2026-12-07): the MoE backward with h kept by the forward
# (MoeFfn::run's preact_out, MoeFfnBackward's h_saved; torch_ops.MoeFfn(recompute=False)).
# (1) MoeFfnBackward's GPU tests (now also the kept-h run of every case) at W = 1 and in the
# one-GPU world at W = 2, and the forward MoE tests at W = 1 (layer 0's epilogue changed);
# (2) tools/torch_moe_autograd_check.py at W = 1: its cases in the three modes (unfused, fused,
# fused_keep), then the Qwen3-like timing with the fused backward's halves and the kept-h forward
# and kernels; (3) the compile and layers checks (tools/gpu_session_1206j.sh parts 3, 4); (4) on an
# H100 only, Mixtral's grouped A/B (1206j part 2). Logs in one tarball, the table last.
#   bash tools/gpu_session_1207a.sh [PART ...]   (default: 1 2 3 4)
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O/logs"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
parts=" ${*:-1 2 3 4} "
table=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
left() { echo $(( ${CCFUSE_SESSION_BUDGET_S:-570} - SECONDS )); }
if [[ $parts == *" 1 "* ]]; then
  OUT="$O/logs/i" timeout 400 bash tools/gpu_session_1206i.sh 1 > "$O/logs/i.txt" 2>&1
  table+=("GPU tests: rc=$?")
  while read -r l; do table+=("  $l"); done < <(grep -E 'rc=' "$O/logs/i.txt" | cut -c1-200)
  while read -r l; do table+=("  $l"); done < <(head -8 "$O/logs/i/bwd_fail.txt" 2>/dev/null | cut -c1-200)
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 120 ]; then
  timeout 200 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_autograd_check.py \
    --ccfuse-lib .carry/bin/libccfuse_c.so --json "$O/logs/moe_autograd.jsonl" > "$O/logs/moe_autograd.log" 2>&1
  table+=("MoeFfn autograd W=1: rc=$? $(grep -E '^torch_moe_autograd_check:' "$O/logs/moe_autograd.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E 'FAIL|timing|Error' "$O/logs/moe_autograd.log" | cut -c1-600 | head -8)
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 150 ]; then
  jparts="3 4"; [[ $gpu == *H100* && $parts == *" 4 "* ]] && jparts="3 4 2"
  OUT="$O/logs/j" CCFUSE_SESSION_BUDGET_S=$(( $(left) - 10 )) bash tools/gpu_session_1206j.sh $jparts > "$O/logs/j.txt" 2>&1
  table+=("1206j parts $jparts: rc=$?")
  while read -r l; do table+=("  $l"); done < <(tail -n +2 "$O/logs/j/summary.txt" 2>/dev/null)
fi
{
  echo "== gpu_session_1207a on $gpu, commit $(tr '\n' ' ' < .carry/commit), ${SECONDS} s"
  printf '%s\n' "${table[@]}"
} | tee "$O/summary.txt"
tar -czf "$O/logs.tar.gz" -C "$O" logs && rm -rf "$O/logs"
