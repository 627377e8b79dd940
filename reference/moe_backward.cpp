// reference/moe_backward.cpp: see moe_backward.h.
#include "reference/moe_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ccfuse/common/dtype.h"
#include "ccfuse/common/error.h"

namespace ccfuse::ref {

namespace {
template <typename T>
double to_d(T v) {
  return double(to_f32(v));
}
// [E, a, b] -> [E, b, a]
template <typename T>
std::vector<T> transpose_experts(const T* w, int64_t experts, int64_t a, int64_t b) {
  std::vector<T> out(size_t(experts * a * b));
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) out[size_t((e * b + j) * a + i)] = w[(e * a + i) * b + j];
  return out;
}
MoeShape plain(MoeShape s, int64_t ffn) {
  s.swiglu = false;
  s.ffn = ffn;
  return s;
}
}  // namespace

template <typename T>
struct MoeBackward<T>::State {
  World& world;
  MoeShape shape;
  int64_t f_in;
  MoeLayer0<T> l0x, l0g;
  MoeLayer1<T> l1;
  SymmetricBuffer<float> dw_sym;
  State(World& w, const MoeShape& s, DispatchMode mode, const MoeConfig& c)
      : world(w),
        shape(s),
        f_in(s.swiglu ? 2 * s.ffn : s.ffn),
        l0x(w, plain(s, f_in), mode, c),
        l0g(w, plain(s, s.ffn), mode, c),
        l1(w, plain(s, f_in), mode, c),
        dw_sym(w, size_t(s.max_tokens_per_rank * s.topk)) {}
};

template <typename T>
MoeBackward<T>::MoeBackward(World& world, MoeShape shape, DispatchMode mode, MoeConfig config)
    : s_(new State(world, shape, mode, config)) {}

template <typename T>
MoeBackward<T>::~MoeBackward() = default;

template <typename T>
void MoeBackward<T>::run(int rank, const T* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w,
                         const T* w1, const T* w2, const T* g, T* dx, float* dw, const std::vector<T>* h_saved,
                         int64_t h_rows) {
  State& s = *s_;
  const MoeShape& sh = s.shape;
  const int k = sh.topk;
  const int64_t h = sh.hidden, f = sh.ffn, fi = s.f_in, el = sh.num_experts / s.world.world_size();
  CCFUSE_ARG_CHECK(num_tokens >= 0 && num_tokens <= sh.max_tokens_per_rank, "num_tokens ", num_tokens,
                   " must be in [0, max_tokens_per_rank = ", sh.max_tokens_per_rank, "]");
  // 1, 2: both dispatches (weights 1 for x: layer 1 below then combines d h W1^T unscaled)
  const std::vector<float> ones(size_t(num_tokens * k), 1.f);
  std::vector<T> hrows, urows;
  MoeMetadata mx, mg;
  s.l0x.run(rank, x, num_tokens, topk_ids, ones.data(), w1, hrows, mx);
  const std::vector<T> w2t = transpose_experts(w2, el, f, h);  // [E, H, F]
  s.l0g.run(rank, g, num_tokens, topk_ids, topk_w, w2t.data(), urows, mg);
  const int64_t rows = mx.layout.rows();
  CCFUSE_CHECK(mg.layout.rows() == rows && mg.row_src_rank == mx.row_src_rank && mg.row_src_token == mx.row_src_token &&
                   mg.row_slot == mx.row_slot,
               "rank ", rank, ": the x and g dispatches put the rows in different orders");
  const int64_t kept = h_rows < 0 ? rows : std::min(rows, h_rows);
  CCFUSE_CHECK(h_saved == nullptr || int64_t(h_saved->size()) == kept * fi, "rank ", rank, ": h_saved holds ",
               h_saved == nullptr ? 0 : h_saved->size(), " values, this call's ", kept, " kept rows need ", kept * fi);
  if (h_saved != nullptr && kept == rows) hrows = *h_saved;  // the forward's h in place of step 1's
  // 3: the activation's backward, row by row
  std::vector<T> dh(size_t(rows * fi));
  std::vector<float> dp(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double p = mg.row_weight[size_t(r)];
    double acc = 0;
    for (int64_t j = 0; j < f; ++j) {
      const double u = to_d(urows[size_t(r * f + j)]);
      if (sh.swiglu) {
        const double gate = to_d(hrows[size_t(r * fi + j)]), up = to_d(hrows[size_t(r * fi + f + j)]);
        const double sg = 1.0 / (1.0 + std::exp(-gate)), silu = gate * sg;
        acc += u * to_d(from_f32<T>(float(silu * up)));
        dh[size_t(r * fi + j)] = from_f32<T>(float(p * u * up * sg * (1 + gate * (1 - sg))));
        dh[size_t(r * fi + f + j)] = from_f32<T>(float(p * u * silu));
      } else {
        acc += u * to_d(hrows[size_t(r * fi + j)]);
        dh[size_t(r * fi + j)] = from_f32<T>(float(p * u));
      }
    }
    dp[size_t(r)] = float(acc);
  }
  // 4: d x = sum over slots of d h W1^T, combined at the owners (weights 1: mx's)
  const std::vector<T> w1t = transpose_experts(w1, el, h, fi);  // [E, F', H]
  s.l1.run(rank, dh, mx, w1t.data(), num_tokens, dx);
  // 5: d w to the owners
  std::fill(s.dw_sym.on(rank), s.dw_sym.on(rank) + num_tokens * k, 0.f);
  s.world.barrier(rank);
  for (int64_t r = 0; r < rows; ++r)
    s.dw_sym.on(mx.row_src_rank[size_t(r)])[int64_t(mx.row_src_token[size_t(r)]) * k + mx.row_slot[size_t(r)]] =
        dp[size_t(r)];
  s.world.barrier(rank);
  std::copy(s.dw_sym.on(rank), s.dw_sym.on(rank) + num_tokens * k, dw);
}

template class MoeBackward<float>;
template class MoeBackward<bf16>;

}  // namespace ccfuse::ref
