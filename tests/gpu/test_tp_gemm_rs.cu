// Fused GEMM + ReduceScatter and GEMM + AllReduce (v1) on all local GPUs (>= 2; skipped otherwise)
// against an fp64 reference of the sum of every rank's partial, which each rank computes itself
// from every rank's inputs (regenerated from the shared seed: it does not trust the exchange).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/tp/gemm_rs.h"
#include "gemm_reference.cuh"
#include "gpu_test_util.h"

namespace ccfuse::tp {
namespace {

using ccfuse::testing::all_devices;
using ccfuse::testing::reference_gemm;

using ccfuse::testing::random_16;
using ccfuse::testing::value_of_16;

struct Case {
  int64_t m, n, k;  // k: per rank
  gemm::BLayout layout;
  DType dtype;
  bool all_reduce;
  int cluster_m = 1;  // GemmRsConfig::cluster_m (2: 2-CTA clusters)
  bool overlap_entry = false;  // GemmRsConfig::overlap_entry (PDL after the entry barrier)
  bool tma_store = true;       // GemmRsConfig::tma_store (false: the register epilogue, v1)
  bool tma_addends = true;     // GemmRsConfig::tma_addends
  bool direct_store = false;   // GemmRsConfig::direct_store
  bool prefetch_addends = true;  // GemmRsConfig::prefetch_addends (the default)
  int forward_spread_us = 0;     // GemmRsConfig::forward_spread_us (0: unpaced; -1: auto, the default)
  bool early_handover = true;    // GemmRsConfig::early_handover (the default)
};

std::string case_name(const Case& c) {
  return detail::str_cat(c.all_reduce ? "ar_" : "rs_", c.m, "x", c.n, "x", c.k, "_", gemm::b_layout_name(c.layout), "_",
                         dtype_name(c.dtype), c.cluster_m != 1 ? detail::str_cat("_cluster", c.cluster_m) : "",
                         c.overlap_entry ? "_pdl" : "", c.tma_store ? "" : "_regs",
                         c.tma_store && !c.tma_addends ? "_ldaddends" : "", c.direct_store ? "_direct" : "",
                         c.prefetch_addends ? "" : "_nopf",
                         c.forward_spread_us > 0 ? detail::str_cat("_fwdspread", c.forward_spread_us)
                                                 : c.forward_spread_us < 0 ? "_fwdauto" : "",
                         c.early_handover ? "" : "_latehandover");
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

// Relative Frobenius error of C rows [row0, row0 + rows) against the reference; every element must
// be finite (outputs are poisoned with NaN before each call).
double rel_error(DType t, const std::vector<uint16_t>& c, const std::vector<double>& ref, int64_t row0, int64_t rows,
                 int64_t n, std::string* err) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < rows * n; ++i) {
    const double v = value_of_16(t, c[size_t(i)]), r = ref[size_t(row0 * n + i)];
    if (!std::isfinite(v)) {
      *err = detail::str_cat("unwritten or non-finite C at row ", i / n, " col ", i % n);
      return 1e30;
    }
    num += (v - r) * (v - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

class FusedGemmReduce : public ::testing::TestWithParam<Case> {};

TEST_P(FusedGemmReduce, MatchesFp64AcrossCallsBackToBackAndGraphs) {
  CCFUSE_REQUIRE_RANKS(2);
  const Case cs = GetParam();
  const int64_t world = int64_t(all_devices().size());
  if (cs.m % world != 0)
    GTEST_SKIP() << "m " << cs.m << " is not divisible by " << world << " ranks (the validation test covers the error)";
  if (cs.cluster_m == 2 && ((cs.m / world + 127) / 128) % 2 != 0)
    GTEST_SKIP() << "cluster_m 2 needs an even number of 128-row tiles per band: m " << cs.m << " over " << world
                 << " ranks does not give one (the validation test covers the error)";
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " case ", case_name(cs)));
  comm::run_local_world(all_devices(), [&](comm::Team& team) {
    const int w = team.world_size(), r = team.rank();
    GemmRsDesc d;
    d.m = cs.m;
    d.n = cs.n;
    d.k = cs.k;
    d.dtype = cs.dtype;
    d.b_layout = cs.layout;
    std::unique_ptr<GemmRs> rs;
    std::unique_ptr<GemmAr> ar;
    GemmRsConfig cfg;
    cfg.cluster_m = cs.cluster_m;
    cfg.overlap_entry = cs.overlap_entry;
    cfg.tma_store = cs.tma_store;
    cfg.tma_addends = cs.tma_addends;
    cfg.direct_store = cs.direct_store;
    cfg.prefetch_addends = cs.prefetch_addends;
    cfg.forward_spread_us = cs.forward_spread_us;
    cfg.early_handover = cs.early_handover;
    if (cs.all_reduce) ar = std::make_unique<GemmAr>(team, d, cfg);
    else rs = std::make_unique<GemmRs>(team, d, cfg);
    auto run = [&](const void* a, const void* b, void* c, cudaStream_t s) {
      if (ar) ar->run(a, b, c, s);
      else rs->run(a, b, c, s);
    };
    const int64_t m_local = d.m / w, out_rows = cs.all_reduce ? d.m : m_local;
    const int64_t out_row0 = cs.all_reduce ? 0 : r * m_local;
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *a, *b, *c, *pa, *pb;
    double* ref;
    CCFUSE_CUDA_CHECK(cudaMalloc(&a, size_t(d.m * d.k) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&b, size_t(d.k * d.n) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&c, size_t(out_rows * d.n) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&pa, size_t(d.m * d.k) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&pb, size_t(d.k * d.n) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&ref, size_t(d.m * d.n) * sizeof(double)));
    const bool nk = cs.layout == gemm::BLayout::kNK;
    std::vector<uint16_t> hc(size_t(out_rows * d.n));
    std::vector<double> hr(size_t(d.m * d.n));
    // Three calls with fresh inputs; GemmAr's last one writes into its symmetric output().
    for (int call = 0; call < 3; ++call) {
      const uint64_t call_seed = seed + 7919ull * call;
      for (int p = 0; p < w; ++p) {  // fp64 reference: sum over ranks of A_p @ B_p
        const auto ha = random_16(d.dtype, call_seed, uint64_t(p), size_t(d.m * d.k));
        const auto hb = random_16(d.dtype, call_seed, 1000 + uint64_t(p), size_t(d.k * d.n));
        CCFUSE_CUDA_CHECK(cudaMemcpy(pa, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        CCFUSE_CUDA_CHECK(cudaMemcpy(pb, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        const dim3 grid(unsigned((d.n + 15) / 16), unsigned((d.m + 15) / 16));
        if (d.dtype == DType::kBFloat16)
          reference_gemm<<<grid, dim3(16, 16)>>>(static_cast<const __nv_bfloat16*>(pa), d.k,
                                                 static_cast<const __nv_bfloat16*>(pb), nk ? d.k : d.n, nk, ref, d.m,
                                                 d.n, d.k, p > 0);
        else
          reference_gemm<<<grid, dim3(16, 16)>>>(static_cast<const __half*>(pa), d.k, static_cast<const __half*>(pb),
                                                 nk ? d.k : d.n, nk, ref, d.m, d.n, d.k, p > 0);
        CCFUSE_CUDA_CHECK_LAUNCH();
        if (p == r) {
          CCFUSE_CUDA_CHECK(cudaMemcpy(a, pa, ha.size() * 2, cudaMemcpyDeviceToDevice));
          CCFUSE_CUDA_CHECK(cudaMemcpy(b, pb, hb.size() * 2, cudaMemcpyDeviceToDevice));
        }
      }
      void* out = (ar && call == 2) ? ar->output() : c;
      CCFUSE_CUDA_CHECK(cudaMemset(out, 0xff, size_t(out_rows * d.n) * 2));  // NaN in bf16 and fp16
      CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // not the device: see gpu_test_util.h
      run(a, b, out, s);
      team.synchronize(s);
      CCFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), out, hc.size() * 2, cudaMemcpyDeviceToHost));
      CCFUSE_CUDA_CHECK(cudaMemcpy(hr.data(), ref, hr.size() * sizeof(double), cudaMemcpyDeviceToHost));
      std::string err;
      EXPECT_LE(rel_error(d.dtype, hc, hr, out_row0, out_rows, d.n, &err), 1e-2)
          << "rank " << r << " call " << call << " " << err;
      team.barrier(s);  // every rank has read its results before the next call overwrites them
      team.synchronize(s);
    }
    // Many calls back to back without host sync, then CUDA-graph replays: the result stays the
    // first call's (same inputs, deterministic reduction order).
    std::vector<uint16_t> first(hc.size()), again(hc.size());
    run(a, b, c, s);
    team.synchronize(s);
    CCFUSE_CUDA_CHECK(cudaMemcpy(first.data(), c, first.size() * 2, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 1000; ++i) run(a, b, c, s);  // issue 4: 1000 calls
    team.synchronize(s);
    CCFUSE_CUDA_CHECK(cudaMemcpy(again.data(), c, again.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(first == again) << "rank " << r << ": 1000 back-to-back calls changed the result";
    team.barrier(s);
    team.synchronize(s);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    run(a, b, c, s);
    CCFUSE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CCFUSE_CUDA_CHECK(cudaMemset(c, 0xff, hc.size() * 2));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // not the device: see gpu_test_util.h
    for (int i = 0; i < 50; ++i) CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    team.synchronize(s);
    CCFUSE_CUDA_CHECK(cudaMemcpy(again.data(), c, again.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(first == again) << "rank " << r << ": 50 graph replays changed the result";
    team.barrier(s);
    team.synchronize(s);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (void* p : {a, b, c, pa, pb}) cudaFree(p);
    cudaFree(ref);
    cudaStreamDestroy(s);
  });
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (bool ar : {false, true}) {
    v.push_back({512, 520, 776, gemm::BLayout::kNK, DType::kBFloat16, ar});  // N past the tile, K = 8 * 97
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar});  // bands of 500 rows (W = 2)
    v.push_back({48, 264, 64, gemm::BLayout::kKN, DType::kBFloat16, ar});     // M < 64
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar});
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 2});  // 2-CTA clusters (opt-in)
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 2});
    // PDL after the entry barrier (passed on 2x H200 2026-11-30)
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, true});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, true});
    // The TMA-store epilogue (the default) above: whole tiles through TMA (the own band's to C,
    // the peers' to the staging buffer), a band's cut last tile (bands of 500 and 24 rows) and
    // N % 8 != 0 (below) from registers. The register epilogue everywhere (v1, opt-out):
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, false, false});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, false, false});
    v.push_back({512, 260, 256, gemm::BLayout::kNK, DType::kBFloat16, ar});  // N % 8 != 0: registers
    // TMA stores with the addends loaded by each thread (tma_addends = false).
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, false, true, false});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, false, true, false});
    // Peer tiles stored by TMA straight into the owner's buffer (direct_store, opt-in); the
    // 500-row bands mix direct whole tiles with cut tiles through the send warps.
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, false, true, true, true});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, false, true, true, true});
    v.push_back({512, 520, 776, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, true, true, true, true});  // + PDL
    // The cases above load an own-band tile's first partial during its mainloop once its flag is
    // set (prefetch_addends, the default since 2026-11-30); here only after the mainloop, as before.
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, true, true, true, false, false});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, false, true, true, false, false});
    // Partials forwarded in paced slices (forward_spread_us): whole and cut tiles; and the default
    // (auto), which paces a GEMM of >= 3 waves of tiles (8192x4096: 7.8 waves on 132 SMs).
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, true, true, true, false, true, 20});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, false, false, true, false, true, 20});
    v.push_back({8192, 4096, 1024, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, true, true, true, false, true, -1});
    // The cases above hand a forwarded TMA-stored tile to the send warps 4 k-blocks into the next
    // mainloop (early_handover, the default since 2026-11-30 22:45, 12f6127); here after it, as before.
    v.push_back({4096, 3072, 2048, gemm::BLayout::kNK, DType::kBFloat16, ar, 1, true, true, true, false, true, 0, false});
    v.push_back({1000, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar, 1, false, true, true, false, true, 0, false});
    // World sizes that are not powers of two (one-GPU worlds of W = 3, 6): bands of 750 / 500 /
    // 375 / 250 rows at W = 2 / 3 / 4 / 6, and of 768 / 512 / 256 / 192 at W = 2 / 3 / 6 / 8.
    v.push_back({1500, 1024, 512, gemm::BLayout::kKN, DType::kFloat16, ar});
    v.push_back({1536, 3072, 1024, gemm::BLayout::kNK, DType::kBFloat16, ar});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedGemmReduce, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

