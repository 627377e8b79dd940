// The GPU MoE router (route_gpu) and layout (make_layout_gpu) against the CPU reference
// (route_logits_cpu, make_layout) on the same inputs: ids exact except documented near-ties
// (docs/moe-routing.md: two selection keys within a few ulp, where CUDA's double exp and libm's
// may round apart), weights within 1e-6 relative (in practice bit-equal), stats and layouts exact.
//
// Every run draws a fresh seed (printed; replay with CCFUSE_TEST_SEED=<n>). Outputs and workspaces
// are poisoned before every GPU call, so an unwritten element shows. Each sweep prints one line
// per case with what it compared and how many near-ties it met, so a log explains itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"
#include "ccfuse/moe/layout.h"
#include "ccfuse/moe/layout_gpu.h"
#include "ccfuse/moe/router.h"
#include "ccfuse/moe/router_gpu.h"
#include "gpu_test_util.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::moe {
namespace {

using ccfuse::testing::arg_error;
using ccfuse::testing::seed_trace;
using ccfuse::testing::test_seed;

constexpr int kPoisonByte = 0x7b;  // int32 0x7b7b7b7b: out of every id/index range
// Keys of the CPU and the GPU may differ by a few ulp (exp); two keys closer than this (relative)
// are a near-tie, where the chosen ids may legitimately differ.
constexpr double kNearTieRel = 4e-15;
constexpr double kWeightRel = 1e-6;

// ---- device buffers ---------------------------------------------------------------------------

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (n > 0) CCFUSE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { upload(v); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p != nullptr) cudaFree(p);
  }
  void upload(const std::vector<T>& v) {
    if (!v.empty()) CCFUSE_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    if (n > 0) CCFUSE_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void poison(int byte = kPoisonByte) {
    // cudaMemset runs on the legacy stream, which does not order against the non-blocking
    // streams the kernels run on: wait for it, or the poison can land after the kernel's writes.
    if (n > 0) CCFUSE_CUDA_CHECK(cudaMemset(p, byte, n * sizeof(T)));
    CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { CCFUSE_CUDA_CHECK(cudaStreamSynchronize(s)); }
};

std::string config_name(const RouterConfig& c, int64_t tokens, bool bias) {
  const char* drop = c.capacity_factor == 0 ? "dropless"
                     : c.drop == DropPolicy::kByPosition ? "by_position" : "by_probability";
  char buf[200];
  std::snprintf(buf, sizeof(buf), "T=%lld E=%d k=%d %s%s%s cf=%g %s", (long long)tokens, c.num_experts, c.topk,
                c.score == ScoreFn::kSoftmax ? "softmax" : "sigmoid", bias ? " bias" : "",
                c.normalize ? "" : " unnormalized", c.capacity_factor, drop);
  return buf;
}

RouterConfig make_config(int experts, int topk, ScoreFn score, double cf = 0,
                         DropPolicy drop = DropPolicy::kByPosition, bool normalize = true) {
  RouterConfig c;
  c.num_experts = experts;
  c.topk = topk;
  c.score = score;
  c.capacity_factor = cf;
  c.drop = drop;
  c.normalize = normalize;
  return c;
}

// Element-wise equality with a short report (first mismatch and count) instead of gtest printing
// two vectors of 100k elements.
template <typename T>
void expect_vec_eq(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << what << ": size " << got.size() << ", want " << want.size();
    return;
  }
  size_t diffs = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && diffs++ == 0) first = i;
  if (diffs > 0)
    ADD_FAILURE() << what << ": " << diffs << " of " << got.size() << " elements differ; first at " << first
                  << ": got " << got[first] << ", want " << want[first];
}

// ---- running the GPU router -------------------------------------------------------------------

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int32_t> tokens_per_expert;
  int64_t dropped = 0;
};

