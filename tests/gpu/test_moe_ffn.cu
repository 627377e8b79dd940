// The expert-parallel MoE FFN (ccfuse/moe/moe_ffn.h) on all local GPUs (>= 2; skipped otherwise)
// against the fp64 reference ref::naive_moe, built on the host from exactly the bf16 values that
// are uploaded (fresh seed per run, printed). Routing patterns: uniform, Zipf-skewed, one hot
// expert, idle experts, uneven / empty ranks, dropped slots and fully dropped tokens, top-1 to
// top-8, SwiGLU on / off, kKN / kNK weights. Besides out, the test checks expert_rows_device()
// and the layer-0 rows (layer0_output() in dispatch_plan.h's receive order), that 20 calls back
// to back (alternating with a different routing) and CUDA-graph replays reproduce the first
// result bit for bit, and that run_layer0 + run_layer1 == run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/dtype.h"
#include "ccfuse/common/error.h"
#include "ccfuse/moe/dispatch_plan.h"
#include "ccfuse/moe/moe_ffn.h"
#include "gpu_test_util.h"
#include "reference/moe_naive.h"
#include "reference/naive.h"

namespace ccfuse::moe {
namespace {

using ccfuse::testing::rank_count;
using ccfuse::testing::rank_devices;

// ---- device memory helpers -----------------------------------------------------------------
struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevPtr = std::unique_ptr<void, CudaFree>;

DevPtr dev_alloc(size_t bytes) {  // at least 256 bytes: a rank with 0 tokens still gets valid pointers
  void* p = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return DevPtr(p);
}
template <typename T>
DevPtr upload(const std::vector<T>& v) {
  DevPtr d = dev_alloc(v.size() * sizeof(T));
  if (!v.empty()) CCFUSE_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
T* as(const DevPtr& p) {
  return static_cast<T*>(p.get());
}
template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) CCFUSE_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
std::vector<double> to_doubles(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16{bits[i]}.to_float();
  return v;
}

// ---- test cases ----------------------------------------------------------------------------
enum class Route {
  kUniform,      // k distinct experts, uniformly
  kZipf,         // k distinct experts, expert i with probability ~ 1 / (i + 1)^1.2
  kFirstExpert,  // slot 0 is expert 0 for every token, other slots distinct uniform others
  kEvenOnly,     // k distinct even experts: every odd expert receives no rows
};

struct Case {
  std::string name;
  int64_t hidden, ffn;
  int experts, topk;
  bool swiglu;
  gemm::BLayout layout;
  Route route;
  std::vector<int64_t> tokens;  // T_r = tokens[r % size]
  int64_t max_tokens = 0;       // 0: the largest T_r
  double drop_slot = 0;         // probability that a slot is -1
  double drop_token = 0;        // probability that all of a token's slots are -1
  int num_sms = 0;
  MoeCombine combine = MoeCombine::kPerSlot;  // the per-slot cases name it; presum_* the other
  bool interleave_sends = false;
  MoeDispatch dispatch = MoeDispatch::kAllToAll;
  bool gather_rows = false;  // MoeFfnConfig::gather_rows (all-gather only)
  bool tma_store = true;  // MoeFfnConfig::tma_store
  int presum_ctas = 0;    // MoeFfnConfig::presum_ctas
  int local_first = -1;  // MoeFfnConfig::local_first
  int striped = -1;      // MoeFfnConfig::striped_dispatch (-1: auto, by units at these row sizes)
  int stripe_rows = 4;   // MoeFfnConfig::stripe_rows
  int bulk = -1;         // MoeFfnConfig::bulk_dispatch (-1: auto, through registers)
  int prep_one = -1;     // MoeFfnConfig::prep_one (-1: auto, the chunk kernels unless env says)
  int dispatch_spread_us = 0;  // MoeFfnConfig::dispatch_spread_us
  int l1_pingpong = -1;        // MoeFfnConfig::l1_pingpong (-1: by H, ping-pong from 4096)
  bool always_combine = false;  // MoeFfnConfig::always_combine (the combine kernel at W = 1 too)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The largest world size <= min(GPUs, kMaxMoeRanks) that divides E (0: none >= 2). With one GPU,
// 1: the layers without a peer (every row local; the GEMMs, layouts, pre-sum and combine are the
// same kernels), so that a one-GPU machine checks them too.
int world_for(int experts) {
  for (int w = std::min(rank_count(), kMaxMoeRanks); w >= 2; --w)
    if (experts % w == 0) return w;
  return rank_count() == 1 ? 1 : 0;
}

// One rank's uploads and what the test expects of it.
struct RankData {
  int64_t tokens = 0;
  std::vector<uint16_t> x;              // [T, H] bf16 bits
  std::vector<int32_t> ids, decoy_ids;  // [T, k]; decoy: another routing for the interleaved calls
  std::vector<float> weights;           // [T, k] bf16-representable
  std::vector<uint16_t> w1, w2;         // in the uploaded layout (SwiGLU-permuted, maybe transposed)
  std::vector<double> out;              // [T, H] fp64 reference
  std::vector<double> act;              // [rows received, F]: the reference layer-0 rows, receive order
  std::vector<int32_t> expert_rows;     // [E_local] rows received per local expert
};

// k routed expert ids of one token (distinct, following the case's pattern), before drops.
std::vector<int32_t> route_token(const Case& c, std::mt19937_64& gen) {
  std::vector<double> p(size_t(c.experts), 1.0);
  for (int e = 0; e < c.experts; ++e) {
    if (c.route == Route::kZipf) p[size_t(e)] = 1.0 / std::pow(double(e + 1), 1.2);
    if (c.route == Route::kEvenOnly && e % 2 == 1) p[size_t(e)] = 0;
  }
  std::vector<int32_t> ids;
  if (c.route == Route::kFirstExpert) {
    ids.push_back(0);
    p[0] = 0;
  }
  while (int(ids.size()) < c.topk) {
    std::discrete_distribution<int> pick(p.begin(), p.end());
    const int e = pick(gen);
    p[size_t(e)] = 0;
    ids.push_back(e);
  }
  return ids;
}

// Every rank's inputs (bf16-rounded), the fp64 reference and the expected receive-side state.
std::vector<RankData> make_problem(const Case& c, int w, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> sym(-1.f, 1.f), unit(0.f, 1.f);
  std::bernoulli_distribution drop_slot(c.drop_slot), drop_token(c.drop_token);
  auto round = [](float f) { return bf16::from_float(f).bits; };
  const int el = c.experts / w, k = c.topk;
  const int64_t h = c.hidden, f = c.ffn, f_in = c.swiglu ? 2 * f : f;
  // Uploaded column i of W1 is column perm[i] of [gate | up] (identity without SwiGLU).
  std::vector<int64_t> perm(static_cast<size_t>(f_in));
  if (c.swiglu) perm = gemm::swiglu_column_permutation(f, 256);
  else std::iota(perm.begin(), perm.end(), int64_t(0));
  const bool nk = c.layout == gemm::BLayout::kNK;

  std::vector<RankData> ranks(static_cast<size_t>(w));
  std::vector<ref::MoeRankInputs> in(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    RankData& rd = ranks[size_t(r)];
    rd.tokens = in[size_t(r)].num_tokens = c.tokens[size_t(r) % c.tokens.size()];
    rd.x.resize(size_t(rd.tokens * h));
    for (auto& v : rd.x) v = round(sym(gen));
    for (int64_t t = 0; t < rd.tokens; ++t) {
      std::vector<int32_t> ids = route_token(c, gen);
      const bool all_dropped = drop_token(gen);
      for (int s = 0; s < k; ++s) {
        if (all_dropped || drop_slot(gen)) ids[size_t(s)] = -1;
        rd.ids.push_back(ids[size_t(s)]);
        // Dropped slots keep a nonzero weight: the op must skip them by id, not by weight.
        rd.weights.push_back(bf16{round(1.f - unit(gen))}.to_float());  // (0, 1]
        rd.decoy_ids.push_back(ids[size_t(s)] < 0 ? -1 : c.experts - 1 - ids[size_t(s)]);
      }
    }
    // Weights in the reference's layout first ([E_local, H, f_in] = [gate | up], [E_local, F, H]).
    std::vector<uint16_t> w1(size_t(el * h * f_in)), w2(size_t(el * f * h));
    for (auto& v : w1) v = round(sym(gen) / std::sqrt(float(h)));
    for (auto& v : w2) v = round(sym(gen) / std::sqrt(float(f)));
    rd.w1.resize(w1.size());
    rd.w2.resize(w2.size());
    for (int64_t e = 0; e < el; ++e) {
      for (int64_t p = 0; p < h; ++p)
        for (int64_t i = 0; i < f_in; ++i) {
          const uint16_t v = w1[size_t((e * h + p) * f_in + perm[size_t(i)])];
          rd.w1[size_t(nk ? (e * f_in + i) * h + p : (e * h + p) * f_in + i)] = v;
        }
      for (int64_t j = 0; j < f; ++j)
        for (int64_t col = 0; col < h; ++col)
          rd.w2[size_t(nk ? (e * h + col) * f + j : (e * f + j) * h + col)] = w2[size_t((e * f + j) * h + col)];
    }
    in[size_t(r)].x = to_doubles(rd.x);
    in[size_t(r)].topk_ids = rd.ids;
    in[size_t(r)].topk_weights.assign(rd.weights.begin(), rd.weights.end());
    in[size_t(r)].w1 = to_doubles(w1);
    in[size_t(r)].w2 = to_doubles(w2);
  }

  // fp64 reference, one thread per source rank (each sees every rank's weights, only its tokens).
  ref::MoeShape shape;
  shape.max_tokens_per_rank = c.max_tokens;
  shape.hidden = h;
  shape.ffn = f;
  shape.num_experts = c.experts;
  shape.topk = k;
  shape.swiglu = c.swiglu;
  std::vector<ref::MoeNaiveOutput> refs(static_cast<size_t>(w));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      try {
        std::vector<ref::MoeRankInputs> mine = in;
        for (int q = 0; q < w; ++q)
          if (q != r) {
            mine[size_t(q)].num_tokens = 0;
            mine[size_t(q)].x.clear();
            mine[size_t(q)].topk_ids.clear();
            mine[size_t(q)].topk_weights.clear();
          }
        refs[size_t(r)] = ref::naive_moe(mine, shape);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  // Receive side (dispatch_plan.h): rows per local expert, and where each entry's layer-0 row lands.
  std::vector<int32_t> counts(size_t(w * c.experts));
  for (int s = 0; s < w; ++s)
    dispatch_counts(ranks[size_t(s)].ids.data(), ranks[size_t(s)].tokens, k, c.experts, counts.data() + s * c.experts);
  const DispatchPlan plan{counts.data(), w, c.experts};
  for (int r = 0; r < w; ++r) {
    RankData& rd = ranks[size_t(r)];
    rd.out = refs[size_t(r)].out[size_t(r)];
    rd.act.assign(size_t(plan.rank_rows(r) * f), 0.0);
    for (int e = 0; e < el; ++e) rd.expert_rows.push_back(int32_t(plan.expert_rows(r * el + e)));
  }
  for (int s = 0; s < w; ++s) {
    const RankData& src = ranks[size_t(s)];
    std::vector<int64_t> pos(src.ids.size());
    dispatch_positions(plan, s, src.ids.data(), src.tokens, k, pos.data());
    for (size_t i = 0; i < pos.size(); ++i) {
      if (src.ids[i] < 0) continue;
      const double* a = refs[size_t(s)].act[size_t(s)].data() + i * size_t(f);
      std::copy(a, a + f, ranks[size_t(plan.owner(src.ids[i]))].act.begin() + pos[i] * f);
    }
  }
  return ranks;
}

class GpuMoeFfn : public ::testing::TestWithParam<Case> {};

TEST_P(GpuMoeFfn, MatchesFp64Reference) {
  CCFUSE_REQUIRE_GPUS(1);
  Case c = GetParam();
  const int w = world_for(c.experts);
  if (w < 1) GTEST_SKIP() << "no world size in [2, " << rank_count() << "] divides " << c.experts << " experts";
  if (c.max_tokens == 0) c.max_tokens = *std::max_element(c.tokens.begin(), c.tokens.end());
  std::random_device rd;
  const uint64_t seed = rd();
  const std::string trace = detail::str_cat("seed ", seed, " case ", c.name, " W ", w);
  SCOPED_TRACE(trace);
  const std::vector<RankData> problem = make_problem(c, w, seed);
  const std::vector<int> devices = rank_devices(w);

  comm::run_local_world(devices, [&](comm::Team& team) {
    const int r = team.rank();
    SCOPED_TRACE(detail::str_cat(trace, " rank ", r));  // traces are per thread
    const RankData& rd = problem[size_t(r)];
    const int64_t t = rd.tokens, h = c.hidden, f = c.ffn;
    MoeFfnDesc d;
    d.max_tokens = c.max_tokens;
    d.hidden = h;
    d.ffn = f;
    d.num_experts = c.experts;
    d.topk = c.topk;
    d.swiglu = c.swiglu;
    d.b_layout = c.layout;
    MoeFfnConfig config;
    config.num_sms = c.num_sms;
    config.combine = c.combine;
    config.tma_store = c.tma_store;
    config.presum_ctas = c.presum_ctas;
    config.local_first = c.local_first;
    config.striped_dispatch = c.striped;
    config.stripe_rows = c.stripe_rows;
    config.bulk_dispatch = c.bulk;
    config.prep_one = c.prep_one;
    config.dispatch_spread_us = c.dispatch_spread_us;
    config.l1_pingpong = c.l1_pingpong;
    config.always_combine = c.always_combine;
    config.interleave_sends = c.interleave_sends;
    config.dispatch = c.dispatch;
    config.gather_rows = c.gather_rows;
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const DevPtr x = upload(rd.x), ids = upload(rd.ids), decoy = upload(rd.decoy_ids), tw = upload(rd.weights);
    const DevPtr w1 = upload(rd.w1), w2 = upload(rd.w2), out = dev_alloc(size_t(t * h) * 2);
    const size_t out_elems = size_t(t * h), out_bytes = out_elems * 2;
    {
      MoeFfn op(team, d, config);
      auto run_real = [&] { op.run(x.get(), t, as<int32_t>(ids), as<float>(tw), w1.get(), w2.get(), out.get(), s); };
      // The decoy: half the tokens, experts mirrored (E - 1 - e): other counts, other receivers.
      auto run_decoy = [&] {
        op.run(x.get(), t / 2, as<int32_t>(decoy), as<float>(tw), w1.get(), w2.get(), out.get(), s);
      };
      // After the stream drains: out holds exactly `want`, bit for bit.
      auto same_as = [&](const std::vector<uint16_t>& want, const char* what) {
        team.synchronize(s);
        EXPECT_TRUE(download<uint16_t>(out.get(), out_elems) == want) << what << " changed the result";
        team.barrier(s);  // every rank has read its out before the next calls overwrite it
        team.synchronize(s);
      };

      // 1. A decoy call, then the checked call into a NaN-poisoned out (stream-ordered, no host sync).
      run_decoy();
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out_bytes, s));
      run_real();
      team.synchronize(s);
      const std::vector<uint16_t> first = download<uint16_t>(out.get(), out_elems);
      const std::vector<double> got = to_doubles(first);
      if (t > 0) EXPECT_LE(ref::rel_err(got, rd.out), 1e-2) << "out";
      int64_t nonzero_dropped = 0;  // tokens whose slots are all -1: exact zeros
      for (int64_t tok = 0; tok < t; ++tok) {
        bool all_dropped = true;
        for (int sl = 0; sl < c.topk; ++sl) all_dropped &= rd.ids[size_t(tok * c.topk + sl)] < 0;
        if (!all_dropped) continue;
        for (int64_t col = 0; col < h; ++col) nonzero_dropped += got[size_t(tok * h + col)] != 0.0;
      }
      EXPECT_EQ(nonzero_dropped, 0) << "elements of fully dropped tokens that are not 0";
      const int el = c.experts / w;
      EXPECT_EQ(download<int32_t>(op.expert_rows_device(), size_t(el)), rd.expert_rows) << "expert_rows_device()";
      const int64_t rows = int64_t(rd.act.size()) / f;
      EXPECT_GE(op.max_rows(), rows);
      if (rows > 0 && op.max_rows() >= rows) {
        const auto act = to_doubles(download<uint16_t>(op.layer0_output(), size_t(rows * f)));
        EXPECT_LE(ref::rel_err(act, rd.act), 1e-2) << "layer0_output() (" << rows << " rows)";
      }
      team.barrier(s);
      team.synchronize(s);

      // 2. 20 calls back to back, alternating with the decoy, ending with the real one.
      for (int i = 0; i < 20; ++i) {
        if (i % 2 == 0) run_decoy();
        else run_real();
      }
      team.synchronize(s);
      EXPECT_EQ(download<int32_t>(op.expert_rows_device(), size_t(el)), rd.expert_rows) << "after back-to-back calls";
      same_as(first, "20 back-to-back calls");

      // 3. run() == run_layer0() then run_layer1().
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out_bytes, s));
      op.run_layer0(x.get(), t, as<int32_t>(ids), as<float>(tw), w1.get(), s);
      op.run_layer1(t, as<int32_t>(ids), w2.get(), out.get(), s);
      same_as(first, "run_layer0 + run_layer1");

      // 4. CUDA graph: decoy + real captured once, replayed 3 times into a poisoned out.
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CCFUSE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      run_decoy();
      run_real();
      CCFUSE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      CCFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out_bytes, s));
      for (int i = 0; i < 3; ++i) CCFUSE_CUDA_CHECK(cudaGraphLaunch(exec, s));
      same_as(first, "CUDA-graph replays");
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }  // ~MoeFfn (collective)
    cudaStreamDestroy(s);
  });
}

