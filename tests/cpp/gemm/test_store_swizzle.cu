// The TMA-store epilogue's staging addresses on the host: store_tile_tma writes each accumulator
// pair at Traits::staging_chunk(row, j, staging_swizzle(row)) + its byte in the chunk, computed by
// hand; the TMA stores read the buffer through CuTe's swizzled layout (Traits::SmemLayoutC). Every
// element of the tile must land where CuTe puts it, for every swizzle width: 32-byte (the 48- and
// 80-column tiles' 16-column sub-tiles), 64-byte (32-column sub-tiles: 96, 160, 224) and 128-byte
// (64-column sub-tiles of the other tiles).
// Compiled by nvcc for the CuTe headers; runs without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "ccfuse/gemm/sm90_gemm.cuh"

namespace ccfuse::gemm::sm90 {
namespace {

template <class Traits>
void check_staging_addresses() {
  using E = typename Traits::Element;
  constexpr int kBM = Traits::kBlockM, kBN = Traits::kBlockN, kSub = Traits::kStoreCols;
  SCOPED_TRACE(::testing::Message() << "tile " << kBM << "x" << kBN << ", " << kSub << "-column sub-tiles");
  // Addresses only (never read or written); 1 KiB-aligned like the shared-memory buffer, since the
  // swizzle acts on address bits.
  alignas(1024) static E buf[kBM * kBN];
  Tensor sC = make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutC{});
  const char* base = reinterpret_cast<const char*>(buf);
  std::vector<int> hits(size_t(kBM) * kBN, 0);
  for (int row = 0; row < kBM; ++row) {
    const int swizzle = Traits::staging_swizzle(row);
    // store_tile_tma computes it once per thread for rows `row` and `row + 8`.
    if (row + 8 < kBM) ASSERT_EQ(Traits::staging_swizzle(row + 8), swizzle) << "row " << row;
    for (int col = 0; col < kBN; ++col) {
      const int ours = Traits::staging_chunk(row, col / 8, swizzle) + (col % 8) * int(sizeof(E));
      const auto cute = reinterpret_cast<const char*>(&sC(row, col % kSub, col / kSub)) - base;
      ASSERT_EQ(ours, cute) << "row " << row << " col " << col;
      ASSERT_EQ(ours % int(sizeof(E)), 0);
      ASSERT_GE(ours, 0);
      ASSERT_LT(ours, kBM * kBN * int(sizeof(E)));
      ++hits[size_t(ours) / sizeof(E)];
    }
  }
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element slot " << i;
}

// CCFUSE_STMATRIX_STAGING: stmatrix.x4 puts register m of lane t (the pair at columns
// 2 (t % 4) + {0, 1} of row t / 4 of matrix m) at the address lane 8 m + t / 4 gave; every such
// element must land where the 32-bit stores put it: row t / 4 + 8 (m % 2) of the warp's 16, column
// group j + m / 2 (store_tile_tma's fragment layout).
template <class Traits>
void check_stmatrix_addresses() {
  using E = typename Traits::Element;
  constexpr int kBM = Traits::kBlockM, kBN = Traits::kBlockN;
  SCOPED_TRACE(::testing::Message() << "stmatrix, tile " << kBM << "x" << kBN);
  for (int warp_row0 = 0; warp_row0 < kBM; warp_row0 += 16)
    for (int j = 0; j + 1 < kBN / 8; j += 2)
      for (int t = 0; t < 32; ++t)
        for (int m = 0; m < 4; ++m)
          for (int e = 0; e < 2; ++e) {
            const int byte = (2 * (t % 4) + e) * int(sizeof(E));
            const int got = Traits::stmatrix_chunk(warp_row0, j, 8 * m + t / 4) + byte;
            const int row = warp_row0 + t / 4;
            const int want = Traits::staging_chunk(row + 8 * (m % 2), j + m / 2, Traits::staging_swizzle(row)) + byte;
            ASSERT_EQ(got, want) << "warp row " << warp_row0 << " j " << j << " lane " << t << " matrix " << m;
          }
}

TEST(GemmStoreSwizzle, StmatrixAddressesMatchTheScalarStores) {
  check_stmatrix_addresses<Traits<cutlass::bfloat16_t, 128, 256, 64, 3, true, 1, true>>();
  check_stmatrix_addresses<Traits<cutlass::bfloat16_t, 128, 192, 64, 4, true, 2, true>>();
  check_stmatrix_addresses<Traits<cutlass::bfloat16_t, 128, 128, 64, 5, false, 1, true>>();
  check_stmatrix_addresses<Traits<cutlass::bfloat16_t, 128, 96, 64, 7, true, 1, true>>();
  check_stmatrix_addresses<Traits<cutlass::bfloat16_t, 128, 160, 64, 5, true, 2, true>>();
  check_stmatrix_addresses<Traits<cutlass::half_t, 128, 224, 64, 3, true, 1, true>>();
}

using Bf16 = cutlass::bfloat16_t;
using Fp16 = cutlass::half_t;

TEST(GemmStoreSwizzle, N96TileMatchesCuteWith64ByteSwizzle) {
  using T = Traits<Bf16, 128, 96, 64, 7, true, 1, true>;
  static_assert(T::kStoreCols == 32 && T::kStoreRowBytes == 64, "96 columns: 32-column boxes, 64-byte swizzle");
  check_staging_addresses<T>();
  check_staging_addresses<Traits<Fp16, 128, 96, 64, 7, true, 2, true>>();
}

TEST(GemmStoreSwizzle, WideTilesMatchCuteWith128ByteSwizzle) {
  using T = Traits<Bf16, 128, 256, 64, 3, true, 1, true>;
  static_assert(T::kStoreCols == 64 && T::kStoreRowBytes == 128, "64-column boxes, 128-byte swizzle");
  check_staging_addresses<T>();
  check_staging_addresses<Traits<Bf16, 128, 192, 64, 4, true, 2, true>>();
  check_staging_addresses<Traits<Fp16, 128, 128, 64, 5, false, 1, true>>();
}

// What the 128x96 tile relies on besides the staging buffer: one wgmma instruction of n = 96 per
// k-step (48 fp32 accumulators per consumer thread, store_tile_tma's fragment layout), and its 7
// stages within the 227 KiB of shared memory of a CTA (also a static_assert in Traits).
TEST(GemmStoreSwizzle, N96TileShape) {
  using T = Traits<Bf16, 128, 96, 64, 7, true, 1, true>;
  using T16 = Traits<Fp16, 128, 96, 64, 7, true, 2, true>;
  static_assert(size<1>(typename MMA_Traits<typename T::MmaOp>::Shape_MNK{}) == 96, "wgmma n96");
  static_assert(size<1>(typename MMA_Traits<typename T16::MmaOp>::Shape_MNK{}) == 96, "wgmma n96 (fp16)");
  using Accum = decltype(partition_fragment_C(typename T::TiledMma{}, Shape<Int<128>, Int<96>>{}));
  static_assert(decltype(size(typename Accum::layout_type{}))::value == 48, "48 accumulators per consumer thread");
  EXPECT_LE(T::kSmemBytes, size_t(232448));
  EXPECT_EQ(T::kSmemBytes, size_t(221 * 1024)) << "7 x 28 KiB of A/B + 24 KiB of C staging, barriers in the padding";
}

// The 64-column tile (opt-in, 2026-12-01): one 64-column sub-tile (128-byte swizzle), both B
// layouts, one wgmma of n = 64 per k-step (32 accumulators per consumer thread), 8 stages within
// the 227 KiB of a CTA: 8 x 24 KiB of A/B + 16 KiB of C staging.
TEST(GemmStoreSwizzle, N64TileMatchesCute) {
  using T = Traits<Bf16, 128, 64, 64, 8, true, 2, true>;
  using Tkn = Traits<Fp16, 128, 64, 64, 8, false, 1, true>;
  static_assert(T::kStoreCols == 64 && T::kStoreRowBytes == 128, "one 64-column box, 128-byte swizzle");
  check_staging_addresses<T>();
  check_staging_addresses<Tkn>();
  check_stmatrix_addresses<T>();
  static_assert(size<1>(typename MMA_Traits<typename T::MmaOp>::Shape_MNK{}) == 64, "wgmma n64");
  static_assert(size<1>(typename MMA_Traits<typename Tkn::MmaOp>::Shape_MNK{}) == 64, "wgmma n64 (B [K, N])");
  using Accum = decltype(partition_fragment_C(typename T::TiledMma{}, Shape<Int<128>, Int<64>>{}));
  static_assert(decltype(size(typename Accum::layout_type{}))::value == 32, "32 accumulators per consumer thread");
  EXPECT_LE(T::kSmemBytes, size_t(232448));
  EXPECT_LE(Tkn::kSmemBytes, size_t(232448));
}

// The 160- and 224-column tiles: 5 and 7 sub-tiles of 32 columns (64-byte swizzle) as 96, one
// wgmma of n = 160 / 224 per k-step (80 / 112 accumulators per consumer thread), within the 227
// KiB of a CTA: 5 x 36 KiB + 40 KiB and 3 x 44 KiB + 56 KiB.
TEST(GemmStoreSwizzle, N160N224TilesMatchCute) {
  using T160 = Traits<Bf16, 128, 160, 64, 5, true, 1, true>;
  using T224 = Traits<Fp16, 128, 224, 64, 3, true, 2, true>;
  static_assert(T160::kStoreCols == 32 && T224::kStoreCols == 32, "32-column boxes");
  check_staging_addresses<T160>();
  check_staging_addresses<Traits<Fp16, 128, 160, 64, 5, true, 2, true>>();
  check_staging_addresses<T224>();
  check_staging_addresses<Traits<Bf16, 128, 224, 64, 3, true, 1, true>>();
  static_assert(size<1>(typename MMA_Traits<typename T160::MmaOp>::Shape_MNK{}) == 160, "wgmma n160");
  static_assert(size<1>(typename MMA_Traits<typename T224::MmaOp>::Shape_MNK{}) == 224, "wgmma n224");
  using Accum160 = decltype(partition_fragment_C(typename T160::TiledMma{}, Shape<Int<128>, Int<160>>{}));
  using Accum224 = decltype(partition_fragment_C(typename T224::TiledMma{}, Shape<Int<128>, Int<224>>{}));
  static_assert(decltype(size(typename Accum160::layout_type{}))::value == 80, "80 accumulators per thread");
  static_assert(decltype(size(typename Accum224::layout_type{}))::value == 112, "112 accumulators per thread");
  EXPECT_LE(T160::kSmemBytes, size_t(232448));
  EXPECT_LE(T224::kSmemBytes, size_t(232448));
  EXPECT_GE(T160::kSmemBytes, size_t(220 * 1024));
  EXPECT_GE(T224::kSmemBytes, size_t(188 * 1024));
}

// The 48- and 80-column tiles (2026-12-01: the widths that make one wave of 128 tiles on the
// M = 1024 shapes with N = 768 and 1280, as cuBLASLt's tiles do there): 3 and 5 sub-tiles of 16
// columns (32-byte swizzle), one wgmma of n = 48 / 80 per k-step (24 / 40 accumulators per consumer
// thread), within the 227 KiB of a CTA: 9 x 22 KiB + 12 KiB and 7 x 26 KiB + 20 KiB.
TEST(GemmStoreSwizzle, N48N80TilesMatchCuteWith32ByteSwizzle) {
  using T48 = Traits<Bf16, 128, 48, 64, 9, true, 2, true>;
  using T80 = Traits<Fp16, 128, 80, 64, 7, true, 1, true>;
  static_assert(T48::kStoreCols == 16 && T48::kStoreRowBytes == 32, "16-column boxes, 32-byte swizzle");
  static_assert(T80::kStoreCols == 16 && T80::kStoreRowBytes == 32, "16-column boxes, 32-byte swizzle");
  check_staging_addresses<T48>();
  check_staging_addresses<Traits<Fp16, 128, 48, 64, 9, true, 1, true>>();
  check_staging_addresses<T80>();
  check_staging_addresses<Traits<Bf16, 128, 80, 64, 7, true, 2, true>>();
  check_stmatrix_addresses<T48>();
  check_stmatrix_addresses<T80>();
  static_assert(size<1>(typename MMA_Traits<typename T48::MmaOp>::Shape_MNK{}) == 48, "wgmma n48");
  static_assert(size<1>(typename MMA_Traits<typename T80::MmaOp>::Shape_MNK{}) == 80, "wgmma n80");
  using Accum48 = decltype(partition_fragment_C(typename T48::TiledMma{}, Shape<Int<128>, Int<48>>{}));
  using Accum80 = decltype(partition_fragment_C(typename T80::TiledMma{}, Shape<Int<128>, Int<80>>{}));
  static_assert(decltype(size(typename Accum48::layout_type{}))::value == 24, "24 accumulators per thread");
  static_assert(decltype(size(typename Accum80::layout_type{}))::value == 40, "40 accumulators per thread");
  EXPECT_LE(T48::kSmemBytes, size_t(232448));
  EXPECT_LE(T80::kSmemBytes, size_t(232448));
  EXPECT_GE(T48::kSmemBytes, size_t(9 * 22 * 1024 + 12 * 1024));
  EXPECT_GE(T80::kSmemBytes, size_t(7 * 26 * 1024 + 20 * 1024));
}

// Gathered A (Schedule::kGatherA): the producer warp's cp.async writes each 16-byte chunk of a row
// at gather_a_offset(row, chunk, stage); wgmma reads the stages through CuTe's SmemLayoutA. Every
// element of every stage must land where CuTe puts it, once.
template <class Traits>
void check_gather_a_addresses() {
  using E = typename Traits::Element;
  constexpr int kBM = Traits::kBlockM, kBK = Traits::kBlockK, kStages = Traits::kStages;
  SCOPED_TRACE(::testing::Message() << "A stages " << kBM << "x" << kBK << " x " << kStages);
  alignas(1024) static E buf[kBM * kBK * kStages];
  Tensor sA = make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutA{});
  const char* base = reinterpret_cast<const char*>(buf);
  std::vector<int> hits(size_t(kBM) * kBK * kStages, 0);
  for (int st = 0; st < kStages; ++st)
    for (int row = 0; row < kBM; ++row)
      for (int col = 0; col < kBK; ++col) {
        const int ours = gather_a_offset<kBM>(row, col / 8, st) + (col % 8) * int(sizeof(E));
        const auto cute = reinterpret_cast<const char*>(&sA(row, col, st)) - base;
        ASSERT_EQ(ours, cute) << "stage " << st << " row " << row << " col " << col;
        ++hits[size_t(ours) / sizeof(E)];
      }
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element slot " << i;
}

