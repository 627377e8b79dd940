// ccfuse/moe/router.h: MoE routing (DESIGN §2.3), CPU reference. A GPU router must produce the
// same top-k ids for the same inputs (ties: the lower expert id wins).
//
//   logits [T, E] = (X [T, H] * jitter) @ W_gate [H, E]      (fp32; jitter only in training)
//   scores = softmax(logits) or sigmoid(logits)
//   top-k by (scores + bias) (bias: load-aware, aux-loss-free balancing; it only steers the
//   choice); the weights are the unbiased scores of the chosen experts, normalised to sum 1 if
//   normalize is set;
//   capacity: each expert keeps at most ceil(capacity_factor * T * k / E) entries (0 = dropless);
//   a dropped entry has id -1 and weight 0 and is counted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ccfuse::moe {

enum class ScoreFn { kSoftmax, kSigmoid };
enum class DropPolicy {
  kByPosition,     // earlier tokens (lower token index) keep their slot
  kByProbability,  // each expert keeps its highest-weight entries
};

struct RouterConfig {
  int num_experts = 0;
  int topk = 1;
  ScoreFn score = ScoreFn::kSoftmax;
  bool normalize = true;
  double capacity_factor = 0;  // 0 = dropless; otherwise > 0
  DropPolicy drop = DropPolicy::kByPosition;
  float jitter_eps = 0;        // training: X *= U(1 - eps, 1 + eps), seeded; 0 = off
  uint64_t jitter_seed = 0;
  int world_size = 1;          // experts are split evenly over the ranks (E % W == 0)
};

struct RouterStats {
  std::vector<int32_t> tokens_per_expert;  // after drops
  int64_t dropped = 0;                     // entries dropped by the capacity
  double imbalance = 0;                    // max / mean of tokens_per_expert (1 = balanced)
};

struct RouterOutput {
  std::vector<int32_t> topk_ids;      // [T, k]; -1 = dropped
  std::vector<float> topk_weights;    // [T, k]; 0 for dropped entries
  RouterStats stats;
};

// Throws InvalidArgument naming the rule: num_experts >= 1, 1 <= topk <= num_experts, experts
// divisible by world_size, capacity_factor >= 0, jitter_eps in [0, 1).
void validate(const RouterConfig& config);

// Routes T tokens. x [T, H] and w_gate [H, E] row-major fp32; bias [E] or null.
RouterOutput route_cpu(const RouterConfig& config, const float* x, const float* w_gate, int64_t num_tokens,
                       int64_t hidden, const float* bias);

// The same from precomputed logits [T, E] (no jitter): what GPU-vs-CPU agreement tests compare.
RouterOutput route_logits_cpu(const RouterConfig& config, const float* logits, int64_t num_tokens, const float* bias);

// Small helpers that pin the exact arithmetic for a GPU router (docs/moe-routing.md):

// capacity_factor > 0: ceil(((capacity_factor * T) * k) / E) evaluated in double, clamped to T
// (an expert gets at most one entry per token; the clamp keeps huge factors from overflowing).
// capacity_factor == 0 (dropless): 0. Validates config; num_tokens >= 0.
int64_t expert_capacity(const RouterConfig& config, int64_t num_tokens);

// The jitter multiplier of element `index` (= t * H + h): z = the index-th (0-based) output of a
// splitmix64 stream seeded with `seed`, r = float(z >> 40) * 2^-24 in [0, 1),
// u = fmaf(2 * eps, r, 1 - eps) in fp32, so u is in [1 - eps, 1 + eps].
float jitter_factor(uint64_t seed, float eps, uint64_t index);

// logits [T, E] (returned, row-major) as route_cpu computes them: x_j = fp32(x * jitter_factor)
// when jitter_eps > 0 (else x), logits[t, e] = fp32(sum over h ascending, in double, of
// double(x_j[t, h]) * double(w_gate[h, e])).
std::vector<float> router_logits_cpu(const RouterConfig& config, const float* x, const float* w_gate,
                                     int64_t num_tokens, int64_t hidden);

// Aux-loss-free balancing: bias[e] += rate * sign(mean load - load[e]) (overloaded experts get
// less likely, underloaded more).
void update_bias(const std::vector<int32_t>& tokens_per_expert, float rate, std::vector<float>& bias);

}  // namespace ccfuse::moe
