// ccfuse/common/schedule.h: tile schedules of the TP ops, written once for the CPU reference
// world and the GPU kernels (__host__ __device__, no allocation, no CUDA headers).
//
// Shapes (W = world size, r = rank, m_local = M / W):
//   ag_gemm : A_r [m_local, K] gathered to A [M, K]; C_r = A @ B_r [M, N].
//   gemm_rs : A_r [M, K_r], B_r [K_r, N]; rank o owns rows [o*m_local, (o+1)*m_local) of the sum.
//   gemm_ar : as gemm_rs, then every rank gets all of [M, N].
// Tiles never straddle a rank's row band: each band is cut into ceil(m_local / block_m) row tiles,
// so M need not be a multiple of block_m (DESIGN §2.1: split along M).
#pragma once

#include <cstdint>

#include "ccfuse/common/hd.h"

namespace ccfuse {

// A tile of the output: rows [row0, row0 + rows) and columns [col0, col0 + cols) of [M, N];
// `band` is the rank whose row band holds it, `m_tile` its row-tile index inside that band.
struct Tile {
  int band;
  int m_tile;
  int n_tile;
  int64_t row0, rows;
  int64_t col0, cols;
};

// The tile grid of one problem, split by rank row bands.
struct BandedGrid {
  int world_size;
  int64_t m_local;   // rows per band (M / W)
  int64_t n;         // columns of C
  int block_m, block_n;

  CCFUSE_HD int m_tiles_per_band() const { return int(ceil_div(m_local, block_m)); }
  CCFUSE_HD int n_tiles() const { return int(ceil_div(n, block_n)); }
  CCFUSE_HD int tiles_per_band() const { return m_tiles_per_band() * n_tiles(); }
  CCFUSE_HD int num_tiles() const { return world_size * tiles_per_band(); }

  // Tile `t` of band `band` in row-major order (m outer, n inner: A rows are reused along N).
  CCFUSE_HD Tile band_tile(int band, int t) const {
    Tile tile;
    tile.band = band;
    tile.m_tile = t / n_tiles();
    tile.n_tile = t % n_tiles();
    tile.row0 = int64_t(band) * m_local + int64_t(tile.m_tile) * block_m;
    tile.rows = min_i64(block_m, m_local - int64_t(tile.m_tile) * block_m);
    tile.col0 = int64_t(tile.n_tile) * block_n;
    tile.cols = min_i64(block_n, n - tile.col0);
    return tile;
  }
};

// ag_gemm on rank r: bands in rank-rotated order (r + i) % W, so the first tiles need only the
// local shard and the last ones the data that had the longest time to arrive.
CCFUSE_HD int ag_band_at(int rank, int world_size, int step) { return (rank + step) % world_size; }

// gemm_rs / gemm_ar on rank r: the band for peer (r + 1 + i) % W is computed at step i, so that
// at every step each owner is targeted by exactly one rank (staggered) and the local band is last.
CCFUSE_HD int rs_band_at(int rank, int world_size, int step) { return (rank + 1 + step) % world_size; }

// The i-th tile (0 <= i < num_tiles) that rank r computes for the given op's band order.
CCFUSE_HD Tile ag_tile_at(const BandedGrid& g, int rank, int i) {
  const int per_band = g.tiles_per_band();
  return g.band_tile(ag_band_at(rank, g.world_size, i / per_band), i % per_band);
}
CCFUSE_HD Tile rs_tile_at(const BandedGrid& g, int rank, int i) {
  const int per_band = g.tiles_per_band();
  return g.band_tile(rs_band_at(rank, g.world_size, i / per_band), i % per_band);
}

// Chunking of a rank's shard for transfer: chunk c of band b holds rows
// [c * chunk_rows, min((c + 1) * chunk_rows, m_local)) of that band. Signal index of
// (band, chunk) is band * chunks_per_band + chunk.
struct Chunking {
  int64_t m_local;
  int64_t chunk_rows;

  CCFUSE_HD int chunks_per_band() const { return int(ceil_div(m_local, chunk_rows)); }
  CCFUSE_HD int64_t chunk_row0(int c) const { return int64_t(c) * chunk_rows; }
  CCFUSE_HD int64_t chunk_rows_of(int c) const { return min_i64(chunk_rows, m_local - chunk_row0(c)); }
  CCFUSE_HD int signal_index(int band, int chunk) const { return band * chunks_per_band() + chunk; }
  // Chunks [first, last] that cover band-local rows [r0, r0 + rows).
  CCFUSE_HD int first_chunk(int64_t r0) const { return int(r0 / chunk_rows); }
  CCFUSE_HD int last_chunk(int64_t r0, int64_t rows) const { return int((r0 + rows - 1) / chunk_rows); }
};

}  // namespace ccfuse
