// The Hopper GEMM engine against an fp64 reference on the GPU: tile shapes, both B layouts,
// bf16/fp16, edge shapes, SM budgets, tile orders, the ready predicate, and bad input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ccfuse/comm/team.h"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/gemm/ready_schedule.cuh"
#include "gemm_reference.cuh"
#include "gpu_test_util.h"

namespace ccfuse::gemm {
namespace {

using ccfuse::testing::reference_gemm;

struct Case {
  int64_t m, n, k;
  DType dtype;
  BLayout layout;
  int block_n;      // 256 or 128 (192, 96, 160, 224, 64: TMA-store only); 0 = choose_config
  int num_sms;      // 0 = all
  bool col_major;
  int cluster = 0;  // 1 or 2; 0 = choose_config's
  bool tma_store = false;  // the TMA-store epilogue (128x256x64/3, or 128x128x64/5 with block_n 128)
  int split_k = 0;         // > 0: forced split-K parts; 0 = choose_config's
  bool stream_k = false;   // forced stream-K (choose_config's pick when block_n is 0)
  bool pingpong = false;   // ping-pong consumers (GemmConfig::pingpong; with tma_store and block_n 128)
  bool pair_n = false;     // CTA pairs along N sharing A (GemmConfig::cluster_n = 2; tma_store, block_n 128 or 96)
  int stages = 0;          // > 0: forced stages (6 with pingpong: the sub-tile staging ring)
};

std::string name_of(const Case& c) {
  return detail::str_cat(c.m, "x", c.n, "x", c.k, "_", dtype_name(c.dtype), "_", b_layout_name(c.layout), "_bn",
                         c.block_n, "_sms", c.num_sms, c.col_major ? "_col" : "_row", "_cl", c.cluster,
                         c.tma_store ? "_tma" : "", c.split_k ? detail::str_cat("_split", c.split_k) : "",
                         c.stream_k ? "_streamk" : "", c.pingpong ? "_pingpong" : "", c.pair_n ? "_pairn" : "",
                         c.stages ? detail::str_cat("_st", c.stages) : "");
}

// Device buffers of one random problem; C poisoned with NaN.
struct Problem {
  GemmDesc desc;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  double* ref = nullptr;
  explicit Problem(const GemmDesc& d, uint64_t seed) : desc(d) {
    const size_t es = size_t(dtype_size(d.dtype));
    const size_t na = size_t(d.m * d.k), nb = size_t(d.k * d.n), nc = size_t(d.m * d.n);
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<uint16_t> ha(na), hb(nb);
    auto bits = [&](float v) -> uint16_t {
      if (d.dtype == DType::kBFloat16) return bf16::from_float(v).bits;
      const __half h = __float2half_rn(v);
      return *reinterpret_cast<const uint16_t*>(&h);
    };
    for (auto& x : ha) x = bits(dist(gen));
    for (auto& x : hb) x = bits(dist(gen));
    CCFUSE_CUDA_CHECK(cudaMalloc(&a, na * es));
    CCFUSE_CUDA_CHECK(cudaMalloc(&b, nb * es));
    CCFUSE_CUDA_CHECK(cudaMalloc(&c, nc * es));
    CCFUSE_CUDA_CHECK(cudaMalloc(&ref, nc * sizeof(double)));
    CCFUSE_CUDA_CHECK(cudaMemcpy(a, ha.data(), na * es, cudaMemcpyHostToDevice));
    CCFUSE_CUDA_CHECK(cudaMemcpy(b, hb.data(), nb * es, cudaMemcpyHostToDevice));
    CCFUSE_CUDA_CHECK(cudaMemset(c, 0xff, nc * es));  // NaN in bf16 and fp16
    const dim3 block(16, 16), grid(unsigned((d.n + 15) / 16), unsigned((d.m + 15) / 16));
    const bool nk = d.layout_is_nk();
    if (d.dtype == DType::kBFloat16)
      reference_gemm<<<grid, block>>>(static_cast<const __nv_bfloat16*>(a), d.k, static_cast<const __nv_bfloat16*>(b),
                                      nk ? d.k : d.n, nk, ref, d.m, d.n, d.k);
    else
      reference_gemm<<<grid, block>>>(static_cast<const __half*>(a), d.k, static_cast<const __half*>(b), nk ? d.k : d.n,
                                      nk, ref, d.m, d.n, d.k);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  ~Problem() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(ref);
  }
  // ‖C − ref‖ / ‖ref‖ over every element (NaN anywhere: infinity).
  double rel_err() const {
    const size_t nc = size_t(desc.m * desc.n);
    std::vector<uint16_t> hc(nc);
    std::vector<double> hr(nc);
    CCFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), c, nc * 2, cudaMemcpyDeviceToHost));
    CCFUSE_CUDA_CHECK(cudaMemcpy(hr.data(), ref, nc * sizeof(double), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < nc; ++i) {
      double v;
      if (desc.dtype == DType::kBFloat16) {
        v = bf16{hc[i]}.to_float();
      } else {
        __half h;
        *reinterpret_cast<uint16_t*>(&h) = hc[i];
        v = __half2float(h);
      }
      if (!std::isfinite(v)) return INFINITY;
      num += (v - hr[i]) * (v - hr[i]);
      den += hr[i] * hr[i];
    }
    return std::sqrt(num / den);
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

class GemmCorrectness : public ::testing::TestWithParam<Case> {};

TEST_P(GemmCorrectness, MatchesFp64Reference) {
  CCFUSE_REQUIRE_GPUS(1);
  const Case c = GetParam();
  const GemmDesc d = make_desc(c.m, c.n, c.k, c.dtype, c.layout);
  GemmConfig cfg = choose_config(d, c.num_sms);
  if (c.block_n == 128) cfg = GemmConfig{128, 128, 64, 6, cfg.num_sms};
  if (c.block_n == 256) cfg = GemmConfig{128, 256, 64, 4, cfg.num_sms};
  cfg.order = c.col_major ? TileOrder::kColumnMajor : TileOrder::kRowMajor;
  if (c.cluster) {
    cfg.cluster_m = c.cluster;
    cfg.split_k = 1;
    cfg.stream_k = false;
  }
  const bool cut = c.split_k > 0 || c.stream_k;
  if (cut) {
    cfg.split_k = c.split_k > 0 ? c.split_k : 1;
    cfg.stream_k = c.stream_k;
    cfg.cluster_m = 1;
    cfg.tma_store = false;
    // The register epilogue's tiles: 128x256/4 and 128x128/6 (choose_config's pick may be a
    // TMA-store-only width, e.g. 64 on one-wave shapes since 2026-12-01).
    cfg.block_n = cfg.block_n == 256 ? 256 : 128;
    cfg.stages = cfg.block_n == 256 ? 4 : 6;
  }
  if (c.tma_store) {
    if (!cut) {
      cfg.split_k = 1;
      cfg.stream_k = false;
    }
    // 128: the narrow TMA-store tile (5 stages); 192: the 192-column one (4 stages); 96, 160,
    // 224, 80 and 48: B [N, K] only (7, 5, 3, 7 and 9 stages); 64: 8 stages, both layouts
    const int n = c.block_n;
    cfg.block_n = n == 128 || n == 192 || n == 96 || n == 160 || n == 224 || n == 64 || n == 80 || n == 48 ? n : 256;
    cfg.stages = n == 128 || n == 160 ? 5 : n == 192 ? 4 : n == 96 || n == 80 ? 7 : n == 64 ? 8 : n == 48 ? 9 : 3;
    cfg.tma_store = true;
  }
  // Ping-pong when the case asks for it, or when choose_config picked it for a case left to it.
  const bool chosen = c.block_n == 0 && !c.tma_store && !cut && c.cluster == 0;
  cfg.pingpong = c.pingpong || (chosen && cfg.pingpong);
  if (c.stages > 0) cfg.stages = c.stages;
  if (c.pair_n) {
    cfg.cluster_m = 1;
    cfg.cluster_n = 2;
  }
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " config ", to_string(cfg)));
  Problem prob(d, seed);
  run(d, cfg, prob.a, prob.b, prob.c, nullptr);
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  const double err = prob.rel_err();
  EXPECT_LE(err, 1e-2);
  EXPECT_GT(err, 0.0) << "bit-exact against fp64 is suspicious for 16-bit outputs";
  if (cfg.pingpong || c.pair_n) {
    // Back to back into a poisoned C, no host sync between: the same bits (each warpgroup's
    // staging buffer and the mainloop order are reused across calls).
    const size_t nc = size_t(d.m * d.n);
    std::vector<uint16_t> first(nc), again(nc);
    CCFUSE_CUDA_CHECK(cudaMemcpy(first.data(), prob.c, nc * 2, cudaMemcpyDeviceToHost));
    CCFUSE_CUDA_CHECK(cudaMemset(prob.c, 0xff, nc * 2));
    for (int i = 0; i < 5; ++i) run(d, cfg, prob.a, prob.b, prob.c, nullptr);
    CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
    CCFUSE_CUDA_CHECK(cudaMemcpy(again.data(), prob.c, nc * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(first == again) << "repeated calls changed the result";
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int bn : {256, 128})
        for (int cl : {1, 2}) {
          out.push_back({1000, 776, 520, t, l, bn, 0, false, cl});  // M, N not multiples of the tile
          out.push_back({48, 200, 24, t, l, bn, 0, false, cl});     // M < 64, K = 8 * 3 (cl 2: a dummy partner)
          out.push_back({2048, 3072, 1032, t, l, bn, 0, false, cl});
        }
  out.push_back({4096, 4096, 4096, DType::kBFloat16, BLayout::kNK, 0, 0, false});
  out.push_back({4096, 4096, 4096, DType::kBFloat16, BLayout::kKN, 0, 0, false});
  out.push_back({3000, 5000, 1000, DType::kBFloat16, BLayout::kNK, 256, 100, false});  // SM budget
  out.push_back({3000, 5000, 1000, DType::kBFloat16, BLayout::kNK, 256, 116, true});   // column-major
  out.push_back({1, 8, 8, DType::kBFloat16, BLayout::kKN, 0, 0, false});
  out.push_back({777, 1030, 8, DType::kBFloat16, BLayout::kNK, 128, 7, false});  // odd ldc: scalar stores
  out.push_back({777, 1030, 8, DType::kBFloat16, BLayout::kNK, 256, 7, false, 2});  // odd row tiles, odd SM budget
  out.push_back({3000, 5000, 1000, DType::kBFloat16, BLayout::kKN, 256, 100, true, 2});
  // The TMA-store epilogue: partial tiles (M, N past the tile), M < 64, both layouts and dtypes,
  // clusters, an SM budget, column-major order (N a multiple of 8: TMA stores rows of C).
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int cl : {1, 2}) {
        out.push_back({1000, 776, 520, t, l, 256, 0, false, cl, true});
        out.push_back({48, 200, 24, t, l, 256, 0, false, cl, true});
      }
  out.push_back({4096, 4096, 4096, DType::kBFloat16, BLayout::kNK, 256, 0, false, 2, true});
  // The narrow TMA-store tile (128x128x64, 5 stages; passed on 2x H200 2026-11-30)
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int cl : {1, 2}) {
        out.push_back({1000, 776, 520, t, l, 128, 0, false, cl, true});
        out.push_back({48, 200, 24, t, l, 128, 0, false, cl, true});
      }
  out.push_back({1024, 768, 4096, DType::kBFloat16, BLayout::kNK, 128, 0, false, 2, true});
  out.push_back({3000, 5000, 512, DType::kBFloat16, BLayout::kKN, 128, 100, true, 1, true});
  out.push_back({3000, 5000, 512, DType::kBFloat16, BLayout::kNK, 256, 100, true, 1, true});
  // The 192-column TMA-store tile (128x192x64, 4 stages; passed on 2x H200 2026-11-30): partial tiles (776 = 4 x 192 + 8), M < 64, both layouts and dtypes, clusters, an SM
  // budget, column order, and two sweep shapes it is meant for.
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int cl : {1, 2}) {
        out.push_back({1000, 776, 520, t, l, 192, 0, false, cl, true});
        out.push_back({48, 200, 24, t, l, 192, 0, false, cl, true});
      }
  out.push_back({3000, 5000, 512, DType::kBFloat16, BLayout::kKN, 192, 100, true, 1, true});
  out.push_back({1024, 3072, 4096, DType::kBFloat16, BLayout::kNK, 192, 0, false, 2, true});
  out.push_back({4096, 768, 4096, DType::kBFloat16, BLayout::kKN, 192, 0, false, 2, true});
  // The 96-column TMA-store tile (128x96x64, 7 stages, 32-column TMA boxes with the 64-byte
  // swizzle; B [N, K] only): partial tiles (776 = 8 x 96 + 8; 808 = 8 x 96 + 40: a full and a
  // clipped box in the last tile), M < 64, both dtypes, clusters (odd row tiles with an odd SM
  // budget), an SM budget in column order, and the one-wave shapes it is meant for.
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (int cl : {1, 2}) {
      out.push_back({1000, 776, 520, t, BLayout::kNK, 96, 0, false, cl, true});
      out.push_back({1000, 808, 520, t, BLayout::kNK, 96, 0, false, cl, true});
      out.push_back({48, 200, 24, t, BLayout::kNK, 96, 0, false, cl, true});
    }
  out.push_back({777, 1000, 136, DType::kBFloat16, BLayout::kNK, 96, 7, false, 2, true});
  out.push_back({3000, 5000, 512, DType::kBFloat16, BLayout::kNK, 96, 100, true, 1, true});
  out.push_back({1024, 1536, 4096, DType::kBFloat16, BLayout::kNK, 96, 0, false, 2, true});
  out.push_back({1024, 1536, 4096, DType::kFloat16, BLayout::kNK, 96, 0, false, 1, true});
  out.push_back({1024, 1280, 8192, DType::kBFloat16, BLayout::kNK, 96, 0, false, 2, true});
  out.push_back({1024, 768, 4096, DType::kBFloat16, BLayout::kNK, 96, 0, false, 2, true});
  // The 160- and 224-column TMA-store tiles (B [N, K] only, 32-column boxes as 96): partial
  // tiles with a full and a clipped box in the last one (1000 = 6 x 160 + 40, 1000 = 4 x 224 +
  // 104), M < 64, both dtypes, clusters, an SM budget in column order, and the sweep shapes
  // choose_config picks them for.
  for (int bn : {160, 224}) {
    for (DType t : {DType::kBFloat16, DType::kFloat16})
      for (int cl : {1, 2}) {
        out.push_back({1000, 1000, 520, t, BLayout::kNK, bn, 0, false, cl, true});
        out.push_back({48, 200, 24, t, BLayout::kNK, bn, 0, false, cl, true});
      }
    out.push_back({777, 1000, 136, DType::kBFloat16, BLayout::kNK, bn, 7, true, 2, true});  // 7 SMs: 3 pairs
  }
  out.push_back({4096, 1280, 8192, DType::kBFloat16, BLayout::kNK, 160, 0, false, 2, true});
  out.push_back({1024, 5120, 8192, DType::kBFloat16, BLayout::kNK, 160, 0, false, 2, true});
  out.push_back({1024, 3584, 4096, DType::kBFloat16, BLayout::kNK, 224, 0, false, 2, true});
  out.push_back({1024, 3584, 4096, DType::kFloat16, BLayout::kNK, 224, 0, false, 1, true});
  // The 64-column TMA-store tile (opt-in, written 2026-12-01): partial tiles (1000 = 15 x 64 + 40
  // columns, 1000 = 7 x 128 + 104 rows), M < 64, both layouts and dtypes, clusters, an SM budget in
  // column order, and the one-wave shape it is meant for (1024x768x4096: 96 tiles).
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int cl : {1, 2}) {
        out.push_back({1000, 1000, 520, t, l, 64, 0, false, cl, true});
        out.push_back({48, 200, 24, t, l, 64, 0, false, cl, true});
      }
  out.push_back({777, 1000, 136, DType::kBFloat16, BLayout::kNK, 64, 7, true, 2, true});  // 7 SMs: 3 pairs
  out.push_back({1024, 768, 4096, DType::kBFloat16, BLayout::kNK, 64, 0, false, 2, true});
  out.push_back({1024, 768, 4096, DType::kFloat16, BLayout::kKN, 64, 0, false, 1, true});
  // The 80- and 48-column TMA-store tiles (B [N, K] only, 16-column boxes with the 32-byte
  // swizzle; written 2026-12-01): partial tiles with full and clipped boxes in the last one (1000 =
  // 12 x 80 + 40 = 20 x 48 + 40; 1000 = 7 x 128 + 104 rows), M < 64, both dtypes, clusters, an odd SM
  // budget in column order (7 SMs: 3 pairs), and the one-wave shapes they are for.
  for (int bn : {80, 48}) {
    for (DType t : {DType::kBFloat16, DType::kFloat16})
      for (int cl : {1, 2}) {
        out.push_back({1000, 1000, 520, t, BLayout::kNK, bn, 0, false, cl, true});
        out.push_back({48, 200, 24, t, BLayout::kNK, bn, 0, false, cl, true});
      }
    out.push_back({777, 1000, 136, DType::kBFloat16, BLayout::kNK, bn, 7, true, 2, true});
  }
  out.push_back({1024, 1280, 8192, DType::kBFloat16, BLayout::kNK, 80, 0, false, 2, true});
  out.push_back({1024, 1280, 8192, DType::kFloat16, BLayout::kNK, 80, 0, false, 1, true});
  out.push_back({1024, 768, 4096, DType::kBFloat16, BLayout::kNK, 48, 0, false, 2, true});
  out.push_back({1024, 768, 4096, DType::kFloat16, BLayout::kNK, 48, 0, false, 1, true});
  // choose_config's own picks since 2026-12-01: ping-pong on K = 512 (unpaired), the 80 and 48
  // tiles unpaired on their one-wave shapes.
  out.push_back({4096, 4096, 512, DType::kBFloat16, BLayout::kNK, 0, 0, false});
  out.push_back({2000, 2000, 264, DType::kFloat16, BLayout::kKN, 0, 0, false});
  out.push_back({1024, 1280, 8192, DType::kBFloat16, BLayout::kNK, 0, 0, false});
  // ... and ping-pong on K = 1024 with >= 20 waves of 128x128 tiles (2026-12-01 23:00), both layouts.
  out.push_back({8192, 8192, 1024, DType::kBFloat16, BLayout::kNK, 0, 0, false});
  out.push_back({8192, 8192, 1000, DType::kFloat16, BLayout::kKN, 0, 0, false});
  // Split-K (opt-in): partial tiles, M < 64, both layouts and dtypes, column order, an odd SM
  // budget with an odd ldc, the most parts (16 of 16 k-blocks); and choose_config's pick for a
  // shape with fewer tiles than SMs (1024x768x8192; 1024x768x4096 takes the 64 tile since 2026-12-01).
  out.push_back({1000, 776, 1032, DType::kBFloat16, BLayout::kNK, 256, 0, false, 0, false, 3});
  out.push_back({48, 200, 520, DType::kFloat16, BLayout::kKN, 128, 0, false, 0, false, 2});
  out.push_back({1000, 520, 776, DType::kBFloat16, BLayout::kKN, 0, 0, true, 0, false, 5});
  out.push_back({777, 1030, 136, DType::kBFloat16, BLayout::kNK, 128, 7, false, 0, false, 2});
  out.push_back({256, 512, 1024, DType::kBFloat16, BLayout::kNK, 256, 0, false, 0, false, 16});
  out.push_back({1024, 768, 8192, DType::kBFloat16, BLayout::kNK, 0, 0, false});
  // Split-K with the narrow TMA-store tile (the last part stores through TMA).
  out.push_back({1000, 776, 1032, DType::kBFloat16, BLayout::kNK, 128, 0, false, 0, true, 3});
  // Stream-K (tiles cut over the CTAs, summed in the kernel): partial tiles with ~3 parts each, M
  // < 64 with fewer iterations than SMs, K = 8 * 3 (one k-block: every part a whole tile), both
  // layouts and dtypes, the register epilogue with an odd ldc and an odd SM budget, the wide
  // tile in column order, whole tiles before the cut ones (100 SMs, 960 tiles), and
  // choose_config's picks for the sweep's few-tile shapes.
  out.push_back({1000, 776, 1032, DType::kBFloat16, BLayout::kNK, 128, 0, false, 0, true, 0, true});
  out.push_back({1000, 776, 1032, DType::kFloat16, BLayout::kKN, 128, 0, false, 0, true, 0, true});
  out.push_back({48, 200, 520, DType::kFloat16, BLayout::kKN, 128, 0, false, 0, true, 0, true});
  out.push_back({48, 200, 24, DType::kBFloat16, BLayout::kNK, 128, 0, false, 0, true, 0, true});
  out.push_back({777, 1030, 136, DType::kBFloat16, BLayout::kNK, 128, 7, false, 0, false, 0, true});
  out.push_back({1000, 520, 776, DType::kBFloat16, BLayout::kKN, 256, 0, true, 0, false, 0, true});
  out.push_back({3000, 5000, 512, DType::kBFloat16, BLayout::kKN, 128, 100, false, 0, true, 0, true});
  out.push_back({4096, 1280, 8192, DType::kBFloat16, BLayout::kNK, 0, 0, false});
  out.push_back({1024, 1536, 4096, DType::kBFloat16, BLayout::kKN, 0, 0, false});
  // Ping-pong consumers (128x128x64/5, TMA store; written 2026-11-30, not yet run on a GPU):
  // partial tiles, M < 64 (one tile: warpgroup 1 idle), both layouts and dtypes, clusters; few
  // CTAs so that each takes many tiles in turn, odd and even counts of tiles per CTA (7 and 8
  // SMs), column order; K of one k-block and the small-K sweep shapes it is meant for.
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int cl : {1, 2}) {
        out.push_back({1000, 776, 520, t, l, 128, 0, false, cl, true, 0, false, true});
        out.push_back({48, 200, 24, t, l, 128, 0, false, cl, true, 0, false, true});
      }
  out.push_back({1000, 1032, 136, DType::kBFloat16, BLayout::kNK, 128, 7, false, 1, true, 0, false, true});
  out.push_back({1000, 1032, 136, DType::kBFloat16, BLayout::kNK, 128, 8, true, 2, true, 0, false, true});
  // CTA pairs along N sharing A (GemmConfig::cluster_n = 2; written 2026-11-30, not yet run on a
  // GPU): odd column-tile counts (the last pair's second tile past N: zeros loaded, A still
  // multicast, its store dropped), one column tile (every pair's second tile past N), M < 64,
  // both layouts and dtypes (the 96 tile: B [N, K] only), an odd SM budget (3 pairs), column
  // order, and the one-wave shapes the narrow tiles are meant for. Each also run back to back.
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (BLayout l : {BLayout::kNK, BLayout::kKN}) {
      out.push_back({1000, 776, 520, t, l, 128, 0, false, 0, true, 0, false, false, true});  // 7 column tiles
      out.push_back({48, 200, 24, t, l, 128, 0, false, 0, true, 0, false, false, true});
    }
    out.push_back({1000, 776, 520, t, BLayout::kNK, 96, 0, false, 0, true, 0, false, false, true});  // 9 column tiles
    out.push_back({1000, 808, 520, t, BLayout::kNK, 96, 0, false, 0, true, 0, false, false, true});
    out.push_back({48, 96, 24, t, BLayout::kNK, 96, 0, false, 0, true, 0, false, false, true});  // one column tile
  }
  out.push_back({777, 1000, 136, DType::kBFloat16, BLayout::kNK, 96, 7, false, 0, true, 0, false, false, true});
  out.push_back({3000, 5000, 512, DType::kBFloat16, BLayout::kKN, 128, 100, true, 0, true, 0, false, false, true});
  out.push_back({1024, 1280, 8192, DType::kBFloat16, BLayout::kNK, 96, 0, false, 0, true, 0, false, false, true});
  out.push_back({1024, 1536, 4096, DType::kBFloat16, BLayout::kNK, 96, 0, false, 0, true, 0, false, false, true});
  out.push_back({1024, 1536, 4096, DType::kBFloat16, BLayout::kNK, 128, 0, false, 0, true, 0, false, false, true});
  out.push_back({777, 1000, 8, DType::kFloat16, BLayout::kKN, 128, 16, false, 2, true, 0, false, true});
  out.push_back({4096, 4096, 512, DType::kBFloat16, BLayout::kNK, 128, 0, false, 2, true, 0, false, true});
  out.push_back({16384, 4096, 1024, DType::kBFloat16, BLayout::kNK, 128, 0, false, 2, true, 0, false, true});
  // Ping-pong with 6 stages and the one-slot sub-tile staging ring (written 2026-12-02): the same
  // coverage as the 5-stage cases above (each also run back to back), plus the K <= 1024 shapes.
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (BLayout l : {BLayout::kNK, BLayout::kKN})
      for (int cl : {1, 2}) {
        out.push_back({1000, 776, 520, t, l, 128, 0, false, cl, true, 0, false, true, false, 6});
        out.push_back({48, 200, 24, t, l, 128, 0, false, cl, true, 0, false, true, false, 6});
      }
  out.push_back({1000, 1032, 136, DType::kBFloat16, BLayout::kNK, 128, 7, false, 1, true, 0, false, true, false, 6});
  out.push_back({1000, 1032, 136, DType::kBFloat16, BLayout::kNK, 128, 8, true, 2, true, 0, false, true, false, 6});
  out.push_back({777, 1000, 8, DType::kFloat16, BLayout::kKN, 128, 16, false, 1, true, 0, false, true, false, 6});
  out.push_back({16384, 4096, 512, DType::kBFloat16, BLayout::kNK, 128, 0, false, 1, true, 0, false, true, false, 6});
  out.push_back({1024, 4096, 1024, DType::kBFloat16, BLayout::kNK, 128, 0, false, 1, true, 0, false, true, false, 6});
  // Ping-pong on 128x160x64/5 through a ring of two 128x32 slots (B [N, K], unpaired): five
  // sub-tiles a tile, so slots are reused within a tile and across tiles.
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    out.push_back({1000, 776, 520, t, BLayout::kNK, 160, 0, false, 1, true, 0, false, true});   // 5 column tiles, the last cut
    out.push_back({48, 200, 24, t, BLayout::kNK, 160, 0, false, 1, true, 0, false, true});
  }
  out.push_back({1000, 1032, 136, DType::kBFloat16, BLayout::kNK, 160, 7, false, 1, true, 0, false, true});
  out.push_back({1000, 1032, 136, DType::kBFloat16, BLayout::kNK, 160, 8, true, 1, true, 0, false, true});
  out.push_back({16384, 4096, 512, DType::kBFloat16, BLayout::kNK, 160, 0, false, 1, true, 0, false, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmCorrectness, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return name_of(i.param); });

