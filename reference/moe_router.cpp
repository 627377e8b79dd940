// reference/moe_router.cpp: the CPU reference router (ccfuse/moe/router.h, DESIGN §2.3).
//
// The arithmetic is pinned so that a GPU router can follow it (docs/moe-routing.md):
//   - logits: fp32 inputs, products and sums in double (h ascending), rounded to fp32 once;
//   - scores, selection keys (score + bias) and normalised weights: double, computed from the
//     fp32 logits; the weights are rounded to fp32 once at the end;
//   - top-k: by key descending, ties to the lower expert id; slot 0 holds the best expert;
//   - capacity: ceil(((cf * T) * k) / E) in double; drops do not renormalise the survivors.
#include "ccfuse/moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ccfuse/common/error.h"

namespace ccfuse::moe {

namespace {

// splitmix64's output function (Steele, Lea, Flood 2014); the stream's i-th output (0-based)
// for seed s is mix(s + (i + 1) * golden).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void check_tokens(int64_t num_tokens) {
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
}

// Selection order: higher key first; equal keys: lower expert id first.
struct KeyGreater {
  const double* key;
  bool operator()(int32_t a, int32_t b) const { return key[a] > key[b] || (key[a] == key[b] && a < b); }
};

void fill_stats(RouterOutput& out, int num_experts) {
  RouterStats& st = out.stats;
  st.tokens_per_expert.assign(size_t(num_experts), 0);
  for (int32_t id : out.topk_ids)
    if (id >= 0) ++st.tokens_per_expert[size_t(id)];
  int64_t total = 0;
  int32_t max_load = 0;
  for (int32_t n : st.tokens_per_expert) {
    total += n;
    max_load = std::max(max_load, n);
  }
  // NOTE: no tokens at all counts as balanced (1.0), not 0/0.
  st.imbalance = total == 0 ? 1.0 : double(max_load) / (double(total) / double(num_experts));
}

// Applies the capacity in place: entries over an expert's capacity get id -1 and weight 0.
void apply_capacity(const RouterConfig& config, int64_t num_tokens, RouterOutput& out) {
  const int64_t capacity = expert_capacity(config, num_tokens);
  const int k = config.topk;
  const int64_t entries = num_tokens * k;
  auto drop = [&](int64_t entry) {
    out.topk_ids[size_t(entry)] = -1;
    out.topk_weights[size_t(entry)] = 0.0f;
    ++out.stats.dropped;
  };
  if (config.drop == DropPolicy::kByPosition) {
    std::vector<int64_t> used(size_t(config.num_experts), 0);
    for (int64_t entry = 0; entry < entries; ++entry) {  // (token, slot) order
      const int32_t id = out.topk_ids[size_t(entry)];
      if (id < 0) continue;
      if (used[size_t(id)] < capacity) {
        ++used[size_t(id)];
      } else {
        drop(entry);
      }
    }
    return;
  }
  // kByProbability: bucket the entries per expert (in entry order, so token ascending), then keep
  // the `capacity` highest fp32 weights; equal weights: the lower token index stays.
  std::vector<std::vector<int64_t>> per_expert(size_t(config.num_experts));
  for (int64_t entry = 0; entry < entries; ++entry) {
    const int32_t id = out.topk_ids[size_t(entry)];
    if (id >= 0) per_expert[size_t(id)].push_back(entry);
  }
  for (auto& list : per_expert) {
    if (int64_t(list.size()) <= capacity) continue;
    // Entries of one expert come from distinct tokens, so entry order is token order.
    std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
      return out.topk_weights[size_t(a)] > out.topk_weights[size_t(b)];
    });
    for (size_t i = size_t(capacity); i < list.size(); ++i) drop(list[i]);
  }
}

}  // namespace

