// reference/world.h: the CPU reference world. W ranks run as W threads over shared host memory,
// with the same signal/epoch protocol as the GPUs (ccfuse/comm/epoch.h) on std::atomic with
// acquire/release, the same entry barrier, and watchdog'd waits.
//
// Usage:
//   ref::World world(/*world_size=*/4);
//   ref::SignalArray sig(world, "ag_chunk", /*num_signals=*/16);
//   world.run([&](int rank) {
//     epoch_t e = sig.begin_call(rank);         // this call's epoch on this rank
//     ... write data into a peer's buffer ...; sig.notify(rank, peer, idx, e);
//     sig.wait(rank, idx, e, /*producer=*/peer);  // throws TimeoutError past the bound
//   });
// If any rank throws, the world is aborted: every other rank's wait or barrier throws at once
// (it does not wait out its bound), and run() rethrows the first rank's error, so a test that
// expects a TimeoutError sees the root cause, not the knock-on aborts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ccfuse/comm/epoch.h"
#include "ccfuse/common/error.h"

namespace ccfuse::ref {

// Raised in ranks that stop because another rank failed first.
class WorldAborted : public Error {
 public:
  explicit WorldAborted(const std::string& what) : Error(what) {}
};

struct WorldOptions {
  int world_size = 1;
  int64_t watchdog_ms = 5000;  // bound of every wait and barrier
};

class World {
 public:
  explicit World(WorldOptions options);
  explicit World(int world_size) : World(WorldOptions{world_size, 5000}) {}

  int world_size() const { return options_.world_size; }
  int64_t watchdog_ms() const { return options_.watchdog_ms; }

  // Runs fn(rank) on W threads and joins them. Rethrows the first error any rank raised.
  void run(const std::function<void(int rank)>& fn);

  // All ranks meet here (the entry barrier of each call). Watchdog'd; throws on abort.
  void barrier(int rank);

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Marks the world failed; waits elsewhere throw WorldAborted naming `rank`.
  void abort(int rank);
  // Throws WorldAborted if another rank failed.
  void throw_if_aborted(int rank) const;

 private:
  WorldOptions options_;
  std::atomic<bool> aborted_{false};
  std::atomic<int> failed_rank_{-1};
  std::mutex barrier_mu_;
  std::condition_variable barrier_cv_;
  int barrier_count_ = 0;
  uint64_t barrier_generation_ = 0;
  std::vector<char> barrier_arrived_;  // [world]: who is in the current barrier (for the timeout message)
};

// A symmetric array of signals: every rank holds `num_signals` flags, and one epoch counter.
class SignalArray {
 public:
  SignalArray(World& world, std::string name, int num_signals);

  const std::string& name() const { return name_; }
  int num_signals() const { return num_signals_; }

  // Starts a call on `rank`: bumps that rank's epoch counter and returns the new epoch.
  epoch_t begin_call(int rank);
  // Release-stores `epoch` into flag `idx` of `to_rank` (after the data it guards is written).
  void notify(int to_rank, int idx, epoch_t epoch);
  // Spins (acquire) until flag `idx` of `rank` reaches `epoch`. `producer` is the rank expected
  // to publish it; it is named in the TimeoutError past the watchdog bound.
  void wait(int rank, int idx, epoch_t epoch, int producer);
  // Current value of a flag (tests).
  epoch_t load(int rank, int idx) const;

 private:
  World& world_;
  std::string name_;
  int num_signals_;
  std::unique_ptr<std::atomic<epoch_t>[]> flags_;   // [world][num_signals]
  std::unique_ptr<std::atomic<epoch_t>[]> epochs_;  // [world], each touched only by its rank
};

// Symmetric buffer: one array of `count` elements per rank, addressable by every rank.
template <typename T>
class SymmetricBuffer {
 public:
  SymmetricBuffer(const World& world, size_t count)
      : count_(count), data_(size_t(world.world_size())) {
    for (auto& d : data_) d.assign(count, T{});
  }
  T* on(int rank) { return data_[size_t(rank)].data(); }
  const T* on(int rank) const { return data_[size_t(rank)].data(); }
  size_t count() const { return count_; }

 private:
  size_t count_;
  std::vector<std::vector<T>> data_;
};

}  // namespace ccfuse::ref
