// src/moe/radix_sort.cu: CUB's stable LSD radix sort for the MoE router and layout (see radix_sort.h).
#include <cub/device/device_radix_sort.cuh>

#include "ccfuse/common/cuda_check.h"
#include "src/moe/radix_sort.h"

namespace ccfuse::moe::detail {

namespace {

template <typename Key>
size_t sort_impl(void* temp, size_t temp_bytes, const Key* keys_in, Key* keys_out, const int32_t* values_in,
                 int32_t* values_out, int64_t n, int end_bit, void* stream) {
  CCFUSE_CHECK(n >= 0 && n <= INT32_MAX, "sort of ", n, " items");
  CCFUSE_CHECK(end_bit >= 1 && end_bit <= int(sizeof(Key) * 8), "end_bit ", end_bit);
  size_t bytes = temp_bytes;
  // NOTE: CUB's radix sort is stable (LSD passes): equal keys keep their input order, which is
  // what makes the GPU layouts and capacity drops deterministic and equal to the CPU's.
  CCFUSE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, values_in, values_out, int(n), 0,
                                                    end_bit, static_cast<cudaStream_t>(stream)));
  return bytes;
}

}  // namespace

size_t radix_sort_pairs(void* temp, size_t temp_bytes, const uint32_t* keys_in, uint32_t* keys_out,
                        const int32_t* values_in, int32_t* values_out, int64_t n, int end_bit, void* stream) {
  return sort_impl(temp, temp_bytes, keys_in, keys_out, values_in, values_out, n, end_bit, stream);
}

size_t radix_sort_pairs(void* temp, size_t temp_bytes, const uint64_t* keys_in, uint64_t* keys_out,
                        const int32_t* values_in, int32_t* values_out, int64_t n, int end_bit, void* stream) {
  return sort_impl(temp, temp_bytes, keys_in, keys_out, values_in, values_out, n, end_bit, stream);
}

}  // namespace ccfuse::moe::detail
