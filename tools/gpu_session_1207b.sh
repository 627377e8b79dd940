#!/usr/bin/env bash
# One device call on one GPU (2026-12-07, later): the grouped tile rule by memory bandwidth
# (choose_config(GroupedGemmDesc, sms, mem_gbps): ping-pong from N = 4096 only at >= 4000 GB/s).
# (1) the engine's config tests (GemmValidation.*, CPU-side rules, and this device's bandwidth);
# (2) Mixtral- and DeepSeek-like grouped GEMMs against torch._grouped_mm, and the A/B of the other
# tile (ping-pong where the engine now runs whole tiles, and back) in the same rounds.
# Logs in one tarball, the table last.   bash tools/gpu_session_1207b.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O/logs"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
table=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
timeout 60 .carry/bin/ccfuse_gpu_tests --gtest_filter='GemmValidation.*' > "$O/logs/gemm_validation.log" 2>&1
table+=("GemmValidation: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$O/logs/gemm_validation.log" | tr '\n' ' ')")
CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 CCFUSE_TEST_ONE_GPU_RANKS=2 timeout 120 \
  .carry/bin/ccfuse_gpu_tests --gtest_filter='GpuMoeFfnBackward.RejectsBadInput' > "$O/logs/bwd_bad_input.log" 2>&1
table+=("GpuMoeFfnBackward.RejectsBadInput: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$O/logs/bwd_bad_input.log" | tr '\n' ' ')")
CCFUSE_GROUPED_ONLY="${G1207B_ONLY:-mixtral|dsv3}" OUT="$O/logs/g" timeout $(( ${CCFUSE_SESSION_BUDGET_S:-400} - SECONDS )) \
  bash tools/gpu_run.sh grouped grouped_ab > "$O/logs/g.txt" 2>&1
table+=("grouped + A/B: rc=$?")
tar -xzf "$O/logs/g/ccfuse-results.tgz" -C "$O/logs/g" ./grouped_summary.log ./grouped_ab_summary.log 2>/dev/null
while read -r l; do table+=("  $l"); done < <(grep -E '^geomean|^same-clock' "$O/logs/g/grouped_summary.log" 2>/dev/null)
while read -r l; do table+=("  $l"); done < <(sed -n '/^variant against/,$p' "$O/logs/g/grouped_ab_summary.log" 2>/dev/null | cut -c1-130)
{
  echo "== gpu_session_1207b on $gpu, commit $(tr '\n' ' ' < .carry/commit), ${SECONDS} s"
  printf '%s\n' "${table[@]}"
} | tee "$O/summary.txt"
tar -czf "$O/logs.tar.gz" -C "$O" logs && rm -rf "$O/logs"
