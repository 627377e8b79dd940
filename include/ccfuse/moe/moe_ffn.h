// ccfuse/moe/moe_ffn.h: the expert-parallel MoE FFN on GPUs, both layers fused with their
// communication (DESIGN §1 rows moe_dispatch_gemm, moe_gemm_combine), all-to-all dispatch, host API.
//
// Per rank r of a Team of W GPUs (E experts, E_local = E / W, rank r owns experts
// [r * E_local, (r + 1) * E_local)):
//   x          [T_r, H]   this rank's tokens (T_r <= max_tokens, may differ per rank, 0 allowed)
//   topk_ids   [T_r, k]   int32 global expert ids, -1 = dropped (the router's output)
//   topk_w     [T_r, k]   float router weights
//   w1         [E_local, H, 2F] (kKN) or [E_local, 2F, H] (kNK): the fused gate/up projection,
//              its 2F columns in gemm::swiglu_column_permutation(F, 256) order (gate and up
//              halves of every 256-column tile); with swiglu = false: [.., H, F] / [.., F, H]
//   w2         [E_local, F, H] (kKN) or [E_local, H, F] (kNK)
//   out        [T_r, H]   out[t] = sum over slots s with topk_ids[t, s] >= 0 of
//                         topk_w[t, s] * act(x[t] @ W1_e) @ W2_e, summed in fp32
//                         (exact zeros for a token whose slots are all dropped)
// act = silu(gate) * up (swiglu) or the identity; it is rounded to bf16 between the layers.
//
// v1 design (docs/moe-layers.md, "GPU v1"):
//  1. Entry barrier + epoch; each rank counts its entries per expert and pushes that row of the
//     [W][E] counts matrix to every peer (one flag per source). From the matrix every rank knows
//     every receiver's expert-sorted buffer (ccfuse/moe/dispatch_plan.h).
//  2. Layer 0: one persistent grouped-GEMM kernel over the local experts. Its send warps push this
//     rank's rows to their final rows in each owner's receive buffer (own rows first, then the
//     peers'), in chunks of 128 rows of a (source, expert) block, each with its row's (source,
//     entry, weight) and a flag per chunk; each tile's producer waits only for the chunks of its
//     rows. SwiGLU runs in the epilogue.
//  3. Layer 1: the grouped down-projection kernel scales each row by its router weight in the
//     epilogue; its send warps forward each finished tile's rows to their token's owner (a slot
//     buffer [T, k, H] per rank) and count rows per source; the last tile for a source releases
//     that source's flag. A small kernel then sums each token's k slots in fp32.
// No host synchronisation: token counts stay on the device; buffers are sized for the worst
// case (every entry of every rank on one rank: W * max_tokens * k rows). CUDA-graph capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ccfuse/comm/team.h"
#include "ccfuse/gemm/gemm.h"

