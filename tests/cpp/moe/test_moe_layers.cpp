// The two MoE layers of the CPU reference world (reference/moe_layers.h) against the fp64
// reference of moe_naive.h: layer 0's activations row by row (matched through the metadata),
// the metadata itself (every kept entry exactly once, on its expert's rank, in layout order),
// and layer 1's output.
//
// Inputs are fresh random numbers on every run; the seed is printed with every failure
// (SCOPED_TRACE) and can be fixed with CCFUSE_TEST_SEED=<n> to replay one.
//
// Tolerance (‖out − ref‖ / ‖ref‖): the reference is fp64 from the rounded inputs and does not
// round act between the layers; the layers do (to T, as the GPU will). bf16: that rounding and
// the output's are ~2^-9 relative each, bound 1e-2. fp32: ~6e-8 each plus fp32 accumulation over
// H, F <= 48 terms, bound 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/moe_layers.h"
#include "reference/moe_naive.h"
#include "reference/naive.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::ref {
namespace {

using namespace ccfuse::testing;

enum class Routing { kUniform, kZipf, kAllToExpert0, kSomeEmpty, kRaggedTokens, kDrops };

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kZipf: return "zipf";
    case Routing::kAllToExpert0: return "all_to_expert0";
    case Routing::kSomeEmpty: return "some_empty";
    case Routing::kRaggedTokens: return "ragged_tokens";
    case Routing::kDrops: return "drops";
  }
  return "?";
}

const char* mode_name(DispatchMode m) { return m == DispatchMode::kAllGather ? "allgather" : "alltoall"; }


// Experts per world size: E % W == 0, E >= 8 (top-8 everywhere), E <= 16.
int experts_for(int world_size) {
  switch (world_size) {
    case 3: return 9;
    case 4:
    case 8: return 16;
    default: return 8;
  }
}



template <typename T>
std::vector<double> to_double(const T* v, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = to_f32(v[i]);
  return out;
}

template <typename T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

// k distinct experts drawn without replacement with probabilities ∝ `weight` (0 = never).
std::vector<int32_t> draw_experts(std::mt19937_64& rng, std::vector<double> weight, int k) {
  std::vector<int32_t> out;
  for (int s = 0; s < k; ++s) {
    std::discrete_distribution<int> dist(weight.begin(), weight.end());
    const int e = dist(rng);
    out.push_back(e);
    weight[size_t(e)] = 0.0;
  }
  return out;
}

// Routing of one rank's tokens: ids [T, k], weights [T, k] (positive, summing to 1 per token
// over its kept slots, as a normalising router gives; 0 where dropped).
void make_routing(std::mt19937_64& rng, Routing routing, int world_size, int num_experts, int k, int64_t tokens,
                  std::vector<int32_t>& ids, std::vector<float>& weights) {
  ids.assign(size_t(tokens * k), -1);
  weights.assign(size_t(tokens * k), 0.0f);
  std::vector<double> base(size_t(num_experts), 1.0);
  if (routing == Routing::kZipf)
    for (int e = 0; e < num_experts; ++e) base[size_t(e)] = 1.0 / std::pow(double(e + 1), 1.2);
  if (routing == Routing::kSomeEmpty) {
    // Every third expert and (W > 1) all experts of the last rank get nothing, if enough
    // experts remain for k distinct choices.
    std::vector<double> restricted = base;
    const int e_local = num_experts / world_size;
    for (int e = 0; e < num_experts; ++e)
      if (e % 3 == 1 || (world_size > 1 && e / e_local == world_size - 1)) restricted[size_t(e)] = 0.0;
    if (std::count_if(restricted.begin(), restricted.end(), [](double w) { return w > 0; }) >= k) base = restricted;
  }
  std::uniform_real_distribution<float> wdist(0.05f, 1.0f);
  std::bernoulli_distribution drop(0.1);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> chosen;
    if (routing == Routing::kAllToExpert0) {
      std::vector<double> rest = base;
      rest[0] = 0.0;
      chosen = draw_experts(rng, rest, k - 1);
      chosen.insert(chosen.begin(), 0);
    } else {
      chosen = draw_experts(rng, base, k);
    }
    float total = 0.0f;
    std::vector<float> w(static_cast<size_t>(k));
    for (int s = 0; s < k; ++s) total += (w[size_t(s)] = wdist(rng));
    for (int s = 0; s < k; ++s) {
      ids[size_t(t * k + s)] = chosen[size_t(s)];
      weights[size_t(t * k + s)] = w[size_t(s)] / total;
    }
    if (routing == Routing::kDrops) {
      // Token 0 loses every slot (its output must be exactly 0); the rest lose ~10%.
      for (int s = 0; s < k; ++s)
        if (t == 0 || drop(rng)) ids[size_t(t * k + s)] = -1, weights[size_t(t * k + s)] = 0.0f;
    }
  }
}

