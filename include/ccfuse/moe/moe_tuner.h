// ccfuse/moe/moe_tuner.h: picks the fused MoE FFN's configuration per problem (issue 5, item 5):
// the dispatch mode, layer 1's combine, layer 0's send order, the communication blocks (n_c) and
// the unit (chunk) size, with a why-string. Host only (no CUDA): the MoE bench's --print-config,
// MoeFfn's MoeCombine::kAuto and the tests use it on any machine. docs/moe-tuner.md has the rules
// and the measurements behind them.
#pragma once

#include <cstdint>
#include <string>

namespace ccfuse::moe {

// One MoE FFN problem as every rank sees it (the same on all ranks: the choice must agree).
struct MoeProblem {
  int world_size = 0;           // EP ranks W
  int num_experts = 0;          // global E, divisible by W
  int topk = 0;                 // slots per token, in [1, E]
  int64_t tokens_per_rank = 0;  // T (a bound, as MoeFfnDesc::max_tokens)
  int64_t hidden = 0, ffn = 0;  // H, F
  // Routing skew: the most rows any rank receives divided by the mean (1 = balanced), e.g. from
  // the router's statistics of the previous step (the layer never syncs the host to learn it);
  // 0 = unknown (treated as skewed: the send order that never lost by much).
  double imbalance = 0;
};

struct MoeChoice {
  std::string dispatch;    // "all-to-all" (MoeDispatch::kAllGather measured slower at W = 2, 2026-11-30)
  std::string combine;     // "presum" | "per-slot" (MoeCombine)
  std::string send_order;  // "interleaved" | "owner-major" (MoeFfnConfig::interleave_sends)
  int num_comm_ctas = 0;   // n_c: CTAs taken from the grouped GEMMs for communication
  int send_warps_per_cta = 3;  // the producer warpgroup's idle warps that copy rows
  int unit_rows = 128;     // rows per dispatch unit and flag (one GEMM row tile)
  // Layer 1 (pre-summed combine): side CTAs that pre-sum each column slice beside the GEMM
  // (MoeFfnConfig::presum_ctas). 0: measured slower beside the GEMM (2026-11-30), so after it.
  int presum_ctas = 0;
  // Layer 0's tile order (MoeFfnConfig::local_first): local-first (auto_local_first) or expert by expert.
  bool local_first = false;
  // Layer 0's striped dispatch (MoeFfnConfig::striped_dispatch; auto_striped): then interleaved
  // sends and expert-order tiles (the rows leave in the order every receiver's tiles take them).
  bool striped_dispatch = false;
  int stripe_rows = 16;  // its rows per send warp and round (MoeTunerConstants::kStripeRows)
  // Layer 1's GEMM on ping-pong 128x128 tiles (MoeFfnConfig::l1_pingpong; auto_l1_pingpong(H)).
  bool l1_pingpong = false;
  // Layer 0's remote bytes per rank, all-to-all over all-gather, for uniform routing: each of a
  // token's k slots lands on a peer with probability (W-1)/W, while the all-gather sends every
  // token to every peer once: k / W. Above 1 the all-gather mode (not built on GPUs) would move
  // fewer bytes; the why-string says so.
  double alltoall_over_allgather_bytes = 0;
  std::string why;
};

// Layer 1's combine for (topk, world size): "presum" for 2 <= topk <= 32 (it sends one row per
// (token, rank) instead of one per slot; a warp holds a token's slots, hence 32), "per-slot"
// otherwise (top-1 has nothing to pre-sum, and the per-slot sends overlap the GEMM). Used by
// MoeFfn for MoeCombine::kAuto.
const char* auto_combine(int topk, int world_size);

// Layer 0's local-first tile order for a call (MoeFfnConfig::local_first = -1): with peers, the
// unit dispatch with sends in owner-major order (the own rows copied first) and at most
// kLocalFirstMaxTokens tokens on this rank.
bool auto_local_first(int64_t tokens, int world_size, bool interleaved_sends, bool striped = false);
// Layer 0's striped dispatch (MoeFfnConfig::striped_dispatch = -1): rows (hidden * 2 bytes in
// bf16) of at least kStripedMinRowBytes (4 KB: Qwen3, Mixtral, DeepSeek-like all), at any W: at
// W = 1 (every row a local copy) striped measured faster than by units on Qwen3 and DeepSeek-like
// (layer 0 0.80-0.98x the time) and level on Mixtral (one H200, 2026-12-02). world_size is kept
// for rules that depend on it.
bool auto_striped(int64_t row_bytes, int world_size);
// Layer 0's striped dispatch by bulk copies through shared memory (MoeFfnConfig::bulk_dispatch =
// -1): where it has been measured faster; nowhere yet (docs/moe-layers.md, "Bulk copies").
bool auto_bulk_dispatch(int world_size);
// Layer 1's grouped GEMM (N = H, K = F) on ping-pong 128x128x64/6 tiles: H >= kL1PingpongMinHidden
// (the grouped GEMM's rule, choose_config: by N).
bool auto_l1_pingpong(int64_t hidden);

// Throws InvalidArgument naming the argument and the rule: world_size < 1, num_experts not
// divisible by it, topk outside [1, num_experts], non-positive tokens/hidden/ffn, imbalance that
// is neither 0 (unknown) nor >= 1.
MoeChoice choose_moe_config(const MoeProblem& problem);

// Layer 1's pre-sum side CTAs for a problem (MoeFfnConfig::presum_ctas = -1, opt-in): enough to
// move the pre-sum's bytes (presum_bytes) within the layer-1 GEMM's time (layer1_gemm_seconds) at
// kPresumCtaGbps a CTA, clamped to [kPresumMinCtas, kPresumMaxCtas]. Estimates, uniform routing.
int presum_ctas_for(const MoeProblem& problem);
double presum_bytes(const MoeProblem& problem);
double layer1_gemm_seconds(const MoeProblem& problem);

// "dispatch=all-to-all combine=presum send_order=interleaved n_c=0 send_warps_per_cta=3
//  unit_rows=128 presum_ctas=8" (one line; the why is choice.why).
std::string to_string(const MoeChoice& choice);

// The rules' thresholds (measured on 2x H200, 2026-11-30; docs/moe-tuner.md).
struct MoeTunerConstants {
  static constexpr int64_t kInterleaveMinTokens = 8192;  // interleaved sends won from here (balanced)
  // Layer 0's local-first tile order won below this many tokens per rank (2026-11-30: Qwen3 layer 0
  // 0.75 -> 0.62 ms, DeepSeek 5.50 -> 5.24 at 4096 uniform); from 8192 it lost 2-23 % (its second
  // pass over each expert's weights; with interleaved sends the local rows also come late).
  static constexpr int64_t kLocalFirstMaxTokens = 4096;
  // Layer 0's striped dispatch (rows dealt to all send warps in send order) from this row size:
  // 2026-11-30, with interleaved sends and expert-order tiles, DeepSeek-like (14 KB rows) fused/limit
  // 1.09-1.28 -> 1.06-1.14 and Mixtral (8 KB) 1-2 % faster. Qwen3 (4 KB rows) lost with 4 rows a
  // fence (-1 % geomean, up to +8 % at 16384 tokens) and won with kStripeRows = 16 (layer 0 -2 to
  // -10 %, 16384 tokens within 1 %; ...-moe-ffn-stripe-rows-ab-8225c47). Smaller rows: not measured.
  static constexpr int64_t kStripedMinRowBytes = 4096;
  // Rows a send warp copies per round of the striped dispatch (MoeFfnConfig::stripe_rows): 16
  // measured 2026-11-30 against 4 and 8 on all 18 cases (Qwen3 fused 0.938 -> 0.887 ms at 4096
  // uniform, Mixtral and DeepSeek-like within 1 %).
  static constexpr int kStripeRows = 16;
  static constexpr double kInterleaveMaxImbalance = 1.25;
  static constexpr int kPresumMaxTopk = 32;
  // Layer 1's pre-sum beside the GEMM (opt-in, MoeFfnConfig::presum_ctas = -1; measured slower
  // 2026-11-30): bytes a side CTA moves per second (an estimate: ~4.8 TB/s of HBM over 132 SMs,
  // at 85 %), and the CTA count's bounds.
  static constexpr double kPresumCtaGbps = 30;
  static constexpr int kPresumMinCtas = 4;
  static constexpr int kPresumMaxCtas = 32;
  // Layer 1 on ping-pong tiles from this H (its GEMM's N), as the grouped GEMM engine: measured
  // 2026-12-02 at W = 1 (`...moe-ffn-w1-ab-l1pp*-50f54a5`), layer 1 with / without: DeepSeek-like
  // (H = 7168) -7.7 to -17 % on all four cases. Qwen3 (H = 2048) gained there too (0 to -8 %), but
  // its EP = 2 GEMM (64 experts of 512 rows, the grouped bench's case) ran 1-5 % slower on it.
  static constexpr int64_t kL1PingpongMinHidden = 4096;
};

}  // namespace ccfuse::moe
