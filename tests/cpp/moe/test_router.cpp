// The CPU reference router (ccfuse/moe/router.h) against a brute-force router written here:
// full argsort per token, capacity by sorting each expert's entries.
//
// Inputs are fresh random numbers on every run; the seed is printed with every failure
// (SCOPED_TRACE) and can be fixed with CCFUSE_TEST_SEED=<n> to replay one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ccfuse/common/error.h"
#include "ccfuse/moe/router.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::moe {
namespace {

using namespace ccfuse::testing;




RouterConfig make_config(int experts, int topk, ScoreFn score = ScoreFn::kSoftmax, bool normalize = true) {
  RouterConfig c;
  c.num_experts = experts;
  c.topk = topk;
  c.score = score;
  c.normalize = normalize;
  return c;
}

// Random logits with deliberate exact ties: some values are drawn from a small set.
std::vector<float> random_logits(std::mt19937_64& rng, int64_t tokens, int experts) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  const float pool[3] = {0.5f, -1.25f, 2.0f};
  std::vector<float> logits(size_t(tokens * experts));
  for (float& v : logits) {
    const int p = pick(rng);
    v = p < 3 ? pool[p] : normal(rng);
  }
  return logits;
}

// ---- the brute-force router ------------------------------------------------------------------

struct Naive {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Scores in double, full sort of all experts by (key desc, id asc), unbiased weights.
Naive naive_route(const RouterConfig& c, const std::vector<float>& logits, int64_t tokens, const float* bias) {
  const int E = c.num_experts, k = c.topk;
  Naive out;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> score(static_cast<size_t>(E));
    if (c.score == ScoreFn::kSoftmax) {
      const double m = *std::max_element(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(double(logits[size_t(t * E + e)]) - m);
      for (int e = 0; e < E; ++e) score[size_t(e)] = std::exp(double(logits[size_t(t * E + e)]) - m) / sum;
    } else {
      for (int e = 0; e < E; ++e) score[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[size_t(t * E + e)])));
    }
    std::vector<std::pair<double, int>> keyed;  // (-key, id): ascending sort = key desc, id asc
    for (int e = 0; e < E; ++e) keyed.push_back({-(score[size_t(e)] + (bias ? double(bias[e]) : 0.0)), e});
    std::sort(keyed.begin(), keyed.end());
    double sum = 0;
    for (int s = 0; s < k; ++s) sum += score[size_t(keyed[size_t(s)].second)];
    for (int s = 0; s < k; ++s) {
      const int id = keyed[size_t(s)].second;
      out.ids.push_back(id);
      double w = score[size_t(id)];
      if (c.normalize) w = sum > 0 ? w / sum : 1.0 / k;
      out.weights.push_back(float(w));
    }
  }
  return out;
}

// Applies the capacity to a naive result; returns the number dropped.
int64_t naive_capacity(const RouterConfig& c, int64_t tokens, Naive& r) {
  const int64_t cap = int64_t(std::ceil(c.capacity_factor * double(tokens) * c.topk / c.num_experts));
  int64_t dropped = 0;
  for (int e = 0; e < c.num_experts; ++e) {
    std::vector<std::tuple<float, int64_t, int64_t>> entries;  // (-weight or 0, token, entry)
    for (int64_t i = 0; i < int64_t(r.ids.size()); ++i)
      if (r.ids[size_t(i)] == e) {
        const float order = c.drop == DropPolicy::kByProbability ? -r.weights[size_t(i)] : 0.0f;
        entries.push_back({order, i / c.topk, i});
      }
    std::sort(entries.begin(), entries.end());
    for (size_t j = size_t(std::min<int64_t>(cap, int64_t(entries.size()))); j < entries.size(); ++j) {
      const int64_t i = std::get<2>(entries[j]);
      r.ids[size_t(i)] = -1;
      r.weights[size_t(i)] = 0.0f;
      ++dropped;
    }
  }
  return dropped;
}

