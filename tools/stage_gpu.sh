#!/usr/bin/env bash
# Builds the CUDA targets here (nvcc 13.0, sm_90a) and stages the binaries in .carry/bin, the
# ignored folder that the device tool carries to the GPU machine (no compiler run there).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target ccfuse_tool ccfuse_gpu_tests ccfuse_comm_bench \
  ccfuse_gemm_hooks_bench ccfuse_ag_transport_probe ccfuse_router_bench ccfuse_moe_ffn_bench ccfuse_c \
  2>&1 | tee build/stage_build.log
# Never stage a build where ptxas serialized wgmma (C7515). (Only the objects this build compiled
# are checked: build from clean, or with this script, to be sure.)
bash tools/check_ptxas_log.sh build/stage_build.log || exit 3
# Usage: bash tools/stage_gpu.sh [NAME ...]: all binaries, or only the named ones (e.g. ccfuse
# libccfuse_c.so ccfuse_moe_ffn_bench) when a call needs fewer: the device tool carries at most
# 64 MiB, working tree included; gzipped (below) all of them take about 15 MiB.
all=(build/ccfuse build/tests/ccfuse_gpu_tests build/ccfuse_comm_bench build/ccfuse_gemm_hooks_bench
     build/ccfuse_ag_transport_probe build/ccfuse_router_bench build/ccfuse_moe_ffn_bench build/libccfuse_c.so)
pick=()
if [ $# -eq 0 ]; then pick=("${all[@]}"); else
  for name in "$@"; do
    found=""
    for f in "${all[@]}"; do [ "$(basename "$f")" = "$name" ] && found=$f; done
    [ -n "$found" ] || { echo "stage_gpu.sh: unknown binary '$name'" >&2; exit 2; }
    pick+=("$found")
  done
fi
rm -rf .carry/bin && mkdir -p .carry/bin
cp "${pick[@]}" .carry/bin/
# The device tool carries at most 64 MiB (working tree included): no symbol tables.
strip --strip-unneeded .carry/bin/* 2>/dev/null || true
gzip -9 .carry/bin/*  # ~4x smaller; tools/gpu_run.sh unpacks them
git rev-parse --short HEAD > .carry/commit 2>/dev/null || echo unknown > .carry/commit
git diff --quiet HEAD 2>/dev/null || echo "+dirty" >> .carry/commit
du -sh .carry; echo "tracked tree: $(git ls-files -z | du -ch --files0-from=- | tail -n 1)"
