// src/tool/gpu_grouped_bench.cu: `ccfuse check|bench --op grouped_gemm`, the engine's grouped GEMM
// (MoE experts) on one GPU (device 0), against an fp64 host reference and cuBLAS's grouped GEMM.
//
//   for expert e: rows [off_e, off_e + rows_e) of C [rows, N] = the same rows of A [rows, K] @ B_e,
//   B [E, N, K] (--b-layout nk, default) or [E, K, N] (kn); rows_e = grouped_rows(E, T * k, routing)
//   computed on the host, copied to the device once; the engine reads them from device memory.
//
// Inputs: generated ON THE DEVICE from a counter-based hash (splitmix64 of (seed, tensor, index))
//   as uniform values in [-1, 1) with 24 bits, rounded to nearest-even in the dtype; the host
//   recomputes exactly the values it needs with the same __host__ __device__ functions. (MoE
//   benchmark inputs reach GBs: host generation and upload would dominate the run.)
// check: C poisoned (0xFF bytes, NaN) with `kSlackRows` rows past the total (max_rows = total +
//   slack), one run; every element of the first `total` rows must be finite, the slack rows must
//   stay poison, the overflow count must be 0, and ‖C − ref‖/‖ref‖ over the compared rows within
//   tolerance_for(dtype). All rows are compared up to kFullCheckMacs multiply-adds; past it, per
//   non-empty expert its first and last rows and one random row.
// bench: as gpu_gemm_bench.cu (rotated input sets past L2, stream hold, warm-up, median of
//   --iters): (a) ccfuse grouped_run (max_rows = total; its prefix kernel included) (b) cuBLAS
//   cublasGemmGroupedBatchedEx with one group per NON-EMPTY expert (cuBLAS may reject m = 0, and
//   an empty expert has nothing to compute; the baseline knows the sizes on the host, which a
//   real MoE layer would not without a sync). Both results are checked on sampled rows against
//   fp64; a wrong baseline is an error (exit 3).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
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
constexpr size_t kRotateBytes = size_t(256) << 20;  // > 4x the H200's 60 MB L2 per pass
constexpr int kMaxSets = 64;
constexpr double kFullCheckMacs = 17179869184.0;  // 2^34
constexpr int64_t kSlackRows = 160;                // check: poisoned rows past the total
constexpr int kBenchSampleRows = 6;                // bench: random rows compared with fp64 (plus edges)
constexpr int kTensorA = 0, kTensorB = 1;

// ---- inputs: the same values on the device and the host ------------------------------------

__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 16-bit pattern of element `i` of tensor `which`: a uniform value in [-1, 1) on a 2^-23 grid
// (exact in float), rounded to nearest-even in bf16 or fp16.
__host__ __device__ inline uint16_t input_bits(uint64_t seed, int which, uint64_t i, bool is_bf16) {
  const uint64_t key = mix64(seed) ^ (uint64_t(which + 1) * 0xD1B54A32D192ED03ull);
  const uint64_t h = mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
  const float v = float(int32_t(h >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
  if (is_bf16) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);  // finite values only: round to nearest, ties to even
    return uint16_t(u >> 16);
  }
  const __half_raw r = __float2half_rn(v);
  return r.x;
}

__global__ void fill_inputs(uint16_t* out, size_t count, uint64_t seed, int which, bool is_bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    out[i] = input_bits(seed, which, i, is_bf16);
}

void fill_on_device(void* out, size_t count, uint64_t seed, int which, DType t, cudaStream_t stream) {
  fill_inputs<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(out), count, seed, which, t == DType::kBFloat16);
  CCFUSE_CUDA_CHECK_LAUNCH();
}

// Counts elements that are not the poison pattern 0xFFFF (rows that must stay unwritten).
__global__ void count_not_poison(const uint16_t* c, size_t count, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    local += c[i] != 0xFFFFu;
  if (local) atomicAdd(bad, local);
}

int64_t written_on_device(const void* c, size_t count, cudaStream_t stream) {
  if (count == 0) return 0;
  DeviceBuffer counter(sizeof(unsigned long long));
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), stream));
  count_not_poison<<<264, 256, 0, stream>>>(static_cast<const uint16_t*>(c), count,
                                            static_cast<unsigned long long*>(counter.get()));
  CCFUSE_CUDA_CHECK_LAUNCH();
  unsigned long long n = 0;
  CCFUSE_CUDA_CHECK(cudaMemcpyAsync(&n, counter.get(), sizeof(n), cudaMemcpyDeviceToHost, stream));
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return int64_t(n);
}

