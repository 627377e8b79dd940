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
  // Split-K / stream-K: the tile accumulates k-blocks [kb_begin, min(kb_end, all)) only, as part
  // `split` of the sum of cut tile `fixup_tile` (KPartSchedule). Every other schedule leaves the
  // defaults: all of K, a whole tile.
  int kb_begin = 0;
  int kb_end = 0x7fffffff;
  int split = 0;
  int64_t fixup_tile = -1;
  // K-grouped problems (KGroupedSchedule, the MoE weight gradients): the tile's K is rows
  // [k_row0, k_row0 + k_rows) of A and B (kb_end = its k-blocks; the last one's rows past k_rows
  // belong to the next group and are zeroed in shared memory). Other schedules leave 0.
  int64_t k_row0 = 0;
  int k_rows = 0;
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

// group_m for a plain GEMM of whole tiles (choose_config): 16 row tiles a group where there are
// at least 32 row tiles, N >= 3072 and K >= 2048, 8 otherwise. Measured 2026-11-30 on the 96 TP
// shapes against 8 in the same call (bench/results/2026-11-30-h200x2-gemm-ab3-*): +0.6 to +2 %
// on those shapes (a group's B columns stay in L2 for twice the rows); -2 to -3 % with K <= 1024
// (the shorter tiles turn over faster than L2 refills A), -0.2 to -1.9 % with 8 row tiles (one
// group: column-major over the whole matrix) and on N <= 2560.
// A tile narrower than it is tall (block_n < block_m: the 128x96 tile, whose A rows are the
// bigger operand of each stage) takes groups of 4 row tiles: neighbouring CTAs then share A
// bands, where the column-major order of 8 spreads every A band over the whole grid. Measured
// 2026-12-01 on one H200 (bench/results/2026-12-01-h200-gemm-raster-sweep-*): 1024x1536x4096
// 89 -> 96.5 % of cuBLASLt back to back (81 -> 92 % interleaved), 1024x1280x8192 level back to
// back and +3 to +7 points interleaved; groups of 2 and row-major lose there, and 4 loses 1-7 %
// on the wider tiles, where B is the bigger operand.
constexpr int kGroupMWide = 16, kGroupMDefault = 8, kGroupMNarrow = 4;
CCFUSE_HD int plain_group_m(int64_t m_tiles, int64_t n, int64_t k, int block_m, int block_n) {
  if (block_n < block_m) return kGroupMNarrow;
  return m_tiles >= 32 && n >= 3072 && k >= 2048 ? kGroupMWide : kGroupMDefault;
}

// Sliced: the N tiles cut into slices of `slice` tiles (the last one may be narrower), every tile
// of a slice (grouped row-major inside it) before any of the next. The columns of a slice are
// final early, so they can be reduced or sent while the next slice computes (the MoE FFN's
// layer 1 pre-sums a slice's columns beside the GEMM); A is read once per slice, B once.
CCFUSE_HD TileCoord sliced_row_major(int64_t idx, int m_tiles, int n_tiles, int slice, int group_m) {
  const int64_t per_slice = int64_t(m_tiles) * slice;
  const int s = int(idx / per_slice);
  const int width = int(min_i64(slice, int64_t(n_tiles) - int64_t(s) * slice));
  const TileCoord c = grouped_row_major(idx - s * per_slice, m_tiles, width, group_m);
  return TileCoord{c.m_tile, s * slice + c.n_tile};
}

// Grouped problems whose row tiles come in two parts, "first" then "rest": every group's first
// row tiles before any group's other row tiles (MoE layer 0: the row tiles whose rows are all
// this GPU's own tokens, which wait for no peer, before the tiles that need rows from peers).
// Group g owns tiles [tile_prefix[g], tile_prefix[g + 1]) (m_tiles(g) * n_tiles of them); its
// first first_prefix[g + 1] - first_prefix[g] of them (f_g * n_tiles: the row tiles 0 .. f_g - 1)
// come in the first part. Inside a part, groups in order and grouped-row-major inside a group.
// Both prefix arrays start at 0 and do not decrease; first_prefix[g + 1] - first_prefix[g] <=
// tile_prefix[g + 1] - tile_prefix[g]. Returns the group and the tile inside the group.
struct GroupTile {
  int group;
  TileCoord tile;  // m_tile inside the group
};
CCFUSE_HD GroupTile first_then_rest(int64_t idx, const int* tile_prefix, const int* first_prefix, int num_groups,
                                    int n_tiles, int group_m) {
  const int64_t firsts = first_prefix[num_groups];
  const bool first = idx < firsts;
  const int64_t j = first ? idx : idx - firsts;
  // The part's prefix at g: first_prefix[g], or the rest's tile_prefix[g] - first_prefix[g].
  auto prefix = [&](int g) -> int64_t { return first ? first_prefix[g] : int64_t(tile_prefix[g]) - first_prefix[g]; };
  int lo = 0, hi = num_groups;  // the largest g with prefix(g) <= j (empty groups skipped)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (prefix(mid) <= j) lo = mid;
    else hi = mid;
  }
  const int f = (first_prefix[lo + 1] - first_prefix[lo]) / n_tiles;  // the group's first row tiles
  const int m_tiles = first ? f : (tile_prefix[lo + 1] - tile_prefix[lo]) / n_tiles - f;
  const TileCoord c = grouped_row_major(j - prefix(lo), m_tiles, n_tiles, group_m);
  return GroupTile{lo, TileCoord{first ? c.m_tile : f + c.m_tile, c.n_tile}};
}

