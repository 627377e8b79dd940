// tests/gpu/gemm_reference.cuh: the fp64 GEMM reference kernel shared by the GPU tests.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ccfuse/common/dtype.h"

namespace ccfuse::testing {

// 16-bit bits (bf16 or fp16) of uniform [-1, 1) values from (seed, stream id).
inline std::vector<uint16_t> random_16(DType t, uint64_t seed, uint64_t id, size_t count) {
  std::mt19937_64 gen(seed * 1000003ull + id);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> v(count);
  for (auto& x : v) {
    const float f = dist(gen);
    if (t == DType::kBFloat16) {
      x = bf16::from_float(f).bits;
    } else {
      x = __half_raw(__float2half(f)).x;
    }
  }
  return v;
}

// The value of 16-bit bits of dtype t.
inline double value_of_16(DType t, uint16_t bits) {
  if (t == DType::kBFloat16) return bf16{bits}.to_float();
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

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
