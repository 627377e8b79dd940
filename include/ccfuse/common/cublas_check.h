// ccfuse/common/cublas_check.h: checked cuBLAS / cuBLASLt calls (host side; they throw ccfuse::Error).
#pragma once

#include <cublas_v2.h>

#include "ccfuse/common/error.h"

// cuBLASLt returns the same cublasStatus_t, so one macro serves both.
#define CCFUSE_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                            \
    cublasStatus_t st_ = (expr);                                                                  \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      ::ccfuse::detail::throw_check_failure(                                                      \
          __FILE__, __LINE__, #expr,                                                              \
          ::ccfuse::detail::str_cat("cuBLAS error ", int(st_), ": ", cublasGetStatusString(st_))); \
  } while (0)
