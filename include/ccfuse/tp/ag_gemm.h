// ccfuse/tp/ag_gemm.h: fused AllGather + GEMM (DESIGN §1 row ag_gemm), host API.
//
//   rank r: A_r [M/W, K] (bf16), B_r ([K, N] or [N, K]) -> C_r [M, N] = AllGather_rows(A) @ B_r,
//   and the gathered A [M, K] stays readable (gathered_a()) for the weight gradient.
//
// v2 design (docs/tp-fusion.md): one persistent GEMM kernel on every SM. Before its first tile,
// each CTA's send warps (three idle warps of the producer warpgroup) push pieces of this rank's
// A band into every rank's symmetric gather buffer over NVLink (this rank's own copy first) and
// release a flag per piece; the GEMM takes bands in rank-rotated order (own band first), each
// tile's producer waiting for the pieces of its 128-row chunk. Entry barrier and epochs come
// from the Team's SignalSet: no host sync, back-to-back calls and CUDA graphs are safe.
//
// Copy-engine transport (AgTransport::kCopyEngine): the GEMM kernel runs without send warps
// (the standalone engine's register split), and this rank's band goes to every peer by
// cudaMemcpyAsync on a side stream per peer, copy_rows rows at a time, each copy followed on
// that stream by cuStreamWriteValue64(flag, 1) (no SM is used for the transfer). Those flags
// hold a fixed value and are zeroed by the next call's entry barrier (SignalSet::begin_call's
// reset set) before any peer may write them again.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "ccfuse/comm/team.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/tp/tuner.h"