namespace ccfuse::moe {

struct MoeFfnDesc {
  int64_t max_tokens = 0;  // bound on T_r of every rank (sizes the buffers)
  int64_t hidden = 0;      // H
  int64_t ffn = 0;         // F (per expert)
  int num_experts = 0;     // global E, divisible by W
  int topk = 1;
  bool swiglu = true;
  DType dtype = DType::kBFloat16;  // bf16 only in v1
  gemm::BLayout b_layout = gemm::BLayout::kKN;
  // Layer 1's B layout where it differs from layer 0's (MoeFfnBackward reads W1 [E, 2F, H] as
  // layer 0's [N, K] and as layer 1's [K, N]); unset: b_layout.
  std::optional<gemm::BLayout> l1_b_layout;
};

// How layer 1 returns rows to their tokens' owners (docs/moe-layers.md):
//   kPerSlot  v1: the send warps forward every (token, slot) row as its tile finishes
//             (overlapped with the GEMM; k rows per token travel), the owner sums the slots.
//   kPresum   v2a: after the GEMM, each rank sums its slots of every (source, token) in fp32 and
//             sends one bf16 row per (token, rank); the owner sums the ranks' rows in rank
//             order. k / (slots per rank) times fewer bytes, not overlapped. topk <= 32.
//   kAuto     moe::auto_combine (moe_tuner.h): kPresum for 2 <= topk <= 32, else kPerSlot (top-1
//             has nothing to pre-sum; not measured). Measured 2026-11-30 on 2x H200 (18 cases,
//             bench/results/2026-11-30-h200x2-moe-ffn-ab-*): presum 1.742x the serial layer
//             (geomean) against per-slot 1.526x; Qwen3 layer 1 0.71 -> 0.39 ms, DeepSeek 3.67 ->
//             2.82 ms at 4096 tokens; Mixtral (top-2) within 1 %.
enum class MoeCombine { kAuto, kPerSlot, kPresum };

// How layer 0 brings the tokens to their experts' ranks (DESIGN §1; docs/moe-layers.md):
//   kAllToAll   every (token, slot) row goes to its expert's owner, into its final row there
//               (up to k rows per token over the links).
//   kAllGather  every token goes once to every other rank (with the routing); each rank then
//               copies the rows of its own experts into place locally: one row per token and
//               peer over the links, plus a local permute. Opt-in: measured 2026-11-30 at
//               W = 2, slower than all-to-all on all 18 cases (1.64x vs 1.72x the serial
//               layer; the permute's HBM time exceeds the link time it saves). Layer 1 is the
//               same in both modes.
enum class MoeDispatch { kAllToAll, kAllGather };

struct MoeFfnConfig {
  int num_sms = 0;  // CTAs of each persistent GEMM; 0 = every SM
  MoeCombine combine = MoeCombine::kAuto;
  MoeDispatch dispatch = MoeDispatch::kAllToAll;
  // Layer 0's send order: false = this rank's own experts first, then the next owner's, ...;
  // true = local expert j of every owner in turn, the order in which the receivers' tiles need
  // the rows. Measured 2026-11-30 (with presum, dispatch by units): 0.88-0.93x the time on the
  // balanced Qwen3 / DeepSeek cases at 8192-16384 tokens, 1.02-1.05x on skewed and small ones;
  // with the striped dispatch it wins (1.966x vs 1.948x the serial layer). The MoE tuner's
  // send_order says when (moe_tuner.h); the default here stays owner-major.
  bool interleave_sends = false;
  // The grouped GEMMs of layer 0 (activation on the way) and of the pre-summed layer 1 (router
  // weight as row scale) store their tiles through shared memory and TMA (128x256x64, 3 stages);
  // a group's cut last tile, and the per-slot layer 1 (whose send warps forward each stored tile),
  // store from registers. false: every tile from registers (128x256x64, 4 stages), as before
  // 2026-11-30. The plain grouped GEMM measured +15 % with it (docs/perf-notes.md).
  bool tma_store = true;
  // Layer 0's tile order: 1 = every local expert's row tiles whose rows are all this rank's own
  // tokens (copied locally, waiting for no peer) first, then the tiles that need rows from peers,
  // which arrive meanwhile; 0 = expert by expert (each expert's own rows first); -1 = per call,
  // moe::auto_local_first (local-first at <= 4096 tokens with owner-major sends: measured faster
  // there, slower on larger calls; docs/perf-notes.md 2026-11-30).
  int local_first = -1;
  // Layer 0's all-to-all dispatch: 0 = each GEMM CTA's send warps copy whole units of 128 rows
  // (one unit per CTA in flight: a round of units finishes together); 1 = striped, the send rows
  // dealt to all CTAs' send warps in send order (stripe_rows a warp a round, one fence a round), each
  // unit's flag raised by the warp that counts its last row, so rows arrive in order; -1 =
  // moe::auto_striped (rows of >= 4 KB; measured 2026-11-30, docs/perf-notes.md). The MoE tuner
  // pairs striped with interleaved sends (interleave_sends) and expert-order tiles.
  int striped_dispatch = -1;
  // Striped dispatch: rows a send warp copies per round, 1..32 (one system fence a round; more
  // rows per fence for small rows, coarser arrival order). 16 (MoeTunerConstants::kStripeRows):
  // measured 2026-11-30 against 4 and 8, faster for 4 KB rows, even for 8-14 KB.
  int stripe_rows = 16;
  // Striped dispatch: 1 = each send warp moves its rows by bulk copies (cp.async.bulk) through a
  // ring of shared-memory slots that layer 0's GEMM leaves free (up to 8 pieces of 4 KB a warp in
  // flight; with SwiGLU the staging buffer's unused half and the 227 KiB's tail, 12 slots a CTA);
  // 0 = through registers (one row a warp in flight); -1 = moe::auto_bulk_dispatch. Where a warp
  // gets fewer than 2 slots (no SwiGLU: only the tail) it copies through registers anyway.
  // An experiment, opt-in (auto: off): measured 2026-12-06 at W = 1, the copy alone 4-10 % faster,
  // layer 0 level on Qwen3 and Mixtral and 1.7x slower on DeepSeek-like at 16384 tokens
  // (docs/moe-layers.md, "Bulk copies").
  int bulk_dispatch = -1;
  // EXPERIMENT (2026-11-30, opt-in): layer 0's all-to-all dispatch paced over this many
  // microseconds (send-list row i, or unit u, not before the dispatch's start + i / n of it)
  // instead of one burst, as ag_gemm's push since v3.5 (docs/tp-fusion.md): the burst slows the
  // GEMM beside it (Qwen3 layer 0: ~0.07 ms of 0.51). 0 = burst. Bench env
  // CCFUSE_MOE_DISPATCH_SPREAD_FRACTION (a fraction of layer 0's estimated GEMM time).
  int dispatch_spread_us = 0;
  // Layer 1 with the pre-summed combine: 0 = the pre-sum as a kernel after the GEMM (default);
  // n > 0 = n CTAs that pre-sum each slice of columns beside the GEMM as soon as the GEMM has
  // stored it (the GEMM takes its tiles slice by slice on the other SMs); -1 = the MoE tuner's
  // estimate (presum_ctas_for). Beside the GEMM measured slower, 2026-11-30: the sliced order
  // costs the GEMM its L2 reuse of A and the side CTAs their SMs (Mixtral layer 1 2.39 vs 1.76 ms).
  int presum_ctas = 0;
  // All-gather mode only (dispatch = kAllGather): layer 0's grouped GEMM reads each row where it
  // lies (this rank's tokens in x, the peers' in the gathered buffer), its producer warp gathering
  // A row by row (cp.async) instead of TMA loads of a permuted copy: no local permute at all, so
  // one row per token and peer over the links and no HBM copy. An experiment, opt-in: measured
  // 2026-11-30 at 1.4-2.0x the grouped GEMM alone for layer 0, slower than the permute on Mixtral
  // and DeepSeek-like, level on Qwen3 (docs/moe-layers.md "Rows read in place").
  bool gather_rows = false;
  // Layer 1's grouped GEMM with the pre-summed combine after it (presum_ctas 0) and tma_store:
  // 1 = ping-pong consumers on 128x128x64 tiles with 6 stages (the engine's staging ring: each
  // warpgroup's epilogue runs under the other's mainloop, what the plain GEMM does for K <= 1024);
  // 0 = the cooperative 128x256x64/3 tile; -1 = moe::auto_l1_pingpong (H >= 4096: its GEMM's N, the
  // grouped GEMM's rule). Written and measured 2026-12-02 (docs/moe-layers.md).
  int l1_pingpong = -1;
  // Layer 1 always ends in the combine kernel. At W = 1 the pre-sum otherwise writes the output
  // itself (the combine would copy its one partial; since 2026-12-06, docs/moe-layers.md); true
  // keeps the W > 1 path there (A/B runs, and tests of the combine kernel on one GPU). Tool env
  // CCFUSE_MOE_L1_DIRECT=0.
  bool always_combine = false;
  // Layer 0's preparation of a call of at most 2048 routing entries (tokens x topk: decode-sized
  // calls): 1 = one kernel in one CTA (ranking, counts and send list on chip); 0 = the two chunk
  // kernels every larger call takes; -1 = 0 unless env CCFUSE_MOE_PREP_ONE=1 (the A/B switch).
  // An experiment for the decode floor (2026-12-07): correct, 2 us less preparation but the same
  // whole layer on one H100 (the two kernels' second launch is hidden by PDL), so opt-in
  // (docs/moe-layers.md).
  int prep_one = -1;
  // Check topk_ids on the device before each call and throw InvalidArgument naming the first
  // entry outside [-1, num_experts): costs a host sync, so off by default (then such an entry
  // counts as dropped). Tests and debugging turn it on.
  bool check_routing = false;
};

// Largest W the fused MoE layers are built for.
constexpr int kMaxMoeRanks = 8;

class MoeFfn {
 public:
  // Collective over the Team (allocates symmetric buffers and signals). Throws InvalidArgument
  // naming the rule: W divides E and is at most 8; 1 <= topk <= E; max_tokens > 0; local_first and
  // striped_dispatch in [-1, 1]; bulk_dispatch and prep_one in [-1, 1]; stripe_rows in [1, 32]; dispatch_spread_us in [0, 100000]; l1_pingpong
  // in [-1, 1], and 1 only with the pre-sum after the GEMM and tma_store; H a positive
  // multiple of 256 (layer 1 forwards whole 256-column tiles); F a positive multiple of 8, and of
  // 128 with SwiGLU; dtype bf16; max_tokens * topk * W < 2^31.
  MoeFfn(comm::Team& team, const MoeFfnDesc& desc, MoeFfnConfig config = {});
  ~MoeFfn();
  MoeFfn(const MoeFfn&) = delete;
  MoeFfn& operator=(const MoeFfn&) = delete;