// Poisons outputs and workspace, routes on a non-default stream, downloads.
Routed route_on_gpu(const RouterConfig& c, const Dev<float>& logits, int64_t tokens, const Dev<float>* bias) {
  const size_t entries = size_t(tokens * c.topk);
  Dev<int32_t> ids(entries), tpe(static_cast<size_t>(c.num_experts));
  Dev<float> weights(entries);
  Dev<int64_t> dropped(1);
  const size_t ws_bytes = router_workspace_bytes(c, tokens);
  Dev<char> ws(ws_bytes);
  ids.poison();
  tpe.poison();
  weights.poison(0xff);  // NaN
  dropped.poison();
  ws.poison(0xa5);
  Stream stream;
  route_gpu(c, logits.p, tokens, bias != nullptr ? bias->p : nullptr, ids.p, weights.p, tpe.p, dropped.p,
            ws_bytes > 0 ? ws.p : nullptr, stream.s);
  stream.sync();
  Routed r;
  r.ids = ids.download();
  r.weights = weights.download();
  r.tokens_per_expert = tpe.download();
  r.dropped = dropped.download()[0];
  return r;
}

// ---- host helpers -----------------------------------------------------------------------------

// The reference's selection keys of one token (docs/moe-routing.md), computed with this host's libm.
std::vector<double> host_keys(const RouterConfig& c, const float* row, const float* bias, std::vector<double>* scores) {
  const int E = c.num_experts;
  std::vector<double> s(static_cast<size_t>(E)), key(static_cast<size_t>(E));
  if (c.score == ScoreFn::kSoftmax) {
    double m = row[0];
    for (int e = 1; e < E; ++e) m = std::max(m, double(row[e]));
    double z = 0;
    for (int e = 0; e < E; ++e) z += (s[size_t(e)] = std::exp(double(row[e]) - m));
    for (int e = 0; e < E; ++e) s[size_t(e)] /= z;
  } else {
    for (int e = 0; e < E; ++e) s[size_t(e)] = 1.0 / (1.0 + std::exp(-double(row[e])));
  }
  for (int e = 0; e < E; ++e) key[size_t(e)] = s[size_t(e)] + (bias ? double(bias[e]) : 0.0);
  if (scores) *scores = s;
  return key;
}

// Capacity applied on the host to dropless ids/weights, as docs/moe-routing.md specifies: the
// check used when the GPU's dropless routing differs from the CPU's at a near-tie (the capacity
// logic is then compared on the GPU's own top-k).
Routed apply_capacity_host(const RouterConfig& c, int64_t tokens, Routed r) {
  const int64_t cap = expert_capacity(c, tokens);
  const int E = c.num_experts, k = c.topk;
  const int64_t entries = tokens * k;
  r.dropped = 0;
  auto drop = [&](int64_t i) {
    r.ids[size_t(i)] = -1;
    r.weights[size_t(i)] = 0.0f;
    ++r.dropped;
  };
  if (cap > 0) {
    std::vector<std::vector<int64_t>> per(static_cast<size_t>(E));
    for (int64_t i = 0; i < entries; ++i) per[size_t(r.ids[size_t(i)])].push_back(i);
    for (auto& list : per) {
      if (c.drop == DropPolicy::kByProbability)
        std::stable_sort(list.begin(), list.end(),
                         [&](int64_t a, int64_t b) { return r.weights[size_t(a)] > r.weights[size_t(b)]; });
      for (size_t i = size_t(cap); i < list.size(); ++i) drop(list[i]);
    }
  }
  r.tokens_per_expert.assign(size_t(E), 0);
  for (int32_t id : r.ids)
    if (id >= 0) ++r.tokens_per_expert[size_t(id)];
  return r;
}

// Invariants any router output must meet (independent of the reference).
void expect_consistent(const RouterConfig& c, int64_t tokens, const Routed& g) {
  const int E = c.num_experts, k = c.topk;
  const int64_t cap = expert_capacity(c, tokens);
  std::vector<int32_t> hist(size_t(E), 0);
  int64_t minus = 0;
  int bad = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int s = 0; s < k; ++s) {
      const int32_t id = g.ids[size_t(t * k + s)];
      const float w = g.weights[size_t(t * k + s)];
      if (id < -1 || id >= E || std::isnan(w) || (id == -1 && w != 0.0f)) {
        if (bad++ < 5) ADD_FAILURE() << "token " << t << " slot " << s << ": id " << id << " weight " << w;
        continue;
      }
      if (id == -1) {
        ++minus;
        continue;
      }
      ++hist[size_t(id)];
      for (int s2 = 0; s2 < s; ++s2)
        if (g.ids[size_t(t * k + s2)] == id && bad++ < 5)
          ADD_FAILURE() << "token " << t << " has expert " << id << " twice";
    }
  }
  expect_vec_eq(g.tokens_per_expert, hist, "tokens_per_expert vs the histogram of the returned ids");
  EXPECT_EQ(g.dropped, minus) << "dropped is not the number of -1 ids";
  if (cap > 0)
    for (int e = 0; e < E; ++e) EXPECT_LE(hist[size_t(e)], cap) << "expert " << e << " over capacity";
  else
    EXPECT_EQ(minus, 0) << "dropless routing dropped entries";
}

