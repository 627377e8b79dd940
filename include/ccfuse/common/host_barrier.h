// ccfuse/common/host_barrier.h: a reusable meeting point for host threads (C++17 has no
// std::barrier), e.g. the rank threads of comm::run_local_world in a test or a bench.
#pragma once

#include <condition_variable>
#include <mutex>

namespace ccfuse {

class HostBarrier {
 public:
  explicit HostBarrier(int n) : n_(n) {}
  // Blocks until n threads have called it; then all return and the barrier is ready again.
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

}  // namespace ccfuse
