// Team, symmetric buffers and signals on real GPUs (>= 2; skipped otherwise).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>

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

struct Ring {
  static constexpr int kTiles = 48;
  static constexpr int kTileElems = 8192;  // 32 KiB a tile
  std::unique_ptr<SymmetricBuffer> data;
  std::unique_ptr<SignalSet> sig;
  unsigned long long* errors = nullptr;
  cudaStream_t stream = nullptr;

  explicit Ring(Team& team) {
    data = team.alloc_symmetric(size_t(kTiles) * kTileElems * sizeof(uint32_t));
    sig = team.make_signals("test.ring", kTiles);
    CCFUSE_CUDA_CHECK(cudaMalloc(&errors, sizeof(*errors)));
    CCFUSE_CUDA_CHECK(cudaMemset(errors, 0, sizeof(*errors)));
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Ring() {
    cudaStreamDestroy(stream);
    cudaFree(errors);
  }
  void call(int skip_publish_rank = -1) {
    sig->begin_call(stream);
    ring_tiles_kernel<<<2 * kTiles, 256, 0, stream>>>(sig->device(), data->view<uint32_t>(), kTiles, kTileElems,
                                                      skip_publish_rank, errors);
    CCFUSE_CUDA_CHECK_LAUNCH();
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
  run_local_world(all_devices(), [&](Team& team) {
    Ring ring(team);
    constexpr int kCalls = 1000;
    for (int i = 0; i < kCalls; ++i) ring.call();  // no host sync in between
    team.synchronize(ring.stream);
    EXPECT_EQ(ring.read_errors(), 0ull) << "rank " << team.rank();
    EXPECT_EQ(ring.sig->read_epoch(), epoch_t(kCalls));
    team.barrier(ring.stream);
    team.synchronize(ring.stream);
  });
}

TEST(GpuTeam, CudaGraphReplaysAdvanceTheEpoch) {
  CCFUSE_REQUIRE_RANKS(2);
  run_local_world(all_devices(), [&](Team& team) {
    Ring ring(team);
    ring.call();  // one eager call first: graph replays continue from the device epoch
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(ring.stream, cudaStreamCaptureModeThreadLocal));
    ring.call();
    CCFUSE_CUDA_CHECK(cudaStreamEndCapture(ring.stream, &graph));
    CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    constexpr int kReplays = 300;
    for (int i = 0; i < kReplays; ++i) CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, ring.stream));
    team.synchronize(ring.stream);
    EXPECT_EQ(ring.read_errors(), 0ull);
    EXPECT_EQ(ring.sig->read_epoch(), epoch_t(1 + kReplays));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    team.barrier(ring.stream);
    team.synchronize(ring.stream);
  });
}

TEST(GpuTeam, WatchdogNamesTheSilentRankAndSignal) {
  CCFUSE_REQUIRE_RANKS(2);
  constexpr int64_t kBoundMs = 300;
  std::atomic<int> timeouts{0};
  ccfuse::testing::HostBarrier host_barrier(int(all_devices().size()));
  run_local_world(all_devices(), [&](Team& team) {
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
