#!/usr/bin/env bash
# The README's main-job command: set up, build, then check and benchmark the TP ops (and, on
# 2+ GPUs, the fused MoE FFN).
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
# The fused MoE FFN (EP = number of GPUs, all-to-all) where 2+ GPUs are present: two model
# shapes, one token count, checked against fp64 on sampled tokens (bench/moe_ffn_bench.cu).
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
if [ "$preset" = default ] && [ "${gpus:-0}" -ge 2 ]; then
  cmake --build --preset "$preset" -j "$(nproc)" --target ccfuse_moe_ffn_bench
  build/ccfuse_moe_ffn_bench --model mixtral qwen3 --tokens 4096 --routing uniform --iters 5 --warmup 2 \
    --json "$out_dir/$(date -u +%Y-%m-%d)-demo-moe.jsonl"
else
  echo "demo: the fused MoE FFN needs 2+ GPUs (found ${gpus:-0}); its CPU reference world runs in the tests"
fi
echo "demo: records appended to $json"
# The short table last: fused vs serial vs limit per op (tools/tp_report.py; "-" where not measured).
python3 tools/tp_report.py "$json"
