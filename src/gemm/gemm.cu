// Host side of the GEMM engine: validation, config choice, TMA descriptors, launch.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/warp_scan.cuh"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/gemm/sm90_gemm.cuh"
#include "src/common/driver_api.h"

namespace ccfuse::gemm {

namespace {

// One warp: the GroupedSchedule's prefix arrays (sm90::grouped_prefix_warp; one thread walking
// the groups paid an L2 round trip per group before the GEMM could start).
__global__ void grouped_prefix_kernel(const int* group_rows, int num_groups, int n_tiles, int block_m,
                                      int64_t max_rows, int* tile_prefix, int64_t* row_prefix, int* overflow) {
  if (threadIdx.x >= 32 || blockIdx.x != 0) return;
  sm90::grouped_prefix_warp([&](int g) { return group_rows[g]; }, num_groups, n_tiles, block_m, max_rows, tile_prefix,
                            row_prefix, overflow, int(threadIdx.x));
}

// The grouped forms' prefix arrays: [num_groups + 1] int64 row prefix, [num_groups + 1] int tile
// prefix, 16 bytes of slack; then (grouped_workspace_bytes) a 64-byte aligned tensor-map slot.
size_t grouped_prefix_bytes(int num_groups) { return size_t(num_groups + 1) * (sizeof(int64_t) + sizeof(int)) + 16; }
CUtensorMap* tensor_map_slot(void* workspace, int num_groups) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(workspace) + grouped_prefix_bytes(num_groups);
  return reinterpret_cast<CUtensorMap*>((at + 63) & ~uintptr_t(63));
}

// Copies a tensor map into global memory (one warp, 8 bytes a lane) and orders the writes before
// the tensor-map proxy's reads of it (the GEMM after it acquires it).
__global__ void store_tensor_map_kernel(const __grid_constant__ CUtensorMap map, CUtensorMap* dst) {
  const int i = int(threadIdx.x);
  if (i < int(sizeof(CUtensorMap) / 8))
    reinterpret_cast<uint64_t*>(dst)[i] = reinterpret_cast<const uint64_t*>(&map)[i];
  asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
}

// The accumulating K-grouped GEMM's TMA reduce-add map (sm90::AccumF32Epilogue::reduce_map): c32
// [groups * m, n] fp32 seen as [groups, m, n], so that a box's rows past its group's m are clipped
// there; box [1, 64, 32] (one consumer warpgroup's rows, 128-byte rows), 128-byte swizzle.
CUtensorMap make_accum_reduce_map(float* c32, int groups, int64_t m, int64_t n) {
  using Epi = sm90::AccumF32Epilogue;
  static const auto encode = CCFUSE_DRIVER_FN(cuTensorMapEncodeTiled, true);
  CUtensorMap map{};
  const cuuint64_t dims[3] = {cuuint64_t(n), cuuint64_t(m), cuuint64_t(groups)};
  const cuuint64_t strides[2] = {cuuint64_t(n) * sizeof(float), cuuint64_t(m) * cuuint64_t(n) * sizeof(float)};
  const cuuint32_t box[3] = {Epi::kReduceCols, Epi::kReduceRows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  detail::driver_check(encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, c32, dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                       "cuTensorMapEncodeTiled (the accumulating K-grouped GEMM's fp32 C)");
  return map;
}


int64_t lda_of(const GemmDesc& d) { return d.lda ? d.lda : d.k; }
int64_t ldb_of(const GemmDesc& d) { return d.ldb ? d.ldb : (d.b_layout == BLayout::kKN ? d.n : d.k); }
int64_t ldc_of(const GemmDesc& d) { return d.ldc ? d.ldc : d.n; }

// The tile shapes the engine is built for: (block_m, block_n, block_k, stages).
struct TileShape {
  int block_m, block_n, block_k, stages;
};
constexpr TileShape kTileShapes[] = {{128, 256, 64, 4}, {128, 128, 64, 6}};
// With the TMA-store epilogue (its 64 KiB staging buffer leaves room for 3 stages).
constexpr TileShape kTmaStoreShape = {128, 256, 64, 3};
// The narrow TMA-store tile: twice the tiles of 128x256 where those fill the SMs badly, each
// without the register epilogue's ~5.7 us (measured 2026-11-30: +5-12 points of cuBLASLt on the
// shapes with >= 2 waves of tiles). 5 stages: 5 x 32 KiB of A/B + 32 KiB of C staging.
constexpr TileShape kTmaStoreNarrowShape = {128, 128, 64, 5};
// The 192-column TMA-store tile, for problems whose 128- and 256-column tiles fill the waves badly
// (cuBLASLt shapes its tiles to the wave there). 4 stages: 4 x 40 KiB of A/B + 48 KiB of C
// staging. Measured 2026-11-30 against the chosen tile: 1024x3072x4096 80 -> 98 %, 4096x768x4096
// 80 -> 98 %, 1024x2560x8192 69 -> 92 % of cuBLASLt; 8192x14336x8192 100 -> 109 %; half a wave
// (1024x1536x4096) 79 -> 60 %.
constexpr TileShape kTmaStoreN192Shape = {128, 192, 64, 4};
// Ping-pong on 128x128 with 6 stages (written and measured 2026-12-02; choose_config's ping-pong
// tile since, see choose_plain): each warpgroup
// stages its tile through one 128x64 sub-tile slot (sm90::Traits::kStagingRing = 1) instead of a
// whole tile, which frees a stage's 32 KiB: 6 x 32 KiB of A/B + 2 x 16 KiB of C staging.
constexpr TileShape kPingpongRingShape = {128, 128, 64, 6};
// Ping-pong on 128x160 with 5 stages (the same day; cuBLASLt's kernel for 16384x4096x512, and
// choose_config's for K <= 512 with >= 10 waves of its tiles):
// a ring of two 128x32 sub-tile slots a warpgroup, 5 x 36 KiB of A/B + 2 x 16 KiB = 212 KiB. B [N,
// K] only (as the 160 tile), CTAs unpaired. (With whole-tile staging it had 4 stages and ran
// 0.5-10 points below 128x128 ping-pong, 2026-12-01.)
constexpr TileShape kPingpongRing160Shape = {128, 160, 64, 5};
// Grouped problems take the 128x128 ping-pong ring from this N (choose_plain).
constexpr int64_t kGroupedPingpongMinN = 4096;
// The 96-column TMA-store tile (choose_config picks it for one-wave B [N, K] problems where it
// fills the wave much better, since 2026-11-30 12:40): for one-wave problems
// where cuBLASLt takes 96- or 80-column tiles. 7 stages: 7 x 28 KiB of A/B + 24 KiB of C staging
// (32-column TMA boxes, 64-byte swizzle) = 221 KiB. B [N, K] only: B [K, N] is loaded in
// 64-column swizzle atoms. Measured 2026-11-30: 1024x1280x8192 70 -> 82 % of cuBLASLt, but
// 1024x1536x4096 86 -> 83 % (81.8 against the 128 tile's 78.5 in other runs: a tie within the
// runs' spread) and ~0.8 of the wide tile's speed per FLOP elsewhere (4096^3: 81 %).
constexpr TileShape kTmaStoreN96Shape = {128, 96, 64, 7};
// The 160- and 224-column TMA-store tiles (B [N, K] only, 32-column TMA boxes with the 64-byte
// swizzle, as 128x96): the widths cuBLASLt shapes to the wave where 128-, 192- and 256-column
// tiles leave a wave mostly empty (2026-11-30 sweep v11: 4096x1280x8192 and 1024x5120x8192 run
// 224 tiles of 128x192 in two waves, cuBLASLt 128 of 128x320; 1024x3584x4096 runs 112 tiles of
// 128x256, cuBLASLt 256 of 128x112). 160: 5 x 36 KiB of A/B + 40 KiB of C staging = 220 KiB;
// 224: 3 x 44 KiB + 56 KiB = 188 KiB (4 stages would need 232 KiB). choose_config's prices for
// them: below.
constexpr TileShape kTmaStoreN160Shape = {128, 160, 64, 5};
// The 64-column TMA-store tile (written 2026-12-01, opt-in: not measured yet, so choose_config
// does not take it): cuBLASLt's tile on our slowest one-wave shape (1024x768x4096: 96 tiles of
// 128x64, docs/gemm.md item 8), where we cut 128x128 tiles along K instead. One 128-byte swizzle
// box per operand row and per store sub-tile, so both B layouts. 8 stages: 8 x 24 KiB of A/B +
// 16 KiB of C staging = 208 KiB.
constexpr TileShape kTmaStoreN64Shape = {128, 64, 64, 8};
constexpr TileShape kTmaStoreN224Shape = {128, 224, 64, 3};
// The 80- and 48-column TMA-store tiles (2026-12-01; B [N, K] only, 16-column TMA boxes with the
// 32-byte swizzle): on the M = 1024 shapes with N = 1280 and 768 they make one wave of 128 tiles,
// as cuBLASLt's tiles do there (its 80x128 and 64x96), where our 96- and 64-column tiles make 112
// and 96 tiles that each do 1.2x and 1.33x the work (we ran at 85 and 86 % of cuBLASLt, about
// those ratios). Measured: below, at their price. 80: 7 x 26 KiB of A/B + 20 KiB of C staging =
// 202 KiB; 48: 9 x 22 KiB + 12 KiB = 210 KiB.
constexpr TileShape kTmaStoreN80Shape = {128, 80, 64, 7};
constexpr TileShape kTmaStoreN48Shape = {128, 48, 64, 9};

template <class Traits>
void launch(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, cudaStream_t stream) {
  const auto sched = sm90::plain_schedule(d.m, d.n, cfg.block_m, cfg.block_n, cfg.group_m,
                                          cfg.order == TileOrder::kColumnMajor);
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  if constexpr (Traits::kPairN) {  // the pairs' direction is the kernel's (which operand it multicasts)
    sm90::launch_gemm<Traits>(d.m, d.n, d.k, a, lda_of(d), b, ldb_of(d), c, ldc_of(d), sm90::PairNSchedule{sched},
                              sm90::PlainEpilogue{}, sms, stream);
  } else {
    sm90::launch_gemm<Traits>(d.m, d.n, d.k, a, lda_of(d), b, ldb_of(d), c, ldc_of(d), sched, sm90::PlainEpilogue{},
                              sms, stream);
  }
}

template <class Traits>
void launch_grouped(const GroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                    const int* group_rows, void* workspace, int* overflow, cudaStream_t stream) {
  sm90::GroupedSchedule sched;
  sched.num_groups = d.num_groups;
  sched.n_tiles = int(ceil_div(d.n, cfg.block_n));
  sched.block_m = cfg.block_m;
  sched.group_m = cfg.group_m;
  sched.tile_bound = (ceil_div(d.max_rows, cfg.block_m) + d.num_groups) * sched.n_tiles;
  auto* row_prefix = static_cast<int64_t*>(workspace);
  auto* tile_prefix = reinterpret_cast<int*>(row_prefix + d.num_groups + 1);
  sched.row_prefix = row_prefix;
  sched.tile_prefix = tile_prefix;
  grouped_prefix_kernel<<<1, 32, 0, stream>>>(group_rows, d.num_groups, sched.n_tiles, cfg.block_m, d.max_rows,
                                              tile_prefix, row_prefix, overflow);
  CCFUSE_CUDA_CHECK_LAUNCH();
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  const int64_t ldb = d.b_layout == BLayout::kKN ? d.n : d.k;
  sm90::launch_gemm<Traits>(d.max_rows, d.n, d.k, a, d.k, b, ldb, c, d.n, sched, sm90::PlainEpilogue{}, sms, stream,
                            d.num_groups, d.n * d.k);
}

template <class E, int BM, int BN, int BK, int S, bool kTma = false, bool kPingpong = false, int kRing = 0>
void grouped_layout(const GroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                    const int* rows, void* ws, int* overflow, cudaStream_t s) {
  if (d.b_layout == BLayout::kNK)
    launch_grouped<sm90::Traits<E, BM, BN, BK, S, true, 1, kTma, kPingpong, false, kRing>>(d, cfg, a, b, c, rows, ws,
                                                                                         overflow, s);
  else
    launch_grouped<sm90::Traits<E, BM, BN, BK, S, false, 1, kTma, kPingpong, false, kRing>>(d, cfg, a, b, c, rows, ws,
                                                                                          overflow, s);
}

// The grouped GEMM's tile shapes, per dtype (the TMA-store epilogue: the default where C's rows are 16-byte aligned).
template <class E>
void grouped_dtype(const GroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                   const int* rows, void* ws, int* overflow, cudaStream_t s) {
  if (cfg.pingpong)  // validate: the 128x128x64/6 ring only
    grouped_layout<E, 128, 128, 64, kPingpongRingShape.stages, true, true, 1>(d, cfg, a, b, c, rows, ws, overflow, s);
  else if (cfg.tma_store && cfg.block_n == 256) grouped_layout<E, 128, 256, 64, 3, true>(d, cfg, a, b, c, rows, ws, overflow, s);
  else if (cfg.tma_store) grouped_layout<E, 128, 128, 64, 5, true>(d, cfg, a, b, c, rows, ws, overflow, s);
  else if (cfg.block_n == 256) grouped_layout<E, 128, 256, 64, 4>(d, cfg, a, b, c, rows, ws, overflow, s);
  else grouped_layout<E, 128, 128, 64, 6>(d, cfg, a, b, c, rows, ws, overflow, s);
}

// Split-K or stream-K (KPartSchedule): tiles cut along K, summed inside the kernel through the
// workspace [partials | counters] (kpart_schedule below).
sm90::KPartSchedule kpart_schedule(const GemmDesc& d, const GemmConfig& cfg, int sms) {
  const auto base = sm90::plain_schedule(d.m, d.n, cfg.block_m, cfg.block_n, cfg.group_m,
                                         cfg.order == TileOrder::kColumnMajor);
  const int k_tiles = int(ceil_div(d.k, cfg.block_k));
  return cfg.stream_k ? sm90::stream_k_schedule(base, k_tiles, sms) : sm90::split_k_schedule(base, k_tiles, cfg.split_k);
}
size_t kpart_partial_bytes(const sm90::KPartSchedule& s, const GemmConfig& cfg) {
  return size_t(s.fixup_slots()) * size_t(cfg.block_m) * size_t(cfg.block_n) * sizeof(float);
}
// Where a launch's partials and tile counters live.
struct Fixup {
  float* partials = nullptr;
  int* counters = nullptr;
};

template <class Traits>
void launch_kparts(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, const Fixup& fx,
                   cudaStream_t stream) {
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  sm90::KPartSchedule sched = kpart_schedule(d, cfg, sms);
  sched.partials = fx.partials;
  sched.counters = fx.counters;
  static const int diag = [] {
    const char* v = std::getenv("CCFUSE_GEMM_KPART_DIAG");  // diagnostics only (KPartSchedule::diag)
    return v != nullptr ? std::atoi(v) : 0;
  }();
  sched.diag = diag;
  // Stream-K's unit -> CTA map assumes exactly sched.sk.ctas CTAs.
  sm90::launch_gemm<Traits>(d.m, d.n, d.k, a, lda_of(d), b, ldb_of(d), c, ldc_of(d), sched, sm90::PlainEpilogue{},
                            cfg.stream_k ? sched.sk.ctas : sms, stream);
}

template <class E, int BM, int BN, int BK, int S, bool kTma = false>
void launch_kparts_layout(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                          const Fixup& ws, cudaStream_t s) {
  if (d.b_layout == BLayout::kNK) launch_kparts<sm90::Traits<E, BM, BN, BK, S, true, 1, kTma>>(d, cfg, a, b, c, ws, s);
  else launch_kparts<sm90::Traits<E, BM, BN, BK, S, false, 1, kTma>>(d, cfg, a, b, c, ws, s);
}

template <class E, int BM, int BN, int BK, int S, bool kTma, bool kBNK, bool kPingpong, int kRing = 0>
void launch_cluster(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, cudaStream_t s) {
  if (cfg.cluster_n == 2) {
    // Pairs along N: built for the narrow TMA-store tiles only (validate says so first).
    if constexpr (kTma && !kPingpong && (BN == 128 || BN == 96)) {
      launch<sm90::Traits<E, BM, BN, BK, S, kBNK, 2, kTma, false, true>>(d, cfg, a, b, c, s);
    } else {
      CCFUSE_ARG_CHECK(false, "cluster_n 2 is not built for the ", BM, "x", BN, " tile");
    }
  } else if (cfg.cluster_m == 2) {
    if constexpr (kPingpong && BN != 128) {
      CCFUSE_ARG_CHECK(false, "pingpong on the ", BM, "x", BN, " tile is built with cluster_m 1");  // validate first
    } else {
      launch<sm90::Traits<E, BM, BN, BK, S, kBNK, 2, kTma, kPingpong, false, kRing>>(d, cfg, a, b, c, s);
    }
  } else {
    launch<sm90::Traits<E, BM, BN, BK, S, kBNK, 1, kTma, kPingpong, false, kRing>>(d, cfg, a, b, c, s);
  }
}

template <class E, int BM, int BN, int BK, int S, bool kTma = false, bool kPingpong = false, int kRing = 0>
void launch_layout(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, cudaStream_t s) {
  if (d.b_layout == BLayout::kNK) {
    launch_cluster<E, BM, BN, BK, S, kTma, true, kPingpong, kRing>(d, cfg, a, b, c, s);
  } else if constexpr (BN % 64 == 0) {
    launch_cluster<E, BM, BN, BK, S, kTma, false, kPingpong, kRing>(d, cfg, a, b, c, s);
  } else {
    // B [K, N]'s 64-column swizzle atoms do not tile BN: not built (validate says so first).
    CCFUSE_ARG_CHECK(false, "tile ", BM, "x", BN, " is built for B [N, K] (b_layout nk) only");
  }
}

template <class E>
void launch_dtype(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, const Fixup& ws,
                  cudaStream_t s) {
  if (cfg.split_k > 1 || cfg.stream_k) {
    if (cfg.tma_store) launch_kparts_layout<E, 128, 128, 64, 5, true>(d, cfg, a, b, c, ws, s);
    else if (cfg.block_n == 256) launch_kparts_layout<E, 128, 256, 64, 4>(d, cfg, a, b, c, ws, s);
    else launch_kparts_layout<E, 128, 128, 64, 6>(d, cfg, a, b, c, ws, s);
  } else if (cfg.pingpong && cfg.block_n == 160) {
    launch_layout<E, 128, 160, 64, kPingpongRing160Shape.stages, true, true, 2>(d, cfg, a, b, c, s);
  } else if (cfg.pingpong && cfg.stages == kPingpongRingShape.stages) {
    launch_layout<E, 128, 128, 64, kPingpongRingShape.stages, true, true, 1>(d, cfg, a, b, c, s);
  } else if (cfg.pingpong) launch_layout<E, 128, 128, 64, 5, true, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 128) launch_layout<E, 128, 128, 64, 5, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 192) launch_layout<E, 128, 192, 64, 4, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 96)
    launch_layout<E, 128, 96, 64, kTmaStoreN96Shape.stages, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 64)
    launch_layout<E, 128, 64, 64, kTmaStoreN64Shape.stages, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 160)
    launch_layout<E, 128, 160, 64, kTmaStoreN160Shape.stages, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 224)
    launch_layout<E, 128, 224, 64, kTmaStoreN224Shape.stages, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 80)
    launch_layout<E, 128, 80, 64, kTmaStoreN80Shape.stages, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store && cfg.block_n == 48)
    launch_layout<E, 128, 48, 64, kTmaStoreN48Shape.stages, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store) launch_layout<E, 128, 256, 64, 3, true>(d, cfg, a, b, c, s);
  else if (cfg.block_n == 256) launch_layout<E, 128, 256, 64, 4>(d, cfg, a, b, c, s);
  else launch_layout<E, 128, 128, 64, 6>(d, cfg, a, b, c, s);
}

}  // namespace