struct MoeCase {
  DispatchMode mode;
  int world_size;
  DType dtype;
  Routing routing;
  int topk;
  bool swiglu;
};

void PrintTo(const MoeCase& c, std::ostream* os) {
  *os << mode_name(c.mode) << " W=" << c.world_size << " " << dtype_name(c.dtype) << " "
      << routing_name(c.routing) << " top" << c.topk << (c.swiglu ? " swiglu" : "");
}

constexpr int64_t kMaxTokens = 24;
constexpr int64_t kHidden = 40;
constexpr int64_t kFfn = 24;

// One call's inputs and outputs, all ranks.
template <typename T>
struct CallData {
  std::vector<int64_t> tokens;  // [W]
  std::vector<std::vector<T>> x, w1, w2, act, out;
  std::vector<std::vector<T>> out_again;  // determinism test: layer 1 run a second time, back to back
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> weights;
  std::vector<MoeMetadata> meta;
  std::vector<MoeRankInputs> exact;
};

template <typename T>
CallData<T> make_call(std::mt19937_64& rng, const MoeCase& c, const MoeShape& shape, int call) {
  const int w = c.world_size;
  const int e_local = shape.num_experts / w;
  const int64_t f_in = shape.swiglu ? 2 * shape.ffn : shape.ffn;
  CallData<T> d;
  d.tokens.resize(size_t(w));
  std::uniform_int_distribution<int64_t> full(kMaxTokens / 2, kMaxTokens);
  std::uniform_int_distribution<int64_t> any(0, kMaxTokens);
  for (int r = 0; r < w; ++r) d.tokens[size_t(r)] = c.routing == Routing::kRaggedTokens ? any(rng) : full(rng);
  if (c.routing == Routing::kRaggedTokens) d.tokens[size_t(call == 0 ? w - 1 : 0)] = 0;  // a rank with no tokens
  d.x.resize(size_t(w)), d.w1.resize(size_t(w)), d.w2.resize(size_t(w)), d.ids.resize(size_t(w));
  d.weights.resize(size_t(w)), d.exact.resize(size_t(w));
  for (int r = 0; r < w; ++r) {
    const size_t ri = size_t(r);
    MoeRankInputs& ex = d.exact[ri];
    ex.num_tokens = d.tokens[ri];
    d.x[ri] = random_values<T>(rng, ex.num_tokens * shape.hidden, ex.x);
    d.w1[ri] = random_values<T>(rng, e_local * shape.hidden * f_in, ex.w1);
    d.w2[ri] = random_values<T>(rng, e_local * shape.ffn * shape.hidden, ex.w2);
    make_routing(rng, c.routing, w, shape.num_experts, c.topk, ex.num_tokens, d.ids[ri], d.weights[ri]);
    ex.topk_ids = d.ids[ri];
    ex.topk_weights.assign(d.weights[ri].begin(), d.weights[ri].end());
  }
  // Poison: every output element must be written. act is resized by layer 0, so it starts
  // larger than any layout and NaN; out starts NaN.
  const int64_t max_rows = int64_t(w) * kMaxTokens * c.topk;
  d.act.assign(size_t(w), std::vector<T>(size_t(max_rows * shape.ffn), poison<T>()));
  d.out.resize(size_t(w));
  for (int r = 0; r < w; ++r) d.out[size_t(r)].assign(size_t(d.tokens[size_t(r)] * shape.hidden), poison<T>());
  d.out_again = d.out;
  // Junk metadata: layer 0 must replace all of it.
  MoeMetadata junk;
  junk.row_src_rank = {7, 7, 7};
  junk.recv_offsets = {5};
  junk.num_tokens = 99;
  d.meta.assign(size_t(w), junk);
  return d;
}

