#!/usr/bin/env bash
# One device call on one GPU (2026-12-06, night), parts in priority order, each time-boxed, the
# whole under the device tool's 600 s: (1) MoeFfnBackward's GPU tests at W = 1 and in the one-GPU
# world at W = 2, and the forward MoE tests at W = 1 (the per-layer B layout touched layer 1);
# (2) MoeFfn with autograd through torch (both backward modes, an injected fault that must fail,
# the borrowed torch communicator); (3) the grouped GEMM's "kn" B against "nk" on dgrad shapes and
# grouped_mm's autograd bench; (4) the Mixtral grouped forward against torch. Logs under $OUT, a
# short table last.   bash tools/gpu_session_1206i.sh [PART ...]   (default: 1 2 3 4)
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
parts=" ${*:-1 2 3 4} "
B=.carry/bin
lib=$B/libccfuse_c.so
table=()
left() { echo $(( ${CCFUSE_SESSION_BUDGET_S:-560} - SECONDS )); }
tests_line() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }

if [[ $parts == *" 1 "* ]]; then
  timeout 150 $B/ccfuse_gpu_tests --gtest_filter='*MoeFfnBackward*' > "$O/bwd_w1.log" 2>&1
  table+=("MoeFfnBackward W=1: rc=$? $(tests_line "$O/bwd_w1.log")")
  # the one-GPU world's settings (comm/team.h mode d; gpu_run.sh one_gpu_world sets the same)
  CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 CCFUSE_TEST_ONE_GPU_RANKS=2 timeout 150 $B/ccfuse_gpu_tests --gtest_filter='*MoeFfnBackward*' > "$O/bwd_w2.log" 2>&1
  table+=("MoeFfnBackward one-GPU W=2: rc=$? $(tests_line "$O/bwd_w2.log")")
  grep -hE '^\[  FAILED  \] [A-Z]|Failure|rel_err|Expected|Which is|seed' "$O/bwd_w1.log" "$O/bwd_w2.log" | head -12 > "$O/bwd_fail.txt"
  if [ "${G1206I_SKIP_FWD:-0}" = 0 ]; then
    timeout 240 $B/ccfuse_gpu_tests --gtest_filter='Routing/GpuMoeFfn.*:GpuMoeFfn.*' > "$O/moe_fwd_w1.log" 2>&1
    table+=("MoE forward W=1 (layer-1 layout refactor): rc=$? $(tests_line "$O/moe_fwd_w1.log")")
  fi
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 60 ]; then
  run1() { local t=$1; shift; timeout "$t" python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_autograd_check.py --ccfuse-lib $lib "$@"; }
  run1 200 --json "$O/moe_autograd.jsonl" > "$O/moe_autograd.log" 2>&1
  table+=("MoeFfn autograd W=1: rc=$? $(grep -E '^torch_moe_autograd_check:' "$O/moe_autograd.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^rank|timing' "$O/moe_autograd.log" | cut -c1-170)
  grep -E 'Error|error' "$O/moe_autograd.log" | head -5 > "$O/moe_autograd_err.txt"
  run1 100 --inject-fault --backward fused > "$O/moe_autograd_fault.log" 2>&1
  table+=("MoeFfn autograd, injected fault (want rc=1, FAIL on uniform_top2): rc=$? $(grep -c FAIL "$O/moe_autograd_fault.log") FAIL")
  run1 100 --borrow-comm --no-timing --backward fused --json "$O/moe_autograd_borrow.jsonl" > "$O/moe_autograd_borrow.log" 2>&1
  table+=("MoeFfn autograd on torch's NCCL communicator: rc=$? $(grep -E '^torch_moe_autograd_check:|Error' "$O/moe_autograd_borrow.log" | head -2 | cut -c1-200)")
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 60 ]; then
  : > "$O/grouped_kn.jsonl"
  for shape in "--experts 64 --tokens 4096 --topk 8 --n 2048 --k 1536" "--experts 128 --tokens 4096 --topk 8 --n 7168 --k 4096"; do
    for lay in nk kn; do
      timeout 60 $B/ccfuse bench --op grouped_gemm $shape --routing uniform --b-layout $lay --dtype bf16 --iters 10 \
        --json "$O/grouped_kn.jsonl" < /dev/null >> "$O/grouped_kn.log" 2>&1 || echo "rc=$? $shape $lay" >> "$O/grouped_kn.log"
    done
  done
  while read -r l; do table+=("  $l"); done < <(python3 -c "
import json
for l in open('$O/grouped_kn.jsonl'):
    r = json.loads(l)
    print('grouped %s E%d n%d k%d: ccfuse %.3f ms (%.0f TF), cuBLAS grouped %.3f ms, %s' % (r['b_layout'], r['experts'], r['n'], r['k'], r['t_fused_ms'], r['tflops'], r.get('t_gemm_ms') or -1, r['config']))")
  if [ "$(left)" -gt 100 ]; then
    timeout $(( $(left) - 60 )) python3 tools/torch_grouped_autograd_bench.py --ccfuse-lib $lib --iters 10 \
      --json "$O/grouped_autograd.jsonl" > "$O/grouped_autograd.log" 2>&1
    table+=("grouped_mm autograd bench: rc=$?")
    while read -r l; do table+=("  $l"); done < <(grep -E 'dgrad' "$O/grouped_autograd.log" | cut -c1-150)
  fi
fi
if [[ $parts == *" 4 "* ]] && [ "$(left)" -gt 120 ]; then
  CCFUSE_GROUPED_ONLY=mixtral OUT="$O/g" timeout $(( $(left) - 20 )) bash tools/gpu_run.sh grouped > "$O/g.log" 2>&1
  table+=("Mixtral grouped forward: rc=$? $(grep -m1 -E '^geomean' "$O/g/grouped_summary.log" 2>/dev/null)")
fi
echo "== gpu_session_1206i on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $CCFUSE_COMMIT, ${SECONDS} s"
cat "$O/bwd_fail.txt" "$O/moe_autograd_err.txt" 2>/dev/null | head -16
printf '%s\n' "${table[@]}"
