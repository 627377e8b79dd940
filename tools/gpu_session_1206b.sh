#!/usr/bin/env bash
# One device call (2026-12-06, afternoon): ag_gemm with short last chunks and the TP ops at
# W = 3 in one-GPU worlds, and the GpuTeam ring tests' stamps at W = 4 and 8. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
NEW='*FusedAgGemm*/1000x*:*FusedAgGemm*/1500x*:*FusedAgGemm*/1536x*:*FusedAgGemm*/768x*:FusedAgGemmValidation*'
OUT=$O/ag2 CCFUSE_ONE_GPU_RANKS=2 CCFUSE_TEST_FILTER='*FusedAgGemm*' CCFUSE_TEST_TIMEOUT=120 bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
OUT=$O/ag38 CCFUSE_ONE_GPU_RANKS="3 8" CCFUSE_TEST_FILTER="$NEW" CCFUSE_TEST_TIMEOUT=75 bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
OUT=$O/rs3 CCFUSE_ONE_GPU_RANKS=3 CCFUSE_TEST_FILTER='*FusedGemmReduce*' CCFUSE_TEST_TIMEOUT=75 bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
OUT=$O/team GTEST_REPEAT=2 CCFUSE_ONE_GPU_RANKS="4 8" CCFUSE_TEST_FILTER='GpuTeam.Thousand*:GpuTeam.CudaGraph*' CCFUSE_TEST_TIMEOUT=40 bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
for d in ag2 ag38 rs3 team; do tar xzf $O/$d/ccfuse-results.tgz -C $O/$d 2>/dev/null; done  # gpu_run.sh packs its logs
for f in $O/ag2/one_gpu_world_w2.log $O/ag38/one_gpu_world_w3.log $O/ag38/one_gpu_world_w8.log $O/rs3/one_gpu_world_w3.log $O/team/one_gpu_world_w4.log $O/team/one_gpu_world_w8.log; do
  echo "== $f: $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  SKIPPED \] [A-Z]' $f) skipped, $(grep -cE '^\[  FAILED  \] [A-Z]' $f) failed"
  grep -E '^\[  FAILED  \] [A-Z]' $f | sort -u | head -5
done
