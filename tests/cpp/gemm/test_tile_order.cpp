// The GEMM engine's tile orders (ccfuse/gemm/tile_order.h), on the host: the persistent kernel's
// scheduler runs the same __host__ __device__ functions, so a tile visited twice or never here is
// a tile computed twice or never on the GPU. Header-only: this suite links no CUDA library.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ccfuse/gemm/tile_order.h"

namespace ccfuse::gemm {
namespace {

using Tile = std::pair<int, int>;  // (m_tile, n_tile)

// The documented order spelled out as loops: groups of `group_m` row tiles (the last one may be
// shorter); inside a group, down the group's rows first, then across N.
std::vector<Tile> expected_grouped(int m_tiles, int n_tiles, int group_m) {
  std::vector<Tile> order;
  for (int first_m = 0; first_m < m_tiles; first_m += group_m) {
    const int rows = std::min(group_m, m_tiles - first_m);
    for (int n = 0; n < n_tiles; ++n)
      for (int m = first_m; m < first_m + rows; ++m) order.emplace_back(m, n);
  }
  return order;
}

std::vector<Tile> grouped_order(int m_tiles, int n_tiles, int group_m) {
  std::vector<Tile> order;
  const int64_t total = int64_t(m_tiles) * n_tiles;
  for (int64_t idx = 0; idx < total; ++idx) {
    const TileCoord t = grouped_row_major(idx, m_tiles, n_tiles, group_m);
    order.emplace_back(t.m_tile, t.n_tile);
  }
  return order;
}

// Every tile of the m_tiles x n_tiles grid exactly once, none outside it.
void expect_each_tile_once(const std::vector<Tile>& order, int m_tiles, int n_tiles, const std::string& what) {
  ASSERT_EQ(order.size(), size_t(m_tiles) * size_t(n_tiles)) << what;
  std::vector<int> seen(size_t(m_tiles) * size_t(n_tiles), 0);
  for (const auto& [m, n] : order) {
    ASSERT_TRUE(m >= 0 && m < m_tiles && n >= 0 && n < n_tiles) << what << ": tile (" << m << ", " << n << ")";
    ++seen[size_t(m) * size_t(n_tiles) + size_t(n)];
  }
  for (size_t i = 0; i < seen.size(); ++i)
    ASSERT_EQ(seen[i], 1) << what << ": tile (" << i / size_t(n_tiles) << ", " << i % size_t(n_tiles) << ")";
}

const int kGroupMs[] = {1, 2, 3, 4, 5, 7, 8, 16, 33};

TEST(TileOrder, GroupedRowMajorVisitsEveryTileOnceInTheDocumentedOrder) {
  // Includes last partial groups (m_tiles not a multiple of group_m) and group_m > m_tiles.
  for (int m_tiles = 1; m_tiles <= 21; ++m_tiles) {
    for (int n_tiles = 1; n_tiles <= 13; ++n_tiles) {
      for (int group_m : kGroupMs) {
        const std::string what = "m_tiles=" + std::to_string(m_tiles) + " n_tiles=" + std::to_string(n_tiles) +
                                 " group_m=" + std::to_string(group_m);
        const auto order = grouped_order(m_tiles, n_tiles, group_m);
        expect_each_tile_once(order, m_tiles, n_tiles, what);
        ASSERT_EQ(order, expected_grouped(m_tiles, n_tiles, group_m)) << what;
      }
    }
  }
}

TEST(TileOrder, GroupedRowMajorOnRealShapes) {
  // 128 x 256 tiles of Llama-3 GEMMs: M = 16384 (128 row tiles) with N = 28672 (112 column
  // tiles); M = 1000 (8 row tiles, the last partial) with N = 3072; and one row of tiles.
  for (const auto& [m_tiles, n_tiles] : {Tile{128, 112}, Tile{8, 12}, Tile{1, 7}, Tile{129, 5}}) {
    for (int group_m : {1, 8, 16, 200}) {
      const std::string what = "m_tiles=" + std::to_string(m_tiles) + " n_tiles=" + std::to_string(n_tiles) +
                               " group_m=" + std::to_string(group_m);
      expect_each_tile_once(grouped_order(m_tiles, n_tiles, group_m), m_tiles, n_tiles, what);
    }
  }
}

TEST(TileOrder, GroupedPrefixStaysWithinGroupRows) {
  // L2 reuse: the first rows * k tiles (rows = the group's height, group_m or all of m_tiles
  // when fewer) cover exactly the rows x k block at the top left, so concurrently running CTAs
  // share k column tiles of B and `rows` row tiles of A.
  for (int m_tiles : {1, 3, 8, 10, 17}) {
    for (int n_tiles : {1, 2, 9}) {
      for (int group_m : kGroupMs) {
        const int rows = std::min(group_m, m_tiles);
        for (int k = 1; k <= n_tiles; ++k) {
          std::set<Tile> prefix;
          for (int64_t idx = 0; idx < int64_t(rows) * k; ++idx) {
            const TileCoord t = grouped_row_major(idx, m_tiles, n_tiles, group_m);
            EXPECT_LT(t.m_tile, rows) << "idx " << idx << " group_m " << group_m << " m_tiles " << m_tiles;
            EXPECT_LT(t.n_tile, k) << "idx " << idx << " group_m " << group_m << " m_tiles " << m_tiles;
            prefix.insert({t.m_tile, t.n_tile});
          }
          EXPECT_EQ(prefix.size(), size_t(rows) * size_t(k));  // the whole block, each tile once
        }
      }
    }
  }
}

TEST(TileOrder, EveryGroupStaysInItsRows) {
  // Group g (tiles [g * group_m * n_tiles, (g + 1) * group_m * n_tiles)) owns row tiles
  // [g * group_m, g * group_m + group_m), clipped to m_tiles, and all column tiles.
  for (int m_tiles : {5, 16, 23}) {
    const int n_tiles = 6;
    for (int group_m : {2, 4, 8}) {
      const int64_t per_group = int64_t(group_m) * n_tiles;
      const int64_t total = int64_t(m_tiles) * n_tiles;
      for (int64_t idx = 0; idx < total; ++idx) {
        const TileCoord t = grouped_row_major(idx, m_tiles, n_tiles, group_m);
        const int64_t group = idx / per_group;
        EXPECT_GE(t.m_tile, group * group_m) << idx;
        EXPECT_LT(t.m_tile, std::min<int64_t>((group + 1) * group_m, m_tiles)) << idx;
      }
    }
  }
}

TEST(TileOrder, GroupedRowMajorIndicesPast32Bits) {
  // 2^17 x 2^16 tiles: linear indices past 2^32 must not wrap (the per-group product is 64-bit).
  const int m_tiles = 1 << 17, n_tiles = 1 << 16, group_m = 8;
  const int64_t total = int64_t(m_tiles) * n_tiles;
  for (int64_t idx : {int64_t(0), (int64_t(1) << 32) + 5, total - n_tiles * int64_t(group_m), total - 1}) {
    const TileCoord t = grouped_row_major(idx, m_tiles, n_tiles, group_m);
    const int64_t per_group = int64_t(group_m) * n_tiles, group = idx / per_group, local = idx % per_group;
    EXPECT_EQ(t.m_tile, group * group_m + local % group_m) << idx;  // every group is full here
    EXPECT_EQ(t.n_tile, local / group_m) << idx;
  }
  const TileCoord last = grouped_row_major(total - 1, m_tiles, n_tiles, group_m);
  EXPECT_EQ(last.m_tile, m_tiles - 1);
  EXPECT_EQ(last.n_tile, n_tiles - 1);
}

TEST(TileOrder, ColumnMajorVisitsEveryTileOnceColumnByColumn) {
  for (int m_tiles = 1; m_tiles <= 17; ++m_tiles) {
    for (int n_tiles = 1; n_tiles <= 11; ++n_tiles) {
      const std::string what = "m_tiles=" + std::to_string(m_tiles) + " n_tiles=" + std::to_string(n_tiles);
      std::vector<Tile> order, expected;
      for (int64_t idx = 0; idx < int64_t(m_tiles) * n_tiles; ++idx) {
        const TileCoord t = column_major(idx, m_tiles);
        order.emplace_back(t.m_tile, t.n_tile);
      }
      for (int n = 0; n < n_tiles; ++n)
        for (int m = 0; m < m_tiles; ++m) expected.emplace_back(m, n);
      expect_each_tile_once(order, m_tiles, n_tiles, what);
      ASSERT_EQ(order, expected) << what;
      // An N-slice is complete after m_tiles * (slice + 1) tiles (MoE layer 1 sends it then).
      for (int k = 1; k <= n_tiles; ++k)
        for (int64_t idx = 0; idx < int64_t(m_tiles) * k; ++idx) ASSERT_LT(column_major(idx, m_tiles).n_tile, k);
    }
  }
}

// Sliced order: the tiles of slice s (n in [s * slice, s * slice + width)) occupy exactly the
// indices [s * m_tiles * slice, ... + m_tiles * width), in grouped row-major order inside; every
// tile once.
TEST(TileOrder, SlicedRowMajorVisitsEachTileOnceSliceBySlice) {
  for (int m_tiles : {1, 3, 8, 13})
    for (int n_tiles : {1, 4, 7, 16})
      for (int slice : {1, 3, 4, 16})
        for (int group_m : {1, 8}) {
          if (slice > n_tiles) continue;
          std::set<Tile> seen;
          int64_t idx = 0;
          for (int first_n = 0; first_n < n_tiles; first_n += slice) {
            const int width = std::min(slice, n_tiles - first_n);
            for (const Tile& t : expected_grouped(m_tiles, width, group_m)) {
              const TileCoord c = sliced_row_major(idx, m_tiles, n_tiles, slice, group_m);
              EXPECT_EQ(c.m_tile, t.first) << "idx " << idx << " m " << m_tiles << " n " << n_tiles << " slice " << slice;
              EXPECT_EQ(c.n_tile, first_n + t.second) << "idx " << idx << " m " << m_tiles << " n " << n_tiles;
              seen.insert({c.m_tile, c.n_tile});
              ++idx;
            }
          }
          EXPECT_EQ(idx, int64_t(m_tiles) * n_tiles);
          EXPECT_EQ(seen.size(), size_t(m_tiles) * n_tiles);
        }
}

// first_then_rest against the order spelled out: for random groups (some empty, some with no
// first tiles, some all first), every group's first f_g row tiles (grouped row-major inside the
// group, groups in order), then every group's other row tiles the same way; every tile once.
TEST(TileOrder, FirstThenRestVisitsFirstTilesOfEveryGroupBeforeTheRest) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&](int bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int((state >> 33) % uint64_t(bound));
  };
  for (int trial = 0; trial < 200; ++trial) {
    const int groups = 1 + next(9), n_tiles = 1 + next(7), group_m = 1 + next(9);
    std::vector<int> m_tiles(static_cast<size_t>(groups)), f(static_cast<size_t>(groups));
    std::vector<int> tile_prefix(size_t(groups) + 1, 0), first_prefix(size_t(groups) + 1, 0);
    for (int g = 0; g < groups; ++g) {
      m_tiles[size_t(g)] = next(4) == 0 ? 0 : next(12);
      const int pick = next(4);  // none first, all first, or some
      f[size_t(g)] = pick == 0 ? 0 : pick == 1 ? m_tiles[size_t(g)] : next(m_tiles[size_t(g)] + 1);
      tile_prefix[size_t(g) + 1] = tile_prefix[size_t(g)] + m_tiles[size_t(g)] * n_tiles;
      first_prefix[size_t(g) + 1] = first_prefix[size_t(g)] + f[size_t(g)] * n_tiles;
    }
    std::vector<std::pair<int, Tile>> want;
    for (int part = 0; part < 2; ++part)
      for (int g = 0; g < groups; ++g) {
        const int lo = part == 0 ? 0 : f[size_t(g)], hi = part == 0 ? f[size_t(g)] : m_tiles[size_t(g)];
        for (const Tile& t : expected_grouped(hi - lo, n_tiles, group_m))
          want.emplace_back(g, Tile{lo + t.first, t.second});
      }
    ASSERT_EQ(int64_t(want.size()), int64_t(tile_prefix[size_t(groups)]));
    for (int64_t idx = 0; idx < int64_t(want.size()); ++idx) {
      const GroupTile got = first_then_rest(idx, tile_prefix.data(), first_prefix.data(), groups, n_tiles, group_m);
      ASSERT_EQ(got.group, want[size_t(idx)].first) << "trial " << trial << " idx " << idx;
      ASSERT_EQ(got.tile.m_tile, want[size_t(idx)].second.first) << "trial " << trial << " idx " << idx;
      ASSERT_EQ(got.tile.n_tile, want[size_t(idx)].second.second) << "trial " << trial << " idx " << idx;
    }
  }
}

