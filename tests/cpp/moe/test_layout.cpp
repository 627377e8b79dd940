// Expert-sorted layouts (make_layout) and expert merging (merge_light_experts), against a
// brute-force stable sort and the documented invariants.
//
// Inputs are fresh random numbers on every run; the seed is printed with every failure
// (SCOPED_TRACE) and can be fixed with CCFUSE_TEST_SEED=<n> to replay one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ccfuse/common/error.h"
#include "ccfuse/moe/layout.h"
#include "ccfuse/moe/router.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::moe {
namespace {

using namespace ccfuse::testing;




// Random routing: distinct experts per token (as a router gives), some entries dropped.
std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t tokens, int topk, int experts, double drop_rate) {
  std::vector<int32_t> ids(size_t(tokens * topk));
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  std::bernoulli_distribution drop(drop_rate);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int s = 0; s < topk; ++s) ids[size_t(t * topk + s)] = drop(rng) ? -1 : perm[size_t(s)];
  }
  return ids;
}

// Checks `layout` against a brute-force stable sort and the invariants of layout.h.
void check_layout(const Layout& layout, const std::vector<int32_t>& ids, int64_t tokens, int topk, int experts,
                  const int32_t* src, int local_rank, int world) {
  // Brute force: (expert, rotated rank, token, slot) of every kept entry, sorted.
  std::vector<std::tuple<int, int, int64_t, int>> keys;
  std::vector<int32_t> count(static_cast<size_t>(experts), 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int s = 0; s < topk; ++s) {
      const int32_t id = ids[size_t(t * topk + s)];
      if (id < 0) continue;
      const int rank = src ? src[t] : local_rank;
      keys.push_back({id, (rank - local_rank + world) % world, t, s});
      ++count[size_t(id)];
    }
  std::sort(keys.begin(), keys.end());
  ASSERT_EQ(int64_t(keys.size()), layout.rows());
  ASSERT_EQ(keys.size(), layout.bin_ids.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    const auto& [e, rot, t, s] = keys[r];
    ASSERT_EQ(int32_t(t * topk + s), layout.indices[r]) << "row " << r;
    ASSERT_EQ(e, layout.bin_ids[r]) << "row " << r;
    (void)rot;
  }
  EXPECT_EQ(count, layout.tokens_per_expert);
  // Bins: end offsets, consistent with the counts and with bin_ids.
  ASSERT_EQ(size_t(experts), layout.bins.size());
  int32_t begin = 0;
  for (int e = 0; e < experts; ++e) {
    EXPECT_EQ(begin + count[size_t(e)], layout.bins[size_t(e)]);
    for (int32_t r = begin; r < layout.bins[size_t(e)]; ++r) EXPECT_EQ(e, layout.bin_ids[size_t(r)]);
    begin = layout.bins[size_t(e)];
  }
  // Every kept entry exactly once, no dropped entry.
  std::vector<int> seen(ids.size(), 0);
  for (int32_t i : layout.indices) {
    ASSERT_GE(i, 0);
    ASSERT_LT(size_t(i), ids.size());
    ++seen[size_t(i)];
  }
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i] >= 0 ? 1 : 0, seen[i]) << "entry " << i;
  // Inside an expert: local rank first, then the rotated ranks in order.
  for (int64_t r = 1; r < layout.rows(); ++r) {
    if (layout.bin_ids[size_t(r)] != layout.bin_ids[size_t(r - 1)]) continue;
    const int64_t ta = layout.indices[size_t(r - 1)] / topk, tb = layout.indices[size_t(r)] / topk;
    const int ra = src ? src[ta] : local_rank, rb = src ? src[tb] : local_rank;
    const int rota = (ra - local_rank + world) % world, rotb = (rb - local_rank + world) % world;
    EXPECT_TRUE(rota < rotb || (rota == rotb && ta < tb)) << "row " << r;
  }
}

