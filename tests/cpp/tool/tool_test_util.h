// tests/cpp/tool/tool_test_util.h: helpers of the tool tests: run the tool in-process with argv
// given as strings, fake GPU hooks, line splitting, and the table of bad inputs.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "ccfuse/common/error.h"
#include "src/tool/cli.h"

namespace ccfuse::tool::testing {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

struct ToolRun {
  int code = -1;
  std::string out, err;
};

// argv[0] is "ccfuse"; `args` follow.
inline std::vector<const char*> make_argv(const std::vector<std::string>& args) {
  static const char* const kProgram = "ccfuse";
  std::vector<const char*> argv{kProgram};
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);  // as the C runtime gives it
  return argv;
}

inline ToolRun run_with(const std::vector<std::string>& args, const GpuHooks& hooks) {
  const auto argv = make_argv(args);
  std::ostringstream out, err;
  ToolRun r;
  r.code = run_tool_with(int(argv.size()) - 1, argv.data(), out, err, hooks);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The real tool (with the GPU side this build links).
inline ToolRun run(const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  std::ostringstream out, err;
  ToolRun r;
  r.code = run_tool(int(argv.size()) - 1, argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline std::string last_line(const std::string& text) {
  const auto lines = lines_of(text);
  return lines.empty() ? std::string() : lines.back();
}

// Fake GPU side: `fake_gpus` devices; check/bench record the options they got.
inline int& fake_gpus() {
  static int n = 0;
  return n;
}
inline Options& fake_seen() {
  static Options o;
  return o;
}
inline int fake_count() { return fake_gpus(); }
inline CheckResult fake_check(const Options& o, std::ostream&) {
  fake_seen() = o;
  return CheckResult{true, 0.0, tolerance_for(o.dtype)};
}
inline BenchRecord fake_bench(const Options& o, std::ostream&) {
  fake_seen() = o;
  BenchRecord r;
  r.gpu = "FakeGPU";
  r.t_fused_ms = 1.0, r.t_serial_ms = 1.5, r.t_gemm_ms = 1.0, r.t_comm_ms = 0.4, r.t_limit_ms = 1.0;
  r.rel_err = 0.0;
  return r;
}
inline GpuHooks fake_hooks(int num_gpus) {
  fake_gpus() = num_gpus;
  fake_seen() = Options{};
  return GpuHooks{&fake_count, &fake_check, &fake_bench};
}

// One bad input: arguments after "ccfuse", GPUs present, and the exact message.
struct BadInput {
  std::vector<std::string> args;
  int num_gpus;
  std::string message;
};

inline std::vector<BadInput> bad_inputs() {
  const std::vector<std::string> ag = {"check", "--op", "ag_gemm"};
  const auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const auto ok_sizes = with(ag, {"--m", "8", "--n", "8", "--k", "8"});
  const std::vector<std::string> gemm = {"check", "--op", "gemm", "--m", "64", "--n", "32", "--k", "16"};
  const std::vector<std::string> grouped = {"check", "--op", "grouped_gemm", "--n", "32", "--k", "16"};
  const auto grouped_ok = with(grouped, {"--experts", "4", "--tokens", "64", "--topk", "2"});
  return {
      {{}, 0, "no command given (try 'ccfuse --help')"},
      {{"x"}, 0, "unknown command 'x' (known: check, bench, help)"},
      {{"--op", "ag_gemm"}, 0, "no command given before '--op' (check or bench)"},
      {with(ag, {"--q", "1"}), 0, "unknown option '--q'"},
      {with(ag, {"stray"}), 0, "unexpected argument 'stray' (options start with --)"},
      {{"check", "--op", "foo"}, 0, "unknown op 'foo' (known: ag_gemm, gemm_rs, gemm_ar, gemm, grouped_gemm)"},
      {with(ag, {"--world-size", "3", "--m", "1000", "--n", "8", "--k", "8"}), 0,
       "--m 1000 is not divisible by --world-size 3"},
      {{"check", "--op", "gemm_rs", "--world-size", "3", "--m", "99", "--n", "8", "--k", "100"}, 0,
       "--k 100 is not divisible by --world-size 3 (gemm_rs splits K across ranks)"},
      {{"check", "--op", "gemm_ar", "--m", "8", "--n", "8", "--k", "9"}, 0,
       "--k 9 is not divisible by the default --world-size 2 (gemm_ar splits K across ranks)"},
      {with(ag, {"--m", "9", "--n", "8", "--k", "8"}), 0, "--m 9 is not divisible by the default --world-size 2"},
      {with(ag, {"--m", "-5"}), 0, "--m -5 must be a positive integer"},
      {with(ag, {"--m", "0"}), 0, "--m 0 must be a positive integer"},
      {with(ag, {"--n", "abc"}), 0, "--n abc is not an integer"},
      {with(ag, {"--k", "1e3"}), 0, "--k 1e3 is not an integer"},
      {with(ag, {"--m", "99999999999999999999"}), 0,
       "--m 99999999999999999999 is out of range (at most 9223372036854775807)"},
      {with(ag, {"--world-size", "0"}), 0, "--world-size 0 must be at least 1"},
      {with(ok_sizes, {"--world-size", "4"}), 2, "--world-size 4 is larger than the 2 GPUs present (--backend gpu)"},
      {with(ok_sizes, {"--world-size", "2", "--backend", "gpu"}), 1,
       "--world-size 2 is larger than the 1 GPU present (--backend gpu)"},
      {with(ok_sizes, {"--backend", "gpu"}), 0, "--backend gpu needs at least 1 GPU; none found"},
      {with(ag, {"--backend", "tpu"}), 0, "--backend tpu is not supported (auto, cpu, gpu)"},
      {with(ag, {"--dtype", "fp8"}), 0, "--dtype fp8 is not supported for --op ag_gemm (fp32, bf16)"},
      {with(ag, {"--dtype", "fp16"}), 0, "--dtype fp16 is not supported for --op ag_gemm (fp32, bf16)"},
      {{"check", "--m", "8", "--n", "8", "--k", "8"}, 0, "--op is required"},
      {with(ag, {"--n", "8", "--k", "8"}), 0, "--m is required"},
      {with(ag, {"--m", "8", "--k", "8"}), 0, "--n is required"},
      {with(ag, {"--m", "8", "--n", "8"}), 0, "--k is required"},
      {with(ag, {"--m"}), 0, "--m needs a value"},
      {with(ag, {"--m", "--n", "8"}), 0, "--m needs a value"},
      {with(ag, {"--m="}), 0, "--m needs a value"},
      {with(ag, {"--m", "8", "--m", "8"}), 0, "--m is given more than once"},
      {{"bench", "--op", "ag_gemm", "--iters", "0"}, 0, "--iters 0 must be at least 1"},
      {{"bench", "--op", "ag_gemm", "--warmup", "-1"}, 0, "--warmup -1 must be at least 0"},
      {with(ag, {"--iters", "3"}), 0, "--iters applies to bench only"},
      {with(ag, {"--json", "x.jsonl"}), 0, "--json applies to bench only"},
      {with(ag, {"--seed", "-1"}), 0, "--seed -1 must be a non-negative integer"},
      {with(ag, {"--seed", "x1"}), 0, "--seed x1 is not an integer"},
      {with(ag, {"--seed", "18446744073709551616"}), 0,
       "--seed 18446744073709551616 is out of range (at most 18446744073709551615)"},
      {with(ag, {"--watchdog-ms", "0"}), 0, "--watchdog-ms 0 must be a positive integer"},
      {with(ag, {"--print-config=yes"}), 0, "--print-config takes no value"},
      {with(ag, {"--world-size", "65", "--m", "65", "--n", "8", "--k", "8"}), 0,
       "--world-size 65 is larger than the 64 ranks the CPU reference world runs (--backend cpu)"},
      {with(ag, {"--m", "8192", "--n", "8192", "--k", "8192"}), 0,
       "--m 8192 --n 8192 --k 8192 is too large for the CPU reference world at --world-size 2 (limits: "
       "2^36 multiply-adds, 2^27 matrix elements; use smaller sizes or --backend gpu)"},
      {{"check", "--op", "gemm_ar", "--m", "65536", "--n", "65536", "--k", "2"}, 0,
       "--m 65536 --n 65536 --k 2 is too large for the CPU reference world at --world-size 2 (limits: "
       "2^36 multiply-adds, 2^27 matrix elements; use smaller sizes or --backend gpu)"},
      // --op gemm: one GPU, GPU backend only, its own dtypes and options.
      {with(gemm, {"--b-layout", "xy"}), 1, "--b-layout xy is not supported (nk: B is [N, K]; kn: B is [K, N])"},
      {with(gemm, {"--sms", "-1"}), 1, "--sms -1 must be at least 0 (0 = every SM)"},
      {with(gemm, {"--sms", "many"}), 1, "--sms many is not an integer"},
      {with(gemm, {"--dtype", "fp32"}), 1, "--dtype fp32 is not supported for --op gemm (bf16, fp16)"},
      {with(gemm, {"--backend", "cpu"}), 1, "--op gemm needs the GPU backend (no CPU reference world version)"},
      {with(gemm, {"--world-size", "2"}), 2, "--world-size 2 is not allowed for --op gemm (single GPU)"},
      {with(gemm, {}), 0, "--op gemm needs the GPU backend (no CPU reference world version); no GPU found"},
      {with(gemm, {"--backend", "gpu"}), 0, "--backend gpu needs at least 1 GPU; none found"},
      {with(ok_sizes, {"--sms", "8"}), 2, "--sms applies to --op gemm only"},
      {with(ok_sizes, {"--b-layout", "kn"}), 2, "--b-layout applies to --op gemm and grouped_gemm only"},
      {{"bench", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--dtype", "fp16"}, 2,
       "--dtype fp16 is not supported for --op gemm_rs (fp32, bf16)"},
      // --op grouped_gemm: one GPU, its sizes and routing.
      {with(grouped_ok, {"--routing", "pareto"}), 1,
       "--routing pareto is not supported (uniform, zipf, one_hot, empty_some)"},
      {with(grouped, {"--tokens", "64", "--topk", "2"}), 1, "--experts is required for --op grouped_gemm"},
      {with(grouped, {"--experts", "4", "--topk", "2"}), 1, "--tokens is required for --op grouped_gemm"},
      {with(grouped, {"--experts", "4", "--tokens", "64"}), 1, "--topk is required for --op grouped_gemm"},
      {with(grouped, {"--experts", "0", "--tokens", "64", "--topk", "2"}), 1, "--experts 0 must be at least 1"},
      {with(grouped, {"--experts", "4", "--tokens", "64", "--topk", "0"}), 1, "--topk 0 must be at least 1"},
      {with(grouped, {"--experts", "4", "--tokens", "0", "--topk", "2"}), 1, "--tokens 0 must be a positive integer"},
      {with(grouped, {"--experts", "5000", "--tokens", "64", "--topk", "2"}), 1,
       "--experts 5000 is out of range (at most 4096)"},
      {with(grouped, {"--experts", "4", "--tokens", "64", "--topk", "65"}), 1, "--topk 65 is out of range (at most 64)"},
      {with(grouped, {"--experts", "4", "--tokens", "2000000000", "--topk", "2"}), 1,
       "--tokens 2000000000 x --topk 2 rows is out of range (at most 2147483647)"},
      {with(grouped, {"--experts", "1", "--tokens", "64", "--topk", "1", "--routing", "empty_some"}), 1,
       "--routing empty_some needs --experts of at least 2 (it empties the even experts)"},
      {with(grouped_ok, {"--m", "128"}), 1, "--m does not apply to --op grouped_gemm (its rows are --tokens x --topk)"},
      {with(grouped_ok, {"--sms", "100"}), 1, "--sms applies to --op gemm only"},
      {with(grouped_ok, {"--dtype", "fp32"}), 1, "--dtype fp32 is not supported for --op grouped_gemm (bf16, fp16)"},
      {with(grouped_ok, {"--backend", "cpu"}), 1,
       "--op grouped_gemm needs the GPU backend (no CPU reference world version)"},
      {with(grouped_ok, {"--world-size", "2"}), 2, "--world-size 2 is not allowed for --op grouped_gemm (single GPU)"},
      {with(grouped_ok, {}), 0, "--op grouped_gemm needs the GPU backend (no CPU reference world version); no GPU found"},
      {with(ok_sizes, {"--experts", "8"}), 2, "--experts applies to --op grouped_gemm only"},
      {with(ok_sizes, {"--routing", "zipf"}), 2, "--routing applies to --op grouped_gemm only"},
      {with(gemm, {"--topk", "2"}), 1, "--topk applies to --op grouped_gemm only"},
  };
}

}  // namespace ccfuse::tool::testing
