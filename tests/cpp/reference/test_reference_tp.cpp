// The TP ops of the CPU reference world against the fp64 references of naive.h, and the fp64
// references and error metric themselves.
//
// Inputs are fresh random numbers on every run; the seed is printed with every failure
// (SCOPED_TRACE) and can be fixed with CCFUSE_TEST_SEED=<n> to replay one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/naive.h"
#include "reference/tp_ops.h"
#include "tests/cpp/test_util.h"

namespace ccfuse::ref {
namespace {

using namespace ccfuse::testing;

enum class Op { kAgGemm, kGemmRs, kGemmAr };

const char* op_name(Op op) {
  switch (op) {
    case Op::kAgGemm: return "ag_gemm";
    case Op::kGemmRs: return "gemm_rs";
    case Op::kGemmAr: return "gemm_ar";
  }
  return "?";
}

// A problem per rank: m_local = M / W rows of each band, the local K, and the tile config.
struct ShapeCase {
  const char* name;
  int64_t m_local, n, k;
  TpConfig config;
};

const ShapeCase kShapes[] = {
    // Nothing is a multiple of the 16x16 tile: the last row and column tiles are partial.
    {"ragged16", 37, 45, 29, {16, 16, 0}},
    // Transfer chunks (5 rows) straddle the 32-row tiles, so a tile waits for several chunks.
    {"ragged32_chunk5", 23, 45, 29, {32, 16, 5}},
    // The default 64x64 tile is larger than the band: one tile per band.
    {"default_tile", 21, 70, 67, TpConfig{}},
    // Everything divides evenly.
    {"multiple", 32, 64, 32, {16, 32, 16}},
};




template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_f32(v[i]);
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

template <typename T>
double tolerance() {
  // fp32: accumulation error over K <= 70 terms is ~1e-7 relative. bf16: the output rounding
  // alone is ~2^-9 relative (DESIGN §4 rule 6).
  return std::is_same_v<T, float> ? 1e-6 : 1e-2;
}

// Runs `op` twice in a row on one World with fresh inputs each time and checks every rank's
// output (and ag_gemm's gathered A) against the fp64 reference.
template <typename T>
void check_op(Op op, int world_size, const ShapeCase& shape_case) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: CCFUSE_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);

  const int64_t m = shape_case.m_local * world_size, n = shape_case.n, k = shape_case.k;
  const TpShape shape{m, n, k};
  World world(WorldOptions{world_size, 20000});
  AgGemm<T> ag(world, shape, shape_case.config);
  GemmRs<T> rs(world, shape, shape_case.config);
  GemmAr<T> ar(world, shape, shape_case.config);

  const size_t num_ranks = static_cast<size_t>(world_size);
  const int64_t a_rows = op == Op::kAgGemm ? shape_case.m_local : m;
  const int64_t c_rows = op == Op::kGemmRs ? shape_case.m_local : m;
  // Both calls run inside one World::run, back to back, as a training step would issue them:
  // nothing but the op's own entry barrier and epochs keeps call 1 from disturbing call 0.
  constexpr int kCalls = 2;
  struct CallData {
    std::vector<std::vector<T>> a, b, c, gathered;
    RankMats a_exact, b_exact;
  };
  std::vector<CallData> calls(kCalls);
  for (CallData& d : calls) {
    d.a.resize(num_ranks), d.b.resize(num_ranks), d.a_exact.resize(num_ranks), d.b_exact.resize(num_ranks);
    for (size_t r = 0; r < num_ranks; ++r) {
      d.a[r] = random_values<T>(rng, a_rows * k, d.a_exact[r]);
      d.b[r] = random_values<T>(rng, k * n, d.b_exact[r]);
    }
    d.c.assign(num_ranks, std::vector<T>(size_t(c_rows * n), poison<T>()));
    d.gathered.assign(num_ranks, std::vector<T>(size_t(m * k), poison<T>()));
  }

  world.run([&](int rank) {
    const size_t r = size_t(rank);
    for (CallData& d : calls) {
      switch (op) {
        case Op::kAgGemm: ag.run(rank, d.a[r].data(), d.b[r].data(), d.c[r].data(), d.gathered[r].data()); break;
        case Op::kGemmRs: rs.run(rank, d.a[r].data(), d.b[r].data(), d.c[r].data()); break;
        case Op::kGemmAr: ar.run(rank, d.a[r].data(), d.b[r].data(), d.c[r].data()); break;
      }
    }
  });

