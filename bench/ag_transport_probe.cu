// Settles two unknowns of the fused ag_gemm design (docs/tp-fusion.md) on the GPU machine.
//  1. transport: copy-engine pushes into a peer's NCCL-mapped buffer, each followed on the same
//     stream by cuStreamWriteValue64 of the call's epoch into the peer's flag (no SM used). Does
//     the peer's kernel, spinning on the flag with acquire loads, always see the chunk's data?
//  2. co-scheduling: a one-CTA publisher kernel and a persistent GEMM whose tiles wait on it,
//     launched in either order, GEMM on 132/131/128/124 SMs: which combinations finish and which
//     time out? (Seen once: publisher launched after a 128-SM GEMM never started.)
// Usage: ccfuse_ag_transport_probe [--json FILE]. Prints a table; exit 0 even when a probe fails
// (the table is the result).
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/comm/team.h"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/gemm/ready_schedule.cuh"

using namespace ccfuse;
using namespace ccfuse::comm;

namespace {

__host__ __device__ uint32_t pattern(uint32_t call, size_t i) {
  uint32_t x = uint32_t(i) * 2654435761u ^ (call * 0x9e3779b9u);
  x ^= x >> 15;
  return x * 0x85ebca6bu;
}

__global__ void fill(uint32_t* p, size_t n, uint32_t call) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = pattern(call, i);
}

// Block c waits for chunk c's flag (from rank 0), then checks the chunk.
__global__ void verify(DeviceSignals sig, const uint32_t* data, size_t chunk_words, uint32_t call,
                       unsigned long long* errors, unsigned long long* flag_wait_ns) {
  __shared__ int ok;
  const int c = blockIdx.x;
  if (threadIdx.x == 0) {
    const uint64_t t0 = global_timer_ns();
    ok = wait(sig, c, current_epoch(sig), 0);
    atomicMax(flag_wait_ns, (unsigned long long)(global_timer_ns() - t0));
  }
  __syncthreads();
  if (!ok) return;
  unsigned long long bad = 0;
  for (size_t i = threadIdx.x; i < chunk_words; i += blockDim.x)
    bad += data[c * chunk_words + i] != pattern(call, c * chunk_words + i);
  if (bad) atomicAdd(errors, bad);
}

__global__ void publish_all_after(DeviceSignals sig, int n, uint64_t delay_ns) {
  const uint64_t t0 = global_timer_ns();
  while (global_timer_ns() - t0 < delay_ns) {
  }
  const epoch_t e = current_epoch(sig);
  for (int i = threadIdx.x; i < n; i += blockDim.x) notify(sig, sig.rank, i, e);
}

struct Row {
  std::string probe, detail, result;
  double ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--json") json = argv[i + 1];
  int num_gpus = 0;
  CCFUSE_CUDA_CHECK(cudaGetDeviceCount(&num_gpus));
  std::vector<Row> rows;
  std::mutex mu;

  // ---- 1. copy engine + stream write-value flags into a peer ----
  if (num_gpus >= 2) {
    try {
      run_local_world({0, 1}, [&](Team& team) {
        constexpr int kChunks = 8, kCalls = 10;
        constexpr size_t kChunkWords = size_t(8) << 20;  // 32 MiB
        auto data = team.alloc_symmetric(kChunks * kChunkWords * 4);
        auto sig = team.make_signals("probe.ce_flags", kChunks);
        uint32_t* src = nullptr;
        unsigned long long *errors = nullptr, *wait_ns = nullptr;
        CCFUSE_CUDA_CHECK(cudaMalloc(&src, kChunks * kChunkWords * 4));
        CCFUSE_CUDA_CHECK(cudaMalloc(&errors, 8));
        CCFUSE_CUDA_CHECK(cudaMalloc(&wait_ns, 8));
        CCFUSE_CUDA_CHECK(cudaMemset(errors, 0, 8));
        CCFUSE_CUDA_CHECK(cudaMemset(wait_ns, 0, 8));
        cudaStream_t s;
        CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        epoch_t host_epoch = 0;  // mirrors the device epoch: one begin_call per call
        const auto t0 = std::chrono::steady_clock::now();
        for (uint32_t call = 1; call <= kCalls; ++call) {
          sig->begin_call(s);
          ++host_epoch;
          if (team.rank() == 0) {
            fill<<<264, 512, 0, s>>>(src, kChunks * kChunkWords, call);
            for (int c = 0; c < kChunks; ++c) {
              auto* dst = static_cast<uint32_t*>(data->peer(1)) + c * kChunkWords;
              CCFUSE_CUDA_CHECK(cudaMemcpyAsync(dst, src + c * kChunkWords, kChunkWords * 4, cudaMemcpyDeviceToDevice, s));
              stream_write_flag(s, sig->device().flags[1] + c, host_epoch);
            }
          } else {
            verify<<<kChunks, 512, 0, s>>>(sig->device(), static_cast<const uint32_t*>(data->local()), kChunkWords, call,
                                           errors, wait_ns);
            CCFUSE_CUDA_CHECK_LAUNCH();
          }
        }
        team.synchronize(s);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (team.rank() == 1) {
          unsigned long long bad = 0, ns = 0;
          CCFUSE_CUDA_CHECK(cudaMemcpy(&bad, errors, 8, cudaMemcpyDeviceToHost));
          CCFUSE_CUDA_CHECK(cudaMemcpy(&ns, wait_ns, 8, cudaMemcpyDeviceToHost));
          std::lock_guard<std::mutex> lock(mu);
          rows.push_back({"ce+writevalue", detail::str_cat(kCalls, " calls x ", kChunks, " x 32 MiB; max flag wait ",
                                                           ns / 1000, " us"),
                          bad == 0 ? "PASS" : detail::str_cat("FAIL ", bad, " stale words"), ms / kCalls});
        }
        team.barrier(s);
        team.synchronize(s);
        cudaFree(src);
        cudaFree(errors);
        cudaFree(wait_ns);
        cudaStreamDestroy(s);
      });
    } catch (const std::exception& e) {
      rows.push_back({"ce+writevalue", "", std::string("ERROR ") + e.what(), 0});
    }
  } else {
    rows.push_back({"ce+writevalue", "", "SKIPPED (needs 2 GPUs)", 0});
  }

