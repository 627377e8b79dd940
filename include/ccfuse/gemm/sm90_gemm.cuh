// ccfuse/gemm/sm90_gemm.cuh: the persistent, warp-specialised Hopper GEMM (device template).
//
// C [M, N] = A [M, K] @ B, A K-major; B K-major ([N, K] storage) or N-major ([K, N] storage).
// One CTA = 3 warpgroups on one SM:
//   WG0  producer: one thread walks the CTA's tiles in the Schedule's order, waits on the
//        Schedule's ready predicate for a tile (a remote signal in the fused ops; nothing in the
//        plain GEMM), then issues TMA loads of A and B k-blocks into a kStages-deep ring of
//        shared-memory buffers, each guarded by a "full" and an "empty" mbarrier.
//   WG1, WG2  consumers: each owns kBlockM/2 rows of the tile and issues wgmma (fp32
//        accumulators in registers), keeping one wgmma batch in flight and releasing a stage as
//        soon as the batch that read it has completed; then runs the Epilogue on its rows.
// The grid is persistent (one CTA per SM of the budget), so the producer prefetches the next
// tile's k-blocks while the consumers run the epilogue of the current one.
//
// Hooks (zero cost when unused: empty structs and `if constexpr`):
//   Schedule::num_tiles() (device), Schedule::max_tiles() (host bound, sizes the grid),
//     Schedule::work(idx) -> TileWork (tile, group, row range), Schedule::kHasReady and
//     Schedule::wait_ready(work) (producer thread; false = watchdog fired)
//   Epilogue::kHasNotify and Epilogue::notify(work) after a tile's stores are visible.
//   Schedule::kHasSide, Schedule::num_side_ctas and Schedule::run_side(cta): horizontal fusion.
//     The first num_side_ctas CTAs of the grid run run_side (all their threads: communication or
//     reduction work) instead of the GEMM; the GEMM runs on the others. One kernel, one CTA per
//     SM: the side CTAs are resident whenever the GEMM's are, so GEMM tiles may wait on them.
//   Schedule::kGatherA and Schedule::gather_rows(...): A's rows gathered one by one (cp.async
//     by two producer warps) instead of TMA boxes of a strided A (HasGatherA, below).
// A grouped GEMM (MoE experts) is a Schedule whose tiles carry a group index (the batch of B)
// and a row range of the concatenated A/C; the kernel is the same.
#pragma once

#include <cuda/atomic>

#include <atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// cute/tensor.hpp first: the atom headers rely on what it declares.
#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include "ccfuse/common/error.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/gemm/tile_order.h"

namespace ccfuse::gemm::sm90 {

using namespace cute;

// Registers a thread of the producer warpgroup keeps when the epilogue has send warps (their copy
// loops). 56 spills the MoE layer-0 kernels' send warps (792 bytes of spill stores, ptxas); 72
// does not (80), leaving the consumers 216 instead of 224 (EXPERIMENT, written 2026-11-30, not
// yet run: build with -DCCFUSE_SEND_WARP_REGS=72, tools/stage_variant.sh).
#ifndef CCFUSE_SEND_WARP_REGS
#define CCFUSE_SEND_WARP_REGS 56
#endif

// Lanes of a gather warp that share one gathered A row (Schedule::kGatherA): 2 = each cp.async
// instruction reads one whole 32-byte sector of each of 16 rows per warp. Measured 2026-11-30 on
// the 18 MoE cases (docs/perf-notes.md): 1 lane (16 bytes of 32 rows: each sector fetched from
// L2 twice) the slowest, then 8 (a 128-byte line of 4 rows), 4 (64 bytes of 8 rows), 2 the
// fastest (layer 0 2.9 % below 4 lanes, geomean). An A/B switch for tools/stage_variant.sh.
#ifndef CCFUSE_GATHER_LANES_PER_ROW
#define CCFUSE_GATHER_LANES_PER_ROW 2
#endif

#ifndef CCFUSE_ADDEND_BATCH
#define CCFUSE_ADDEND_BATCH 8  // column groups of a partial tile loaded per batch (add_addends)
#endif

template <class Element_, int kBlockM_, int kBlockN_, int kBlockK_, int kStages_, bool kBNK_, int kClusterM_ = 1,
          bool kTmaStore_ = false, bool kPingpong_ = false, bool kPairN_ = false, int kStagingRing_ = 0,
          bool kAMN_ = false>
struct Traits {
  using Element = Element_;
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kBlockK = kBlockK_, kStages = kStages_;
  // CTAs per cluster (1 or 2). With 2, the two CTAs compute vertically adjacent tiles that share
  // their B tile: each loads half of it and multicasts it to both (a third less L2 traffic).
  static constexpr int kClusterM = kClusterM_;
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs");
  // kPairN (GemmConfig::cluster_n = 2; an experiment written 2026-11-30): the pair's tiles are
  // horizontally adjacent instead and share their A tile, each CTA loading half of it and
  // multicasting it, B loaded whole. A's bytes per FLOP are 1/block_n against B's 1/block_m, so
  // narrow tiles gain more from sharing A (docs/gemm.md, item 8). Plain problems with the
  // TMA-store epilogue only (PairNSchedule; the TMA store drops a tile past N).
  static constexpr bool kPairN = kPairN_;
  static_assert(!kPairN || (kClusterM == 2 && kTmaStore_), "pairs along N are built for clusters of 2 with tma_store");
  static constexpr bool kBNK = kBNK_;  // B stored [N, K] (K-major); else [K, N] (N-major)
  // Epilogue through shared memory and TMA stores (plain problems, PlainEpilogue): the consumers
  // write the tile into a swizzled staging buffer, one thread issues the TMA stores, and nobody
  // waits for them but the next tile's staging writes. Frees the tensor cores from the ~5.7 us per
  // tile that the register stores cost (docs/perf-notes.md). Needs kBlockM x kBlockN x 2 bytes.
  static constexpr bool kTmaStore = kTmaStore_;
  // The staging buffer holds kBlockN / kStoreCols sub-tiles of [kBlockM, kStoreCols], one TMA box
  // each: 64 columns (a 128-byte swizzle atom) where they tile the width, else 32 (a 64-byte one;
  // 128x96, 160, 224), else 16 (a 32-byte one; 128x48, 128x80).
  static constexpr int kStoreCols = kBlockN % 64 == 0 ? 64 : (kBlockN % 32 == 0 ? 32 : 16);
  static_assert(kBlockN % kStoreCols == 0, "whole TMA-store sub-tiles per tile");
  static constexpr int kStoreRowBytes = kStoreCols * int(sizeof(Element));  // = the swizzle width
  static constexpr int kStoreChunks = kStoreRowBytes / 16;                 // 16-byte chunks of a sub-tile row
  static constexpr int kStoreSubBytes = kBlockM * kStoreRowBytes;          // one sub-tile
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  // Ping-pong consumers (plain problems with the TMA-store epilogue; GemmConfig::pingpong, an
  // experiment written 2026-11-30): each consumer warpgroup computes whole tiles of its own (both
  // 64-row halves), the two taking the CTA's tiles in turn, so that one's epilogue runs while the
  // other's mainloop keeps the tensor cores busy. Each has its own staging buffer.
  static constexpr bool kPingpong = kPingpong_;
  static_assert(!kPingpong || (kTmaStore && kBlockM == 128), "ping-pong is built for 128-row TMA-store tiles");
  static constexpr int kStagingTiles = kPingpong ? 2 : 1;
  // kStagingRing > 0 (ping-pong only; written 2026-12-02, choose_config's ping-pong since v24,
  // docs/gemm.md item 9): each warpgroup stages its
  // tile through a ring of that many [kBlockM, kStoreCols] sub-tiles instead of a whole tile,
  // storing each sub-tile as soon as it is written (store_tile_tma_wg). The shared memory freed
  // buys pipeline stages (cuBLASLt's K = 512 kernel: 160-column ping-pong, 5 stages, sub-tiled
  // epilogue; docs/perf-notes.md, 2026-12-02).
  static constexpr int kStagingRing = kStagingRing_;
  static_assert(kStagingRing == 0 || kPingpong, "the staging ring is built for ping-pong consumers");
  static_assert(kStagingRing == 0 || kStagingRing <= kBlockN / kStoreCols, "a ring no longer than a tile");
  static constexpr int kStagingElems =
      kStagingRing > 0 ? kStagingTiles * kStagingRing * kBlockM * kStoreCols : kBlockM * kBlockN * kStagingTiles;
  static_assert(kBlockK * sizeof(Element) == 128, "one 128-byte swizzle atom along K");

  // kAMN (K-grouped problems, the MoE weight gradients): A is stored [K, M] (M contiguous, the
  // transpose of a row-major [rows, M] activation), laid out in shared memory as N-major B is
  // (64-row slabs of 64x8 swizzle atoms tiled along K first: each slab of a stage one contiguous
  // 8 KiB block, k-row k of it the 128-byte line k). KGroupedSchedule's problems.
  static constexpr bool kAMN = kAMN_;
  static_assert(!kAMN || kClusterM == 1, "A [K, M] is built for unpaired CTAs");
  using SmemAtomA = conditional_t<kAMN, GMMA::Layout_MN_SW128_Atom<Element>, GMMA::Layout_K_SW128_Atom<Element>>;
  using SmemOrderA = conditional_t<kAMN, Step<_2, _1, _3>, Step<_1, _2, _3>>;
  using SmemLayoutA = decltype(tile_to_shape(SmemAtomA{}, make_shape(Int<kBlockM>{}, Int<kBlockK>{}, Int<kStages>{}),
                                             SmemOrderA{}));
  using SmemAtomB = conditional_t<kBNK, GMMA::Layout_K_SW128_Atom<Element>, GMMA::Layout_MN_SW128_Atom<Element>>;
  // N-major B: tile the 64x8 swizzle atoms along K first, so that each 64-column slab of a
  // stage is one contiguous 64x64 block (one TMA box); N-first tiling cut every stage into
  // 8-row boxes and ran at 2/3 of the K-major speed (measured 519 vs 756 TFLOP/s).
  using SmemOrderB = conditional_t<kBNK, Step<_1, _2, _3>, Step<_2, _1, _3>>;
  using SmemLayoutB = decltype(tile_to_shape(SmemAtomB{}, make_shape(Int<kBlockN>{}, Int<kBlockK>{}, Int<kStages>{}),
                                             SmemOrderB{}));
  static constexpr GMMA::Major kMajorB = kBNK ? GMMA::Major::K : GMMA::Major::MN;
  static constexpr GMMA::Major kMajorA = kAMN ? GMMA::Major::MN : GMMA::Major::K;
  using MmaOp = decltype(GMMA::ss_op_selector<Element, Element, float,
                                              Shape<Int<kBlockM / kConsumerWGs>, Int<kBlockN>, Int<kBlockK>>,
                                              kMajorA, kMajorB>());
  // Two consumer warpgroups stacked along M; with kPingpong one warpgroup's (its fragment holds
  // both 64-row halves of a tile: MMA_M = 2).
  using TiledMma = decltype(make_tiled_mma(MmaOp{}, Layout<Shape<Int<kPingpong ? 1 : kConsumerWGs>, _1, _1>>{}));

  struct SharedStorage {
    alignas(1024) Element a[cosize_v<SmemLayoutA>];  // 128-byte swizzle wants 1 KiB alignment
    alignas(1024) Element b[cosize_v<SmemLayoutB>];
    alignas(1024) Element c[kTmaStore ? kStagingElems : 8];  // kTmaStore staging
    alignas(8) uint64_t full[kStages];
    alignas(8) uint64_t empty[kStages];
    alignas(8) uint64_t addend_full;  // Epilogue::kTmaAddends: a partial tile loaded into the staging buffer
    uint32_t tiles_handed;  // kHasSendWarps: tiles stored by the consumers so far
    int fixup_last;         // kHasFixup: is this part its tile's last (fixup_sum)
    uint64_t trace_t[3];    // tile traces: start, mma_done, addends_ready of the current tile
                            // (kept here, not in registers the mainloop needs)
  };
  static constexpr uint32_t kStageBytes = uint32_t((kBlockM + kBlockN) * kBlockK * sizeof(Element));
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  // launch_gemm asks for it all as dynamic shared memory: at most 227 KiB per block on sm_90.
  static_assert(kSmemBytes <= 232448, "shared memory of one CTA past the 227 KiB of sm_90");

