// The MoE FFN tuner (include/ccfuse/moe/moe_tuner.h): the measured rules on the measured cases,
// the edges of each rule, the why-string and the argument errors.
#include <gtest/gtest.h>

#include <string>

#include "ccfuse/common/error.h"
#include "ccfuse/moe/moe_tuner.h"

namespace ccfuse::moe {
namespace {

MoeProblem problem(int w, int e, int k, int64_t t, int64_t h, int64_t f, double imbalance) {
  MoeProblem p;
  p.world_size = w;
  p.num_experts = e;
  p.topk = k;
  p.tokens_per_rank = t;
  p.hidden = h;
  p.ffn = f;
  p.imbalance = imbalance;
  return p;
}

TEST(MoeTuner, CombineRule) {
  EXPECT_STREQ(auto_combine(1, 2), "per-slot");
  EXPECT_STREQ(auto_combine(2, 2), "presum");
  EXPECT_STREQ(auto_combine(8, 2), "presum");
  EXPECT_STREQ(auto_combine(32, 8), "presum");
  EXPECT_STREQ(auto_combine(33, 8), "per-slot");
}

TEST(MoeTuner, SendOrderFollowsTheMeasuredCases) {
  // 2026-11-30 A/B (bench/results/2026-11-30-h200x2-moe-ffn-ab-*), dispatch by units: interleaved
  // won on the balanced cases from 8192 tokens per rank and lost on the skewed ones and
  // DeepSeek-like at 4096. Since the striped dispatch (rows >= 4 KB: all three models), interleaved
  // always there (...-moe-ffn-striped-ab-c4394f3: DeepSeek-like 4096 uniform fused 8.10 -> 7.28 ms,
  // striped with owner-major sends 7.79; ...-moe-ffn-stripe-rows-ab-8225c47: Qwen3 8192 zipf
  // 2.488 ms by units with owner-major sends -> 2.372 striped, 16 rows a round, interleaved).
  struct Case {
    int e, k;
    int64_t t, h, f;
    double imbalance;
    const char* want;
  };
  const Case cases[] = {
      {128, 8, 16384, 2048, 768, 1.00, "interleaved"},   // Qwen3 uniform: 3.775 -> 3.318 ms
      {128, 8, 8192, 2048, 768, 1.00, "interleaved"},    // Qwen3 uniform: 2.001 -> 1.826
      {256, 8, 16384, 7168, 2048, 1.00, "interleaved"},  // DeepSeek-like uniform: 30.52 -> 28.27
      {256, 8, 4096, 7168, 2048, 1.00, "interleaved"},   // DeepSeek-like, striped (by units: 8.34 -> 8.73, lost)
      {128, 8, 8192, 2048, 768, 1.78, "interleaved"},    // Qwen3 zipf, striped: 2.488 -> 2.372
      {8, 2, 4096, 4096, 14336, 1.56, "interleaved"},    // Mixtral zipf, striped: 7.33 -> 7.25 ms
  };
  for (const Case& c : cases) {
    const MoeChoice ch = choose_moe_config(problem(2, c.e, c.k, c.t, c.h, c.f, c.imbalance));
    EXPECT_EQ(ch.send_order, c.want) << c.e << " experts, " << c.t << " tokens, imbalance " << c.imbalance;
    EXPECT_EQ(ch.combine, "presum");
    EXPECT_EQ(ch.dispatch, "all-to-all");
    EXPECT_EQ(ch.num_comm_ctas, 0);
    EXPECT_EQ(ch.unit_rows, 128);
  }
}

TEST(MoeTuner, EdgesOfTheSendOrderRule) {
  using C = MoeTunerConstants;
  auto order = [](int w, int64_t t, double imb) {
    return choose_moe_config(problem(w, 64, 4, t, 1024, 512, imb)).send_order;
  };
  EXPECT_EQ(order(2, C::kInterleaveMinTokens, C::kInterleaveMaxImbalance), "interleaved");
  EXPECT_EQ(order(2, C::kInterleaveMinTokens - 1, 1.0), "owner-major");
  EXPECT_EQ(order(2, C::kInterleaveMinTokens, 1.26), "owner-major");
  EXPECT_EQ(order(2, 1 << 20, 0), "owner-major");  // skew unknown
  EXPECT_EQ(order(1, 1 << 20, 1.0), "owner-major");  // nothing to send
  EXPECT_EQ(order(8, 1 << 20, 1.1), "interleaved");
}

// Layer 0's local-first tile order: with peers, owner-major sends and at most
// kLocalFirstMaxTokens tokens per rank (measured faster at 4096 tokens, slower from 8192).
TEST(MoeTuner, EdgesOfTheLocalFirstRule) {
  using C = MoeTunerConstants;
  EXPECT_TRUE(auto_local_first(C::kLocalFirstMaxTokens, 2, false));
  EXPECT_FALSE(auto_local_first(C::kLocalFirstMaxTokens + 1, 2, false));
  EXPECT_FALSE(auto_local_first(1024, 2, true));  // interleaved sends copy the own rows late
  EXPECT_FALSE(auto_local_first(1024, 1, false));  // one rank: every row is local, nothing waits
  // 2 KB rows (H = 1024): the unit dispatch, where this rule applies.
  const MoeChoice small = choose_moe_config(problem(2, 128, 8, 4096, 1024, 768, 1.0));
  EXPECT_TRUE(small.local_first);
  EXPECT_NE(small.why.find("layer 0 tiles local-first"), std::string::npos) << small.why;
  const MoeChoice zipf_large = choose_moe_config(problem(2, 128, 8, 16384, 1024, 768, 1.8));
  EXPECT_FALSE(zipf_large.local_first);
  EXPECT_NE(zipf_large.why.find("16384 > 4096 tokens per rank"), std::string::npos) << zipf_large.why;
}

// Layer 0's striped dispatch from 4 KB rows (H >= 2048 in bf16), kStripeRows rows a warp a round,
// with interleaved sends and expert-order tiles; by units below, with the older rules.
TEST(MoeTuner, EdgesOfTheStripedRule) {
  using C = MoeTunerConstants;
  EXPECT_TRUE(auto_striped(C::kStripedMinRowBytes, 2));
  EXPECT_FALSE(auto_striped(C::kStripedMinRowBytes - 2, 2));
  EXPECT_TRUE(auto_striped(C::kStripedMinRowBytes, 1));  // one rank: its local copy, striped too
  EXPECT_FALSE(auto_striped(C::kStripedMinRowBytes - 2, 1));
  const MoeChoice deepseek = choose_moe_config(problem(2, 256, 8, 4096, 7168, 2048, 1.0));
  EXPECT_TRUE(deepseek.striped_dispatch);
  EXPECT_EQ(deepseek.send_order, "interleaved");  // below kInterleaveMinTokens: for the striping
  EXPECT_FALSE(deepseek.local_first);
  EXPECT_NE(deepseek.why.find("layer 0 dispatch striped: rows of 14336 >= 4096 bytes"), std::string::npos)
      << deepseek.why;
  EXPECT_EQ(deepseek.stripe_rows, C::kStripeRows);
  EXPECT_NE(to_string(deepseek).find("l0_dispatch=striped(16 rows)"), std::string::npos) << to_string(deepseek);
  const MoeChoice qwen = choose_moe_config(problem(2, 128, 8, 4096, 2048, 768, 1.0));
  EXPECT_TRUE(qwen.striped_dispatch);  // 4 KB rows: striped since 16 rows a round (2026-11-30)
  EXPECT_EQ(qwen.send_order, "interleaved");
  EXPECT_FALSE(qwen.local_first);
  const MoeChoice small_rows = choose_moe_config(problem(2, 64, 4, 4096, 1024, 512, 1.0));  // 2 KB rows
  EXPECT_FALSE(small_rows.striped_dispatch);
  EXPECT_EQ(small_rows.send_order, "owner-major");
  EXPECT_TRUE(small_rows.local_first);
  EXPECT_NE(to_string(small_rows).find("l0_dispatch=units"), std::string::npos) << to_string(small_rows);
  EXPECT_FALSE(auto_local_first(1024, 2, false, true));  // striped: expert order
}

TEST(MoeTuner, WhyAndToString) {
  const MoeChoice a = choose_moe_config(problem(2, 128, 8, 16384, 1024, 768, 1.0));  // 2 KB rows: by units
  EXPECT_EQ(to_string(a),
            "dispatch=all-to-all combine=presum send_order=interleaved n_c=0 send_warps_per_cta=3 unit_rows=128 "
            "presum_ctas=0 l0_order=expert l0_dispatch=units l1_tile=128x256");
  // Layer 1 on ping-pong tiles by H (its GEMM's N) with the pre-summed combine: DeepSeek-like's
  // 7168 and Mixtral's 4096, not Qwen3's 2048 or this H = 1024, never with the per-slot combine (top-1).
  EXPECT_FALSE(a.l1_pingpong);
  EXPECT_NE(a.why.find("layer 1 tiles 128x256: H = 1024 < 4096"), std::string::npos) << a.why;
  const MoeChoice dsv3 = choose_moe_config(problem(2, 256, 8, 4096, 7168, 2048, 1.0));
  EXPECT_TRUE(dsv3.l1_pingpong);
  EXPECT_NE(to_string(dsv3).find("l1_tile=128x128-pingpong"), std::string::npos) << to_string(dsv3);
  EXPECT_TRUE(choose_moe_config(problem(2, 8, 2, 4096, 4096, 14336, 1.0)).l1_pingpong);
  EXPECT_FALSE(choose_moe_config(problem(2, 128, 8, 4096, 2048, 768, 1.0)).l1_pingpong);
  EXPECT_FALSE(choose_moe_config(problem(2, 8, 1, 4096, 8192, 512, 1.0)).l1_pingpong);
  EXPECT_TRUE(auto_l1_pingpong(MoeTunerConstants::kL1PingpongMinHidden));
  EXPECT_FALSE(auto_l1_pingpong(MoeTunerConstants::kL1PingpongMinHidden - 256));
  // Layer 1's pre-sum after the GEMM (beside it measured slower); the opt-in estimate for Qwen3 at
  // 16384 tokens: 671 MB of pre-sum against ~0.69 ms of GEMM (33 CTAs at 30 GB/s, capped at 32).
  EXPECT_NE(a.why.find("layer 1 pre-sum after the GEMM (presum_ctas 0)"), std::string::npos) << a.why;
  EXPECT_EQ(presum_ctas_for(problem(2, 128, 8, 16384, 2048, 768, 1.0)), 32);
  // Mixtral-like (k = 2, F = 14336): few bytes per FLOP, the floor.
  EXPECT_EQ(presum_ctas_for(problem(2, 8, 2, 4096, 4096, 14336, 1.0)), 4);
  EXPECT_NE(a.why.find("send order interleaved: balanced routing (imbalance 1 <= 1.25) and 16384 >= 8192 tokens"),
            std::string::npos)
      << a.why;
  EXPECT_DOUBLE_EQ(a.alltoall_over_allgather_bytes, 4.0);  // top-8 over 2 ranks
  EXPECT_NE(a.why.find("all-gather mode measured slower on all 18 cases"),
            std::string::npos)
      << a.why;
  const MoeChoice b = choose_moe_config(problem(2, 8, 1, 4096, 1024, 14336, 1.78));  // 2 KB rows: by units
  EXPECT_DOUBLE_EQ(b.alltoall_over_allgather_bytes, 0.5);
  EXPECT_EQ(b.why.find("fewer dispatch bytes"), std::string::npos) << b.why;
  EXPECT_EQ(b.combine, "per-slot");
  EXPECT_NE(b.why.find("combine per-slot: top-1 has nothing to pre-sum"), std::string::npos) << b.why;
  EXPECT_NE(b.why.find("owner-major: skewed routing (imbalance 1.78)"), std::string::npos) << b.why;
  const MoeChoice c = choose_moe_config(problem(2, 64, 40, 4096, 1024, 512, 0));
  EXPECT_EQ(c.combine, "per-slot");
  EXPECT_NE(c.why.find("topk 40 > 32"), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("routing skew unknown"), std::string::npos) << c.why;
}

std::string arg_error(const MoeProblem& p) {
  try {
    choose_moe_config(p);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(MoeTuner, BadInputNamesTheRule) {
  EXPECT_EQ(arg_error(problem(0, 8, 2, 16, 256, 256, 1)), "world_size 0 must be at least 1");
  EXPECT_EQ(arg_error(problem(3, 8, 2, 16, 256, 256, 1)),
            "num_experts 8 is not divisible by the world size 3 (experts are split evenly over the ranks)");
  EXPECT_EQ(arg_error(problem(2, 8, 9, 16, 256, 256, 1)), "topk 9 must be in [1, num_experts = 8]");
  EXPECT_EQ(arg_error(problem(2, 8, 2, 0, 256, 256, 1)),
            "tokens_per_rank, hidden, ffn must be positive (got 0, 256, 256)");
  EXPECT_EQ(arg_error(problem(2, 8, 2, 16, 256, 256, 0.5)),
            "imbalance 0.5 must be 0 (unknown) or >= 1 (most rows a rank receives / the mean)");
}

}  // namespace
}  // namespace ccfuse::moe
