// Fused GEMM + ReduceScatter and GEMM + AllReduce, v1: partial tiles stored to their owner over
// NVLink by the GEMM's epilogue, reduced in the owner's epilogue (ccfuse/tp/gemm_rs.h).
#include "ccfuse/tp/gemm_rs.h"

#include <sstream>
#include <vector>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/common/pace.cuh"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/ranges.h"
#include "ccfuse/gemm/sm90_gemm.cuh"
#include "ccfuse/tp/tuner.h"
#include "src/tp/banded_tiles.cuh"
#include "src/tp/tile_copy.cuh"

namespace ccfuse::tp {

namespace {

constexpr int kBlockM = 128, kBlockN = 256;

// The GEMM's tiles: peers' bands first, staggered, own band last (banded_tiles.cuh).
struct RsSchedule : BandedTiles {
  static constexpr bool kHasReady = false;
  static constexpr bool kHasSide = false;
  __device__ bool wait_ready(const gemm::TileWork&) { return true; }
};

// Flags (on the owner of a band): [src * tiles_per_band + t] = partial tile t of the band from
// rank src; GemmAr adds [W * tiles_per_band + owner * tiles_per_band + t] on every rank = reduced
// tile t of `owner`'s band stored into this rank's output.
template <class Element, bool kAllReduce>
struct RsEpilogue {
  static constexpr bool kHasNotify = false;
  static constexpr gemm::sm90::Activation kAct = gemm::sm90::Activation::kNone;
  static constexpr bool kHasRowScale = false;
  static constexpr bool kHasSendWarps = true;
  static constexpr bool kHasAddends = true;
  static constexpr bool kHasTail = kAllReduce;
  // With the TMA-store epilogue (GemmRsConfig::tma_store): whole tiles go through TMA, the own
  // band's to C, the peers' bands' to the staging buffer (tma_target); a band's last tile, when
  // cut short by the band's end, from registers (out()).
  static constexpr bool kTmaStoreOk = true;
  static constexpr bool kTmaAltC = true;
  // ... and, with GemmRsConfig::tma_addends, a whole own-band tile's peer partials come into the
  // staging buffer by TMA (addend_map: this rank's receive buffer as [W * m_local, N]).
  static constexpr bool kTmaAddends = true;
  const void* addend_map = nullptr;
  bool tma_addends = false;
  // GemmRsConfig::prefetch_addends: the first partial of an own-band tile is loaded while its
  // mainloop runs, once its flag is seen (addend_ready).
  static constexpr bool kPrefetchAddends = true;
  bool prefetch_addends = false;
  // GemmRsConfig::early_handover: a TMA-stored tile that the send warps forward (a peer band's
  // partial; GemmAr's reduced own-band tile) is handed to them a few k-blocks into the next
  // mainloop, not after it.
  static constexpr bool kEarlyHandover = true;
  bool early_handover = false;
  // GemmRsConfig::direct_store (experiment): a peer band's whole tile goes by TMA straight into
  // slot `rank` of the owner's receive buffer (peer_maps: W descriptors, one per rank's buffer as
  // [W * m_local, N]) and its flag is released once the bulk writes are complete; no staging
  // copy, no send warps for it. Cut tiles still go through the staging buffer and the send warps.
  static constexpr bool kTmaDirect = true;
  const void* peer_maps = nullptr;
  bool direct = false;

  Element* recv[kMaxTpRanks] = {};   // every rank's receive buffer [W][m_local][N]
  Element* agout[kMaxTpRanks] = {};  // GemmAr: every rank's symmetric output [M, N]
  Element* staging = nullptr;        // local [M, N]: finished partial tiles of the peers' bands
  Element* c = nullptr;              // this rank's output: [m_local, N] (rs) or [M, N] (ar)
  int64_t m_local = 0, n = 0, ldc = 0;
  int rank = 0, world = 1, m_tiles_per_band = 1, n_tiles = 1;
  bool copy_tail = true;  // GemmAr: C is not the symmetric output, copy the peers' bands into it
  uint64_t forward_spread_ns = 0;  // GemmRsConfig::forward_spread_us (0: unpaced)
  comm::DeviceSignals sig{};
  gemm::TileTrace* trace = nullptr;  // diagnostics (set_trace), null = off
  int trace_slots = 0;

