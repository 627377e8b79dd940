// Bad input to the MoE layers of the CPU reference world: InvalidArgument whose message names
// the rule, raised before the entry barrier so that World::run reports it (not a timeout).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "reference/moe_layers.h"

namespace ccfuse::ref {
namespace {

void expect_invalid(const std::function<void()>& fn, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected InvalidArgument: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception: " << e.what() << "; expected InvalidArgument: " << message;
  }
}

MoeShape good_shape() {
  MoeShape s;
  s.max_tokens_per_rank = 256;
  s.hidden = 16;
  s.ffn = 8;
  s.num_experts = 8;
  s.topk = 2;
  return s;
}

TEST(MoeLayersErrors, ValidateNamesTheRule) {
  World w4(4);
  MoeShape s = good_shape();
  s.num_experts = 10;
  expect_invalid([&] { validate_moe(w4, s); }, "num_experts 10 is not divisible by world_size 4");
  s = good_shape();
  s.topk = 9;
  expect_invalid([&] { validate_moe(w4, s); }, "topk 9 must not exceed num_experts 8");
  s = good_shape();
  s.topk = 0;
  expect_invalid([&] { validate_moe(w4, s); }, "topk 0 must be at least 1");
  s = good_shape();
  s.hidden = 0;
  expect_invalid([&] { validate_moe(w4, s); }, "hidden 0 must be positive");
  s = good_shape();
  s.ffn = -3;
  expect_invalid([&] { validate_moe(w4, s); }, "ffn -3 must be positive");
  s = good_shape();
  s.max_tokens_per_rank = 0;
  expect_invalid([&] { validate_moe(w4, s); }, "max_tokens_per_rank 0 must be positive");
  s = good_shape();
  s.num_experts = 0;
  expect_invalid([&] { validate_moe(w4, s); }, "num_experts 0 must be positive");
  s = good_shape();
  s.max_tokens_per_rank = int64_t(1) << 30;
  expect_invalid([&] { validate_moe(w4, s); },
                 "max_tokens_per_rank 1073741824 with world_size 4 and topk 2 gives more than 2147483647 entries");
  expect_invalid([&] { validate_moe(w4, good_shape(), MoeConfig{64, 64, 0}); }, "slice_cols 0 must be positive");
  expect_invalid([&] { validate_moe(w4, good_shape(), MoeConfig{0, 64, 64}); }, "chunk_tokens 0 must be positive");
  expect_invalid([&] { validate_moe(w4, good_shape(), MoeConfig{64, -1, 64}); }, "block_m -1 must be positive");
  validate_moe(w4, good_shape());
  validate_moe(w4, good_shape(), MoeConfig{});
}

TEST(MoeLayersErrors, ConstructorsValidate) {
  World w4(4);
  MoeShape s = good_shape();
  s.num_experts = 10;
  expect_invalid([&] { MoeLayer0<bf16>(w4, s, DispatchMode::kAllGather); },
                 "num_experts 10 is not divisible by world_size 4");
  expect_invalid([&] { MoeLayer1<float>(w4, s, DispatchMode::kAllToAll); },
                 "num_experts 10 is not divisible by world_size 4");
  expect_invalid([&] { MoeLayer1<float>(w4, good_shape(), DispatchMode::kAllToAll, MoeConfig{64, 64, 0}); },
                 "slice_cols 0 must be positive");
}

// Inputs for W = 2 ranks of good_shape(): rank 0 gets `bad_tokens` tokens (or its ids are set
// by `tweak`), rank 1 a valid call.
struct RunInputs {
  std::vector<std::vector<float>> x, w1, w2, weights, out;
  std::vector<std::vector<int32_t>> ids;
  std::vector<int64_t> tokens;
};

RunInputs make_inputs(const MoeShape& s, int64_t tokens0) {
  RunInputs in;
  in.tokens = {tokens0, 4};
  for (int r = 0; r < 2; ++r) {
    const int64_t t = in.tokens[size_t(r)];
    in.x.emplace_back(size_t(t * s.hidden), 0.5f);
    in.w1.emplace_back(size_t(s.num_experts / 2 * s.hidden * s.ffn), 0.25f);
    in.w2.emplace_back(size_t(s.num_experts / 2 * s.ffn * s.hidden), 0.25f);
    std::vector<int32_t> ids(size_t(t * s.topk));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % size_t(s.num_experts));
    in.ids.push_back(ids);
    in.weights.emplace_back(size_t(t * s.topk), 0.5f);
    in.out.emplace_back(size_t(t * s.hidden), 0.0f);
  }
  return in;
}