  // Global views that the TMA descriptors are built from (host side). B is (N, K, groups).
  static auto gmem_a(const Element* a, int64_t m, int64_t k, int64_t lda) {
    if constexpr (kAMN)
      return make_tensor(make_gmem_ptr(a), make_shape(int(m), int(k)), make_stride(_1{}, lda));
    else
      return make_tensor(make_gmem_ptr(a), make_shape(int(m), int(k)), make_stride(lda, _1{}));
  }
  // kAMN with N-major B: the byte offset, from a stage's start, of the 128-byte line that holds
  // k-row k of the operand's 64-column slab `slab` (test_store_swizzle.cu checks it against the
  // layouts); zero_k_tail clears the lines of the rows past a group's end.
  CCFUSE_HD static constexpr int mn_major_line(int slab, int k) {
    return (slab * kBlockK + k) * 64 * int(sizeof(Element));
  }
  static auto gmem_b(const Element* b, int64_t n, int64_t k, int64_t ldb, int groups, int64_t group_stride) {
    if constexpr (kBNK)
      return make_tensor(make_gmem_ptr(b), make_shape(int(n), int(k), groups), make_stride(ldb, _1{}, group_stride));
    else
      return make_tensor(make_gmem_ptr(b), make_shape(int(n), int(k), groups), make_stride(_1{}, ldb, group_stride));
  }
  // The pair's multicast operand: A along N, B along M (kClusterM CTAs share it).
  static constexpr int kMulticastA = kPairN ? kClusterM : 1, kMulticastB = kPairN ? 1 : kClusterM;
  using TmaLoadA = conditional_t<kMulticastA == 1, SM90_TMA_LOAD, SM90_TMA_LOAD_MULTICAST>;
  using TmaA = decltype(make_tma_copy(TmaLoadA{}, gmem_a(nullptr, 1, 1, 1), SmemLayoutA{}(_, _, 0), Int<kMulticastA>{}));
  // C staging: kBlockN / kStoreCols sub-tiles of [kBlockM, kStoreCols], each one swizzled TMA box.
  using SmemAtomC = conditional_t<kStoreCols == 64, GMMA::Layout_K_SW128_Atom<Element>,
                                  conditional_t<kStoreCols == 32, GMMA::Layout_K_SW64_Atom<Element>,
                                                GMMA::Layout_K_SW32_Atom<Element>>>;
  using SmemLayoutC = decltype(tile_to_shape(SmemAtomC{},
                                             make_shape(Int<kBlockM>{}, Int<kStoreCols>{}, Int<kBlockN / kStoreCols>{})));
  // The byte offset in the staging buffer of the 16-byte chunk of tile row `row` that holds
  // columns [8 j, 8 j + 8), by hand (sC's layout evaluated per element spilled). The 1 KiB-aligned
  // buffer holds the sub-tiles one after the other, kBlockM rows of kStoreRowBytes each; the
  // 128-byte (64-, 32-byte) swizzle XORs a chunk's index in its row with bits 7-9 (7-8, 7) of the
  // row's byte offset: staging_swizzle(row), row % 8 (128-byte rows), (row / 2) % 4 (64-byte rows)
  // or (row / 4) % 2 (32-byte rows), the same for row + 8. Checked equal to
  // &sC(row, col % kStoreCols, col / kStoreCols) for every element of the 48-, 80-, 96-, 128-, 192-
  // and 256-column tiles (tests/cpp/gemm/test_store_swizzle.cu).
  CCFUSE_HD static constexpr int staging_swizzle(int row) { return (row / (128 / kStoreRowBytes)) % kStoreChunks; }
  CCFUSE_HD static constexpr int staging_chunk(int row, int j, int swizzle) {
    return (j / kStoreChunks) * kStoreSubBytes + row * kStoreRowBytes + (((j % kStoreChunks) ^ swizzle) << 4);
  }
  // stmatrix.x4 staging (CCFUSE_STMATRIX_STAGING): a warp stores column groups j and j + 1 of its
  // 16 rows as four 8x8 matrices, m = 0..3: column group j + m / 2, rows 8 (m % 2) .. + 7; lane l
  // gives the address of row l % 8 of matrix l / 8. The chunk (byte offset) lane l addresses, for
  // the warp whose first tile row is warp_row0; checked against staging_chunk for every element
  // (tests/cpp/gemm/test_store_swizzle.cu).
  CCFUSE_HD static constexpr int stmatrix_chunk(int warp_row0, int j, int lane) {
    const int row = warp_row0 + (lane % 8) + 8 * ((lane / 8) % 2);
    return staging_chunk(row, j + lane / 16, staging_swizzle(row));
  }
  static auto gmem_c(Element* c, int64_t m, int64_t n, int64_t ldc) {
    return make_tensor(make_gmem_ptr(c), make_shape(int(m), int(n)), make_stride(ldc, _1{}));
  }
  using TmaC = decltype(make_tma_copy(SM90_TMA_STORE{}, gmem_c(nullptr, 1, 1, 1), SmemLayoutC{}(_, _, 0)));
  using TmaLoadB = conditional_t<kMulticastB == 1, SM90_TMA_LOAD, SM90_TMA_LOAD_MULTICAST>;
  using TmaB = decltype(make_tma_copy(TmaLoadB{}, gmem_b(nullptr, 1, 1, 1, 1, 1), SmemLayoutB{}(_, _, 0),
                                      Int<kMulticastB>{}));
};

// The plain schedule: all tiles of one problem, grouped row-major or column-major.
struct PlainSchedule {
  int m_tiles = 0, n_tiles = 0, group_m = 8;
  bool col_major = false;
  int block_m = 128;
  int64_t m = 0;
  static constexpr bool kHasReady = false;
  static constexpr bool kHasSide = false;
  static constexpr bool kTmaStoreOk = true;  // tiles are clipped at M only
  CCFUSE_HD int64_t num_tiles() const { return int64_t(m_tiles) * n_tiles; }
  int64_t max_tiles() const { return num_tiles(); }
  CCFUSE_HD TileCoord coord(int64_t idx) const {
    return col_major ? column_major(idx, m_tiles) : grouped_row_major(idx, m_tiles, n_tiles, group_m);
  }
  CCFUSE_HD TileWork work(int64_t idx) const {
    const TileCoord c = coord(idx);
    return TileWork{c.m_tile, c.n_tile, 0, int64_t(c.m_tile) * block_m, m};
  }
  // 2-CTA clusters: unit `idx` is a pair of vertically adjacent tiles; CTA `rank` takes row tile
  // 2 * pair + rank. With an odd number of row tiles the last pair's second tile lies past M: it
  // loads zeros, still multicasts its half of B to its partner, and stores nothing.
  CCFUSE_HD int64_t num_pairs() const { return int64_t((m_tiles + 1) / 2) * n_tiles; }
  CCFUSE_HD TileWork work_pair(int64_t idx, int rank) const {
    const int m_pairs = (m_tiles + 1) / 2;
    const TileCoord c =
        col_major ? column_major(idx, m_pairs) : grouped_row_major(idx, m_pairs, n_tiles, group_m > 1 ? group_m / 2 : 1);
    const int mt = 2 * c.m_tile + rank;
    return TileWork{mt, c.n_tile, 0, int64_t(mt) * block_m, m};
  }
  __device__ bool wait_ready(const TileWork&) { return true; }
};

// The plain schedule for CTA pairs along N (Traits::kPairN): unit `idx` is a pair of horizontally
// adjacent tiles, CTA `rank` taking column tile 2 * pair + rank (pairs grouped row-major as
// above, or column-major). With an odd number of column tiles the last pair's second tile lies
// past N: its B loads give zeros, it still multicasts its half of A, its TMA stores are dropped.
struct PairNSchedule : PlainSchedule {
  CCFUSE_HD int64_t num_pairs() const { return int64_t(m_tiles) * ((n_tiles + 1) / 2); }
  CCFUSE_HD TileWork work_pair(int64_t idx, int rank) const {
    const int n_pairs = (n_tiles + 1) / 2;
    const TileCoord c = col_major ? column_major(idx, m_tiles) : grouped_row_major(idx, m_tiles, n_pairs, group_m);
    return TileWork{c.m_tile, 2 * c.n_tile + rank, 0, int64_t(c.m_tile) * block_m, m};
  }
};

// Grouped problems sharing N and K (MoE experts): group g owns rows [row_prefix[g],
// row_prefix[g + 1]) of the concatenated A and C and batch g of B. The prefix arrays live in
// device memory (filled by grouped_prefix_kernel from per-group row counts, no host sync).
// Inside a group, tiles go grouped-row-major as in PlainSchedule.
struct GroupedSchedule {
  const int* tile_prefix = nullptr;       // [num_groups + 1]
  const int64_t* row_prefix = nullptr;    // [num_groups + 1]
  int num_groups = 0, n_tiles = 0, block_m = 128, group_m = 8;
  int64_t tile_bound = 0;                 // host: most tiles any routing can produce
  static constexpr bool kHasReady = false;
  static constexpr bool kHasSide = false;
  __device__ int64_t num_tiles() const { return tile_prefix[num_groups]; }
  int64_t max_tiles() const { return tile_bound; }
  __device__ TileWork work(int64_t idx) const {
    int lo = 0, hi = num_groups;  // largest g with tile_prefix[g] <= idx (empty groups skipped)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (tile_prefix[mid] <= idx) lo = mid;
      else hi = mid;
    }
    const int m_tiles = (tile_prefix[lo + 1] - tile_prefix[lo]) / n_tiles;
    const TileCoord c = grouped_row_major(idx - tile_prefix[lo], m_tiles, n_tiles, group_m);
    const int64_t r0 = row_prefix[lo];
    return TileWork{c.m_tile, c.n_tile, lo, r0 + int64_t(c.m_tile) * block_m, row_prefix[lo + 1]};
  }
  __device__ bool wait_ready(const TileWork&) { return true; }
};

// K-grouped problems (the MoE experts' weight gradients): C_g [m, n] = A_g^T B_g for every group
// g, A_g and B_g being rows [row_prefix[g], row_prefix[g + 1]) of A [rows, m] and B [rows, n]
// (the contraction runs over a group's rows, the tokens routed to expert g). C is [groups * m, n]
// (group g's tile rows from g * m). Every group has the same m_tiles x n_tiles tiles, in group
// order, grouped-row-major inside a group; a tile's k-blocks are its group's rows cut in block_k
// (none for a group without rows: the tile stores zeros). A's tile rows count from 0 in every
// group (a_row0 below), B is batch 0.
struct KGroupedSchedule {
  const int64_t* row_prefix = nullptr;  // [num_groups + 1], device
  int num_groups = 0, m_tiles = 0, n_tiles = 0, block_m = 128, block_k = 64, group_m = 8;
  int64_t m = 0;  // rows of one group's C
  static constexpr bool kHasReady = false;
  static constexpr bool kHasSide = false;
  static constexpr bool kKGrouped = true;
  CCFUSE_HD int64_t num_tiles() const { return int64_t(num_groups) * m_tiles * n_tiles; }
  int64_t max_tiles() const { return num_tiles(); }
  __device__ TileWork work(int64_t idx) const {
    const int64_t per = int64_t(m_tiles) * n_tiles;
    const int g = int(idx / per);
    const TileCoord c = grouped_row_major(idx - g * per, m_tiles, n_tiles, group_m);
    TileWork w{c.m_tile, c.n_tile, g, int64_t(g) * m + int64_t(c.m_tile) * block_m, int64_t(g + 1) * m};
    w.k_row0 = row_prefix[g];
    w.k_rows = int(row_prefix[g + 1] - w.k_row0);
    w.kb_end = (w.k_rows + block_k - 1) / block_k;
    return w;
  }
  CCFUSE_HD int64_t a_row0(const TileWork& w) const { return int64_t(w.m_tile) * block_m; }
  __device__ bool wait_ready(const TileWork&) { return true; }
};
template <class S, class = void>
struct IsKGrouped : std::false_type {};
template <class S>
struct IsKGrouped<S, std::void_t<decltype(S::kKGrouped)>> : std::bool_constant<S::kKGrouped> {};

// A K-grouped tile's last k-block (rows [valid, kBlockK) of it past its group's end, the next
// group's rows or whatever lies past them): clears those k-rows of the stage's A and B (both
// MN-major: Traits::mn_major_line) with 16-byte stores by `threads` threads, then orders them
// before the tensor cores' reads (the async proxy). The caller then synchronises the threads
// that read the stage.
template <class Traits>
__device__ __forceinline__ void zero_k_tail(typename Traits::SharedStorage& ss, int stage, int valid, int thread,
                                            int threads) {
  static_assert(Traits::kAMN && !Traits::kBNK, "K-grouped tiles read A and B MN-major");
  constexpr int kSlabsA = Traits::kBlockM / 64, kSlabsB = Traits::kBlockN / 64;
  constexpr int kChunks = 64 * int(sizeof(typename Traits::Element)) / 16;  // 16-byte chunks of a line
  char* a = reinterpret_cast<char*>(ss.a) + size_t(stage) * Traits::kBlockM * Traits::kBlockK * sizeof(typename Traits::Element);
  char* b = reinterpret_cast<char*>(ss.b) + size_t(stage) * Traits::kBlockN * Traits::kBlockK * sizeof(typename Traits::Element);
  const int lines = Traits::kBlockK - valid;
  const int total = (kSlabsA + kSlabsB) * lines * kChunks;
  for (int i = thread; i < total; i += threads) {
    const int chunk = i % kChunks, line = valid + (i / kChunks) % lines, slab = i / kChunks / lines;
    char* base = slab < kSlabsA ? a + Traits::mn_major_line(slab, line) : b + Traits::mn_major_line(slab - kSlabsA, line);
    *reinterpret_cast<uint4*>(base + 16 * chunk) = make_uint4(0, 0, 0, 0);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Tiles whose K is cut into parts run by different CTAs, the parts summed inside the kernel
// (kHasFixup; fixup_sum below): the last part of a tile to finish adds the others' fp32 partials
// from the workspace to its accumulators and stores the tile; no second kernel.
//   split-K  (stream = false): every tile in `splits` equal parts, units tile * splits + s
//            (adjacent, so they run at once on neighbouring CTAs).
//   stream-K (stream = true): StreamKPlan (tile_order.h); the launch must use exactly sk.ctas
//            CTAs.
// Workspace: `partials`, one slot of BLOCK_M x BLOCK_N floats per unit that may hold a part
// (fixup_slots()), and `counters`, one int per cut tile (fixup_tiles()), zero before the first
// call; each tile's last part puts its counter back to zero.
struct KPartSchedule {
  PlainSchedule base;
  bool stream = false;
  int splits = 1;  // split-K: parts per tile, <= k_tiles (no part empty)
  int k_tiles = 1;
  StreamKPlan sk;
  float* partials = nullptr;
  int* counters = nullptr;
  // Diagnostics (env CCFUSE_GEMM_KPART_DIAG, timing only, wrong results): 1 = no fixup (every
  // part stores its own sum as the tile), 2 = counters and barriers but no partial stores or loads.
  int diag = 0;
  static constexpr bool kHasReady = false;
  static constexpr bool kHasSide = false;
  static constexpr bool kHasFixup = true;
  static constexpr bool kTmaStoreOk = true;  // tiles are clipped at M only
  CCFUSE_HD int64_t num_tiles() const { return stream ? sk.units() : base.num_tiles() * splits; }
  int64_t max_tiles() const { return num_tiles(); }
  CCFUSE_HD int64_t fixup_tiles() const { return stream ? sk.sk_tiles : base.num_tiles(); }
  CCFUSE_HD int64_t fixup_slots() const { return stream ? sk.slots() : base.num_tiles() * splits; }
  // Unit idx; an empty one has kb_begin == kb_end (every thread skips it).
  CCFUSE_HD TileWork work(int64_t idx) const {
    if (!stream) {
      const int s = int(idx % splits);
      TileWork w = base.work(idx / splits);
      w.kb_begin = int(int64_t(s) * k_tiles / splits);
      w.kb_end = int(int64_t(s + 1) * k_tiles / splits);
      w.split = s;
      w.fixup_tile = idx / splits;
      return w;
    }
    if (idx < sk.dp_tiles) return base.work(idx);
    const KPart kp = sk.part_of(idx - sk.dp_tiles);
    if (kp.tile < 0) {
      TileWork empty{0, 0, 0, 0, 0};
      empty.kb_end = 0;
      return empty;
    }
    TileWork w = base.work(sk.dp_tiles + kp.tile);
    w.kb_begin = kp.kb_begin;
    w.kb_end = kp.kb_end;
    w.split = kp.part;
    w.fixup_tile = kp.tile;
    return w;
  }
  // Parts of cut tile t, and the workspace slot of its part i (i in [0, parts)).
  CCFUSE_HD int fixup_parts(int64_t t) const { return stream ? sk.parts(t) : splits; }
  CCFUSE_HD int64_t fixup_slot(int64_t t, int i) const { return stream ? sk.slot(t, i) : t * splits + i; }
  __device__ bool wait_ready(const TileWork&) { return true; }
};

inline KPartSchedule stream_k_schedule(const PlainSchedule& base, int k_tiles, int sms) {
  KPartSchedule s;
  s.base = base;
  s.stream = true;
  s.k_tiles = k_tiles;
  s.sk = make_stream_k_plan(base.num_tiles(), k_tiles, sms);
  return s;
}
inline KPartSchedule split_k_schedule(const PlainSchedule& base, int k_tiles, int splits) {
  KPartSchedule s;
  s.base = base;
  s.k_tiles = k_tiles;
  s.splits = splits;
  return s;
}

// Epilogues: where a tile's output goes and what happens to it on the way.
//   kAct          Activation::kNone, kGelu (erf form) or kSiluMul: SwiGLU from one GEMM whose
//                 B columns are arranged per BLOCK_N tile as [BLOCK_N/2 gate | BLOCK_N/2 up]
//                 (swiglu_column_permutation() in gemm.h); the output has N/2 columns then.
//   kHasRowScale  row_scale(global row) multiplies each output row (MoE weights, fp8 scales).
//   out(p, w, ldc) the address of output row w.row0, column 0, and the output's row stride:
//                 the local C, or a peer's symmetric buffer (PeerBandEpilogue).
//   kHasNotify    notify(w) after every consumer thread's stores of the tile.
//   kHasSendWarps sends(w): after the tile's stores, warps 1-3 of the producer warpgroup (idle
//                 otherwise) run send(w, thread, 96) on it, then one of them notify_sent(w),
//                 while the consumers go on with the next tile (handed over through a
//                 shared-memory counter, release/acquire at CTA scope). The fused TP ops copy
//                 the finished tile to a peer there with 16-byte stores and release its flag:
//                 the consumers neither store 4-byte fragments over NVLink nor wait for a
//                 system-scope fence.
//                 Before the first tile the send warps run send_prologue(cta, num_ctas, thread,
//                 96) (AllGather+GEMM pushes this rank's A rows to its peers there).
//   kSendSmem     (with kHasSendWarps) send_prologue takes a fifth argument, a SendSmem: the
//                 shared memory the CTA has and the GEMM does not use (the staging buffer's half
//                 that SiLU-and-mul leaves unwritten, and what the 227 KiB allow past the
//                 SharedStorage, which launch_gemm then asks for). MoE layer 0's dispatch moves
//                 rows through it with bulk copies.
//   kHasAddends   has_addends(w): this tile sums partial tiles from memory before its store;
//                 wait_addends(w) (one consumer thread, then a barrier of the consumers) waits
//                 until they are written; there are num_addends(w), addend(w,
//                 i, ld) = address of row w.row0, column 0 of the i-th (same columns as the tile).
//                 They are added in fp32 (GEMM+ReduceScatter: the peers' partials of this rank's
//                 rows are added to this rank's own partial, which never leaves the registers).
//   kHasTail      tail(consumer_idx, cta, num_ctas) runs on the consumer threads of every GEMM
//                 CTA after its last tile (GEMM+AllReduce: copying the peers' reduced bands).
enum class Activation { kNone, kGelu, kSiluMul };

// Programmatic dependent launch (launch_gemm(..., pdl = true)): the kernel may start while the
// kernel before it on the stream (a fused op's entry barrier) still runs. Everything that depends
// on that kernel (the call's epoch, a peer's buffers) must come after griddep_wait(), which
// returns once the previous grid has completed and its writes are visible; without PDL it
// returns at once. The engine calls it before the send warps' work and before the consumers'
// first addend wait and their tail; schedules call it in wait_ready before remote waits.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

template <class Element>
struct Params;

// The plain epilogue: store to C, nothing to notify.
struct PlainEpilogue {
  static constexpr bool kTmaStoreOk = true;  // plain stores to the local C: TMA can do them
  static constexpr bool kHasNotify = false;
  static constexpr Activation kAct = Activation::kNone;
  static constexpr bool kHasRowScale = false;
  static constexpr bool kHasSendWarps = false;
  static constexpr bool kHasAddends = false;
  static constexpr bool kHasTail = false;
  template <class Element>
  __device__ Element* out(const Params<Element>& p, const TileWork& w, int64_t& ldc) const {
    ldc = p.ldc;
    return p.c + w.row0 * p.ldc;
  }
  __device__ float row_scale(int64_t) const { return 1.f; }
  __device__ void notify(const TileWork&) const {}
};

// Activation and optional per-row scale on the way to the local C.
template <Activation kAct_, bool kRowScale>
struct ActivationEpilogue : PlainEpilogue {
  static constexpr bool kTmaStoreOk = true;  // store_tile_tma applies the activation and the scale
  static constexpr Activation kAct = kAct_;
  static constexpr bool kHasRowScale = kRowScale;
  const float* scale = nullptr;  // [rows of C] when kRowScale
  __device__ float row_scale(int64_t row) const { return scale[row]; }
};

// Adds the tile into an fp32 tensor instead of storing it: c32[row, col] += the accumulators (the
// MoE weight gradients into Megatron's fp32 main_grad: gradient-accumulation fusion, no bf16
// rounding of each micro-batch's gradient, no separate add kernel). Register epilogue only
// (Traits::kTmaStore off; store_tile -> accumulate_block_f32). Every element of c32 gets exactly one
// add per launch (one tile owns it), so the result does not depend on the order of the adds.
// reduce_map set (the default of the K-grouped form): the tile leaves through TMA reduce-adds
// (reduce_tile_f32_tma): each consumer warpgroup stages its 64 rows in [64, 32] fp32 sub-tiles
// (kExtraSmemBytes past SharedStorage: a ring of kReduceSlots a warpgroup) and one of its threads
// issues cp.reduce.async.bulk.tensor .add for each, so whole 128-byte lines reach the L2 and the
// adds finish while the next tile's mainloop runs. reduce_map: a CUtensorMap in global memory
// (64-byte aligned, make_accum_reduce_map's layout: c32 as [groups, group_rows, n], box
// [1, 64, 32], 128-byte swizzle), so rows past a group's end are clipped at the group.
// reduce_map null, the register forms: rmw = false: one red.global.add.v2.f32 per pair of columns
// (fire and forget, the L2 does the read-modify-write); true: a load, an add and a store per pair
// (A/B: CCFUSE_KGROUPED_ACCUM=red / rmw).
// skip_no_k: K-grouped tiles of a group without rows add nothing (leave c32 as it is).
struct AccumF32Epilogue : PlainEpilogue {
  static constexpr bool kTmaStoreOk = false;
  static constexpr bool kAccumF32 = true;
  static constexpr int kReduceRows = 64, kReduceCols = 32, kReduceSlots = 2;
  static constexpr int kReduceSlotBytes = kReduceRows * kReduceCols * int(sizeof(float));
  static constexpr int kExtraSmemBytes = 2 * kReduceSlots * kReduceSlotBytes;  // two consumer warpgroups
  float* c32 = nullptr;
  int64_t ld32 = 0;
  const void* reduce_map = nullptr;
  bool rmw = false;
  bool skip_no_k = false;
};
template <class E, class = void>
struct HasAccumF32 : std::false_type {};
template <class E>
struct HasAccumF32<E, std::void_t<decltype(E::kAccumF32)>> : std::bool_constant<E::kAccumF32> {};

// Stores row band b (rows [b * rows_per_band, (b + 1) * rows_per_band) of the GEMM's output) into
// rank b's buffer at slot `slot` ([slot * rows_per_band, ...) of that buffer), e.g. GEMM+RS
// partials into the owner's receive buffer (slot = this rank). ASSUMPTION: the schedule never
// lets a tile straddle two bands (rows_per_band a multiple of BLOCK_M, or a banded schedule).
// Notifies per tile on `sig` (index = tile's linear id within its band, if set).
template <class Element>
struct PeerBandEpilogue {
  static constexpr bool kHasNotify = false;
  static constexpr Activation kAct = Activation::kNone;
  static constexpr bool kHasRowScale = false;
  static constexpr bool kHasSendWarps = false;
  static constexpr bool kHasAddends = false;
  static constexpr bool kHasTail = false;
  Element* peers[32];  // buffer of each rank (comm::SymmetricView::ptrs)
  int64_t rows_per_band = 0, ldc = 0;
  int slot = 0;
  __device__ Element* out(const Params<Element>&, const TileWork& w, int64_t& out_ldc) const {
    out_ldc = ldc;
    const int64_t band = w.row0 / rows_per_band;
    return peers[band] + (int64_t(slot) * rows_per_band + (w.row0 - band * rows_per_band)) * ldc;
  }
  __device__ float row_scale(int64_t) const { return 1.f; }
  __device__ void notify(const TileWork&) const {}
};

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
// CCFUSE_STMATRIX_STAGING=1: the TMA-store epilogue writes its staging buffer with stmatrix.x4
// (one instruction per two 8-column groups of a warp's 16 rows) instead of 32-bit stores.
// An experiment (2026-11-30): correct, but level with the 32-bit stores (geomean 1.002 over the
// GEMM sweep on one H200), so off (docs/perf-notes.md, "stmatrix.x4 staging writes").
#ifndef CCFUSE_STMATRIX_STAGING
#define CCFUSE_STMATRIX_STAGING 0
#endif
// SiLU's quotient by __fdividef (approximate, ~2 ulp, far below bf16's rounding; 0 once 1 + e^-x
// passes 2^126, where SiLU is below 1e-36 anyway). The IEEE division (CCFUSE_FAST_SILU=0) made
// the SwiGLU epilogue cost 7-25 % of the whole grouped GEMM (MoE layer 0; measured 2026-11-30,
// docs/perf-notes.md).
#ifndef CCFUSE_FAST_SILU
#define CCFUSE_FAST_SILU 1
#endif
__device__ __forceinline__ float silu(float x) {
#if CCFUSE_FAST_SILU
  return __fdividef(x, 1.f + __expf(-x));
#else
  return x / (1.f + __expf(-x));
#endif
}

// Two fp32 values rounded to Element (bf16 or fp16), packed in one 32-bit word, x in the low half.
template <class Element>
__device__ __forceinline__ uint32_t round_pair(float2 v) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    __nv_bfloat162 p = __floats2bfloat162_rn(v.x, v.y);
    return *reinterpret_cast<uint32_t*>(&p);
  } else {
    __half2 p = __floats2half2_rn(v.x, v.y);
    return *reinterpret_cast<uint32_t*>(&p);
  }
}

