// src/moe/sorted_search.cuh: device helpers over sorted keys, shared by the router and layout kernels.
#pragma once

#include <cstdint>

namespace ccfuse::moe::detail {

// The first index in keys[0, n) whose key is >= value (keys sorted ascending).
template <typename Key>
__device__ __forceinline__ int64_t lower_bound(const Key* keys, int64_t n, Key value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (keys[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace ccfuse::moe::detail
