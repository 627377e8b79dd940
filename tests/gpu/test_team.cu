// Team, symmetric buffers and signals on real GPUs (>= 2; skipped otherwise).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/comm/team.h"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/gemm/gemm.h"
#include "gpu_test_util.h"

namespace ccfuse::comm {
namespace {

using ccfuse::testing::all_devices;

__device__ __forceinline__ uint32_t pattern(epoch_t epoch, int src, int tile, int i) {
  return uint32_t(epoch * 2654435761ull) ^ (uint32_t(src) << 24) ^ (uint32_t(tile) << 14) ^ uint32_t(i);
}

// Ring exchange of one call: CTA t < num_tiles pushes tile t of this call's pattern into the
// next rank's slot and signals it; CTA num_tiles + t waits for tile t from the previous rank and
// counts wrong words (stale data) and flags that are not exactly this epoch (stale flags).
__global__ void ring_tiles_kernel(DeviceSignals sig, SymmetricView<uint32_t> data, int num_tiles, int tile_elems,
                                  int skip_publish_rank, unsigned long long* errors) {
  const epoch_t epoch = current_epoch(sig);
  const int rank = sig.rank, w = sig.world_size;
  const int next = (rank + 1) % w, prev = (rank + w - 1) % w;
  if (int(blockIdx.x) < num_tiles) {
    const int tile = blockIdx.x;
    uint32_t* dst = data.peer(next) + size_t(tile) * tile_elems;
    for (int i = threadIdx.x; i < tile_elems; i += blockDim.x) dst[i] = pattern(epoch, rank, tile, i);
    __syncthreads();
    if (threadIdx.x == 0 && rank != skip_publish_rank) notify(sig, next, tile, epoch);
    return;
  }
  const int tile = blockIdx.x - num_tiles;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = wait(sig, tile, epoch, prev);
    if (ok && sig.flags[rank][tile] != epoch) atomicAdd(errors, 1ull);  // a flag from the future is a bug too
  }
  __syncthreads();
  if (!ok) return;
  const uint32_t* src = data.local() + size_t(tile) * tile_elems;
  unsigned long long bad = 0;
  for (int i = threadIdx.x; i < tile_elems; i += blockDim.x) bad += src[i] != pattern(epoch, prev, tile, i);
  if (bad) atomicAdd(errors, bad);
}

__global__ void stamp_kernel(unsigned long long* out) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *out = t;
}

// Where each rank's time goes in a ring test (one-GPU worlds of W >= 4 were late on their first
// call or stalled in the graph test, 2026-12-06): host steps and the moment the rank's stream
// got to them on the GPU (globaltimer, in mapped host memory so that a stalled run still shows
// what ran), as ms since the test began. Printed as they happen (a hung run still tells where it
// was) when W >= 4 in a one-GPU world, else only at a failure.
struct Stamps {
  static constexpr int kGpuSlots = 8;
  const bool verbose = ccfuse::testing::one_gpu_ranks() >= 4;
  const double t0_ms = now_ms();
  std::mutex mu;
  std::vector<std::string> lines;
  static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  void host(int rank, const char* what) {
    char line[160];
    std::snprintf(line, sizeof(line), "[ stamp ] rank %d host +%.3f ms %s", rank, now_ms() - t0_ms, what);
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(line);
    if (verbose) std::printf("%s\n", line), std::fflush(stdout);
  }
  // The GPU's stamps of one rank (slots a kernel wrote, 0 = not reached), then every line if asked.
  void gpu(int rank, const unsigned long long* slots, const char* const* names, int n) {
    for (int i = 0; i < n; ++i) {
      char line[160];
      if (slots[i] == 0) std::snprintf(line, sizeof(line), "[ stamp ] rank %d gpu  (not reached) %s", rank, names[i]);
      else std::snprintf(line, sizeof(line), "[ stamp ] rank %d gpu  +%.3f ms %s", rank, double(slots[i]) * 1e-6 - t0_ms, names[i]);
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
      if (verbose) std::printf("%s\n", line), std::fflush(stdout);
    }
  }
  ~Stamps() {
    if (verbose || !::testing::Test::HasFailure()) return;
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
  }
};

