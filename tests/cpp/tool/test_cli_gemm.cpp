// `ccfuse check|bench --op gemm` on the host side: its options and rules (one GPU, GPU backend
// only, bf16/fp16, --b-layout, --sms), what reaches the GPU side, and what it prints and records.
// The bad inputs are in tool_test_util.h's table (both test_cli_parse and test_cli_run use it).
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tool_test_util.h"
#ifdef CCFUSE_WITH_CUDA
#include "ccfuse/gemm/gemm.h"
#endif

namespace ccfuse::tool::testing {
namespace {

Options parse(const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  return parse_args(int(argv.size()) - 1, argv.data());
}

const std::vector<std::string> kGemm = {"--op", "gemm", "--m", "256", "--n", "128", "--k", "64"};

std::vector<std::string> gemm_args(const std::string& command, const std::vector<std::string>& more = {}) {
  std::vector<std::string> a{command};
  a.insert(a.end(), kGemm.begin(), kGemm.end());
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(ToolGemm, DefaultsAreNkAllSmsBf16AndOneGpu) {
  Options o = parse(gemm_args("check"));
  EXPECT_TRUE(is_gemm(o));
  EXPECT_EQ(o.b_layout, gemm::BLayout::kNK);
  EXPECT_EQ(o.sms, 0);
  EXPECT_EQ(o.dtype, DType::kBFloat16);
  EXPECT_EQ(o.world_size, 0);
  for (int gpus : {1, 2, 8}) {
    Options r = o;
    EXPECT_EQ(resolve(r, gpus), "");  // auto is the GPU, without a notice
    EXPECT_EQ(r.backend, Backend::kGpu);
    EXPECT_EQ(r.world_size, 1) << "single GPU whatever the GPUs present (" << gpus << ")";
  }
}

TEST(ToolGemm, EveryGemmOptionParses) {
  Options o = parse(gemm_args("bench", {"--dtype", "fp16", "--b-layout", "kn", "--sms", "116", "--world-size", "1",
                                        "--backend", "gpu", "--iters", "10"}));
  EXPECT_EQ(o.dtype, DType::kFloat16);
  EXPECT_EQ(o.b_layout, gemm::BLayout::kKN);
  EXPECT_EQ(o.sms, 116);
  EXPECT_EQ(o.world_size, 1);
  EXPECT_EQ(o.iters, 10);
  EXPECT_EQ(parse(gemm_args("check", {"--b-layout=nk", "--sms=0", "--dtype=bf16"})).b_layout, gemm::BLayout::kNK);
  // --sms has no upper bound at parse time: the GPU's SM count is checked where the GPU is known.
  EXPECT_EQ(parse(gemm_args("check", {"--sms", "100000"})).sms, 100000);
}

TEST(ToolGemm, OtherOpsKeepTheirDtypes) {
  EXPECT_EQ(parse({"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8", "--dtype", "fp32"}).dtype,
            DType::kFloat32);
  // The dtype rule is applied once the op is known, wherever --dtype stands.
  EXPECT_EQ(parse({"check", "--dtype", "fp16", "--op", "gemm", "--m", "8", "--n", "8", "--k", "8"}).dtype,
            DType::kFloat16);
}

TEST(ToolGemm, CheckReachesTheGpuSideWithTheOptionsAndPrintsThemForReplay) {
  const ToolRun r = run_with(gemm_args("check", {"--dtype", "fp16", "--b-layout", "kn", "--sms", "100", "--seed", "4"}),
                             fake_hooks(1));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(fake_seen().op, "gemm");
  EXPECT_EQ(fake_seen().backend, Backend::kGpu);
  EXPECT_EQ(fake_seen().world_size, 1);
  EXPECT_EQ(fake_seen().dtype, DType::kFloat16);
  EXPECT_EQ(fake_seen().b_layout, gemm::BLayout::kKN);
  EXPECT_EQ(fake_seen().sms, 100);
  EXPECT_EQ(last_line(r.out), "PASS op=gemm backend=gpu world_size=1 m=256 n=128 k=64 dtype=fp16 b_layout=kn sms=100 "
                              "seed=4 rel_err=0.000e+00 tol=1e-02");
}

std::string fake_gemm_config(const Options& o) { return "block=128x256x64 fake sms=" + std::to_string(o.sms); }

TEST(ToolGemm, PrintConfigShowsTheEngineConfig) {
  GpuHooks hooks = fake_hooks(1);
  hooks.gemm_config = &fake_gemm_config;
  const ToolRun r = run_with(gemm_args("check", {"--sms", "124", "--print-config"}), hooks);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = lines_of(r.out);
  for (const char* kv : {"op=gemm", "backend=gpu", "world_size=1", "b_layout=nk", "sms=124",
                         "gemm_config=block=128x256x64 fake sms=124"})
    EXPECT_NE(std::find(lines.begin(), lines.end(), kv), lines.end()) << kv << " missing in\n" << r.out;
  // The TP ops print no GEMM lines.
  const ToolRun tp = run_with({"check", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--print-config"}, hooks);
  ASSERT_EQ(tp.code, 0) << tp.err;
  EXPECT_EQ(tp.out.find("gemm_config="), std::string::npos);
  EXPECT_EQ(tp.out.find("b_layout="), std::string::npos);
}

BenchRecord fake_gemm_bench(const Options& o, std::ostream&) {
  fake_seen() = o;
  BenchRecord r;
  r.gpu = "FakeGPU";
  r.t_fused_ms = 1.1, r.t_gemm_ms = 1.0;
  r.tflops = 600, r.tflops_cublas = 660, r.pct_of_cublas = 100.0 / 1.1;
  r.rel_err = 2e-3, r.rel_err_cublas = 1e-3;
  r.config = "block=128x256x64 stages=4 sms=132 order=row group_m=8";
  r.b_layout = "nk";
  r.cublas_algo = "id=66 tile=20";
  r.sms = 132, r.gpu_sms = 132;
  return r;
}

TEST(ToolGemm, BenchRecordsTheGemmFields) {
  GpuHooks hooks = fake_hooks(1);
  hooks.bench = &fake_gemm_bench;
  const std::string path = ::testing::TempDir() + "ccfuse_gemm_bench_test.jsonl";
  std::remove(path.c_str());
  const ToolRun r = run_with(gemm_args("bench", {"--json", path}), hooks);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"tflops", "600.0", "660.0", "pct_of_cublas", "90.9", "block=128x256x64", "cuBLASLt",
                           "b_layout=nk", "sms=132/132"})
    EXPECT_CONTAINS(r.out, part);
  for (const char* absent : {"t_serial", "overlap_eff", "t_comm"}) EXPECT_EQ(r.out.find(absent), std::string::npos) << absent;
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  std::remove(path.c_str());
  for (const char* part : {"\"op\":\"gemm\"", "\"world_size\":1", "\"t_fused_ms\":1.1", "\"t_gemm_ms\":1,",
                           "\"t_serial_ms\":null", "\"tflops\":600,", "\"tflops_cublas\":660,", "\"pct_of_cublas\":90.9",
                           "\"rel_err_cublas\":0.001", "\"config\":\"block=128x256x64 stages=4 sms=132 order=row group_m=8\"",
                           "\"b_layout\":\"nk\"", "\"cublas_algo\":\"id=66 tile=20\"", "\"sms\":132", "\"gpu_sms\":132"})
    EXPECT_CONTAINS(line, part);
}

TEST(ToolGemm, TpRecordsHaveNoGemmFields) {
  BenchRecord r;
  r.op = "ag_gemm";
  r.t_fused_ms = 1;
  const std::string line = to_json_line(r);
  for (const char* key : {"tflops", "pct_of_cublas", "config", "b_layout", "\"sms\"", "gpu_sms", "cublas_algo"})
    EXPECT_EQ(line.find(key), std::string::npos) << key << " in " << line;
}

TEST(ToolGemm, UsageDocumentsGemm) {
  const std::string u = usage();
  for (const char* part : {"--op gemm", "--b-layout", "--sms", "fp16", "cuBLASLt", "GPU backend only"})
    EXPECT_CONTAINS(u, part);
}

#ifdef CCFUSE_WITH_CUDA
// choose_config is host code (it needs a GPU only to count SMs when num_sms is 0): its tile
// choice is checked here, in CI, on the prices of docs/gemm.md "Choosing a config".
gemm::GemmConfig choice(int64_t m, int64_t n, int64_t k, gemm::BLayout layout = gemm::BLayout::kNK) {
  return gemm::choose_config(gemm::make_desc(m, n, k, DType::kBFloat16, layout), 132);
}

TEST(ToolGemm, ChooseConfigPrices192TileForThePowerCap) {
  // Multi-wave shapes where 192 columns fill the waves no better than 256 (within 1 %): 256, whose
  // fewer L2 bytes per FLOP measured 0.95-1.00x the 192 tile's time at the 700 W cap (2026-12-01).
  for (const auto& s : std::vector<std::array<int64_t, 3>>{{8192, 14336, 8192}, {4096, 3072, 4096},
                                                          {8192, 28672, 8192}, {8192, 1536, 4096}}) {
    const gemm::GemmConfig c = choice(s[0], s[1], s[2]);
    EXPECT_EQ(c.block_n, 256) << s[0] << "x" << s[1] << "x" << s[2];
    EXPECT_EQ(c.stages, 3);
    // CTA pairs only where the tiles make at least 20 waves (2026-12-01).
    EXPECT_EQ(c.cluster_m, s[1] >= 14336 ? 2 : 1) << s[0] << "x" << s[1] << "x" << s[2];
  }
  // An odd number of row tiles: no pairs (the last pair's second tile would be all past M).
  EXPECT_EQ(choice(8000, 14336, 8192).cluster_m, 1);  // 63 row tiles, 27 waves
  EXPECT_EQ(choice(8064, 14336, 8192).cluster_m, 1);  // 63
  EXPECT_EQ(choice(7936, 14336, 8192).cluster_m, 2);  // 62
  // Where 192 fills the waves much better, it stays: 8192x768x4096 (256 tiles of 192 in 2 waves,
  // 192 of 256 in 2 waves with half the work each: 1.17x the time with 256 at the cap) and the
  // N = 8192 family (2752 tiles of 192 in 21 waves against 2048 of 256 in 16: 1.6 % better).
  EXPECT_EQ(choice(8192, 768, 4096).block_n, 192);
  EXPECT_EQ(choice(8192, 8192, 14336).block_n, 192);
  // One-wave shapes keep the tiles shaped to the wave (160, 224, 96, 80, 48) and split-K.
  EXPECT_EQ(choice(1024, 5120, 8192).block_n, 160);
  EXPECT_EQ(choice(1024, 14336, 4096).block_n, 224);
  EXPECT_EQ(choice(1024, 1536, 4096).block_n, 96);
  EXPECT_EQ(choice(1024, 1280, 8192).block_n, 80);
  EXPECT_EQ(choice(1024, 768, 4096).block_n, 48);
  EXPECT_EQ(choice(1024, 768, 4096, gemm::BLayout::kKN).block_n, 64);
  EXPECT_EQ(choice(1024, 768, 8192).split_k, 2);
  // B [K, N]: no 96/160/224 tiles (64-column swizzle atoms); 192 where it fills one wave.
  EXPECT_EQ(choice(1024, 2560, 8192, gemm::BLayout::kKN).block_n, 192);
  for (const auto& s : std::vector<std::array<int64_t, 3>>{{8192, 14336, 8192}, {8192, 768, 4096},
                                                          {1024, 5120, 8192}, {1024, 2560, 8192}}) {
    const gemm::GemmDesc d = gemm::make_desc(s[0], s[1], s[2], DType::kBFloat16, gemm::BLayout::kNK);
    EXPECT_NO_THROW(gemm::validate(d, gemm::choose_config(d, 132)));
  }
}
#endif

#ifndef CCFUSE_WITH_CUDA
TEST(ToolGemm, HostOnlyBuildRefusesGemmAsBadInput) {
  const ToolRun r = run(gemm_args("check"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "ccfuse: error: --op gemm needs the GPU backend (no CPU reference world version); no GPU found\n");
}
#endif

}  // namespace
}  // namespace ccfuse::tool::testing