template <class Element>
struct Params {
  int m, n, k;  // m: rows of A and C (all groups)
  int num_groups;
  Element* c;
  int64_t ldc;
  int64_t c_rows;  // C's rows as the TMA store clips them (launch_gemm's c_rows, else m)
};

// Stores a consumer warpgroup's accumulators through the epilogue, rounding to Element.
//
// NOTE: written against the wgmma m64nNk16 fp32 accumulator layout, not through CuTe's
// coordinate tensors. In warpgroup `wg`, thread t (warp t / 32, lane t % 32) holds, for each
// 8-column group j, columns 8j + 2 (lane % 4) + {0, 1} of rows 16 warp + lane / 4 (values 4j,
// 4j + 1) and 8 rows below (values 4j + 2, 4j + 3). With kSiluMul the gate of output column c
// is tile column c and its up is tile column c + BLOCK_N / 2: group j pairs with j + BLOCK_N / 16.
// The output pair (columns 8j + c0, 8j + c0 + 1 of fragment half h) of a tile's accumulators,
// the epilogue's arithmetic in fp32: the activation (SiLU-and-mul pairs gate column j with up
// column j + kBN / 16 of the same tile) and the per-row scale (1 without one). Shared by the
// register and the TMA-store epilogues.
template <int kBN, class Epilogue, class Accum>
__device__ __forceinline__ float2 output_pair(const Accum& accum, int j, int h, float scale) {
  float v0 = accum(4 * j + 2 * h), v1 = accum(4 * j + 2 * h + 1);
  if constexpr (Epilogue::kAct == Activation::kSiluMul) {
    v0 = silu(v0) * accum(4 * (j + kBN / 16) + 2 * h);
    v1 = silu(v1) * accum(4 * (j + kBN / 16) + 2 * h + 1);
  } else if constexpr (Epilogue::kAct == Activation::kGelu) {
    v0 = gelu_erf(v0);
    v1 = gelu_erf(v1);
  }
  if constexpr (Epilogue::kHasRowScale) {
    v0 *= scale;
    v1 *= scale;
  }
  return make_float2(v0, v1);
}

// One 64-row block of a tile from registers (rows past the tile's group or M, and columns past
// N, are not written): the m64nNk16 fragment `frag` of warpgroup thread t holds rows
// block_row0 + 16 (t / 32) + (t % 32) / 4 and 8 below.
template <class Traits, class Epilogue, class Frag>
__device__ __forceinline__ void store_block(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                            const Frag& accum, int block_row0, int t, const TileWork& w) {
  using Element = typename Traits::Element;
  constexpr int kBN = Traits::kBlockN;
  constexpr bool kGlu = Epilogue::kAct == Activation::kSiluMul;
  constexpr int kOutCols = kGlu ? kBN / 2 : kBN;  // output columns of one tile
  static_assert(decltype(size(accum))::value == kBN / 2, "one 64-row wgmma tile");
  const int lane = t % 32;
  const int row = block_row0 + (t / 32) * 16 + lane / 4;  // in the tile
  const int64_t out_n = kGlu ? p.n / 2 : p.n;
  const int col0 = w.n_tile * kOutCols + 2 * (lane % 4);
  const int64_t rows = min_i64(w.row_end, p.m) - w.row0;  // rows of this tile's group left from row0
  const bool row_ok[2] = {row < rows, row + 8 < rows};
  float scale[2] = {1.f, 1.f};
  if constexpr (Epilogue::kHasRowScale) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h)
      if (row_ok[h]) scale[h] = epi.row_scale(w.row0 + row + 8 * h);
  }
  int64_t ldc = 0;
  Element* base = epi.out(p, w, ldc) + row * ldc + col0;
  // 32-bit pair stores need every row to start 4-byte aligned (outputs are 16-byte aligned).
  const bool pairs = (ldc & 1) == 0;
  CUTE_UNROLL
  for (int j = 0; j < kOutCols / 8; ++j) {
    const int col = col0 + 8 * j;
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      if (!row_ok[h]) continue;
      Element* dst = base + h * 8 * ldc + 8 * j;
      const float2 pv = output_pair<kBN, Epilogue>(accum, j, h, scale[h]);
      const float v0 = pv.x, v1 = pv.y;
      if (pairs && col + 1 < out_n) {
        if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
          *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
        } else {
          *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(v0, v1);
        }
      } else {
        if (col < out_n) dst[0] = Element(v0);
        if (col + 1 < out_n) dst[1] = Element(v1);
      }
    }
  }
}

// AccumF32Epilogue's store_block: one 64-row block of a tile added into epi.c32 (rows past the
// tile's group or M, columns past N untouched). Same fragment layout as store_block; a thread's
// two columns are adjacent and start at an even column, so each pair is one 8-byte access (ld32
// even, c32 8-byte aligned: the launch checks).
template <class Traits, class Epilogue, class Frag>
__device__ __forceinline__ void accumulate_block_f32(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                                     const Frag& accum, int block_row0, int t, const TileWork& w) {
  constexpr int kBN = Traits::kBlockN;
  static_assert(Epilogue::kAct == Activation::kNone && !Epilogue::kHasRowScale, "a plain sum into fp32");
  static_assert(decltype(size(accum))::value == kBN / 2, "one 64-row wgmma tile");
  if (epi.skip_no_k && w.k_rows == 0) return;
  const int lane = t % 32;
  const int row = block_row0 + (t / 32) * 16 + lane / 4;  // in the tile
  const int col0 = w.n_tile * kBN + 2 * (lane % 4);
  const int64_t rows = min_i64(w.row_end, p.m) - w.row0;
  const bool row_ok[2] = {row < rows, row + 8 < rows};
  float* base = epi.c32 + (w.row0 + row) * epi.ld32 + col0;
  CUTE_UNROLL
  for (int j = 0; j < kBN / 8; ++j) {
    if (col0 + 8 * j >= p.n) break;  // p.n even: a pair is all in or all out
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      if (!row_ok[h]) continue;
      float* dst = base + h * 8 * epi.ld32 + 8 * j;
      const float v0 = accum(4 * j + 2 * h), v1 = accum(4 * j + 2 * h + 1);
      if (epi.rmw) {
        float2 old = *reinterpret_cast<const float2*>(dst);
        old.x += v0;
        old.y += v1;
        *reinterpret_cast<float2*>(dst) = old;
      } else {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(v0), "f"(v1) : "memory");
      }
    }
  }
}

// A consumer warpgroup's 64 rows of a tile from registers (store_block, or accumulate_block_f32
// for an AccumF32Epilogue).
template <class Traits, class Epilogue, class Accum>
__device__ __forceinline__ void store_tile(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                           const Accum& accum, int consumer_idx, const TileWork& w) {
  const int block_row0 = (consumer_idx / 128) * (Traits::kBlockM / Traits::kConsumerWGs);
  if constexpr (HasAccumF32<Epilogue>::value)
    accumulate_block_f32<Traits, Epilogue>(p, epi, accum, block_row0, consumer_idx % 128, w);
  else
    store_block<Traits, Epilogue>(p, epi, accum, block_row0, consumer_idx % 128, w);
}

// The TMA-store epilogue (Traits::kTmaStore): wait until the previous tile's stores have read the
// staging buffer, write this tile's values into it (swizzled: the 8 rows a warp writes at once
// fall in 8 different 16-byte bank groups, no bank conflicts, with either swizzle width), make
// them visible to the async proxy, and let consumer thread 0 issue one TMA store per sub-tile of
// Traits::kStoreCols columns (rows and columns past M, N are clipped by TMA). Same fragment
// layout and the same epilogue arithmetic as store_tile:
// the activation (SiLU-and-mul halves the tile's columns: gate | up halves of the tile, as in
// store_tile) and the per-row scale, in fp32, before the one rounding to the output type.
// Named barriers: id 1 both consumer warpgroups, 2 the send warps, 3 + wg one ping-pong
// warpgroup's epilogue, 5 + wg the ping-pong mainloop order (warpgroup wg may start its next one).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// AccumF32Epilogue with a reduce_map (K-grouped tiles: w.group, w.m_tile): consumer warpgroup
// consumer_idx / 128 adds its 64 rows of the tile into c32 through TMA reduce-adds of [64, 32]
// fp32 sub-tiles, staged in `ring` (kReduceSlots slots of the warpgroup's, 1 KiB aligned: the
// 128-byte swizzle). Its thread 0 issues them and waits, before a slot is written again, until
// the reduce that read it last has read it (cp.async.bulk.wait_group.read; the groups are that
// thread's, in order: `seq` counts the sub-tiles the warpgroup has issued, the same in each of its
// threads). The reduce-adds themselves complete asynchronously (the kernel's end waits for them).
// Rows past the group's m and columns past n are clipped by the map.
template <class Traits, class Epilogue, class Accum>
__device__ __forceinline__ void reduce_tile_f32_tma(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                                    char* ring, const Accum& accum, int consumer_idx,
                                                    const TileWork& w, uint32_t& seq) {
  constexpr int kBN = Traits::kBlockN, kCols = Epilogue::kReduceCols, kSlots = Epilogue::kReduceSlots;
  constexpr int kSlotBytes = Epilogue::kReduceSlotBytes;
  static_assert(Traits::kBlockM / Traits::kConsumerWGs == Epilogue::kReduceRows && !Traits::kPingpong,
                "one 64-row block a cooperative consumer warpgroup");
  static_assert(kBN % kCols == 0 && kCols * sizeof(float) == 128, "sub-tiles of 128-byte rows (the swizzle width)");
  static_assert(decltype(size(accum))::value == kBN / 2, "one 64-row wgmma tile");
  if (epi.skip_no_k && w.k_rows == 0) return;
  const int wg = consumer_idx / 128, t = consumer_idx % 128, lane = t % 32;
  const int64_t rows = min_i64(w.row_end, p.m) - w.row0;  // the group's rows left from the tile's first
  if (int64_t(wg) * Epilogue::kReduceRows >= rows) return;  // this warpgroup's rows are all past it
  ring += wg * kSlots * kSlotBytes;
  const int row = (t / 32) * 16 + lane / 4;  // in the warpgroup's block; and row + 8
  const int swizzle = row % 8;               // = (row + 8) % 8
  const int row_g = w.m_tile * Traits::kBlockM + wg * Epilogue::kReduceRows;  // in the group
  CUTE_UNROLL
  for (int s = 0; s < kBN / kCols; ++s) {
    const int col = w.n_tile * kBN + s * kCols;
    if (col >= p.n) break;  // the same in every thread
    char* slot = ring + int(seq % kSlots) * kSlotBytes;
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kSlots - 1) : "memory");
    named_barrier_sync(3 + wg, 128);
    CUTE_UNROLL
    for (int jj = 0; jj < kCols / 8; ++jj) {
      const int j = s * (kCols / 8) + jj;            // the fragment's 8-column group
      const int chunk = 2 * jj + (lane % 4) / 2;     // the 16-byte chunk of the row the pair falls in
      const int within = (lane % 2) * 8;
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int offset = (row + 8 * h) * 128 + ((chunk ^ swizzle) << 4) + within;
        *reinterpret_cast<float2*>(slot + offset) = make_float2(accum(4 * j + 2 * h), accum(4 * j + 2 * h + 1));
      }
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> the TMA engine's reads
    named_barrier_sync(3 + wg, 128);
    if (t == 0) {
      const uint32_t src = uint32_t(__cvta_generic_to_shared(slot));
      asm volatile(
          "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
              reinterpret_cast<uint64_t>(epi.reduce_map)),
          "r"(src), "r"(col), "r"(row_g), "r"(w.group)
          : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    ++seq;
  }
}