  for (int call = 0; call < kCalls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const CallData& d = calls[size_t(call)];
    const RankMats ref = op == Op::kAgGemm   ? naive_ag_gemm(d.a_exact, d.b_exact, m, n, k)
                         : op == Op::kGemmRs ? naive_gemm_rs(d.a_exact, d.b_exact, m, n, k)
                                             : naive_gemm_ar(d.a_exact, d.b_exact, m, n, k);
    for (size_t r = 0; r < num_ranks; ++r) {
      const double err = rel_err(to_double(d.c[r]), ref[r]);
      EXPECT_LE(err, tolerance<T>()) << op_name(op) << " rank " << r;
    }
    if (op == Op::kAgGemm) {
      // The gathered A is a copy: exact, bit for bit, on every rank.
      std::vector<T> want;
      for (const auto& shard : d.a) want.insert(want.end(), shard.begin(), shard.end());
      for (size_t r = 0; r < num_ranks; ++r) EXPECT_TRUE(same_bits(d.gathered[r], want)) << "rank " << r;
    }
    if (op == Op::kGemmAr) {
      // Each band is reduced and rounded once by its owner: all ranks hold identical bits.
      for (size_t r = 1; r < num_ranks; ++r) EXPECT_TRUE(same_bits(d.c[r], d.c[0])) << "rank " << r;
    }
  }
}

struct TpCase {
  Op op;
  int world_size;
  DType dtype;
  int shape_idx;
};

// gtest prints this in failure messages instead of the struct's bytes.
void PrintTo(const TpCase& c, std::ostream* os) {
  *os << op_name(c.op) << " W=" << c.world_size << " " << dtype_name(c.dtype) << " " << kShapes[c.shape_idx].name;
}

class ReferenceTp : public ::testing::TestWithParam<TpCase> {};

TEST_P(ReferenceTp, MatchesFp64ReferenceTwiceInARow) {
  const TpCase& p = GetParam();
  const ShapeCase& shape_case = kShapes[p.shape_idx];
  if (p.dtype == DType::kFloat32)
    check_op<float>(p.op, p.world_size, shape_case);
  else
    check_op<bf16>(p.op, p.world_size, shape_case);
}

std::vector<TpCase> all_cases() {
  std::vector<TpCase> cases;
  for (Op op : {Op::kAgGemm, Op::kGemmRs, Op::kGemmAr})
    for (int w : {1, 2, 3, 4, 8})
      for (DType dtype : {DType::kFloat32, DType::kBFloat16})
        for (int s = 0; s < int(std::size(kShapes)); ++s) cases.push_back({op, w, dtype, s});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, ReferenceTp, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<TpCase>& info) {
                           const TpCase& p = info.param;
                           return std::string(op_name(p.op)) + "_W" + std::to_string(p.world_size) + "_" +
                                  dtype_name(p.dtype) + "_" + kShapes[p.shape_idx].name;
                         });