int current_device_sms() {
  // The current context's SMs: in a green context (a one-GPU world's rank, or a caller's own
  // partition) persistent grids must fit its share, or CTAs that wait on each other deadlock.
  static const auto get_current = CCFUSE_DRIVER_FN(cuCtxGetCurrent, false);
  static const auto get_resource = CCFUSE_DRIVER_FN(cuCtxGetDevResource, false);
  // Per thread, by context: a launch asks several times (a rank thread of a one-GPU world is
  // new for every world, so a context handle reused by the driver is not mistaken for another).
  thread_local CUcontext cached_ctx = nullptr;
  thread_local int cached_sms = 0;
  CUcontext ctx = nullptr;
  if (get_current && get_resource && get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) {
    if (ctx == cached_ctx) return cached_sms;
    CUdevResource res{};
    if (get_resource(ctx, &res, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS && res.sm.smCount > 0) {
      cached_ctx = ctx;
      cached_sms = int(res.sm.smCount);
      return cached_sms;
    }
  }
  int dev = 0, sms = 0;
  CCFUSE_CUDA_CHECK(cudaGetDevice(&dev));
  CCFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

void validate(const GemmDesc& d, const GemmConfig& cfg) {
  CCFUSE_ARG_CHECK(d.m > 0, "m ", d.m, " must be positive");
  CCFUSE_ARG_CHECK(d.n > 0, "n ", d.n, " must be positive");
  CCFUSE_ARG_CHECK(d.k > 0, "k ", d.k, " must be positive");
  constexpr int64_t kMaxDim = (int64_t(1) << 31) - 1;
  CCFUSE_ARG_CHECK(d.m <= kMaxDim && d.n <= kMaxDim && d.k <= kMaxDim,
                   "m, n, k must each be below 2^31 (TMA coordinates are 32-bit)");
  CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16 || d.dtype == DType::kFloat16, "dtype ", dtype_name(d.dtype),
                   " is not supported by the GEMM engine (bf16, fp16)");
  // TMA: every global stride but the innermost must be a multiple of 16 bytes.
  const int64_t align = 16 / dtype_size(d.dtype);
  const int64_t lda = lda_of(d), ldb = ldb_of(d), ldc = ldc_of(d);
  CCFUSE_ARG_CHECK(lda >= d.k, "lda ", lda, " must be at least k ", d.k);
  CCFUSE_ARG_CHECK(lda % align == 0, d.lda ? "lda " : "k ", lda, " must be a multiple of ", align, " for ",
                   dtype_name(d.dtype), " (TMA needs 16-byte aligned rows of A)");
  const int64_t b_row = d.b_layout == BLayout::kKN ? d.n : d.k;
  CCFUSE_ARG_CHECK(ldb >= b_row, "ldb ", ldb, " must be at least ", b_row);
  CCFUSE_ARG_CHECK(ldb % align == 0, d.ldb ? "ldb " : (d.b_layout == BLayout::kKN ? "n " : "k "), ldb,
                   " must be a multiple of ", align, " for ", dtype_name(d.dtype), " (TMA needs 16-byte aligned rows of B [",
                   d.b_layout == BLayout::kKN ? "K, N" : "N, K", "])");
  CCFUSE_ARG_CHECK(ldc >= d.n, "ldc ", ldc, " must be at least n ", d.n);
  bool known = false;
  auto same = [&](const TileShape& t) {
    return t.block_m == cfg.block_m && t.block_n == cfg.block_n && t.block_k == cfg.block_k && t.stages == cfg.stages;
  };
  if (cfg.tma_store) {
    known = same(kTmaStoreShape) || same(kTmaStoreNarrowShape) || same(kTmaStoreN192Shape) ||
            same(kTmaStoreN96Shape) || same(kTmaStoreN160Shape) || same(kTmaStoreN224Shape) ||
            same(kTmaStoreN64Shape) || same(kTmaStoreN80Shape) || same(kTmaStoreN48Shape) ||
            (cfg.pingpong && (same(kPingpongRingShape) || same(kPingpongRing160Shape)));
    CCFUSE_ARG_CHECK(known, "tile ", cfg.block_m, "x", cfg.block_n, "x", cfg.block_k, " with ", cfg.stages,
                     " stages is not built with tma_store (built: 128x256x64/3, 128x224x64/3, 128x192x64/4, "
                     "128x160x64/5, 128x128x64/5, 128x96x64/7, 128x80x64/7, 128x64x64/8, 128x48x64/9)");
    // B [K, N] is loaded in swizzle atoms 64 columns wide (sm90::Traits::SmemLayoutB).
    CCFUSE_ARG_CHECK(cfg.block_n % 64 == 0 || d.b_layout == BLayout::kNK, "tile ", cfg.block_m, "x", cfg.block_n,
                     " needs B [N, K] (b_layout nk): B [K, N] is loaded in 64-column swizzle atoms, which do not "
                     "tile ", cfg.block_n, " columns");
    CCFUSE_ARG_CHECK(ldc % align == 0, "ldc ", ldc, " must be a multiple of ", align, " for ", dtype_name(d.dtype),
                     " with tma_store (TMA stores 16-byte aligned rows of C)");
  } else {
    for (const auto& t : kTileShapes) known |= same(t);
    CCFUSE_ARG_CHECK(known, "tile ", cfg.block_m, "x", cfg.block_n, "x", cfg.block_k, " with ", cfg.stages,
                     " stages is not built (built: 128x256x64/4, 128x128x64/6)");
  }
  CCFUSE_ARG_CHECK(cfg.num_sms >= 0, "num_sms ", cfg.num_sms, " must not be negative");
  CCFUSE_ARG_CHECK(cfg.group_m >= 1, "group_m ", cfg.group_m, " must be at least 1");
  CCFUSE_ARG_CHECK(cfg.cluster_m == 1 || cfg.cluster_m == 2, "cluster_m ", cfg.cluster_m, " must be 1 or 2");
  const int64_t k_blocks = ceil_div(d.k, cfg.block_k);
  CCFUSE_ARG_CHECK(cfg.split_k >= 1 && cfg.split_k <= 16 && cfg.split_k <= k_blocks, "split_k ", cfg.split_k,
                   " must be in [1, min(16, k / block_k = ", k_blocks, ")]");
  CCFUSE_ARG_CHECK(!(cfg.split_k > 1 && cfg.stream_k), "split_k ", cfg.split_k, " and stream_k exclude each other");
  const bool cut = cfg.split_k > 1 || cfg.stream_k;
  CCFUSE_ARG_CHECK(!cut || cfg.cluster_m == 1, cfg.stream_k ? "stream_k" : "split_k > 1", " is built with cluster_m 1, not ",
                   cfg.cluster_m);
  // Split-K on the 128x256 and 128x192 TMA-store tiles was built and measured slower than the
  // chosen whole tiles on the one-wave shapes it was for (2026-11-30 14:35, docs/perf-notes.md):
  // the last part reads every other part's wider fp32 partial alone.
  CCFUSE_ARG_CHECK(!cut || !cfg.tma_store || cfg.block_n == 128, cfg.stream_k ? "stream_k" : "split_k > 1",
                   " with tma_store is built for the 128x128x64/5 tile");
  CCFUSE_ARG_CHECK(!cfg.pingpong || cfg.block_n == 128 || cfg.cluster_m == 1, "pingpong on the ", cfg.block_m, "x",
                   cfg.block_n, " tile is built with cluster_m 1, not ", cfg.cluster_m);
  CCFUSE_ARG_CHECK(!cfg.pingpong || (cfg.tma_store && (same(kTmaStoreNarrowShape) || same(kPingpongRingShape) ||
                                                       same(kPingpongRing160Shape)) && !cut),
                   "pingpong is built for whole tiles of the 128x128x64/5, 128x128x64/6 and 128x160x64/5 tiles "
                   "with tma_store, not ", cfg.block_m, "x", cfg.block_n, "x",
                   cfg.block_k, "/", cfg.stages, cfg.tma_store ? "" : " without tma_store",
                   cut ? (cfg.stream_k ? " with stream_k" : " with split_k") : "");
  CCFUSE_ARG_CHECK(cfg.cluster_n == 1 || cfg.cluster_n == 2, "cluster_n ", cfg.cluster_n, " must be 1 or 2");
  CCFUSE_ARG_CHECK(cfg.cluster_n == 1 || cfg.cluster_m == 1, "cluster_n 2 with cluster_m 2 (2x2 clusters) is not built");
  CCFUSE_ARG_CHECK(cfg.cluster_n == 1 || (cfg.tma_store && (same(kTmaStoreNarrowShape) || same(kTmaStoreN96Shape)) &&
                                          !cut && !cfg.pingpong),
                   "cluster_n 2 is built for whole tiles of the 128x128x64/5 and 128x96x64/7 tiles with tma_store, "
                   "not ", cfg.block_m, "x", cfg.block_n, "x", cfg.block_k, "/", cfg.stages,
                   cfg.tma_store ? "" : " without tma_store", cut ? (cfg.stream_k ? " with stream_k" : " with split_k") : "",
                   cfg.pingpong ? " with pingpong" : "");
}

namespace {
constexpr bool kPickStreamK = false;

GemmConfig choose_plain(const GemmDesc& d, int num_sms, bool grouped, double mem_gbps = 0) {
  // Time model in k-blocks of a 128x128 tile at full speed, per CTA of a persistent grid of
  // `sms` CTAs (docs/gemm.md, "choosing a config"):
  //   whole tiles   ceil(tiles / sms) waves x k_tiles x (block_n / 128) / efficiency
  //   stream-K      (whole-tile waves x k_tiles + ceil(cut iterations / CTAs) + fixup) / efficiency
  // Efficiencies measured against each other (docs/perf-notes.md): with the TMA-store epilogue
  // 128x256 1.0, 128x128 0.96 (2026-11-30: 93-97 % of cuBLASLt where its tiles fill the SMs) and
  // 128x192 0.99 (1.03 until 2026-12-01, from 0.92-1.10 of the model's wide-tile time on 8 shapes
  // timed interleaved with cuBLASLt; back to back at the 700 W power cap, the way a training step
  // runs, the 192 tile moves 17 % more bytes from L2 per FLOP and costs power: the sweep's
  // 192-tile rows fell from 96.7 to 93.1 % of cuBLASLt there while the 256-tile rows held 95 %, and
  // forced to 128x256 the multi-wave 192 shapes ran 0.95-1.00x the time at the cap and level
  // interleaved, bench/results/2026-12-01-h200-gemm-*-35d7187*); with the register epilogue (ldc not
  // 16-byte aligned) 128x128 at 0.92 of 128x256. A cut tile's fixup (its partials through L2,
  // the last part's sum) is priced at 4 k-blocks, and stream-K would have to win by 5 % over
  // whole tiles to be chosen; it is not chosen at all while it measures slower (kPickStreamK).
  const int sms = num_sms > 0 ? num_sms : current_device_sms();
  // Grouped GEMMs: the TMA-store epilogue on 128x256 and 128x128 (a group's cut last tile from
  // registers; measured 2026-11-30: 100.4 -> 115.8 % of the best of cuBLAS grouped and torch
  // over the 37 MoE cases), no 192 tile, no split-K or stream-K; 128x128 at 0.88 of 128x256 (the
  // rule they were measured with).
  const bool tma_ok = ldc_of(d) % (16 / dtype_size(d.dtype)) == 0;
  const int64_t k_tiles = ceil_div(d.k, 64);
  struct Option {
    TileShape t;
    bool tma, stream;
    double time;
  };
  auto waves = [&](int64_t tiles) { return double(ceil_div(tiles, int64_t(sms))); };
  auto tiles_of = [&](const TileShape& t) { return ceil_div(d.m, t.block_m) * ceil_div(d.n, t.block_n); };
  const TileShape wide = tma_ok ? kTmaStoreShape : kTileShapes[0];
  const TileShape narrow = tma_ok ? kTmaStoreNarrowShape : kTileShapes[1];
  // Relative to the wide tile of the same epilogue (what each rule was measured with).
  const double eff_wide = 1.0, eff_narrow = grouped ? 0.88 : (tma_ok ? 0.96 : 0.92), eff_192 = 0.99,
               eff_96 = 0.81, eff_160 = 0.97, eff_224 = 0.98, eff_64 = 0.67, eff_80 = 0.72, eff_48 = 0.51;
  Option best{wide, tma_ok, false, waves(tiles_of(wide)) * double(k_tiles) * 2.0 / eff_wide};
  const Option whole_narrow{narrow, tma_ok, false, waves(tiles_of(narrow)) * double(k_tiles) / eff_narrow};
  if (whole_narrow.time < best.time * (1 - 1e-9)) best = whole_narrow;
  if (tma_ok && !grouped) {
    const Option whole_192{kTmaStoreN192Shape, true, false,
                           waves(tiles_of(kTmaStoreN192Shape)) * double(k_tiles) * 1.5 / eff_192};
    if (whole_192.time < best.time * (1 - 1e-9)) best = whole_192;
    // The 128x96 tile (B [N, K] only) at 0.81 of the wide tile per FLOP (4096^3 in CTA pairs:
    // 78.8 against 96.8 % of cuBLASLt, 2026-11-30 12:30; 0.82 in the first run): it wins only
    // where its tiles fill a wave that the wider tiles leave mostly empty (1024x1280x8192: 112
    // tiles against 80; measured 70 -> 81-82 % of cuBLASLt in two runs).
    if (d.b_layout == BLayout::kNK) {
      const Option whole_96{kTmaStoreN96Shape, true, false,
                            waves(tiles_of(kTmaStoreN96Shape)) * double(k_tiles) * 0.75 / eff_96};
      if (whole_96.time < best.time * (1 - 1e-9)) best = whole_96;
      // The 160- and 224-column tiles (B [N, K] only). Measured 2026-11-30 14:35-14:50: forced on
      // 4096^3 and 8192^3 they run at ~1.0 of the wide tile per FLOP in the model's terms, and on
      // multi-wave shapes 160 beats 192 by 0.2-2 % and 128 by 3-4 % but loses 1-3 % to 256, 224
      // loses 1.5-3 % to 256. Priced at 0.97 and 0.98 they are picked where they fill the waves
      // (4096x1280x8192, 1024x5120x8192 84 -> 98 % of cuBLASLt; 1024x2560x8192 89 -> 101 %;
      // 1024x7168x8192 92 -> 98 %; 1024x3584x4096 87 -> 90 %) and on two multi-wave shapes
      // against 128 (8192x1280x8192 94 -> 98 %), never against 256 on multi-wave shapes.
      const Option whole_160{kTmaStoreN160Shape, true, false,
                             waves(tiles_of(kTmaStoreN160Shape)) * double(k_tiles) * 1.25 / eff_160};
      if (whole_160.time < best.time * (1 - 1e-9)) best = whole_160;
      const Option whole_224{kTmaStoreN224Shape, true, false,
                             waves(tiles_of(kTmaStoreN224Shape)) * double(k_tiles) * 1.75 / eff_224};
      if (whole_224.time < best.time * (1 - 1e-9)) best = whole_224;
      // The 80- and 48-column tiles (B [N, K] only), priced from the same call (2026-12-01 10:57,
      // one H200). 80 at 0.72: 1024x1280x8192 ran at 0.93-0.96 of the 96 tile's time (4096^3 forced
      // to it: 0.73 of the wide tile's speed). 48 at 0.51: its speed on 4096^3, and the price that
      // keeps split-K on 1024x768x8192 (4 % faster than the 48 tile back to back there) while
      // taking 1024x768x4096 from the 64 tile (0.89-0.94 of its time). They are for one wave that
      // the wider tiles fill with fewer, bigger tiles (85 -> 89-91 % and 82-86 -> 87-91 % of
      // cuBLASLt interleaved; 89 -> 93 % and 86 -> 91.5 % back to back); where they need more
      // waves they lose 10-40 points (2048x1280x8192: 79 and 44 against the 160 tile's 99 %).
      const Option whole_80{kTmaStoreN80Shape, true, false,
                            waves(tiles_of(kTmaStoreN80Shape)) * double(k_tiles) * 0.625 / eff_80};
      if (whole_80.time < best.time * (1 - 1e-9)) best = whole_80;
      const Option whole_48{kTmaStoreN48Shape, true, false,
                            waves(tiles_of(kTmaStoreN48Shape)) * double(k_tiles) * 0.375 / eff_48};
      if (whole_48.time < best.time * (1 - 1e-9)) best = whole_48;
    }
    // The 128x64 tile (both B layouts) at 0.67 of the wide tile per FLOP: what it measured in one
    // wave against split-K in 2 of 128x128 (2026-12-01, pairs and groups of 4 row tiles, one
    // H200: 0.64 on 1024x768x4096, where it wins by 6-8 %, and 0.70-0.71 on 1024x768x8192, where
    // split-K wins by 3 % back to back). Where it needs two waves it loses 8-34 points (2048x768x4096:
    // 54 against the 96 tile's 74 %), which the price keeps it from.
    const Option whole_64{kTmaStoreN64Shape, true, false,
                          waves(tiles_of(kTmaStoreN64Shape)) * double(k_tiles) * 0.5 / eff_64};
    if (whole_64.time < best.time * (1 - 1e-9)) best = whole_64;
    // Short K where the wide tile makes one wave: the 128x128 tile in two waves instead, when they
    // are enough (measured twice on 1024x4096x512 and x1024, 2026-11-30 and 2026-12-01: +1.8 to
    // +3.8 points of cuBLASLt, which takes 128x128 there too; with more waves of the wide tile the
    // 128x128 tile loses 3.5-6 points at K = 512, so the rule is kept to one wave).
    if (best.t.block_n == wide.block_n && k_tiles <= 16 && tiles_of(wide) <= sms && tiles_of(narrow) <= 2 * sms)
      best = whole_narrow;
  }
  if (tma_ok && !grouped && k_tiles >= 4) {
    const StreamKPlan sk = make_stream_k_plan(tiles_of(narrow), int(k_tiles), sms);
    constexpr double kFixup = 4.0;
    const double iters = double(sk.dp_tiles / sms) * double(k_tiles) +
                         double(ceil_div(sk.iters(), int64_t(sk.ctas))) + kFixup;
    const Option stream{narrow, true, true, iters / eff_narrow};
    // Not chosen: measured 15 % slower than whole tiles on the 11 shapes this model picked it
    // for, and as slow without its fixup: its CTAs run different tiles at different k offsets,
    // unclustered, and lose the L2 reuse and B multicast of whole tiles (2026-11-30,
    // docs/perf-notes.md). Kept for the A/B (kPickStreamK) until it is faster.
    if (kPickStreamK && stream.time < 0.95 * best.time) best = stream;
  }
  // Split-K in 2 parts on the narrow TMA-store tile where twice its tiles still fit in one wave:
  // half the k-blocks per CTA, plus ~20 k-blocks of fixup and second prologue (measured
  // 2026-11-30 on 1024x768x4096: 26.7 -> 21.9 us, 62 -> 78 % of cuBLASLt; in 3 parts, or where
  // the parts take two waves, slower than whole tiles).
  bool split2 = false;
  if (tma_ok && !grouped && 2 * tiles_of(narrow) <= sms && k_tiles >= 32) {
    const double t = (double(ceil_div(k_tiles, 2)) + 20.0) / eff_narrow;
    if (t < 0.95 * best.time) {
      best = Option{narrow, true, false, t};
      split2 = true;
    }
  }
  // K <= 512 (at most 8 k-blocks a tile) with more 128x128 tiles than SMs: ping-pong consumers on
  // the 128x128 tile, CTAs unpaired, whatever the model says. Each tile's epilogue is a large share
  // of its time there, and ping-pong runs it under the other warpgroup's mainloop. Measured
  // 2026-12-01 (one H200, `...gemm-smallk-pingpong-sweep-8ddcc33`), against the engine's unpaired
  // whole tiles in the same call: 16384x4096x512 +2.7 % interleaved / +3.4 % back to back,
  // 8192x4096x512 +1.6 / level, 4096x4096x512 +2.5 / +2.5, 1024x4096x512 +1.5 / +1.3. (With CTA
  // pairs, as measured on 2026-11-30, it was level to -5 points.) A CTA with one tile would leave
  // one warpgroup idle, so only where there are more tiles than SMs.
  // And K <= 1024 (at most 16 k-blocks) where the 128x128 tiles make at least 20 waves: measured
  // 2026-12-01 22:55 (one H200, `...gemm-pingpong-wide-k1024-sweep-d4202b3`, each against the
  // engine's choice run twice in the same call, % of cuBLASLt interleaved / back to back):
  // 16384x4096x1024 (31 waves; 128x256) 90.9 / 95.6 -> 94.1 / 98.7, 8192x8192x1024 (31; 128x192
  // pairs) 89.9 / 91.4 -> 92.7 / 94.2, 16384x8192x1024 (62; 128x192 pairs) 90.0 / 90.7 -> 91.5 /
  // 91.9 (and 91.4 / 91.5 on 2026-12-01 11:39); with 15.5 waves it lost 1-4 points back to back
  // (8192x4096x1024, 4096x8192x1024), and at K = 2048 it was mixed (16384x4096x2048 +0.6 / -2.3).
  // Since 2026-12-02 both through the sub-tile staging ring (sm90::Traits::kStagingRing), whose
  // freed shared memory is a sixth stage on 128x128, and for all K <= 1024 with more 128x128 tiles
  // than SMs: measured 05:17 (one H200, `...gemm-staging-ring-k1024-sweep-3410ee4`) on the ten
  // such TP shapes against the engine's choice run twice in the same call, 6-stage ping-pong gained
  // +2.0 to +4.0 points interleaved on every one (16384x4096x512 89.9 -> 91.7, 1024x4096x512
  // 89.8 -> 91.9, 1024x4096x1024 89.7 -> 91.8, 16384x8192x1024 91.4 -> 95.2) and -1.5 to +3.8 back to
  // back (the losses within the engine's two runs' spread, on 4 shapes). And where K <= 512 and
  // 128x160 tiles make at least 10 waves (B [N, K]), ping-pong on 128x160 with 5 stages, cuBLASLt's
  // own kernel there: 16384x4096x512 89.9 / 91.4 -> 94.5 / 95.9, 8192x4096x512 92.1 / 95.2 ->
  // 96.1 / 100.0 (with fewer waves it lost: 4096x4096x512 95.4 against 6-stage 128x128's 99.9).
  // Grouped problems (MoE experts) take the 6-stage 128x128 ping-pong by N, not K: measured
  // 2026-12-02 (one H200, `...grouped-ab-pingpong-*-50f54a5`, each against 128x256x64/3 in the same
  // rounds) it was faster on all 12 DeepSeek-like cases (N = 4096 and 7168, K = 7168 and 2048:
  // -0.5 to +7.5 %) and on 9 of 12 Mixtral ones (N = 28672 and 4096: -6.3 to +2.8 %, geomean
  // +0.7 %), but slower on 10 of 13 Qwen3 ones (N = 1536 and 2048, K = 2048 and 768, even at
  // K = 768: -5 to +1 %). tiles_of counts max_rows as one group, a bound on the tiles any routing
  // makes. (The 160 ring is not built for groups.) Only on devices of the H200's memory
  // bandwidth: on one H100 (3.35 TB/s) the whole 128x256 tile ran 1.06-1.37x faster than this
  // ping-pong on all 12 Mixtral cases (geomean 1.20; 2026-12-07,
  // bench/results/2026-12-07-h100-grouped-mixtral-ab-7611fd9*): 128x128 tiles read 1.33x the
  // bytes per FLOP of 128x256, which the H200's 4.8 TB/s covers and the H100's does not (the
  // hypothesis; DeepSeek-like groups on an H100 follow it unmeasured so far).
  const bool pingpong = tma_ok && !split2 && !best.stream && tiles_of(narrow) > sms &&
                        (grouped ? d.n >= kGroupedPingpongMinN && mem_gbps >= kGroupedPingpongMinGbps
                                 : k_tiles <= 16);
  if (pingpong) {
    best = Option{kPingpongRingShape, true, false, 0};
    if (!grouped && d.b_layout == BLayout::kNK && k_tiles <= 8 && tiles_of(kPingpongRing160Shape) >= 10 * int64_t(sms))
      best = Option{kPingpongRing160Shape, true, false, 0};
  }
  GemmConfig c;
  c.pingpong = pingpong;
  c.split_k = split2 ? 2 : 1;
  c.block_m = best.t.block_m;
  c.block_n = best.t.block_n;
  c.block_k = best.t.block_k;
  c.stages = best.t.stages;
  c.tma_store = best.tma;
  c.stream_k = best.stream;
  c.num_sms = sms;
  // CTA pairs sharing B need at least two row tiles and a budget for at least one pair
  // (stream-K's units are single tiles), and pay only where the tiles make at least 20 waves.
  // Measured 2026-12-01 on all 96 TP shapes, the engine's config with and without pairs in the
  // same call (one H200, bench/results/2026-12-01-h200-gemm-cluster-ab-*): without them the
  // speed ratio by waves of tiles was 1.043 (one wave; up to 1.14 on the 48 and 80 tiles), 1.018
  // (2), 1.014 (2-4), 1.012 (4-8), 1.015 (8-16), 1.002 (16-30) and 0.996 (> 30) back to back at
  // the power cap. The pair couples two CTAs: a stage is refilled only when both have released
  // it, which costs more than the multicast saves until the L2 is the limit. On one H100
  // (2026-12-06, `bench/results/2026-12-06-h100-gemm-pairs-*`, % of cuBLASLt interleaved) the
  // 20-30 wave shapes split: 8192x14336x8192 0.7-3.6 points better unpaired (four rounds),
  // 8192x8192x14336 level, 4096x28672x8192 2 points better paired; the threshold stays.
  const bool pairs_pay = tiles_of(best.t) >= 20 * int64_t(sms);
  // An odd number of row tiles leaves the last pair's second tile past M (PlainSchedule::work_pair):
  // a whole mainloop on zeros, 1 / row tiles more work, where the pairs' best measured gain is
  // 0.4 % (> 30 waves): no pairs then. 8064x14336x8192 (63 row tiles, 27 waves) ran at 96.7-97.5 %
  // of cuBLASLt with pairs against 102.7-103.1 % unpaired (one H100, 2026-12-06).
  const int64_t row_tiles = ceil_div(d.m, int64_t(c.block_m));
  c.cluster_m = !c.stream_k && !split2 && !pingpong && pairs_pay && row_tiles >= 2 && row_tiles % 2 == 0 && sms >= 2 ? 2 : 1;
  // The raster (tile_order.h): groups of 16 row tiles on large plain problems of whole tiles, of
  // 4 for tiles narrower than tall.
  if (!grouped && !split2 && !c.stream_k)
    c.group_m = plain_group_m(ceil_div(d.m, c.block_m), d.n, d.k, c.block_m, c.block_n);
  return c;
}
}  // namespace

GemmConfig choose_config(const GemmDesc& d, int num_sms) { return choose_plain(d, num_sms, false); }

std::string to_string(const GemmConfig& c) {
  std::ostringstream os;
  os << "block=" << c.block_m << "x" << c.block_n << "x" << c.block_k << " stages=" << c.stages << " sms=" << c.num_sms
     << " order=" << (c.order == TileOrder::kRowMajor ? "row" : "column") << " group_m=" << c.group_m
     << " cluster=" << c.cluster_m << (c.cluster_n == 2 ? " cluster_n=2" : "") << (c.tma_store ? " epilogue=tma_store" : "")
     << (c.split_k > 1 ? " split_k=" + std::to_string(c.split_k) : std::string()) << (c.stream_k ? " stream_k" : "")
     << (c.pingpong ? " pingpong" : "");
  return os.str();
}

int64_t num_tiles(const GemmDesc& d, const GemmConfig& c) {
  return ceil_div(d.m, c.block_m) * ceil_div(d.n, c.block_n);
}

void tile_coord(const GemmDesc& d, const GemmConfig& c, int64_t idx, int64_t* m_tile, int64_t* n_tile) {
  const int mt = int(ceil_div(d.m, c.block_m)), nt = int(ceil_div(d.n, c.block_n));
  const TileCoord t = c.order == TileOrder::kRowMajor ? grouped_row_major(idx, mt, nt, c.group_m) : column_major(idx, mt);
  *m_tile = t.m_tile;
  *n_tile = t.n_tile;
}

size_t workspace_bytes(const GemmDesc& d, const GemmConfig& cfg) {
  if (cfg.split_k <= 1 && !cfg.stream_k) return 0;
  const sm90::KPartSchedule s = kpart_schedule(d, cfg, cfg.num_sms > 0 ? cfg.num_sms : current_device_sms());
  return kpart_partial_bytes(s, cfg) + size_t(s.fixup_tiles()) * sizeof(int);
}

namespace {
// The per-device split-K / stream-K buffers of run() without a workspace (grown, never shrunk;
// freed at exit): `which` 0 holds partials, 1 the tile counters, zeroed when allocated. A call
// leaves the counters it used at zero and touches no other, so the counters stay zero whatever
// the problem (partials and counters sharing one buffer would not: one problem's partials lie
// where another's counters are).
// With may_grow false, null when the buffer is smaller than `bytes` (nothing allocated).
void* cached_buffer(int which, size_t bytes, bool may_grow) {
  static std::mutex mu;
  static std::vector<std::pair<void*, size_t>> per_device[2];
  int dev = 0;
  CCFUSE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto& buffers = per_device[which];
  if (buffers.size() <= size_t(dev)) buffers.resize(size_t(dev) + 1, {nullptr, 0});
  auto& slot = buffers[size_t(dev)];
  if (slot.second < bytes) {
    if (!may_grow) return nullptr;
    if (slot.first != nullptr) CCFUSE_CUDA_CHECK(cudaFree(slot.first));
    slot = {nullptr, 0};
    CCFUSE_CUDA_CHECK(cudaMalloc(&slot.first, bytes));
    if (which == 1) CCFUSE_CUDA_CHECK(cudaMemset(slot.first, 0, bytes));
    slot.second = bytes;
  }
  return slot.first;
}
}  // namespace

void run(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, void* stream,
         void* workspace) {
  validate(d, cfg);
  for (auto [ptr, name] : {std::pair<const void*, const char*>{a, "A"}, {b, "B"}, {c, "C"}})
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, name, " (", ptr, ") must be 16-byte aligned (TMA)");
  auto s = static_cast<cudaStream_t>(stream);
  Fixup fx;
  if (cfg.split_k > 1 || cfg.stream_k) {
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "workspace (", workspace,
                     ") must be 16-byte aligned");
    const sm90::KPartSchedule k = kpart_schedule(d, cfg, cfg.num_sms > 0 ? cfg.num_sms : current_device_sms());
    const size_t partial_bytes = kpart_partial_bytes(k, cfg), counter_bytes = size_t(k.fixup_tiles()) * sizeof(int);
    if (workspace != nullptr) {
      // A caller's workspace [partials | counters] may hold anything: its counters are zeroed on the stream first.
      fx.partials = static_cast<float*>(workspace);
      fx.counters = reinterpret_cast<int*>(static_cast<char*>(workspace) + partial_bytes);
      CCFUSE_CUDA_CHECK(cudaMemsetAsync(fx.counters, 0, counter_bytes, s));
    } else {
      // The library's buffers cannot be allocated while the stream is being captured into a CUDA
      // graph: then, when they are too small, the tiles run whole (same product; the sums of a
      // tile's k-blocks in one CTA instead of parts).
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      CCFUSE_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
      const bool may_grow = capture == cudaStreamCaptureStatusNone;
      fx.partials = static_cast<float*>(cached_buffer(0, partial_bytes, may_grow));
      fx.counters = static_cast<int*>(cached_buffer(1, counter_bytes, may_grow));
      if (fx.partials == nullptr || fx.counters == nullptr) {
        GemmConfig whole = cfg;
        whole.split_k = 1;
        whole.stream_k = false;
        if (d.dtype == DType::kBFloat16) launch_dtype<cutlass::bfloat16_t>(d, whole, a, b, c, Fixup{}, s);
        else launch_dtype<cutlass::half_t>(d, whole, a, b, c, Fixup{}, s);
        return;
      }
    }
  }
  if (d.dtype == DType::kBFloat16) launch_dtype<cutlass::bfloat16_t>(d, cfg, a, b, c, fx, s);
  else launch_dtype<cutlass::half_t>(d, cfg, a, b, c, fx, s);
}

