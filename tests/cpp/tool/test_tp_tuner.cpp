// tests/cpp/tool/test_tp_tuner.cpp: the fused TP ops' tuner (include/ccfuse/tp/tuner.h): cost
// model values, the choice among transports (only built ones), the why-string, the tuned table
// (file format, errors, exact-match override, the shipped file) and --print-config of the tool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ccfuse/common/error.h"
#include "ccfuse/tp/tuner.h"
#include "tool_test_util.h"

namespace ccfuse::tp {
namespace {

using tool::testing::fake_hooks;
using tool::testing::lines_of;
using tool::testing::run_with;
using tool::testing::ToolRun;

const TunedTable kEmpty{};

TpProblem problem(const std::string& op, int w, int64_t m, int64_t n, int64_t k_per_rank) {
  TpProblem p;
  p.op = op;
  p.world_size = w;
  p.m = m;
  p.n = n;
  p.k_per_rank = k_per_rank;
  return p;
}

// A table file under the test's temporary directory; removed at the end of the test.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_(::testing::TempDir() + "ccfuse_tuner_" + name) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const char* const kHeader =
    "# op\tworld_size\tm\tn\tk_per_rank\tgpu_sms\ttransport\tnum_comm_ctas\tpieces_per_chunk\tgroup_m\t"
    "measured_fused_ms\tsource_file\n";

std::string load_error(const std::string& name, const std::string& text) {
  const TempFile f(name, text);
  try {
    load_tuned_table(f.path());
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- the model ------------------------------------------------------------------------------

TEST(TpTuner, GemmEfficiencyFollowsTheMeasuredSweep) {
  EXPECT_DOUBLE_EQ(gemm_efficiency(512), 0.47);
  EXPECT_DOUBLE_EQ(gemm_efficiency(1024), 0.68);
  EXPECT_DOUBLE_EQ(gemm_efficiency(3584), 0.93);
  EXPECT_DOUBLE_EQ(gemm_efficiency(4096), 0.95);
  EXPECT_DOUBLE_EQ(gemm_efficiency(7168), 1.0);
  EXPECT_DOUBLE_EQ(gemm_efficiency(28672), 1.0);
  EXPECT_NEAR(gemm_efficiency(724), 0.575, 0.001);  // halfway between 512 and 1024 in log2 K
  EXPECT_DOUBLE_EQ(gemm_efficiency(1), 0.085);
}

TEST(TpTuner, LongGemmsAreDerated) {
  EXPECT_DOUBLE_EQ(gemm_sustained_factor(1e9), 1.0);
  EXPECT_DOUBLE_EQ(gemm_sustained_factor(1e12), 1.0);
  EXPECT_DOUBLE_EQ(gemm_sustained_factor(1.45e12), 0.9375);
  EXPECT_DOUBLE_EQ(gemm_sustained_factor(1.9e12), 0.875);
  EXPECT_DOUBLE_EQ(gemm_sustained_factor(1e15), 0.875);
}

TEST(TpTuner, TransportBandwidthsAndBuiltFlags) {
  EXPECT_DOUBLE_EQ(transport_gbps("copy-engine", 0, 0), 393.0);
  EXPECT_DOUBLE_EQ(transport_gbps("sm-send-warps", 0, 0), 370.0);
  EXPECT_DOUBLE_EQ(transport_gbps("sm-comm-ctas", 8, 0), 349.0);
  EXPECT_DOUBLE_EQ(transport_gbps("sm-comm-ctas", 16, 0), 360.0);
  EXPECT_DOUBLE_EQ(transport_gbps("copy-engine", 0, 786), 786.0);      // link_gbps is the copy engine's rate
  EXPECT_DOUBLE_EQ(transport_gbps("sm-send-warps", 0, 786), 740.0);    // the others keep their ratio to it
  for (const char* op : {"ag_gemm", "gemm_rs", "gemm_ar"}) {
    EXPECT_TRUE(transport_built(op, "sm-send-warps")) << op;
    EXPECT_FALSE(transport_built(op, "sm-comm-ctas")) << op;
  }
  EXPECT_TRUE(transport_built("ag_gemm", "copy-engine"));  // AgTransport::kCopyEngine
  EXPECT_FALSE(transport_built("gemm_rs", "copy-engine"));
  EXPECT_FALSE(transport_built("gemm_ar", "copy-engine"));
  EXPECT_THROW(transport_gbps("nvshmem", 0, 0), InvalidArgument);
}

TEST(TpTuner, ModelValuesOfAGemmBoundGemmRs) {
  // W=2, M=N=8192, per-rank K=14336 (the Llama-70B row-parallel shape).
  const TpChoice c = choose_tp_config(problem("gemm_rs", 2, 8192, 8192, 14336), kEmpty);
  EXPECT_EQ(c.transport, "sm-send-warps");
  EXPECT_EQ(c.num_comm_ctas, 0);
  EXPECT_EQ(c.block_m, 128);
  EXPECT_EQ(c.block_n, 256);
  EXPECT_EQ(c.block_k, 64);
  EXPECT_EQ(c.chunk_rows, 128);
  EXPECT_EQ(c.pieces_per_chunk, 1);
  EXPECT_EQ(c.group_m, 8);
  EXPECT_EQ(c.source, "model");
  // 2*8192*8192*14336 FLOPs (> 1.9e12: derated) / (760 * 0.875 TFLOP/s); 4096*8192*2 B / 370 GB/s
  // + 2.46 us; exposed: 132 tiles of 64 KiB read locally at 3000 GB/s + 2.46 us; entry barrier 10 us.
  EXPECT_NEAR(c.predicted_gemm_ms, 2.893452, 1e-6);
  EXPECT_NEAR(c.predicted_comm_ms, 0.181375 + 0.00246, 1e-6);
  EXPECT_NEAR(c.predicted_fused_ms, 2.893452 + 0.0028836 + 0.00246 + 0.010, 1e-6);
  EXPECT_EQ(to_string(c),
            "transport=sm-send-warps n_c=0 block=128x256x64 chunk_rows=128 pieces_per_chunk=1 group_m=8 "
            "forward_spread_us=20 predicted_ms=2.909 source=model");
  EXPECT_EQ(c.why,
            "sm-send-warps predicts 2.909 ms (gemm 2.893 on 132 SMs, comm 0.1838, GEMM-bound): the only built "
            "transport. Not built: sm-comm-ctas n_c=8 3.095 ms; sm-comm-ctas n_c=16 3.308 ms; copy-engine 2.909 ms.");
}

TEST(TpTuner, ModelChoosesABuiltTransport) {
  const std::vector<TpProblem> problems = {
      problem("ag_gemm", 2, 8192, 14336, 8192),  problem("ag_gemm", 8, 8192, 1024, 256),
      problem("gemm_rs", 2, 16384, 16384, 256),  problem("gemm_rs", 4, 1024, 8192, 7168),
      problem("gemm_ar", 2, 4096, 4096, 7168),   problem("gemm_ar", 8, 65536, 16384, 128),
      problem("gemm_rs", 1, 512, 512, 512)};
  for (const TpProblem& p : problems) {
    const TpChoice c = choose_tp_config(p, kEmpty);
    SCOPED_TRACE(p.op + " W=" + std::to_string(p.world_size) + " m=" + std::to_string(p.m));
    // gemm_rs/gemm_ar: the send warps, the only built transport; ag_gemm: the copy engine where
    // the push is dense (ag_copy_engine_pays), else the send warps.
    EXPECT_EQ(c.transport, p.op == "ag_gemm" && ag_copy_engine_pays(p) ? "copy-engine" : "sm-send-warps");
    EXPECT_EQ(c.num_comm_ctas, 0);
    EXPECT_EQ(c.source, "model");
    EXPECT_GT(c.predicted_gemm_ms, 0);
    EXPECT_GE(c.predicted_fused_ms, std::max(c.predicted_gemm_ms, c.predicted_comm_ms));
    // The entry barrier alone keeps it strictly above.
    EXPECT_GE(c.predicted_fused_ms - std::max(c.predicted_gemm_ms, c.predicted_comm_ms), 0.010 - 1e-12);
  }
  EXPECT_EQ(choose_tp_config(problems[0], kEmpty).transport, "sm-send-warps");  // comm 0.11 x the GEMM
  // K = 256: comm-bound, a dense push, but W = 8: the copy-engine rule is measured at W = 2 only.
  EXPECT_EQ(choose_tp_config(problems[1], kEmpty).transport, "sm-send-warps");
  EXPECT_NE(choose_tp_config(problems[1], kEmpty).why.find("measured at W = 2 only"), std::string::npos);
  EXPECT_EQ(choose_tp_config(problem("ag_gemm", 2, 8192, 1024, 256), kEmpty).transport, "copy-engine");
}

TEST(TpTuner, AgCopyEngineWhereThePushIsDenseAndTheTileStays256) {
  // The five bench shapes at W = 2 (comm / gemm of the model's send warps): 4096x7168x4096
  // (0.144) and 8192x3072x4096 (0.316) dense; 8192x14336x8192, 16384x14336x8192 (0.064, 0.063)
  // and 1024x14336x8192 (0.079, also a 192-column tile) sparse.
  EXPECT_TRUE(ag_copy_engine_pays(problem("ag_gemm", 2, 4096, 7168, 4096)));
  EXPECT_TRUE(ag_copy_engine_pays(problem("ag_gemm", 2, 8192, 3072, 4096)));
  EXPECT_FALSE(ag_copy_engine_pays(problem("ag_gemm", 2, 8192, 14336, 8192)));
  EXPECT_FALSE(ag_copy_engine_pays(problem("ag_gemm", 2, 16384, 14336, 8192)));
  EXPECT_FALSE(ag_copy_engine_pays(problem("ag_gemm", 2, 1024, 14336, 8192)));
  // Dense, but its send warps would take the 192 tile (64 tiles of 192 in one wave against 48
  // of 256, also one): the send warps.
  const TpProblem narrow = problem("ag_gemm", 2, 1024, 1536, 4096);
  EXPECT_EQ(ag_block_n(1024, 1536, 132), 192);
  EXPECT_FALSE(ag_copy_engine_pays(narrow));
  EXPECT_NE(choose_tp_config(narrow, kEmpty).why.find("192-column tile"), std::string::npos);
  EXPECT_FALSE(ag_copy_engine_pays(problem("ag_gemm", 1, 8192, 3072, 4096)));  // one rank
  EXPECT_FALSE(ag_copy_engine_pays(problem("ag_gemm", 4, 8192, 3072, 4096)));  // measured at W = 2 only
  // The why names the rule, and the copy engine's choice has no push pacing and the 256 tile.
  const TpChoice d = choose_tp_config(problem("ag_gemm", 2, 8192, 3072, 4096), kEmpty);
  EXPECT_EQ(d.transport, "copy-engine");
  EXPECT_EQ(d.push_spread_us, 0);
  EXPECT_EQ(d.block_n, 256);
  EXPECT_NE(d.why.find("the push is dense"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("Also built: sm-send-warps"), std::string::npos) << d.why;
  const TpChoice sp = choose_tp_config(problem("ag_gemm", 2, 8192, 14336, 8192), kEmpty);
  EXPECT_NE(sp.why.find("the push is sparse"), std::string::npos) << sp.why;
  try {
    ag_copy_engine_pays(problem("gemm_rs", 2, 8192, 3072, 4096));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "ag_copy_engine_pays: op 'gemm_rs' is not ag_gemm");
  }
}

TEST(TpTuner, OneRankMovesNothing) {
  const TpChoice c = choose_tp_config(problem("gemm_ar", 1, 4096, 4096, 4096), kEmpty);
  EXPECT_EQ(c.predicted_comm_ms, 0.0);
  EXPECT_NEAR(c.predicted_fused_ms, c.predicted_gemm_ms + 0.010, 1e-12);
}

TEST(TpTuner, CommTimeScalesWithTheBytesMoved) {
  const double flag = 0.00246;
  const auto comm = [](TpProblem p) { return choose_tp_config(p, kEmpty).predicted_comm_ms; };
  // gemm_rs: (W-1) * M/W * N * 2 bytes.
  const double rs = comm(problem("gemm_rs", 2, 8192, 4096, 4096)) - flag;
  EXPECT_NEAR(rs, 4096.0 * 4096 * 2 / 370e9 * 1e3, 1e-9);
  EXPECT_NEAR(comm(problem("gemm_rs", 2, 8192, 8192, 4096)) - flag, 2 * rs, 1e-9);    // twice N
  EXPECT_NEAR(comm(problem("gemm_rs", 2, 8192, 4096, 1024)) - flag, rs, 1e-9);        // K moves nothing
  EXPECT_NEAR(comm(problem("gemm_rs", 4, 8192, 4096, 4096)) - flag, 1.5 * rs, 1e-9);  // 3/4 of M, not 1/2
  EXPECT_NEAR(comm(problem("gemm_ar", 2, 8192, 4096, 4096)) - flag, 2 * rs, 1e-9);    // + the all-gather
  // ag_gemm: (W-1) * M/W * K * 2 bytes: N moves nothing, K does.
  // (N = 16384: a GEMM-heavy problem, so that the tuner keeps the send warps.)
  const double ag = comm(problem("ag_gemm", 2, 8192, 16384, 4096)) - flag;
  EXPECT_NEAR(ag, rs, 1e-9);
  EXPECT_NEAR(comm(problem("ag_gemm", 2, 8192, 16384, 8192)) - flag, 2 * ag, 1e-9);
  // A link twice as fast halves the transfer.
  TpProblem fast = problem("gemm_rs", 2, 8192, 4096, 4096);
  fast.link_gbps = 786;
  EXPECT_NEAR(comm(fast) - flag, rs / 2, 1e-9);
}

TEST(TpTuner, FewerSmsSlowTheGemm) {
  TpProblem p = problem("gemm_rs", 2, 8192, 8192, 14336);
  const double full = choose_tp_config(p, kEmpty).predicted_gemm_ms;
  p.num_sms = 66;
  EXPECT_NEAR(choose_tp_config(p, kEmpty).predicted_gemm_ms, 2 * full, 1e-9);
}

TEST(TpTuner, PiecesPerChunkFollowTheAgGemmRule) {
  const auto pieces = [](int64_t m, int w, int sms) {
    TpProblem p = problem("ag_gemm", w, m, 4096, 4096);
    p.num_sms = sms;
    return choose_tp_config(p, kEmpty).pieces_per_chunk;
  };
  EXPECT_EQ(pieces(8192, 2, 132), 8);    // 32 chunks: 32 * 4 = 128 < 132
  EXPECT_EQ(pieces(16384, 2, 132), 4);   // 64 chunks
  EXPECT_EQ(pieces(4096, 2, 132), 16);   // 16 chunks
  EXPECT_EQ(pieces(1024, 2, 132), 32);   // 4 chunks: capped at 32
  EXPECT_EQ(pieces(8192, 2, 64), 2);     // 32 * 2 = 64 CTAs
  EXPECT_EQ(pieces(65536, 2, 132), 1);   // 256 chunks
  // gemm_rs / gemm_ar flag whole tiles.
  EXPECT_EQ(choose_tp_config(problem("gemm_ar", 2, 1024, 8192, 14336), kEmpty).pieces_per_chunk, 1);
}

TEST(TpTuner, WhyNamesTheCopyEngineWhenItWouldBeFaster) {
  // Comm-bound: per-rank K = 256, 256 MiB of partials per rank.
  const TpChoice c = choose_tp_config(problem("gemm_rs", 2, 16384, 16384, 256), kEmpty);
  EXPECT_EQ(c.transport, "sm-send-warps");  // not built: never chosen
  EXPECT_NEAR(c.predicted_fused_ms, 0.743305, 1e-5);
  EXPECT_EQ(c.why,
            "sm-send-warps predicts 0.7433 ms (gemm 0.6459 on 132 SMs, comm 0.728, comm-bound): the only built "
            "transport. Not built: sm-comm-ctas n_c=8 0.7868 ms; sm-comm-ctas n_c=16 0.7631 ms; copy-engine 0.7033 ms "
            "(would be 0.04 ms faster).");
  // GEMM-bound: nothing would be faster, so no "would be".
  const TpChoice g = choose_tp_config(problem("gemm_rs", 2, 8192, 8192, 14336), kEmpty);
  EXPECT_EQ(g.why.find("would be"), std::string::npos) << g.why;
  EXPECT_NE(g.why.find("copy-engine"), std::string::npos) << g.why;
  // A gain under 1 % (ag_gemm's first chunk at 393 instead of 370 GB/s) is not called one.
  const TpChoice a = choose_tp_config(problem("ag_gemm", 2, 8192, 14336, 8192), kEmpty);
  EXPECT_NE(a.why.find("copy-engine 2.911 ms."), std::string::npos) << a.why;
  EXPECT_EQ(a.why.find("would be"), std::string::npos) << a.why;
}

// ---- argument checks --------------------------------------------------------------------------

std::string arg_error(const TpProblem& p) {
  try {
    choose_tp_config(p, kEmpty);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TpTuner, InvalidArgumentsNameTheRule) {
  EXPECT_EQ(arg_error(problem("gemm", 2, 8, 8, 8)), "op 'gemm' is not a fused TP op (known: ag_gemm, gemm_rs, gemm_ar)");
  TpProblem fp32 = problem("gemm_rs", 2, 8, 8, 8);
  fp32.dtype = DType::kFloat32;
  EXPECT_EQ(arg_error(fp32), "dtype fp32 is not supported by the fused TP kernels (bf16 or fp16)");
  TpProblem fp16 = problem("gemm_rs", 2, 8, 8, 8);
  fp16.dtype = DType::kFloat16;
  EXPECT_EQ(arg_error(fp16), "(no error)");
  EXPECT_EQ(arg_error(problem("gemm_rs", 0, 8, 8, 8)), "world_size 0 must be at least 1");
  EXPECT_EQ(arg_error(problem("gemm_rs", 16, 16, 8, 8)), "world_size 16 exceeds 8 (the fused TP kernels' limit)");
  EXPECT_EQ(arg_error(problem("gemm_rs", 2, 0, 8, 8)), "m, n, k_per_rank must be positive (got 0, 8, 8)");
  EXPECT_EQ(arg_error(problem("gemm_ar", 2, 8, -1, 8)), "m, n, k_per_rank must be positive (got 8, -1, 8)");
  EXPECT_EQ(arg_error(problem("gemm_ar", 2, 8, 8, 0)), "m, n, k_per_rank must be positive (got 8, 8, 0)");
  EXPECT_EQ(arg_error(problem("gemm_rs", 3, 1000, 8, 8)), "m 1000 is not divisible by world_size 3");
  // A band of M / W rows not a multiple of 128 ends in a short chunk: taken.
  EXPECT_EQ(arg_error(problem("ag_gemm", 2, 1000, 8, 8)), "(no error)");
  TpProblem no_sms = problem("gemm_rs", 2, 8, 8, 8);
  no_sms.num_sms = 0;
  EXPECT_EQ(arg_error(no_sms), "num_sms 0 must be positive");
  TpProblem neg_link = problem("gemm_rs", 2, 8, 8, 8);
  neg_link.link_gbps = -1;
  EXPECT_EQ(arg_error(neg_link), "link_gbps -1 must be >= 0 (0 = the model's default)");
}

// ---- the tuned table ----------------------------------------------------------------------------

TEST(TpTuner, AgPushSpreadIsAFractionOfOneBandsGemmTime) {
  // 8192x3072x4096 at W = 2: 2*8192*3072*4096 FLOPs at 0.95 x 760 TFLOP/s = 0.28564 ms for the
  // whole GEMM, 142.8 us for one band; 0.8 of it by default.
  const TpProblem p = problem("ag_gemm", 2, 8192, 3072, 4096);
  const TpChoice c = choose_tp_config(p, kEmpty);
  EXPECT_NEAR(c.predicted_gemm_ms, 2.0 * 8192 * 3072 * 4096 / (0.95 * 760e12) * 1e3, 1e-9);
  EXPECT_EQ(ag_push_spread_us(p, 1.0), 143);
  EXPECT_EQ(ag_push_spread_us(p, 0.5), 71);
  EXPECT_EQ(ag_push_spread_us(p), int(std::lround(TpModelConstants::kAgPushSpreadFraction * 142.82)));
  // The tuner takes the copy engine for this dense push (no pacing there); over send warps the
  // rule applies (a table row naming them).
  EXPECT_EQ(c.transport, "copy-engine");
  EXPECT_EQ(c.push_spread_us, 0);
  const TempFile f("warps.tsv", "ag_gemm\t2\t8192\t3072\t4096\t132\tsm-send-warps\t0\t0\t8\t0.29\tr.jsonl\n");
  const TpChoice w = choose_tp_config(p, load_tuned_table(f.path()));
  EXPECT_EQ(w.transport, "sm-send-warps");
  EXPECT_EQ(w.push_spread_us, ag_push_spread_us(p));
  EXPECT_EQ(ag_push_spread_us(p, 0), 0);
  // Four ranks: a band is a quarter of the GEMM.
  EXPECT_EQ(ag_push_spread_us(problem("ag_gemm", 4, 8192, 3072, 4096), 1.0), 71);
  EXPECT_EQ(ag_push_spread_us(problem("ag_gemm", 1, 8192, 3072, 4096), 1.0), 0);  // nothing to push
  // Huge problems stop at 100 ms.
  EXPECT_EQ(ag_push_spread_us(problem("ag_gemm", 2, 1 << 22, 1 << 16, 1 << 14), 2.0), 100000);
  // gemm_rs / gemm_ar push nothing up front.
  EXPECT_EQ(choose_tp_config(problem("gemm_rs", 2, 8192, 3072, 4096), kEmpty).push_spread_us, 0);
  EXPECT_NE(to_string(w).find(" push_spread_us=" + std::to_string(w.push_spread_us) + " "), std::string::npos);
  EXPECT_EQ(to_string(c).find(" push_spread_us="), std::string::npos);
  try {
    ag_push_spread_us(p, 2.5);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "push_spread_fraction 2.5 must be in [0, 2]");
  }
  try {
    ag_push_spread_us(problem("gemm_rs", 2, 8192, 3072, 4096), 1.0);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "ag_push_spread_us: op 'gemm_rs' is not ag_gemm");
  }
}

TEST(TpTuner, AgBlockNIs192OnlyWhereItsWavesCostFivePercentLess) {
  // 1024x14336: 8 x 56 = 448 tiles of 256 (4 waves on 132 CTAs: 1024 column-waves), 8 x 75 = 600
  // of 192 (5 waves: 960, 6.25 % less).
  EXPECT_EQ(ag_block_n(1024, 14336, 132), 192);
  // 4096x7168: 896 tiles of 256 in 7 waves (1792) against 1216 of 192 in 10 (1920).
  EXPECT_EQ(ag_block_n(4096, 7168, 132), 256);
  // 8192x3072: 6 waves of 256 against 8 of 192: equal, 256 stays.
  EXPECT_EQ(ag_block_n(8192, 3072, 132), 256);
  // 8192x14336: 28 waves of 256 (7168) against 37 of 192 (7104): under 5 %.
  EXPECT_EQ(ag_block_n(8192, 14336, 132), 256);
  // n not a multiple of 8 (no TMA-store epilogue): 256 whatever the waves.
  EXPECT_EQ(ag_block_n(1024, 14338, 132), 256);
  EXPECT_EQ(ag_block_n(1024, 14336, 66), 256);  // 7 waves (1792) against 10 (1920)
  // The tuner reports it for ag_gemm over send warps only.
  EXPECT_EQ(choose_tp_config(problem("ag_gemm", 2, 1024, 14336, 8192), kEmpty).block_n, 192);
  EXPECT_EQ(choose_tp_config(problem("ag_gemm", 2, 8192, 14336, 8192), kEmpty).block_n, 256);
  EXPECT_EQ(choose_tp_config(problem("gemm_rs", 2, 1024, 14336, 8192), kEmpty).block_n, 256);
  try {
    ag_block_n(1024, 0, 132);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "ag_block_n: m 1024, n 0 and num_sms 132 must be positive");
  }
}

TEST(TpTuner, RsForwardSpreadOnlyFromThreeWavesOfTiles) {
  const int us = TpModelConstants::kRsForwardSpreadUs;
  // 8192x4096: 64 x 16 = 1024 tiles of 128x256, 7.8 waves on 132 CTAs.
  EXPECT_EQ(rs_forward_spread_us(2, 8192, 4096, 132), us);
  // 4096x4096: 512 tiles, 3.9 waves; 1024x8192: 256 tiles, 1.9 waves.
  EXPECT_EQ(rs_forward_spread_us(2, 4096, 4096, 132), us);
  EXPECT_EQ(rs_forward_spread_us(2, 1024, 8192, 132), 0);
  // The floor: 396 tiles are 3.0 waves on 132 CTAs, 395 are not; a cut last tile counts.
  EXPECT_EQ(rs_forward_spread_us(2, 128 * 396, 256, 132), us);
  EXPECT_EQ(rs_forward_spread_us(2, 128 * 395, 256, 132), 0);
  EXPECT_EQ(rs_forward_spread_us(2, 128 * 395, 257, 132), us);
  // Fewer CTAs, more waves; one rank forwards nothing.
  EXPECT_EQ(rs_forward_spread_us(2, 1024, 8192, 64), us);
  EXPECT_EQ(rs_forward_spread_us(1, 8192, 4096, 132), 0);
  // The tuner reports it for gemm_rs and gemm_ar, never for ag_gemm.
  EXPECT_EQ(choose_tp_config(problem("gemm_rs", 2, 8192, 4096, 6144), kEmpty).forward_spread_us, us);
  EXPECT_EQ(choose_tp_config(problem("gemm_ar", 2, 4096, 4096, 14336), kEmpty).forward_spread_us, us);
  EXPECT_EQ(choose_tp_config(problem("gemm_rs", 2, 1024, 8192, 28672), kEmpty).forward_spread_us, 0);
  EXPECT_EQ(choose_tp_config(problem("ag_gemm", 2, 8192, 4096, 6144), kEmpty).forward_spread_us, 0);
  try {
    rs_forward_spread_us(2, 0, 4096, 132);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "rs_forward_spread_us: world_size 2, m 0, n 4096 and num_sms 132 must be positive");
  }
}

TEST(TpTuner, TableRowOverridesTheModelOnAnExactMatchOnly) {
  const TempFile f("override.tsv", std::string(kHeader) +
                                       "gemm_rs\t2\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0278\tres.jsonl\n"
                                       "\n"
                                       "ag_gemm\t2\t8192\t4096\t4096\t132\tsm-send-warps\t0\t16\t4\t0.5\tres.jsonl\n");
  const TunedTable t = load_tuned_table(f.path());
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(t.entries[0].line, 2);
  EXPECT_EQ(t.entries[1].line, 4);

  const TpChoice c = choose_tp_config(problem("gemm_rs", 2, 8192, 8192, 14336), t);
  EXPECT_EQ(c.source, "table:ccfuse_tuner_override.tsv:2");
  EXPECT_DOUBLE_EQ(c.predicted_fused_ms, 3.0278);
  EXPECT_NEAR(c.predicted_gemm_ms, 2.893452, 1e-6);  // the model's parts stay for reference
  EXPECT_EQ(c.why,
            "sm-send-warps from the tuned table (ccfuse_tuner_override.tsv line 2): measured 3.028 ms on this exact "
            "problem (res.jsonl); the model alone predicts 2.909 ms (gemm 2.893, comm 0.1838).");
  EXPECT_EQ(to_string(c),
            "transport=sm-send-warps n_c=0 block=128x256x64 chunk_rows=128 pieces_per_chunk=1 group_m=8 "
            "forward_spread_us=20 predicted_ms=3.028 source=table:ccfuse_tuner_override.tsv:2");

  // The row's knobs are taken.
  const TpChoice a = choose_tp_config(problem("ag_gemm", 2, 8192, 4096, 4096), t);
  EXPECT_EQ(a.source, "table:ccfuse_tuner_override.tsv:4");
  EXPECT_EQ(a.pieces_per_chunk, 16);  // the rule would give 8
  EXPECT_EQ(a.group_m, 4);

  // Any key field different: the model.
  for (TpProblem p : {problem("gemm_ar", 2, 8192, 8192, 14336), problem("gemm_rs", 4, 8192, 8192, 14336),
                      problem("gemm_rs", 2, 4096, 8192, 14336), problem("gemm_rs", 2, 8192, 4096, 14336),
                      problem("gemm_rs", 2, 8192, 8192, 7168)}) {
    EXPECT_EQ(choose_tp_config(p, t).source, "model");
  }
  TpProblem other_gpu = problem("gemm_rs", 2, 8192, 8192, 14336);
  other_gpu.num_sms = 114;
  EXPECT_EQ(choose_tp_config(other_gpu, t).source, "model");
}

TEST(TpTuner, TableRowOfANotBuiltTransportIsIgnored) {
  const TempFile f("notbuilt.tsv",
                   "gemm_rs\t2\t16384\t16384\t256\t132\tcopy-engine\t0\t0\t8\t0.6\tprobe.log\n");
  const TpChoice c = choose_tp_config(problem("gemm_rs", 2, 16384, 16384, 256), load_tuned_table(f.path()));
  EXPECT_EQ(c.transport, "sm-send-warps");
  EXPECT_EQ(c.source, "model");
  EXPECT_NE(c.why.find("The tuned table's row (line 1, copy-engine) names a transport that is not built: ignored."),
            std::string::npos)
      << c.why;
}

TEST(TpTuner, TableParseErrorsNameFileLineAndRule) {
  const std::string row = "gemm_rs\t2\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0\tr.jsonl\n";
  const std::string dir = ::testing::TempDir() + "ccfuse_tuner_";
  EXPECT_EQ(load_error("cols.tsv", "# comment\n\ngemm_rs\t2\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0\n"),
            dir + "cols.tsv:3: expected 12 tab-separated columns (op world_size m n k_per_rank gpu_sms transport "
                  "num_comm_ctas pieces_per_chunk group_m measured_fused_ms source_file), got 11");
  EXPECT_EQ(load_error("spaces.tsv", "gemm_rs 2 8192 8192 14336 132 sm-send-warps 0 0 8 3.0 r.jsonl\n"),
            dir + "spaces.tsv:1: expected 12 tab-separated columns (op world_size m n k_per_rank gpu_sms transport "
                  "num_comm_ctas pieces_per_chunk group_m measured_fused_ms source_file), got 1");
  EXPECT_EQ(load_error("op.tsv", row + "gemm\t2\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0\tr.jsonl\n"),
            dir + "op.tsv:2: column 1 op 'gemm' is not a fused TP op (known: ag_gemm, gemm_rs, gemm_ar)");
  EXPECT_EQ(load_error("int.tsv", "gemm_rs\t2\t8k\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0\tr.jsonl\n"),
            dir + "int.tsv:1: column 3 m '8k' is not an integer");
  EXPECT_EQ(load_error("ws.tsv", "gemm_rs\t9\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0\tr.jsonl\n"),
            dir + "ws.tsv:1: column 2 world_size 9 must be in 1..8");
  EXPECT_EQ(load_error("tr.tsv", "gemm_rs\t2\t8192\t8192\t14336\t132\tnvshmem\t0\t0\t8\t3.0\tr.jsonl\n"),
            dir + "tr.tsv:1: column 7 transport 'nvshmem' is unknown (known: sm-send-warps, sm-comm-ctas, copy-engine)");
  EXPECT_EQ(load_error("nc.tsv", "gemm_rs\t2\t8192\t8192\t14336\t132\tsm-send-warps\t8\t0\t8\t3.0\tr.jsonl\n"),
            dir + "nc.tsv:1: column 8 num_comm_ctas 8 must be 0 for this transport");
  EXPECT_EQ(load_error("nc0.tsv", "gemm_rs\t2\t8192\t8192\t14336\t132\tsm-comm-ctas\t0\t0\t8\t3.0\tr.jsonl\n"),
            dir + "nc0.tsv:1: column 8 num_comm_ctas 0 must be in 1..gpu_sms-1 for sm-comm-ctas");
  EXPECT_EQ(load_error("pieces.tsv", "ag_gemm\t2\t8192\t8192\t8192\t132\tsm-send-warps\t0\t12\t8\t3.0\tr.jsonl\n"),
            dir + "pieces.tsv:1: column 9 pieces_per_chunk 12 must be 0 (auto) or a power of two <= 32");
  EXPECT_EQ(load_error("ms.tsv", "gemm_rs\t2\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\tfast\tr.jsonl\n"),
            dir + "ms.tsv:1: column 11 measured_fused_ms 'fast' is not a number");
  EXPECT_EQ(load_error("ms0.tsv", "gemm_rs\t2\t8192\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t0\tr.jsonl\n"),
            dir + "ms0.tsv:1: column 11 measured_fused_ms 0 must be positive");
  EXPECT_EQ(load_error("div.tsv", "gemm_rs\t2\t8191\t8192\t14336\t132\tsm-send-warps\t0\t0\t8\t3.0\tr.jsonl\n"),
            dir + "div.tsv:1: m 8191 is not divisible by world_size 2");
  EXPECT_EQ(load_error("dup.tsv", row + "# again\n" + row),
            dir + "dup.tsv:3: duplicate key (gemm_rs world_size=2 m=8192 n=8192 k_per_rank=14336 gpu_sms=132), "
                  "first at line 1");
  const std::string missing = ::testing::TempDir() + "ccfuse_tuner_does_not_exist.tsv";
  try {
    load_tuned_table(missing);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "tuned table " + missing + " cannot be opened");
  }
  // Comments, blank lines and CRLF endings are fine.
  const TempFile ok("crlf.tsv", "# c\r\n\r\n" + row.substr(0, row.size() - 1) + "\r\n   # indented comment\n");
  EXPECT_EQ(load_tuned_table(ok.path()).entries.size(), 1u);
}

