// src/common/driver_api.h: CUDA driver functions reached through the runtime's entry-point table,
// so that the library does not link libcuda (the runtime is static; the driver is the system's).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"

namespace ccfuse::detail {

// The driver function `name` with the ABI of the CUDA headers ccfuse was built with, or nullptr
// where the installed driver lacks it and `required` is false.
inline void* driver_entry(const char* name, bool required) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &f, CUDA_VERSION, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || f == nullptr) {
    cudaGetLastError();
    if (required)
      throw Error(str_cat("CUDA driver function ", name, " not found (built against CUDA ", CUDA_VERSION / 1000, ".",
                          (CUDA_VERSION % 1000) / 10, "; the installed driver is older)"));
    return nullptr;
  }
  return f;
}

// Throws Error naming the driver call and its CUresult unless it succeeded.
inline void driver_check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw Error(str_cat(what, " failed (CUresult ", int(r), ")"));
}

}  // namespace ccfuse::detail

// A typed pointer to driver function `fn`, resolved once per call site (static). `fn` is the
// name cuda.h declares; a versioned alias (#define fn fn_v2) gives the type, the plain name the lookup.
#define CCFUSE_DRIVER_FN(fn, required) \
  reinterpret_cast<decltype(&fn)>(::ccfuse::detail::driver_entry(#fn, required))
