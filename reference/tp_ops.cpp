// reference/tp_ops.cpp: the TP ops on the CPU reference world.
//
// Each op follows the GPU kernel's schedule (ccfuse/common/schedule.h) and signal protocol
// (ccfuse/comm/epoch.h) step by step, so that a schedule or protocol bug shows up here, under
// ThreadSanitizer, before it costs a hung GPU:
//   - every call starts with the entry barrier (no rank overwrites a peer's buffer while the peer
//     still reads it from the previous call), then takes this call's epoch;
//   - data is written into a peer's symmetric buffer first, then the flag is release-stored;
//   - a consumer acquire-waits on every flag guarding what it reads, its own rank's included.
#include "reference/tp_ops.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace ccfuse::ref {

void validate_tp(const World& world, const TpShape& shape, const TpConfig& config) {
  const int world_size = world.world_size();
  CCFUSE_ARG_CHECK(shape.m > 0, "m ", shape.m, " must be positive");
  CCFUSE_ARG_CHECK(shape.n > 0, "n ", shape.n, " must be positive");
  CCFUSE_ARG_CHECK(shape.k > 0, "k ", shape.k, " must be positive");
  CCFUSE_ARG_CHECK(shape.m % world_size == 0, "m ", shape.m, " is not divisible by world_size ", world_size);
  CCFUSE_ARG_CHECK(config.block_m > 0, "block_m ", config.block_m, " must be positive");
  CCFUSE_ARG_CHECK(config.block_n > 0, "block_n ", config.block_n, " must be positive");
  CCFUSE_ARG_CHECK(config.chunk_rows >= 0, "chunk_rows ", config.chunk_rows,
                   " must not be negative (0 means block_m)");
  // Tile and signal indices are int (as on the GPU); refuse grids whose counts would overflow.
  // Divisions, not products, so that the check itself cannot overflow int64.
  constexpr int64_t kMaxCount = std::numeric_limits<int>::max();
  const int64_t m_local = shape.m / world_size;
  const int64_t m_tiles = ceil_div(m_local, config.block_m);
  const int64_t n_tiles = ceil_div(shape.n, config.block_n);
  CCFUSE_ARG_CHECK(n_tiles <= kMaxCount / m_tiles / world_size, "m ", shape.m, ", n ", shape.n, " with block_m ",
                   config.block_m, ", block_n ", config.block_n, " give more than ", kMaxCount, " tiles");
  const int64_t chunk_rows = config.chunk_rows > 0 ? config.chunk_rows : int64_t(config.block_m);
  CCFUSE_ARG_CHECK(ceil_div(m_local, chunk_rows) <= kMaxCount / world_size, "m ", shape.m, " with chunk_rows ",
                   chunk_rows, " gives more than ", kMaxCount, " chunks");
}

namespace {

BandedGrid make_grid(const World& world, const TpShape& shape, const TpConfig& config) {
  BandedGrid grid;
  grid.world_size = world.world_size();
  grid.m_local = shape.m / world.world_size();
  grid.n = shape.n;
  grid.block_m = config.block_m;
  grid.block_n = config.block_n;
  return grid;
}

void check_rank(const World& world, int rank) {
  CCFUSE_CHECK(rank >= 0 && rank < world.world_size(), "rank ", rank, " out of range for world_size ",
               world.world_size());
}

// acc [rows, cols] = a [rows, k] @ b [k, cols] in fp32, where a has row stride lda and b row
// stride ldb. Each element sums over k in order 0..k-1, one rounding per step, as one GPU thread
// of a fp32-accumulating MMA would (up to the MMA's internal order).
template <typename T>
void tile_gemm_f32(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t rows, int64_t cols, int64_t k,
                   std::vector<float>& acc) {
  acc.assign(size_t(rows * cols), 0.0f);
  std::vector<float> b_row(static_cast<size_t>(cols));
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = 0; j < cols; ++j) b_row[size_t(j)] = to_f32(b[p * ldb + j]);
    for (int64_t i = 0; i < rows; ++i) {
      const float a_ip = to_f32(a[i * lda + p]);
      float* acc_row = acc.data() + i * cols;
      for (int64_t j = 0; j < cols; ++j) acc_row[j] += a_ip * b_row[size_t(j)];
    }
  }
}

