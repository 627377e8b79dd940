#!/usr/bin/env bash
# One device call (2026-12-06, afternoon): after tools/gpu_session_1206d.sh (the engine's TMA store
# for a cut tile ending at C's last row, at W = 1), the fused kernels whose bands or groups take
# that path at W = 2 in a one-GPU world (ag_gemm, the MoE FFN), then the ring tests at W = 8 three
# passes with the hung-rank stamps (GPU stamps after 8 s, the eager call's entry barrier).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
OUT=$O/w2 CCFUSE_ONE_GPU_RANKS=2 CCFUSE_TEST_FILTER='*FusedAgGemm*:*GpuMoeFfn*' CCFUSE_TEST_TIMEOUT=300 \
  bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
OUT=$O/w8 GTEST_REPEAT=3 CCFUSE_ONE_GPU_RANKS=8 CCFUSE_TEST_FILTER='GpuTeam.Thousand*:GpuTeam.CudaGraph*' \
  CCFUSE_TEST_TIMEOUT=${CCFUSE_RING_TIMEOUT:-120} bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
for d in w2 w8; do tar xzf $O/$d/ccfuse-results.tgz -C $O/$d 2>/dev/null; done
f=$O/w2/one_gpu_world_w2.log
echo "W=2 ag+moe: $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  FAILED  \] [A-Z]' $f) failed, $(grep -E '^\[  SKIPPED \] [A-Z]' $f | sort -u | wc -l) skipped; $(grep -h 'test suites ran' $f)"
grep -E '^\[  FAILED  \] [A-Z]' $f | head -10
f=$O/w8/one_gpu_world_w8.log
echo "W=8 ring x3: $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  FAILED  \] [A-Z]' $f) failed; iterations started: $(grep -c 'Repeating all tests' $f)"
grep -E "still busy|\(not reached\)|failed|threw|timed out" $f | head -30
