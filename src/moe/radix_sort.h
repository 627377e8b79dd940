// src/moe/radix_sort.h: the stable key-value radix sorts of the GPU router and layout (internal).
// One translation unit (radix_sort.cu) instantiates CUB's DeviceRadixSort for the two key types,
// so router.cu and layout.cu do not compile it twice.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ccfuse::moe::detail {

// Stable ascending sort of (keys_in, values_in) by bits [0, end_bit) of the key; n items.
// temp == nullptr: returns the bytes of temp storage needed (no work). Otherwise sorts on stream.
size_t radix_sort_pairs(void* temp, size_t temp_bytes, const uint32_t* keys_in, uint32_t* keys_out,
                        const int32_t* values_in, int32_t* values_out, int64_t n, int end_bit, void* stream);
size_t radix_sort_pairs(void* temp, size_t temp_bytes, const uint64_t* keys_in, uint64_t* keys_out,
                        const int32_t* values_in, int32_t* values_out, int64_t n, int end_bit, void* stream);

// Bits needed to hold values 0..max_value (at least 1).
inline int bits_for(uint64_t max_value) {
  int b = 1;
  while (b < 64 && (max_value >> b) != 0) ++b;
  return b;
}

// Rounds a workspace offset up to 256 bytes.
inline size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

}  // namespace ccfuse::moe::detail
