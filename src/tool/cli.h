// src/tool/cli.h: the `ccfuse` command-line tool (the main job): argument parsing, validation,
// and the backends it drives.
//
//   ccfuse check --op OP --world-size W --m M --n N --k K [--dtype fp32|bf16] [--backend cpu|gpu] [--seed S]
//   ccfuse bench --op OP ... [--iters N] [--warmup N] [--json FILE]
//
// Exit codes: 0 PASS (or bench done), 1 FAIL (wrong answer), 2 bad input (one line on stderr
// naming the argument and the rule), 3 runtime error (CUDA/NCCL/watchdog...).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "ccfuse/common/dtype.h"

namespace ccfuse::tool {

enum class Command { kCheck, kBench, kHelp, kVersion };
enum class Backend { kAuto, kCpu, kGpu };

struct Options {
  Command command = Command::kHelp;
  std::string op;                 // ag_gemm | gemm_rs | gemm_ar
  int world_size = 0;             // 0 = default: GPUs present (gpu backend) or 2 (cpu)
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kBFloat16;
  Backend backend = Backend::kAuto;
  std::optional<uint64_t> seed;   // unset = fresh random seed (printed, so a failure can be replayed)
  int iters = 20;                 // bench: timed repetitions (median reported)
  int warmup = 3;                 // bench: untimed repetitions first
  std::string json_path;          // bench: append JSON Lines records here
  int64_t watchdog_ms = 5000;     // bound of every remote wait
  int block_m = 64, block_n = 64; // CPU world tile shape
  bool print_config = false;
};

// Ops the tool knows.
const std::vector<std::string>& known_ops();

// Parses argv (argv[0] is the program). Throws InvalidArgument with a one-line message such as
// "--m 1000 is not divisible by --world-size 3" or "unknown op 'foo' (known: ag_gemm, gemm_rs, gemm_ar)".
Options parse_args(int argc, const char* const* argv);

// Resolves the backend and default world size given the GPUs present, and checks the rules
// that depend on them (W <= GPUs for the gpu backend, W divides M, ...). Returns a one-line
// notice to print (e.g. "no GPUs found: using the CPU reference world"), or "" for none.
std::string resolve(Options& options, int num_gpus);

// Runs the tool; returns the exit code. All output goes to out/err. main() is a thin wrapper.
int run_tool(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// One result line of `check`, ready to print (last line of output).
struct CheckResult {
  bool pass = false;
  double rel_err = 0;
  double tolerance = 0;
};

// One benchmark record (DESIGN §5 results format). Times are medians in ms; negative = null.
struct BenchRecord {
  std::string op, dtype, gpu, commit, date, backend, command;
  int world_size = 0;
  int64_t m = 0, n = 0, k = 0;
  double t_fused_ms = -1, t_serial_ms = -1, t_gemm_ms = -1, t_comm_ms = -1, t_limit_ms = -1, t_peer_ms = -1;
  double rel_err = -1;
  std::string notes;
};
std::string to_json_line(const BenchRecord& r);

// Backends. cpu_* run on the reference world; gpu_* exist only with CCFUSE_WITH_CUDA.
CheckResult cpu_check(const Options& options, std::ostream& log);
BenchRecord cpu_bench(const Options& options, std::ostream& log);
int count_gpus();  // 0 without CUDA or without devices
CheckResult gpu_check(const Options& options, std::ostream& log);
BenchRecord gpu_bench(const Options& options, std::ostream& log);

}  // namespace ccfuse::tool