TEST(GemmStoreSwizzle, GatheredARowsMatchCute) {
  check_gather_a_addresses<Traits<Bf16, 128, 256, 64, 3, true, 1, true>>();
  check_gather_a_addresses<Traits<Bf16, 128, 256, 64, 4, false>>();
  check_gather_a_addresses<Traits<Fp16, 128, 128, 64, 5, true, 1, true>>();
}

// K-grouped tiles (Traits::kAMN, B [K, N]): zero_k_tail clears k-rows past a group's end as whole
// 128-byte lines, Traits::mn_major_line(slab, k) from each stage's start. Every element (mn, k) of
// each stage of A and of B must lie in the line of its 64-column slab mn / 64 and k-row k, and the
// lines of one stage must tile it exactly.
template <class T, class Layout>
void check_mn_major_lines(int extent, int stages) {
  using E = typename T::Element;
  constexpr int kBK = T::kBlockK;
  std::vector<E> storage(size_t(extent) * kBK * stages + 1024);
  E* buf = reinterpret_cast<E*>((reinterpret_cast<uintptr_t>(storage.data()) + 1023) / 1024 * 1024);
  Tensor s = make_tensor(make_smem_ptr(buf), Layout{});
  const char* base = reinterpret_cast<const char*>(buf);
  const int stage_bytes = extent * kBK * int(sizeof(E));
  std::vector<int> hits(size_t(extent) * kBK * stages, 0);
  for (int st = 0; st < stages; ++st)
    for (int mn = 0; mn < extent; ++mn)
      for (int k = 0; k < kBK; ++k) {
        const auto off = reinterpret_cast<const char*>(&s(mn, k, st)) - base;
        const int line = T::mn_major_line(mn / 64, k) + st * stage_bytes;
        ASSERT_GE(off, line) << "stage " << st << " mn " << mn << " k " << k;
        ASSERT_LT(off, line + 128) << "stage " << st << " mn " << mn << " k " << k;
        ++hits[size_t(off) / sizeof(E)];
      }
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element slot " << i;
}

TEST(GemmStoreSwizzle, KGroupedOperandLinesMatchCute) {
  using T = Traits<cutlass::bfloat16_t, 128, 256, 64, 3, false, 1, true, false, false, 0, true>;
  using Tn = Traits<cutlass::half_t, 128, 128, 64, 5, false, 1, true, false, false, 0, true>;
  static_assert(T::kMajorA == GMMA::Major::MN && T::kMajorB == GMMA::Major::MN, "A and B MN-major");
  check_mn_major_lines<T, typename T::SmemLayoutA>(128, 3);
  check_mn_major_lines<T, typename T::SmemLayoutB>(256, 3);
  check_mn_major_lines<Tn, typename Tn::SmemLayoutA>(128, 5);
  check_mn_major_lines<Tn, typename Tn::SmemLayoutB>(128, 5);
  EXPECT_LE(T::kSmemBytes, size_t(232448));
  EXPECT_LE(Tn::kSmemBytes, size_t(232448));
}

}  // namespace
}  // namespace ccfuse::gemm::sm90