// ---- the problem ---------------------------------------------------------------------------

struct Problem {
  std::vector<int64_t> rows;     // per expert
  std::vector<int64_t> offsets;  // per expert, plus the total at the end
  int64_t total = 0;
  int non_empty = 0;
  // Expert of global row r.
  int expert_of(int64_t r) const {
    return int(std::upper_bound(offsets.begin(), offsets.end(), r) - offsets.begin()) - 1;
  }
};

Problem problem_of(const Options& o) {
  Problem p;
  p.rows = grouped_rows(o.experts, o.m, o.routing);
  p.offsets.resize(p.rows.size() + 1, 0);
  for (size_t e = 0; e < p.rows.size(); ++e) {
    p.offsets[e + 1] = p.offsets[e] + p.rows[e];
    p.non_empty += p.rows[e] > 0;
  }
  p.total = p.offsets.back();
  CCFUSE_CHECK(p.total == o.m, "routing lost rows: ", p.total, " of ", o.m);
  return p;
}

gemm::GroupedGemmDesc desc_of(const Options& o, int64_t max_rows) {
  gemm::GroupedGemmDesc d;
  d.num_groups = o.experts;
  d.max_rows = max_rows;
  d.n = o.n;
  d.k = o.k;
  d.dtype = o.dtype;
  d.b_layout = o.b_layout;
  return d;
}

struct DeviceInfo {
  std::string name;
  int sms = 0;
};

DeviceInfo device_info() {
  CCFUSE_CUDA_CHECK(cudaSetDevice(kDevice));
  cudaDeviceProp prop{};
  CCFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, kDevice));
  return {prop.name, prop.multiProcessorCount};
}

gemm::GemmConfig config_of(const gemm::GroupedGemmDesc& desc, const DeviceInfo& dev) {
  gemm::GemmConfig cfg = gemm::choose_config(desc, dev.sms);
  // CCFUSE_GROUPED_TMA_STORE=0 (A/B runs): every tile from registers, the rule before 2026-11-30
  // (the chosen tile's register-epilogue build: 4 stages for 128x256, 6 for 128x128).
  if (const char* v = std::getenv("CCFUSE_GROUPED_TMA_STORE"); v != nullptr && std::string(v) == "0" && cfg.tma_store) {
    cfg.tma_store = false;
    cfg.stages = cfg.block_n == 256 ? 4 : 6;
  }
  // CCFUSE_GROUPED_GROUP_M=N (A/B runs): the raster inside each group in groups of N row tiles.
  if (const char* v = std::getenv("CCFUSE_GROUPED_GROUP_M"); v != nullptr && std::atoi(v) > 0) cfg.group_m = std::atoi(v);
  gemm::validate(desc, cfg);  // bad shapes are bad input (exit code 2)
  return cfg;
}

