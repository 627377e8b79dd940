// src/tool/gpu_gemm_bench.cu: `ccfuse check|bench --op gemm`, the Hopper GEMM engine on one GPU
// (device 0), against an fp64 host reference and against cuBLASLt.
//
//   C [M, N] = A [M, K] @ B,  B [N, K] (--b-layout nk, default) or [K, N] (kn), bf16 or fp16,
//   fp32 accumulation; the engine's config is gemm::choose_config(desc, SM budget).
//
// check: inputs from fill_uniform (seed, rank 0, A = 0 / B = 1) rounded to the dtype, C poisoned
//   with 0xFF bytes (NaN in bf16 and fp16), one run, then every element must be finite and
//   ‖C − ref‖/‖ref‖ over the compared rows within tolerance_for(dtype). All rows are compared up to
//   kFullCheckMacs multiply-adds; past it one random row per 128-row band plus the last row (the
//   full scan for NaN/poison still covers every element).
// bench: the same inputs copied into enough buffer sets that rotating through them streams more
//   than 4x the 60 MB L2; CUDA events around every run, the runs queued back to back behind a
//   stream hold (so that host launch cost never shows as GPU time), warm-up, median of --iters:
//   (a) ccfuse with its config; (b) cuBLASLt on exactly the same problem (row-major C = A B as
//   column-major C^T = op(B)^T A^T): each of up to kMaxCublasAlgos heuristic algorithms timed over
//   a few runs first, then the best one timed like (a), right after (a). Both results are checked
//   on sampled rows against fp64 (rel_err, rel_err_cublas) and scanned whole for NaN/poison; a
//   wrong cuBLASLt result is an error (exit 3), not a baseline.
// NOTE: with an SM budget (--sms N below the GPU's count), cuBLASLt gets the same number as its
//   SM_COUNT_TARGET: a heuristic hint for kernels sharing the GPU, not a hard limit.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "ccfuse/common/cublas_check.h"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"
#include "ccfuse/gemm/gemm.h"
#include "src/tool/cli.h"
#include "src/tool/gpu_bench_util.cuh"


