// reference/moe_layout.cpp: expert-sorted token layouts and expert merging (ccfuse/moe/layout.h).
//
// make_layout is a counting sort over the key (expert, rotated source rank): entries are visited
// in (token, slot) order, so inside one bucket they stay in token order and the result is the
// stable sort by (expert, (src - local_rank + W) % W, token, slot) in O(T * k + E * W).
#include "ccfuse/moe/layout.h"

#include <climits>

#include "ccfuse/common/error.h"

namespace ccfuse::moe {

Layout make_layout(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts,
                   const int32_t* token_src_rank, int local_rank, int world_size) {
  CCFUSE_ARG_CHECK(topk >= 1, "topk ", topk, " must be at least 1");
  CCFUSE_ARG_CHECK(num_experts >= 1, "num_experts ", num_experts, " must be at least 1");
  CCFUSE_ARG_CHECK(world_size >= 1, "world_size ", world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(local_rank >= 0 && local_rank < world_size, "local_rank ", local_rank,
                   " is out of range [0, ", world_size, ")");
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
  // Rows are addressed by int32 entry indices (token * k + slot).
  CCFUSE_ARG_CHECK(num_tokens <= INT32_MAX / topk, "num_tokens * topk = ", num_tokens, " * ", topk,
                   " exceeds INT32_MAX");
  if (num_tokens > 0) CCFUSE_ARG_CHECK(topk_ids != nullptr, "topk_ids must not be null");

  // Validate everything before building, so that an error leaves nothing half done.
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (token_src_rank != nullptr) {
      const int32_t src = token_src_rank[t];
      CCFUSE_ARG_CHECK(src >= 0 && src < world_size, "token_src_rank[", t, "] = ", src, " is out of range [0, ",
                       world_size, ")");
    }
    for (int s = 0; s < topk; ++s) {
      const int32_t id = topk_ids[t * topk + s];
      CCFUSE_ARG_CHECK(id >= -1 && id < num_experts, "topk_ids[", t, ", ", s, "] = ", id, " is out of range [-1, ",
                       num_experts, ")");
    }
  }

  const int64_t num_buckets = int64_t(num_experts) * world_size;
  auto bucket_of = [&](int64_t t, int32_t id) {
    const int src = token_src_rank ? token_src_rank[t] : local_rank;
    const int rotated = (src - local_rank + world_size) % world_size;
    return int64_t(id) * world_size + rotated;
  };

  std::vector<int64_t> offset(static_cast<size_t>(num_buckets) + 1, 0);
  Layout layout;
  layout.tokens_per_expert.assign(size_t(num_experts), 0);
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int s = 0; s < topk; ++s) {
      const int32_t id = topk_ids[t * topk + s];
      if (id < 0) continue;
      ++offset[size_t(bucket_of(t, id)) + 1];
      ++layout.tokens_per_expert[size_t(id)];
    }
  for (int64_t b = 0; b < num_buckets; ++b) offset[size_t(b) + 1] += offset[size_t(b)];
  const int64_t rows = offset[size_t(num_buckets)];

  layout.indices.resize(size_t(rows));
  layout.bin_ids.resize(size_t(rows));
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int s = 0; s < topk; ++s) {
      const int32_t id = topk_ids[t * topk + s];
      if (id < 0) continue;
      const int64_t row = offset[size_t(bucket_of(t, id))]++;
      layout.indices[size_t(row)] = int32_t(t * topk + s);
      layout.bin_ids[size_t(row)] = id;
    }

  layout.bins.resize(size_t(num_experts));
  int32_t end = 0;
  for (int e = 0; e < num_experts; ++e) {
    end += layout.tokens_per_expert[size_t(e)];
    layout.bins[size_t(e)] = end;
  }
  return layout;
}

std::vector<int32_t> merge_light_experts(const std::vector<int32_t>& tokens_per_expert, int64_t min_rows) {
  const int32_t num_experts = int32_t(tokens_per_expert.size());
  for (int32_t e = 0; e < num_experts; ++e)
    CCFUSE_ARG_CHECK(tokens_per_expert[size_t(e)] >= 0, "tokens_per_expert[", e, "] = ", tokens_per_expert[size_t(e)],
                     " must be >= 0");
  std::vector<int32_t> groups;
  if (min_rows <= 0) {
    for (int32_t e = 0; e <= num_experts; ++e) groups.push_back(e);
    return groups;
  }
  auto heavy = [&](int32_t e) { return tokens_per_expert[size_t(e)] >= min_rows; };

  int32_t e = 0;
  while (e < num_experts) {
    if (heavy(e)) {
      // A run of empty experts before the first heavy one has no previous group: it joins this one.
      groups.push_back(groups.empty() ? 0 : e);
      ++e;
      continue;
    }
    // A maximal run [begin, end) of light experts.
    const int32_t begin = e;
    int64_t run_rows = 0;
    while (e < num_experts && !heavy(e)) run_rows += tokens_per_expert[size_t(e++)];
    const int32_t end = e;
    if (run_rows == 0) {
      // Empty experts only: join the previous group; with none, the next heavy expert's group
      // (handled above); with no next either, every expert is empty: one group.
      if (groups.empty() && end == num_experts) groups.push_back(begin);
      continue;
    }
    // Greedy cut; `open` is the rows of the group started last.
    const size_t run_first_group = groups.size();
    groups.push_back(groups.empty() ? 0 : begin);  // leading empty experts join the first group
    int64_t open = 0;
    for (int32_t x = begin; x < end; ++x) {
      open += tokens_per_expert[size_t(x)];
      if (open >= min_rows && x + 1 < end) {
        groups.push_back(x + 1);
        open = 0;
      }
    }
    // A short remainder (empty experts included) joins the run's previous group.
    if (open < min_rows && groups.size() - run_first_group > 1) groups.pop_back();
  }
  groups.push_back(num_experts);
  return groups;
}

}  // namespace ccfuse::moe
