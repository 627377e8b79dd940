// reference/moe_naive.h: fp64 reference of the two MoE layers, straight from their definitions
// (DESIGN §1): no layout, no chunks, no slices, no signals. Compare with rel_err (naive.h).
//
// For every token t of every rank and every slot s with expert e = topk_ids[t, s] >= 0 (owned
// by rank e / E_local, local index e % E_local):
//   h      = x[t] @ W1_e                                   [F] or [2F] with SwiGLU
//   act    = h                  (plain)                    [F]
//          = silu(h[:F]) * h[F:]  (SwiGLU, gate first)
//   out[t] = Σ_s w[t, s] · act_{t,s} @ W2_e                [H]  (0 if every slot is dropped)
// NOTE: act is NOT rounded to the layer's dtype here (the layers round it to T between layer 0
// and layer 1, as the GPU does). The tests' tolerance covers that one extra rounding: bf16
// ~2^-9 relative per element (1e-2 bound), fp32 ~6e-8 (1e-5 bound).
#pragma once

#include <cstdint>
#include <vector>

#include "reference/moe_layers.h"

namespace ccfuse::ref {

// One rank's inputs as doubles (already rounded to the op's dtype, so that the reference sees
// exactly what the layers see).
struct MoeRankInputs {
  int64_t num_tokens = 0;
  std::vector<double> x;             // [T, H]
  std::vector<int32_t> topk_ids;     // [T, k] global expert ids, -1 = dropped
  std::vector<double> topk_weights;  // [T, k]
  std::vector<double> w1;            // [E_local, H, F] ([E_local, H, 2F] = [gate | up] with SwiGLU)
  std::vector<double> w2;            // [E_local, F, H]
};

struct MoeNaiveOutput {
  // [W][T_r * k * F]: the activation of each (token, slot) of rank r's tokens; 0 where dropped.
  std::vector<std::vector<double>> act;
  // [W][T_r * H]
  std::vector<std::vector<double>> out;
};

// Throws InvalidArgument on sizes that do not match `shape` and W = ranks.size().
MoeNaiveOutput naive_moe(const std::vector<MoeRankInputs>& ranks, const MoeShape& shape);

}  // namespace ccfuse::ref

namespace ccfuse::ref {

// The gradients of the MoE FFN (the plan in docs/moe-layers.md, "The backward pass"), fp64, from
// the definitions above: given d loss / d out of every rank's tokens,
//   u        = g[t] @ W2_e^T                               [F]   (the unscaled gradient at act)
//   d w[t,s] = <u, act_{t,s}>                              (= <g[t], act_{t,s} @ W2_e>)
//   d act    = w[t,s] · u;  d h = act'(h, d act)           [F] or [2F]
//   d x[t]   = Σ_s d h @ W1_e^T                            [H]
//   d W2_e  += w[t,s] · act_{t,s}^T g[t];  d W1_e += x[t]^T d h
// Dropped slots contribute nothing and get d w = 0. Gradients of the weights land on the rank
// that owns the expert, as the forward's weights live there.
struct MoeNaiveGrad {
  std::vector<std::vector<double>> dx;  // [W][T_r * H]
  std::vector<std::vector<double>> dw;  // [W][T_r * k] (the router weights' gradient)
  std::vector<std::vector<double>> dw1;  // [W][E_local * H * F'] (F' = 2F with SwiGLU)
  std::vector<std::vector<double>> dw2;  // [W][E_local * F * H]
};

// grad_out: [W][T_r * H]. Throws InvalidArgument as naive_moe does, and on a grad_out of the wrong size.
MoeNaiveGrad naive_moe_backward(const std::vector<MoeRankInputs>& ranks, const MoeShape& shape,
                                const std::vector<std::vector<double>>& grad_out);

}  // namespace ccfuse::ref