// Stream-K's tile counters must be back at zero after every call: back-to-back calls on the
// library's workspace, a caller's workspace full of garbage (zeroed by run() on the stream), and
// CUDA-graph replays, each checked on a poisoned C.
TEST(GemmStreamK, RepeatedCallsCallerWorkspaceAndGraphReplays) {
  CCFUSE_REQUIRE_GPUS(1);
  const GemmDesc d = make_desc(1000, 776, 1032, DType::kBFloat16, BLayout::kNK);
  GemmConfig cfg = choose_config(d, 0);
  cfg.block_n = 128;
  cfg.stages = 5;
  cfg.tma_store = true;
  cfg.stream_k = true;
  cfg.cluster_m = 1;
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " config ", to_string(cfg)));
  Problem prob(d, seed);
  const size_t c_bytes = size_t(d.m * d.n) * 2;
  cudaStream_t s = nullptr;
  CCFUSE_CUDA_CHECK(cudaStreamCreate(&s));
  auto check = [&](const char* what) {
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
    const double err = prob.rel_err();
    EXPECT_LE(err, 1e-2) << what;
    EXPECT_GT(err, 0.0) << what;
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(prob.c, 0xff, c_bytes, s));  // poison for the next one
  };
  for (int i = 0; i < 3; ++i) {
    run(d, cfg, prob.a, prob.b, prob.c, s);
    check("library workspace, back to back");
  }
  void* ws = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&ws, workspace_bytes(d, cfg)));
  CCFUSE_CUDA_CHECK(cudaMemset(ws, 0x5a, workspace_bytes(d, cfg)));
  run(d, cfg, prob.a, prob.b, prob.c, s, ws);
  check("caller's workspace");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  run(d, cfg, prob.a, prob.b, prob.c, s);  // the library's workspace exists since the calls above
  CCFUSE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) {
    CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    check("graph replay");
  }
  CCFUSE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  CCFUSE_CUDA_CHECK(cudaGraphDestroy(graph));
  CCFUSE_CUDA_CHECK(cudaFree(ws));
  CCFUSE_CUDA_CHECK(cudaStreamDestroy(s));
}

