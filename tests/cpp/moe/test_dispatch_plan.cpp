// The dispatch plan (ccfuse/moe/dispatch_plan.h) against make_layout: a row's position computed
// by its sender from the counts matrix alone must be the row's place in the receiver's
// expert-sorted layout, and a tile's source range must cover exactly the blocks of its rows.
// Fresh random routing every run (seed printed; CCFUSE_TEST_SEED replays).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/error.h"
#include "ccfuse/moe/dispatch_plan.h"
#include "ccfuse/moe/layout.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::moe {
namespace {

using namespace ccfuse::testing;

// Distinct experts per token, some dropped; Zipf-like skew when `skew`.
std::vector<int32_t> routing(std::mt19937_64& rng, int64_t tokens, int topk, int experts, bool skew) {
  std::vector<int32_t> ids(size_t(tokens * topk));
  std::vector<double> w(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e) w[size_t(e)] = skew ? 1.0 / double((e + 1) * (e + 1)) : 1.0;
  std::bernoulli_distribution drop(0.1);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> left = w;
    for (int s = 0; s < topk; ++s) {
      std::discrete_distribution<int> pick(left.begin(), left.end());
      const int e = pick(rng);
      left[size_t(e)] = 0;
      ids[size_t(t * topk + s)] = drop(rng) ? -1 : e;
    }
  }
  return ids;
}

struct World {
  int w, experts, topk;
  std::vector<int64_t> tokens;             // per source
  std::vector<std::vector<int32_t>> ids;   // per source
  std::vector<int32_t> counts;             // [W][E]
  DispatchPlan plan() const { return DispatchPlan{counts.data(), w, experts}; }
};

World make_world(std::mt19937_64& rng, int w, int experts_per_rank, int topk, bool skew) {
  World x{w, w * experts_per_rank, topk, {}, {}, {}};
  x.counts.assign(size_t(x.w * x.experts), 0);
  std::uniform_int_distribution<int64_t> tok(0, 300);
  for (int s = 0; s < w; ++s) {
    const int64_t t = s == 1 ? 0 : tok(rng);  // a source with no tokens when W > 1
    x.tokens.push_back(t);
    x.ids.push_back(routing(rng, t, std::min(topk, x.experts), x.experts, skew));
    dispatch_counts(x.ids.back().data(), t, std::min(topk, x.experts), x.experts, x.counts.data() + size_t(s) * x.experts);
  }
  x.topk = std::min(topk, x.experts);
  return x;
}

