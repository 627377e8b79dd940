// ccfuse/gemm/gemm.h: the Hopper GEMM engine, host API (no CUDA headers needed).
//
//   C [M, N] = A [M, K] @ B        A row-major (K contiguous)
//   B is [K, N] row-major (BLayout::kKN) or [N, K] row-major (BLayout::kNK, a torch Linear weight)
//   C row-major, same dtype as A and B (bf16 or fp16), fp32 accumulation.
//
// Problem descriptor -> validated, printable config -> launch (DESIGN §4 rule 2). The fused ops
// use the same kernel through its device template (ccfuse/gemm/sm90_gemm.cuh) with their own
// tile scheduler (ready predicate) and epilogue (peer stores, notify).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ccfuse/common/dtype.h"

namespace ccfuse::gemm {

enum class BLayout { kKN, kNK };
inline const char* b_layout_name(BLayout b) { return b == BLayout::kKN ? "kn" : "nk"; }

// Order in which a persistent CTA takes output tiles.
enum class TileOrder {
  kRowMajor,     // m outer, n inner, in groups of `group_m` row tiles (L2 reuse of B)
  kColumnMajor,  // n outer (used across a group list by MoE layer 1)
};

struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kBFloat16;
  BLayout b_layout = BLayout::kKN;
  // Leading dimensions in elements; 0 = packed (k for A, n or k for B, n for C).
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool layout_is_nk() const { return b_layout == BLayout::kNK; }
};

// A packed problem (leading dimensions 0 = packed).
inline GemmDesc make_desc(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout) {
  GemmDesc d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.dtype = dtype;
  d.b_layout = b_layout;
  return d;
}

// Per-tile timestamps of a persistent GEMM (diagnostics; globaltimer ns), written by the first
// consumer thread of each CTA: start (before the tile's first k-block wait), mma_done (last
// wgmma retired), addends_ready (peer partials waited for and added; = mma_done without), stored
// (the tile's stores issued and, with send warps, handed over). Records of the CTA at
// grid-position c (GEMM CTAs counted from 0) are [c * slots, c * slots + slots); unused ones
// keep what the caller put there (zero them first).
struct TileTrace {
  uint64_t start, mma_done, addends_ready, stored;
  int32_t m_tile, n_tile, cta, index;
};

struct GemmConfig {
  int block_m = 128;
  int block_n = 256;
  int block_k = 64;
  int stages = 4;
  int num_sms = 0;  // CTAs of the persistent grid; 0 = every SM. An SM budget leaves the rest free.
  TileOrder order = TileOrder::kRowMajor;
  int group_m = 8;
  int cluster_m = 1;  // 2: CTA pairs on adjacent row tiles share B by TMA multicast (plain GEMM only)
  // 2: CTA pairs on adjacent column tiles share A by TMA multicast instead (plain GEMM, tma_store,
  // the 128x128 and 128x96 tiles; not with cluster_m 2, split-K, stream-K or pingpong). For
  // narrow tiles, whose A bytes per FLOP (1/block_n) outweigh B's (1/block_m). An experiment
  // (2026-11-30): +7 % on 4096^3 with the 128x96 tile, 4-11 % slower on the one-wave shapes it was
  // meant for; choose_config does not pick it (docs/gemm.md, README).
  int cluster_n = 1;
  // Epilogue through shared memory and TMA stores, overlapped with the next tile (plain GEMM,
  // 128x256x64 with 3 stages, ldc a multiple of 8). Opt-in until measured (docs/perf-notes.md).
  bool tma_store = false;
  // Split-K (plain problems, cluster 1): each tile's K is cut into split_k equal parts run by
  // different CTAs; the last part of a tile to finish adds the others' fp32 partials (through a
  // workspace, inside the kernel) and stores the tile. Opt-in: choose_config picks stream-K.
  int split_k = 1;
  // Stream-K (plain problems, cluster 1): whole tiles for all full waves but the last, and the
  // k-blocks of the remaining tiles cut evenly over the CTAs, each tile's parts summed as in
  // split-K. choose_config picks it where the tiles fill the SMs badly (few tiles, long K).
  // split_k and stream_k need workspace_bytes() of device memory: run() takes a per-device one
  // unless one is passed (one GEMM at a time per device then: concurrent calls on several streams
  // must pass their own).
  bool stream_k = false;
  // Ping-pong consumers (plain problems, tma_store, the 128x128x64/5 tile, whole tiles): each
  // consumer warpgroup computes its own tiles, the two in turn, so that one's epilogue runs under
  // the other's mainloop (what cuBLASLt's 128x128 kernels do on K <= 1024). choose_config picks
  // it, unpaired, for K <= 512 with more 128x128 tiles than SMs and for K <= 1024 with at least
  // 20 waves of them (measured 2026-12-01: +1.5 to +3.4 % and +1.3 to +3.3 % there; in CTA pairs
  // it had been level or slower; docs/gemm.md item 9).
  bool pingpong = false;
};

