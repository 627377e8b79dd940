# One-GPU A/B of the MoE dispatch copy (2026-12-02): old binaries in .carry/bin-old, new in .carry/bin;
# GpuMoeFfn tests at W = 1, Qwen3 diagnostics (units and striped) twice each, all models by variant.
set -u
R=$OUT
export CCFUSE_TEST_FILTER='*GpuMoeFfn*' CCFUSE_TEST_TIMEOUT=300
OUT=$R/tests bash tools/gpu_run.sh tests_only > $R/tests.out 2>&1
for b in old new old new; do
  d=.carry/bin; [ $b = old ] && d=.carry/bin-old
  n=$b; [ -d $R/diag-$b ] && n=$b-2
  CCFUSE_BIN=$d CCFUSE_MOE_DIAG_TOKENS="4096 16384" CCFUSE_MOE_DIAG_MODELS=qwen3 CCFUSE_MOE_DIAGS="none l0sendonly" OUT=$R/diag-$n bash tools/gpu_run.sh moe_diag > /dev/null 2>&1
  CCFUSE_MOE_STRIPED=1 CCFUSE_BIN=$d CCFUSE_MOE_DIAG_TOKENS="4096 16384" CCFUSE_MOE_DIAG_MODELS=qwen3 CCFUSE_MOE_DIAGS="none l0sendonly" OUT=$R/diagstriped-$n bash tools/gpu_run.sh moe_diag > /dev/null 2>&1
done
for b in old new; do
  d=.carry/bin; [ $b = old ] && d=.carry/bin-old
  CCFUSE_BIN=$d CCFUSE_MOE_AB_VARIANTS="default striped" CCFUSE_MOE_AB_ARGS="--tokens 4096 16384 --routing uniform" OUT=$R/ab-$b timeout 200 bash tools/gpu_run.sh moe_ab > /dev/null 2>&1
done
CCFUSE_MOE_AB_VARIANTS="gather" CCFUSE_MOE_AB_ARGS="--tokens 4096 16384 --routing uniform" OUT=$R/ab-new timeout 120 bash tools/gpu_run.sh moe_ab > /dev/null 2>&1
grep -E '^\[  (PASSED|FAILED)|FAILED  \]' $R/tests/gpu_tests_only.log | head -20
for f in $R/diag*/moe_diag_summary.log; do echo "== $f"; tail -n +2 $f; done
for f in $R/ab-*/moe_table_*.log; do echo "== $f"; tail -n +2 $f; done