namespace ccfuse::tool {

namespace {

using detail::str_cat;

constexpr int kDevice = 0;
// Rotated input sets stream at least this much per pass: > 4x the H200's 60 MB L2.
constexpr size_t kRotateBytes = size_t(256) << 20;
constexpr int kMaxSets = 64;
constexpr size_t kCublasWorkspace = size_t(64) << 20;
// cuBLASLt heuristic algorithms tried (the first ones are its own favourites), each over a few runs.
constexpr int kMaxCublasAlgos = 16;
constexpr int kAlgoWarmup = 0, kAlgoRuns = 3;  // after median_ms's own first (loading) run
// check compares every row up to this many multiply-adds (a second or two on the host's cores).
constexpr double kFullCheckMacs = 17179869184.0;  // 2^34
constexpr int kBandRows = 128;
// bench: output rows compared with fp64 (random ones and the last, which holds any partial tile).
constexpr int kBenchSampleRows = 4;

// ---- host side: 16-bit values, inputs, the fp64 reference -----------------------------------

uint16_t encode(float f, DType t) {
  if (t == DType::kBFloat16) return bf16::from_float(f).bits;
  const __half_raw r = __float2half_rn(f);
  return r.x;
}

// One input tensor: its 16-bit encoding (uploaded) and the same values as floats (the reference
// sees exactly what the GPU sees).
struct HostTensor {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

HostTensor make_tensor(uint64_t seed, int which, size_t count, DType t) {
  HostTensor h;
  h.values.resize(count);
  fill_uniform(seed, /*rank=*/0, which, h.values.data(), count);
  h.bits.resize(count);
  const Decoder decode(t);
  parallel_for(count, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      h.bits[i] = encode(h.values[i], t);
      h.values[i] = decode(h.bits[i]);
    }
  });
  return h;
}

struct HostInputs {
  HostTensor a, b;  // A [M, K]; B [N, K] (nk) or [K, N] (kn)
};

HostInputs make_inputs(const Options& o) {
  HostInputs in;
  // The two tensors come from independent streams: generate them side by side.
  std::exception_ptr a_error;
  std::thread a_thread([&] {
    try {
      in.a = make_tensor(*o.seed, 0, size_t(o.m * o.k), o.dtype);
    } catch (...) {
      a_error = std::current_exception();  // e.g. bad_alloc: rethrown below, not std::terminate
    }
  });
  try {
    in.b = make_tensor(*o.seed, 1, size_t(o.k * o.n), o.dtype);
  } catch (...) {
    a_thread.join();
    throw;
  }
  a_thread.join();
  if (a_error) std::rethrow_exception(a_error);
  return in;
}

// fp64 rows of A @ B: out[i * n + j] for row rows[i]. Products of two 16-bit values are exact
// in float (at most 22 significant bits), so only the sums need doubles.
std::vector<double> reference_rows(const Options& o, const HostInputs& in, const std::vector<int64_t>& rows) {
  const int64_t n = o.n, k = o.k;
  constexpr int64_t kBlock = 128;  // output columns per work item
  const int64_t col_blocks = ceil_div(n, kBlock);
  const int64_t items = int64_t(rows.size()) * col_blocks;
  std::vector<double> out(rows.size() * size_t(n));
  std::atomic<int64_t> next{0};
  const bool nk = o.b_layout == gemm::BLayout::kNK;
  auto worker = [&] {
    double acc[kBlock];
    for (int64_t item = next++; item < items; item = next++) {
      const size_t i = size_t(item / col_blocks);
      const int64_t j0 = (item % col_blocks) * kBlock, cols = std::min(kBlock, n - j0);
      const float* a = in.a.values.data() + size_t(rows[i] * k);
      const float* b = in.b.values.data();
      std::fill(acc, acc + cols, 0.0);
      if (nk) {  // B [N, K]: a dot product per column
        for (int64_t j = 0; j < cols; ++j) {
          const float* bj = b + size_t((j0 + j) * k);
          double s[4] = {0, 0, 0, 0};  // four chains: the adds of one would wait on each other
          int64_t kk = 0;
          for (; kk + 4 <= k; kk += 4)
            for (int u = 0; u < 4; ++u) s[u] += double(a[kk + u] * bj[kk + u]);
          for (; kk < k; ++kk) s[0] += double(a[kk] * bj[kk]);
          acc[j] = (s[0] + s[1]) + (s[2] + s[3]);
        }
      } else {  // B [K, N]: rows of B, contiguous in the output columns
        for (int64_t kk = 0; kk < k; ++kk) {
          const float av = a[kk];
          const float* bk = b + size_t(kk * n + j0);
          for (int64_t j = 0; j < cols; ++j) acc[j] += double(av * bk[j]);
        }
      }
      std::copy(acc, acc + cols, out.begin() + std::ptrdiff_t(i * size_t(n) + size_t(j0)));
    }
  };
  std::vector<std::thread> threads;
  const int num_threads = int(std::min<int64_t>(host_threads(), std::max<int64_t>(items, 1)));
  for (int t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return out;
}

// ---- device side ---------------------------------------------------------------------------

struct DeviceInfo {
  std::string name;
  int sms = 0;     // SMs of the GPU
  int budget = 0;  // SMs the GEMM may use (--sms, 0 = all)
};

DeviceInfo device_info(const Options& o) {
  CCFUSE_CUDA_CHECK(cudaSetDevice(kDevice));
  cudaDeviceProp prop{};
  CCFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, kDevice));
  DeviceInfo d{prop.name, prop.multiProcessorCount, 0};
  CCFUSE_ARG_CHECK(o.sms <= d.sms, "--sms ", o.sms, " is more than the ", d.sms, " SMs of GPU ", kDevice, " (",
                   d.name, ")");
  d.budget = o.sms > 0 ? o.sms : d.sms;
  return d;
}

gemm::GemmDesc desc_of(const Options& o) {
  return gemm::make_desc(o.m, o.n, o.k, o.dtype, o.b_layout);  // packed leading dimensions
}