  CCFUSE_HD int band_of(const gemm::TileWork& w) const { return w.m_tile / m_tiles_per_band; }
  CCFUSE_HD int tiles_per_band() const { return m_tiles_per_band * n_tiles; }
  CCFUSE_HD int tile_in_band(const gemm::TileWork& w) const {
    return (w.m_tile % m_tiles_per_band) * n_tiles + w.n_tile;
  }
  CCFUSE_HD int64_t row_in_band(const gemm::TileWork& w) const { return w.row0 - band_of(w) * m_local; }
  CCFUSE_HD int64_t tile_rows(const gemm::TileWork& w) const { return min_i64(int64_t(kBlockM), w.row_end - w.row0); }
  CCFUSE_HD int64_t tile_cols(const gemm::TileWork& w) const {
    return min_i64(int64_t(kBlockN), n - int64_t(w.n_tile) * kBlockN);
  }

  // ---- consumers: the own band adds the peers' partials, then every tile is stored locally ----
  __device__ bool has_addends(const gemm::TileWork& w) const { return world > 1 && band_of(w) == rank; }
  __device__ void wait_addends(const gemm::TileWork& w) const {
    const epoch_t e = comm::current_epoch(sig);
    const int t = tile_in_band(w);
    for (int i = 1; i < world; ++i) {
      const int src = (rank + i) % world;
      // On a watchdog timeout: go on (garbage out); the host raises TimeoutError.
      if (!comm::wait(sig, src * tiles_per_band() + t, e, src)) return;
    }
  }
  __device__ bool addend_ready(const gemm::TileWork& w, int i) const {
    const int src = (rank + 1 + i) % world;
    return comm::test(sig, src * tiles_per_band() + tile_in_band(w), comm::current_epoch(sig));
  }
  __device__ int num_addends(const gemm::TileWork&) const { return world - 1; }
  __device__ int64_t addend_row(const gemm::TileWork& w, int i) const {
    return int64_t((rank + 1 + i) % world) * m_local + row_in_band(w);
  }
  __device__ const Element* addend(const gemm::TileWork& w, int i, int64_t& ld) const {
    ld = n;
    const int src = (rank + 1 + i) % world;
    return recv[rank] + (src * m_local + row_in_band(w)) * n;
  }
  // Own band -> C; a peer's band -> the local staging buffer (the send warps forward it).
  __device__ Element* out(const gemm::sm90::Params<Element>&, const gemm::TileWork& w, int64_t& out_ld) const {
    if (band_of(w) != rank) {
      out_ld = n;
      return staging + w.row0 * n;
    }
    out_ld = ldc;
    return c + (kAllReduce ? w.row0 : row_in_band(w)) * ldc;
  }

  // TMA store: the own band to C (launch's c, [m_local or M, N]) at the tile's row in it, a peer's
  // band to the staging buffer (c_alt, [M, N]) at its row.
  __device__ bool tma_target(const gemm::TileWork& w, int64_t& row) const {
    if (band_of(w) != rank) {
      row = w.row0;
      return true;
    }
    row = kAllReduce ? w.row0 : row_in_band(w);
    return false;
  }