// Captured into a CUDA graph before the library's split-K buffers are big enough (they cannot
// grow during a capture): run() falls back to whole tiles, and the replays are correct. The
// problem needs 256 MiB of partials (2048x2048 in 128x128 tiles, 16 parts), more than any other
// test here, so the buffers are too small whatever ran before.
TEST(GemmSplitK, CapturedBeforeItsBuffersExistFallsBackToWholeTiles) {
  CCFUSE_REQUIRE_GPUS(1);
  const GemmDesc d = make_desc(2048, 2048, 8192, DType::kBFloat16, BLayout::kNK);
  GemmConfig cfg = choose_config(d, 0);
  cfg.block_n = 128;
  cfg.stages = 5;
  cfg.tma_store = true;
  cfg.stream_k = false;
  cfg.split_k = 16;
  cfg.cluster_m = 1;
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " config ", to_string(cfg)));
  Problem prob(d, seed);
  cudaStream_t s = nullptr;
  CCFUSE_CUDA_CHECK(cudaStreamCreate(&s));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  run(d, cfg, prob.a, prob.b, prob.c, s);
  CCFUSE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) {
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(prob.c, 0xff, size_t(d.m * d.n) * 2, s));
    CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
    const double err = prob.rel_err();
    EXPECT_LE(err, 1e-2) << "replay " << i;
    EXPECT_GT(err, 0.0);
  }
  CCFUSE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  CCFUSE_CUDA_CHECK(cudaGraphDestroy(graph));
  // Outside a capture the same call grows the buffers and runs split.
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(prob.c, 0xff, size_t(d.m * d.n) * 2, s));
  run(d, cfg, prob.a, prob.b, prob.c, s);
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_LE(prob.rel_err(), 1e-2);
  CCFUSE_CUDA_CHECK(cudaStreamDestroy(s));
}

// A grouped problem of two groups of at most 256 rows in all (validation tests).
GroupedGemmDesc two_groups(int64_t n, int64_t k, BLayout layout = BLayout::kKN) {
  GroupedGemmDesc g;
  g.num_groups = 2;
  g.max_rows = 256;
  g.n = n;
  g.k = k;
  g.b_layout = layout;
  return g;
}

TEST(GemmValidation, RejectsWhatTmaCannotTake) {
  GemmDesc d;
  d.m = 128;
  d.n = 128;
  d.k = 100;
  GemmConfig cfg;
  try {
    validate(d, cfg);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "k 100 must be a multiple of 8 for bf16 (TMA needs 16-byte aligned rows of A)");
  }
  d.k = 128;
  d.n = 100;
  try {
    validate(d, cfg);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "n 100 must be a multiple of 8 for bf16 (TMA needs 16-byte aligned rows of B [K, N])");
  }
  d.b_layout = BLayout::kNK;
  EXPECT_NO_THROW(validate(d, cfg));  // N is free when B is [N, K]
  d.dtype = DType::kFloat32;
  try {
    validate(d, cfg);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "dtype fp32 is not supported by the GEMM engine (bf16, fp16)");
  }
  d.dtype = DType::kBFloat16;
  cfg.block_n = 64;
  EXPECT_THROW(validate(d, cfg), InvalidArgument);
}

// choose_config's epilogue and split choices (host only: an explicit SM count needs no GPU).
TEST(GemmValidation, ChooseConfigPicksTheMeasuredWinners) {
  const GemmConfig wide = choose_config(make_desc(8192, 4096, 4096, DType::kBFloat16, BLayout::kNK), 132);
  EXPECT_TRUE(wide.tma_store);  // 16-byte aligned rows of C: the TMA-store epilogue
  EXPECT_EQ(wide.block_n, 256);
  EXPECT_EQ(wide.stages, 3);
  const GemmConfig odd = choose_config(make_desc(8192, 4100, 4096, DType::kBFloat16, BLayout::kNK), 132);
  EXPECT_FALSE(odd.tma_store);  // n % 8 != 0: registers
  EXPECT_NO_THROW(validate(make_desc(8192, 4100, 4096, DType::kBFloat16, BLayout::kNK), odd));
  // Fewer narrow tiles than half the SMs, long K: split-K in 2 on the narrow TMA-store tile
  // (measured faster there; stream-K and 3 parts slower) ...
  // (either B layout: split-K was 4 % faster than the 48 tile below back to back there)
  for (BLayout l : {BLayout::kNK, BLayout::kKN}) {
    const GemmConfig few = choose_config(make_desc(1024, 768, 8192, DType::kBFloat16, l), 132);
    EXPECT_EQ(few.split_k, 2);
    EXPECT_FALSE(few.stream_k);
    EXPECT_TRUE(few.tma_store);
    EXPECT_EQ(few.block_n, 128);
    EXPECT_EQ(few.stages, 5);
    EXPECT_EQ(few.cluster_m, 1);
    EXPECT_NO_THROW(validate(make_desc(1024, 768, 8192, DType::kBFloat16, l), few));
  }
  // ... unless the 128x64 tile fills one wave and K is short enough that split-K's fixup costs
  // more than the narrow tile loses (1024x768x4096: 6-8 % faster, 2026-12-01), in CTA pairs with
  // groups of 4 row tiles; with B [N, K] the 128x48 tile, which makes 128 tiles of that wave
  // instead of 96.
  for (BLayout l : {BLayout::kNK, BLayout::kKN}) {
    const GemmConfig n64 = choose_config(make_desc(1024, 768, 4096, DType::kBFloat16, l), 132);
    EXPECT_EQ(n64.block_n, l == BLayout::kNK ? 48 : 64);
    EXPECT_EQ(n64.stages, l == BLayout::kNK ? 9 : 8);
    EXPECT_EQ(n64.split_k, 1);
    EXPECT_EQ(n64.cluster_m, 1);  // one wave: no CTA pairs
    EXPECT_EQ(n64.group_m, 4);
    EXPECT_NO_THROW(validate(make_desc(1024, 768, 4096, DType::kBFloat16, l), n64));
  }
  // Not where it needs two waves: the 96 tile fills one.
  EXPECT_EQ(choose_config(make_desc(2048, 768, 4096, DType::kBFloat16, BLayout::kNK), 132).block_n, 96);
  // Short K where the wide tile makes one wave: two waves of 128x128 (1024x4096x512 and x1024,
  // +2 to +4 points, measured twice); with more waves of the wide tile it stays.
  EXPECT_EQ(choose_config(make_desc(1024, 4096, 512, DType::kBFloat16, BLayout::kNK), 132).block_n, 128);
  EXPECT_EQ(choose_config(make_desc(1024, 4096, 1024, DType::kBFloat16, BLayout::kNK), 132).block_n, 128);
  EXPECT_EQ(choose_config(make_desc(1024, 4096, 1792, DType::kBFloat16, BLayout::kNK), 132).block_n, 256);
  // (K <= 1024 with more 128x128 tiles than SMs takes ping-pong, 4096x4096x1024 included, since
  // 2026-12-02: ChooseConfigPingPongForShortK.)
  // Twice the tiles would take two waves: whole tiles in CTA pairs, 128 of 96 columns (one wave)
  // rather than 96 of 128.
  const GemmConfig two_waves = choose_config(make_desc(1024, 1536, 4096, DType::kBFloat16, BLayout::kNK), 132);
  EXPECT_EQ(two_waves.split_k, 1);
  EXPECT_FALSE(two_waves.stream_k);
  EXPECT_EQ(two_waves.block_n, 96);
  EXPECT_EQ(two_waves.stages, 7);
  EXPECT_EQ(two_waves.cluster_m, 1);
  EXPECT_EQ(two_waves.cluster_n, 1);
  // A narrow tile's raster: groups of 4 row tiles (2026-12-01: 89 -> 96.5 % of cuBLASLt back to back).
  EXPECT_EQ(two_waves.group_m, 4);
  EXPECT_EQ(wide.group_m, 16);
  EXPECT_NO_THROW(validate(make_desc(1024, 1536, 4096, DType::kBFloat16, BLayout::kNK), two_waves));
  // 112 tiles of 96 columns against 80 of 128 (1024x1280x8192: 70 -> 81 % of cuBLASLt), and 128
  // of 80 columns against both (one full wave, as cuBLASLt's); B [K, N] cannot take the 96 or 80
  // tile (64-column swizzle atoms).
  EXPECT_EQ(choose_config(make_desc(1024, 1280, 8192, DType::kBFloat16, BLayout::kNK), 132).block_n, 80);
  const GemmConfig kn = choose_config(make_desc(1024, 1280, 8192, DType::kBFloat16, BLayout::kKN), 132);
  EXPECT_EQ(kn.block_n % 64, 0);
  EXPECT_NO_THROW(validate(make_desc(1024, 1280, 8192, DType::kBFloat16, BLayout::kKN), kn));
  // Where the wider tiles fill the waves, not the 96 tile.
  EXPECT_NE(choose_config(make_desc(1024, 3584, 4096, DType::kBFloat16, BLayout::kNK), 132).block_n, 96);
  EXPECT_NE(choose_config(make_desc(4096, 4096, 4096, DType::kBFloat16, BLayout::kNK), 132).block_n, 96);
  // 384 narrow tiles take 3 waves, 256 tiles of 128x192 take 2 (measured 2026-11-30: 97.4 ->
  // 99.7 % of cuBLASLt), no stream-K.
  const GemmConfig mid = choose_config(make_desc(8192, 768, 4096, DType::kBFloat16, BLayout::kNK), 132);
  EXPECT_FALSE(mid.stream_k);
  EXPECT_TRUE(mid.tma_store);
  EXPECT_EQ(mid.block_n, 192);
  EXPECT_EQ(mid.stages, 4);
  EXPECT_NO_THROW(validate(make_desc(8192, 768, 4096, DType::kBFloat16, BLayout::kNK), mid));
  // 112 tiles of 128x192 fill one wave better than 80 wide ones (1024x2560x8192: 69 -> 92 %), and
  // 128 of 128x160 better still (B [N, K]); B [K, N] keeps 192.
  EXPECT_EQ(choose_config(make_desc(1024, 2560, 8192, DType::kBFloat16, BLayout::kNK), 132).block_n, 160);
  EXPECT_EQ(choose_config(make_desc(1024, 2560, 8192, DType::kBFloat16, BLayout::kKN), 132).block_n, 192);
  // Unaligned rows of C: no 192 tile (TMA-store only), registers.
  EXPECT_NE(choose_config(make_desc(1024, 2564, 8192, DType::kBFloat16, BLayout::kNK), 132).block_n, 192);
  // Many tiles: the wide tile stays.
  EXPECT_FALSE(wide.stream_k);
  GroupedGemmDesc g;
  g.num_groups = 8;
  g.max_rows = 8192;
  g.n = 2048;
  g.k = 4096;
  // Grouped: the TMA-store epilogue on the wide tile (measured 2026-11-30: 100.4 -> 115.8 % of
  // the best of cuBLAS grouped and torch), whole tiles only, unclustered; below N = 4096 (from
  // there ping-pong, below).
  const GemmConfig grouped = choose_config(g, 132);
  EXPECT_TRUE(grouped.tma_store);
  EXPECT_EQ(grouped.block_n, 256);
  EXPECT_EQ(grouped.stages, 3);
  EXPECT_EQ(grouped.split_k, 1);
  EXPECT_FALSE(grouped.stream_k);
  // A grouped problem whose tiles fill the waves better at 128 columns: the narrow TMA-store tile,
  // never 128x192 (not built for grouped problems).
  GroupedGemmDesc g2 = g;
  g2.max_rows = 8192;
  g2.n = 768;
  const GemmConfig grouped_narrow = choose_config(g2, 132);
  EXPECT_TRUE(grouped_narrow.tma_store);
  EXPECT_EQ(grouped_narrow.block_n, 128);
  EXPECT_EQ(grouped_narrow.stages, 5);
  EXPECT_FALSE(grouped_narrow.stream_k);
  EXPECT_NO_THROW(validate(g2, grouped_narrow));
  EXPECT_EQ(grouped.cluster_m, 1);
  EXPECT_NO_THROW(validate(g, grouped));
  // Grouped ping-pong (the 6-stage 128x128 ring) goes by N, not K (measured 2026-12-02): Qwen3's
  // down projection (N = 2048, K = 768) keeps 128x256; DeepSeek-like's (N = 7168, K = 2048) and
  // Mixtral-like wide ones (N = 28672, K = 4096) take it; never the 160 ring (not built for groups).
  // Only at an H200's memory bandwidth (4800 GB/s; measured 2026-12-07: an H100's 3350 runs the
  // whole 128x256 tile faster).
  const double h200 = 4800, h100 = 3350;
  GroupedGemmDesc g4 = g;
  g4.num_groups = 64;
  g4.max_rows = 32768;
  g4.n = 2048;
  g4.k = 768;
  g4.b_layout = BLayout::kNK;
  EXPECT_FALSE(choose_config(g4, 132, h200).pingpong);
  g4.num_groups = 128;
  g4.n = 7168;
  g4.k = 2048;
  EXPECT_FALSE(choose_config(g4, 132, h100).pingpong);
  EXPECT_EQ(choose_config(g4, 132, h100).block_n, 256);
  const GemmConfig grouped_pp = choose_config(g4, 132, h200);
  EXPECT_TRUE(grouped_pp.pingpong);
  EXPECT_TRUE(grouped_pp.tma_store);
  EXPECT_EQ(grouped_pp.block_n, 128);
  EXPECT_EQ(grouped_pp.stages, 6);
  EXPECT_EQ(grouped_pp.cluster_m, 1);
  EXPECT_NO_THROW(validate(g4, grouped_pp));
  g4.num_groups = 4;
  g4.n = 28672;
  g4.k = 4096;
  EXPECT_TRUE(choose_config(g4, 132, h200).pingpong);
  EXPECT_FALSE(choose_config(g4, 132, h100).pingpong);
  g4.n = 4000;  // below 4096 columns
  EXPECT_FALSE(choose_config(g4, 132, h200).pingpong);
  // This device's bandwidth (what choose_config without one uses): an H100's or H200's is in
  // range; 0 without a device (the CPU-only machines run this test too).
  const double gbps = current_device_mem_gbps();
  EXPECT_TRUE(gbps == 0 || (gbps > 1000 && gbps < 10000)) << gbps;
  GroupedGemmDesc g5 = g4;
  g5.n = 28672;
  if (gbps > 0) EXPECT_EQ(choose_config(g5, 132).pingpong, gbps >= kGroupedPingpongMinGbps);
  // Unaligned rows of C: registers (4 stages).
  GroupedGemmDesc g3 = g;
  g3.n = 4100;
  g3.b_layout = BLayout::kNK;
  const GemmConfig grouped_odd = choose_config(g3, 132);
  EXPECT_FALSE(grouped_odd.tma_store);
  EXPECT_NO_THROW(validate(g3, grouped_odd));
}

