// The stream-K partition (StreamKPlan, ccfuse/gemm/tile_order.h) on the host: the GEMM kernel's
// KPartSchedule runs the same __host__ __device__ functions. Every (cut tile, k-block) must be
// run by exactly one unit, each unit by the CTA the round robin gives it, every tile's parts
// counted and numbered in k order, and every part's workspace slot its own.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ccfuse/gemm/tile_order.h"

namespace ccfuse::gemm {
namespace {

void check_plan(int64_t tiles, int k_tiles, int sms) {
  SCOPED_TRACE(::testing::Message() << "tiles " << tiles << " k_tiles " << k_tiles << " sms " << sms);
  const StreamKPlan p = make_stream_k_plan(tiles, k_tiles, sms);
  ASSERT_EQ(p.dp_tiles + p.sk_tiles, tiles);
  ASSERT_GE(p.ctas, 1);
  ASSERT_LE(p.ctas, sms);
  ASSERT_GE(p.iters(), p.ctas) << "a CTA without iterations would be counted as a part and never arrive";
  ASSERT_EQ(p.dp_tiles % p.ctas, 0) << "whole tiles must keep the round robin aligned";
  if (tiles > sms) {
    EXPECT_EQ(p.ctas, sms);
    EXPECT_LT(p.sk_tiles, 2 * int64_t(sms));
  }
  // Every stream-K unit: which CTA runs it (round robin over the grid of p.ctas CTAs).
  std::vector<std::vector<int>> covered(size_t(p.sk_tiles), std::vector<int>(size_t(k_tiles), 0));
  std::map<int64_t, std::set<int>> parts_seen;             // tile -> part indices
  std::map<std::pair<int64_t, int>, int64_t> slot_of_part;  // (tile, part) -> unit
  std::map<int64_t, int> kb_first;                         // (tile, part) in k order
  std::vector<int64_t> iters_of_cta(size_t(p.ctas), 0);
  for (int64_t u = 0; u < p.slots(); ++u) {
    const int cta = int((p.dp_tiles + u) % p.ctas);
    const KPart kp = p.part_of(u);
    if (kp.tile < 0) continue;
    ASSERT_LT(kp.tile, p.sk_tiles);
    ASSERT_LT(kp.kb_begin, kp.kb_end);
    ASSERT_GE(kp.kb_begin, 0);
    ASSERT_LE(kp.kb_end, k_tiles);
    // The CTA's units cover its own range [begin_of(c), begin_of(c + 1)).
    const int64_t first = kp.tile * k_tiles + kp.kb_begin, last = kp.tile * k_tiles + kp.kb_end - 1;
    EXPECT_GE(first, p.begin_of(cta));
    EXPECT_LT(last, p.begin_of(cta + 1));
    iters_of_cta[size_t(cta)] += kp.kb_end - kp.kb_begin;
    for (int kb = kp.kb_begin; kb < kp.kb_end; ++kb) ++covered[size_t(kp.tile)][size_t(kb)];
    ASSERT_GE(kp.part, 0);
    ASSERT_LT(kp.part, p.parts(kp.tile));
    EXPECT_TRUE(parts_seen[kp.tile].insert(kp.part).second) << "part " << kp.part << " of tile " << kp.tile << " twice";
    EXPECT_EQ(p.slot(kp.tile, kp.part), u) << "the last part must find this part's partial where it was left";
    slot_of_part[{kp.tile, kp.part}] = u;
    // Parts are numbered in k order.
    const std::pair<int64_t, int> previous(kp.tile, kp.part - 1);
    if (kp.part > 0 && slot_of_part.count(previous)) {
      EXPECT_LT(kb_first[slot_of_part[previous]], first);
    }
    kb_first[u] = int(first);
  }
  for (int64_t t = 0; t < p.sk_tiles; ++t) {
    for (int kb = 0; kb < k_tiles; ++kb) ASSERT_EQ(covered[size_t(t)][size_t(kb)], 1) << "tile " << t << " k-block " << kb;
    EXPECT_EQ(int(parts_seen[t].size()), p.parts(t)) << "tile " << t;
  }
  // Balanced: every CTA runs floor or ceil of I / ctas iterations.
  for (int c = 0; c < p.ctas; ++c) {
    EXPECT_GE(iters_of_cta[size_t(c)], p.iters() / p.ctas);
    EXPECT_LE(iters_of_cta[size_t(c)], (p.iters() + p.ctas - 1) / p.ctas);
  }
}

TEST(StreamKPlan, CoversEveryKBlockOnceAndNumbersParts) {
  for (int sms : {1, 2, 7, 100, 132})
    for (int64_t tiles : {int64_t(1), int64_t(2), int64_t(7), int64_t(48), int64_t(96), int64_t(131), int64_t(132),
                          int64_t(133), int64_t(320), int64_t(1000)})
      for (int k_tiles : {1, 2, 3, 9, 17, 64, 128}) check_plan(tiles, k_tiles, sms);
}

TEST(StreamKPlan, ShapesOfTheGemmSweep) {
  // 1024x768x4096 in 128x128 tiles: 48 tiles of 64 k-blocks over 132 CTAs, ~23 k-blocks each.
  const StreamKPlan few = make_stream_k_plan(48, 64, 132);
  EXPECT_EQ(few.dp_tiles, 0);
  EXPECT_EQ(few.ctas, 132);
  EXPECT_EQ(few.parts(0), 3);
  // 4096x1280x8192: 320 tiles = 2 waves + 56; whole tiles for one wave, stream-K over 188.
  const StreamKPlan hybrid = make_stream_k_plan(320, 128, 132);
  EXPECT_EQ(hybrid.dp_tiles, 132);
  EXPECT_EQ(hybrid.sk_tiles, 188);
  // Fewer iterations than SMs: one CTA per iteration, no CTA idle in the plan.
  const StreamKPlan tiny = make_stream_k_plan(2, 1, 132);
  EXPECT_EQ(tiny.ctas, 2);
  EXPECT_EQ(tiny.parts(0), 1);
  EXPECT_EQ(tiny.parts(1), 1);
}

}  // namespace
}  // namespace ccfuse::gemm
