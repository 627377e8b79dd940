// ccfuse/comm/watchdog.h: what a device-side wait records when it passes its bound.
//
// The record lives in host-mapped pinned memory, so the host can read it while the GPU context
// is still healthy (we never __trap(): a trap poisons the context and loses the record). The
// first wait that times out claims the record (atomicCAS on a device-memory word); every later wait on the
// same rank sees `fired` and gives up at once, so one missing peer costs one bound, not one per
// tile. The host turns the record into a ccfuse::TimeoutError (Team::check_watchdog()).
#pragma once

#include <cstdint>

namespace ccfuse::comm {

struct WatchdogRecord {
  int32_t fired;       // 0 = none; 1 = a wait timed out and the fields below are written
  int32_t rank;        // the rank whose wait timed out
  int32_t producer;    // the rank expected to publish the signal
  int32_t set_id;      // which SignalSet (its name is kept on the host)
  int32_t index;       // the signal index inside the set
  int32_t reserved;
  uint64_t want;       // epoch waited for
  uint64_t have;       // flag value seen last
  uint64_t waited_ns;  // how long it waited
};

}  // namespace ccfuse::comm