  // ---- 2. co-scheduling of a publisher kernel with a persistent GEMM that waits on it ----
  try {
    run_local_world({0}, [&](Team& team) {
      using Traits = gemm::sm90::Traits<cutlass::bfloat16_t, 128, 256, 64, 4, true>;
      const int64_t m = 4096, n = 4096, k = 4096;
      void *a, *b, *c;
      CCFUSE_CUDA_CHECK(cudaMalloc(&a, m * k * 2));
      CCFUSE_CUDA_CHECK(cudaMalloc(&b, n * k * 2));
      CCFUSE_CUDA_CHECK(cudaMalloc(&c, m * n * 2));
      CCFUSE_CUDA_CHECK(cudaMemset(a, 0, m * k * 2));
      CCFUSE_CUDA_CHECK(cudaMemset(b, 0, n * k * 2));
      const int m_tiles = int(m / 128);
      auto sig = team.make_signals("probe.sched", m_tiles);
      cudaStream_t gs, ps;
      cudaEvent_t begun;
      CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
      CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking));
      CCFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&begun, cudaEventDisableTiming));
      for (int sms : {132, 131, 128, 124}) {
        for (int publisher_first = 1; publisher_first >= 0; --publisher_first) {
          gemm::sm90::SignalReadySchedule sched;
          sched.base = gemm::sm90::plain_schedule(m, n, 128, 256, 8, false);
          sched.sig = sig->device();
          sig->begin_call(gs);
          CCFUSE_CUDA_CHECK(cudaEventRecord(begun, gs));
          CCFUSE_CUDA_CHECK(cudaStreamWaitEvent(ps, begun));
          const auto t0 = std::chrono::steady_clock::now();
          auto launch_gemm = [&] {
            gemm::sm90::launch_gemm<Traits>(m, n, k, a, k, b, k, c, n, sched, gemm::sm90::PlainEpilogue{}, sms, gs);
          };
          auto launch_pub = [&] {
            publish_all_after<<<1, 128, 0, ps>>>(sig->device(), m_tiles, 200000);
            CCFUSE_CUDA_CHECK_LAUNCH();
          };
          if (publisher_first) {
            launch_pub();
            launch_gemm();
          } else {
            launch_gemm();
            launch_pub();
          }
          std::string result = "ok";
          try {
            CCFUSE_CUDA_CHECK(cudaStreamSynchronize(ps));
            team.synchronize(gs);
          } catch (const TimeoutError&) {
            result = "TIMEOUT";
            team.reset_watchdog();
          }
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          rows.push_back({"gemm+publisher", detail::str_cat("gemm on ", sms, " SMs, ",
                                                            publisher_first ? "publisher launched first" : "GEMM launched first"),
                          result, ms});
        }
      }
      cudaFree(a);
      cudaFree(b);
      cudaFree(c);
    }, TeamOptions{2000});
  } catch (const std::exception& e) {
    rows.push_back({"gemm+publisher", "", std::string("ERROR ") + e.what(), 0});
  }

  std::ofstream out;
  if (!json.empty()) out.open(json, std::ios::app);
  std::printf("%-16s %-62s %-10s %10s\n", "probe", "detail", "result", "ms");
  for (const Row& r : rows) {
    std::printf("%-16s %-62s %-10s %10.3f\n", r.probe.c_str(), r.detail.c_str(), r.result.c_str(), r.ms);
    if (out)
      out << "{\"probe\":\"" << r.probe << "\",\"detail\":\"" << r.detail << "\",\"result\":\"" << r.result
          << "\",\"ms\":" << r.ms << "}\n";
  }
  return 0;
}