// fp64 rows of the grouped product, rows sorted ascending: out[i * n + j] for row rows[i]. B of an
// expert is materialised once (as floats) for all its rows.
std::vector<double> reference_rows(const Options& o, const Problem& p, const std::vector<int64_t>& rows) {
  const int64_t n = o.n, k = o.k;
  const bool nk = o.b_layout == gemm::BLayout::kNK, is_bf16 = o.dtype == DType::kBFloat16;
  const Decoder decode(o.dtype);
  const uint64_t seed = *o.seed;
  std::vector<double> out(rows.size() * size_t(n));
  std::vector<float> b(size_t(k * n)), a;
  size_t first = 0;
  while (first < rows.size()) {
    const int e = p.expert_of(rows[first]);
    size_t last = first;
    while (last < rows.size() && rows[last] < p.offsets[size_t(e) + 1]) ++last;
    const size_t count = last - first;
    const uint64_t b0 = uint64_t(e) * uint64_t(k * n);
    parallel_for(b.size(), [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) b[i] = decode(input_bits(seed, kTensorB, b0 + i, is_bf16));
    });
    a.resize(count * size_t(k));
    parallel_for(a.size(), [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        const uint64_t r = uint64_t(rows[first + i / size_t(k)]);
        a[i] = decode(input_bits(seed, kTensorA, r * uint64_t(k) + i % size_t(k), is_bf16));
      }
    });
    constexpr int64_t kBlock = 128;  // output columns per work item
    const int64_t col_blocks = ceil_div(n, kBlock);
    const int64_t items = int64_t(count) * col_blocks;
    std::atomic<int64_t> next{0};
    auto worker = [&] {
      double acc[kBlock];
      for (int64_t item = next++; item < items; item = next++) {
        const size_t i = size_t(item / col_blocks);
        const int64_t j0 = (item % col_blocks) * kBlock, cols = std::min(kBlock, n - j0);
        const float* ar = a.data() + i * size_t(k);
        std::fill(acc, acc + cols, 0.0);
        if (nk) {  // B_e [N, K]
          for (int64_t j = 0; j < cols; ++j) {
            const float* bj = b.data() + size_t((j0 + j) * k);
            double s[4] = {0, 0, 0, 0};
            int64_t kk = 0;
            for (; kk + 4 <= k; kk += 4)
              for (int u = 0; u < 4; ++u) s[u] += double(ar[kk + u] * bj[kk + u]);
            for (; kk < k; ++kk) s[0] += double(ar[kk] * bj[kk]);
            acc[j] = (s[0] + s[1]) + (s[2] + s[3]);
          }
        } else {  // B_e [K, N]
          for (int64_t kk = 0; kk < k; ++kk) {
            const float av = ar[kk];
            const float* bk = b.data() + size_t(kk * n + j0);
            for (int64_t j = 0; j < cols; ++j) acc[j] += double(av * bk[j]);
          }
        }
        std::copy(acc, acc + cols, out.begin() + std::ptrdiff_t((first + i) * size_t(n) + size_t(j0)));
      }
    };
    std::vector<std::thread> threads;
    const int num_threads = int(std::min<int64_t>(host_threads(), std::max<int64_t>(items, 1)));
    for (int t = 1; t < num_threads; ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    first = last;
  }
  return out;
}

