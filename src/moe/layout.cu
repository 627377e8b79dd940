// src/moe/layout.cu: expert-sorted token layouts on the GPU (ccfuse/moe/layout_gpu.h).
//
// The CPU make_layout is a stable counting sort by the bucket (expert, rotated source rank). Here
// the same stable order comes from CUB's radix sort (stable) of the bucket keys with the entry
// index as value, entries fed in entry order:
//   layout_keys      entry i = token * k + slot: key = expert * W + (src - local + W) % W, value
//                    i; dropped (and invalid) entries get the sentinel key E * W, sorting last.
//   radix sort       by the low ceil(log2(E * W + 1)) bits; values land directly in `indices`.
//   layout_finish    per sorted row: bin_ids = key / W, sentinel rows -> -1; per expert: bins and
//                    tokens_per_expert by binary search of the sorted keys (no atomics, no scan).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"
#include "ccfuse/moe/layout_gpu.h"
#include "src/moe/radix_sort.h"
#include "src/moe/sorted_search.cuh"

namespace ccfuse::moe {

namespace {

__global__ void layout_keys(const int32_t* __restrict__ topk_ids, int64_t n, int topk, int num_experts,
                            const int32_t* __restrict__ token_src_rank, int local_rank, int world_size,
                            uint32_t* __restrict__ keys, int32_t* __restrict__ values,
                            unsigned long long* __restrict__ bad) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t sentinel = uint32_t(num_experts) * uint32_t(world_size);
  const int32_t id = topk_ids[i];
  const int src = token_src_rank != nullptr ? token_src_rank[i / topk] : local_rank;
  const bool valid = id >= -1 && id < num_experts && src >= 0 && src < world_size;
  // The lowest invalid entry: bad holds max(n - i) over invalid i (0 = none), so a zero memset
  // initialises it.
  if (!valid) atomicMax(bad, (unsigned long long)(n - i));
  uint32_t key = sentinel;
  if (valid && id >= 0) key = uint32_t(id) * uint32_t(world_size) + uint32_t((src - local_rank + world_size) % world_size);
  keys[i] = key;
  values[i] = int32_t(i);
}


// Threads [0, n): sorted rows; threads [0, E): experts; thread 0 also reports bad_entry.
__global__ void layout_finish(const uint32_t* __restrict__ sorted_keys, int64_t n, int num_experts, int world_size,
                              int32_t* __restrict__ indices, int32_t* __restrict__ bin_ids, int32_t* __restrict__ bins,
                              int32_t* __restrict__ tokens_per_expert, const unsigned long long* __restrict__ bad,
                              int32_t* __restrict__ bad_entry) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint32_t sentinel = uint32_t(num_experts) * uint32_t(world_size);
  if (x < n) {
    const uint32_t key = sorted_keys[x];
    if (key >= sentinel) {
      indices[x] = -1;
      bin_ids[x] = -1;
    } else {
      bin_ids[x] = int32_t(key / uint32_t(world_size));
    }
  }
  if (x < num_experts) {
    const int e = int(x);
    const int64_t begin = detail::lower_bound<uint32_t>(sorted_keys, n, uint32_t(e) * uint32_t(world_size));
    const int64_t end = detail::lower_bound<uint32_t>(sorted_keys, n, uint32_t(e + 1) * uint32_t(world_size));
    bins[e] = int32_t(end);
    tokens_per_expert[e] = int32_t(end - begin);
  }
  if (x == 0 && bad_entry != nullptr) *bad_entry = *bad == 0 ? -1 : int32_t(int64_t(n) - int64_t(*bad));
}

struct Plan {
  int64_t n = 0;
  int end_bit = 0;
  size_t keys_in = 0, keys_out = 0, values_in = 0, bad = 0, temp = 0, temp_bytes = 0, total = 0;
};