void expect_same(const Naive& want, const RouterOutput& got) {
  ASSERT_EQ(want.ids.size(), got.topk_ids.size());
  ASSERT_EQ(want.weights.size(), got.topk_weights.size());
  for (size_t i = 0; i < want.ids.size(); ++i) {
    ASSERT_EQ(want.ids[i], got.topk_ids[i]) << "entry " << i;
    ASSERT_FLOAT_EQ(want.weights[i], got.topk_weights[i]) << "entry " << i;
  }
}

// Stats recomputed from the ids.
void expect_stats(const RouterConfig& c, const RouterOutput& out) {
  std::vector<int32_t> count(size_t(c.num_experts), 0);
  int64_t dropped = 0;
  for (int32_t id : out.topk_ids) {
    if (id < 0) {
      ++dropped;
    } else {
      ++count[size_t(id)];
    }
  }
  EXPECT_EQ(count, out.stats.tokens_per_expert);
  EXPECT_EQ(dropped, out.stats.dropped);
  const int64_t total = int64_t(out.topk_ids.size()) - dropped;
  const double mean = double(total) / c.num_experts;
  const double max = *std::max_element(count.begin(), count.end());
  EXPECT_DOUBLE_EQ(total == 0 ? 1.0 : max / mean, out.stats.imbalance);
}

// ---- validation ------------------------------------------------------------------------------

TEST(Router, ValidateMessages) {
  auto msg = [](RouterConfig c) { return arg_error([&] { validate(c); }); };
  RouterConfig c = make_config(8, 2);
  EXPECT_EQ("", msg(c));
  c = make_config(0, 1);
  EXPECT_EQ("num_experts 0 must be at least 1", msg(c));
  c = make_config(8, 0);
  EXPECT_EQ("topk 0 must be at least 1", msg(c));
  c = make_config(8, 9);
  EXPECT_EQ("topk 9 must not exceed num_experts 8", msg(c));
  c = make_config(8, 2);
  c.world_size = 0;
  EXPECT_EQ("world_size 0 must be at least 1", msg(c));
  c = make_config(10, 2);
  c.world_size = 4;
  EXPECT_EQ("num_experts 10 is not divisible by world_size 4", msg(c));
  c = make_config(8, 2);
  c.capacity_factor = -1;
  EXPECT_EQ("capacity_factor -1 must be >= 0 (0 = dropless)", msg(c));
  c.capacity_factor = std::nan("");
  EXPECT_EQ("capacity_factor nan must be >= 0 (0 = dropless)", msg(c));
  c.capacity_factor = INFINITY;
  EXPECT_EQ("capacity_factor inf must be finite", msg(c));
  c = make_config(8, 2);
  c.jitter_eps = 1.5f;
  EXPECT_EQ("jitter_eps 1.5 must be in [0, 1)", msg(c));
  c.jitter_eps = 1.0f;
  EXPECT_EQ("jitter_eps 1 must be in [0, 1)", msg(c));
  c.jitter_eps = -0.25f;
  EXPECT_EQ("jitter_eps -0.25 must be in [0, 1)", msg(c));
}

TEST(Router, RouteValidatesItsArguments) {
  const RouterConfig c = make_config(4, 2);
  std::vector<float> logits = {0, 1, 2, 3, 0, 1, NAN, 3};
  EXPECT_EQ("logits[1, 2] = nan is not finite", arg_error([&] { route_logits_cpu(c, logits.data(), 2, nullptr); }));
  logits[6] = 2;
  const float bias[4] = {0, INFINITY, 0, 0};
  EXPECT_EQ("bias[1] = inf is not finite", arg_error([&] { route_logits_cpu(c, logits.data(), 2, bias); }));
  EXPECT_EQ("num_tokens -1 must be >= 0", arg_error([&] { route_logits_cpu(c, logits.data(), -1, nullptr); }));
  EXPECT_EQ("logits must not be null", arg_error([&] { route_logits_cpu(c, nullptr, 2, nullptr); }));
  EXPECT_EQ("topk 9 must not exceed num_experts 4",
            arg_error([&] { route_logits_cpu(make_config(4, 9), logits.data(), 2, nullptr); }));
  const float x[2] = {1, 2}, w[8] = {};
  EXPECT_EQ("hidden 0 must be at least 1", arg_error([&] { route_cpu(c, x, w, 1, 0, nullptr); }));
  EXPECT_EQ("x must not be null", arg_error([&] { route_cpu(c, nullptr, w, 1, 2, nullptr); }));
  EXPECT_EQ("w_gate must not be null", arg_error([&] { route_cpu(c, x, nullptr, 1, 2, nullptr); }));
  std::vector<float> bias_v(3, 0.0f);
  EXPECT_EQ("bias has 3 entries but tokens_per_expert has 4",
            arg_error([&] { update_bias({1, 2, 3, 4}, 0.1f, bias_v); }));
  bias_v.assign(4, 0.0f);
  EXPECT_EQ("rate nan must be finite", arg_error([&] { update_bias({1, 2, 3, 4}, NAN, bias_v); }));
}