TEST(TpTuner, ShippedTableParsesWithTheThirteenMeasuredRows) {
  const TunedTable& t = default_table();
  ASSERT_FALSE(t.path.empty()) << "bench/tuned/tp_tuned.tsv not found";
  EXPECT_NE(t.path.find("bench/tuned/tp_tuned.tsv"), std::string::npos) << t.path;
  ASSERT_EQ(t.entries.size(), 13u);
  int ag = 0, rs = 0, ar = 0;
  for (const TunedEntry& e : t.entries) {
    ag += e.op == "ag_gemm";
    rs += e.op == "gemm_rs";
    ar += e.op == "gemm_ar";
    EXPECT_EQ(e.world_size, 2);
    EXPECT_EQ(e.gpu_sms, 132);
    EXPECT_EQ(e.group_m, 8);
    // The two dense ag_gemm pushes over the copy engine, measured in their own A/B call.
    const bool ce = e.op == "ag_gemm" && e.k_per_rank == 4096;
    EXPECT_EQ(e.transport, ce ? "copy-engine" : "sm-send-warps");
    EXPECT_EQ(e.source_file, ce ? "bench/results/2026-11-30-h200x2-tp-agce-ab-b1-12f6127.jsonl"
                                : "bench/results/2026-11-30-h200x2-tp-v3.7-bc44201.jsonl");
  }
  EXPECT_EQ(ag, 5);
  EXPECT_EQ(rs, 5);
  EXPECT_EQ(ar, 3);
  // The bench's gemm_rs record at global K = 28672: per-rank K 14336, t_fused_ms 2.8257.
  const TpChoice c = choose_tp_config(problem("gemm_rs", 2, 8192, 8192, 14336));
  EXPECT_EQ(c.source, "table:tp_tuned.tsv:14");
  EXPECT_DOUBLE_EQ(c.predicted_fused_ms, 2.8257);
  // ag_gemm M=1024: 4 chunks per rank, the rule's 32 pieces written out.
  const TpChoice a = choose_tp_config(problem("ag_gemm", 2, 1024, 14336, 8192));
  EXPECT_EQ(a.pieces_per_chunk, 32);
  EXPECT_DOUBLE_EQ(a.predicted_fused_ms, 0.3512);
}