struct Ring {
  static constexpr int kTiles = 48;
  static constexpr int kTileElems = 8192;  // 32 KiB a tile
  std::unique_ptr<SymmetricBuffer> data;
  std::unique_ptr<SignalSet> sig;
  unsigned long long* errors = nullptr;
  cudaStream_t stream = nullptr;

  explicit Ring(Team& team) {
    // Plain allocations first, the collectives last: in a one-GPU world a cudaMalloc after them
    // may wait for a peer's first call, which waits for this rank (docs/foundation.md).
    CCFUSE_CUDA_CHECK(cudaMalloc(&errors, sizeof(*errors)));
    CCFUSE_CUDA_CHECK(cudaMemset(errors, 0, sizeof(*errors)));
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CCFUSE_CUDA_CHECK(cudaHostAlloc(&stamps, sizeof(unsigned long long) * Stamps::kGpuSlots, cudaHostAllocMapped));
    std::memset(stamps, 0, sizeof(unsigned long long) * Stamps::kGpuSlots);
    data = team.alloc_symmetric(size_t(kTiles) * kTileElems * sizeof(uint32_t));
    sig = team.make_signals("test.ring", kTiles);
  }
  ~Ring() {
    cudaStreamDestroy(stream);
    cudaFree(errors);
    cudaFreeHost(stamps);
  }
  // The GPU writes the time it reaches this point of the stream into slot i.
  void stamp(int i) {
    unsigned long long* d = nullptr;
    CCFUSE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d), stamps, 0));
    stamp_kernel<<<1, 1, 0, stream>>>(d + i);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  unsigned long long* stamps = nullptr;  // mapped host memory, Stamps::kGpuSlots
  // mid_slot >= 0: also stamp that slot between the entry barrier and the ring kernel.
  void call(int skip_publish_rank = -1, int mid_slot = -1) {
    sig->begin_call(stream);
    if (mid_slot >= 0) stamp(mid_slot);
    ring_tiles_kernel<<<2 * kTiles, 256, 0, stream>>>(sig->device(), data->view<uint32_t>(), kTiles, kTileElems,
                                                      skip_publish_rank, errors);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  // Team::synchronize, but a stream still busy after kLateMs prints the rank's GPU stamps so far
  // (mapped memory: readable while the stream hangs), then goes on waiting.
  void synchronize_watched(Team& team, Stamps& st, const char* const* names, int n) {
    constexpr double kLateMs = 8000;  // past the 5 s watchdog bound
    const auto start = std::chrono::steady_clock::now();
    bool told = false;
    while (cudaStreamQuery(stream) == cudaErrorNotReady) {
      if (!told && std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() > kLateMs) {
        told = true;
        st.host(team.rank(), "stream still busy: its GPU stamps so far");
        st.gpu(team.rank(), stamps, names, n);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    team.synchronize(stream);
  }
  unsigned long long read_errors() const {
    unsigned long long e = 0;
    CCFUSE_CUDA_CHECK(cudaMemcpy(&e, errors, sizeof(e), cudaMemcpyDeviceToHost));
    return e;
  }
};

__global__ void read_peers_kernel(SymmetricView<int> view, int* out) {
  const int r = threadIdx.x;
  if (r < view.world_size) out[r] = view.peer(r)[1];
}

TEST(GpuTeam, RanksAndPeerPointers) {
  CCFUSE_REQUIRE_RANKS(2);
  const auto devices = all_devices();
  run_local_world(devices, [&](Team& team) {
    EXPECT_EQ(team.world_size(), int(devices.size()));
    EXPECT_EQ(team.device(), devices[size_t(team.rank())]);
    auto buf = team.alloc_symmetric(4096);
    const int mine[2] = {-1, 1000 + team.rank()};
    CCFUSE_CUDA_CHECK(cudaMemcpy(buf->local(), mine, sizeof(mine), cudaMemcpyHostToDevice));
    team.barrier(nullptr);
    int* out = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&out, sizeof(int) * kMaxLsaRanks));
    read_peers_kernel<<<1, 32>>>(buf->view<int>(), out);
    CCFUSE_CUDA_CHECK_LAUNCH();
    std::vector<int> got(size_t(team.world_size()));
    CCFUSE_CUDA_CHECK(cudaMemcpy(got.data(), out, sizeof(int) * got.size(), cudaMemcpyDeviceToHost));
    for (int r = 0; r < team.world_size(); ++r) EXPECT_EQ(got[size_t(r)], 1000 + r) << "peer " << r;
    team.barrier(nullptr);  // nobody frees before all have read
    team.synchronize(nullptr);
    cudaFree(out);
  });
}

