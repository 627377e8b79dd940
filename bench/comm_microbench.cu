// Communication microbenchmarks on the GPUs of one host (>= 2), all through ccfuse's Team:
//   signal_rtt : round trip of a release/acquire flag between ranks 0 and 1 (ping-pong in one kernel)
//   lsa_push   : SM-driven NVLink stores to the peer's symmetric buffer, by number of CTAs
//   lsa_pull   : SM-driven NVLink loads from the peer's symmetric buffer, by number of CTAs
//   ce_push    : copy engine (cudaMemcpyAsync) into the peer's symmetric buffer
// Each is timed with CUDA events on rank 0, median of --iters runs; "bidir" rows run the same
// transfer on both ranks at once and report one direction's bandwidth.
//
// Usage: ccfuse_comm_bench [--bytes N] [--iters N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "ccfuse/comm/signals.cuh"
#include "ccfuse/comm/team.h"
#include "ccfuse/common/cuda_check.h"

using namespace ccfuse;
using namespace ccfuse::bench;
using namespace ccfuse::comm;

namespace {

__global__ void pingpong_kernel(DeviceSignals sig, int iters) {
  if (threadIdx.x != 0 || sig.rank > 1) return;
  // Flag values grow across launches: epoch in the high half, iteration in the low half.
  const epoch_t base = current_epoch(sig) << 32;
  for (int i = 1; i <= iters; ++i) {
    if (sig.rank == 0) {
      notify(sig, 1, 0, base + i);
      if (!wait(sig, 1, base + i, 1)) return;
    } else {
      if (!wait(sig, 0, base + i, 0)) return;
      notify(sig, 0, 1, base + i);
    }
  }
}

// 16-byte accesses, kUnroll loads in flight per thread before the stores: NVLink loads have
// microseconds of latency, and one load in flight per thread leaves the link idle.
template <int kUnroll>
__global__ void copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i * 2654435761u) ^ seed;
}