// The engine's config for the options, validated (bad shapes are bad input: exit code 2).
// A/B runs (docs/perf-notes.md) replace the engine's choice by one TMA-store tile setting:
//   CCFUSE_GEMM_TMA_STORE=1  128x256x64/3 whole tiles
//   CCFUSE_GEMM_TILE_N=192   128x192x64/4 whole tiles
//   CCFUSE_GEMM_TILE_N=128   128x128x64/5 whole tiles (what cuBLASLt takes for K <= 1024)
//   CCFUSE_GEMM_PINGPONG=1   128x128x64/5 whole tiles with ping-pong consumers (GemmConfig::pingpong)
//   CCFUSE_GEMM_PINGPONG=6   the same with 6 stages, each warpgroup staging through one 128x64 sub-tile
//   CCFUSE_GEMM_PINGPONG=160 ping-pong on 128x160x64/5 (two 128x32 staging slots a warpgroup; nk, unpaired)
//   CCFUSE_GEMM_TILE_N=96    128x96x64/7 whole tiles (B [N, K] only: --b-layout nk)
//   CCFUSE_GEMM_TILE_N=64    128x64x64/8 whole tiles (opt-in, 2026-12-01: not measured yet)
//   CCFUSE_GEMM_TILE_N=160   128x160x64/5 whole tiles (B [N, K] only)
//   CCFUSE_GEMM_TILE_N=224   128x224x64/3 whole tiles (B [N, K] only)
//   CCFUSE_GEMM_TILE_N=80    128x80x64/7 whole tiles (B [N, K] only)
//   CCFUSE_GEMM_TILE_N=48    128x48x64/9 whole tiles (B [N, K] only)
//   CCFUSE_GEMM_CLUSTER_N=2  with TILE_N=128 or 96: CTA pairs along N sharing A (GemmConfig::cluster_n)
//   CCFUSE_GEMM_STREAM_K=1   128x128x64/5 stream-K (opt-in: measured slower than whole tiles)
//   CCFUSE_GEMM_SPLIT_K=N    128x128x64/5 split-K in N parts
//   CCFUSE_GEMM_CLUSTER_M=N  CTA pairs sharing B off (1) or on (2)
//   CCFUSE_GEMM_GROUP_M=N    the row-major raster in groups of N row tiles (default 8)
//   CCFUSE_GEMM_ORDER=col    the column-major raster
gemm::GemmConfig config_of(const Options& o, const DeviceInfo& dev) {
  const gemm::GemmDesc desc = desc_of(o);
  gemm::GemmConfig cfg = gemm::choose_config(desc, dev.budget);
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  auto force = [&](int block_n, int stages, bool stream_k, int split_k, int cluster_m) {
    cfg.block_m = 128;
    cfg.block_n = block_n;
    cfg.block_k = 64;
    cfg.stages = stages;
    cfg.tma_store = true;
    cfg.stream_k = stream_k;
    cfg.split_k = split_k;
    cfg.cluster_m = cluster_m;
    cfg.pingpong = false;  // a forced tile replaces choose_config's ping-pong too (PINGPONG sets it)
  };
  const int pairs = desc.m > 128 ? 2 : 1;  // CTA pairs need two row tiles
  if (env("CCFUSE_GEMM_TMA_STORE") == "1") force(256, 3, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "192") force(192, 4, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "96") force(96, 7, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "64") force(64, 8, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "160") force(160, 5, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "224") force(224, 3, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "80") force(80, 7, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "48") force(48, 9, false, 1, pairs);
  if (env("CCFUSE_GEMM_TILE_N") == "128") force(128, 5, false, 1, pairs);
  if (env("CCFUSE_GEMM_PINGPONG") == "1" || env("CCFUSE_GEMM_PINGPONG") == "6") {
    force(128, env("CCFUSE_GEMM_PINGPONG") == "6" ? 6 : 5, false, 1, pairs);
    cfg.pingpong = true;
  }
  if (env("CCFUSE_GEMM_PINGPONG") == "160") {
    force(160, 5, false, 1, 1);
    cfg.pingpong = true;
  }
  // CCFUSE_GEMM_CLUSTER_N=2 on top of a 128- or 96-column tile: the CTA pairs along N, sharing A
  // (GemmConfig::cluster_n).
  if (env("CCFUSE_GEMM_CLUSTER_N") == "2") {
    cfg.cluster_m = 1;
    cfg.cluster_n = 2;
  }
  if (env("CCFUSE_GEMM_STREAM_K") == "1") force(128, 5, true, 1, 1);
  if (const int parts = std::atoi(env("CCFUSE_GEMM_SPLIT_K").c_str()); parts > 1) force(128, 5, false, parts, 1);
  // CTA pairs off (1) or on (2) on top of any whole-tile setting above.
  if (const int cm = std::atoi(env("CCFUSE_GEMM_CLUSTER_M").c_str()); cm > 0) cfg.cluster_m = cm;
  // The tile raster on top of any of the above (L2 reuse): rows of group_m tiles, or column-major.
  if (const int g = std::atoi(env("CCFUSE_GEMM_GROUP_M").c_str()); g > 0) cfg.group_m = g;
  if (env("CCFUSE_GEMM_ORDER") == "col") cfg.order = gemm::TileOrder::kColumnMajor;
  gemm::validate(desc, cfg);
  return cfg;
}


