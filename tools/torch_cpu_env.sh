#!/usr/bin/env bash
# A PyTorch for the CPU tests of the Python layer's math (tests/python/test_moe_grad_torch.py):
# PyPI's torch wheel (built for CUDA 13.0; the CPU half works without a GPU) in the ignored venv
# .venv-torch, without its CUDA dependencies except the three libraries it cannot load without
# and that this machine's CUDA toolkit lacks (cuFile, cuSPARSELt, NVSHMEM). ~1.6 GB, ~1 min.
# Usage: source tools/torch_cpu_env.sh  ->  $CCFUSE_TORCH_PY runs a python that imports torch.
_venv=${CCFUSE_TORCH_VENV:-$PWD/.venv-torch}
[ -x "$_venv/bin/python" ] || python3 -m venv "$_venv"
_site=$("$_venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH="$_site/nvidia/cusparselt/lib:$_site/nvidia/cu13/lib:$_site/nvidia/nvshmem/lib:${LD_LIBRARY_PATH:-}"
if ! "$_venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  "$_venv/bin/pip" install -q --no-deps torch==2.11.0 nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.0 \
    nvidia-nvshmem-cu13==3.4.5
  "$_venv/bin/pip" install -q typing_extensions sympy filelock networkx jinja2 fsspec numpy
fi
export CCFUSE_TORCH_PY="$_venv/bin/python"
unset _venv _site