  // The whole FFN (layer 0 + activation + layer 1) for this rank's num_tokens tokens; every rank
  // calls it (collective), on its stream. Pointers: device memory, 16-byte aligned. Throws
  // InvalidArgument on num_tokens > max_tokens or < 0, null or misaligned pointers, out
  // overlapping x, and (config.check_routing) expert ids outside [-1, num_experts). Sizes of the
  // buffers behind the pointers (e.g. a w1 of another hidden size) cannot be checked from raw
  // pointers: they are the caller's contract.
  // preact_out (training; nullptr: none): layer 0's output before its activation is also kept
  // there, [max_rows(), 2F] bf16 with SwiGLU (each 256-column tile's [128 gate | 128 up] columns,
  // w1's order as run takes it; [max_rows(), F] without), in the receive order of
  // layer0_output(). MoeFfnBackward::run reads it instead of recomputing layer 0 (h_saved).
  // preact_rows (0: max_rows()): preact_out's rows, in [1, max_rows()]; a call that receives more
  // keeps its first preact_rows rows only, and the backward then recomputes h (decided on the
  // device: no host sync). A bound near the rows a step receives (~ tokens x topk, not the
  // worst case tokens x topk x W) keeps the memory at what a balanced step needs.
  void run(const void* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w, const void* w1,
           const void* w2, void* out, cudaStream_t stream, void* preact_out = nullptr, int64_t preact_rows = 0);

