// ccfuse/common/pace.cuh: pacing of a send loop on the device (ag_gemm's push of A, the MoE
// layer 0 dispatch). Item i of n is not sent before start + i / n of the spread: a burst of
// NVLink stores from every SM slows the GEMM beside it far more than the same bytes spread out
// (docs/tp-fusion.md, "v3.5").
#pragma once

#include <cstdint>

#include "ccfuse/gemm/sm90_gemm.cuh"

namespace ccfuse {

// Start of a paced loop: the global timer, or 0 when there is nothing to pace.
__device__ __forceinline__ uint64_t pace_start(uint64_t spread_ns) {
  return spread_ns > 0 ? gemm::sm90::globaltimer_ns() : 0;
}

// Waits until start + spread_ns * i / n (no wait without a spread or with n <= 0).
__device__ __forceinline__ void pace_until(uint64_t start, uint64_t spread_ns, int64_t i, int64_t n) {
  if (spread_ns == 0 || n <= 0) return;
  const uint64_t due = start + spread_ns * uint64_t(i) / uint64_t(n);
  while (gemm::sm90::globaltimer_ns() < due) __nanosleep(500);
}

}  // namespace ccfuse