// Throws InvalidArgument naming the argument and the rule: positive sizes; dtype bf16 or fp16;
// TMA needs 16-byte aligned rows (k, and n for kKN B, multiples of 8 elements for 16-bit types)
// and leading dimensions; a tile shape the engine was built for.
void validate(const GemmDesc& desc, const GemmConfig& config);

// Multiprocessors of the current CUDA context (the default SM budget): the device's, or the
// share of a green context that is current (a rank of a one-GPU world, comm/team.h mode d).
int current_device_sms();

// The engine's choice for a problem on `num_sms` SMs (tile shape by size, SM budget kept).
GemmConfig choose_config(const GemmDesc& desc, int num_sms);

// "block=128x256x64 stages=4 sms=132 order=row group_m=8"
std::string to_string(const GemmConfig& config);

// Runs C = A @ B on `stream`. Pointers must be 16-byte aligned (checked). With split_k > 1 or
// stream_k the fp32 partials and the tiles' counters need workspace_bytes(desc, config) bytes:
// `workspace` (16-byte aligned device memory; its counters are zeroed on the stream before the
// kernel), or, when it is null, per-device buffers the library grows on first use (a cudaMalloc
// then). While the stream is being captured into a CUDA graph they cannot grow: a call whose
// buffers are too small then runs its tiles whole (correct, without the split). Make one call
// before capturing, or pass a workspace, to keep the split in the graph.
void run(const GemmDesc& desc, const GemmConfig& config, const void* a, const void* b, void* c, void* stream,
         void* workspace = nullptr);
size_t workspace_bytes(const GemmDesc& desc, const GemmConfig& config);

// Tiles of the problem for a config, and the (m_tile, n_tile) of linear tile index `idx` in the
// config's order: host copies of the device scheduler's math, for tests and tools.
int64_t num_tiles(const GemmDesc& desc, const GemmConfig& config);
void tile_coord(const GemmDesc& desc, const GemmConfig& config, int64_t idx, int64_t* m_tile, int64_t* n_tile);

// Fused epilogues (bf16, cluster 1): an activation and/or a per-row scale on the way out.
//   kGelu     C = gelu(A @ B) (erf form)
//   kSiluMul  SwiGLU from one GEMM: B's columns are arranged per block_n tile as
//             [block_n/2 gate | block_n/2 up] (swiglu_column_permutation), N = 2F must be a
//             multiple of block_n, and C = silu(gate) * up is [M, F] (ldc counts F columns).
//   row_scale C[i, :] *= row_scale[i] (device, one float per row), e.g. MoE top-k weights.
enum class EpilogueOp { kNone, kGelu, kSiluMul };
struct EpilogueDesc {
  EpilogueOp op = EpilogueOp::kNone;
  const float* row_scale = nullptr;
};
void run_fused(const GemmDesc& desc, const GemmConfig& config, const EpilogueDesc& epilogue, const void* a,
               const void* b, void* c, void* stream);
