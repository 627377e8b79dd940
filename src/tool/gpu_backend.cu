// GPU backend of the ccfuse tool: W ranks = W local GPUs, one thread each (Team mode (a)).
//
// It runs and times the fused ops (ccfuse/tp) and, in the same run on the same GPUs, the serial
// baselines that they must beat (DESIGN §5):
//   ag_gemm : ncclAllGather(A) then cuBLAS  C = A_full @ B_r
//   gemm_rs : cuBLAS P = A_r @ B_r then ncclReduceScatter(P)
//   gemm_ar : cuBLAS P = A_r @ B_r then ncclAllReduce(P)
// t_fused is null where no fused kernel is built for the op/shape/dtype (none is faked).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <cstdlib>
#include <fstream>
#include <exception>
#include <functional>
#include <cmath>
#include <mutex>
#include <ostream>
#include <random>

#include "ccfuse/comm/team.h"
#include "ccfuse/common/host_barrier.h"
#include "ccfuse/tp/ag_gemm.h"
#include "ccfuse/tp/gemm_rs.h"
#include "ccfuse/tp/tuner.h"
#include "ccfuse/common/cublas_check.h"
#include "ccfuse/common/cuda_check.h"
#include "reference/naive.h"
#include "src/tool/cli.h"


namespace ccfuse::tool {

int count_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the tool, just 0 GPUs
    return 0;
  }
  return n;
}

