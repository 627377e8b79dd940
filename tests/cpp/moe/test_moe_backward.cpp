// The fp64 reference of the MoE FFN's backward (reference/moe_naive.h, naive_moe_backward) against
// central finite differences of the forward (naive_moe) on small random problems: two ranks, a
// different number of tokens each, a dropped slot, SwiGLU and plain. The loss is
// L = Σ_r <g_r, out_r> for a random g, so d L / d θ is what the backward returns for g.
// Fresh random inputs each run; the seed is printed with a failure (CCFUSE_TEST_SEED replays it).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/error.h"
#include "reference/moe_naive.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::ref {
namespace {

using namespace ccfuse::testing;

struct Problem {
  MoeShape shape;
  std::vector<MoeRankInputs> ranks;
  std::vector<std::vector<double>> g;  // d L / d out
};

Problem make_problem(uint64_t seed, bool swiglu) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.1, 1.0);
  Problem p;
  p.shape.hidden = 6;
  p.shape.ffn = 5;
  p.shape.num_experts = 4;
  p.shape.topk = 2;
  p.shape.swiglu = swiglu;
  p.shape.max_tokens_per_rank = 4;
  const int world = 2, e_local = 2, k = 2;
  const int64_t h = 6, f = 5, f_in = swiglu ? 10 : 5;
  const int64_t tokens[2] = {4, 3};
  p.ranks.resize(world);
  p.g.resize(world);
  for (int r = 0; r < world; ++r) {
    MoeRankInputs& in = p.ranks[size_t(r)];
    in.num_tokens = tokens[r];
    for (int64_t i = 0; i < tokens[r] * h; ++i) in.x.push_back(nd(rng));
    for (int64_t t = 0; t < tokens[r]; ++t) {
      const int e0 = int(rng() % 4);
      const int e1 = (e0 + 1 + int(rng() % 3)) % 4;  // a different expert
      in.topk_ids.push_back(e0);
      in.topk_ids.push_back(e1);
      in.topk_weights.push_back(ud(rng));
      in.topk_weights.push_back(ud(rng));
    }
    for (int64_t i = 0; i < e_local * h * f_in; ++i) in.w1.push_back(nd(rng) * 0.5);
    for (int64_t i = 0; i < e_local * f * h; ++i) in.w2.push_back(nd(rng) * 0.5);
    for (int64_t i = 0; i < tokens[r] * h; ++i) p.g[size_t(r)].push_back(nd(rng));
  }
  p.ranks[1].topk_ids[1] = -1;  // rank 1's token 0, slot 1: dropped
  p.ranks[1].topk_weights[1] = 0.0;
  (void)k;
  return p;
}

double loss(const Problem& p) {
  const MoeNaiveOutput out = naive_moe(p.ranks, p.shape);
  double l = 0.0;
  for (size_t r = 0; r < out.out.size(); ++r)
    for (size_t i = 0; i < out.out[r].size(); ++i) l += p.g[r][i] * out.out[r][i];
  return l;
}

// Checks every element of one parameter array against central differences.
void check_param(Problem& p, const char* name, const std::function<std::vector<double>&(int)>& param,
                 const std::vector<std::vector<double>>& grad) {
  const double eps = 1e-6;
  for (int r = 0; r < int(p.ranks.size()); ++r) {
    std::vector<double>& v = param(r);
    ASSERT_EQ(v.size(), grad[size_t(r)].size()) << name << " rank " << r;
    for (size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i];
      v[i] = keep + eps;
      const double lp = loss(p);
      v[i] = keep - eps;
      const double lm = loss(p);
      v[i] = keep;
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(grad[size_t(r)][i], fd, 1e-6 * std::max(1.0, std::fabs(fd)))
          << name << " rank " << r << " element " << i;
    }
  }
}

class MoeNaiveBackward : public ::testing::TestWithParam<bool> {};

TEST_P(MoeNaiveBackward, MatchesFiniteDifferences) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + (GetParam() ? " swiglu" : " plain"));
  Problem p = make_problem(seed, GetParam());
  const MoeNaiveGrad g = naive_moe_backward(p.ranks, p.shape, p.g);
  check_param(p, "x", [&](int r) -> std::vector<double>& { return p.ranks[size_t(r)].x; }, g.dx);
  check_param(p, "topk_weights", [&](int r) -> std::vector<double>& { return p.ranks[size_t(r)].topk_weights; },
              g.dw);
  check_param(p, "w1", [&](int r) -> std::vector<double>& { return p.ranks[size_t(r)].w1; }, g.dw1);
  check_param(p, "w2", [&](int r) -> std::vector<double>& { return p.ranks[size_t(r)].w2; }, g.dw2);
  // the dropped slot's router weight gets no gradient (its slot contributes nothing)
  EXPECT_EQ(g.dw[1][1], 0.0);
}

INSTANTIATE_TEST_SUITE_P(Act, MoeNaiveBackward, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "swiglu" : "plain"; });

TEST(MoeNaiveBackwardErrors, GradOutMustMatchTheTokens) {
  Problem p = make_problem(1, true);
  p.g[1].pop_back();
  try {
    naive_moe_backward(p.ranks, p.shape, p.g);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's grad_out does not match its 3 tokens"), std::string::npos)
        << e.what();
  }
  p.g.pop_back();
  try {
    naive_moe_backward(p.ranks, p.shape, p.g);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("grad_out has 1 ranks, the inputs 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ccfuse::ref
