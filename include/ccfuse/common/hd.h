// ccfuse/common/hd.h: host+device qualifiers and small integer math shared by CPU and GPU code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CCFUSE_HD __host__ __device__ __forceinline__
#else
#define CCFUSE_HD inline
#endif

namespace ccfuse {

CCFUSE_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
CCFUSE_HD constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
CCFUSE_HD constexpr int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace ccfuse
