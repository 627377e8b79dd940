// ccfuse/common/ranges.h: byte ranges, for the ops' checks that an output does not alias an input.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ccfuse {

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (empty ranges share none).
inline bool bytes_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace ccfuse