// ---- cuBLASLt: the same problem ------------------------------------------------------------

// Row-major C [M, N] = A [M, K] B is column-major C^T [N, M] = X Y with Y = A^T (A row-major is
// a column-major [K, M] matrix, ld K) and X = B^T: for B [K, N] row-major (kn) X is B's memory
// read column-major as [N, K] (ld N, no transpose); for B [N, K] row-major (nk) B's memory is a
// column-major [K, N] matrix (ld K) and X = its transpose (op T).
class CublasLtGemm {
 public:
  CublasLtGemm(const Options& o, int sm_count_target) {
    const cudaDataType_t t = o.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
    const bool nk = o.b_layout == gemm::BLayout::kNK;
    CCFUSE_CUBLAS_CHECK(cublasLtCreate(&handle_));
    CCFUSE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_x = nk ? CUBLAS_OP_T : CUBLAS_OP_N, trans_y = CUBLAS_OP_N;
    CCFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_x, sizeof(trans_x)));
    CCFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_y, sizeof(trans_y)));
    if (sm_count_target > 0) {
      const int32_t target = sm_count_target;
      CCFUSE_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)));
    }
    const uint64_t m = uint64_t(o.m), n = uint64_t(o.n), k = uint64_t(o.k);
    CCFUSE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x_, t, nk ? k : n, nk ? n : k, int64_t(nk ? k : n)));
    CCFUSE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&y_, t, k, m, int64_t(k)));
    CCFUSE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, t, n, m, int64_t(n)));
    CCFUSE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
    const uint64_t ws = kCublasWorkspace;
    CCFUSE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  }
  ~CublasLtGemm() {
    if (pref_) cublasLtMatmulPreferenceDestroy(pref_);
    for (auto l : {x_, y_, c_})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (op_) cublasLtMatmulDescDestroy(op_);
    if (handle_) cublasLtDestroy(handle_);
  }
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Up to `max` algorithms, cuBLASLt's preferred first.
  std::vector<cublasLtMatmulHeuristicResult_t> algorithms(int max) const {
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max));
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, op_, x_, y_, c_, c_, pref_, max, results.data(), &returned);
    if (st != CUBLAS_STATUS_SUCCESS) return {};  // e.g. NOT_SUPPORTED: no baseline, reported as such
    results.resize(size_t(std::max(returned, 0)));
    results.erase(std::remove_if(results.begin(), results.end(),
                                 [](const cublasLtMatmulHeuristicResult_t& r) {
                                   return r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kCublasWorkspace;
                                 }),
                  results.end());
    return results;
  }

  // C = A @ B with algorithm `algo`; false if this algorithm refuses to run (it is then skipped).
  bool run(const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* c, void* workspace,
           cudaStream_t stream) const {
    const float alpha = 1.f, beta = 0.f;
    return cublasLtMatmul(handle_, op_, &alpha, b, x_, a, y_, &beta, c, c_, c, c_, &algo, workspace,
                          kCublasWorkspace, stream) == CUBLAS_STATUS_SUCCESS;
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t x_ = nullptr, y_ = nullptr, c_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
};