  // ---- send warps: forward each finished tile and release its flag ----
  CCFUSE_HD bool cut(const gemm::TileWork& w) const { return w.row0 + kBlockM > w.row_end; }
  __device__ bool sends(const gemm::TileWork& w) const {
    return band_of(w) != rank ? !direct || cut(w) : kAllReduce && world > 1;
  }
  __device__ const void* tma_direct(const gemm::TileWork& w, int64_t& row) const {
    const int band = band_of(w);
    if (!direct || band == rank) return nullptr;
    row = int64_t(rank) * m_local + row_in_band(w);
    return static_cast<const char*>(peer_maps) + size_t(band) * sizeof(gemm::sm90::TmaDescriptor);
  }
  __device__ void stored_direct(const gemm::TileWork& w) const {
    comm::notify(sig, band_of(w), rank * tiles_per_band() + tile_in_band(w), comm::current_epoch(sig));
  }
  __device__ void send(const gemm::TileWork& w, int tid, int num_threads) const {
    const int band = band_of(w);
    const int64_t col0 = int64_t(w.n_tile) * kBlockN;
    if (band != rank) {  // partial -> slot `rank` of the owner's receive buffer
      const Element* from = staging + w.row0 * n + col0;
      Element* to = recv[band] + (rank * m_local + row_in_band(w)) * n + col0;
      const int64_t rows = tile_rows(w), cols = tile_cols(w);
      if (forward_spread_ns == 0) {
        copy_tile(from, n, to, n, rows, cols, tid, num_threads);
        return;
      }
      // Paced (GemmRsConfig::forward_spread_us): slice s of kSlices not before t0 + s / kSlices
      // of the spread.
      constexpr int kSlices = 8;
      const int64_t step = (rows + kSlices - 1) / kSlices;
      const uint64_t t0 = pace_start(forward_spread_ns);
      for (int s = 0; s < kSlices && s * step < rows; ++s) {
        pace_until(t0, forward_spread_ns, s, kSlices);
        copy_tile(from + s * step * n, n, to + s * step * n, n, min_i64(step, rows - s * step), cols, tid, num_threads);
      }
    } else {  // GemmAr: reduced tile -> every peer's output
      for (int i = 1; i < world; ++i)
        copy_tile(c + w.row0 * ldc + col0, ldc, agout[(rank + i) % world] + w.row0 * n + col0, n, tile_rows(w),
                  tile_cols(w), tid, num_threads);
    }
  }
  __device__ void notify_sent(const gemm::TileWork& w) const {
    const epoch_t e = comm::current_epoch(sig);
    const int band = band_of(w), t = tile_in_band(w);
    if (band != rank) {
      comm::notify(sig, band, rank * tiles_per_band() + t, e);
    } else if constexpr (kAllReduce) {
      for (int i = 1; i < world; ++i)
        comm::notify(sig, (rank + i) % world, world * tiles_per_band() + rank * tiles_per_band() + t, e);
    }
  }
  __device__ void notify(const gemm::TileWork&) const {}
  __device__ void send_prologue(int64_t, int64_t, int, int) const {}

  // GemmAr, consumer threads of each GEMM CTA after its last tile: the peers' reduced tiles
  // (strided over the CTAs), waited for and copied from the symmetric output into C.
  __device__ void tail(int consumer_idx, int64_t cta, int64_t num_ctas) const {
    if constexpr (kAllReduce) {
      constexpr int kThreads = 256;
      const epoch_t e = comm::current_epoch(sig);
      const int64_t total = int64_t(world - 1) * tiles_per_band();
      for (int64_t idx = cta; idx < total; idx += num_ctas) {
        const int owner = int((rank + 1 + idx / tiles_per_band()) % world);
        const int t = int(idx % tiles_per_band());
        if (consumer_idx == 0) (void)comm::wait(sig, world * tiles_per_band() + owner * tiles_per_band() + t, e, owner);
        asm volatile("bar.sync 1, %0;" ::"n"(kThreads));
        if (!copy_tail) continue;
        const int64_t row0 = owner * m_local + int64_t(t / n_tiles) * kBlockM;
        const int64_t rows = min_i64(int64_t(kBlockM), (owner + 1) * m_local - row0);
        const int64_t col0 = int64_t(t % n_tiles) * kBlockN;
        copy_tile(agout[rank] + row0 * n + col0, n, c + row0 * ldc + col0, ldc, rows,
                  min_i64(int64_t(kBlockN), n - col0), consumer_idx, kThreads);
      }
    }
  }
};

}  // namespace

// The TMA-store epilogue runs where asked for, unclustered, with rows of a multiple of 16 bytes.
static bool rs_tma_store(const GemmRsConfig& c, int64_t n) { return c.tma_store && c.cluster_m == 1 && n % 8 == 0; }

std::string to_string(const GemmRsConfig& c, int num_sms, bool all_reduce, int64_t n) {
  std::ostringstream os;
  const bool tma = rs_tma_store(c, n);
  os << "block=" << kBlockM << "x" << kBlockN << "x64 stages=" << (tma ? 3 : 4)
     << " epilogue="
     << (tma ? (c.tma_addends ? (c.prefetch_addends ? "tma_store+tma_addends(prefetched)" : "tma_store+tma_addends")
                              : "tma_store")
             : "registers")
     << (tma && c.direct_store ? " peer_tiles=tma-direct" : "")
     << (c.forward_spread_us > 0 ? " forward_spread=" + std::to_string(c.forward_spread_us) + "us" : "")
     << (tma && !c.early_handover ? " handover=after-next-mainloop" : "")
     << " cluster=" << c.cluster_m
     << (c.overlap_entry ? " entry=pdl" : "") << " sms=" << (c.num_sms > 0 ? c.num_sms : num_sms)
     << " group_m=" << c.group_m << " bands=staggered(own last) reduce=epilogue(fp32)"
     << (all_reduce ? " allgather=epilogue-stores+tail-copy" : "");
  return os.str();
}

// The state and launch shared by GemmRs and GemmAr.
struct RsState {
  comm::Team& team;
  GemmRsDesc desc;
  GemmRsConfig cfg;
  bool all_reduce;
  int64_t m_local = 0;
  int m_tiles_per_band = 0, n_tiles = 0;
  std::unique_ptr<comm::SymmetricBuffer> recv, agout;
  void* staging = nullptr;  // local [M, N]
  void* addend_map = nullptr;  // device copy of the receive buffer's TMA descriptor (tma_addends)
  void* peer_maps = nullptr;   // direct_store: every rank's receive buffer's TMA-store descriptor
  gemm::TileTrace* trace = nullptr;
  int trace_slots = 0;
  std::unique_ptr<comm::SignalSet> sig;

