// src/tool/cli.cpp: argument parsing, validation and dispatch of the `ccfuse` tool.
//
// Every rule a user can break is checked here, before any work starts, and reported as one
// InvalidArgument line that names the argument and the rule (exit code 2). Errors that only show
// while running (a watchdog timeout, a failed CUDA call) arrive as ccfuse::Error (exit code 3).
#include "src/tool/cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <ostream>
#include <random>
#include <set>
#include <sstream>

#include "ccfuse/common/error.h"
#include "ccfuse/tp/tuner.h"

#ifndef CCFUSE_VERSION
#define CCFUSE_VERSION "unknown"
#endif

namespace ccfuse::tool {

namespace {

using detail::str_cat;

// The CPU world runs one thread per rank; past this it measures the OS scheduler, not the op.
constexpr int kMaxCpuWorldSize = 64;
// Multiply-adds one CPU run may cost (the fp64 reference is a plain loop, ~1 GMAC/s): beyond it
// a check takes minutes and looks like a hang.
constexpr double kMaxCpuMacs = 68719476736.0;  // 2^36
// Elements of A, B and C over all ranks: the check also keeps fp64 copies (~30 bytes each in
// all), so this bounds a run near 4 GiB instead of failing mid-way on std::bad_alloc.
constexpr double kMaxCpuElements = 134217728.0;  // 2^27
// Bound of --watchdog-ms (a day): larger values would overflow the clock arithmetic of a deadline.
constexpr int64_t kMaxWatchdogMs = 86400000;

bool is_k_split(const std::string& op) { return op == "gemm_rs" || op == "gemm_ar"; }

// One option of check/bench.
struct OptionSpec {
  const char* name;
  bool bench_only;
};

const OptionSpec kOptionSpecs[] = {
    {"--op", false},          {"--world-size", false}, {"--m", false},           {"--n", false},
    {"--k", false},           {"--dtype", false},      {"--backend", false},     {"--seed", false},
    {"--watchdog-ms", false}, {"--block-m", false},    {"--block-n", false},     {"--iters", true},
    {"--warmup", true},       {"--json", true},        {"--print-config", false}, {"--inject-fault", false},
    {"--b-layout", false},    {"--sms", false},         {"--experts", false},     {"--tokens", false},
    {"--topk", false},        {"--routing", false},
};

bool takes_value(const std::string& name) { return name != "--print-config" && name != "--inject-fault"; }

const OptionSpec* find_spec(const std::string& name) {
  for (const auto& spec : kOptionSpecs)
    if (name == spec.name) return &spec;
  return nullptr;
}

// Digits with an optional sign, nothing else (no spaces, no "1e3", no "0x10").
bool looks_like_integer(const std::string& text) {
  size_t i = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return false;
  return true;
}

// Parses a signed integer in [lo, hi]; `rule` completes "NAME VALUE <rule>" when it is below lo.
int64_t parse_int(const std::string& name, const std::string& text, int64_t lo, int64_t hi,
                  const char* rule) {
  CCFUSE_ARG_CHECK(looks_like_integer(text), name, " ", text, " is not an integer");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const bool overflow = errno == ERANGE;
  CCFUSE_ARG_CHECK(!(overflow && text[0] == '-') && (overflow || v >= lo), name, " ", text, " ", rule);
  CCFUSE_ARG_CHECK(!overflow && v <= hi, name, " ", text, " is out of range (at most ", hi, ")");
  return int64_t(v);
}

uint64_t parse_seed(const std::string& text) {
  CCFUSE_ARG_CHECK(looks_like_integer(text), "--seed ", text, " is not an integer");
  CCFUSE_ARG_CHECK(text[0] != '-', "--seed ", text, " must be a non-negative integer");
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  CCFUSE_ARG_CHECK(errno != ERANGE, "--seed ", text, " is out of range (at most ",
                   std::numeric_limits<uint64_t>::max(), ")");
  return uint64_t(v);
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
// --op grouped_gemm: bounds that keep the host-side bookkeeping small and the rows (tokens * topk,
// an int on the device) in range.
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxTopk = 64;

// What parse_args checks only once every option is known: the --dtype text (its rule depends on
// the op) and the options given (--b-layout/--sms belong to --op gemm).
struct ParseState {
  std::string dtype_text;
  std::set<std::string> seen;
};

void set_option(Options& o, ParseState& st, const std::string& name, const std::string& value) {
  if (name == "--op") {
    bool known = false;
    for (const auto& op : known_ops()) known = known || op == value;
    if (!known) {
      std::string list;
      for (const auto& op : known_ops()) list += (list.empty() ? "" : ", ") + op;
      throw InvalidArgument(str_cat("unknown op '", value, "' (known: ", list, ")"));
    }
    o.op = value;
  } else if (name == "--world-size") {
    o.world_size = int(parse_int(name, value, 1, kIntMax, "must be at least 1"));
  } else if (name == "--m") {
    o.m = parse_int(name, value, 1, kI64Max, "must be a positive integer");
  } else if (name == "--n") {
    o.n = parse_int(name, value, 1, kI64Max, "must be a positive integer");
  } else if (name == "--k") {
    o.k = parse_int(name, value, 1, kI64Max, "must be a positive integer");
  } else if (name == "--dtype") {
    st.dtype_text = value;  // checked against the op once all options are read (check_dtype)
  } else if (name == "--backend") {
    if (value == "auto") {
      o.backend = Backend::kAuto;
    } else if (value == "cpu") {
      o.backend = Backend::kCpu;
    } else if (value == "gpu") {
      o.backend = Backend::kGpu;
    } else {
      throw InvalidArgument(str_cat("--backend ", value, " is not supported (auto, cpu, gpu)"));
    }
  } else if (name == "--seed") {
    o.seed = parse_seed(value);
  } else if (name == "--iters") {
    o.iters = int(parse_int(name, value, 1, kIntMax, "must be at least 1"));
  } else if (name == "--warmup") {
    o.warmup = int(parse_int(name, value, 0, kIntMax, "must be at least 0"));
  } else if (name == "--json") {
    o.json_path = value;
  } else if (name == "--watchdog-ms") {
    o.watchdog_ms = parse_int(name, value, 1, kMaxWatchdogMs, "must be a positive integer");
  } else if (name == "--block-m") {
    o.block_m = int(parse_int(name, value, 1, 1 << 16, "must be a positive integer"));
  } else if (name == "--block-n") {
    o.block_n = int(parse_int(name, value, 1, 1 << 16, "must be a positive integer"));
  } else if (name == "--print-config") {
    o.print_config = true;
  } else if (name == "--inject-fault") {
    o.inject_fault = true;
  } else if (name == "--b-layout") {
    if (value == "nk") {
      o.b_layout = gemm::BLayout::kNK;
    } else if (value == "kn") {
      o.b_layout = gemm::BLayout::kKN;
    } else {
      throw InvalidArgument(str_cat("--b-layout ", value, " is not supported (nk: B is [N, K]; kn: B is [K, N])"));
    }
  } else if (name == "--sms") {
    // The upper bound (the GPU's SM count) is checked where the GPU is known (gpu_gemm_bench.cu).
    o.sms = int(parse_int(name, value, 0, kIntMax, "must be at least 0 (0 = every SM)"));
  } else if (name == "--experts") {
    o.experts = int(parse_int(name, value, 1, kMaxExperts, "must be at least 1"));
  } else if (name == "--tokens") {
    o.tokens = parse_int(name, value, 1, kIntMax, "must be a positive integer");
  } else if (name == "--topk") {
    o.topk = int(parse_int(name, value, 1, kMaxTopk, "must be at least 1"));
  } else if (name == "--routing") {
    o.routing = parse_routing(value);
  }
}

// dtypes per op: the TP ops run fp32 and bf16 (CPU world and serial baselines); the GEMM engine
// is a 16-bit tensor-core kernel (bf16, fp16).
void check_dtype(Options& o, const std::string& text) {
  if (text.empty()) return;  // default bf16: every op has it
  const bool gemm = o.op == "gemm" || o.op == "grouped_gemm";
  const char* supported = gemm ? "bf16, fp16" : "fp32, bf16";
  if (text == "bf16") {
    o.dtype = DType::kBFloat16;
  } else if (text == "fp32" && !gemm) {
    o.dtype = DType::kFloat32;
  } else if (text == "fp16" && gemm) {
    o.dtype = DType::kFloat16;
  } else {
    throw InvalidArgument(str_cat("--dtype ", text, " is not supported for --op ", o.op, " (", supported, ")"));
  }
}

// The rules of --op gemm and grouped_gemm (one GPU, no CPU version) and of their options on the
// other ops.
void check_gemm_rules(const Options& o, const std::set<std::string>& seen) {
  const bool grouped = o.op == "grouped_gemm";
  if (!grouped)
    for (const char* name : {"--experts", "--tokens", "--topk", "--routing"})
      CCFUSE_ARG_CHECK(seen.count(name) == 0, name, " applies to --op grouped_gemm only");
  if (grouped) {
    // The cuBLAS baseline gets every SM: an SM budget would compare unlike things.
    CCFUSE_ARG_CHECK(seen.count("--sms") == 0, "--sms applies to --op gemm only");
  } else if (o.op != "gemm") {
    CCFUSE_ARG_CHECK(seen.count("--b-layout") == 0, "--b-layout applies to --op gemm and grouped_gemm only");
    CCFUSE_ARG_CHECK(seen.count("--sms") == 0, "--sms applies to --op gemm only");
    return;
  }
  CCFUSE_ARG_CHECK(o.world_size == 0 || o.world_size == 1, "--world-size ", o.world_size,
                   " is not allowed for --op ", o.op, " (single GPU)");
  CCFUSE_ARG_CHECK(o.backend != Backend::kCpu, "--op ", o.op, " needs the GPU backend (no CPU reference world version)");
}

// --op grouped_gemm: E, T and k are required, --m is not an option (m = T * k, set here), and the
// routing must be possible.
void check_grouped_rules(Options& o, const std::set<std::string>& seen) {
  CCFUSE_ARG_CHECK(seen.count("--m") == 0, "--m does not apply to --op grouped_gemm (its rows are --tokens x --topk)");
  CCFUSE_ARG_CHECK(o.experts > 0, "--experts is required for --op grouped_gemm");
  CCFUSE_ARG_CHECK(o.tokens > 0, "--tokens is required for --op grouped_gemm");
  CCFUSE_ARG_CHECK(o.topk > 0, "--topk is required for --op grouped_gemm");
  CCFUSE_ARG_CHECK(o.tokens * o.topk <= kIntMax, "--tokens ", o.tokens, " x --topk ", o.topk,
                   " rows is out of range (at most ", kIntMax, ")");
  CCFUSE_ARG_CHECK(o.routing != Routing::kEmptySome || o.experts >= 2,
                   "--routing empty_some needs --experts of at least 2 (it empties the even experts)");
  o.m = o.tokens * o.topk;
}

// The rules between the sizes and the world size. `defaulted` words the message for a world
// size the user did not give, so that they know which option to set.
void check_shape(const Options& o, bool defaulted) {
  const std::string w = defaulted ? str_cat("the default --world-size ", o.world_size)
                                  : str_cat("--world-size ", o.world_size);
  CCFUSE_ARG_CHECK(o.m % o.world_size == 0, "--m ", o.m, " is not divisible by ", w);
  if (is_k_split(o.op))
    CCFUSE_ARG_CHECK(o.k % o.world_size == 0, "--k ", o.k, " is not divisible by ", w, " (", o.op,
                     " splits K across ranks)");
}

// Multiply-adds of one run on the CPU world plus its fp64 reference: ag_gemm does the full
// [M, N, K] product on every rank; gemm_rs/gemm_ar do it once in total (K split across ranks).
double cpu_macs(const Options& o) {
  const double mnk = double(o.m) * double(o.n) * double(o.k);
  return is_k_split(o.op) ? mnk : mnk * double(o.world_size);
}

// A, B and C elements of all ranks (see kMaxCpuElements).
double cpu_elements(const Options& o) {
  const double m = double(o.m), n = double(o.n), k = double(o.k), w = double(o.world_size);
  if (o.op == "ag_gemm") return m * k + w * k * n + w * m * n;  // A sharded, B and C per rank
  if (o.op == "gemm_rs") return m * k + k * n + m * n;          // everything split W ways
  return m * k + k * n + w * m * n;                             // gemm_ar: C whole on every rank
}

std::string gpus_phrase(int n) { return str_cat(n, n == 1 ? " GPU" : " GPUs"); }

uint64_t fresh_seed() {
  // random_device alone may be deterministic on some platforms; the clock breaks the tie.
  std::random_device rd;
  const uint64_t hi = uint64_t(rd()) << 32 | uint64_t(rd());
  const uint64_t t = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return hi ^ (t * 0x9E3779B97F4A7C15ull);
}

// argv joined back into one line for the JSON "command" field, quoting what a shell would split.
std::string command_line(int argc, const char* const* argv) {
  std::string s = "ccfuse";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i] ? argv[i] : "";
    bool plain = !a.empty();
    for (char c : a)
      plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_=.,/:+@%", c));
    if (plain) {
      s += " " + a;
    } else {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      s += " " + q + "'";
    }
  }
  return s;
}

// One line on the terminal, whatever the message holds (a CCFUSE_CHECK message could carry a
// newline from a formatted value).
std::string one_line(const char* what) {
  std::string s = what ? what : "";
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

const std::vector<std::string>& known_ops() {
  static const std::vector<std::string> ops = {"ag_gemm", "gemm_rs", "gemm_ar", "gemm", "grouped_gemm"};
  return ops;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kCpu: return "cpu";
    case Backend::kGpu: return "gpu";
  }
  return "?";
}

bool is_gemm(const Options& options) { return options.op == "gemm"; }
bool is_grouped(const Options& options) { return options.op == "grouped_gemm"; }
bool is_single_gpu(const Options& options) { return is_gemm(options) || is_grouped(options); }

int64_t local_k(const Options& options) {
  return is_k_split(options.op) && options.world_size > 0 ? options.k / options.world_size : options.k;
}

Options parse_args(int argc, const char* const* argv) {
  Options o;
  CCFUSE_ARG_CHECK(argc >= 2 && argv && argv[1], "no command given (try 'ccfuse --help')");
  const std::string cmd = argv[1];
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    o.command = Command::kHelp;
    return o;
  }
  if (cmd == "version" || cmd == "--version") {
    o.command = Command::kVersion;
    return o;
  }
  if (cmd == "check") {
    o.command = Command::kCheck;
  } else if (cmd == "bench") {
    o.command = Command::kBench;
  } else if (cmd.rfind("--", 0) == 0 && find_spec(cmd.substr(0, cmd.find('='))) != nullptr) {
    throw InvalidArgument(str_cat("no command given before '", cmd, "' (check or bench)"));
  } else {
    throw InvalidArgument(str_cat("unknown command '", cmd, "' (known: check, bench, help)"));
  }

