// ccfuse/gemm/ready_schedule.cuh: a GEMM schedule whose producer waits, per tile, until the A rows
// of the tile's row band have been published on a signal (comm::DeviceSignals, current epoch).
// Signal index of a tile = its row-band index m_tile / m_tiles_per_signal; producer rank given.
#pragma once

#include "ccfuse/comm/epoch.h"
#include "ccfuse/comm/signals.cuh"
#include "ccfuse/gemm/sm90_gemm.cuh"

namespace ccfuse::gemm::sm90 {

// The producer thread keeps a copy of this schedule and caches in it which signals it has already
// seen published in this call (up to kCachedSignals of them), so each one costs one acquire load
// and one proxy fence per CTA, not one per tile.
struct SignalReadySchedule {
  static constexpr int kCachedSignals = 256;
  PlainSchedule base;
  comm::DeviceSignals sig;
  int m_tiles_per_signal = 1;
  int producer_rank = 0;
  // Producer-thread state (initialised by the host to zero; per CTA, not shared).
  epoch_t epoch = 0;
  uint64_t seen[kCachedSignals / 64] = {};
  static constexpr bool kHasReady = true;
  static constexpr bool kHasSide = false;
  CCFUSE_HD int64_t num_tiles() const { return base.num_tiles(); }
  int64_t max_tiles() const { return base.max_tiles(); }
  CCFUSE_HD TileWork work(int64_t idx) const { return base.work(idx); }
  __device__ bool wait_ready(const TileWork& w) {
    const int idx = w.m_tile / m_tiles_per_signal;
    const bool cacheable = idx < kCachedSignals;
    if (cacheable && (seen[idx / 64] >> (idx % 64) & 1)) return true;
    if (epoch == 0) epoch = comm::current_epoch(sig);
    const bool ok = comm::wait(sig, idx, epoch, producer_rank);
    asm volatile("fence.proxy.async.global;" ::: "memory");
    if (ok && cacheable) seen[idx / 64] |= uint64_t(1) << (idx % 64);
    return ok;
  }
};

}  // namespace ccfuse::gemm::sm90