  ~RsState();
  RsState(comm::Team& t, const GemmRsDesc& d, const GemmRsConfig& c, bool ar)
      : team(t), desc(d), cfg(c), all_reduce(ar) {
    const char* op = ar ? "gemm_ar" : "gemm_rs";
    const int w = team.world_size();
    CCFUSE_ARG_CHECK(d.world_size == 0 || d.world_size == w, op, ": desc.world_size ", d.world_size,
                     " does not match the Team's world size ", w);
    CCFUSE_ARG_CHECK(w <= kMaxTpRanks, op, ": world size ", w, " exceeds ", kMaxTpRanks);
    CCFUSE_ARG_CHECK(d.m > 0 && d.n > 0 && d.k > 0, op, ": m, n, k must be positive (got ", d.m, ", ", d.n, ", ",
                     d.k, ")");
    CCFUSE_ARG_CHECK(d.m % w == 0, op, ": m ", d.m, " is not divisible by the world size ", w);
    CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16 || d.dtype == DType::kFloat16, op, ": dtype must be bf16 or fp16, not ",
                     dtype_name(d.dtype));
    CCFUSE_ARG_CHECK(cfg.group_m >= 1, op, ": group_m ", cfg.group_m, " must be at least 1");
    CCFUSE_ARG_CHECK(cfg.forward_spread_us >= -1 && cfg.forward_spread_us <= 10000, op, ": forward_spread_us ",
                     cfg.forward_spread_us, " must be -1 (auto) or in [0, 10000] microseconds");
    CCFUSE_ARG_CHECK(cfg.cluster_m == 1 || cfg.cluster_m == 2, op, ": cluster_m ", cfg.cluster_m, " must be 1 or 2");
    gemm::validate(gemm::make_desc(d.m, d.n, d.k, d.dtype, d.b_layout), gemm::GemmConfig{kBlockM, kBlockN, 64, 4, 0});
    m_local = d.m / w;
    m_tiles_per_band = int(ceil_div(m_local, kBlockM));
    CCFUSE_ARG_CHECK(cfg.cluster_m != 2 || m_tiles_per_band % 2 == 0, op, ": cluster_m 2 needs an even number of ",
                     "128-row tiles per band (m / world_size = ", m_local, " gives ", m_tiles_per_band, ")");
    n_tiles = int(ceil_div(d.n, kBlockN));
    if (cfg.forward_spread_us < 0)  // auto: tp::rs_forward_spread_us (paced where the GEMM has >= 3 waves)
      cfg.forward_spread_us =
          rs_forward_spread_us(w, d.m, d.n, cfg.num_sms > 0 ? cfg.num_sms : gemm::current_device_sms());
    const int64_t tpb = int64_t(m_tiles_per_band) * n_tiles;
    CCFUSE_ARG_CHECK(tpb * w * (ar ? 2 : 1) < int64_t(1) << 30, op, ": too many tiles (", tpb * w, ")");
    recv = team.alloc_symmetric(size_t(d.m * d.n) * 2);
    CCFUSE_CUDA_CHECK(cudaMalloc(&staging, size_t(d.m * d.n) * 2));
    if (ar) agout = team.alloc_symmetric(size_t(d.m * d.n) * 2);
    if (rs_tma_store(cfg, d.n) && cfg.tma_addends) {
      const gemm::sm90::TmaDescriptor map = staging_map<cute::SM90_TMA_LOAD>(recv->local(), d);
      CCFUSE_CUDA_CHECK(cudaMalloc(&addend_map, sizeof(map)));
      CCFUSE_CUDA_CHECK(cudaMemcpy(addend_map, &map, sizeof(map), cudaMemcpyHostToDevice));
    }
    if (rs_tma_store(cfg, d.n) && cfg.direct_store) {
      std::vector<gemm::sm90::TmaDescriptor> maps(static_cast<size_t>(w));
      for (int r = 0; r < w; ++r) maps[size_t(r)] = staging_map<cute::SM90_TMA_STORE>(recv->peer(r), d);
      CCFUSE_CUDA_CHECK(cudaMalloc(&peer_maps, maps.size() * sizeof(maps[0])));
      CCFUSE_CUDA_CHECK(cudaMemcpy(peer_maps, maps.data(), maps.size() * sizeof(maps[0]), cudaMemcpyHostToDevice));
    }
    sig = team.make_signals(op, int(tpb * w * (ar ? 2 : 1)));
  }

