// tests/cpp/test_util.h: helpers shared by the host test suites (random inputs, replayable seeds,
// poisoned outputs, error messages).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ccfuse/common/dtype.h"
#include "ccfuse/common/error.h"

namespace ccfuse::testing {

// A fresh seed per run, or CCFUSE_TEST_SEED to replay a failure.
inline uint64_t test_seed() {
  if (const char* env = std::getenv("CCFUSE_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
}

// For SCOPED_TRACE: how to replay this run.
inline std::string seed_trace(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (replay: CCFUSE_TEST_SEED=" + std::to_string(seed) + ")";
}

// The InvalidArgument message of fn(), or "" when it does not throw.
template <typename Fn>
std::string arg_error(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// NaN in T: outputs are filled with it before a run, so unwritten elements show.
template <typename T>
T poison() {
  return from_f32<T>(std::numeric_limits<float>::quiet_NaN());
}

// Uniform [-1, 1) rounded to T; `exact` gets the rounded values as doubles (an fp64 reference
// must see exactly what the op sees).
template <typename T>
std::vector<T> random_values(std::mt19937_64& rng, int64_t count, std::vector<double>& exact) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> out(static_cast<size_t>(count));
  exact.resize(size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    out[size_t(i)] = from_f32<T>(dist(rng));
    exact[size_t(i)] = to_f32(out[size_t(i)]);
  }
  return out;
}

}  // namespace ccfuse::testing
