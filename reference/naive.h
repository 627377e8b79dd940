// reference/naive.h: fp64 references of the TP ops, straight from their definitions (no tiles,
// no schedule, no signals), and the error metric ‖out − ref‖ / ‖ref‖ (DESIGN §4 rule 6).
#pragma once

#include <cstdint>
#include <vector>

namespace ccfuse::ref {

// Per-rank inputs as doubles (already rounded to the op's dtype). a[r], b[r] are row-major.
//   ag_gemm: a[r] [M/W, K], b[r] [K, N] -> out[r] [M, N]
//   gemm_rs: a[r] [M, K],   b[r] [K, N] -> out[r] [M/W, N]
//   gemm_ar: a[r] [M, K],   b[r] [K, N] -> out[r] [M, N]
using RankMats = std::vector<std::vector<double>>;
RankMats naive_ag_gemm(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k);
RankMats naive_gemm_rs(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k);
RankMats naive_gemm_ar(const RankMats& a, const RankMats& b, int64_t m, int64_t n, int64_t k);

// ‖out − ref‖₂ / ‖ref‖₂ over all elements; NaN or Inf anywhere in `out` gives +inf.
double rel_err(const std::vector<double>& out, const std::vector<double>& ref);

}  // namespace ccfuse::ref
