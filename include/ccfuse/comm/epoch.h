// ccfuse/comm/epoch.h: the signal protocol of DESIGN §2.2, shared by the GPU runtime and the CPU
// reference world.
//
// A signal is a 64-bit word in symmetric memory. Signals are never reset: each call of an op
// has an epoch (a counter in device memory that grows by one per call, starting at 1), the
// producer stores the epoch with release semantics after its data, and the consumer waits with
// acquire loads until the flag has reached the epoch.
//
// NOTE: DESIGN §2.2 sketches 32-bit flags with a wrap-safe compare. With 32 bits a flag that an
// op leaves untouched for 2^31 calls (a larger shape used rarely, ~6 h at 10 us a call) would
// pass a wait falsely. 64-bit flags cost 4 more bytes per signal and never wrap in practice;
// the compare stays the serial-number one so the protocol reads the same.
#pragma once

#include <cstdint>

#include "ccfuse/common/hd.h"

namespace ccfuse {

using epoch_t = uint64_t;

// True when `flag` holds `epoch` or a later one (serial-number arithmetic).
CCFUSE_HD bool epoch_reached(epoch_t flag, epoch_t epoch) { return int64_t(flag - epoch) >= 0; }

}  // namespace ccfuse