// One 64-row block of a tile into the staging buffer `c_bytes`: the m64nNk16 fragment `frag` of
// warpgroup thread t holds rows block_row0 + 16 (t / 32) + (t % 32) / 4 and 8 below (store_tile's
// layout); `scale` is their row scale (1 without one).
// kSub >= 0: only the columns of sub-tile kSub ([kSub kStoreCols, (kSub + 1) kStoreCols)), written
// at the start of `c_bytes` (one slot of a staging ring, Traits::kStagingRing).
template <class Traits, class Epilogue, int kSub = -1, class Frag>
__device__ __forceinline__ void stage_block(const Frag& frag, int block_row0, int t, const float (&scale)[2],
                                            char* c_bytes) {
  using Element = typename Traits::Element;
  constexpr int kBN = Traits::kBlockN;
  constexpr int kOutCols = Epilogue::kAct == Activation::kSiluMul ? kBN / 2 : kBN;
  static_assert(kSub < 0 || Epilogue::kAct != Activation::kSiluMul, "sub-tiles of whole-column tiles only");
  constexpr int kJ0 = kSub < 0 ? 0 : kSub * Traits::kStoreChunks;
  constexpr int kJ1 = kSub < 0 ? kOutCols / 8 : kJ0 + Traits::kStoreChunks;
  if constexpr (kSub > 0) c_bytes -= kSub * Traits::kStoreSubBytes;  // staging_chunk counts from sub-tile 0
  const int lane = t % 32;
  const int row = block_row0 + (t / 32) * 16 + lane / 4;
#if CCFUSE_STMATRIX_STAGING
  // One stmatrix.x4 per two column groups instead of four 32-bit stores (Traits::stmatrix_chunk).
  static_assert((kOutCols / 8) % 2 == 0, "stmatrix.x4 stores column groups in pairs");
  (void)row;
  const int warp_row0 = block_row0 + (t / 32) * 16;
  const uint32_t c_smem = uint32_t(__cvta_generic_to_shared(c_bytes));
  CUTE_UNROLL
  for (int j = kJ0; j < kJ1; j += 2) {
    uint32_t bits[4];
    CUTE_UNROLL
    for (int m = 0; m < 4; ++m) {  // matrix m: column group j + m / 2, fragment half m % 2
      bits[m] = round_pair<Element>(output_pair<kBN, Epilogue>(frag, j + m / 2, m % 2, scale[m % 2]));
    }
    const uint32_t addr = c_smem + uint32_t(Traits::stmatrix_chunk(warp_row0, j, lane));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(bits[0]),
                 "r"(bits[1]), "r"(bits[2]), "r"(bits[3])
                 : "memory");
  }
#else
  const int c0 = 2 * (lane % 4);
  // The swizzled addresses by hand (Traits::staging_chunk).
  const int swizzle = Traits::staging_swizzle(row);  // = staging_swizzle(row + 8)
  CUTE_UNROLL
  for (int j = kJ0; j < kJ1; ++j) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      const uint32_t bits = round_pair<Element>(output_pair<kBN, Epilogue>(frag, j, h, scale[h]));
      // col = c0 + 8j is even: the pair stays inside one 16-byte chunk of the swizzled row.
      const int offset = Traits::staging_chunk(row + 8 * h, j, swizzle) + c0 * int(sizeof(Element));
      *reinterpret_cast<uint32_t*>(c_bytes + offset) = bits;
    }
  }
#endif
}

// The row scales of a 64-row block's two fragment rows (1 without a scale; rows past the tile's
// group or M are clipped by TMA and not read).
template <class Epilogue, class Element>
__device__ __forceinline__ void block_scales(const Params<Element>& p, const Epilogue& epi, const TileWork& w,
                                             int row, float (&scale)[2]) {
  scale[0] = scale[1] = 1.f;
  if constexpr (Epilogue::kHasRowScale) {
    const int64_t rows = min_i64(w.row_end, p.m) - w.row0;
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h)
      if (row + 8 * h < rows) scale[h] = epi.row_scale(w.row0 + row + 8 * h);
  }
}

// One TMA store per sub-tile of Traits::kStoreCols columns from the staging buffer `c` to rows
// [row0, row0 + kBlockM) of tma_c's tensor (rows and columns past its edge are clipped by TMA), by
// one thread; then commits them as one bulk group. row0 is w.row0 unless the epilogue says
// otherwise (tma_target).
// s_lo / s_hi: only sub-tiles [s_lo, s_hi) (-1: to the last), from the staging slots starting at
// c's sub-tile 0 (a staging ring's slot holds one sub-tile: s_hi = s_lo + 1).
template <class Traits, class Epilogue, class TmaC>
__device__ __forceinline__ void issue_tile_stores(const Params<typename Traits::Element>& p, const TmaC& tma_c,
                                                  typename Traits::Element* c, const TileWork& w, int64_t row0,
                                                  int s_lo = 0, int s_hi = -1) {
  constexpr int kBN = Traits::kBlockN, kSub = Traits::kStoreCols;
  constexpr bool kGlu = Epilogue::kAct == Activation::kSiluMul;
  constexpr int kOutCols = kGlu ? kBN / 2 : kBN;
  Tensor sC = make_tensor(make_smem_ptr(c), typename Traits::SmemLayoutC{});  // (BM, kSub, BN / kSub)
  const int out_n = kGlu ? p.n / 2 : p.n;  // the C tensor's columns (launch_gemm's tma_c)
  Tensor mC = tma_c.get_tma_tensor(make_shape(p.m, out_n));
  Tensor gC = local_tile(domain_offset(make_coord(int(row0), 0), mC), Shape<Int<Traits::kBlockM>, Int<kSub>>{},
                         make_coord(0, _));  // (BM, kSub, N / kSub)
  auto [tCgC, tCsC] = tma_partition(tma_c, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sC), group_modes<0, 2>(gC));
  if (s_hi < 0) s_hi = kOutCols / kSub;
  CUTE_UNROLL
  for (int s = 0; s < kOutCols / kSub; ++s)
    if (s >= s_lo && s < s_hi && w.n_tile * kOutCols + s * kSub < out_n)
      copy(tma_c, tCsC(_, s - s_lo), tCgC(_, w.n_tile * (kOutCols / kSub) + s));
  tma_store_arrive();
}

// issue_tile_stores through a TMA descriptor in global memory (Epilogue::kTmaDirect).
template <class Traits, class Epilogue>
__device__ __forceinline__ void issue_tile_stores_raw(const Params<typename Traits::Element>& p, const void* map,
                                                      typename Traits::Element* c, const TileWork& w, int64_t row0) {
  constexpr int kBN = Traits::kBlockN, kSub = Traits::kStoreCols;
  // Only epilogues that keep the tile's columns store directly (never SiLU-and-mul's halves).
  if constexpr (Epilogue::kAct != Activation::kSiluMul) {
    CUTE_UNROLL
    for (int s = 0; s < kBN / kSub; ++s) {
      const int col = w.n_tile * kBN + s * kSub;
      if (col >= p.n) break;
      const uint32_t src = uint32_t(__cvta_generic_to_shared(c + s * (Traits::kBlockM * kSub)));
      asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                       reinterpret_cast<uint64_t>(map)),
                   "r"(src), "r"(col), "r"(int(row0))
                   : "memory");
    }
  }
  tma_store_arrive();
}

// The TMA-store epilogue (Traits::kTmaStore) of the two consumer warpgroups' tile (each 64 rows):
// wait until the previous tile's stores have read the staging buffer, write this tile's values
// into it (swizzled: the 8 rows a warp writes at once fall in 8 different 16-byte bank groups, no
// bank conflicts, with either swizzle width), make them visible to the async proxy, and let
// consumer thread 0 issue the stores. Same fragment layout and the same epilogue arithmetic as
// store_tile: the activation (SiLU-and-mul halves the tile's columns: gate | up halves of the
// tile, as in store_tile) and the per-row scale, in fp32, before the one rounding to the output
// type.
template <class Traits, class Epilogue, class Storage, class TmaC, class Accum>
__device__ __forceinline__ void store_tile_tma(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                               Storage& ss, const TmaC& tma_c, const Accum& accum, int consumer_idx,
                                               const TileWork& w, int64_t row0, const void* raw_map = nullptr) {
  constexpr bool kGlu = Epilogue::kAct == Activation::kSiluMul;
  static_assert((kGlu ? Traits::kBlockN / 2 : Traits::kBlockN) % Traits::kStoreCols == 0,
                "whole TMA boxes (kStoreCols columns) per tile");
  constexpr int kThreads = 128 * Traits::kConsumerWGs;
  const int wg = consumer_idx / 128, t = consumer_idx % 128;
  const int block_row0 = wg * (Traits::kBlockM / Traits::kConsumerWGs);
  float scale[2];
  block_scales(p, epi, w, block_row0 + (t / 32) * 16 + (t % 32) / 4, scale);
  if (consumer_idx == 0) tma_store_wait<0>();  // the previous tile's stores have read the buffer
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads));
  stage_block<Traits, Epilogue>(accum, block_row0, t, scale, reinterpret_cast<char*>(ss.c));
  cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> the TMA engine's reads
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads));
  if (consumer_idx == 0) {
    if (raw_map != nullptr) issue_tile_stores_raw<Traits, Epilogue>(p, raw_map, ss.c, w, row0);
    else issue_tile_stores<Traits, Epilogue>(p, tma_c, ss.c, w, row0);
  }
}

// The TMA-store epilogue of ping-pong consumers (Traits::kPingpong): warpgroup `wg` stores its own
// whole tile (two 64-row blocks of its fragment, MMA_M = 2) through its own staging buffer, with
// its own named barrier (3 + wg) and its thread 0 issuing the stores: the other warpgroup's
// mainloop runs meanwhile.
template <class Traits, class Epilogue, class Storage, class TmaC, class Accum>
__device__ __forceinline__ void store_tile_tma_wg(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                                  Storage& ss, const TmaC& tma_c, const Accum& accum, int wg, int t,
                                                  const TileWork& w) {
  static_assert(Traits::kPingpong, "one warpgroup's whole tile");
  using Element = typename Traits::Element;
  if constexpr (Traits::kStagingRing > 0) {
    // Sub-tile by sub-tile through this warpgroup's ring of kR slots: before writing slot s % kR,
    // thread 0 waits until at most kR - 1 of its store groups (one per sub-tile, in order) are
    // still reading, i.e. the slot's last store has read it.
    constexpr int kR = Traits::kStagingRing, kSubElems = Traits::kBlockM * Traits::kStoreCols;
    Element* ring = ss.c + wg * (kR * kSubElems);
    float scale[2][2];
    CUTE_UNROLL
    for (int mb = 0; mb < 2; ++mb) block_scales(p, epi, w, 64 * mb + (t / 32) * 16 + (t % 32) / 4, scale[mb]);
    cute::for_each(cute::make_int_sequence<Traits::kBlockN / Traits::kStoreCols>{}, [&](auto sub) {
      constexpr int s = decltype(sub)::value;
      Element* slot = ring + (s % kR) * kSubElems;
      if (t == 0) tma_store_wait<kR - 1>();
      named_barrier_sync(3 + wg, 128);
      CUTE_UNROLL
      for (int mb = 0; mb < 2; ++mb)
        stage_block<Traits, Epilogue, s>(accum(_, mb, _), 64 * mb, t, scale[mb], reinterpret_cast<char*>(slot));
      cutlass::arch::fence_view_async_shared();
      named_barrier_sync(3 + wg, 128);
      if (t == 0) issue_tile_stores<Traits, Epilogue>(p, tma_c, slot, w, w.row0, s, s + 1);
    });
    return;
  }
  Element* c = ss.c + wg * (Traits::kBlockM * Traits::kBlockN);
  if (t == 0) tma_store_wait<0>();  // this warpgroup's previous stores have read its buffer
  named_barrier_sync(3 + wg, 128);
  CUTE_UNROLL
  for (int mb = 0; mb < 2; ++mb) {
    float scale[2];
    block_scales(p, epi, w, 64 * mb + (t / 32) * 16 + (t % 32) / 4, scale);
    stage_block<Traits, Epilogue>(accum(_, mb, _), 64 * mb, t, scale, reinterpret_cast<char*>(c));
  }
  cutlass::arch::fence_view_async_shared();
  named_barrier_sync(3 + wg, 128);
  if (t == 0) issue_tile_stores<Traits, Epilogue>(p, tma_c, c, w, w.row0);
}

// Two 16-bit values as one 32-bit word (the low one first, as in memory), and back to floats.
template <class Element>
__device__ __forceinline__ uint32_t pack_pair(Element lo, Element hi) {
  return uint32_t(reinterpret_cast<const uint16_t&>(lo)) | (uint32_t(reinterpret_cast<const uint16_t&>(hi)) << 16);
}
__device__ __forceinline__ float2 unpack_pair(uint32_t bits, cutlass::bfloat16_t) {
  return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(bits));
}
__device__ __forceinline__ float2 unpack_pair(uint32_t bits, cutlass::half_t) {
  return __half22float2(reinterpret_cast<const __half2&>(bits));
}

// Adds the epilogue's partial tiles (Epilogue::addends) into a consumer warpgroup's
// accumulators, in fp32, same fragment layout as store_tile. The loads are latency-bound (a
// partial tile sits in local HBM or L2, ~0.5-1 us away): each thread issues kBatch * 2 32-bit
// loads (raw bf16/fp16 pairs, one register each) before it adds any of them. With 4 column groups
// per batch (v1, float2 per load) the 16 batches of a tile cost ~1 us each and the own-band tiles
// of gemm_rs spent ~17 us each in here (tile traces, 2026-11-29). 8 and 16 groups per batch
// measured the same (2026-11-29, gemm_rs at TP = 2: within 1-2 %, both ~9 % faster than v1 on
// 8192x4096x6144); 8 spills less.
template <class Traits, class Epilogue, class Accum>
__device__ __forceinline__ void add_addends(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                            Accum& accum, int consumer_idx, const TileWork& w) {
  using Element = typename Traits::Element;
  constexpr int kBN = Traits::kBlockN;
  constexpr int kBatch = CCFUSE_ADDEND_BATCH;
  static_assert((kBN / 8) % kBatch == 0, "column groups in whole batches");
  static_assert(Epilogue::kAct == Activation::kNone, "addends are summed before the store, without activation");
  const int wg = consumer_idx / 128, t = consumer_idx % 128, lane = t % 32;
  const int row = wg * (Traits::kBlockM / Traits::kConsumerWGs) + (t / 32) * 16 + lane / 4;
  const int col0 = w.n_tile * kBN + 2 * (lane % 4);
  const int64_t rows = min_i64(w.row_end, p.m) - w.row0;
  const bool row_ok[2] = {row < rows, row + 8 < rows};
  const int num = epi.num_addends(w);
  for (int a = 0; a < num; ++a) {
    int64_t ld = 0;
    const Element* base = epi.addend(w, a, ld) + row * ld + col0;
    const bool pairs = (ld & 1) == 0;
    CUTE_UNROLL
    for (int j0 = 0; j0 < kBN / 8; j0 += kBatch) {
      uint32_t v[kBatch][2];
      CUTE_UNROLL
      for (int jj = 0; jj < kBatch; ++jj) {
        const int j = j0 + jj, col = col0 + 8 * j;
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          v[jj][h] = 0u;  // +0.0 twice
          if (!row_ok[h]) continue;
          const Element* src = base + h * 8 * ld + 8 * j;
          if (pairs && col + 1 < p.n) {
            v[jj][h] = *reinterpret_cast<const uint32_t*>(src);
          } else {
            v[jj][h] = pack_pair(col < p.n ? src[0] : Element(0.f), col + 1 < p.n ? src[1] : Element(0.f));
          }
        }
      }
      CUTE_UNROLL
      for (int jj = 0; jj < kBatch; ++jj) {
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          const float2 f = unpack_pair(v[jj][h], Element{});
          accum(4 * (j0 + jj) + 2 * h) += f.x;
          accum(4 * (j0 + jj) + 2 * h + 1) += f.y;
        }
      }
    }
  }
}