  ParseState st;
  std::set<std::string>& seen = st.seen;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i] ? argv[i] : "";
    if (arg == "--help" || arg == "-h") {
      o.command = Command::kHelp;
      return o;
    }
    CCFUSE_ARG_CHECK(arg.rfind("--", 0) == 0, "unexpected argument '", arg, "' (options start with --)");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpec* spec = find_spec(name);
    CCFUSE_ARG_CHECK(spec != nullptr, "unknown option '", name, "'");
    CCFUSE_ARG_CHECK(!spec->bench_only || o.command == Command::kBench, name, " applies to bench only");
    CCFUSE_ARG_CHECK(seen.insert(name).second, name, " is given more than once");
    std::string value;
    if (!takes_value(name)) {
      CCFUSE_ARG_CHECK(eq == std::string::npos, name, " takes no value");
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      CCFUSE_ARG_CHECK(!value.empty(), name, " needs a value");
    } else {
      // A following option is a forgotten value, not the value ("--m --n 8"); negative numbers
      // ("-5") still reach the range check, which names the rule.
      CCFUSE_ARG_CHECK(i + 1 < argc && argv[i + 1] && std::string(argv[i + 1]).rfind("--", 0) != 0 &&
                           argv[i + 1][0] != '\0',
                       name, " needs a value");
      value = argv[++i];
    }
    set_option(o, st, name, value);
  }

  CCFUSE_ARG_CHECK(!o.op.empty(), "--op is required");
  check_dtype(o, st.dtype_text);
  check_gemm_rules(o, seen);
  if (is_grouped(o)) check_grouped_rules(o, seen);
  CCFUSE_ARG_CHECK(o.m > 0, "--m is required");
  CCFUSE_ARG_CHECK(o.n > 0, "--n is required");
  CCFUSE_ARG_CHECK(o.k > 0, "--k is required");
  if (o.world_size > 0) check_shape(o, /*defaulted=*/false);
  return o;
}

