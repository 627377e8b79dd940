// Host side of the GEMM engine: validation, config choice, TMA descriptors, launch.
#include <algorithm>
#include <mutex>
#include <sstream>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/gemm/sm90_gemm.cuh"

namespace ccfuse::gemm {

namespace {

// One thread: the GroupedSchedule's prefix arrays (sm90::grouped_prefix).
__global__ void grouped_prefix_kernel(const int* group_rows, int num_groups, int n_tiles, int block_m,
                                      int64_t max_rows, int* tile_prefix, int64_t* row_prefix, int* overflow) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  sm90::grouped_prefix(group_rows, num_groups, n_tiles, block_m, max_rows, tile_prefix, row_prefix, overflow);
}


// C = bf16/fp16(sum of the split_k fp32 slices of ws [splits][m][n]).
template <class E>
__global__ void split_reduce_kernel(const float* ws, int splits, int64_t m, int64_t n, E* c, int64_t ldc) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) acc += ws[s * total + i];
    c[(i / n) * ldc + i % n] = E(acc);
  }
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
// The narrow TMA-store tile (written 2026-11-30, not yet run on a GPU): for problems with fewer
// 128x256 tiles than SMs, twice the tiles, each without the register epilogue's ~5.7 us.
// 5 stages: 5 x 32 KiB of A/B + 32 KiB of C staging.
constexpr TileShape kTmaStoreNarrowShape = {128, 128, 64, 5};

template <class Traits>
void launch(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, cudaStream_t stream) {
  const auto sched = sm90::plain_schedule(d.m, d.n, cfg.block_m, cfg.block_n, cfg.group_m,
                                          cfg.order == TileOrder::kColumnMajor);
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  sm90::launch_gemm<Traits>(d.m, d.n, d.k, a, lda_of(d), b, ldb_of(d), c, ldc_of(d), sched, sm90::PlainEpilogue{}, sms,
                            stream);
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

template <class E, int BM, int BN, int BK, int S>
void grouped_layout(const GroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                    const int* rows, void* ws, int* overflow, cudaStream_t s) {
  if (d.b_layout == BLayout::kNK) launch_grouped<sm90::Traits<E, BM, BN, BK, S, true>>(d, cfg, a, b, c, rows, ws, overflow, s);
  else launch_grouped<sm90::Traits<E, BM, BN, BK, S, false>>(d, cfg, a, b, c, rows, ws, overflow, s);
}

template <class Traits>
void launch_split(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, float* ws,
                  cudaStream_t stream) {
  sm90::SplitKSchedule sched;
  sched.base = sm90::plain_schedule(d.m, d.n, cfg.block_m, cfg.block_n, cfg.group_m,
                                    cfg.order == TileOrder::kColumnMajor);
  sched.splits = cfg.split_k;
  sched.k_tiles = int(ceil_div(d.k, cfg.block_k));
  sm90::SplitKEpilogue epi;
  epi.ws = ws;
  epi.ld = d.n;
  epi.split_stride = d.m * d.n;
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  sm90::launch_gemm<Traits>(d.m, d.n, d.k, a, lda_of(d), b, ldb_of(d), c, ldc_of(d), sched, epi, sms, stream);
  using E = typename Traits::Element;
  const int blocks = int(std::min<int64_t>(ceil_div(d.m * d.n, 256), 8 * int64_t(sms)));
  split_reduce_kernel<E><<<blocks, 256, 0, stream>>>(ws, cfg.split_k, d.m, d.n, static_cast<E*>(c), ldc_of(d));
  CCFUSE_CUDA_CHECK_LAUNCH();
}

template <class E, int BM, int BN, int BK, int S>
void launch_split_layout(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, float* ws,
                         cudaStream_t s) {
  if (d.b_layout == BLayout::kNK) launch_split<sm90::Traits<E, BM, BN, BK, S, true>>(d, cfg, a, b, c, ws, s);
  else launch_split<sm90::Traits<E, BM, BN, BK, S, false>>(d, cfg, a, b, c, ws, s);
}

template <class E, int BM, int BN, int BK, int S, bool kTma = false>
void launch_layout(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, cudaStream_t s) {
  const bool nk = d.b_layout == BLayout::kNK;
  if (cfg.cluster_m == 2) {
    if (nk) launch<sm90::Traits<E, BM, BN, BK, S, true, 2, kTma>>(d, cfg, a, b, c, s);
    else launch<sm90::Traits<E, BM, BN, BK, S, false, 2, kTma>>(d, cfg, a, b, c, s);
  } else {
    if (nk) launch<sm90::Traits<E, BM, BN, BK, S, true, 1, kTma>>(d, cfg, a, b, c, s);
    else launch<sm90::Traits<E, BM, BN, BK, S, false, 1, kTma>>(d, cfg, a, b, c, s);
  }
}

template <class E>
void launch_dtype(const GemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c, float* ws,
                  cudaStream_t s) {
  if (cfg.split_k > 1) {
    if (cfg.block_n == 256) launch_split_layout<E, 128, 256, 64, 4>(d, cfg, a, b, c, ws, s);
    else launch_split_layout<E, 128, 128, 64, 6>(d, cfg, a, b, c, ws, s);
  } else if (cfg.tma_store && cfg.block_n == 128) launch_layout<E, 128, 128, 64, 5, true>(d, cfg, a, b, c, s);
  else if (cfg.tma_store) launch_layout<E, 128, 256, 64, 3, true>(d, cfg, a, b, c, s);
  else if (cfg.block_n == 256) launch_layout<E, 128, 256, 64, 4>(d, cfg, a, b, c, s);
  else launch_layout<E, 128, 128, 64, 6>(d, cfg, a, b, c, s);
}

}  // namespace

