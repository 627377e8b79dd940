// ccfuse/common/host_barrier.h: the rank threads' meeting point of the benches and GPU tests.
// Reused over many generations, it lets no thread through early; abort() wakes the waiters, and
// every later arrival, with the Error it was given (a failed rank must not hang the others).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ccfuse/common/host_barrier.h"

namespace ccfuse {
namespace {

TEST(HostBarrier, NoThreadPassesBeforeAllArriveOverManyGenerations) {
  constexpr int kThreads = 4, kRounds = 200;
  HostBarrier barrier(kThreads);
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        arrived.fetch_add(1);
        barrier.arrive_and_wait();
        // Everyone of this round has arrived before anyone leaves it.
        if (arrived.load() < (round + 1) * kThreads) early = true;
        barrier.arrive_and_wait();  // nobody starts the next round's count before all checked
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(early.load());
  EXPECT_EQ(arrived.load(), kThreads * kRounds);
}

TEST(HostBarrier, AbortWakesTheWaitersAndLaterArrivalsWithItsMessage) {
  HostBarrier barrier(3, "bench: another rank failed");
  std::atomic<int> woken{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < 2; ++t) {
    waiters.emplace_back([&] {
      try {
        barrier.arrive_and_wait();
      } catch (const Error& e) {
        if (std::string(e.what()) == "bench: another rank failed") woken.fetch_add(1);
      }
    });
  }
  // The third thread fails instead of arriving.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  barrier.abort();
  for (auto& th : waiters) th.join();
  EXPECT_EQ(woken.load(), 2);
  EXPECT_THROW(barrier.arrive_and_wait(), Error);
}

}  // namespace
}  // namespace ccfuse
