#!/usr/bin/env bash
# One device call (2026-12-06): ag_gemm's fp16 cases at W = 2 in a one-GPU world (and gemm_rs's
# fp16 cases after the helpers moved), then ag_gemm at W = 1 on whole and short bands (ccfuse
# bench: the fused op against our plain GEMM and cuBLAS on the same shape), two passes.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
OUT=$O/fp16 CCFUSE_ONE_GPU_RANKS=2 CCFUSE_TEST_FILTER='*FusedAgGemm*fp16*:*FusedGemmReduce*1000x1024x512*' \
  CCFUSE_TEST_TIMEOUT=120 bash tools/gpu_run.sh one_gpu_world > /dev/null 2>&1
tar xzf $O/fp16/ccfuse-results.tgz -C $O/fp16 2>/dev/null
source tools/gpu_env.sh  # library path and CCFUSE_COMMIT (gpu_run.sh above unpacked the binaries)
for pass in 1 2; do
  for s in "8192 14336 8192" "8000 14336 8192" "1024 14336 8192" "1000 14336 8192" "4096 7168 4096" "4000 7168 4096"; do
    set -- $s
    timeout 60 .carry/bin/ccfuse bench --backend gpu --op ag_gemm --m $1 --n $2 --k $3 --world-size 1 --dtype bf16 \
      --json $O/ag_w1.jsonl > /dev/null 2>> $O/ag_w1.err
  done
done
f=$O/fp16/one_gpu_world_w2.log
echo "fp16 W=2: $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  FAILED  \] [A-Z]' $f) failed, $(grep -E '^\[  SKIPPED \] [A-Z]' $f | sort -u | wc -l) skipped"
python3 - "$O/ag_w1.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print('%5d x %5d x %5d fused %.4f ours %.4f cublas %.4f fused/ours %.3f %s' % (
        r['m'], r['n'], r['k'], r['t_fused_ms'], r['t_gemm_ccfuse_ms'], r.get('t_gemm_ms', 0),
        r['t_fused_ms'] / r['t_gemm_ccfuse_ms'], r.get('check', '')))
PY
tail -3 $O/ag_w1.err