// The reduce-scatter half shared by gemm_rs and gemm_ar.
//
// partials on owner o: [W src][m_local][N] fp32; slot src holds rank src's partial of band o.
// Signal (src, t) on owner o, index src * tiles_per_band + t, says slot src of o's band-local
// tile t is written.
struct ReduceScatter {
  BandedGrid grid;
  int64_t k;
  SymmetricBuffer<float> partials;
  SignalArray partial_ready;

  ReduceScatter(World& world, const BandedGrid& g, int64_t k_local, const char* signal_name)
      : grid(g),
        k(k_local),
        partials(world, size_t(g.world_size) * size_t(g.m_local) * size_t(g.n)),
        partial_ready(world, signal_name, g.world_size * g.tiles_per_band()) {}

  // Rank `rank` computes its partial of every tile of Σ (a [M, K] @ b [K, N]) in the staggered
  // order (peer bands first, own band last) and pushes each one to the band's owner.
  template <typename T>
  void produce(int rank, const T* a, const T* b, epoch_t epoch) {
    const int64_t n = grid.n;
    const int per_band = grid.tiles_per_band();
    std::vector<float> acc;
    for (int i = 0; i < grid.num_tiles(); ++i) {
      const Tile tile = rs_tile_at(grid, rank, i);
      tile_gemm_f32(a + tile.row0 * k, k, b + tile.col0, n, tile.rows, tile.cols, k, acc);
      const int64_t band_row0 = tile.row0 - int64_t(tile.band) * grid.m_local;
      float* dst = partials.on(tile.band) + (int64_t(rank) * grid.m_local + band_row0) * n + tile.col0;
      for (int64_t i_row = 0; i_row < tile.rows; ++i_row)
        std::copy_n(acc.data() + i_row * tile.cols, tile.cols, dst + i_row * n);
      const int t = tile.m_tile * grid.n_tiles() + tile.n_tile;
      partial_ready.notify(tile.band, rank * per_band + t, epoch);
    }
  }