void check_args(int64_t num_tokens, int topk, int num_experts, int local_rank, int world_size) {
  CCFUSE_ARG_CHECK(topk >= 1, "topk ", topk, " must be at least 1");
  CCFUSE_ARG_CHECK(num_experts >= 1, "num_experts ", num_experts, " must be at least 1");
  CCFUSE_ARG_CHECK(world_size >= 1, "world_size ", world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(local_rank >= 0 && local_rank < world_size, "local_rank ", local_rank, " is out of range [0, ",
                   world_size, ")");
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
  CCFUSE_ARG_CHECK(num_tokens <= INT32_MAX / topk, "num_tokens * topk = ", num_tokens, " * ", topk,
                   " exceeds INT32_MAX");
  // The bucket keys (and their sentinel E * W) are 32-bit.
  CCFUSE_ARG_CHECK(int64_t(num_experts) * world_size < int64_t(UINT32_MAX), "num_experts * world_size = ",
                   num_experts, " * ", world_size, " exceeds the GPU layout's 32-bit keys");
}

Plan make_plan(int64_t num_tokens, int topk, int num_experts, int world_size) {
  Plan p;
  p.n = num_tokens * topk;
  if (p.n == 0) return p;
  p.end_bit = detail::bits_for(uint64_t(num_experts) * uint64_t(world_size));  // keys 0..E*W (sentinel)
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = detail::align256(off + bytes);
    return at;
  };
  p.keys_in = take(size_t(p.n) * 4);
  p.keys_out = take(size_t(p.n) * 4);
  p.values_in = take(size_t(p.n) * 4);
  p.bad = take(8);
  p.temp_bytes = detail::radix_sort_pairs(nullptr, 0, static_cast<const uint32_t*>(nullptr), nullptr, nullptr, nullptr,
                                          p.n, p.end_bit, nullptr);
  p.temp = take(p.temp_bytes);
  p.total = off;
  return p;
}

}  // namespace

size_t layout_workspace_bytes(int64_t num_tokens, int topk, int num_experts, int world_size) {
  check_args(num_tokens, topk, num_experts, 0, world_size);
  return make_plan(num_tokens, topk, num_experts, world_size).total;
}

void make_layout_gpu(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts,
                     const int32_t* token_src_rank, int local_rank, int world_size, int32_t* indices,
                     int32_t* bin_ids, int32_t* bins, int32_t* tokens_per_expert, void* workspace, void* stream,
                     int32_t* bad_entry) {
  check_args(num_tokens, topk, num_experts, local_rank, world_size);
  CCFUSE_ARG_CHECK(bins != nullptr, "bins must not be null");
  CCFUSE_ARG_CHECK(tokens_per_expert != nullptr, "tokens_per_expert must not be null");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Plan p = make_plan(num_tokens, topk, num_experts, world_size);
  if (p.n == 0) {
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(bins, 0, size_t(num_experts) * sizeof(int32_t), s));
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(tokens_per_expert, 0, size_t(num_experts) * sizeof(int32_t), s));
    if (bad_entry != nullptr) CCFUSE_CUDA_CHECK(cudaMemsetAsync(bad_entry, 0xff, sizeof(int32_t), s));
    return;
  }
  CCFUSE_ARG_CHECK(topk_ids != nullptr, "topk_ids must not be null");
  CCFUSE_ARG_CHECK(indices != nullptr, "indices must not be null");
  CCFUSE_ARG_CHECK(bin_ids != nullptr, "bin_ids must not be null");
  CCFUSE_ARG_CHECK(workspace != nullptr, "workspace must not be null (layout_workspace_bytes = ", p.total, ")");
  CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace must be 256-byte aligned");

  char* ws = static_cast<char*>(workspace);
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(ws + p.keys_in);
  uint32_t* keys_out = reinterpret_cast<uint32_t*>(ws + p.keys_out);
  int32_t* values_in = reinterpret_cast<int32_t*>(ws + p.values_in);
  unsigned long long* bad = reinterpret_cast<unsigned long long*>(ws + p.bad);
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
  layout_keys<<<unsigned((p.n + 255) / 256), 256, 0, s>>>(topk_ids, p.n, topk, num_experts, token_src_rank, local_rank,
                                                          world_size, keys_in, values_in, bad);
  CCFUSE_CUDA_CHECK_LAUNCH();
  detail::radix_sort_pairs(ws + p.temp, p.temp_bytes, keys_in, keys_out, values_in, indices, p.n, p.end_bit, stream);
  const int64_t threads = std::max<int64_t>(p.n, num_experts);
  layout_finish<<<unsigned((threads + 255) / 256), 256, 0, s>>>(keys_out, p.n, num_experts, world_size, indices,
                                                                bin_ids, bins, tokens_per_expert, bad, bad_entry);
  CCFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace ccfuse::moe
