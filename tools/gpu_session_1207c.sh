#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, later): the K-grouped GEMM (gemm.h kgrouped_run, the MoE
# weight gradients). (1) its GPU tests against the fp64 reference (KGroupedGemm.*: tails, empty
# groups, NaN past the rows, cut m and n, dropped rows) and its config rules; (2) the weight-gradient
# cases against torch._grouped_mm interleaved (tools/torch_wgrad_bench.py: Qwen3-like all, Mixtral-
# and DeepSeek-like at 4096 tokens), and the same script with --inject-fault on one case (must exit
# 3); (3) tools/torch_moe_autograd_check.py at W = 1 in modes fused, fused_keep and fused_keep_kw
# (wgrad="ccfuse"): correctness of d W1, d W2 against fp32 autograd, and the Qwen3-like timing with
# both weight-gradient paths alone; (4) the other tiles (CCFUSE_KGROUPED_TILE=pingpong, 128) on
# Qwen3- and DeepSeek-like cases at 4096 tokens, torch in the same rounds; (5) the fp32
# accumulating form (main_grad +=, --accumulate) against main_grad.add_(torch._grouped_mm(...)), by
# red.global.add and by load-add-store (CCFUSE_KGROUPED_ACCUM=rmw); (3) also runs fused_kw_mg
# (MoeFfn(main_grad=True)); (6) torch_ops.grouped_mm's b gradient, now by the K-grouped GEMM:
# tools/torch_compile_check.py (aot_eager: opcheck of kgrouped_mm, grouped autograd eager and
# compiled) and tools/torch_grouped_autograd_bench.py (uniform: ccfuse's autograd against torch's).
# Logs in one tarball, the table last.
#   bash tools/gpu_session_1207c.sh [PART ...]   (default: 1 2 5 4 3 6)
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O/logs"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
parts=" ${*:-1 2 5 4 3 6} "
table=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
left() { echo $(( ${CCFUSE_SESSION_BUDGET_S:-570} - SECONDS )); }
if [[ $parts == *" 1 "* ]]; then
  timeout 150 .carry/bin/ccfuse_gpu_tests --gtest_filter='*KGroupedGemm*:GemmValidation.KGroupedRules' \
    > "$O/logs/kgrouped_tests.log" 2>&1
  table+=("K-grouped tests: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$O/logs/kgrouped_tests.log" | tr '\n' ' ')")
  while read -r l; do table+=("  $l"); done < <(grep -E '^\[  FAILED  \]|Failure|error' "$O/logs/kgrouped_tests.log" | head -8 | cut -c1-200)
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) > 300 ? 240 : $(left) - 40 )) python3 tools/torch_wgrad_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so \
    --json "$O/logs/wgrad.jsonl" --only "${WGRAD_ONLY:-qwen3|mixtral-up-T4096|mixtral-down-T4096|dsv3-up-T4096|dsv3-down-T4096}" \
    > "$O/logs/wgrad.log" 2>&1
  table+=("wgrad bench: rc=$?")
  while read -r l; do table+=("  $l"); done < <(cut -c1-190 "$O/logs/wgrad.log" | tail -n 24)
  timeout 60 python3 tools/torch_wgrad_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so --json "$O/logs/wgrad_fault.jsonl" \
    --only qwen3-down-T4096 --inject-fault > "$O/logs/wgrad_fault.log" 2>&1
  table+=("wgrad bench --inject-fault: rc=$? (3 = caught)")
fi
if [[ $parts == *" 5 "* ]] && [ "$(left)" -gt 150 ]; then
  for mode in red rmw; do
    CCFUSE_KGROUPED_ACCUM=$mode timeout 120 python3 tools/torch_wgrad_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so \
      --accumulate --json "$O/logs/wgrad_accum_$mode.jsonl" \
      --only "${ACCUM_ONLY:-qwen3-up-T4096|qwen3-down-T4096|mixtral-up-T4096|dsv3-up-T4096|dsv3-down-T4096}" \
      > "$O/logs/wgrad_accum_$mode.log" 2>&1
    table+=("wgrad accumulate ($mode): rc=$?")
    while read -r l; do table+=("  $l"); done < <(cut -c1-230 "$O/logs/wgrad_accum_$mode.log" | tail -n 7)
  done
  timeout 60 python3 tools/torch_wgrad_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so --accumulate \
    --json "$O/logs/wgrad_accum_fault.jsonl" --only qwen3-down-T4096 --inject-fault > "$O/logs/wgrad_accum_fault.log" 2>&1
  table+=("wgrad accumulate --inject-fault: rc=$? (3 = caught)")
fi
if [[ $parts == *" 4 "* ]] && [ "$(left)" -gt 150 ]; then
  for tile in pingpong 128; do
    CCFUSE_KGROUPED_TILE=$tile timeout 100 python3 tools/torch_wgrad_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so \
      --json "$O/logs/wgrad_$tile.jsonl" --only "qwen3-up-T4096|qwen3-down-T4096|dsv3-up-T4096|dsv3-down-T4096" \
      > "$O/logs/wgrad_$tile.log" 2>&1
    table+=("wgrad bench, tile $tile: rc=$?")
    while read -r l; do table+=("  $l"); done < <(cut -c1-190 "$O/logs/wgrad_$tile.log" | tail -n 9)
  done
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) - 10 )) python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_autograd_check.py \
    --ccfuse-lib .carry/bin/libccfuse_c.so --backward fused,fused_keep,fused_keep_kw,fused_kw_mg \
    --json "$O/logs/moe_autograd.jsonl" > "$O/logs/moe_autograd.log" 2>&1
  table+=("MoeFfn autograd W=1: rc=$? $(grep -E '^torch_moe_autograd_check:' "$O/logs/moe_autograd.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E 'FAIL|timing|Error' "$O/logs/moe_autograd.log" | cut -c1-700 | head -8)
fi
if [[ $parts == *" 6 "* ]] && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) > 200 ? 150 : $(left) - 40 )) python3 -m torch.distributed.run --nproc-per-node 1 \
    tools/torch_compile_check.py --ccfuse-lib .carry/bin/libccfuse_c.so --backends aot_eager \
    --json "$O/logs/compile.jsonl" > "$O/logs/compile.log" 2>&1
  table+=("torch_compile_check (aot_eager): rc=$?")
  while read -r l; do table+=("  $l"); done < <(grep -E 'kgrouped|grouped_autograd|check:' "$O/logs/compile.log" | cut -c1-200 | head -8)
  if [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) - 20 )) python3 tools/torch_grouped_autograd_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so \
      --routing uniform --json "$O/logs/grouped_autograd.jsonl" > "$O/logs/grouped_autograd.log" 2>&1
    table+=("torch_grouped_autograd_bench (uniform): rc=$?")
    while read -r l; do table+=("  $l"); done < <(cut -c1-200 "$O/logs/grouped_autograd.log" | tail -n 8)
  fi
fi
{
  echo "== gpu_session_1207c on $gpu, commit $(tr '\n' ' ' < .carry/commit), ${SECONDS} s"
  printf '%s\n' "${table[@]}"
} | tee "$O/summary.txt"
tar -czf "$O/logs.tar.gz" -C "$O" logs && rm -rf "$O/logs"