TEST(GpuTeam, ThousandCallsBackToBackNoStaleFlag) {
  CCFUSE_REQUIRE_RANKS(2);
  Stamps stamps;
  run_local_world(all_devices(), [&](Team& team) {
    const int rank = team.rank();
    stamps.host(rank, "in the rank's thread");
    Ring ring(team);
    stamps.host(rank, "ring built (collectives done)");
    constexpr int kCalls = 1000;
    const auto start = std::chrono::steady_clock::now();
    ring.stamp(0);
    ring.call();
    ring.stamp(1);
    stamps.host(rank, "first call enqueued");
    for (int i = 1; i < kCalls; ++i) ring.call();  // no host sync in between
    stamps.host(rank, "all calls enqueued");
    const char* const gpu_names[2] = {"stream reached the first call", "first call done"};
    try {
      ring.synchronize_watched(team, stamps, gpu_names, 2);
    } catch (...) {
      stamps.host(rank, "synchronize threw");
      stamps.gpu(rank, ring.stamps, gpu_names, 2);
      throw;
    }
    stamps.gpu(rank, ring.stamps, gpu_names, 2);
    std::printf("[ info ] rank %d: %d ring calls in %.1f ms\n", team.rank(), kCalls,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    EXPECT_EQ(ring.read_errors(), 0ull) << "rank " << team.rank();
    EXPECT_EQ(ring.sig->read_epoch(), epoch_t(kCalls));
    team.barrier(ring.stream);
    team.synchronize(ring.stream);
  });
}

TEST(GpuTeam, CudaGraphReplaysAdvanceTheEpoch) {
  CCFUSE_REQUIRE_RANKS(2);
  // Host meeting points around the capture: in a one-GPU world, one rank's capture and
  // instantiation must not overlap a peer's kernels that wait for that rank (suspected from a
  // W = 4 and W = 8 run, 2026-12-06: not confirmed); between GPUs they are no-ops in effect.
  // The graph is uploaded before the replays: a first launch that uploads it might wait like a
  // lazily loaded kernel (not confirmed).
  ccfuse::testing::HostBarrier host_barrier(int(all_devices().size()));
  Stamps stamps;
  run_local_world(all_devices(), [&](Team& team) {
   const int rank = team.rank();
   const char* const gpu_names[4] = {"stream reached the eager call", "eager call done", "replays done",
                                     "eager call's entry barrier passed"};
   try {
    stamps.host(rank, "in the rank's thread");
    Ring ring(team);
    stamps.host(rank, "ring built (collectives done)");
    ring.stamp(0);
    ring.call(-1, /*mid_slot=*/3);  // one eager call first: graph replays continue from the device epoch
    ring.stamp(1);
    stamps.host(rank, "eager call enqueued");
    ring.synchronize_watched(team, stamps, gpu_names, 4);
    stamps.host(rank, "eager call synchronized");
    host_barrier.arrive_and_wait();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(ring.stream, cudaStreamCaptureModeThreadLocal));
    ring.call();
    CCFUSE_CUDA_CHECK(cudaStreamEndCapture(ring.stream, &graph));
    stamps.host(rank, "captured");
    CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    stamps.host(rank, "instantiated");
    CCFUSE_CUDA_CHECK(cudaGraphUpload(exec, ring.stream));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(ring.stream));
    stamps.host(rank, "uploaded");
    host_barrier.arrive_and_wait();
    constexpr int kReplays = 300;
    for (int i = 0; i < kReplays; ++i) CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, ring.stream));
    ring.stamp(2);
    stamps.host(rank, "replays enqueued");
    ring.synchronize_watched(team, stamps, gpu_names, 4);
    stamps.host(rank, "replays synchronized");
    stamps.gpu(rank, ring.stamps, gpu_names, 4);
    EXPECT_EQ(ring.read_errors(), 0ull);
    EXPECT_EQ(ring.sig->read_epoch(), epoch_t(1 + kReplays));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    team.barrier(ring.stream);
    team.synchronize(ring.stream);
   } catch (...) {
    stamps.host(rank, "failed");
    host_barrier.abort();  // no rank waits at the host for one that failed
    throw;
   }
  });
}

