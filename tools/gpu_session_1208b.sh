#!/usr/bin/env bash
# One device call on one GPU (written 2026-12-07, sixth session; binaries of 9aab36b or later):
# compute-sanitizer's racecheck, memcheck and synccheck on the one-CTA MoE preparation
# (single_chunk_prep_kernel: shared-memory ranking, scan and send list behind barriers; the four
# `prep_one_*` GpuMoeFfn cases) and on the default chunk kernels' smallest MoE cases (their steps
# became shared device functions in f0b34e6). Prediction: 0 errors from each tool.
#   bash tools/gpu_session_1208b.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
filter='*GpuMoeFfn.*/prep_one_*:*GpuMoeFfn.*/regstore_*'
for tool in racecheck synccheck memcheck; do
  [ "$(left)" -gt 60 ] || { table+=("$tool: not run (time)"); continue; }
  CCFUSE_WATCHDOG_MS=120000 timeout 170 compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 \
    --error-exitcode 9 $B/ccfuse_gpu_tests --gtest_filter="$filter" > "$O/logs/$tool.log" 2>&1
  table+=("$tool ($filter): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$O/logs/$tool.log" | tr '\n' ' ')")
  while read -r l; do table+=("  $l"); done < <(grep -E '^=========     at |^\[  FAILED  \]' "$O/logs/$tool.log" | sort | uniq -c | head -4 | cut -c1-200)
done
finish gpu_session_1208b