// ---- selection against the brute force ------------------------------------------------------

TEST(Router, MatchesBruteForce) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int expert_choices[] = {1, 2, 3, 8, 16, 60, 128};
  for (int iter = 0; iter < 60; ++iter) {
    const int E = expert_choices[iter % 7];
    const int k = std::uniform_int_distribution<int>(1, std::min(E, 8))(rng);
    const int64_t T = std::uniform_int_distribution<int64_t>(0, 90)(rng);
    RouterConfig c = make_config(E, k, iter % 2 ? ScoreFn::kSigmoid : ScoreFn::kSoftmax, (iter / 2) % 2 == 0);
    std::vector<float> bias(static_cast<size_t>(E));
    std::normal_distribution<float> small(0.0f, 0.3f);
    for (float& b : bias) b = small(rng);
    const bool use_bias = iter % 3 == 0;
    SCOPED_TRACE("iter " + std::to_string(iter) + " E " + std::to_string(E) + " k " + std::to_string(k) + " T " +
                 std::to_string(T));
    const std::vector<float> logits = random_logits(rng, T, E);
    const RouterOutput out = route_logits_cpu(c, logits.data(), T, use_bias ? bias.data() : nullptr);
    expect_same(naive_route(c, logits, T, use_bias ? bias.data() : nullptr), out);
    EXPECT_EQ(0, out.stats.dropped);
    expect_stats(c, out);
  }
}

// route_cpu = logits in double from x and w_gate, then route_logits_cpu.
TEST(Router, RouteCpuComputesLogitsInDouble) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t T = 37, H = 29;
  const int E = 12;
  std::vector<float> x(size_t(T * H)), w(size_t(H * E));
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  for (ScoreFn fn : {ScoreFn::kSoftmax, ScoreFn::kSigmoid}) {
    const RouterConfig c = make_config(E, 3, fn);
    std::vector<float> logits(size_t(T * E));
    for (int64_t t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double acc = 0;
        for (int64_t h = 0; h < H; ++h) acc += double(x[size_t(t * H + h)]) * double(w[size_t(h * E + e)]);
        logits[size_t(t * E + e)] = float(acc);
      }
    EXPECT_EQ(logits, router_logits_cpu(c, x.data(), w.data(), T, H));
    expect_same(naive_route(c, logits, T, nullptr), route_cpu(c, x.data(), w.data(), T, H, nullptr));
  }
}