void validate(const RouterConfig& config) {
  CCFUSE_ARG_CHECK(config.num_experts >= 1, "num_experts ", config.num_experts, " must be at least 1");
  CCFUSE_ARG_CHECK(config.topk >= 1, "topk ", config.topk, " must be at least 1");
  CCFUSE_ARG_CHECK(config.topk <= config.num_experts, "topk ", config.topk, " must not exceed num_experts ",
                   config.num_experts);
  CCFUSE_ARG_CHECK(config.world_size >= 1, "world_size ", config.world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(config.num_experts % config.world_size == 0, "num_experts ", config.num_experts,
                   " is not divisible by world_size ", config.world_size);
  CCFUSE_ARG_CHECK(config.capacity_factor >= 0, "capacity_factor ", config.capacity_factor,
                   " must be >= 0 (0 = dropless)");  // also rejects NaN
  CCFUSE_ARG_CHECK(std::isfinite(config.capacity_factor), "capacity_factor ", config.capacity_factor,
                   " must be finite");
  CCFUSE_ARG_CHECK(config.jitter_eps >= 0 && config.jitter_eps < 1, "jitter_eps ", config.jitter_eps,
                   " must be in [0, 1)");
}

int64_t expert_capacity(const RouterConfig& config, int64_t num_tokens) {
  validate(config);
  check_tokens(num_tokens);
  if (config.capacity_factor == 0) return 0;
  // ASSUMPTION: this evaluation order is the contract (Megatron's get_capacity is the same
  // formula); with factors like 1.1 the double may land a hair above an integer and round up.
  const double cap = std::ceil(config.capacity_factor * double(num_tokens) * double(config.topk) /
                               double(config.num_experts));
  return cap >= double(num_tokens) ? num_tokens : int64_t(cap);
}

float jitter_factor(uint64_t seed, float eps, uint64_t index) {
  const uint64_t z = splitmix64_mix(seed + (index + 1) * kGolden);
  const float r = float(z >> 40) * 0x1p-24f;  // 24 bits: exact in fp32, in [0, 1)
  return std::fma(2.0f * eps, r, 1.0f - eps);  // fp32 fma: what a GPU's fmaf gives bit-exactly
}

std::vector<float> router_logits_cpu(const RouterConfig& config, const float* x, const float* w_gate,
                                     int64_t num_tokens, int64_t hidden) {
  validate(config);
  check_tokens(num_tokens);
  CCFUSE_ARG_CHECK(hidden >= 1, "hidden ", hidden, " must be at least 1");
  const int64_t num_experts = config.num_experts;
  std::vector<float> logits(size_t(num_tokens * num_experts));
  if (num_tokens == 0) return logits;
  CCFUSE_ARG_CHECK(x != nullptr, "x must not be null");
  CCFUSE_ARG_CHECK(w_gate != nullptr, "w_gate must not be null");
  std::vector<float> xj(static_cast<size_t>(hidden));
  std::vector<double> acc(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) {
      const float v = x[t * hidden + h];
      xj[size_t(h)] = config.jitter_eps > 0
                          ? v * jitter_factor(config.jitter_seed, config.jitter_eps, uint64_t(t * hidden + h))
                          : v;
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    // fp32 x fp32 is exact in double; the sum over h (ascending) is the only rounding before the
    // final one to fp32.
    for (int64_t h = 0; h < hidden; ++h) {
      const double xv = xj[size_t(h)];
      const float* w_row = w_gate + h * num_experts;
      for (int64_t e = 0; e < num_experts; ++e) acc[size_t(e)] += xv * double(w_row[e]);
    }
    for (int64_t e = 0; e < num_experts; ++e) logits[size_t(t * num_experts + e)] = float(acc[size_t(e)]);
  }
  return logits;
}

RouterOutput route_logits_cpu(const RouterConfig& config, const float* logits, int64_t num_tokens,
                              const float* bias) {
  validate(config);
  check_tokens(num_tokens);
  const int num_experts = config.num_experts;
  const int k = config.topk;
  if (bias != nullptr)
    for (int e = 0; e < num_experts; ++e)
      CCFUSE_ARG_CHECK(std::isfinite(bias[e]), "bias[", e, "] = ", bias[e], " is not finite");

  RouterOutput out;
  out.topk_ids.assign(size_t(num_tokens * k), -1);
  out.topk_weights.assign(size_t(num_tokens * k), 0.0f);
  if (num_tokens > 0) CCFUSE_ARG_CHECK(logits != nullptr, "logits must not be null");

  std::vector<double> score(static_cast<size_t>(num_experts)), key(static_cast<size_t>(num_experts));
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    for (int e = 0; e < num_experts; ++e)
      CCFUSE_ARG_CHECK(std::isfinite(row[e]), "logits[", t, ", ", e, "] = ", row[e], " is not finite");
    if (config.score == ScoreFn::kSoftmax) {
      double max_logit = row[0];
      for (int e = 1; e < num_experts; ++e) max_logit = std::max(max_logit, double(row[e]));
      double sum = 0;  // experts ascending
      for (int e = 0; e < num_experts; ++e) {
        score[size_t(e)] = std::exp(double(row[e]) - max_logit);
        sum += score[size_t(e)];
      }
      for (int e = 0; e < num_experts; ++e) score[size_t(e)] /= sum;  // sum >= 1: the max term is 1
    } else {
      for (int e = 0; e < num_experts; ++e) score[size_t(e)] = 1.0 / (1.0 + std::exp(-double(row[e])));
    }
    for (int e = 0; e < num_experts; ++e) key[size_t(e)] = score[size_t(e)] + (bias ? double(bias[e]) : 0.0);

    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), KeyGreater{key.data()});

    double norm = 1.0;
    if (config.normalize) {
      double sum = 0;  // slots ascending
      for (int s = 0; s < k; ++s) sum += score[size_t(order[size_t(s)])];
      // NOTE: softmax scores are never all 0, but sigmoid scores underflow to 0 for logits below
      // about -745; then the weights are uniform 1/k, so a token's weights still sum to 1.
      norm = sum > 0 ? sum : 0.0;
    }
    for (int s = 0; s < k; ++s) {
      const int32_t id = order[size_t(s)];
      const double w = norm > 0 ? score[size_t(id)] / norm : 1.0 / double(k);
      out.topk_ids[size_t(t * k + s)] = id;
      out.topk_weights[size_t(t * k + s)] = float(w);
    }
  }

  if (config.capacity_factor > 0) apply_capacity(config, num_tokens, out);
  fill_stats(out, num_experts);
  return out;
}

RouterOutput route_cpu(const RouterConfig& config, const float* x, const float* w_gate, int64_t num_tokens,
                       int64_t hidden, const float* bias) {
  const std::vector<float> logits = router_logits_cpu(config, x, w_gate, num_tokens, hidden);
  return route_logits_cpu(config, logits.data(), num_tokens, bias);
}

void update_bias(const std::vector<int32_t>& tokens_per_expert, float rate, std::vector<float>& bias) {
  CCFUSE_ARG_CHECK(bias.size() == tokens_per_expert.size(), "bias has ", bias.size(),
                   " entries but tokens_per_expert has ", tokens_per_expert.size());
  CCFUSE_ARG_CHECK(std::isfinite(rate), "rate ", rate, " must be finite");
  if (bias.empty()) return;
  double total = 0;
  for (int32_t n : tokens_per_expert) total += n;
  const double mean = total / double(tokens_per_expert.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const double load = tokens_per_expert[e];
    const float sign = mean > load ? 1.0f : (mean < load ? -1.0f : 0.0f);
    bias[e] += rate * sign;
  }
}

}  // namespace ccfuse::moe