  // Layer 0 alone (dispatch + grouped GEMM + activation) then layer 1 alone, for the bench's
  // per-layer figures: run() == run_layer0() followed by run_layer1() on the same stream.
  // gemm = false: the dispatch alone (the received rows, layer0_input(); layer0_output() is not
  // written), for a caller that has the GEMM's result already (MoeFfnBackward with h_saved).
  // gemm_above_rows >= 0 (with gemm): the GEMM runs only if this call receives more rows than
  // that (decided on the device; else the dispatch alone): MoeFfnBackward with a kept h of that
  // many rows. preact_rows: as run's.
  void run_layer0(const void* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w, const void* w1,
                  cudaStream_t stream, void* preact_out = nullptr, bool gemm = true, int64_t preact_rows = 0,
                  int64_t gemm_above_rows = -1);
  void run_layer1(int64_t num_tokens, const int32_t* topk_ids, const void* w2, void* out, cudaStream_t stream);

  // After a call (stream-ordered; for tests and the bench): rows this rank received, per local
  // expert (device, [E_local] ints), and the layer-0 output [max_rows, F] (device, bf16) in the
  // receive order (local experts in order; inside an expert the sources rotated from this rank).
  const int32_t* expert_rows_device() const;
  const void* layer0_output() const;
  int64_t max_rows() const;
  // The rows layer 0 received, [max_rows, H] (device, bf16), in the same receive order.
  const void* layer0_input() const;