struct Agreement {
  int64_t near_tie_tokens = 0;   // tokens whose ids differ from the CPU's at a near-tie
  int64_t weight_bit_diffs = 0;  // entries (same id) whose fp32 weight is not bit-equal
  double max_weight_rel = 0;
  double max_tie_gap = 0;        // largest relative key gap among the near-ties
};

// GPU vs CPU routing of the same logits: ids exact or near-tie, weights close, stats exact when
// nothing differs.
Agreement compare_routing(const RouterConfig& c, int64_t tokens, const std::vector<float>& logits,
                          const std::vector<float>* bias, const RouterOutput& cpu, const Routed& g) {
  Agreement a;
  const int k = c.topk;
  int reported = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    bool same = true;
    for (int s = 0; s < k; ++s) same &= cpu.topk_ids[size_t(t * k + s)] == g.ids[size_t(t * k + s)];
    if (!same) {
      const std::vector<double> key =
          host_keys(c, logits.data() + t * c.num_experts, bias ? bias->data() : nullptr, nullptr);
      bool tie = true;
      for (int s = 0; s < k; ++s) {
        const int32_t ci = cpu.topk_ids[size_t(t * k + s)], gi = g.ids[size_t(t * k + s)];
        if (ci == gi) continue;
        if (ci < 0 || gi < 0 || gi >= c.num_experts) {
          tie = false;
          break;
        }
        const double kc = key[size_t(ci)], kg = key[size_t(gi)];
        const double gap = std::fabs(kc - kg) / std::max({std::fabs(kc), std::fabs(kg), 1e-300});
        a.max_tie_gap = std::max(a.max_tie_gap, gap);
        if (gap > kNearTieRel) tie = false;
      }
      if (tie) {
        ++a.near_tie_tokens;
      } else if (reported++ < 5) {
        std::string cs, gs;
        for (int s = 0; s < k; ++s) {
          cs += " " + std::to_string(cpu.topk_ids[size_t(t * k + s)]);
          gs += " " + std::to_string(g.ids[size_t(t * k + s)]);
        }
        ADD_FAILURE() << "token " << t << ": cpu ids" << cs << ", gpu ids" << gs << " (not a near-tie)";
      }
      continue;  // weights of a token with other experts are not comparable
    }
    for (int s = 0; s < k; ++s) {
      const float wc = cpu.topk_weights[size_t(t * k + s)], wg = g.weights[size_t(t * k + s)];
      if (wc == wg) continue;
      ++a.weight_bit_diffs;
      const double rel = std::fabs(double(wc) - double(wg)) / std::max({std::fabs(double(wc)), 1e-30});
      a.max_weight_rel = std::max(a.max_weight_rel, std::isnan(rel) ? 1e300 : rel);
      if (!(rel <= kWeightRel) && reported++ < 5)
        ADD_FAILURE() << "token " << t << " slot " << s << ": weight cpu " << wc << " gpu " << wg;
    }
  }
  if (a.near_tie_tokens == 0) {
    expect_vec_eq(g.tokens_per_expert, cpu.stats.tokens_per_expert, "tokens_per_expert vs the CPU's");
    EXPECT_EQ(g.dropped, cpu.stats.dropped) << "dropped differs from the CPU's";
  }
  return a;
}

void expect_same_routing(const Routed& want, const Routed& got, const char* what) {
  expect_vec_eq(got.ids, want.ids, std::string(what) + ": ids");
  expect_vec_eq(got.tokens_per_expert, want.tokens_per_expert, std::string(what) + ": tokens_per_expert");
  EXPECT_EQ(got.dropped, want.dropped) << what << ": dropped";
  expect_vec_eq(got.weights, want.weights, std::string(what) + ": weights (bit-equal)");
}

