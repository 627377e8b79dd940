// ccfuse/moe/layout.h: token layouts of the MoE layers (DESIGN §2.1, §2.3), CPU reference.
//
// Entries are (token, slot) pairs of the router's topk_ids [T, k], T = tokens of all source
// ranks concatenated in rank order (all-gather dispatch) or the tokens one rank receives.
// The layout sorts them by expert; inside an expert by source rank in rotated order starting at
// `local_rank` (local tokens first, so the first tiles need no remote data), then by token index.
// Dropped entries (id -1) are left out.
#pragma once

#include <cstdint>
#include <vector>

namespace ccfuse::moe {

struct Layout {
  std::vector<int32_t> indices;  // [rows]: entry (token * k + slot) of each sorted row (the gather map)
  std::vector<int32_t> bin_ids;  // [rows]: expert of each sorted row
  std::vector<int32_t> bins;     // [E]: end offset (exclusive) of each expert's rows
  std::vector<int32_t> tokens_per_expert;  // [E]
  int64_t rows() const { return int64_t(indices.size()); }
};

// token_src_rank: per token (size T) the rank it came from, or null (all tokens are local_rank's).
// Throws InvalidArgument for ids out of [-1, E), a src rank out of [0, world_size), topk < 1.
Layout make_layout(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts,
                   const int32_t* token_src_rank, int local_rank, int world_size);

// Expert merging: consecutive experts are grouped so that every group but the last has at least
// `min_rows` rows (light experts share one scheduling unit and the tensor cores stay busy); a
// heavy expert is a group of its own. Returns the group boundaries as expert indices:
// groups[i] = first expert of group i, plus a final entry num_experts.
// Exactly (docs/moe-routing.md): an expert is heavy if its rows >= min_rows, else light.
//  - min_rows <= 0: every expert is its own group.
//  - A heavy expert never shares its group with another expert that has rows.
//  - A maximal run of light experts is cut greedily left to right: a group closes as soon as it
//    holds >= min_rows rows; a short remainder at the end of the run joins the run's previous
//    group. A run whose total is below min_rows (so it cannot reach min_rows without a heavy
//    expert) stays one short group: the only kind of group under min_rows (the last group
//    included).
//  - A run of empty experts only joins the previous group (the next one when it is first); all
//    experts empty: one group.
std::vector<int32_t> merge_light_experts(const std::vector<int32_t>& tokens_per_expert, int64_t min_rows);

}  // namespace ccfuse::moe
