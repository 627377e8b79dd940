// Fused AllGather + GEMM (both transports) on all local GPUs (>= 2; skipped otherwise) against an fp64
// reference computed from the full A, which the test builds itself (it does not trust the gather).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/tp/ag_gemm.h"
#include "gemm_reference.cuh"
#include "gpu_test_util.h"

namespace ccfuse::tp {
namespace {

using ccfuse::testing::all_devices;
using ccfuse::testing::reference_gemm;

using ccfuse::testing::random_16;
using ccfuse::testing::value_of_16;

struct Shape {
  int64_t m, n, k;
  gemm::BLayout layout;
  int push_ctas = 0;  // AgGemmConfig::push_ctas (0: every CTA pushes)
  AgTransport transport = AgTransport::kSendWarps;
  int copy_rows = 0;  // AgGemmConfig::copy_rows (copy engine; 0: auto)
  int cluster_m = 1;  // AgGemmConfig::cluster_m (2: 2-CTA clusters)
  bool overlap_entry = false;  // AgGemmConfig::overlap_entry (PDL after the entry barrier)
  int block_n = 0;             // AgGemmConfig::block_n (0: auto)
  bool return_gathered = true;  // AgGemmConfig::return_gathered
  int push_spread_us = -1;      // AgGemmConfig::push_spread_us (-1: auto, the default)
  DType dtype = DType::kBFloat16;  // AgGemmDesc::dtype
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.m << "x" << s.n << "x" << s.k << "_" << gemm::b_layout_name(s.layout);
}

class FusedAgGemm : public ::testing::TestWithParam<Shape> {};

TEST_P(FusedAgGemm, MatchesFp64AndGathersExactly) {
  CCFUSE_REQUIRE_RANKS(2);
  const Shape sh = GetParam();
  if (sh.transport == AgTransport::kCopyEngine && ccfuse::testing::one_gpu_ranks() > 0)
    GTEST_SKIP() << "the copy-engine transport needs a GPU per rank (rejected in a one-GPU world)";
  const int64_t world = int64_t(all_devices().size());
  if (sh.m % world != 0 || (sh.cluster_m == 2 && sh.m % (world * 256) != 0))
    GTEST_SKIP() << "m " << sh.m << " is not a multiple of " << world << " ranks x " << (sh.cluster_m == 2 ? 256 : 1)
                 << " rows (ag_gemm's rule; the validation test covers the error)";
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(detail::str_cat("seed ", seed, " m ", sh.m, " n ", sh.n, " k ", sh.k));
  comm::run_local_world(all_devices(), [&](comm::Team& team) {
    const int w = team.world_size(), r = team.rank();
    AgGemmDesc d;
    d.m = sh.m;
    d.n = sh.n;
    d.k = sh.k;
    d.b_layout = sh.layout;
    d.dtype = sh.dtype;
    AgGemmConfig cfg;
    cfg.push_ctas = sh.push_ctas;
    cfg.transport = sh.transport;
    cfg.copy_rows = sh.copy_rows;
    cfg.cluster_m = sh.cluster_m;
    cfg.overlap_entry = sh.overlap_entry;
    cfg.block_n = sh.block_n;
    cfg.return_gathered = sh.return_gathered;
    cfg.push_spread_us = sh.push_spread_us;
    AgGemm op(team, d, cfg);
    const int64_t m_local = d.m / w;
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *a_r, *b, *c, *a_full;
    double* ref;
    CCFUSE_CUDA_CHECK(cudaMalloc(&a_r, size_t(m_local * d.k) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&b, size_t(d.k * d.n) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&c, size_t(d.m * d.n) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&a_full, size_t(d.m * d.k) * 2));
    CCFUSE_CUDA_CHECK(cudaMalloc(&ref, size_t(d.m * d.n) * sizeof(double)));
    // Three calls with fresh inputs; the last one writes A_r straight into local_a().
    for (int call = 0; call < 3; ++call) {
      const uint64_t call_seed = seed + 7919ull * call;
      std::vector<uint16_t> full;
      for (int band = 0; band < w; ++band) {
        auto part = random_16(sh.dtype, call_seed, uint64_t(band), size_t(m_local * d.k));
        full.insert(full.end(), part.begin(), part.end());
      }
      const auto hb = random_16(sh.dtype, call_seed, 1000 + uint64_t(r), size_t(d.k * d.n));
      CCFUSE_CUDA_CHECK(cudaMemcpy(a_full, full.data(), full.size() * 2, cudaMemcpyHostToDevice));
      CCFUSE_CUDA_CHECK(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
      const bool in_place = call == 2;
      const uint16_t* mine = full.data() + size_t(r * m_local * d.k);
      CCFUSE_CUDA_CHECK(cudaMemcpy(in_place ? op.local_a() : a_r, mine, size_t(m_local * d.k) * 2, cudaMemcpyHostToDevice));
      CCFUSE_CUDA_CHECK(cudaMemset(c, 0xff, size_t(d.m * d.n) * 2));
      const bool nk = sh.layout == gemm::BLayout::kNK;
      const dim3 grid(unsigned((d.n + 15) / 16), unsigned((d.m + 15) / 16));
      if (sh.dtype == DType::kBFloat16)
        reference_gemm<<<grid, dim3(16, 16)>>>(static_cast<const __nv_bfloat16*>(a_full), d.k,
                                               static_cast<const __nv_bfloat16*>(b), nk ? d.k : d.n, nk, ref, d.m, d.n, d.k);
      else
        reference_gemm<<<grid, dim3(16, 16)>>>(static_cast<const __half*>(a_full), d.k, static_cast<const __half*>(b),
                                               nk ? d.k : d.n, nk, ref, d.m, d.n, d.k);
      CCFUSE_CUDA_CHECK_LAUNCH();
      CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // not the device: see gpu_test_util.h
      op.run(in_place ? nullptr : a_r, b, c, s);
      team.synchronize(s);
      std::vector<uint16_t> gathered(full.size()), hc(size_t(d.m * d.n));
      std::vector<double> hr(hc.size());
      CCFUSE_CUDA_CHECK(cudaMemcpy(gathered.data(), op.gathered_a(), gathered.size() * 2, cudaMemcpyDeviceToHost));
      CCFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), c, hc.size() * 2, cudaMemcpyDeviceToHost));
      CCFUSE_CUDA_CHECK(cudaMemcpy(hr.data(), ref, hr.size() * sizeof(double), cudaMemcpyDeviceToHost));
      if (!sh.return_gathered && !in_place) {  // this rank's own slot is not filled: the peers' bands only
        const size_t own0 = size_t(r * m_local * d.k), own1 = own0 + size_t(m_local * d.k);
        std::copy(full.begin() + own0, full.begin() + own1, gathered.begin() + own0);
      }
      EXPECT_TRUE(gathered == full) << "rank " << r << " call " << call << ": gathered A differs";
      double num = 0, den = 0;
      for (size_t i = 0; i < hc.size(); ++i) {
        const double v = value_of_16(sh.dtype, hc[i]);
        ASSERT_TRUE(std::isfinite(v)) << "rank " << r << " call " << call << " unwritten C at " << i;
        num += (v - hr[i]) * (v - hr[i]);
        den += hr[i] * hr[i];
      }
      EXPECT_LE(std::sqrt(num / den), 1e-2) << "rank " << r << " call " << call;
      team.barrier(s);  // every rank has read its results before the next call overwrites inputs
      team.synchronize(s);
    }
    // Many calls back to back, no host sync: the result of the last equals the first's.
    std::vector<uint16_t> first(size_t(d.m * d.n)), last(first.size());
    op.run(nullptr, b, c, s);
    team.synchronize(s);
    CCFUSE_CUDA_CHECK(cudaMemcpy(first.data(), c, first.size() * 2, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 1000; ++i) op.run(nullptr, b, c, s);  // issue 4: 1000 calls
    team.synchronize(s);
    CCFUSE_CUDA_CHECK(cudaMemcpy(last.data(), c, last.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(first == last) << "rank " << r << ": 1000 back-to-back calls changed the result";
    team.barrier(s);
    team.synchronize(s);
    // CUDA-graph replays (the copy engine's side streams, copies and stream-written flags are
    // captured too), with A_r from a_r this time: the result stays the first call's.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CCFUSE_CUDA_CHECK(cudaMemcpy(a_r, op.local_a(), size_t(m_local * d.k) * 2, cudaMemcpyDeviceToDevice));
    CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    op.run(a_r, b, c, s);
    CCFUSE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CCFUSE_CUDA_CHECK(cudaMemset(c, 0xff, last.size() * 2));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // not the device: see gpu_test_util.h
    for (int i = 0; i < 50; ++i) CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    team.synchronize(s);
    CCFUSE_CUDA_CHECK(cudaMemcpy(last.data(), c, last.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(first == last) << "rank " << r << ": 50 graph replays changed the result";
    team.barrier(s);
    team.synchronize(s);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (void* p : {a_r, b, c, a_full}) cudaFree(p);
    cudaFree(ref);
    cudaStreamDestroy(s);
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedAgGemm,
                         ::testing::Values(Shape{512, 520, 776, gemm::BLayout::kNK},
                                           Shape{1024, 1024, 1024, gemm::BLayout::kKN},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK},
                                           // few pushing CTAs
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 7},
                                           Shape{1024, 1024, 1024, gemm::BLayout::kKN, 1},
                                           // copy engine: auto copy size, one chunk a copy, a whole band a copy
                                           Shape{512, 520, 776, gemm::BLayout::kNK, 0, AgTransport::kCopyEngine},
                                           Shape{1024, 1024, 1024, gemm::BLayout::kKN, 0, AgTransport::kCopyEngine},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 0, AgTransport::kCopyEngine, 128},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kKN, 0, AgTransport::kCopyEngine,
                                                 2048},
                                           // 2-CTA clusters (opt-in)
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 2},
                                           Shape{1024, 1024, 1024, gemm::BLayout::kKN, 0, AgTransport::kCopyEngine, 0, 2},
                                           // 384 rows per band at W = 2: an odd number of row tiles
                                           Shape{768, 1024, 1024, gemm::BLayout::kNK},
                                           // PDL after the entry barrier (passed on 2x H200 2026-11-30):
                                           // TMA-store and register epilogues, A_r in place and not
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 true},
                                           Shape{512, 520, 776, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 true},
                                           // 192-column tiles (opt-in; passed on 2x H200 2026-11-30): partial
                                           // column tiles (520 = 2 x 192 + 136, 1000 = 5 x 192 + 40), both
                                           // layouts, PDL; and a many-row shape at the default
                                           Shape{512, 520, 776, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 192},
                                           Shape{1024, 1000, 1024, gemm::BLayout::kKN, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 192},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 true, 192},
                                           Shape{8192, 768, 1024, gemm::BLayout::kKN},
                                           // Peers' bands only in gathered_a() (over the copy engine too); the
                                           // push paced over 100 us, and in one burst.
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 0, false},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kKN, 0, AgTransport::kCopyEngine, 0, 1,
                                                 false, 0, false},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 0, true, 100},
                                           Shape{4096, 3072, 2048, gemm::BLayout::kKN, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 0, true, 0},
                                           // Bands that end in a short 128-row chunk (M / W = 500 at W = 2, 250 at
                                           // 4, 125 at 8; 1536: 192 rows at W = 8, 512 at 3; 1500: 750 at 2, 500 at
                                           // 3, 375 at 4): a cut last tile stored from registers, pieces past the
                                           // band's end flagged empty; with PDL, 192-column tiles, few pushing
                                           // CTAs, peers-only gathering, and over the copy engine (auto, and
                                           // 256-row copies that do not divide the band)
                                           Shape{1000, 1024, 1024, gemm::BLayout::kNK},
                                           Shape{1536, 1024, 1024, gemm::BLayout::kNK},
                                           Shape{1500, 520, 776, gemm::BLayout::kKN},
                                           Shape{1000, 1024, 1024, gemm::BLayout::kKN, 3},
                                           Shape{1000, 1024, 1024, gemm::BLayout::kKN, 0, AgTransport::kSendWarps, 0, 1,
                                                 true},
                                           Shape{1000, 1000, 1024, gemm::BLayout::kKN, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 192},
                                           Shape{1000, 1024, 1024, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 0, false},
                                           Shape{1000, 1024, 1024, gemm::BLayout::kNK, 0, AgTransport::kCopyEngine},
                                           Shape{1500, 520, 776, gemm::BLayout::kKN, 0, AgTransport::kCopyEngine, 256},
                                           // fp16: whole and short bands, 192-column tiles, the copy engine
                                           Shape{1024, 1024, 1024, gemm::BLayout::kKN, 0, AgTransport::kSendWarps, 0, 1,
                                                 false, 0, true, -1, DType::kFloat16},
                                           Shape{1000, 1000, 1024, gemm::BLayout::kNK, 0, AgTransport::kSendWarps, 0, 1,
                                                 true, 192, true, -1, DType::kFloat16},
                                           Shape{1024, 1024, 1024, gemm::BLayout::kNK, 0, AgTransport::kCopyEngine, 0, 1,
                                                 false, 0, true, -1, DType::kFloat16}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return detail::str_cat(i.param.m, "x", i.param.n, "x", i.param.k, "_",
                                                  gemm::b_layout_name(i.param.layout),
                                                  i.param.push_ctas ? detail::str_cat("_push", i.param.push_ctas) : "",
                                                  i.param.transport == AgTransport::kCopyEngine
                                                      ? detail::str_cat("_ce", i.param.copy_rows)
                                                      : "",
                                                  i.param.cluster_m != 1 ? detail::str_cat("_cluster", i.param.cluster_m) : "",
                                                  i.param.overlap_entry ? "_pdl" : "",
                                                  i.param.block_n ? detail::str_cat("_bn", i.param.block_n) : "",
                                                  i.param.return_gathered ? "" : "_peersonly",
                                                  i.param.push_spread_us >= 0
                                                      ? detail::str_cat("_spread", i.param.push_spread_us)
                                                      : "",
                                                  i.param.dtype == DType::kFloat16 ? "_fp16" : "");
                         });

