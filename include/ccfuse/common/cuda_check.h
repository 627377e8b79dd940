// ccfuse/common/cuda_check.h: checked CUDA, NCCL and cuBLAS calls (host side; they throw ccfuse::Error).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "ccfuse/common/error.h"

#define CCFUSE_CUDA_CHECK(expr)                                                                 \
  do {                                                                                          \
    cudaError_t err_ = (expr);                                                                  \
    if (err_ != cudaSuccess)                                                                    \
      ::ccfuse::detail::throw_check_failure(__FILE__, __LINE__, #expr,                          \
                                            ::ccfuse::detail::str_cat("CUDA error ", cudaGetErrorName(err_), \
                                                                      ": ", cudaGetErrorString(err_))); \
  } while (0)

#define CCFUSE_NCCL_CHECK(expr)                                                                 \
  do {                                                                                          \
    ncclResult_t res_ = (expr);                                                                 \
    if (res_ != ncclSuccess)                                                                    \
      ::ccfuse::detail::throw_check_failure(__FILE__, __LINE__, #expr,                          \
                                            ::ccfuse::detail::str_cat("NCCL error ", int(res_), ": ", \
                                                                      ncclGetErrorString(res_))); \
  } while (0)

// After a kernel launch: the launch itself (bad config) is an error, not a silent no-op.
#define CCFUSE_CUDA_CHECK_LAUNCH() CCFUSE_CUDA_CHECK(cudaGetLastError())
