// Shared helpers of the GPU tests: skip cleanly (with the reason shown) where GPUs are missing.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "ccfuse/common/host_barrier.h"

#include <cstdlib>
#include <numeric>
#include <string>
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

// CCFUSE_TEST_ONE_GPU_RANKS=W (W >= 2): the multi-rank tests run W ranks on GPU 0 (comm/team.h
// mode d: a green context each, 1/W of the SMs) instead of one rank per GPU. Correctness only:
// the ranks talk through one GPU's memory, not NVLink. Inside a rank, sync the legacy stream
// (cudaStreamSynchronize(cudaStreamLegacy)), not the device: a device-wide sync would also wait
// for the other ranks' kernels, which may wait for this rank's next call.
inline int one_gpu_ranks() {
  const char* env = std::getenv("CCFUSE_TEST_ONE_GPU_RANKS");
  if (env == nullptr || *env == '\0') return 0;
  const int w = std::atoi(env);
  return w >= 2 && gpu_count() >= 1 ? w : 0;
}

// Ranks a multi-rank test may use: the GPUs, or the one-GPU world's W.
inline int rank_count() {
  const int w = one_gpu_ranks();
  return w > 0 ? w : gpu_count();
}

// The devices of a world of `n` ranks for comm::run_local_world: 0..n-1, or GPU 0 n times.
inline std::vector<int> rank_devices(int n) {
  std::vector<int> d(static_cast<size_t>(n), 0);
  if (one_gpu_ranks() == 0 || n == 1) std::iota(d.begin(), d.end(), 0);
  return d;
}

inline std::vector<int> all_devices() { return rank_devices(rank_count()); }

// Host-side meeting point for the rank threads of one test.
using ccfuse::HostBarrier;

}  // namespace ccfuse::testing

// Skips the test, with the reason in the output, unless at least `n` GPUs are present.
#define CCFUSE_REQUIRE_GPUS(n)                                                                  \
  do {                                                                                          \
    const int have_ = ::ccfuse::testing::gpu_count();                                           \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, found " << have_;             \
  } while (0)

// Skips unless a world of `n` ranks can run: n GPUs, or CCFUSE_TEST_ONE_GPU_RANKS >= n.
#define CCFUSE_REQUIRE_RANKS(n)                                                                 \
  do {                                                                                          \
    const int have_ = ::ccfuse::testing::rank_count();                                          \
    if (have_ < (n))                                                                            \
      GTEST_SKIP() << "needs " << (n) << " ranks (GPUs, or CCFUSE_TEST_ONE_GPU_RANKS), found " << have_; \
  } while (0)