// For SwiGLU: column i of the GEMM's B takes column perm[i] of [gate (F columns) | up (F columns)].
std::vector<int64_t> swiglu_column_permutation(int64_t ffn, int block_n);

// Grouped GEMM (MoE experts): for g in [0, num_groups), rows [off_g, off_g + rows_g) of C =
// the same rows of A @ B_g, where rows_g comes from device memory (no host sync, CUDA-graph
// capturable) and off_g is its prefix sum. A and C hold `max_rows` rows (the bound on the total);
// B is [num_groups, K, N] (kKN) or [num_groups, N, K] (kNK), contiguous per group. Rows past
// max_rows are dropped; their count goes to `overflow` (device int) when it is not null.
struct GroupedGemmDesc {
  int num_groups = 0;
  int64_t max_rows = 0, n = 0, k = 0;
  DType dtype = DType::kBFloat16;
  BLayout b_layout = BLayout::kKN;
};
void validate(const GroupedGemmDesc& desc, const GemmConfig& config);
// mem_gbps: the device's peak memory bandwidth in GB/s (0: the current device's,
// current_device_mem_gbps()); the grouped tile rule depends on it (ping-pong 128x128 from N = 4096
// only from kGroupedPingpongMinGbps: measured faster on an H200, slower on an H100).
GemmConfig choose_config(const GroupedGemmDesc& desc, int num_sms, double mem_gbps = 0);
// Peak memory bandwidth of the current device, GB/s (memory clock x bus width; 0 if unknown).
double current_device_mem_gbps();
constexpr double kGroupedPingpongMinGbps = 4000;  // H100 SXM ~3350, H200 ~4800
size_t grouped_workspace_bytes(const GroupedGemmDesc& desc);
void grouped_run(const GroupedGemmDesc& desc, const GemmConfig& config, const void* a, const void* b, void* c,
                 const int* group_rows, void* workspace, int* overflow, void* stream);

// K-grouped GEMM (the MoE experts' weight gradients: d W_g = dY_g^T X_g over the tokens routed to
// expert g): for g in [0, num_groups), C_g [m, n] = A_g^T B_g, where A_g and B_g are rows
// [off_g, off_g + rows_g) of A [max_rows, m] and B [max_rows, n] (both row-major: the rows are
// the contraction), rows_g comes from device memory (no host sync, CUDA-graph capturable) and
// off_g is its prefix sum. C is [num_groups, m, n], contiguous; a group without rows gets zeros.
// Rows past max_rows are dropped; their count goes to `overflow` (device int) when it is not
// null. Cooperative TMA-store tiles 128x256x64/3 and 128x128x64/5 (choose_config's pick); m and n
// multiples of 8 (16-byte rows for TMA). torch._grouped_mm(a.t(), b, offs) computes the same.
// accumulate: C is fp32 and gets C_g += A_g^T B_g instead (Megatron's gradient-accumulation fusion
// into the fp32 main_grad: no bf16 rounding of each micro-batch's gradient, no separate add); a
// group without rows leaves its C_g as it is. Register-epilogue tiles 128x256x64/4 and
// 128x128x64/6 (choose_config's pick for it), C 16-byte aligned.
struct KGroupedGemmDesc {
  int num_groups = 0;
  int64_t max_rows = 0, m = 0, n = 0;
  DType dtype = DType::kBFloat16;  // of A and B (and C unless accumulate)
  bool accumulate = false;
};
void validate(const KGroupedGemmDesc& desc, const GemmConfig& config);
GemmConfig choose_config(const KGroupedGemmDesc& desc, int num_sms);
size_t kgrouped_workspace_bytes(const KGroupedGemmDesc& desc);
void kgrouped_run(const KGroupedGemmDesc& desc, const GemmConfig& config, const void* a, const void* b, void* c,
                  const int* group_rows, void* workspace, int* overflow, void* stream);

}  // namespace ccfuse::gemm
