#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, third session): the accumulating K-grouped GEMM's TMA
# reduce-add epilogue (sm90::reduce_tile_f32_tma) and the K-grouped tile A/B by k-blocks a tile.
# (1) the engine's K-grouped tests (accumulate by TMA reduce-adds, the default now, and by the
# register forms red / rmw; m = 56, 72: a warpgroup without rows, cut at the group) and the
# validation tests, then the other GEMM tests (the kernel's shared memory and epilogue dispatch
# changed for every form); (2) tools/torch_wgrad_bench.py --accumulate with --ab-accum red (the
# previous default, same rounds) on Qwen3-, Mixtral- and DeepSeek-like cases, and --inject-fault
# (exit 3); (3) --ab-tile pingpong on the bf16 form (Qwen3-like all token counts, Mixtral- and
# DeepSeek-like at 4096: ping-pong against cooperative by mean k-blocks a tile); (4)
# tools/torch_moe_autograd_check.py at W = 1, fused_kw_mg (MoeFfn(main_grad=True): the TMA
# reduce-adds in the layer's backward) and fused_keep.
# Logs in one tarball, the table last.   bash tools/gpu_session_1207e.sh [PART ...] (default 1 2 3 4)
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2 3 4} "
if [[ $parts == *" 1 "* ]]; then
  timeout 150 $B/ccfuse_gpu_tests --gtest_filter='*KGroupedGemm*:GemmValidation.*' > "$O/logs/kgrouped.log" 2>&1
  table+=("K-grouped + GemmValidation: rc=$? $(tests_line "$O/logs/kgrouped.log")")
  timeout 150 $B/ccfuse_gpu_tests --gtest_filter='*Gemm*:*Grouped*:-*KGroupedGemm*:GemmValidation.*' \
    > "$O/logs/gemm.log" 2>&1
  table+=("other GEMM tests: rc=$? $(tests_line "$O/logs/gemm.log")")
  for f in kgrouped gemm; do
    while read -r l; do table+=("  $f: $l"); done < <(grep -E '^\[  FAILED  \]|Failure$|error:' "$O/logs/$f.log" | head -6 | cut -c1-200)
  done
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 120 ]; then
  timeout 170 python3 tools/torch_wgrad_bench.py --ccfuse-lib $B/libccfuse_c.so --accumulate --ab-accum red \
    --json "$O/logs/wgrad_accum.jsonl" \
    --only "${ACCUM_ONLY:-qwen3-up-T4096|qwen3-down-T4096|qwen3-up-T16384|mixtral-up-T4096|mixtral-down-T4096|dsv3-up-T4096|dsv3-down-T4096}" \
    > "$O/logs/wgrad_accum.log" 2>&1
  table+=("wgrad accumulate (tma, ab red): rc=$?")
  while read -r l; do table+=("  $l"); done < <(cut -c1-260 "$O/logs/wgrad_accum.log" | tail -n 16)
  timeout 60 python3 tools/torch_wgrad_bench.py --ccfuse-lib $B/libccfuse_c.so --accumulate \
    --json "$O/logs/wgrad_accum_fault.jsonl" --only qwen3-down-T4096 --inject-fault > "$O/logs/wgrad_accum_fault.log" 2>&1
  table+=("wgrad accumulate --inject-fault: rc=$? (3 = caught)")
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 120 ]; then
  timeout $(( $(left) > 260 ? 150 : $(left) - 60 )) python3 tools/torch_wgrad_bench.py --ccfuse-lib $B/libccfuse_c.so \
    --ab-tile pingpong --json "$O/logs/wgrad_tile.jsonl" \
    --only "${TILE_ONLY:-qwen3|mixtral-up-T4096|mixtral-down-T4096|dsv3-up-T4096|dsv3-down-T4096}" \
    > "$O/logs/wgrad_tile.log" 2>&1
  table+=("wgrad bf16, ab pingpong: rc=$?")
  while read -r l; do table+=("  $l"); done < <(cut -c1-250 "$O/logs/wgrad_tile.log" | tail -n 22)
fi
if [[ $parts == *" 4 "* ]] && [ "$(left)" -gt 70 ]; then
  timeout $(( $(left) - 10 )) python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_autograd_check.py \
    --ccfuse-lib $B/libccfuse_c.so --backward fused_kw_mg,fused_keep \
    --json "$O/logs/moe_autograd.jsonl" > "$O/logs/moe_autograd.log" 2>&1
  table+=("MoeFfn autograd W=1: rc=$? $(grep -E '^torch_moe_autograd_check:' "$O/logs/moe_autograd.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E 'FAIL|timing|Error' "$O/logs/moe_autograd.log" | cut -c1-600 | head -8)
fi
finish gpu_session_1207e