TEST(GpuTeam, WatchdogNamesTheSilentRankAndSignal) {
  CCFUSE_REQUIRE_RANKS(2);
  constexpr int64_t kBoundMs = 300;
  std::atomic<int> timeouts{0};
  ccfuse::testing::HostBarrier host_barrier(int(all_devices().size()));
  run_local_world(all_devices(), [&](Team& team) {
   try {
    Ring ring(team);
    ring.call();
    team.synchronize(ring.stream);  // a healthy call first
    const auto start = std::chrono::steady_clock::now();
    ring.call(/*skip_publish_rank=*/0);  // rank 0 never publishes: its ring successor (rank 1) must time out
    try {
      team.synchronize(ring.stream);
      EXPECT_NE(team.rank(), 1) << "rank 1 should have timed out";
    } catch (const TimeoutError& e) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      ++timeouts;
      const std::string what = e.what();
      EXPECT_EQ(team.rank(), 1) << what;
      EXPECT_NE(what.find("rank 1: timed out"), std::string::npos) << what;
      EXPECT_NE(what.find("signal 'test.ring'["), std::string::npos) << what;
      EXPECT_NE(what.find("from rank 0"), std::string::npos) << what;
      EXPECT_LT(ms, 5.0 * kBoundMs + 500) << what;
      team.reset_watchdog();
    }
    // Rank 1 spent one bound in the failed call: the others wait for it on the host, or their
    // next entry barrier would (rightly) time out too.
    host_barrier.arrive_and_wait();
    // The Team stays usable: the next call (epoch + 1) is correct everywhere.
    CCFUSE_CUDA_CHECK(cudaMemset(ring.errors, 0, sizeof(*ring.errors)));
    ring.call();
    team.synchronize(ring.stream);
    EXPECT_EQ(ring.read_errors(), 0ull);
    team.barrier(ring.stream);
    team.synchronize(ring.stream);
   } catch (...) {
    host_barrier.abort();  // a rank that failed early must not leave the others at the host barrier
    throw;
   }
  }, TeamOptions{kBoundMs});
  EXPECT_EQ(timeouts.load(), 1);
}

TEST(GpuTeam, WatchdogOnEntryBarrierNamesTheAbsentRank) {
  CCFUSE_REQUIRE_RANKS(2);
  constexpr int64_t kBoundMs = 300;
  std::atomic<int> timeouts{0};
  run_local_world(all_devices(), [&](Team& team) {
    auto sig = team.make_signals("test.absent", 4);
    if (team.rank() != 0) sig->begin_call(nullptr);  // rank 0 never enters the call
    try {
      team.synchronize(nullptr);
      EXPECT_EQ(team.rank(), 0);
    } catch (const TimeoutError& e) {
      ++timeouts;
      const std::string what = e.what();
      EXPECT_NE(what.find("entry barrier of 'test.absent'"), std::string::npos) << what;
      EXPECT_NE(what.find("from rank 0"), std::string::npos) << what;
      team.reset_watchdog();
    }
  }, TeamOptions{kBoundMs});
  EXPECT_EQ(timeouts.load(), int(all_devices().size()) - 1);
}

TEST(GpuTeam, BadInputRaisesClearErrors) {
  CCFUSE_REQUIRE_RANKS(2);
  run_local_world(all_devices(), [&](Team& team) {
    try {
      team.alloc_symmetric(0);
      ADD_FAILURE() << "alloc_symmetric(0) did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "symmetric buffer size must be positive, got 0 bytes");
    }
    try {
      team.make_signals("x", -1);
      ADD_FAILURE() << "make_signals(-1) did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "num_signals -1 must not be negative (signal set 'x')");
    }
    void* plain = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&plain, 4096));
    try {
      team.require_symmetric(plain, 4096, "A");
      ADD_FAILURE() << "a cudaMalloc pointer passed require_symmetric";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("A ("), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("is not inside a symmetric buffer of this Team"), std::string::npos);
    }
    auto buf = team.alloc_symmetric(8192);
    EXPECT_NO_THROW(team.require_symmetric(static_cast<char*>(buf->local()) + 4096, 4096, "A"));
    EXPECT_THROW(team.require_symmetric(static_cast<char*>(buf->local()) + 4096, 8192, "A"), InvalidArgument);
    cudaFree(plain);
  });
  EXPECT_THROW(Team::create(ncclUniqueId{}, 2, 2, 0), InvalidArgument);
}

