#include "reference/world.h"

#include <chrono>
#include <exception>
#include <thread>

namespace ccfuse::ref {

namespace {
using Clock = std::chrono::steady_clock;
}

World::World(WorldOptions options) : options_(options) {
  CCFUSE_ARG_CHECK(options.world_size >= 1, "world_size ", options.world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(options.watchdog_ms > 0, "watchdog_ms ", options.watchdog_ms, " must be positive");
  barrier_arrived_.assign(size_t(options.world_size), 0);
}

void World::abort(int rank) {
  int expected = -1;
  failed_rank_.compare_exchange_strong(expected, rank);
  aborted_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(barrier_mu_);
  barrier_cv_.notify_all();
}

void World::throw_if_aborted(int rank) const {
  if (aborted())
    throw WorldAborted(detail::str_cat("rank ", rank, ": stopped because rank ", failed_rank_.load(),
                                       " failed"));
}

void World::run(const std::function<void(int rank)>& fn) {
  const int w = world_size();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(w));
  // NOTE: not std::vector<bool>: its elements share words, so two ranks setting their own entry
  // would race.
  std::vector<char> knock_on(static_cast<size_t>(w), 0);
  std::vector<std::thread> threads;
  threads.reserve(size_t(w));
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const WorldAborted&) {
        errors[size_t(r)] = std::current_exception();
        knock_on[size_t(r)] = 1;
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        abort(r);
      }
    });
  }
  for (auto& t : threads) t.join();
  // Root cause first: the rank that failed on its own, not one that stopped because of it.
  const int first = failed_rank_.load();
  if (first >= 0 && errors[size_t(first)]) std::rethrow_exception(errors[size_t(first)]);
  for (int r = 0; r < w; ++r)
    if (errors[size_t(r)] && !knock_on[size_t(r)]) std::rethrow_exception(errors[size_t(r)]);
  for (int r = 0; r < w; ++r)
    if (errors[size_t(r)]) std::rethrow_exception(errors[size_t(r)]);
}

void World::barrier(int rank) {
  std::unique_lock<std::mutex> lock(barrier_mu_);
  throw_if_aborted(rank);
  const uint64_t gen = barrier_generation_;
  barrier_arrived_[size_t(rank)] = 1;
  if (++barrier_count_ == world_size()) {
    barrier_count_ = 0;
    barrier_arrived_.assign(barrier_arrived_.size(), 0);
    ++barrier_generation_;
    barrier_cv_.notify_all();
    return;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.watchdog_ms);
  while (barrier_generation_ == gen) {
    if (aborted()) {
      lock.unlock();
      throw_if_aborted(rank);
    }
    if (barrier_cv_.wait_until(lock, deadline) == std::cv_status::timeout && barrier_generation_ == gen) {
      const int arrived = barrier_count_;
      std::string missing;
      for (int r = 0; r < world_size(); ++r)
        if (!barrier_arrived_[size_t(r)]) missing += detail::str_cat(missing.empty() ? "" : ",", r);
      throw TimeoutError(detail::str_cat("rank ", rank, ": barrier timed out after ", options_.watchdog_ms,
                                         " ms with ", arrived, " of ", world_size(),
                                         " ranks arrived (missing rank ", missing, ")"));
    }
  }
}

SignalArray::SignalArray(World& world, std::string name, int num_signals)
    : world_(world), name_(std::move(name)), num_signals_(num_signals) {
  CCFUSE_ARG_CHECK(num_signals >= 0, "num_signals ", num_signals, " must not be negative");
  const size_t total = size_t(world.world_size()) * size_t(num_signals);
  flags_ = std::make_unique<std::atomic<epoch_t>[]>(total);
  epochs_ = std::make_unique<std::atomic<epoch_t>[]>(size_t(world.world_size()));
  for (size_t i = 0; i < total; ++i) flags_[i].store(0, std::memory_order_relaxed);
  for (int r = 0; r < world.world_size(); ++r) epochs_[size_t(r)].store(0, std::memory_order_relaxed);
}

epoch_t SignalArray::begin_call(int rank) {
  return epochs_[size_t(rank)].fetch_add(1, std::memory_order_relaxed) + 1;
}

void SignalArray::notify(int to_rank, int idx, epoch_t epoch) {
  CCFUSE_CHECK(to_rank >= 0 && to_rank < world_.world_size(), "signal '", name_, "' rank ", to_rank, " out of range");
  CCFUSE_CHECK(idx >= 0 && idx < num_signals_, "signal '", name_, "' index ", idx, " out of range");
  flags_[size_t(to_rank) * size_t(num_signals_) + size_t(idx)].store(epoch, std::memory_order_release);
}

epoch_t SignalArray::load(int rank, int idx) const {
  CCFUSE_CHECK(rank >= 0 && rank < world_.world_size() && idx >= 0 && idx < num_signals_, "signal '", name_,
               "' rank ", rank, " index ", idx, " out of range");
  return flags_[size_t(rank) * size_t(num_signals_) + size_t(idx)].load(std::memory_order_acquire);
}

void SignalArray::wait(int rank, int idx, epoch_t epoch, int producer) {
  CCFUSE_CHECK(rank >= 0 && rank < world_.world_size(), "signal '", name_, "' rank ", rank, " out of range");
  CCFUSE_CHECK(idx >= 0 && idx < num_signals_, "signal '", name_, "' index ", idx, " out of range");
  const auto& flag = flags_[size_t(rank) * size_t(num_signals_) + size_t(idx)];
  if (epoch_reached(flag.load(std::memory_order_acquire), epoch)) return;
  const auto start = Clock::now();
  const auto bound = std::chrono::milliseconds(world_.watchdog_ms());
  for (uint64_t spin = 0;; ++spin) {
    const epoch_t seen = flag.load(std::memory_order_acquire);
    if (epoch_reached(seen, epoch)) return;
    if ((spin & 63) == 63) {
      world_.throw_if_aborted(rank);
      if (Clock::now() - start > bound)
        throw TimeoutError(detail::str_cat("rank ", rank, ": timed out after ", world_.watchdog_ms(),
                                           " ms waiting for signal '", name_, "'[", idx, "] from rank ",
                                           producer, " (want epoch ", epoch, ", have ", seen, ")"));
      std::this_thread::yield();
    }
  }
}

}  // namespace ccfuse::ref