namespace {
GemmDesc as_plain(const GroupedGemmDesc& d) { return make_desc(d.max_rows, d.n, d.k, d.dtype, d.b_layout); }
}  // namespace

void validate(const GroupedGemmDesc& d, const GemmConfig& cfg) {
  CCFUSE_ARG_CHECK(d.num_groups >= 1, "num_groups ", d.num_groups, " must be at least 1");
  CCFUSE_ARG_CHECK(cfg.cluster_m == 1, "cluster_m ", cfg.cluster_m, " is not supported by the grouped GEMM (1 only)");
  CCFUSE_ARG_CHECK(cfg.cluster_n == 1, "cluster_n ", cfg.cluster_n, " is not supported by the grouped GEMM (1 only)");
  // TMA-store epilogue: whole tiles through TMA, tiles cut by their group's end from registers.
  CCFUSE_ARG_CHECK(!cfg.tma_store || cfg.block_n == 256 || cfg.block_n == 128,
                   "tma_store in the grouped GEMM is built for the 128x256x64/3 and 128x128x64/5 tiles, not ",
                   cfg.block_m, "x", cfg.block_n);
  CCFUSE_ARG_CHECK(cfg.split_k == 1, "split_k ", cfg.split_k, " is not supported by the grouped GEMM (1 only)");
  CCFUSE_ARG_CHECK(!cfg.stream_k, "stream_k is not supported by the grouped GEMM");
  CCFUSE_ARG_CHECK(!cfg.pingpong || (cfg.tma_store && cfg.block_m == kPingpongRingShape.block_m &&
                                      cfg.block_n == kPingpongRingShape.block_n &&
                                      cfg.block_k == kPingpongRingShape.block_k &&
                                      cfg.stages == kPingpongRingShape.stages),
                   "pingpong in the grouped GEMM is built for the 128x128x64/6 tile with tma_store, not ", cfg.block_m,
                   "x", cfg.block_n, "x", cfg.block_k, "/", cfg.stages, cfg.tma_store ? "" : " without tma_store");
  CCFUSE_ARG_CHECK(d.max_rows > 0, "max_rows ", d.max_rows, " must be positive (the bound on the rows of all groups)");
  validate(as_plain(d), cfg);
}

