// reference/moe_dispatch_plan.cpp: host versions of the dispatch plan (ccfuse/moe/dispatch_plan.h).
#include <vector>

#include "ccfuse/common/error.h"
#include "ccfuse/moe/dispatch_plan.h"

namespace ccfuse::moe {

namespace {
void check_routing(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts) {
  CCFUSE_ARG_CHECK(topk >= 1, "topk ", topk, " must be at least 1");
  CCFUSE_ARG_CHECK(num_experts >= 1, "num_experts ", num_experts, " must be at least 1");
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
  CCFUSE_ARG_CHECK(num_tokens == 0 || topk_ids != nullptr, "topk_ids must not be null");
  for (int64_t i = 0; i < num_tokens * topk; ++i)
    CCFUSE_ARG_CHECK(topk_ids[i] >= -1 && topk_ids[i] < num_experts, "topk_ids[", i, "] = ", topk_ids[i],
                     " is out of range [-1, ", num_experts, ")");
}
}  // namespace

void dispatch_counts(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts, int32_t* counts_row) {
  check_routing(topk_ids, num_tokens, topk, num_experts);
  for (int e = 0; e < num_experts; ++e) counts_row[e] = 0;
  for (int64_t i = 0; i < num_tokens * topk; ++i)
    if (topk_ids[i] >= 0) ++counts_row[topk_ids[i]];
}

void dispatch_positions(const DispatchPlan& plan, int src, const int32_t* topk_ids, int64_t num_tokens, int topk,
                        int64_t* positions) {
  CCFUSE_ARG_CHECK(plan.world_size >= 1, "world_size ", plan.world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(plan.num_experts % plan.world_size == 0, "num_experts ", plan.num_experts,
                   " is not divisible by world_size ", plan.world_size);
  CCFUSE_ARG_CHECK(src >= 0 && src < plan.world_size, "src ", src, " is out of range [0, ", plan.world_size, ")");
  check_routing(topk_ids, num_tokens, topk, plan.num_experts);
  std::vector<int64_t> next(static_cast<size_t>(plan.num_experts));
  for (int e = 0; e < plan.num_experts; ++e) next[size_t(e)] = plan.block_begin(src, e);
  std::vector<int32_t> seen(static_cast<size_t>(plan.num_experts), 0);
  for (int64_t i = 0; i < num_tokens * topk; ++i) {
    const int e = topk_ids[i];
    if (e < 0) {
      positions[i] = -1;
      continue;
    }
    CCFUSE_ARG_CHECK(++seen[size_t(e)] <= plan.count(src, e), "counts[", src, "][", e, "] = ", plan.count(src, e),
                     " is smaller than source ", src, "'s entries for expert ", e);
    positions[i] = next[size_t(e)]++;
  }
}

}  // namespace ccfuse::moe
