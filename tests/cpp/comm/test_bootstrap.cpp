// The TCP bootstrap of mode (b) Teams and the launcher-environment parsing (no GPU needed).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccfuse/comm/bootstrap.h"
#include "ccfuse/common/error.h"

namespace ccfuse::comm {
namespace {

int pick_port() {
  std::random_device rd;
  return 20000 + int(rd() % 20000);
}

TEST(Bootstrap, RankZeroBlobReachesEveryRank) {
  constexpr int kWorld = 4;
  const int port = pick_port();
  const std::string blob("\x01\x00\xffunique-id-bytes", 19);
  std::vector<std::string> got(kWorld);
  std::vector<std::thread> threads;
  for (int r = kWorld - 1; r >= 0; --r)  // clients first: they must retry until rank 0 listens
    threads.emplace_back([&, r] { got[size_t(r)] = broadcast_blob_tcp(r, kWorld, "127.0.0.1", port, r == 0 ? blob : "", 10000); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(got[size_t(r)], blob) << "rank " << r;
}

TEST(Bootstrap, MissingRankZeroTimesOutWithAddress) {
  const int port = pick_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    broadcast_blob_tcp(1, 2, "127.0.0.1", port, "", 300);
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 could not reach rank 0 at 127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(Bootstrap, MissingPeerTimesOutOnRankZero) {
  try {
    broadcast_blob_tcp(0, 3, "127.0.0.1", pick_port(), "x", 300);
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("with 0 of 2 ranks connected"), std::string::npos) << e.what();
  }
}

TEST(Bootstrap, BadArgumentsNameTheRule) {
  EXPECT_THROW(broadcast_blob_tcp(2, 2, "127.0.0.1", 1234, "", 10), InvalidArgument);
  try {
    broadcast_blob_tcp(0, 2, "127.0.0.1", 70000, "", 10);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "bootstrap port 70000 must be in [1, 65535]");
  }
  EXPECT_EQ(broadcast_blob_tcp(0, 1, "127.0.0.1", 1, "solo", 10), "solo");
}

// Sets environment variables for one test and restores them after.
class EnvGuard {
 public:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? std::string(old) : std::string(), old != nullptr});
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) setenv(it->name.c_str(), it->value.c_str(), 1);
      else unsetenv(it->name.c_str());
    }
  }

 private:
  struct Saved {
    std::string name, value;
    bool had;
  };
  std::vector<Saved> saved_;
};

void clear_launch_env(EnvGuard& env) {
  for (const char* n : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CCFUSE_BOOTSTRAP_PORT",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"})
    env.set(n, nullptr);
}

TEST(LaunchEnv, TorchrunVariables) {
  EnvGuard env;
  clear_launch_env(env);
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("MASTER_ADDR", "10.1.2.3");
  env.set("MASTER_PORT", "29500");
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.port, 29501);  // torchrun's store holds MASTER_PORT itself
  env.set("CCFUSE_BOOTSTRAP_PORT", "31000");
  EXPECT_EQ(read_launch_env().port, 31000);
}

TEST(LaunchEnv, SlurmFallbacks) {
  EnvGuard env;
  clear_launch_env(env);
  env.set("SLURM_PROCID", "1");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_LOCALID", "1");
  env.set("CCFUSE_BOOTSTRAP_PORT", "30000");
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, BadOrMissingVariablesNameThemselves) {
  EnvGuard env;
  clear_launch_env(env);
  try {
    read_launch_env();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "environment variable RANK is not set: launch with torchrun, srun or mpirun, or use Team::create");
  }
  env.set("RANK", "x1");
  try {
    read_launch_env();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "environment variable RANK='x1' must be a non-negative integer");
  }
  env.set("RANK", "2");
  env.set("WORLD_SIZE", "2");
  try {
    read_launch_env();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "RANK 2 must be below WORLD_SIZE 2");
  }
  env.set("RANK", "0");
  try {
    read_launch_env();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "neither CCFUSE_BOOTSTRAP_PORT nor MASTER_PORT is set (needed for WORLD_SIZE 2)");
  }
}

}  // namespace
}  // namespace ccfuse::comm
