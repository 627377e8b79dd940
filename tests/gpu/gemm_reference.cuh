// tests/gpu/gemm_reference.cuh: the fp64 GEMM reference kernel shared by the GPU tests.
#pragma once

#include <cstdint>

namespace ccfuse::testing {

template <class E>
__device__ double to_double(E v) {
  return double(float(v));
}

// C_ref[i, j] = sum_k A[i, k] * B(k, j) in fp64 (B(k, j) = b[k * ldb + j] for kn, b[j * ldb + k] for nk);
// with `accumulate`, C_ref += that (sums of per-rank partials).
template <class E>
__global__ void reference_gemm(const E* a, int64_t lda, const E* b, int64_t ldb, bool b_nk, double* c, int64_t m,
                               int64_t n, int64_t k, bool accumulate = false) {
  const int64_t row = blockIdx.y * int64_t(blockDim.y) + threadIdx.y;
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= m || col >= n) return;
  double acc = 0;
  for (int64_t kk = 0; kk < k; ++kk)
    acc += to_double(a[row * lda + kk]) * to_double(b_nk ? b[col * ldb + kk] : b[kk * ldb + col]);
  c[row * n + col] = accumulate ? c[row * n + col] + acc : acc;
}

}  // namespace ccfuse::testing