// Epilogue::kTmaAddends (with the TMA-store epilogue): a whole tile's partial tiles are loaded by
// TMA into the staging buffer, one after the other, instead of by each thread from global memory
// (add_addends): epi.addend_map is a TMA descriptor in global memory of the addends' tensor (the
// staging buffer's element type, box and swizzle: launch-independent, built once by the host, see
// make_staging_map), and epi.addend_row(w, i) the row of that tensor where addend i of tile w
// starts (its columns are the tile's). Cut tiles still take add_addends.
template <class E, class = void>
struct HasTmaAddends : std::false_type {};
template <class E>
struct HasTmaAddends<E, std::void_t<decltype(E::kTmaAddends)>> : std::bool_constant<E::kTmaAddends> {};

// Epilogue::kPreactOut (optional): the epilogue may also keep the tile's accumulators before its
// activation and row scale, rounded to Element, in a second [rows, N] tensor with the tile's
// columns (SwiGLU: the [gate | up] order of every BLOCK_N tile): preact_out(w, ld) gives the
// address of row w.row0, column 0 there, when preact_enabled(); only rows below
// preact_row_end() are kept (the tensor's rows: a caller's bound smaller than C's). Written from
// registers (store_block's pattern, beside the tile's own store). What a backward pass reads
// instead of recomputing layer 0 (MoE training, docs/moe-layers.md).
template <class E, class = void>
struct HasPreactOut : std::false_type {};
template <class E>
struct HasPreactOut<E, std::void_t<decltype(E::kPreactOut)>> : std::bool_constant<E::kPreactOut> {};

// store_block's addressing for kPreactOut: the raw accumulators, no activation, no scale.
template <class Element, class Epilogue>
struct PreactEpilogue {
  static constexpr Activation kAct = Activation::kNone;
  static constexpr bool kHasRowScale = false;
  const Epilogue& epi;
  __device__ Element* out(const Params<Element>&, const TileWork& w, int64_t& ldc) const {
    return epi.preact_out(w, ldc);
  }
  __device__ float row_scale(int64_t) const { return 1.f; }
};

// Whether tile w keeps any pre-activation rows, and `kept`: w cut at the kept tensor's end
// (Epilogue::preact_row_end()), for store_block's row bound.
template <class Epilogue>
__device__ __forceinline__ bool preact_rows_of(const Epilogue& epi, const TileWork& w, TileWork& kept) {
  if (!epi.preact_enabled()) return false;
  kept = w;
  kept.row_end = min_i64(w.row_end, epi.preact_row_end());
  return kept.row0 < kept.row_end;
}

// A consumer warpgroup's 64 rows of the tile's pre-activation, if the epilogue keeps it.
template <class Traits, class Epilogue, class Accum>
__device__ __forceinline__ void store_preact(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                             const Accum& accum, int consumer_idx, const TileWork& w) {
  if constexpr (HasPreactOut<Epilogue>::value) {
    TileWork kept;
    if (preact_rows_of(epi, w, kept))
      store_tile<Traits>(p, PreactEpilogue<typename Traits::Element, Epilogue>{epi}, accum, consumer_idx, kept);
  }
}

// The TMA descriptor of a tensor [rows, n] (row stride n) in the staging buffer's box and swizzle,
// for loads into it (Epilogue::kTmaAddends) or stores from it (Epilogue::kTmaDirect); the caller
// copies the 128 bytes to device memory.
template <class Traits, class Op = SM90_TMA_LOAD>
TmaDescriptor make_staging_map(const typename Traits::Element* base, int64_t rows, int64_t n) {
  auto tma = make_tma_copy(Op{}, Traits::gmem_c(const_cast<typename Traits::Element*>(base), rows, n, n),
                           typename Traits::SmemLayoutC{}(_, _, 0));
  return *tma.get_tma_descriptor();
}

// Epilogue::kTmaDirect (gemm_rs's opt-in direct_store; measured no faster, 2026-11-30): epi.tma_direct(w, row) gives a TMA
// descriptor in global memory (make_staging_map with SM90_TMA_STORE, e.g. of a peer's receive
// buffer) that whole tile w is stored to, at `row`, instead of tma_c / tma_c_alt (null: those);
// once its bulk writes are complete, consumer thread 0 calls epi.stored_direct(w) (GEMM +
// ReduceScatter: release the tile's flag on the peer). Completion is awaited after the next
// tile's mainloop, as for the send warps' hand-over.
template <class E, class = void>
struct HasTmaDirect : std::false_type {};
template <class E>
struct HasTmaDirect<E, std::void_t<decltype(E::kTmaDirect)>> : std::bool_constant<E::kTmaDirect> {};

// kTmaAddends, consumer thread 0: loads addend i of tile w (a partial tile the peers wrote with
// generic stores, its flags acquired) into the staging buffer, completing on ss.addend_full. The
// caller has made sure the previous tile's stores have read the buffer.
template <class Traits, class Epilogue, class Storage>
__device__ __forceinline__ void issue_addend_tma(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                                 Storage& ss, const TileWork& w, int i) {
  using Element = typename Traits::Element;
  constexpr int kBN = Traits::kBlockN, kSub = Traits::kStoreCols;
  constexpr uint32_t kBoxBytes = uint32_t(Traits::kBlockM * kSub * sizeof(Element));
  // Boxes that start past N are not loaded (their columns are never stored; what the buffer held
  // there is added to accumulators nobody reads).
  const int boxes = min(kBN / kSub, int((p.n - int64_t(w.n_tile) * kBN + kSub - 1) / kSub));
  auto* bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&ss.addend_full);
  // The peers wrote the partials with generic stores (acquired by the flag wait or test); TMA
  // reads them through the async proxy.
  asm volatile("fence.proxy.async.global;" ::: "memory");
  bar->arrive_and_expect_tx(kBoxBytes * uint32_t(boxes));
  const uint64_t map = reinterpret_cast<uint64_t>(epi.addend_map);
  const uint32_t mbar = uint32_t(__cvta_generic_to_shared(bar));
  const int row0 = int(epi.addend_row(w, i));
  for (int s = 0; s < boxes; ++s) {
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(ss.c + s * (Traits::kBlockM * kSub)));
    const int col = w.n_tile * kBN + s * kSub;
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
        "l"(map), "r"(mbar), "r"(col), "r"(row0)
        : "memory");
  }
}

// Epilogue::kPrefetchAddends (with kTmaAddends): addend_ready(w, i) looks once at addend i's flags
// without waiting; while an own-band tile's mainloop runs, consumer thread 0 asks it every few
// k-blocks and, once the first partial is there, loads it into the staging buffer (which the
// previous tile's stores have read by then), so that the epilogue finds it in shared memory.
template <class E, class = void>
struct HasPrefetchAddends : std::false_type {};
template <class E>
struct HasPrefetchAddends<E, std::void_t<decltype(E::kPrefetchAddends)>> : std::bool_constant<E::kPrefetchAddends> {};

// Epilogue::kEarlyHandover (with send warps and the TMA-store epilogue): a TMA-stored tile that
// the send warps forward is handed over at k-block kEarlyHandoverKb of the next tile's mainloop
// (consumer thread 0 waits for the bulk writes there, which are complete or nearly so by then),
// instead of after that whole mainloop, when the runtime field early_handover is set. On few
// waves of long tiles (K / W = 14336: ~150 us a mainloop) the late hand-over held the peers'
// partials back by a whole tile.
template <class E, class = void>
struct HasEarlyHandover : std::false_type {};
template <class E>
struct HasEarlyHandover<E, std::void_t<decltype(E::kEarlyHandover)>> : std::bool_constant<E::kEarlyHandover> {};
constexpr int kEarlyHandoverKb = 4;

// kTmaAddends: adds the tile's partial tiles into a consumer warpgroup's accumulators through the
// staging buffer. For each addend consumer thread 0 waits until the previous tile's TMA stores
// have read the buffer, then loads the partial tile into it (kBlockN / kStoreCols boxes, one
// mbarrier); every consumer thread reads its fragment's values at the positions stage_block
// writes them (same swizzle), adds them in fp32, and a barrier keeps the buffer until all have.
// The caller has waited for the addends' flags (and the consumers' barrier after it).
// With `prefetched` (consumer thread 0), addend 0 is already loading (kPrefetchAddends).
template <class Traits, class Epilogue, class Storage, class Accum>
__device__ __forceinline__ void add_addends_tma(const Params<typename Traits::Element>& p, const Epilogue& epi,
                                                Storage& ss, Accum& accum, int consumer_idx, const TileWork& w,
                                                uint32_t& phase, bool prefetched = false) {
  using Element = typename Traits::Element;
  constexpr int kBN = Traits::kBlockN;
  constexpr int kThreads = 128 * Traits::kConsumerWGs;
  static_assert(Epilogue::kAct == Activation::kNone, "addends are summed before the store, without activation");
  const int wg = consumer_idx / 128, t = consumer_idx % 128, lane = t % 32;
  const int row = wg * (Traits::kBlockM / Traits::kConsumerWGs) + (t / 32) * 16 + lane / 4;
  const int c0 = 2 * (lane % 4);
  const int swizzle = Traits::staging_swizzle(row);  // = staging_swizzle(row + 8)
  auto* bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&ss.addend_full);
  const char* c_bytes = reinterpret_cast<const char*>(ss.c);
  const int n_add = epi.num_addends(w);
  for (int i = 0; i < n_add; ++i) {
    if (consumer_idx == 0 && !(i == 0 && prefetched)) {
      tma_store_wait<0>();  // the previous tile's stores (or the previous addend's reads) are done with the buffer
      issue_addend_tma<Traits>(p, epi, ss, w, i);
    }
    bar->wait(phase);
    phase ^= 1u;
    CUTE_UNROLL
    for (int j = 0; j < kBN / 8; ++j) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int offset = Traits::staging_chunk(row + 8 * h, j, swizzle) + c0 * int(sizeof(Element));
        const float2 f = unpack_pair(*reinterpret_cast<const uint32_t*>(c_bytes + offset), Element{});
        accum(4 * j + 2 * h) += f.x;
        accum(4 * j + 2 * h + 1) += f.y;
      }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads));  // every thread has read before the buffer is reused
  }
}

// Schedule::kHasAltA: the schedule's alt_a(w) tiles read A through the second descriptor
// (tma_a_alt, rows counted from Schedule::alt_a_row0), e.g. AllGather+GEMM reading its own band
// in place instead of from the gather buffer. Schedules without the member never do.
template <class S, class = void>
struct HasAltA : std::false_type {};
template <class S>
struct HasAltA<S, std::void_t<decltype(S::kHasAltA)>> : std::bool_constant<S::kHasAltA> {};

// Schedule::kGatherA: A's rows are not one strided matrix but gathered row by row (the MoE
// layer 0 reading its tokens where they lie: docs/moe-layers.md, "rows read in place"). Warps 0
// and 1 of the producer warpgroup load A with 16-byte cp.async into the stage's
// 128-byte-swizzled layout (gather_a_offset), B still by TMA; warps 2 and 3 are the send warps.
// The schedule's
//   template <int N> bool gather_rows(const TileWork& w, int first, int step, const char* (&rows)[N],
//                                     unsigned& valid)
// gives a lane the addresses of tile rows first + step i (bit i of `valid` set for real rows; the
// others hold any readable address and are zero-filled) once they may be read (false: the
// watchdog fired). Unclustered, whole tiles, not ping-pong.
template <class S, class = void>
struct HasGatherA : std::false_type {};
template <class S>
struct HasGatherA<S, std::void_t<decltype(S::kGatherA)>> : std::bool_constant<S::kGatherA> {};

// The byte offset in the A stages of the 16-byte chunk `chunk` (columns 8 chunk .. 8 chunk + 7 of
// the k-block) of tile row `row` in stage `stage`: rows of 128 bytes (one swizzle atom along K),
// stages one after the other, the chunk's index XORed with row % 8 (the 128-byte swizzle, on the
// 1 KiB-aligned buffer). Checked equal to CuTe's SmemLayoutA for every element
// (tests/cpp/gemm/test_store_swizzle.cu).
template <int kBlockM>
CCFUSE_HD constexpr int gather_a_offset(int row, int chunk, int stage) {
  return stage * kBlockM * 128 + row * 128 + ((chunk ^ (row % 8)) << 4);
}

// Schedule::kHasFixup: tiles cut along K over several CTAs (KPartSchedule). Absent = no.
// Schedule::kWaitsPriorGrid: the schedule's device arrays (a grouped schedule's prefixes) are
// written by the kernel before it on the stream. With PDL (launch_gemm(..., pdl = true)) every
// thread then waits (griddep_wait) after the CTA's setup and before the schedule is first read, so
// that the launch, the CTA's residency and its barrier setup hide behind that kernel (the MoE
// layer 0 behind its exchange kernel).
template <class S, class = void>
struct WaitsPriorGrid : std::false_type {};
template <class S>
struct WaitsPriorGrid<S, std::void_t<decltype(S::kWaitsPriorGrid)>> : std::bool_constant<S::kWaitsPriorGrid> {};

// Epilogue::kSendSmem (see "Epilogues" above): up to two regions of shared memory for the send
// warps, 128-byte aligned, in bytes; empty ones have bytes = 0.
struct SendSmem {
  char* ptr[2] = {nullptr, nullptr};
  int bytes[2] = {0, 0};
};
template <class E, class = void>
struct HasSendSmem : std::false_type {};
template <class E>
struct HasSendSmem<E, std::void_t<decltype(E::kSendSmem)>> : std::bool_constant<E::kSendSmem> {};
// The most dynamic shared memory a CTA may have on sm_90 (227 KiB).
constexpr int kMaxCtaSmem = 232448;
// Bytes past Traits::SharedStorage that launch_gemm asks for on the send warps' behalf.
template <class Traits, class Epilogue>
constexpr int send_smem_tail() {
  if constexpr (HasSendSmem<Epilogue>::value) return int((kMaxCtaSmem - int(Traits::kSmemBytes)) / 128 * 128);
  else return 0;
}
// Epilogue::kExtraSmemBytes: shared memory of the epilogue's own, past Traits::SharedStorage (whose
// size is a multiple of 1 KiB: its buffers are 1 KiB aligned), e.g. AccumF32Epilogue's reduce ring.
template <class E, class = void>
struct ExtraSmem : std::integral_constant<int, 0> {};
template <class E>
struct ExtraSmem<E, std::void_t<decltype(E::kExtraSmemBytes)>> : std::integral_constant<int, E::kExtraSmemBytes> {};
template <class Traits, class Epilogue>
constexpr int dynamic_smem_bytes() {
  static_assert(ExtraSmem<Epilogue>::value == 0 || !HasSendSmem<Epilogue>::value,
                "the send warps' spare shared memory and an epilogue's own do not mix");
  static_assert(Traits::kSmemBytes % 1024 == 0, "the epilogue's shared memory starts 1 KiB aligned");
  return int(Traits::kSmemBytes) + send_smem_tail<Traits, Epilogue>() + ExtraSmem<Epilogue>::value;
}

template <class S, class = void>
struct HasFixup : std::false_type {};
template <class S>
struct HasFixup<S, std::void_t<decltype(S::kHasFixup)>> : std::bool_constant<S::kHasFixup> {};

