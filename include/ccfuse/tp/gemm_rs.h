// ccfuse/tp/gemm_rs.h: fused GEMM + ReduceScatter and GEMM + AllReduce (DESIGN §1 rows gemm_rs,
// gemm_ar), host API.
//
//   rank r: A_r [M, K] and B_r ([K, N] or [N, K]) hold this rank's slice of the reduction
//   (a row-parallel Linear: K is the per-rank K, the global one is W * K). Partial P_r = A_r @ B_r.
//   GemmRs:  C_r [M/W, N] = rows [r * M/W, (r + 1) * M/W) of sum_p P_p
//   GemmAr:  C_r [M, N]   = sum_p P_p  (the M-split form: reduce-scatter by row band, then
//                           all-gather the reduced bands; never a split along K)
//
// v1 design (docs/tp-fusion.md): one persistent GEMM kernel on every SM, no communication CTAs.
// Each rank computes the row bands of its peers first, in a staggered order (rank r takes band
// r + 1, r + 2, ... so that at any time each rank receives from one peer). A finished partial
// tile is stored locally (staging; by TMA since v3.4, tma_store), handed to three idle warps of
// the producer warpgroup, which
// copy it into the owner's symmetric receive buffer with 16-byte NVLink stores and release a
// flag per tile while the consumers go on with the next tile. Its own band comes last: the
// epilogue of each own tile waits for the W - 1 peer flags of that tile, adds the peers' partials
// to its own accumulators in fp32 (its own partial never leaves the registers; the partials come
// into shared memory by TMA since v3.4, tma_addends) and stores the result. GemmAr's send warps also copy each reduced tile into every peer's symmetric output and
// flag it; after their last tile the CTAs copy the peers' bands into C (or nothing, when C is
// output()).
// Entry barrier and epochs come from the Team's SignalSet: no host sync, back-to-back calls and
// CUDA graphs are safe. Waits are watchdog'd (TimeoutError on the host).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "ccfuse/comm/team.h"
#include "ccfuse/gemm/gemm.h"