TEST(Router, ScoreFunctions) {
  const float logits[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  // Softmax, not normalised over the chosen: the weights are the full softmax probabilities.
  RouterOutput out = route_logits_cpu(make_config(4, 4, ScoreFn::kSoftmax, false), logits, 1, nullptr);
  const double z = std::exp(1.0) + std::exp(-2.0) + std::exp(0.5) + std::exp(3.0);
  EXPECT_EQ((std::vector<int32_t>{3, 0, 2, 1}), out.topk_ids);
  EXPECT_FLOAT_EQ(float(std::exp(3.0) / z), out.topk_weights[0]);
  EXPECT_FLOAT_EQ(float(std::exp(1.0) / z), out.topk_weights[1]);
  EXPECT_FLOAT_EQ(float(std::exp(0.5) / z), out.topk_weights[2]);
  EXPECT_FLOAT_EQ(float(std::exp(-2.0) / z), out.topk_weights[3]);
  // Max-subtraction: logits far beyond exp's range still give finite probabilities.
  const float big[2] = {1000.0f, 999.0f};
  out = route_logits_cpu(make_config(2, 2, ScoreFn::kSoftmax, false), big, 1, nullptr);
  EXPECT_FLOAT_EQ(float(1 / (1 + std::exp(-1.0))), out.topk_weights[0]);
  EXPECT_FLOAT_EQ(float(std::exp(-1.0) / (1 + std::exp(-1.0))), out.topk_weights[1]);
  // Sigmoid, not normalised.
  out = route_logits_cpu(make_config(4, 2, ScoreFn::kSigmoid, false), logits, 1, nullptr);
  EXPECT_EQ((std::vector<int32_t>{3, 0}), out.topk_ids);
  EXPECT_FLOAT_EQ(float(1 / (1 + std::exp(-3.0))), out.topk_weights[0]);
  EXPECT_FLOAT_EQ(float(1 / (1 + std::exp(-1.0))), out.topk_weights[1]);
  // Sigmoid, normalised over the chosen two.
  out = route_logits_cpu(make_config(4, 2, ScoreFn::kSigmoid, true), logits, 1, nullptr);
  const double s3 = 1 / (1 + std::exp(-3.0)), s0 = 1 / (1 + std::exp(-1.0));
  EXPECT_FLOAT_EQ(float(s3 / (s3 + s0)), out.topk_weights[0]);
  EXPECT_FLOAT_EQ(float(s0 / (s3 + s0)), out.topk_weights[1]);
  // Sigmoid scores that underflow to 0: normalised weights fall back to 1/k (no NaN).
  const float low[3] = {-1000.0f, -2000.0f, -3000.0f};
  out = route_logits_cpu(make_config(3, 2, ScoreFn::kSigmoid, true), low, 1, nullptr);
  EXPECT_EQ((std::vector<int32_t>{0, 1}), out.topk_ids);
  EXPECT_EQ((std::vector<float>{0.5f, 0.5f}), out.topk_weights);
}

TEST(Router, TiesGoToTheLowerExpertId) {
  for (ScoreFn fn : {ScoreFn::kSoftmax, ScoreFn::kSigmoid}) {
    const std::vector<float> equal(16, 0.75f);
    RouterOutput out = route_logits_cpu(make_config(8, 3, fn), equal.data(), 2, nullptr);
    EXPECT_EQ((std::vector<int32_t>{0, 1, 2, 0, 1, 2}), out.topk_ids);
    for (float w : out.topk_weights) EXPECT_FLOAT_EQ(1.0f / 3, w);
    // A tie inside the top-k and one at its boundary.
    const float row[6] = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 2.0f};
    out = route_logits_cpu(make_config(6, 3, fn), row, 1, nullptr);
    EXPECT_EQ((std::vector<int32_t>{1, 3, 2}), out.topk_ids);
    // Sigmoid saturates to 1.0 in double for large logits: a tie in score, so lower id first.
    if (fn == ScoreFn::kSigmoid) {
      const float sat[3] = {40.0f, 50.0f, 60.0f};
      out = route_logits_cpu(make_config(3, 1, fn), sat, 1, nullptr);
      EXPECT_EQ(0, out.topk_ids[0]);
    }
  }
}