// ---- the tool --------------------------------------------------------------------------------

std::string line_starting(const std::string& out, const std::string& prefix) {
  for (const std::string& l : lines_of(out))
    if (l.rfind(prefix, 0) == 0) return l;
  return "(no line " + prefix + ")";
}

TEST(TpTuner, PrintConfigShowsTheTunerChoice) {
  // Two fake GPUs: the big shape passes resolve() (the CPU world would refuse its size).
  const ToolRun r = run_with({"check", "--op", "gemm_rs", "--m", "8192", "--n", "8192", "--k", "28672", "--seed", "1",
                              "--print-config"},
                             fake_hooks(2));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(line_starting(r.out, "tp_config="),
            "tp_config=transport=sm-send-warps n_c=0 block=128x256x64 chunk_rows=128 pieces_per_chunk=1 group_m=8 "
            "forward_spread_us=20 predicted_ms=2.826 source=table:tp_tuned.tsv:14");
  EXPECT_EQ(line_starting(r.out, "tp_why="),
            "tp_why=sm-send-warps from the tuned table (tp_tuned.tsv line 14): measured 2.826 ms on this exact problem "
            "(bench/results/2026-11-30-h200x2-tp-v3.7-bc44201.jsonl); the model alone predicts 2.909 ms (gemm 2.893, comm "
            "0.1838).");

  // A shape the table lacks: the model, per-rank K = 2048 / 2.
  const ToolRun m = run_with({"check", "--op", "gemm_ar", "--m", "256", "--n", "512", "--k", "2048", "--seed", "1",
                              "--backend", "cpu", "--print-config"},
                             fake_hooks(0));
  ASSERT_EQ(m.code, 0) << m.err;
  const TpChoice expect = choose_tp_config(problem("gemm_ar", 2, 256, 512, 1024));
  EXPECT_EQ(line_starting(m.out, "tp_config="), "tp_config=" + to_string(expect));
  EXPECT_NE(line_starting(m.out, "tp_config=").find("source=model"), std::string::npos);
  EXPECT_EQ(line_starting(m.out, "tp_why="), "tp_why=" + expect.why);

  // ag_gemm keeps K.
  const ToolRun a = run_with({"check", "--op", "ag_gemm", "--m", "1024", "--n", "14336", "--k", "8192", "--seed", "1",
                              "--print-config"},
                             fake_hooks(2));
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(line_starting(a.out, "tp_config=").find("pieces_per_chunk=32"), std::string::npos) << a.out;
  EXPECT_NE(line_starting(a.out, "tp_config=").find("source=table:tp_tuned.tsv:13"), std::string::npos) << a.out;
}