namespace ccfuse::tp {

struct GemmRsDesc {
  int64_t m = 0, n = 0;
  int64_t k = 0;  // per-rank K (the reduction slice this rank holds)
  DType dtype = DType::kBFloat16;
  gemm::BLayout b_layout = gemm::BLayout::kNK;
  int world_size = 0;  // 0: the Team's; else must equal it (catches a Team of another size)
};

struct GemmRsConfig {
  int num_sms = 0;  // CTAs of the persistent GEMM; 0 = every SM
  int group_m = 8;
  // CTAs per cluster along M: 1, or 2 (B multicast to vertically adjacent tiles, as the plain
  // GEMM does; needs an even number of 128-row tiles per band, ceil(M / W / 128)). Measured
  // 2026-11-30: 2 was 1-5 % slower on the TP shapes (a pair moves in lockstep, so one CTA's wait
  // for the peers' partials stalls both), so 1 is the default.
  int cluster_m = 1;
  // Launch the GEMM with programmatic dependent launch after the entry barrier kernel, so that
  // its prologue and first tiles overlap the barrier; sends, addend waits and the tail come after
  // griddepcontrol.wait. Default since 2026-11-30 (20:33, 004b4f0): in GPU time 0.987-0.999x the
  // time without it on the small TP shapes, +-1 % on the large (docs/perf-notes.md). Tool env
  // CCFUSE_TP_PDL=0 for A/B.
  bool overlap_entry = true;
  // The epilogue stores whole tiles through shared memory and TMA (3 pipeline stages; the own
  // band's tiles to C, the peers' to the staging buffer the send warps forward), as the plain
  // GEMM does; false: from registers (4 stages, v1). Needs cluster_m 1 and N a multiple of 8
  // (16-byte rows), else the register epilogue runs. Tool env CCFUSE_RS_TMA_STORE=0 for A/B.
  bool tma_store = true;
  // With tma_store: an own-band tile's peer partials are loaded by TMA into the staging buffer and
  // added from there, instead of by every consumer thread from global memory. Tool env
  // CCFUSE_RS_TMA_ADDENDS=0 for A/B.
  bool tma_addends = true;
  // With tma_addends: an own-band tile's first partial is loaded while the tile's mainloop runs
  // (consumer thread 0 looks at its flag every 8 k-blocks), not after it. Default since
  // 2026-11-30 (20:48, bc44201): 0.988-0.995x the time without it on the gemm_rs/gemm_ar shapes
  // that gain, noise elsewhere (docs/perf-notes.md). Tool env CCFUSE_RS_PREFETCH_ADDENDS=0 for A/B.
  bool prefetch_addends = true;
  // Opt-in: with tma_store, a peer band's whole tile is stored by TMA straight into the owner's
  // receive buffer over NVLink (no staging copy, no send warps for it) and its flag released once
  // the bulk writes are complete. Measured 2026-11-30 against the default in the same call:
  // 0.98-1.02x its time on the 8 gemm_rs/gemm_ar shapes, no gain. Tool env CCFUSE_RS_DIRECT=1.
  bool direct_store = false;
  // The send warps forward a peer band's partial tile in 8 slices of rows paced over this many
  // microseconds (0 = as fast as they can), as ag_gemm paces its push: tile traces showed the peer
  // band's waves whose partials are forwarded in a burst beside the mainloop run it 20-35 % slower.
  // -1 (the default since 2026-11-30 22:30, 056c54d): tp::rs_forward_spread_us, 20 us where the
  // GEMM has at least 3 waves of tiles, else 0; measured 0.951x the unpaced time on
  // 8192x4096x6144 and 0.962x on 4096x4096x14336 (docs/perf-notes.md). GemmAr's all-gather of reduced tiles is never paced
  // (it is the op's tail). Tool env CCFUSE_RS_FORWARD_SPREAD_US=N, tp_ab variants rsspreadN.
  int forward_spread_us = -1;
  // With tma_store: a tile the send warps forward (a peer band's partial; GemmAr's reduced
  // own-band tile to the peers) is handed to them 4 k-blocks into the next tile's mainloop, once
  // its bulk writes are complete, instead of after that whole mainloop (default since 2026-11-30
  // 22:45, 12f6127): tile traces of gemm_rs 1024x8192x28672 (two waves of ~150 us mainloops) showed the own band
  // waiting 17-33 us for partials the peer had finished a whole tile earlier. false: the old
  // hand-over, for A/B (tool env CCFUSE_RS_EARLY_HANDOVER=0, tp_ab variant rslate).
  bool early_handover = true;
};

// "block=128x256x64 stages=3 epilogue=tma_store cluster=1 sms=132 group_m=8 bands=staggered(own
// last) reduce=epilogue(fp32)"; n: the problem's N (whether the TMA-store epilogue can run).
std::string to_string(const GemmRsConfig& config, int num_sms, bool all_reduce, int64_t n);

// Largest number of ranks the fused TP reductions are built for.
constexpr int kMaxTpRanks = 8;

class GemmRs {
 public:
  // Collective over the Team. Throws InvalidArgument naming the rule: the world size divides M
  // and is at most 8, dtype bf16 or fp16, TMA alignment of K (and N for [K, N] B), the desc's
  // world size equal to the Team's.
  GemmRs(comm::Team& team, const GemmRsDesc& desc, GemmRsConfig config = {});
  ~GemmRs();
  // a: A_r [M, K]; b: B_r; c: C_r [M/W, N]; all device pointers, 16-byte aligned, c not
  // overlapping a or b.
  void run(const void* a, const void* b, void* c, cudaStream_t stream);
  // Diagnostics: later calls write per-tile timestamps (gemm::TileTrace) into `records` (device,
  // GEMM CTAs x slots_per_cta); nullptr turns it off.
  void set_trace(gemm::TileTrace* records, int slots_per_cta);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

class GemmAr {
 public:
  GemmAr(comm::Team& team, const GemmRsDesc& desc, GemmRsConfig config = {});
  ~GemmAr();
  // The symmetric output [M, N]: pass it as c to skip the final copy of the peers' bands.
  void* output() const;
  // a: A_r [M, K]; b: B_r; c: C [M, N] (or output()).
  void run(const void* a, const void* b, void* c, cudaStream_t stream);
  void set_trace(gemm::TileTrace* records, int slots_per_cta);  // as GemmRs::set_trace

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ccfuse::tp