// choose_config's raster (plain_group_m): groups of 16 row tiles on large problems of long K
// only (measured 2026-11-30 against 8: faster there, slower on K <= 1024, on 8 row tiles and on
// N <= 2560); groups of 4 for tiles narrower than tall (measured 2026-12-01 on the 128x96 tile).
TEST(TileOrder, PlainGroupMRule) {
  EXPECT_EQ(plain_group_m(32, 3072, 2048, 128, 256), kGroupMWide);
  EXPECT_EQ(plain_group_m(128, 28672, 8192, 128, 256), kGroupMWide);
  EXPECT_EQ(plain_group_m(128, 28672, 8192, 128, 192), kGroupMWide);
  EXPECT_EQ(plain_group_m(31, 14336, 8192, 128, 256), kGroupMDefault);  // M = 3968 with 128-row tiles
  EXPECT_EQ(plain_group_m(8, 14336, 8192, 128, 224), kGroupMDefault);   // M = 1024: one group of all rows
  EXPECT_EQ(plain_group_m(128, 2560, 8192, 128, 160), kGroupMDefault);
  EXPECT_EQ(plain_group_m(128, 4096, 1792, 128, 256), kGroupMDefault);
  EXPECT_EQ(plain_group_m(128, 4096, 1024, 128, 256), kGroupMDefault);
  EXPECT_EQ(plain_group_m(8, 4096, 1024, 128, 128), kGroupMDefault);  // square tiles: as wide ones
  // Narrower than tall: A is the bigger operand, neighbours share A bands.
  EXPECT_EQ(plain_group_m(8, 1536, 4096, 128, 96), kGroupMNarrow);
  EXPECT_EQ(plain_group_m(8, 1280, 8192, 128, 96), kGroupMNarrow);
  EXPECT_EQ(plain_group_m(128, 28672, 8192, 128, 64), kGroupMNarrow);
  // The order itself stays a permutation with every group size on a real shape.
  for (int g : {kGroupMNarrow, kGroupMDefault, kGroupMWide}) {
    const int mt = 128, nt = 56;  // 16384 x 14336 in 128 x 256 tiles
    std::vector<int> seen(size_t(mt) * nt, 0);
    for (int64_t i = 0; i < int64_t(mt) * nt; ++i) {
      const TileCoord t = grouped_row_major(i, mt, nt, g);
      ++seen[size_t(t.m_tile) * nt + t.n_tile];
    }
    for (int c : seen) ASSERT_EQ(c, 1) << "group_m " << g;
  }
}

}  // namespace
}  // namespace ccfuse::gemm