TEST(GemmValidation, SplitKRules) {
  const GemmDesc d = make_desc(1024, 768, 256, DType::kBFloat16, BLayout::kNK);  // 4 k-blocks
  GemmConfig cfg;
  cfg.split_k = 5;
  try {
    validate(d, cfg);
    ADD_FAILURE() << "split_k past the k-blocks accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "split_k 5 must be in [1, min(16, k / block_k = 4)]");
  }
  cfg.split_k = 2;
  cfg.cluster_m = 2;
  try {
    validate(d, cfg);
    ADD_FAILURE() << "split_k with clusters accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "split_k > 1 is built with cluster_m 1, not 2");
  }
  cfg.cluster_m = 1;
  EXPECT_NO_THROW(validate(d, cfg));
  cfg.num_sms = 132;
  // Partials: one 128x256 fp32 slot per part (8 x 3 tiles x 2 parts); one counter per tile.
  EXPECT_EQ(workspace_bytes(d, cfg), size_t(24) * 2 * 128 * 256 * 4 + 24 * 4);
  cfg.stream_k = true;
  try {
    validate(d, cfg);
    ADD_FAILURE() << "split_k with stream_k accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "split_k 2 and stream_k exclude each other");
  }
  cfg.split_k = 1;
  cfg.tma_store = true;
  cfg.stages = 3;
  try {
    validate(d, cfg);
    ADD_FAILURE() << "stream_k with the wide TMA-store tile accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "stream_k with tma_store is built for the 128x128x64/5 tile");
  }
  cfg.block_n = 128;
  cfg.stages = 5;
  EXPECT_NO_THROW(validate(d, cfg));
  // 8 x 6 = 48 tiles of 4 k-blocks on 132 SMs: 132 CTAs, 192 iterations, 2 units each at most.
  EXPECT_EQ(workspace_bytes(d, cfg), size_t(132) * 2 * 128 * 128 * 4 + 48 * 4);
  cfg = GemmConfig{};
  cfg.split_k = 2;
  const GroupedGemmDesc g = two_groups(256, 256);
  try {
    validate(g, cfg);
    ADD_FAILURE() << "split_k in a grouped GEMM accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "split_k 2 is not supported by the grouped GEMM (1 only)");
  }
}

TEST(GemmValidation, TmaStoreRules) {
  GemmDesc d = make_desc(256, 264, 128, DType::kBFloat16, BLayout::kNK);
  GemmConfig cfg{128, 256, 64, 3};
  cfg.tma_store = true;
  EXPECT_NO_THROW(validate(d, cfg));
  d.ldc = 270;  // rows of C not 16-byte aligned
  try {
    validate(d, cfg);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "ldc 270 must be a multiple of 8 for bf16 with tma_store (TMA stores 16-byte aligned rows of C)");
  }
  d.ldc = 0;
  cfg.stages = 4;  // the staging buffer leaves room for 3 stages only
  try {
    validate(d, cfg);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "tile 128x256x64 with 4 stages is not built with tma_store (built: 128x256x64/3, "
                           "128x224x64/3, 128x192x64/4, 128x160x64/5, 128x128x64/5, 128x96x64/7, 128x80x64/7, 128x64x64/8, 128x48x64/9)");
  }
  cfg.stages = 3;
  const GroupedGemmDesc g = two_groups(256, 128);
  EXPECT_NO_THROW(validate(g, cfg));  // the grouped TMA-store epilogue (experiment): cut tiles from registers
  GemmConfig n192 = cfg;
  n192.block_n = 192;
  n192.stages = 4;
  try {
    validate(g, n192);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "tma_store in the grouped GEMM is built for the 128x256x64/3 and 128x128x64/5 tiles, not 128x192");
  }
  EXPECT_EQ(to_string(cfg), "block=128x256x64 stages=3 sms=0 order=row group_m=8 cluster=1 epilogue=tma_store");
}

// The 96-column TMA-store tile (opt-in): whole tiles of B [N, K] in clusters of 1 or 2; not B
// [K, N], whose 64-column swizzle atoms do not tile it, nor cut or grouped; never chosen.
// validate(desc, cfg) must throw InvalidArgument with exactly `message`.
template <class Desc>
void expect_invalid(const Desc& d, const GemmConfig& cfg, const char* message) {
  try {
    validate(d, cfg);
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), message);
  }
}

// The rules every B [N, K]-only TMA-store tile (32-column boxes: 96, 160, 224 columns) shares:
// whole tiles in clusters of 1 or 2, bf16 and fp16; not B [K, N], split-K, stream-K, other stage
// counts, the register epilogue or grouped problems, each with its message.
void expect_nk_only_tile_rules(int bn, int stages) {
  SCOPED_TRACE(::testing::Message() << "128x" << bn << "/" << stages);
  GemmDesc d = make_desc(1024, 1536, 4096, DType::kBFloat16, BLayout::kNK);
  GemmConfig cfg{128, bn, 64, stages};
  cfg.tma_store = true;
  EXPECT_NO_THROW(validate(d, cfg));
  cfg.cluster_m = 2;
  EXPECT_NO_THROW(validate(d, cfg));
  d.dtype = DType::kFloat16;
  EXPECT_NO_THROW(validate(d, cfg));
  EXPECT_EQ(to_string(cfg), detail::str_cat("block=128x", bn, "x64 stages=", stages,
                                            " sms=0 order=row group_m=8 cluster=2 epilogue=tma_store"));
  d.b_layout = BLayout::kKN;
  expect_invalid(d, cfg, detail::str_cat("tile 128x", bn, " needs B [N, K] (b_layout nk): B [K, N] is loaded in ",
                                         "64-column swizzle atoms, which do not tile ", bn, " columns").c_str());
  d.b_layout = BLayout::kNK;
  cfg.cluster_m = 1;
  cfg.split_k = 2;
  expect_invalid(d, cfg, "split_k > 1 with tma_store is built for the 128x128x64/5 tile");
  cfg.split_k = 1;
  cfg.stream_k = true;
  expect_invalid(d, cfg, "stream_k with tma_store is built for the 128x128x64/5 tile");
  cfg.stream_k = false;
  GemmConfig other = cfg;
  other.stages = stages - 1;  // only `stages` is built
  expect_invalid(d, other, detail::str_cat("tile 128x", bn, "x64 with ", stages - 1, " stages is not built with ",
                                           "tma_store (built: 128x256x64/3, 128x224x64/3, 128x192x64/4, ",
                                           "128x160x64/5, 128x128x64/5, 128x96x64/7, 128x80x64/7, 128x64x64/8, 128x48x64/9)").c_str());
  other = cfg;
  other.tma_store = false;  // registers: not built
  EXPECT_THROW(validate(d, other), InvalidArgument);
  expect_invalid(two_groups(256, 128, BLayout::kNK), cfg,
                 detail::str_cat("tma_store in the grouped GEMM is built for the 128x256x64/3 and 128x128x64/5 ",
                                 "tiles, not 128x", bn).c_str());
}

TEST(GemmValidation, N96TileRules) {
  expect_nk_only_tile_rules(96, 7);
  // choose_config: the one-wave B [N, K] shapes the tile is meant for take it (1024x768x4096 and
  // 1024x1280x8192 take the 48 and 80 tiles, which make one full wave), B [K, N] never does.
  for (const auto& [m, n, k, picked] : {std::tuple<int64_t, int64_t, int64_t, bool>{1024, 1536, 4096, true},
                                        {2048, 768, 4096, true}, {1024, 1280, 8192, false},
                                        {1024, 768, 4096, false}}) {
    EXPECT_EQ(choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), 132).block_n == 96, picked)
        << m << "x" << n;
    EXPECT_NE(choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kKN), 132).block_n, 96) << m << "x" << n;
  }
}

// The 64-column TMA-store tile (2026-12-01): whole tiles of either B layout in clusters of 1 or 2,
// 8 stages only; not split-K, CTA pairs along N or grouped; chosen where it fills one wave that the
// others leave mostly empty (ChooseConfigPicksTheMeasuredWinners).
TEST(GemmValidation, N64TileRules) {
  for (BLayout l : {BLayout::kNK, BLayout::kKN}) {
    GemmDesc d = make_desc(1024, 768, 4096, DType::kBFloat16, l);
    GemmConfig cfg{128, 64, 64, 8};
    cfg.tma_store = true;
    EXPECT_NO_THROW(validate(d, cfg));
    cfg.cluster_m = 2;
    d.dtype = DType::kFloat16;
    EXPECT_NO_THROW(validate(d, cfg));
    EXPECT_EQ(to_string(cfg), "block=128x64x64 stages=8 sms=0 order=row group_m=8 cluster=2 epilogue=tma_store");
    GemmConfig other = cfg;
    other.stages = 7;
    expect_invalid(d, other, "tile 128x64x64 with 7 stages is not built with tma_store (built: 128x256x64/3, "
                             "128x224x64/3, 128x192x64/4, 128x160x64/5, 128x128x64/5, 128x96x64/7, 128x80x64/7, 128x64x64/8, 128x48x64/9)");
    other = cfg;
    other.cluster_m = 1;
    other.split_k = 2;
    expect_invalid(d, other, "split_k > 1 with tma_store is built for the 128x128x64/5 tile");
    other = cfg;
    other.cluster_m = 1;
    other.cluster_n = 2;
    expect_invalid(d, other, "cluster_n 2 is built for whole tiles of the 128x128x64/5 and 128x96x64/7 tiles with "
                             "tma_store, not 128x64x64/8");
  }
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1024, 768, 8192}, {1024, 1536, 4096},
                                {8192, 768, 4096}, {2048, 768, 4096}})
    EXPECT_NE(choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), 132).block_n, 64) << m << "x" << n;
}

