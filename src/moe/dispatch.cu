// src/moe/dispatch.cu: source-side dispatch positions on the GPU (ccfuse/moe/dispatch_gpu.h).
//
// The source's own entries, stably sorted by expert (make_layout_gpu with one rank), give each
// entry its rank among the source's entries of the same expert: sorted row r of expert e has rank
// r - (first sorted row of e). Adding the (source, expert) block's first row on the owner
// (DispatchPlan::block_begin, one thread per expert) gives the final row.
#include <cuda_runtime.h>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"
#include "ccfuse/moe/dispatch_gpu.h"
#include "ccfuse/moe/dispatch_plan.h"
#include "ccfuse/moe/layout_gpu.h"
#include "src/moe/radix_sort.h"

namespace ccfuse::moe {

namespace {

struct Plan {
  size_t indices = 0, bin_ids = 0, bins = 0, tpe = 0, block = 0, layout_ws = 0, total = 0;
};

Plan make_plan(int64_t num_tokens, int topk, int num_experts) {
  Plan p;
  const size_t n = size_t(num_tokens * topk);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = detail::align256(off + bytes);
    return at;
  };
  p.indices = take(n * 4);
  p.bin_ids = take(n * 4);
  p.bins = take(size_t(num_experts) * 4);
  p.tpe = take(size_t(num_experts) * 4);
  p.block = take(size_t(num_experts) * 8);
  p.layout_ws = take(layout_workspace_bytes(num_tokens, topk, num_experts, 1));
  p.total = off;
  return p;
}

void check(int64_t num_tokens, int topk, int num_experts) {
  CCFUSE_ARG_CHECK(topk >= 1, "topk ", topk, " must be at least 1");
  CCFUSE_ARG_CHECK(num_experts >= 1, "num_experts ", num_experts, " must be at least 1");
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
}

__global__ void block_offsets(DispatchPlan plan, int src, int64_t* block) {
  const int e = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < plan.num_experts) block[e] = plan.block_begin(src, e);
}

__global__ void fill_positions(const int32_t* __restrict__ indices, const int32_t* __restrict__ bin_ids,
                               const int32_t* __restrict__ bins, const int64_t* __restrict__ block, int64_t n,
                               int64_t* __restrict__ positions) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const int e = bin_ids[r];
  if (e < 0) return;  // rows past the row count (dropped entries keep -1)
  const int64_t first = e == 0 ? 0 : bins[e - 1];
  positions[indices[r]] = block[e] + (r - first);
}

}  // namespace

size_t dispatch_workspace_bytes(int64_t num_tokens, int topk, int num_experts) {
  check(num_tokens, topk, num_experts);
  return make_plan(num_tokens, topk, num_experts).total;
}

void dispatch_counts_gpu(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts, int32_t* counts_row,
                         void* workspace, void* stream) {
  check(num_tokens, topk, num_experts);
  CCFUSE_ARG_CHECK(counts_row != nullptr, "counts_row must not be null");
  const Plan p = make_plan(num_tokens, topk, num_experts);
  char* ws = static_cast<char*>(workspace);
  CCFUSE_ARG_CHECK(num_tokens == 0 || ws != nullptr, "workspace must not be null (dispatch_workspace_bytes = ",
                   p.total, ")");
  // The layout's tokens_per_expert is the counts row (dropped entries excluded).
  make_layout_gpu(topk_ids, num_tokens, topk, num_experts, nullptr, 0, 1, reinterpret_cast<int32_t*>(ws + p.indices),
                  reinterpret_cast<int32_t*>(ws + p.bin_ids), reinterpret_cast<int32_t*>(ws + p.bins), counts_row,
                  ws == nullptr ? nullptr : ws + p.layout_ws, stream);
}

void dispatch_positions_gpu(const int32_t* counts, int world_size, int num_experts, int src, const int32_t* topk_ids,
                            int64_t num_tokens, int topk, int64_t* positions, void* workspace, void* stream) {
  check(num_tokens, topk, num_experts);
  CCFUSE_ARG_CHECK(world_size >= 1, "world_size ", world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(num_experts % world_size == 0, "num_experts ", num_experts, " is not divisible by world_size ",
                   world_size);
  CCFUSE_ARG_CHECK(src >= 0 && src < world_size, "src ", src, " is out of range [0, ", world_size, ")");
  CCFUSE_ARG_CHECK(counts != nullptr, "counts must not be null");
  const int64_t n = num_tokens * topk;
  if (n == 0) return;
  CCFUSE_ARG_CHECK(positions != nullptr && topk_ids != nullptr, "topk_ids and positions must not be null");
  const Plan p = make_plan(num_tokens, topk, num_experts);
  char* ws = static_cast<char*>(workspace);
  CCFUSE_ARG_CHECK(ws != nullptr, "workspace must not be null (dispatch_workspace_bytes = ", p.total, ")");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto* indices = reinterpret_cast<int32_t*>(ws + p.indices);
  auto* bin_ids = reinterpret_cast<int32_t*>(ws + p.bin_ids);
  auto* bins = reinterpret_cast<int32_t*>(ws + p.bins);
  auto* block = reinterpret_cast<int64_t*>(ws + p.block);
  make_layout_gpu(topk_ids, num_tokens, topk, num_experts, nullptr, 0, 1, indices, bin_ids, bins,
                  reinterpret_cast<int32_t*>(ws + p.tpe), ws + p.layout_ws, stream);
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(positions, 0xff, size_t(n) * sizeof(int64_t), s));  // -1: dropped
  block_offsets<<<unsigned((num_experts + 255) / 256), 256, 0, s>>>(DispatchPlan{counts, world_size, num_experts}, src,
                                                                     block);
  CCFUSE_CUDA_CHECK_LAUNCH();
  fill_positions<<<unsigned((n + 255) / 256), 256, 0, s>>>(indices, bin_ids, bins, block, n, positions);
  CCFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace ccfuse::moe