std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    int32_t v = -1;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
    return int(v);
  };
  return str_cat("id=", get(CUBLASLT_ALGO_CONFIG_ID), " tile=", get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                 " stages=", get(CUBLASLT_ALGO_CONFIG_STAGES_ID), " splitk=", get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                 " cluster=", get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

double tflops_of(const Options& o, double ms) {
  return ms > 0 ? 2.0 * double(o.m) * double(o.n) * double(o.k) / (ms * 1e9) : -1;
}

// Sampled output rows of bench: random ones plus the last row, sorted, distinct.
std::vector<int64_t> sample_rows(const Options& o) {
  std::mt19937_64 pick(*o.seed ^ 0x9E3779B97F4A7C15ull);
  std::vector<int64_t> rows{o.m - 1};
  for (int i = 0; i < kBenchSampleRows; ++i) rows.push_back(int64_t(pick() % uint64_t(o.m)));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace

std::string gpu_gemm_config(const Options& o) {
  if (is_grouped(o)) return gpu_grouped_config(o);  // gpu_grouped_bench.cu
  const DeviceInfo dev = device_info(o);
  return gemm::to_string(config_of(o, dev));
}

CheckResult gpu_gemm_check(const Options& o, std::ostream& log) {
  CCFUSE_CHECK(o.seed.has_value(), "gemm check needs a resolved seed");
  const DeviceInfo dev = device_info(o);
  const gemm::GemmConfig cfg = config_of(o, dev);
  const gemm::GemmDesc desc = desc_of(o);
  log << "gpu: gemm on " << dev.name << " (" << dev.sms << " SMs), b_layout=" << gemm::b_layout_name(o.b_layout)
      << ", config " << gemm::to_string(cfg) << "\n";

  const HostInputs in = make_inputs(o);
  const size_t c_count = size_t(o.m * o.n);
  DeviceBuffer a(in.a.bits.size() * 2), b(in.b.bits.size() * 2), c(c_count * 2);
  Stream stream;
  CCFUSE_CUDA_CHECK(cudaMemcpy(a.get(), in.a.bits.data(), in.a.bits.size() * 2, cudaMemcpyHostToDevice));
  CCFUSE_CUDA_CHECK(cudaMemcpy(b.get(), in.b.bits.data(), in.b.bits.size() * 2, cudaMemcpyHostToDevice));
  CCFUSE_CUDA_CHECK(cudaMemset(c.get(), 0xFF, c_count * 2));  // poison: every element must be written
  gemm::run(desc, cfg, a.get(), b.get(), c.get(), stream.s);
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.s));

  std::vector<uint16_t> c_bits(c_count);
  CCFUSE_CUDA_CHECK(cudaMemcpy(c_bits.data(), c.get(), c_count * 2, cudaMemcpyDeviceToHost));
  const uint16_t mask = exponent_mask(o.dtype);
  int64_t bad = 0, first_bad = -1;
  for (size_t i = 0; i < c_count; ++i) {
    if ((c_bits[i] & mask) == mask) {
      if (first_bad < 0) first_bad = int64_t(i);
      ++bad;
    }
  }
  if (bad > 0)
    log << "gpu: " << bad << " of " << c_count << " output elements are NaN/Inf or unwritten (first at row "
        << first_bad / o.n << ", column " << first_bad % o.n << ")\n";

  // Rows compared with fp64: all of them when that is cheap, else one per band of 128 rows (so
  // every row tile is seen) and the last row.
  std::vector<int64_t> rows;
  const bool all_rows = double(o.m) * double(o.n) * double(o.k) <= kFullCheckMacs;
  if (all_rows) {
    for (int64_t r = 0; r < o.m; ++r) rows.push_back(r);
  } else {
    std::mt19937_64 pick(*o.seed ^ 0xC0FFEEull);
    for (int64_t r0 = 0; r0 < o.m; r0 += kBandRows)
      rows.push_back(r0 + int64_t(pick() % uint64_t(std::min<int64_t>(kBandRows, o.m - r0))));
    if (rows.back() != o.m - 1) rows.push_back(o.m - 1);
  }
  const auto t0 = Clock::now();
  const std::vector<double> want = reference_rows(o, in, rows);
  const Decoder decode(o.dtype);
  std::vector<double> got;
  got.reserve(want.size());
  for (int64_t r : rows)
    for (int64_t j = 0; j < o.n; ++j) got.push_back(double(decode(c_bits[size_t(r * o.n + j)])));
  if (o.inject_fault && !got.empty()) got[got.size() / 2] += 1000.0;
  log << "gpu: compared " << (all_rows ? "all " : "") << rows.size() << " rows of " << o.m
      << (all_rows ? "" : " (one per 128-row band and the last)") << " with fp64 in "
      << int(seconds_since(t0) * 1000) << " ms; scanned all " << c_count << " elements for NaN/poison\n";

  CheckResult res;
  res.rel_err = bad > 0 ? INFINITY : row_error(got, want).rel();
  res.tolerance = tolerance_for(o.dtype, o.k);
  res.pass = res.rel_err <= res.tolerance;
  return res;
}

