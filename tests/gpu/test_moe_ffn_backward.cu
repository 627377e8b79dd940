// MoeFfnBackward (ccfuse/moe/moe_ffn.h) against the fp64 reference ref::naive_moe_backward, built
// on the host from exactly the bf16 values uploaded (fresh seed per run, printed): d x and d topk_w
// (into NaN-poisoned buffers; dropped slots exactly 0), and the weight gradients computed on the
// host in fp64 from wgrad_operands() (the received rows, d h, p a, rows per expert); then again
// with h kept by the forward (MoeFfn::run's preact_out, h_saved). W = 1 on one
// GPU, or every local GPU / the one-GPU world's ranks (CCFUSE_TEST_ONE_GPU_RANKS). A second call
// back to back must reproduce d x bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/dtype.h"
#include "ccfuse/common/error.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/moe/moe_ffn.h"
#include "gpu_test_util.h"
#include "reference/moe_naive.h"
#include "reference/naive.h"

namespace ccfuse::moe {
namespace {

using ccfuse::testing::rank_count;
using ccfuse::testing::rank_devices;

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevPtr = std::unique_ptr<void, CudaFree>;

DevPtr dev_alloc(size_t bytes) {
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
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) CCFUSE_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
double bf(uint16_t bits) { return bf16{bits}.to_float(); }
std::vector<double> to_doubles(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf(bits[i]);
  return v;
}

struct Case {
  std::string name;
  int experts = 8, topk = 2;
  int64_t hidden = 256, ffn = 256;
  std::vector<int64_t> tokens;  // per rank (cycled)
  bool swiglu = true, tiles = false;
  gemm::BLayout layout = gemm::BLayout::kNK;
  double drop = 0.0;
  bool one_hot = false;  // slot 0 of every token on expert 1
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"swiglu_nk_torch_order", 8, 2, 256, 256, {96, 40}, true, false, gemm::BLayout::kNK});
  c.push_back({"swiglu_kn_tile_order", 8, 2, 256, 256, {64, 80}, true, true, gemm::BLayout::kKN});
  c.push_back({"swiglu_nk_tile_order_drops", 16, 8, 256, 256, {48, 72}, true, true, gemm::BLayout::kNK, 0.25});
  c.push_back({"plain_nk", 8, 3, 512, 128, {80, 33}, false, false, gemm::BLayout::kNK, 0.1});
  c.push_back({"one_hot_expert", 8, 2, 256, 128, {128, 64}, true, false, gemm::BLayout::kNK, 0.0, true});
  c.push_back({"top1_rank0_empty", 8, 1, 256, 256, {0, 100}, true, false, gemm::BLayout::kNK});
  return c;
}

int world_for(int experts) {
  for (int w = std::min(rank_count(), kMaxMoeRanks); w >= 2; --w)
    if (experts % w == 0) return w;
  return 1;
}

class GpuMoeFfnBackward : public ::testing::TestWithParam<Case> {};

