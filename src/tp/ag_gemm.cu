// Fused AllGather + GEMM: this rank's A band reaches the peers by the GEMM CTAs' send warps or by
// the copy engine; the GEMM's producers wait per 128-row chunk (docs/tp-fusion.md).
#include "ccfuse/tp/ag_gemm.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/ranges.h"
#include "ccfuse/common/pace.cuh"
#include "ccfuse/gemm/sm90_gemm.cuh"
#include "src/tp/banded_tiles.cuh"
#include "src/tp/tile_copy.cuh"

namespace ccfuse::tp {

namespace {

constexpr int kBlockM = 128;
constexpr int kMaxAgRanks = 8;

// The schedule of one rank's fused ag_gemm kernel (see sm90_gemm.cuh for the hooks): bands in
// rank-rotated order, own band first (banded_tiles.cuh). The producer of a tile waits for its
// 128-row chunk: all `pieces` flags of it, published by the band's rank. A band of M / W rows
// not a multiple of 128 ends in a short chunk; its tile's rows past the band (the next band's
// rows, or TMA's zeros past M) are computed from whatever is there and never stored.
struct AgSchedule : BandedTiles {
  int block_n = 256;  // the kernel's tile width (launch_ag_layout picks the Traits by it)
  int pieces = 1;
  // Chunks per flag: 1 with send warps; copy_rows / 128 with the copy engine (one flag a copy),
  // and flags (of `pieces` each) per band: m_tiles_per_band, or the copies of a band.
  int chunks_per_flag = 1;
  int flags_per_band = 0;
  // The own band is in the gather buffer before the kernel starts (copy engine, the caller wrote
  // local_a()): its tiles wait for nothing.
  bool own_ready = false;
  // The own band is read in place from a_local (second TMA descriptor) when the caller passed
  // one: its tiles wait for nothing.
  static constexpr bool kHasAltA = true;
  bool own_in_place = false;
  int64_t alt_a_row0 = 0;  // rank * m_local
  CCFUSE_HD bool alt_a(const gemm::TileWork& w) const { return own_in_place && w.m_tile / m_tiles_per_band == rank; }
  comm::DeviceSignals sig{};
  // Producer-thread state: the call's epoch (0 = read it from the device; the copy engine's
  // fixed-value flags set it to 1 on the host), the chunks already seen complete, and whether the
  // entry barrier kernel is known complete (griddep_wait: with PDL the kernel may start before it).
  epoch_t epoch = 0;
  bool entered = false;
  uint64_t seen[4] = {};

  static constexpr bool kHasReady = true;
  static constexpr bool kHasSide = false;
  // A band's last tile may end inside M (M / W not a multiple of 128): the engine stores whole
  // tiles through TMA and a cut one from registers, which stop at the band's end (the last
  // band's by TMA too: its end is M, where TMA clips; sm90::tma_store_tile).
  static constexpr bool kTmaStoreOk = false;