double current_device_mem_gbps() {
  // Once per device: the memory clock query is not a cheap attribute read on every driver (the
  // grouped GEMM's host time grew by 0.1-0.4 ms a call with it per call, 2026-12-07, perf-notes).
  static std::atomic<double> cached[64];
  int dev = 0, khz = 0, bits = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < 64) {
    const double known = cached[dev].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const double gbps = 2.0 * double(khz) * 1e3 * double(bits) / 8.0 / 1e9;  // double data rate
  if (dev >= 0 && dev < 64) cached[dev].store(gbps, std::memory_order_relaxed);
  return gbps;
}

GemmConfig choose_config(const GroupedGemmDesc& d, int num_sms, double mem_gbps) {
  GemmConfig c = choose_plain(as_plain(d), num_sms, true, mem_gbps > 0 ? mem_gbps : current_device_mem_gbps());
  c.cluster_m = 1;  // CTA pairs would straddle group boundaries
  return c;
}

size_t grouped_workspace_bytes(const GroupedGemmDesc& d) {
  // + the tensor-map slot (the accumulating K-grouped form's) and its alignment to 64 bytes
  return grouped_prefix_bytes(d.num_groups) + 64 + sizeof(CUtensorMap);
}

namespace {
// The grouped forms' run-time arguments (after validate(desc, config)); `form` names the
// workspace-size function, "grouped" or "kgrouped".
void check_grouped_args(const void* a, const void* b, const void* c, const int* group_rows, const void* workspace,
                        const char* form) {
  CCFUSE_ARG_CHECK(group_rows != nullptr, "group_rows must point to num_groups ints in device memory");
  CCFUSE_ARG_CHECK(workspace != nullptr, "workspace must hold ", form,
                   "_workspace_bytes(desc) bytes of device memory");
  for (auto [ptr, name] : {std::pair<const void*, const char*>{a, "A"}, {b, "B"}, {c, "C"}})
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, name, " (", ptr, ") must be 16-byte aligned (TMA)");
}
}  // namespace