TEST(Router, TopOneThroughEight) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int E = 16;
  const int64_t T = 50;
  const std::vector<float> logits = random_logits(rng, T, E);
  for (int k = 1; k <= 8; ++k) {
    SCOPED_TRACE("k " + std::to_string(k));
    for (ScoreFn fn : {ScoreFn::kSoftmax, ScoreFn::kSigmoid}) {
      const RouterConfig c = make_config(E, k, fn);
      const RouterOutput out = route_logits_cpu(c, logits.data(), T, nullptr);
      expect_same(naive_route(c, logits, T, nullptr), out);
      for (int64_t t = 0; t < T; ++t) {
        std::set<int32_t> distinct;
        double sum = 0;
        for (int s = 0; s < k; ++s) {
          const int32_t id = out.topk_ids[size_t(t * k + s)];
          distinct.insert(id);
          sum += out.topk_weights[size_t(t * k + s)];
          // Slots in descending logit order (scores are monotone in the logit), ties: lower id.
          if (s > 0) {
            const int32_t prev = out.topk_ids[size_t(t * k + s - 1)];
            const float lp = logits[size_t(t * E + prev)], lc = logits[size_t(t * E + id)];
            EXPECT_TRUE(lp > lc || (lp == lc && prev < id));
          }
        }
        EXPECT_EQ(size_t(k), distinct.size());
        EXPECT_NEAR(1.0, sum, 1e-5);
        // Every unchosen expert scores no more than the last chosen one.
        const float last = logits[size_t(t * E + out.topk_ids[size_t(t * k + k - 1)])];
        for (int e = 0; e < E; ++e)
          if (!distinct.count(e)) {
            EXPECT_LE(logits[size_t(t * E + e)], last);
          }
      }
    }
  }
}

// ---- capacity --------------------------------------------------------------------------------

TEST(Router, ExpertCapacity) {
  RouterConfig c = make_config(4, 2);
  EXPECT_EQ(0, expert_capacity(c, 10));  // dropless
  c.capacity_factor = 1.0;
  EXPECT_EQ(5, expert_capacity(c, 10));
  c.capacity_factor = 1.5;
  EXPECT_EQ(8, expert_capacity(c, 10));  // ceil(7.5)
  c.capacity_factor = 0.01;
  EXPECT_EQ(1, expert_capacity(c, 10));
  EXPECT_EQ(0, expert_capacity(c, 0));
  c.capacity_factor = 1e300;
  EXPECT_EQ(10, expert_capacity(c, 10));  // clamped to T
  EXPECT_EQ("num_tokens -3 must be >= 0", arg_error([&] { expert_capacity(c, -3); }));
}

TEST(Router, CapacityMatchesBruteForce) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const double factors[] = {0.25, 0.5, 1.0, 1.1, 1.25, 2.0};
  for (int iter = 0; iter < 48; ++iter) {
    const int E = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(E, 4))(rng);
    const int64_t T = std::uniform_int_distribution<int64_t>(1, 80)(rng);
    RouterConfig c = make_config(E, k, iter % 4 < 2 ? ScoreFn::kSoftmax : ScoreFn::kSigmoid, iter % 3 != 0);
    c.capacity_factor = factors[iter % 6];
    c.drop = iter % 2 ? DropPolicy::kByProbability : DropPolicy::kByPosition;
    SCOPED_TRACE("iter " + std::to_string(iter) + " E " + std::to_string(E) + " k " + std::to_string(k) + " T " +
                 std::to_string(T) + " cf " + std::to_string(c.capacity_factor));
    // Skew the logits so that capacity binds.
    std::vector<float> logits = random_logits(rng, T, E);
    for (int64_t t = 0; t < T; ++t) logits[size_t(t * E)] += 3.0f;
    const RouterOutput out = route_logits_cpu(c, logits.data(), T, nullptr);
    Naive want = naive_route(c, logits, T, nullptr);
    const int64_t dropped = naive_capacity(c, T, want);
    expect_same(want, out);
    EXPECT_EQ(dropped, out.stats.dropped);
    expect_stats(c, out);
    const int64_t cap = expert_capacity(c, T);
    for (int32_t n : out.stats.tokens_per_expert) EXPECT_LE(n, cap);
    for (size_t i = 0; i < out.topk_ids.size(); ++i)
      if (out.topk_ids[i] < 0) {
        EXPECT_EQ(0.0f, out.topk_weights[i]);
      }
  }
}

