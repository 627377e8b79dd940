// reference/moe_backward.h: the MoE FFN's backward on the CPU reference world, composed from the
// forward's two layers with their roles swapped: the decomposition ccfuse::moe::MoeFfnBackward
// runs on GPUs (docs/moe-layers.md, "The backward pass"), checked here at any W in CI.
//
// Per rank, for its tokens, with the forward's inputs and g = d loss / d out [T, H]:
//   1. MoeLayer0 with N = F' (2F with SwiGLU) and no activation: x to its experts' owners (router
//      weights 1), h = x W1;
//   2. MoeLayer0 with W2's transpose ([E_local, H, F]): g to the same owners, u = g W2^T (the two
//      dispatches must put the rows in one order: checked, Error otherwise);
//   3. per received row: a = act(h) rounded to T (as the forward rounds it), d w = <u, a>,
//      d h = act'(h, w u);
//   4. MoeLayer1 with W1's transpose ([E_local, F', H]) on d h, weights 1: d x at the owners;
//   5. d w to the tokens' owners: a symmetric [max_tokens * k] array per rank, zeroed, then a
//      barrier, the stores, a barrier.
// The weight gradients (per expert over its received rows) are not composed here: the GPU takes
// them from its receive buffers (MoeFfnBackward::wgrad_operands); naive_moe_backward has them.
#pragma once

#include <memory>
#include <vector>

#include "reference/moe_layers.h"

namespace ccfuse::ref {

template <typename T>
class MoeBackward {
 public:
  // shape as the forward's (shape.swiglu: w1 [E_local, H, 2F] = [gate | up]).
  MoeBackward(World& world, MoeShape shape, DispatchMode mode, MoeConfig config = {});
  ~MoeBackward();
  // Every rank inside World::run. w1 [E_local, H, F'], w2 [E_local, F, H] (MoeLayer0 / 1's layouts),
  // g [T, H]; dx [T, H], dw [T, k] (0 for dropped slots). h_saved (may be null): the forward's
  // MoeLayer0 preact rows (same shape, mode and config, same routing), read in step 3 instead of
  // step 1's h (MoeFfnBackward's h_saved; step 1 still dispatches x). Error if its rows are not
  // this call's. h_rows >= 0: h_saved holds the first min(rows, h_rows) rows (the forward's
  // preact_rows); where this call has more rows than h_rows, step 3 reads step 1's h instead.
  void run(int rank, const T* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w, const T* w1,
           const T* w2, const T* g, T* dx, float* dw, const std::vector<T>* h_saved = nullptr,
           int64_t h_rows = -1);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ccfuse::ref
