#include "reference/moe_naive.h"

#include <cmath>

namespace ccfuse::ref {

MoeNaiveOutput naive_moe(const std::vector<MoeRankInputs>& ranks, const MoeShape& shape) {
  const int world_size = int(ranks.size());
  CCFUSE_ARG_CHECK(world_size >= 1, "naive_moe needs at least one rank");
  CCFUSE_ARG_CHECK(shape.num_experts > 0 && shape.num_experts % world_size == 0, "num_experts ",
                   shape.num_experts, " is not divisible by world_size ", world_size);
  CCFUSE_ARG_CHECK(shape.topk >= 1 && shape.hidden > 0 && shape.ffn > 0, "naive_moe: topk, hidden and ffn must be positive");
  const int k = shape.topk;
  const int e_local = shape.num_experts / world_size;
  const int64_t h = shape.hidden, f = shape.ffn;
  const int64_t f_in = shape.swiglu ? 2 * f : f;
  for (int r = 0; r < world_size; ++r) {
    const MoeRankInputs& in = ranks[size_t(r)];
    const int64_t t = in.num_tokens;
    CCFUSE_ARG_CHECK(t >= 0 && int64_t(in.x.size()) == t * h && int64_t(in.topk_ids.size()) == t * k &&
                         int64_t(in.topk_weights.size()) == t * k,
                     "naive_moe: rank ", r, "'s x / topk arrays do not match its ", t, " tokens");
    CCFUSE_ARG_CHECK(int64_t(in.w1.size()) == e_local * h * f_in && int64_t(in.w2.size()) == e_local * f * h,
                     "naive_moe: rank ", r, "'s w1 / w2 do not match the shape");
  }

  MoeNaiveOutput result;
  result.act.resize(size_t(world_size));
  result.out.resize(size_t(world_size));
  std::vector<double> hid(static_cast<size_t>(f_in));
  for (int r = 0; r < world_size; ++r) {
    const MoeRankInputs& in = ranks[size_t(r)];
    std::vector<double>& act = result.act[size_t(r)];
    std::vector<double>& out = result.out[size_t(r)];
    act.assign(size_t(in.num_tokens * k * f), 0.0);
    out.assign(size_t(in.num_tokens * h), 0.0);
    for (int64_t t = 0; t < in.num_tokens; ++t) {
      for (int slot = 0; slot < k; ++slot) {
        const int32_t e = in.topk_ids[size_t(t * k + slot)];
        if (e < 0) continue;
        CCFUSE_ARG_CHECK(e < shape.num_experts, "naive_moe: expert id ", e, " out of range");
        const MoeRankInputs& owner = ranks[size_t(e / e_local)];
        const double* w1 = owner.w1.data() + int64_t(e % e_local) * h * f_in;
        const double* w2 = owner.w2.data() + int64_t(e % e_local) * f * h;
        for (int64_t j = 0; j < f_in; ++j) {
          double v = 0.0;
          for (int64_t p = 0; p < h; ++p) v += in.x[size_t(t * h + p)] * w1[p * f_in + j];
          hid[size_t(j)] = v;
        }
        double* a = act.data() + (t * k + slot) * f;
        for (int64_t j = 0; j < f; ++j) {
          if (shape.swiglu) {
            const double g = hid[size_t(j)];
            a[j] = g / (1.0 + std::exp(-g)) * hid[size_t(f + j)];
          } else {
            a[j] = hid[size_t(j)];
          }
        }
        const double w = in.topk_weights[size_t(t * k + slot)];
        for (int64_t c = 0; c < h; ++c) {
          double v = 0.0;
          for (int64_t j = 0; j < f; ++j) v += a[j] * w2[j * h + c];
          out[size_t(t * h + c)] += w * v;
        }
      }
    }
  }
  return result;
}

}  // namespace ccfuse::ref

