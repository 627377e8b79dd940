#!/usr/bin/env bash
# One device call (2026-12-06, afternoon): the engine's TMA store for a cut tile that ends at C's
# last row (sm90_gemm.cuh tma_store_tile). The whole GPU suite at W = 1 (the grouped GEMM's last
# group and ag_gemm's last band take the new path), then ag_gemm at W = 1 on whole and short bands
# against our plain GEMM and cuBLAS, two passes (as tools/gpu_session_1206c.sh, for the before).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
OUT=$O/suite bash tools/gpu_run.sh tests > /dev/null 2>&1
tar xzf $O/suite/ccfuse-results.tgz -C $O/suite 2>/dev/null
source tools/gpu_env.sh
for pass in 1 2; do
  for s in "8192 14336 8192" "8000 14336 8192" "1024 14336 8192" "1000 14336 8192" "4096 7168 4096" "4000 7168 4096"; do
    set -- $s
    timeout 60 .carry/bin/ccfuse bench --backend gpu --op ag_gemm --m $1 --n $2 --k $3 --world-size 1 --dtype bf16 \
      --json $O/ag_w1.jsonl > /dev/null 2>> $O/ag_w1.err
  done
done
f=$O/suite/gpu_tests.log
echo "suite W=1: $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  FAILED  \] [A-Z]' $f) failed, $(grep -E '^\[  SKIPPED \] [A-Z]' $f | sort -u | wc -l) skipped; $(grep -h 'test suites ran' $f)"
grep -E '^\[  FAILED  \] [A-Z]' $f | head -20
tail -n 8 $O/suite/gpu_check.log 2>/dev/null
python3 - "$O/ag_w1.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print('%5d x %5d x %5d fused %.4f ours %.4f cublas %.4f fused/ours %.3f %s' % (
        r['m'], r['n'], r['k'], r['t_fused_ms'], r['t_gemm_ccfuse_ms'], r.get('t_gemm_ms', 0),
        r['t_fused_ms'] / r['t_gemm_ccfuse_ms'], r.get('check', '')))
PY
tail -3 $O/ag_w1.err