  __device__ bool wait_ready(const gemm::TileWork& w) {
    if (alt_a(w)) return true;
    const int chunk = w.m_tile;
    if (own_ready && chunk / m_tiles_per_band == rank) return true;
    const bool cacheable = chunk < 256;
    if (cacheable && (seen[chunk / 64] >> (chunk % 64) & 1)) return true;
    if (!entered) {
      gemm::sm90::griddep_wait();  // the epoch and the flags are the entry barrier's (a no-op without PDL)
      entered = true;
    }
    if (epoch == 0) epoch = comm::current_epoch(sig);
    bool ok = true;
    const int band = chunk / m_tiles_per_band;
    const int flag0 = (band * flags_per_band + chunk % m_tiles_per_band / chunks_per_flag) * pieces;
    for (int pc = 0; pc < pieces && ok; ++pc) ok = comm::wait(sig, flag0 + pc, epoch, band);
    // The rows were written through the generic proxy (by a peer, or this GPU's send warps); TMA
    // reads them through the async proxy.
    asm volatile("fence.proxy.async.global;" ::: "memory");
    if (ok && cacheable) seen[chunk / 64] |= uint64_t(1) << (chunk % 64);
    return ok;
  }
};

// The epilogue stores to the local C as usual; its send warps push this rank's A band, before
// any tile, into every rank's gather buffer, one piece of a 128-row chunk at a time, each
// released with its own flag (a piece past the end of a short last chunk copies nothing and is
// flagged all the same): to the peers first (rank + 1, ...), to this rank's own gather
// buffer last (for gathered_a(): its own tiles read A_r in place), or only to the peers when A_r
// was written into local_a() by the caller. Pieces are spread over
// all GEMM CTAs so that the whole chip's NVLink bandwidth serves the push.
struct AgPushEpilogue : gemm::sm90::PlainEpilogue {
  static constexpr bool kHasSendWarps = true;
  comm::DeviceSignals sig{};
  const char* src = nullptr;                 // own band [m_local, K], or nullptr: already in place
  char* gather[kMaxAgRanks] = {};            // every rank's gather buffer [M, K]
  int64_t band_offset_bytes = 0;             // rank * m_local * K * 2
  int64_t row_bytes = 0;                     // K * 2
  int64_t m_local = 0;                       // rows of a band (M / W)
  int rank = 0, world = 1, m_tiles_per_band = 0, pieces = 1, rows_per_piece = kBlockM;
  int push_ctas = 0;  // 0: every CTA pushes
  bool copy_own = true;      // AgGemmConfig::return_gathered: also fill this rank's own gather slot
  uint64_t spread_ns = 0;    // AgGemmConfig::push_spread_us (0 = one burst)
  gemm::TileTrace* trace = nullptr;  // diagnostics (set_trace), null = off
  int trace_slots = 0;

