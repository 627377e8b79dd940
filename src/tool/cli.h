// src/tool/cli.h: the `ccfuse` command-line tool (the main job): argument parsing, validation,
// and the backends it drives.
//
//   ccfuse check --op OP --world-size W --m M --n N --k K [--dtype fp32|bf16] [--backend cpu|gpu] [--seed S]
//   ccfuse bench --op OP ... [--iters N] [--warmup N] [--json FILE]
//   ccfuse check|bench --op gemm --m M --n N --k K [--dtype bf16|fp16] [--b-layout nk|kn] [--sms N]
//     (the single-GPU Hopper GEMM engine against an fp64 reference (check) and cuBLASLt (bench))
//   ccfuse check|bench --op grouped_gemm --experts E --tokens T --topk k --n N --k K
//               [--routing uniform|zipf|one_hot|empty_some] [--b-layout nk|kn] [--dtype bf16|fp16]
//     (the engine's grouped GEMM (MoE experts) on one GPU, against fp64 (check) and cuBLAS's
//      grouped GEMM (bench); the T*k rows spread over the E experts by the routing)
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
#include "ccfuse/gemm/gemm.h"  // BLayout (host-only header: no CUDA needed)

namespace ccfuse::tool {

enum class Command { kCheck, kBench, kHelp, kVersion };
enum class Backend { kAuto, kCpu, kGpu };
// How the rows of --op grouped_gemm spread over the experts (grouped_rows).
enum class Routing { kUniform, kZipf, kOneHot, kEmptySome };

struct Options {
  Command command = Command::kHelp;
  std::string op;                 // ag_gemm | gemm_rs | gemm_ar | gemm | grouped_gemm
  int world_size = 0;             // 0 = default: GPUs present (gpu backend) or 2 (cpu); gemm: 1
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
  // --op gemm only (single GPU, GPU backend only):
  gemm::BLayout b_layout = gemm::BLayout::kNK;  // B [N, K] (nk, a torch Linear weight; default) or [K, N] (kn)
  int sms = 0;                    // SM budget of the persistent GEMM grid; 0 = every SM (checked against the GPU)
  // --op grouped_gemm only (single GPU, GPU backend only): E experts (groups), T tokens, top-k;
  // the T*k rows (= m, set by parse_args) spread over the experts by `routing` (grouped_rows).
  int experts = 0;
  int64_t tokens = 0;
  int topk = 0;
  Routing routing = Routing::kUniform;
  // Hidden (not in --help): corrupt one output element before the comparison, so that tests can
  // prove the checker fails when the answer is wrong.
  bool inject_fault = false;
};

// Ops the tool knows.
const std::vector<std::string>& known_ops();

// Parses argv (argv[0] is the program). Throws InvalidArgument with a one-line message such as
// "--m 1000 is not divisible by --world-size 3" or "unknown op 'foo' (known: ag_gemm, gemm_rs, gemm_ar, gemm)".
Options parse_args(int argc, const char* const* argv);

// Resolves the backend and default world size given the GPUs present, and checks the rules
// that depend on them (W <= GPUs for the gpu backend, W divides M, ...). Returns a one-line
// notice to print (e.g. "no GPUs found: using the CPU reference world"), or "" for none.
std::string resolve(Options& options, int num_gpus);

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
  // TP ops on GPUs (added, written only when set): ccfuse's own GEMM engine on the rank's GEMM
  // (no communication, same harness), to tell the fusion's overhead from the GEMM's gap to cuBLAS.
  double t_gemm_ccfuse_ms = -1;
  // CCFUSE_BENCH_STEADY_MS > 0 (TP ops on GPUs): each variant back to back for about steady_ms,
  // alone (the GPU at its power cap), medians per run; written only when set.
  // --op gemm: t_fused_steady_ms is ccfuse's, t_gemm_steady_ms cuBLASLt's, and pct_of_cublas_steady
  // ccfuse's throughput as a percentage of cuBLASLt's, each back to back alone.
  double steady_ms = -1, t_fused_steady_ms = -1, t_serial_steady_ms = -1, t_gemm_steady_ms = -1,
         t_comm_steady_ms = -1, t_gemm_ccfuse_steady_ms = -1, pct_of_cublas_steady = -1;
  // --op gemm (added fields; each is written to the JSON only when set, so the TP records keep
  // their shape): ccfuse and best-cuBLASLt throughput, ccfuse as a percentage of cuBLASLt, the
  // engine's config (gemm::to_string), B's layout, the SM budget used and the GPU's SM count,
  // and rel_err of the cuBLASLt result (it solves the same problem: checked too).
  double tflops = -1, tflops_cublas = -1, pct_of_cublas = -1, rel_err_cublas = -1;
  std::string config, b_layout, cublas_algo;
  int sms = -1, gpu_sms = -1;
  // --op grouped_gemm (added fields, written only when set; DESIGN §5 MoE fields): experts, topk,
  // tokens_per_rank (= --tokens: the tokens whose top-k rows this GPU's experts take), routing,
  // the rows per expert, and the best baseline (cuBLAS grouped GEMM): its name, throughput and
  // ccfuse's percentage of it (t_gemm_ms is the baseline's time, t_fused_ms ccfuse's).
  int experts = -1, topk = -1;
  int64_t tokens_per_rank = -1;
  std::string routing, baseline;
  std::vector<int64_t> group_rows;
  double tflops_baseline = -1, pct_of_baseline = -1, rel_err_baseline = -1;
  // An A/B variant of ccfuse's own config timed interleaved with t_fused_ms in the same rounds
  // (--op grouped_gemm with CCFUSE_GROUPED_AB_GROUP_M): its config and median; written when set.
  std::string variant_config;
  double t_variant_ms = -1;
};
std::string to_json_line(const BenchRecord& r);