std::string resolve(Options& o, int num_gpus) {
  if (o.command != Command::kCheck && o.command != Command::kBench) return "";
  if (num_gpus < 0) num_gpus = 0;
  if (is_single_gpu(o)) {
    // One GPU, no CPU version: auto means the GPU, and there must be one. (parse_args already
    // refused --backend cpu and world sizes other than 1; options built by hand meet them here.)
    check_gemm_rules(o, {});
    if (o.backend == Backend::kAuto) {
      CCFUSE_ARG_CHECK(num_gpus >= 1, "--op ", o.op,
                       " needs the GPU backend (no CPU reference world version); no GPU found");
      o.backend = Backend::kGpu;
    }
    CCFUSE_ARG_CHECK(num_gpus >= 1, "--backend gpu needs at least 1 GPU; none found");
    o.world_size = 1;
    return "";
  }
  std::string notice;
  if (o.backend == Backend::kAuto) {
    if (num_gpus >= 2) {
      o.backend = Backend::kGpu;
    } else {
      // One GPU cannot show communication overlap; the CPU world at least runs the protocol.
      o.backend = Backend::kCpu;
      notice = str_cat("ccfuse: ", gpus_phrase(num_gpus),
                       " found: running on the CPU reference world (--backend cpu)");
    }
  }
  const bool defaulted = o.world_size == 0;
  if (o.backend == Backend::kGpu) {
    CCFUSE_ARG_CHECK(num_gpus >= 1, "--backend gpu needs at least 1 GPU; none found");
    if (defaulted) o.world_size = num_gpus;
    CCFUSE_ARG_CHECK(o.world_size <= num_gpus, "--world-size ", o.world_size, " is larger than the ",
                     gpus_phrase(num_gpus), " present (--backend gpu)");
  } else {
    if (defaulted) o.world_size = 2;
    CCFUSE_ARG_CHECK(o.world_size <= kMaxCpuWorldSize, "--world-size ", o.world_size,
                     " is larger than the ", kMaxCpuWorldSize,
                     " ranks the CPU reference world runs (--backend cpu)");
  }
  check_shape(o, defaulted);
  if (o.backend == Backend::kCpu)
    CCFUSE_ARG_CHECK(cpu_macs(o) <= kMaxCpuMacs && cpu_elements(o) <= kMaxCpuElements, "--m ", o.m,
                     " --n ", o.n, " --k ", o.k, " is too large for the CPU reference world at --world-size ",
                     o.world_size, " (limits: 2^36 multiply-adds, 2^27 matrix elements; use smaller sizes "
                     "or --backend gpu)");
  return notice;
}

