// src/tool/routing.cpp: how --op grouped_gemm spreads its tokens * topk rows over the experts
// (cli.h, grouped_rows). Host-only and deterministic: tools/moe_grouped.py computes the same
// counts in Python (both are pinned by tests against the same checked-in values).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ccfuse/common/error.h"
#include "src/tool/cli.h"

namespace ccfuse::tool {

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kZipf: return "zipf";
    case Routing::kOneHot: return "one_hot";
    case Routing::kEmptySome: return "empty_some";
  }
  return "?";
}

Routing parse_routing(const std::string& text) {
  for (Routing r : {Routing::kUniform, Routing::kZipf, Routing::kOneHot, Routing::kEmptySome})
    if (text == routing_name(r)) return r;
  throw InvalidArgument(detail::str_cat("--routing ", text, " is not supported (uniform, zipf, one_hot, empty_some)"));
}

namespace {

// `total` rows split evenly over `parts`; the first total % parts get one more.
int64_t even_share(int64_t total, int64_t parts, int64_t index) {
  return total / parts + (index < total % parts ? 1 : 0);
}

}  // namespace

std::vector<int64_t> grouped_rows(int experts, int64_t total_rows, Routing routing) {
  CCFUSE_ARG_CHECK(experts >= 1, "--experts ", experts, " must be at least 1");
  CCFUSE_ARG_CHECK(total_rows >= 0, "the rows to route (", total_rows, ") must not be negative");
  const size_t e_count = size_t(experts);
  std::vector<int64_t> rows(e_count, 0);
  switch (routing) {
    case Routing::kUniform:
      for (size_t e = 0; e < e_count; ++e) rows[e] = even_share(total_rows, experts, int64_t(e));
      break;
    case Routing::kOneHot:
      rows[0] = total_rows;
      break;
    case Routing::kEmptySome: {
      CCFUSE_ARG_CHECK(experts >= 2, "--routing empty_some needs --experts of at least 2 (it empties the even "
                                     "experts and fills the odd ones)");
      const int64_t odd = experts / 2;  // experts 1, 3, ..., the i-th odd one is 2i+1
      for (int64_t i = 0; i < odd; ++i) rows[size_t(2 * i + 1)] = even_share(total_rows, odd, i);
      break;
    }
    case Routing::kZipf: {
      // Integer weights, so that the split is exact integer arithmetic (only the weights come from
      // floating point: pow of a small integer, far from any rounding tie).
      std::vector<int64_t> w(e_count);
      __int128 sum = 0;
      for (size_t e = 0; e < e_count; ++e) {
        w[e] = std::llround(1073741824.0 / std::pow(double(e + 1), kZipfExponent));  // 2^30 / (e+1)^s
        sum += w[e];
      }
      int64_t given = 0;
      for (size_t e = 0; e < e_count; ++e) {
        rows[e] = int64_t(__int128(total_rows) * w[e] / sum);
        given += rows[e];
      }
      // The remainder (< experts) one row each to the first experts: keeps the counts non-increasing.
      for (size_t e = 0; given < total_rows; ++e, ++given) ++rows[e];
      break;
    }
  }
  return rows;
}

}  // namespace ccfuse::tool
