# One-GPU A/B of the MoE dispatch copy (2026-12-02): old binaries in .carry/bin-old, new in .carry/bin.
# Every run writes into its own folder under $OUT; at the end all of them go into one
# $OUT/ab-all.tgz (the device tool brings back a limited number of files).
# W1AB_TESTS=1: the GpuMoeFfn tests at W = 1 first. W1AB_NCU=1: ncu of layer 0's send-only kernel.
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
ab="--tokens 4096 16384 --routing uniform"
diag=(CCFUSE_MOE_DIAG_TOKENS="4096 16384" CCFUSE_MOE_DIAG_MODELS=qwen3 CCFUSE_MOE_DIAGS="none l0sendonly")
for pass in 1 2; do
  for b in old new; do
    d=.carry/bin; [ $b = old ] && d=.carry/bin-old
    run diagstriped-$b-$pass $d CCFUSE_MOE_STRIPED=1 "${diag[@]}" -- moe_diag
  done
done
for b in old new; do
  d=.carry/bin; [ $b = old ] && d=.carry/bin-old
  run ab-$b $d CCFUSE_MOE_AB_VARIANTS="default striped" CCFUSE_MOE_AB_ARGS="$ab" -- moe_ab
done
if [ "${W1AB_NCU:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  gunzip -f .carry/bin/*.gz 2>/dev/null; chmod +x .carry/bin/* 2>/dev/null
  for st in 0 1; do
    mkdir -p $R/ncu-sendonly-striped$st
    CCFUSE_MOE_STRIPED=$st CCFUSE_MOE_DIAG=l0sendonly timeout 120 $NCU --clock-control none \
      --kernel-name-base demangled --kernel-name regex:L0Schedule --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      .carry/bin/ccfuse_moe_ffn_bench --model qwen3 --tokens 4096 --routing uniform --iters 1 --warmup 1 --sample 4 \
      < /dev/null > $R/ncu-sendonly-striped$st/ncu.txt 2>&1
    runs+=(ncu-sendonly-striped$st)
  done
fi
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
  [ -f $R/all/$n/ncu.txt ] && { echo "== $n"; grep -E "Duration|DRAM Throughput|L2 Hit Rate|L1/TEX Hit|Memory Throughput|Warp Cycles Per Issued|Stall|stalled" $R/all/$n/ncu.txt | head -12; }
done
tar czf $R/ab-all.tgz -C $R/all .
for n in "${runs[@]}"; do rm -rf $R/$n $R/$n.out; done
rm -rf $R/all