Routed from_cpu(const RouterOutput& o) {
  return Routed{o.topk_ids, o.topk_weights, o.stats.tokens_per_expert, o.stats.dropped};
}

// ---- the layout on the GPU vs make_layout -----------------------------------------------------

struct GpuLayout {
  std::vector<int32_t> indices, bin_ids, bins, tokens_per_expert;
  int32_t bad_entry = 0;
};

GpuLayout layout_on_gpu(const int32_t* d_ids, int64_t tokens, int k, int E, const int32_t* d_src, int local, int W) {
  const size_t entries = size_t(tokens * k);
  Dev<int32_t> indices(entries), bin_ids(entries), bins(static_cast<size_t>(E)), tpe(static_cast<size_t>(E)), bad(1);
  const size_t ws_bytes = layout_workspace_bytes(tokens, k, E, W);
  Dev<char> ws(ws_bytes);
  indices.poison();
  bin_ids.poison();
  bins.poison();
  tpe.poison();
  bad.poison();
  ws.poison(0xa5);
  Stream stream;
  make_layout_gpu(d_ids, tokens, k, E, d_src, local, W, indices.p, bin_ids.p, bins.p, tpe.p,
                  ws_bytes > 0 ? ws.p : nullptr, stream.s, bad.p);
  stream.sync();
  return GpuLayout{indices.download(), bin_ids.download(), bins.download(), tpe.download(), bad.download()[0]};
}

// The GPU layout equals make_layout exactly; rows past the row count are -1.
void expect_layout_matches(const std::vector<int32_t>& ids, const int32_t* d_ids, int64_t tokens, int k, int E,
                           const std::vector<int32_t>* src, const int32_t* d_src, int local, int W) {
  const Layout cpu = make_layout(ids.data(), tokens, k, E, src ? src->data() : nullptr, local, W);
  const GpuLayout g = layout_on_gpu(d_ids, tokens, k, E, d_src, local, W);
  const size_t rows = size_t(cpu.rows());
  ASSERT_EQ(g.indices.size(), size_t(tokens * k));
  expect_vec_eq(std::vector<int32_t>(g.indices.begin(), g.indices.begin() + long(rows)), cpu.indices, "layout indices");
  expect_vec_eq(std::vector<int32_t>(g.bin_ids.begin(), g.bin_ids.begin() + long(rows)), cpu.bin_ids, "layout bin_ids");
  expect_vec_eq(g.bins, cpu.bins, "layout bins");
  expect_vec_eq(g.tokens_per_expert, cpu.tokens_per_expert, "layout tokens_per_expert");
  EXPECT_EQ(g.bad_entry, -1) << "bad_entry for valid input";
  size_t tail_bad = 0;
  for (size_t r = rows; r < g.indices.size(); ++r) tail_bad += g.indices[r] != -1 || g.bin_ids[r] != -1;
  EXPECT_EQ(tail_bad, 0u) << "rows past the row count (" << rows << ") must be -1";
}

// ---- logits generators ------------------------------------------------------------------------