// Mode (d) on the one GPU that every GPU machine has: two ranks, each in a green context with
// its own half (or less) of the SMs, exchange through plain allocations with the same signals.
TEST(GpuTeam, OneGpuWorldGivesEachRankItsOwnSmsAndPeers) {
  CCFUSE_REQUIRE_GPUS(1);
  int total = 0;
  CCFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&total, cudaDevAttrMultiProcessorCount, 0));
  std::atomic<int> sms_sum{0};
  run_local_world({0, 0}, [&](Team& team) {
    EXPECT_TRUE(team.shares_device());
    EXPECT_EQ(team.comm(), nullptr);
    EXPECT_EQ(team.device(), 0);
    const int sms = gemm::current_device_sms();
    EXPECT_GE(sms, 8) << "rank " << team.rank();
    EXPECT_LE(2 * sms, total) << "rank " << team.rank() << ": the shares overlap";
    sms_sum += sms;
    Ring ring(team);
    EXPECT_EQ(ring.data->peer(team.rank()), ring.data->local());
    EXPECT_NE(ring.data->peer(0), ring.data->peer(1));
    for (int i = 0; i < 100; ++i) ring.call();
    team.synchronize(ring.stream);
    EXPECT_EQ(ring.read_errors(), 0ull) << "rank " << team.rank();
    EXPECT_EQ(ring.sig->read_epoch(), epoch_t(100));
    team.barrier(ring.stream);
    team.synchronize(ring.stream);
  });
  EXPECT_LE(sms_sum.load(), total);
  // Back on the primary context: the whole GPU again.
  CCFUSE_CUDA_CHECK(cudaSetDevice(0));
  EXPECT_EQ(gemm::current_device_sms(), total);
}

__global__ void spin_on_host_flag(const volatile int* flag, unsigned long long max_ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*flag == 0 && t - t0 < max_ns);
}

__global__ void touch(int* p) { *p += 1; }