// CCFUSE_BENCH_STEADY_MS (default 0: off): the GPU benches also run each variant back to back for
// about this long, alone, and record its median time per run (t_*_steady_ms). Interleaved, every
// variant runs at the clock that the mix's average power allows; back to back, as the layers of a
// training step do, the GPU sits at its 700 W cap and each variant at the clock its own power
// allows (1.43-1.9 GHz measured 2026-12-01, docs/perf-notes.md). Throws on a bad value.
int bench_steady_ms();
// The integer environment variable `name`, or `fallback` where unset or empty; throws
// InvalidArgument naming the variable, its value, the unit and [lo, hi] where it is not a number in range.
int env_int(const char* name, int fallback, int lo, int hi, const char* unit);

// Backends. cpu_* run on the reference world; gpu_* exist only with CCFUSE_WITH_CUDA.
CheckResult cpu_check(const Options& options, std::ostream& log);
BenchRecord cpu_bench(const Options& options, std::ostream& log);
int count_gpus();  // 0 without CUDA or without devices
CheckResult gpu_check(const Options& options, std::ostream& log);
BenchRecord gpu_bench(const Options& options, std::ostream& log);
// --op gemm on one GPU (gpu_gemm_bench.cu; gpu_check/gpu_bench hand gemm to these). check: the
// full output (or, past 2^34 multiply-adds, every element for NaN/poison and one row per
// 128-row band against fp64); bench: ccfuse vs the best of cuBLASLt's heuristic algorithms.
CheckResult gpu_gemm_check(const Options& options, std::ostream& log);
BenchRecord gpu_gemm_bench(const Options& options, std::ostream& log);
std::string gpu_gemm_config(const Options& options);  // "block=... stages=... sms=..." (no CUDA: throws)
// --op grouped_gemm on one GPU (gpu_grouped_bench.cu; gpu_check/gpu_bench hand it to these).
CheckResult gpu_grouped_check(const Options& options, std::ostream& log);
BenchRecord gpu_grouped_bench(const Options& options, std::ostream& log);
std::string gpu_grouped_config(const Options& options);

// The GPU side of the tool as three entry points. run_tool() passes the real ones (gpu_backend.cu,
// or gpu_stub.cpp without CUDA); tests pass fakes to drive the backend selection on a host
// without GPUs.
struct GpuHooks {
  int (*count_gpus)() = nullptr;
  CheckResult (*check)(const Options&, std::ostream&) = nullptr;
  BenchRecord (*bench)(const Options&, std::ostream&) = nullptr;
  // --op gemm --print-config: the engine's config for the resolved options (gemm::to_string of
  // choose_config on the SM budget); null = print none.
  std::string (*gemm_config)(const Options&) = nullptr;
};
int run_tool_with(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                  const GpuHooks& gpu);

