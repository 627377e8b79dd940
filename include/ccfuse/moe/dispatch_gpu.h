// ccfuse/moe/dispatch_gpu.h: the source side of the MoE layer-0 dispatch on the GPU (host API).
// Device twins of dispatch_counts / dispatch_positions (ccfuse/moe/dispatch_plan.h): with them a
// source knows, before sending anything, the final row of each of its entries in its owner's
// expert-sorted buffer (docs/moe-layers.md, "GPU plan"). No host synchronisation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ccfuse::moe {

// Bytes of device workspace dispatch_positions_gpu needs (a make_layout_gpu of the source's own
// entries, its outputs, and the block offsets). Needs a current CUDA device.
size_t dispatch_workspace_bytes(int64_t num_tokens, int topk, int num_experts);

// counts_row [E] (device) = this source's entries per global expert (dropped ones excluded).
void dispatch_counts_gpu(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts, int32_t* counts_row,
                         void* workspace, void* stream);

// positions [T * k] (device, int64): the row of entry (token * k + slot) of source `src` in the
// buffer of its expert's owner, or -1 for a dropped entry; `counts` [W][E] (device) is the whole
// counts matrix (every source's counts_row). Equals dispatch_positions exactly. Throws
// InvalidArgument naming the rule (W divides E, src in range, sizes, null pointers).
void dispatch_positions_gpu(const int32_t* counts, int world_size, int num_experts, int src, const int32_t* topk_ids,
                            int64_t num_tokens, int topk, int64_t* positions, void* workspace, void* stream);

}  // namespace ccfuse::moe