  __device__ bool sends(const gemm::TileWork&) const { return false; }
  __device__ void send(const gemm::TileWork&, int, int) const {}
  __device__ void notify_sent(const gemm::TileWork&) const {}
  __device__ void send_prologue(int64_t cta, int64_t num_ctas, int tid, int num_threads) const {
    const epoch_t e = comm::current_epoch(sig);
    const int64_t total = int64_t(m_tiles_per_band) * pieces;
    const int64_t pushers = push_ctas > 0 && push_ctas < num_ctas ? push_ctas : num_ctas;
    const uint64_t t0 = pace_start(spread_ns);
    for (int64_t piece = cta; piece < total; piece += pushers) {
      pace_until(t0, spread_ns, piece, total);  // piece i of the band not before t0 + i / total of the spread
      const int chunk = int(piece / pieces), pc = int(piece % pieces);
      const int64_t row0 = int64_t(chunk) * kBlockM + int64_t(pc) * rows_per_piece;
      const int64_t offset = band_offset_bytes + row0 * row_bytes;
      const int64_t bytes = max(int64_t(0), min(int64_t(rows_per_piece), m_local - row0)) * row_bytes;
      for (int i = 1; i <= world; ++i) {
        // With A_r in place in local_a() (src null) this rank's own flags go first: its own tiles
        // read the gather buffer and wait for them (there is nothing to copy).
        const int p = src != nullptr ? (rank + i) % world : (rank + i - 1) % world;
        if (src != nullptr && p == rank && !copy_own) continue;  // nobody reads that slot or waits for its flag
        if ((src != nullptr || p != rank) && bytes > 0)
          copy_contiguous(src != nullptr ? src + (offset - band_offset_bytes) : gather[rank] + offset, gather[p] + offset,
                          bytes, tid, num_threads);
        asm volatile("bar.sync 2, %0;" ::"r"(num_threads));  // every send thread's stores before the flag
        if (tid == 0) comm::notify(sig, p, (rank * m_tiles_per_band + chunk) * pieces + pc, e);
      }
    }
  }
};

// Copy-engine transport: the plain epilogue (no send warps: the standalone engine's 40/232
// register split), with tile traces.
struct AgCeEpilogue : gemm::sm90::PlainEpilogue {
  gemm::TileTrace* trace = nullptr;
  int trace_slots = 0;
};

}  // namespace

const char* transport_name(AgTransport t) { return t == AgTransport::kCopyEngine ? "copy-engine" : "sm-send-warps"; }

struct AgGemm::State {
  comm::Team& team;
  AgGemmDesc desc;
  AgGemmConfig cfg;
  int64_t m_local = 0;
  std::unique_ptr<comm::SymmetricBuffer> gather;
  std::unique_ptr<comm::SignalSet> sig;
  gemm::TileTrace* trace = nullptr;
  int trace_slots = 0;
  // Copy engine: fixed-value flags (one per copy of every band), a side stream per peer, events.
  std::unique_ptr<comm::SignalSet> ce_sig;
  int copy_rows = 0;
  int block_n = 256;  // the kernel's tile width (AgGemmConfig::block_n; 0 = 256)
  std::vector<cudaStream_t> side;
  cudaEvent_t start = nullptr;
  std::vector<cudaEvent_t> done;
  State(comm::Team& t, const AgGemmDesc& d, const AgGemmConfig& c) : team(t), desc(d), cfg(c) {}
  ~State() {
    for (cudaStream_t st : side) cudaStreamDestroy(st);
    for (cudaEvent_t e : done) cudaEventDestroy(e);
    if (start) cudaEventDestroy(start);
  }
};

// Rows per copy of the copy engine: the most 128-row chunks (a power of two dividing the band's
// chunks, the last one short where M / W is not a multiple of 128) that keep a copy at or under
// 4 MiB and the band at 4 or more copies; at least one chunk.
int auto_copy_rows(int64_t m_local, int64_t k) {
  const int64_t chunks = ceil_div(m_local, int64_t(kBlockM)), chunk_bytes = kBlockM * k * 2;
  int64_t c = 1;
  while (chunks % (2 * c) == 0 && 2 * c * chunk_bytes <= (int64_t(4) << 20) && chunks / (2 * c) >= 4) c *= 2;
  return int(c * kBlockM);
}

// Pieces per 128-row chunk: the fewest (a power of two, at most 32) that give every GEMM CTA's
// send warps a piece of the push.
int pieces_for(const AgGemmConfig& c, int64_t chunks_local, int gemm_ctas) {
  if (c.pieces_per_chunk > 0) return c.pieces_per_chunk;
  int p = 1;
  while (p < 32 && chunks_local * p < gemm_ctas) p *= 2;
  return p;
}

// The tile width: AgGemmConfig::block_n, or for 0 tp::ag_block_n's rule where 192 is built
// (send warps, cluster 1; n a multiple of 8 is the rule's own condition).
int auto_block_n(const AgGemmConfig& c, const AgGemmDesc& d, int gemm_ctas) {
  if (c.block_n != 0) return c.block_n;
  if (c.transport != AgTransport::kSendWarps || c.cluster_m != 1) return 256;
  return ag_block_n(d.m, d.n, gemm_ctas);
}

std::string fraction_string(double f) {
  std::ostringstream os;
  os << f;
  return os.str();
}

std::string to_string(const AgGemmConfig& c, int num_sms, const AgGemmDesc* desc) {
  std::ostringstream os;
  const int gemm_ctas = c.num_sms > 0 ? c.num_sms : num_sms;
  const int block_n = desc != nullptr ? auto_block_n(c, *desc, gemm_ctas) : c.block_n == 192 ? 192 : 256;
  os << "gemm_ctas=" << gemm_ctas << " block=128x" << block_n
     << "x64 epilogue=tma_store(n%8==0) cluster="
     << c.cluster_m << " chunk_rows=" << kBlockM;
  if (c.transport == AgTransport::kCopyEngine) {
    os << " group_m=" << c.group_m << " push=" << transport_name(c.transport) << "(copy_rows="
       << (c.copy_rows > 0 ? std::to_string(c.copy_rows) : std::string("auto")) << ")";
    return os.str();
  }
  os << " pieces_per_chunk=" << (c.pieces_per_chunk > 0 ? std::to_string(c.pieces_per_chunk) : std::string("auto"))
     << " group_m=" << c.group_m << " push=send-warps"
     << (c.push_ctas > 0 ? "(" + std::to_string(c.push_ctas) + " ctas)" : std::string())
     << (c.push_spread_us > 0 ? " push_spread=" + std::to_string(c.push_spread_us) + "us"
         : c.push_spread_us < 0 ? " push_spread=auto(" + fraction_string(c.push_spread_fraction) + " of a band)"
                                : std::string(" push_spread=0"))
     << (c.return_gathered ? "" : " gathered=peers-only") << (c.overlap_entry ? " entry=pdl" : "");
  return os.str();
}

AgGemm::AgGemm(comm::Team& team, const AgGemmDesc& d, AgGemmConfig cfg) : s_(new State(team, d, cfg)) {
  const int w = team.world_size();
  CCFUSE_ARG_CHECK(w <= kMaxAgRanks, "ag_gemm: world size ", w, " exceeds ", kMaxAgRanks);
  CCFUSE_ARG_CHECK(d.m > 0 && d.n > 0 && d.k > 0, "m, n, k must be positive (got ", d.m, ", ", d.n, ", ", d.k, ")");
  CCFUSE_ARG_CHECK(d.m % w == 0, "m ", d.m, " is not divisible by the world size ", w);
  s_->m_local = d.m / w;
  CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16 || d.dtype == DType::kFloat16, "ag_gemm: dtype must be bf16 or fp16, not ",
                   dtype_name(d.dtype));
  CCFUSE_ARG_CHECK(cfg.push_ctas >= 0, "push_ctas ", cfg.push_ctas, " must not be negative (0 = every CTA)");
  CCFUSE_ARG_CHECK(cfg.push_spread_us >= -1 && cfg.push_spread_us <= 100000, "push_spread_us ", cfg.push_spread_us,
                   " must be -1 (auto) or in [0, 100000]");
  CCFUSE_ARG_CHECK(cfg.pieces_per_chunk == 0 || (cfg.pieces_per_chunk <= 32 && (cfg.pieces_per_chunk & (cfg.pieces_per_chunk - 1)) == 0),
                   "pieces_per_chunk ", cfg.pieces_per_chunk, " must be 0 (auto) or a power of two up to 32");
  CCFUSE_ARG_CHECK(cfg.transport == AgTransport::kSendWarps || cfg.transport == AgTransport::kCopyEngine,
                   "ag_gemm: transport ", int(cfg.transport), " is not an AgTransport");
  CCFUSE_ARG_CHECK(cfg.cluster_m == 1 || cfg.cluster_m == 2, "cluster_m ", cfg.cluster_m, " must be 1 or 2");
  CCFUSE_ARG_CHECK(cfg.cluster_m != 2 || s_->m_local % (2 * kBlockM) == 0, "cluster_m 2 needs m / world_size = ",
                   s_->m_local, " to be a multiple of 256 (tile pairs inside a band)");
  CCFUSE_ARG_CHECK(cfg.copy_rows == 0 || (cfg.copy_rows > 0 && cfg.copy_rows % kBlockM == 0),
                   "copy_rows ", cfg.copy_rows, " must be 0 (auto) or a positive multiple of 128");
  gemm::validate(gemm::make_desc(d.m, d.n, d.k, d.dtype, d.b_layout), gemm::GemmConfig{128, 256, 64, 4, 0});
  CCFUSE_ARG_CHECK(cfg.block_n == 0 || cfg.block_n == 256 || cfg.block_n == 192, "block_n ", cfg.block_n,
                   " must be 0 (= 256), 256 or 192");
  CCFUSE_ARG_CHECK(cfg.block_n != 192 || (d.n % 8 == 0 && cfg.cluster_m == 1 && cfg.transport == AgTransport::kSendWarps),
                   "block_n 192 is built for the TMA-store epilogue with send warps: it needs n (", d.n,
                   ") a multiple of 8, cluster_m 1 (got ", cfg.cluster_m, ") and the send-warp transport");
  // Measured 2026-12-06 (one H100, W = 2): every rank's copies waited while both GEMMs waited
  // for them, until the watchdog (a same-GPU copy is not a peer copy engine transfer).
  CCFUSE_ARG_CHECK(cfg.transport != AgTransport::kCopyEngine || !team.shares_device(),
                   "transport copy-engine needs every rank on its own GPU: in a one-GPU world (ranks sharing GPU ",
                   team.device(), ") the copies do not run beside the GEMMs that wait for them");
  const int gemm_ctas = cfg.num_sms > 0 ? cfg.num_sms : gemm::current_device_sms();
  s_->block_n = auto_block_n(cfg, d, gemm_ctas);
  if (cfg.push_spread_us < 0) {  // auto: a fraction of the model's time for one band (tp::ag_push_spread_us)
    TpProblem p;
    p.op = "ag_gemm";
    p.world_size = w;
    p.m = d.m;
    p.n = d.n;
    p.k_per_rank = d.k;
    p.dtype = d.dtype;
    p.num_sms = gemm_ctas;
    s_->cfg.push_spread_us = cfg.transport == AgTransport::kSendWarps ? ag_push_spread_us(p, cfg.push_spread_fraction) : 0;
  }
  s_->gather = team.alloc_symmetric(size_t(d.m * d.k) * 2);
  const int64_t chunks = ceil_div(s_->m_local, int64_t(kBlockM));  // per band
  s_->sig = team.make_signals("ag_gemm", int(w * chunks) * 32);      // room for 32 pieces per chunk
  if (cfg.transport == AgTransport::kCopyEngine) {
    s_->copy_rows = cfg.copy_rows > 0 ? cfg.copy_rows : auto_copy_rows(s_->m_local, d.k);
    s_->ce_sig = team.make_signals("ag_gemm.copy_engine", int(w * ceil_div(s_->m_local, int64_t(s_->copy_rows))));
    CCFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&s_->start, cudaEventDisableTiming));
    for (int i = 1; i < w; ++i) {
      cudaStream_t st = nullptr;
      CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      s_->side.push_back(st);
      cudaEvent_t e = nullptr;
      CCFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      s_->done.push_back(e);
    }
  }
}

