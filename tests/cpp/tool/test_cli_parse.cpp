// The tool's argument rules: every bad input gives one InvalidArgument naming the argument and
// the rule (from parse_args or, for rules that depend on the GPUs, resolve), and good input
// parses to the expected options.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tool_test_util.h"

namespace ccfuse::tool::testing {
namespace {

Options parse(const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  return parse_args(int(argv.size()) - 1, argv.data());
}

// The message of the InvalidArgument that parse + resolve raise, or "" if they accept the input.
std::string error_of(const std::vector<std::string>& args, int num_gpus) {
  try {
    Options o = parse(args);
    resolve(o, num_gpus);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ToolParse, EveryBadInputNamesTheArgumentAndTheRule) {
  for (const auto& bad : bad_inputs()) {
    std::string joined;
    for (const auto& a : bad.args) joined += " " + a;
    EXPECT_EQ(error_of(bad.args, bad.num_gpus), bad.message) << "ccfuse" << joined;
  }
}

TEST(ToolParse, DivisibilityIsCheckedAtParseTimeWhenTheWorldSizeIsGiven) {
  // No GPU count needed: the user gave both numbers.
  try {
    parse({"check", "--op", "ag_gemm", "--m", "1000", "--n", "8", "--k", "8", "--world-size", "3"});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "--m 1000 is not divisible by --world-size 3");
  }
}

TEST(ToolParse, GoodCheckParsesEveryOption) {
  const Options o = parse({"check", "--op", "gemm_rs", "--world-size", "4", "--m", "128", "--n", "96",
                           "--k", "64", "--dtype", "fp32", "--backend", "cpu", "--seed", "18446744073709551615",
                           "--watchdog-ms", "250", "--block-m", "16", "--block-n", "32", "--print-config"});
  EXPECT_EQ(o.command, Command::kCheck);
  EXPECT_EQ(o.op, "gemm_rs");
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.m, 128);
  EXPECT_EQ(o.n, 96);
  EXPECT_EQ(o.k, 64);
  EXPECT_EQ(o.dtype, DType::kFloat32);
  EXPECT_EQ(o.backend, Backend::kCpu);
  ASSERT_TRUE(o.seed.has_value());
  EXPECT_EQ(*o.seed, 18446744073709551615ull);
  EXPECT_EQ(o.watchdog_ms, 250);
  EXPECT_EQ(o.block_m, 16);
  EXPECT_EQ(o.block_n, 32);
  EXPECT_TRUE(o.print_config);
  EXPECT_FALSE(o.inject_fault);
  EXPECT_EQ(local_k(o), 16);  // gemm_rs: each rank holds K/W
}

TEST(ToolParse, DefaultsAndEqualsForm) {
  const Options o = parse({"bench", "--op=ag_gemm", "--m=64", "--n=32", "--k=48", "--iters=5", "--json=out.jsonl"});
  EXPECT_EQ(o.command, Command::kBench);
  EXPECT_EQ(o.op, "ag_gemm");
  EXPECT_EQ(o.world_size, 0);  // resolved later
  EXPECT_EQ(o.dtype, DType::kBFloat16);
  EXPECT_EQ(o.backend, Backend::kAuto);
  EXPECT_FALSE(o.seed.has_value());
  EXPECT_EQ(o.iters, 5);
  EXPECT_EQ(o.warmup, 3);
  EXPECT_EQ(o.json_path, "out.jsonl");
  EXPECT_EQ(local_k(o), 48);  // ag_gemm: K is not split
}

TEST(ToolParse, HelpAndVersion) {
  EXPECT_EQ(parse({"--help"}).command, Command::kHelp);
  EXPECT_EQ(parse({"-h"}).command, Command::kHelp);
  EXPECT_EQ(parse({"help"}).command, Command::kHelp);
  EXPECT_EQ(parse({"--version"}).command, Command::kVersion);
  EXPECT_EQ(parse({"version"}).command, Command::kVersion);
  // --help anywhere after a command wins over missing required options.
  EXPECT_EQ(parse({"check", "--op", "ag_gemm", "--help"}).command, Command::kHelp);
}

TEST(ToolResolve, FewerThanTwoGpusPicksTheCpuWorldWithOneNotice) {
  for (int gpus : {0, 1}) {
    Options o = parse({"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8"});
    const std::string notice = resolve(o, gpus);
    EXPECT_EQ(o.backend, Backend::kCpu);
    EXPECT_EQ(o.world_size, 2);
    EXPECT_EQ(notice, gpus == 0 ? "ccfuse: 0 GPUs found: running on the CPU reference world (--backend cpu)"
                                : "ccfuse: 1 GPU found: running on the CPU reference world (--backend cpu)");
    EXPECT_EQ(notice.find('\n'), std::string::npos);
  }
}

TEST(ToolResolve, TwoOrMoreGpusPickTheGpuBackendAndAllOfThem) {
  Options o = parse({"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8"});
  EXPECT_EQ(resolve(o, 4), "");
  EXPECT_EQ(o.backend, Backend::kGpu);
  EXPECT_EQ(o.world_size, 4);
}

TEST(ToolResolve, ExplicitCpuBackendNeedsNoNotice) {
  Options o = parse({"check", "--op", "gemm_ar", "--m", "9", "--n", "8", "--k", "6", "--world-size", "3",
                     "--backend", "cpu"});
  EXPECT_EQ(resolve(o, 8), "");
  EXPECT_EQ(o.backend, Backend::kCpu);
  EXPECT_EQ(o.world_size, 3);
  EXPECT_EQ(local_k(o), 2);
}

TEST(ToolResolve, HelpNeedsNothingResolved) {
  Options o = parse({"--help"});
  EXPECT_EQ(resolve(o, 0), "");
}

TEST(ToolResults, ToleranceAndCheckLine) {
  EXPECT_EQ(tolerance_for(DType::kFloat32), 1e-6);
  EXPECT_EQ(tolerance_for(DType::kBFloat16), 1e-2);
  Options o = parse({"check", "--op", "gemm_rs", "--m", "8", "--n", "4", "--k", "6", "--seed", "42"});
  resolve(o, 0);
  EXPECT_EQ(check_line(o, CheckResult{true, 1.5e-3, 1e-2}),
            "PASS op=gemm_rs backend=cpu world_size=2 m=8 n=4 k=6 dtype=bf16 seed=42 rel_err=1.500e-03 tol=1e-02");
  EXPECT_EQ(check_line(o, CheckResult{false, std::numeric_limits<double>::infinity(), 1e-2}).substr(0, 5), "FAIL ");
}

TEST(ToolResults, UsageDocumentsTheOpsAndTheKConvention) {
  const std::string u = usage();
  for (const auto& op : known_ops()) EXPECT_CONTAINS(u, op);
  EXPECT_CONTAINS(u, "--k the global K");
  EXPECT_CONTAINS(u, "each rank holds K/W");
  EXPECT_CONTAINS(u, "exit codes: 0");
  EXPECT_EQ(u.find("--inject-fault"), std::string::npos);  // a testing aid, not a user option
}

TEST(ToolInputs, FillUniformIsDeterministicPerSeedRankAndTensor) {
  std::vector<float> a(1000), b(1000), c(1000), d(1000);
  fill_uniform(7, 0, 0, a.data(), a.size());
  fill_uniform(7, 0, 0, b.data(), b.size());
  fill_uniform(7, 1, 0, c.data(), c.size());
  fill_uniform(7, 0, 1, d.data(), d.size());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  double sum = 0;
  for (float v : a) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LE(v, 1.0f);
    sum += v;
  }
  EXPECT_LT(std::abs(sum / double(a.size())), 0.1);  // centred: a shifted range would show here
}

}  // namespace
}  // namespace ccfuse::tool::testing

namespace ccfuse::tool {
namespace {
TEST(Tolerance, Fp32GrowsWithSqrtKBeyond1024) {
  EXPECT_EQ(tolerance_for(DType::kFloat32, 512), 1e-6);
  EXPECT_EQ(tolerance_for(DType::kFloat32, 1024), 1e-6);
  EXPECT_DOUBLE_EQ(tolerance_for(DType::kFloat32, 4096), 2e-6);
  EXPECT_DOUBLE_EQ(tolerance_for(DType::kFloat32, 16384), 4e-6);
  EXPECT_EQ(tolerance_for(DType::kBFloat16, 16384), 1e-2);
}
}  // namespace
}  // namespace ccfuse::tool