// The 160- and 224-column TMA-store tiles: whole tiles of B [N, K] in clusters of 1 or 2 (32-column
// boxes as the 96 tile); not B [K, N], cut or grouped; chosen where they fill the waves.
// CTA pairs sharing B only where the tiles make at least 20 waves of the SMs given (measured
// 2026-12-01 on the 96 TP shapes: without pairs 1.04x as fast in one wave, level past 16 waves),
// on an even number of row tiles (2026-12-06: an odd one runs a tile past M), never in grouped
// GEMMs, split-K or stream-K.
TEST(GemmValidation, ChooseConfigPairsOnlyManyWaves) {
  auto pick = [](int64_t m, int64_t n, int64_t k, int sms) {
    return choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), sms);
  };
  EXPECT_EQ(pick(8192, 28672, 8192, 132).cluster_m, 2);   // 7168 tiles of 128x256: 54 waves
  EXPECT_EQ(pick(16384, 8192, 4096, 132).cluster_m, 2);   // 5504 tiles of 128x192: 41.7 waves
  EXPECT_EQ(pick(4096, 8192, 4096, 132).cluster_m, 1);    // 1024 tiles: 7.8 waves
  EXPECT_EQ(pick(1024, 4096, 512, 132).cluster_m, 1);     // 256 tiles of 128x128: 2 waves
  EXPECT_EQ(pick(1024, 768, 4096, 132).cluster_m, 1);     // one wave of 128x48
  EXPECT_EQ(pick(4096, 8192, 4096, 32).cluster_m, 2);     // 1024 tiles on 32 SMs: 32 waves
  EXPECT_EQ(pick(1024, 768, 8192, 132).cluster_m, 1);     // split-K
  const GemmConfig tiles_2640 = pick(5120, 16896, 4096, 132);  // 40 x 66 = 20 x 132 tiles of 128x256
  EXPECT_EQ(tiles_2640.block_n, 256);
  EXPECT_EQ(tiles_2640.cluster_m, 2) << to_string(tiles_2640);
  EXPECT_EQ(pick(8064, 16896, 4096, 132).cluster_m, 1);  // 63 row tiles: an odd number
}

// K <= 1024 with more 128x128 tiles than SMs: ping-pong consumers, unpaired, through the sub-tile
// staging ring (2026-12-02: 6-stage 128x128 +2 to +4 points interleaved on the ten such TP
// shapes), on 128x160/5 where K <= 512 and its tiles make >= 10 waves (B [N, K]); not with one
// wave of 128x128 tiles (one warpgroup would do a CTA's only tile), not past 16 k-blocks, not
// grouped, not without TMA stores.
TEST(GemmValidation, ChooseConfigPingPongForShortK) {
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{16384, 4096, 512}, {8192, 4096, 512},
                                {4096, 4096, 512}, {1024, 4096, 512}, {4096, 4096, 64}, {4096, 4096, 1024},
                                {1024, 4096, 1024}, {16384, 8192, 1024}, {8192, 4096, 1024}}) {
    for (BLayout l : {BLayout::kNK, BLayout::kKN}) {
      const GemmDesc d = make_desc(m, n, k, DType::kBFloat16, l);
      const GemmConfig c = choose_config(d, 132);
      // 128x160: 1664 (8192 rows) and 3328 (16384) tiles at K = 512, >= 10 waves; 832 (4096) fewer
      const bool wide = l == BLayout::kNK && k <= 512 && m >= 8192;
      EXPECT_TRUE(c.pingpong) << m << "x" << n << "x" << k;
      EXPECT_EQ(c.block_n, wide ? 160 : 128) << m << "x" << n << "x" << k;
      EXPECT_EQ(c.stages, wide ? 5 : 6);
      EXPECT_TRUE(c.tma_store);
      EXPECT_EQ(c.cluster_m, 1);
      EXPECT_EQ(c.split_k, 1);
      EXPECT_NO_THROW(validate(d, c));
    }
  }
  auto pick = [](int64_t m, int64_t n, int64_t k) {
    return choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), 132);
  };
  EXPECT_FALSE(pick(16384, 8192, 2048).pingpong);  // 32 k-blocks
  EXPECT_FALSE(pick(1024, 2048, 512).pingpong);   // 128 tiles of 128x128: one wave
  EXPECT_FALSE(choose_config(make_desc(4096, 4100, 512, DType::kBFloat16, BLayout::kNK), 132).pingpong);  // no TMA store
  EXPECT_FALSE(choose_config(two_groups(4096, 4096, BLayout::kNK), 132).pingpong);
  // An SM budget counts: 16384x4096x512 on 100 SMs still >= 10 waves of 128x160 (3328 tiles)
  EXPECT_EQ(choose_config(make_desc(16384, 4096, 512, DType::kBFloat16, BLayout::kNK), 100).block_n, 160);
  EXPECT_EQ(choose_config(make_desc(1024, 2048, 512, DType::kBFloat16, BLayout::kNK), 64).stages, 6);  // 128 > 64 SMs
}

// The 80- and 48-column TMA-store tiles (2026-12-01): B [N, K] only, in clusters of 1 or 2, 7 and
// 9 stages only.
TEST(GemmValidation, N80N48TileRules) {
  expect_nk_only_tile_rules(80, 7);
  expect_nk_only_tile_rules(48, 9);
}

TEST(GemmValidation, N160N224TileRules) {
  expect_nk_only_tile_rules(160, 5);
  expect_nk_only_tile_rules(224, 3);
  // choose_config: 256 tiles of 160 columns in two waves against 224 of 192 (4096x1280x8192,
  // 1024x5120x8192); 128 tiles of 224 in one wave against 112 of 256 (1024x3584x4096); never for
  // B [K, N]; not where the 256 tile fills the waves.
  for (const auto& [m, n, k, bn] : {std::tuple<int64_t, int64_t, int64_t, int>{4096, 1280, 8192, 160},
                                    {1024, 5120, 8192, 160}, {1024, 3584, 4096, 224}}) {
    const GemmConfig c = choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), 132);
    EXPECT_EQ(c.block_n, bn) << m << "x" << n;
    EXPECT_NO_THROW(validate(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), c));
    const GemmConfig kn = choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kKN), 132);
    EXPECT_EQ(kn.block_n % 64, 0) << m << "x" << n;
  }
  EXPECT_EQ(choose_config(make_desc(8192, 4096, 4096, DType::kBFloat16, BLayout::kNK), 132).block_n, 256);
  // Multi-wave shapes (measured 2026-11-30): 160 over 128 (8192x1280x8192: 94 -> 98 %), not over
  // 256 (4096x7168x4096: 1 % slower), nor 224 over 256 (4096x8192x4096: 2 % slower).
  EXPECT_EQ(choose_config(make_desc(8192, 1280, 8192, DType::kBFloat16, BLayout::kNK), 132).block_n, 160);
  EXPECT_EQ(choose_config(make_desc(4096, 7168, 4096, DType::kBFloat16, BLayout::kNK), 132).block_n, 256);
  EXPECT_EQ(choose_config(make_desc(4096, 8192, 4096, DType::kBFloat16, BLayout::kNK), 132).block_n, 256);
}

// A config changed in its tile, epilogue, split-K or ping-pong, and the message each change must
// raise: `rule` followed by the variant's `what`.
struct ConfigVariant {
  int block_n, stages;
  bool tma_store;
  int split_k;
  bool pingpong;
  const char* what;
};
void expect_variants_invalid(const GemmDesc& d, const GemmConfig& base, const std::string& rule,
                             std::initializer_list<ConfigVariant> variants) {
  for (const ConfigVariant& v : variants) {
    GemmConfig bad = base;
    bad.block_n = v.block_n;
    bad.stages = v.stages;
    bad.tma_store = v.tma_store;
    bad.split_k = v.split_k;
    bad.pingpong = v.pingpong;
    expect_invalid(d, bad, (rule + v.what).c_str());
  }
}

// Ping-pong consumers (GemmConfig::pingpong): whole tiles of the 128x128x64/5 TMA-store tile,
// plain problems; choose_config does not pick them.
TEST(GemmValidation, PingpongRules) {
  const GemmDesc d = make_desc(4096, 4096, 512, DType::kBFloat16, BLayout::kKN);
  GemmConfig cfg{128, 128, 64, 5};
  cfg.tma_store = true;
  cfg.pingpong = true;
  EXPECT_NO_THROW(validate(d, cfg));
  cfg.cluster_m = 2;
  EXPECT_NO_THROW(validate(d, cfg));
  EXPECT_EQ(to_string(cfg), "block=128x128x64 stages=5 sms=0 order=row group_m=8 cluster=2 epilogue=tma_store pingpong");
  GemmConfig single = cfg;
  single.cluster_m = 1;
  expect_variants_invalid(d, single,
                          "pingpong is built for whole tiles of the 128x128x64/5, 128x128x64/6 and 128x160x64/5 "
                          "tiles with tma_store, not ",
                          {{256, 3, true, 1, true, "128x256x64/3"},
                           {128, 6, false, 1, true, "128x128x64/6 without tma_store"},
                           {128, 5, true, 2, true, "128x128x64/5 with split_k"}});
  // The opt-in sub-tile staging rings (2026-12-02): 128x128x64/6 (paired or not), 128x160x64/5
  // (B [N, K], unpaired).
  GemmConfig ring = single;
  ring.stages = 6;
  EXPECT_NO_THROW(validate(d, ring));
  ring.cluster_m = 2;
  EXPECT_NO_THROW(validate(d, ring));
  GemmConfig ring160 = single;
  ring160.block_n = 160;
  const GemmDesc nk = make_desc(4096, 4096, 512, DType::kBFloat16, BLayout::kNK);
  EXPECT_NO_THROW(validate(nk, ring160));
  ring160.cluster_m = 2;
  expect_invalid(nk, ring160, "pingpong on the 128x160 tile is built with cluster_m 1, not 2");
  ring160.cluster_m = 1;
  ring160.stages = 4;
  expect_invalid(nk, ring160, "tile 128x160x64 with 4 stages is not built with tma_store (built: 128x256x64/3, "
                              "128x224x64/3, 128x192x64/4, 128x160x64/5, 128x128x64/5, 128x96x64/7, 128x80x64/7, "
                              "128x64x64/8, 128x48x64/9)");
  // Grouped: the 6-stage ring only (2026-12-02).
  GemmConfig grouped = cfg;
  grouped.cluster_m = 1;
  expect_invalid(two_groups(256, 128, BLayout::kNK), grouped,
                 "pingpong in the grouped GEMM is built for the 128x128x64/6 tile with tma_store, not 128x128x64/5");
  grouped.stages = 6;
  EXPECT_NO_THROW(validate(two_groups(256, 128, BLayout::kNK), grouped));
  grouped.tma_store = false;
  expect_invalid(two_groups(256, 128, BLayout::kNK), grouped,
                 "pingpong in the grouped GEMM is built for the 128x128x64/6 tile with tma_store, not 128x128x64/6 "
                 "without tma_store");
  // choose_config takes it only for K <= 1024 with more 128x128 tiles than SMs
  // (ChooseConfigPingPongForShortK).
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 1024}, {4096, 4096, 4096},
                                {16384, 4096, 2048}})
    EXPECT_FALSE(choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), 132).pingpong) << m << "x" << n;
}

// CTA pairs along N (GemmConfig::cluster_n = 2): whole tiles of the 128x128 and 128x96 TMA-store
// tiles, plain problems, not with cluster_m 2, split-K or ping-pong; choose_config does not pick them.
TEST(GemmValidation, PairNRules) {
  const GemmDesc d = make_desc(1024, 1536, 4096, DType::kBFloat16, BLayout::kNK);
  GemmConfig cfg{128, 128, 64, 5};
  cfg.tma_store = true;
  cfg.cluster_n = 2;
  EXPECT_NO_THROW(validate(d, cfg));
  EXPECT_EQ(to_string(cfg), "block=128x128x64 stages=5 sms=0 order=row group_m=8 cluster=1 cluster_n=2 epilogue=tma_store");
  GemmConfig n96 = cfg;
  n96.block_n = 96;
  n96.stages = 7;
  EXPECT_NO_THROW(validate(d, n96));
  expect_variants_invalid(d, cfg,
                          "cluster_n 2 is built for whole tiles of the 128x128x64/5 and 128x96x64/7 tiles with "
                          "tma_store, not ",
                          {{256, 3, true, 1, false, "128x256x64/3"},
                           {192, 4, true, 1, false, "128x192x64/4"},
                           {128, 6, false, 1, false, "128x128x64/6 without tma_store"},
                           {128, 5, true, 2, false, "128x128x64/5 with split_k"},
                           {128, 5, true, 1, true, "128x128x64/5 with pingpong"}});
  GemmConfig both = cfg;
  both.cluster_m = 2;
  expect_invalid(d, both, "cluster_n 2 with cluster_m 2 (2x2 clusters) is not built");
  GemmConfig four = cfg;
  four.cluster_n = 4;
  expect_invalid(d, four, "cluster_n 4 must be 1 or 2");
  expect_invalid(two_groups(256, 128, BLayout::kNK), cfg, "cluster_n 2 is not supported by the grouped GEMM (1 only)");
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1024, 1280, 8192}, {1024, 1536, 4096},
                                {4096, 4096, 4096}})
    EXPECT_EQ(choose_config(make_desc(m, n, k, DType::kBFloat16, BLayout::kNK), 132).cluster_n, 1) << m << "x" << n;
}