  // Owner `rank` waits for all W partials of its band-local tile t and sums them in fp32 in
  // source order 0..W-1 (a fixed order, so the result does not depend on arrival timing).
  // sum [rows, cols] of the tile.
  Tile reduce_tile(int rank, int t, epoch_t epoch, std::vector<float>& sum) {
    const Tile tile = grid.band_tile(rank, t);
    const int per_band = grid.tiles_per_band();
    const int64_t n = grid.n;
    const int64_t band_row0 = tile.row0 - int64_t(rank) * grid.m_local;
    sum.assign(size_t(tile.rows * tile.cols), 0.0f);
    for (int src = 0; src < grid.world_size; ++src) {
      partial_ready.wait(rank, src * per_band + t, epoch, /*producer=*/src);
      const float* part = partials.on(rank) + (int64_t(src) * grid.m_local + band_row0) * n + tile.col0;
      for (int64_t i = 0; i < tile.rows; ++i)
        for (int64_t j = 0; j < tile.cols; ++j) sum[size_t(i * tile.cols + j)] += part[i * n + j];
    }
    return tile;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ag_gemm

template <typename T>
struct AgGemm<T>::State {
  World& world;
  TpShape shape;
  BandedGrid grid;
  Chunking chunking;
  SymmetricBuffer<T> gathered;  // [M, K] on every rank; band r is written by rank r
  SignalArray chunk_ready;      // on rank d, index chunking.signal_index(band, chunk): band's chunk arrived

  State(World& w, const TpShape& s, const TpConfig& c)
      : world(w),
        shape(s),
        grid(make_grid(w, s, c)),
        chunking{s.m / w.world_size(), c.chunk_rows > 0 ? c.chunk_rows : int64_t(c.block_m)},
        gathered(w, size_t(s.m) * size_t(s.k)),
        chunk_ready(w, "ag_chunk", w.world_size() * chunking.chunks_per_band()) {}
};

template <typename T>
AgGemm<T>::AgGemm(World& world, TpShape shape, TpConfig config) {
  validate_tp(world, shape, config);
  s_ = std::make_unique<State>(world, shape, config);
}

template <typename T>
AgGemm<T>::~AgGemm() = default;

template <typename T>
void AgGemm<T>::run(int rank, const T* a_local, const T* b, T* c, T* a_gathered) {
  State& s = *s_;
  check_rank(s.world, rank);
  CCFUSE_ARG_CHECK(a_local != nullptr && b != nullptr && c != nullptr, "ag_gemm: a_local, b and c must not be null");
  const int world_size = s.world.world_size();
  const int64_t k = s.shape.k, n = s.shape.n, m_local = s.grid.m_local;

  s.world.barrier(rank);
  const epoch_t epoch = s.chunk_ready.begin_call(rank);

  // Push model: chunk-major so that every peer gets its first rows as early as possible; peers
  // in rotated order starting with ourselves (our own first tiles need only our own chunks).
  for (int chunk = 0; chunk < s.chunking.chunks_per_band(); ++chunk) {
    const int64_t row0 = s.chunking.chunk_row0(chunk);
    const int64_t rows = s.chunking.chunk_rows_of(chunk);
    for (int d = 0; d < world_size; ++d) {
      const int dst_rank = (rank + d) % world_size;
      std::copy_n(a_local + row0 * k, rows * k, s.gathered.on(dst_rank) + (int64_t(rank) * m_local + row0) * k);
      s.chunk_ready.notify(dst_rank, s.chunking.signal_index(rank, chunk), epoch);
    }
  }

  // Tiles in rank-rotated band order; before each, wait for the chunks holding its rows.
  const T* a_all = s.gathered.on(rank);
  std::vector<float> acc;
  for (int i = 0; i < s.grid.num_tiles(); ++i) {
    const Tile tile = ag_tile_at(s.grid, rank, i);
    const int64_t band_row0 = tile.row0 - int64_t(tile.band) * m_local;
    const int first = s.chunking.first_chunk(band_row0);
    const int last = s.chunking.last_chunk(band_row0, tile.rows);
    for (int chunk = first; chunk <= last; ++chunk)
      s.chunk_ready.wait(rank, s.chunking.signal_index(tile.band, chunk), epoch, /*producer=*/tile.band);
    tile_gemm_f32(a_all + tile.row0 * k, k, b + tile.col0, n, tile.rows, tile.cols, k, acc);
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t j = 0; j < tile.cols; ++j)
        c[(tile.row0 + r) * n + tile.col0 + j] = from_f32<T>(acc[size_t(r * tile.cols + j)]);
  }

  // Every chunk of every band was waited on above (the tiles cover all rows), so the whole
  // gathered buffer is safe to read.
  if (a_gathered != nullptr) std::copy_n(a_all, s.shape.m * k, a_gathered);
}

// ---------------------------------------------------------------------------------------------
// gemm_rs

template <typename T>
struct GemmRs<T>::State {
  World& world;
  TpShape shape;
  ReduceScatter rs;

  State(World& w, const TpShape& s, const TpConfig& c) : world(w), shape(s), rs(w, make_grid(w, s, c), s.k, "rs_partial") {}
};

template <typename T>
GemmRs<T>::GemmRs(World& world, TpShape shape, TpConfig config) {
  validate_tp(world, shape, config);
  s_ = std::make_unique<State>(world, shape, config);
}

template <typename T>
GemmRs<T>::~GemmRs() = default;

template <typename T>
void GemmRs<T>::run(int rank, const T* a, const T* b, T* c_band) {
  State& s = *s_;
  check_rank(s.world, rank);
  CCFUSE_ARG_CHECK(a != nullptr && b != nullptr && c_band != nullptr, "gemm_rs: a, b and c_band must not be null");
  const int64_t n = s.shape.n;
  const int64_t m_local = s.rs.grid.m_local;

  s.world.barrier(rank);
  const epoch_t epoch = s.rs.partial_ready.begin_call(rank);

  // All partials first, then the reduction: the reduction's waits depend only on other ranks'
  // produce phases, which never wait, so there is no cycle.
  s.rs.produce(rank, a, b, epoch);
  std::vector<float> sum;
  for (int t = 0; t < s.rs.grid.tiles_per_band(); ++t) {
    const Tile tile = s.rs.reduce_tile(rank, t, epoch, sum);
    const int64_t band_row0 = tile.row0 - int64_t(rank) * m_local;
    for (int64_t i = 0; i < tile.rows; ++i)
      for (int64_t j = 0; j < tile.cols; ++j)
        c_band[(band_row0 + i) * n + tile.col0 + j] = from_f32<T>(sum[size_t(i * tile.cols + j)]);
  }
}

// ---------------------------------------------------------------------------------------------
// gemm_ar

template <typename T>
struct GemmAr<T>::State {
  World& world;
  TpShape shape;
  ReduceScatter rs;
  // [M, N] of T on every rank: the owner of band o writes its reduced rows into every rank's
  // copy (the all-gather), so the owner's rounding to T happens once and all ranks hold the
  // same bits. This doubles as the "band buffer" of the reduce-scatter half.
  SymmetricBuffer<T> out;
  // On rank d, index band * m_tiles_per_band + m_tile: that row strip (all N columns) arrived.
  SignalArray band_ready;