TEST_P(GpuMoeFfnBackward, MatchesFp64Reference) {
  CCFUSE_REQUIRE_GPUS(1);
  const Case c = GetParam();
  const int w = world_for(c.experts), el = c.experts / w, k = c.topk;
  const int64_t h = c.hidden, f = c.ffn, fi = c.swiglu ? 2 * f : f;
  std::random_device rdev;
  const uint64_t seed = rdev();
  const std::string trace = detail::str_cat("seed ", seed, " case ", c.name, " W ", w);
  SCOPED_TRACE(trace);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> sym(-1.f, 1.f), unit(0.f, 1.f);
  auto round = [](float v) { return bf16::from_float(v).bits; };
  // Uploaded column i of W1 is column perm[i] of the reference's [gate | up].
  std::vector<int64_t> perm(static_cast<size_t>(fi));
  if (c.tiles) perm = gemm::swiglu_column_permutation(f, 256);
  else std::iota(perm.begin(), perm.end(), int64_t(0));
  const bool nk = c.layout == gemm::BLayout::kNK;
  std::vector<int64_t> perm_fwd(static_cast<size_t>(fi));  // the forward's (MoeFfn::run) W1 order
  if (c.swiglu) perm_fwd = gemm::swiglu_column_permutation(f, 256);
  else std::iota(perm_fwd.begin(), perm_fwd.end(), int64_t(0));

  struct Rank {
    int64_t tokens = 0;
    std::vector<uint16_t> x, g, w1, w2;
    std::vector<uint16_t> w1_fwd;  // w1 as the forward takes it (SwiGLU: tile order)
    std::vector<int32_t> ids;
    std::vector<float> weights;
  };
  std::vector<Rank> ranks(static_cast<size_t>(w));
  std::vector<ref::MoeRankInputs> in(static_cast<size_t>(w));
  std::vector<std::vector<double>> grad_out(static_cast<size_t>(w));
  int64_t max_tokens = 1;
  for (int r = 0; r < w; ++r) {
    Rank& rk = ranks[size_t(r)];
    rk.tokens = in[size_t(r)].num_tokens = c.tokens[size_t(r) % c.tokens.size()];
    max_tokens = std::max(max_tokens, rk.tokens);
    rk.x.resize(size_t(rk.tokens * h));
    rk.g.resize(size_t(rk.tokens * h));
    for (auto& v : rk.x) v = round(sym(gen));
    for (auto& v : rk.g) v = round(sym(gen));
    for (int64_t t = 0; t < rk.tokens; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(c.experts));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), gen);
      if (c.one_hot) {
        std::iter_swap(all.begin(), std::find(all.begin(), all.end(), 1));
      }
      for (int s = 0; s < k; ++s) {
        rk.ids.push_back(unit(gen) < c.drop ? -1 : all[size_t(s)]);
        rk.weights.push_back(float(bf(round(1.f - unit(gen)))));
      }
    }
    std::vector<uint16_t> w1(size_t(el * h * fi)), w2(size_t(el * f * h));  // [E, H, fi], [E, F, H]
    for (auto& v : w1) v = round(sym(gen) / std::sqrt(float(h)));
    for (auto& v : w2) v = round(sym(gen) / std::sqrt(float(f)));
    rk.w1.resize(w1.size());
    rk.w1_fwd.resize(w1.size());
    rk.w2.resize(w2.size());
    for (int64_t e = 0; e < el; ++e) {
      for (int64_t p = 0; p < h; ++p)
        for (int64_t i = 0; i < fi; ++i) {
          const size_t at = size_t(nk ? (e * fi + i) * h + p : (e * h + p) * fi + i);
          rk.w1[at] = w1[size_t((e * h + p) * fi + perm[size_t(i)])];
          rk.w1_fwd[at] = w1[size_t((e * h + p) * fi + perm_fwd[size_t(i)])];
        }
      for (int64_t j = 0; j < f; ++j)
        for (int64_t col = 0; col < h; ++col)
          rk.w2[size_t(nk ? (e * h + col) * f + j : (e * f + j) * h + col)] = w2[size_t((e * f + j) * h + col)];
    }
    in[size_t(r)].x = to_doubles(rk.x);
    in[size_t(r)].topk_ids = rk.ids;
    in[size_t(r)].topk_weights.assign(rk.weights.begin(), rk.weights.end());
    in[size_t(r)].w1 = to_doubles(w1);
    in[size_t(r)].w2 = to_doubles(w2);
    grad_out[size_t(r)] = to_doubles(rk.g);
  }
  ref::MoeShape shape;
  shape.max_tokens_per_rank = max_tokens;
  shape.hidden = h;
  shape.ffn = f;
  shape.num_experts = c.experts;
  shape.topk = k;
  shape.swiglu = c.swiglu;
  const ref::MoeNaiveGrad want = ref::naive_moe_backward(in, shape, grad_out);

  comm::run_local_world(rank_devices(w), [&](comm::Team& team) {
    const int r = team.rank();
    SCOPED_TRACE(detail::str_cat(trace, " rank ", r));
    const Rank& rk = ranks[size_t(r)];
    const int64_t t = rk.tokens;
    MoeFfnDesc d;
    d.max_tokens = max_tokens;
    d.hidden = h;
    d.ffn = f;
    d.num_experts = c.experts;
    d.topk = k;
    d.swiglu = c.swiglu;
    d.b_layout = c.layout;
    cudaStream_t s;
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const DevPtr x = upload(rk.x), g = upload(rk.g), ids = upload(rk.ids), tw = upload(rk.weights);
    const DevPtr w1 = upload(rk.w1), w2 = upload(rk.w2);
    const DevPtr dx = dev_alloc(size_t(t * h) * 2), dtw = dev_alloc(size_t(t * k) * 4);
    {
      MoeFfnBackward op(team, d, c.tiles);
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(dx.get(), 0xff, size_t(t * h) * 2, s));
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(dtw.get(), 0xff, size_t(t * k) * 4, s));
      // Every check of one backward call's results (mode: "recompute" or "saved h").
      const auto verify = [&](const char* mode) {
        SCOPED_TRACE(mode);
        std::vector<uint16_t> first = download<uint16_t>(dx.get(), size_t(t * h));
        const std::vector<float> dtw_got = download<float>(dtw.get(), size_t(t * k));
        if (t > 0) {
          EXPECT_LE(ref::rel_err(to_doubles(first), want.dx[size_t(r)]), 1e-2) << "dx";
          EXPECT_LE(ref::rel_err(std::vector<double>(dtw_got.begin(), dtw_got.end()), want.dw[size_t(r)]), 1e-2)
              << "dtopk_w";
        }
        int64_t bad_dropped = 0;
        for (int64_t i = 0; i < t * k; ++i) bad_dropped += rk.ids[size_t(i)] < 0 && dtw_got[size_t(i)] != 0.f;
        EXPECT_EQ(bad_dropped, 0) << "dropped slots whose d topk_w is not exactly 0";

        // The weight gradients from the operands, on the host in fp64.
        const MoeWgradOperands o = op.wgrad_operands();
        const std::vector<int32_t> rows_e = download<int32_t>(o.expert_rows, size_t(el));
        const int64_t rows = std::accumulate(rows_e.begin(), rows_e.end(), int64_t(0));
        if (rows > o.max_rows) {
          ADD_FAILURE() << "rows " << rows << " > max_rows " << o.max_rows;
          return first;
        }
        const auto xr = download<uint16_t>(o.x_rows, size_t(rows * h)), gr = download<uint16_t>(o.g_rows, size_t(rows * h));
        const auto dh = download<uint16_t>(o.dh_rows, size_t(rows * fi)), pa = download<uint16_t>(o.pa_rows, size_t(rows * f));
        // Every received row is its source token's x and g (both dispatches put the rows in one order).
        const auto src = download<int32_t>(o.row_src, size_t(rows * 2));
        int64_t wrong_x = 0, wrong_g = 0, bad_src = 0;
        for (int64_t q = 0; q < rows; ++q) {
          const int sr = src[size_t(2 * q)], entry = src[size_t(2 * q + 1)];
          if (sr < 0 || sr >= w || entry < 0 || entry >= ranks[size_t(sr)].tokens * k) {
            ++bad_src;
            continue;
          }
          const int64_t tok = entry / k;
          for (int64_t p = 0; p < h; ++p) {
            wrong_x += xr[size_t(q * h + p)] != ranks[size_t(sr)].x[size_t(tok * h + p)];
            wrong_g += gr[size_t(q * h + p)] != ranks[size_t(sr)].g[size_t(tok * h + p)];
          }
        }
        EXPECT_EQ(bad_src, 0) << "rows whose (source, entry) is out of range";
        EXPECT_EQ(wrong_x, 0) << "elements of received x rows that differ from their source token's";
        EXPECT_EQ(wrong_g, 0) << "elements of received g rows that differ from their source token's";
        // d h and p a of every received row against the host's fp64 from the row's own x and g (the
        // activation's backward alone, apart from the dispatch and the return paths).
        {
          std::vector<double> dh_want, pa_want, dh_got, pa_got;
          const std::vector<double>& w1r = in[size_t(r)].w1;  // [E_l, H, fi] ([gate | up])
          const std::vector<double>& w2r = in[size_t(r)].w2;  // [E_l, F, H]
          int64_t q = 0;
          for (int e = 0; e < el; ++e)
            for (int32_t n = 0; n < rows_e[size_t(e)]; ++n, ++q) {
              const int sr = src[size_t(2 * q)], entry = src[size_t(2 * q + 1)];
              if (sr < 0 || sr >= w) continue;
              const double pw = ranks[size_t(sr)].weights[size_t(entry)];
              std::vector<double> hv(size_t(fi), 0.0), uv(size_t(f), 0.0);
              for (int64_t p = 0; p < h; ++p) {
                const double xv = bf(xr[size_t(q * h + p)]), gv = bf(gr[size_t(q * h + p)]);
                for (int64_t i = 0; i < fi; ++i) hv[size_t(i)] += xv * w1r[size_t((e * h + p) * fi + i)];
                for (int64_t j = 0; j < f; ++j) uv[size_t(j)] += gv * w2r[size_t((e * f + j) * h + p)];
              }
              std::vector<double> dref(static_cast<size_t>(fi), 0.0);
              for (int64_t j = 0; j < f; ++j) {
                double a, dg = 0, du;
                if (c.swiglu) {
                  const double g0 = hv[size_t(j)], up = hv[size_t(f + j)], sg = 1.0 / (1.0 + std::exp(-g0));
                  a = g0 * sg * up;
                  dg = pw * uv[size_t(j)] * up * sg * (1 + g0 * (1 - sg));
                  du = pw * uv[size_t(j)] * g0 * sg;
                  dref[size_t(j)] = dg;
                  dref[size_t(f + j)] = du;
                } else {
                  a = hv[size_t(j)];
                  dref[size_t(j)] = pw * uv[size_t(j)];
                }
                pa_want.push_back(pw * a);
                pa_got.push_back(bf(pa[size_t(q * f + j)]));
              }
              for (int64_t i = 0; i < fi; ++i) {  // uploaded column i is the reference's perm[i]
                dh_want.push_back(dref[size_t(perm[size_t(i)])]);
                dh_got.push_back(bf(dh[size_t(q * fi + i)]));
              }
            }
          if (!pa_want.empty()) {
            EXPECT_LE(ref::rel_err(pa_got, pa_want), 1e-2) << "p a of the received rows";
            EXPECT_LE(ref::rel_err(dh_got, dh_want), 2e-2) << "d h of the received rows";
          }
        }
        std::vector<double> dw1(size_t(el * h * fi), 0.0), dw2(size_t(el * f * h), 0.0);  // the reference's layouts
        int64_t row = 0;
        for (int e = 0; e < el; ++e)
          for (int32_t q = 0; q < rows_e[size_t(e)]; ++q, ++row) {
            for (int64_t p = 0; p < h; ++p) {
              const double xv = bf(xr[size_t(row * h + p)]), gv = bf(gr[size_t(row * h + p)]);
              for (int64_t i = 0; i < fi; ++i) dw1[size_t((e * h + p) * fi + perm[size_t(i)])] += xv * bf(dh[size_t(row * fi + i)]);
              for (int64_t j = 0; j < f; ++j) dw2[size_t((e * f + j) * h + p)] += bf(pa[size_t(row * f + j)]) * gv;
            }
          }
        EXPECT_LE(ref::rel_err(dw1, want.dw1[size_t(r)]), 1e-2) << "d w1 from wgrad_operands()";
        EXPECT_LE(ref::rel_err(dw2, want.dw2[size_t(r)]), 1e-2) << "d w2 from wgrad_operands()";
        return first;
      };
      op.run(x.get(), t, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), w1.get(), w2.get(), g.get(),
             dx.get(), static_cast<float*>(dtw.get()), s);
      team.synchronize(s);
      const std::vector<uint16_t> first = verify("recompute");
      team.barrier(s);
      team.synchronize(s);

      // A second call back to back: the same d x, bit for bit.
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(dx.get(), 0xff, size_t(t * h) * 2, s));
      op.run(x.get(), t, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), w1.get(), w2.get(), g.get(),
             dx.get(), static_cast<float*>(dtw.get()), s);
      team.synchronize(s);
      EXPECT_TRUE(download<uint16_t>(dx.get(), size_t(t * h)) == first) << "a second call changed d x";
      team.barrier(s);
      team.synchronize(s);

      // The forward keeps h (MoeFfn::run's preact_out, NaN-poisoned first) and the backward reads
      // it (h_saved): every check again. A MoeFfn of the same desc and (default) config.
      MoeFfn fwd(team, d);
      const DevPtr w1f = upload(rk.w1_fwd), y = dev_alloc(size_t(t * h) * 2);
      const DevPtr hs = dev_alloc(size_t(fwd.max_rows() * fi) * 2);
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(hs.get(), 0xff, size_t(fwd.max_rows() * fi) * 2, s));
      fwd.run(x.get(), t, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), w1f.get(), w2.get(), y.get(),
              s, hs.get());
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(dx.get(), 0xff, size_t(t * h) * 2, s));
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(dtw.get(), 0xff, size_t(t * k) * 4, s));
      op.run(x.get(), t, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), w1.get(), w2.get(), g.get(),
             dx.get(), static_cast<float*>(dtw.get()), s, hs.get());
      team.synchronize(s);
      verify("saved h");
      team.barrier(s);
      team.synchronize(s);

      // The kept h bounded (MoeFfn::run's preact_rows, MoeFfnBackward::run's h_rows): 1 row, below
      // the received rows wherever a rank receives two or more, so that its backward recomputes h
      // (decided on the device); max_rows - 1, where the rows fit and h is read. Every check
      // again, and the rows after the bound untouched by the forward (NaN stays). The buffers are
      // made before the loop: a cudaFree between the calls would wait for the whole device, the
      // other rank's kernels too, which wait for this rank (a one-GPU world's deadlock).
      const int64_t guard = 64;
      const int64_t bounds[2] = {1, fwd.max_rows() - 1};
      const DevPtr hb_one = dev_alloc(size_t((bounds[0] + guard) * fi) * 2);
      const DevPtr hb_most = dev_alloc(size_t((bounds[1] + guard) * fi) * 2);
      for (const int64_t kept : bounds) {
        const size_t kept_bytes = size_t(kept * fi) * 2, all_bytes = size_t((kept + guard) * fi) * 2;
        const DevPtr& hb = kept == bounds[0] ? hb_one : hb_most;
        CCFUSE_CUDA_CHECK(cudaMemsetAsync(hb.get(), 0xff, all_bytes, s));
        fwd.run(x.get(), t, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), w1f.get(), w2.get(),
                y.get(), s, hb.get(), kept);
        CCFUSE_CUDA_CHECK(cudaMemsetAsync(dx.get(), 0xff, size_t(t * h) * 2, s));
        CCFUSE_CUDA_CHECK(cudaMemsetAsync(dtw.get(), 0xff, size_t(t * k) * 4, s));
        op.run(x.get(), t, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), w1.get(), w2.get(), g.get(),
               dx.get(), static_cast<float*>(dtw.get()), s, hb.get(), kept);
        team.synchronize(s);
        verify(kept == 1 ? "saved h of 1 row (recomputed past it)" : "saved h of max_rows - 1 rows");
        const std::vector<uint16_t> tail =
            download<uint16_t>(static_cast<char*>(hb.get()) + kept_bytes, size_t(guard * fi));
        EXPECT_TRUE(std::all_of(tail.begin(), tail.end(), [](uint16_t v) { return v == 0xffff; }))
            << "the forward wrote past preact_rows = " << kept;
        team.barrier(s);
        team.synchronize(s);
      }
    }
    cudaStreamDestroy(s);
  });
}

