# Sourced on the GPU machine: multicast off; the NCCL (2.28.9, PyTorch's wheel) and cuBLAS the
# binaries were built against first on the library path; the commit of the staged binaries.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
_ccfuse_pylib() { python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH="$(_ccfuse_pylib nvidia.nccl):$(_ccfuse_pylib nvidia.cublas):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export CCFUSE_COMMIT=$(tr -d '\n' < .carry/commit 2>/dev/null || echo unknown)