TEST(Layout, MatchesStableSortByExpertRankToken) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 60; ++iter) {
    const int world = std::uniform_int_distribution<int>(1, 8)(rng);
    const int experts = world * std::uniform_int_distribution<int>(1, 6)(rng);
    const int topk = std::uniform_int_distribution<int>(1, std::min(experts, 8))(rng);
    const int local_rank = std::uniform_int_distribution<int>(0, world - 1)(rng);
    const int64_t tokens = std::uniform_int_distribution<int64_t>(0, 120)(rng);
    SCOPED_TRACE("iter " + std::to_string(iter) + " W " + std::to_string(world) + " E " + std::to_string(experts) +
                 " k " + std::to_string(topk) + " T " + std::to_string(tokens) + " r " + std::to_string(local_rank));
    const std::vector<int32_t> ids = random_ids(rng, tokens, topk, experts, iter % 3 == 0 ? 0.3 : 0.0);
    std::vector<int32_t> src(static_cast<size_t>(tokens));
    if (iter % 2) {
      // All-gather dispatch: tokens of all ranks concatenated in rank order.
      for (int64_t t = 0; t < tokens; ++t) src[size_t(t)] = int32_t(t * world / std::max<int64_t>(tokens, 1));
    } else {
      // Received tokens: any order of source ranks.
      for (auto& s : src) s = std::uniform_int_distribution<int32_t>(0, world - 1)(rng);
    }
    const Layout layout = make_layout(ids.data(), tokens, topk, experts, src.data(), local_rank, world);
    check_layout(layout, ids, tokens, topk, experts, src.data(), local_rank, world);
  }
}

TEST(Layout, NullSourceRanksMeanAllLocal) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int64_t tokens = 77;
  const std::vector<int32_t> ids = random_ids(rng, tokens, 3, 16, 0.1);
  const std::vector<int32_t> src(static_cast<size_t>(tokens), 2);
  const Layout a = make_layout(ids.data(), tokens, 3, 16, nullptr, 2, 4);
  const Layout b = make_layout(ids.data(), tokens, 3, 16, src.data(), 2, 4);
  check_layout(a, ids, tokens, 3, 16, nullptr, 2, 4);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.bin_ids, b.bin_ids);
  EXPECT_EQ(a.bins, b.bins);
  // Within an expert: plain token order.
  for (int64_t r = 1; r < a.rows(); ++r)
    if (a.bin_ids[size_t(r)] == a.bin_ids[size_t(r - 1)]) {
      EXPECT_LT(a.indices[size_t(r - 1)], a.indices[size_t(r)]);
    }
}

TEST(Layout, RotatedRankOrderByHand) {
  // 6 tokens from ranks 0,0,1,1,2,2 (W = 3), all to expert 0 (top-1); local rank 1:
  // rotated order is ranks 1, 2, 0 -> tokens 2,3,4,5,0,1.
  const int32_t ids[6] = {0, 0, 0, 0, 0, 0};
  const int32_t src[6] = {0, 0, 1, 1, 2, 2};
  Layout l = make_layout(ids, 6, 1, 2, src, 1, 3);
  EXPECT_EQ((std::vector<int32_t>{2, 3, 4, 5, 0, 1}), l.indices);
  EXPECT_EQ((std::vector<int32_t>{0, 0, 0, 0, 0, 0}), l.bin_ids);
  EXPECT_EQ((std::vector<int32_t>{6, 6}), l.bins);
  EXPECT_EQ((std::vector<int32_t>{6, 0}), l.tokens_per_expert);
  // Top-2 with a dropped slot: entries (token * 2 + slot).
  const int32_t ids2[6] = {1, 0, -1, 1, 0, 1};  // token 0: e1,e0; token 1: dropped,e1; token 2: e0,e1
  const int32_t src2[3] = {1, 0, 1};
  l = make_layout(ids2, 3, 2, 2, src2, 0, 2);
  // Expert 0: token 0 (rank 1), token 2 (rank 1) -> entries 1, 4. Expert 1: token 1 (rank 0) first,
  // then tokens 0, 2 (rank 1) -> entries 3, 0, 5.
  EXPECT_EQ((std::vector<int32_t>{1, 4, 3, 0, 5}), l.indices);
  EXPECT_EQ((std::vector<int32_t>{0, 0, 1, 1, 1}), l.bin_ids);
  EXPECT_EQ((std::vector<int32_t>{2, 5}), l.bins);
}

