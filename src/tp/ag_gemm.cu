// Fused AllGather + GEMM, v1: side CTAs push this rank's A band over NVLink, GEMM CTAs wait per tile.
#include "ccfuse/tp/ag_gemm.h"

#include <sstream>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/gemm/sm90_gemm.cuh"

namespace ccfuse::tp {

namespace {

constexpr int kBlockM = 128;

// The schedule of one rank's fused ag_gemm kernel (see sm90_gemm.cuh for the hooks).
struct AgSchedule {
  // GEMM tiles: bands in rank-rotated order, own band first; grouped row-major inside a band.
  int m_tiles_per_band = 0, n_tiles = 0, group_m = 8, rank = 0, world = 1;
  int64_t m = 0;
  comm::DeviceSignals sig{};
  // Producer-thread state: the call's epoch and the chunks already seen published.
  epoch_t epoch = 0;
  uint64_t seen[4] = {};
  // Side CTAs: push this rank's band.
  int num_side_ctas = 0;
  const int4* src = nullptr;                   // own band [m_local, K], or nullptr: already in place
  char* gather[comm::kMaxLsaRanks] = {};       // every rank's gather buffer [M, K]
  int64_t band_offset_bytes = 0;               // rank * m_local * K * 2
  int64_t chunk_bytes = 0;                     // 128 rows * K * 2

  static constexpr bool kHasReady = true;
  static constexpr bool kHasSide = true;

  CCFUSE_HD int64_t num_tiles() const { return int64_t(world) * m_tiles_per_band * n_tiles; }
  int64_t max_tiles() const { return num_tiles(); }
  CCFUSE_HD gemm::TileWork work(int64_t idx) const {
    const int64_t per_band = int64_t(m_tiles_per_band) * n_tiles;
    const int band = int((rank + idx / per_band) % world);
    const gemm::TileCoord c = gemm::grouped_row_major(idx % per_band, m_tiles_per_band, n_tiles, group_m);
    const int mt = band * m_tiles_per_band + c.m_tile;
    return gemm::TileWork{mt, c.n_tile, 0, int64_t(mt) * kBlockM, m};
  }
  // Tile w needs chunk w.m_tile, published by the band's rank.
  __device__ bool wait_ready(const gemm::TileWork& w) {
    const int idx = w.m_tile;
    const bool cacheable = idx < 256;
    if (cacheable && (seen[idx / 64] >> (idx % 64) & 1)) return true;
    if (epoch == 0) epoch = comm::current_epoch(sig);
    const bool ok = comm::wait(sig, idx, epoch, idx / m_tiles_per_band);
    asm volatile("fence.proxy.async.global;" ::: "memory");
    if (ok && cacheable) seen[idx / 64] |= uint64_t(1) << (idx % 64);
    return ok;
  }
  // Side CTA `cta`: chunks cta, cta + num_side_ctas, ... of this rank's band, to the peers first
  // (rank + 1, rank + 2, ...) and to this rank last; a flag per (chunk, destination).
  __device__ void run_side(int cta) {
    const epoch_t e = comm::current_epoch(sig);
    const int64_t vec = chunk_bytes / 16;
    for (int c = cta; c < m_tiles_per_band; c += num_side_ctas) {
      for (int i = 1; i <= world; ++i) {
        const int p = (rank + i) % world;
        if (src != nullptr || p != rank) {
          const int4* from = src != nullptr ? src + c * vec
                                            : reinterpret_cast<const int4*>(gather[rank] + band_offset_bytes) + c * vec;
          int4* to = reinterpret_cast<int4*>(gather[p] + band_offset_bytes) + c * vec;
          // 4 independent 16-byte loads per thread in flight before the stores (NVLink latency).
          int64_t j = threadIdx.x;
          for (; j + 3 * blockDim.x < vec; j += 4 * blockDim.x) {
            int4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = from[j + u * blockDim.x];
#pragma unroll
            for (int u = 0; u < 4; ++u) to[j + u * blockDim.x] = v[u];
          }
          for (; j < vec; j += blockDim.x) to[j] = from[j];
        }
        __syncthreads();  // every thread's stores of the chunk happen-before the release below
        if (threadIdx.x == 0) comm::notify(sig, p, rank * m_tiles_per_band + c, e);
      }
    }
  }
};


}  // namespace

struct AgGemm::State {
  comm::Team& team;
  AgGemmDesc desc;
  AgGemmConfig cfg;
  int64_t m_local = 0;
  std::unique_ptr<comm::SymmetricBuffer> gather;
  std::unique_ptr<comm::SignalSet> sig;
  State(comm::Team& t, const AgGemmDesc& d, const AgGemmConfig& c) : team(t), desc(d), cfg(c) {}
};

std::string to_string(const AgGemmConfig& c, int num_sms) {
  std::ostringstream os;
  os << "comm_ctas=" << c.num_comm_ctas << " gemm_ctas=" << num_sms - c.num_comm_ctas << " block=128x256x64 chunk_rows="
     << kBlockM << " group_m=" << c.group_m;
  return os.str();
}

AgGemm::AgGemm(comm::Team& team, const AgGemmDesc& d, AgGemmConfig cfg) : s_(new State(team, d, cfg)) {
  const int w = team.world_size();
  CCFUSE_ARG_CHECK(d.m > 0 && d.n > 0 && d.k > 0, "m, n, k must be positive (got ", d.m, ", ", d.n, ", ", d.k, ")");
  CCFUSE_ARG_CHECK(d.m % w == 0, "m ", d.m, " is not divisible by the world size ", w);
  s_->m_local = d.m / w;
  CCFUSE_ARG_CHECK(s_->m_local % kBlockM == 0, "m / world_size = ", s_->m_local,
                   " must be a multiple of 128 (ag_gemm v1 sends whole 128-row tiles)");
  CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16, "ag_gemm v1 is built for bf16, not ", dtype_name(d.dtype));
  CCFUSE_ARG_CHECK(cfg.num_comm_ctas >= 1, "num_comm_ctas ", cfg.num_comm_ctas, " must be at least 1");
  gemm::GemmDesc g;
  g.m = d.m;
  g.n = d.n;
  g.k = d.k;
  g.dtype = d.dtype;
  g.b_layout = d.b_layout;
  gemm::validate(g, gemm::GemmConfig{128, 256, 64, 4, 0});
  s_->gather = team.alloc_symmetric(size_t(d.m * d.k) * 2);
  s_->sig = team.make_signals("ag_gemm", int(d.m / kBlockM));
}

