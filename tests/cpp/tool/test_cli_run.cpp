// run_tool end to end in-process: exit codes, the one-line errors on stderr, `check` on the CPU
// world for every op (PASS, and FAIL when an output is corrupted), backend selection with fake
// GPU hooks, and runtime errors.
#include <algorithm>
#include <iostream>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tool_test_util.h"

namespace ccfuse::tool::testing {
namespace {

std::string joined(const std::vector<std::string>& args) {
  std::string s = "ccfuse";
  for (const auto& a : args) s += " " + a;
  return s;
}

TEST(ToolRun, BadInputExitsTwoWithOneLineOnStderr) {
  for (const auto& bad : bad_inputs()) {
    const ToolRun r = run_with(bad.args, fake_hooks(bad.num_gpus));
    EXPECT_EQ(r.code, 2) << joined(bad.args);
    EXPECT_EQ(r.err, "ccfuse: error: " + bad.message + "\n") << joined(bad.args);
    EXPECT_EQ(r.out, "") << joined(bad.args);
  }
}

TEST(ToolRun, BadInputThroughTheRealEntryPoint) {
  const ToolRun r = run({"check", "--op", "ag_gemm", "--m", "1000", "--n", "8", "--k", "8", "--world-size", "3"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "ccfuse: error: --m 1000 is not divisible by --world-size 3\n");
}

TEST(ToolRun, HelpAndVersionExitZero) {
  ToolRun r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_CONTAINS(r.out, "usage:");
  EXPECT_EQ(r.err, "");
  r = run({"help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_CONTAINS(r.out, "ccfuse check --op OP");
  r = run({"--version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, std::string("ccfuse ") + CCFUSE_VERSION + "\n");
}

// The last line of every check, with the op, backend and world size filled in.
std::regex check_line_re(const std::string& verdict, const std::string& op, int w) {
  return std::regex("^" + verdict + " op=" + op + " backend=cpu world_size=" + std::to_string(w) +
                    " m=[0-9]+ n=[0-9]+ k=[0-9]+ dtype=(fp32|bf16) seed=[0-9]+ rel_err=[-+.e0-9a-z]+ "
                    "tol=1e-0[26]$");
}

struct CheckCase {
  std::string op;
  int w;
  const char* dtype;
  const char *m, *n, *k;
};

TEST(ToolRun, CheckPassesForEveryOpOnTheCpuWorld) {
  // Shapes with partial tiles (16 x 16 tiles over bands of 10 or 8 rows) and K split W ways.
  const std::vector<CheckCase> cases = {
      {"ag_gemm", 1, "bf16", "20", "24", "12"}, {"ag_gemm", 3, "fp32", "30", "20", "18"},
      {"gemm_rs", 1, "fp32", "20", "24", "12"}, {"gemm_rs", 3, "bf16", "24", "20", "18"},
      {"gemm_ar", 1, "bf16", "20", "24", "12"}, {"gemm_ar", 3, "fp32", "24", "20", "18"},
      {"ag_gemm", 2, "bf16", "32", "16", "8"},  {"gemm_ar", 4, "bf16", "32", "16", "8"},
  };
  for (const auto& c : cases) {
    const std::vector<std::string> args = {"check", "--op", c.op, "--world-size", std::to_string(c.w),
                                           "--m", c.m, "--n", c.n, "--k", c.k, "--dtype", c.dtype,
                                           "--backend", "cpu", "--block-m", "16", "--block-n", "16"};
    const ToolRun r = run(args);
    EXPECT_EQ(r.code, 0) << joined(args) << "\n" << r.out << r.err;
    EXPECT_TRUE(std::regex_match(last_line(r.out), check_line_re("PASS", c.op, c.w))) << last_line(r.out);
    EXPECT_CONTAINS(last_line(r.out), std::string(" dtype=") + c.dtype + " ");
    EXPECT_CONTAINS(r.err, "check: ");  // progress goes to the log stream, results to out
  }
}

TEST(ToolRun, InjectedFaultFails) {
  for (const std::string op : {"ag_gemm", "gemm_rs", "gemm_ar"}) {
    for (const char* dtype : {"bf16", "fp32"}) {
      const ToolRun r = run({"check", "--op", op, "--world-size", "2", "--m", "8", "--n", "8", "--k", "8",
                             "--backend", "cpu", "--dtype", dtype, "--seed", "11", "--inject-fault"});
      EXPECT_EQ(r.code, 1) << r.out << r.err;
      EXPECT_TRUE(std::regex_match(last_line(r.out), check_line_re("FAIL", op, 2))) << last_line(r.out);
      EXPECT_CONTAINS(last_line(r.out), " seed=11 ");
    }
  }
}

TEST(ToolRun, PrintedSeedReplaysTheSameRun) {
  const std::vector<std::string> base = {"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8",
                                         "--backend", "cpu"};
  const ToolRun first = run(base);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  std::smatch seed;
  const std::string line = last_line(first.out);
  ASSERT_TRUE(std::regex_search(line, seed, std::regex("seed=([0-9]+)")));
  auto again_args = base;
  again_args.insert(again_args.end(), {"--seed", seed[1].str()});
  const ToolRun again = run(again_args);
  ASSERT_EQ(again.code, 0);
  EXPECT_EQ(last_line(again.out), line);  // same inputs, same (deterministic) op, same rel_err
}

TEST(ToolRun, NoGpusMeansOneNoticeLineThenTheCpuWorld) {
  const ToolRun r = run_with({"check", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--seed", "1"},
                             fake_hooks(0));
  EXPECT_EQ(r.code, 0) << r.err;
  const auto err_lines = lines_of(r.err);
  ASSERT_FALSE(err_lines.empty());
  EXPECT_EQ(err_lines[0], "ccfuse: 0 GPUs found: running on the CPU reference world (--backend cpu)");
  int notices = 0;
  for (const auto& l : err_lines) notices += l.find("GPUs found") != std::string::npos;
  EXPECT_EQ(notices, 1);
  EXPECT_CONTAINS(last_line(r.out), "PASS op=gemm_rs backend=cpu world_size=2 ");

  const ToolRun quiet = run_with({"check", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--backend",
                                  "cpu"}, fake_hooks(0));
  EXPECT_EQ(quiet.err.find("GPUs found"), std::string::npos);
}

TEST(ToolRun, TwoGpusMeanTheGpuBackendByDefault) {
  const ToolRun r = run_with({"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8", "--seed", "3"},
                             fake_hooks(2));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(fake_seen().backend, Backend::kGpu);
  EXPECT_EQ(fake_seen().world_size, 2);
  EXPECT_EQ(last_line(r.out),
            "PASS op=ag_gemm backend=gpu world_size=2 m=8 n=8 k=8 dtype=bf16 seed=3 rel_err=0.000e+00 tol=1e-02");
}

TEST(ToolRun, PrintConfigShowsTheResolvedOptions) {
  const ToolRun r = run_with({"check", "--op", "gemm_ar", "--m", "8", "--n", "8", "--k", "8", "--seed", "9",
                              "--print-config"}, fake_hooks(0));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = lines_of(r.out);
  for (const char* kv : {"command=check", "op=gemm_ar", "backend=cpu", "world_size=2", "m=8", "n=8", "k=8",
                         "k_per_rank=4", "dtype=bf16", "seed=9", "watchdog_ms=5000"})
    EXPECT_NE(std::find(lines.begin(), lines.end(), kv), lines.end()) << kv << " missing in\n" << r.out;
  EXPECT_CONTAINS(lines.back(), "PASS ");
}

CheckResult timing_out_check(const Options&, std::ostream&) {
  throw TimeoutError("rank 1: timed out after 5000 ms waiting for signal 'ag_chunk'[3] from rank 0");
}
CheckResult crashing_check(const Options&, std::ostream&) { throw std::logic_error("boom"); }
int two_gpus() { return 2; }

TEST(ToolRun, RuntimeErrorsExitThreeWithTheMessage) {
  GpuHooks hooks{&two_gpus, &timing_out_check, &fake_bench};
  ToolRun r = run_with({"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8"}, hooks);
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.err,
            "ccfuse: error: rank 1: timed out after 5000 ms waiting for signal 'ag_chunk'[3] from rank 0\n");

  hooks.check = &crashing_check;  // not a ccfuse error: still caught, still one line
  r = run_with({"check", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8"}, hooks);
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.err, "ccfuse: internal error: boom\n");
}

#ifndef CCFUSE_WITH_CUDA
TEST(ToolRun, HostOnlyBuildHasNoGpuBackend) {
  EXPECT_EQ(count_gpus(), 0);
  Options o;
  try {
    gpu_check(o, std::cerr);
    FAIL() << "expected ccfuse::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "this ccfuse was built without CUDA: use --backend cpu");
  }
  EXPECT_THROW(gpu_bench(o, std::cerr), Error);
}
#endif

}  // namespace
}  // namespace ccfuse::tool::testing