INSTANTIATE_TEST_SUITE_P(Routing, GpuMoeFfnBackward, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(GpuMoeFfnBackward, RejectsBadInput) {
  CCFUSE_REQUIRE_GPUS(1);
  comm::run_local_world({0}, [&](comm::Team& team) {
    MoeFfnDesc d;
    d.max_tokens = 16;
    d.hidden = 256;
    d.ffn = 128;
    d.num_experts = 4;
    d.topk = 2;
    d.swiglu = false;
    try {
      MoeFfnBackward op(team, d, /*w1_swiglu_tiles=*/true);
      ADD_FAILURE() << "no error for w1_swiglu_tiles without swiglu";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "w1_swiglu_tiles needs swiglu (the tile order is SwiGLU's)");
    }
    d.swiglu = true;
    MoeFfnConfig cfg;
    cfg.dispatch = MoeDispatch::kAllGather;
    cfg.gather_rows = true;
    try {
      MoeFfnBackward op(team, d, false, cfg);
      ADD_FAILURE() << "no error for gather_rows";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "moe_ffn backward: gather_rows leaves no received rows for the weight gradients "
                             "(use the default dispatch)");
    }
    // The kept pre-activation: needs the GEMM; h_saved aligned, not overlapping dx.
    MoeFfn fwd(team, d);
    const DevPtr buf = dev_alloc(size_t(fwd.max_rows() * 2 * d.ffn) * 2 + 4096);
    char* base = static_cast<char*>(buf.get());
    try {
      fwd.run_layer0(nullptr, 0, nullptr, nullptr, base, nullptr, base + 256, /*gemm=*/false);
      ADD_FAILURE() << "no error for preact_out without the GEMM";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "preact_out needs layer 0's GEMM (gemm = true, every call)");
    }
    try {
      fwd.run_layer0(nullptr, 0, nullptr, nullptr, base, nullptr, base + 256, true, fwd.max_rows() + 1);
      ADD_FAILURE() << "no error for preact_rows past max_rows";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), "preact_rows " + std::to_string(fwd.max_rows() + 1) +
                                           " must be in [1, max_rows() = " + std::to_string(fwd.max_rows()) +
                                           "] (0: max_rows())");
    }
    MoeFfn gathering(team, d, cfg);  // all-gather with gather_rows: the GEMM reads the rows in place
    try {
      gathering.run_layer0(nullptr, 0, nullptr, nullptr, base, nullptr, nullptr, /*gemm=*/false);
      ADD_FAILURE() << "no error for the dispatch alone with gather_rows";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "gemm = false (the dispatch alone) places no rows with gather_rows (its GEMM reads "
                             "them in place)");
    }
    MoeFfnBackward op(team, d, false);
    const DevPtr ids = dev_alloc(64 * 4), tw = dev_alloc(64 * 4), dtw = dev_alloc(64 * 4);
    for (const auto& [h_saved, want] :
         {std::pair<const char*, const char*>{base + 8, "h_saved must be a 16-byte aligned device pointer (or null: "
                                                         "recompute)"},
          {base + 1024, "dx must not overlap h_saved"}}) {
      try {
        op.run(nullptr, 4, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), base, base, base + 2048, base,
               static_cast<float*>(dtw.get()), nullptr, h_saved);
        ADD_FAILURE() << "no error: " << want;
      } catch (const InvalidArgument& e) {
        EXPECT_STREQ(e.what(), want);
      }
    }
    try {
      op.run(nullptr, 4, static_cast<int32_t*>(ids.get()), static_cast<float*>(tw.get()), base, base, base + 2048, base,
             static_cast<float*>(dtw.get()), nullptr, base + 4096, -3);
      ADD_FAILURE() << "no error for a negative h_rows";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), "h_rows -3 must be in [1, max_rows() = " + std::to_string(fwd.max_rows()) +
                                           "] (0: max_rows()), the forward's preact_rows");
    }
  });
}

}  // namespace
}  // namespace ccfuse::moe