// The metadata of every rank: each kept entry (src, token, slot) exactly once, on the rank that
// owns its expert, with its router weight; rows sorted by expert, inside an expert by source
// rank rotated from the local rank (local first), then by token.
template <typename T>
void check_metadata(const MoeCase& c, const MoeShape& shape, const CallData<T>& d) {
  const int w = c.world_size, k = c.topk;
  const int e_local = shape.num_experts / w;
  std::vector<std::vector<int>> seen(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) seen[size_t(r)].assign(size_t(d.tokens[size_t(r)] * k), 0);
  for (int r = 0; r < w; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const MoeMetadata& m = d.meta[size_t(r)];
    const int64_t rows = m.layout.rows();
    ASSERT_EQ(m.num_tokens, d.tokens[size_t(r)]);
    ASSERT_EQ(m.topk, k);
    ASSERT_EQ(int64_t(m.row_src_rank.size()), rows);
    ASSERT_EQ(int64_t(m.row_src_token.size()), rows);
    ASSERT_EQ(int64_t(m.row_slot.size()), rows);
    ASSERT_EQ(int64_t(m.row_weight.size()), rows);
    ASSERT_EQ(int64_t(m.layout.bins.size()), e_local);
    ASSERT_EQ(m.recv_offsets.size(), size_t(w) + 1);
    // What was received from each source: all its tokens (all-gather) or exactly those with an
    // expert here, each once (all-to-all).
    for (int src = 0; src < w; ++src) {
      std::vector<int32_t> want;
      for (int64_t t = 0; t < d.tokens[size_t(src)]; ++t) {
        bool here = c.mode == DispatchMode::kAllGather;
        for (int s = 0; s < k; ++s) {
          const int32_t id = d.ids[size_t(src)][size_t(t * k + s)];
          here = here || (id >= 0 && id / e_local == r);
        }
        if (here) want.push_back(int32_t(t));
      }
      const std::vector<int32_t> got(m.recv_token.begin() + m.recv_offsets[size_t(src)],
                                     m.recv_token.begin() + m.recv_offsets[size_t(src) + 1]);
      EXPECT_EQ(got, want) << "tokens received from rank " << src;
    }
    int prev_e = -1, prev_rot = -1;
    int32_t prev_tok = -1;
    for (int64_t i = 0; i < rows; ++i) {
      const int src = m.row_src_rank[size_t(i)];
      const int32_t tok = m.row_src_token[size_t(i)];
      const int slot = m.row_slot[size_t(i)];
      const int e = m.layout.bin_ids[size_t(i)];
      ASSERT_TRUE(src >= 0 && src < w && tok >= 0 && tok < d.tokens[size_t(src)] && slot >= 0 && slot < k)
          << "row " << i;
      ASSERT_TRUE(e >= 0 && e < e_local) << "row " << i;
      const size_t entry = size_t(tok) * size_t(k) + size_t(slot);
      EXPECT_EQ(d.ids[size_t(src)][entry], r * e_local + e) << "row " << i;
      EXPECT_EQ(m.row_weight[size_t(i)], d.weights[size_t(src)][entry]) << "row " << i;
      ++seen[size_t(src)][entry];
      const int rot = (src - r + w) % w;
      const bool ordered = e > prev_e || (e == prev_e && (rot > prev_rot || (rot == prev_rot && tok >= prev_tok)));
      EXPECT_TRUE(ordered) << "row " << i << " out of layout order";
      prev_e = e, prev_rot = rot, prev_tok = tok;
    }
    EXPECT_EQ(m.layout.bins.empty() ? 0 : int64_t(m.layout.bins.back()), rows);
  }
  for (int src = 0; src < w; ++src)
    for (size_t entry = 0; entry < seen[size_t(src)].size(); ++entry) {
      const bool kept = d.ids[size_t(src)][entry] >= 0;
      EXPECT_EQ(seen[size_t(src)][entry], kept ? 1 : 0) << "entry " << entry << " of rank " << src;
    }
}