// The three ops share one World and run interleaved, 10 times each with the same inputs, in two
// World::run sessions of 5 (op objects outlive a run): their signals and epochs must not
// interfere, and results must be bitwise the same every call.
TEST(ReferenceTpRepeat, OpsInterleavedOnOneWorldAreDeterministic) {
  constexpr int kWorld = 3, kRuns = 2, kCallsPerRun = 5;
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const TpShape shape{kWorld * 19, 33, 21};
  const TpConfig config{8, 16, 3};
  World world(WorldOptions{kWorld, 20000});
  AgGemm<bf16> ag(world, shape, config);
  GemmRs<bf16> rs(world, shape, config);
  GemmAr<bf16> ar(world, shape, config);

  const int64_t m_local = shape.m / kWorld;
  std::vector<std::vector<bf16>> a_ag(kWorld), a_full(kWorld), b(kWorld);
  RankMats a_ag_x(kWorld), a_full_x(kWorld), b_x(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    a_ag[r] = random_values<bf16>(rng, m_local * shape.k, a_ag_x[r]);
    a_full[r] = random_values<bf16>(rng, shape.m * shape.k, a_full_x[r]);
    b[r] = random_values<bf16>(rng, shape.k * shape.n, b_x[r]);
  }
  std::vector<std::vector<bf16>> c_ag(kWorld), c_rs(kWorld), c_ar(kWorld);
  std::vector<int> mismatches(kWorld, 0);
  for (int run = 0; run < kRuns; ++run) {
    world.run([&](int rank) {
      std::vector<bf16> ag_out(size_t(shape.m * shape.n)), rs_out(size_t(m_local * shape.n)),
          ar_out(size_t(shape.m * shape.n));
      for (int call = 0; call < kCallsPerRun; ++call) {
        ag.run(rank, a_ag[rank].data(), b[rank].data(), ag_out.data());
        rs.run(rank, a_full[rank].data(), b[rank].data(), rs_out.data());
        ar.run(rank, a_full[rank].data(), b[rank].data(), ar_out.data());
        if (run == 0 && call == 0) {
          c_ag[rank] = ag_out, c_rs[rank] = rs_out, c_ar[rank] = ar_out;
        } else {
          mismatches[rank] += !same_bits(ag_out, c_ag[rank]) + !same_bits(rs_out, c_rs[rank]) +
                              !same_bits(ar_out, c_ar[rank]);
        }
      }
    });
  }
  EXPECT_EQ(mismatches, std::vector<int>(kWorld, 0));
  const RankMats ref_ag = naive_ag_gemm(a_ag_x, b_x, shape.m, shape.n, shape.k);
  const RankMats ref_rs = naive_gemm_rs(a_full_x, b_x, shape.m, shape.n, shape.k);
  const RankMats ref_ar = naive_gemm_ar(a_full_x, b_x, shape.m, shape.n, shape.k);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_LE(rel_err(to_double(c_ag[r]), ref_ag[r]), 1e-2) << "ag_gemm rank " << r;
    EXPECT_LE(rel_err(to_double(c_rs[r]), ref_rs[r]), 1e-2) << "gemm_rs rank " << r;
    EXPECT_LE(rel_err(to_double(c_ar[r]), ref_ar[r]), 1e-2) << "gemm_ar rank " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input

std::string invalid_argument_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other exception: ") + e.what();
  }
  return "no exception";
}

template <typename Op>
void expect_rejects(World& world, TpShape shape, TpConfig config, const std::string& message) {
  EXPECT_EQ(invalid_argument_message([&] { Op op(world, shape, config); }), message);
}

template <typename Op>
void check_bad_inputs() {
  World world3(3);
  expect_rejects<Op>(world3, {1000, 8, 8}, {}, "m 1000 is not divisible by world_size 3");
  expect_rejects<Op>(world3, {0, 8, 8}, {}, "m 0 must be positive");
  expect_rejects<Op>(world3, {6, -5, 8}, {}, "n -5 must be positive");
  expect_rejects<Op>(world3, {6, 8, 0}, {}, "k 0 must be positive");
  expect_rejects<Op>(world3, {6, 8, 8}, {0, 64, 0}, "block_m 0 must be positive");
  expect_rejects<Op>(world3, {6, 8, 8}, {64, -16, 0}, "block_n -16 must be positive");
  expect_rejects<Op>(world3, {6, 8, 8}, {64, 64, -1}, "chunk_rows -1 must not be negative (0 means block_m)");
  expect_rejects<Op>(world3, {int64_t(3) << 40, 1 << 20, 8}, {1, 1, 0},
                     "m 3298534883328, n 1048576 with block_m 1, block_n 1 give more than 2147483647 tiles");
  expect_rejects<Op>(world3, {int64_t(3) << 40, 8, 8}, {1 << 30, 64, 1},
                     "m 3298534883328 with chunk_rows 1 gives more than 2147483647 chunks");
}

TEST(ReferenceTpArgs, AgGemmRejectsBadShapesAndTiles) { check_bad_inputs<AgGemm<float>>(); }
TEST(ReferenceTpArgs, GemmRsRejectsBadShapesAndTiles) { check_bad_inputs<GemmRs<bf16>>(); }
TEST(ReferenceTpArgs, GemmArRejectsBadShapesAndTiles) { check_bad_inputs<GemmAr<float>>(); }