TEST(FusedAgGemmValidation, RejectsWhatItCannotDo) {
  CCFUSE_REQUIRE_RANKS(2);
  comm::run_local_world(all_devices(), [&](comm::Team& team) {
    const int w = team.world_size();
    // The constructor (collective) must throw InvalidArgument with exactly `message`.
    auto expect_error = [&](const AgGemmDesc& d, const AgGemmConfig& cfg, const std::string& message) {
      try {
        AgGemm op(team, d, cfg);
        ADD_FAILURE() << "no error; expected: " << message;
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(std::string(e.what()), message);
      }
    };
    AgGemmDesc d;
    d.m = 128 * w + 1;
    d.n = 256;
    d.k = 256;
    expect_error(d, {}, detail::str_cat("m ", d.m, " is not divisible by the world size ", w));
    d.m = 512 * w;
    AgGemmConfig cfg;
    cfg.transport = AgTransport::kCopyEngine;
    cfg.copy_rows = 320;
    expect_error(d, cfg, "copy_rows 320 must be 0 (auto) or a positive multiple of 128");
    if (team.shares_device()) {
      cfg.copy_rows = 0;
      expect_error(d, cfg, detail::str_cat("transport copy-engine needs every rank on its own GPU: in a one-GPU world "
                                           "(ranks sharing GPU ", team.device(),
                                           ") the copies do not run beside the GEMMs that wait for them"));
    }
    d.m = 384 * w;
    cfg = AgGemmConfig{};
    cfg.cluster_m = 2;
    expect_error(d, cfg, "cluster_m 2 needs m / world_size = 384 to be a multiple of 256 (tile pairs inside a band)");
    d.m = 512 * w;
    cfg = AgGemmConfig{};
    cfg.block_n = 128;
    expect_error(d, cfg, "block_n 128 must be 0 (= 256), 256 or 192");
    cfg = AgGemmConfig{};
    cfg.push_spread_us = -2;
    expect_error(d, cfg, "push_spread_us -2 must be -1 (auto) or in [0, 100000]");
    cfg = AgGemmConfig{};
    cfg.push_spread_fraction = 2.5;
    expect_error(d, cfg, "push_spread_fraction 2.5 must be in [0, 2]");
    cfg = AgGemmConfig{};
    cfg.block_n = 192;
    cfg.cluster_m = 2;
    expect_error(d, cfg,
                 "block_n 192 is built for the TMA-store epilogue with send warps: it needs n (256) a multiple of 8, "
                 "cluster_m 1 (got 2) and the send-warp transport");
    // An output that overlaps an input or the gather buffer: refused before anything is enqueued.
    d = AgGemmDesc{};
    d.m = 256 * w;
    d.n = 256;
    d.k = 256;
    AgGemm op(team, d, {});
    const size_t c_bytes = size_t(d.m * d.n) * 2, a_bytes = size_t(256 * d.k) * 2, b_bytes = size_t(d.k * d.n) * 2;
    char* mem = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&mem, c_bytes + a_bytes + b_bytes));
    char *a = mem, *b = mem + a_bytes;
    auto expect_run_error = [&](const void* a_local, const void* b_in, void* c_out, const std::string& message) {
      try {
        op.run(a_local, b_in, c_out, nullptr);
        ADD_FAILURE() << "no error; expected: " << message;
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(std::string(e.what()), message);
      }
    };
    expect_run_error(a, b, a + 4096, "ag_gemm: output c overlaps input a_local");
    expect_run_error(nullptr, b, b - 16, "ag_gemm: output c overlaps input b");
    expect_run_error(nullptr, b, const_cast<void*>(op.gathered_a()), "ag_gemm: output c overlaps the gather buffer");
    expect_run_error(nullptr, b, static_cast<char*>(op.local_a()) - 512, "ag_gemm: output c overlaps the gather buffer");
    team.synchronize(nullptr);
    cudaFree(mem);
  });
}

}  // namespace
}  // namespace ccfuse::tp
