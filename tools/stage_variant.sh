#!/usr/bin/env bash
# Builds a variant of some CUDA targets with extra nvcc flags (compile-time A/B experiments, e.g.
# -DCCFUSE_SEND_WARP_REGS=72) in its own build folder, and stages the binaries in .carry/bin-NAME
# beside the default build's .carry/bin (tools/stage_gpu.sh). On the GPU machine:
#   OUT=$OUT/NAME CCFUSE_BIN=.carry/bin-NAME bash tools/gpu_run.sh SECTIONS
# runs the same sections on the variant (its files under $OUT/NAME).
# Usage: bash tools/stage_variant.sh NAME "NVCC FLAGS" TARGET [TARGET ...]
#   e.g. bash tools/stage_variant.sh r72 "-DCCFUSE_SEND_WARP_REGS=72" ccfuse_moe_ffn_bench
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: $0 NAME \"NVCC FLAGS\" TARGET [TARGET ...]" >&2; exit 2; }
name=$1 flags=$2
shift 2
[[ $name =~ ^[A-Za-z0-9_-]+$ ]] || { echo "stage_variant.sh: NAME '$name' must be letters, digits, - or _" >&2; exit 2; }
export PATH=/usr/local/cuda/bin:$PATH
dir=build-variant-$name
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCCFUSE_WITH_CUDA=ON "-DCMAKE_CUDA_FLAGS=$flags" >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "$@"
rm -rf ".carry/bin-$name" && mkdir -p ".carry/bin-$name"
for t in "$@"; do
  f=$(find "$dir" -maxdepth 2 -type f -name "$t" -perm -u+x | head -n 1)
  [ -n "$f" ] || { echo "stage_variant.sh: no binary '$t' under $dir" >&2; exit 2; }
  cp "$f" ".carry/bin-$name/"
done
strip --strip-unneeded ".carry/bin-$name"/* 2>/dev/null || true
gzip -9 ".carry/bin-$name"/*  # ~4x smaller; tools/gpu_run.sh unpacks them
echo "$flags" > ".carry/bin-$name/FLAGS"
du -sh .carry ".carry/bin-$name"