TEST(Layout, EmptyAndAllDropped) {
  Layout l = make_layout(nullptr, 0, 2, 4, nullptr, 0, 1);
  EXPECT_EQ(0, l.rows());
  EXPECT_EQ((std::vector<int32_t>{0, 0, 0, 0}), l.bins);
  EXPECT_EQ((std::vector<int32_t>{0, 0, 0, 0}), l.tokens_per_expert);
  const int32_t ids[4] = {-1, -1, -1, -1};
  l = make_layout(ids, 2, 2, 4, nullptr, 0, 1);
  EXPECT_EQ(0, l.rows());
  EXPECT_EQ((std::vector<int32_t>{0, 0, 0, 0}), l.bins);
}

// The router's output feeds make_layout directly; bins agree with the router's stats.
TEST(Layout, FromRouterOutput) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const int64_t tokens = 96;
  RouterConfig c;
  c.num_experts = 16;
  c.topk = 4;
  c.capacity_factor = 1.0;
  c.world_size = 4;
  std::vector<float> logits(size_t(tokens * c.num_experts));
  for (float& v : logits) v = normal(rng);
  const RouterOutput out = route_logits_cpu(c, logits.data(), tokens, nullptr);
  std::vector<int32_t> src(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) src[size_t(t)] = int32_t(t / 24);
  for (int r = 0; r < c.world_size; ++r) {
    const Layout l = make_layout(out.topk_ids.data(), tokens, c.topk, c.num_experts, src.data(), r, c.world_size);
    check_layout(l, out.topk_ids, tokens, c.topk, c.num_experts, src.data(), r, c.world_size);
    EXPECT_EQ(out.stats.tokens_per_expert, l.tokens_per_expert);
    EXPECT_EQ(tokens * c.topk - out.stats.dropped, l.rows());
  }
}

TEST(Layout, ValidationMessages) {
  const int32_t ids[4] = {0, 1, 12, 3};
  const int32_t good[4] = {0, 1, 2, 3};
  const int32_t src[2] = {0, 4};
  EXPECT_EQ("topk_ids[1, 0] = 12 is out of range [-1, 8)",
            arg_error([&] { make_layout(ids, 2, 2, 8, nullptr, 0, 1); }));
  const int32_t neg[4] = {0, 1, 2, -2};
  EXPECT_EQ("topk_ids[1, 1] = -2 is out of range [-1, 8)",
            arg_error([&] { make_layout(neg, 2, 2, 8, nullptr, 0, 1); }));
  EXPECT_EQ("token_src_rank[1] = 4 is out of range [0, 4)",
            arg_error([&] { make_layout(good, 2, 2, 8, src, 0, 4); }));
  EXPECT_EQ("topk 0 must be at least 1", arg_error([&] { make_layout(good, 2, 0, 8, nullptr, 0, 1); }));
  EXPECT_EQ("num_experts 0 must be at least 1", arg_error([&] { make_layout(good, 2, 2, 0, nullptr, 0, 1); }));
  EXPECT_EQ("world_size 0 must be at least 1", arg_error([&] { make_layout(good, 2, 2, 8, nullptr, 0, 0); }));
  EXPECT_EQ("local_rank 2 is out of range [0, 2)", arg_error([&] { make_layout(good, 2, 2, 8, nullptr, 2, 2); }));
  EXPECT_EQ("num_tokens -1 must be >= 0", arg_error([&] { make_layout(good, -1, 2, 8, nullptr, 0, 1); }));
  EXPECT_EQ("topk_ids must not be null", arg_error([&] { make_layout(nullptr, 2, 2, 8, nullptr, 0, 1); }));
  EXPECT_EQ("num_tokens * topk = 1073741824 * 2 exceeds INT32_MAX",
            arg_error([&] { make_layout(good, int64_t(1) << 30, 2, 8, nullptr, 0, 1); }));
  EXPECT_EQ("tokens_per_expert[1] = -3 must be >= 0", arg_error([&] { merge_light_experts({1, -3}, 4); }));
}

// ---- merge_light_experts ---------------------------------------------------------------------

