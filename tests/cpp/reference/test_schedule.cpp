// Tile schedules of the TP ops (ccfuse/common/schedule.h): coverage, order and chunk cover.
// The GPU kernels use the same functions, so these properties hold for them too.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "ccfuse/common/schedule.h"

namespace ccfuse {
namespace {

struct GridCase {
  int world_size;
  int64_t m_local, n;
  int block_m, block_n;
};

std::vector<GridCase> grid_cases() {
  std::vector<GridCase> cases;
  for (int w : {1, 2, 3, 4, 8})
    for (int64_t m_local : {1, 7, 16, 37, 64})
      for (int64_t n : {1, 45, 64})
        for (auto [bm, bn] : {std::pair{16, 16}, std::pair{32, 8}, std::pair{64, 64}, std::pair{1, 3}})
          cases.push_back({w, m_local, n, bm, bn});
  return cases;
}

std::string describe(const GridCase& c) {
  return "W=" + std::to_string(c.world_size) + " m_local=" + std::to_string(c.m_local) + " n=" +
         std::to_string(c.n) + " block=" + std::to_string(c.block_m) + "x" + std::to_string(c.block_n);
}

BandedGrid make(const GridCase& c) { return BandedGrid{c.world_size, c.m_local, c.n, c.block_m, c.block_n}; }

// Counts how many tiles of rank `rank`'s order cover each element of [M, N]; checks each tile
// stays inside its band and the grid.
template <typename TileAt>
std::vector<int> cover_counts(const BandedGrid& g, int rank, TileAt tile_at) {
  const int64_t m = g.m_local * g.world_size;
  std::vector<int> count(size_t(m * g.n), 0);
  for (int i = 0; i < g.num_tiles(); ++i) {
    const Tile t = tile_at(g, rank, i);
    EXPECT_GT(t.rows, 0);
    EXPECT_GT(t.cols, 0);
    EXPECT_LE(t.rows, g.block_m);
    EXPECT_LE(t.cols, g.block_n);
    // A tile never straddles a band: its rows are all inside band t.band.
    EXPECT_GE(t.row0, int64_t(t.band) * g.m_local);
    EXPECT_LE(t.row0 + t.rows, int64_t(t.band + 1) * g.m_local);
    EXPECT_GE(t.col0, 0);
    EXPECT_LE(t.col0 + t.cols, g.n);
    EXPECT_EQ(t.row0, int64_t(t.band) * g.m_local + int64_t(t.m_tile) * g.block_m);
    EXPECT_EQ(t.col0, int64_t(t.n_tile) * g.block_n);
    for (int64_t r = t.row0; r < t.row0 + t.rows; ++r)
      for (int64_t c = t.col0; c < t.col0 + t.cols; ++c) ++count[size_t(r * g.n + c)];
  }
  return count;
}

TEST(Schedule, AgAndRsOrdersCoverEveryElementExactlyOnce) {
  for (const GridCase& c : grid_cases()) {
    SCOPED_TRACE(describe(c));
    const BandedGrid g = make(c);
    for (int rank = 0; rank < c.world_size; ++rank) {
      for (int count : cover_counts(g, rank, ag_tile_at)) ASSERT_EQ(count, 1) << "ag_tile_at rank " << rank;
      for (int count : cover_counts(g, rank, rs_tile_at)) ASSERT_EQ(count, 1) << "rs_tile_at rank " << rank;
    }
  }
}

TEST(Schedule, TileCountsAreCeilings) {
  const BandedGrid g{3, 37, 45, 16, 16};
  EXPECT_EQ(g.m_tiles_per_band(), 3);
  EXPECT_EQ(g.n_tiles(), 3);
  EXPECT_EQ(g.tiles_per_band(), 9);
  EXPECT_EQ(g.num_tiles(), 27);
  const Tile last = g.band_tile(2, 8);
  EXPECT_EQ(last.row0, 2 * 37 + 32);
  EXPECT_EQ(last.rows, 5);
  EXPECT_EQ(last.col0, 32);
  EXPECT_EQ(last.cols, 13);
}

TEST(Schedule, AgOrderStartsWithOwnBandAndIsRankRotated) {
  for (const GridCase& c : grid_cases()) {
    SCOPED_TRACE(describe(c));
    const BandedGrid g = make(c);
    const int per_band = g.tiles_per_band();
    for (int rank = 0; rank < c.world_size; ++rank) {
      EXPECT_EQ(ag_tile_at(g, rank, 0).band, rank);
      for (int i = 0; i < g.num_tiles(); ++i)
        ASSERT_EQ(ag_tile_at(g, rank, i).band, (rank + i / per_band) % c.world_size) << "rank " << rank << " i " << i;
    }
  }
}

TEST(Schedule, RsOrderIsStaggeredAndEndsWithOwnBand) {
  for (const GridCase& c : grid_cases()) {
    SCOPED_TRACE(describe(c));
    const BandedGrid g = make(c);
    for (int rank = 0; rank < c.world_size; ++rank) {
      EXPECT_EQ(rs_tile_at(g, rank, g.num_tiles() - 1).band, rank);
      if (c.world_size > 1) {
        EXPECT_EQ(rs_tile_at(g, rank, 0).band, (rank + 1) % c.world_size);
      }
    }
    // At every step, the W ranks target W distinct owners: no owner receives two pushes at once.
    for (int i = 0; i < g.num_tiles(); ++i) {
      std::set<int> owners;
      for (int rank = 0; rank < c.world_size; ++rank) owners.insert(rs_tile_at(g, rank, i).band);
      ASSERT_EQ(int(owners.size()), c.world_size) << "step " << i;
    }
  }
}

TEST(Schedule, ChunksPartitionTheBandAndCoverEachTile) {
  for (int64_t m_local : {1, 5, 16, 37, 64})
    for (int64_t chunk_rows : {1, 3, 8, 16, 40, 64, 100})
      for (int block_m : {1, 7, 16, 32}) {
        SCOPED_TRACE("m_local=" + std::to_string(m_local) + " chunk_rows=" + std::to_string(chunk_rows) +
                     " block_m=" + std::to_string(block_m));
        const Chunking ch{m_local, chunk_rows};
        // Chunks tile the band exactly.
        int64_t next_row = 0;
        for (int c = 0; c < ch.chunks_per_band(); ++c) {
          ASSERT_EQ(ch.chunk_row0(c), next_row);
          ASSERT_GT(ch.chunk_rows_of(c), 0);
          next_row += ch.chunk_rows_of(c);
        }
        ASSERT_EQ(next_row, m_local);
        // For every row tile, [first, last] is the smallest set of chunks that holds its rows.
        const BandedGrid g{1, m_local, 1, block_m, 1};
        for (int t = 0; t < g.m_tiles_per_band(); ++t) {
          const Tile tile = g.band_tile(0, t);
          const int first = ch.first_chunk(tile.row0);
          const int last = ch.last_chunk(tile.row0, tile.rows);
          ASSERT_GE(first, 0);
          ASSERT_LT(last, ch.chunks_per_band());
          ASSERT_LE(first, last);
          EXPECT_LE(ch.chunk_row0(first), tile.row0);
          EXPECT_GT(ch.chunk_row0(first) + ch.chunk_rows_of(first), tile.row0);
          EXPECT_GE(ch.chunk_row0(last) + ch.chunk_rows_of(last), tile.row0 + tile.rows);
          EXPECT_LT(ch.chunk_row0(last), tile.row0 + tile.rows);
        }
      }
}

TEST(Schedule, ChunkSignalIndicesAreDistinctAndDense) {
  for (int w : {1, 3, 8}) {
    const Chunking ch{37, 16};
    std::set<int> seen;
    for (int band = 0; band < w; ++band)
      for (int c = 0; c < ch.chunks_per_band(); ++c) seen.insert(ch.signal_index(band, c));
    EXPECT_EQ(int(seen.size()), w * ch.chunks_per_band());
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), w * ch.chunks_per_band() - 1);
  }
}

}  // namespace
}  // namespace ccfuse
