# One-GPU A/B of the MoE dispatch copy (2026-12-02): old binaries in .carry/bin-old, new in .carry/bin.
# Every run writes into its own folder under $OUT; at the end all of them go into one
# $OUT/ab-all.tgz (the device tool brings back a limited number of files).
# W1AB_TESTS=1: the GpuMoeFfn tests at W = 1 first; W1AB_DIAG=0: no Qwen3 diagnostics;
# W1AB_VARIANTS, W1AB_ARGS: moe_ab's variants and bench arguments for both binaries. (An ncu of the
# send-only kernel run from here failed: ncclDevCommCreate needs gpu_run.sh's NCCL library path; use gpu_run.sh moe_ncu.)
set -u
R=$OUT
runs=()
run() {  # run NAME BIN-DIR ENV... -- gpu_run.sh sections
  local name=$1 bin=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env CCFUSE_BIN=$bin "${envs[@]}" OUT=$R/$name timeout 240 bash tools/gpu_run.sh "$@" > $R/$name.out 2>&1
  runs+=($name)
}
if [ "${W1AB_TESTS:-0}" = 1 ]; then
  run tests .carry/bin CCFUSE_TEST_FILTER='*GpuMoeFfn*' CCFUSE_TEST_TIMEOUT=300 -- tests_only
fi
ab=${W1AB_ARGS:-"--tokens 4096 16384 --routing uniform"}
diag=(CCFUSE_MOE_DIAG_TOKENS="4096 16384" CCFUSE_MOE_DIAG_MODELS=qwen3 CCFUSE_MOE_DIAGS="none l0sendonly")
for pass in $([ "${W1AB_DIAG:-1}" = 1 ] && echo 1 2); do
  for b in old new; do
    d=.carry/bin; [ $b = old ] && d=.carry/bin-old
    run diagstriped-$b-$pass $d CCFUSE_MOE_STRIPED=1 "${diag[@]}" -- moe_diag
  done
done
for pass in $(seq ${W1AB_AB_PASSES:-1}); do  # W1AB_AB_PASSES: old, new, old, new ... against drift
  for b in old new; do
    d=.carry/bin; [ $b = old ] && d=.carry/bin-old
    run ab-$b-$pass $d CCFUSE_MOE_AB_VARIANTS="${W1AB_VARIANTS:-default striped}" CCFUSE_MOE_AB_ARGS="$ab" -- moe_ab
  done
done
for n in "${runs[@]}"; do
  mkdir -p $R/all/$n
  [ -f $R/$n/ccfuse-results.tgz ] && tar xzf $R/$n/ccfuse-results.tgz -C $R/all/$n
done
for n in "${runs[@]}"; do [ -d $R/$n ] && cp -r $R/$n/*.txt $R/all/$n/ 2>/dev/null; cp $R/$n.out $R/all/ 2>/dev/null; done
# The short tables last, per run.
for n in "${runs[@]}"; do
  for f in $R/all/$n/moe_diag_summary.log $R/all/$n/moe_table_*.log; do
    [ -f "$f" ] && { echo "== $n/$(basename $f)"; grep -v '^model' "$f"; }
  done
  [ -f $R/all/$n/gpu_tests_only.log ] && { echo "== $n"; grep -E '^\[  (PASSED|FAILED) ' $R/all/$n/gpu_tests_only.log; }
done
tar czf $R/ab-all.tgz -C $R/all .
for n in "${runs[@]}"; do rm -rf $R/$n $R/$n.out; done
rm -rf $R/all
