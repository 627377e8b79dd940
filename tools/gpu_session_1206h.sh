#!/usr/bin/env bash
# One device call (2026-12-06, 18:xx; one GPU lent): (1) the GpuMoeFfn cases that force the combine
# kernel at W = 1 (*presum_combine_kernel*, never run); (2) ccfuse.torch_ops through torch at W = 1:
# the TP linears with autograd (now the raw ops' autograd Functions, bias cases included),
# torch.compile / torch.library.opcheck (tools/torch_compile_check.py, with --inject-fault run
# apart: it must fail), the GPU router through Python (tools/torch_router_check.py, the same).
# Logs under $OUT; a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p $O
if [ "${1:-}" = grouped ]; then
  for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
  source tools/gpu_env.sh
  timeout 500 python3 tools/torch_grouped_autograd_bench.py --ccfuse-lib .carry/bin/libccfuse_c.so \
    --json $O/grouped_autograd.jsonl 2>&1 | tee $O/grouped_autograd.log | tail -14
  timeout 200 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_compile_check.py --ccfuse-lib \
    .carry/bin/libccfuse_c.so --backends aot_eager --json $O/compile.jsonl > $O/compile.log 2>&1
  echo "rc=$?" >> $O/compile.log; grep -E 'grouped|check:|rc=' $O/compile.log | cut -c1-150
  exit 0
fi
OUT=$O/t CCFUSE_TEST_FILTER='*presum_combine_kernel*' CCFUSE_TEST_TIMEOUT=120 bash tools/gpu_run.sh tests_only > /dev/null 2>&1
tar xzf $O/t/ccfuse-results.tgz -C $O/t 2>/dev/null
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
lib=.carry/bin/libccfuse_c.so
run1() {  # name, timeout, script args...
  local name=$1 t=$2; shift 2
  timeout $t python3 -m torch.distributed.run --nproc-per-node 1 "$@" > $O/$name.log 2>&1
  echo "rc=$?" >> $O/$name.log
}
run1 tp_linear 180 tools/torch_tp_linear_check.py --ccfuse-lib $lib --json $O/tp_linear.jsonl
run1 compile ${G1206H_COMPILE_TIMEOUT:-300} tools/torch_compile_check.py --ccfuse-lib $lib --json $O/compile.jsonl
run1 compile_fault 240 tools/torch_compile_check.py --ccfuse-lib $lib --backends aot_eager --inject-fault
timeout 180 python3 tools/torch_router_check.py --ccfuse-lib $lib --json $O/router.jsonl > $O/router.log 2>&1; echo "rc=$?" >> $O/router.log
timeout 120 python3 tools/torch_router_check.py --ccfuse-lib $lib --inject-fault --iters 5 > $O/router_fault.log 2>&1; echo "rc=$?" >> $O/router_fault.log
echo "== presum_combine_kernel tests: $(grep -E '^\[  (PASSED|FAILED) ' $O/t/gpu_tests_only.log | tr '\n' ' ')"
echo "== torch linears W=1:"; grep -vE '^(W|\[)' $O/tp_linear.log | tail -16
echo "== compile/opcheck W=1:"; grep -E 'ok$|FAIL|rc=|torch_compile_check' $O/compile.log | tail -30
echo "== compile, injected fault (must fail: fault:block FAIL, rc=1):"; grep -E 'fault|rc=' $O/compile_fault.log | tail -3
echo "== router:"; tail -12 $O/router.log
echo "== router, injected fault (must end rc=1):"; grep -E 'dropless_softmax|rc=' $O/router_fault.log
# Second call ("grouped" as the first argument runs only this): grouped_mm with autograd against
# torch._grouped_mm on MoE expert shapes.