template <typename T>
void check_layers(const MoeCase& c, int calls_with_same_inputs = 0) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: CCFUSE_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);

  const int w = c.world_size;
  MoeShape shape;
  shape.max_tokens_per_rank = kMaxTokens;
  shape.hidden = kHidden;
  shape.ffn = kFfn;
  shape.num_experts = experts_for(w);
  shape.topk = c.topk;
  shape.swiglu = c.swiglu;
  // Small tiles so that chunks straddle tiles and the last slice is partial (40 = 16 + 16 + 8);
  // the Zipf cases use the default tiling (one chunk, one tile, one slice).
  MoeConfig config{5, 8, 16};
  if (c.routing == Routing::kZipf) config = MoeConfig{};

  World world(WorldOptions{w, 20000});
  MoeLayer0<T> layer0(world, shape, c.mode, config);
  MoeLayer1<T> layer1(world, shape, c.mode, config);

  // Two calls with fresh inputs back to back in one World::run (epochs, entry barriers); or,
  // for the determinism check, the same inputs several times.
  const bool same_inputs = calls_with_same_inputs > 0;
  const int num_calls = same_inputs ? calls_with_same_inputs : 2;
  std::vector<CallData<T>> calls;
  for (int call = 0; call < num_calls; ++call) {
    if (same_inputs && call > 0) {
      calls.push_back(calls[0]);
      for (auto& o : calls.back().out) std::fill(o.begin(), o.end(), poison<T>());
      for (auto& o : calls.back().out_again) std::fill(o.begin(), o.end(), poison<T>());
    } else {
      calls.push_back(make_call<T>(rng, c, shape, call));
    }
  }

  world.run([&](int rank) {
    const size_t r = size_t(rank);
    for (CallData<T>& d : calls) {
      layer0.run(rank, d.x[r].data(), d.tokens[r], d.ids[r].data(), d.weights[r].data(), d.w1[r].data(), d.act[r],
                 d.meta[r]);
      layer1.run(rank, d.act[r], d.meta[r], d.w2[r].data(), d.tokens[r], d.out[r].data());
      // Layer 1 again on the same rows with nothing in between (a recompute): only its own
      // entry barrier keeps this call's pushes off the partials the owners still reduce.
      if (same_inputs) layer1.run(rank, d.act[r], d.meta[r], d.w2[r].data(), d.tokens[r], d.out_again[r].data());
    }
  });

  for (int call = 0; call < num_calls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const CallData<T>& d = calls[size_t(call)];
    check_metadata(c, shape, d);
    const MoeNaiveOutput ref = naive_moe(d.exact, shape);
    for (int r = 0; r < w; ++r) {
      const size_t ri = size_t(r);
      const MoeMetadata& m = d.meta[ri];
      const int64_t rows = m.layout.rows();
      ASSERT_EQ(int64_t(d.act[ri].size()), rows * shape.ffn) << "rank " << r;
      // Layer 0: each row against the reference activation of its (source, token, slot).
      std::vector<double> want;
      want.reserve(size_t(rows * shape.ffn));
      for (int64_t i = 0; i < rows; ++i) {
        const size_t src = size_t(m.row_src_rank[size_t(i)]);
        const int64_t entry = int64_t(m.row_src_token[size_t(i)]) * c.topk + m.row_slot[size_t(i)];
        const double* a = ref.act[src].data() + entry * shape.ffn;
        want.insert(want.end(), a, a + shape.ffn);
      }
      EXPECT_LE(rel_err(to_double(d.act[ri].data(), d.act[ri].size()), want), tolerance<T>())
          << "layer 0 rank " << r;
      // Layer 1: the combined output.
      EXPECT_LE(rel_err(to_double(d.out[ri].data(), d.out[ri].size()), ref.out[ri]), tolerance<T>())
          << "layer 1 rank " << r;
      // A token whose every slot was dropped gets exactly 0.
      for (int64_t t = 0; t < d.tokens[ri]; ++t) {
        bool any = false;
        for (int s = 0; s < c.topk; ++s) any = any || d.ids[ri][size_t(t * c.topk + s)] >= 0;
        if (any) continue;
        for (int64_t j = 0; j < shape.hidden; ++j) {
          ASSERT_EQ(to_f32(d.out[ri][size_t(t * shape.hidden + j)]), 0.0f) << "rank " << r << " token " << t;
        }
      }
    }
    if (same_inputs) {
      // Fixed reduction order: the same inputs give the same bits, whatever the thread timing.
      for (int r = 0; r < w; ++r) {
        const auto& a = calls[0].out[size_t(r)];
        EXPECT_EQ(0, std::memcmp(a.data(), d.out[size_t(r)].data(), a.size() * sizeof(T))) << "rank " << r;
        EXPECT_EQ(0, std::memcmp(a.data(), d.out_again[size_t(r)].data(), a.size() * sizeof(T))) << "rank " << r;
      }
    }
  }
}