AgGemm::~AgGemm() = default;

void* AgGemm::local_a() const {
  return static_cast<char*>(s_->gather->local()) + size_t(s_->team.rank() * s_->m_local * s_->desc.k) * 2;
}
const void* AgGemm::gathered_a() const { return s_->gather->local(); }

void AgGemm::run(const void* a_local, const void* b, void* c, cudaStream_t stream) {
  const AgGemmDesc& d = s_->desc;
  comm::Team& team = s_->team;
  team.check_watchdog();  // a timeout of an earlier call is reported here, not swallowed
  CCFUSE_ARG_CHECK(b != nullptr && c != nullptr, "b and c must be device pointers");
  CCFUSE_ARG_CHECK(c != s_->gather->local(), "c must not alias the gather buffer");
  for (auto [ptr, name] : {std::pair<const void*, const char*>{a_local, "a_local"}, {b, "b"}, {c, "c"}})
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, name, " (", ptr, ") must be 16-byte aligned");
  s_->sig->begin_call(stream);  // entry barrier + epoch
  AgSchedule sched;
  sched.m_tiles_per_band = int(s_->m_local / kBlockM);
  sched.n_tiles = int(ceil_div(d.n, 256));
  sched.group_m = s_->cfg.group_m;
  sched.rank = team.rank();
  sched.world = team.world_size();
  sched.m = d.m;
  sched.sig = s_->sig->device();
  sched.num_side_ctas = s_->cfg.num_comm_ctas;
  sched.src = static_cast<const int4*>(a_local);
  for (int r = 0; r < sched.world; ++r) sched.gather[r] = static_cast<char*>(s_->gather->peer(r));
  sched.band_offset_bytes = int64_t(team.rank()) * s_->m_local * d.k * 2;
  sched.chunk_bytes = int64_t(kBlockM) * d.k * 2;
  const int sms = s_->cfg.num_sms > 0 ? s_->cfg.num_sms : gemm::current_device_sms();
  const int64_t ldb = d.b_layout == gemm::BLayout::kKN ? d.n : d.k;
  using E = cutlass::bfloat16_t;
  if (d.b_layout == gemm::BLayout::kNK)
    gemm::sm90::launch_gemm<gemm::sm90::Traits<E, 128, 256, 64, 4, true>>(
        d.m, d.n, d.k, s_->gather->local(), d.k, b, ldb, c, d.n, sched, gemm::sm90::PlainEpilogue{}, sms, stream);
  else
    gemm::sm90::launch_gemm<gemm::sm90::Traits<E, 128, 256, 64, 4, false>>(
        d.m, d.n, d.k, s_->gather->local(), d.k, b, ldb, c, d.n, sched, gemm::sm90::PlainEpilogue{}, sms, stream);
}

}  // namespace ccfuse::tp
