#!/usr/bin/env bash
# One device call (2026-12-06, evening; one GPU lent): (1) the GpuMoeFfn tests and the choose_config
# tests with the new binaries; (2) ccfuse.torch_ops' TP linears with autograd and ag_gemm's gathered
# view through torch at W = 1 (tools/torch_tp_linear_check.py); (3) layer 1's pre-sum writing the
# output itself at W = 1 (no combine kernel) against CCFUSE_MOE_L1_DIRECT=0 (the combine), MoE
# FFN A/B, two passes; (4) the ring tests at W = 8 in a one-GPU world, six passes. Logs under $OUT.
# G1206_PARTS: "checks" (1, 2, 4), "torch" (2) and/or "ab" (3); default checks and ab (over 10
# minutes: one call each). G1206_AB_PASSES: the A/B's passes (2).
# "combine" (later the same evening): the combine kernel by warps per token (.carry/bin-new)
# against the old one (.carry/bin), both at W = 1 with CCFUSE_MOE_L1_DIRECT=0, and the direct
# pre-sum; the GpuMoeFfn tests with CCFUSE_MOE_L1_DIRECT=0 on the new binaries first. (Binaries of
# c21018d, where the library read that variable; since then MoeFfnConfig::always_combine, which
# the bench sets from it and the tests presum_combine_kernel_* set themselves.)
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p $O
parts=${G1206_PARTS:-checks ab}
if [[ " $parts " == *" checks "* ]]; then
OUT=$O/t CCFUSE_TEST_FILTER='*GpuMoeFfn*:GemmValidation.ChooseConfig*' CCFUSE_TEST_TIMEOUT=300 \
  bash tools/gpu_run.sh tests_only > /dev/null 2>&1
tar xzf $O/t/ccfuse-results.tgz -C $O/t 2>/dev/null
fi
if [[ " $parts " == *" checks "* || " $parts " == *" torch "* ]]; then
(
  for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
  source tools/gpu_env.sh
  timeout 180 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_tp_linear_check.py \
    --ccfuse-lib .carry/bin/libccfuse_c.so --json $O/tp_linear.jsonl > $O/tp_linear.log 2>&1
  echo "rc=$?" >> $O/tp_linear.log
)
fi
[[ " $parts " == *" ab "* ]] && mkdir -p $O/ab && OUT=$O/ab W1AB_BINS="combine=.carry/bin,CCFUSE_MOE_L1_DIRECT=0 direct=.carry/bin" W1AB_DIAG=0 W1AB_AB_PASSES=${G1206_AB_PASSES:-2} W1AB_VARIANTS=default bash tools/w1_copy_ab.sh > $O/ab.log 2>&1
if [[ " $parts " == *" checks "* ]]; then
OUT=$O/w8 GTEST_REPEAT=6 CCFUSE_ONE_GPU_RANKS=8 CCFUSE_TEST_FILTER='GpuTeam.Thousand*:GpuTeam.CudaGraph*' \
  CCFUSE_TEST_TIMEOUT=${CCFUSE_RING_TIMEOUT:-240} bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
tar xzf $O/w8/ccfuse-results.tgz -C $O/w8 2>/dev/null
echo "== tests: $(grep -E '^\[  (PASSED|FAILED) ' $O/t/gpu_tests_only.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $O/t/gpu_tests_only.log | head -10
fi
if [[ " $parts " == *" checks "* || " $parts " == *" torch "* ]]; then
echo "== torch linears at W = 1:"; grep -vE '^(W|\[)' $O/tp_linear.log | tail -14
fi
if [[ " $parts " == *" checks "* ]]; then
f=$O/w8/one_gpu_world_w8.log
echo "== W=8 ring x6: $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  FAILED  \] [A-Z]' $f) failed; iterations started: $(grep -c 'Repeating all tests' $f)"
grep -E "still busy|\(not reached\)|failed|threw|timed out" $f | head -20
fi
[[ " $parts " == *" ab "* ]] && {
echo "== MoE W = 1 A/B (combine = CCFUSE_MOE_L1_DIRECT=0, direct = the default):"; tail -40 $O/ab.log; }
if [[ " $parts " == *" combine "* ]]; then
  OUT=$O/tc CCFUSE_BIN=.carry/bin-new CCFUSE_MOE_L1_DIRECT=0 CCFUSE_TEST_FILTER='*GpuMoeFfn*' CCFUSE_TEST_TIMEOUT=300 \
    bash tools/gpu_run.sh tests_only > /dev/null 2>&1
  tar xzf $O/tc/ccfuse-results.tgz -C $O/tc 2>/dev/null
  echo "== tests with the combine kernel at W = 1: $(grep -E '^\[  (PASSED|FAILED) ' $O/tc/gpu_tests_only.log | tr '\n' ' ')"
  mkdir -p $O/cab
  OUT=$O/cab W1AB_BINS="oldcombine=.carry/bin,CCFUSE_MOE_L1_DIRECT=0 newcombine=.carry/bin-new,CCFUSE_MOE_L1_DIRECT=0 direct=.carry/bin-new" \
    W1AB_DIAG=0 W1AB_AB_PASSES=${G1206_AB_PASSES:-2} W1AB_VARIANTS=default bash tools/w1_copy_ab.sh > $O/cab.log 2>&1
  echo "== MoE W = 1, layer 1's combine:"; tail -40 $O/cab.log
fi