std::string usage() {
  return R"(ccfuse: fused computation + communication kernels; check and time one op.

usage:
  ccfuse check --op OP --m M --n N --k K [--world-size W] [--dtype fp32|bf16]
               [--backend auto|cpu|gpu] [--seed S]
  ccfuse bench --op OP --m M --n N --k K [...check options] [--iters N] [--warmup N] [--json FILE]
  ccfuse check|bench --op gemm --m M --n N --k K [--dtype bf16|fp16] [--b-layout nk|kn] [--sms N]
  ccfuse check|bench --op grouped_gemm --experts E --tokens T --topk K_TOP --n N --k K
               [--routing uniform|zipf|one_hot|empty_some] [--dtype bf16|fp16] [--b-layout nk|kn]
  ccfuse help | --help          this text
  ccfuse --version              the version

commands:
  check   runs OP once on fresh random inputs and compares it with an fp64 reference;
          the last line is PASS or FAIL with the op, shape, seed, rel_err and tolerance
          (tolerance on ||out - ref|| / ||ref||: 1e-6 fp32, 1e-2 bf16)
  bench   times OP (median of --iters runs after --warmup runs) against its parts and prints
          t_fused, t_serial, t_gemm, t_comm, t_limit = max(t_gemm, t_comm), t_peer,
          speedup = t_serial / t_fused, overlap efficiency = (t_serial - t_fused) / (t_serial - t_limit)
          and rel_err; --json FILE appends one JSON Lines record (bench/results format)

ops (W = world size, r = rank; --m is the global M and --k the global K):
  ag_gemm   A_r [M/W, K], B_r [K, N] -> C_r = AllGather_rows(A) @ B_r [M, N]
  gemm_rs   A_r [M, K/W], B_r [K/W, N] -> rows [r*M/W, (r+1)*M/W) of sum_r A_r @ B_r
  gemm_ar   as gemm_rs -> all of sum_r A_r @ B_r [M, N]
  W must divide M; for gemm_rs and gemm_ar W must also divide K (each rank holds K/W).
  gemm      A [M, K] @ B -> C [M, N] on one GPU (the Hopper GEMM engine; GPU backend only,
            world size 1); B is [N, K] (--b-layout nk, a torch Linear weight) or [K, N] (kn).
            bench times it against the best of cuBLASLt's heuristic algorithms on the same
            problem and reports TFLOP/s of both (t_fused = ccfuse, t_gemm = cuBLASLt).
  grouped_gemm  MoE expert GEMMs on one GPU (GPU backend only): the T * K_TOP rows of A [T*K_TOP, K]
            spread over E experts by --routing (expert-sorted); rows of expert e times B_e
            (B [E, N, K] for nk, [E, K, N] for kn). The rows per expert are read from device
            memory. bench times it against cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx,
            one group per non-empty expert) and reports TFLOP/s (2 * T * K_TOP * N * K / t).