// Dropped slots contribute zero and the survivors are not renormalised.
TEST(Router, DropsAreNotRenormalised) {
  // 4 tokens, 2 experts, top-2, cf 0.5: capacity ceil(0.5 * 4 * 2 / 2) = 2.
  const float logits[8] = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f};
  RouterConfig c = make_config(2, 2);
  c.capacity_factor = 0.5;
  const RouterOutput out = route_logits_cpu(c, logits, 4, nullptr);
  const float w0 = float(1 / (1 + std::exp(-1.0))), w1 = float(std::exp(-1.0) / (1 + std::exp(-1.0)));
  EXPECT_EQ((std::vector<int32_t>{0, 1, 0, 1, -1, -1, -1, -1}), out.topk_ids);
  EXPECT_EQ((std::vector<float>{w0, w1, w0, w1, 0, 0, 0, 0}), out.topk_weights);
  EXPECT_EQ(4, out.stats.dropped);
  EXPECT_EQ((std::vector<int32_t>{2, 2}), out.stats.tokens_per_expert);
}

TEST(Router, AllTokensToOneExpert) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int E = 8;
  const int64_t T = 64;
  std::vector<float> logits = random_logits(rng, T, E);
  for (int64_t t = 0; t < T; ++t) logits[size_t(t * E + 5)] = 100.0f + float(t % 7);  // expert 5 wins always
  for (int k : {1, 2}) {
    SCOPED_TRACE("k " + std::to_string(k));
    RouterConfig c = make_config(E, k);
    RouterOutput out = route_logits_cpu(c, logits.data(), T, nullptr);
    EXPECT_EQ(T, out.stats.tokens_per_expert[5]);
    EXPECT_EQ(0, out.stats.dropped);
    if (k == 1) {
      EXPECT_DOUBLE_EQ(double(E), out.stats.imbalance);
      for (float w : out.topk_weights) EXPECT_EQ(1.0f, w);
    }
    for (DropPolicy drop : {DropPolicy::kByPosition, DropPolicy::kByProbability}) {
      c.capacity_factor = 1.0;
      c.drop = drop;
      out = route_logits_cpu(c, logits.data(), T, nullptr);
      const int64_t cap = expert_capacity(c, T);  // ceil(T * k / E)
      EXPECT_EQ(cap, out.stats.tokens_per_expert[5]);
      EXPECT_GE(out.stats.dropped, T - cap);
      // Which tokens keep expert 5.
      std::vector<int64_t> kept;
      for (int64_t t = 0; t < T; ++t)
        if (out.topk_ids[size_t(t * k)] == 5) kept.push_back(t);
      ASSERT_EQ(size_t(cap), kept.size());
      if (drop == DropPolicy::kByPosition) {
        for (int64_t i = 0; i < cap; ++i) EXPECT_EQ(i, kept[size_t(i)]);
      } else if (k == 1) {
        // k = 1: every weight is 1.0, so all tie and the lower token indices stay.
        for (int64_t i = 0; i < cap; ++i) EXPECT_EQ(i, kept[size_t(i)]);
      }
      Naive want = naive_route(c, logits, T, nullptr);
      EXPECT_EQ(naive_capacity(c, T, want), out.stats.dropped);
      expect_same(want, out);
    }
  }
}

TEST(Router, ZeroTokenExpertsAndNoTokens) {
  const int E = 6;
  const int64_t T = 20;
  std::vector<float> logits(size_t(T * E), -50.0f);
  for (int64_t t = 0; t < T; ++t) logits[size_t(t * E + (t % 2 ? 1 : 4))] = 1.0f;
  const RouterConfig c = make_config(E, 1);
  RouterOutput out = route_logits_cpu(c, logits.data(), T, nullptr);
  EXPECT_EQ((std::vector<int32_t>{0, 10, 0, 0, 10, 0}), out.stats.tokens_per_expert);
  EXPECT_DOUBLE_EQ(3.0, out.stats.imbalance);  // max 10 / mean 20/6
  // No tokens: empty outputs, zero loads, imbalance defined as 1.
  out = route_logits_cpu(c, nullptr, 0, nullptr);
  EXPECT_TRUE(out.topk_ids.empty());
  EXPECT_TRUE(out.topk_weights.empty());
  EXPECT_EQ(std::vector<int32_t>(E, 0), out.stats.tokens_per_expert);
  EXPECT_EQ(0, out.stats.dropped);
  EXPECT_EQ(1.0, out.stats.imbalance);
}

