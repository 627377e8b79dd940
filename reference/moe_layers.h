// reference/moe_layers.h: the two MoE layers on the CPU reference world (DESIGN §1, §2), with
// the same protocol as the GPU (signals per (source rank, chunk), epochs, entry barrier).
//
// Per rank r (W ranks, E experts, E_local = E / W experts per rank, experts [r*E_local, ...)):
//   X_r [T_r, H] tokens (T_r may differ per rank, <= max_tokens_per_rank)
//   topk_ids_r / topk_weights_r [T_r, k] (global expert ids; -1 = dropped)
//   W1_r [E_local, H, F], W2_r [E_local, F, H] (row-major per expert)
// Layer 0 (moe_dispatch_gemm): for each local expert e, act_e = X[tokens routed to e] @ W1_e,
//   rows expert-sorted by ccfuse::moe::make_layout (local source rank first); optional SwiGLU
//   (then W1 is [E_local, H, 2F] = [gate | up] and act = silu(gate) * up, [rows, F]).
// Layer 1 (moe_gemm_combine): out_r [T_r, H] = for each token t of rank r, Σ_slots w_{t,s} ·
//   (act_e @ W2_e)[row of (t, s)], summed in fp32, returned to the token's owner.
// Dispatch modes: kAllGather (every rank gathers every rank's tokens, computes its local
//   experts, reduce-scatter back) and kAllToAll (tokens go only to the ranks owning their
//   experts, combine back all-to-all).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ccfuse/common/dtype.h"
#include "ccfuse/moe/layout.h"
#include "reference/world.h"

namespace ccfuse::ref {

enum class DispatchMode { kAllGather, kAllToAll };

struct MoeShape {
  int64_t max_tokens_per_rank = 0;
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F
  int num_experts = 0;
  int topk = 1;
  bool swiglu = false;
};

// Tiling of the reference schedule (mirrors the GPU plan; tuned values live elsewhere).
struct MoeConfig {
  int64_t chunk_tokens = 64;  // layer 0: tokens per transfer chunk (one signal per (source, chunk))
  int block_m = 64;           // layer 0: rows per tile; a tile waits for the chunks of all its rows
  int64_t slice_cols = 64;    // layer 1: N-slice width (columns of H); one signal per (source, slice)
};

// What layer 0 leaves for layer 1 on a rank: the expert-sorted rows and where they came from.
struct MoeMetadata {
  moe::Layout layout;                  // over the entries this rank received; experts are LOCAL ids
                                       // [0, E_local); indices are recv_index * topk + slot
  std::vector<int32_t> row_src_rank;   // [rows] owner rank of each row's token
  std::vector<int32_t> row_src_token;  // [rows] token index on its owner
  std::vector<int32_t> row_slot;       // [rows] top-k slot
  std::vector<float> row_weight;       // [rows] router weight
  // The receive list of layer 0 (what layer 1 sends partial sums back for): the tokens this rank
  // received, concatenated by source rank 0..W-1; [recv_offsets[s], recv_offsets[s+1]) came
  // from rank s. kAllGather: every token of every rank; kAllToAll: only those with at least one
  // expert on this rank.
  std::vector<int64_t> recv_offsets;   // [W + 1]
  std::vector<int32_t> recv_token;     // [received] index of each received token on its owner
  int64_t num_tokens = 0;              // this rank's own tokens (layer 0's num_tokens)
  int topk = 0;                        // k of the layer 0 that built this
};

// Throws InvalidArgument naming the rule (experts divisible by W, topk <= experts, sizes > 0, ...).
void validate_moe(const World& world, const MoeShape& shape);
// The same plus the tiling (chunk_tokens, block_m, slice_cols positive).
void validate_moe(const World& world, const MoeShape& shape, const MoeConfig& config);

template <typename T>
class MoeLayer0 {
 public:
  MoeLayer0(World& world, MoeShape shape, DispatchMode mode);
  MoeLayer0(World& world, MoeShape shape, DispatchMode mode, MoeConfig config);
  ~MoeLayer0();
  // act: resized to [rows, F]; meta filled. Called by every rank inside World::run.
  // preact (training, may be null): resized to [rows, F'] and given the rows before the
  // activation (F' = 2F [gate | up] with SwiGLU), rounded to T: what MoeBackward can read instead
  // of recomputing them (ccfuse::moe::MoeFfn::run's preact_out on GPUs). preact_rows >= 0: the
  // first min(rows, preact_rows) rows only (a GPU caller's bound on its kept buffer).
  void run(int rank, const T* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_weights,
           const T* w1, std::vector<T>& act, MoeMetadata& meta, std::vector<T>* preact = nullptr,
           int64_t preact_rows = -1);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

template <typename T>
class MoeLayer1 {
 public:
  MoeLayer1(World& world, MoeShape shape, DispatchMode mode);
  MoeLayer1(World& world, MoeShape shape, DispatchMode mode, MoeConfig config);
  ~MoeLayer1();
  // out: [num_tokens, H] of this rank's own tokens (num_tokens as given to layer 0).
  void run(int rank, const std::vector<T>& act, const MoeMetadata& meta, const T* w2, int64_t num_tokens, T* out);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ccfuse::ref
