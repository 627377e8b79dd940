# One-GPU A/B of the MoE dispatch copy (2026-12-02). W1AB_BINS names the builds and settings to
# compare, "NAME=DIR[,VAR=VALUE...]" each (default "old=.carry/bin-old new=.carry/bin": old
# binaries staged in .carry/bin-old, new in .carry/bin; e.g. "r72=.carry/bin-r72" for a
# tools/stage_variant.sh build, "st0=.carry/bin,CCFUSE_MOE_STRIPED=0" for a bench setting).
# Every run writes into its own folder under $OUT; at the end all of them go into one
# $OUT/ab-all.tgz (the device tool brings back a limited number of files).
# W1AB_TESTS=1: GPU tests at W = 1 first, with the first build's binaries (W1AB_TEST_FILTER, by
# default the GpuMoeFfn ones); W1AB_DIAG=0: no diagnostics (W1AB_DIAGS, default "none l0sendonly",
# on W1AB_DIAG_MODELS, default qwen3, at W1AB_DIAG_TOKENS, default "4096 16384";
# W1AB_DIAG_PASSES passes, default 2); W1AB_VARIANTS, W1AB_ARGS: moe_ab's variants and bench
# arguments; W1AB_AB_ONLY="NAME ...": moe_ab on those builds only (default every build);
# W1AB_AB_PASSES: moe_ab passes (each build in turn, against drift); W1AB_GROUPED="NAME ...":
# gpu_run.sh grouped (its checks and ccfuse's grouped bench, no torch) on those builds, on the
# cases W1AB_GROUPED_ONLY names (tools/moe_grouped.py --only), W1AB_GROUPED_PASSES times;
# W1AB_NCU="NAME ...": gpu_run.sh moe_ncu_send on those builds (ncu needs gpu_run.sh's NCCL
# library path, so it runs through it).
set -u
R=$OUT
runs=()
specs=(${W1AB_BINS:-old=.carry/bin-old new=.carry/bin})
names=()
run() {  # run NAME BIN-DIR ENV... -- gpu_run.sh sections
  local name=$1 bin=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env CCFUSE_BIN=$bin "${envs[@]}" OUT=$R/$name timeout 240 bash tools/gpu_run.sh "$@" > $R/$name.out 2>&1
  runs+=($name)
}
spec_run() {  # spec_run SPEC RUN-NAME ENV... -- sections
  local spec=$1 tag=$2; shift 2
  local name=${spec%%=*} rest=${spec#*=}
  local dir=${rest%%,*} kv=()
  [[ $rest == *,* ]] && IFS=, read -ra kv <<< "${rest#*,}"
  run $tag-$name $dir "${kv[@]}" "$@"
}
named() {  # named SPEC "NAME ...": is the spec's name in the list
  local n
  for n in $2; do [ "${1%%=*}" = "$n" ] && return 0; done
  return 1
}
if [ "${W1AB_TESTS:-0}" = 1 ]; then
  spec_run ${specs[0]} tests CCFUSE_TEST_FILTER="${W1AB_TEST_FILTER:-*GpuMoeFfn*}" CCFUSE_TEST_TIMEOUT=300 -- tests_only
fi
ab=${W1AB_ARGS:-"--tokens 4096 16384 --routing uniform"}
diag=(CCFUSE_MOE_DIAG_TOKENS="${W1AB_DIAG_TOKENS:-4096 16384}" CCFUSE_MOE_DIAG_MODELS="${W1AB_DIAG_MODELS:-qwen3}"
      CCFUSE_MOE_DIAGS="${W1AB_DIAGS:-none l0sendonly}")
for pass in $([ "${W1AB_DIAG:-1}" = 1 ] && seq ${W1AB_DIAG_PASSES:-2}); do
  for s in "${specs[@]}"; do spec_run $s diagstriped$pass CCFUSE_MOE_STRIPED=1 "${diag[@]}" -- moe_diag; done
done
for pass in $(seq ${W1AB_AB_PASSES:-1}); do
  for s in "${specs[@]}"; do
    [ -n "${W1AB_AB_ONLY:-}" ] && ! named $s "$W1AB_AB_ONLY" && continue
    spec_run $s ab$pass CCFUSE_MOE_AB_VARIANTS="${W1AB_VARIANTS:-default striped}" CCFUSE_MOE_AB_ARGS="$ab" -- moe_ab
  done
done
for pass in $([ -n "${W1AB_GROUPED:-}" ] && seq ${W1AB_GROUPED_PASSES:-1}); do
  for s in "${specs[@]}"; do
    named $s "$W1AB_GROUPED" || continue
    spec_run $s grouped$pass CCFUSE_GROUPED_ONLY="${W1AB_GROUPED_ONLY:-qwen3-down-T4096}" CCFUSE_GROUPED_TORCH=0 -- grouped
  done
done
for n in ${W1AB_NCU:-}; do
  for s in "${specs[@]}"; do [ "${s%%=*}" = $n ] && spec_run $s ncu -- moe_ncu_send; done
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
  [ -f $R/all/$n/grouped_check.log ] && echo "== $n: grouped check $(grep -c '^PASS' $R/all/$n/grouped_check.log) PASS, $(grep -c '^FAIL' $R/all/$n/grouped_check.log) FAIL"
  [ -f $R/all/$n/grouped.jsonl ] && python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print('%-8s E=%-4d T=%-6d N=%-5d K=%-5d %-8s ccfuse %.4f ms  cuBLAS grouped %.4f ms  %s' % (sys.argv[2], r['experts'],
          r['tokens_per_rank'], r['n'], r['k'], r['routing'], r['t_fused_ms'], r.get('t_gemm_ms') or 0, r.get('check', '')))
" $R/all/$n/grouped.jsonl $n
done
tar czf $R/ab-all.tgz -C $R/all .
for n in "${runs[@]}"; do rm -rf $R/$n $R/$n.out; done
rm -rf $R/all
