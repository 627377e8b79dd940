// ccfuse/common/host_barrier.h: a reusable meeting point for host threads (C++17 has no
// std::barrier), e.g. the rank threads of comm::run_local_world in a test or a bench.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>

#include "ccfuse/common/error.h"

namespace ccfuse {

class HostBarrier {
 public:
  // `failed`: the message of the Error that waiting threads get after abort().
  explicit HostBarrier(int n, std::string failed = "another thread failed") : n_(n), failed_(std::move(failed)) {}
  // Blocks until n threads have called it; then all return and the barrier is ready again.
  // Throws Error(failed) once abort() was called (before or during the wait): a thread that
  // failed must not leave the others waiting forever.
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) throw Error(failed_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen || aborted_; });
    if (gen_ == gen) throw Error(failed_);
  }
  // Wakes every waiting thread, and every later one, with the Error.
  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
  bool aborted_ = false;
  std::string failed_;
};

}  // namespace ccfuse
