// The MoE FFN's backward composed from the forward's layers on the CPU reference world
// (reference/moe_backward.h: the decomposition MoeFfnBackward runs on GPUs) against the fp64
// naive_moe_backward: d x and d topk_w of every rank, W = 1..4, both dispatch modes, SwiGLU and
// plain, ragged token counts (a rank with none), dropped slots (exactly 0 gradient), top-1 to
// top-4, fp32 and bf16; then again with the forward's kept h (MoeLayer0's preact), bit for bit.
// Outputs are poisoned (NaN) first; fresh random inputs per run (CCFUSE_TEST_SEED replays a
// failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/dtype.h"
#include "reference/moe_backward.h"
#include "reference/moe_naive.h"
#include "reference/naive.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::ref {
namespace {

using namespace ccfuse::testing;

struct Case {
  const char* name;
  int world, experts, topk;
  bool swiglu;
  DispatchMode mode;
  double drop;
};

template <typename T>
void check(const Case& c, double tol) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(std::string(c.name) + " " + seed_trace(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int w = c.world, k = c.topk, el = c.experts / w;
  const int64_t h = 24, f = 16, fi = c.swiglu ? 2 * f : f;
  MoeShape shape;
  shape.hidden = h;
  shape.ffn = f;
  shape.num_experts = c.experts;
  shape.topk = k;
  shape.swiglu = c.swiglu;
  shape.max_tokens_per_rank = 40;
  auto round = [](float v) { return from_f32<T>(v); };
  std::vector<std::vector<T>> x(w), g(w), w1(w), w2(w), dx(w);
  std::vector<std::vector<int32_t>> ids(w);
  std::vector<std::vector<float>> tw(w), dw(w);
  std::vector<MoeRankInputs> in(static_cast<size_t>(w));
  std::vector<std::vector<double>> gd(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    const int64_t t = r == 1 ? 0 : 40 - 7 * r;  // ragged; rank 1 has none (W >= 2)
    MoeRankInputs& m = in[size_t(r)];
    m.num_tokens = t;
    for (int64_t i = 0; i < t * h; ++i) {
      x[r].push_back(round(nd(rng)));
      g[r].push_back(round(nd(rng)));
    }
    for (int64_t i = 0; i < t; ++i) {
      std::vector<int32_t> all(static_cast<size_t>(c.experts));
      for (int e = 0; e < c.experts; ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      for (int s = 0; s < k; ++s) {
        ids[r].push_back(ud(rng) < c.drop ? -1 : all[size_t(s)]);
        tw[r].push_back(to_f32(round(0.1f + ud(rng))));
      }
    }
    for (int64_t i = 0; i < el * h * fi; ++i) w1[r].push_back(round(nd(rng) / std::sqrt(float(h))));
    for (int64_t i = 0; i < el * f * h; ++i) w2[r].push_back(round(nd(rng) / std::sqrt(float(f))));
    for (const T& v : x[r]) m.x.push_back(to_f32(v));
    m.topk_ids = ids[r];
    m.topk_weights.assign(tw[r].begin(), tw[r].end());
    for (const T& v : w1[r]) m.w1.push_back(to_f32(v));
    for (const T& v : w2[r]) m.w2.push_back(to_f32(v));
    for (const T& v : g[r]) gd[size_t(r)].push_back(to_f32(v));
    dx[r].assign(size_t(t * h), poison<T>());
    dw[r].assign(size_t(t * k), std::nanf(""));
  }
  const MoeNaiveGrad want = naive_moe_backward(in, shape, gd);

  World world(WorldOptions{w, 20000});
  MoeBackward<T> bw(world, shape, c.mode, MoeConfig{5, 8, 8});
  world.run([&](int r) {
    bw.run(r, x[r].data(), in[size_t(r)].num_tokens, ids[r].data(), tw[r].data(), w1[r].data(), w2[r].data(),
           g[r].data(), dx[r].data(), dw[r].data());
  });
  // With the forward's kept h (MoeLayer0's preact, the forward's own shape): the same d x and
  // d topk_w bit for bit (the rows in the same order, h rounded the same way).
  {
    MoeLayer0<T> fwd(world, shape, c.mode, MoeConfig{5, 8, 8});
    std::vector<std::vector<T>> dx2(w), dx3(w);
    std::vector<std::vector<float>> dw2(w), dw3(w);
    world.run([&](int r) {
      const int64_t t = in[size_t(r)].num_tokens;
      std::vector<T> act, kept;
      MoeMetadata meta;
      fwd.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), act, meta, &kept);
      dx2[r].assign(size_t(t * h), poison<T>());
      dw2[r].assign(size_t(t * k), std::nanf(""));
      bw.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), w2[r].data(), g[r].data(), dx2[r].data(),
             dw2[r].data(), &kept);
      // The kept h is what step 3 reads: halved, the gradients change (d topk_w = <u, act(h)>
      // always; d x with SwiGLU, whose derivative depends on h).
      for (T& v : kept) v = from_f32<T>(0.5f * to_f32(v));
      dx3[r].assign(size_t(t * h), poison<T>());
      dw3[r].assign(size_t(t * k), std::nanf(""));
      bw.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), w2[r].data(), g[r].data(), dx3[r].data(),
             dw3[r].data(), &kept);
    });
    // A kept h bounded (the forward's preact_rows, the backward's h_rows): 1 row, NaN where the
    // call has more (step 3 must read step 1's h then); and rows + 3 (all kept, read). Both bit-equal
    // to the recomputed run.
    std::vector<std::vector<T>> dx4(w), dx5(w);
    std::vector<std::vector<float>> dw4(w), dw5(w);
    world.run([&](int r) {
      const int64_t t = in[size_t(r)].num_tokens;
      std::vector<T> act, one, all;
      MoeMetadata meta;
      fwd.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), act, meta, &one, 1);
      const int64_t rows = meta.layout.rows();
      EXPECT_EQ(int64_t(one.size()), std::min<int64_t>(rows, 1) * fi) << "the values kept for a bound of 1 row";
      if (rows > 1) std::fill(one.begin(), one.end(), poison<T>());
      dx4[r].assign(size_t(t * h), poison<T>());
      dw4[r].assign(size_t(t * k), std::nanf(""));
      bw.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), w2[r].data(), g[r].data(), dx4[r].data(),
             dw4[r].data(), &one, 1);
      fwd.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), act, meta, &all, rows + 3);
      dx5[r].assign(size_t(t * h), poison<T>());
      dw5[r].assign(size_t(t * k), std::nanf(""));
      bw.run(r, x[r].data(), t, ids[r].data(), tw[r].data(), w1[r].data(), w2[r].data(), g[r].data(), dx5[r].data(),
             dw5[r].data(), &all, rows + 3);
    });
    for (int r = 0; r < w; ++r) {
      SCOPED_TRACE("bounded kept h, rank " + std::to_string(r));
      EXPECT_EQ(std::memcmp(dx4[r].data(), dx[r].data(), dx[r].size() * sizeof(T)), 0) << "d x, bound 1 row";
      EXPECT_EQ(std::memcmp(dw4[r].data(), dw[r].data(), dw[r].size() * sizeof(float)), 0) << "d topk_w, bound 1 row";
      EXPECT_EQ(std::memcmp(dx5[r].data(), dx[r].data(), dx[r].size() * sizeof(T)), 0) << "d x, bound rows + 3";
      EXPECT_EQ(std::memcmp(dw5[r].data(), dw[r].data(), dw[r].size() * sizeof(float)), 0) << "d topk_w, bound rows + 3";
    }
    int64_t changed = 0;
    for (int r = 0; r < w; ++r) {
      changed += std::memcmp(dw3[r].data(), dw[r].data(), dw[r].size() * sizeof(float)) != 0;
      if (c.swiglu) changed += std::memcmp(dx3[r].data(), dx[r].data(), dx[r].size() * sizeof(T)) != 0;
    }
    EXPECT_GE(changed, c.swiglu ? 2 : 1) << "a halved kept h changed too few ranks' gradients";
    for (int r = 0; r < w; ++r) {
      SCOPED_TRACE("kept h, rank " + std::to_string(r));
      ASSERT_EQ(dx2[r].size(), dx[r].size());
      EXPECT_EQ(std::memcmp(dx2[r].data(), dx[r].data(), dx[r].size() * sizeof(T)), 0)
          << "d x differs from the recomputed run's";
      EXPECT_EQ(std::memcmp(dw2[r].data(), dw[r].data(), dw[r].size() * sizeof(float)), 0)
          << "d topk_w differs from the recomputed run's";
    }
  }
  for (int r = 0; r < w; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    if (in[size_t(r)].num_tokens == 0) continue;
    std::vector<double> got_dx, got_dw(dw[r].begin(), dw[r].end());
    for (const T& v : dx[r]) got_dx.push_back(to_f32(v));
    EXPECT_LE(rel_err(got_dx, want.dx[size_t(r)]), tol) << "dx";
    EXPECT_LE(rel_err(got_dw, want.dw[size_t(r)]), tol) << "d topk_w";
    for (size_t i = 0; i < ids[r].size(); ++i) {
      if (ids[r][i] < 0) {
        EXPECT_EQ(dw[r][i], 0.f) << "dropped slot " << i;
      }
    }
  }
}