// In a one-GPU world, which host calls of one rank wait for another rank's running kernel? A
// rank's kernel that waits for a peer is normal; a host call of the peer that waits for that
// kernel before the peer joins is a deadlock (until the watchdog). Rank 0 runs a kernel that
// spins until rank 1's host thread releases it (1 s at most); rank 1 times one call meanwhile.
TEST(GpuTeam, OneGpuWorldHostCallsDoNotWaitForAPeersKernel) {
  CCFUSE_REQUIRE_GPUS(1);
  CCFUSE_CUDA_CHECK(cudaSetDevice(0));
  int* flag = nullptr;
  CCFUSE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  const char* names[] = {"cudaMemcpyAsync own stream + sync", "cudaMemcpy D2H pinned", "cudaMemcpy D2H pageable",
                         "cudaMemset (legacy) + legacy sync",  "kernel on legacy + legacy sync",
                         "cudaStreamCreate + destroy",          "cudaMalloc",
                         "cudaDeviceSynchronize",              "cudaFree"};
  constexpr int kOps = 9;
  std::vector<double> ms(kOps, 0.0);
  ccfuse::testing::HostBarrier hb(2);
  run_local_world({0, 0}, [&](Team& team) {
   try {
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *dev = nullptr, *pinned = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&dev, 4096));
    CCFUSE_CUDA_CHECK(cudaMemset(dev, 0, 4096));
    CCFUSE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 64, cudaHostAllocDefault));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    int* dflag = nullptr;
    CCFUSE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflag), flag, 0));
    // Both kernels launched once first: under lazy loading (the default without
    // CUDA_MODULE_LOADING=EAGER) a kernel's first launch waits for the running kernels.
    *reinterpret_cast<volatile int*>(flag) = 1;
    spin_on_host_flag<<<1, 32, 0, s>>>(dflag, 0);
    touch<<<1, 1, 0, s>>>(dev);
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
    hb.arrive_and_wait();
    for (int op = 0; op < kOps; ++op) {
      hb.arrive_and_wait();
      if (team.rank() == 0) {
        *reinterpret_cast<volatile int*>(flag) = 0;
        spin_on_host_flag<<<1, 32, 0, s>>>(dflag, 1000000000ull);
        CCFUSE_CUDA_CHECK_LAUNCH();
      }
      hb.arrive_and_wait();
      if (team.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0's kernel is running
        int x = 0;
        void* tmp = nullptr;
        cudaStream_t s2;
        const auto t0 = std::chrono::steady_clock::now();
        switch (op) {
          case 0: CCFUSE_CUDA_CHECK(cudaMemcpyAsync(pinned, dev, 4, cudaMemcpyDeviceToHost, s));
                  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s)); break;
          case 1: CCFUSE_CUDA_CHECK(cudaMemcpy(pinned, dev, 4, cudaMemcpyDeviceToHost)); break;
          case 2: CCFUSE_CUDA_CHECK(cudaMemcpy(&x, dev, 4, cudaMemcpyDeviceToHost)); break;
          case 3: CCFUSE_CUDA_CHECK(cudaMemset(dev, 0, 64)); CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy)); break;
          case 4: touch<<<1, 1>>>(dev); CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy)); break;
          case 5: CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
                  CCFUSE_CUDA_CHECK(cudaStreamDestroy(s2)); break;
          case 6: CCFUSE_CUDA_CHECK(cudaMalloc(&tmp, 1 << 20)); break;
          case 7: CCFUSE_CUDA_CHECK(cudaDeviceSynchronize()); break;
          case 8: CCFUSE_CUDA_CHECK(cudaMalloc(&tmp, 1 << 20)); 
                  {
                    const auto t1 = std::chrono::steady_clock::now();
                    CCFUSE_CUDA_CHECK(cudaFree(tmp));
                    ms[size_t(op)] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
                    tmp = nullptr;
                  }
                  break;
        }
        if (op != 8) ms[size_t(op)] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (tmp) cudaFree(tmp);
        *reinterpret_cast<volatile int*>(flag) = 1;
      } else {
        CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
      }
    }
    hb.arrive_and_wait();
    cudaFreeHost(pinned);
    cudaFree(dev);
    cudaStreamDestroy(s);
   } catch (...) {
    *reinterpret_cast<volatile int*>(flag) = 1;
    hb.abort();  // the other rank must not wait at the host barrier for this one
    throw;
   }
  });
  cudaFreeHost(flag);
  for (int op = 0; op < kOps; ++op) {
    std::printf("[ info ] one-GPU world, rank 1 while rank 0's kernel spins: %-36s %8.2f ms\n", names[op], ms[size_t(op)]);
    // The calls ranks make between collectives must not wait for a peer's kernel. Device-wide
    // syncs (cudaDeviceSynchronize, cudaFree) are recorded, not asserted: docs/foundation.md.
    if (op < 7) EXPECT_LT(ms[size_t(op)], 500.0) << names[op] << " waited for the other rank's kernel";
  }
}

// A rank that fails leaves no other waiting in a collective: they fail too, and the world
// reports the first failure, not the knock-on ones.
TEST(GpuTeam, OneGpuWorldReportsTheFailedRank) {
  CCFUSE_REQUIRE_GPUS(1);
  try {
    run_local_world({0, 0, 0}, [&](Team& team) {
      if (team.rank() == 2) throw InvalidArgument("rank 2 gave up");
      auto buf = team.alloc_symmetric(4096);  // collective: would wait for rank 2 forever
      ADD_FAILURE() << "rank " << team.rank() << " passed a collective that rank 2 never joined";
    });
    ADD_FAILURE() << "run_local_world did not rethrow";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "rank 2 gave up");
  }
}

TEST(GpuTeam, RunLocalWorldRejectsAGpuListedTwiceAmongOthers) {
  try {
    run_local_world({0, 1, 0}, [](Team&) { ADD_FAILURE() << "ran"; });
    ADD_FAILURE() << "did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("list each GPU once, or one GPU for every rank"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ccfuse::comm
