#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, later): the kept h bounded (MoeFfn::run's preact_rows,
# MoeFfnBackward::run's h_rows, decided on the device) and the grouped GEMM's host time.
# (1) MoeFfnBackward's GPU tests (every case also with a kept h of 1 row, recomputed, and of
# max_rows - 1) at W = 1 and in the one-GPU W = 2 world, and the engine's K-grouped and validation
# tests (store_preact changed); (2) tools/torch_moe_autograd_check.py at W = 1 in fused,
# fused_keep (the default bound: every row kept) and fused_keep_b1 (one row: recomputed), with the
# timing; (3) tools/torch_grouped_autograd_bench.py (uniform): grouped_mm's host time with the
# memory bandwidth cached (the Qwen3-like rows); (4) tools/torch_compile_check.py (aot_eager).
# Logs in one tarball, the table last.   bash tools/gpu_session_1207d.sh [PART ...] (default 1 2 3 4)
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2 3 4} "
if [[ $parts == *" 1 "* ]]; then
  timeout 150 $B/ccfuse_gpu_tests --gtest_filter='*MoeFfnBackward*' > "$O/logs/bwd_w1.log" 2>&1
  table+=("MoeFfnBackward W=1: rc=$? $(tests_line "$O/logs/bwd_w1.log")")
  CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 CCFUSE_TEST_ONE_GPU_RANKS=2 timeout 150 \
    $B/ccfuse_gpu_tests --gtest_filter='*MoeFfnBackward*' > "$O/logs/bwd_w2.log" 2>&1
  table+=("MoeFfnBackward one-GPU W=2: rc=$? $(tests_line "$O/logs/bwd_w2.log")")
  timeout 120 $B/ccfuse_gpu_tests --gtest_filter='*KGroupedGemm*:GemmValidation.*' > "$O/logs/gemm.log" 2>&1
  table+=("K-grouped + GemmValidation: rc=$? $(tests_line "$O/logs/gemm.log")")
  for f in bwd_w1 bwd_w2 gemm; do
    while read -r l; do table+=("  $f: $l"); done < <(grep -E '^\[  FAILED  \]|Failure$|error:' "$O/logs/$f.log" | head -6 | cut -c1-200)
  done
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) > 260 ? 200 : $(left) - 40 )) python3 -m torch.distributed.run --nproc-per-node 1 \
    tools/torch_moe_autograd_check.py --ccfuse-lib $B/libccfuse_c.so --backward fused,fused_keep,fused_keep_b1 \
    --json "$O/logs/moe_autograd.jsonl" > "$O/logs/moe_autograd.log" 2>&1
  table+=("MoeFfn autograd W=1: rc=$? $(grep -E '^torch_moe_autograd_check:' "$O/logs/moe_autograd.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E 'FAIL|timing|Error' "$O/logs/moe_autograd.log" | cut -c1-600 | head -8)
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 80 ]; then
  timeout $(( $(left) > 200 ? 150 : $(left) - 30 )) python3 tools/torch_grouped_autograd_bench.py \
    --ccfuse-lib $B/libccfuse_c.so --routing uniform --json "$O/logs/grouped_autograd.jsonl" \
    > "$O/logs/grouped_autograd.log" 2>&1
  table+=("torch_grouped_autograd_bench (uniform): rc=$?")
  while read -r l; do table+=("  $l"); done < <(cut -c1-200 "$O/logs/grouped_autograd.log" | tail -n 7)
fi
if [[ $parts == *" 4 "* ]] && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 15 )) python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_compile_check.py \
    --ccfuse-lib $B/libccfuse_c.so --backends aot_eager --json "$O/logs/compile.jsonl" > "$O/logs/compile.log" 2>&1
  table+=("torch_compile_check (aot_eager): rc=$? $(grep -E 'check:' "$O/logs/compile.log" | tail -1)")
  while read -r l; do table+=("  $l"); done < <(grep -E 'moe_train|FAIL' "$O/logs/compile.log" | cut -c1-200 | head -6)
fi
finish gpu_session_1207d