TEST(MergeLightExperts, ByHand) {
  using V = std::vector<int32_t>;
  // min_rows <= 0: every expert its own group.
  EXPECT_EQ((V{0, 1, 2, 3}), merge_light_experts({5, 0, 7}, 0));
  EXPECT_EQ((V{0, 1, 2, 3}), merge_light_experts({5, 0, 7}, -4));
  EXPECT_EQ((V{0}), merge_light_experts({}, 16));
  // Light experts merge until >= 16 rows; heavy ones stand alone.
  EXPECT_EQ((V{0, 3, 4, 6}), merge_light_experts({4, 5, 8, 20, 10, 6}, 16));
  // A short remainder joins the run's previous group.
  EXPECT_EQ((V{0, 4}), merge_light_experts({10, 6, 3, 2}, 16));
  // A light run below min_rows between heavy experts stays one short group.
  EXPECT_EQ((V{0, 1, 3, 4}), merge_light_experts({30, 2, 3, 40}, 16));
  // Empty experts join a neighbour: the previous group, or the next when first.
  EXPECT_EQ((V{0, 3, 4}), merge_light_experts({30, 0, 0, 40}, 16));
  EXPECT_EQ((V{0, 4, 5}), merge_light_experts({0, 0, 30, 0, 40}, 16));
  EXPECT_EQ((V{0, 2, 5}), merge_light_experts({0, 30, 40, 0, 0}, 16));
  EXPECT_EQ((V{0, 4}), merge_light_experts({0, 0, 0, 0}, 16));
  // Empty experts inside a light run are merged like any light expert.
  EXPECT_EQ((V{0, 5}), merge_light_experts({0, 8, 0, 8, 0}, 16));
  // Exactly min_rows is heavy.
  EXPECT_EQ((V{0, 1, 2}), merge_light_experts({16, 16}, 16));
}

TEST(MergeLightExperts, Invariants) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const int experts = std::uniform_int_distribution<int>(1, 40)(rng);
    const int64_t min_rows = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    std::vector<int32_t> tpe(static_cast<size_t>(experts));
    std::geometric_distribution<int32_t> rows(iter % 2 ? 0.05 : 0.2);
    std::bernoulli_distribution empty(0.3);
    for (auto& n : tpe) n = empty(rng) ? 0 : rows(rng);
    SCOPED_TRACE("iter " + std::to_string(iter) + " E " + std::to_string(experts) + " min_rows " +
                 std::to_string(min_rows));
    const std::vector<int32_t> g = merge_light_experts(tpe, min_rows);
    ASSERT_GE(g.size(), 2u);
    EXPECT_EQ(0, g.front());
    EXPECT_EQ(experts, g.back());
    const bool all_empty = std::all_of(tpe.begin(), tpe.end(), [](int32_t n) { return n == 0; });
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      ASSERT_LT(g[i], g[i + 1]);  // non-empty groups, increasing
      int64_t group_rows = 0;
      int with_rows = 0, heavy = 0;
      for (int32_t e = g[i]; e < g[i + 1]; ++e) {
        group_rows += tpe[size_t(e)];
        with_rows += tpe[size_t(e)] > 0;
        heavy += tpe[size_t(e)] >= min_rows;
      }
      // A heavy expert shares its group with no other expert that has rows.
      if (heavy > 0) {
        EXPECT_EQ(1, with_rows) << "group " << i;
      }
      // No group of empty experts only, unless every expert is empty.
      if (!all_empty) {
        EXPECT_GT(group_rows, 0) << "group " << i;
      }
      if (group_rows < min_rows && !all_empty) {
        // A short group is a whole maximal light run: heavy (or nothing) on both sides.
        EXPECT_TRUE(g[i] == 0 || tpe[size_t(g[i] - 1)] >= min_rows) << "group " << i;
        EXPECT_TRUE(g[i + 1] == experts || tpe[size_t(g[i + 1])] >= min_rows) << "group " << i;
      }
      if (heavy == 0 && group_rows >= min_rows) {
        // Greedy: a light group closes as soon as it reaches min_rows (< 2 * min_rows), and at
        // most a short remainder (< min_rows) is folded in after it.
        EXPECT_LT(group_rows, 3 * min_rows) << "group " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ccfuse::moe
