#!/usr/bin/env bash
# One device call on one GPU (2026-12-06, late night), parts in priority order, each time-boxed:
# (1) MoeFfnBackward's GPU tests at W = 1 and in the one-GPU world at W = 2 (tools/gpu_session_1206i.sh
# part 1, the forward tests left out); (2) Mixtral's grouped GEMM on this GPU: the engine's choice
# (128x128 ping-pong) against the whole 128x256 tile in the same interleaved rounds (gpu_run.sh
# grouped_ab), torch._grouped_mm beside it (gpu_run.sh grouped), and the plain engine on one
# expert's dense shape against cuBLASLt; (3) tools/torch_compile_check.py at W = 1 (MoeFfn with
# backward="fused" compiled, forward and backward); (4) tools/torch_layers_check.py at W = 1
# (ccfuse.layers.MoeLayer trained). Parts run in the order 1, 3, 4, 2. Every log goes into one tarball (the device tool brings
# back few files); the table is printed last.   bash tools/gpu_session_1206j.sh [PART ...]
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O/logs"
parts=" ${*:-1 3 4 2} "
table=()
left() { echo $(( ${CCFUSE_SESSION_BUDGET_S:-560} - SECONDS )); }

if [[ $parts == *" 1 "* ]]; then
  G1206I_SKIP_FWD=1 OUT="$O/logs/bwd" timeout 330 bash tools/gpu_session_1206i.sh 1 > "$O/logs/bwd.txt" 2>&1
  table+=("part 1 rc=$?")
  while read -r l; do table+=("  $l"); done < <(grep -vE '^(==|\s*$)' "$O/logs/bwd.txt" | tail -n 14 | cut -c1-220)
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 150 ]; then
  # torch.compile with MoeFfn(backward="fused") trained (moe_train_fused cases), and the rest of the
  # compile check as before, at W = 1
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_compile_check.py \
    --ccfuse-lib .carry/bin/libccfuse_c.so --json "$O/logs/compile.jsonl" > "$O/logs/compile.log" 2>&1
  table+=("torch.compile check W=1: rc=$? $(grep -E '^torch_compile_check:' "$O/logs/compile.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^moe_train|FAIL' "$O/logs/compile.log" | cut -c1-220 | head -8)
fi
if [[ $parts == *" 4 "* ]] && [ "$(left)" -gt 150 ]; then
  # ccfuse.layers.MoeLayer trained (router + fused MoE FFN), eager and compiled, against fp32 torch
  timeout 150 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_layers_check.py \
    --ccfuse-lib .carry/bin/libccfuse_c.so --compile --json "$O/logs/layers.jsonl" > "$O/logs/layers.log" 2>&1
  table+=("MoeLayer check W=1: rc=$? $(grep -E '^torch_layers_check:' "$O/logs/layers.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^rank|Error' "$O/logs/layers.log" | cut -c1-200 | head -10)
  if [ "$(left)" -gt 200 ]; then
    timeout 90 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_layers_check.py \
      --ccfuse-lib .carry/bin/libccfuse_c.so --inject-fault > "$O/logs/layers_fault.log" 2>&1
    table+=("MoeLayer check, injected fault (want rc=1): rc=$?")
  fi
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 90 ]; then
  : > "$O/logs/plain.jsonl"
  for shape in "8192 28672 4096" "8192 4096 14336"; do
    set -- $shape
    timeout 40 .carry/bin/ccfuse bench --op gemm --m $1 --n $2 --k $3 --dtype bf16 --iters 10 --print-config \
      --json "$O/logs/plain.jsonl" < /dev/null >> "$O/logs/plain.log" 2>&1 || echo "rc=$? $shape" >> "$O/logs/plain.log"
  done
  while read -r l; do table+=("  $l"); done < <(python3 -c "
import json
for l in open('$O/logs/plain.jsonl'):
    r = json.loads(l)
    print('plain %dx%dx%d: ccfuse %.3f ms, cuBLASLt %.3f ms, %s' % (r['m'], r['n'], r['k'], r['t_fused_ms'], r.get('t_gemm_ms') or -1, r.get('config', '')))" 2>&1)
  CCFUSE_GROUPED_ONLY=mixtral OUT="$O/logs/g" timeout $(( $(left) - 20 )) bash tools/gpu_run.sh grouped grouped_ab \
    > "$O/logs/g.txt" 2>&1
  table+=("Mixtral grouped + A/B (whole 128x256): rc=$?")
  # gpu_run.sh packs its outputs into ccfuse-results.tgz: the two summaries back out of it
  tar -xzf "$O/logs/g/ccfuse-results.tgz" -C "$O/logs/g" ./grouped_summary.log ./grouped_ab_summary.log 2>/dev/null
  while read -r l; do table+=("  $l"); done < <(grep -E '^geomean|^same-clock' "$O/logs/g/grouped_summary.log" 2>/dev/null)
  while read -r l; do table+=("  $l"); done < <(sed -n '/^variant against/,$p' "$O/logs/g/grouped_ab_summary.log" 2>/dev/null | cut -c1-160)
fi
{
  echo "== gpu_session_1206j on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(cat .carry/commit 2>/dev/null | tr '\n' ' '), ${SECONDS} s"
  printf '%s\n' "${table[@]}"
} | tee "$O/summary.txt"
tar -czf "$O/logs.tar.gz" -C "$O" logs && rm -rf "$O/logs"