namespace ccfuse::tp {

struct AgGemmDesc {
  int64_t m = 0, n = 0, k = 0;  // M global rows; B_r is [K, N] (kKN) or [N, K] (kNK)
  DType dtype = DType::kBFloat16;
  gemm::BLayout b_layout = gemm::BLayout::kNK;
};

// How this rank's A band reaches its peers.
enum class AgTransport {
  kSendWarps,   // the GEMM CTAs' idle producer warps store it over NVLink before their first tile
  kCopyEngine,  // cudaMemcpyAsync + cuStreamWriteValue64 flags on side streams (no SM)
};
const char* transport_name(AgTransport t);  // "sm-send-warps" | "copy-engine" (the tuner's names)

struct AgGemmConfig {
  AgTransport transport = AgTransport::kSendWarps;
  // Copy engine only: rows per copy (and flag); a positive multiple of 128 (a band's last copy
  // is short where it does not divide M / W). 0 = auto (about 4 MiB per copy, at least 4
  // copies per band where the band allows).
  int copy_rows = 0;
  // CTAs per cluster along M: 1, or 2 (B multicast to vertically adjacent tiles, as the plain
  // GEMM does; needs M / W a multiple of 256). Measured 2026-11-30: 2 was 0-3 % slower on the TP
  // shapes (a pair moves in lockstep, so one CTA's flag wait stalls both), so 1 is the default.
  int cluster_m = 1;
  // Launch the GEMM with programmatic dependent launch after the entry barrier kernel, so that
  // its prologue and its own-band tiles overlap the barrier; the pushes and remote waits come
  // after griddepcontrol.wait. Send warps only (the copy engine's event fork sits between the two
  // kernels). Default since 2026-11-30 (20:33, 004b4f0): in GPU time 0.987-0.999x the time
  // without it on the small TP shapes, +-1 % on the large (docs/perf-notes.md). Tool env
  // CCFUSE_TP_PDL=0 for A/B.
  bool overlap_entry = true;
  int num_sms = 0;           // CTAs of the persistent GEMM; 0 = every SM
  // Columns per tile: 256, or 192 (TMA-store epilogue with send warps: n a multiple of 8,
  // cluster_m 1), or 0 = auto: tp::ag_block_n's wave rule (192 only where its whole waves cost
  // >= 5 % less, e.g. 1024x14336; 256 where 192 cannot run). Measured 2026-11-30: where the plain
  // GEMM engine would pick 192 the fused op took 0.97-1.04x the 256 tile's time (the waits and
  // the push set its pace, not the tile's efficiency); on 1024x14336x8192, 3.4 waves of 256, 192
  // took 0.955x.
  int block_n = 0;
  int pieces_per_chunk = 0;  // flags (and pushes) per 128-row chunk of A; 0 = enough for every CTA
  int group_m = 8;
  // CTAs whose send warps push A (the first push_ctas of the grid); 0 = every GEMM CTA. 16-32
  // CTAs saturate NVLink (docs/perf-notes.md, ceilings). Measured 2026-11-30: slower on every
  // shape (16 pushers: 2.92 -> 3.34 ms on 8192x14336x8192; the GEMM waits for the push), so
  // nothing sets it but tests; send warps only.
  int push_ctas = 0;
  // false: gathered_a() holds the peers' bands only when A_r comes by pointer (run(a_local, ...)):
  // this rank's band is not copied into its own gather buffer (32 MB of HBM read and written on
  // 8192x...x4096 at TP = 2, beside the own band's tiles). For inference, where no weight gradient
  // needs the gathered A. With A_r written into local_a() nothing changes. Tool env
  // CCFUSE_AG_RETURN_GATHERED=0.
  bool return_gathered = true;
  // Send warps only: the push of A_r is paced over push_spread_us microseconds (piece i of the
  // band waits until push start + i / pieces of it) instead of one burst. A burst slowed the own
  // band's tiles by 35 % (tile traces, docs/perf-notes.md); paced, ag_gemm 8192x3072x4096 went
  // from 0.339 to 0.294 ms (2026-11-30). 0 = one burst; -1 (default) = auto: push_spread_fraction
  // of the cost model's time for one band of tiles (tp::ag_push_spread_us), the time every rank
  // spends on its own band before it needs a peer's rows. Tool env CCFUSE_AG_PUSH_SPREAD_US,
  // CCFUSE_AG_PUSH_SPREAD_FRACTION.
  int push_spread_us = -1;
  double push_spread_fraction = TpModelConstants::kAgPushSpreadFraction;
};

// "gemm_ctas=132 block=128x256x64 chunk_rows=128 pieces_per_chunk=auto group_m=8 push=send-warps"
// desc: the problem (unused so far; the tile width does not depend on it).
std::string to_string(const AgGemmConfig& config, int num_sms, const AgGemmDesc* desc = nullptr);

class AgGemm {
 public:
  // Collective over the Team. Throws InvalidArgument naming the rule: world size divides M (and
  // is at most 8), bf16 or fp16, TMA alignment of K and N; cluster_m 2 needs M / W a multiple of
  // 256. Any other M / W is taken: a band's last 128-row chunk may be short.
  AgGemm(comm::Team& team, const AgGemmDesc& desc, AgGemmConfig config = {});
  ~AgGemm();

  // This rank's band inside the symmetric gather buffer ([M/W, K]): write A_r here and pass
  // a_local = nullptr to run() to skip the local copy.
  void* local_a() const;
  // The gathered A [M, K] after a call (without this rank's band when config.return_gathered is
  // false and A_r came by pointer).
  const void* gathered_a() const;

  // a_local: this rank's A_r [M/W, K] (device) or nullptr; b: B_r; c: C_r [M, N] (device).
  // Throws InvalidArgument, before enqueueing anything, where c overlaps a_local, b or the gather
  // buffer, or a pointer is not 16-byte aligned.
  void run(const void* a_local, const void* b, void* c, cudaStream_t stream);
  // Diagnostics: later calls write per-tile timestamps (gemm::TileTrace) into `records` (device,
  // GEMM CTAs x slots_per_cta); nullptr turns it off.
  void set_trace(gemm::TileTrace* records, int slots_per_cta);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ccfuse::tp
