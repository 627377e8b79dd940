#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, third session): ccfuse.layers.MoeLayer with the MoeFfn
# options passed through (tools/torch_layers_check.py at W = 1: fused, fused_keep, unfused and the
# new fused_wt / fused_kb / fused_mg, eager, plus fused compiled), then its --inject-fault run (must
# exit 1). Logs in one tarball, the table last.   bash tools/gpu_session_1207g.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
timeout 240 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_layers_check.py \
  --ccfuse-lib $B/libccfuse_c.so --compile --json "$O/logs/layers.jsonl" > "$O/logs/layers.log" 2>&1
table+=("torch_layers_check W=1: rc=$? $(grep -E '^torch_layers_check:' "$O/logs/layers.log")")
while read -r l; do table+=("  $l"); done < <(grep -E '^rank' "$O/logs/layers.log" | cut -c1-200)
timeout 120 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_layers_check.py \
  --ccfuse-lib $B/libccfuse_c.so --inject-fault --json "$O/logs/layers_fault.jsonl" > "$O/logs/layers_fault.log" 2>&1
table+=("torch_layers_check --inject-fault: rc=$? (nonzero = caught) $(grep -E '^torch_layers_check:' "$O/logs/layers_fault.log")")
finish gpu_session_1207g
