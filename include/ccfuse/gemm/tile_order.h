// ccfuse/gemm/tile_order.h: linear tile index -> (m_tile, n_tile), shared by the persistent GEMM
// kernel's scheduler and the host (tests, tools). __host__ __device__, no CUDA headers.
#pragma once

#include <cstdint>

#include "ccfuse/common/hd.h"

namespace ccfuse::gemm {

struct TileCoord {
  int m_tile;
  int n_tile;
};

// One output tile of a plain or grouped problem: rows [row0, min(row0 + block_m, row_end)) of
// the (concatenated) A and C, columns of n_tile, weights of batch `group` of B.
struct TileWork {
  int m_tile;  // inside its group
  int n_tile;
  int group;
  int64_t row0;
  int64_t row_end;  // exclusive; rows past it (the next group's) are computed but never stored
  // Split-K: the tile accumulates k-blocks [kb_begin, min(kb_end, all)) only, as part `split` of
  // its sum (SplitKSchedule). Every other schedule leaves the defaults: all of K.
  int kb_begin = 0;
  int kb_end = 0x7fffffff;
  int split = 0;
};

// Row-major in groups of `group_m` row tiles: inside a group, tiles go down the group's rows
// first, then across N, so that concurrently running CTAs share B columns and A rows in L2.
// The last group may have fewer rows.
CCFUSE_HD TileCoord grouped_row_major(int64_t idx, int m_tiles, int n_tiles, int group_m) {
  const int64_t per_group = int64_t(group_m) * n_tiles;
  const int64_t group = idx / per_group;
  const int first_m = int(group * group_m);
  const int rows = int(min_i64(group_m, m_tiles - first_m));
  const int64_t local = idx - group * per_group;
  return TileCoord{first_m + int(local % rows), int(local / rows)};
}

// Column-major: all row tiles of an N-slice before the next slice.
CCFUSE_HD TileCoord column_major(int64_t idx, int m_tiles) {
  return TileCoord{int(idx % m_tiles), int(idx / m_tiles)};
}

}  // namespace ccfuse::gemm