const Case kCases[] = {
    {"w1_swiglu_alltoall", 1, 4, 2, true, DispatchMode::kAllToAll, 0.0},
    {"w2_swiglu_alltoall_drops", 2, 8, 2, true, DispatchMode::kAllToAll, 0.2},
    {"w2_plain_allgather", 2, 8, 3, false, DispatchMode::kAllGather, 0.1},
    {"w3_swiglu_top1", 3, 12, 1, true, DispatchMode::kAllToAll, 0.0},
    {"w4_swiglu_top4_allgather", 4, 12, 4, true, DispatchMode::kAllGather, 0.25},
    {"w4_plain_alltoall", 4, 8, 2, false, DispatchMode::kAllToAll, 0.0},
};

TEST(MoeBackwardWorld, Fp32MatchesFp64Reference) {
  for (const Case& c : kCases) check<float>(c, 1e-4);
}

TEST(MoeBackwardWorld, Bf16MatchesFp64Reference) {
  for (const Case& c : kCases) check<bf16>(c, 2e-2);
}

TEST(MoeBackwardWorld, KeptHOfAnotherCallIsAnError) {
  MoeShape shape;
  shape.hidden = 8;
  shape.ffn = 4;
  shape.num_experts = 2;
  shape.topk = 1;
  shape.swiglu = true;
  shape.max_tokens_per_rank = 4;
  World world(WorldOptions{1, 20000});
  MoeBackward<float> bw(world, shape, DispatchMode::kAllToAll);
  const std::vector<float> x(32, 0.5f), g(32, 0.25f), w1(2 * 8 * 8, 0.1f), w2(2 * 4 * 8, 0.1f), tw(4, 1.f);
  const std::vector<int32_t> ids = {0, 1, 0, -1};  // 3 rows: 3 x 2F = 24 values
  const std::vector<float> kept(16, 0.f);          // 2 rows' worth
  std::vector<float> dx(32), dw(4);
  try {
    world.run([&](int r) {
      bw.run(r, x.data(), 4, ids.data(), tw.data(), w1.data(), w2.data(), g.data(), dx.data(), dw.data(), &kept);
    });
    ADD_FAILURE() << "no error for a kept h of another call's rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h_saved holds 16 values, this call's 3 kept rows need 24"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ccfuse::ref
