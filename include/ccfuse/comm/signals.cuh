// ccfuse/comm/signals.cuh: device side of the signal protocol (DESIGN §2.2).
//
// Producer, after its data is written and visible to the thread that signals (CTA barrier, and
// fence.proxy.async after TMA stores):   notify(sig, peer, idx, epoch)   -> st.release.sys
// Consumer, one thread:                  if (!wait(sig, idx, epoch, producer)) bail out;
//                                        then a CTA barrier (and fence.proxy.async.global before
//                                        TMA loads of what the peer wrote).
// wait() is watchdog'd: past sig.timeout_ns it claims the rank's WatchdogRecord and returns
// false; every later wait on this rank returns false at once. Kernels must then skip their
// remaining work and return, and the host raises TimeoutError (Team::synchronize).
#pragma once

#include <cuda/atomic>

#include "ccfuse/comm/epoch.h"
#include "ccfuse/comm/team.h"

namespace ccfuse::comm {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The epoch of the call in flight (set by SignalSet::begin_call on this stream).
__device__ __forceinline__ epoch_t current_epoch(const DeviceSignals& sig) {
  return cuda::atomic_ref<const epoch_t, cuda::thread_scope_device>(*sig.epoch).load(cuda::memory_order_relaxed);
}

// Publishes `epoch` in flag `idx` of rank `peer` (release, system scope: orders this thread's
// earlier writes, and those made visible to it by a CTA barrier, before the flag).
__device__ __forceinline__ void notify(const DeviceSignals& sig, int peer, int idx, epoch_t epoch) {
  cuda::atomic_ref<epoch_t, cuda::thread_scope_system> flag(sig.flags[peer][idx]);
  flag.store(epoch, cuda::memory_order_release);
}

// True once any wait of this rank has timed out (device-memory claim word, cheap to poll).
__device__ __forceinline__ bool watchdog_fired(const DeviceSignals& sig) {
  return cuda::atomic_ref<int32_t, cuda::thread_scope_device>(*sig.watchdog_claim).load(cuda::memory_order_relaxed) != 0;
}

// Spins until ready(&seen) holds (it loads the watched word with acquire semantics into `seen`).
// Watchdog'd: past sig.timeout_ns it claims this rank's WatchdogRecord (index, want, seen,
// producer) and returns false; once any wait of this rank has fired it returns false at once.
template <class Ready>
__device__ __forceinline__ bool spin_until(const DeviceSignals& sig, Ready ready, int idx, epoch_t want, int producer) {
  epoch_t seen = 0;
  if (ready(&seen)) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; ++spin) {
    if (ready(&seen)) return true;
    if ((spin & 255u) == 0) {
      if (watchdog_fired(sig)) return false;
      const uint64_t waited = global_timer_ns() - start;
      if (waited > sig.timeout_ns) {
        // Claim in device memory (atomics to host memory need PCIe AtomicOps), then fill the
        // host record and publish it with a system-scope release.
        if (atomicCAS(sig.watchdog_claim, 0, 1) == 0) {
          WatchdogRecord* rec = sig.watchdog;
          rec->rank = sig.rank;
          rec->producer = producer;
          rec->set_id = sig.set_id;
          rec->index = idx;
          rec->want = want;
          rec->have = seen;
          rec->waited_ns = waited;
          cuda::atomic_ref<int32_t, cuda::thread_scope_system>(rec->fired).store(1, cuda::memory_order_release);
        }
        return false;
      }
    }
    if (spin > 64) __nanosleep(32);
  }
}

// One look (acquire, system scope) at this rank's flag `idx`: true once it has reached `epoch`.
__device__ __forceinline__ bool test(const DeviceSignals& sig, int idx, epoch_t epoch) {
  cuda::atomic_ref<epoch_t, cuda::thread_scope_system> flag(sig.flags[sig.rank][idx]);
  return epoch_reached(flag.load(cuda::memory_order_acquire), epoch);
}

// Spins (acquire, system scope) until this rank's flag `idx` reaches `epoch`. Returns false if
// the watchdog fired (here or in another wait of this rank). One thread calls it.
__device__ __forceinline__ bool wait(const DeviceSignals& sig, int idx, epoch_t epoch, int producer) {
  cuda::atomic_ref<epoch_t, cuda::thread_scope_system> flag(sig.flags[sig.rank][idx]);
  return spin_until(
      sig,
      [&](epoch_t* seen) {
        *seen = flag.load(cuda::memory_order_acquire);
        return epoch_reached(*seen, epoch);
      },
      idx, epoch, producer);
}

// Spins (acquire, device scope) until a count that this GPU's own CTAs raise reaches `target`
// (e.g. tiles of a slice stored). Watchdog'd as wait(); the record names `idx` and producer = this
// rank. One thread calls it.
__device__ __forceinline__ bool wait_count(const DeviceSignals& sig, const int* counter, int target, int idx) {
  cuda::atomic_ref<const int, cuda::thread_scope_device> count(*counter);
  return spin_until(
      sig,
      [&](epoch_t* seen) {
        const int c = count.load(cuda::memory_order_acquire);
        *seen = epoch_t(c);
        return c >= target;
      },
      idx, epoch_t(target), sig.rank);
}

// All ranks of the set meet: threads 0..W-1 of the calling CTA each signal one peer and wait for
// one peer on the barrier slots [num_signals, num_signals + W). Returns false on a watchdog.
// The CTA must have at least W threads; every thread of it must call this.
__device__ __forceinline__ bool barrier_cta(const DeviceSignals& sig, epoch_t epoch) {
  __syncthreads();  // every thread's earlier writes happen-before the release below
  const int t = threadIdx.x;
  bool ok = true;
  if (t < sig.world_size) {
    notify(sig, t, sig.num_signals + sig.rank, epoch);
    ok = wait(sig, sig.num_signals + t, epoch, t);
  }
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

}  // namespace ccfuse::comm