struct Row {
  std::string bench, mode;
  int ctas = 0;
  size_t bytes = 0;
  double time_ms = 0, gbps = 0, usec = 0;
};

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t(256) << 20;
  int iters = 20;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::cerr << name << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--bytes") bytes = std::stoull(value("--bytes"));
    else if (a == "--iters") iters = std::stoi(value("--iters"));
    else if (a == "--json") json = value("--json");
    else {
      std::cerr << "unknown option '" << a << "' (known: --bytes, --iters, --json)\n";
      return 2;
    }
  }
  int num_gpus = 0;
  if (cudaGetDeviceCount(&num_gpus) != cudaSuccess || num_gpus < 2) {
    std::cerr << "ccfuse_comm_bench: needs at least 2 GPUs, found " << num_gpus << "\n";
    return 2;
  }
  std::vector<int> devices(static_cast<size_t>(num_gpus));
  for (int d = 0; d < num_gpus; ++d) devices[size_t(d)] = d;
  cudaDeviceProp prop{};
  CCFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int num_sms = prop.multiProcessorCount;

  std::vector<Row> rows;
  std::mutex rows_mu;
  try {
    run_local_world(devices, [&](Team& team) {
      const int rank = team.rank();
      cudaStream_t stream;
      CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaEvent_t t0, t1;
      CCFUSE_CUDA_CHECK(cudaEventCreate(&t0));
      CCFUSE_CUDA_CHECK(cudaEventCreate(&t1));
      auto src = team.alloc_symmetric(bytes);
      auto dst = team.alloc_symmetric(bytes);
      fill_kernel<<<1024, 256, 0, stream>>>(static_cast<uint32_t*>(src->local()), bytes / 4, 0x9e3779b9u + rank);
      CCFUSE_CUDA_CHECK_LAUNCH();
      auto sig = team.make_signals("bench.pingpong", 2);
      auto sync_all = [&] {
        team.barrier(stream);
        team.synchronize(stream);
      };
      auto record = [&](Row r) {
        if (rank != 0) return;
        std::lock_guard<std::mutex> lock(rows_mu);
        rows.push_back(r);
      };

      // --- signal round trip (ranks 0 and 1) ---
      {
        constexpr int kPings = 20000;
        std::vector<double> us;
        for (int rep = 0; rep < 7; ++rep) {
          sig->begin_call(stream);
          CCFUSE_CUDA_CHECK(cudaEventRecord(t0, stream));
          pingpong_kernel<<<1, 32, 0, stream>>>(sig->device(), kPings);
          CCFUSE_CUDA_CHECK_LAUNCH();
          CCFUSE_CUDA_CHECK(cudaEventRecord(t1, stream));
          team.synchronize(stream);
          float ms = 0;
          CCFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
          if (rep > 0) us.push_back(1000.0 * ms / kPings);
        }
        Row r;
        r.bench = "signal_rtt";
        r.mode = "pingpong";
        r.usec = median(us);
        record(r);
      }
      sync_all();

      const size_t n16 = bytes / 16;
      auto time_on_rank0 = [&](bool both, auto&& launch) {
        std::vector<double> ms_all;
        for (int rep = 0; rep < iters + 2; ++rep) {
          sync_all();
          const bool active = rank == 0 || (both && rank == 1);
          if (active) {
            CCFUSE_CUDA_CHECK(cudaEventRecord(t0, stream));
            launch();
            CCFUSE_CUDA_CHECK(cudaEventRecord(t1, stream));
          }
          team.synchronize(stream);
          if (rank == 0 && rep >= 2) {
            float ms = 0;
            CCFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
            ms_all.push_back(ms);
          }
        }
        return rank == 0 ? median(ms_all) : 0.0;
      };
      const int peer = rank ^ 1;  // ranks 0 and 1 talk; others idle in the barriers
      for (int bidir = 0; bidir < 2; ++bidir) {
        for (int ctas : {1, 2, 4, 8, 16, 32, 64, num_sms}) {
          for (int pull = 0; pull < 2; ++pull) {
            const double ms = time_on_rank0(bidir != 0, [&] {
              if (peer >= team.world_size()) return;
              const int4* from = pull ? static_cast<const int4*>(src->peer(peer)) : static_cast<const int4*>(src->local());
              int4* to = pull ? static_cast<int4*>(dst->local()) : static_cast<int4*>(dst->peer(peer));
              copy_kernel<8><<<ctas, 512, 0, stream>>>(from, to, n16);
              CCFUSE_CUDA_CHECK_LAUNCH();
            });
            Row r;
            r.bench = pull ? "lsa_pull" : "lsa_push";
            r.mode = bidir ? "bidir" : "oneway";
            r.ctas = ctas;
            r.bytes = bytes;
            r.time_ms = ms;
            r.gbps = ms > 0 ? double(bytes) / (ms * 1e6) : 0;
            record(r);
          }
        }
        const double ms = time_on_rank0(bidir != 0, [&] {
          if (peer >= team.world_size()) return;
          CCFUSE_CUDA_CHECK(cudaMemcpyAsync(dst->peer(peer), src->local(), bytes, cudaMemcpyDeviceToDevice, stream));
        });
        Row r;
        r.bench = "ce_push";
        r.mode = bidir ? "bidir" : "oneway";
        r.bytes = bytes;
        r.time_ms = ms;
        r.gbps = ms > 0 ? double(bytes) / (ms * 1e6) : 0;
        record(r);
      }
      // Correctness of the last push: the peer's dst holds our src (spot check a few words).
      sync_all();
      if (rank == 1) {
        std::vector<uint32_t> got(1024), want(1024);
        CCFUSE_CUDA_CHECK(cudaMemcpy(got.data(), dst->local(), 4096, cudaMemcpyDeviceToHost));
        CCFUSE_CUDA_CHECK(cudaMemcpy(want.data(), src->peer(0), 4096, cudaMemcpyDeviceToHost));
        CCFUSE_CHECK(got == want, "copy-engine push delivered wrong data");
      }
      sync_all();
      cudaEventDestroy(t0);
      cudaEventDestroy(t1);
      cudaStreamDestroy(stream);
    });
  } catch (const std::exception& e) {
    std::cerr << "ccfuse_comm_bench: " << e.what() << "\n";
    return 3;
  }

  const std::string gpu = prop.name, commit = env_or("CCFUSE_COMMIT", "unknown"), date = iso_date();
  std::ofstream out;
  if (!json.empty()) out.open(json, std::ios::app);
  std::printf("%-11s %-7s %6s %12s %10s %10s\n", "bench", "mode", "ctas", "bytes", "ms", "GB/s|us");
  for (const Row& r : rows) {
    if (r.bench == "signal_rtt")
      std::printf("%-11s %-7s %6s %12s %10s %10.3f\n", r.bench.c_str(), r.mode.c_str(), "-", "-", "-", r.usec);
    else
      std::printf("%-11s %-7s %6d %12zu %10.4f %10.1f\n", r.bench.c_str(), r.mode.c_str(), r.ctas, r.bytes, r.time_ms,
                  r.gbps);
    if (out) {
      out << "{\"bench\":\"" << r.bench << "\",\"mode\":\"" << r.mode << "\",\"world_size\":" << num_gpus
          << ",\"ctas\":" << r.ctas << ",\"threads_per_cta\":512,\"bytes\":" << r.bytes << ",\"time_ms\":" << r.time_ms
          << ",\"gbps\":" << r.gbps << ",\"rtt_us\":" << r.usec << ",\"gpu\":\"" << gpu << "\",\"num_sms\":" << num_sms
          << ",\"commit\":\"" << commit << "\",\"date\":\"" << date << "\",\"iters\":" << iters << "}\n";
    }
  }
  return 0;
}
