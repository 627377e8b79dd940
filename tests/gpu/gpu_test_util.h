// Shared helpers of the GPU tests: skip cleanly (with the reason shown) where GPUs are missing.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "ccfuse/common/host_barrier.h"

#include <numeric>
#include <vector>

namespace ccfuse::testing {

inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

inline std::vector<int> all_devices() {
  std::vector<int> d(static_cast<size_t>(gpu_count()));
  std::iota(d.begin(), d.end(), 0);
  return d;
}

// Host-side meeting point for the rank threads of one test.
using ccfuse::HostBarrier;

}  // namespace ccfuse::testing

// Skips the test, with the reason in the output, unless at least `n` GPUs are present.
#define CCFUSE_REQUIRE_GPUS(n)                                                                  \
  do {                                                                                          \
    const int have_ = ::ccfuse::testing::gpu_count();                                           \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, found " << have_;             \
  } while (0)