// Shapes: H a multiple of 256, F of 128. Each case's fp64 reference (naive_moe: T * k * 3HF
// multiply-adds per rank with SwiGLU, 2HF without) stays around 5e8 at W = 2, about 1 s per case
// on one core per rank; it grows with W.
std::vector<Case> cases() {
  using gemm::BLayout;
  std::vector<Case> v;
  v.push_back({"uniform", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {300}});
  v.push_back({"zipf_top4", 512, 256, 16, 4, true, BLayout::kKN, Route::kZipf, {128}});
  v.push_back({"one_expert_top1", 512, 256, 8, 1, true, BLayout::kKN, Route::kFirstExpert, {300}});  // all on 0
  v.push_back({"hot_expert_top2", 512, 256, 8, 2, true, BLayout::kKN, Route::kFirstExpert, {200}});
  v.push_back({"idle_odd_experts", 512, 256, 8, 2, true, BLayout::kKN, Route::kEvenOnly, {200}});
  v.push_back({"uneven_tokens", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {300, 17}, 512});
  v.push_back({"rank0_no_tokens", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {0, 300}});
  v.push_back({"drops", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {300}, 0, 0.2, 0.05});
  v.push_back({"top1_e16", 512, 256, 16, 1, true, BLayout::kKN, Route::kUniform, {300}});
  v.push_back({"top8_e16", 512, 256, 16, 8, true, BLayout::kKN, Route::kUniform, {64}});
  v.push_back({"plain_kn", 512, 256, 8, 2, false, BLayout::kKN, Route::kUniform, {300}});
  v.push_back({"swiglu_nk", 512, 256, 8, 2, true, BLayout::kNK, Route::kZipf, {200}});
  v.push_back({"plain_nk_drops", 512, 256, 8, 2, false, BLayout::kNK, Route::kZipf, {250, 40}, 0, 0.2, 0.05});
  // 2F = 768: three 256-column SwiGLU tiles; few CTAs so that each takes several tiles.
  v.push_back({"h768_f384_8sms", 768, 384, 8, 2, true, BLayout::kKN, Route::kUniform, {100}, 0, 0, 0, 8});
  // The pre-summed combine (MoeCombine::kPresum; passed on 2x H200 2026-11-30): top-8, drops and
  // empty ranks, uneven token counts, kNK.
  const MoeCombine presum = MoeCombine::kPresum;
  v.push_back({"presum_top8_e16", 512, 256, 16, 8, true, BLayout::kKN, Route::kUniform, {64}, 0, 0, 0, 0, presum});
  v.push_back({"presum_drops", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {300}, 0, 0.2, 0.05, 0, presum});
  v.push_back({"presum_rank0_no_tokens", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {0, 300}, 0, 0, 0, 0,
               presum});
  v.push_back({"presum_uneven_nk_zipf", 512, 256, 16, 4, false, BLayout::kNK, Route::kZipf, {250, 40}, 512, 0.1, 0.02,
               0, presum});
  // The default (kAuto): presum at top-2, per-slot past top-32.
  v.push_back({"auto_top2", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {300}, 0, 0, 0, 0, MoeCombine::kAuto});
  v.push_back({"auto_top40_e64", 512, 256, 64, 40, true, BLayout::kKN, Route::kUniform, {48}, 0, 0, 0, 0,
               MoeCombine::kAuto});
  // The interleaved send order (passed on 2x H200 2026-11-30).
  Case inter{"interleaved_zipf_top4", 512, 256, 16, 4, true, BLayout::kKN, Route::kZipf, {250, 40}, 512, 0.1, 0.02};
  inter.interleave_sends = true;
  v.push_back(inter);
  inter.name = "interleaved_presum_top8";
  inter.topk = 8;
  inter.route = Route::kUniform;
  inter.combine = MoeCombine::kPresum;
  v.push_back(inter);
  // The all-gather dispatch (MoeDispatch::kAllGather; opt-in, passed on 2x H200 2026-11-30):
  // both combines, top-1 to top-8, drops, a rank with no tokens, uneven counts past one 128-token
  // chunk, kNK, and few CTAs (each takes several push and permute units).
  // Each also with layer 0 reading its rows in place (MoeFfnConfig::gather_rows, written
  // 2026-11-30: the grouped GEMM's producer warp gathers A by row, no permute).
  const auto ag = [&](Case c) {
    c.name = "allgather_" + c.name;
    c.dispatch = MoeDispatch::kAllGather;
    v.push_back(c);
    c.name = "gather_rows_" + c.name.substr(10);
    c.gather_rows = true;
    v.push_back(c);
  };
  ag({"uniform_top2", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {300}});
  ag({"top1_e16", 512, 256, 16, 1, true, BLayout::kKN, Route::kUniform, {300}});
  ag({"presum_top8_e16", 512, 256, 16, 8, true, BLayout::kKN, Route::kUniform, {64}, 0, 0, 0, 0, presum});
  ag({"presum_rank0_no_tokens", 512, 256, 8, 2, true, BLayout::kKN, Route::kUniform, {0, 300}, 0, 0, 0, 0, presum});
  ag({"perslot_uneven_nk_zipf_drops", 512, 256, 16, 4, false, BLayout::kNK, Route::kZipf, {250, 40}, 512, 0.1, 0.02});
  ag({"h768_f384_8sms", 768, 384, 8, 2, true, BLayout::kKN, Route::kUniform, {300}, 0, 0, 0, 8, presum});
  // The TMA-store epilogue of the layers' grouped GEMMs (the default since 2026-11-30): ~512 rows
  // per expert, so most tiles are whole (stored by TMA) and each expert's last one is cut (stored
  // from registers); SwiGLU and plain, both B layouts, both combines; and the register path.
  v.push_back({"tma_whole_tiles_swiglu_nk", 512, 256, 4, 2, true, BLayout::kNK, Route::kUniform, {1024}, 0, 0, 0, 0,
               presum});
  v.push_back({"tma_whole_tiles_plain_kn_zipf", 512, 256, 4, 2, false, BLayout::kKN, Route::kZipf, {1024, 700}, 0,
               0.1, 0.02, 0, presum});
  v.push_back({"tma_whole_tiles_perslot_16sms", 512, 256, 4, 2, true, BLayout::kNK, Route::kUniform, {1024}, 0, 0, 0,
               16});
  // Layer 1's pre-sum beside the GEMM in side CTAs (presum_ctas > 0 or -1; opt-in, passed on 2x
  // H200 2026-11-30, measured slower than after the GEMM): the tuner's estimate, one side CTA, and
  // many slices (H = 2048: 8 column tiles, 2 a slice) with few GEMM CTAs.
  Case after{"presum_beside_gemm_zipf", 512, 256, 8, 4, true, BLayout::kNK, Route::kZipf, {300, 120}, 0, 0.1, 0.02, 0,
             presum};
  after.presum_ctas = -1;
  v.push_back(after);
  Case one_side = after;
  one_side.name = "presum_one_side_cta";
  one_side.presum_ctas = 1;
  v.push_back(one_side);
  Case slices{"presum_h2048_slices_12sms", 2048, 256, 8, 2, true, BLayout::kNK, Route::kUniform, {300}, 0, 0, 0, 12,
              presum};
  slices.presum_ctas = 3;
  v.push_back(slices);
  // Layer 1 on ping-pong 128x128 tiles with the pre-sum after it (l1_pingpong 1; by default only
  // from H = 4096, 2026-12-02): whole and cut tiles, top-8, drops, few CTAs; and the default at
  // H = 4096.
  for (Case pp : {Case{"l1_pingpong_whole_tiles_swiglu_nk", 512, 256, 4, 2, true, BLayout::kNK, Route::kUniform, {1024},
                       0, 0, 0, 0, presum},
                  Case{"l1_pingpong_top8_e16_drops_8sms", 512, 256, 16, 8, true, BLayout::kKN, Route::kZipf, {300, 90}, 0,
                       0.1, 0.02, 8, presum}}) {
    pp.l1_pingpong = 1;
    v.push_back(pp);
  }
  v.push_back({"l1_auto_pingpong_h4096", 4096, 256, 8, 2, true, BLayout::kNK, Route::kUniform, {200, 90}, 0, 0.05, 0.01, 0,
               presum});
  // Ping-pong with few CTAs: each alternates its two consumer warpgroups over many tiles.
  Case pp_few{"l1_pingpong_zipf_uneven_5sms", 1024, 384, 8, 4, true, BLayout::kNK, Route::kZipf, {700, 130}, 0, 0.05,
              0.01, 5, presum};
  pp_few.l1_pingpong = 1;
  v.push_back(pp_few);
  // The combine kernel at every W (at W = 1 the pre-sum writes the output itself unless
  // always_combine): top-8 with dropped slots and fully dropped tokens, uneven ranks, a hidden size
  // whose row is not a multiple of 64 pieces (H = 768: 96 pieces, the warp's second piece partial).
  for (Case cc : {Case{"presum_combine_kernel_top8_drops", 512, 256, 16, 8, true, BLayout::kKN, Route::kZipf,
                       {300, 90}, 0, 0.1, 0.05, 0, presum},
                  Case{"presum_combine_kernel_h768", 768, 384, 8, 2, true, BLayout::kNK, Route::kUniform, {200}, 0,
                       0, 0.05, 0, presum}}) {
    cc.always_combine = true;
    v.push_back(cc);
  }
  Case regs{"regstore_whole_tiles_swiglu", 512, 256, 4, 2, true, BLayout::kNK, Route::kUniform, {1024}, 0, 0, 0, 0,
            presum};
  regs.tma_store = false;
  v.push_back(regs);
  // The same with dropped slots and tokens, Zipf routing and uneven ranks: with register stores
  // every buffer a kernel reads is written by plain stores, so compute-sanitizer's initcheck
  // (gpu_run.sh sanitize) can check the preparation's reads (it does not count TMA bulk stores as
  // writes; a dropped entry's rank was loaded uninitialised until 2026-12-07).
  Case regs_drops{"regstore_drops_zipf_uneven", 512, 256, 8, 2, true, BLayout::kNK, Route::kZipf, {700, 300}, 0,
                  0.1, 0.05, 0, presum};
  regs_drops.tma_store = false;
  v.push_back(regs_drops);
  // Layer 0's one-CTA preparation for calls of <= 2048 entries (MoeFfnConfig::prep_one, opt-in,
  // 2026-12-07; the other cases take the two chunk kernels): drops, Zipf and uneven ranks; top-8
  // over 16 experts; and ranks on different paths in one call (rank 0: 2200 entries, two chunks;
  // rank 1: 600, one CTA), with the striped dispatch's unit counters too.
  for (Case pc : {Case{"prep_one_drops_zipf_uneven", 512, 256, 8, 2, true, BLayout::kNK, Route::kZipf, {700, 300}, 0,
                       0.1, 0.05, 0, presum},
                  Case{"prep_one_top8_e16", 512, 256, 16, 8, true, BLayout::kKN, Route::kUniform, {64}, 0, 0, 0, 0,
                       presum},
                  Case{"prep_one_mixed_paths_uneven", 512, 256, 8, 2, true, BLayout::kNK, Route::kUniform,
                       {1100, 300}, 0, 0.05, 0.0, 0, presum}}) {
    pc.prep_one = 1;
    v.push_back(pc);
  }
  Case pc_striped{"prep_one_striped_interleaved", 512, 256, 8, 2, true, BLayout::kNK, Route::kZipf, {700, 300}, 0,
                  0.05, 0.0, 0, presum};
  pc_striped.prep_one = 1;
  pc_striped.striped = 1;
  pc_striped.interleave_sends = true;
  v.push_back(pc_striped);
  // Layer 0's local-first tile order (the default since 2026-11-30 late): every expert's row tiles
  // of only local rows before the others. Skewed and uneven ranks (one rank's experts mostly
  // local, the other's mostly remote), a max_tokens bound that cuts rows, few CTAs (each takes
  // tiles of both parts); and the expert order it replaced (local_first = false).
  Case local_first{"local_first_zipf_uneven_8sms", 512, 256, 4, 2, true, BLayout::kNK, Route::kZipf, {2048, 600}, 0,
                   0.05, 0.01, 8, presum};
  local_first.local_first = 1;
  v.push_back(local_first);
  Case expert_order{"expert_order_whole_tiles", 512, 256, 4, 2, true, BLayout::kNK, Route::kUniform, {1024}, 0, 0, 0,
                    0, presum};
  expert_order.local_first = 0;
  v.push_back(expert_order);
  // Rows read in place with the local-first order (an experiment written 2026-11-30, not yet run
  // on a GPU): the row tiles of only this rank's tokens first, read from x without a wait, while
  // the peer's push (phase 1) lands.
  Case gather_local = local_first;
  gather_local.name = "gather_rows_local_first_zipf_uneven_8sms";
  gather_local.dispatch = MoeDispatch::kAllGather;
  gather_local.gather_rows = true;
  v.push_back(gather_local);
  // Layer 0's striped dispatch (MoeFfnConfig::striped_dispatch; experiment 2026-11-30): rows dealt
  // to every CTA's send warps, a count per unit. Uneven ranks with drops and Zipf skew (units cut
  // short), top-8 with interleaved sends and a rank without tokens, few CTAs (each warp copies rows
  // of many units), both combines.
  Case striped{"striped_zipf_uneven_drops", 512, 256, 8, 2, true, BLayout::kNK, Route::kZipf, {1500, 300}, 0, 0.05,
               0.01, 0, presum};
  striped.striped = 1;
  v.push_back(striped);
  Case striped_top8{"striped_top8_interleaved_rank0_empty", 512, 256, 16, 8, true, BLayout::kKN, Route::kUniform,
                    {0, 400}, 0, 0, 0, 0, presum};
  striped_top8.striped = 1;
  striped_top8.interleave_sends = true;
  v.push_back(striped_top8);
  Case striped_few{"striped_perslot_8sms", 768, 384, 8, 2, true, BLayout::kKN, Route::kUniform, {700}, 0, 0, 0, 8};
  striped_few.striped = 1;
  v.push_back(striped_few);
  // The round's size at its ends (MoeFfnConfig::stripe_rows 1 and 32; written 2026-11-30 08:10,
  // not yet run on a GPU).
  Case stripe1 = striped;
  stripe1.name = "striped_1_row_a_round";
  stripe1.stripe_rows = 1;
  v.push_back(stripe1);
  Case stripe32 = striped_top8;
  stripe32.name = "striped_32_rows_a_round_top8";
  stripe32.stripe_rows = 32;
  v.push_back(stripe32);
  // The striped dispatch's bulk copies through shared memory (MoeFfnConfig::bulk_dispatch, written
  // 2026-12-06) and its copy through registers, both forced at any W: rows of 4.5 KB (a 4 KB piece
  // and a 512-byte one, a ring of 4 KB slots), 1 KB rows without SwiGLU (the ring only in the
  // shared memory past the GEMM's, 1 KB slots), top-8 with a rank without tokens.
  Case bulk_split{"striped_bulk_rows_of_two_pieces", 2304, 256, 8, 4, true, BLayout::kNK, Route::kZipf, {600, 350},
                  0, 0.05, 0, 0, presum};
  bulk_split.striped = 1;
  bulk_split.bulk = 1;
  v.push_back(bulk_split);
  Case bulk_noglu{"striped_bulk_no_swiglu_tail_only", 512, 256, 8, 2, false, BLayout::kKN, Route::kUniform,
                  {900, 500}, 0, 0, 0, 0, presum};
  bulk_noglu.striped = 1;
  bulk_noglu.bulk = 1;
  v.push_back(bulk_noglu);
  Case bulk_top8 = striped_top8;
  bulk_top8.name = "striped_bulk_top8_rank0_empty";
  bulk_top8.bulk = 1;
  v.push_back(bulk_top8);
  Case registers = striped;
  registers.name = "striped_through_registers";
  registers.bulk = 0;
  v.push_back(registers);
  // Layer 0's dispatch paced (MoeFfnConfig::dispatch_spread_us, experiment 2026-11-30), striped
  // and by units: rows arrive over 200 us instead of at once.
  Case paced_striped = striped;
  paced_striped.name = "striped_paced_200us";
  paced_striped.dispatch_spread_us = 200;
  v.push_back(paced_striped);
  Case paced_units{"units_paced_200us_top4", 512, 256, 16, 4, true, BLayout::kKN, Route::kUniform, {900, 700}};
  paced_units.striped = 0;
  paced_units.dispatch_spread_us = 200;
  v.push_back(paced_units);
  // Layer 0's preparation (chunk_rank_kernel, chunk_send_list_kernel) over three 2048-entry
  // chunks with unit sends: an entry ranked wrong in its chunk shows in layer0_output(), which is
  // checked in receive order. (The striped cases above cover drops, a rank without tokens and
  // both send orders.)
  Case chunks{"chunk_prep_units_zipf_top4_e16", 512, 256, 16, 4, true, BLayout::kKN, Route::kZipf, {1100, 530}};
  chunks.striped = 0;
  v.push_back(chunks);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Routing, GpuMoeFfn, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The messages are the implementation's; the test only asks that they name the argument.
template <typename F>
void expect_rejected(F&& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no error, expected InvalidArgument naming " << argument;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos)
        << "message \"" << e.what() << "\" does not name " << argument;
  }
}

