// ccfuse/tp/tuner.h: picks the configuration of a fused tensor-parallel op (ag_gemm, gemm_rs,
// gemm_ar) per problem: the transport (SM send warps, SM communication CTAs, copy engine), the
// number of communication CTAs n_c, the tile shape, the chunk size, pieces per chunk and group_m.
//
// Host only (no CUDA): the tool's --print-config, benches and tests use it on any machine.
// docs/tp-tuner.md has the cost model and the table format.
//
//   1. An exact match of (op, world size, m, n, per-rank K, GPU SMs) in the tuned table (a data
//      file, bench/tuned/tp_tuned.tsv) wins: its measured configuration and time.
//   2. Otherwise the cost model predicts every candidate transport and the fastest BUILT one is
//      chosen; the why-string names the alternatives and what a not-built transport would have
//      predicted when it would have been faster.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ccfuse/common/dtype.h"

namespace ccfuse::tp {

// One fused TP problem, as a rank sees it.
struct TpProblem {
  std::string op;        // "ag_gemm" | "gemm_rs" | "gemm_ar"
  int world_size = 0;    // ranks W (divides m)
  int64_t m = 0, n = 0;  // m: global rows (ag_gemm: gathered A; gemm_rs/gemm_ar: rows of A_r)
  int64_t k_per_rank = 0;  // ag_gemm: K; gemm_rs/gemm_ar: this rank's slice of the reduction (global K / W)
  DType dtype = DType::kBFloat16;  // bf16 or fp16
  int num_sms = 132;     // SMs of one GPU
  double link_gbps = 0;  // one-way link bandwidth the copy engine reaches (GB/s); 0 = the model's default (393)
};

// The tuner's answer.
struct TpChoice {
  std::string transport;  // "sm-send-warps" | "sm-comm-ctas" | "copy-engine"
  int num_comm_ctas = 0;  // n_c: SMs taken from the GEMM for communication
  int block_m = 128, block_n = 256, block_k = 64;
  int chunk_rows = 128;       // rows per flagged chunk (ag_gemm: of A; gemm_rs/gemm_ar: a tile row band)
  int pieces_per_chunk = 1;   // flags (and pushes) per chunk (ag_gemm); 1 for gemm_rs/gemm_ar (a flag per tile)
  int group_m = 8;
  int push_spread_us = 0;     // ag_gemm over send warps: the push paced over this many us (0: burst)
  int forward_spread_us = 0;  // gemm_rs/gemm_ar: peer partials forwarded paced over this many us (0: burst)
  double predicted_gemm_ms = 0, predicted_comm_ms = 0, predicted_fused_ms = 0;
  std::string source;  // "model" or "table:<file>:<line>"
  std::string why;     // the alternatives considered, their predicted times, and why this one
};

// One measured row of the tuned table.
struct TunedEntry {
  std::string op;
  int world_size = 0;
  int64_t m = 0, n = 0, k_per_rank = 0;
  int gpu_sms = 0;
  std::string transport;
  int num_comm_ctas = 0;
  int pieces_per_chunk = 0;
  int group_m = 8;
  double measured_fused_ms = 0;
  std::string source_file;  // the results file the time comes from
  int line = 0;             // line in the table file
};

// The tuned table: measured configurations, keyed by (op, W, m, n, k_per_rank, gpu_sms).
struct TunedTable {
  std::string path;  // where it was loaded from ("" for an empty default)
  std::vector<TunedEntry> entries;
  // The exact match for a problem, or nullptr.
  const TunedEntry* find(const TpProblem& problem) const;
};

// Parses a tuned table: tab-separated, '#' starts a comment line, blank lines skipped, 12 columns
//   op world_size m n k_per_rank gpu_sms transport num_comm_ctas pieces_per_chunk group_m
//   measured_fused_ms source_file
// Throws InvalidArgument "<path>:<line>: ..." naming the column and the rule (column count,
// non-numeric or out-of-range values, unknown op or transport, duplicate keys), or
// "tuned table <path> cannot be opened" when the file cannot be read.
TunedTable load_tuned_table(const std::string& path);

// The table shipped with the sources (bench/tuned/tp_tuned.tsv), loaded once. Looked for at
// $CCFUSE_TUNED_TABLE, then the source tree this library was built from, then
// ./bench/tuned/tp_tuned.tsv. Missing everywhere: an empty table (never throws for that); a
// malformed file throws as load_tuned_table.
const TunedTable& default_table();

// Throws InvalidArgument naming the argument and the rule: unknown op, world size < 1 or not
// dividing m, non-positive m/n/k_per_rank/num_sms, negative link_gbps, dtype not bf16/fp16.
TpChoice choose_tp_config(const TpProblem& problem, const TunedTable& table = default_table());

// "transport=sm-send-warps n_c=0 block=128x256x64 chunk_rows=128 pieces_per_chunk=32 group_m=8
//  predicted_ms=3.028 source=model" (one line; the why is choice.why).
std::string to_string(const TpChoice& choice);

// ---- the cost model, exposed for tests and docs ------------------------------------------------

// Fraction of the engine's peak reached at this K (per-rank K of the GEMM), from the measured
// interleaved GEMM sweep: piecewise linear in log2(K); 1.0 from K = 7168.
double gemm_efficiency(int64_t k);
// Clock derating of long GEMMs (FLOPs of the whole GEMM): 1.0 up to 1e12, 0.875 from 1.9e12.
double gemm_sustained_factor(double flops);
// Default one-way bandwidth (GB/s) of a transport with n_c communication CTAs (n_c ignored but
// for sm-comm-ctas), scaled by link_gbps / 393 when link_gbps > 0.
double transport_gbps(const std::string& transport, int num_comm_ctas, double link_gbps);
// Whether the kernels implement the transport for the op today: sm-send-warps for all three;
// copy-engine for ag_gemm only (AgTransport::kCopyEngine); sm-comm-ctas for none (replaced).
bool transport_built(const std::string& op, const std::string& transport);

// Constants of the model (measured on 2x H200 over NVLink unless marked).
struct TpModelConstants {
  static constexpr double kPeakTflops = 760.0;          // ccfuse GEMM engine, bf16, K >= 7168, 132 SMs
  static constexpr double kSustainedFromFlops = 1e12;   // GEMMs up to this many FLOPs run at full clocks
  static constexpr double kThrottledFromFlops = 1.9e12; // from here at kThrottledFactor (~665 TFLOP/s)
  static constexpr double kThrottledFactor = 0.875;
  static constexpr double kCopyEngineGbps = 393.0;      // cudaMemcpyAsync peer, one way
  static constexpr double kSendWarpsGbps = 370.0;       // 16-byte NVLink stores from 132 CTAs
  static constexpr double kCommCtas8Gbps = 349.0;       // 8 communication CTAs
  static constexpr double kCommCtas16Gbps = 360.0;      // 16 CTAs: interpolated, not measured
  static constexpr double kFlagRoundTripUs = 2.46;      // release a flag, peer sees it
  static constexpr double kEntryBarrierUs = 10.0;       // entry barrier of a fused call
  static constexpr double kLocalHbmGbps = 3000.0;       // local reads/writes of the reduction and tail copy (assumed)
  // ag_gemm's push pacing: the push of A_r spread over this fraction of one band's GEMM time
  // (docs/perf-notes.md, "ag_gemm push pacing").
  static constexpr double kAgPushSpreadFraction = 0.8;
  // gemm_rs/gemm_ar: the send warps' forwarding of peer partials paced over this many us where the
  // per-rank GEMM has at least kRsForwardSpreadMinWaves waves of 128x256 tiles (docs/perf-notes.md,
  // "gemm_rs forward pacing"; measured 2026-11-30: 10, 20 and 30 us equally good).
  static constexpr int kRsForwardSpreadUs = 20;
  // ag_gemm: the copy engine instead of the send warps where the push is dense, the model's
  // communication time (send warps) at least this fraction of its GEMM time (docs/tp-tuner.md).
  // Set between the measured shapes: 0.144 and 0.316 faster over the copy engine, 0.063-0.064
  // within noise (0.079: the 192 tile's shape, excluded on its own).
  static constexpr double kAgCopyEngineMinCommRatio = 0.1;
  static constexpr double kRsForwardSpreadMinWaves = 3.0;
};

// ag_gemm over send warps: microseconds over which to pace the push of A_r (AgGemmConfig::
// push_spread_us = -1). band_fraction x the model's GEMM time of one band of row tiles
// (gemm_ms / W: every rank computes its own band before it needs a peer's rows), rounded, at most
// 100000; 0 at W = 1. Throws InvalidArgument for a problem choose_tp_config rejects, an op other
// than ag_gemm, or band_fraction outside [0, 2].
int ag_push_spread_us(const TpProblem& problem, double band_fraction = TpModelConstants::kAgPushSpreadFraction);

// ag_gemm over send warps: the tile width, 256 or 192, for the gathered [m, K] x [K, n] GEMM on
// num_sms CTAs. 192 where whole waves of its tiles cost at least 5 % less than 256's (waves x
// columns, the tiles being equally fast per column in the fused kernel) and n is a multiple of
// 8 (its TMA-store epilogue): the few-wave shapes whose 256 tiles leave the last wave mostly
// empty (1024x14336: 448 tiles on 132 CTAs, 3.4 waves; 600 tiles of 192, 4.5). Measured
// 2026-11-30: 1024x14336x8192 1.108 -> 1.060x the engine's GEMM time; on 4096x7168x4096 and
// 8192x3072x4096, which this rule leaves at 256, 192 was 4-8 % slower.
int ag_block_n(int64_t m, int64_t n, int num_sms);

// ag_gemm: whether the copy engine is the transport (the model has no term for the send warps'
// contention with the GEMM beside them, so this is a measured rule, not a predicted time): W = 2
// (the only world size measured; W - 1 copies per chunk elsewhere), the model's send-warp communication time >= kAgCopyEngineMinCommRatio x its GEMM time (a dense
// push), and ag_block_n 256 (the copy-engine path has no 192 tile). Measured 2026-11-30 in GPU
// time, three calls: 0.974-0.981x the send warps' time on 4096x7168x4096 (comm/gemm 0.29) and
// 0.979-0.983x on 8192x3072x4096 (0.59); on 8192x14336x8192 and 16384x14336x8192 (0.11-0.12)
// within +-1.5 % either way; 1.02-1.03x on 1024x14336x8192 (the 192 tile's shape). Throws
// InvalidArgument for a problem choose_tp_config rejects or an op other than ag_gemm.
bool ag_copy_engine_pays(const TpProblem& problem);

// gemm_rs/gemm_ar: microseconds over which the send warps pace the forwarding of each peer partial
// tile (GemmRsConfig::forward_spread_us = -1). kRsForwardSpreadUs where the [m, n] GEMM has at
// least kRsForwardSpreadMinWaves waves of 128x256 tiles on num_sms CTAs and world_size > 1, else 0
// (as fast as the warps can). Measured 2026-11-30 on 2x H200: 8192x4096x6144 (7.8 waves) 0.951x and
// 4096x4096x14336 (3.9) 0.962x the unpaced time; 1024x8192x28672 (1.9 waves) 1.01-1.02x, hence
// the floor; the 15-31-wave shapes within noise.
int rs_forward_spread_us(int world_size, int64_t m, int64_t n, int num_sms);

}  // namespace ccfuse::tp