// Runs the tool; returns the exit code. All output goes to out/err; main() is a thin wrapper.
// It is run_tool_with the GPU functions of this build (gpu_backend.cu, or gpu_stub.cpp).
int run_tool(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// ---- helpers shared by the backends and the tests --------------------------------------------

// Usage text of --help.
std::string usage();
// The resolved options, one key=value per line (--print-config).
std::string format_config(const Options& options);
bool is_gemm(const Options& options);  // --op gemm: the single-GPU GEMM engine
bool is_grouped(const Options& options);  // --op grouped_gemm: the engine's grouped GEMM (MoE experts)
bool is_single_gpu(const Options& options);  // gemm or grouped_gemm: one GPU, no CPU version

// ---- --op grouped_gemm routing -------------------------------------------------------------

// "uniform" | "zipf" | "one_hot" | "empty_some"; parse_routing throws InvalidArgument otherwise.
const char* routing_name(Routing r);
Routing parse_routing(const std::string& text);
// Exponent s of the zipf routing: expert e (0-based) gets a share proportional to 1/(e+1)^s.
constexpr double kZipfExponent = 1.2;
// Rows per expert of `total_rows` (= tokens * topk) routed over `experts` experts, deterministic
// (the same on every host; tools/moe_grouped.py is the Python twin, tests pin both):
//   uniform     total/E each, the first total%E experts one more;
//   zipf        integer weights w_e = llround(2^30 / (e+1)^kZipfExponent); expert e gets
//               floor(total * w_e / sum(w)) (exact integer arithmetic), and the remainder goes one
//               row each to the first experts: non-increasing, sum exact;
//   one_hot     every row to expert 0;
//   empty_some  uniform over the odd experts (1, 3, ...), the even ones get none (E >= 2).
// Throws InvalidArgument for experts < 1, total_rows < 0, or empty_some with experts < 2.
std::vector<int64_t> grouped_rows(int experts, int64_t total_rows, Routing routing);
const char* backend_name(Backend b);  // "auto" | "cpu" | "gpu"

// ‖out − ref‖/‖ref‖ bound of `check` (DESIGN §4 rule 6): bf16 1e-2; fp32 1e-6 up to a reduction
// length of 1024, then growing as sqrt(k / 1024): fp32 rounding error of a length-k dot product
// grows like sqrt(k) (measured: 1.2e-6 at k = 4096, 2.3e-6 at k = 16384, correct ops).
double tolerance_for(DType dtype, int64_t k = 0);
// The last line of `check`: "PASS op=... backend=... world_size=... m=... n=... k=... dtype=...
// seed=... rel_err=... tol=..." (or FAIL with the same fields).
std::string check_line(const Options& options, const CheckResult& result);

// Per-rank reduction length: --k is the global K; gemm_rs/gemm_ar split it across the ranks.
int64_t local_k(const Options& options);

// Deterministic inputs: values uniform in [-1, 1) from std::mt19937_64 seeded by (seed, rank,
// which) through std::seed_seq, both fully specified by the standard, so the same seed gives the
// same inputs on every platform and backend. `which` names the tensor (0 = A, 1 = B).
void fill_uniform(uint64_t seed, int rank, int which, float* out, size_t count);

// speedup = t_serial / t_fused, or -1 (= null) when a time is missing.
double speedup_of(const BenchRecord& r);
// overlap efficiency = (t_serial − t_fused) / (t_serial − t_limit); it may be negative (fused
// slower than serial), so "undefined" (a time missing, t_serial <= t_limit) is NaN (= null).
double overlap_eff_of(const BenchRecord& r);
// The human-readable bench table (DESIGN §5 metrics).
std::string format_bench_table(const BenchRecord& r);

// JSON string literal (quotes included) with ", \\ and control characters escaped.
std::string json_quote(const std::string& s);
// Now as ISO 8601 UTC, e.g. "2025-06-01T12:34:56Z".
std::string iso_utc_now();
// $CCFUSE_COMMIT if set, else `git rev-parse --short HEAD` run now, else "unknown".
std::string current_commit();

}  // namespace ccfuse::tool
