// src/moe/moe_tuner.cpp: the fused MoE FFN's tuner (include/ccfuse/moe/moe_tuner.h, docs/moe-tuner.md).
#include "ccfuse/moe/moe_tuner.h"

#include <cmath>
#include <sstream>

#include "ccfuse/common/error.h"

namespace ccfuse::moe {

using C = MoeTunerConstants;

namespace {
std::string num(double v) {
  std::ostringstream os;
  os.precision(3);
  os << v;
  return os.str();
}
}  // namespace

const char* auto_combine(int topk, int /*world_size*/) {
  return topk >= 2 && topk <= C::kPresumMaxTopk ? "presum" : "per-slot";
}

// Layer 1's pre-sum moves, per rank, its received rows (read once: T k rows of H, balanced) and
// one partial row per (token, rank) of every source (written, W T rows of H; bf16).
double presum_bytes(const MoeProblem& p) {
  return double(p.tokens_per_rank) * double(p.topk) * double(p.hidden) * 2.0 +
         double(p.world_size) * double(p.tokens_per_rank) * double(p.hidden) * 2.0;
}
// Layer 1's GEMM per rank (T k rows x F -> H), at the grouped GEMM's measured ~600 TFLOP/s.
double layer1_gemm_seconds(const MoeProblem& p) {
  return 2.0 * double(p.tokens_per_rank) * double(p.topk) * double(p.hidden) * double(p.ffn) / 600e12;
}

int presum_ctas_for(const MoeProblem& p) {
  using C = MoeTunerConstants;
  const double need = presum_bytes(p) / (C::kPresumCtaGbps * 1e9 * layer1_gemm_seconds(p));
  const int n = int(std::ceil(need));
  return n < C::kPresumMinCtas ? C::kPresumMinCtas : n > C::kPresumMaxCtas ? C::kPresumMaxCtas : n;
}

MoeChoice choose_moe_config(const MoeProblem& p) {
  CCFUSE_ARG_CHECK(p.world_size >= 1, "world_size ", p.world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(p.num_experts >= 1 && p.num_experts % p.world_size == 0, "num_experts ", p.num_experts,
                   " is not divisible by the world size ", p.world_size, " (experts are split evenly over the ranks)");
  CCFUSE_ARG_CHECK(p.topk >= 1 && p.topk <= p.num_experts, "topk ", p.topk, " must be in [1, num_experts = ",
                   p.num_experts, "]");
  CCFUSE_ARG_CHECK(p.tokens_per_rank > 0 && p.hidden > 0 && p.ffn > 0, "tokens_per_rank, hidden, ffn must be positive "
                   "(got ", p.tokens_per_rank, ", ", p.hidden, ", ", p.ffn, ")");
  CCFUSE_ARG_CHECK(p.imbalance == 0 || (std::isfinite(p.imbalance) && p.imbalance >= 1), "imbalance ", p.imbalance,
                   " must be 0 (unknown) or >= 1 (most rows a rank receives / the mean)");
  MoeChoice c;
  std::ostringstream why;
  c.dispatch = "all-to-all";
  c.alltoall_over_allgather_bytes = p.world_size > 1 ? double(p.topk) / double(p.world_size) : 1.0;
  why << "dispatch all-to-all (the all-gather mode measured slower on all 18 cases, 1.64x vs 1.72x the serial "
         "layer: its local permute costs more HBM time than the link bytes it saves at W = 2";
  if (c.alltoall_over_allgather_bytes > 1)
    why << "; it would move " << num(c.alltoall_over_allgather_bytes) << "x fewer dispatch bytes here";
  why << "). ";
  c.combine = auto_combine(p.topk, p.world_size);
  if (c.combine == std::string("presum"))
    why << "combine presum: one row per (token, rank) instead of one per slot (" << p.topk
        << " slots; measured 1.74x vs 1.53x the serial layer over 18 cases). ";
  else if (p.topk == 1)
    why << "combine per-slot: top-1 has nothing to pre-sum, and the per-slot sends overlap the GEMM. ";
  else
    why << "combine per-slot: topk " << p.topk << " > " << C::kPresumMaxTopk << " (a warp holds a token's slots). ";
  const bool balanced = p.imbalance > 0 && p.imbalance <= C::kInterleaveMaxImbalance;
  c.striped_dispatch = auto_striped(p.hidden * 2, p.world_size);
  c.stripe_rows = C::kStripeRows;
  const bool interleave =
      p.world_size > 1 && (c.striped_dispatch || (balanced && p.tokens_per_rank >= C::kInterleaveMinTokens));
  c.send_order = interleave ? "interleaved" : "owner-major";
  why << "layer 0 dispatch " << (c.striped_dispatch ? "striped" : "by units") << ": rows of " << p.hidden * 2
      << (c.striped_dispatch ? " >= " : " < ") << C::kStripedMinRowBytes
      << " bytes (striped, the rows leave in send order with a fence per " << c.stripe_rows
      << " rows a warp; by units, a round "
         "of 128-row units finishes together; measured 2026-11-30";
  if (p.world_size == 1)
    why << "; at W = 1 the same rule for the local copy: layer 0 striped 0.80x-0.98x its time by units, "
           "2026-12-02";
  why << "). ";
  if (p.world_size == 1)
    why << "send order owner-major: one rank, nothing to send. ";
  else if (c.striped_dispatch)
    why << "send order interleaved: striped rows leave in the order every receiver's tiles take them. ";
  else if (interleave)
    why << "send order interleaved: balanced routing (imbalance " << num(p.imbalance) << " <= "
        << C::kInterleaveMaxImbalance << ") and " << p.tokens_per_rank << " >= " << C::kInterleaveMinTokens
        << " tokens per rank (measured 0.88-0.99x the time there). ";
  else
    why << "send order owner-major: "
        << (p.imbalance == 0 ? std::string("routing skew unknown")
                             : !balanced ? "skewed routing (imbalance " + num(p.imbalance) + ")"
                                         : std::to_string(p.tokens_per_rank) + " tokens per rank < " +
                                               std::to_string(C::kInterleaveMinTokens))
        << " (interleaving measured 1.02-1.05x the time on skewed and small problems). ";
  c.local_first = auto_local_first(p.tokens_per_rank, p.world_size, interleave, c.striped_dispatch);
  if (p.world_size > 1) {
    why << "layer 0 tiles " << (c.local_first ? "local-first" : "expert by expert") << ": ";
    if (c.local_first)
      why << "the row tiles of own rows wait for no peer while the rest arrives (" << p.tokens_per_rank
          << " <= " << C::kLocalFirstMaxTokens << " tokens per rank). ";
    else if (interleave)
      why << "interleaved sends copy the own rows along with the rest, in the tiles' order. ";
    else
      why << "a second pass over each expert's weights costs more than the waits it saves (" << p.tokens_per_rank
          << " > " << C::kLocalFirstMaxTokens << " tokens per rank). ";
  }
  c.num_comm_ctas = 0;
  c.send_warps_per_cta = 3;
  c.unit_rows = 128;
  why << "layer 0 n_c 0: the three idle producer warps of every GEMM CTA copy the rows (dedicated CTAs cost "
         "the persistent GEMM its SMs: measured slower in the TP ops); units of 128 rows, one GEMM row tile "
         "and one flag each. ";
  c.presum_ctas = 0;
  if (c.combine != std::string("presum"))
    why << "layer 1 pre-sum CTAs: none (per-slot combine).";
  else
    why << "layer 1 pre-sum after the GEMM (presum_ctas 0): beside it in side CTAs over a sliced tile order "
           "measured slower on 17 of 18 cases (1.70x vs 1.83x the serial layer; Mixtral layer 1 2.39 vs "
           "1.76 ms), presum_ctas_for would give " << presum_ctas_for(p) << " here.";
  c.l1_pingpong = c.combine == std::string("presum") && auto_l1_pingpong(p.hidden);
  if (c.combine == std::string("presum"))
    why << " layer 1 tiles " << (c.l1_pingpong ? "128x128 ping-pong" : "128x256") << ": H = " << p.hidden
        << (c.l1_pingpong ? " >= " : " < ") << C::kL1PingpongMinHidden
        << " (the grouped GEMM's rule by N: ping-pong measured faster on the DeepSeek-like and most Mixtral "
           "cases, slower on Qwen3's; layer 1 of DeepSeek-like -8 to -17 % at W = 1, 2026-12-02).";
  c.why = why.str();
  return c;
}

bool auto_l1_pingpong(int64_t hidden) { return hidden >= MoeTunerConstants::kL1PingpongMinHidden; }

bool auto_local_first(int64_t tokens, int world_size, bool interleaved_sends, bool striped) {
  return world_size > 1 && !interleaved_sends && !striped && tokens <= MoeTunerConstants::kLocalFirstMaxTokens;
}

bool auto_bulk_dispatch(int world_size) {
  // Measured 2026-12-06 at W = 1 (one H100): the copy alone 4-10 % faster and Qwen3's layer 0 0.5-1.6 %,
  // but DeepSeek-like's layer 0 at 16384 tokens 1.7x slower (unexplained), and never run with
  // peers: opt-in everywhere until an EP = 2 run says otherwise.
  (void)world_size;
  return false;
}

bool auto_striped(int64_t row_bytes, int world_size) {
  (void)world_size;  // W = 1 too (its local copy), measured 2026-12-02
  return row_bytes >= MoeTunerConstants::kStripedMinRowBytes;
}

std::string to_string(const MoeChoice& c) {
  std::ostringstream os;
  os << "dispatch=" << c.dispatch << " combine=" << c.combine << " send_order=" << c.send_order
     << " n_c=" << c.num_comm_ctas << " send_warps_per_cta=" << c.send_warps_per_cta << " unit_rows=" << c.unit_rows
     << " presum_ctas=" << c.presum_ctas << " l0_order=" << (c.local_first ? "local-first" : "expert")
     << " l0_dispatch=" << (c.striped_dispatch ? "striped(" + std::to_string(c.stripe_rows) + " rows)" : "units")
     << " l1_tile=" << (c.l1_pingpong ? "128x128-pingpong" : "128x256");
  return os.str();
}

}  // namespace ccfuse::moe