std::vector<float> normal_logits(std::mt19937_64& rng, int64_t tokens, int E, float sigma = 2.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(size_t(tokens * E));
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<float> random_bias(std::mt19937_64& rng, int E) {
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> b(static_cast<size_t>(E));
  for (float& x : b) x = u(rng);
  return b;
}

// Runs one (E, k, T, score, bias) case: dropless, by position (cf 1.0 and 1.25), by probability
// (cf 1.25), and the layouts of the results; prints one line.
void run_case(std::mt19937_64& rng, int E, int k, int64_t T, ScoreFn score, bool with_bias, bool normalize = true,
              std::vector<float> logits = {}) {
  if (logits.empty()) logits = normal_logits(rng, T, E);
  const std::vector<float> bias = with_bias ? random_bias(rng, E) : std::vector<float>{};
  Dev<float> d_logits(logits), d_bias(bias);
  const Dev<float>* bp = with_bias ? &d_bias : nullptr;
  const std::vector<float>* hbp = with_bias ? &bias : nullptr;

  const RouterConfig base = make_config(E, k, score, 0, DropPolicy::kByPosition, normalize);
  SCOPED_TRACE(config_name(base, T, with_bias));
  const RouterOutput cpu = route_logits_cpu(base, logits.data(), T, with_bias ? bias.data() : nullptr);
  const Routed gpu = route_on_gpu(base, d_logits, T, bp);
  expect_consistent(base, T, gpu);
  const Agreement a = compare_routing(base, T, logits, hbp, cpu, gpu);
  const bool exact = a.near_tie_tokens == 0 && a.weight_bit_diffs == 0;

  // The same call again: deterministic to the bit.
  {
    const Routed again = route_on_gpu(base, d_logits, T, bp);
    expect_same_routing(gpu, again, "second dropless run");
  }

  std::string capacity_note;
  const struct {
    double cf;
    DropPolicy drop;
  } caps[] = {{1.0, DropPolicy::kByPosition}, {1.25, DropPolicy::kByPosition}, {1.25, DropPolicy::kByProbability}};
  for (const auto& cp : caps) {
    RouterConfig c = base;
    c.capacity_factor = cp.cf;
    c.drop = cp.drop;
    SCOPED_TRACE(config_name(c, T, with_bias));
    const Routed g = route_on_gpu(c, d_logits, T, bp);
    expect_consistent(c, T, g);
    if (exact) {
      const RouterOutput cc = route_logits_cpu(c, logits.data(), T, with_bias ? bias.data() : nullptr);
      expect_same_routing(from_cpu(cc), g, "capacity vs route_logits_cpu");
    } else {
      // The dropless top-k differed at near-ties: check the capacity step on the GPU's own top-k.
      expect_same_routing(apply_capacity_host(c, T, gpu), g, "capacity vs host capacity on the GPU top-k");
      capacity_note = " (capacity checked on the GPU's top-k: near-ties)";
    }
    // Layouts of the capacity-dropped ids (with -1s), all ranks local.
    Dev<int32_t> d_ids(g.ids);
    expect_layout_matches(g.ids, d_ids.p, T, k, E, nullptr, nullptr, 0, 1);
  }

  // Layouts of the dropless ids with source ranks (all-gather order: rank r holds tokens
  // [r T/W, (r+1) T/W)), W = 4, local_rank 2 and 0; and random ranks with W = 8, local 5.
  Dev<int32_t> d_ids(gpu.ids);
  for (const int W : {4, 8}) {
    std::vector<int32_t> src(static_cast<size_t>(T));
    std::uniform_int_distribution<int> pick(0, W - 1);
    for (int64_t t = 0; t < T; ++t) src[size_t(t)] = W == 4 ? int32_t(t * W / std::max<int64_t>(T, 1)) : pick(rng);
    Dev<int32_t> d_src(src);
    for (const int local : {0, W == 4 ? 2 : 5}) {
      SCOPED_TRACE("layout W=" + std::to_string(W) + " local_rank=" + std::to_string(local));
      expect_layout_matches(gpu.ids, d_ids.p, T, k, E, &src, d_src.p, local, W);
    }
  }
  expect_layout_matches(gpu.ids, d_ids.p, T, k, E, nullptr, nullptr, 1, 2);  // null src, local_rank 1

  std::printf("[ case ] %-60s near-ties %lld (max gap %.1e), weight bit-diffs %lld (max rel %.1e)%s\n",
              config_name(base, T, with_bias).c_str(), (long long)a.near_tie_tokens, a.max_tie_gap,
              (long long)a.weight_bit_diffs, a.max_weight_rel, capacity_note.c_str());
}

// ---- tests ------------------------------------------------------------------------------------

TEST(MoeRouterGpu, MatchesCpuSweep) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::printf("seed %llu (replay: CCFUSE_TEST_SEED=%llu)\n", (unsigned long long)seed, (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  for (const int E : {8, 64, 128, 256})
    for (const int k : {1, 2, 8})
      for (const int64_t T : {int64_t(1), int64_t(1000), int64_t(16384)})
        for (const ScoreFn score : {ScoreFn::kSoftmax, ScoreFn::kSigmoid})
          for (const bool bias : {false, true}) {
            if (k > E) continue;
            run_case(rng, E, k, T, score, bias);
            if (::testing::Test::HasFatalFailure()) return;
          }
}

// Wide and odd expert counts (E not a multiple of 32, E = 1024, k > 32 keeps several winners per
// lane), unnormalised weights, E = 1, and T = 0.
TEST(MoeRouterGpu, ShapesAndOptions) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  run_case(rng, 1, 1, 100, ScoreFn::kSoftmax, false);
  run_case(rng, 1, 1, 100, ScoreFn::kSigmoid, true);
  run_case(rng, 33, 5, 700, ScoreFn::kSoftmax, true);
  run_case(rng, 200, 6, 999, ScoreFn::kSigmoid, false, /*normalize=*/false);
  run_case(rng, 256, 8, 4096, ScoreFn::kSoftmax, true, /*normalize=*/false);
  run_case(rng, 1000, 40, 300, ScoreFn::kSoftmax, true);
  run_case(rng, 1024, 64, 257, ScoreFn::kSigmoid, false);
  run_case(rng, 512, 512, 20, ScoreFn::kSoftmax, false);  // k = E: every expert, in key order
  run_case(rng, 96, 33, 500, ScoreFn::kSoftmax, true);
  // T = 0: stats are zeroed, nothing else is touched.
  for (const double cf : {0.0, 1.25}) {
    const RouterConfig c = make_config(64, 2, ScoreFn::kSoftmax, cf);
    Dev<float> none(0);
    const Routed g = route_on_gpu(c, none, 0, nullptr);
    EXPECT_EQ(g.tokens_per_expert, std::vector<int32_t>(64, 0));
    EXPECT_EQ(g.dropped, 0);
  }
}

// Exact ties: equal logits (a small pool of values), all logits equal, sigmoid saturating to 1.0
// and underflowing to 0 (weights 1/k with normalize): the lower expert id wins on both sides.
TEST(MoeRouterGpu, Ties) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (const int E : {8, 64, 256}) {
    const int64_t T = 2000;
    std::vector<float> pool_logits(size_t(T * E));
    const float pool[4] = {0.5f, -1.25f, 2.0f, 2.0f};
    std::uniform_int_distribution<int> pick(0, 3);
    for (float& v : pool_logits) v = pool[pick(rng)];
    for (const ScoreFn score : {ScoreFn::kSoftmax, ScoreFn::kSigmoid}) {
      run_case(rng, E, std::min(E, 8), T, score, false, true, pool_logits);
      run_case(rng, E, 2, T, score, true, true, pool_logits);
      run_case(rng, E, 3, T, score, false, true, std::vector<float>(size_t(T * E), 1.5f));
    }
    // Sigmoid saturation (scores exactly 1.0 above ~37) and underflow (0 below ~-745).
    std::vector<float> sat(size_t(T * E));
    std::uniform_real_distribution<float> hi(40.0f, 80.0f), lo(-900.0f, -750.0f);
    for (float& v : sat) v = hi(rng);
    run_case(rng, E, std::min(E, 8), T, ScoreFn::kSigmoid, false, true, sat);
    for (float& v : sat) v = lo(rng);
    run_case(rng, E, std::min(E, 8), T, ScoreFn::kSigmoid, false, true, sat);
  }
}