// A cut tile's part has its accumulators: returns true when it is the tile's last part to
// finish and has added the other parts' fp32 partials (then it stores the tile), false when it
// has left its own partial in the workspace for the last one. Every consumer thread calls it.
// Partials are kept in fragment order, thread-major (value v of consumer thread x at
// [v / 4][x][v % 4]): the writer and the reader share the fragment layout, so no index math, and a
// warp's 16-byte accesses are contiguous. Ordering: a part's stores, the consumers' barrier, then
// one thread's release increment of the tile's counter; the part that sees every other part
// counted (acquire) reads their partials through L2 (ld.global.cg), after a barrier.
template <class Traits, class Schedule, class Storage, class Accum>
__device__ __forceinline__ bool fixup_sum(const Schedule& sched, Storage& ss, Accum& accum, int consumer_idx,
                                          const TileWork& w) {
  constexpr int kThreads = 128 * Traits::kConsumerWGs;
  constexpr int kVals = decltype(size(accum))::value;
  static_assert(kVals % 4 == 0, "whole float4s of accumulators per thread");
  constexpr int64_t kSlot = int64_t(kVals) * kThreads;  // = BLOCK_M x BLOCK_N floats
  if (sched.diag == 1) return true;
  const bool move = sched.diag != 2;
  const int parts = sched.fixup_parts(w.fixup_tile);
  cuda::atomic_ref<int, cuda::thread_scope_device> count(sched.counters[w.fixup_tile]);
  // Every other part already counted: this one is last without leaving its partial.
  if (consumer_idx == 0) ss.fixup_last = count.load(cuda::memory_order_acquire) == parts - 1 ? 1 : 0;
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads));
  bool last = ss.fixup_last != 0;
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads));  // read by all before it is written again
  if (!last) {
    float4* mine = reinterpret_cast<float4*>(sched.partials + sched.fixup_slot(w.fixup_tile, w.split) * kSlot);
    CUTE_UNROLL
    for (int q = 0; q < kVals / 4; ++q) {
      if (move)
        mine[q * kThreads + consumer_idx] = make_float4(accum(4 * q), accum(4 * q + 1), accum(4 * q + 2), accum(4 * q + 3));
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads));  // every thread's partial before the count
    if (consumer_idx == 0) {
      __threadfence();
      ss.fixup_last = count.fetch_add(1, cuda::memory_order_acq_rel) == parts - 1 ? 1 : 0;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads));
    last = ss.fixup_last != 0;
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads));
    if (!last) return false;
  }
  constexpr int kBatch = 8;  // float4 loads in flight per thread
  static_assert((kVals / 4) % kBatch == 0, "whole batches");
  for (int i = 0; i < parts; ++i) {
    if (i == w.split || !move) continue;
    const float4* src = reinterpret_cast<const float4*>(sched.partials + sched.fixup_slot(w.fixup_tile, i) * kSlot);
    CUTE_UNROLL
    for (int q0 = 0; q0 < kVals / 4; q0 += kBatch) {
      float4 v[kBatch];
      CUTE_UNROLL
      for (int b = 0; b < kBatch; ++b) v[b] = __ldcg(src + (q0 + b) * kThreads + consumer_idx);
      CUTE_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        accum(4 * (q0 + b)) += v[b].x;
        accum(4 * (q0 + b) + 1) += v[b].y;
        accum(4 * (q0 + b) + 2) += v[b].z;
        accum(4 * (q0 + b) + 3) += v[b].w;
      }
    }
  }
  if (consumer_idx == 0) count.store(0, cuda::memory_order_relaxed);  // every part has counted: ready for the next call
  return true;
}

// Schedule::kTmaStoreOk / Epilogue::kTmaStoreOk: may the TMA-store epilogue (Traits::kTmaStore)
// run with them? A schedule's tiles must be clipped at M only (TMA clips at the tensor's edge, not
// at a group's or band's end); an epilogue must store plain values to the local C. Absent = no.
template <class S, class = void>
struct tma_store_ok : std::false_type {};
template <class S>
struct tma_store_ok<S, std::void_t<decltype(S::kTmaStoreOk)>> : std::bool_constant<S::kTmaStoreOk> {};

// Epilogue::kTmaAltC: the TMA-store epilogue has two destinations, launch_gemm's c and c_alt
// (same columns and row stride), and epi.tma_target(w, row0) picks one per tile (true = c_alt) and
// the row of that tensor the tile's first row goes to (GEMM+ReduceScatter: its own band to C at
// the band's row, the peers' bands to the local staging buffer). Absent = c at w.row0.
template <class E, class = void>
struct HasTmaAltC : std::false_type {};
template <class E>
struct HasTmaAltC<E, std::void_t<decltype(E::kTmaAltC)>> : std::bool_constant<E::kTmaAltC> {};

// May tile w leave through the TMA store? Yes where TMA's clipping is exact for it: a schedule
// whose tiles are cut at M only, a whole tile, or a cut tile whose end is C's last row (a band's or
// a group's end that is also the tensor's: nothing after it to overwrite). The last case only for
// the one destination c at w.row0 (an epilogue with two, kTmaAltC, maps rows its own way).
template <class Traits, class Schedule, class Epilogue, class Element>
__device__ __forceinline__ bool tma_store_tile(const Params<Element>& p, const TileWork& w) {
  return tma_store_ok<Schedule>::value || w.row0 + Traits::kBlockM <= w.row_end ||
         (!HasTmaAltC<Epilogue>::value && w.row_end >= p.c_rows);
}

// Epilogue::trace (TileTrace*, null = off) and Epilogue::trace_slots: per-tile timestamps
// (ccfuse/gemm/gemm.h). Epilogues without the members pay nothing.
template <class E, class = void>
struct HasTileTrace : std::false_type {};
template <class E>
struct HasTileTrace<E, std::void_t<decltype(std::declval<E>().trace), decltype(std::declval<E>().trace_slots)>>
    : std::true_type {};

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A tile's mainloop from (stage, phase): k-blocks [kb_begin, kb_end), each batch of wgmmas kept in
// flight while the next is issued, each stage released once the batch after it is issued. Returns
// the last stage, which the caller releases after warpgroup_wait<0>.
// kProxyFence (Schedule::kGatherA): the stage's A was written by cp.async (the generic proxy) and
// wgmma reads it through the async proxy: a proxy fence after the acquire.
// tail(kb, stage) runs after each stage's acquire, before its wgmmas (K-grouped tiles clear the
// rows of their last k-block past the group's end there).
struct NoTail {
  __device__ void operator()(int, int) const {}
};
template <int kStages, bool kProxyFence = false, class Mma, class FragA, class FragB, class Accum, class Full,
          class Release, class Tail = NoTail>