TEST(GemmValidation, RejectsMisalignedPointers) {
  CCFUSE_REQUIRE_GPUS(1);
  GemmDesc d;
  d.m = d.n = d.k = 64;
  void* buf = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
  try {
    run(d, choose_config(d, 0), static_cast<char*>(buf) + 2, buf, buf, nullptr);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("A ("), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("must be 16-byte aligned (TMA)"), std::string::npos) << e.what();
  }
  cudaFree(buf);
}

// Copies A's row bands into place one at a time, slowly, and publishes each on its signal.
__global__ void publish_rows_slowly(comm::DeviceSignals sig, const uint16_t* src, uint16_t* dst, int64_t k,
                                    int64_t rows_per_band, int num_bands, int64_t m, uint64_t delay_ns) {
  const epoch_t epoch = comm::current_epoch(sig);
  if (threadIdx.x == 0) {  // let the GEMM start and block on its first tiles
    const uint64_t t0 = comm::global_timer_ns();
    while (comm::global_timer_ns() - t0 < 20 * delay_ns) {
    }
  }
  __syncthreads();
  for (int i = 0; i < num_bands; ++i) {
    const int band = (i * 7) % num_bands;  // out of order on purpose (num_bands not a multiple of 7)
    const int64_t r0 = band * rows_per_band, r1 = min(m, r0 + rows_per_band);
    for (int64_t e = r0 * k + threadIdx.x; e < r1 * k; e += blockDim.x) dst[e] = src[e];
    __syncthreads();
    if (threadIdx.x == 0) {
      comm::notify(sig, sig.rank, band, epoch);
      const uint64_t t0 = comm::global_timer_ns();
      while (comm::global_timer_ns() - t0 < delay_ns) {
      }
    }
    __syncthreads();
  }
}

TEST(GemmReadyPredicate, TilesWaitForRowsPublishedByAnotherStream) {
  CCFUSE_REQUIRE_GPUS(1);
  comm::run_local_world({0}, [](comm::Team& team) {
    using Traits = sm90::Traits<cutlass::bfloat16_t, 128, 256, 64, 4, true>;
    GemmDesc d;
    d.m = 2000;
    d.n = 3072;
    d.k = 1024;
    d.b_layout = BLayout::kNK;
    const int m_tiles = int(ceil_div(d.m, 128));
    auto sig = team.make_signals("test.gemm_ready", m_tiles);
    for (int call = 0; call < 3; ++call) {
      std::random_device rd;
      const uint64_t seed = rd();
      SCOPED_TRACE(detail::str_cat("seed ", seed, " call ", call));
      Problem prob(d, seed);
      uint16_t* staged = nullptr;  // the rows as they will arrive; A itself starts as NaN
      CCFUSE_CUDA_CHECK(cudaMalloc(&staged, size_t(d.m * d.k) * 2));
      CCFUSE_CUDA_CHECK(cudaMemcpy(staged, prob.a, size_t(d.m * d.k) * 2, cudaMemcpyDeviceToDevice));
      CCFUSE_CUDA_CHECK(cudaMemset(prob.a, 0xff, size_t(d.m * d.k) * 2));
      cudaStream_t gemm_stream, copy_stream;
      cudaEvent_t begun;
      CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&gemm_stream, cudaStreamNonBlocking));
      CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
      CCFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&begun, cudaEventDisableTiming));
      CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
      sig->begin_call(gemm_stream);
      CCFUSE_CUDA_CHECK(cudaEventRecord(begun, gemm_stream));
      CCFUSE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream, begun));
      sm90::SignalReadySchedule sched;
      sched.base = sm90::plain_schedule(d.m, d.n, 128, 256, 8, false);
      sched.sig = sig->device();
      // NOTE: the copy kernel is launched first. Launched after the persistent GEMM (128 of 132
      // SMs) it did not start until the GEMM had finished, so every tile wait timed out
      // (seen on H200, 2026-11-29): a kernel that the GEMM waits on must be resident first.
      publish_rows_slowly<<<1, 512, 0, copy_stream>>>(sig->device(), staged, static_cast<uint16_t*>(prob.a), d.k, 128,
                                                      m_tiles, d.m, 50000);
      CCFUSE_CUDA_CHECK_LAUNCH();
      sm90::launch_gemm<Traits>(d.m, d.n, d.k, prob.a, d.k, prob.b, d.k, prob.c, d.n, sched, sm90::PlainEpilogue{}, 128,
                                gemm_stream);
      CCFUSE_CUDA_CHECK(cudaStreamSynchronize(copy_stream));
      team.synchronize(gemm_stream);
      EXPECT_LE(prob.rel_err(), 1e-2);
      cudaFree(staged);
      cudaEventDestroy(begun);
      cudaStreamDestroy(gemm_stream);
      cudaStreamDestroy(copy_stream);
    }
  });
}

// ---- fused epilogues ------------------------------------------------------------------------

// ‖got − want‖ / ‖want‖ of a bf16 output [rows, cols] with row stride ldc.
double rel_err_bf16(const void* c, int64_t rows, int64_t cols, int64_t ldc, const std::vector<double>& want) {
  std::vector<uint16_t> hc(size_t(rows * ldc));
  CCFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), c, hc.size() * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const double v = bf16{hc[size_t(r * ldc + j)]}.to_float(), w = want[size_t(r * cols + j)];
      if (!std::isfinite(v)) return INFINITY;
      num += (v - w) * (v - w);
      den += w * w;
    }
  return std::sqrt(num / den);
}

std::vector<double> host_ref(const Problem& p) {
  std::vector<double> r(size_t(p.desc.m * p.desc.n));
  CCFUSE_CUDA_CHECK(cudaMemcpy(r.data(), p.ref, r.size() * sizeof(double), cudaMemcpyDeviceToHost));
  return r;
}

TEST(GemmFusedEpilogue, SwigluColumnPermutationPairsGateWithUp) {
  const auto perm = swiglu_column_permutation(/*ffn=*/384, /*block_n=*/256);
  ASSERT_EQ(perm.size(), 768u);
  std::vector<int> seen(768, 0);
  for (size_t i = 0; i < perm.size(); ++i) ++seen[size_t(perm[i])];
  for (int v : seen) EXPECT_EQ(v, 1);
  // Output column c of tile t: gate at GEMM column t*256 + c, up at t*256 + 128 + c.
  for (int64_t c = 0; c < 384; ++c) {
    const int64_t t = c / 128, cc = c % 128;
    EXPECT_EQ(perm[size_t(t * 256 + cc)], c);
    EXPECT_EQ(perm[size_t(t * 256 + 128 + cc)], 384 + c);
  }
  EXPECT_THROW(swiglu_column_permutation(100, 256), InvalidArgument);
}

class GemmFusedEpilogue : public ::testing::TestWithParam<std::tuple<int, BLayout>> {};

TEST_P(GemmFusedEpilogue, ActivationsAndRowScaleMatchFp64) {
  CCFUSE_REQUIRE_GPUS(1);
  const auto [block_n, layout] = GetParam();
  GemmDesc d;
  d.m = 1000;
  d.n = 3 * block_n;  // SwiGLU: whole tiles of [gate | up]
  d.k = 776;
  d.b_layout = layout;
  GemmConfig cfg = block_n == 256 ? GemmConfig{128, 256, 64, 4, 0} : GemmConfig{128, 128, 64, 6, 0};
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed));
  Problem prob(d, seed);
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> ref = host_ref(prob);
  std::vector<float> scale(size_t(d.m));
  std::mt19937_64 gen(seed);
  for (auto& x : scale) x = std::uniform_real_distribution<float>(0.f, 2.f)(gen);
  float* scale_dev = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&scale_dev, scale.size() * 4));
  CCFUSE_CUDA_CHECK(cudaMemcpy(scale_dev, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice));
  auto gelu = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  auto silu = [](double x) { return x / (1 + std::exp(-x)); };
  for (EpilogueOp op : {EpilogueOp::kNone, EpilogueOp::kGelu, EpilogueOp::kSiluMul})
    for (bool scaled : {false, true}) {
      SCOPED_TRACE(detail::str_cat("op ", int(op), " scaled ", scaled));
      const int64_t out_n = op == EpilogueOp::kSiluMul ? d.n / 2 : d.n;
      std::vector<double> want(size_t(d.m * out_n));
      for (int64_t r = 0; r < d.m; ++r)
        for (int64_t c = 0; c < out_n; ++c) {
          double v;
          if (op == EpilogueOp::kSiluMul) {
            const int64_t t = c / (block_n / 2), cc = c % (block_n / 2);
            v = silu(ref[size_t(r * d.n + t * block_n + cc)]) * ref[size_t(r * d.n + t * block_n + block_n / 2 + cc)];
          } else {
            v = ref[size_t(r * d.n + c)];
            if (op == EpilogueOp::kGelu) v = gelu(v);
          }
          want[size_t(r * out_n + c)] = scaled ? v * scale[size_t(r)] : v;
        }
      CCFUSE_CUDA_CHECK(cudaMemset(prob.c, 0xff, size_t(d.m * d.n) * 2));
      run_fused(d, cfg, EpilogueDesc{op, scaled ? scale_dev : nullptr}, prob.a, prob.b, prob.c, nullptr);
      CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_LE(rel_err_bf16(prob.c, d.m, out_n, out_n, want), 1e-2);
    }
  cudaFree(scale_dev);
}

INSTANTIATE_TEST_SUITE_P(Tiles, GemmFusedEpilogue,
                         ::testing::Combine(::testing::Values(256, 128), ::testing::Values(BLayout::kNK, BLayout::kKN)));

// Row bands of the output land in "peer" buffers (here: W local buffers) at the given slot.
TEST(GemmPeerBandEpilogue, BandsLandInTheirRanksSlot) {
  CCFUSE_REQUIRE_GPUS(1);
  using Traits = sm90::Traits<cutlass::bfloat16_t, 128, 256, 64, 4, true>;
  constexpr int kRanks = 3, kSlot = 1;
  GemmDesc d;
  d.m = kRanks * 256;  // bands of 256 rows: tiles never straddle bands
  d.n = 520;
  d.k = 264;
  d.b_layout = BLayout::kNK;
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed));
  Problem prob(d, seed);
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> ref = host_ref(prob);
  sm90::PeerBandEpilogue<cutlass::bfloat16_t> epi;
  std::vector<void*> bufs(kRanks);
  const int64_t rows_per_band = d.m / kRanks, buf_rows = kRanks * rows_per_band;
  for (int r = 0; r < kRanks; ++r) {
    CCFUSE_CUDA_CHECK(cudaMalloc(&bufs[size_t(r)], size_t(buf_rows * d.n) * 2));
    CCFUSE_CUDA_CHECK(cudaMemset(bufs[size_t(r)], 0xff, size_t(buf_rows * d.n) * 2));
    epi.peers[r] = static_cast<cutlass::bfloat16_t*>(bufs[size_t(r)]);
  }
  epi.rows_per_band = rows_per_band;
  epi.ldc = d.n;
  epi.slot = kSlot;
  const auto sched = sm90::plain_schedule(d.m, d.n, 128, 256, 8, false);
  sm90::launch_gemm<Traits>(d.m, d.n, d.k, prob.a, d.k, prob.b, d.k, prob.c, d.n, sched, epi, 132, nullptr);
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<double> want(ref.begin() + r * rows_per_band * d.n, ref.begin() + (r + 1) * rows_per_band * d.n);
    const void* slot_ptr = static_cast<const uint16_t*>(bufs[size_t(r)]) + kSlot * rows_per_band * d.n;
    EXPECT_LE(rel_err_bf16(slot_ptr, rows_per_band, d.n, d.n, want), 1e-2) << "band " << r;
    std::vector<uint16_t> other(size_t(rows_per_band * d.n));
    CCFUSE_CUDA_CHECK(cudaMemcpy(other.data(), bufs[size_t(r)], other.size() * 2, cudaMemcpyDeviceToHost));
    for (uint16_t v : other) ASSERT_EQ(v, 0xffff) << "slot 0 of rank " << r << " was written";
  }
  for (void* b : bufs) cudaFree(b);
}

// ---- grouped GEMM ----------------------------------------------------------------------------

struct GroupedCase {
  std::string name;
  std::vector<int> rows;  // per group; may be 0
  int64_t n, k;
  BLayout layout;
  int block_n;
  int64_t extra_capacity;  // max_rows = sum(rows) + this; negative: overflow on purpose
  bool tma_store = false;  // the TMA-store epilogue (passed on 2x H200 2026-11-30)
  bool pingpong = false;   // ping-pong consumers on 128x128x64/6 (the staging ring; tma_store)
  int num_sms = 0;         // the persistent grid (0: every SM)
};

void PrintTo(const GroupedCase& c, std::ostream* os) { *os << c.name; }