// ---- jitter ----------------------------------------------------------------------------------

TEST(Router, JitterFactorFormula) {
  // splitmix64 reference outputs: seed 0 -> 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4;
  // seed 1234567 -> 6457827717110365317.
  const std::pair<uint64_t, std::pair<uint64_t, uint64_t>> known[] = {
      {0, {0, 0xE220A8397B1DCDAFull}}, {0, {1, 0x6E789E6AA1B965F4ull}}, {1234567, {0, 6457827717110365317ull}}};
  for (const auto& [seed, iv] : known) {
    const float eps = 0.125f;
    const float r = float(iv.second >> 40) / 16777216.0f;
    EXPECT_EQ(std::fma(2 * eps, r, 1 - eps), jitter_factor(seed, eps, iv.first));
  }
  EXPECT_EQ(1.0f, jitter_factor(42, 0.0f, 7));
  // Bounds and spread.
  for (float eps : {1e-3f, 0.01f, 0.3f, 0.99f}) {
    double sum = 0;
    float lo = 2, hi = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      const float u = jitter_factor(99, eps, uint64_t(i));
      lo = std::min(lo, u);
      hi = std::max(hi, u);
      sum += u;
    }
    EXPECT_GE(lo, 1.0f - eps);
    EXPECT_LE(hi, 1.0f + eps);
    EXPECT_LT(lo, 1.0f - 0.9f * eps);  // it does spread over the whole range
    EXPECT_GT(hi, 1.0f + 0.9f * eps);
    EXPECT_NEAR(1.0, sum / n, 0.02 * eps);
  }
}

TEST(Router, JitterIsDeterministicAndBounded) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t T = 64, H = 16;
  const int E = 8;
  std::vector<float> x(size_t(T * H)), w(size_t(H * E));
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  RouterConfig plain = make_config(E, 2);
  RouterConfig c = plain;
  c.jitter_eps = 0.2f;
  c.jitter_seed = rng();

  // The jittered logits are the logits of x * jitter_factor(seed, eps, t * H + h).
  std::vector<float> xj(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float u = jitter_factor(c.jitter_seed, c.jitter_eps, i);
    ASSERT_GE(u, 1.0f - c.jitter_eps);
    ASSERT_LE(u, 1.0f + c.jitter_eps);
    xj[i] = x[i] * u;
  }
  EXPECT_EQ(router_logits_cpu(plain, xj.data(), w.data(), T, H), router_logits_cpu(c, x.data(), w.data(), T, H));

  const RouterOutput a = route_cpu(c, x.data(), w.data(), T, H, nullptr);
  const RouterOutput b = route_cpu(c, x.data(), w.data(), T, H, nullptr);
  EXPECT_EQ(a.topk_ids, b.topk_ids);
  EXPECT_EQ(a.topk_weights, b.topk_weights);
  const RouterOutput none = route_cpu(plain, x.data(), w.data(), T, H, nullptr);
  EXPECT_NE(none.topk_weights, a.topk_weights);

  RouterConfig other = c;
  other.jitter_seed = c.jitter_seed ^ 0x5555;
  const RouterOutput d = route_cpu(other, x.data(), w.data(), T, H, nullptr);
  EXPECT_NE(a.topk_weights, d.topk_weights);
  // Strong jitter on 128 token-choices: some ids differ between seeds.
  RouterConfig strong = c;
  strong.jitter_eps = 0.9f;
  RouterConfig strong2 = strong;
  strong2.jitter_seed = other.jitter_seed;
  EXPECT_NE(route_cpu(strong, x.data(), w.data(), T, H, nullptr).topk_ids,
            route_cpu(strong2, x.data(), w.data(), T, H, nullptr).topk_ids);

  // eps = 0: jitter off, whatever the seed.
  RouterConfig zero = plain;
  zero.jitter_seed = 12345;
  const RouterOutput z = route_cpu(zero, x.data(), w.data(), T, H, nullptr);
  EXPECT_EQ(none.topk_ids, z.topk_ids);
  EXPECT_EQ(none.topk_weights, z.topk_weights);
}

