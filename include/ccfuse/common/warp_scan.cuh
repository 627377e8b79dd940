// Prefix sums by one warp, 32 items a step, and the grouped GEMM's per-group prefix arrays built
// with them.
//
// Why a warp and not one thread: the grouped schedule's prefix arrays (and the MoE plan's) were
// built by a single thread walking the groups, each step loading a group's rows from device memory
// and storing the prefixes. A store that may alias the next load keeps the loads in order, so the
// walk paid one L2 round trip per group: ~0.2 us a group, tens of microseconds at 64-256 experts,
// on the critical path before every grouped GEMM (docs/perf-notes.md, 2026-12-06). A warp pays one
// round trip per 32 groups.
#pragma once

#include <cstdint>

namespace ccfuse {

// The inclusive prefix sum of v over the warp's lanes (every lane of the warp takes part).
template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

// Exclusive prefix sums of value(i), i < n, by one warp (every lane calls it with the same n):
// write(i, sum of value(j) for j < i) for every i <= n, so write(n, total) comes last, from lane 0.
// Returns the total to every lane.
template <class T, class Value, class Write>
__device__ T warp_exclusive_scan(int n, Value value, Write write, int lane) {
  T carry = 0;
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int i = i0 + lane;
    const T v = i < n ? T(value(i)) : T(0);
    const T incl = warp_inclusive_scan(v, lane);
    if (i < n) write(i, carry + incl - v);
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) write(n, carry);
  return carry;
}

namespace gemm::sm90 {

// One warp: GroupedSchedule's prefix sums of rows and tiles per group (row_prefix may be null)
// from rows_of(g), the rows of group g (negative counts as 0). Rows past `max_rows` are dropped
// (counted in *overflow when not null) so that no tile reads or writes past the buffers: group g
// keeps min(P(g + 1), max_rows) - min(P(g), max_rows) rows, P being the prefix sum of the rows,
// the same as walking the groups one by one and cutting the first group that overflows.
// kept (optional, [num_groups]): those kept rows per group, for a scan of the caller's after it.
template <class RowsOf>
__device__ void grouped_prefix_warp(RowsOf rows_of, int num_groups, int n_tiles, int block_m, int64_t max_rows,
                                    int* tile_prefix, int64_t* row_prefix, int* overflow, int lane,
                                    int32_t* kept = nullptr) {
  int64_t rows_carry = 0;
  int tiles_carry = 0;
  for (int g0 = 0; g0 < num_groups; g0 += 32) {
    const int g = g0 + lane;
    int64_t r = g < num_groups ? int64_t(rows_of(g)) : 0;
    if (r < 0) r = 0;
    const int64_t incl = warp_inclusive_scan(r, lane);
    const int64_t lo = min(rows_carry + incl - r, max_rows), hi = min(rows_carry + incl, max_rows);
    // Row tiles of the kept rows; a 32-bit division where they fit (a 64-bit one by a runtime
    // divisor is a slow-path call, on the scan's critical path).
    const int64_t kept_rows = hi - lo;
    const int row_tiles = kept_rows < (int64_t(1) << 31)
                              ? int((uint32_t(kept_rows) + uint32_t(block_m - 1)) / uint32_t(block_m))
                              : int((kept_rows + block_m - 1) / block_m);
    const int t = g < num_groups ? row_tiles * n_tiles : 0;
    const int t_incl = warp_inclusive_scan(t, lane);
    if (g < num_groups) {
      if (row_prefix) row_prefix[g] = lo;
      tile_prefix[g] = tiles_carry + t_incl - t;
      if (kept) kept[g] = int32_t(hi - lo);
    }
    rows_carry += __shfl_sync(0xffffffffu, incl, 31);
    tiles_carry += __shfl_sync(0xffffffffu, t_incl, 31);
  }
  if (lane == 0) {
    if (row_prefix) row_prefix[num_groups] = min(rows_carry, max_rows);
    tile_prefix[num_groups] = tiles_carry;
    if (overflow) *overflow = int(rows_carry > max_rows ? rows_carry - max_rows : 0);
  }
}

}  // namespace gemm::sm90
}  // namespace ccfuse