// Per non-empty expert: its first and last rows and `random_per_expert` random ones; sorted, distinct.
std::vector<int64_t> edge_rows(const Problem& p, uint64_t seed, int random_per_expert) {
  std::mt19937_64 pick(seed ^ 0xC0FFEEull);
  std::vector<int64_t> rows;
  for (size_t e = 0; e < p.rows.size(); ++e) {
    if (p.rows[e] == 0) continue;
    rows.push_back(p.offsets[e]);
    rows.push_back(p.offsets[e + 1] - 1);
    for (int i = 0; i < random_per_expert; ++i) rows.push_back(p.offsets[e] + int64_t(pick() % uint64_t(p.rows[e])));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// bench: the first and last rows of the first, last and largest non-empty experts plus random rows.
std::vector<int64_t> sample_rows(const Problem& p, uint64_t seed) {
  std::mt19937_64 pick(seed ^ 0x9E3779B97F4A7C15ull);
  std::vector<int64_t> rows;
  int first = -1, last = -1, largest = 0;
  for (size_t e = 0; e < p.rows.size(); ++e) {
    if (p.rows[e] == 0) continue;
    if (first < 0) first = int(e);
    last = int(e);
    if (p.rows[e] > p.rows[size_t(largest)]) largest = int(e);
  }
  for (int e : {first, last, largest}) {
    rows.push_back(p.offsets[size_t(e)]);
    rows.push_back(p.offsets[size_t(e) + 1] - 1);
  }
  for (int i = 0; i < kBenchSampleRows; ++i) rows.push_back(int64_t(pick() % uint64_t(p.total)));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

double tflops_of(const Options& o, double ms) {
  return ms > 0 ? 2.0 * double(o.m) * double(o.n) * double(o.k) / (ms * 1e9) : -1;
}

// ---- cuBLAS grouped GEMM: one group (of one problem) per non-empty expert -------------------
//
// Row-major C_e [m_e, N] = A_e [m_e, K] B_e is column-major C_e^T [N, m_e] = X_e A_e^T: cuBLAS's
// (m, n, k) = (N, m_e, K); its "A" is B_e (kn: [K, N] row-major = column-major [N, K], ld N, op N;
// nk: [N, K] row-major = column-major [K, N], ld K, op T), its "B" is A_e (column-major [K, m_e],
// ld K), C_e^T has ld N.
class CublasGrouped {
 public:
  CublasGrouped(const Options& o, const Problem& p, int num_sets) : o_(o) {
    CCFUSE_CUBLAS_CHECK(cublasCreate(&handle_));
    const bool nk = o.b_layout == gemm::BLayout::kNK;
    for (size_t e = 0; e < p.rows.size(); ++e) {
      if (p.rows[e] == 0) continue;
      experts_.push_back(int(e));
      offsets_.push_back(p.offsets[e]);
      transa_.push_back(nk ? CUBLAS_OP_T : CUBLAS_OP_N);
      transb_.push_back(CUBLAS_OP_N);
      m_.push_back(int(o.n));
      n_.push_back(int(p.rows[e]));
      k_.push_back(int(o.k));
      lda_.push_back(int(nk ? o.k : o.n));
      ldb_.push_back(int(o.k));
      ldc_.push_back(int(o.n));
      alpha_.push_back(1.f);
      beta_.push_back(0.f);
      size_.push_back(1);
    }
    // Per set, the device arrays of pointers: [X_e...] [A_e...] [C_e...].
    ptrs_ = std::make_unique<DeviceBuffer>(size_t(num_sets) * 3 * experts_.size() * sizeof(void*));
  }
  ~CublasGrouped() {
    if (handle_) cublasDestroy(handle_);
  }
  CublasGrouped(const CublasGrouped&) = delete;
  CublasGrouped& operator=(const CublasGrouped&) = delete;

  void set_pointers(int set, const void* a, const void* b, void* c) {
    const size_t g = experts_.size();
    std::vector<const void*> host(3 * g);
    const size_t es = 2;  // 16-bit types
    for (size_t i = 0; i < g; ++i) {
      host[i] = static_cast<const char*>(b) + size_t(experts_[i]) * size_t(o_.n * o_.k) * es;
      host[g + i] = static_cast<const char*>(a) + size_t(offsets_[i] * o_.k) * es;
      host[2 * g + i] = static_cast<char*>(c) + size_t(offsets_[i] * o_.n) * es;
    }
    CCFUSE_CUDA_CHECK(cudaMemcpy(set_ptrs(set), host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }

  // False if cuBLAS refuses (reported as no baseline on the first call).
  bool run(int set, cudaStream_t stream) {
    CCFUSE_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    const size_t g = experts_.size();
    void** p = set_ptrs(set);
    const cudaDataType_t t = o_.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
    last_status_ = cublasGemmGroupedBatchedEx(
        handle_, transa_.data(), transb_.data(), m_.data(), n_.data(), k_.data(), alpha_.data(), p, t, lda_.data(),
        p + g, t, ldb_.data(), beta_.data(), p + 2 * g, t, ldc_.data(), int(g), size_.data(), CUBLAS_COMPUTE_32F);
    return last_status_ == CUBLAS_STATUS_SUCCESS;
  }
  cublasStatus_t last_status() const { return last_status_; }
  size_t groups() const { return experts_.size(); }

 private:
  void** set_ptrs(int set) const {
    return static_cast<void**>(ptrs_->get()) + size_t(set) * 3 * experts_.size();
  }
  const Options& o_;
  cublasHandle_t handle_ = nullptr;
  std::vector<int> experts_;
  std::vector<int64_t> offsets_;
  std::vector<cublasOperation_t> transa_, transb_;
  std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, size_;
  std::vector<float> alpha_, beta_;
  std::unique_ptr<DeviceBuffer> ptrs_;
  cublasStatus_t last_status_ = CUBLAS_STATUS_SUCCESS;
};

}  // namespace

std::string gpu_grouped_config(const Options& o) {
  const DeviceInfo dev = device_info();
  return gemm::to_string(config_of(desc_of(o, o.m), dev));
}

CheckResult gpu_grouped_check(const Options& o, std::ostream& log) {
  CCFUSE_CHECK(o.seed.has_value(), "grouped_gemm check needs a resolved seed");
  const DeviceInfo dev = device_info();
  const Problem p = problem_of(o);
  const int64_t max_rows = p.total + kSlackRows;
  const gemm::GroupedGemmDesc desc = desc_of(o, max_rows);
  const gemm::GemmConfig cfg = config_of(desc, dev);
  log << "gpu: grouped_gemm on " << dev.name << " (" << dev.sms << " SMs): " << o.experts << " experts ("
      << p.non_empty << " non-empty), " << p.total << " rows (+" << kSlackRows << " poisoned slack rows), routing "
      << routing_name(o.routing) << ", b_layout=" << gemm::b_layout_name(o.b_layout) << ", config "
      << gemm::to_string(cfg) << "\n";

  Stream stream;
  const size_t a_count = size_t(max_rows * o.k), b_count = size_t(int64_t(o.experts) * o.n * o.k),
               c_count = size_t(max_rows * o.n);
  DeviceBuffer a(a_count * 2), b(b_count * 2), c(c_count * 2), rows_dev(size_t(o.experts) * sizeof(int)),
      overflow(sizeof(int)), workspace(gemm::grouped_workspace_bytes(desc));
  fill_on_device(a.get(), a_count, *o.seed, kTensorA, o.dtype, stream.s);
  fill_on_device(b.get(), b_count, *o.seed, kTensorB, o.dtype, stream.s);
  const std::vector<int> rows_int(p.rows.begin(), p.rows.end());
  CCFUSE_CUDA_CHECK(cudaMemcpyAsync(rows_dev.get(), rows_int.data(), rows_int.size() * sizeof(int),
                                    cudaMemcpyHostToDevice, stream.s));
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(c.get(), 0xFF, c_count * 2, stream.s));  // poison
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(overflow.get(), 0x7F, sizeof(int), stream.s));  // must become 0
  gemm::grouped_run(desc, cfg, a.get(), b.get(), c.get(), static_cast<const int*>(rows_dev.get()), workspace.get(),
                    static_cast<int*>(overflow.get()), stream.s);
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.s));

  bool bad = false;
  int overflow_host = -1;
  CCFUSE_CUDA_CHECK(cudaMemcpy(&overflow_host, overflow.get(), sizeof(int), cudaMemcpyDeviceToHost));
  if (overflow_host != 0) {
    log << "gpu: overflow count " << overflow_host << " (expected 0: max_rows holds every row)\n";
    bad = true;
  }
  const int64_t non_finite = non_finite_on_device(c.get(), size_t(p.total * o.n), o.dtype, stream.s);
  if (non_finite > 0) {
    log << "gpu: " << non_finite << " of " << p.total * o.n << " output elements are NaN/Inf or unwritten\n";
    bad = true;
  }
  const int64_t slack_written =
      written_on_device(static_cast<const char*>(c.get()) + size_t(p.total * o.n) * 2, size_t(kSlackRows * o.n), stream.s);
  if (slack_written > 0) {
    log << "gpu: " << slack_written << " elements of the " << kSlackRows << " rows past the total were written\n";
    bad = true;
  }

  std::vector<int64_t> rows;
  const bool all_rows = double(p.total) * double(o.n) * double(o.k) <= kFullCheckMacs;
  if (all_rows) {
    rows.resize(size_t(p.total));
    std::iota(rows.begin(), rows.end(), int64_t(0));
  } else {
    rows = edge_rows(p, *o.seed, 1);
  }
  const auto t0 = Clock::now();
  const std::vector<double> want = reference_rows(o, p, rows);
  const Decoder decode(o.dtype);
  std::vector<double> got = download_rows(c.get(), o.n, rows, decode);
  if (o.inject_fault && !got.empty()) got[got.size() / 2] += 1000.0;
  log << "gpu: compared " << (all_rows ? "all " : "") << rows.size() << " rows of " << p.total
      << (all_rows ? "" : " (first, last and one random row of every non-empty expert)") << " with fp64 in "
      << int(seconds_since(t0) * 1000) << " ms; scanned every output element for NaN/poison\n";

  CheckResult res;
  res.rel_err = bad ? INFINITY : row_error(got, want).rel();
  res.tolerance = tolerance_for(o.dtype, o.k);
  res.pass = res.rel_err <= res.tolerance;
  return res;
}