TEST(TpTuner, PrintConfigSaysNoneWhereTheTunerRefuses) {
  // Bands of 500 rows (short last chunks) are a problem the tuner takes.
  const ToolRun odd = run_with({"check", "--op", "ag_gemm", "--m", "1000", "--n", "8", "--k", "8", "--seed", "1",
                                "--backend", "cpu", "--print-config"},
                               fake_hooks(0));
  ASSERT_EQ(odd.code, 0) << odd.err;
  EXPECT_EQ(line_starting(odd.out, "tp_config=").rfind("tp_config=transport=", 0), 0u) << odd.out;
  EXPECT_NE(odd.out.find("tp_why="), std::string::npos) << odd.out;

  const ToolRun fp32 = run_with({"check", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--dtype", "fp32",
                                 "--seed", "1", "--backend", "cpu", "--print-config"},
                                fake_hooks(0));
  ASSERT_EQ(fp32.code, 0) << fp32.err;
  EXPECT_EQ(line_starting(fp32.out, "tp_config="),
            "tp_config=none (dtype fp32 is not supported by the fused TP kernels (bf16 or fp16))");

  // Without --print-config nothing is printed.
  const ToolRun quiet = run_with({"check", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--seed", "1",
                                  "--backend", "cpu"},
                                 fake_hooks(0));
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.out.find("tp_"), std::string::npos);
}

}  // namespace
}  // namespace ccfuse::tp
