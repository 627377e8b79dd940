// src/tp/banded_tiles.cuh: the tile order of the fused TP ops' GEMMs (internal), one for both.
// Tiles go band by band (a band = one rank's M / W rows) in the order of ccfuse/common/schedule.h
// (ag_band_at: own band first; rs_band_at: peers' bands first, staggered, own band last) and
// grouped row-major inside a band. A band has ceil(m_local / BLOCK_M) row tiles; the last one's
// rows past the band are computed (from the next band's A rows or TMA zeros) but never stored.
#pragma once

#include <cstdint>

#include "ccfuse/common/schedule.h"
#include "ccfuse/gemm/tile_order.h"

namespace ccfuse::tp {

struct BandedTiles {
  static constexpr int kBlockM = 128;
  int m_tiles_per_band = 0, n_tiles = 0, group_m = 8, rank = 0, world = 1;
  int64_t m_local = 0;
  bool peers_first = false;  // rs_band_at order (gemm_rs, gemm_ar); else ag_band_at (ag_gemm)

  CCFUSE_HD int64_t num_tiles() const { return int64_t(world) * m_tiles_per_band * n_tiles; }
  int64_t max_tiles() const { return num_tiles(); }
  // m_tile is the row tile counted over all bands (band * m_tiles_per_band + tile in band).
  CCFUSE_HD gemm::TileWork work(int64_t idx) const {
    const int64_t per_band = int64_t(m_tiles_per_band) * n_tiles;
    const int step = int(idx / per_band);
    const int band = peers_first ? rs_band_at(rank, world, step) : ag_band_at(rank, world, step);
    const gemm::TileCoord c = gemm::grouped_row_major(idx % per_band, m_tiles_per_band, n_tiles, group_m);
    const int64_t row0 = band * m_local + int64_t(c.m_tile) * kBlockM;
    return gemm::TileWork{band * m_tiles_per_band + c.m_tile, c.n_tile, 0, row0, (band + 1) * m_local};
  }
  // 2-CTA clusters (B multicast, as in the plain GEMM): unit `idx` is a pair of vertically
  // adjacent row tiles of one band, in the same band order; CTA `cta_rank` of the cluster takes
  // row tile 2 * pair + cta_rank. Needs an even m_tiles_per_band (the host checks).
  CCFUSE_HD int64_t num_pairs() const { return int64_t(world) * (m_tiles_per_band / 2) * n_tiles; }
  CCFUSE_HD gemm::TileWork work_pair(int64_t idx, int cta_rank) const {
    const int m_pairs = m_tiles_per_band / 2;
    const int64_t per_band = int64_t(m_pairs) * n_tiles;
    const int step = int(idx / per_band);
    const int band = peers_first ? rs_band_at(rank, world, step) : ag_band_at(rank, world, step);
    const gemm::TileCoord c = gemm::grouped_row_major(idx % per_band, m_pairs, n_tiles, group_m > 1 ? group_m / 2 : 1);
    const int mt = 2 * c.m_tile + cta_rank;
    const int64_t row0 = band * m_local + int64_t(mt) * kBlockM;
    return gemm::TileWork{band * m_tiles_per_band + mt, c.n_tile, 0, row0, (band + 1) * m_local};
  }
};


}  // namespace ccfuse::tp