void grouped_run(const GroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                 const int* group_rows, void* workspace, int* overflow, void* stream) {
  validate(d, cfg);
  check_grouped_args(a, b, c, group_rows, workspace, "grouped");
  auto s = static_cast<cudaStream_t>(stream);
  if (d.dtype == DType::kBFloat16) grouped_dtype<cutlass::bfloat16_t>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
  else grouped_dtype<cutlass::half_t>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
}

namespace {
// K-grouped (the weight gradients): A [max_rows, m] read as A^T (MN-major), B [max_rows, n]
// (N-major), C [num_groups * m, n]; the prefix of the groups' rows from the grouped GEMM's scan
// (its tile prefix unused: one tile a row).
template <class Traits>
void launch_kgrouped(const KGroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                     const int* group_rows, void* workspace, int* overflow, cudaStream_t stream) {
  sm90::KGroupedSchedule sched;
  sched.num_groups = d.num_groups;
  sched.m_tiles = int(ceil_div(d.m, cfg.block_m));
  sched.n_tiles = int(ceil_div(d.n, cfg.block_n));
  sched.block_m = cfg.block_m;
  sched.block_k = cfg.block_k;
  sched.group_m = cfg.group_m;
  sched.m = d.m;
  auto* row_prefix = static_cast<int64_t*>(workspace);
  auto* tile_prefix = reinterpret_cast<int*>(row_prefix + d.num_groups + 1);
  sched.row_prefix = row_prefix;
  grouped_prefix_kernel<<<1, 32, 0, stream>>>(group_rows, d.num_groups, 1, 1, d.max_rows, tile_prefix, row_prefix,
                                              overflow);
  CCFUSE_CUDA_CHECK_LAUNCH();
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  auto launch = [&](const auto& epi) {
    sm90::launch_gemm<Traits>(int64_t(d.num_groups) * d.m, d.n, d.max_rows, a, d.m, b, d.n, c, d.n, sched, epi, sms,
                              stream, 1, d.n * d.max_rows, nullptr, 0, false, 0, nullptr, 0, d.m);
  };
  if constexpr (Traits::kTmaStore) {
    launch(sm90::PlainEpilogue{});
  } else {  // accumulate (validate): C += into fp32
    sm90::AccumF32Epilogue epi;
    epi.c32 = static_cast<float*>(c);
    epi.ld32 = d.n;
    // CCFUSE_KGROUPED_ACCUM (an A/B switch for the benches, not a setting): red or rmw (the
    // register forms), else the TMA reduce-adds.
    const char* env = std::getenv("CCFUSE_KGROUPED_ACCUM");
    const std::string mode = env != nullptr ? env : "";
    epi.rmw = mode == "rmw";
    if (mode != "red" && mode != "rmw") {
      CUtensorMap* slot = tensor_map_slot(workspace, d.num_groups);
      store_tensor_map_kernel<<<1, 32, 0, stream>>>(make_accum_reduce_map(epi.c32, d.num_groups, d.m, d.n), slot);
      CCFUSE_CUDA_CHECK_LAUNCH();
      epi.reduce_map = slot;
    }
    epi.skip_no_k = true;
    launch(epi);
  }
}

template <class E>
void kgrouped_dtype(const KGroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                    const int* rows, void* ws, int* overflow, cudaStream_t s) {
  if (d.accumulate) {  // validate: the register tiles 128x256x64/4 and 128x128x64/6
    if (cfg.block_n == 256)
      launch_kgrouped<sm90::Traits<E, 128, 256, 64, 4, false, 1, false, false, false, 0, true>>(d, cfg, a, b, c, rows,
                                                                                               ws, overflow, s);
    else
      launch_kgrouped<sm90::Traits<E, 128, 128, 64, 6, false, 1, false, false, false, 0, true>>(d, cfg, a, b, c, rows,
                                                                                               ws, overflow, s);
  } else if (cfg.pingpong)  // validate: the 128x128x64/6 ring only
    launch_kgrouped<sm90::Traits<E, 128, 128, 64, kPingpongRingShape.stages, false, 1, true, true, false, 1, true>>(
        d, cfg, a, b, c, rows, ws, overflow, s);
  else if (cfg.block_n == 256)
    launch_kgrouped<sm90::Traits<E, 128, 256, 64, 3, false, 1, true, false, false, 0, true>>(d, cfg, a, b, c, rows, ws,
                                                                                            overflow, s);
  else
    launch_kgrouped<sm90::Traits<E, 128, 128, 64, 5, false, 1, true, false, false, 0, true>>(d, cfg, a, b, c, rows, ws,
                                                                                            overflow, s);
}
}  // namespace