class MoeLayers : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeLayers, MatchesFp64ReferenceTwiceInARow) {
  const MoeCase& c = GetParam();
  if (c.dtype == DType::kFloat32)
    check_layers<float>(c);
  else
    check_layers<bf16>(c);
}

// The cross product mode × W × routing × topk runs in full; dtype and SwiGLU alternate so that
// every (mode, W, routing) sees both dtypes and both activations across its topk values.
std::vector<MoeCase> all_cases() {
  std::vector<MoeCase> cases;
  const Routing routings[] = {Routing::kUniform,   Routing::kZipf,         Routing::kAllToExpert0,
                              Routing::kSomeEmpty, Routing::kRaggedTokens, Routing::kDrops};
  for (DispatchMode mode : {DispatchMode::kAllGather, DispatchMode::kAllToAll})
    for (int w : {1, 2, 3, 4, 8})
      for (int ri = 0; ri < int(std::size(routings)); ++ri)
        for (int ki = 0; ki < 3; ++ki) {
          const int topk = ki == 0 ? 1 : ki == 1 ? 2 : 8;
          const DType dtype = (ri + ki + w) % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
          const bool swiglu = (ri + ki + int(mode == DispatchMode::kAllToAll)) % 2 == 1;
          cases.push_back({mode, w, dtype, routings[ri], topk, swiglu});
        }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<MoeCase>& info) {
  const MoeCase& c = info.param;
  return std::string(mode_name(c.mode)) + "_W" + std::to_string(c.world_size) + "_" + dtype_name(c.dtype) + "_" +
         routing_name(c.routing) + "_top" + std::to_string(c.topk) + (c.swiglu ? "_swiglu" : "");
}

INSTANTIATE_TEST_SUITE_P(All, MoeLayers, ::testing::ValuesIn(all_cases()), case_name);

// Same inputs three times in a row on one World: bit-identical outputs (the owner sums the W
// sources in fixed order, whatever order they arrived in).
class MoeLayersDeterministic : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeLayersDeterministic, SameInputsSameBits) {
  const MoeCase& c = GetParam();
  if (c.dtype == DType::kFloat32)
    check_layers<float>(c, 3);
  else
    check_layers<bf16>(c, 3);
}

INSTANTIATE_TEST_SUITE_P(All, MoeLayersDeterministic,
                         ::testing::Values(MoeCase{DispatchMode::kAllGather, 3, DType::kBFloat16, Routing::kUniform, 2, true},
                                           MoeCase{DispatchMode::kAllToAll, 3, DType::kBFloat16, Routing::kUniform, 2, true},
                                           MoeCase{DispatchMode::kAllGather, 8, DType::kFloat32, Routing::kDrops, 8, false},
                                           MoeCase{DispatchMode::kAllToAll, 8, DType::kFloat32, Routing::kDrops, 8, false}),
                         case_name);

}  // namespace
}  // namespace ccfuse::ref
