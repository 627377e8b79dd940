// ccfuse/moe/layout_gpu.h: expert-sorted token layouts on the GPU (DESIGN §2.1, §2.3), host API.
// The result equals the CPU make_layout (ccfuse/moe/layout.h) exactly: rows are the non-dropped
// entries (token, slot) stably sorted by (expert, (src_rank - local_rank + W) % W, token, slot).
// Design: docs/moe-router-gpu.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ccfuse::moe {

// Bytes of device workspace make_layout_gpu needs. Needs a current CUDA device (CUB size query).
size_t layout_workspace_bytes(int64_t num_tokens, int topk, int num_experts, int world_size);

// topk_ids [T, k] int32 (device; -1 = dropped), token_src_rank [T] int32 (device) or null (every
// token is local_rank's). Outputs (device):
//   indices [T * k]: entry (token * k + slot) of each sorted row; rows >= the row count get -1
//   bin_ids [T * k]: expert of each sorted row; rows >= the row count get -1
//   bins [E]: end offset (exclusive) of each expert's rows (bins[E - 1] = the row count)
//   tokens_per_expert [E]
// The row count is only known on the device (bins[E - 1]): indices and bin_ids hold room for
// every entry. `workspace`: layout_workspace_bytes(...) bytes, 256-byte aligned.
// Argument errors throw InvalidArgument with make_layout's messages (topk, num_experts,
// world_size, local_rank, num_tokens, T * k <= INT32_MAX, null pointers). The device data are not
// checked on the host (no sync): an id outside [-1, E) or a source rank outside [0, W) makes that
// entry count as dropped, and when `bad_entry` (device int32, may be null) is given it receives
// the lowest such entry index (token * k + slot), or -1 when every entry is valid; the CPU
// make_layout would have thrown for that input.
void make_layout_gpu(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts,
                     const int32_t* token_src_rank, int local_rank, int world_size, int32_t* indices,
                     int32_t* bin_ids, int32_t* bins, int32_t* tokens_per_expert, void* workspace, void* stream,
                     int32_t* bad_entry = nullptr);

}  // namespace ccfuse::moe
