// The source side of the MoE dispatch on one GPU (ccfuse/moe/dispatch_gpu.h) against its host
// twins (dispatch_counts, dispatch_positions): W sources are simulated one after the other on the
// same device (no communication involved). Fresh random routing per run (seed printed).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"
#include "ccfuse/moe/dispatch_gpu.h"
#include "ccfuse/moe/dispatch_plan.h"
#include "gpu_test_util.h"

namespace ccfuse::moe {
namespace {

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)));
  if (!v.empty()) CCFUSE_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) CCFUSE_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

TEST(MoeDispatchGpu, CountsAndPositionsEqualTheHostPlan) {
  CCFUSE_REQUIRE_GPUS(1);
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed));
  std::mt19937_64 rng(seed);
  cudaStream_t s;
  CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int cases = 0;
  for (int w : {1, 2, 4, 8}) {
    for (int experts : {8, 64, 256}) {
      if (experts % w != 0) continue;
      for (int topk : {1, 2, 8}) {
        for (bool skew : {false, true}) {
          SCOPED_TRACE(detail::str_cat("W=", w, " E=", experts, " k=", topk, " skew=", skew));
          std::vector<std::vector<int32_t>> ids(static_cast<size_t>(w));
          std::vector<int64_t> tokens(static_cast<size_t>(w));
          std::vector<int32_t> counts(size_t(w * experts));
          std::uniform_int_distribution<int64_t> tok(0, 3000);
          std::vector<double> p(static_cast<size_t>(experts));
          for (int e = 0; e < experts; ++e) p[size_t(e)] = skew ? 1.0 / double((e + 1) * (e + 1)) : 1.0;
          std::bernoulli_distribution drop(0.05);
          for (int src = 0; src < w; ++src) {
            tokens[size_t(src)] = src == w - 1 && w > 1 ? 0 : tok(rng);  // one source without tokens
            auto& v = ids[size_t(src)];
            for (int64_t t = 0; t < tokens[size_t(src)]; ++t) {
              std::vector<double> left = p;
              for (int j = 0; j < topk; ++j) {
                std::discrete_distribution<int> pick(left.begin(), left.end());
                const int e = pick(rng);
                left[size_t(e)] = 0;
                v.push_back(drop(rng) ? -1 : e);
              }
            }
            dispatch_counts(v.data(), tokens[size_t(src)], topk, experts, counts.data() + size_t(src) * experts);
          }
          // Counts on the GPU, row by row, into one device matrix.
          int32_t* d_counts = nullptr;
          CCFUSE_CUDA_CHECK(cudaMalloc(&d_counts, counts.size() * sizeof(int32_t)));
          CCFUSE_CUDA_CHECK(cudaMemset(d_counts, 0x5a, counts.size() * sizeof(int32_t)));  // poison
          CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<int32_t*> d_ids;
          std::vector<void*> ws;
          for (int src = 0; src < w; ++src) {
            d_ids.push_back(device_copy(ids[size_t(src)]));
            void* work = nullptr;
            CCFUSE_CUDA_CHECK(cudaMalloc(&work, std::max<size_t>(dispatch_workspace_bytes(tokens[size_t(src)], topk, experts), 256)));
            ws.push_back(work);
            dispatch_counts_gpu(d_ids.back(), tokens[size_t(src)], topk, experts, d_counts + size_t(src) * experts, work, s);
          }
          CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
          ASSERT_EQ(host_copy(d_counts, counts.size()), counts) << "counts matrix";
          const DispatchPlan plan{counts.data(), w, experts};
          for (int src = 0; src < w; ++src) {
            const size_t n = ids[size_t(src)].size();
            std::vector<int64_t> want(n);
            dispatch_positions(plan, src, ids[size_t(src)].data(), tokens[size_t(src)], topk, want.data());
            int64_t* d_pos = nullptr;
            CCFUSE_CUDA_CHECK(cudaMalloc(&d_pos, std::max<size_t>(n, 1) * sizeof(int64_t)));
            CCFUSE_CUDA_CHECK(cudaMemset(d_pos, 0x5a, std::max<size_t>(n, 1) * sizeof(int64_t)));
            CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
            dispatch_positions_gpu(d_counts, w, experts, src, d_ids[size_t(src)], tokens[size_t(src)], topk, d_pos,
                                   ws[size_t(src)], s);
            CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
            EXPECT_EQ(host_copy(d_pos, n), want) << "positions of source " << src;
            cudaFree(d_pos);
          }
          for (auto* p_ids : d_ids) cudaFree(p_ids);
          for (void* p_ws : ws) cudaFree(p_ws);
          cudaFree(d_counts);
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 30);
  cudaStreamDestroy(s);
}

TEST(MoeDispatchGpu, BadInputNamesTheRule) {
  CCFUSE_REQUIRE_GPUS(1);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  int32_t dummy = 0;
  int64_t pos = 0;
  EXPECT_EQ(message([&] { dispatch_positions_gpu(&dummy, 3, 8, 0, &dummy, 1, 1, &pos, &dummy, nullptr); }),
            "num_experts 8 is not divisible by world_size 3");
  EXPECT_EQ(message([&] { dispatch_positions_gpu(&dummy, 2, 8, 2, &dummy, 1, 1, &pos, &dummy, nullptr); }),
            "src 2 is out of range [0, 2)");
  EXPECT_EQ(message([&] { dispatch_positions_gpu(nullptr, 2, 8, 0, &dummy, 1, 1, &pos, &dummy, nullptr); }),
            "counts must not be null");
  EXPECT_EQ(message([&] { dispatch_counts_gpu(&dummy, 1, 0, 8, &dummy, &dummy, nullptr); }), "topk 0 must be at least 1");
}

}  // namespace
}  // namespace ccfuse::moe