__device__ __forceinline__ int mainloop(Mma& mma, const FragA& tCrA, const FragB& tCrB, Accum& accum, Full* full,
                                        int& stage, uint32_t& phase, int kb_begin, int kb_end, Release& release,
                                        const Tail& tail = Tail{}) {
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  int prev_stage = -1;
  for (int kb = kb_begin; kb < kb_end; ++kb) {
    full[stage].wait(phase);
    if constexpr (kProxyFence) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    tail(kb, stage);
    warpgroup_fence_operand(accum);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kk = 0; kk < size<2>(tCrA); ++kk) {
      cute::gemm(mma, tCrA(_, _, kk, stage), tCrB(_, _, kk, stage), accum);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    // Keep this batch in flight; the previous one has finished reading its stage.
    warpgroup_wait<1>();
    warpgroup_fence_operand(accum);
    if (prev_stage >= 0) release(prev_stage);
    prev_stage = stage;
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  return prev_stage;
}

template <class Traits, class Schedule, class Epilogue>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    gemm_kernel(Params<typename Traits::Element> p, Schedule sched, Epilogue epi,
                CUTE_GRID_CONSTANT const typename Traits::TmaA tma_a,
                CUTE_GRID_CONSTANT const typename Traits::TmaB tma_b,
                CUTE_GRID_CONSTANT const typename Traits::TmaA tma_a_alt,
                CUTE_GRID_CONSTANT const typename Traits::TmaC tma_c,
                CUTE_GRID_CONSTANT const typename Traits::TmaC tma_c_alt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  int side_ctas = 0;
  if constexpr (Schedule::kHasSide) {
    static_assert(Traits::kClusterM == 1, "side CTAs are built for unclustered launches");
    side_ctas = sched.num_side_ctas;
    if (int(blockIdx.x) < side_ctas) {
      if constexpr (WaitsPriorGrid<Schedule>::value) griddep_wait();
      Schedule side = sched;  // run_side may keep state
      side.run_side(blockIdx.x);
      return;
    }
  }
  using Element = typename Traits::Element;
  using Storage = typename Traits::SharedStorage;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  constexpr int kStages = Traits::kStages;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  auto* full = reinterpret_cast<FullBarrier*>(ss.full);
  auto* empty = reinterpret_cast<EmptyBarrier*>(ss.empty);

  constexpr int kCluster = Traits::kClusterM;
  static_assert(Traits::kPairN == std::is_same_v<Schedule, PairNSchedule>,
                "pairs along N (Traits::kPairN) go with PairNSchedule, and only they");
  constexpr bool kGatherA = HasGatherA<Schedule>::value;
  // Gathered A: warps 0 and 1 of the producer warpgroup gather, warps 2 and 3 are the send warps.
  constexpr int kGatherWarps = kGatherA ? 2 : 0;
  static_assert(!kGatherA || (kCluster == 1 && !Traits::kPingpong && !HasFixup<Schedule>::value &&
                              !HasAltA<Schedule>::value && Traits::kBlockM % 32 == 0),
                "gathered A rows are built for unclustered whole tiles");
  // setmaxnreg moves registers within the CTA's launch allocation (168 x 384 threads): what the
  // producer warpgroup gives back must cover what the consumers take, or their
  // setmaxnreg.inc waits forever: 128 * (168 - P) >= 256 * (C - 168).
  // (56 / 224 against 40 / 232 measured the same for gemm_rs: perf-notes, send warps.)
  // With send warps the producer warpgroup keeps CCFUSE_SEND_WARP_REGS registers a thread and the
  // consumers get what is left of the 64K: 168 + (168 - P) / 2 (56 -> 224, 72 -> 216).
  // The gather warps of a kGatherA schedule take the send warps' budget too (their copy loops
  // measured at 56 registers).
  constexpr bool kWideProducer = Epilogue::kHasSendWarps || HasGatherA<Schedule>::value;
  constexpr int kProducerRegs = kWideProducer ? CCFUSE_SEND_WARP_REGS : 40;
  constexpr int kConsumerRegs = kWideProducer ? 168 + (168 - CCFUSE_SEND_WARP_REGS) / 2 : 232;
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0, "setmaxnreg takes multiples of 8");
  static_assert(Traits::kThreads != 384 || 128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168),
                "register hand-over must balance");
  const int warp_group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // The producer's arrive_and_expect_tx; with gathered A also one cp.async arrival per lane of
      // the gather warps (.noinc: counted here).
      full[s].init(kGatherA ? 1 + 32 * kGatherWarps : 1);
      // Unclustered: every consumer thread releases. Clustered: one lane per consumer warp of
      // each CTA of the cluster (the stage is refilled by multicasts from both).
      // Ping-pong: one warpgroup consumes each stage.
      constexpr int kStageWGs = Traits::kPingpong ? 1 : Traits::kConsumerWGs;
      empty[s].init(kCluster == 1 ? 128 * kStageWGs : 4 * kStageWGs * kCluster);
    }
    if constexpr (HasTmaAddends<Epilogue>::value) reinterpret_cast<FullBarrier*>(&ss.addend_full)->init(1);
    cutlass::arch::fence_barrier_init();
    ss.tiles_handed = 0;
  }
  if constexpr (kCluster > 1) {
    cute::cluster_arrive_relaxed();  // barriers initialised before any remote arrive or multicast
    cute::cluster_wait();
  } else {
    __syncthreads();
  }
  const int cta_rank = kCluster > 1 ? int(cute::block_rank_in_cluster()) : 0;
  const int unit_start = (int(blockIdx.x) - side_ctas) / kCluster, unit_stride = (int(gridDim.x) - side_ctas) / kCluster;
  // Per-CTA work that is not tile work (send_prologue, tail) is split over the GEMM CTAs, not the
  // clusters (a cluster's two CTAs would otherwise do the same share twice).
  const int gemm_cta = int(blockIdx.x) - side_ctas, gemm_ctas = int(gridDim.x) - side_ctas;

  Tensor sA = make_tensor(make_smem_ptr(ss.a), typename Traits::SmemLayoutA{});  // (BM, BK, stages)
  Tensor sB = make_tensor(make_smem_ptr(ss.b), typename Traits::SmemLayoutB{});  // (BN, BK, stages)
  const int k_tiles = (p.k + Traits::kBlockK - 1) / Traits::kBlockK;
  if constexpr (WaitsPriorGrid<Schedule>::value) griddep_wait();  // before the schedule's first read
  int64_t num_units;
  if constexpr (kCluster > 1) num_units = sched.num_pairs();
  else num_units = sched.num_tiles();
  auto work_of = [&](int64_t u) {
    if constexpr (kCluster > 1) return sched.work_pair(u, cta_rank);
    else return sched.work(u);
  };

  // Consumers release a stage: to the local producer, or to every producer of the cluster (each of
  // them multicasts into this CTA's copy of the stage).
  auto release = [&](int s) {
    if constexpr (kCluster > 1) {
      __syncwarp();
      if (threadIdx.x % 32 == 0)
        for (int c = 0; c < kCluster; ++c) empty[s].arrive(uint32_t(c), 1u);
    } else {
      empty[s].arrive();
    }
  };

  if (warp_group == 0) {
    // ---------------- producer ----------------
    // With send warps the producer warpgroup keeps more registers for their copy loops.
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (kGatherA && threadIdx.x < 32 * kGatherWarps) {
      if constexpr (kGatherA) {
        // ---------------- producer warps 0 and 1, A gathered ----------------
        // kLanes lanes share a row: lane l of warp g copies chunks l % kLanes + kLanes j of tile
        // rows l / kLanes + (32 / kLanes) (g + 2 i) (one 16-byte cp.async each), so that one
        // instruction reads 16 kLanes contiguous bytes of each of its rows, whole 32-byte sectors
        // from kLanes = 2 on (with one lane per row each sector was fetched from L2 twice, a half
        // per instruction: ncu 2026-11-30, Mixtral layer 0 at 86 % of L2 throughput, 7 % L1
        // hits). Every lane of a row computes its address (and waits for its chunk) itself. Warp
        // 0's lane 0 also loads B by TMA. One warp alone issued too slowly (2026-11-30: layer 0 at
        // 1.7x the TMA-fed GEMM on Mixtral).
        static_assert(!IsKGrouped<Schedule>::value, "K-grouped tiles load A by TMA");
        const int lane = threadIdx.x % 32, gw = threadIdx.x / 32;
        Schedule producer_sched = sched;
        Tensor mB = tma_b.get_tma_tensor(make_shape(p.n, p.k, p.num_groups));
        constexpr int kChunks = Traits::kBlockK * int(sizeof(Element)) / 16;
        constexpr int kLanes = CCFUSE_GATHER_LANES_PER_ROW;
        static_assert(kLanes >= 1 && kLanes <= kChunks && kChunks % kLanes == 0 && 32 % kLanes == 0,
                      "lanes per gathered row: a divisor of the row's chunks and of the warp");
        constexpr int kRowsPerPass = 32 / kLanes * kGatherWarps;
        constexpr int kRows = Traits::kBlockM / kRowsPerPass;
        const int row_lane = lane / kLanes + 32 / kLanes * gw, chunk_lane = lane % kLanes;
        constexpr uint32_t kBytesB = uint32_t(Traits::kBlockN * Traits::kBlockK * sizeof(Element));
        const uint32_t sa = cute::cast_smem_ptr_to_uint(ss.a);
        const int64_t row_bytes = int64_t(p.k) * int64_t(sizeof(Element));
        int stage = 0;
        uint32_t phase = 0;
        for (int64_t t = unit_start; t < num_units; t += unit_stride) {
          const TileWork w = work_of(t);
          const char* rows[kRows];
          unsigned valid = 0;
          // On a watchdog timeout load anyway (as wait_ready below): the host raises the error.
          (void)producer_sched.gather_rows(w, row_lane, kRowsPerPass, rows, valid);
          Tensor gB = local_tile(mB(_, _, w.group), Shape<Int<Traits::kBlockN>, Int<Traits::kBlockK>>{},
                                 make_coord(w.n_tile, _));
          auto [tBgB, tBsB] = tma_partition(tma_b, 0, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
          const int kb_end = w.kb_end < k_tiles ? w.kb_end : k_tiles;
          for (int kb = w.kb_begin; kb < kb_end; ++kb) {
            empty[stage].wait(phase ^ 1);
            const int64_t col0 = int64_t(kb) * Traits::kBlockK * int64_t(sizeof(Element));
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
              const int r = row_lane + kRowsPerPass * i;
#pragma unroll
              for (int j = 0; j < kChunks / kLanes; ++j) {
                const int c = chunk_lane + kLanes * j;
                const int64_t off = col0 + 16 * c;
                const bool real = ((valid >> i) & 1u) != 0 && off < row_bytes;
                const uint32_t dst = sa + uint32_t(gather_a_offset<Traits::kBlockM>(r, c, stage));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst),
                             "l"(real ? rows[i] + off : rows[i]), "r"(real ? 16 : 0)
                             : "memory");
              }
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                             cute::cast_smem_ptr_to_uint(&full[stage]))
                         : "memory");
            if (threadIdx.x == 0) {
              full[stage].arrive_and_expect_tx(kBytesB);
              copy(tma_b.with(*reinterpret_cast<uint64_t*>(&full[stage])), tBgB(_, kb), tBsB(_, stage));
            }
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1;
            }
          }
        }
      }
    } else if (!kGatherA && threadIdx.x == 0) {
      Schedule producer_sched = sched;  // the producer's own copy: ready schedules cache state in it
      Tensor mA = tma_a.get_tma_tensor(make_shape(p.m, p.k));
      Tensor mB = tma_b.get_tma_tensor(make_shape(p.n, p.k, p.num_groups));
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t t = unit_start; t < num_units; t += unit_stride) {
        const TileWork w = work_of(t);
        if constexpr (Schedule::kHasReady) {
          // On a watchdog timeout wait_ready returns false and we load the tile anyway: the
          // consumers must not hang on a stage that never fills; the output is garbage and the
          // host raises the TimeoutError.
          // wait_ready also issues fence.proxy.async.global after a band's acquire: the rows were
          // written through the generic proxy (by another GPU or stream), TMA reads through the
          // async proxy.
          (void)producer_sched.wait_ready(w);
        }
        // A from the tile's first row (any row: groups start anywhere); B of the tile's group.
        bool alt = false;
        if constexpr (HasAltA<Schedule>::value) alt = producer_sched.alt_a(w);
        int64_t a_row = w.row0;
        if constexpr (HasAltA<Schedule>::value) a_row = alt ? w.row0 - producer_sched.alt_a_row0 : w.row0;
        // K-grouped: A's rows (M) from the group's tile row, both operands' K from the group's
        // first row; B is batch 0.
        int k_row0 = 0, b_group = w.group;
        if constexpr (IsKGrouped<Schedule>::value) {
          a_row = producer_sched.a_row0(w);
          k_row0 = int(w.k_row0);
          b_group = 0;
        }
        const typename Traits::TmaA& tma_a_tile = alt ? tma_a_alt : tma_a;
        Tensor gA = local_tile(domain_offset(make_coord(int(a_row), k_row0), mA),
                               Shape<Int<Traits::kBlockM>, Int<Traits::kBlockK>>{}, make_coord(0, _));
        Tensor gB = local_tile(domain_offset(make_coord(0, k_row0), mB(_, _, b_group)),
                               Shape<Int<Traits::kBlockN>, Int<Traits::kBlockK>>{}, make_coord(w.n_tile, _));
        // The pair's shared operand is cut in kCluster slices, this CTA loading (and multicasting)
        // slice cta_rank; the other is loaded whole.
        auto [tAgA, tAsA] = tma_partition(tma_a, Traits::kPairN ? cta_rank : 0, Layout<Int<Traits::kMulticastA>>{},
                                          group_modes<0, 2>(sA), group_modes<0, 2>(gA));
        auto [tBgB, tBsB] = tma_partition(tma_b, Traits::kPairN ? 0 : cta_rank, Layout<Int<Traits::kMulticastB>>{},
                                          group_modes<0, 2>(sB), group_modes<0, 2>(gB));
        const int kb_end = w.kb_end < k_tiles ? w.kb_end : k_tiles;
        for (int kb = w.kb_begin; kb < kb_end; ++kb) {
          empty[stage].wait(phase ^ 1);
          full[stage].arrive_and_expect_tx(Traits::kStageBytes);
          constexpr uint16_t kPairMask = uint16_t((1 << kCluster) - 1);
          if constexpr (Traits::kMulticastA > 1)
            copy(tma_a_tile.with(*reinterpret_cast<uint64_t*>(&full[stage]), kPairMask), tAgA(_, kb), tAsA(_, stage));
          else
            copy(tma_a_tile.with(*reinterpret_cast<uint64_t*>(&full[stage])), tAgA(_, kb), tAsA(_, stage));
          if constexpr (Traits::kMulticastB > 1)
            copy(tma_b.with(*reinterpret_cast<uint64_t*>(&full[stage]), kPairMask), tBgB(_, kb), tBsB(_, stage));
          else
            copy(tma_b.with(*reinterpret_cast<uint64_t*>(&full[stage])), tBgB(_, kb), tBsB(_, stage));
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    } else if constexpr (Epilogue::kHasSendWarps) {
      if (threadIdx.x >= 32 * (kGatherA ? kGatherWarps : 1)) {
        // ---------------- send warps ----------------
        // The same tile sequence as the consumers; wait for each sent tile's hand-over.
        constexpr int kSendThreads = 128 - 32 * (kGatherA ? kGatherWarps : 1);
        const int st = threadIdx.x - (128 - kSendThreads);
        // Everything the send warps do writes to peers or reads the call's epoch: after the entry
        // barrier (a no-op unless launched with PDL).
        griddep_wait();
        // Work that does not wait for any tile first (AllGather+GEMM: pushing this rank's A).
        if constexpr (HasSendSmem<Epilogue>::value) {
          // The staging buffer's columns past the activation's output (SiLU-and-mul writes half
          // of them) and the tail past SharedStorage.
          SendSmem spare;
          constexpr bool kHalfStaging = Epilogue::kAct == Activation::kSiluMul && Traits::kTmaStore &&
                                        !Traits::kPingpong && Traits::kStagingRing == 0 &&
                                        !HasTmaAddends<Epilogue>::value;
          if constexpr (kHalfStaging) {
            constexpr int kUsed = (Traits::kBlockN / 2 / Traits::kStoreCols) * Traits::kStoreSubBytes;
            spare.ptr[0] = reinterpret_cast<char*>(ss.c) + kUsed;
            spare.bytes[0] = int(sizeof(ss.c)) - kUsed;
          }
          constexpr int kTail = send_smem_tail<Traits, Epilogue>();
          if constexpr (kTail > 0) {
            spare.ptr[1] = smem_raw + Traits::kSmemBytes;
            spare.bytes[1] = kTail;
          }
          epi.send_prologue(gemm_cta, gemm_ctas, st, kSendThreads, spare);
        } else {
          epi.send_prologue(gemm_cta, gemm_ctas, st, kSendThreads);
        }
        uint32_t handed = 0;
        for (int64_t t = unit_start; t < num_units; t += unit_stride) {
          const TileWork w = work_of(t);
          if (!epi.sends(w)) continue;
          ++handed;
          if (st == 0) {
            cuda::atomic_ref<uint32_t, cuda::thread_scope_block> count(ss.tiles_handed);
            while (count.load(cuda::memory_order_acquire) < handed) __nanosleep(64);
          }
          asm volatile("bar.sync 2, %0;" ::"n"(kSendThreads));  // the acquire before every send thread's loads
          epi.send(w, st, kSendThreads);
          asm volatile("bar.sync 2, %0;" ::"n"(kSendThreads));  // every send thread's stores before the flag
          if (st == 0) epi.notify_sent(w);
        }
      }
    }
  } else if constexpr (Traits::kPingpong) {
    // ---------------- ping-pong consumers ----------------
    // The CTA's i-th unit goes to warpgroup i % 2. Every unit is a whole tile of k_tiles
    // k-blocks, loaded in unit order, so unit i's first k-block is the (i * k_tiles)-th the
    // producer loads: its stage and phase. Warpgroup wg starts a mainloop only once the other has
    // issued its previous one (named barrier 5 + wg), so that the mainloops alternate and each
    // epilogue runs under the other warpgroup's mainloop. The order is also what makes the phase
    // waits sound: an mbarrier parity wait can only tell the current phase from the one before,
    // and a warpgroup that waited for a stage two loads ahead of the producer would pass at once.
    // Once the other warpgroup has waited for every k-block of unit i - 1, each stage of unit i
    // has completed its previous load, so its wait is for the stage's current phase.
    static_assert(!Epilogue::kHasSendWarps && !Epilogue::kHasNotify && !Epilogue::kHasAddends &&
                      !HasFixup<Schedule>::value && !Schedule::kHasReady && !HasTileTrace<Epilogue>::value,
                  "ping-pong consumers are built for plain problems and epilogues");
    // Whole tiles through TMA; a grouped schedule's tile cut by its group's end (rows past it
    // belong to the next group) from registers, as the cooperative consumers do.
    static_assert(tma_store_ok<Epilogue>::value, "ping-pong stores through TMA");
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    typename Traits::TiledMma mma;
    const int wg = warp_group - 1, t = threadIdx.x % 128;
    auto thr = mma.get_thread_slice(t);
    Tensor tCsA = thr.partition_A(sA);  // (MMA, MMA_M = 2, MMA_K, stages)
    Tensor tCsB = thr.partition_B(sB);
    Tensor tCrA = thr.make_fragment_A(tCsA);
    Tensor tCrB = thr.make_fragment_B(tCsB);
    // K-grouped tiles (IsKGrouped) have their group's k-blocks, not k_tiles: unit i's first k-block
    // is then the count of the CTA's earlier units' k-blocks (kb_done, both warpgroups walking
    // every unit). The phase argument above holds as it is: it needs only that the other warpgroup
    // has waited for every k-block before unit i's.
    constexpr bool kKGrouped = IsKGrouped<Schedule>::value;
    int64_t i = 0, kb_done = 0;
    for (int64_t u = unit_start; u < num_units; u += unit_stride, ++i) {
      int kb_count = k_tiles;
      TileWork w{};
      if constexpr (kKGrouped) {
        w = work_of(u);
        kb_count = w.kb_end < k_tiles ? w.kb_end : k_tiles;
        kb_done += kb_count;
        if (int(i % 2) != wg) continue;
      } else {
        if (int(i % 2) != wg) continue;
        w = work_of(u);
      }
      const int64_t kb0 = kKGrouped ? kb_done - kb_count : i * k_tiles;
      int stage = int(kb0 % kStages);
      uint32_t phase = uint32_t((kb0 / kStages) % 2);
      if (i > 0) named_barrier_sync(5 + wg, 256);  // the other warpgroup has issued unit i - 1's mainloop
      Tensor accum = partition_fragment_C(mma, Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{});
      int prev_stage;
      if constexpr (kKGrouped) {
        // As the cooperative consumers, with this warpgroup alone reading its stages.
        const int valid = w.k_rows % Traits::kBlockK, last = kb_count - 1;
        auto tail = [&](int kb, int s) {
          if (kb != last || valid == 0) return;
          zero_k_tail<Traits>(ss, s, valid, t, 128);
          named_barrier_sync(3 + wg, 128);
        };
        if (kb_count == 0) {
          CUTE_UNROLL
          for (int j = 0; j < size(accum); ++j) accum(j) = 0.f;
        }
        prev_stage = mainloop<kStages>(mma, tCrA, tCrB, accum, full, stage, phase, 0, kb_count, release, tail);
      } else {
        prev_stage = mainloop<kStages>(mma, tCrA, tCrB, accum, full, stage, phase, 0, k_tiles, release);
      }
      // Unit i + 1 (the other warpgroup's) may start its mainloop: this one's is issued.
      if (u + unit_stride < num_units) named_barrier_arrive(5 + (1 - wg), 256);
      warpgroup_wait<0>();
      warpgroup_fence_operand(accum);
      if (prev_stage >= 0) release(prev_stage);
      if constexpr (HasPreactOut<Epilogue>::value) {
        TileWork kept;
        if (preact_rows_of(epi, w, kept)) {
          CUTE_UNROLL
          for (int mb = 0; mb < 2; ++mb)
            store_block<Traits>(p, PreactEpilogue<typename Traits::Element, Epilogue>{epi}, accum(_, mb, _), 64 * mb,
                                t, kept);
        }
      }
      if (tma_store_tile<Traits, Schedule, Epilogue>(p, w)) {
        store_tile_tma_wg<Traits>(p, epi, ss, tma_c, accum, wg, t, w);
      } else {
        CUTE_UNROLL
        for (int mb = 0; mb < 2; ++mb) store_block<Traits, Epilogue>(p, epi, accum(_, mb, _), 64 * mb, t, w);
      }
    }
    if (t == 0) tma_store_wait<0>();  // the staging buffer must outlive the last stores' reads of it
  } else {
    // ---------------- consumers ----------------
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    typename Traits::TiledMma mma;
    const int consumer_idx = threadIdx.x - 128;
    auto thr = mma.get_thread_slice(consumer_idx);
    Tensor tCsA = thr.partition_A(sA);  // (MMA, MMA_M, MMA_K, stages)
    Tensor tCsB = thr.partition_B(sB);
    Tensor tCrA = thr.make_fragment_A(tCsA);  // smem descriptors
    Tensor tCrB = thr.make_fragment_B(tCsB);
    int stage = 0;
    uint32_t phase = 0;
    constexpr bool kTrace = HasTileTrace<Epilogue>::value;
    int trace_index = 0;
    uint64_t* trace_t = ss.trace_t;
    // A tile handed to the send warps reads what the consumers stored. A TMA-stored tile's writes
    // belong to the async proxy and complete some time after the store is issued, so consumer
    // thread 0 hands it over only after the next tile's mainloop (or after the last tile): then it
    // waits for the writes (cp.async.bulk.wait_group 0, which by then costs nothing), orders
    // them before the generic proxy, and releases the count. Hand-overs stay in tile order.
    constexpr bool kDeferHandover = Traits::kTmaStore && Epilogue::kHasSendWarps;
    bool handover_pending = false;  // consumer thread 0: a TMA-stored tile not yet handed over
    // HasEarlyHandover: consumer thread 0 hands it over at k-block kEarlyHandoverKb of the next
    // mainloop instead (flush_handover there; a no-op when nothing is pending).
    constexpr bool kEarlyHandover = kDeferHandover && HasEarlyHandover<Epilogue>::value;
    bool early_handover = false;
    if constexpr (kEarlyHandover) early_handover = consumer_idx == 0 && epi.early_handover;
    int handover_kb = 0;  // kEarlyHandover: k-blocks of the current mainloop released so far
    (void)early_handover;
    (void)handover_kb;
    constexpr bool kPrefetch = HasPrefetchAddends<Epilogue>::value && HasTmaAddends<Epilogue>::value && Traits::kTmaStore;
    bool addend_prefetched = false;  // consumer thread 0: the current tile's first addend is loading
    int prefetch_kb = 0;             // consumer thread 0: k-blocks of the current mainloop released so far
    bool prefetch_try = false;       // consumer thread 0: the current tile may prefetch
    (void)addend_prefetched;
    (void)prefetch_kb;
    (void)prefetch_try;
    constexpr bool kDirect = HasTmaDirect<Epilogue>::value && Traits::kTmaStore;
    bool direct_pending = false;  // consumer thread 0: a directly stored tile (kTmaDirect) not yet complete
    TileWork direct_w{};
    uint32_t addend_phase = 0;      // kTmaAddends: the parity of ss.addend_full's next phase
    (void)addend_phase;
    (void)direct_pending;
    (void)direct_w;
    auto hand_over = [&ss]() {
      cuda::atomic_ref<uint32_t, cuda::thread_scope_block> count(ss.tiles_handed);
      count.fetch_add(1u, cuda::memory_order_release);
    };
    auto flush_handover = [&]() {
      if ((kDeferHandover && handover_pending) || (kDirect && direct_pending)) {
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        asm volatile("fence.proxy.async.global;" ::: "memory");
        if (kDeferHandover && handover_pending) hand_over();
        handover_pending = false;
        if constexpr (kDirect) {
          if (direct_pending) {
            griddep_wait();  // the flag carries the call's epoch (PDL: after the entry barrier)
            epi.stored_direct(direct_w);
          }
          direct_pending = false;
        }
      }
    };
    uint32_t reduce_seq = 0;  // AccumF32Epilogue's reduce ring: sub-tiles this warpgroup has issued
    (void)reduce_seq;
    if constexpr (HasAccumF32<Epilogue>::value) {
      // The map was written in global memory by a kernel before this one (make_accum_reduce_map's
      // caller): ordered before the tensor-map proxy's reads of it.
      if (epi.reduce_map != nullptr && consumer_idx % 128 == 0)
        asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(epi.reduce_map) : "memory");
    }
    for (int64_t t = unit_start; t < num_units; t += unit_stride) {
      const TileWork w = work_of(t);
      if constexpr (HasFixup<Schedule>::value) {
        if (w.kb_begin >= w.kb_end) continue;  // an empty stream-K unit (the producer loads nothing for it)
      }
      if constexpr (kTrace) {
        if (epi.trace != nullptr && consumer_idx == 0) trace_t[0] = globaltimer_ns();
      }
      Tensor accum = partition_fragment_C(mma, Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{});
      const int kb_end = w.kb_end < k_tiles ? w.kb_end : k_tiles;
      if constexpr (kEarlyHandover) handover_kb = 0;
      if constexpr (kPrefetch) {
        addend_prefetched = false;
        prefetch_kb = 0;
        prefetch_try = consumer_idx == 0 && epi.prefetch_addends && epi.tma_addends && epi.has_addends(w) &&
                       (tma_store_ok<Schedule>::value || w.row0 + Traits::kBlockM <= w.row_end);
      }
      // kPrefetch: consumer thread 0 looks at the first addend's flags at k-blocks 4, 12, 20, ... of
      // an own-band tile (by k-block 4 the previous tile's stores have long read the staging
      // buffer) and starts its load once it is there.
      auto release_k = [&](int s) {
        release(s);
        if constexpr (kEarlyHandover) {
          if (early_handover && ++handover_kb == kEarlyHandoverKb) flush_handover();
        }
        if constexpr (kPrefetch) {
          if (prefetch_try && !addend_prefetched && (++prefetch_kb & 7) == 4) {
            griddep_wait();  // the flags carry the call's epoch (PDL: after the entry barrier)
            if (epi.addend_ready(w, 0)) {
              tma_store_wait<0>();
              issue_addend_tma<Traits>(p, epi, ss, w, 0);
              addend_prefetched = true;
            }
          }
        }
      };
      int prev_stage;
      if constexpr (IsKGrouped<Schedule>::value) {
        // The group's last k-block holds k_rows % kBlockK of its rows: clear the rest of the stage
        // (both consumer warpgroups, then all of them before either reads it). A group without
        // rows stores zeros.
        const int valid = w.k_rows % Traits::kBlockK, last = kb_end - 1;
        auto tail = [&](int kb, int s) {
          if (kb != last || valid == 0) return;
          zero_k_tail<Traits>(ss, s, valid, consumer_idx, 128 * Traits::kConsumerWGs);
          asm volatile("bar.sync 1, %0;" ::"n"(128 * Traits::kConsumerWGs));
        };
        if (w.kb_begin >= kb_end) {
          CUTE_UNROLL
          for (int i = 0; i < size(accum); ++i) accum(i) = 0.f;
        }
        prev_stage = mainloop<kStages, kGatherA>(mma, tCrA, tCrB, accum, full, stage, phase, w.kb_begin, kb_end,
                                                 release_k, tail);
      } else {
        prev_stage = mainloop<kStages, kGatherA>(mma, tCrA, tCrB, accum, full, stage, phase, w.kb_begin, kb_end,
                                                 release_k);
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(accum);
      if (prev_stage >= 0) release(prev_stage);
      if constexpr (kTrace) {
        if (epi.trace != nullptr && consumer_idx == 0) {
          trace_t[1] = globaltimer_ns();
          trace_t[2] = trace_t[1];
        }
      }
      if (consumer_idx == 0) flush_handover();  // before any wait on a peer: the peer may wait for it
      if constexpr (Epilogue::kHasAddends) {
        if (epi.has_addends(w)) {  // the same for every consumer thread of the CTA
          if (consumer_idx == 0) {
            griddep_wait();  // the addends' flags carry the call's epoch (PDL: after the entry barrier)
            epi.wait_addends(w);
          }
          // The wait's acquire happens-before every consumer thread's loads of the addends.
          asm volatile("bar.sync 1, %0;" ::"n"(128 * Traits::kConsumerWGs));
          if constexpr (HasTmaAddends<Epilogue>::value && Traits::kTmaStore) {
            if (epi.tma_addends && (tma_store_ok<Schedule>::value || w.row0 + Traits::kBlockM <= w.row_end))
              add_addends_tma<Traits>(p, epi, ss, accum, consumer_idx, w, addend_phase, kPrefetch && addend_prefetched);
            else
              add_addends<Traits>(p, epi, accum, consumer_idx, w);
          } else {
            add_addends<Traits>(p, epi, accum, consumer_idx, w);
          }
          if constexpr (kTrace) {
            if (epi.trace != nullptr && consumer_idx == 0) trace_t[2] = globaltimer_ns();
          }
        }
      }
      if constexpr (HasFixup<Schedule>::value) {
        static_assert(!Epilogue::kHasSendWarps && !Epilogue::kHasNotify && !Epilogue::kHasAddends,
                      "tiles cut along K are built for plain epilogues");
        if (w.fixup_tile >= 0 && !fixup_sum<Traits>(sched, ss, accum, consumer_idx, w)) continue;  // not the last part
      }
      store_preact<Traits>(p, epi, accum, consumer_idx, w);
      bool stored_tma = false;  // the same for every consumer thread of the CTA
      (void)stored_tma;
      if constexpr (Traits::kTmaStore) {
        static_assert(tma_store_ok<Epilogue>::value,
                      "the TMA-store epilogue needs plain stores to the local C (Epilogue::kTmaStoreOk)");
        // Schedules whose tiles may be cut short of M (a group's or a band's end: GroupedSchedule,
        // the fused TP ops' bands): whole tiles through TMA; a cut tile from registers, since TMA
        // would also write the rows after its end, which belong to the next group or band, unless
        // its end is C's (tma_store_tile).
        if (tma_store_tile<Traits, Schedule, Epilogue>(p, w)) {
          stored_tma = true;
          if constexpr (HasTmaAltC<Epilogue>::value) {
            int64_t row0 = w.row0;
            const void* direct = nullptr;
            if constexpr (kDirect) direct = epi.tma_direct(w, row0);
            if (direct != nullptr) {
              // A peer's buffer: only after the entry barrier (the peer may still read it; PDL).
              griddep_wait();
              store_tile_tma<Traits>(p, epi, ss, tma_c, accum, consumer_idx, w, row0, direct);
              if (consumer_idx == 0) {  // complete after the next mainloop (flush_handover)
                direct_pending = true;
                direct_w = w;
              }
            } else if (epi.tma_target(w, row0)) {
              store_tile_tma<Traits>(p, epi, ss, tma_c_alt, accum, consumer_idx, w, row0);
            } else {
              store_tile_tma<Traits>(p, epi, ss, tma_c, accum, consumer_idx, w, row0);
            }
          } else {
            store_tile_tma<Traits>(p, epi, ss, tma_c, accum, consumer_idx, w, w.row0);
          }
        } else {
          store_tile<Traits>(p, epi, accum, consumer_idx, w);
        }
      } else if constexpr (HasAccumF32<Epilogue>::value) {
        if (epi.reduce_map != nullptr)
          reduce_tile_f32_tma<Traits>(p, epi, smem_raw + Traits::kSmemBytes, accum, consumer_idx, w, reduce_seq);
        else
          store_tile<Traits>(p, epi, accum, consumer_idx, w);
      } else {
        store_tile<Traits>(p, epi, accum, consumer_idx, w);
      }
      if constexpr (Epilogue::kHasSendWarps) {
        if (epi.sends(w)) {
          // Every consumer thread's stores happen-before the hand-over to the send warps.
          asm volatile("bar.sync 1, %0;" ::"n"(128 * Traits::kConsumerWGs));
          if (consumer_idx == 0) {
            if (kDeferHandover && stored_tma) {
              handover_pending = true;  // handed over after the next mainloop (flush_handover)
            } else {
              flush_handover();  // tile order
              hand_over();
            }
          }
        }
      }
      if constexpr (Epilogue::kHasNotify) {
        // Every consumer thread's stores happen-before the notify of the tile.
        asm volatile("bar.sync 1, %0;" ::"n"(128 * Traits::kConsumerWGs));
        if (consumer_idx == 0) {
          if constexpr (Traits::kTmaStore) {
            // A TMA-stored tile is written by the async proxy: wait until its writes (not only
            // the staging reads) are complete, then order them before the generic-proxy release.
            asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
            asm volatile("fence.proxy.async.global;" ::: "memory");
          }
          epi.notify(w);
        }
      }
      if constexpr (kTrace) {
        if (epi.trace != nullptr && consumer_idx == 0 && trace_index < epi.trace_slots) {
          const int cta = unit_start;
          TileTrace& rec = epi.trace[int64_t(cta) * epi.trace_slots + trace_index];
          rec = TileTrace{trace_t[0], trace_t[1], trace_t[2], globaltimer_ns(), w.m_tile, w.n_tile, cta, trace_index};
        }
        ++trace_index;
      }
    }
    if (consumer_idx == 0) flush_handover();
    if constexpr (Traits::kTmaStore) {
      // The staging buffer must outlive the last stores' reads of it.
      if (consumer_idx == 0) tma_store_wait<0>();
    }
    if constexpr (HasAccumF32<Epilogue>::value) {
      // Each warpgroup's reduce ring must outlive its last reduce-adds (they complete here).
      if (epi.reduce_map != nullptr && consumer_idx % 128 == 0)
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
    if constexpr (Epilogue::kHasTail) {
      griddep_wait();
      epi.tail(consumer_idx, gemm_cta, gemm_ctas);
    }
  }
  if constexpr (kCluster > 1) {
    // No CTA leaves while its partner may still arrive on its barriers.
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  }
#endif
}