AgGemm::~AgGemm() = default;

void* AgGemm::local_a() const {
  return static_cast<char*>(s_->gather->local()) + size_t(s_->team.rank() * s_->m_local * s_->desc.k) * 2;
}
const void* AgGemm::gathered_a() const { return s_->gather->local(); }
void AgGemm::set_trace(gemm::TileTrace* records, int slots_per_cta) {
  s_->trace = records;
  s_->trace_slots = records != nullptr ? slots_per_cta : 0;
}

namespace {
// The TMA-store epilogue (3 stages + swizzled C staging, stores overlapped with the next tile)
// when C's rows are 16-byte aligned (n a multiple of 8), in 2-CTA clusters when asked for; the
// register epilogue (4 stages, no clusters) otherwise.
template <class E, bool kNK, class Epi>
void launch_ag_layout(const AgGemmDesc& d, const void* gathered, const void* a_local, int64_t m_local,
                      const AgSchedule& sched, const Epi& epi, const void* b, void* c, int sms, int cluster_m,
                      bool pdl, cudaStream_t stream) {
  const int64_t ldb = kNK ? d.k : d.n;
  if (sched.block_n == 192)  // validated: n % 8 == 0, cluster_m 1
    gemm::sm90::launch_gemm<gemm::sm90::Traits<E, 128, 192, 64, 4, kNK, 1, true>>(
        d.m, d.n, d.k, gathered, d.k, b, ldb, c, d.n, sched, epi, sms, stream, 1, 0, a_local, m_local, pdl);
  else if (d.n % 8 == 0 && cluster_m == 2)
    gemm::sm90::launch_gemm<gemm::sm90::Traits<E, 128, 256, 64, 3, kNK, 2, true>>(
        d.m, d.n, d.k, gathered, d.k, b, ldb, c, d.n, sched, epi, sms, stream, 1, 0, a_local, m_local);
  else if (d.n % 8 == 0)
    gemm::sm90::launch_gemm<gemm::sm90::Traits<E, 128, 256, 64, 3, kNK, 1, true>>(
        d.m, d.n, d.k, gathered, d.k, b, ldb, c, d.n, sched, epi, sms, stream, 1, 0, a_local, m_local, pdl);
  else
    gemm::sm90::launch_gemm<gemm::sm90::Traits<E, 128, 256, 64, 4, kNK>>(d.m, d.n, d.k, gathered, d.k, b, ldb, c, d.n,
                                                                          sched, epi, sms, stream, 1, 0, a_local, m_local,
                                                                          pdl);
}
template <class Epi>
void launch_ag(const AgGemmDesc& d, const void* gathered, const void* a_local, int64_t m_local, const AgSchedule& sched,
               const Epi& epi, const void* b, void* c, int sms, int cluster_m, bool pdl, cudaStream_t stream) {
  const bool bf16 = d.dtype == DType::kBFloat16, nk = d.b_layout == gemm::BLayout::kNK;
  if (bf16 && nk)
    launch_ag_layout<cutlass::bfloat16_t, true>(d, gathered, a_local, m_local, sched, epi, b, c, sms, cluster_m, pdl, stream);
  else if (bf16)
    launch_ag_layout<cutlass::bfloat16_t, false>(d, gathered, a_local, m_local, sched, epi, b, c, sms, cluster_m, pdl, stream);
  else if (nk)
    launch_ag_layout<cutlass::half_t, true>(d, gathered, a_local, m_local, sched, epi, b, c, sms, cluster_m, pdl, stream);
  else
    launch_ag_layout<cutlass::half_t, false>(d, gathered, a_local, m_local, sched, epi, b, c, sms, cluster_m, pdl, stream);
}
}  // namespace

