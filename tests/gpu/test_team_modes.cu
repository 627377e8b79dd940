// The two other ways to make a Team: (b) one process per GPU from the launcher's environment,
// and (c) around a communicator someone else owns. Each runs the ring exchange of test_team.cu.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/comm/team.h"
#include "ccfuse/common/cuda_check.h"
#include "gpu_test_util.h"

extern char** environ;

namespace ccfuse::comm {
namespace {

// Every rank adds (rank + 1) * epoch into slot `rank` of every peer; after the call each rank
// checks all W slots. Exercises symmetric buffers, notify/wait and the epoch across calls.
__global__ void all_to_all_kernel(DeviceSignals sig, SymmetricView<epoch_t> slots, unsigned long long* errors) {
  const epoch_t epoch = current_epoch(sig);
  const int w = sig.world_size;
  const int p = threadIdx.x;
  if (p < w) {
    slots.peer(p)[sig.rank] = epoch * uint64_t(sig.rank + 1);
    notify(sig, p, sig.rank, epoch);  // release orders the store above before the flag
    if (!wait(sig, p, epoch, p)) return;
    if (slots.local()[p] != epoch * uint64_t(p + 1)) atomicAdd(errors, 1ull);
  }
}

void exchange_a_few_times(Team& team, int calls) {
  auto slots = team.alloc_symmetric(sizeof(epoch_t) * size_t(team.world_size()));
  auto sig = team.make_signals("test.a2a", team.world_size());
  unsigned long long* errors = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&errors, sizeof(*errors)));
  CCFUSE_CUDA_CHECK(cudaMemset(errors, 0, sizeof(*errors)));
  for (int i = 0; i < calls; ++i) {
    sig->begin_call(nullptr);
    all_to_all_kernel<<<1, 32>>>(sig->device(), slots->view<epoch_t>(), errors);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  team.synchronize(nullptr);
  unsigned long long bad = 0;
  CCFUSE_CUDA_CHECK(cudaMemcpy(&bad, errors, sizeof(bad), cudaMemcpyDeviceToHost));
  EXPECT_EQ(bad, 0ull) << "rank " << team.rank();
  EXPECT_EQ(sig->read_epoch(), epoch_t(calls));
  team.barrier(nullptr);  // nobody frees what a peer may still write
  team.synchronize(nullptr);
  cudaFree(errors);
}

TEST(GpuTeamModes, FromExistingCommunicator) {
  CCFUSE_REQUIRE_GPUS(2);
  const auto devices = ccfuse::testing::all_devices();
  const int n = int(devices.size());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  CCFUSE_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto team = Team::from_comm(comms[size_t(r)]);
        EXPECT_EQ(team->rank(), r);
        EXPECT_EQ(team->world_size(), n);
        exchange_a_few_times(*team, 50);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  // The Team borrowed the communicators: they are still ours to destroy.
  for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Child side of FromLauncherEnvironment: runs only inside the processes that test spawns.
TEST(GpuTeamModes, ChildProcessFromEnv) {
  if (!std::getenv("CCFUSE_TEST_CHILD")) GTEST_SKIP() << "runs only as a child of FromLauncherEnvironment";
  auto team = Team::from_env();
  exchange_a_few_times(*team, 50);
}

TEST(GpuTeamModes, FromLauncherEnvironment) {
  CCFUSE_REQUIRE_GPUS(2);
  if (std::getenv("CCFUSE_TEST_CHILD")) GTEST_SKIP() << "already a child";
  const int n = ccfuse::testing::gpu_count();
  std::random_device rd;
  const int port = 21000 + int(rd() % 20000);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    // torchrun's variables; MASTER_PORT + 1 is where ccfuse's bootstrap listens.
    std::vector<std::string> env = {"CCFUSE_TEST_CHILD=1", "RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                    "WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port), "NCCL_NVLS_ENABLE=0"};
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (kv.rfind("RANK=", 0) && kv.rfind("LOCAL_RANK=", 0) && kv.rfind("WORLD_SIZE=", 0) && kv.rfind("MASTER_", 0))
        env.push_back(kv);
    }
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=GpuTeamModes.ChildProcessFromEnv";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  // Children exit by themselves (their waits are watchdog'd); bound the wait anyway.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pids[r], &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (done == 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
      ADD_FAILURE() << "rank " << r << " did not finish within 120 s";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " status " << status;
  }
}

}  // namespace
}  // namespace ccfuse::comm