template <class F>
void expect_invalid(F&& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no error, expected: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(FusedGemmReduceValidation, NamesTheArgumentAndTheRule) {
  CCFUSE_REQUIRE_RANKS(2);
  comm::run_local_world(all_devices(), [&](comm::Team& team) {
    const int w = team.world_size();
    GemmRsDesc d;
    d.m = 128 * w + 1;
    d.n = 256;
    d.k = 256;
    expect_invalid([&] { GemmRs op(team, d); },
                   detail::str_cat("gemm_rs: m ", d.m, " is not divisible by the world size ", w));
    d.m = 128 * w;
    d.world_size = w + 1;
    expect_invalid([&] { GemmAr op(team, d); },
                   detail::str_cat("gemm_ar: desc.world_size ", w + 1, " does not match the Team's world size ", w));
    d.world_size = 0;
    d.dtype = DType::kFloat32;
    expect_invalid([&] { GemmRs op(team, d); }, "gemm_rs: dtype must be bf16 or fp16, not fp32");
    d.dtype = DType::kBFloat16;
    d.k = 100;  // per-rank K: rows of A not 16-byte aligned
    expect_invalid([&] { GemmRs op(team, d); },
                   "k 100 must be a multiple of 8 for bf16 (TMA needs 16-byte aligned rows of A)");
    d.k = 256;
    d.n = 260;  // B [K, N] rows not 16-byte aligned: that layout cannot take this N
    d.b_layout = gemm::BLayout::kKN;
    expect_invalid([&] { GemmAr op(team, d); },
                   "n 260 must be a multiple of 8 for bf16 (TMA needs 16-byte aligned rows of B [K, N])");
    d.n = 256;
    d.b_layout = gemm::BLayout::kNK;
    d.m = 384 * w;  // 3 row tiles per band: no pairs
    GemmRsConfig cfg;
    cfg.cluster_m = 2;
    expect_invalid([&] { GemmRs op(team, d, cfg); },
                   "gemm_rs: cluster_m 2 needs an even number of 128-row tiles per band (m / world_size = 384 gives 3)");
    cfg.cluster_m = 1;
    cfg.forward_spread_us = -5;
    expect_invalid([&] { GemmAr op(team, d, cfg); }, "gemm_ar: forward_spread_us -5 must be -1 (auto) or in [0, 10000] microseconds");
    GemmRs op(team, d);
    void* buf = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&buf, size_t(d.m * d.k + d.n * d.k) * 2));
    char* a = static_cast<char*>(buf);
    char* b = a + size_t(d.m * d.k) * 2;
    expect_invalid([&] { op.run(a, b, a + 256, nullptr); }, "gemm_rs: output c overlaps input a");
    expect_invalid([&] { op.run(a, b, b, nullptr); }, "gemm_rs: output c overlaps input b");
    expect_invalid([&] { op.run(a + 2, b, b, nullptr); }, detail::str_cat("gemm_rs: a (", static_cast<void*>(a + 2),
                                                                          ") must be 16-byte aligned"));
    cudaFree(buf);
  });
}

}  // namespace
}  // namespace ccfuse::tp