namespace ccfuse::ref {

MoeNaiveGrad naive_moe_backward(const std::vector<MoeRankInputs>& ranks, const MoeShape& shape,
                                const std::vector<std::vector<double>>& grad_out) {
  // The forward's checks (and its activations, which the backward reads, as the GPU's would).
  const MoeNaiveOutput fwd = naive_moe(ranks, shape);
  const int world_size = int(ranks.size());
  CCFUSE_ARG_CHECK(int(grad_out.size()) == world_size, "naive_moe_backward: grad_out has ", grad_out.size(),
                   " ranks, the inputs ", world_size);
  const int k = shape.topk;
  const int e_local = shape.num_experts / world_size;
  const int64_t h = shape.hidden, f = shape.ffn;
  const int64_t f_in = shape.swiglu ? 2 * f : f;
  MoeNaiveGrad g;
  g.dx.resize(size_t(world_size));
  g.dw.resize(size_t(world_size));
  g.dw1.resize(size_t(world_size));
  g.dw2.resize(size_t(world_size));
  for (int r = 0; r < world_size; ++r) {
    const int64_t t = ranks[size_t(r)].num_tokens;
    CCFUSE_ARG_CHECK(int64_t(grad_out[size_t(r)].size()) == t * h, "naive_moe_backward: rank ", r,
                     "'s grad_out does not match its ", t, " tokens");
    g.dx[size_t(r)].assign(size_t(t * h), 0.0);
    g.dw[size_t(r)].assign(size_t(t * k), 0.0);
    g.dw1[size_t(r)].assign(size_t(e_local * h * f_in), 0.0);
    g.dw2[size_t(r)].assign(size_t(e_local * f * h), 0.0);
  }
  std::vector<double> hid(static_cast<size_t>(f_in)), u(static_cast<size_t>(f)), dh(static_cast<size_t>(f_in));
  for (int r = 0; r < world_size; ++r) {
    const MoeRankInputs& in = ranks[size_t(r)];
    const double* gout = grad_out[size_t(r)].data();
    for (int64_t t = 0; t < in.num_tokens; ++t) {
      const double* xt = in.x.data() + t * h;
      const double* gt = gout + t * h;
      for (int slot = 0; slot < k; ++slot) {
        const int32_t e = in.topk_ids[size_t(t * k + slot)];
        if (e < 0) continue;
        const int owner_rank = e / e_local;
        const MoeRankInputs& owner = ranks[size_t(owner_rank)];
        const int64_t le = e % e_local;
        const double* w1 = owner.w1.data() + le * h * f_in;
        const double* w2 = owner.w2.data() + le * f * h;
        double* dw1 = g.dw1[size_t(owner_rank)].data() + le * h * f_in;
        double* dw2 = g.dw2[size_t(owner_rank)].data() + le * f * h;
        const double* a = fwd.act[size_t(r)].data() + (t * k + slot) * f;
        const double p = in.topk_weights[size_t(t * k + slot)];
        for (int64_t j = 0; j < f_in; ++j) {  // h = x W1 again (the forward does not return it)
          double v = 0.0;
          for (int64_t q = 0; q < h; ++q) v += xt[q] * w1[q * f_in + j];
          hid[size_t(j)] = v;
        }
        double dp = 0.0;
        for (int64_t j = 0; j < f; ++j) {
          double v = 0.0;
          for (int64_t c = 0; c < h; ++c) v += gt[c] * w2[j * h + c];
          u[size_t(j)] = v;
          dp += v * a[j];
        }
        g.dw[size_t(r)][size_t(t * k + slot)] = dp;
        for (int64_t j = 0; j < f; ++j)
          for (int64_t c = 0; c < h; ++c) dw2[j * h + c] += p * a[j] * gt[c];
        for (int64_t j = 0; j < f; ++j) {
          const double da = p * u[size_t(j)];
          if (shape.swiglu) {  // act = silu(gate) * up; silu'(z) = s(z) (1 + z (1 - s(z)))
            const double z = hid[size_t(j)], up = hid[size_t(f + j)];
            const double s = 1.0 / (1.0 + std::exp(-z));
            dh[size_t(j)] = da * up * s * (1.0 + z * (1.0 - s));
            dh[size_t(f + j)] = da * z * s;
          } else {
            dh[size_t(j)] = da;
          }
        }
        double* dxt = g.dx[size_t(r)].data() + t * h;
        for (int64_t q = 0; q < h; ++q) {
          double v = 0.0;
          for (int64_t j = 0; j < f_in; ++j) {
            v += dh[size_t(j)] * w1[q * f_in + j];
            dw1[q * f_in + j] += xt[q] * dh[size_t(j)];
          }
          dxt[q] += v;
        }
      }
    }
  }
  return g;
}

}  // namespace ccfuse::ref