// ---- bias ------------------------------------------------------------------------------------

TEST(Router, BiasSteersChoiceButNotWeights) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int E = 8;
  const int64_t T = 40;
  const std::vector<float> logits = random_logits(rng, T, E);
  for (ScoreFn fn : {ScoreFn::kSoftmax, ScoreFn::kSigmoid}) {
    const RouterConfig c = make_config(E, 2, fn);
    std::vector<float> bias(E, 0.0f);
    bias[6] = 10.0f;  // scores are in [0, 1]: expert 6 is always first
    const RouterOutput out = route_logits_cpu(c, logits.data(), T, bias.data());
    EXPECT_EQ(T, out.stats.tokens_per_expert[6]);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(6, out.topk_ids[size_t(t * 2)]);
      // Weights: unbiased scores of the chosen two, normalised.
      const int32_t a = out.topk_ids[size_t(t * 2)], b = out.topk_ids[size_t(t * 2 + 1)];
      double sa, sb;
      if (fn == ScoreFn::kSoftmax) {
        sa = std::exp(double(logits[size_t(t * E + a)]));
        sb = std::exp(double(logits[size_t(t * E + b)]));
      } else {
        sa = 1 / (1 + std::exp(-double(logits[size_t(t * E + a)])));
        sb = 1 / (1 + std::exp(-double(logits[size_t(t * E + b)])));
      }
      EXPECT_NEAR(sa / (sa + sb), out.topk_weights[size_t(t * 2)], 1e-6);
      EXPECT_NEAR(sb / (sa + sb), out.topk_weights[size_t(t * 2 + 1)], 1e-6);
    }
    // A large negative bias: never chosen.
    bias.assign(E, 0.0f);
    bias[2] = -10.0f;
    EXPECT_EQ(0, route_logits_cpu(c, logits.data(), T, bias.data()).stats.tokens_per_expert[2]);
  }
}

TEST(Router, UpdateBiasDirection) {
  std::vector<float> bias = {0.5f, 0.0f, -0.25f, 0.0f};
  update_bias({10, 0, 5, 5}, 0.125f, bias);  // mean 5
  EXPECT_EQ((std::vector<float>{0.375f, 0.125f, -0.25f, 0.0f}), bias);
  update_bias({1, 2, 3, 4}, 0.5f, bias);  // mean 2.5: none equal
  EXPECT_EQ((std::vector<float>{0.875f, 0.625f, -0.75f, -0.5f}), bias);
  std::vector<float> empty;
  update_bias({}, 1.0f, empty);
  EXPECT_TRUE(empty.empty());
}

// Bias updates between steps pull a skewed router towards balance.
TEST(Router, BiasUpdatesBalanceLoad) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int E = 8;
  const int64_t T = 256;
  std::vector<float> logits = random_logits(rng, T, E);
  for (int64_t t = 0; t < T; ++t) logits[size_t(t * E)] += 2.0f;  // expert 0 is popular
  const RouterConfig c = make_config(E, 2, ScoreFn::kSigmoid);
  std::vector<float> bias(E, 0.0f);
  const double first = route_logits_cpu(c, logits.data(), T, nullptr).stats.imbalance;
  // The sign updates of a fixed step make the load oscillate around balance once there: the
  // imbalance of one step can peak above its mean (1.28-1.34 at the last step for about 1 seed in
  // 1500, 2026-12-07), so the settled state is judged by the mean of the last 20 steps (below 1.15
  // for 399 seeds in 400; 1.5 and more before the updates).
  double settled = 0;
  for (int step = 0; step < 100; ++step) {
    const RouterOutput out = route_logits_cpu(c, logits.data(), T, bias.data());
    if (step >= 80) settled += out.stats.imbalance / 20;
    update_bias(out.stats.tokens_per_expert, 0.01f, bias);
  }
  EXPECT_GT(first, 1.5);
  EXPECT_LT(settled, 1.25);
  EXPECT_LT(bias[0], 0.0f);
}

}  // namespace
}  // namespace ccfuse::moe