BenchRecord gpu_gemm_bench(const Options& o, std::ostream& log) {
  CCFUSE_CHECK(o.seed.has_value(), "gemm bench needs a resolved seed");
  const auto t_start = Clock::now();
  const DeviceInfo dev = device_info(o);
  const gemm::GemmConfig cfg = config_of(o, dev);
  const gemm::GemmDesc desc = desc_of(o);
  const std::string config = gemm::to_string(cfg);

  const HostInputs in = make_inputs(o);
  const size_t a_bytes = in.a.bits.size() * 2, b_bytes = in.b.bits.size() * 2, c_bytes = size_t(o.m * o.n) * 2;
  const size_t set_bytes = a_bytes + b_bytes + c_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  CCFUSE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t room = free_bytes > (size_t(1) << 30) ? free_bytes - (size_t(1) << 30) : 0;  // workspace, slack
  const size_t wanted_sets = size_t(ceil_div(int64_t(kRotateBytes), int64_t(set_bytes)));
  const int num_sets = int(std::clamp<size_t>(std::min(wanted_sets, room / set_bytes), 1, kMaxSets));
  log << "gpu: gemm on " << dev.name << " (" << dev.sms << " SMs, budget " << dev.budget << "), b_layout="
      << gemm::b_layout_name(o.b_layout) << ", config " << config << "; " << num_sets << " rotated input sets, "
      << o.warmup << " warm-up + " << o.iters << " timed runs (inputs ready in "
      << int(seconds_since(t_start) * 1000) << " ms)\n";

  std::vector<std::unique_ptr<DeviceBuffer>> a, b, c;
  for (int i = 0; i < num_sets; ++i) {
    a.push_back(std::make_unique<DeviceBuffer>(a_bytes));
    b.push_back(std::make_unique<DeviceBuffer>(b_bytes));
    c.push_back(std::make_unique<DeviceBuffer>(c_bytes));
  }
  CCFUSE_CUDA_CHECK(cudaMemcpy(a[0]->get(), in.a.bits.data(), a_bytes, cudaMemcpyHostToDevice));
  CCFUSE_CUDA_CHECK(cudaMemcpy(b[0]->get(), in.b.bits.data(), b_bytes, cudaMemcpyHostToDevice));
  for (int i = 1; i < num_sets; ++i) {
    CCFUSE_CUDA_CHECK(cudaMemcpy(a[size_t(i)]->get(), a[0]->get(), a_bytes, cudaMemcpyDeviceToDevice));
    CCFUSE_CUDA_CHECK(cudaMemcpy(b[size_t(i)]->get(), b[0]->get(), b_bytes, cudaMemcpyDeviceToDevice));
  }
  Stream stream;
  const auto set_of = [&](int it) { return size_t(it % num_sets); };

  // Sampled rows against fp64, once for both GEMMs; the output of set 0 is poisoned first.
  const std::vector<int64_t> rows = sample_rows(o);
  const std::vector<double> want = reference_rows(o, in, rows);
  const Decoder decode(o.dtype);
  const auto checked_rel_err = [&](const char* who, bool inject, auto&& run_set0) {
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(c[0]->get(), 0xFF, c_bytes, stream.s));
    run_set0();
    const int64_t bad = non_finite_on_device(c[0]->get(), size_t(o.m * o.n), o.dtype, stream.s);
    if (bad > 0) log << "gpu: " << who << ": " << bad << " output elements are NaN/Inf or unwritten\n";
    std::vector<double> got = download_rows(c[0]->get(), o.n, rows, decode);
    if (inject && !got.empty()) got[got.size() / 2] += 1000.0;
    return bad > 0 ? double(INFINITY) : row_error(got, want).rel();
  };

  // cuBLASLt's candidates first: a quick pass over its heuristic algorithms (which also brings
  // the GPU to its running clocks before the two timings that matter).
  const int sm_target = dev.budget < dev.sms ? dev.budget : 0;
  CublasLtGemm lt(o, sm_target);
  DeviceBuffer workspace(kCublasWorkspace);
  const auto algos = lt.algorithms(kMaxCublasAlgos);
  double best_quick = INFINITY;
  int best = -1;
  for (size_t i = 0; i < algos.size(); ++i) {
    bool ok = true;
    const double ms = median_ms(stream.s, kAlgoWarmup, kAlgoRuns, log, [&](int it) {
      const size_t s = set_of(it);
      ok = ok && lt.run(algos[i].algo, a[s]->get(), b[s]->get(), c[s]->get(), workspace.get(), stream.s);
    });
    if (ok && ms < best_quick) best_quick = ms, best = int(i);
  }

  // (a) ccfuse with its config, (b) the best cuBLASLt algorithm, timed alike and interleaved.
  const auto ccfuse_run = [&](int it) {
    const size_t s = set_of(it);
    gemm::run(desc, cfg, a[s]->get(), b[s]->get(), c[s]->get(), stream.s);
  };
  double t_ccfuse = -1, t_cublas = -1, rel_err_cublas = -1;
  std::string algo_text;
  std::function<void(int)> cublas_run;
  if (best >= 0) {
    const cublasLtMatmulAlgo_t algo = algos[size_t(best)].algo;
    algo_text = describe_algo(algo);
    cublas_run = [&, algo](int it) {
      const size_t s = set_of(it);
      CCFUSE_CHECK(lt.run(algo, a[s]->get(), b[s]->get(), c[s]->get(), workspace.get(), stream.s),
                   "cuBLASLt algorithm ", algo_text, " failed on its second use");
    };
    const auto t = medians_interleaved(stream.s, o.warmup, o.iters, log, {ccfuse_run, cublas_run});
    t_ccfuse = t[0];
    t_cublas = t[1];
    log << "gpu: ccfuse gemm " << t_ccfuse << " ms (" << tflops_of(o, t_ccfuse) << " TFLOP/s)\n";
    log << "gpu: cuBLASLt " << t_cublas << " ms (" << tflops_of(o, t_cublas) << " TFLOP/s), best of " << algos.size()
        << " heuristic algorithms: #" << best << " " << algo_text << " (timed interleaved with ccfuse)\n";
  } else {
    t_ccfuse = median_ms(stream.s, o.warmup, o.iters, log, ccfuse_run);
    log << "gpu: ccfuse gemm " << t_ccfuse << " ms (" << tflops_of(o, t_ccfuse) << " TFLOP/s)\n";
    log << "gpu: cuBLASLt offered no algorithm for this problem: no baseline\n";
  }
  // Each alone, back to back (CCFUSE_BENCH_STEADY_MS): at the power cap, at the clock its own power
  // allows. Two rounds in turn (ccfuse, cuBLASLt, ccfuse, cuBLASLt), the first third of each
  // run's calls not counted (the clock settling); the mean of the two rounds' medians.
  double t_ccfuse_steady = -1, t_cublas_steady = -1;
  if (const int steady = bench_steady_ms(); steady > 0 && cublas_run) {
    const int n_ours = std::max(30, int(steady / std::max(t_ccfuse, 1e-3)));
    const int n_cublas = std::max(30, int(steady / std::max(t_cublas, 1e-3)));
    double sum_ours = 0, sum_cublas = 0;
    for (int round = 0; round < 2; ++round) {
      sum_ours += median_ms(stream.s, n_ours / 3, n_ours, log, ccfuse_run);
      sum_cublas += median_ms(stream.s, n_cublas / 3, n_cublas, log, cublas_run);
    }
    t_ccfuse_steady = sum_ours / 2, t_cublas_steady = sum_cublas / 2;
    log << "gpu: back to back for ~" << steady << " ms each: ccfuse " << t_ccfuse_steady << " ms, cuBLASLt "
        << t_cublas_steady << " ms (" << 100.0 * t_cublas_steady / t_ccfuse_steady << " %)\n";
  }

  // Both results on the sampled rows (and the whole output scanned for NaN/poison).
  const double rel_err = checked_rel_err("ccfuse", o.inject_fault, [&] { ccfuse_run(0); });
  if (cublas_run) {
    rel_err_cublas = checked_rel_err("cuBLASLt", false, [&] { cublas_run(0); });
    // A baseline that computes something else is no baseline.
    const double tol = tolerance_for(o.dtype, o.k);
    CCFUSE_CHECK(!(rel_err_cublas > tol), "the cuBLASLt baseline's result is wrong (rel_err ", rel_err_cublas,
                 " > ", tol, "): it does not solve the same problem");
  }

  BenchRecord rec;
  rec.op = o.op;
  rec.dtype = dtype_name(o.dtype);
  rec.gpu = dev.name;
  rec.backend = "gpu";
  rec.world_size = 1;
  rec.m = o.m, rec.n = o.n, rec.k = o.k;
  rec.t_fused_ms = t_ccfuse;
  rec.t_gemm_ms = t_cublas;
  rec.rel_err = rel_err;
  rec.rel_err_cublas = rel_err_cublas;
  rec.tflops = tflops_of(o, t_ccfuse);
  rec.tflops_cublas = tflops_of(o, t_cublas);
  rec.pct_of_cublas = t_cublas > 0 ? 100.0 * t_cublas / t_ccfuse : -1;
  if (t_ccfuse_steady > 0 && t_cublas_steady > 0) {
    rec.steady_ms = bench_steady_ms();
    rec.t_fused_steady_ms = t_ccfuse_steady;
    rec.t_gemm_steady_ms = t_cublas_steady;
    rec.pct_of_cublas_steady = 100.0 * t_cublas_steady / t_ccfuse_steady;
  }
  rec.config = config;
  rec.b_layout = gemm::b_layout_name(o.b_layout);
  rec.cublas_algo = algo_text;
  rec.sms = dev.budget;
  rec.gpu_sms = dev.sms;
  rec.notes = str_cat("single-GPU GEMM: t_fused = ccfuse, t_gemm = best of ", algos.size(),
                      " cuBLASLt heuristic algorithms (", kCublasWorkspace >> 20, " MiB workspace",
                      sm_target > 0 ? str_cat(", SM_COUNT_TARGET ", sm_target) : std::string(), "); rel_err over ",
                      rows.size(), " sampled rows; ", num_sets, " rotated input sets");
  log << "gpu: gemm bench took " << int(seconds_since(t_start) * 1000) << " ms\n";
  return rec;
}

}  // namespace ccfuse::tool