int current_device_sms() {
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
    known = same(kTmaStoreShape) || same(kTmaStoreNarrowShape);
    CCFUSE_ARG_CHECK(known, "tile ", cfg.block_m, "x", cfg.block_n, "x", cfg.block_k, " with ", cfg.stages,
                     " stages is not built with tma_store (built: 128x256x64/3, 128x128x64/5)");
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
  CCFUSE_ARG_CHECK(cfg.split_k == 1 || (!cfg.tma_store && cfg.cluster_m == 1),
                   "split_k > 1 is built without tma_store and with cluster_m 1");
}

GemmConfig choose_config(const GemmDesc& d, int num_sms) {
  // Wave quantisation model: a persistent grid of `sms` CTAs runs ceil(tiles / sms) waves; the
  // last one may be partly empty. Per FLOP, 128x256 tiles with the TMA-store epilogue run ~12 %
  // faster than 128x128 tiles (more reuse per byte of shared memory, and the epilogue overlapped
  // with the next tile: 2026-11-29 gemm_tma run, docs/perf-notes.md), so prefer them unless their
  // waves waste more than that. Without TMA stores (ldc not 16-byte aligned) the register
  // epilogue's 128x256 tile is ~8 % ahead of 128x128.
  const int sms = num_sms > 0 ? num_sms : current_device_sms();
  const bool tma_ok = ldc_of(d) % (16 / dtype_size(d.dtype)) == 0;
  // (The narrow TMA-store tile, kTmaStoreNarrowShape, is built but not chosen here until it is
  // measured: the bench's CCFUSE_GEMM_NARROW_TMA=1 swaps it in where this picks 128x128.)
  const TileShape wide = tma_ok ? kTmaStoreShape : kTileShapes[0];
  const TileShape candidates[] = {wide, kTileShapes[1]};
  GemmConfig best;
  double best_score = -1;
  for (const auto& t : candidates) {
    const double tiles = double(ceil_div(d.m, t.block_m) * ceil_div(d.n, t.block_n));
    const double waves = std::ceil(tiles / sms);
    const double fill = tiles / (waves * sms);
    const double tile_eff = t.block_n == 256 ? 1.0 : (tma_ok ? 0.88 : 0.92);
    const double score = fill * tile_eff;
    if (score > best_score + 1e-9) {
      best_score = score;
      best.block_m = t.block_m;
      best.block_n = t.block_n;
      best.block_k = t.block_k;
      best.stages = t.stages;
      best.tma_store = tma_ok && t.block_n == 256;
    }
  }
  best.num_sms = sms;
  // CTA pairs sharing B need at least two row tiles and a budget for at least one pair.
  best.cluster_m = ceil_div(d.m, best.block_m) >= 2 && sms >= 2 ? 2 : 1;
  // Split-K is not chosen here: picked by a wave-fill model for the six TP shapes with the
  // fewest tiles it made them 0-20 points slower (e.g. 1024x1536x4096: 74.8 -> 54.4 % of
  // cuBLASLt; 2026-11-29, docs/perf-notes.md): its parts store fp32 tiles from registers and a
  // second kernel reads them back, which costs more than the idle SMs it fills. It stays
  // available (GemmConfig::split_k) for callers that measure it worth it.
  return best;
}

std::string to_string(const GemmConfig& c) {
  std::ostringstream os;
  os << "block=" << c.block_m << "x" << c.block_n << "x" << c.block_k << " stages=" << c.stages << " sms=" << c.num_sms
     << " order=" << (c.order == TileOrder::kRowMajor ? "row" : "column") << " group_m=" << c.group_m
     << " cluster=" << c.cluster_m << (c.tma_store ? " epilogue=tma_store" : "")
     << (c.split_k > 1 ? " split_k=" + std::to_string(c.split_k) : std::string());
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
  return cfg.split_k > 1 ? size_t(cfg.split_k) * size_t(d.m * d.n) * sizeof(float) : 0;
}