void validate(const KGroupedGemmDesc& d, const GemmConfig& cfg) {
  CCFUSE_ARG_CHECK(d.num_groups >= 1, "num_groups ", d.num_groups, " must be at least 1");
  CCFUSE_ARG_CHECK(d.max_rows > 0, "max_rows ", d.max_rows, " must be positive (the bound on the rows of all groups)");
  CCFUSE_ARG_CHECK(d.m > 0 && d.n > 0, "m and n (", d.m, ", ", d.n, ") must be positive");
  constexpr int64_t kMaxDim = (int64_t(1) << 31) - 1;
  CCFUSE_ARG_CHECK(d.max_rows <= kMaxDim && d.n <= kMaxDim && int64_t(d.num_groups) * d.m <= kMaxDim,
                   "max_rows, n and num_groups * m must each be below 2^31 (TMA coordinates are 32-bit)");
  CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16 || d.dtype == DType::kFloat16, "dtype ", dtype_name(d.dtype),
                   " is not supported by the GEMM engine (bf16, fp16)");
  const int64_t align = 16 / dtype_size(d.dtype);
  CCFUSE_ARG_CHECK(d.m % align == 0, "m ", d.m, " must be a multiple of ", align, " for ", dtype_name(d.dtype),
                   " (TMA needs 16-byte aligned rows of A [rows, m])");
  CCFUSE_ARG_CHECK(d.n % align == 0, "n ", d.n, " must be a multiple of ", align, " for ", dtype_name(d.dtype),
                   " (TMA needs 16-byte aligned rows of B [rows, n] and C)");
  auto is = [&](const TileShape& t) {
    return cfg.block_m == t.block_m && cfg.block_n == t.block_n && cfg.block_k == t.block_k && cfg.stages == t.stages;
  };
  const bool whole = cfg.cluster_m == 1 && cfg.cluster_n == 1 && cfg.split_k == 1 && !cfg.stream_k;
  if (d.accumulate) {
    CCFUSE_ARG_CHECK(!cfg.tma_store && !cfg.pingpong && (is(kTileShapes[0]) || is(kTileShapes[1])) && whole,
                     "the accumulating K-grouped GEMM (C fp32 +=) is built for the register-epilogue tiles "
                     "128x256x64/4 and 128x128x64/6 (cooperative, without tma_store), without clusters, split-K or "
                     "stream-K, not ",
                     to_string(cfg), cfg.tma_store ? " with tma_store" : "");
  } else {
    CCFUSE_ARG_CHECK(cfg.tma_store &&
                         (cfg.pingpong ? is(kPingpongRingShape) : (is(kTmaStoreShape) || is(kTmaStoreNarrowShape))) &&
                         whole,
                     "the K-grouped GEMM is built for the TMA-store tiles 128x256x64/3 and 128x128x64/5 (cooperative) "
                     "and 128x128x64/6 (pingpong), without clusters, split-K or stream-K, not ",
                     to_string(cfg), cfg.tma_store ? "" : " without tma_store");
  }
  CCFUSE_ARG_CHECK(cfg.num_sms >= 0, "num_sms ", cfg.num_sms, " must not be negative");
}