  std::string describe() const;  // "moe_ffn v1 dispatch=alltoall ..."

 private:
  friend class MoeFfnBackward;
  // Layer 0's state after a call, for MoeFfnBackward: its output (writable), each received row's
  // (source rank, entry) pair and router weight, the rows' prefix per local expert (device).
  struct Layer0View {
    void* out;
    const int32_t* row_src;  // [max_rows][2]
    const float* row_w;      // [max_rows]
    const int64_t* row_prefix;  // [groups + 1]
    int groups;
  };
  Layer0View layer0_view() const;
  struct State;
  std::unique_ptr<State> s_;
  void run_layer1_presum(int64_t num_tokens, const int32_t* topk_ids, const void* w2, void* out,
                         cudaStream_t stream);
  // direct_out (W = 1): the pre-sum writes the num_tokens output rows itself, no flags, no combine.
  void run_layer1_presum_after(const void* w2, cudaStream_t stream, bool gemm_only, void* direct_out = nullptr,
                               int64_t num_tokens = 0);
};

// The MoE FFN's backward (docs/moe-layers.md, "The backward pass"), v0: the forward's fused
// layers re-used with their roles swapped, activations recomputed (the forward keeps nothing) or,
// with h_saved, read from what the forward kept (MoeFfn::run's preact_out).
// Per rank, for its tokens, with the forward's inputs (x, topk_ids, topk_w, w1, w2: as MoeFfn::run
// takes them, same desc) and g = d loss / d out [T, H] bf16:
//   1. layer 0 of an FFN with N = 2F and no activation: x's rows to their experts' owners (the
//      forward's dispatch, router weights 1) and h = x W1 (gate, up) per expert;
//   2. layer 0 of an FFN with N = F and W2's transpose: g's rows to the same owners, u = g W2^T;
//   3. one kernel per received row: a = silu(gate) * up (rounded to bf16, as the forward),
//      d topk_w = <u, a>, d h = SwiGLU'(h, p u) (in place of h), p a (in place of u);
//   4. layer 1 of the first FFN with W1's transpose and weights 1: d x = sum over slots of
//      d h W1^T, combined at the tokens' owners as the forward's output is;
//   5. d topk_w to the tokens' owners (one float per slot over NVLink, two barriers).
// No host synchronisation. The weight gradients are per-expert GEMMs over the received rows (K
// varies per expert: d W1_e = d h_e^T x_e, d W2_e = g_e^T (p a)_e, or their transposes for kKN
// weights), which the engine has no form for yet: wgrad_operands() gives their operands, valid
// until the next run on this rank (enqueue their GEMMs on the same stream before it; PyTorch's
// torch._grouped_mm takes them as they are: docs/integration.md).
struct MoeWgradOperands {
  const void* x_rows = nullptr;    // [max_rows, H] bf16: the received x rows
  const void* dh_rows = nullptr;   // [max_rows, 2F] (F without SwiGLU) bf16: d h, w1's column order
  const void* g_rows = nullptr;    // [max_rows, H] bf16: the received g rows
  const void* pa_rows = nullptr;   // [max_rows, F] bf16: p * a
  const int32_t* expert_rows = nullptr;  // [E_local] int32 on the device: rows per local expert, in order
  const int32_t* row_src = nullptr;      // [max_rows][2] int32: each row's (source rank, entry = token * k + slot)
  int64_t max_rows = 0;
};

class MoeFfnBackward {
 public:
  // Collective (three MoeFfn's worth of symmetric buffers less one layer 1: ~2x the forward's).
  // desc as the forward's MoeFfn. w1_swiglu_tiles: w1's 2F rows (columns for kKN) in
  // gemm::swiglu_column_permutation order, as MoeFfn::run takes them with SwiGLU (true), or gate
  // rows then up rows (false: torch's Linear weights; the gradients come in the same order).
  // Throws InvalidArgument as MoeFfn does.
  MoeFfnBackward(comm::Team& team, const MoeFfnDesc& desc, bool w1_swiglu_tiles, MoeFfnConfig config = {});
  ~MoeFfnBackward();
  MoeFfnBackward(const MoeFfnBackward&) = delete;
  MoeFfnBackward& operator=(const MoeFfnBackward&) = delete;

