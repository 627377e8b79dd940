#!/usr/bin/env bash
# The README's main-job command: set up, build, then check and benchmark the TP ops.
# With >= 2 GPUs the tool runs on the GPUs; otherwise on the CPU reference world (it says so).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
bash tools/setup.sh
preset=$(bash tools/preset.sh)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target ccfuse_tool
bin=build/ccfuse; [ "$preset" = cpu ] && bin=build-cpu/ccfuse
# Local results go under build/ (ignored); bench/results/ holds only committed GPU runs.
out_dir=${CCFUSE_RESULTS:-build/results}
mkdir -p "$out_dir"
json="$out_dir/$(date -u +%Y-%m-%d)-demo.jsonl"
for op in ag_gemm gemm_rs gemm_ar; do
  "$bin" check --op "$op" --m 256 --n 192 --k 128
done
for op in ag_gemm gemm_rs gemm_ar; do
  "$bin" bench --op "$op" --m 512 --n 512 --k 256 --iters 5 --json "$json"
done
echo "demo: records appended to $json"
# The short table last: fused vs serial vs limit per op (tools/tp_report.py; "-" where not measured).
python3 tools/tp_report.py "$json"
