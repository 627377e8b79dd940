#!/usr/bin/env bash
# The README's test command: set up, build every target (CUDA sources included where nvcc
# exists), run the whole test suite with CTest. GPU tests skip, with the reason shown, on
# machines with fewer than 2 GPUs. With --tsan, also builds and runs the host tests under
# ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
bash tools/setup.sh
preset=$(bash tools/preset.sh)
jobs=${CCFUSE_JOBS:-$(nproc)}
cmake --preset "$preset" >/dev/null
build_log=$(mktemp)
cmake --build --preset "$preset" -j "$jobs" 2>&1 | tee "$build_log"
# A kernel whose wgmmas ptxas serialized (C7515) compiles and passes every test, only slowly: fail.
bash tools/check_ptxas_log.sh "$build_log"
rm -f "$build_log"
ctest --preset "$preset" -j "$jobs"
# The Python tools (routing twin of the C++ one, result merging): standard library only.
python3 -m unittest discover -s tests/python
# The Python layer's parts that need a real torch (tests/python/test_*_torch.py: the MoE FFN's
# backward, the torch internals torch_ops relies on; on the CPU): PyPI's torch in an ignored venv
# (tools/torch_cpu_env.sh, ~1.6 GB the first time; CCFUSE_TORCH_TESTS=0 skips).
if [ "${CCFUSE_TORCH_TESTS:-1}" != 0 ]; then
  (
    source tools/torch_cpu_env.sh
    out=$("$CCFUSE_TORCH_PY" -m unittest -v tests/python/test_*_torch.py 2>&1) || {
      echo "$out" | tail -n 40; echo "test.sh: tests/python/test_*_torch.py failed" >&2; exit 1; }
    echo "$out" | tail -n 12
    if echo "$out" | grep -q "skipped 'needs torch"; then
      echo "test.sh: the torch tests skipped although tools/torch_cpu_env.sh installed torch" >&2; exit 1
    fi
  )
fi
# Say why GPU tests skipped (CTest lists them only as "Skipped").
gpu_tests=build/tests/ccfuse_gpu_tests
if [ "$preset" = default ] && [ -x "$gpu_tests" ]; then
  reasons=$("$gpu_tests" 2>&1 | grep -A1 ': Skipped$' | grep -v -e ': Skipped$' -e '^--$' | sort | uniq -c || true)
  [ -z "$reasons" ] || echo "GPU tests skipped here:$reasons"
fi
if [ "${1:-}" = "--tsan" ]; then
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j "$jobs"
  ctest --preset tsan -j "$jobs"
fi