// Every token's best expert is expert 3 (and for k = 2 the second is expert 5): capacity drops
// the later tokens (by position) or the lower weights (by probability).
TEST(MoeRouterGpu, AllTokensToOneExpert) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (const int E : {8, 64, 256})
    for (const int k : {1, 2}) {
      const int64_t T = 5000;
      std::vector<float> logits = normal_logits(rng, T, E, 0.5f);
      std::uniform_real_distribution<float> boost(6.0f, 9.0f);
      for (int64_t t = 0; t < T; ++t) {
        logits[size_t(t * E + 3)] = boost(rng) + 10.0f;
        logits[size_t(t * E + 5)] = boost(rng);
      }
      for (const ScoreFn score : {ScoreFn::kSoftmax, ScoreFn::kSigmoid}) run_case(rng, E, k, T, score, false, true, logits);
    }
}

// router_logits_gpu equals router_logits_cpu bit for bit, with and without jitter.
TEST(MoeRouterGpu, LogitsFromXBitExact) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (const float eps : {0.0f, 0.01f, 0.3f}) {
    const int64_t T = 300, H = 777;
    const int E = 72;
    RouterConfig c = make_config(E, 4, ScoreFn::kSoftmax);
    c.jitter_eps = eps;
    c.jitter_seed = rng();
    const std::vector<float> x = normal_logits(rng, T, int(H), 1.0f), w = normal_logits(rng, H, E, 0.05f);
    Dev<float> dx(x), dw(w), dl(size_t(T * E));
    dl.poison(0xff);
    Stream s;
    router_logits_gpu(c, dx.p, dw.p, T, H, dl.p, s.s);
    s.sync();
    const std::vector<float> want = router_logits_cpu(c, x.data(), w.data(), T, H);
    const std::vector<float> got = dl.download();
    size_t diffs = 0;
    for (size_t i = 0; i < want.size(); ++i) diffs += std::memcmp(&want[i], &got[i], 4) != 0;
    EXPECT_EQ(diffs, 0u) << "jitter_eps " << eps << ": logits not bit-equal to router_logits_cpu";
    // And the full route_cpu equals route_gpu on those logits (modulo near-ties, checked above).
    const RouterOutput cpu = route_cpu(c, x.data(), w.data(), T, H, nullptr);
    const Routed g = route_on_gpu(c, dl, T, nullptr);
    compare_routing(c, T, want, nullptr, cpu, g);
  }
}