  // Collective; stream-ordered. dx [T, H] bf16; dtopk_w [T, k] float (0 for dropped slots).
  // Throws InvalidArgument as MoeFfn::run does, and for dx overlapping g or x.
  // h_saved (nullptr: recompute): the forward's pre-activation, MoeFfn::run's preact_out from a
  // MoeFfn of the same desc and config with the same routing (then the receive orders agree);
  // step 1 dispatches x without its GEMM and step 3 reads h from h_saved (left unchanged), two of
  // the backward's eight GEMM units fewer. w1 stays in w1_swiglu_tiles order (h_saved is in the
  // forward's tile order either way). h_rows (0: max_rows()): h_saved's rows, the forward's
  // preact_rows; where this call receives more rows than that (the forward kept only some), step 1
  // recomputes h after all and step 3 reads the recomputed one (decided on the device).
  void run(const void* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w, const void* w1,
           const void* w2, const void* g, void* dx, float* dtopk_w, cudaStream_t stream,
           const void* h_saved = nullptr, int64_t h_rows = 0);
  MoeWgradOperands wgrad_operands() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

namespace internal {
// What layer 0's exchange kernel derives from the counts matrix (for tests: any W <= 8 on one GPU,
// no peers involved). counts: [W][E] entries of source s for expert e, as every rank sees it.
struct PlanArrays {
  std::vector<int32_t> group_rows;                       // [E_local]
  std::vector<int64_t> row_prefix;                       // [E_local + 1]
  std::vector<int32_t> tile_prefix0, tile_prefix1;       // [E_local + 1]
  std::vector<int32_t> local_prefix0;                    // [E_local + 1]
  std::vector<int32_t> chunk_base;                       // [W][E + 1]
  std::vector<int64_t> rows_base;                        // [E + 1]
  std::vector<int64_t> block_begin;                      // [E]
  std::vector<int64_t> target;                           // [W]
  std::vector<int32_t> perm_base;                        // [W * E_local + 1]
};
// Runs the derivation on the current GPU for `rank` of `world` (interleaved: the interleaved send
// order, MoeFfnConfig::interleave_sends) with 128-row chunks and tiles.
PlanArrays derive_plan_for_test(int world, int rank, int experts, bool interleaved, const std::vector<int32_t>& counts,
                                int n_tiles0, int n_tiles1, int64_t max_rows);
}  // namespace internal

}  // namespace ccfuse::moe