// Layer 0's plan (what the exchange kernel derives from the counts matrix, by warp scans) against
// the serial definitions, for every rank of W = 1..8 on one GPU (no peers needed): the multi-rank
// arrays (block_begin's rotation, chunk_base per source, perm_base) are otherwise checked only
// where W GPUs run the whole layer. Fresh random counts (seed printed), with empty experts, one
// hot expert, more than 32 experts and a max_rows cut.
TEST(GpuMoeFfn, PlanMatchesSerialDefinition) {
  CCFUSE_REQUIRE_GPUS(1);
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 gen(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  struct Shape {
    int world, experts;
  };
  for (const Shape sh : {Shape{1, 8}, Shape{2, 128}, Shape{2, 6}, Shape{3, 96}, Shape{4, 256}, Shape{8, 64},
                         Shape{8, 256}, Shape{5, 320}}) {
    const int w = sh.world, ex = sh.experts, epr = ex / w;
    for (int rank = 0; rank < w; ++rank) {
      for (const bool interleaved : {false, true}) {
        std::vector<int32_t> cnt(size_t(w) * ex);
        std::uniform_int_distribution<int> pick(0, 3), small(0, 300);
        for (auto& c : cnt) {
          const int kind = pick(gen);
          c = kind == 0 ? 0 : kind == 1 ? small(gen) % 5 : small(gen);
        }
        cnt[size_t(gen() % cnt.size())] = 5000 + int(gen() % 3000);  // a hot (source, expert)
        int64_t rows_here = 0;
        for (int s = 0; s < w; ++s)
          for (int j = 0; j < epr; ++j) rows_here += cnt[size_t(s) * ex + rank * epr + j];
        // Every other case cuts the local rows at max_rows (the overflow rule).
        const int64_t max_rows = (rank + interleaved) % 2 ? std::max<int64_t>(1, rows_here * 2 / 3) : rows_here + 1000;
        const int n0 = 3, n1 = 2;
        SCOPED_TRACE("W " + std::to_string(w) + " E " + std::to_string(ex) + " rank " + std::to_string(rank) +
                     (interleaved ? " interleaved" : "") + " max_rows " + std::to_string(max_rows));
        const internal::PlanArrays got = internal::derive_plan_for_test(w, rank, ex, interleaved, cnt, n0, n1, max_rows);
        const DispatchPlan plan{cnt.data(), w, ex};
        const auto rot_expert = [&](int src, int i) {
          return interleaved ? ((src + i % w) % w) * epr + i / w : (src * epr + i) % ex;
        };
        // Layer 0 and 1 schedules: groups walked in order, the rows past max_rows dropped.
        int64_t rows = 0;
        int t0 = 0, t1 = 0, lp = 0;
        for (int j = 0; j < epr; ++j) {
          const int x = rank * epr + j;
          ASSERT_EQ(got.group_rows[j], plan.expert_rows(x)) << "group_rows[" << j << "]";
          const int64_t lo = std::min(rows, max_rows), hi = std::min(rows + plan.expert_rows(x), max_rows);
          ASSERT_EQ(got.row_prefix[j], lo) << "row_prefix[" << j << "]";
          ASSERT_EQ(got.tile_prefix0[j], t0) << "tile_prefix0[" << j << "]";
          ASSERT_EQ(got.tile_prefix1[j], t1) << "tile_prefix1[" << j << "]";
          ASSERT_EQ(got.local_prefix0[j], lp) << "local_prefix0[" << j << "]";
          t0 += int(cdiv(hi - lo, 128)) * n0;
          t1 += int(cdiv(hi - lo, 128)) * n1;
          lp += int(std::min<int64_t>(plan.count(rank, x), hi - lo) / 128) * n0;
          rows += plan.expert_rows(x);
        }
        ASSERT_EQ(got.row_prefix[epr], std::min(rows, max_rows));
        ASSERT_EQ(got.tile_prefix0[epr], t0);
        ASSERT_EQ(got.tile_prefix1[epr], t1);
        ASSERT_EQ(got.local_prefix0[epr], lp);
        for (int x = 0; x < ex; ++x) ASSERT_EQ(got.block_begin[x], plan.block_begin(rank, x)) << "block_begin[" << x << "]";
        int64_t sent = 0;
        for (int i = 0; i <= ex; ++i) {
          ASSERT_EQ(got.rows_base[i], sent) << "rows_base[" << i << "]";
          if (i < ex) sent += plan.count(rank, rot_expert(rank, i));
        }
        for (int src = 0; src < w; ++src) {
          int c = 0;
          for (int i = 0; i <= ex; ++i) {
            ASSERT_EQ(got.chunk_base[size_t(src) * (ex + 1) + i], c) << "chunk_base[" << src << "][" << i << "]";
            if (i < ex) c += int(cdiv(plan.count(src, rot_expert(src, i)), 128));
          }
          int64_t from_src = 0;
          for (int j = 0; j < epr; ++j) from_src += plan.count(src, rank * epr + j);
          ASSERT_EQ(got.target[src], from_src * n1) << "target[" << src << "]";
        }
        std::vector<int> perm(size_t(w) * epr + 1);
        plan.permute_bases(rank, 128, perm.data());
        for (size_t q = 0; q < perm.size(); ++q) ASSERT_EQ(got.perm_base[q], perm[q]) << "perm_base[" << q << "]";
      }
    }
  }
}

TEST(GpuMoeFfn, RejectsBadInput) {
  CCFUSE_REQUIRE_GPUS(1);  // one GPU: W = 1, where every E divides (the num_experts rule needs W >= 2)
  const int w = std::min(rank_count(), kMaxMoeRanks);
  const std::vector<int> devices = rank_devices(w);
  comm::run_local_world(devices, [&](comm::Team& team) {
    MoeFfnDesc good;
    good.max_tokens = 64;
    good.hidden = 256;
    good.ffn = 128;
    good.num_experts = 2 * w;
    good.topk = 2;
    // Each bad desc breaks exactly one rule (the same on every rank: the constructor is collective).
    auto with = [&](auto change) {
      MoeFfnDesc d = good;
      change(d);
      return d;
    };
    if (w > 1) expect_rejected([&] { MoeFfn op(team, with([&](MoeFfnDesc& d) { d.num_experts = w + 1; })); }, "num_experts");
    expect_rejected([&] { MoeFfn op(team, with([&](MoeFfnDesc& d) { d.topk = 2 * w + 1; })); }, "topk");
    expect_rejected([&] { MoeFfn op(team, with([](MoeFfnDesc& d) { d.topk = 0; })); }, "topk");
    expect_rejected([&] { MoeFfn op(team, with([](MoeFfnDesc& d) { d.hidden = 100; })); }, "hidden");
    expect_rejected([&] { MoeFfn op(team, with([](MoeFfnDesc& d) { d.max_tokens = 0; })); }, "max_tokens");
    expect_rejected([&] { MoeFfn op(team, with([](MoeFfnDesc& d) { d.ffn = 192; })); }, "ffn");  // SwiGLU: 128 | F
    expect_rejected([&] { MoeFfn op(team, with([](MoeFfnDesc& d) { d.dtype = DType::kFloat16; })); }, "dtype");
    // Config knobs outside their ranges (checked before any collective allocation).
    auto config = [](auto change) {
      MoeFfnConfig c;
      change(c);
      return c;
    };
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.stripe_rows = 0; })); }, "stripe_rows");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.stripe_rows = 33; })); }, "stripe_rows");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.bulk_dispatch = 2; })); },
                    "bulk_dispatch");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.local_first = 2; })); }, "local_first");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.prep_one = 2; })); }, "prep_one");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.dispatch_spread_us = -1; })); },
                    "dispatch_spread_us");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.striped_dispatch = -2; })); },
                    "striped_dispatch");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.gather_rows = true; })); },
                    "gather_rows needs dispatch = kAllGather");
    expect_rejected([&] { MoeFfn op(team, good, config([](MoeFfnConfig& c) { c.l1_pingpong = 2; })); }, "l1_pingpong");
    expect_rejected([&] {
      MoeFfn op(team, good, config([](MoeFfnConfig& c) {
        c.l1_pingpong = 1;
        c.combine = MoeCombine::kPerSlot;
      }));
    }, "l1_pingpong 1 needs the pre-summed combine");
    expect_rejected([&] {
      MoeFfn op(team, good, config([](MoeFfnConfig& c) {
        c.l1_pingpong = 1;
        c.presum_ctas = 2;
      }));
    }, "l1_pingpong 1 needs the pre-sum after the GEMM (presum_ctas 0, got 2)");

    MoeFfn op(team, good);
    const int64_t t = good.max_tokens + 1, h = good.hidden, f = good.ffn;
    const int el = good.num_experts / w;
    const DevPtr x = dev_alloc(size_t(t * h) * 2), out = dev_alloc(size_t(t * h) * 2);
    const DevPtr ids = upload(std::vector<int32_t>(size_t(t * good.topk), 0));
    const DevPtr tw = upload(std::vector<float>(size_t(t * good.topk), 1.f));
    const DevPtr w1 = dev_alloc(size_t(el * h * 2 * f) * 2), w2 = dev_alloc(size_t(el * f * h) * 2);
    auto call = [&](int64_t n, const void* xp, void* op_out) {
      op.run(xp, n, as<int32_t>(ids), as<float>(tw), w1.get(), w2.get(), op_out, nullptr);
    };
    expect_rejected([&] { call(t, x.get(), out.get()); }, "num_tokens");  // > max_tokens
    expect_rejected([&] { call(-1, x.get(), out.get()); }, "num_tokens");
    char* xb = static_cast<char*>(x.get());
    EXPECT_THROW(call(8, xb + 2, out.get()), InvalidArgument) << "misaligned x";
    EXPECT_THROW(call(8, x.get(), xb + 256), InvalidArgument) << "out overlapping x";
    // A rejected call must leave the op usable: one valid (empty) collective call completes.
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    op.run(x.get(), 0, as<int32_t>(ids), as<float>(tw), w1.get(), w2.get(), out.get(), s);
    team.synchronize(s);
    // Expert ids out of range: an error naming topk_ids and the entry with check_routing (before
    // any collective step, so every rank throws alike); counted as dropped without it.
    MoeFfnConfig checked;
    checked.check_routing = true;
    MoeFfn op_checked(team, good, checked);
    std::vector<int32_t> bad(size_t(8 * good.topk), 0);
    bad[5] = good.num_experts;
    const DevPtr bad_ids = upload(bad);
    try {
      op_checked.run(x.get(), 8, as<int32_t>(bad_ids), as<float>(tw), w1.get(), w2.get(), out.get(), s);
      ADD_FAILURE() << "an expert id of num_experts was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(detail::str_cat("topk_ids: entry 5 (token ", 5 / good.topk, ", slot ",
                                                            5 % good.topk, ")")),
                std::string::npos)
          << e.what();
    }
    cudaStreamDestroy(s);
  });
}

}  // namespace
}  // namespace ccfuse::moe