class GroupedGemm : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(GroupedGemm, EveryGroupMatchesItsOwnFp64Gemm) {
  CCFUSE_REQUIRE_GPUS(1);
  const GroupedCase gc = GetParam();
  int64_t total = 0;
  for (int r : gc.rows) total += r;
  GroupedGemmDesc d;
  d.num_groups = int(gc.rows.size());
  d.max_rows = total + gc.extra_capacity;
  d.n = gc.n;
  d.k = gc.k;
  d.b_layout = gc.layout;
  GemmConfig cfg = choose_config(d, 0);
  if (gc.block_n == 128) cfg = GemmConfig{128, 128, 64, 6, cfg.num_sms};
  if (gc.block_n == 256) cfg = GemmConfig{128, 256, 64, 4, cfg.num_sms};
  if (gc.tma_store) {
    cfg.tma_store = true;
    cfg.stages = cfg.block_n == 256 ? 3 : 5;
  }
  if (gc.pingpong) cfg = GemmConfig{128, 128, 64, 6};
  if (gc.pingpong) {
    cfg.tma_store = true;
    cfg.pingpong = true;
  }
  if (gc.num_sms > 0) cfg.num_sms = gc.num_sms;
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " config ", to_string(cfg)));
  // One big random problem: A [max_rows, K], B [G, ...], C [max_rows + guard, N].
  constexpr int64_t kGuardRows = 8;
  GemmDesc whole;
  whole.m = d.max_rows + kGuardRows;
  whole.n = d.n;
  whole.k = d.k;
  whole.b_layout = d.b_layout;
  Problem big(whole, seed);  // its A and C; B is re-made per group below
  __nv_bfloat16* b_all = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&b_all, size_t(d.num_groups) * d.n * d.k * 2));
  {
    std::mt19937_64 gen(seed + 1);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<uint16_t> hb(size_t(d.num_groups) * d.n * d.k);
    for (auto& x : hb) x = bf16::from_float(dist(gen)).bits;
    CCFUSE_CUDA_CHECK(cudaMemcpy(b_all, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  }
  int* rows_dev = nullptr;
  int* overflow = nullptr;
  void* ws = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&rows_dev, gc.rows.size() * sizeof(int)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&overflow, sizeof(int)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&ws, grouped_workspace_bytes(d)));
  CCFUSE_CUDA_CHECK(cudaMemcpy(rows_dev, gc.rows.data(), gc.rows.size() * sizeof(int), cudaMemcpyHostToDevice));
  grouped_run(d, cfg, big.a, b_all, big.c, rows_dev, ws, overflow, nullptr);
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  int dropped = -1;
  CCFUSE_CUDA_CHECK(cudaMemcpy(&dropped, overflow, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(dropped, int(std::max<int64_t>(0, total - d.max_rows)));

  // fp64 reference, group by group (rows past max_rows are dropped, as the kernel does).
  const bool nk = d.b_layout == BLayout::kNK;
  int64_t off = 0;
  for (int g = 0; g < d.num_groups; ++g) {
    const int64_t r = std::min<int64_t>(gc.rows[size_t(g)], d.max_rows - off);
    if (r > 0) {
      const dim3 block(16, 16), grid(unsigned((d.n + 15) / 16), unsigned((r + 15) / 16));
      reference_gemm<<<grid, block>>>(static_cast<const __nv_bfloat16*>(big.a) + off * d.k, d.k,
                                      b_all + size_t(g) * d.n * d.k, nk ? d.k : d.n, nk, big.ref + off * d.n, r, d.n, d.k);
      CCFUSE_CUDA_CHECK_LAUNCH();
      off += r;
    }
  }
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  // Compare the rows the groups own; the rows after them (and the guard rows) must still be poison.
  std::vector<uint16_t> hc(size_t(whole.m * d.n));
  std::vector<double> hr(size_t(whole.m * d.n));
  CCFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), big.c, hc.size() * 2, cudaMemcpyDeviceToHost));
  CCFUSE_CUDA_CHECK(cudaMemcpy(hr.data(), big.ref, hr.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < off * d.n; ++i) {
    const double v = bf16{hc[size_t(i)]}.to_float();
    ASSERT_TRUE(std::isfinite(v)) << "unwritten output at row " << i / d.n;
    num += (v - hr[size_t(i)]) * (v - hr[size_t(i)]);
    den += hr[size_t(i)] * hr[size_t(i)];
  }
  for (int64_t i = off * d.n; i < whole.m * d.n; ++i)
    ASSERT_EQ(hc[size_t(i)], 0xffff) << "row " << i / d.n << " past the groups was written";
  if (off > 0) EXPECT_LE(std::sqrt(num / den), 1e-2);
  cudaFree(b_all);
  cudaFree(rows_dev);
  cudaFree(overflow);
  cudaFree(ws);
}

std::vector<GroupedCase> grouped_cases() {
  std::vector<GroupedCase> out;
  for (BLayout l : {BLayout::kKN, BLayout::kNK})
    for (int bn : {256, 128}) {
      const std::string suffix = std::string("_") + b_layout_name(l) + "_bn" + std::to_string(bn);
      out.push_back({"mixed" + suffix, {0, 1, 127, 128, 129, 500, 0, 1000}, 512, 256, l, bn, 0});
      out.push_back({"one_group_takes_all" + suffix, {0, 0, 3000, 0}, 768, 520, l, bn, 64});
    }
  // Zipf-like skew over 64 experts, some empty.
  std::vector<int> zipf;
  for (int e = 0; e < 64; ++e) zipf.push_back(e % 9 == 4 ? 0 : int(4000 / (e + 1)));
  out.push_back({"zipf64_kn", zipf, 768, 2048, BLayout::kKN, 0, 0});
  out.push_back({"all_empty", {0, 0, 0}, 256, 128, BLayout::kKN, 0, 16});
  out.push_back({"overflow_drops_rows", {300, 300, 300}, 256, 128, BLayout::kKN, 256, -200});
  // The TMA-store epilogue: whole tiles by TMA, cut ones (a group's last) from registers; the rows
  // past the groups must stay poison.
  for (BLayout l : {BLayout::kKN, BLayout::kNK})
    for (int bn : {256, 128}) {
      const std::string suffix = std::string("_") + b_layout_name(l) + "_bn" + std::to_string(bn) + "_tma";
      out.push_back({"mixed" + suffix, {0, 1, 127, 128, 129, 500, 0, 1000}, 512, 256, l, bn, 0, true});
    }
  out.push_back({"zipf64_kn_tma", zipf, 768, 2048, BLayout::kKN, 256, 0, true});
  out.push_back({"overflow_drops_rows_tma", {300, 300, 300}, 256, 128, BLayout::kKN, 256, -200, true});
  out.push_back({"one_group_takes_all_nk_tma", {0, 0, 3000, 0}, 768, 520, BLayout::kNK, 128, 64, true});
  // Ping-pong consumers (2026-12-02): whole tiles through each warpgroup's staging slot, cut ones
  // from registers; few SMs so that every CTA alternates its warpgroups over many tiles, an odd
  // number of tiles on some CTAs.
  for (BLayout l : {BLayout::kKN, BLayout::kNK}) {
    const std::string suffix = std::string("_") + b_layout_name(l) + "_pingpong";
    out.push_back({"mixed" + suffix, {0, 1, 127, 128, 129, 500, 0, 1000}, 512, 256, l, 128, 0, true, true});
    out.push_back({"mixed_5sms" + suffix, {0, 1, 127, 128, 129, 500, 0, 1000}, 384, 768, l, 128, 0, true, true, 5});
  }
  out.push_back({"zipf64_kn_pingpong", zipf, 768, 2048, BLayout::kKN, 128, 0, true, true});
  out.push_back({"overflow_drops_rows_pingpong", {300, 300, 300}, 256, 128, BLayout::kKN, 128, -200, true, true});
  out.push_back({"one_group_takes_all_nk_pingpong", {0, 0, 3000, 0}, 768, 520, BLayout::kNK, 128, 64, true, true, 3});
  out.push_back({"all_empty_pingpong", {0, 0, 0}, 256, 128, BLayout::kKN, 128, 16, true, true});
  // 70 groups: the prefix warp's carry across three steps of 32 groups, and rows dropped past
  // max_rows from a group of the third step on (the cut group partly kept, the later ones empty).
  std::vector<int> seventy;
  for (int g = 0; g < 70; ++g) seventy.push_back(g % 7 == 3 ? 0 : 37 + (g * 13) % 100);
  out.push_back({"overflow_past_32_groups_tma", seventy, 256, 128, BLayout::kKN, 128, -250, true});
  out.push_back({"seventy_groups_nk", seventy, 256, 192, BLayout::kNK, 256, 0});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Groups, GroupedGemm, ::testing::ValuesIn(grouped_cases()),
                         [](const ::testing::TestParamInfo<GroupedCase>& i) { return i.param.name; });

// ---- K-grouped GEMM (the weight gradients) ---------------------------------------------------

// C_g[i, j] = sum over the group's rows r of A[r, i] B[r, j], fp64; C [groups, m, n].
template <class E>
__global__ void reference_kgrouped(const E* a, const E* b, const int64_t* offs, int groups, int64_t m, int64_t n,
                                   double* c) {
  const int64_t i = blockIdx.y * int64_t(blockDim.y) + threadIdx.y;
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int g = int(blockIdx.z);
  if (i >= m || j >= n || g >= groups) return;
  double acc = 0;
  for (int64_t r = offs[g]; r < offs[g + 1]; ++r)
    acc += ccfuse::testing::to_double(a[r * m + i]) * ccfuse::testing::to_double(b[r * n + j]);
  c[(int64_t(g) * m + i) * n + j] = acc;
}

struct KGroupedCase {
  std::string name;
  std::vector<int> rows;  // per group; may be 0
  int64_t m, n;
  int block_n;            // 256 or 128 (cooperative), 6 = the 128x128x64/6 ping-pong ring; 0 = choose_config's
  int64_t extra_capacity;  // max_rows = sum(rows) + this; negative: rows dropped on purpose
  DType dtype = DType::kBFloat16;
  int num_sms = 0;
  // 0: C = A^T B (bf16/fp16); 1: C (fp32) += A^T B by TMA reduce-adds (the default); 2: the same
  // by load-add-store (CCFUSE_KGROUPED_ACCUM=rmw); 3: by red.global.add (=red). block_n 256 / 128
  // then name the register tiles /4 and /6.
  int accumulate = 0;
};
void PrintTo(const KGroupedCase& c, std::ostream* os) { *os << c.name; }
class KGroupedGemm : public ::testing::TestWithParam<KGroupedCase> {};