// Column-major: all row tiles of an N-slice before the next slice.
CCFUSE_HD TileCoord column_major(int64_t idx, int m_tiles) {
  return TileCoord{int(idx % m_tiles), int(idx / m_tiles)};
}

// Stream-K (docs/gemm.md): tiles [0, dp_tiles) run whole, one per unit; the k-blocks of the
// other sk_tiles tiles, taken as one range of I = sk_tiles * k_tiles iterations (tile-major), are
// cut evenly over `ctas` CTAs: CTA c runs [c I / ctas, (c + 1) I / ctas), as up to `segments`
// units, one per tile it touches (the rest empty). Its j-th is unit dp_tiles + j * ctas + c, so
// a persistent grid of exactly `ctas` CTAs taking units round robin gives each CTA its own.
// Needs I >= ctas (no CTA without iterations) and dp_tiles a multiple of ctas.
struct KPart {
  int64_t tile;  // cut tile (index among the sk_tiles), -1: an empty unit
  int kb_begin, kb_end;
  int part;      // index of this part among its tile's parts, in k order
};
struct StreamKPlan {
  int64_t dp_tiles = 0, sk_tiles = 0;
  int k_tiles = 1, ctas = 1, segments = 1;
  CCFUSE_HD int64_t iters() const { return sk_tiles * k_tiles; }
  CCFUSE_HD int64_t begin_of(int c) const { return int64_t(c) * iters() / ctas; }
  // The CTA whose range holds iteration i: the largest c with begin_of(c) <= i.
  CCFUSE_HD int cta_of(int64_t i) const { return int(((i + 1) * ctas + iters() - 1) / iters()) - 1; }
  CCFUSE_HD int64_t units() const { return dp_tiles + int64_t(ctas) * segments; }
  CCFUSE_HD int64_t slots() const { return int64_t(ctas) * segments; }  // one per stream-K unit
  CCFUSE_HD int parts(int64_t t) const { return cta_of((t + 1) * k_tiles - 1) - cta_of(t * k_tiles) + 1; }
  // The slot (stream-K unit index) of part i of cut tile t.
  CCFUSE_HD int64_t slot(int64_t t, int i) const {
    const int c = cta_of(t * k_tiles) + i;
    return (t - begin_of(c) / k_tiles) * ctas + c;
  }
  // Stream-K unit u (counted from dp_tiles).
  CCFUSE_HD KPart part_of(int64_t u) const {
    const int c = int(u % ctas);
    const int64_t j = u / ctas, begin = begin_of(c), end = begin_of(c + 1);
    const int64_t t = begin / k_tiles + j;
    if (t >= sk_tiles || t * k_tiles >= end) return KPart{-1, 0, 0, 0};
    const int64_t lo = begin - t * k_tiles, hi = end - t * k_tiles;
    return KPart{t, int(lo > 0 ? lo : 0), int(hi < k_tiles ? hi : k_tiles), c - cta_of(t * k_tiles)};
  }
};

// The plan for `tiles` tiles of `k_tiles` k-blocks on `sms` CTAs: whole tiles for all full waves
// but the last; stream-K over the last full wave plus the partial one (fewer parts per tile than
// cutting the partial wave alone), or over all tiles when there are at most `sms`.
CCFUSE_HD StreamKPlan make_stream_k_plan(int64_t tiles, int k_tiles, int sms) {
  StreamKPlan p;
  p.k_tiles = k_tiles;
  p.sk_tiles = tiles <= sms ? tiles : sms + tiles % sms;
  p.dp_tiles = tiles - p.sk_tiles;
  p.ctas = int(p.iters() < sms ? p.iters() : sms);
  const int64_t per_cta = (p.iters() + p.ctas - 1) / p.ctas;
  p.segments = int((per_cta + k_tiles - 1) / k_tiles + 1);
  return p;
}

}  // namespace ccfuse::gemm