namespace {

using comm::Team;

bool is_ag(const Options& o) { return o.op == "ag_gemm"; }
// The fused kernels: ag_gemm, gemm_rs and gemm_ar (bf16 or fp16; the tool's 16-bit type is bf16).
bool has_fused(const Options& o) { return o.dtype == DType::kBFloat16; }
// The tuner's choice for the fused op (include/ccfuse/tp/tuner.h): the configs below follow it.
tp::TpChoice tuned(const Options& o, int sms) {
  tp::TpProblem p;
  p.op = o.op;
  p.world_size = o.world_size;
  p.m = o.m;
  p.n = o.n;
  p.k_per_rank = is_ag(o) ? o.k : o.k / o.world_size;
  p.dtype = o.dtype;
  p.num_sms = sms;
  return tp::choose_tp_config(p);
}
// A/B runs (tools/gpu_run.sh tp_ab): CCFUSE_TP_CLUSTER=1 | 2 sets the fused TP GEMMs' cluster
// size (default 1); the record's config says which ran.
int cluster_override() {
  const char* v = std::getenv("CCFUSE_TP_CLUSTER");
  if (v == nullptr || !*v) return 1;
  const std::string t = v;
  CCFUSE_ARG_CHECK(t == "1" || t == "2", "CCFUSE_TP_CLUSTER '", t, "' must be 1 or 2");
  return std::stoi(t);
}
// A/B runs: CCFUSE_TP_PDL=0 | 1 sets whether the fused TP GEMMs are launched with programmatic
// dependent launch after their entry barrier (AgGemmConfig/GemmRsConfig::overlap_entry; default on).
bool pdl_override(bool dflt) {
  const char* v = std::getenv("CCFUSE_TP_PDL");
  if (v == nullptr || !*v) return dflt;
  const std::string t = v;
  CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_TP_PDL '", t, "' must be 0 or 1");
  return t == "1";
}
// A/B runs: CCFUSE_TP_GROUP_M=N (1..64) sets the fused TP GEMMs' group_m (row tiles per raster
// group; the tuner's 8 otherwise, where the plain engine uses 16 on large shapes).
int group_m_override(int tuned, const char* v = std::getenv("CCFUSE_TP_GROUP_M")) {
  if (v == nullptr || !*v) return tuned;
  char* end = nullptr;
  const long g = std::strtol(v, &end, 10);
  CCFUSE_ARG_CHECK(end != v && *end == 0 && g >= 1 && g <= 64, "group_m override '", v, "' must be in [1, 64]");
  return int(g);
}
tp::AgGemmConfig ag_config(const tp::TpChoice& c) {
  tp::AgGemmConfig cfg;
  cfg.pieces_per_chunk = c.pieces_per_chunk;
  cfg.group_m = group_m_override(c.group_m);
  cfg.transport = c.transport == "copy-engine" ? tp::AgTransport::kCopyEngine : tp::AgTransport::kSendWarps;
  cfg.cluster_m = cluster_override();
  cfg.overlap_entry = pdl_override(cfg.overlap_entry);
  // A/B runs (tools/gpu_run.sh tp_ab): CCFUSE_AG_TRANSPORT=copy-engine | sm-send-warps overrides
  // the tuner; the record's config says which ran.
  if (const char* v = std::getenv("CCFUSE_AG_TRANSPORT"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "copy-engine" || t == "sm-send-warps", "CCFUSE_AG_TRANSPORT '", t,
                     "' must be copy-engine or sm-send-warps");
    cfg.transport = t == "copy-engine" ? tp::AgTransport::kCopyEngine : tp::AgTransport::kSendWarps;
  }
  // CCFUSE_AG_RETURN_GATHERED=0: skip filling this rank's own gather slot (AgGemmConfig::return_gathered).
  if (const char* v = std::getenv("CCFUSE_AG_RETURN_GATHERED"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_AG_RETURN_GATHERED '", t, "' must be 0 or 1");
    cfg.return_gathered = t == "1";
  }
  // The push pacing is the tuner's (the same rule as AgGemmConfig's auto). A/B runs:
  // CCFUSE_AG_PUSH_SPREAD_US=N paces it over N us (0: one burst); CCFUSE_AG_PUSH_SPREAD_FRACTION=f
  // over f x one band's predicted GEMM time (AgGemmConfig::push_spread_fraction).
  if (cfg.transport == tp::AgTransport::kSendWarps) cfg.push_spread_us = c.push_spread_us;
  if (const char* v = std::getenv("CCFUSE_AG_PUSH_SPREAD_FRACTION"); v != nullptr && *v) {
    char* end = nullptr;
    const double f = std::strtod(v, &end);
    CCFUSE_ARG_CHECK(end != v && *end == 0 && f >= 0 && f <= 2, "CCFUSE_AG_PUSH_SPREAD_FRACTION '", v,
                     "' must be a number in [0, 2]");
    cfg.push_spread_us = -1;
    cfg.push_spread_fraction = f;
  }
  if (const char* v = std::getenv("CCFUSE_AG_PUSH_SPREAD_US"); v != nullptr && *v) {
    const int us = std::atoi(v);
    CCFUSE_ARG_CHECK(us >= 0, "CCFUSE_AG_PUSH_SPREAD_US '", v, "' must be a number of microseconds");
    cfg.push_spread_us = us;
  }
  // CCFUSE_AG_BLOCK_N=256 | 192: the tile width instead of the auto rule (A/B runs).
  if (const char* v = std::getenv("CCFUSE_AG_BLOCK_N"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "256" || t == "192", "CCFUSE_AG_BLOCK_N '", t, "' must be 256 or 192");
    cfg.block_n = std::stoi(t);
  }
  return cfg;
}
tp::AgGemmDesc ag_desc(const Options& o) {
  tp::AgGemmDesc d;
  d.m = o.m;
  d.n = o.n;
  d.k = o.k;
  d.b_layout = gemm::BLayout::kKN;  // the tool's B is [K, N], as for cuBLAS
  return d;
}
tp::GemmRsConfig rs_config(const tp::TpChoice& c) {
  tp::GemmRsConfig cfg;
  cfg.group_m = group_m_override(c.group_m);
  cfg.cluster_m = cluster_override();
  cfg.overlap_entry = pdl_override(cfg.overlap_entry);
  cfg.forward_spread_us = c.forward_spread_us;  // the tuner's (tp::rs_forward_spread_us), unless overridden below
  // A/B runs (tools/gpu_run.sh tp_ab, variant rsreg): CCFUSE_RS_TMA_STORE=0 stores gemm_rs /
  // gemm_ar tiles from registers (v1) instead of through TMA.
  if (const char* v = std::getenv("CCFUSE_RS_TMA_STORE"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_RS_TMA_STORE '", t, "' must be 0 or 1");
    cfg.tma_store = t == "1";
  }
  if (const char* v = std::getenv("CCFUSE_RS_TMA_ADDENDS"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_RS_TMA_ADDENDS '", t, "' must be 0 or 1");
    cfg.tma_addends = t == "1";
  }
  if (const char* v = std::getenv("CCFUSE_RS_FORWARD_SPREAD_US"); v != nullptr && *v) {
    char* end = nullptr;
    const long us = std::strtol(v, &end, 10);
    CCFUSE_ARG_CHECK(end != v && *end == 0 && us >= 0 && us <= 10000, "CCFUSE_RS_FORWARD_SPREAD_US '", v,
                     "' must be a number of microseconds in [0, 10000]");
    cfg.forward_spread_us = int(us);
  }
  if (const char* v = std::getenv("CCFUSE_RS_EARLY_HANDOVER"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_RS_EARLY_HANDOVER '", t, "' must be 0 or 1");
    cfg.early_handover = t == "1";
  }
  if (const char* v = std::getenv("CCFUSE_RS_PREFETCH_ADDENDS"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_RS_PREFETCH_ADDENDS '", t, "' must be 0 or 1");
    cfg.prefetch_addends = t == "1";
  }
  if (const char* v = std::getenv("CCFUSE_RS_DIRECT"); v != nullptr && *v) {
    const std::string t = v;
    CCFUSE_ARG_CHECK(t == "0" || t == "1", "CCFUSE_RS_DIRECT '", t, "' must be 0 or 1");
    cfg.direct_store = t == "1";
  }
  return cfg;
}
std::string fused_config(const Options& o, int sms) {
  const tp::TpChoice c = tuned(o, sms);
  if (is_ag(o)) {
    const tp::AgGemmDesc d = ag_desc(o);
    return "ag_gemm v2 (" + tp::to_string(ag_config(c), sms, &d) + "; tuner: " + c.source + ")";
  }
  return o.op + " v1 (" + tp::to_string(rs_config(c), sms, o.op == "gemm_ar", o.n) + "; tuner: " + c.source + ")";
}
size_t elem_size(DType t) { return size_t(dtype_size(t)); }
cudaDataType_t cuda_type(DType t) { return t == DType::kFloat32 ? CUDA_R_32F : CUDA_R_16BF; }
ncclDataType_t nccl_type(DType t) { return t == DType::kFloat32 ? ncclFloat32 : ncclBfloat16; }

// Shapes of one rank's part of the op.
struct RankShape {
  int64_t a_rows, a_cols;  // A as this rank holds it
  int64_t gemm_m, gemm_k;  // the local cuBLAS GEMM: [gemm_m, gemm_k] x [gemm_k, n]
  int64_t out_rows;        // rows of the output this rank returns
};
RankShape rank_shape(const Options& o) {
  const int64_t w = o.world_size;
  if (is_ag(o)) return {o.m / w, o.k, o.m, o.k, o.m};
  const int64_t kl = local_k(o);
  return {o.m, kl, o.m, kl, o.op == "gemm_rs" ? o.m / w : o.m};
}

// Row-major C[m,n] = A[m,k] @ B[k,n] as column-major C^T = B^T A^T; fp32 accumulation.
void gemm_rowmajor(cublasHandle_t h, DType t, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c) {
  const float alpha = 1.f, beta = 0.f;
  CCFUSE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, cuda_type(t), int(n),
                                   a, cuda_type(t), int(k), &beta, c, cuda_type(t), int(n), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
}

// Host floats -> device buffer of dtype t.
void upload(const std::vector<float>& host, DType t, void* dev) {
  if (t == DType::kFloat32) {
    CCFUSE_CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    return;
  }
  std::vector<uint16_t> bits(host.size());
  for (size_t i = 0; i < host.size(); ++i) bits[i] = bf16::from_float(host[i]).bits;
  CCFUSE_CUDA_CHECK(cudaMemcpy(dev, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
}
std::vector<double> download(const void* dev, size_t count, DType t) {
  std::vector<double> out(count);
  if (t == DType::kFloat32) {
    std::vector<float> f(count);
    CCFUSE_CUDA_CHECK(cudaMemcpy(f.data(), dev, count * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) out[i] = f[i];
  } else {
    std::vector<uint16_t> bits(count);
    CCFUSE_CUDA_CHECK(cudaMemcpy(bits.data(), dev, count * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) out[i] = bf16{bits[i]}.to_float();
  }
  return out;
}
std::vector<float> rounded(std::vector<float> v, DType t) {
  if (t != DType::kFloat32)
    for (auto& x : v) x = bf16::from_float(x).to_float();
  return v;
}

// One rank's device state for the serial baseline (several input sets, rotated so that the L2
// does not serve repeated runs).
// The timing method: before each timed run's start event the stream spins 100 us on the GPU
// (CCFUSE_BENCH_LEAD_US=N, 0..10000, changes it; 0 = the method before 3906f43, 2026-11-30 19:00 UTC), so
// that the host has enqueued the run's launches before the GPU reaches the event and the event
// pair measures GPU time, not the host's enqueue latency (as when a training loop runs ahead of
// the GPU; the single-GPU GEMM benches hold the stream for the same reason). The same for every
// variant. Measured 2026-11-30: without it cuBLAS's t_gemm carried 10-30 us of host latency on
// the 0.3 ms shapes, ours hardly any (docs/perf-notes.md).
__global__ void lead_spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
// Diagnostics (trace_fused): the GPU's clock at this point of the stream.
__global__ void stamp_kernel(uint64_t* out) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *out = t;
}
int lead_us() { return env_int("CCFUSE_BENCH_LEAD_US", 100, 0, 10000, "microseconds"); }


struct RankState {
  Team& team;
  const Options& o;
  RankShape s;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  int num_sets = 1;
  std::vector<void*> a, b, gathered, out;  // per set; `gathered` = A_full (ag) or the partial P (rs/ar)
  std::unique_ptr<tp::AgGemm> fused_ag;    // the fused op, where one is built for this problem
  std::unique_ptr<tp::GemmRs> fused_rs;
  std::unique_ptr<tp::GemmAr> fused_ar;

  RankState(Team& t, const Options& opts, int sets) : team(t), o(opts), s(rank_shape(opts)), num_sets(sets) {
    CCFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CCFUSE_CUBLAS_CHECK(cublasCreate(&blas));
    CCFUSE_CUBLAS_CHECK(cublasSetStream(blas, stream));
    const size_t es = elem_size(o.dtype);
    for (int i = 0; i < num_sets; ++i) {
      a.push_back(alloc(size_t(s.a_rows * s.a_cols) * es));
      b.push_back(alloc(size_t(s.gemm_k * o.n) * es));
      gathered.push_back(alloc(size_t(is_ag(o) ? o.m * o.k : o.m * o.n) * es));
      out.push_back(alloc(size_t(s.out_rows * o.n) * es));
    }
    if (has_fused(o) && !is_ag(o)) {
      tp::GemmRsDesc d;
      d.m = o.m;
      d.n = o.n;
      d.k = s.gemm_k;  // per rank
      d.dtype = o.dtype;
      d.b_layout = gemm::BLayout::kKN;  // the tool's B is [K, N], as for cuBLAS
      const tp::GemmRsConfig cfg = rs_config(tuned(o, gemm::current_device_sms()));
      if (o.op == "gemm_rs") fused_rs = std::make_unique<tp::GemmRs>(team, d, cfg);
      else fused_ar = std::make_unique<tp::GemmAr>(team, d, cfg);
    }
    if (has_fused(o) && is_ag(o)) {
      fused_ag = std::make_unique<tp::AgGemm>(team, ag_desc(o), ag_config(tuned(o, gemm::current_device_sms())));
    }
  }
  ~RankState() {
    for (auto* v : {&a, &b, &gathered, &out})
      for (void* p : *v) cudaFree(p);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
  }
  static void* alloc(size_t bytes) {
    void* p = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    return p;
  }

  void comm_part(int set) {
    const size_t es = elem_size(o.dtype);
    if (is_ag(o)) {
      CCFUSE_NCCL_CHECK(ncclAllGather(a[set], gathered[set], size_t(s.a_rows * s.a_cols), nccl_type(o.dtype),
                                      team.comm(), stream));
    } else if (o.op == "gemm_rs") {
      CCFUSE_NCCL_CHECK(ncclReduceScatter(gathered[set], out[set], size_t(s.out_rows * o.n), nccl_type(o.dtype),
                                          ncclSum, team.comm(), stream));
    } else {
      CCFUSE_NCCL_CHECK(ncclAllReduce(gathered[set], out[set], size_t(o.m * o.n), nccl_type(o.dtype), ncclSum,
                                      team.comm(), stream));
    }
    (void)es;
  }
  // ccfuse's GEMM engine on the same local GEMM (B [K, N]), its default config.
  void ccfuse_gemm_part(int set) {
    const gemm::GemmDesc g = gemm::make_desc(o.m, o.n, s.gemm_k, o.dtype, gemm::BLayout::kKN);
    gemm::GemmConfig cfg = gemm::choose_config(g, gemm::current_device_sms());
    // A/B runs: CCFUSE_TP_ENGINE_CLUSTER=1|2 and CCFUSE_TP_ENGINE_GROUP_M=N put the engine in the
    // fused kernels' raster (cluster 1, group_m 8) to separate config from fusion cost.
    if (const char* v = std::getenv("CCFUSE_TP_ENGINE_CLUSTER"); v != nullptr && *v) {
      const std::string t = v;
      CCFUSE_ARG_CHECK(t == "1" || t == "2", "CCFUSE_TP_ENGINE_CLUSTER '", t, "' must be 1 or 2");
      cfg.cluster_m = std::stoi(t);
    }
    if (const char* v = std::getenv("CCFUSE_TP_ENGINE_GROUP_M"); v != nullptr && *v) cfg.group_m = group_m_override(cfg.group_m, v);
    gemm::run(g, cfg, is_ag(o) ? gathered[set] : a[set], b[set], is_ag(o) ? out[set] : gathered[set], stream);
  }
  void gemm_part(int set) {
    if (is_ag(o)) gemm_rowmajor(blas, o.dtype, o.m, o.n, o.k, gathered[set], b[set], out[set]);
    else gemm_rowmajor(blas, o.dtype, o.m, o.n, s.gemm_k, a[set], b[set], gathered[set]);
  }
  bool has_fused_op() const { return fused_ag || fused_rs || fused_ar; }
  // Diagnostics (CCFUSE_TILE_TRACE=PREFIX): one run of the fused op with per-tile timestamps,
  // written to PREFIX.rank<r>.csv (tools/tile_trace.py summarises them).
  void trace_fused(const std::string& prefix) {
    const int sms = gemm::current_device_sms();
    const int64_t tiles_bound = (ceil_div(o.m, 128) + o.world_size) * ceil_div(o.n, 192);  // 192- or 256-column tiles
    const int slots = int(tiles_bound / sms + 2);
    const size_t count = size_t(sms) * size_t(slots);
    gemm::TileTrace* rec = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&rec, count * sizeof(gemm::TileTrace)));
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(rec, 0, count * sizeof(gemm::TileTrace), stream));
    auto set = [&](gemm::TileTrace* r) {
      if (fused_ag) fused_ag->set_trace(r, slots);
      if (fused_rs) fused_rs->set_trace(r, slots);
      if (fused_ar) fused_ar->set_trace(r, slots);
    };
    // Where the op's time goes outside its tiles: globaltimer stamps (one-thread kernels) around
    // the traced op and around the engine's GEMM, each after the bench's lead spin, three times;
    // the tiles are the last run's (PREFIX.rank<r>.stamps: tools/tile_trace.py reads it).
    uint64_t* stamps = nullptr;
    constexpr int kStampRuns = 3;
    CCFUSE_CUDA_CHECK(cudaMalloc(&stamps, 4 * kStampRuns * sizeof(uint64_t)));
    const uint64_t lead_ns = uint64_t(std::max(lead_us(), 100)) * 1000u;
    set(rec);
    for (int i = 0; i < kStampRuns; ++i) {
      team.barrier(stream);
      lead_spin_kernel<<<1, 1, 0, stream>>>(lead_ns);
      stamp_kernel<<<1, 1, 0, stream>>>(stamps + 4 * i);
      fused(0);
      stamp_kernel<<<1, 1, 0, stream>>>(stamps + 4 * i + 1);
      lead_spin_kernel<<<1, 1, 0, stream>>>(lead_ns);
      stamp_kernel<<<1, 1, 0, stream>>>(stamps + 4 * i + 2);
      ccfuse_gemm_part(0);
      stamp_kernel<<<1, 1, 0, stream>>>(stamps + 4 * i + 3);
      CCFUSE_CUDA_CHECK_LAUNCH();
    }
    team.synchronize(stream);
    set(nullptr);
    {
      std::vector<uint64_t> st(4 * kStampRuns);
      CCFUSE_CUDA_CHECK(cudaMemcpy(st.data(), stamps, st.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
      cudaFree(stamps);
      std::ofstream f(prefix + ".rank" + std::to_string(team.rank()) + ".stamps");
      f << "fused_begin_ns,fused_end_ns,engine_begin_ns,engine_end_ns\n";
      for (int i = 0; i < kStampRuns; ++i)
        f << st[4 * i] << "," << st[4 * i + 1] << "," << st[4 * i + 2] << "," << st[4 * i + 3] << "\n";
    }
    std::vector<gemm::TileTrace> host(count);
    CCFUSE_CUDA_CHECK(cudaMemcpy(host.data(), rec, count * sizeof(gemm::TileTrace), cudaMemcpyDeviceToHost));
    cudaFree(rec);
    std::ofstream csv(prefix + ".rank" + std::to_string(team.rank()) + ".csv");
    csv << "op,rank,cta,index,m_tile,n_tile,start_ns,mma_done_ns,addends_ready_ns,stored_ns\n";
    for (const gemm::TileTrace& t : host)
      if (t.stored != 0)
        csv << o.op << "," << team.rank() << "," << t.cta << "," << t.index << "," << t.m_tile << "," << t.n_tile << ","
            << t.start << "," << t.mma_done << "," << t.addends_ready << "," << t.stored << "\n";
  }
  void fused(int set) {
    if (fused_ag) fused_ag->run(a[set], b[set], out[set], stream);
    else if (fused_rs) fused_rs->run(a[set], b[set], out[set], stream);
    else fused_ar->run(a[set], b[set], out[set], stream);
  }
  // The fused op where one is built, else the serial baseline (what `check` verifies).
  void op(int set) {
    if (has_fused_op()) fused(set);
    else serial(set);
  }
  void serial(int set) {
    if (is_ag(o)) {
      comm_part(set);
      gemm_part(set);
    } else {
      gemm_part(set);
      comm_part(set);
    }
  }
};

std::vector<float> rank_input(const Options& o, int rank, int which, size_t count) {
  std::vector<float> v(count);
  fill_uniform(*o.seed, rank, which, v.data(), count);
  return rounded(std::move(v), o.dtype);
}

std::vector<int> devices_for(const Options& o) {
  std::vector<int> d(static_cast<size_t>(o.world_size));
  for (int i = 0; i < o.world_size; ++i) d[size_t(i)] = i;
  return d;
}

}  // namespace

CheckResult gpu_check(const Options& o, std::ostream& log) {
  if (is_gemm(o)) return gpu_gemm_check(o, log);  // single GPU: gpu_gemm_bench.cu
  if (is_grouped(o)) return gpu_grouped_check(o, log);  // single GPU: gpu_grouped_bench.cu
  const int w = o.world_size;
  const RankShape s = rank_shape(o);
  ref::RankMats a(static_cast<size_t>(w)), b(static_cast<size_t>(w)), out(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    for (float x : rank_input(o, r, 0, size_t(s.a_rows * s.a_cols))) a[size_t(r)].push_back(x);
    for (float x : rank_input(o, r, 1, size_t(s.gemm_k * o.n))) b[size_t(r)].push_back(x);
  }
  log << "gpu: running the " << (has_fused(o) ? "fused" : "serial NCCL + cuBLAS") << " " << o.op << " on " << w
      << " GPUs\n";
  comm::run_local_world(devices_for(o), [&](Team& team) {
    const int r = team.rank();
    RankState st(team, o, 1);
    upload(std::vector<float>(a[size_t(r)].begin(), a[size_t(r)].end()), o.dtype, st.a[0]);
    upload(std::vector<float>(b[size_t(r)].begin(), b[size_t(r)].end()), o.dtype, st.b[0]);
    // Poison the output: every element must be written by the op.
    CCFUSE_CUDA_CHECK(cudaMemset(st.out[0], 0xff, size_t(s.out_rows * o.n) * elem_size(o.dtype)));
    st.op(0);
    team.synchronize(st.stream);
    out[size_t(r)] = download(st.out[0], size_t(s.out_rows * o.n), o.dtype);
  }, comm::TeamOptions{o.watchdog_ms});
  ref::RankMats want = is_ag(o)          ? ref::naive_ag_gemm(a, b, o.m, o.n, o.k)
                       : o.op == "gemm_rs" ? ref::naive_gemm_rs(a, b, o.m, o.n, s.gemm_k)
                                           : ref::naive_gemm_ar(a, b, o.m, o.n, s.gemm_k);
  std::vector<double> got_all, want_all;
  for (int r = 0; r < w; ++r) {
    got_all.insert(got_all.end(), out[size_t(r)].begin(), out[size_t(r)].end());
    want_all.insert(want_all.end(), want[size_t(r)].begin(), want[size_t(r)].end());
  }
  if (o.inject_fault && !got_all.empty()) got_all[got_all.size() / 2] += 1000.0;
  CheckResult res;
  res.rel_err = ref::rel_err(got_all, want_all);
  res.tolerance = tolerance_for(o.dtype, o.k);
  res.pass = res.rel_err <= res.tolerance;
  return res;
}


BenchRecord gpu_bench(const Options& o, std::ostream& log) {
  if (is_gemm(o)) return gpu_gemm_bench(o, log);  // single GPU: gpu_gemm_bench.cu
  if (is_grouped(o)) return gpu_grouped_bench(o, log);  // single GPU: gpu_grouped_bench.cu
  const int w = o.world_size;
  const RankShape s = rank_shape(o);
  const size_t es = elem_size(o.dtype);
  const size_t set_bytes = size_t(s.a_rows * s.a_cols + s.gemm_k * o.n + (is_ag(o) ? o.m * o.k : o.m * o.n) +
                                  s.out_rows * o.n) * es;
  // Rotate input sets so that their total is several times the 60 MB L2.
  const int num_sets = int(std::clamp<size_t>((size_t(512) << 20) / std::max<size_t>(set_bytes, 1) + 1, 1, 4));
  constexpr int kSampleRows = 4;
  std::mutex mu;
  std::vector<double> t_comm(static_cast<size_t>(w)), t_gemm(static_cast<size_t>(w)), t_serial(static_cast<size_t>(w));
  std::vector<double> t_fused(static_cast<size_t>(w), -1.0), t_gemm_ours(static_cast<size_t>(w), -1.0);
  std::vector<double> err_num(static_cast<size_t>(w)), err_den(static_cast<size_t>(w));
  // Steady-state times (CCFUSE_BENCH_STEADY_MS), per part and rank, in the parts' order below.
  const int steady = bench_steady_ms();
  std::vector<std::vector<double>> t_steady;
  HostBarrier host_barrier(w, "gpu bench: another rank failed");
  cudaDeviceProp prop{};
  CCFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int lead = lead_us();
  log << "gpu: " << w << " x " << prop.name << ", serial NCCL + cuBLAS baselines, " << num_sets
      << " rotated input sets, " << o.warmup << " warm-up + " << o.iters << " timed runs each"
      << (lead > 0 ? ", a " + std::to_string(lead) + " us GPU spin before each start event" : std::string()) << "\n";

  comm::run_local_world(devices_for(o), [&](Team& team) {
    const int r = team.rank();
    // A rank that throws wakes the others at the host barrier (the steady runs) with an Error.
    struct AbortOnThrow {
      HostBarrier& barrier;
      int before = std::uncaught_exceptions();
      ~AbortOnThrow() {
        if (std::uncaught_exceptions() > before) barrier.abort();
      }
    } abort_on_throw{host_barrier};
    RankState st(team, o, num_sets);
    const auto a_host = rank_input(o, r, 0, size_t(s.a_rows * s.a_cols));
    const auto b_host = rank_input(o, r, 1, size_t(s.gemm_k * o.n));
    for (int i = 0; i < num_sets; ++i) {
      upload(a_host, o.dtype, st.a[size_t(i)]);
      upload(b_host, o.dtype, st.b[size_t(i)]);
    }
    cudaEvent_t e0, e1;
    CCFUSE_CUDA_CHECK(cudaEventCreate(&e0));
    CCFUSE_CUDA_CHECK(cudaEventCreate(&e1));
    // Every variant is timed in the same rounds, one run of each per round, in turn: the H200's
    // clocks drift with temperature and power over a benchmark (up to 20 % measured), so timing
    // the variants one after the other would favour whichever runs first.
    struct Part {
      const char* what;
      std::function<void(int)> run;
      std::vector<double>* medians;  // per rank
      std::vector<double> ms;
    };
    std::vector<Part> parts;
    parts.push_back({"t_comm", [&](int set) { st.comm_part(set); }, &t_comm, {}});
    parts.push_back({"t_gemm", [&](int set) { st.gemm_part(set); }, &t_gemm, {}});
    parts.push_back({"t_serial", [&](int set) { st.serial(set); }, &t_serial, {}});
    if (o.dtype != DType::kFloat32)
      parts.push_back({"t_gemm_ccfuse", [&](int set) { st.ccfuse_gemm_part(set); }, &t_gemm_ours, {}});
    if (st.has_fused_op()) parts.push_back({"t_fused", [&](int set) { st.fused(set); }, &t_fused, {}});
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      for (Part& part : parts) {
        team.barrier(st.stream);  // ranks start each run together
        if (lead > 0) {
          lead_spin_kernel<<<1, 1, 0, st.stream>>>(uint64_t(lead) * 1000u);
          CCFUSE_CUDA_CHECK(cudaGetLastError());
        }
        CCFUSE_CUDA_CHECK(cudaEventRecord(e0, st.stream));
        part.run(it % num_sets);
        CCFUSE_CUDA_CHECK(cudaEventRecord(e1, st.stream));
        team.synchronize(st.stream);
        float t = 0;
        CCFUSE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        if (it >= o.warmup) part.ms.push_back(t);
      }
    }
    for (Part& part : parts) {
      std::sort(part.ms.begin(), part.ms.end());
      (*part.medians)[size_t(r)] = part.ms[part.ms.size() / 2];
    }
    if (steady > 0) {
      // Each part back to back, alone; every rank runs it the same number of times (each run of a
      // collective part is a collective), from the slowest rank's interleaved median. Two rounds,
      // the second in reverse order (the GPU warms over the rounds, and a warmer GPU reaches a
      // lower clock at the same power); the mean of each part's two medians.
      if (r == 0) t_steady.assign(parts.size(), std::vector<double>(size_t(w), 0.0));
      host_barrier.arrive_and_wait();
      for (size_t q = 0; q < 2 * parts.size(); ++q) {
        const size_t p = q < parts.size() ? q : 2 * parts.size() - 1 - q;
        const double slowest = *std::max_element(parts[p].medians->begin(), parts[p].medians->end());
        const int runs = std::max(20, int(double(steady) / std::max(slowest, 1e-3)));
        std::vector<cudaEvent_t> ev(size_t(runs) + 1);
        for (auto& e : ev) CCFUSE_CUDA_CHECK(cudaEventCreate(&e));
        team.barrier(st.stream);
        lead_spin_kernel<<<1, 1, 0, st.stream>>>(uint64_t(10000) * 1000u);  // the queue fills meanwhile
        CCFUSE_CUDA_CHECK(cudaGetLastError());
        CCFUSE_CUDA_CHECK(cudaEventRecord(ev[0], st.stream));
        for (int i = 0; i < runs; ++i) {
          parts[p].run(i % num_sets);
          CCFUSE_CUDA_CHECK(cudaEventRecord(ev[size_t(i) + 1], st.stream));
        }
        team.synchronize(st.stream);
        std::vector<double> ms;
        for (int i = runs / 10; i < runs; ++i) {  // the first tenth: the clock settling
          float t = 0;
          CCFUSE_CUDA_CHECK(cudaEventElapsedTime(&t, ev[size_t(i)], ev[size_t(i) + 1]));
          ms.push_back(t);
        }
        for (auto e : ev) cudaEventDestroy(e);
        std::sort(ms.begin(), ms.end());
        t_steady[p][size_t(r)] += ms[ms.size() / 2] / 2;
      }
    }
    if (r == 0) {
      std::lock_guard<std::mutex> lock(mu);
      log << "gpu: timed";
      for (const Part& part : parts) log << " " << part.what;
      log << ", interleaved\n";
    }

    if (const char* prefix = std::getenv("CCFUSE_TILE_TRACE"); prefix != nullptr && st.has_fused_op())
      st.trace_fused(prefix);

    // rel_err on sampled rows of a fresh, poisoned run (a full fp64 reference of these
    // shapes would take minutes on the host).
    CCFUSE_CUDA_CHECK(cudaMemset(st.out[0], 0xff, size_t(s.out_rows * o.n) * es));
    st.op(0);
    team.synchronize(st.stream);
    std::mt19937_64 pick(*o.seed + 17 * uint64_t(r));
    std::vector<int64_t> rows;
    for (int i = 0; i < kSampleRows; ++i) rows.push_back(int64_t(pick() % uint64_t(s.out_rows)));
    std::vector<std::vector<double>> got;
    for (int64_t row : rows) got.push_back(download(static_cast<char*>(st.out[0]) + size_t(row * o.n) * es, size_t(o.n), o.dtype));
    // Reference rows in fp64 from the (deterministic) inputs, regenerated once per source rank.
    std::vector<std::vector<double>> want(rows.size(), std::vector<double>(size_t(o.n), 0.0));
    for (int src = 0; src < w; ++src) {
      std::vector<size_t> use;  // sampled rows that take A rows from `src`
      for (size_t i = 0; i < rows.size(); ++i)
        if (!is_ag(o) || rows[i] / s.a_rows == src) use.push_back(i);
      if (use.empty()) continue;
      const auto a_src = rank_input(o, src, 0, size_t(s.a_rows * s.a_cols));
      const std::vector<float> b_other = is_ag(o) ? std::vector<float>() : rank_input(o, src, 1, size_t(s.gemm_k * o.n));
      const std::vector<float>& b_use = is_ag(o) ? b_host : b_other;
      for (size_t i : use) {
        // gemm_rs returns this rank's band: output row i is global row r * rows_per_band + i.
        const int64_t a_row = is_ag(o) ? rows[i] % s.a_rows : (o.op == "gemm_rs" ? r * s.out_rows + rows[i] : rows[i]);
        for (int64_t kk = 0; kk < s.gemm_k; ++kk) {
          const double av = a_src[size_t(a_row * s.a_cols + kk)];
          const float* brow = b_use.data() + size_t(kk * o.n);
          for (int64_t j = 0; j < o.n; ++j) want[i][size_t(j)] += av * double(brow[j]);
        }
      }
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t j = 0; j < o.n; ++j) {
        const double g = got[i][size_t(j)], d = g - want[i][size_t(j)];
        num += std::isfinite(g) ? d * d : INFINITY;
        den += want[i][size_t(j)] * want[i][size_t(j)];
      }
    }
    err_num[size_t(r)] = num;
    err_den[size_t(r)] = den;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }, comm::TeamOptions{o.watchdog_ms});

  BenchRecord rec;
  rec.op = o.op;
  rec.dtype = dtype_name(o.dtype);
  rec.gpu = prop.name;
  rec.backend = "gpu";
  rec.world_size = w;
  rec.m = o.m;
  rec.n = o.n;
  rec.k = o.k;
  // A collective finishes when its slowest rank does: take the max over ranks of the medians.
  rec.t_comm_ms = *std::max_element(t_comm.begin(), t_comm.end());
  rec.t_gemm_ms = *std::max_element(t_gemm.begin(), t_gemm.end());
  rec.t_serial_ms = *std::max_element(t_serial.begin(), t_serial.end());
  rec.t_limit_ms = std::max(rec.t_comm_ms, rec.t_gemm_ms);
  if (has_fused(o)) rec.t_fused_ms = *std::max_element(t_fused.begin(), t_fused.end());
  rec.t_gemm_ccfuse_ms = *std::max_element(t_gemm_ours.begin(), t_gemm_ours.end());
  if (steady > 0) {
    // The parts' order above: comm, gemm, serial, [gemm_ccfuse], [fused].
    rec.steady_ms = steady;
    std::vector<double*> dst = {&rec.t_comm_steady_ms, &rec.t_gemm_steady_ms, &rec.t_serial_steady_ms};
    if (o.dtype != DType::kFloat32) dst.push_back(&rec.t_gemm_ccfuse_steady_ms);
    if (has_fused(o)) dst.push_back(&rec.t_fused_steady_ms);
    for (size_t p = 0; p < dst.size() && p < t_steady.size(); ++p)
      *dst[p] = *std::max_element(t_steady[p].begin(), t_steady[p].end());
  }
  double num = 0, den = 0;
  for (int r = 0; r < w; ++r) {
    num += err_num[size_t(r)];
    den += err_den[size_t(r)];
  }
  rec.rel_err = den > 0 ? std::sqrt(num / den) : -1;
  rec.notes = (has_fused(o) ? "fused " + fused_config(o, prop.multiProcessorCount) + "; rel_err of the fused op"
                            : std::string("serial NCCL+cuBLAS baselines only (t_fused null: no fused kernel for this op/shape "
                                          "yet); rel_err of the serial op")) +
              " over " + std::to_string(kSampleRows) + " sampled output rows per rank" +
              (lead > 0 ? "; timing: a " + std::to_string(lead) + " us GPU spin before each start event" : "");
  return rec;
}

}  // namespace ccfuse::tool