// Bad configs throw before anything runs, with the CPU's messages.
TEST(MoeRouterGpu, BadInputMessages) {
  CCFUSE_REQUIRE_GPUS(1);
  std::vector<RouterConfig> bad;
  bad.push_back(make_config(0, 1, ScoreFn::kSoftmax));
  bad.push_back(make_config(8, 0, ScoreFn::kSoftmax));
  bad.push_back(make_config(8, 9, ScoreFn::kSoftmax));
  {
    RouterConfig c = make_config(8, 2, ScoreFn::kSoftmax);
    c.world_size = 0;
    bad.push_back(c);
    c.world_size = 3;
    bad.push_back(c);
  }
  bad.push_back(make_config(8, 2, ScoreFn::kSoftmax, -1));
  bad.push_back(make_config(8, 2, ScoreFn::kSoftmax, std::numeric_limits<double>::quiet_NaN()));
  bad.push_back(make_config(8, 2, ScoreFn::kSoftmax, std::numeric_limits<double>::infinity()));
  {
    RouterConfig c = make_config(8, 2, ScoreFn::kSoftmax);
    c.jitter_eps = 1.5f;
    bad.push_back(c);
  }
  Dev<float> logits(16 * 8), w(16);
  Dev<int32_t> ids(64), tpe(8);
  Dev<int64_t> dropped(1);
  for (const RouterConfig& c : bad) {
    const std::string want = arg_error([&] { validate(c); });
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(arg_error([&] { route_gpu(c, logits.p, 4, nullptr, ids.p, w.p, tpe.p, dropped.p, nullptr, nullptr); }),
              want);
    EXPECT_EQ(arg_error([&] { router_workspace_bytes(c, 4); }), want);
  }
  const RouterConfig ok = make_config(8, 2, ScoreFn::kSoftmax);
  EXPECT_EQ(arg_error([&] { route_gpu(ok, logits.p, -1, nullptr, ids.p, w.p, tpe.p, dropped.p, nullptr, nullptr); }),
            "num_tokens -1 must be >= 0");
  EXPECT_EQ(arg_error([&] { router_workspace_bytes(make_config(2048, 2, ScoreFn::kSoftmax), 4); }),
            "num_experts 2048 exceeds the GPU router's limit of 1024");
  EXPECT_EQ(arg_error([&] { route_gpu(ok, nullptr, 4, nullptr, ids.p, w.p, tpe.p, dropped.p, nullptr, nullptr); }),
            "logits must not be null");
  const RouterConfig capped = make_config(8, 2, ScoreFn::kSoftmax, 1.0);
  EXPECT_NE(arg_error([&] { route_gpu(capped, logits.p, 16, nullptr, ids.p, w.p, tpe.p, dropped.p, nullptr, nullptr); })
                .find("workspace must not be null"),
            std::string::npos);
  RouterConfig jit = ok;
  jit.jitter_eps = 1.5f;
  EXPECT_EQ(arg_error([&] { router_logits_gpu(jit, logits.p, logits.p, 4, 2, logits.p, nullptr); }),
            "jitter_eps 1.5 must be in [0, 1)");
  EXPECT_EQ(arg_error([&] { router_logits_gpu(ok, logits.p, logits.p, 4, 0, logits.p, nullptr); }),
            "hidden 0 must be at least 1");
}

