// The GPU MoE router + layout on one GPU: route_gpu (softmax top-k from fp32 logits, dropless or
// capacity by position) followed by make_layout_gpu (expert-sorted gather map), timed together
// with CUDA events (warm-up, then the median of --iters back-to-back calls), plus each half alone.
// The PyTorch equivalent is tools/torch_router_bench.py (same JSON fields, t_torch_ms).
// Usage: ccfuse_router_bench [--tokens 16384] [--experts 256] [--topk 8] [--iters 50] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/moe/layout_gpu.h"
#include "ccfuse/moe/router_gpu.h"

using namespace ccfuse;
using namespace ccfuse::moe;

namespace {

double median_ms(const std::function<void()>& fn, int iters, int warmup, cudaStream_t s) {
  cudaEvent_t a, b;
  CCFUSE_CUDA_CHECK(cudaEventCreate(&a));
  CCFUSE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    CCFUSE_CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    CCFUSE_CUDA_CHECK(cudaEventRecord(b, s));
    CCFUSE_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CCFUSE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 16384;
  int experts = 256, topk = 8, iters = 50, warmup = 10;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (a == "--experts") experts = std::atoi(argv[i + 1]);
    else if (a == "--topk") topk = std::atoi(argv[i + 1]);
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--json") json = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  try {
    cudaDeviceProp prop{};
    CCFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const char* commit = std::getenv("CCFUSE_COMMIT");
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));

    // Logits N(0, 2) as a gate GEMM would give them (seeded: the same every run).
    std::vector<float> h_logits(size_t(tokens * experts));
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& v : h_logits) v = normal(rng);
    const size_t entries = size_t(tokens * topk);
    float* logits = dev_alloc<float>(h_logits.size());
    CCFUSE_CUDA_CHECK(cudaMemcpy(logits, h_logits.data(), h_logits.size() * 4, cudaMemcpyHostToDevice));
    int32_t* ids = dev_alloc<int32_t>(entries);
    float* weights = dev_alloc<float>(entries);
    int32_t* tpe = dev_alloc<int32_t>(size_t(experts));
    int64_t* dropped = dev_alloc<int64_t>(1);
    int32_t* indices = dev_alloc<int32_t>(entries);
    int32_t* bin_ids = dev_alloc<int32_t>(entries);
    int32_t* bins = dev_alloc<int32_t>(size_t(experts));
    int32_t* layout_tpe = dev_alloc<int32_t>(size_t(experts));
    const size_t layout_ws_bytes = layout_workspace_bytes(tokens, topk, experts, 1);
    char* layout_ws = dev_alloc<char>(layout_ws_bytes);
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    std::FILE* out = json.empty() ? nullptr : std::fopen(json.c_str(), "a");
    std::printf("%-8s %-8s %-5s %-6s %12s %12s %12s %10s\n", "tokens", "experts", "topk", "cf", "route+layout",
                "route", "layout", "dropped");
    for (const double cf : {0.0, 1.25}) {
      RouterConfig c;
      c.num_experts = experts;
      c.topk = topk;
      c.score = ScoreFn::kSoftmax;
      c.normalize = true;
      c.capacity_factor = cf;
      c.drop = DropPolicy::kByPosition;
      const size_t ws_bytes = router_workspace_bytes(c, tokens);
      char* ws = dev_alloc<char>(ws_bytes);
      auto route = [&] { route_gpu(c, logits, tokens, nullptr, ids, weights, tpe, dropped, ws, s); };
      auto layout = [&] {
        make_layout_gpu(ids, tokens, topk, experts, nullptr, 0, 1, indices, bin_ids, bins, layout_tpe, layout_ws, s);
      };
      const double t_both = median_ms([&] { route(); layout(); }, iters, warmup, s);
      const double t_route = median_ms(route, iters, warmup, s);
      const double t_layout = median_ms(layout, iters, warmup, s);
      int64_t h_dropped = 0;
      CCFUSE_CUDA_CHECK(cudaMemcpy(&h_dropped, dropped, 8, cudaMemcpyDeviceToHost));
      std::printf("%-8lld %-8d %-5d %-6.2f %9.4f ms %9.4f ms %9.4f ms %10lld\n", (long long)tokens, experts, topk, cf,
                  t_both, t_route, t_layout, (long long)h_dropped);
      if (out != nullptr) {
        std::fprintf(out,
                     "{\"bench\": \"moe_router\", \"tokens\": %lld, \"experts\": %d, \"topk\": %d, "
                     "\"capacity_factor\": %g, \"drop_policy\": \"%s\", \"score\": \"softmax\", "
                     "\"t_ccfuse_ms\": %.6f, \"t_route_ms\": %.6f, \"t_layout_ms\": %.6f, \"dropped\": %lld, "
                     "\"iters\": %d, \"date\": \"%s\", \"gpu\": \"%s\", \"commit\": \"%s\"}\n",
                     (long long)tokens, experts, topk, cf, cf > 0 ? "position" : "none", t_both, t_route, t_layout,
                     (long long)h_dropped, iters, date, prop.name, commit ? commit : "unknown");
        std::fflush(out);
      }
      cudaFree(ws);
    }
    if (out != nullptr) std::fclose(out);
    cudaFree(logits);
    cudaFree(ids);
    cudaFree(weights);
    cudaFree(tpe);
    cudaFree(dropped);
    cudaFree(indices);
    cudaFree(bin_ids);
    cudaFree(bins);
    cudaFree(layout_tpe);
    cudaFree(layout_ws);
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ccfuse_router_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