  State(World& w, const TpShape& s, const TpConfig& c)
      : world(w),
        shape(s),
        rs(w, make_grid(w, s, c), s.k, "ar_partial"),
        out(w, size_t(s.m) * size_t(s.n)),
        band_ready(w, "ar_band", w.world_size() * rs.grid.m_tiles_per_band()) {}
};

template <typename T>
GemmAr<T>::GemmAr(World& world, TpShape shape, TpConfig config) {
  validate_tp(world, shape, config);
  s_ = std::make_unique<State>(world, shape, config);
}

template <typename T>
GemmAr<T>::~GemmAr() = default;

template <typename T>
void GemmAr<T>::run(int rank, const T* a, const T* b, T* c) {
  State& s = *s_;
  check_rank(s.world, rank);
  CCFUSE_ARG_CHECK(a != nullptr && b != nullptr && c != nullptr, "gemm_ar: a, b and c must not be null");
  const int world_size = s.world.world_size();
  const BandedGrid& grid = s.rs.grid;
  const int64_t n = s.shape.n;
  const int m_tiles = grid.m_tiles_per_band();

  s.world.barrier(rank);
  const epoch_t epoch = s.rs.partial_ready.begin_call(rank);
  // Both arrays advance once per call on every rank, so their epochs stay equal.
  const epoch_t gather_epoch = s.band_ready.begin_call(rank);

  // Reduce-scatter: same schedule as gemm_rs (split along M; K is never split).
  s.rs.produce(rank, a, b, epoch);
  std::vector<float> sum;
  for (int t = 0; t < grid.tiles_per_band(); ++t) {
    const Tile tile = s.rs.reduce_tile(rank, t, epoch, sum);
    for (int d = 0; d < world_size; ++d) {
      // Staggered targets (peer r+1 first), as the reduce-scatter, so owners spread their pushes.
      T* dst = s.out.on((rank + 1 + d) % world_size);
      for (int64_t i = 0; i < tile.rows; ++i)
        for (int64_t j = 0; j < tile.cols; ++j)
          dst[(tile.row0 + i) * n + tile.col0 + j] = from_f32<T>(sum[size_t(i * tile.cols + j)]);
    }
    // A row strip is published once its last column tile is in (tiles run m outer, n inner).
    if (tile.n_tile == grid.n_tiles() - 1)
      for (int d = 0; d < world_size; ++d)
        s.band_ready.notify((rank + 1 + d) % world_size, rank * m_tiles + tile.m_tile, gather_epoch);
  }

  // All-gather: collect the strips, own band first (it needs no peer), then rank-rotated.
  const T* all = s.out.on(rank);
  for (int step = 0; step < world_size; ++step) {
    const int band = ag_band_at(rank, world_size, step);
    for (int m_tile = 0; m_tile < m_tiles; ++m_tile) {
      s.band_ready.wait(rank, band * m_tiles + m_tile, gather_epoch, /*producer=*/band);
      const int64_t row0 = int64_t(band) * grid.m_local + int64_t(m_tile) * grid.block_m;
      const int64_t rows = min_i64(grid.block_m, grid.m_local - int64_t(m_tile) * grid.block_m);
      std::copy_n(all + row0 * n, rows * n, c + row0 * n);
    }
  }
}

template class AgGemm<float>;
template class AgGemm<bf16>;
template class GemmRs<float>;
template class GemmRs<bf16>;
template class GemmAr<float>;
template class GemmAr<bf16>;

}  // namespace ccfuse::ref