TEST(ReferenceTpArgs, NullPointersAreRejected) {
  World world(2);
  AgGemm<float> ag(world, {4, 4, 4});
  GemmRs<float> rs(world, {4, 4, 4});
  GemmAr<float> ar(world, {4, 4, 4});
  std::vector<float> buf(64, 0.0f);
  EXPECT_EQ(invalid_argument_message([&] {
              world.run([&](int rank) { ag.run(rank, nullptr, buf.data(), buf.data()); });
            }),
            "ag_gemm: a_local, b and c must not be null");
  World world2(2);
  GemmRs<float> rs2(world2, {4, 4, 4});
  GemmAr<float> ar2(world2, {4, 4, 4});
  EXPECT_EQ(invalid_argument_message([&] {
              world2.run([&](int rank) { rs2.run(rank, buf.data(), nullptr, buf.data()); });
            }),
            "gemm_rs: a, b and c_band must not be null");
  World world3(2);
  GemmAr<float> ar3(world3, {4, 4, 4});
  EXPECT_EQ(invalid_argument_message([&] {
              world3.run([&](int rank) { ar3.run(rank, buf.data(), buf.data(), nullptr); });
            }),
            "gemm_ar: a, b and c must not be null");
}

// ---------------------------------------------------------------------------------------------
// The fp64 references and the metric

TEST(Naive, AgGemmGathersRowsInRankOrder) {
  // W = 2, M = 2, K = 1, N = 2: A = [[1], [2]], B_0 = [[1, 10]], B_1 = [[-1, 0]].
  const RankMats out = naive_ag_gemm({{1}, {2}}, {{1, 10}, {-1, 0}}, 2, 2, 1);
  EXPECT_EQ(out[0], (std::vector<double>{1, 10, 2, 20}));
  EXPECT_EQ(out[1], (std::vector<double>{-1, 0, -2, 0}));
}

TEST(Naive, GemmRsAndArSumOverRanks) {
  // W = 2, M = 2, K = 1, N = 1: A_0 = [[1], [2]], A_1 = [[3], [4]], B_0 = [[10]], B_1 = [[100]].
  const RankMats a = {{1, 2}, {3, 4}}, b = {{10}, {100}};
  const RankMats rs = naive_gemm_rs(a, b, 2, 1, 1);
  EXPECT_EQ(rs[0], (std::vector<double>{310}));
  EXPECT_EQ(rs[1], (std::vector<double>{420}));
  const RankMats ar = naive_gemm_ar(a, b, 2, 1, 1);
  EXPECT_EQ(ar[0], (std::vector<double>{310, 420}));
  EXPECT_EQ(ar[1], ar[0]);
}

TEST(Naive, RejectsMismatchedSizes) {
  EXPECT_EQ(invalid_argument_message([] { naive_gemm_ar({{1, 2}, {3}}, {{1}, {1}}, 2, 1, 1); }),
            "a[1] has 1 elements, want 2");
  EXPECT_EQ(invalid_argument_message([] { naive_gemm_rs({{1, 2, 3}}, {{1}}, 3, 1, 1); }), "no exception");
  EXPECT_EQ(invalid_argument_message([] { naive_gemm_rs({{1, 2, 3}, {1, 2, 3}}, {{1}, {1}}, 3, 1, 1); }),
            "m 3 is not divisible by world_size 2");
}

TEST(RelErr, IsTheRelativeL2Norm) {
  EXPECT_DOUBLE_EQ(rel_err({3, 4}, {3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(rel_err({3, 5}, {3, 4}), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(rel_err({0, 0}, {3, 4}), 1.0);
}

TEST(RelErr, NanOrInfInOutputIsInfinite) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(rel_err({1, nan}, {1, 1}), inf);
  EXPECT_EQ(rel_err({inf, 1}, {1, 1}), inf);
  EXPECT_EQ(rel_err({-inf, 1}, {0, 0}), inf);
}

TEST(RelErr, ZeroReferenceGivesTheOutputNorm) {
  EXPECT_DOUBLE_EQ(rel_err({0, 0}, {0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(rel_err({3, 4}, {0, 0}), 5.0);
}

}  // namespace
}  // namespace ccfuse::ref