void AgGemm::run(const void* a_local, const void* b, void* c, cudaStream_t stream) {
  const AgGemmDesc& d = s_->desc;
  comm::Team& team = s_->team;
  team.check_watchdog();  // a timeout of an earlier call is reported here, not swallowed
  CCFUSE_ARG_CHECK(b != nullptr && c != nullptr, "b and c must be device pointers");
  const size_t c_bytes = size_t(d.m * d.n) * 2;
  CCFUSE_ARG_CHECK(!bytes_overlap(c, c_bytes, s_->gather->local(), size_t(d.m * d.k) * 2),
                   "ag_gemm: output c overlaps the gather buffer");
  CCFUSE_ARG_CHECK(!bytes_overlap(c, c_bytes, a_local, a_local != nullptr ? size_t(s_->m_local * d.k) * 2 : 0),
                   "ag_gemm: output c overlaps input a_local");
  CCFUSE_ARG_CHECK(!bytes_overlap(c, c_bytes, b, size_t(d.k * d.n) * 2), "ag_gemm: output c overlaps input b");
  for (auto [ptr, name] : {std::pair<const void*, const char*>{a_local, "a_local"}, {b, "b"}, {c, "c"}})
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, name, " (", ptr, ") must be 16-byte aligned");
  const bool ce = s_->cfg.transport == AgTransport::kCopyEngine;
  // Entry barrier + epoch; the copy engine's fixed-value flags of the previous call are zeroed
  // before this rank enters it.
  s_->sig->begin_call(stream, ce ? s_->ce_sig.get() : nullptr);
  const int sms = s_->cfg.num_sms > 0 ? s_->cfg.num_sms : gemm::current_device_sms();
  const int64_t row_bytes = d.k * 2, band_offset = int64_t(team.rank()) * s_->m_local * row_bytes;
  char* gather_local = static_cast<char*>(s_->gather->local());
  AgSchedule sched;
  sched.m_tiles_per_band = int(ceil_div(s_->m_local, int64_t(kBlockM)));
  sched.flags_per_band = sched.m_tiles_per_band;
  sched.block_n = s_->block_n;
  sched.n_tiles = int(ceil_div(d.n, s_->block_n));
  sched.group_m = s_->cfg.group_m;
  sched.rank = team.rank();
  sched.world = team.world_size();
  sched.m_local = s_->m_local;
  sched.own_in_place = a_local != nullptr;
  sched.alt_a_row0 = int64_t(sched.rank) * s_->m_local;
  if (ce) {
    // This rank's band to every peer on that peer's side stream (rank + 1 first), copy_rows rows
    // a copy (the last one short where copy_rows does not divide the band), each followed by its
    // flag (= 1, zeroed by the next call's begin_call); then into
    // this rank's own gather buffer (gathered_a()) when A_r came from a_local. Enqueued before
    // the GEMM so that the first copy starts with it.
    const char* src = a_local != nullptr ? static_cast<const char*>(a_local) : gather_local + band_offset;
    const int64_t copies = ceil_div(s_->m_local, int64_t(s_->copy_rows)), copy_bytes = s_->copy_rows * row_bytes;
    const int64_t band_bytes = s_->m_local * row_bytes;
    const comm::DeviceSignals& ce_dev = s_->ce_sig->device();
    CCFUSE_CUDA_CHECK(cudaEventRecord(s_->start, stream));
    for (int i = 1; i < sched.world; ++i) {
      const int p = (sched.rank + i) % sched.world;
      cudaStream_t side = s_->side[size_t(i - 1)];
      CCFUSE_CUDA_CHECK(cudaStreamWaitEvent(side, s_->start, 0));
      char* dst = static_cast<char*>(s_->gather->peer(p)) + band_offset;
      for (int64_t cp = 0; cp < copies; ++cp) {
        CCFUSE_CUDA_CHECK(cudaMemcpyAsync(dst + cp * copy_bytes, src + cp * copy_bytes,
                                          size_t(std::min(copy_bytes, band_bytes - cp * copy_bytes)),
                                          cudaMemcpyDeviceToDevice, side));
        comm::stream_write_flag(side, ce_dev.flags[p] + sched.rank * copies + cp, 1);
      }
    }
    if (a_local != nullptr && s_->cfg.return_gathered) {
      cudaStream_t side = s_->side.empty() ? stream : s_->side[0];
      CCFUSE_CUDA_CHECK(cudaMemcpyAsync(gather_local + band_offset, a_local, size_t(s_->m_local * row_bytes),
                                        cudaMemcpyDeviceToDevice, side));
    }
    sched.sig = ce_dev;
    sched.epoch = 1;
    sched.chunks_per_flag = s_->copy_rows / kBlockM;
    sched.flags_per_band = int(copies);
    sched.own_ready = true;
    AgCeEpilogue epi;
    epi.trace = s_->trace;
    epi.trace_slots = s_->trace_slots;
    launch_ag(d, gather_local, a_local, s_->m_local, sched, epi, b, c, sms, s_->cfg.cluster_m, false, stream);
    for (size_t i = 0; i < s_->side.size(); ++i) {  // join: the caller's stream covers the copies
      CCFUSE_CUDA_CHECK(cudaEventRecord(s_->done[i], s_->side[i]));
      CCFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, s_->done[i], 0));
    }
    return;
  }
  sched.sig = s_->sig->device();
  const int gemm_ctas = int(std::min<int64_t>(sched.num_tiles(), sms));
  const int pushers = s_->cfg.push_ctas > 0 ? std::min(s_->cfg.push_ctas, gemm_ctas) : gemm_ctas;
  sched.pieces = pieces_for(s_->cfg, sched.m_tiles_per_band, pushers);
  AgPushEpilogue epi;
  epi.sig = sched.sig;
  epi.src = static_cast<const char*>(a_local);
  for (int r = 0; r < sched.world; ++r) epi.gather[r] = static_cast<char*>(s_->gather->peer(r));
  epi.band_offset_bytes = band_offset;
  epi.row_bytes = row_bytes;
  epi.m_local = s_->m_local;
  epi.rank = sched.rank;
  epi.world = sched.world;
  epi.m_tiles_per_band = sched.m_tiles_per_band;
  epi.pieces = sched.pieces;
  epi.rows_per_piece = kBlockM / sched.pieces;
  epi.push_ctas = s_->cfg.push_ctas;
  epi.copy_own = s_->cfg.return_gathered;
  epi.spread_ns = uint64_t(s_->cfg.push_spread_us) * 1000u;
  epi.trace = s_->trace;
  epi.trace_slots = s_->trace_slots;
  launch_ag(d, gather_local, a_local, s_->m_local, sched, epi, b, c, sms, s_->cfg.cluster_m, s_->cfg.overlap_entry,
            stream);
}

}  // namespace ccfuse::tp
