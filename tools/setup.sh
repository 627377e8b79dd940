#!/usr/bin/env bash
# Installs what ccfuse needs to build on a fresh Debian/Ubuntu machine (idempotent, ~1-3 min):
# CMake >= 3.25, Ninja, GoogleTest, and the pinned CUTLASS/CuTe headers (nvidia-cutlass on PyPI).
# The CUDA toolkit (nvcc 13, cuBLAS, NCCL >= 2.28 with device headers) must already be present
# for the CUDA build; without nvcc the host-only build (CPU reference world) is used.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
[ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || need_apt+=(libgtest-dev)
command -v g++ >/dev/null || need_apt+=(g++)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

CUTLASS_PIN="nvidia-cutlass==4.2.0.0"
if ! python3 -c "import cutlass_library, os, sys; sys.exit(0 if os.path.exists(os.path.join(os.path.dirname(cutlass_library.__file__), 'source/include/cute/tensor.hpp')) else 1)" 2>/dev/null; then
  echo "setup: pip install $CUTLASS_PIN"
  python3 -m pip install -q "$CUTLASS_PIN" 2>&1 | grep -v "Running pip as the 'root' user" || true
fi

cmake_ver=$(cmake --version | head -1 | awk '{print $3}')
if [ "$(printf '%s\n3.25.0\n' "$cmake_ver" | sort -V | head -1)" != "3.25.0" ]; then
  echo "setup: CMake $cmake_ver is older than 3.25: pip install cmake"
  python3 -m pip install -q "cmake>=3.25"
fi
echo "setup: ok (cmake $cmake_ver, nvcc: $(command -v nvcc >/dev/null && nvcc --version | tail -1 || echo none))"