TEST(MoeLayersErrors, TooManyTokens) {
  World world(2);
  const MoeShape s = good_shape();
  MoeLayer0<float> layer0(world, s, DispatchMode::kAllGather);
  RunInputs in = make_inputs(s, 300);
  expect_invalid(
      [&] {
        world.run([&](int rank) {
          std::vector<float> act;
          MoeMetadata meta;
          const size_t r = size_t(rank);
          layer0.run(rank, in.x[r].data(), in.tokens[r], in.ids[r].data(), in.weights[r].data(), in.w1[r].data(), act,
                     meta);
        });
      },
      "num_tokens 300 exceeds max_tokens_per_rank 256");
}

TEST(MoeLayersErrors, ExpertIdOutOfRange) {
  for (int32_t bad : {8, -2}) {
    World world(2);
    const MoeShape s = good_shape();
    MoeLayer0<float> layer0(world, s, DispatchMode::kAllToAll);
    RunInputs in = make_inputs(s, 3);
    in.ids[0][3] = bad;  // token 1, slot 1
    expect_invalid(
        [&] {
          world.run([&](int rank) {
            std::vector<float> act;
            MoeMetadata meta;
            const size_t r = size_t(rank);
            layer0.run(rank, in.x[r].data(), in.tokens[r], in.ids[r].data(), in.weights[r].data(), in.w1[r].data(),
                       act, meta);
          });
        },
        "topk_ids[1][1] = " + std::to_string(bad) + " is out of range [-1, 8)");
  }
}

// Layer 1 checks what it is given against the metadata of layer 0: a layer 1 built for another
// ffn or topk, or the wrong num_tokens, is refused before the entry barrier.
TEST(MoeLayersErrors, Layer1MismatchedWithLayer0) {
  struct Mismatch {
    int ffn, topk;
    int64_t tokens_delta;
    std::string message;
  };
  const MoeShape s = good_shape();
  // Rank 0 has 3 tokens x top-2 over 8 experts at i % 8: ids 0..5, experts 0..3 are rank 0's,
  // so rank 0 holds 4 rows of its own + rank 1's 4 tokens x 2 = ids 0..7 -> 4 more: 8 rows.
  const std::vector<Mismatch> cases = {
      {12, 2, 0, "act has 64 elements, expected rows 8 x ffn 12 = 96"},
      {8, 1, 0, "metadata topk 2 does not match the layer's topk 1"},
      {8, 2, 1, "num_tokens 4 does not match layer 0's num_tokens 3"},
  };
  for (const Mismatch& mm : cases) {
    SCOPED_TRACE(mm.message);
    World world(2);
    MoeLayer0<float> layer0(world, s, DispatchMode::kAllGather);
    MoeShape s1 = s;
    s1.ffn = mm.ffn;
    s1.topk = mm.topk;
    MoeLayer1<float> layer1(world, s1, DispatchMode::kAllGather);
    RunInputs in = make_inputs(s, 3);
    std::vector<std::vector<float>> act(2);
    std::vector<MoeMetadata> meta(2);
    world.run([&](int rank) {
      const size_t r = size_t(rank);
      layer0.run(rank, in.x[r].data(), in.tokens[r], in.ids[r].data(), in.weights[r].data(), in.w1[r].data(), act[r],
                 meta[r]);
    });
    ASSERT_EQ(meta[0].layout.rows(), 8);
    std::vector<float> big_out(size_t(8 * s.hidden));
    expect_invalid(
        [&] {
          // Only rank 0 calls: it must fail before the entry barrier, so nobody waits for rank 1.
          world.run([&](int rank) {
            if (rank != 0) return;
            layer1.run(rank, act[0], meta[0], in.w2[0].data(), in.tokens[0] + mm.tokens_delta, big_out.data());
          });
        },
        mm.message);
  }
}

}  // namespace
}  // namespace ccfuse::ref