// Layouts of arbitrary id arrays (-1s, ids of every range, duplicates in one token, which
// make_layout accepts) against make_layout; edge cases; bad input.
TEST(MoeLayoutGpu, MatchesCpu) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (const int E : {1, 8, 64, 256, 1000})
    for (const int k : {1, 2, 8})
      for (const int64_t T : {int64_t(0), int64_t(1), int64_t(1000), int64_t(16384)})
        for (const int W : {1, 2, 8})
          for (const double drop_rate : {0.0, 0.3, 1.0}) {
            SCOPED_TRACE("E=" + std::to_string(E) + " k=" + std::to_string(k) + " T=" + std::to_string(T) +
                         " W=" + std::to_string(W) + " drop=" + std::to_string(drop_rate));
            std::vector<int32_t> ids(size_t(T * k)), src(static_cast<size_t>(T));
            std::uniform_int_distribution<int> expert(0, E - 1), rank(0, W - 1);
            std::bernoulli_distribution dropped(drop_rate);
            for (int32_t& id : ids) id = dropped(rng) ? -1 : expert(rng);
            for (int32_t& r : src) r = rank(rng);
            Dev<int32_t> d_ids(ids), d_src(src);
            const int local = int(rng() % unsigned(W));
            expect_layout_matches(ids, d_ids.p, T, k, E, &src, d_src.p, local, W);
            expect_layout_matches(ids, d_ids.p, T, k, E, nullptr, nullptr, local, W);
            ++cases;
            if (::testing::Test::HasFatalFailure()) return;
          }
  std::printf("[ layout ] %d random cases equal to make_layout (with and without token_src_rank)\n", cases);
}

TEST(MoeLayoutGpu, BadInput) {
  CCFUSE_REQUIRE_GPUS(1);
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  Dev<int32_t> d(ids), out(8), out2(8), bins(8), tpe(8);
  // Host-checkable arguments: the CPU's messages.
  struct Args {
    int64_t T;
    int k, E, local, W;
  };
  for (const Args a : {Args{4, 0, 8, 0, 1}, Args{4, 2, 0, 0, 1}, Args{4, 2, 8, 0, 0}, Args{4, 2, 8, 2, 2},
                       Args{4, 2, 8, -1, 2}, Args{-1, 2, 8, 0, 1}, Args{int64_t(1) << 31, 2, 8, 0, 1}}) {
    const std::string want = arg_error([&] { make_layout(ids.data(), a.T, a.k, a.E, nullptr, a.local, a.W); });
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(arg_error([&] {
                make_layout_gpu(d.p, a.T, a.k, a.E, nullptr, a.local, a.W, out.p, out2.p, bins.p, tpe.p, nullptr,
                                nullptr);
              }),
              want);
  }
  // Device data the CPU rejects: the GPU reports the lowest bad entry and leaves it out.
  {
    const std::vector<int32_t> bad_ids = {0, 1, 2, -1, 12, 3, -2, 4};  // entries 4 (12 >= 8) and 6 (-2)
    Dev<int32_t> db(bad_ids);
    EXPECT_NE(arg_error([&] { make_layout(bad_ids.data(), 4, 2, 8, nullptr, 0, 1); }), "");
    const GpuLayout g = layout_on_gpu(db.p, 4, 2, 8, nullptr, 0, 1);
    EXPECT_EQ(g.bad_entry, 4);
    EXPECT_EQ(g.bins.back(), 5) << "rows: the 5 valid entries";
    const std::vector<int32_t> src = {0, 1, 3, 0};  // token 2's rank 3 >= W = 2: entries 4, 5
    Dev<int32_t> ds(src);
    EXPECT_NE(arg_error([&] { make_layout(ids.data(), 4, 2, 8, src.data(), 0, 2); }), "");
    EXPECT_EQ(layout_on_gpu(d.p, 4, 2, 8, ds.p, 0, 2).bad_entry, 4);
  }
}

}  // namespace
}  // namespace ccfuse::moe