TEST(DispatchPlan, SenderPositionsAreTheReceiversLayoutRows) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int w : {1, 2, 3, 4, 8}) {
    for (int epr : {1, 2, 5}) {
      for (int topk : {1, 2, 8}) {
        for (bool skew : {false, true}) {
          const World x = make_world(rng, w, epr, topk, skew);
          const DispatchPlan plan = x.plan();
          // All sources' tokens concatenated in rank order, with their source rank.
          std::vector<int32_t> all_ids, src_of;
          std::vector<int64_t> entry_base;  // first global entry of each source
          for (int s = 0; s < w; ++s) {
            entry_base.push_back(int64_t(all_ids.size()));
            all_ids.insert(all_ids.end(), x.ids[size_t(s)].begin(), x.ids[size_t(s)].end());
            for (int64_t t = 0; t < x.tokens[size_t(s)]; ++t) src_of.push_back(s);
          }
          const int64_t total_tokens = int64_t(src_of.size());
          for (int d = 0; d < w; ++d) {
            SCOPED_TRACE(detail::str_cat("W=", w, " experts/rank=", epr, " topk=", x.topk, " skew=", skew, " dest=", d));
            const Layout lay = make_layout(all_ids.data(), total_tokens, x.topk, x.experts, src_of.data(), d, w);
            const int first_expert = d * epr;
            const int64_t base = first_expert == 0 ? 0 : lay.bins[size_t(first_expert - 1)];
            ASSERT_EQ(lay.bins[size_t(first_expert + epr - 1)] - base, plan.rank_rows(d));
            // Where each of d's rows must come from, by the senders' positions.
            std::vector<int64_t> want(size_t(plan.rank_rows(d)), -1);
            for (int s = 0; s < w; ++s) {
              std::vector<int64_t> pos(x.ids[size_t(s)].size());
              dispatch_positions(plan, s, x.ids[size_t(s)].data(), x.tokens[size_t(s)], x.topk, pos.data());
              for (size_t i = 0; i < pos.size(); ++i) {
                const int e = x.ids[size_t(s)][i];
                if (e < 0) {
                  EXPECT_EQ(pos[i], -1);
                  continue;
                }
                if (plan.owner(e) != d) continue;
                ASSERT_GE(pos[i], 0);
                ASSERT_LT(pos[i], int64_t(want.size()));
                EXPECT_EQ(want[size_t(pos[i])], -1) << "two entries sent to row " << pos[i];
                want[size_t(pos[i])] = entry_base[size_t(s)] + int64_t(i);
              }
            }
            for (size_t r = 0; r < want.size(); ++r)
              ASSERT_EQ(want[r], lay.indices[size_t(base) + r]) << "row " << r;
            // Expert boundaries.
            for (int e = first_expert; e < first_expert + epr; ++e)
              EXPECT_EQ(plan.expert_begin(e), (e == 0 ? 0 : lay.bins[size_t(e - 1)]) - base) << "expert " << e;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(DispatchPlan, TileSourcesCoverExactlyTheTilesBlocks) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int w : {1, 2, 3, 4, 8}) {
    const World x = make_world(rng, w, 3, 4, true);
    const DispatchPlan plan = x.plan();
    for (int e = 0; e < x.experts; ++e) {
      const int d = plan.owner(e);
      const int64_t rows = plan.expert_rows(e);
      // Source position of every row of the expert, from the block boundaries.
      std::vector<int> pos_of_row;
      for (int i = 0; i < w; ++i)
        for (int32_t r = 0; r < plan.count((d + i) % w, e); ++r) pos_of_row.push_back(i);
      ASSERT_EQ(int64_t(pos_of_row.size()), rows);
      for (int s = 0; s < w; ++s) {
        const int i = (s - d + w) % w;
        const auto it = std::find(pos_of_row.begin(), pos_of_row.end(), i);
        if (it != pos_of_row.end()) {
          EXPECT_EQ(plan.block_begin(s, e) - plan.expert_begin(e), int64_t(it - pos_of_row.begin()));
        }
      }
      for (int64_t block : {1, 16, 64, 128}) {
        for (int64_t row0 = 0; row0 < rows; row0 += block) {
          const int64_t n = std::min(block, rows - row0);
          int first = 0, last = 0;
          plan.tile_sources(e, row0, n, &first, &last);
          EXPECT_EQ(first, pos_of_row[size_t(row0)]) << "expert " << e << " rows " << row0 << "+" << n;
          EXPECT_EQ(last, pos_of_row[size_t(row0 + n - 1)]) << "expert " << e << " rows " << row0 << "+" << n;
        }
      }
      int first = 0, last = 0;
      plan.tile_sources(e, 0, 0, &first, &last);
      EXPECT_GT(first, last) << "an empty tile depends on nothing";
    }
  }
}

// All-gather mode: the receiver's permute units (permute_bases, permute_unit: the device code's
// functions) cover each of its (source, expert) blocks exactly, in rows of at most unit_rows,
// its own tokens' blocks first, chunks of a block in order; and each unit's rows are the rows
// the receiver's layout gives that block.
TEST(DispatchPlan, AllGatherPermuteUnitsCoverEveryBlockOnce) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int w : {1, 2, 3, 4, 8})
    for (int unit_rows : {1, 7, 128}) {
      const World x = make_world(rng, w, 3, 4, w % 2 == 0);
      const DispatchPlan plan = x.plan();
      const int epr = plan.experts_per_rank();
      for (int d = 0; d < w; ++d) {
        std::vector<int> base(size_t(w * epr + 1));
        plan.permute_bases(d, unit_rows, base.data());
        std::vector<int> covered(size_t(plan.rank_rows(d)), 0);
        const int64_t first_row = plan.expert_begin(d * epr);
        bool others_started = false;
        int64_t prev_chunk = -1;
        int prev_block = -1;
        for (int64_t u = 0; u < base[size_t(w * epr)]; ++u) {
          const DispatchPlan::PermuteUnit pu = plan.permute_unit(d, base.data(), u, unit_rows);
          ASSERT_EQ(plan.owner(pu.expert), d);
          ASSERT_GT(pu.rows, 0) << "unit " << u;
          ASSERT_LE(pu.rows, unit_rows);
          EXPECT_EQ(pu.row0, plan.block_begin(pu.src, pu.expert) + pu.chunk * unit_rows);
          EXPECT_LE(pu.chunk * unit_rows + pu.rows, plan.count(pu.src, pu.expert));
          if (pu.src != d) others_started = true;
          EXPECT_FALSE(others_started && pu.src == d) << "the receiver's own tokens come first";
          const int block = pu.src * x.experts + pu.expert;
          if (block == prev_block) EXPECT_EQ(pu.chunk, prev_chunk + 1);
          else EXPECT_EQ(pu.chunk, 0);
          prev_block = block;
          prev_chunk = pu.chunk;
          for (int64_t r = pu.row0; r < pu.row0 + pu.rows; ++r) ++covered[size_t(r - first_row)];
        }
        for (size_t r = 0; r < covered.size(); ++r) ASSERT_EQ(covered[r], 1) << "rank " << d << " row " << r;
      }
    }
}

TEST(DispatchPlan, BadInputNamesTheRule) {
  const std::vector<int32_t> counts = {1, 0, 0, 0};  // W = 2, E = 2: source 0 sends one row to expert 0
  const DispatchPlan plan{counts.data(), 2, 2};
  const std::vector<int32_t> ids = {0, 0};  // two entries for expert 0
  std::vector<int64_t> pos(2);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { dispatch_positions(plan, 0, ids.data(), 2, 1, pos.data()); }),
            "counts[0][0] = 1 is smaller than source 0's entries for expert 0");
  EXPECT_EQ(message([&] { dispatch_positions(plan, 2, ids.data(), 2, 1, pos.data()); }), "src 2 is out of range [0, 2)");
  const std::vector<int32_t> bad = {0, 2};
  EXPECT_EQ(message([&] { dispatch_positions(plan, 0, bad.data(), 2, 1, pos.data()); }),
            "topk_ids[1] = 2 is out of range [-1, 2)");
  const DispatchPlan uneven{counts.data(), 2, 3};
  EXPECT_EQ(message([&] { dispatch_positions(uneven, 0, ids.data(), 1, 1, pos.data()); }),
            "num_experts 3 is not divisible by world_size 2");
}

}  // namespace
}  // namespace ccfuse::moe
