// reference/naive.cpp: fp64 references of the TP ops, written from the definitions in
// DESIGN §1 with no tiling, so that a schedule bug in tp_ops.cpp cannot hide in both.
#include "reference/naive.h"

#include <cmath>
#include <limits>

#include "ccfuse/common/error.h"

namespace ccfuse::ref {

namespace {

// out [rows, n] += a [rows, k] @ b [k, n], all row-major.
void gemm_acc(const double* a, const double* b, double* out, int64_t rows, int64_t n, int64_t k) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const double a_ip = a[i * k + p];
      for (int64_t j = 0; j < n; ++j) out[i * n + j] += a_ip * b[p * n + j];
    }
}

void check_inputs(const RankMats& a, const RankMats& b, int64_t a_rows, int64_t m, int64_t n, int64_t k) {
  CCFUSE_ARG_CHECK(!a.empty(), "a must hold one matrix per rank");
  CCFUSE_ARG_CHECK(a.size() == b.size(), "a has ", a.size(), " ranks but b has ", b.size());
  CCFUSE_ARG_CHECK(m > 0 && n > 0 && k > 0, "m, n, k (", m, ", ", n, ", ", k, ") must be positive");
  const int64_t w = int64_t(a.size());
  CCFUSE_ARG_CHECK(m % w == 0, "m ", m, " is not divisible by world_size ", w);
  for (size_t r = 0; r < a.size(); ++r) {
    CCFUSE_ARG_CHECK(int64_t(a[r].size()) == a_rows * k, "a[", r, "] has ", a[r].size(), " elements, want ",
                     a_rows * k);
    CCFUSE_ARG_CHECK(int64_t(b[r].size()) == k * n, "b[", r, "] has ", b[r].size(), " elements, want ", k * n);
  }
}

// Σ_r a[r] @ b[r] as one [m, n] matrix.
std::vector<double> sum_of_products(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k) {
  std::vector<double> sum(size_t(m * n), 0.0);
  for (size_t r = 0; r < a.size(); ++r) gemm_acc(a[r].data(), b[r].data(), sum.data(), m, n, k);
  return sum;
}

}  // namespace

RankMats naive_ag_gemm(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k) {
  const int64_t w = int64_t(a.size());
  check_inputs(a, b, w > 0 ? m / w : 0, m, n, k);
  // The gathered A [m, k]: rank r's shard is rows [r*M/W, (r+1)*M/W).
  std::vector<double> gathered;
  gathered.reserve(size_t(m * k));
  for (const auto& shard : a) gathered.insert(gathered.end(), shard.begin(), shard.end());
  RankMats out(a.size());
  for (size_t r = 0; r < a.size(); ++r) {
    out[r].assign(size_t(m * n), 0.0);
    gemm_acc(gathered.data(), b[r].data(), out[r].data(), m, n, k);
  }
  return out;
}

RankMats naive_gemm_rs(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k) {
  check_inputs(a, b, m, m, n, k);
  const int64_t m_local = m / int64_t(a.size());
  const std::vector<double> sum = sum_of_products(a, b, m, n, k);
  RankMats out(a.size());
  for (size_t r = 0; r < a.size(); ++r) {
    const auto first = sum.begin() + int64_t(r) * m_local * n;
    out[r].assign(first, first + m_local * n);
  }
  return out;
}

RankMats naive_gemm_ar(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k) {
  check_inputs(a, b, m, m, n, k);
  return RankMats(a.size(), sum_of_products(a, b, m, n, k));
}

double rel_err(const std::vector<double>& out, const std::vector<double>& ref) {
  CCFUSE_ARG_CHECK(out.size() == ref.size(), "out has ", out.size(), " elements but ref has ", ref.size());
  double diff2 = 0.0, ref2 = 0.0, out2 = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    // A NaN would vanish from a comparison like `err <= tol` (false, but easy to invert by
    // mistake); +inf fails every tolerance whichever way it is written.
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    const double d = out[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
    out2 += out[i] * out[i];
  }
  // An all-zero reference has no scale; the absolute norm of `out` is the only honest answer.
  if (ref2 == 0.0) return std::sqrt(out2);
  return std::sqrt(diff2 / ref2);
}

}  // namespace ccfuse::ref