  // A receive buffer ([W * m_local, N] = [M, N]) as a TMA tensor in the staging buffer's box and
  // swizzle (the same for both B layouts), built once.
  template <class Op>
  static gemm::sm90::TmaDescriptor staging_map(const void* buf, const GemmRsDesc& d) {
    if (d.dtype == DType::kBFloat16)
      return gemm::sm90::make_staging_map<gemm::sm90::Traits<cutlass::bfloat16_t, kBlockM, kBlockN, 64, 3, true, 1, true>,
                                          Op>(static_cast<const cutlass::bfloat16_t*>(buf), d.m, d.n);
    return gemm::sm90::make_staging_map<gemm::sm90::Traits<cutlass::half_t, kBlockM, kBlockN, 64, 3, true, 1, true>, Op>(
        static_cast<const cutlass::half_t*>(buf), d.m, d.n);
  }

  void run(const void* a, const void* b, void* c, cudaStream_t stream) {
    const GemmRsDesc& d = desc;
    const char* op = all_reduce ? "gemm_ar" : "gemm_rs";
    team.check_watchdog();  // a timeout of an earlier call is reported here, not swallowed
    CCFUSE_ARG_CHECK(a != nullptr && b != nullptr && c != nullptr, op, ": a, b and c must be device pointers");
    for (auto [ptr, name] : {std::pair<const void*, const char*>{a, "a"}, {b, "b"}, {c, "c"}})
      CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, op, ": ", name, " (", ptr,
                       ") must be 16-byte aligned");
    const size_t es = 2;
    const size_t c_bytes = size_t((all_reduce ? d.m : m_local) * d.n) * es;
    CCFUSE_ARG_CHECK(!bytes_overlap(c, c_bytes, a, size_t(d.m * d.k) * es), op, ": output c overlaps input a");
    CCFUSE_ARG_CHECK(!bytes_overlap(c, c_bytes, b, size_t(d.n * d.k) * es), op, ": output c overlaps input b");
    CCFUSE_ARG_CHECK(!bytes_overlap(c, c_bytes, recv->local(), size_t(d.m * d.n) * es), op,
                     ": output c overlaps the receive buffer");
    if (d.dtype == DType::kBFloat16) launch<cutlass::bfloat16_t>(a, b, c, stream);
    else launch<cutlass::half_t>(a, b, c, stream);
  }

  template <class E>
  void launch(const void* a, const void* b, void* c, cudaStream_t stream) {
    if (all_reduce) launch_mode<E, true>(a, b, c, stream);
    else launch_mode<E, false>(a, b, c, stream);
  }

  template <class E, bool kAr>
  void launch_mode(const void* a, const void* b, void* c, cudaStream_t stream) {
    sig->begin_call(stream);  // entry barrier (peers done reading their buffers) + epoch
    launch_epi<E, kAr, RsEpilogue<E, kAr>>(a, b, c, stream);
  }

  template <class E, bool kAr, class Epi>
  void launch_epi(const void* a, const void* b, void* c, cudaStream_t stream) {
    const GemmRsDesc& d = desc;
    const int w = team.world_size();
    RsSchedule sched;
    sched.m_tiles_per_band = m_tiles_per_band;
    sched.n_tiles = n_tiles;
    sched.group_m = cfg.group_m;
    sched.rank = team.rank();
    sched.world = w;
    sched.m_local = m_local;
    sched.peers_first = true;
    Epi epi;
    for (int r = 0; r < w; ++r) {
      epi.recv[r] = static_cast<E*>(recv->peer(r));
      if (kAr) epi.agout[r] = static_cast<E*>(agout->peer(r));
    }
    epi.c = static_cast<E*>(c);
    epi.staging = static_cast<E*>(staging);
    epi.addend_map = addend_map;
    epi.tma_addends = addend_map != nullptr;
    epi.prefetch_addends = cfg.prefetch_addends;
    epi.early_handover = cfg.early_handover;
    epi.forward_spread_ns = uint64_t(cfg.forward_spread_us) * 1000u;
    epi.peer_maps = peer_maps;
    epi.direct = peer_maps != nullptr;
    epi.m_local = m_local;
    epi.n = d.n;
    epi.ldc = d.n;
    epi.rank = team.rank();
    epi.world = w;
    epi.m_tiles_per_band = m_tiles_per_band;
    epi.n_tiles = n_tiles;
    epi.copy_tail = !kAr || c != agout->local();
    epi.sig = sig->device();
    epi.trace = trace;
    epi.trace_slots = trace_slots;
    const int sms = cfg.num_sms > 0 ? cfg.num_sms : gemm::current_device_sms();
    const int64_t ldb = d.b_layout == gemm::BLayout::kKN ? d.n : d.k;
    const bool nk = d.b_layout == gemm::BLayout::kNK;
    if (rs_tma_store(cfg, d.n)) {  // 3 stages: the staging tile takes the fourth's shared memory
      if (nk) launch<gemm::sm90::Traits<E, kBlockM, kBlockN, 64, 3, true, 1, true>>(a, b, ldb, c, sched, epi, sms, stream);
      else launch<gemm::sm90::Traits<E, kBlockM, kBlockN, 64, 3, false, 1, true>>(a, b, ldb, c, sched, epi, sms, stream);
    } else if (cfg.cluster_m == 2) {
      if (nk) launch<gemm::sm90::Traits<E, kBlockM, kBlockN, 64, 4, true, 2>>(a, b, ldb, c, sched, epi, sms, stream);
      else launch<gemm::sm90::Traits<E, kBlockM, kBlockN, 64, 4, false, 2>>(a, b, ldb, c, sched, epi, sms, stream);
    } else {
      if (nk) launch<gemm::sm90::Traits<E, kBlockM, kBlockN, 64, 4, true>>(a, b, ldb, c, sched, epi, sms, stream);
      else launch<gemm::sm90::Traits<E, kBlockM, kBlockN, 64, 4, false>>(a, b, ldb, c, sched, epi, sms, stream);
    }
  }
  template <class T, class Epi>
  void launch(const void* a, const void* b, int64_t ldb, void* c, const RsSchedule& sched, const Epi& epi, int sms,
              cudaStream_t stream) {
    const GemmRsDesc& d = desc;
    gemm::sm90::launch_gemm<T>(d.m, d.n, d.k, a, d.k, b, ldb, c, d.n, sched, epi, sms, stream, 1, 0, nullptr, 0,
                               cfg.overlap_entry && T::kClusterM == 1, all_reduce ? d.m : m_local, staging, d.m);
  }
};