BenchRecord gpu_grouped_bench(const Options& o, std::ostream& log) {
  CCFUSE_CHECK(o.seed.has_value(), "grouped_gemm bench needs a resolved seed");
  const auto t_start = Clock::now();
  const DeviceInfo dev = device_info();
  const Problem p = problem_of(o);
  const gemm::GroupedGemmDesc desc = desc_of(o, p.total);
  const gemm::GemmConfig cfg = config_of(desc, dev);
  const std::string config = gemm::to_string(cfg);

  const size_t a_bytes = size_t(p.total * o.k) * 2, b_bytes = size_t(int64_t(o.experts) * o.n * o.k) * 2,
               c_bytes = size_t(p.total * o.n) * 2;
  const size_t set_bytes = a_bytes + b_bytes + c_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  CCFUSE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t room = free_bytes > (size_t(1) << 30) ? free_bytes - (size_t(1) << 30) : 0;
  CCFUSE_CHECK(room >= set_bytes, "grouped_gemm bench needs ", set_bytes >> 20, " MiB of GPU memory, ", room >> 20,
               " MiB free");
  const size_t wanted_sets = size_t(ceil_div(int64_t(kRotateBytes), int64_t(set_bytes)));
  const int num_sets = int(std::clamp<size_t>(std::min(wanted_sets, room / set_bytes), 1, kMaxSets));
  log << "gpu: grouped_gemm on " << dev.name << " (" << dev.sms << " SMs): " << o.experts << " experts ("
      << p.non_empty << " non-empty), " << p.total << " rows, routing " << routing_name(o.routing)
      << ", b_layout=" << gemm::b_layout_name(o.b_layout) << ", config " << config << "; " << num_sets
      << " rotated input sets, " << o.warmup << " warm-up + " << o.iters << " timed runs\n";

  Stream stream;
  std::vector<std::unique_ptr<DeviceBuffer>> a, b, c;
  for (int i = 0; i < num_sets; ++i) {
    a.push_back(std::make_unique<DeviceBuffer>(a_bytes));
    b.push_back(std::make_unique<DeviceBuffer>(b_bytes));
    c.push_back(std::make_unique<DeviceBuffer>(c_bytes));
    fill_on_device(a.back()->get(), a_bytes / 2, *o.seed, kTensorA, o.dtype, stream.s);
    fill_on_device(b.back()->get(), b_bytes / 2, *o.seed, kTensorB, o.dtype, stream.s);
  }
  DeviceBuffer rows_dev(size_t(o.experts) * sizeof(int)), workspace(gemm::grouped_workspace_bytes(desc));
  const std::vector<int> rows_int(p.rows.begin(), p.rows.end());
  CCFUSE_CUDA_CHECK(cudaMemcpyAsync(rows_dev.get(), rows_int.data(), rows_int.size() * sizeof(int),
                                    cudaMemcpyHostToDevice, stream.s));
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  const auto set_of = [&](int it) { return size_t(it % num_sets); };

  const std::vector<int64_t> rows = sample_rows(p, *o.seed);
  const std::vector<double> want = reference_rows(o, p, rows);
  const Decoder decode(o.dtype);
  const auto checked_rel_err = [&](const char* who, bool inject, auto&& run_set0) {
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(c[0]->get(), 0xFF, c_bytes, stream.s));
    run_set0();
    const int64_t bad = non_finite_on_device(c[0]->get(), c_bytes / 2, o.dtype, stream.s);
    if (bad > 0) log << "gpu: " << who << ": " << bad << " output elements are NaN/Inf or unwritten\n";
    std::vector<double> got = download_rows(c[0]->get(), o.n, rows, decode);
    if (inject && !got.empty()) got[got.size() / 2] += 1000.0;
    return bad > 0 ? double(INFINITY) : row_error(got, want).rel();
  };

  // (b) first: cuBLAS grouped, one problem per non-empty expert (this also brings the clocks up).
  CublasGrouped blas(o, p, num_sets);
  for (int i = 0; i < num_sets; ++i) blas.set_pointers(i, a[size_t(i)]->get(), b[size_t(i)]->get(), c[size_t(i)]->get());
  double t_cublas = -1, rel_err_cublas = -1;
  std::function<void(int)> cublas_run;
  if (blas.run(0, stream.s)) {
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    cublas_run = [&](int it) {
      CCFUSE_CHECK(blas.run(int(set_of(it)), stream.s), "cublasGemmGroupedBatchedEx failed on a later call: ",
                   cublasGetStatusString(blas.last_status()));
    };
  } else {
    log << "gpu: cublasGemmGroupedBatchedEx refused the problem (" << cublasGetStatusString(blas.last_status())
        << "): no baseline\n";
  }

  const auto ccfuse_run = [&](int it) {
    const size_t s = set_of(it);
    gemm::grouped_run(desc, cfg, a[s]->get(), b[s]->get(), c[s]->get(), static_cast<const int*>(rows_dev.get()),
                      workspace.get(), nullptr, stream.s);
  };
  // A third variant in the same interleaved rounds (t_variant_ms), for A/B runs:
  //   CCFUSE_GROUPED_AB_GROUP_M=N    the engine's config with groups of N row tiles in the raster;
  //   CCFUSE_GROUPED_AB_PINGPONG=1   ping-pong consumers on 128x128x64/6 (the staging ring) where
  //                                  the engine's config has none, else its whole-tile 128x256x64/3.
  const int ab_group_m = env_int("CCFUSE_GROUPED_AB_GROUP_M", 0, 0, 1 << 20, "row tiles");
  const bool ab_pingpong = env_int("CCFUSE_GROUPED_AB_PINGPONG", 0, 0, 1, "0 or 1") == 1;
  gemm::GemmConfig variant_cfg = cfg;
  if (ab_group_m > 0) variant_cfg.group_m = ab_group_m;
  if (ab_pingpong) {
    const bool pp = !cfg.pingpong;
    variant_cfg.pingpong = pp;
    variant_cfg.tma_store = true;
    variant_cfg.block_n = pp ? 128 : 256;
    variant_cfg.stages = pp ? 6 : 3;
  }
  const bool ab_variant = ab_group_m > 0 || ab_pingpong;
  const auto variant_run = [&](int it) {
    const size_t s = set_of(it);
    gemm::grouped_run(desc, variant_cfg, a[s]->get(), b[s]->get(), c[s]->get(), static_cast<const int*>(rows_dev.get()),
                      workspace.get(), nullptr, stream.s);
  };
  double t_ccfuse = -1, t_variant = -1;
  if (cublas_run) {
    median_ms(stream.s, 1, 3, log, cublas_run);  // warm the clocks (not recorded)
    // Interleaved (gpu_bench_util.cuh): clock drift must not favour whichever runs first.
    std::vector<std::function<void(int)>> runs = {ccfuse_run, cublas_run};
    if (ab_variant) runs.push_back(variant_run);
    const auto t = medians_interleaved(stream.s, o.warmup, o.iters, log, runs);
    t_ccfuse = t[0];
    t_cublas = t[1];
    if (ab_variant) {
      t_variant = t[2];
      log << "gpu: variant " << gemm::to_string(variant_cfg) << " " << t_variant << " ms (" << tflops_of(o, t_variant)
          << " TFLOP/s), interleaved\n";
    }
  } else {
    t_ccfuse = median_ms(stream.s, o.warmup, o.iters, log, ccfuse_run);
  }
  log << "gpu: ccfuse grouped_gemm " << t_ccfuse << " ms (" << tflops_of(o, t_ccfuse) << " TFLOP/s)\n";
  if (cublas_run)
    log << "gpu: cuBLAS grouped " << t_cublas << " ms (" << tflops_of(o, t_cublas) << " TFLOP/s), " << blas.groups()
        << " groups (timed interleaved with ccfuse)\n";

  const double rel_err = checked_rel_err("ccfuse", o.inject_fault, [&] { ccfuse_run(0); });
  if (cublas_run) {
    rel_err_cublas = checked_rel_err("cuBLAS grouped", false, [&] { cublas_run(0); });
    const double tol = tolerance_for(o.dtype, o.k);
    CCFUSE_CHECK(!(rel_err_cublas > tol), "the cuBLAS grouped baseline's result is wrong (rel_err ", rel_err_cublas,
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
  rec.rel_err_baseline = rel_err_cublas;
  rec.tflops = tflops_of(o, t_ccfuse);
  rec.tflops_baseline = tflops_of(o, t_cublas);
  rec.pct_of_baseline = t_cublas > 0 ? 100.0 * t_cublas / t_ccfuse : -1;
  rec.baseline = t_cublas > 0 ? "cublas_grouped" : "";
  rec.config = config;
  rec.b_layout = gemm::b_layout_name(o.b_layout);
  rec.gpu_sms = dev.sms;
  rec.group_rows = p.rows;
  if (t_variant > 0) {
    rec.variant_config = gemm::to_string(variant_cfg);
    rec.t_variant_ms = t_variant;
  }
  rec.notes = str_cat("grouped GEMM: t_fused = ccfuse grouped_run (rows per expert read from device memory), "
                      "t_gemm = cublasGemmGroupedBatchedEx (",
                      blas.groups(), " groups, one per non-empty expert, host-known sizes); rel_err over ",
                      rows.size(), " sampled rows; ", num_sets, " rotated input sets; bench took ",
                      int(seconds_since(t_start) * 1000), " ms");
  return rec;
}

}  // namespace ccfuse::tool