// The schedule of a plain problem for a config (tile counts, order).
inline PlainSchedule plain_schedule(int64_t m, int64_t n, int block_m, int block_n, int group_m, bool col_major) {
  PlainSchedule s;
  s.block_m = block_m;
  s.m = m;
  s.m_tiles = int((m + block_m - 1) / block_m);
  s.n_tiles = int((n + block_n - 1) / block_n);
  s.group_m = group_m;
  s.col_major = col_major;
  return s;
}

// Launches the kernel for one Traits instantiation with any Schedule/Epilogue on `grid_sms` CTAs
// (at most one per tile). A, B: global pointers laid out as Traits expects; C row-major (ldc).
// Host only; validation is the caller's (ccfuse::gemm::validate).
// For grouped problems `m` is the row capacity of A and C and B holds `groups` batches of
// `group_stride` elements; plain problems pass groups = 1. `a_alt` ([a_alt_rows, K], stride lda)
// is what Schedule::alt_a tiles read (HasAltA); null: A again.
// TMA-store epilogue only: `c_rows` (0 = m) is C's row count as the TMA store clips it, and
// `c_alt` ([c_alt_rows, n], stride ldc) the second destination of an Epilogue::kTmaAltC.
// `a_m` (0 = m): A's extent along M where it is not C's (K-grouped problems: one group's m, C
// holding every group's).
template <class Traits, class Schedule, class Epilogue>
void launch_gemm(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, void* c,
                 int64_t ldc, const Schedule& sched, const Epilogue& epi, int grid_sms, cudaStream_t stream,
                 int groups = 1, int64_t group_stride = 0, const void* a_alt = nullptr, int64_t a_alt_rows = 0,
                 bool pdl = false, int64_t c_rows = 0, void* c_alt = nullptr, int64_t c_alt_rows = 0,
                 int64_t a_m = 0) {
  using E = typename Traits::Element;
  auto tma_a = make_tma_copy(typename Traits::TmaLoadA{},
                             Traits::gmem_a(static_cast<const E*>(a), a_m > 0 ? a_m : m, k, lda),
                             typename Traits::SmemLayoutA{}(_, _, 0), Int<Traits::kMulticastA>{});
  auto tma_a_alt = a_alt == nullptr ? tma_a
                                    : make_tma_copy(typename Traits::TmaLoadA{},
                                                    Traits::gmem_a(static_cast<const E*>(a_alt), a_alt_rows, k, lda),
                                                    typename Traits::SmemLayoutA{}(_, _, 0), Int<Traits::kMulticastA>{});
  auto tma_b = make_tma_copy(typename Traits::TmaLoadB{},
                             Traits::gmem_b(static_cast<const E*>(b), n, k, ldb, groups, group_stride ? group_stride : n * k),
                             typename Traits::SmemLayoutB{}(_, _, 0), Int<Traits::kMulticastB>{});
  // Only the TMA-store epilogue uses it; the others get a descriptor of a valid dummy view (an
  // odd ldc, which they support, would not make a valid TMA descriptor).
  const int64_t out_n = Epilogue::kAct == Activation::kSiluMul ? n / 2 : n;
  auto tma_c = make_tma_copy(SM90_TMA_STORE{},
                             Traits::kTmaStore ? Traits::gmem_c(static_cast<E*>(c), c_rows > 0 ? c_rows : m, out_n, ldc)
                                               : Traits::gmem_c(static_cast<E*>(c), Traits::kBlockM, Traits::kStoreCols,
                                                                Traits::kStoreCols),
                             typename Traits::SmemLayoutC{}(_, _, 0));
  if (HasTmaAltC<Epilogue>::value && Traits::kTmaStore && (c_alt == nullptr || c_alt_rows <= 0))
    throw Error("gemm: an epilogue with two TMA-store destinations needs c_alt and c_alt_rows");
  auto tma_c_alt = !(HasTmaAltC<Epilogue>::value && Traits::kTmaStore)
                       ? tma_c
                       : make_tma_copy(SM90_TMA_STORE{}, Traits::gmem_c(static_cast<E*>(c_alt), c_alt_rows, out_n, ldc),
                                       typename Traits::SmemLayoutC{}(_, _, 0));
  Params<E> p{int(m), int(n), int(k), groups, static_cast<E*>(c), ldc, c_rows > 0 ? c_rows : m};
  auto kernel = gemm_kernel<Traits, Schedule, Epilogue>;
  constexpr int kSmem = dynamic_smem_bytes<Traits, Epilogue>();
  static_assert(kSmem <= kMaxCtaSmem, "shared memory of one CTA past the 227 KiB of sm_90");
  // The shared-memory attribute once per kernel and device (it is per device; every call paid
  // for it before, on the host, which counts in a fused op's time when the GPU waits for it).
  static std::atomic<uint64_t> attribute_set{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) throw Error(detail::str_cat("gemm: cudaGetDevice: ", cudaGetErrorString(err)));
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || (attribute_set.load(std::memory_order_acquire) & bit) == 0) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) throw Error(detail::str_cat("gemm: cudaFuncSetAttribute: ", cudaGetErrorString(err)));
    attribute_set.fetch_or(bit, std::memory_order_acq_rel);
  }
  if constexpr (Traits::kClusterM == 1) {
    // grid_sms counts every CTA, side CTAs included.
    int side = 0;
    if constexpr (Schedule::kHasSide) side = sched.num_side_ctas;
    const int64_t tiles = sched.max_tiles();
    const int gemm_ctas = int(tiles < grid_sms - side ? tiles : grid_sms - side);
    if (gemm_ctas <= 0 && side == 0) return;
    if (gemm_ctas <= 0) throw Error(detail::str_cat("gemm: no SM left for the GEMM (", grid_sms, " SMs, ", side, " side CTAs)"));
    if (!pdl) {
      kernel<<<gemm_ctas + side, Traits::kThreads, kSmem, stream>>>(p, sched, epi, tma_a, tma_b, tma_a_alt,
                                                                                 tma_c, tma_c_alt);
    } else {
      // Programmatic dependent launch: may start before the previous kernel on the stream ends
      // (griddep_wait above orders what depends on it).
      cudaLaunchConfig_t config{};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      config.attrs = attr;
      config.numAttrs = 1;
      config.gridDim = dim3(unsigned(gemm_ctas + side));
      config.blockDim = dim3(Traits::kThreads);
      config.dynamicSmemBytes = kSmem;
      config.stream = stream;
      err = cudaLaunchKernelEx(&config, kernel, p, sched, epi, tma_a, tma_b, tma_a_alt, tma_c, tma_c_alt);
      if (err != cudaSuccess) throw Error(detail::str_cat("gemm: PDL launch failed: ", cudaGetErrorString(err)));
    }
  } else {
    // Clustered schedules hand out pairs of vertically adjacent tiles (num_pairs, work_pair):
    // PlainSchedule and the fused TP ops' banded schedules.
    static_assert(!Schedule::kHasSide, "side CTAs are built for unclustered launches");
    cudaLaunchConfig_t config{};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = Traits::kClusterM;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    config.blockDim = dim3(Traits::kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    // A persistent grid must fit at once: clusters are placed within a GPC, so fewer than
    // SMs / 2 of them may be co-resident.
    int max_clusters = 0;
    config.gridDim = dim3(unsigned(grid_sms / Traits::kClusterM * Traits::kClusterM));
    err = cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config);
    if (err != cudaSuccess) throw Error(detail::str_cat("gemm: cudaOccupancyMaxActiveClusters: ", cudaGetErrorString(err)));
    int64_t clusters = sched.num_pairs();
    if (clusters > grid_sms / Traits::kClusterM) clusters = grid_sms / Traits::kClusterM;
    if (clusters > max_clusters) clusters = max_clusters;
    if (clusters <= 0) return;
    config.gridDim = dim3(unsigned(clusters * Traits::kClusterM));
    err = cudaLaunchKernelEx(&config, kernel, p, sched, epi, tma_a, tma_b, tma_a_alt, tma_c, tma_c_alt);
    if (err != cudaSuccess) throw Error(detail::str_cat("gemm: cluster launch failed: ", cudaGetErrorString(err)));
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(detail::str_cat("gemm: launch failed: ", cudaGetErrorString(err)));
}

}  // namespace ccfuse::gemm::sm90
