// The CPU reference world: signals and epochs across rank threads, the entry barrier, the
// watchdog, and how one rank's failure stops the others.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reference/world.h"

namespace ccfuse::ref {
namespace {

using Clock = std::chrono::steady_clock;

// Substring check that prints the whole message on failure (gmock's HasSubstr is not linked).
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs fn and returns the message of the exception of type E it throws (fails the test otherwise).
template <typename E, typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

TEST(World, BadArgumentsAreRejectedWithTheRule) {
  EXPECT_EQ(message_of<InvalidArgument>([] { World w(0); }), "world_size 0 must be at least 1");
  EXPECT_EQ(message_of<InvalidArgument>([] { World w(WorldOptions{-2, 100}); }), "world_size -2 must be at least 1");
  EXPECT_EQ(message_of<InvalidArgument>([] { World w(WorldOptions{2, 0}); }), "watchdog_ms 0 must be positive");
  World world(2);
  EXPECT_EQ(message_of<InvalidArgument>([&] { SignalArray s(world, "x", -1); }),
            "num_signals -1 must not be negative");
}

TEST(World, RunsEveryRankOnItsOwnThread) {
  World world(4);
  std::vector<int> seen(4, 0);
  world.run([&](int rank) { seen[size_t(rank)] = rank + 1; });
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
}

TEST(World, SignalCarriesDataAcrossThreads) {
  World world(2);
  SignalArray sig(world, "data_ready", 1);
  SymmetricBuffer<int64_t> buf(world, 64);
  world.run([&](int rank) {
    const epoch_t e = sig.begin_call(rank);
    if (rank == 0) {
      for (int i = 0; i < 64; ++i) buf.on(1)[i] = 1000 + i;  // plain writes, published by notify
      sig.notify(1, 0, e);
    } else {
      sig.wait(1, 0, e, /*producer=*/0);
      for (int i = 0; i < 64; ++i) ASSERT_EQ(buf.on(1)[i], 1000 + i);
    }
  });
  EXPECT_EQ(sig.load(1, 0), 1u);
  EXPECT_EQ(sig.load(0, 0), 0u);
}

TEST(World, EpochsStartAtOneAndGrowByOnePerCall) {
  World world(3);
  SignalArray sig(world, "s", 2);
  std::vector<std::vector<epoch_t>> epochs(3);
  for (int call = 0; call < 5; ++call)
    world.run([&](int rank) { epochs[size_t(rank)].push_back(sig.begin_call(rank)); });
  for (const auto& per_rank : epochs) EXPECT_EQ(per_rank, (std::vector<epoch_t>{1, 2, 3, 4, 5}));
}

// 1000 back-to-back calls of a ring pass: call e writes a value that depends on e into the next
// rank's slot. A wait passing on a flag left over from an earlier call, or a write landing
// before the reader of the previous call is done, would show a value from another call.
TEST(World, ThousandBackToBackCallsSeeNoStaleFlag) {
  constexpr int kWorld = 4, kCalls = 1000;
  World world(kWorld);
  SignalArray sig(world, "ring", 1);
  SymmetricBuffer<int64_t> slot(world, 1);
  std::vector<int> bad(kWorld, 0);
  world.run([&](int rank) {
    const int next = (rank + 1) % kWorld, prev = (rank + kWorld - 1) % kWorld;
    for (int call = 1; call <= kCalls; ++call) {
      world.barrier(rank);  // entry barrier: the previous reader of next's slot is done
      const epoch_t e = sig.begin_call(rank);
      ASSERT_EQ(e, epoch_t(call));
      slot.on(next)[0] = int64_t(e) * 100 + rank;
      sig.notify(next, 0, e);
      sig.wait(rank, 0, e, prev);
      if (slot.on(rank)[0] != int64_t(e) * 100 + prev) ++bad[size_t(rank)];
    }
  });
  EXPECT_EQ(bad, std::vector<int>(kWorld, 0));
}

TEST(World, BarrierOrdersPlainWrites) {
  World world(3);
  SymmetricBuffer<int> buf(world, 1);
  std::vector<int> sums(3, 0);
  world.run([&](int rank) {
    buf.on(rank)[0] = rank + 10;
    world.barrier(rank);
    for (int r = 0; r < 3; ++r) sums[size_t(rank)] += buf.on(r)[0];
  });
  EXPECT_EQ(sums, (std::vector<int>{33, 33, 33}));
}

TEST(World, WatchdogNamesWaiterProducerAndSignal) {
  World world(WorldOptions{2, 200});
  SignalArray sig(world, "ag_chunk", 8);
  const auto start = Clock::now();
  const std::string msg = message_of<TimeoutError>([&] {
    world.run([&](int rank) {
      const epoch_t e = sig.begin_call(rank);
      if (rank == 1) sig.wait(1, 3, e, /*producer=*/0);  // rank 0 never publishes
    });
  });
  const double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.2);
  EXPECT_LT(elapsed, 1.0);  // 5x the bound
  EXPECT_CONTAINS(msg, "rank 1:");
  EXPECT_CONTAINS(msg, "from rank 0");
  EXPECT_CONTAINS(msg, "'ag_chunk'[3]");
  EXPECT_CONTAINS(msg, "200 ms");
  EXPECT_CONTAINS(msg, "want epoch 1, have 0");
}

// Rank 1 times out (the root cause); rank 2, which would time out later, is stopped by the abort
// and sees WorldAborted. run() must report rank 1's TimeoutError.
TEST(World, RunRethrowsTheRootCauseNotTheKnockOn) {
  World world(WorldOptions{3, 200});
  SignalArray sig(world, "rs_partial", 4);
  std::atomic<bool> rank2_saw_abort{false};
  const auto start = Clock::now();
  const std::string msg = message_of<TimeoutError>([&] {
    world.run([&](int rank) {
      const epoch_t e = sig.begin_call(rank);
      if (rank == 1) sig.wait(1, 2, e, /*producer=*/0);
      if (rank == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its bound ends after rank 1's
        try {
          sig.wait(2, 0, e, /*producer=*/1);
        } catch (const WorldAborted& aborted) {
          rank2_saw_abort = std::string(aborted.what()).find("rank 1 failed") != std::string::npos;
          throw;
        }
      }
    });
  });
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_CONTAINS(msg, "rank 1:");
  EXPECT_CONTAINS(msg, "'rs_partial'[2] from rank 0");
  EXPECT_TRUE(rank2_saw_abort);
}

TEST(World, BarrierTimesOutNamingTheMissingRank) {
  World world(WorldOptions{3, 200});
  const auto start = Clock::now();
  const std::string msg = message_of<TimeoutError>([&] {
    world.run([&](int rank) {
      if (rank != 2) world.barrier(rank);
    });
  });
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_CONTAINS(msg, "barrier timed out after 200 ms with 2 of 3 ranks arrived (missing rank 2)");
}

// A rank that fails for its own reason stops the others at once: their waits and barriers throw
// WorldAborted instead of running out a long bound, and run() reports the original error.
TEST(World, ARankThrowingStopsTheOthersAtOnce) {
  World world(WorldOptions{4, 20000});
  SignalArray sig(world, "s", 1);
  const auto start = Clock::now();
  const std::string msg = message_of<std::runtime_error>([&] {
    world.run([&](int rank) {
      const epoch_t e = sig.begin_call(rank);
      if (rank == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the others start waiting
        throw std::runtime_error("rank 0 broke");
      }
      if (rank == 1) world.barrier(rank);
      if (rank >= 2) sig.wait(rank, 0, e, /*producer=*/0);
    });
  });
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(msg, "rank 0 broke");
  EXPECT_TRUE(world.aborted());
}

TEST(World, AFailedWorldStaysFailed) {
  World world(WorldOptions{2, 20000});
  EXPECT_THROW(world.run([](int rank) {
    if (rank == 1) throw std::runtime_error("boom");
  }),
               std::runtime_error);
  // The barrier count and epochs of a failed world are no longer consistent across ranks, so
  // later collective calls refuse to run rather than hang or mix calls.
  const std::string msg = message_of<WorldAborted>([&] { world.run([&](int rank) { world.barrier(rank); }); });
  EXPECT_CONTAINS(msg, "stopped because rank 1 failed");
}

}  // namespace
}  // namespace ccfuse::ref
