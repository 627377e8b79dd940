#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, fourth session): ccfuse.layers.MoeLayer for inference
# under CUDA graphs (tools/torch_moe_graph_check.py at W = 1: captured in torch's default "global"
# mode, replays on fresh tokens against eager bit for bit and an fp32 reference, eager vs replay
# per-call time), and the same with --inject-fault (must exit 1). Logs in one tarball, the table last.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
graph_check() {
  local name=$1
  shift
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_graph_check.py \
    --ccfuse-lib $B/libccfuse_c.so "$@" > "$O/logs/$name.log" 2>&1
  table+=("$name: rc=$? $(grep -E '^torch_moe_graph_check:' "$O/logs/$name.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^rank |Error|error' "$O/logs/$name.log" | cut -c1-230 | head -14)
}
graph_check moe_graph --json "$O/logs/moe_graph.jsonl"
[ "$(left)" -gt 60 ] && graph_check moe_graph_fault --small --inject-fault --replays 2 --iters 5
finish gpu_session_1207j