RsState::~RsState() {
  cudaFree(staging);
  cudaFree(addend_map);
  cudaFree(peer_maps);
}

struct GemmRs::State : RsState {
  using RsState::RsState;
};
struct GemmAr::State : RsState {
  using RsState::RsState;
};

GemmRs::GemmRs(comm::Team& team, const GemmRsDesc& d, GemmRsConfig cfg) : s_(new State(team, d, cfg, false)) {}
GemmRs::~GemmRs() = default;
void GemmRs::run(const void* a, const void* b, void* c, cudaStream_t stream) { s_->run(a, b, c, stream); }
void GemmRs::set_trace(gemm::TileTrace* records, int slots_per_cta) {
  s_->trace = records;
  s_->trace_slots = records != nullptr ? slots_per_cta : 0;
}

GemmAr::GemmAr(comm::Team& team, const GemmRsDesc& d, GemmRsConfig cfg) : s_(new State(team, d, cfg, true)) {}
GemmAr::~GemmAr() = default;
void* GemmAr::output() const { return s_->agout->local(); }
void GemmAr::run(const void* a, const void* b, void* c, cudaStream_t stream) { s_->run(a, b, c, stream); }
void GemmAr::set_trace(gemm::TileTrace* records, int slots_per_cta) {
  s_->trace = records;
  s_->trace_slots = records != nullptr ? slots_per_cta : 0;
}

}  // namespace ccfuse::tp
