// src/tool/gpu_bench_util.cuh: helpers of the tool's single-GPU benches (gpu_gemm_bench.cu,
// gpu_grouped_bench.cu): host threads, 16-bit decoding, the error norm, device buffers and
// streams, the NaN/poison scan, and the timing loop (CUDA events behind a stream hold, median).
// Everything is TU-local (anonymous namespace): include it from one .cu file each.
#pragma once

#include <functional>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <thread>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/dtype.h"
#include "ccfuse/common/error.h"

namespace ccfuse::tool {

namespace {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// 16-bit pattern -> float, for both types (fp16 through a table: the reference reads a lot).
struct Decoder {
  DType type;
  std::vector<float> fp16_table;
  explicit Decoder(DType t) : type(t) {
    if (t != DType::kFloat16) return;
    fp16_table.resize(65536);
    for (uint32_t b = 0; b < 65536; ++b) {
      __half_raw r;
      r.x = uint16_t(b);
      fp16_table[b] = __half2float(__half(r));
    }
  }
  float operator()(uint16_t bits) const {
    return type == DType::kBFloat16 ? bf16{bits}.to_float() : fp16_table[bits];
  }
};

inline int host_threads() { return int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 64u)); }

// Runs fn(begin, end) over [0, count) in contiguous parts, one per thread.
template <class F>
void parallel_for(size_t count, F&& fn) {
  const size_t parts = std::min<size_t>(size_t(host_threads()), std::max<size_t>(count / 65536, 1));
  std::vector<std::thread> threads;
  for (size_t p = 1; p < parts; ++p)
    threads.emplace_back([&, p] { fn(count * p / parts, count * (p + 1) / parts); });
  fn(0, count / parts);
  for (auto& t : threads) t.join();
}

// ‖got − want‖ / ‖want‖ over the given rows; a non-finite value anywhere gives +inf.
struct RowError {
  double num = 0, den = 0;
  double rel() const { return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0); }
};
inline RowError row_error(const std::vector<double>& got, const std::vector<double>& want) {
  RowError e;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = got[i] - want[i];
    e.num += std::isfinite(got[i]) ? d * d : INFINITY;
    e.den += want[i] * want[i];
  }
  return e;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { CCFUSE_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16))); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Counts elements that are NaN or Inf (0xFFFF, the poison, is a NaN in both types).
__global__ void count_non_finite(const uint16_t* c, size_t count, uint16_t exponent_mask, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    local += (c[i] & exponent_mask) == exponent_mask;
  if (local) atomicAdd(bad, local);
}

inline uint16_t exponent_mask(DType t) { return t == DType::kBFloat16 ? uint16_t(0x7F80) : uint16_t(0x7C00); }

inline int64_t non_finite_on_device(const void* c, size_t count, DType t, cudaStream_t stream) {
  DeviceBuffer counter(sizeof(unsigned long long));
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), stream));
  count_non_finite<<<264, 256, 0, stream>>>(static_cast<const uint16_t*>(c), count, exponent_mask(t),
                                            static_cast<unsigned long long*>(counter.get()));
  CCFUSE_CUDA_CHECK_LAUNCH();
  unsigned long long bad = 0;
  CCFUSE_CUDA_CHECK(cudaMemcpyAsync(&bad, counter.get(), sizeof(bad), cudaMemcpyDeviceToHost, stream));
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return int64_t(bad);
}

// Rows `rows` of the row-major [*, n] 16-bit matrix at `c`, as doubles.
inline std::vector<double> download_rows(const void* c, int64_t n, const std::vector<int64_t>& rows, const Decoder& decode) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  std::vector<double> out;
  out.reserve(rows.size() * size_t(n));
  for (int64_t r : rows) {
    CCFUSE_CUDA_CHECK(cudaMemcpy(bits.data(), static_cast<const char*>(c) + size_t(r * n) * 2, size_t(n) * 2,
                                 cudaMemcpyDeviceToHost));
    for (uint16_t b : bits) out.push_back(double(decode(b)));
  }
  return out;
}