namespace {
// The per-device split-K workspace of run() without one (grown, never shrunk; freed at exit).
void* cached_workspace(size_t bytes) {
  static std::mutex mu;
  static std::vector<std::pair<void*, size_t>> per_device;
  int dev = 0;
  CCFUSE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (per_device.size() <= size_t(dev)) per_device.resize(size_t(dev) + 1, {nullptr, 0});
  auto& slot = per_device[size_t(dev)];
  if (slot.second < bytes) {
    if (slot.first != nullptr) CCFUSE_CUDA_CHECK(cudaFree(slot.first));
    slot = {nullptr, 0};
    CCFUSE_CUDA_CHECK(cudaMalloc(&slot.first, bytes));
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
  float* ws = nullptr;
  if (cfg.split_k > 1) {
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "workspace (", workspace,
                     ") must be 16-byte aligned");
    ws = static_cast<float*>(workspace != nullptr ? workspace : cached_workspace(workspace_bytes(d, cfg)));
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (d.dtype == DType::kBFloat16) launch_dtype<cutlass::bfloat16_t>(d, cfg, a, b, c, ws, s);
  else launch_dtype<cutlass::half_t>(d, cfg, a, b, c, ws, s);
}

namespace {
GemmDesc as_plain(const GroupedGemmDesc& d) { return make_desc(d.max_rows, d.n, d.k, d.dtype, d.b_layout); }
}  // namespace

void validate(const GroupedGemmDesc& d, const GemmConfig& cfg) {
  CCFUSE_ARG_CHECK(d.num_groups >= 1, "num_groups ", d.num_groups, " must be at least 1");
  CCFUSE_ARG_CHECK(cfg.cluster_m == 1, "cluster_m ", cfg.cluster_m, " is not supported by the grouped GEMM (1 only)");
  CCFUSE_ARG_CHECK(!cfg.tma_store, "tma_store is not supported by the grouped GEMM (a tile's rows may cross groups)");
  CCFUSE_ARG_CHECK(cfg.split_k == 1, "split_k ", cfg.split_k, " is not supported by the grouped GEMM (1 only)");
  CCFUSE_ARG_CHECK(d.max_rows > 0, "max_rows ", d.max_rows, " must be positive (the bound on the rows of all groups)");
  validate(as_plain(d), cfg);
}

GemmConfig choose_config(const GroupedGemmDesc& d, int num_sms) {
  GemmConfig c = choose_config(as_plain(d), num_sms);
  c.cluster_m = 1;  // CTA pairs would straddle group boundaries
  c.split_k = 1;    // the grouped GEMM has no split-K
  if (c.tma_store) {  // a tile's rows may cross groups: stores from registers, clipped per group
    const TileShape& t = kTileShapes[0];
    c.stages = t.stages;
    c.tma_store = false;
  }
  return c;
}

size_t grouped_workspace_bytes(const GroupedGemmDesc& d) {
  return size_t(d.num_groups + 1) * (sizeof(int64_t) + sizeof(int)) + 16;
}

void grouped_run(const GroupedGemmDesc& d, const GemmConfig& cfg, const void* a, const void* b, void* c,
                 const int* group_rows, void* workspace, int* overflow, void* stream) {
  validate(d, cfg);
  CCFUSE_ARG_CHECK(group_rows != nullptr, "group_rows must point to num_groups ints in device memory");
  CCFUSE_ARG_CHECK(workspace != nullptr, "workspace must hold grouped_workspace_bytes(desc) bytes of device memory");
  for (auto [ptr, name] : {std::pair<const void*, const char*>{a, "A"}, {b, "B"}, {c, "C"}})
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, name, " (", ptr, ") must be 16-byte aligned (TMA)");
  auto s = static_cast<cudaStream_t>(stream);
  if (d.dtype == DType::kBFloat16) {
    if (cfg.block_n == 256) grouped_layout<cutlass::bfloat16_t, 128, 256, 64, 4>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
    else grouped_layout<cutlass::bfloat16_t, 128, 128, 64, 6>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
  } else {
    if (cfg.block_n == 256) grouped_layout<cutlass::half_t, 128, 256, 64, 4>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
    else grouped_layout<cutlass::half_t, 128, 128, 64, 6>(d, cfg, a, b, c, group_rows, workspace, overflow, s);
  }
}

}  // namespace ccfuse::gemm