options:
  --op OP            ag_gemm | gemm_rs | gemm_ar | gemm (required)
  --m, --n, --k      problem sizes, positive integers (required)
  --world-size W     ranks (default: the GPUs present for gpu, 2 for cpu)
  --dtype D          bf16 (default) | fp32 (TP ops) | fp16 (gemm)
  --backend B        auto (default: gpu with 2 or more GPUs, else cpu) | cpu | gpu
  --seed S           input seed, a non-negative integer (default: fresh; always printed)
  --watchdog-ms T    bound of every wait on another rank (default 5000)
  --block-m, --block-n  tile shape of the CPU reference world (default 64 x 64)
  --b-layout L       gemm, grouped_gemm: B stored nk = [N, K] (default) or kn = [K, N] (per expert)
  --sms N            gemm: SM budget of the persistent grid (default 0 = every SM; at most the GPU's)
  --experts E        grouped_gemm: experts (groups), 1..4096 (required)
  --tokens T         grouped_gemm: tokens before top-k (required); rows = T * K_TOP
  --topk K_TOP       grouped_gemm: rows per token, 1..64 (required)
  --routing R        grouped_gemm: uniform (default: equal split) | zipf (expert e's share ~ 1/(e+1)^1.2)
                     | one_hot (all rows to expert 0) | empty_some (odd experts only; E >= 2)
  --print-config     print the resolved options (key=value lines; gemm: also its engine config;
                     ag_gemm, gemm_rs, gemm_ar: also the TP tuner's choice tp_config= and tp_why=)
  --iters N          bench: timed runs, median reported (default 20)
  --warmup N         bench: untimed runs first (default 3)
  --json FILE        bench: append the record to FILE (JSON Lines)
  options also take the form --name=value

exit codes: 0 pass (or bench done), 1 wrong answer, 2 bad input, 3 runtime error
environment: CCFUSE_COMMIT overrides the commit recorded by --json (default: git rev-parse)
)";
}

std::string format_config(const Options& o) {
  std::ostringstream os;
  os << "command=" << (o.command == Command::kBench ? "bench" : "check") << "\n"
     << "op=" << o.op << "\n"
     << "backend=" << backend_name(o.backend) << "\n"
     << "world_size=" << o.world_size << "\n"
     << "m=" << o.m << "\n"
     << "n=" << o.n << "\n"
     << "k=" << o.k << "\n"
     << "k_per_rank=" << local_k(o) << "\n"
     << "dtype=" << dtype_name(o.dtype) << "\n"
     << "seed=" << (o.seed ? std::to_string(*o.seed) : std::string("fresh")) << "\n"
     << "watchdog_ms=" << o.watchdog_ms << "\n"
     << "block_m=" << o.block_m << "\n"
     << "block_n=" << o.block_n << "\n";
  if (is_gemm(o))
    os << "b_layout=" << gemm::b_layout_name(o.b_layout) << "\n"
       << "sms=" << o.sms << "\n";
  if (is_grouped(o)) {
    os << "b_layout=" << gemm::b_layout_name(o.b_layout) << "\n"
       << "experts=" << o.experts << "\n"
       << "tokens=" << o.tokens << "\n"
       << "topk=" << o.topk << "\n"
       << "routing=" << routing_name(o.routing) << "\n"
       << "group_rows=";
    const auto rows = grouped_rows(o.experts, o.m, o.routing);
    for (size_t e = 0; e < rows.size(); ++e) os << (e ? "," : "") << rows[e];
    os << "\n";
  }
  if (o.command == Command::kBench)
    os << "iters=" << o.iters << "\n"
       << "warmup=" << o.warmup << "\n"
       << "json=" << o.json_path << "\n";
  return os.str();
}

namespace {
// --print-config of the fused TP ops: the tuner's choice (include/ccfuse/tp/tuner.h) for the
// resolved options, two lines; "tp_config=none (<rule>)" where the tuner refuses the problem.
// The SM count is the H200's (132): the tool does not ask the GPU for it.
std::string format_tp_config(const Options& o) {
  tp::TpProblem p;
  p.op = o.op;
  p.world_size = o.world_size;
  p.m = o.m;
  p.n = o.n;
  p.k_per_rank = local_k(o);
  p.dtype = o.dtype;
  p.num_sms = 132;
  try {
    const tp::TpChoice c = tp::choose_tp_config(p);
    return str_cat("tp_config=", tp::to_string(c), "\ntp_why=", c.why, "\n");
  } catch (const InvalidArgument& e) {
    return str_cat("tp_config=none (", e.what(), ")\n");
  }
}
}  // namespace

int run_tool_with(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                  const GpuHooks& gpu) {
  // Everything is caught here: the tool reports and returns a code, it never aborts.
  try {
    Options o = parse_args(argc, argv);
    if (o.command == Command::kHelp) {
      out << usage();
      return 0;
    }
    if (o.command == Command::kVersion) {
      out << "ccfuse " << CCFUSE_VERSION << "\n";
      return 0;
    }
    // An explicit CPU run never asks the GPU side: counting GPUs initialises CUDA (slow, and it
    // can fail on a broken driver, which should not stop a CPU check).
    const int num_gpus = o.backend != Backend::kCpu && gpu.count_gpus ? gpu.count_gpus() : 0;
    const std::string notice = resolve(o, num_gpus);
    const bool on_gpu = o.backend == Backend::kGpu;
    CCFUSE_CHECK(!on_gpu || (gpu.check && gpu.bench), "no GPU backend linked");

    // Opened before the (possibly long) run, so that a bad path is bad input, not lost work.
    std::ofstream json;
    if (o.command == Command::kBench && !o.json_path.empty()) {
      json.open(o.json_path, std::ios::app);
      CCFUSE_ARG_CHECK(json.is_open(), "--json ", o.json_path, " cannot be opened for appending: ",
                       std::strerror(errno));
    }
    if (!notice.empty()) err << notice << "\n";
    if (!o.seed) o.seed = fresh_seed();
    if (o.print_config) {
      out << format_config(o);
      // The engine's choice needs the GPU (its SM count): the GPU side formats it.
      if (is_single_gpu(o) && on_gpu && gpu.gemm_config) out << "gemm_config=" << gpu.gemm_config(o) << "\n";
      if (o.op == "ag_gemm" || is_k_split(o.op)) out << format_tp_config(o);
      out << std::flush;
    }

    if (o.command == Command::kCheck) {
      const CheckResult r = on_gpu ? gpu.check(o, err) : cpu_check(o, err);
      out << check_line(o, r) << "\n" << std::flush;
      return r.pass ? 0 : 1;
    }

    BenchRecord rec = on_gpu ? gpu.bench(o, err) : cpu_bench(o, err);
    // The tool knows these better than any backend; the backend names the hardware (gpu).
    rec.op = o.op;
    rec.world_size = o.world_size;
    rec.m = o.m;
    rec.n = o.n;
    rec.k = o.k;
    if (is_grouped(o)) {
      rec.experts = o.experts;
      rec.topk = o.topk;
      rec.tokens_per_rank = o.tokens;
      rec.routing = routing_name(o.routing);
      if (rec.b_layout.empty()) rec.b_layout = gemm::b_layout_name(o.b_layout);
      if (rec.group_rows.empty()) rec.group_rows = grouped_rows(o.experts, o.m, o.routing);
    }
    rec.dtype = dtype_name(o.dtype);
    rec.backend = backend_name(o.backend);
    rec.command = command_line(argc, argv);
    if (rec.gpu.empty()) rec.gpu = "unknown";
    if (rec.commit.empty()) rec.commit = current_commit();
    if (rec.date.empty()) rec.date = iso_utc_now();
    out << format_bench_table(rec);

    // A timing of a wrong answer is not a result: report it and keep it out of the records.
    // A negative rel_err means the backend did not check (recorded as null), not a failure.
    const double tol = tolerance_for(o.dtype, o.k);
    const CheckResult r{!std::isnan(rec.rel_err) && rec.rel_err <= tol, rec.rel_err, tol};
    if (!r.pass) {
      out << check_line(o, r) << " (bench result not recorded)\n" << std::flush;
      return 1;
    }
    if (json.is_open()) {
      json << to_json_line(rec) << "\n";
      json.flush();
      CCFUSE_CHECK(json.good(), "writing --json ", o.json_path, " failed");
      out << "appended 1 record to " << o.json_path << "\n";
    }
    out << std::flush;
    return 0;
  } catch (const InvalidArgument& e) {
    err << "ccfuse: error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const Error& e) {
    err << "ccfuse: error: " << one_line(e.what()) << "\n";
    return 3;
  } catch (const std::bad_alloc&) {
    err << "ccfuse: error: out of memory (try smaller --m/--n/--k)\n";
    return 3;
  } catch (const std::exception& e) {
    err << "ccfuse: internal error: " << one_line(e.what()) << "\n";
    return 3;
  } catch (...) {
    err << "ccfuse: internal error: unknown exception\n";
    return 3;
  }
}

int run_tool(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  return run_tool_with(argc, argv, out, err, GpuHooks{&count_gpus, &gpu_check, &gpu_bench, &gpu_gemm_config});
}

int env_int(const char* name, int fallback, int lo, int hi, const char* unit) {
  const char* v = std::getenv(name);
  if (v == nullptr || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  CCFUSE_ARG_CHECK(end != v && *end == 0 && x >= lo && x <= hi, name, " '", v, "' must be a number of ", unit,
                   " in [", lo, ", ", hi, "]");
  return int(x);
}

int bench_steady_ms() { return env_int("CCFUSE_BENCH_STEADY_MS", 0, 0, 10000, "milliseconds"); }

}  // namespace ccfuse::tool