// Holds a stream on the GPU until the host releases it, so that the runs queued behind it start
// back to back: a GEMM of a few microseconds is shorter than its launch (gemm::run builds TMA
// descriptors on the host), and without the hold the events would time the host's launch gaps.
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void hold_stream(const volatile int* release, int generation, uint64_t timeout_ns) {
  const uint64_t t0 = global_ns();
  // The timeout only guards against a host that never releases (it then measures launch gaps).
  while (*release < generation && global_ns() - t0 < timeout_ns) __nanosleep(1000);
}

class StreamHold {
 public:
  StreamHold() {
    CCFUSE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(int), cudaHostAllocMapped));
    *flag_ = 0;
    CCFUSE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag_), flag_, 0));
  }
  ~StreamHold() {
    // Never free the flag under a waiting kernel (an exception may leave a hold unreleased).
    if (stream_) {
      release();
      cudaStreamSynchronize(stream_);
    }
    cudaFreeHost(flag_);
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  void hold(cudaStream_t stream) {
    stream_ = stream;
    hold_stream<<<1, 1, 0, stream>>>(device_flag_, ++generation_, kTimeoutNs);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  void release() { __atomic_store_n(flag_, generation_, __ATOMIC_RELEASE); }

 private:
  static constexpr uint64_t kTimeoutNs = 2000000000ull;  // 2 s
  int* flag_ = nullptr;
  int* device_flag_ = nullptr;
  int generation_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Medians of the runs after the warm-up ones, for several variants timed in the same rounds
// (round i runs variant 0, 1, ... once each, in turn): the H200's clocks drift with temperature
// and power during a benchmark, and timing one variant after the other favoured whichever ran
// first by up to 15 %. CUDA events around each run, queued back to back behind a stream hold
// (in batches, well inside the launch queue), read once at the end.
// NOTE: each variant runs once first, unheld and synchronised: with lazy module loading (the
// CUDA 12.2+ default) the first launch of a kernel may wait for the whole GPU, i.e. for the hold.
inline std::vector<double> medians_interleaved(cudaStream_t stream, int warmup, int iters, std::ostream& log,
                                               const std::vector<std::function<void(int)>>& variants) {
  constexpr int kBatch = 32;  // runs per hold
  const int total = warmup + iters;
  const size_t nv = variants.size();
  for (const auto& v : variants) v(0);
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(2 * size_t(total) * nv, nullptr);
  struct Cleanup {
    std::vector<cudaEvent_t>& ev;
    ~Cleanup() {
      for (auto e : ev)
        if (e) cudaEventDestroy(e);
    }
  } cleanup{events};
  for (auto& e : events) CCFUSE_CUDA_CHECK(cudaEventCreate(&e));
  const int rounds_per_batch = std::max(1, kBatch / int(nv));
  StreamHold hold;
  for (int first = 0; first < total; first += rounds_per_batch) {
    const auto t0 = Clock::now();
    hold.hold(stream);
    for (int it = first; it < std::min(total, first + rounds_per_batch); ++it) {
      for (size_t v = 0; v < nv; ++v) {
        const size_t e = 2 * (size_t(it) * nv + v);
        CCFUSE_CUDA_CHECK(cudaEventRecord(events[e], stream));
        variants[v](it);
        CCFUSE_CUDA_CHECK(cudaEventRecord(events[e + 1], stream));
      }
    }
    hold.release();
    if (seconds_since(t0) > 1.0)
      log << "gpu: warning: queueing runs took " << seconds_since(t0)
          << " s: a launch waited for the GPU (the stream hold), so these times may include launch gaps\n";
  }
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> medians;
  for (size_t v = 0; v < nv; ++v) {
    std::vector<double> ms;
    for (int it = warmup; it < total; ++it) {
      float t = 0;
      const size_t e = 2 * (size_t(it) * nv + v);
      CCFUSE_CUDA_CHECK(cudaEventElapsedTime(&t, events[e], events[e + 1]));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    medians.push_back(ms[ms.size() / 2]);
  }
  return medians;
}

template <class F>
double median_ms(cudaStream_t stream, int warmup, int iters, std::ostream& log, F&& run_once) {
  return medians_interleaved(stream, warmup, iters, log, {std::function<void(int)>(run_once)})[0];
}

}  // namespace

}  // namespace ccfuse::tool