GemmConfig choose_config(const KGroupedGemmDesc& d, int num_sms) {
  GemmConfig c;
  // CCFUSE_KGROUPED_TILE (an A/B switch for the benches, not a setting): 256, 128 or pingpong.
  const char* forced = std::getenv("CCFUSE_KGROUPED_TILE");
  const std::string tile = forced != nullptr ? forced : "";
  if (tile == "pingpong" && !d.accumulate) {
    c = GemmConfig{kPingpongRingShape.block_m, kPingpongRingShape.block_n, kPingpongRingShape.block_k,
                   kPingpongRingShape.stages, num_sms};
    c.tma_store = true;
    c.pingpong = true;
    return c;
  }
  // Where one group's 128x256 tiles fill at most half the SMs, the narrow ping-pong tile (twice
  // the tiles a group): a group with most of the rows (skewed routing, unknown here: the counts
  // stay on the device) then spreads over twice the SMs. Measured 2026-12-07 (perf-notes): Qwen3-
  // like dW2 (48 tiles a group) 1.12-1.18x on Zipf routing, 0.995-1.035x uniform; at 96 tiles a
  // group (Qwen3-like dW1) within 3 % either way, at 448+ (DeepSeek-, Mixtral-like) ping-pong
  // lost 4-38 %. num_sms 0: 132 (H100 / H200). Not for the accumulating form: its narrow
  // register tile measured 1-10 % slower on the same shapes.
  const int sms = num_sms > 0 ? num_sms : 132;
  const int64_t wide_group_tiles = ceil_div(d.m, 128) * ceil_div(d.n, 256);
  if (tile.empty() && !d.accumulate && d.n > 128 && 2 * wide_group_tiles <= sms) {
    c = GemmConfig{kPingpongRingShape.block_m, kPingpongRingShape.block_n, kPingpongRingShape.block_k,
                   kPingpongRingShape.stages, num_sms};
    c.tma_store = true;
    c.pingpong = true;
    c.group_m = 8;
    return c;
  }
  const bool wide = tile == "256" || (tile != "128" && d.n > 128);
  if (d.accumulate) {  // the register-epilogue tiles (no ping-pong form)
    const TileShape& t = kTileShapes[wide ? 0 : 1];
    c = GemmConfig{t.block_m, t.block_n, t.block_k, t.stages, num_sms};
    c.group_m = 8;
    return c;
  }
  c.block_m = 128;
  c.block_n = wide ? kTmaStoreShape.block_n : kTmaStoreNarrowShape.block_n;
  c.block_k = 64;
  c.stages = wide ? kTmaStoreShape.stages : kTmaStoreNarrowShape.stages;
  c.tma_store = true;
  c.num_sms = num_sms;
  c.group_m = 8;
  return c;
}

size_t kgrouped_workspace_bytes(const KGroupedGemmDesc& d) {  // the grouped GEMM's prefix arrays
  GroupedGemmDesc g;
  g.num_groups = d.num_groups;
  return grouped_workspace_bytes(g);
}

void kgrouped_run(const KGroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                  const int* group_rows, void* workspace, int* overflow, void* stream) {
  validate(d, cfg);
  check_grouped_args(a, b, c, group_rows, workspace, "kgrouped");
  auto s = static_cast<cudaStream_t>(stream);
  if (d.dtype == DType::kBFloat16) kgrouped_dtype<cutlass::bfloat16_t>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
  else kgrouped_dtype<cutlass::half_t>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
}

}  // namespace ccfuse::gemm
