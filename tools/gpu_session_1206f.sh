#!/usr/bin/env bash
# One device call (2026-12-06, afternoon): why the plain GEMM at 8000x14336x8192 runs ~6 % slower
# than at 8192 rows with the same config (128x256x64/3, CTA pairs, group_m 16). 63 row tiles
# (8000, 8064) against 64 (8192) and 62 (7936): the engine's choice (since 2026-12-06 unpaired
# for an odd number of row tiles) against the other pairing (CCFUSE_GEMM_CLUSTER_M=2 on the odd
# counts: the old choice; =1 on the even ones), two rounds, each record with cuBLASLt in the
# same process.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
source tools/gpu_env.sh  # unpacks nothing: run after a gpu_run.sh call, or unpack here
for d in .carry/bin; do for gz in "$d"/*.gz; do [ -e "$gz" ] && gunzip -f "$gz" && chmod +x "${gz%.gz}"; done; done
for round in 1 2; do
  for mv in "8192 1" "8000 2" "8064 2" "7936 1"; do
    set -- $mv; m=$1
    for v in "" $2; do
      CCFUSE_GEMM_CLUSTER_M=$v timeout 60 .carry/bin/ccfuse bench --op gemm --m $m --n 14336 --k 8192 --dtype bf16 \
        --iters 10 --json $O/odd_rows.jsonl > /dev/null 2>> $O/odd_rows.err
    done
  done
done
python3 - $O/odd_rows.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print('%5d x %5d x %5d %-62s ours %.4f ms cublas %.4f ms %5.1f %%' % (r['m'], r['n'], r['k'], r.get('config', '')[:62],
          r['t_fused_ms'], r['t_gemm_ms'], r.get('pct_of_cublas', 0)))
PY
tail -3 $O/odd_rows.err