// Every group's C against its fp64 sum; A and B rows past the kept ones are NaN (a tail k-block
// that read them unzeroed would poison its group), C starts as NaN (every element must be
// written: a group without rows gets zeros). Accumulating: C (fp32) starts as fresh random values
// c0 and must end as c0 + the sum within fp32's accuracy (a bf16 rounding on the way would miss it
// 10x), a group without rows bit-equal to c0, and the NaN guard after C untouched.
TEST_P(KGroupedGemm, EveryGroupMatchesItsFp64Sum) {
  CCFUSE_REQUIRE_GPUS(1);
  const KGroupedCase kc = GetParam();
  int64_t total = 0;
  for (int r : kc.rows) total += r;
  KGroupedGemmDesc d;
  d.num_groups = int(kc.rows.size());
  d.max_rows = total + kc.extra_capacity;
  d.m = kc.m;
  d.n = kc.n;
  d.dtype = kc.dtype;
  d.accumulate = kc.accumulate != 0;
  GemmConfig cfg = choose_config(d, kc.num_sms);
  if (d.accumulate) {
    if (kc.block_n == 256) cfg = GemmConfig{128, 256, 64, 4, kc.num_sms};
    if (kc.block_n == 128) cfg = GemmConfig{128, 128, 64, 6, kc.num_sms};
    ASSERT_FALSE(cfg.tma_store);
  } else {
    if (kc.block_n == 256) cfg = GemmConfig{128, 256, 64, 3, kc.num_sms};
    if (kc.block_n == 128) cfg = GemmConfig{128, 128, 64, 5, kc.num_sms};
    if (kc.block_n == 6) {
      cfg = GemmConfig{128, 128, 64, 6, kc.num_sms};
      cfg.pingpong = true;
    }
    cfg.tma_store = true;
  }
  const char* accum_env = "CCFUSE_KGROUPED_ACCUM";
  if (kc.accumulate == 2) setenv(accum_env, "rmw", 1);
  else if (kc.accumulate == 3) setenv(accum_env, "red", 1);
  else unsetenv(accum_env);
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " config ", to_string(cfg)));
  // The rows each group keeps (the kernel drops those past max_rows) and their offsets.
  std::vector<int64_t> offs(size_t(d.num_groups) + 1, 0);
  for (int g = 0; g < d.num_groups; ++g)
    offs[size_t(g) + 1] = std::min<int64_t>(offs[size_t(g)] + kc.rows[size_t(g)], d.max_rows);
  const int64_t kept = offs.back();
  auto ha = ccfuse::testing::random_16(d.dtype, seed, 1, size_t(d.max_rows * d.m));
  auto hb = ccfuse::testing::random_16(d.dtype, seed, 2, size_t(d.max_rows * d.n));
  std::fill(ha.begin() + kept * d.m, ha.end(), uint16_t(0xffff));
  std::fill(hb.begin() + kept * d.n, hb.end(), uint16_t(0xffff));
  const size_t nc = size_t(d.num_groups) * d.m * d.n;
  const size_t c_size = d.accumulate ? 4 : 2, guard = 1024;  // guard: fp32 NaNs after C (accumulate)
  void *a = nullptr, *b = nullptr, *c = nullptr, *ws = nullptr;
  double* ref = nullptr;
  int64_t* offs_dev = nullptr;
  int *rows_dev = nullptr, *overflow = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&a, ha.size() * 2));
  CCFUSE_CUDA_CHECK(cudaMalloc(&b, hb.size() * 2));
  CCFUSE_CUDA_CHECK(cudaMalloc(&c, nc * c_size + guard * 4));
  CCFUSE_CUDA_CHECK(cudaMalloc(&ref, nc * sizeof(double)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&offs_dev, offs.size() * sizeof(int64_t)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&rows_dev, kc.rows.size() * sizeof(int)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&overflow, sizeof(int)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&ws, kgrouped_workspace_bytes(d)));
  CCFUSE_CUDA_CHECK(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  CCFUSE_CUDA_CHECK(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  std::vector<float> c0;
  if (d.accumulate) {
    std::mt19937_64 gen(seed ^ 0x5eed);
    std::uniform_real_distribution<float> dist(-4.f, 4.f);
    c0.resize(nc);
    for (float& v : c0) v = dist(gen);
    c0.resize(nc + guard, std::numeric_limits<float>::quiet_NaN());
    CCFUSE_CUDA_CHECK(cudaMemcpy(c, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice));
  } else {
    CCFUSE_CUDA_CHECK(cudaMemset(c, 0xff, nc * 2));
  }
  CCFUSE_CUDA_CHECK(cudaMemset(overflow, 0xff, sizeof(int)));
  CCFUSE_CUDA_CHECK(cudaMemcpy(offs_dev, offs.data(), offs.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  CCFUSE_CUDA_CHECK(cudaMemcpy(rows_dev, kc.rows.data(), kc.rows.size() * sizeof(int), cudaMemcpyHostToDevice));
  kgrouped_run(d, cfg, a, b, c, rows_dev, ws, overflow, nullptr);
  unsetenv(accum_env);
  const dim3 block(16, 16), grid(unsigned((d.n + 15) / 16), unsigned((d.m + 15) / 16), unsigned(d.num_groups));
  if (d.dtype == DType::kBFloat16)
    reference_kgrouped<<<grid, block>>>(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b),
                                        offs_dev, d.num_groups, d.m, d.n, ref);
  else
    reference_kgrouped<<<grid, block>>>(static_cast<const __half*>(a), static_cast<const __half*>(b), offs_dev,
                                        d.num_groups, d.m, d.n, ref);
  CCFUSE_CUDA_CHECK_LAUNCH();
  CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  int dropped = -1;
  CCFUSE_CUDA_CHECK(cudaMemcpy(&dropped, overflow, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(dropped, int(total - kept));
  std::vector<uint16_t> hc(d.accumulate ? 0 : nc);
  std::vector<float> hc32(d.accumulate ? nc + guard : 0);
  std::vector<double> hr(nc);
  if (d.accumulate) CCFUSE_CUDA_CHECK(cudaMemcpy(hc32.data(), c, hc32.size() * 4, cudaMemcpyDeviceToHost));
  else CCFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), c, nc * 2, cudaMemcpyDeviceToHost));
  CCFUSE_CUDA_CHECK(cudaMemcpy(hr.data(), ref, nc * sizeof(double), cudaMemcpyDeviceToHost));
  const size_t per = size_t(d.m * d.n);
  for (int g = 0; g < d.num_groups; ++g) {
    const bool empty = offs[size_t(g) + 1] == offs[size_t(g)];
    double num = 0, den = 0;
    for (size_t i = size_t(g) * per; i < size_t(g + 1) * per; ++i) {
      // accumulate: what the kernel added (c0 subtracted in fp64: exact for these magnitudes' sum)
      const double v = d.accumulate ? double(hc32[i]) - double(c0[i]) : ccfuse::testing::value_of_16(d.dtype, hc[i]);
      ASSERT_TRUE(std::isfinite(v)) << "group " << g << " element " << i - size_t(g) * per << " (rows "
                                    << offs[size_t(g) + 1] - offs[size_t(g)] << ") not finite";
      if (empty && d.accumulate) ASSERT_EQ(hc32[i], c0[i]) << "group " << g << " has no rows: C must stay as it was";
      else if (empty) ASSERT_EQ(v, 0.0) << "group " << g << " has no rows";
      num += (v - hr[i]) * (v - hr[i]);
      den += hr[i] * hr[i];
    }
    // fp32 accumulation: ~sqrt(rows) x 2^-24 relative, plus c0's rounding (|c0| <= 4 vs the sum's
    // ~sqrt(rows) / 3): 1e-3 holds it; a bf16 rounding of the sum (2^-9) does not.
    if (den > 0) EXPECT_LE(std::sqrt(num / den), d.accumulate ? 1e-3 : 1e-2) << "group " << g;
  }
  for (size_t i = nc; i < hc32.size(); ++i)
    ASSERT_TRUE(std::isnan(hc32[i])) << "the kernel wrote " << i - nc << " elements past C";
  for (void* p : {a, b, c, ws, static_cast<void*>(ref), static_cast<void*>(offs_dev), static_cast<void*>(rows_dev),
                  static_cast<void*>(overflow)})
    cudaFree(p);
}

std::vector<KGroupedCase> kgrouped_cases() {
  std::vector<KGroupedCase> out;
  // Tails of every length class: none, 1, 63, 64 + 1, a group of one row, empty groups.
  const std::vector<int> mixed = {0, 1, 63, 64, 65, 200, 0, 1000, 128};
  for (int bn : {256, 128, 6}) {
    const std::string s = bn == 6 ? std::string("_pingpong") : "_bn" + std::to_string(bn);
    out.push_back({"mixed" + s, mixed, 256, 512, bn, 0});
    out.push_back({"mixed_fp16" + s, mixed, 256, 512, bn, 40, DType::kFloat16});
    // m and n cut by the tiles: rows past m from registers, columns past n clipped by TMA.
    out.push_back({"cut_m_n" + s, mixed, 200, 264, bn, 8});
    out.push_back({"few_sms" + s, mixed, 384, 768, bn, 0, DType::kBFloat16, 5});
  }
  std::vector<int> zipf;
  for (int e = 0; e < 64; ++e) zipf.push_back(e % 9 == 4 ? 0 : int(4000 / (e + 1)));
  out.push_back({"zipf64", zipf, 768, 1024, 0, 0});
  out.push_back({"all_empty", {0, 0, 0}, 256, 256, 0, 16});
  // The last group's tail reads the NaN rows past the kept ones: only the clearing keeps them out.
  out.push_back({"nan_after_last_tail", {100, 37}, 256, 256, 0, 64});
  out.push_back({"nan_after_last_tail_pingpong", {100, 37}, 256, 256, 6, 64});
  out.push_back({"overflow_drops_rows", {300, 300, 300}, 256, 256, 256, -200});
  std::vector<int> seventy;
  for (int g = 0; g < 70; ++g) seventy.push_back(g % 7 == 3 ? 0 : 37 + (g * 13) % 100);
  out.push_back({"overflow_past_32_groups", seventy, 128, 128, 128, -250});
  out.push_back({"overflow_past_32_groups_pingpong", seventy, 128, 128, 6, -250});
  out.push_back({"zipf64_pingpong_3sms", zipf, 256, 384, 6, 0, DType::kBFloat16, 3});
  // C (fp32) += A^T B: both register tiles, fp16, cut m and n, the NaN tail, dropped rows, the
  // load-add-store form.
  for (int bn : {256, 128}) {
    const std::string s = "_bn" + std::to_string(bn);
    out.push_back({"accum_mixed" + s, mixed, 256, 512, bn, 0, DType::kBFloat16, 0, 1});
    out.push_back({"accum_cut_m_n" + s, mixed, 200, 264, bn, 8, DType::kBFloat16, 0, 1});
    out.push_back({"accum_rmw_mixed" + s, mixed, 256, 512, bn, 0, DType::kBFloat16, 0, 2});
    out.push_back({"accum_red_cut_m_n" + s, mixed, 200, 264, bn, 8, DType::kBFloat16, 0, 3});
    // m = 56: a tile's second warpgroup has no rows of its group; m = 72: 8 of them (the map clips
    // the rest at the group, not at C's end).
    out.push_back({"accum_m56" + s, mixed, 56, 264, bn, 0, DType::kBFloat16, 0, 1});
    out.push_back({"accum_m72_n40" + s, mixed, 72, 40, bn, 0, DType::kBFloat16, 0, 1});
  }
  out.push_back({"accum_fp16_zipf64", zipf, 768, 1024, 0, 40, DType::kFloat16, 0, 1});
  out.push_back({"accum_nan_after_last_tail", {100, 37}, 256, 256, 0, 64, DType::kBFloat16, 0, 1});
  out.push_back({"accum_overflow_past_32_groups_3sms", seventy, 128, 128, 128, -250, DType::kBFloat16, 3, 1});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Groups, KGroupedGemm, ::testing::ValuesIn(kgrouped_cases()),
                         [](const ::testing::TestParamInfo<KGroupedCase>& i) { return i.param.name; });

TEST(GemmValidation, KGroupedRules) {
  KGroupedGemmDesc d;
  d.num_groups = 4;
  d.max_rows = 1000;
  d.m = 2048;
  d.n = 4096;  // 16 x 16 tiles of 128x256 a group
  const GemmConfig ok = choose_config(d, 0);
  EXPECT_NO_THROW(validate(d, ok));
  EXPECT_TRUE(ok.tma_store);
  EXPECT_FALSE(ok.pingpong);
  EXPECT_EQ(ok.block_n, 256);
  KGroupedGemmDesc narrow = d;
  narrow.n = 128;
  EXPECT_EQ(choose_config(narrow, 0).block_n, 128);
  EXPECT_FALSE(choose_config(narrow, 0).pingpong);
  // A group's 128x256 tiles on at most half the SMs: the ping-pong tile (132 SMs when num_sms is 0).
  KGroupedGemmDesc few = d;
  few.n = 768;  // 16 x 3 = 48 tiles a group
  const GemmConfig few_cfg = choose_config(few, 0);
  EXPECT_TRUE(few_cfg.pingpong && few_cfg.tma_store && few_cfg.block_n == 128 && few_cfg.stages == 6)
      << to_string(few_cfg);
  EXPECT_NO_THROW(validate(few, few_cfg));
  EXPECT_FALSE(choose_config(few, 64).pingpong);  // 48 tiles fill more than half of 64 SMs
  EXPECT_TRUE(choose_config(few, 96).pingpong);
  few.accumulate = true;  // not the accumulating form
  EXPECT_FALSE(choose_config(few, 0).pingpong);
  few.accumulate = false;
  setenv("CCFUSE_KGROUPED_TILE", "256", 1);  // the bench's switch overrides the rule
  EXPECT_FALSE(choose_config(few, 0).pingpong);
  unsetenv("CCFUSE_KGROUPED_TILE");
  auto invalid = [](const KGroupedGemmDesc& x, const GemmConfig& cfg, const char* message) {
    try {
      validate(x, cfg);
      ADD_FAILURE() << "accepted; expected: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  KGroupedGemmDesc bad = d;
  bad.m = 100;
  invalid(bad, ok, "m 100 must be a multiple of 8");
  bad = d;
  bad.n = 36;
  invalid(bad, ok, "n 36 must be a multiple of 8");
  bad = d;
  bad.num_groups = 0;
  invalid(bad, ok, "num_groups 0 must be at least 1");
  bad = d;
  bad.max_rows = 0;
  invalid(bad, ok, "max_rows 0 must be positive");
  bad = d;
  bad.dtype = DType::kFloat32;
  invalid(bad, ok, "is not supported by the GEMM engine");
  GemmConfig cfg = ok;
  cfg.pingpong = true;
  invalid(d, cfg, "is built for the TMA-store tiles");
  cfg = GemmConfig{128, 128, 64, 6};
  cfg.tma_store = true;
  cfg.pingpong = true;
  EXPECT_NO_THROW(validate(d, cfg));
  cfg = ok;
  cfg.tma_store = false;
  invalid(d, cfg, "without tma_store");
  cfg = GemmConfig{128, 192, 64, 4};
  cfg.tma_store = true;
  invalid(d, cfg, "is built for the TMA-store tiles");
  // Accumulating into fp32: the register tiles, never ping-pong (not even when the bench's switch asks).
  KGroupedGemmDesc acc = d;
  acc.accumulate = true;
  const GemmConfig acc_ok = choose_config(acc, 0);
  EXPECT_FALSE(acc_ok.tma_store);
  EXPECT_EQ(acc_ok.block_n, 256);
  EXPECT_EQ(acc_ok.stages, 4);
  EXPECT_NO_THROW(validate(acc, acc_ok));
  KGroupedGemmDesc acc_narrow = acc;
  acc_narrow.n = 128;
  EXPECT_EQ(choose_config(acc_narrow, 0).block_n, 128);
  EXPECT_EQ(choose_config(acc_narrow, 0).stages, 6);
  setenv("CCFUSE_KGROUPED_TILE", "pingpong", 1);
  const GemmConfig acc_switch = choose_config(acc, 0);
  unsetenv("CCFUSE_KGROUPED_TILE");
  EXPECT_FALSE(acc_switch.pingpong);
  EXPECT_NO_THROW(validate(acc, acc_switch));
  invalid(acc, ok, "the accumulating K-grouped GEMM (C fp32 +=) is built for the register-epilogue tiles");
  cfg = acc_ok;
  cfg.stages = 3;
  invalid(acc, cfg, "not block=128x256x64 stages=3");
  invalid(d, acc_ok, "without tma_store");
}

}  // namespace
}  // namespace ccfuse::gemm
