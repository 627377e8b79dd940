// The expert-parallel MoE FFN, v1 (ccfuse/moe/moe_ffn.h; docs/moe-layers.md, "GPU v1").
#include "ccfuse/moe/moe_ffn.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/ranges.h"
#include "ccfuse/common/pace.cuh"
#include "ccfuse/common/warp_scan.cuh"
#include "ccfuse/gemm/sm90_gemm.cuh"
#include "ccfuse/moe/dispatch_gpu.h"
#include "ccfuse/moe/dispatch_plan.h"
#include "ccfuse/moe/moe_tuner.h"

namespace ccfuse::moe {

namespace {

constexpr int kBlockM = 128, kBlockN = 256;
constexpr int kChunkRows = 128;  // rows of a (source, expert) block per dispatch flag
using E = cutlass::bfloat16_t;

// Where things live (per rank, all device memory; "sym" = symmetric, peers write it).
//   counts   sym [W][E] int32       every source's entries per global expert
//   recv     sym [max_rows, H] bf16 layer 0's A: dispatched rows, expert-sorted
//   row_src  sym [max_rows] int2    (source rank, entry = token * k + slot) of each received row
//   row_w    sym [max_rows] float   its router weight
//   slots    sym [max_tokens * k, H] bf16  layer 1's weighted rows back at their token's owner
//   h1       [max_rows, F] bf16     layer 0's output (after the activation)
//   y        [max_rows, H] bf16     layer 1's weighted output tiles before they are forwarded
// Flags: [0, W) counts row of source s; [W, W + W * max_chunks) chunk c of source s's dispatch;
// [W + W * max_chunks, + W) layer 1: every row of source s's tokens is back; all-gather mode:
// then [.., + W * max_gchunks) token chunk c of source s is in this rank's gathered buffer.
struct Plan {  // device arrays derived from the counts matrix (written by exchange_kernel)
  int32_t* group_rows;   // [E_local] rows of each local expert
  int64_t* row_prefix;   // [E_local + 1]
  int* tile_prefix0;     // [E_local + 1] layer-0 tiles (n_tiles = 2F / 256 or F / 256)
  int* tile_prefix1;     // [E_local + 1] layer-1 tiles (n_tiles = H / 256)
  int* local_prefix0;    // [E_local + 1] layer-0 tiles of row tiles all from this rank (local_first)
  int* chunk_base;       // [W][E + 1] first chunk of source s's block of rotated expert i
  int64_t* rows_base;    // [E + 1] this rank's entries before rotated expert i (send order)
  int64_t* block_begin;  // [E] first row of this rank's block of expert e on its owner
  int64_t* target;       // [W] layer 1: (rows from source s) * H-tiles
  int64_t* done_count;   // [W] layer 1: row-tiles of source s sent so far (zeroed per call)
  int* unit_done;        // [max_chunks] striped dispatch: rows of this rank's send unit u copied (zeroed per call)
  int* perm_base;        // [W * E_local + 1] all-gather: first permute unit of (i-th source
                         // rotated from this rank, local expert j), units of kChunkRows rows
};

// a[i] for a register array of 4 and a warp-uniform i (no local-memory indexing).
template <class T>
__device__ __forceinline__ T select4(const T (&a)[4], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}

// A source's send order over the global experts (rotated index i <-> expert). Owner-major (v1,
// measured): this rank's own experts first, then rank + 1's, ...; a receiver's first experts get
// their remote rows only after every source has copied its own rows. Interleaved
// (MoeFfnConfig::interleave_sends; the MoE tuner picks it with the striped dispatch and on
// balanced large cases): local expert j of every owner in turn (owners rotated from this rank),
// in the order the receivers' tiles need them.
struct Geometry {
  int world = 1, rank = 0, experts = 1, epr = 1, topk = 1;
  int64_t hidden = 0, max_chunks = 0;
  int64_t max_tokens = 0, max_gchunks = 0;  // all-gather: token chunks of kChunkRows per source
  bool interleaved = false;
  __host__ __device__ int rot_index(int src, int e) const {
    if (!interleaved) return (e - src * epr + experts) % experts;
    return (e % epr) * world + (e / epr - src + world) % world;
  }
  __host__ __device__ int rot_expert(int src, int i) const {
    if (!interleaved) return (src * epr + i) % experts;
    return ((src + i % world) % world) * epr + i / world;
  }
  __host__ __device__ int chunk_flag(int src, int chunk) const { return world + int(src * max_chunks) + chunk; }
  __host__ __device__ int done_flag(int src) const { return world + int(world * max_chunks) + src; }
  // All-gather: token chunk c of source src has arrived in this rank's gathered buffer.
  __host__ __device__ int gather_flag(int src, int64_t c) const {
    return world + int(world * max_chunks) + world + int(src * max_gchunks + c);
  }
  __host__ __device__ int num_flags(bool allgather) const {
    return world + int(world * max_chunks) + world + (allgather ? int(world * max_gchunks) : 0);
  }
};

// Layer 0's preparation kernels go out with programmatic dependent launch (launch_pdl): each may
// start while the kernel before it still runs, and waits (gemm::sm90::griddep_wait) only where it
// reads what that kernel wrote, so a kernel's launch hides behind its predecessor's work instead of
// following its end (the steps of "l0pre" cost 5-8 us each on one H100, 2026-12-06, the work in
// them a fraction of that). Every kernel of the chain waits before it exits, so its end implies
// its predecessors'. Without PDL the griddepcontrol instructions return at once.
__device__ __forceinline__ void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;"); }

template <class... KArgs, class... Args>
void launch_pdl(bool pdl, void (*kernel)(KArgs...), unsigned grid, unsigned block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  config.gridDim = dim3(grid);
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  CCFUSE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// CCFUSE_MOE_PREP_PDL=0: the preparation kernels launched one after the other (an A/B switch).
bool prep_pdl() {
  const char* v = std::getenv("CCFUSE_MOE_PREP_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// MoeFfnConfig::prep_one = -1: CCFUSE_MOE_PREP_ONE=1 prepares a call of at most kPrepChunk
// entries by single_chunk_prep_kernel instead of the two chunk kernels (an A/B switch, 2026-12-07;
// opt-in until measured).
bool prep_one_env() {
  const char* v = std::getenv("CCFUSE_MOE_PREP_ONE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// CCFUSE_MOE_L0_PDL=0: layer 0's GEMM launched after the exchange kernel's end (an A/B switch).
bool l0_gemm_pdl() {
  const char* v = std::getenv("CCFUSE_MOE_L0_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The Plan from the counts matrix cnt ([W][E], in shared memory) by the whole CTA; erows ([E])
// and kept ([E_local]) are shared-memory scratch.
__device__ void derive_plan(const Geometry& g, const int32_t* cnt, int32_t* erows, int32_t* kept, const Plan& plan,
                            int n_tiles0, int n_tiles1, int64_t max_rows) {
  for (int x = threadIdx.x; x < g.experts; x += blockDim.x) {
    int32_t r = 0;
    for (int q = 0; q < g.world; ++q) r += cnt[q * g.experts + x];
    erows[x] = r;
    if (x / g.epr == g.rank) plan.group_rows[x - g.rank * g.epr] = r;
  }
  __syncthreads();
  // Every derived array is a prefix sum: one task a warp, each a warp scan (32 items a step).
  // Until 2026-12-06 single threads walked the experts for chunk_base, rows_base and perm_base,
  // and thread x summed x's predecessors for block_begin: O(E) shared-memory steps each, a few
  // microseconds at E = 128-256 on the path to layer 0's GEMM (docs/perf-notes.md).
  // Tasks: 0 layer 0's schedule prefixes and local_prefix0, 1 layer 1's, 2 rows_base,
  // 3 perm_base, 4 block_begin, 5 + s chunk_base of source s and target[s].
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  const int32_t* local_rows = erows + g.rank * g.epr;
  for (int task = warp; task < 5 + g.world; task += warps) {
    if (task == 0) {
      gemm::sm90::grouped_prefix_warp([&](int x) { return local_rows[x]; }, g.epr, n_tiles0, kBlockM, max_rows,
                                      plan.tile_prefix0, plan.row_prefix, nullptr, lane, kept);
      __syncwarp();  // kept[] written by the warp's lanes
      // Layer 0's first tiles (MoeFfnConfig::local_first, L0Schedule::local_prefix): a local
      // expert's rows start with this rank's own (block_begin: the owner's block first), so its
      // first floor(own / 128) row tiles hold only rows copied on this GPU (within the rows kept
      // under max_rows).
      warp_exclusive_scan<int>(
          g.epr,
          [&](int x) {
            const int own = min(cnt[g.rank * g.experts + g.rank * g.epr + x], kept[x]);
            return own / kBlockM * n_tiles0;
          },
          [&](int x, int tiles) { plan.local_prefix0[x] = tiles; }, lane);
    } else if (task == 1) {
      gemm::sm90::grouped_prefix_warp([&](int x) { return local_rows[x]; }, g.epr, n_tiles1, kBlockM, max_rows,
                                      plan.tile_prefix1, nullptr, nullptr, lane);
    } else if (task == 2) {  // this rank's entries before rotated expert i (its send order)
      warp_exclusive_scan<int64_t>(
          g.experts, [&](int i) { return cnt[g.rank * g.experts + g.rot_expert(g.rank, i)]; },
          [&](int i, int64_t v) { plan.rows_base[i] = v; }, lane);
    } else if (task == 3) {  // DispatchPlan::permute_bases(rank, kChunkRows, perm_base)
      warp_exclusive_scan<int>(
          g.world * g.epr,
          [&](int q) {
            const int src = (g.rank + q / g.epr) % g.world;
            return (cnt[src * g.experts + g.rank * g.epr + q % g.epr] + kChunkRows - 1) / kChunkRows;
          },
          [&](int q, int u) { plan.perm_base[q] = u; }, lane);
    } else if (task == 4) {
      // block_begin(rank, x): x's first row on its owner (the owner's earlier experts' rows), then
      // the blocks of the sources rotated from the owner that come before this rank's.
      for (int owner = 0; owner < g.world; ++owner) {
        const int x0 = owner * g.epr, before = (g.rank - owner + g.world) % g.world;
        warp_exclusive_scan<int64_t>(
            g.epr, [&](int j) { return erows[x0 + j]; },
            [&](int j, int64_t row) {
              if (j == g.epr) return;
              for (int i = 0; i < before; ++i) row += cnt[((owner + i) % g.world) * g.experts + x0 + j];
              plan.block_begin[x0 + j] = row;
            },
            lane);
      }
    } else {  // source src's chunks before its block of rotated expert i; layer 1's target from it
      const int src = task - 5;
      warp_exclusive_scan<int>(
          g.experts,
          [&](int i) { return (cnt[src * g.experts + g.rot_expert(src, i)] + kChunkRows - 1) / kChunkRows; },
          [&](int i, int c) { plan.chunk_base[src * (g.experts + 1) + i] = c; }, lane);
      const int64_t from_src = warp_exclusive_scan<int64_t>(
          g.epr, [&](int x) { return cnt[src * g.experts + g.rank * g.epr + x]; }, [](int, int64_t) {}, lane);
      if (lane == 0) plan.target[src] = from_src * n_tiles1;
    }
  }
}

// Every rank's counts matrix (symmetric memory), by value in the kernel's parameters: no pointer
// table to load from device memory on the exchange's critical path.
struct CountsPeers {
  int32_t* p[kMaxMoeRanks];
};

// One CTA: push this rank's counts row into every rank's matrix, wait for every source's, then
// derive the Plan (derive_plan). The own row goes to shared memory as it is pushed; only the
// peers' rows are read back after the wait (at W = 1 none). ~9 us at W = 1 (ncu, 2026-12-06):
// a chain of dependent memory round trips and system-scope fences, then the scans.
__global__ void exchange_kernel(Geometry g, comm::DeviceSignals sig, const int32_t* counts_row, CountsPeers peers,
                                Plan plan, int n_tiles0, int n_tiles1, int64_t max_rows) {
  griddep_launch_dependents();  // layer 0's GEMM may take its SMs now (it waits for this kernel's end)
  gemm::sm90::griddep_wait();   // the counts row and the call's epoch (the kernels before it)
  extern __shared__ int32_t smem_counts[];  // [W][E], then expert rows [E], then kept rows [E_local]
  const epoch_t e = comm::current_epoch(sig);
  for (int x = threadIdx.x; x < g.experts; x += blockDim.x) {
    const int32_t v = counts_row[x];
    smem_counts[g.rank * g.experts + x] = v;
    for (int q = 0; q < g.world; ++q) peers.p[q][g.rank * g.experts + x] = v;
  }
  __syncthreads();
  bool ok = true;
  if (threadIdx.x < g.world) {
    // All-gather mode: route_push_kernel's writes (the kernel before on the stream) go out under
    // the same flags.
    __threadfence_system();
    comm::notify(sig, threadIdx.x, g.rank, e);
    ok = comm::wait(sig, threadIdx.x, e, threadIdx.x);
  }
  if (!__syncthreads_and(ok ? 1 : 0)) return;  // watchdog: the host raises TimeoutError
  const int32_t* counts = peers.p[g.rank];
  for (int i = threadIdx.x; i < g.world * g.experts; i += blockDim.x)
    if (i / g.experts != g.rank) smem_counts[i] = counts[i];
  __syncthreads();
  derive_plan(g, smem_counts, smem_counts + g.world * g.experts, smem_counts + (g.world + 1) * g.experts, plan,
              n_tiles0, n_tiles1, max_rows);
}

// internal::derive_plan_for_test's kernel: derive_plan from a given matrix (no exchange).
__global__ void derive_plan_kernel(Geometry g, const int32_t* counts, Plan plan, int n_tiles0, int n_tiles1,
                                   int64_t max_rows) {
  extern __shared__ int32_t smem_counts[];
  for (int i = threadIdx.x; i < g.world * g.experts; i += blockDim.x) smem_counts[i] = counts[i];
  __syncthreads();
  derive_plan(g, smem_counts, smem_counts + g.world * g.experts, smem_counts + (g.world + 1) * g.experts, plan,
              n_tiles0, n_tiles1, max_rows);
}

constexpr int kPrepChunk = 2048, kPrepThreads = 256;
constexpr int kPrepWarps = kPrepThreads / 32, kPrepSteps = kPrepChunk / kPrepThreads;

// The chunk's ids (kPrepSteps a thread, entry first + step * kPrepThreads + threadIdx.x), all
// loaded before any is used: one round trip to memory, not one a step behind its barriers.
__device__ __forceinline__ void load_chunk_ids(const int32_t* topk_ids, int64_t entries, int64_t first,
                                               int (&ids)[kPrepSteps]) {
#pragma unroll
  for (int step = 0; step < kPrepSteps; ++step) {
    const int64_t i = first + step * kPrepThreads + threadIdx.x;
    ids[step] = i < entries ? topk_ids[i] : -1;
  }
}

// ranks[step] = the entry's rank among the chunk's entries of the same expert, in entry order
// (valid ids only; ids outside [0, E) are dropped), and running[x] = the chunk's count of expert x:
// 256 entries a step, within a warp by __match_any_sync, across the step's warps through a
// [warps][E] count table, across steps by the running count. running [E] and warp_cnt [warps][E]
// in shared memory, zeroed here; running is final for every thread on return.
__device__ __forceinline__ void rank_chunk_entries(const int (&ids)[kPrepSteps], int experts, int32_t* running,
                                                   int32_t* warp_cnt, int (&ranks)[kPrepSteps]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < experts; i += blockDim.x) running[i] = 0;
  for (int i = threadIdx.x; i < experts * kPrepWarps; i += blockDim.x) warp_cnt[i] = 0;
  __syncthreads();
#pragma unroll
  for (int step = 0; step < kPrepSteps; ++step) {
    int x = ids[step];
    if (x >= experts) x = -1;
    const unsigned peers = __match_any_sync(0xffffffffu, x);
    const bool leader = (peers & ((1u << lane) - 1)) == 0;
    if (x >= 0 && leader) warp_cnt[warp * experts + x] = __popc(peers);
    __syncthreads();
    ranks[step] = 0;
    if (x >= 0) {
      int r = running[x] + __popc(peers & ((1u << lane) - 1));
      for (int w = 0; w < warp; ++w) r += warp_cnt[w * experts + x];
      ranks[step] = r;
    }
    __syncthreads();
    if (x >= 0 && leader) {
      atomicAdd(&running[x], __popc(peers));
      warp_cnt[warp * experts + x] = 0;
    }
    __syncwarp();  // the resets before the next step's counts from other lanes
  }
  __syncthreads();
}

// The per-call writes that follow the counts (base[x]: entries of expert x in the chunks before
// this one, total[x]: this rank's count of x, both in shared memory): CTA 0 writes counts_row (for
// the exchange kernel) and zeroes the per-call counters done_count [W] and unit_done [units] (null:
// not used), which saves their memsets; every CTA places its chunk's entries in the send list,
// send_list[rows_base[rot(x)] + base[x] + rank] = entry, rows_base (the send order's first row of
// each rotated expert, as exchange_kernel derives it) scanned into shared memory. A null
// send_list (the all-gather dispatch, which sends no rows): the counts and counters only.
__device__ __forceinline__ void write_counts_and_send_list(const Geometry& g, const int32_t* base, const int32_t* total,
                                                           int32_t* rows_base, int64_t first,
                                                           const int (&ids)[kPrepSteps], const int (&ranks)[kPrepSteps],
                                                           int32_t* counts_row, int32_t* send_list, int64_t* done_count,
                                                           int* unit_done, int64_t units) {
  if (blockIdx.x == 0) {
    for (int x = threadIdx.x; x < g.experts; x += blockDim.x) counts_row[x] = total[x];
    for (int i = threadIdx.x; i < g.world && done_count != nullptr; i += blockDim.x) done_count[i] = 0;
    for (int64_t i = threadIdx.x; i < units && unit_done != nullptr; i += blockDim.x) unit_done[i] = 0;
  }
  if (send_list == nullptr) return;
  if (threadIdx.x < 32)  // exclusive scan of the totals in rotated order (rows_base[E] unused here)
    warp_exclusive_scan<int32_t>(
        g.experts, [&](int i) { return total[g.rot_expert(g.rank, i)]; },
        [&](int i, int32_t v) {
          if (i < g.experts) rows_base[i] = v;
        },
        int(threadIdx.x));
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kPrepSteps; ++u) {
    const int x = ids[u];
    if (x < 0 || x >= g.experts) continue;
    send_list[rows_base[g.rot_index(g.rank, x)] + base[x] + ranks[u]] = int32_t(first + u * kPrepThreads + threadIdx.x);
  }
}

// ---- layer 0's preparation: this rank's counts and send list ---------------------------------
// The send list holds this rank's entries in send order (owners rotated from this rank, experts in
// order, an expert's entries in entry order). Until 2026-11-30 a histogram kernel, a CUB radix sort
// of the entries (dispatch_positions_gpu) and a scatter kernel built it with two memsets, ~12
// launches: 0.07-0.16 ms of layer 0 at T = 4096. Chunks of kPrepChunk entries, two kernels:
// 0.03-0.08 ms (docs/perf-notes.md, "Chunked preparation"); one chunk (entries <= kPrepChunk,
// decode-sized calls) may take one kernel instead, single_chunk_prep_kernel (2026-12-07, opt-in).
// chunk_rank_kernel: CTA c ranks entries [c * kPrepChunk, ...) (rank_chunk_entries) and writes
// the rank of every valid entry and the chunk's count per expert.
__global__ void chunk_rank_kernel(const int32_t* topk_ids, int64_t entries, int experts, int32_t* entry_rank,
                                  int32_t* chunk_counts) {
  extern __shared__ int32_t prep_smem[];
  int32_t* running = prep_smem;               // [E]
  int32_t* warp_cnt = prep_smem + experts;    // [kPrepWarps][E]
  const int64_t first = int64_t(blockIdx.x) * kPrepChunk;
  int ids[kPrepSteps], ranks[kPrepSteps];
  load_chunk_ids(topk_ids, entries, first, ids);
  griddep_launch_dependents();  // the send-list kernel may launch (it waits for this one's end)
  rank_chunk_entries(ids, experts, running, warp_cnt, ranks);
#pragma unroll
  for (int step = 0; step < kPrepSteps; ++step)
    if (ids[step] >= 0 && ids[step] < experts) entry_rank[first + step * kPrepThreads + threadIdx.x] = ranks[step];
  for (int x = threadIdx.x; x < experts; x += blockDim.x) chunk_counts[int64_t(blockIdx.x) * experts + x] = running[x];
  // It needs nothing of the call's entry barrier (only the routing, written before it), so it
  // waits for it last: this kernel's end then implies the barrier's.
  gemm::sm90::griddep_wait();
}

// chunk_send_list_kernel: base and total of every expert from the counts of all chunks, then
// write_counts_and_send_list for the chunk's valid entries.
__global__ void chunk_send_list_kernel(Geometry g, const int32_t* topk_ids, int64_t entries, const int32_t* entry_rank,
                                       const int32_t* chunk_counts, int32_t* counts_row, int32_t* send_list,
                                       int64_t* done_count, int* unit_done, int64_t units) {
  extern __shared__ int32_t prep_smem[];
  int32_t* base = prep_smem;                   // [E] entries of expert x in the chunks before this one
  int32_t* total = prep_smem + g.experts;      // [E] entries of expert x (this rank's counts row)
  int32_t* rows_base = total + g.experts;      // [E] by rotated index
  // The chunk's ids and ranks loaded first (one round trip; the stores below may alias them, so
  // the loop at the end would otherwise load them one entry at a time).
  const int64_t first = int64_t(blockIdx.x) * kPrepChunk;
  int ids[kPrepSteps], ranks[kPrepSteps];
  load_chunk_ids(topk_ids, entries, first, ids);
  griddep_launch_dependents();  // the exchange kernel may launch (it waits for this one's end)
  gemm::sm90::griddep_wait();   // the ranks and counts of chunk_rank_kernel
  // chunk_rank_kernel writes the ranks of valid entries only: a dropped entry's is never read
  // (compute-sanitizer's initcheck flagged those loads, 2026-12-07).
#pragma unroll
  for (int u = 0; u < kPrepSteps; ++u) {
    const int64_t i = first + u * kPrepThreads + threadIdx.x;
    ranks[u] = i < entries && ids[u] >= 0 && ids[u] < g.experts ? entry_rank[i] : 0;
  }
  const int chunks = int(gridDim.x);
  for (int x = threadIdx.x; x < g.experts; x += blockDim.x) {
    int32_t before = 0, all = 0;
    for (int c = 0; c < chunks; ++c) {
      const int32_t n = chunk_counts[int64_t(c) * g.experts + x];
      before += c < int(blockIdx.x) ? n : 0;
      all += n;
    }
    base[x] = before;
    total[x] = all;
  }
  __syncthreads();
  write_counts_and_send_list(g, base, total, rows_base, first, ids, ranks, counts_row, send_list, done_count, unit_done,
                             units);
}

// single_chunk_prep_kernel (entries <= kPrepChunk: one CTA): the two kernels above in one, the
// ranks and counts kept on chip (no entry_rank / chunk_counts round trip, one launch less).
// Shared memory: running [E], warp_cnt [kPrepWarps][E], zeros [E] (base: no earlier chunk),
// rows_base [E]. Its global writes come after the call's entry barrier (griddep_wait), as the
// send-list kernel's do behind chunk_rank_kernel's end. MoeFfnConfig::prep_one (opt-in).
__global__ void single_chunk_prep_kernel(Geometry g, const int32_t* topk_ids, int64_t entries, int32_t* counts_row,
                                         int32_t* send_list, int64_t* done_count, int* unit_done, int64_t units) {
  extern __shared__ int32_t prep_smem[];
  int32_t* running = prep_smem;                            // [E]
  int32_t* warp_cnt = running + g.experts;                 // [kPrepWarps][E]
  int32_t* zeros = warp_cnt + kPrepWarps * g.experts;      // [E]
  int32_t* rows_base = zeros + g.experts;                  // [E]
  int ids[kPrepSteps], ranks[kPrepSteps];
  load_chunk_ids(topk_ids, entries, 0, ids);
  griddep_launch_dependents();  // the exchange kernel may launch (it waits for this one's end)
  for (int x = threadIdx.x; x < g.experts; x += blockDim.x) zeros[x] = 0;
  rank_chunk_entries(ids, g.experts, running, warp_cnt, ranks);  // its barriers order the zeros too
  gemm::sm90::griddep_wait();  // the entry barrier (begin_call_kernel) before any global write
  write_counts_and_send_list(g, zeros, running, rows_base, 0, ids, ranks, counts_row, send_list, done_count, unit_done,
                             units);
}

// ---- all-gather dispatch (MoeDispatch::kAllGather) -----------------------------------------

// This rank's routing into slot `rank` of every rank's gathered routing [W][max_tokens * k]
// (ids and weights), padded with -1 (dropped) past its num_tokens tokens: a receiver ranks any
// source's entries with dispatch_positions_gpu over max_tokens tokens, no token count needed.
// Before the exchange kernel on the stream: its flags publish these writes too.
__global__ void route_push_kernel(Geometry g, const int32_t* topk_ids, const float* topk_w, int64_t num_tokens,
                                  int32_t* const* ids_peers, float* const* w_peers) {
  const int64_t entries = g.max_tokens * g.topk, live = num_tokens * g.topk;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < g.world * entries;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int p = int(i / entries);
    const int64_t j = i % entries, at = int64_t(g.rank) * entries + j;
    ids_peers[p][at] = j < live ? topk_ids[j] : -1;
    w_peers[p][at] = j < live ? topk_w[j] : 0.f;
  }
}

// The pre-summed combine's row map (MoeCombine::kPresum): row_of[src * max_tokens * k + entry] on
// the owner = (the call's epoch, the local row holding that entry), written with the entry's
// row_src by whoever writes that (the sender's dispatch, or ag_rows_kernel), so that layer 1 needs
// no memset and no scatter kernel of its own. An entry whose epoch is not the call's is not here
// (another rank's, dropped, or a token past the source's count): no clearing between calls, and a
// call cut short by a timeout leaves nothing the next one could take for its own (epochs never
// repeat). 16 bytes an entry: a 32-bit epoch tag would repeat after 2^32 calls (days of decode).
__device__ __forceinline__ void set_row_of(ulonglong2* row_of, int64_t i, epoch_t e, int64_t row) {
  row_of[i] = make_ulonglong2(e, uint64_t(row));
}
__device__ __forceinline__ int32_t row_of_entry(const ulonglong2* row_of, int64_t i, epoch_t e) {
  const ulonglong2 v = row_of[i];
  return v.x == e ? int32_t(v.y) : -1;
}

// The receive rows' metadata, from every source's gathered routing and positions (local writes):
// row_src[pos] = (source, entry), row_w[pos] = its weight, for the entries of this rank's experts
// (and row_of, kPresum only).
__global__ void ag_rows_kernel(Geometry g, comm::DeviceSignals sig, const int32_t* ids, const float* weights,
                               const int64_t* positions, int2* row_src, float* row_w, ulonglong2* row_of) {
  const int64_t entries = g.max_tokens * g.topk;
  const epoch_t e = comm::current_epoch(sig);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < g.world * entries;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int x = ids[i];
    if (x < 0 || x >= g.experts || x / g.epr != g.rank || positions[i] < 0) continue;
    row_src[positions[i]] = make_int2(int(i / entries), int(i % entries));
    row_w[positions[i]] = weights[i];
    if (row_of != nullptr) set_row_of(row_of, i, e, positions[i]);
  }
}

// One row of `vecs` 16-byte pieces copied by a warp, eight loads in flight per lane before their
// stores. (Row by row with the whole group, or flat with 4 loads in flight, the dispatch copy was
// latency-bound: ~3-4 GB/s per SM.) The loads do not allocate in L1: the send warps' spilled
// registers live there (an L1 of ~20 KB beside the GEMM's shared memory), and streamed rows
// evicted them (ncu of 28606ef, 2026-12-02: L1 hit rate 18 %; instructions waiting on spill
// reloads held ~20 % of the send warps' stall samples). Whole 4 KB batches unpredicated from one
// base address, with the striped round dividing each lane's entry once, cut the send warps'
// instructions a 4 KB row from 238 to 165 (ncu) and made the dispatch alone 8-10 % slower (one
// H200, 2026-12-02; its long-scoreboard stall samples rose 11.2k -> 14.7k): not kept.
__device__ __forceinline__ int4 load_no_l1(const int4* p) {
  int4 v;
  asm volatile("ld.global.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// (A row's destination reaches striped_sends' copy through a shuffle, so the compiler no longer
// knows it is global memory: the store says so.)
__device__ __forceinline__ void store_global(int4* p, const int4& v) {
  asm volatile("st.global.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void copy_row(const E* from_row, E* to_row, int vecs, int lane) {
  const int4* from = reinterpret_cast<const int4*>(from_row);
  int4* dst = reinterpret_cast<int4*>(to_row);
  for (int c0 = lane; c0 < vecs; c0 += 8 * 32) {
    int4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (c0 + 32 * u < vecs) v[u] = load_no_l1(from + c0 + 32 * u);
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (c0 + 32 * u < vecs) store_global(dst + c0 + 32 * u, v[u]);
  }
}

// A row of `bytes` prefetched into L2 by a warp (a 128-byte line a lane, 4 KB a pass).
__device__ __forceinline__ void prefetch_row_l2(const E* row, int bytes, int lane) {
  const char* p = reinterpret_cast<const char*>(row);
#pragma unroll 1
  for (int b = lane * 128; b < bytes; b += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + b));
}

// Bulk copies (TMA's cp.async.bulk) of the striped dispatch (MoeFfnConfig::bulk_dispatch): global
// -> shared memory, completing on an mbarrier, and shared -> global in bulk groups. Shared
// addresses are 32-bit `.shared::cta` ones.
__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t@!done bra WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// A send warp's ring of shared-memory slots for bulk copies, planned from the engine's spare
// regions (gemm::sm90::SendSmem). Each warp has a control block at the start of the tail region
// (the first region where there is no tail): its slots' mbarriers, their shared addresses, and a
// table of the round's rows (source and destination pointers, written by the lanes, walked by
// lane 0); then the slots, region after region, dealt to the warps in blocks of `slots`. Slots
// are used round-robin across rounds: `slot` is the next, `parity` its mbarrier's phase parity.
struct BulkRing {
  static constexpr int kMaxSlots = 8, kMaxWarps = 4;
  static constexpr int kSlotTable = 8 * kMaxSlots, kRowTable = kSlotTable + 4 * kMaxSlots + 32;  // 64, 128
  static constexpr int kControlBytes = kRowTable + 16 * 32;                                       // 640
  uint32_t ctl = 0;  // this warp's control block
  int slots = 0, slot_bytes = 0, slot = 0;
  uint32_t parity = 0;
  // Every lane the same; lane 0 initialises the barriers and the slot table. slots < 2: no ring
  // (the copy goes through registers).
  __device__ void plan(const gemm::sm90::SendSmem& spare, int row_bytes, int warp, int warps, int lane, int max_slots) {
    slot_bytes = row_bytes < 4096 ? row_bytes : 4096;  // rows are multiples of 512 bytes (H % 256 == 0)
    int bytes[2] = {spare.bytes[0], spare.bytes[1]};
    char* ptr[2] = {spare.ptr[0], spare.ptr[1]};
    const int c = bytes[1] > 0 ? 1 : 0;
    if (warps > kMaxWarps || bytes[c] < warps * kControlBytes) return;
    const uint32_t control = uint32_t(__cvta_generic_to_shared(ptr[c]));
    ptr[c] += warps * kControlBytes;
    bytes[c] -= warps * kControlBytes;
    const int n0 = bytes[0] / slot_bytes, total = n0 + bytes[1] / slot_bytes;
    slots = min(min(kMaxSlots, max_slots), total / warps);
    if (slots < 2) {
      slots = 0;
      return;
    }
    ctl = control + uint32_t(warp * kControlBytes);
    if (lane == 0) {
      for (int i = 0; i < slots; ++i) {
        const int j = warp * slots + i;
        const char* at = j < n0 ? ptr[0] + j * slot_bytes : ptr[1] + (j - n0) * slot_bytes;
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(ctl + kSlotTable + 4u * i), "r"(uint32_t(__cvta_generic_to_shared(at)))
                     : "memory");
        mbar_init(ctl + 8u * uint32_t(i));
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
  }
};

// ---- layer 0 -------------------------------------------------------------------------------

// The grouped schedule over the local experts; a tile's producer waits for the dispatch chunks
// of its rows (every source block it overlaps, chunk by chunk).
struct L0Schedule : gemm::sm90::GroupedSchedule {
  static constexpr bool kHasReady = true;
  static constexpr bool kWaitsPriorGrid = true;  // its prefixes come from the exchange kernel (PDL)
  Geometry geo;
  const int32_t* counts = nullptr;  // local [W][E]
  const int* chunk_base = nullptr;
  comm::DeviceSignals sig{};
  epoch_t epoch = 0;
  bool diag_no_wait = false;  // CCFUSE_MOE_DIAG=nowait: timing experiments only (wrong results)
  bool diag_no_tiles = false;  // CCFUSE_MOE_DIAG=l0sendonly: no tiles, the send warps' dispatch alone
  // run_layer0's gemm_above_rows (>= 0): no tiles (the dispatch alone) when this call's rows fit
  // in that many (row_prefix comes from the exchange kernel, as tile_prefix does).
  int64_t gemm_above_rows = -1;
  __device__ int64_t num_tiles() const {
    if (diag_no_tiles || (gemm_above_rows >= 0 && row_prefix[num_groups] <= gemm_above_rows)) return 0;
    return GroupedSchedule::num_tiles();
  }
  // MoeFfnConfig::local_first: the row tiles of only this rank's rows first (gemm::first_then_rest).
  const int* local_prefix = nullptr;
  __device__ gemm::TileWork work(int64_t idx) const {
    if (local_prefix == nullptr) return GroupedSchedule::work(idx);
    const gemm::GroupTile t = gemm::first_then_rest(idx, tile_prefix, local_prefix, num_groups, n_tiles, group_m);
    return gemm::TileWork{t.tile.m_tile, t.tile.n_tile, t.group, row_prefix[t.group] + int64_t(t.tile.m_tile) * block_m,
                          row_prefix[t.group + 1]};
  }
  __device__ bool wait_ready(const gemm::TileWork& w) {
    if (diag_no_wait) return true;
    if (epoch == 0) epoch = comm::current_epoch(sig);
    const int x = geo.rank * geo.epr + w.group;
    const int64_t lo = w.row0 - row_prefix[w.group];
    const int64_t hi = min(lo + kBlockM, w.row_end - row_prefix[w.group]);
    int64_t begin = 0;
    bool ok = true;
    for (int i = 0; i < geo.world && ok; ++i) {
      const int s = (geo.rank + i) % geo.world;
      const int64_t cnt = counts[s * geo.experts + x];
      const int64_t a = max(lo, begin) - begin, b = min(hi, begin + cnt) - begin;  // block-relative rows
      if (a < b) {
        const int base = chunk_base[s * (geo.experts + 1) + geo.rot_index(s, x)];
        for (int64_t c = a / kChunkRows; c <= (b - 1) / kChunkRows && ok; ++c)
          ok = comm::wait(sig, geo.chunk_flag(s, base + int(c)), epoch, s);
      }
      begin += cnt;
    }
    // Rows written through the generic proxy (peers' and this GPU's send warps), read by TMA.
    asm volatile("fence.proxy.async.global;" ::: "memory");
    return ok;
  }
};

// All-gather mode with MoeFfnConfig::gather_rows: the grouped GEMM's producer warp gathers each
// tile's A rows where they lie (gemm::sm90 Schedule::kGatherA): this rank's tokens from x, a
// peer's from its slot of this rank's gathered buffer, once that token's chunk has arrived (a
// wait per row on the chunk's flag, each lane for its own rows: its acquire orders its own loads).
struct L0GatherSchedule : L0Schedule {
  static constexpr bool kGatherA = true;
  const E* x = nullptr;           // [T, H]
  const E* gath_local = nullptr;  // [W][max_tokens][H]
  const int2* row_src = nullptr;  // local: (source, entry) of every receive row
  template <int N>
  __device__ bool gather_rows(const gemm::TileWork& w, int first, int step, const char* (&rows)[N], unsigned& valid) {
    if (epoch == 0) epoch = comm::current_epoch(sig);
    bool ok = true;
    valid = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t row = w.row0 + first + int64_t(step) * i;
      rows[i] = reinterpret_cast<const char*>(gath_local);  // readable; zero-filled past the tile's rows
      if (row >= w.row_end) continue;
      const int2 se = row_src[row];
      const int64_t tok = se.y / geo.topk;
      if (se.x == geo.rank) {
        rows[i] = reinterpret_cast<const char*>(x + tok * geo.hidden);
      } else {
        if (!diag_no_wait && ok) ok = comm::wait(sig, geo.gather_flag(se.x, tok / kChunkRows), epoch, se.x);
        rows[i] = reinterpret_cast<const char*>(gath_local + (int64_t(se.x) * geo.max_tokens + tok) * geo.hidden);
      }
      valid |= 1u << i;
    }
    return ok;
  }
};

// Stores layer 0's tile (activation on the way) locally; the send warps do the dispatch before
// the first tile: chunk u of this rank's send order -> its owner's receive buffer, then its flag.
template <gemm::sm90::Activation kAct>
struct L0Epilogue : gemm::sm90::ActivationEpilogue<kAct, false> {
  static constexpr bool kHasSendWarps = true;
  Geometry geo;
  comm::DeviceSignals sig{};
  const E* x = nullptr;              // [T, H]
  const float* topk_w = nullptr;     // [T, k]
  const int32_t* send_list = nullptr;
  const int* chunk_base = nullptr;   // this rank's row: chunk_base + rank * (E + 1)
  const int64_t* rows_base = nullptr;
  const int64_t* block_begin = nullptr;
  E* recv[kMaxMoeRanks] = {};
  int2* row_src[kMaxMoeRanks] = {};
  float* row_w[kMaxMoeRanks] = {};
  ulonglong2* row_of[kMaxMoeRanks] = {};  // kPresum: every rank's row map (set_row_of); else null

  // MoeFfn::run_layer0's preact_out: the pre-activation rows [max_rows, 2F] (SwiGLU's tile column
  // order; F columns without SwiGLU), for a backward pass that reads them instead of recomputing.
  static constexpr bool kPreactOut = true;
  E* preact = nullptr;
  int64_t preact_ld = 0;
  int64_t preact_rows = 0;  // the kept tensor's rows (MoeFfn::run's preact_rows): rows past them are not kept
  __device__ bool preact_enabled() const { return preact != nullptr; }
  __device__ int64_t preact_row_end() const { return preact_rows; }
  __device__ E* preact_out(const gemm::TileWork& w, int64_t& ld) const {
    ld = preact_ld;
    return preact + w.row0 * preact_ld;
  }

  __device__ bool sends(const gemm::TileWork&) const { return false; }
  __device__ void send(const gemm::TileWork&, int, int) const {}
  __device__ void notify_sent(const gemm::TileWork&) const {}
  bool diag_no_send = false;  // CCFUSE_MOE_DIAG=nosend: timing experiments only (wrong results)
  // CCFUSE_MOE_DIAG=l0nolocal: the rows this rank owns are not copied (the flags still go up): the
  // cost of the local half of the copy (HBM to HBM) against the remote half. Wrong results.
  bool diag_no_local = false;
  // All-gather mode (MoeDispatch::kAllGather): ag_prologue instead of the all-to-all sends.
  bool allgather = false;
  bool gather_rows = false;  // MoeFfnConfig::gather_rows: phase 1 only (the GEMM reads rows in place)
  int64_t num_tokens = 0;            // this rank's
  E* gath[kMaxMoeRanks] = {};        // every rank's gathered tokens [W][max_tokens][H]
  const int32_t* counts = nullptr;   // local [W][E]
  const int* perm_base = nullptr;
  const int2* row_src_local = nullptr;
  E* recv_local = nullptr;

  // Phase 1: this rank's tokens, in chunks of kChunkRows, into slot `rank` of every other rank's
  // gathered buffer (peers rotated from the next rank), a flag per (peer, chunk). Phase 2: the
  // rows of this rank's experts copied into place from the gathered buffers (this rank's own
  // tokens from x, first: they wait for nothing), units of kChunkRows rows of one (source,
  // expert) block, each released on the same local flag an all-to-all source would release
  // (the grouped GEMM's producers wait for it alike). A unit waits for the gathered chunks that
  // hold its tokens.
  __device__ void ag_prologue(int64_t cta, int64_t num_ctas, int tid, int num_threads) const {
    const epoch_t e = comm::current_epoch(sig);
    const int warp = tid / 32, lane = tid % 32, warps = num_threads / 32;
    const int vecs = int(geo.hidden * int64_t(sizeof(E)) / 16);
    const int64_t gchunks = (num_tokens + kChunkRows - 1) / kChunkRows;
    for (int64_t u = cta; u < (geo.world - 1) * gchunks; u += num_ctas) {
      const int p = (geo.rank + 1 + int(u / gchunks)) % geo.world;
      const int64_t c = u % gchunks, t0 = c * kChunkRows;
      const int64_t rows = min(int64_t(kChunkRows), num_tokens - t0);
      E* const to = gath[p] + (int64_t(geo.rank) * geo.max_tokens + t0) * geo.hidden;
      for (int64_t r = warp; r < rows; r += warps) copy_row(x + (t0 + r) * geo.hidden, to + r * geo.hidden, vecs, lane);
      asm volatile("bar.sync 2, %0;" ::"r"(num_threads));  // every send thread's stores before the flag
      if (tid == 0) comm::notify(sig, p, geo.gather_flag(geo.rank, c), e);
    }
    if (gather_rows) return;
    const int units = perm_base[geo.world * geo.epr];
    const DispatchPlan plan{counts, geo.world, geo.experts};
    for (int64_t u = cta; u < units; u += num_ctas) {
      const DispatchPlan::PermuteUnit pu = plan.permute_unit(geo.rank, perm_base, u, kChunkRows);
      const int src = pu.src, xg = pu.expert;
      const int64_t c = pu.chunk, r0 = pu.row0, rows = pu.rows;
      if (src != geo.rank) {
        if (tid == 0) {
          int64_t t_lo = INT64_MAX, t_hi = -1;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t t = row_src_local[r0 + r].y / geo.topk;
            t_lo = min(t_lo, t);
            t_hi = max(t_hi, t);
          }
          // On a watchdog timeout go on (the host raises the TimeoutError; results are garbage).
          for (int64_t ch = t_lo / kChunkRows; ch <= t_hi / kChunkRows; ++ch)
            if (!comm::wait(sig, geo.gather_flag(src, ch), e, src)) break;
        }
        asm volatile("bar.sync 2, %0;" ::"r"(num_threads));  // the acquire before every thread's loads
      }
      const E* from = src == geo.rank ? x : gath[geo.rank] + int64_t(src) * geo.max_tokens * geo.hidden;
      for (int64_t r = warp; r < rows; r += warps) {
        const int64_t t = row_src_local[r0 + r].y / geo.topk;
        copy_row(from + t * geo.hidden, recv_local + (r0 + r) * geo.hidden, vecs, lane);
      }
      asm volatile("bar.sync 2, %0;" ::"r"(num_threads));  // every send thread's stores before the flag
      if (tid == 0)
        comm::notify(sig, geo.rank, geo.chunk_flag(src, chunk_base[src * (geo.experts + 1) + geo.rot_index(src, xg)] + int(c)), e);
    }
  }

  // Striped dispatch (MoeFfnConfig::striped_dispatch): this rank's send rows, in send order, dealt
  // to every GEMM CTA's send warps in turn (row i to warp i mod G, consecutive rows on different
  // SMs), so that rows leave roughly in send order; a count per unit, and the warp that copies a
  // unit's last row raises its flag. Unit by CTA (below) keeps ~one unit per CTA in flight: all
  // of a round's units finish together, and a tile's rows wait for a whole round.
  bool striped = false;
  int* unit_done = nullptr;  // [units] zero at the call's start
  // A warp takes stripe_rows rows (i, i + G, ...) per round (MoeFfnConfig::stripe_rows, <= 32):
  // one fence per round, then the rows' counts in parallel (lane j: row j). The first version
  // fenced and searched per row: 1.6-2.1x layer 0's time on Qwen3's 4 KB rows (2026-11-30).
  // Lane j looks up row j's entry, expert block, owner and router weight at the round's start (a
  // binary search over rows_base per lane, all lanes at once) and stores its metadata, so that
  // each row's copy waits only for its own data loads: looked up row by row (a forward search,
  // send_list[i], then topk_w[entry] after the copy), every row paid three or four dependent
  // memory latencies. The next row's data is prefetched into L2 while this one is copied, and a
  // round of only this rank's rows fences at device scope. Measured against the row-by-row form
  // at W = 1 (one H200, 2026-12-02, Qwen3, striped): the dispatch alone 0.269 -> 0.205 ms at 4096
  // tokens, 1.067 -> 0.696 at 16384; layer 0 -3.4 to -5 %; DeepSeek-like and Mixtral level.
  int stripe_rows = 16;
  uint64_t spread_ns = 0;  // MoeFfnConfig::dispatch_spread_us (0 = one burst)
  // Bulk copies (MoeFfnConfig::bulk_dispatch, opt-in): each send warp moves its rows through a
  // ring of shared-memory slots (BulkRing) with cp.async.bulk, in 4 KB pieces, up to 8 pieces a
  // warp in flight, where copy_row holds one row (4 KB) a warp in registers. The lanes put the
  // round's rows into the warp's row table and lane 0 issues every copy. The round's stores
  // complete (and are ordered before the generic proxy) before the round's fence. Measured
  // 2026-12-06 at W = 1 (docs/moe-layers.md, "Bulk copies"): the copy alone 4-10 % faster, but the
  // copies share the SM's TMA unit with the GEMM's stage loads (DeepSeek-like's layer 0 at 16384
  // tokens 1.7x slower with 4 slots a warp, level with 2, when the copy's gain is gone too). (All
  // lanes walking the pieces, shuffling each one's pointers, spilled: 2.4x the instructions.)
  bool bulk = false;
  int bulk_slots = BulkRing::kMaxSlots;  // CCFUSE_MOE_BULK_SLOTS: at most this many slots a warp (an A/B switch)
  __device__ void bulk_round(BulkRing& ring, const E* my_from, E* my_to, bool copies, int row_bytes, int lane) const {
    const unsigned mask = __ballot_sync(0xffffffffu, copies);
    if (copies) {  // the round's copying rows, compacted, into the warp's row table
      const uint32_t at = ring.ctl + BulkRing::kRowTable + 16u * uint32_t(__popc(mask & ((1u << lane) - 1u)));
      asm volatile("st.shared.v2.u64 [%0], {%1, %2};" ::"r"(at), "l"(reinterpret_cast<uint64_t>(my_from)),
                   "l"(reinterpret_cast<uint64_t>(my_to))
                   : "memory");
    }
    __syncwarp();
    if (lane == 0) {
      const uint32_t ctl = ring.ctl;
      const int S = ring.slots, sb = ring.slot_bytes, ppr = (row_bytes + sb - 1) / sb, n = __popc(mask) * ppr;
      const auto slot_addr = [&](int i) {
        uint32_t a;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(a) : "r"(ctl + BulkRing::kSlotTable + 4u * uint32_t(i)));
        return a;
      };
      const auto row_ptr = [&](int row, int half) {
        uint64_t v;
        asm volatile("ld.shared.u64 %0, [%1];" : "=l"(v) : "r"(ctl + BulkRing::kRowTable + 16u * uint32_t(row) + 8u * half));
        return reinterpret_cast<char*>(v);
      };
      int lq = 0, lrow = 0, lk = 0, lslot = ring.slot;
      const auto load_next = [&]() {  // piece lq (row lrow, piece lk) into slot lslot
        bulk_load(slot_addr(lslot), row_ptr(lrow, 0) + lk * sb, min(sb, row_bytes - lk * sb), ctl + 8u * uint32_t(lslot));
        if (++lk == ppr) lk = 0, ++lrow;
        if (++lslot == S) lslot = 0;
        ++lq;
      };
      while (lq < n && lq < S) load_next();
      int srow = 0, sk = 0, sslot = ring.slot;
      uint32_t par = ring.parity;
      for (int q = 0; q < n; ++q) {
        mbar_wait(ctl + 8u * uint32_t(sslot), par);
        bulk_store(row_ptr(srow, 1) + sk * sb, slot_addr(sslot), min(sb, row_bytes - sk * sb));
        if (++sk == ppr) sk = 0, ++srow;
        if (++sslot == S) sslot = 0, par ^= 1u;
        // Piece q - 1's slot again (piece q - 1 + S) once its store has read it; store q may still be reading.
        if (q >= 1 && lq < n) {
          asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
          load_next();
        }
      }
      ring.slot = sslot;
      ring.parity = par;
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the round's rows written
      asm volatile("fence.proxy.async.global;" ::: "memory");    // ... before the generic-proxy fence
    }
    __syncwarp();  // the row table is read before the next round writes it
  }
  __device__ void striped_sends(int64_t cta, int64_t num_ctas, int tid, int num_threads,
                                const gemm::sm90::SendSmem& spare) const {
    const epoch_t e = comm::current_epoch(sig);
    const uint64_t t0 = pace_start(spread_ns);
    const int* base = chunk_base + geo.rank * (geo.experts + 1);
    const int warp = tid / 32, lane = tid % 32;
    const int64_t total_rows = rows_base[geo.experts], g_warps = num_ctas * (num_threads / 32);
    const int vecs = int(geo.hidden * int64_t(sizeof(E)) / 16);
    const int row_bytes = int(geo.hidden * int64_t(sizeof(E)));
    BulkRing ring;
    if (bulk) ring.plan(spare, row_bytes, warp, num_threads / 32, lane, bulk_slots);
    for (int64_t i0 = int64_t(warp) * num_ctas + cta; i0 < total_rows; i0 += stripe_rows * g_warps) {
      pace_until(t0, spread_ns, i0, total_rows);  // row i of the send list not before t0 + i / rows of the spread
      const int rows_here = int(min(int64_t(stripe_rows), (total_rows - 1 - i0) / g_warps + 1));
      // Lane j < rows_here: row i0 + j * G of the send list, with its source row and destination
      // row as pointers (a row's copy then needs only shuffles: no division by top-k, no peer
      // table lookup, fewer live registers in the copy loop).
      int my_lo = 0, my_owner = 0, my_r = 0;
      const E* my_from = nullptr;
      E* my_to = nullptr;
      if (lane < rows_here) {
        const int64_t i = i0 + int64_t(lane) * g_warps;
        const int32_t entry = send_list[i];
        int lo = 0, hi = geo.experts;  // largest rotated index with rows_base[lo] <= i (< experts)
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (rows_base[mid] <= i) lo = mid;
          else hi = mid;
        }
        const int xg = geo.rot_expert(geo.rank, lo);
        my_lo = lo;
        my_owner = xg / geo.epr;
        my_r = int(i - rows_base[lo]);  // row in this rank's block of expert xg
        const int64_t dest = block_begin[xg] + my_r;
        row_src[my_owner][dest] = make_int2(geo.rank, entry);
        row_w[my_owner][dest] = topk_w[entry];
        if (row_of[my_owner] != nullptr)
          set_row_of(row_of[my_owner], geo.rank * geo.max_tokens * geo.topk + entry, e, dest);
        my_from = x + int64_t(entry / geo.topk) * geo.hidden;
        if (!diag_no_local || my_owner != geo.rank) my_to = recv[my_owner] + dest * geo.hidden;
      }
      const bool any_remote = __any_sync(0xffffffffu, lane < rows_here && my_owner != geo.rank);
      const auto from_of = [&](int j) {
        return reinterpret_cast<const E*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_from), j));
      };
      // Each row's data into L2 one row ahead of its copy. (Four rows ahead measured no faster:
      // the dispatch alone 0.172-0.174 ms against 0.172-0.173, Qwen3 at 4096 tokens, W = 1, one
      // H100, 2026-12-06.)
      if (ring.slots >= 2) {
        bulk_round(ring, my_from, my_to, lane < rows_here && my_to != nullptr, row_bytes, lane);
      } else {
        if (rows_here > 0) prefetch_row_l2(from_of(0), row_bytes, lane);
        for (int j = 0; j < rows_here; ++j) {
          const E* from = from_of(j);
          E* to = reinterpret_cast<E*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_to), j));
          if (j + 1 < rows_here) prefetch_row_l2(from_of(j + 1), row_bytes, lane);
          if (to != nullptr) copy_row(from, to, vecs, lane);
        }
      }
      __syncwarp();  // every lane's stores before lane 0's fence
      if (lane == 0) {
        if (any_remote) __threadfence_system();  // the round's rows (on the peers) before their counts
        else __threadfence();                    // only this GPU reads them
      }
      __syncwarp();
      if (lane < rows_here) {
        const int64_t c = my_r / kChunkRows;
        const int u = base[my_lo] + int(c);
        const int rows = int(min(int64_t(kChunkRows), rows_base[my_lo + 1] - rows_base[my_lo] - c * kChunkRows));
        cuda::atomic_ref<int, cuda::thread_scope_device> done(unit_done[u]);
        if (done.fetch_add(1, cuda::memory_order_acq_rel) + 1 == rows) {
          __threadfence_system();  // every counted row before the flag
          comm::notify(sig, my_owner, geo.chunk_flag(geo.rank, u), e);
        }
      }
    }
  }

  static constexpr bool kSendSmem = true;  // send_prologue gets the GEMM's spare shared memory
  __device__ void send_prologue(int64_t cta, int64_t num_ctas, int tid, int num_threads,
                                const gemm::sm90::SendSmem& spare) const {
    if (diag_no_send) return;
    if (allgather) {
      ag_prologue(cta, num_ctas, tid, num_threads);
      return;
    }
    if (striped) {
      striped_sends(cta, num_ctas, tid, num_threads, spare);
      return;
    }
    const epoch_t e = comm::current_epoch(sig);
    const int* base = chunk_base + geo.rank * (geo.experts + 1);
    const int total = base[geo.experts];
    const int64_t row_bytes = geo.hidden * int64_t(sizeof(E));
    const uint64_t t0 = pace_start(spread_ns);
    for (int64_t u = cta; u < total; u += num_ctas) {
      pace_until(t0, spread_ns, u, total);  // unit u not before t0 + u / units of the spread
      int lo = 0, hi = geo.experts;  // largest rotated index i with base[i] <= u
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (base[mid] <= u) lo = mid;
        else hi = mid;
      }
      const int xg = geo.rot_expert(geo.rank, lo), owner = xg / geo.epr;
      const int64_t r0 = (u - base[lo]) * int64_t(kChunkRows);
      const int64_t cnt = rows_base[lo + 1] - rows_base[lo];
      const int64_t rows = min(int64_t(kChunkRows), cnt - r0);
      const int32_t* entries = send_list + rows_base[lo] + r0;
      const int64_t dest0 = block_begin[xg] + r0;
      E* const to = recv[owner] + dest0 * geo.hidden;  // the unit's rows are contiguous there
      // A warp per row (copy_row); the unit's entries are loaded once (lane l holds rows l, l + 32,
      // ...) and broadcast by shuffles. (The rows' metadata stored first by all send threads and the
      // next row prefetched into L2, as striped_sends does, measured 2026-12-02 at W = 1: no faster
      // here, +2 % on layer 0 of DeepSeek-like and Mixtral; not kept.)
      const int warp = tid / 32, lane = tid % 32, warps = num_threads / 32;
      int32_t mine[kChunkRows / 32];
#pragma unroll
      for (int q = 0; q < kChunkRows / 32; ++q) mine[q] = lane + 32 * q < rows ? entries[lane + 32 * q] : 0;
      const int vecs = int(row_bytes / 16);
      for (int r = warp; r < rows; r += warps) {
        const int32_t held = select4(mine, r / 32);
        const int32_t entry = __shfl_sync(0xffffffffu, held, r % 32);
        if (!diag_no_local || owner != geo.rank)
          copy_row(x + int64_t(entry / geo.topk) * geo.hidden, to + int64_t(r) * geo.hidden, vecs, lane);
        if (lane == 0) {
          row_src[owner][dest0 + r] = make_int2(geo.rank, entry);
          row_w[owner][dest0 + r] = topk_w[entry];
          if (row_of[owner] != nullptr)
            set_row_of(row_of[owner], geo.rank * geo.max_tokens * geo.topk + entry, e, dest0 + r);
        }
      }
      asm volatile("bar.sync 2, %0;" ::"r"(num_threads));  // every send thread's stores before the flag
      if (tid == 0) comm::notify(sig, owner, geo.chunk_flag(geo.rank, int(u)), e);
    }
  }
};

// ---- layer 1 -------------------------------------------------------------------------------

// Weighted rows (router weight per row) stored locally, forwarded by the send warps to the
// owner's slot buffer; per source, the last row-tile releases the source's flag.
struct L1Epilogue : gemm::sm90::ActivationEpilogue<gemm::sm90::Activation::kNone, true> {
  static constexpr bool kHasSendWarps = true;
  // The send warps read each tile back from y as soon as the consumers hand it over: register
  // stores only (a TMA store would still be in flight).
  static constexpr bool kTmaStoreOk = false;
  Geometry geo;
  comm::DeviceSignals sig{};
  const int2* row_src = nullptr;  // local
  const E* y = nullptr;           // local [max_rows, H]
  E* slots[kMaxMoeRanks] = {};
  int64_t* target = nullptr;
  int64_t* done_count = nullptr;
  bool diag_no_send = false;  // CCFUSE_MOE_DIAG=l1nosend: timing experiments only (wrong results)

  __device__ bool sends(const gemm::TileWork&) const { return !diag_no_send; }
  // A warp per tile row (256 columns = 512 bytes = one 16-byte piece per lane), eight rows in
  // flight per warp; the rows' (source, entry) are loaded once per tile and broadcast.
  __device__ void send(const gemm::TileWork& w, int tid, int num_threads) const {
    static_assert(kBlockN * sizeof(E) == 32 * 16, "one 16-byte piece per lane per tile row");
    static_assert(kBlockM == 128, "four rows' sources per lane");
    const int rows = int(min(int64_t(kBlockM), w.row_end - w.row0));
    const int64_t col0 = int64_t(w.n_tile) * kBlockN;
    const int warp = tid / 32, lane = tid % 32, warps = num_threads / 32;
    int32_t src_rank[4], src_entry[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int2 v = lane + 32 * q < rows ? row_src[w.row0 + lane + 32 * q] : make_int2(0, 0);
      src_rank[q] = v.x;
      src_entry[q] = v.y;
    }
    for (int r0 = warp * 8; r0 < rows; r0 += warps * 8) {
      int4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (r0 + u < rows) v[u] = reinterpret_cast<const int4*>(y + (w.row0 + r0 + u) * geo.hidden + col0)[lane];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int r = r0 + u;  // warp-uniform
        const int rank = __shfl_sync(0xffffffffu, select4(src_rank, (r / 32) & 3), r % 32);
        const int entry = __shfl_sync(0xffffffffu, select4(src_entry, (r / 32) & 3), r % 32);
        if (r < rows) reinterpret_cast<int4*>(slots[rank] + int64_t(entry) * geo.hidden + col0)[lane] = v[u];
      }
    }
  }
  __device__ void notify_sent(const gemm::TileWork& w) const {
    int per_src[kMaxMoeRanks] = {};
    const int64_t rows = min(int64_t(kBlockM), w.row_end - w.row0);
    for (int64_t r = 0; r < rows; ++r) {
      const int s = row_src[w.row0 + r].x;
#pragma unroll
      for (int q = 0; q < kMaxMoeRanks; ++q) per_src[q] += q == s;
    }
    __threadfence_system();  // this CTA's send stores (ordered by the send warps' barrier) first
    const epoch_t e = comm::current_epoch(sig);
    for (int s = 0; s < geo.world; ++s) {
      if (per_src[s] == 0) continue;
      cuda::atomic_ref<int64_t, cuda::thread_scope_device> done(done_count[s]);
      const int64_t now = done.fetch_add(int64_t(per_src[s]), cuda::memory_order_acq_rel) + per_src[s];
      if (now == target[s]) comm::notify(sig, s, geo.done_flag(geo.rank), e);
    }
  }
  __device__ void send_prologue(int64_t cta, int64_t, int tid, int) const {
    // Sources with no row here are done at once.
    if (cta != 0 || tid != 0) return;
    const epoch_t e = comm::current_epoch(sig);
    for (int s = 0; s < geo.world; ++s)
      if (target[s] == 0 || diag_no_send) comm::notify(sig, s, geo.done_flag(geo.rank), e);
  }
};

// Eight bf16 values (one 16-byte piece) added into fp32 accumulators, and packed back.
__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const int4& raw) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    acc[2 * q] += f.x;
    acc[2 * q + 1] += f.y;
  }
}
__device__ __forceinline__ int4 pack_bf16x8(const float (&acc)[8]) {
  int4 res;
  __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&res);
#pragma unroll
  for (int q = 0; q < 4; ++q) r[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  return res;
}

// out[t] = sum of the token's live slots, fp32; waits for every rank's flag first.
__global__ void combine_kernel(Geometry g, comm::DeviceSignals sig, const E* slots, const int32_t* topk_ids,
                               int64_t num_tokens, E* out) {
  bool ok = true;
  if (threadIdx.x < g.world) ok = comm::wait(sig, g.done_flag(threadIdx.x), comm::current_epoch(sig), threadIdx.x);
  if (!__syncthreads_and(ok ? 1 : 0)) return;
  const int64_t vecs = g.hidden / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < num_tokens * vecs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / vecs, v = i % vecs;
    float acc[8] = {};
    for (int j = 0; j < g.topk; ++j) {
      const int x = topk_ids[t * g.topk + j];
      if (x < 0 || x >= g.experts) continue;  // dropped (or invalid: counted as dropped by the layout)
      add_bf16x8(acc, reinterpret_cast<const int4*>(slots + (t * g.topk + j) * g.hidden)[v]);
    }
    reinterpret_cast<int4*>(out + t * g.hidden)[v] = pack_bf16x8(acc);
  }
}

// bad[0] = the lowest entry whose expert id lies outside [-1, E) (stays INT32_MAX when none).
__global__ void check_ids_kernel(const int32_t* topk_ids, int64_t entries, int experts, int32_t* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < entries; i += int64_t(gridDim.x) * blockDim.x) {
    const int x = topk_ids[i];
    if (x < -1 || x >= experts) atomicMin(bad, int32_t(i));
  }
}

// ---- layer 1, pre-summed combine (MoeCombine::kPresum) ----------------------------------------

// A warp per (source, token): the sum of this rank's weighted rows of the token's slots, in slot
// order (fp32), sent as one bf16 row to slot `rank` of the source's partial buffer [W][T_max][H].
// Tokens with no row here send nothing (the owner knows from its routing which ranks to read).
// One (source, token) item's pre-sum by one warp: dst[v] = the sum of the token's live rows of y
// (lane j of `mine` holds slot j's row, -1 = none) over the 16-byte pieces [v0, v1), v1 - v0 a
// multiple of 32 (whole 256-column tiles), fp32 inside. Two pieces a lane and up to 8 slots a
// batch are loaded before any is added (16 loads in flight; one at a time before, measured
// 2026-11-30: Qwen3 T = 4096 layer 1 0.366 -> 0.335 ms, DeepSeek-like T = 16384 8.77 -> 8.49).
__device__ __forceinline__ void presum_item(const Geometry& g, int32_t mine, const E* y, int4* dst, int v0, int v1) {
  const int lane = threadIdx.x % 32;
  for (int v = v0 + lane; v < v1; v += 64) {
    const bool second = v + 32 < v1;  // the same for every lane (v1 - v0 is a multiple of 32)
    float acc[2][8] = {};
    for (int j0 = 0; j0 < g.topk; j0 += 8) {
      int32_t row[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) row[u] = __shfl_sync(0xffffffffu, mine, (j0 + u) & 31);
      int4 r[2][8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (j0 + u < g.topk && row[u] >= 0) {
          const int4* src = reinterpret_cast<const int4*>(y + int64_t(row[u]) * g.hidden);
          r[0][u] = src[v];
          if (second) r[1][u] = src[v + 32];
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (j0 + u < g.topk && row[u] >= 0) {
          add_bf16x8(acc[0], r[0][u]);
          if (second) add_bf16x8(acc[1], r[1][u]);
        }
      }
    }
    dst[v] = pack_bf16x8(acc[0]);
    if (second) dst[v + 32] = pack_bf16x8(acc[1]);
  }
}

// Item i of the W * max_tokens (source, token) items: source i % W, token i / W. With the sources
// interleaved, the warps in flight pre-sum every source's tokens at once, the local ones (HBM only)
// beside the remote ones (NVLink stores); source-major items ran the two phases one after the
// other on each rank (the pre-sum 12-22 % slower, measured 2026-11-30, docs/perf-notes.md).
__device__ __forceinline__ void presum_item_of(const Geometry& g, int64_t item, int& src, int64_t& token) {
  src = int(item % g.world);
  token = item / g.world;
}

// `out` non-null (W = 1 only): the one rank's sum is the token's output, written there for the
// num_tokens tokens (zeros for a token with no row: every slot dropped), and no combine follows;
// otherwise every (source, token) item of max_tokens per source goes to its source's partial buffer.
__global__ void presum_kernel(Geometry g, comm::DeviceSignals sig, int64_t max_tokens, const ulonglong2* row_of,
                              const E* y, E* const* partial, E* out, int64_t num_tokens) {
  const epoch_t e = comm::current_epoch(sig);
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int vecs = int(g.hidden / 8);
  const int64_t items = out != nullptr ? num_tokens : g.world * max_tokens;
  for (int64_t item = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; item < items; item += warps) {
    int src;
    int64_t token;
    presum_item_of(g, item, src, token);
    const int32_t mine = lane < g.topk ? row_of_entry(row_of, (src * max_tokens + token) * g.topk + lane, e) : -1;
    int4* dst = out != nullptr ? reinterpret_cast<int4*>(out + token * g.hidden)
                               : reinterpret_cast<int4*>(partial[src] + (int64_t(g.rank) * max_tokens + token) * g.hidden);
    if (__ballot_sync(0xffffffffu, mine >= 0) == 0) {  // warp-uniform
      if (out != nullptr)
        for (int v = lane; v < vecs; v += 32) dst[v] = make_int4(0, 0, 0, 0);
      continue;
    }
    presum_item(g, mine, y, dst, 0, vecs);
  }
}

// After presum_kernel (stream order: its stores are complete): release every rank's done flag.
__global__ void presum_notify_kernel(Geometry g, comm::DeviceSignals sig) {
  if (threadIdx.x >= g.world) return;
  __threadfence_system();
  comm::notify(sig, threadIdx.x, g.done_flag(g.rank), comm::current_epoch(sig));
}

// out[t] = sum over the ranks holding one of t's experts, in rank order, of their partial rows.
// A warp per token: its lanes read the token's top-k ids once (the ranks to read), then stride
// over the row's 16-byte pieces, two at a time. (One thread per piece, each reading all top-k ids
// again, made the combine at W = 1 cost layer 1 37-120 us on Qwen3 and 80-360 us on DeepSeek-like
// for a copy: one H100, 2026-12-06.)
__global__ void presum_combine_kernel(Geometry g, comm::DeviceSignals sig, const E* partial, int64_t max_tokens,
                                      const int32_t* topk_ids, int64_t num_tokens, E* out) {
  bool ok = true;
  if (threadIdx.x < g.world) ok = comm::wait(sig, g.done_flag(threadIdx.x), comm::current_epoch(sig), threadIdx.x);
  if (!__syncthreads_and(ok ? 1 : 0)) return;
  const int lane = threadIdx.x % 32;
  const int vecs = int(g.hidden / 8);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; t < num_tokens; t += warps) {
    const int x = lane < g.topk ? topk_ids[t * g.topk + lane] : -1;
    const uint32_t ranks = __reduce_or_sync(0xffffffffu, x >= 0 && x < g.experts ? 1u << (x / g.epr) : 0u);
    int4* dst = reinterpret_cast<int4*>(out + t * g.hidden);
    for (int v = lane; v < vecs; v += 64) {
      const bool second = v + 32 < vecs;
      float acc[2][8] = {};
      for (int r = 0; r < g.world; ++r) {
        if (!(ranks >> r & 1u)) continue;
        const int4* src = reinterpret_cast<const int4*>(partial + (int64_t(r) * max_tokens + t) * g.hidden);
        const int4 a = src[v];
        int4 b{};
        if (second) b = src[v + 32];
        add_bf16x8(acc[0], a);
        if (second) add_bf16x8(acc[1], b);
      }
      dst[v] = pack_bf16x8(acc[0]);
      if (second) dst[v + 32] = pack_bf16x8(acc[1]);
    }
  }
}

// ---- layer 1, pre-sum beside the GEMM (MoeFfnConfig::presum_ctas > 0) ----------------------
// The GEMM takes its tiles slice by slice (gemm::sliced_row_major over every local expert's row
// tiles, `slice` column tiles a slice); each stored tile counts itself on its slice's counter
// (L1SliceEpilogue). The schedule's side CTAs (the first num_side_ctas of the grid) wait for a
// slice's count, pre-sum its columns of every (source, token) as presum_kernel does, and go on to
// the next slice while the GEMM computes it; the last side CTA to finish releases every rank's
// done flag. Only the last slice's pre-sum is left after the GEMM.
struct L1SliceSchedule : gemm::sm90::GroupedSchedule {
  static constexpr bool kHasSide = true;
  int num_side_ctas = 0;
  int slice = 1;               // column tiles per slice
  int* slice_done = nullptr;   // [slices] tiles stored per slice, [slices] side CTAs finished (zeroed per call)
  Geometry geo;
  comm::DeviceSignals sig{};
  int64_t max_tokens = 0;
  const ulonglong2* row_of = nullptr;
  const E* y = nullptr;
  E* const* partial = nullptr;
  bool diag_no_presum = false;  // CCFUSE_MOE_DIAG=l1gemm: timing only (wrong results)

  __device__ gemm::TileWork work(int64_t idx) const {
    const int64_t m_total = tile_prefix[num_groups] / n_tiles;
    const gemm::TileCoord c = gemm::sliced_row_major(idx, int(m_total), n_tiles, slice, group_m);
    const int64_t first = int64_t(c.m_tile) * n_tiles;  // the tile_prefix of the tile's row band
    int lo = 0, hi = num_groups;  // largest g with tile_prefix[g] <= first (empty groups skipped)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (tile_prefix[mid] <= first) lo = mid;
      else hi = mid;
    }
    const int64_t m_in = c.m_tile - tile_prefix[lo] / n_tiles;
    return gemm::TileWork{int(m_in), c.n_tile, lo, row_prefix[lo] + m_in * block_m, row_prefix[lo + 1]};
  }

  __device__ void run_side(int cta) const {
    const int tid = threadIdx.x, lane = tid % 32, warps = blockDim.x / 32;
    const int64_t m_total = tile_prefix[num_groups] / n_tiles;
    const int slices = (n_tiles + slice - 1) / slice;
    const int64_t first_warp = int64_t(cta) * warps + tid / 32, stride = int64_t(num_side_ctas) * warps;
    const int64_t items = int64_t(geo.world) * max_tokens;
    const epoch_t e_call = comm::current_epoch(sig);
    bool ok = true;
    for (int sl = 0; sl < slices && ok && !diag_no_presum; ++sl) {
      const int width = min(slice, n_tiles - sl * slice);
      if (tid == 0) ok = comm::wait_count(sig, slice_done + sl, int(m_total * width), sl);
      // The count's acquire happens-before every thread's loads of y.
      ok = __syncthreads_and(ok ? 1 : 0) != 0;
      if (!ok) break;
      const int v0 = sl * slice * (kBlockN / 8), v1 = (sl * slice + width) * (kBlockN / 8);  // 16-byte pieces
      for (int64_t item = first_warp; item < items; item += stride) {
        int src;
        int64_t token;
        presum_item_of(geo, item, src, token);
        const int32_t mine =
            lane < geo.topk ? row_of_entry(row_of, (src * max_tokens + token) * geo.topk + lane, e_call) : -1;
        if (__ballot_sync(0xffffffffu, mine >= 0) == 0) continue;  // warp-uniform
        presum_item(geo, mine, y,
                    reinterpret_cast<int4*>(partial[src] + (int64_t(geo.rank) * max_tokens + token) * geo.hidden), v0, v1);
      }
    }
    __syncthreads();  // every thread's stores before thread 0's release
    if (tid == 0 && ok) {
      __threadfence_system();
      cuda::atomic_ref<int, cuda::thread_scope_device> finished(slice_done[slices]);
      if (finished.fetch_add(1, cuda::memory_order_acq_rel) + 1 == num_side_ctas) {
        __threadfence_system();  // the other side CTAs' stores (acquired above) before the flags
        const epoch_t e = comm::current_epoch(sig);
        for (int r = 0; r < geo.world; ++r) comm::notify(sig, r, geo.done_flag(geo.rank), e);
      }
    }
  }
};

// Layer 1's weighted rows into y (TMA-store or registers), each stored tile counted on its
// slice's counter (after its stores are complete: the kernel waits for a tile's TMA stores
// before notify).
struct L1SliceEpilogue : gemm::sm90::ActivationEpilogue<gemm::sm90::Activation::kNone, true> {
  static constexpr bool kHasNotify = true;
  int slice = 1;
  int* slice_done = nullptr;
  __device__ void notify(const gemm::TileWork& w) const {
    cuda::atomic_ref<int, cuda::thread_scope_device> count(slice_done[w.n_tile / slice]);
    count.fetch_add(1, cuda::memory_order_release);
  }
};

// n elements of T at offset p of a buffer (256-byte aligned pieces); p advances past them. A pass
// from p = 0 sizes the buffer, a second one from its address carves it.
template <class T>
T* carve(uintptr_t& p, size_t n) {
  T* r = reinterpret_cast<T*>(p);
  p += (n * sizeof(T) + 255) / 256 * 256;
  return r;
}

}  // namespace

struct MoeFfn::State {
  comm::Team& team;
  MoeFfnDesc desc;
  MoeFfnConfig cfg;
  Geometry geo;
  int64_t max_rows = 0;
  std::unique_ptr<comm::SymmetricBuffer> counts, recv, row_src, row_w, slots;
  std::unique_ptr<comm::SymmetricBuffer> partial;  // kPresum: [W][max_tokens][H] bf16
  // kAllGather: gathered tokens [W][max_tokens][H] bf16 and routing [W][max_tokens * k] (ids,
  // weights); every source's positions here [W][max_tokens * k]; device arrays of peer pointers.
  std::unique_ptr<comm::SymmetricBuffer> gath, gids, gw;
  int64_t* gpositions = nullptr;
  int32_t** gids_peers = nullptr;
  float** gw_peers = nullptr;
  std::unique_ptr<comm::SymmetricBuffer> row_of;   // kPresum: [W][max_tokens * k] ulonglong2 (set_row_of)
  int* slice_done = nullptr;                       // kPresum beside the GEMM: [H / 256 + 1] counters
  int presum_ctas = 0;                             // resolved MoeFfnConfig::presum_ctas
  bool l1_pp = false;                              // resolved MoeFfnConfig::l1_pingpong
  int l1_block_n = 256;                            // layer 1's tile width (128 with ping-pong)
  bool striped = false;                            // resolved MoeFfnConfig::striped_dispatch
  bool bulk = false;                               // resolved MoeFfnConfig::bulk_dispatch
  E* const* partial_peers = nullptr;               // kPresum: device array of W pointers
  std::unique_ptr<comm::SignalSet> sig;
  void* scratch = nullptr;  // Plan arrays, counts_row, send_list, ranks, dispatch workspace (all-gather)
  void* h1 = nullptr;
  void* y = nullptr;
  Plan plan{};
  int32_t* counts_row = nullptr;
  CountsPeers counts_peers{};  // every rank's counts matrix
  int32_t* send_list = nullptr;
  int32_t* entry_rank = nullptr;    // chunk_rank_kernel: [max_tokens * k]
  int32_t* chunk_counts = nullptr;  // chunk_rank_kernel: [chunks][E]
  int32_t* bad_entry = nullptr;  // check_routing
  void* dispatch_ws = nullptr;
  int64_t num_tokens = 0;  // of the last run_layer0
  State(comm::Team& t, const MoeFfnDesc& d, const MoeFfnConfig& c) : team(t), desc(d), cfg(c) {}
  ~State() {
    cudaFree(scratch);
    cudaFree(slice_done);
    cudaFree(const_cast<E**>(partial_peers));
    cudaFree(gpositions);
    cudaFree(gids_peers);
    cudaFree(gw_peers);
    cudaFree(h1);
    cudaFree(y);
  }
  int64_t l0_cols() const { return desc.swiglu ? 2 * desc.ffn : desc.ffn; }
  bool l1_nk() const { return desc.l1_b_layout.value_or(desc.b_layout) == gemm::BLayout::kNK; }
  // Either layer's grouped schedule over the local experts (rows from the exchange kernel).
  gemm::sm90::GroupedSchedule grouped_schedule(int n_tiles, const int* tile_prefix) const {
    gemm::sm90::GroupedSchedule g;
    g.num_groups = geo.epr;
    g.n_tiles = n_tiles;
    g.block_m = kBlockM;
    g.row_prefix = plan.row_prefix;
    g.tile_prefix = tile_prefix;
    g.tile_bound = (ceil_div(max_rows, kBlockM) + geo.epr) * n_tiles;
    return g;
  }
};

MoeFfn::MoeFfn(comm::Team& team, const MoeFfnDesc& d, MoeFfnConfig cfg) : s_(new State(team, d, cfg)) {
  const int w = team.world_size();
  CCFUSE_ARG_CHECK(w <= kMaxMoeRanks, "moe_ffn: world size ", w, " exceeds ", kMaxMoeRanks);
  CCFUSE_ARG_CHECK(d.max_tokens > 0, "max_tokens ", d.max_tokens, " must be positive");
  CCFUSE_ARG_CHECK(cfg.local_first >= -1 && cfg.local_first <= 1, "local_first ", cfg.local_first,
                   " must be -1 (per call), 0 (expert order) or 1 (local-first)");
  CCFUSE_ARG_CHECK(cfg.striped_dispatch >= -1 && cfg.striped_dispatch <= 1, "striped_dispatch ", cfg.striped_dispatch,
                   " must be -1 (by row size), 0 (by units) or 1 (striped)");
  CCFUSE_ARG_CHECK(cfg.bulk_dispatch >= -1 && cfg.bulk_dispatch <= 1, "bulk_dispatch ", cfg.bulk_dispatch,
                   " must be -1 (auto: moe::auto_bulk_dispatch), 0 (through registers) or 1 (bulk copies)");
  CCFUSE_ARG_CHECK(cfg.prep_one >= -1 && cfg.prep_one <= 1, "prep_one ", cfg.prep_one,
                   " must be -1 (auto), 0 (the two chunk kernels) or 1 (one kernel for calls of <= 2048 entries)");
  CCFUSE_ARG_CHECK(cfg.stripe_rows >= 1 && cfg.stripe_rows <= 32, "stripe_rows ", cfg.stripe_rows,
                   " must be in [1, 32] (one lane counts each row of a round)");
  CCFUSE_ARG_CHECK(cfg.dispatch_spread_us >= 0 && cfg.dispatch_spread_us <= 100000, "dispatch_spread_us ",
                   cfg.dispatch_spread_us, " must be in [0, 100000]");
  CCFUSE_ARG_CHECK(!cfg.gather_rows || cfg.dispatch == MoeDispatch::kAllGather,
                   "gather_rows needs dispatch = kAllGather (all-to-all puts each row in its final place already)");
  CCFUSE_ARG_CHECK(d.num_experts >= 1, "num_experts ", d.num_experts, " must be at least 1");
  CCFUSE_ARG_CHECK(d.num_experts <= 1024, "num_experts ", d.num_experts, " exceeds 1024 (the counts matrix of the "
                   "exchange kernel lives in shared memory)");
  CCFUSE_ARG_CHECK(d.num_experts % w == 0, "num_experts ", d.num_experts, " is not divisible by the world size ", w,
                   " (experts are split evenly over the ranks)");
  CCFUSE_ARG_CHECK(d.topk >= 1 && d.topk <= d.num_experts, "topk ", d.topk, " must be in [1, num_experts = ",
                   d.num_experts, "]");
  CCFUSE_ARG_CHECK(d.hidden > 0 && d.hidden % kBlockN == 0, "hidden ", d.hidden,
                   " must be a positive multiple of 256 (layer 1's output tiles are forwarded whole)");
  CCFUSE_ARG_CHECK(d.ffn > 0 && d.ffn % 8 == 0, "ffn ", d.ffn, " must be a positive multiple of 8 (TMA rows)");
  CCFUSE_ARG_CHECK(!d.swiglu || d.ffn % (kBlockN / 2) == 0, "ffn ", d.ffn,
                   " must be a multiple of 128 with swiglu (gate and up halves of every 256-column tile)");
  CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16, "moe_ffn: dtype must be bf16 in v1, not ", dtype_name(d.dtype));
  if (cfg.combine == MoeCombine::kAuto)  // the tuner's rule (moe_tuner.h): presum for 2 <= topk <= 32
    cfg.combine = std::string(auto_combine(d.topk, w)) == "presum" ? MoeCombine::kPresum : MoeCombine::kPerSlot;
  s_->cfg.combine = cfg.combine;
  CCFUSE_ARG_CHECK(cfg.combine != MoeCombine::kPresum || d.topk <= 32, "topk ", d.topk,
                   " must be at most 32 with the pre-summed combine (a warp holds a token's slots)");
  CCFUSE_ARG_CHECK(cfg.l1_pingpong >= -1 && cfg.l1_pingpong <= 1, "l1_pingpong ", cfg.l1_pingpong,
                   " must be -1 (by H), 0 (128x256 tiles) or 1 (128x128 ping-pong)");
  CCFUSE_ARG_CHECK(cfg.l1_pingpong < 1 || cfg.combine == MoeCombine::kPresum,
                   "l1_pingpong 1 needs the pre-summed combine (the per-slot combine forwards 256-column tiles)");
  CCFUSE_ARG_CHECK(cfg.l1_pingpong < 1 || (cfg.presum_ctas == 0 && cfg.tma_store),
                   "l1_pingpong 1 needs the pre-sum after the GEMM (presum_ctas 0, got ", cfg.presum_ctas,
                   ") and tma_store", cfg.tma_store ? "" : " (false here)");
  const int64_t entries = d.max_tokens * d.topk;
  CCFUSE_ARG_CHECK(entries * w < (int64_t(1) << 31), "max_tokens * topk * world size ", entries * w,
                   " must stay below 2^31 (row indices)");
  State& s = *s_;
  s.geo.world = w;
  s.geo.rank = team.rank();
  s.geo.experts = d.num_experts;
  s.geo.epr = d.num_experts / w;
  s.geo.topk = d.topk;
  s.geo.hidden = d.hidden;
  s.geo.max_chunks = (entries + kChunkRows - 1) / kChunkRows + d.num_experts;
  s.geo.interleaved = cfg.interleave_sends;
  s.striped = cfg.striped_dispatch > 0 || (cfg.striped_dispatch < 0 && auto_striped(d.hidden * 2, w));
  s.bulk = cfg.bulk_dispatch > 0 || (cfg.bulk_dispatch < 0 && auto_bulk_dispatch(w));
  if (const char* v = std::getenv("CCFUSE_MOE_BULK_DISPATCH"); v != nullptr && cfg.bulk_dispatch < 0)
    s.bulk = std::strcmp(v, "0") != 0;  // an A/B switch for the benches (the default's choice only)
  s.geo.max_tokens = d.max_tokens;
  s.geo.max_gchunks = (d.max_tokens + kChunkRows - 1) / kChunkRows;
  const bool allgather = cfg.dispatch == MoeDispatch::kAllGather;
  s.max_rows = entries * w;
  s.counts = team.alloc_symmetric(size_t(w) * d.num_experts * 4);
  s.recv = team.alloc_symmetric(size_t(s.max_rows * d.hidden) * 2);
  s.row_src = team.alloc_symmetric(size_t(s.max_rows) * sizeof(int2));
  s.row_w = team.alloc_symmetric(size_t(s.max_rows) * 4);
  if (cfg.combine == MoeCombine::kPresum) {
    s.partial = team.alloc_symmetric(size_t(w) * size_t(d.max_tokens * d.hidden) * 2);
    s.row_of = team.alloc_symmetric(size_t(w) * size_t(entries) * sizeof(ulonglong2));  // zeroed: no epoch 0
    CCFUSE_ARG_CHECK(cfg.presum_ctas >= -1 && cfg.presum_ctas <= 64, "presum_ctas ", cfg.presum_ctas,
                     " must be -1 (the tuner's), 0 (after the GEMM) or 1..64");
    if (cfg.presum_ctas < 0) {
      MoeProblem p;
      p.world_size = w;
      p.num_experts = d.num_experts;
      p.topk = d.topk;
      p.tokens_per_rank = d.max_tokens;
      p.hidden = d.hidden;
      p.ffn = d.ffn;
      s.presum_ctas = presum_ctas_for(p);
    } else {
      s.presum_ctas = cfg.presum_ctas;
    }
    CCFUSE_CUDA_CHECK(cudaMalloc(&s.slice_done, size_t(d.hidden / kBlockN + 1) * sizeof(int)));
    // Layer 1 on ping-pong 128x128 tiles: the pre-sum after a plain grouped GEMM through TMA stores.
    const bool pp_ok = s.presum_ctas == 0 && cfg.tma_store;
    s.l1_pp = pp_ok && (cfg.l1_pingpong > 0 || (cfg.l1_pingpong < 0 && auto_l1_pingpong(d.hidden)));
    s.l1_block_n = s.l1_pp ? 128 : kBlockN;
    std::vector<E*> pp(static_cast<size_t>(w));
    for (int r = 0; r < w; ++r) pp[size_t(r)] = static_cast<E*>(s.partial->peer(r));
    E** dev = nullptr;
    CCFUSE_CUDA_CHECK(cudaMalloc(&dev, size_t(w) * sizeof(E*)));
    CCFUSE_CUDA_CHECK(cudaMemcpy(dev, pp.data(), size_t(w) * sizeof(E*), cudaMemcpyHostToDevice));
    s.partial_peers = dev;
    s.slots = team.alloc_symmetric(16);  // unused by this combine
  } else {
    s.slots = team.alloc_symmetric(size_t(entries * d.hidden) * 2);
  }
  s.sig = team.make_signals("moe_ffn", s.geo.num_flags(allgather));
  if (allgather) {
    s.gath = team.alloc_symmetric(size_t(w) * size_t(d.max_tokens * d.hidden) * 2);
    s.gids = team.alloc_symmetric(size_t(w) * size_t(entries) * 4);
    s.gw = team.alloc_symmetric(size_t(w) * size_t(entries) * 4);
    CCFUSE_CUDA_CHECK(cudaMalloc(&s.gpositions, size_t(w) * size_t(entries) * 8));
    std::vector<int32_t*> ip(static_cast<size_t>(w));
    std::vector<float*> wp(static_cast<size_t>(w));
    for (int r = 0; r < w; ++r) {
      ip[size_t(r)] = static_cast<int32_t*>(s.gids->peer(r));
      wp[size_t(r)] = static_cast<float*>(s.gw->peer(r));
    }
    CCFUSE_CUDA_CHECK(cudaMalloc(&s.gids_peers, size_t(w) * sizeof(int32_t*)));
    CCFUSE_CUDA_CHECK(cudaMalloc(&s.gw_peers, size_t(w) * sizeof(float*)));
    CCFUSE_CUDA_CHECK(cudaMemcpy(s.gids_peers, ip.data(), size_t(w) * sizeof(int32_t*), cudaMemcpyHostToDevice));
    CCFUSE_CUDA_CHECK(cudaMemcpy(s.gw_peers, wp.data(), size_t(w) * sizeof(float*), cudaMemcpyHostToDevice));
  }
  CCFUSE_CUDA_CHECK(cudaMalloc(&s.h1, size_t(s.max_rows * d.ffn) * 2));
  CCFUSE_CUDA_CHECK(cudaMalloc(&s.y, size_t(s.max_rows * d.hidden) * 2));
  const int ex = d.num_experts, el = s.geo.epr;
  // The all-gather dispatch ranks every source's entries with dispatch_positions_gpu.
  const size_t ws = allgather ? dispatch_workspace_bytes(d.max_tokens, d.topk, ex) : 0;
  auto carve_all = [&](uintptr_t p) {
    const uintptr_t begin = p;
    s.plan.group_rows = carve<int32_t>(p, el);
    s.plan.row_prefix = carve<int64_t>(p, el + 1);
    s.plan.tile_prefix0 = carve<int>(p, el + 1);
    s.plan.tile_prefix1 = carve<int>(p, el + 1);
    s.plan.local_prefix0 = carve<int>(p, el + 1);
    s.plan.chunk_base = carve<int>(p, size_t(w) * (ex + 1));
    s.plan.rows_base = carve<int64_t>(p, ex + 1);
    s.plan.block_begin = carve<int64_t>(p, ex);
    s.plan.target = carve<int64_t>(p, w);
    s.plan.done_count = carve<int64_t>(p, w);
    s.plan.unit_done = carve<int>(p, size_t(s.geo.max_chunks));
    s.plan.perm_base = carve<int>(p, size_t(w) * el + 1);
    s.counts_row = carve<int32_t>(p, ex);
    s.send_list = carve<int32_t>(p, entries);
    s.entry_rank = carve<int32_t>(p, entries);
    s.chunk_counts = carve<int32_t>(p, size_t(ceil_div(entries, kPrepChunk)) * ex);
    s.bad_entry = carve<int32_t>(p, 1);
    s.dispatch_ws = carve<char>(p, ws);
    return size_t(p - begin);
  };
  const size_t bytes = carve_all(0);
  CCFUSE_CUDA_CHECK(cudaMalloc(&s.scratch, bytes));
  carve_all(reinterpret_cast<uintptr_t>(s.scratch));
  for (int r = 0; r < w; ++r) s.counts_peers.p[r] = static_cast<int32_t*>(s.counts->peer(r));
}

MoeFfn::~MoeFfn() = default;

internal::PlanArrays internal::derive_plan_for_test(int world, int rank, int experts, bool interleaved,
                                                const std::vector<int32_t>& counts, int n_tiles0, int n_tiles1,
                                                int64_t max_rows) {
  CCFUSE_ARG_CHECK(world >= 1 && world <= kMaxMoeRanks, "derive_plan_for_test: world ", world, " must be in [1, ",
                   kMaxMoeRanks, "]");
  CCFUSE_ARG_CHECK(rank >= 0 && rank < world, "derive_plan_for_test: rank ", rank, " must be in [0, world = ", world, ")");
  CCFUSE_ARG_CHECK(experts > 0 && experts % world == 0, "derive_plan_for_test: experts ", experts,
                   " must be a positive multiple of world = ", world);
  CCFUSE_ARG_CHECK(counts.size() == size_t(world) * size_t(experts), "derive_plan_for_test: counts has ", counts.size(),
                   " entries, must be world * experts = ", size_t(world) * size_t(experts));
  Geometry g;
  g.world = world;
  g.rank = rank;
  g.experts = experts;
  g.epr = experts / world;
  g.interleaved = interleaved;
  PlanArrays out;
  out.group_rows.resize(g.epr);
  out.row_prefix.resize(g.epr + 1);
  out.tile_prefix0.resize(g.epr + 1);
  out.tile_prefix1.resize(g.epr + 1);
  out.local_prefix0.resize(g.epr + 1);
  out.chunk_base.resize(size_t(world) * (experts + 1));
  out.rows_base.resize(experts + 1);
  out.block_begin.resize(experts);
  out.target.resize(world);
  out.perm_base.resize(size_t(world) * g.epr + 1);
  // One device allocation holds the counts and every array, each poisoned before the kernel.
  std::vector<std::pair<void*, size_t>> host = {
      {out.group_rows.data(), out.group_rows.size() * 4},       {out.row_prefix.data(), out.row_prefix.size() * 8},
      {out.tile_prefix0.data(), out.tile_prefix0.size() * 4},   {out.tile_prefix1.data(), out.tile_prefix1.size() * 4},
      {out.local_prefix0.data(), out.local_prefix0.size() * 4}, {out.chunk_base.data(), out.chunk_base.size() * 4},
      {out.rows_base.data(), out.rows_base.size() * 8},         {out.block_begin.data(), out.block_begin.size() * 8},
      {out.target.data(), out.target.size() * 8},               {out.perm_base.data(), out.perm_base.size() * 4}};
  size_t total = counts.size() * 4;
  std::vector<size_t> offset;
  for (const auto& h : host) {
    total = (total + 15) / 16 * 16;
    offset.push_back(total);
    total += h.second;
  }
  char* dev = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&dev, total));
  std::unique_ptr<char, void (*)(char*)> hold(dev, [](char* q) { cudaFree(q); });
  CCFUSE_CUDA_CHECK(cudaMemset(dev, 0xA5, total));
  CCFUSE_CUDA_CHECK(cudaMemcpy(dev, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
  Plan plan{};
  plan.group_rows = reinterpret_cast<int32_t*>(dev + offset[0]);
  plan.row_prefix = reinterpret_cast<int64_t*>(dev + offset[1]);
  plan.tile_prefix0 = reinterpret_cast<int*>(dev + offset[2]);
  plan.tile_prefix1 = reinterpret_cast<int*>(dev + offset[3]);
  plan.local_prefix0 = reinterpret_cast<int*>(dev + offset[4]);
  plan.chunk_base = reinterpret_cast<int*>(dev + offset[5]);
  plan.rows_base = reinterpret_cast<int64_t*>(dev + offset[6]);
  plan.block_begin = reinterpret_cast<int64_t*>(dev + offset[7]);
  plan.target = reinterpret_cast<int64_t*>(dev + offset[8]);
  plan.perm_base = reinterpret_cast<int*>(dev + offset[9]);
  derive_plan_kernel<<<1, 256, size_t(world + 2) * experts * 4>>>(g, reinterpret_cast<const int32_t*>(dev), plan,
                                                                  n_tiles0, n_tiles1, max_rows);
  CCFUSE_CUDA_CHECK_LAUNCH();
  // The legacy stream only: in a one-GPU world a device-wide sync would also wait for the other
  // ranks' kernels, which may wait for this rank's next call.
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  for (size_t i = 0; i < host.size(); ++i)
    CCFUSE_CUDA_CHECK(cudaMemcpy(host[i].first, dev + offset[i], host[i].second, cudaMemcpyDeviceToHost));
  return out;
}

const int32_t* MoeFfn::expert_rows_device() const { return s_->plan.group_rows; }
const void* MoeFfn::layer0_output() const { return s_->h1; }
const void* MoeFfn::layer0_input() const { return s_->recv->local(); }
MoeFfn::Layer0View MoeFfn::layer0_view() const {
  return {s_->h1, static_cast<const int32_t*>(s_->row_src->local()), static_cast<const float*>(s_->row_w->local()),
          s_->plan.row_prefix, s_->geo.epr};
}
int64_t MoeFfn::max_rows() const { return s_->max_rows; }

std::string MoeFfn::describe() const {
  std::ostringstream os;
  const MoeFfnDesc& d = s_->desc;
  const bool allgather = s_->cfg.dispatch == MoeDispatch::kAllGather;
  os << "moe_ffn v1 dispatch="
     << (allgather ? (s_->cfg.gather_rows ? "allgather(tokens to every rank, rows read in place by the GEMM; opt-in)"
                                          : "allgather(tokens to every rank, local permute; opt-in)")
                   : "alltoall")
     << (!allgather && s_->geo.interleaved ? "(send order interleaved)" : "")
     << (s_->cfg.tma_store ? " block=128x256x64 stages=3 epilogue=tma_store(layer0"
                           : " block=128x256x64 stages=4 epilogue=registers")
     << (s_->cfg.tma_store ? (s_->cfg.combine == MoeCombine::kPresum ? ",layer1)" : ";layer1 registers)") : "")
     << " chunk_rows=" << kChunkRows
     << " sms=" << (s_->cfg.num_sms > 0 ? s_->cfg.num_sms : gemm::current_device_sms())
     << " layer0=grouped+" << (d.swiglu ? "swiglu" : "identity") << "+send-warp-dispatch"
     << (!allgather && s_->striped ? "(striped rows, " + std::to_string(s_->cfg.stripe_rows) + " a warp a round" +
                                         (s_->bulk ? ", bulk copies)" : ")")
                                   : std::string())
     << (!allgather && s_->cfg.dispatch_spread_us > 0 ? "(paced over " + std::to_string(s_->cfg.dispatch_spread_us) + " us)"
                                                      : std::string())
     << (s_->cfg.local_first > 0 ? "(local-first tiles)"
                                 : s_->cfg.local_first == 0 ? "(expert-order tiles)"
                                                            : "(tile order auto: local-first at <= 4096 tokens)")
     << (s_->cfg.combine == MoeCombine::kPresum
             ? (s_->presum_ctas > 0
                    ? " layer1=grouped(sliced)+row-weight combine=presum(per token and rank, " +
                          std::to_string(s_->presum_ctas) + " side CTAs beside the GEMM) reduce=fp32-rank-sum"
                    : std::string(s_->l1_pp ? " layer1=grouped(128x128x64/6 ping-pong)" : " layer1=grouped") +
                          "+row-weight combine=presum(per token and rank, after the GEMM) reduce=fp32-rank-sum" +
                          (s_->geo.world == 1 && !s_->cfg.always_combine ? "(W=1: the pre-sum writes the output)"
                                                                          : ""))
             : " layer1=grouped+row-weight+send-warp-combine(slots) reduce=fp32-slot-sum")
     << " b=" << gemm::b_layout_name(d.b_layout);
  if (d.l1_b_layout.has_value() && *d.l1_b_layout != d.b_layout) os << " b1=" << gemm::b_layout_name(*d.l1_b_layout);
  if (s_->cfg.prep_one == 1 || (s_->cfg.prep_one < 0 && prep_one_env())) os << " prep=one-cta(<=2048 entries)";
  // An empty CCFUSE_MOE_DIAG stops nothing (the scripts' "no stop" runs set it so): no label then.
  const char* diag = std::getenv("CCFUSE_MOE_DIAG");
  if (diag != nullptr && *diag != '\0') os << " DIAG=" << diag << "(results-invalid)";
  return os.str();
}

namespace {
void check_ptr(const void* p, const char* name) {
  CCFUSE_ARG_CHECK(p != nullptr, name, " must be a device pointer, not null");
  CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, name, " (", p, ") must be 16-byte aligned");
}

template <class Traits, class Schedule, class Epi>
void launch(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int64_t ldc, const Schedule& sched,
            const Epi& epi, int sms, int groups, cudaStream_t stream, bool pdl = false) {
  const int64_t ldb = Traits::kBNK ? k : n;
  gemm::sm90::launch_gemm<Traits>(m, n, k, a, k, b, ldb, c, ldc, sched, epi, sms, stream, groups, n * k, nullptr, 0,
                                  pdl);
}

// The layers' grouped GEMMs: 128x256x64 tiles, B [N, K] (nk) or [K, N]; through the TMA-store
// epilogue (3 stages: its 64 KiB staging buffer) when `tma` and the epilogue allows it, else from
// registers (4 stages).
template <class Schedule, class Epi>
void launch_layer(bool nk, bool tma, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c,
                  int64_t ldc, const Schedule& sched, const Epi& epi, int sms, int groups, cudaStream_t stream,
                  bool pdl = false) {
  using gemm::sm90::Traits;
  if constexpr (gemm::sm90::tma_store_ok<Epi>::value) {
    if (tma) {
      if (nk)
        launch<Traits<E, 128, 256, 64, 3, true, 1, true>>(m, n, k, a, b, c, ldc, sched, epi, sms, groups, stream, pdl);
      else
        launch<Traits<E, 128, 256, 64, 3, false, 1, true>>(m, n, k, a, b, c, ldc, sched, epi, sms, groups, stream, pdl);
      return;
    }
  }
  if (nk) launch<Traits<E, 128, 256, 64, 4, true>>(m, n, k, a, b, c, ldc, sched, epi, sms, groups, stream, pdl);
  else launch<Traits<E, 128, 256, 64, 4, false>>(m, n, k, a, b, c, ldc, sched, epi, sms, groups, stream, pdl);
}
// Layer 1's grouped GEMM on ping-pong 128x128x64 tiles with 6 stages (MoeFfnConfig::l1_pingpong;
// the engine's sub-tile staging ring, sm90::Traits::kStagingRing): TMA-stored whole tiles, a
// group's cut last tile from registers.
template <class Schedule, class Epi>
void launch_layer_pingpong(bool nk, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int64_t ldc,
                           const Schedule& sched, const Epi& epi, int sms, int groups, cudaStream_t stream) {
  using gemm::sm90::Traits;
  static_assert(gemm::sm90::tma_store_ok<Epi>::value, "ping-pong stores through TMA");
  if (nk) launch<Traits<E, 128, 128, 64, 6, true, 1, true, true, false, 1>>(m, n, k, a, b, c, ldc, sched, epi, sms, groups,
                                                                             stream);
  else launch<Traits<E, 128, 128, 64, 6, false, 1, true, true, false, 1>>(m, n, k, a, b, c, ldc, sched, epi, sms, groups,
                                                                           stream);
}
}  // namespace

void MoeFfn::run_layer0(const void* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w,
                        const void* w1, cudaStream_t stream, void* preact_out, bool gemm, int64_t preact_rows,
                        int64_t gemm_above_rows) {
  State& s = *s_;
  const MoeFfnDesc& d = s.desc;
  s.team.check_watchdog();
  CCFUSE_ARG_CHECK(num_tokens >= 0 && num_tokens <= d.max_tokens, "num_tokens ", num_tokens,
                   " must be in [0, max_tokens = ", d.max_tokens, "]");
  if (num_tokens > 0) {
    check_ptr(x, "x");
    CCFUSE_ARG_CHECK(topk_ids != nullptr && topk_w != nullptr, "topk_ids and topk_w must be device pointers");
  }
  check_ptr(w1, "w1");
  CCFUSE_ARG_CHECK(gemm || !s.cfg.gather_rows, "gemm = false (the dispatch alone) places no rows with "
                   "gather_rows (its GEMM reads them in place)");
  CCFUSE_ARG_CHECK(preact_rows >= 0 && preact_rows <= s.max_rows, "preact_rows ", preact_rows,
                   " must be in [1, max_rows() = ", s.max_rows, "] (0: max_rows())");
  CCFUSE_ARG_CHECK(gemm_above_rows >= -1, "gemm_above_rows ", gemm_above_rows, " must be >= 0 (or -1: always)");
  if (preact_rows == 0) preact_rows = s.max_rows;
  if (preact_out != nullptr) {
    check_ptr(preact_out, "preact_out");
    CCFUSE_ARG_CHECK(gemm && gemm_above_rows < 0, "preact_out needs layer 0's GEMM (gemm = true, every call)");
    const size_t bytes = size_t(preact_rows * s.l0_cols()) * 2;
    CCFUSE_ARG_CHECK(x == nullptr || !bytes_overlap(preact_out, bytes, x, size_t(num_tokens * d.hidden) * 2),
                     "preact_out must not overlap x");
  }
  if (s.cfg.check_routing && num_tokens > 0) {
    // Host sync (off by default): ids outside [-1, E) are counted as dropped otherwise.
    const int32_t none = INT32_MAX;
    CCFUSE_CUDA_CHECK(cudaMemcpyAsync(s.bad_entry, &none, 4, cudaMemcpyHostToDevice, stream));
    const int64_t entries = num_tokens * d.topk;
    check_ids_kernel<<<int(std::min<int64_t>(ceil_div(entries, 256), 1024)), 256, 0, stream>>>(topk_ids, entries,
                                                                                              d.num_experts, s.bad_entry);
    CCFUSE_CUDA_CHECK_LAUNCH();
    int32_t bad = none;
    CCFUSE_CUDA_CHECK(cudaMemcpyAsync(&bad, s.bad_entry, 4, cudaMemcpyDeviceToHost, stream));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    CCFUSE_ARG_CHECK(bad == none, "topk_ids: entry ", bad, " (token ", bad / d.topk, ", slot ", bad % d.topk,
                     ") holds an expert id outside [-1, num_experts = ", d.num_experts, ")");
  }
  s.num_tokens = num_tokens;
  // Timing experiments (docs/moe-layers.md; the results are wrong then): "l0stopbegin",
  // "l0stoprank", "l0stoplist" stop after the call's entry barrier, the ranking kernel, the send
  // list kernel (each preparation step's share of "l0pre", launch gaps included).
  const char* diag = std::getenv("CCFUSE_MOE_DIAG");
  const auto stop_at = [&](const char* step) { return diag != nullptr && std::strstr(diag, step) != nullptr; };
  s.sig->begin_call(stream);  // triggers its dependents at once: the first kernel below may start
  if (stop_at("l0stopbegin")) return;
  const bool pdl = prep_pdl();
  const bool allgather = s.cfg.dispatch == MoeDispatch::kAllGather;
  const int64_t entries_now = num_tokens * d.topk;
  const unsigned prep_chunks = unsigned(ceil_div(entries_now, kPrepChunk));
  const size_t one_smem = size_t(d.num_experts) * (3 + kPrepWarps) * 4;
  const bool one = s.cfg.prep_one >= 0 ? s.cfg.prep_one == 1 : prep_one_env();
  if (prep_chunks == 1 && one && one_smem <= 48 * 1024) {
    // One chunk (decode-sized calls): ranking, counts and send list in one CTA ("l0stoprank" and
    // "l0stoplist" both stop after it).
    launch_pdl(pdl, single_chunk_prep_kernel, 1, kPrepThreads, one_smem, stream, s.geo, topk_ids, entries_now,
               s.counts_row, allgather ? nullptr : s.send_list, s.plan.done_count,
               s.striped ? s.plan.unit_done : nullptr, s.geo.max_chunks);
    if (stop_at("l0stoprank") || stop_at("l0stoplist")) return;
  } else if (prep_chunks > 0) {
    launch_pdl(pdl, chunk_rank_kernel, prep_chunks, kPrepThreads, size_t(d.num_experts) * (1 + kPrepWarps) * 4,
               stream, topk_ids, entries_now, d.num_experts, s.entry_rank, s.chunk_counts);
    if (stop_at("l0stoprank")) return;
    // Needs only this rank's counts: before the exchange, which waits for the peers. Zeroes the
    // per-call counters too.
    launch_pdl(pdl, chunk_send_list_kernel, prep_chunks, kPrepThreads, size_t(d.num_experts) * 3 * 4, stream, s.geo,
               topk_ids, entries_now, static_cast<const int32_t*>(s.entry_rank),
               static_cast<const int32_t*>(s.chunk_counts), s.counts_row, allgather ? nullptr : s.send_list,
               s.plan.done_count, s.striped ? s.plan.unit_done : nullptr, s.geo.max_chunks);
    if (stop_at("l0stoplist")) return;
  } else {  // no tokens: the counts row and the counters by memsets
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(s.counts_row, 0, size_t(d.num_experts) * 4, stream));
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(s.plan.done_count, 0, size_t(s.geo.world) * 8, stream));
    if (s.striped) CCFUSE_CUDA_CHECK(cudaMemsetAsync(s.plan.unit_done, 0, size_t(s.geo.max_chunks) * 4, stream));
  }
  const int dev_sms = gemm::current_device_sms();
  const int64_t entries_max = d.max_tokens * d.topk;
  if (allgather) {  // the routing first: the exchange kernel's flags publish it with the counts
    route_push_kernel<<<2 * dev_sms, 256, 0, stream>>>(s.geo, topk_ids, topk_w, num_tokens, s.gids_peers, s.gw_peers);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  const int n_tiles0 = int(ceil_div(s.l0_cols(), kBlockN)), n_tiles1 = int(d.hidden / s.l1_block_n);
  const size_t exchange_smem = size_t(s.geo.world + 2) * d.num_experts * 4;
  // PDL only right after the send-list kernel (not after memsets or the all-gather's kernel).
  launch_pdl(pdl && prep_chunks > 0 && !allgather, exchange_kernel, 1, 256, exchange_smem, stream, s.geo,
             s.sig->device(), static_cast<const int32_t*>(s.counts_row), s.counts_peers, s.plan, n_tiles0, n_tiles1,
             s.max_rows);
  const int32_t* counts_local = static_cast<const int32_t*>(s.counts->local());
  if (allgather) {
    // Every source's entries ranked on this rank (dispatch_positions_gpu over max_tokens padded
    // tokens), then the receive rows' (source, entry) and weight.
    const int32_t* gids = static_cast<const int32_t*>(s.gids->local());
    for (int src = 0; src < s.geo.world; ++src)
      dispatch_positions_gpu(counts_local, s.geo.world, d.num_experts, src, gids + src * entries_max, d.max_tokens,
                             d.topk, s.gpositions + src * entries_max, s.dispatch_ws, stream);
    ag_rows_kernel<<<2 * dev_sms, 256, 0, stream>>>(
        s.geo, s.sig->device(), gids, static_cast<const float*>(s.gw->local()), s.gpositions,
        static_cast<int2*>(s.row_src->local()), static_cast<float*>(s.row_w->local()),
        s.row_of ? static_cast<ulonglong2*>(s.row_of->local()) : nullptr);
    CCFUSE_CUDA_CHECK_LAUNCH();
  }
  L0Schedule sched;
  static_cast<gemm::sm90::GroupedSchedule&>(sched) = s.grouped_schedule(n_tiles0, s.plan.tile_prefix0);
  sched.geo = s.geo;
  sched.counts = counts_local;
  sched.chunk_base = s.plan.chunk_base;
  sched.sig = s.sig->device();
  if (s.cfg.local_first > 0 ||
      (s.cfg.local_first < 0 && auto_local_first(num_tokens, s.geo.world, s.geo.interleaved, s.striped)))
    sched.local_prefix = s.plan.local_prefix0;
  // Timing experiments (docs/moe-layers.md): "nowait" (tiles do not wait for their rows),
  // "nosend" (no dispatch; implies nowait), "l0pre" (no GEMM: the preparation alone), "l0plain"
  // (below). The results are wrong then.
  const bool no_send = diag != nullptr && (std::strncmp(diag, "nosend", 6) == 0 || std::strstr(diag, ",nosend") != nullptr);
  sched.diag_no_wait = no_send || (diag != nullptr && std::strstr(diag, "nowait") != nullptr);
  // "l0sendonly": layer 0's kernel with no tiles, so that only its send warps' dispatch runs
  // (against NCCL's all-to-all of the same rows: how fast the send warps move them on their own).
  sched.diag_no_tiles = !gemm || (diag != nullptr && std::strstr(diag, "l0sendonly") != nullptr);
  sched.gemm_above_rows = gemm_above_rows;
  const int sms = s.cfg.num_sms > 0 ? s.cfg.num_sms : gemm::current_device_sms();
  auto fill = [&](auto& epi) {
    epi.diag_no_send = no_send;
    epi.diag_no_local = diag != nullptr && std::strstr(diag, "l0nolocal") != nullptr;
    epi.geo = s.geo;
    epi.sig = sched.sig;
    epi.x = static_cast<const E*>(x);
    epi.topk_w = topk_w;
    epi.send_list = s.send_list;
    epi.chunk_base = s.plan.chunk_base;
    epi.rows_base = s.plan.rows_base;
    epi.block_begin = s.plan.block_begin;
    epi.striped = s.striped;
    epi.bulk = s.bulk;
    if (const char* v = std::getenv("CCFUSE_MOE_BULK_SLOTS")) epi.bulk_slots = std::max(2, std::atoi(v));
    epi.unit_done = s.plan.unit_done;
    epi.stripe_rows = s.cfg.stripe_rows;
    epi.spread_ns = uint64_t(s.cfg.dispatch_spread_us) * 1000u;
    epi.preact = static_cast<E*>(preact_out);
    epi.preact_ld = s.l0_cols();
    epi.preact_rows = preact_rows;
    for (int r = 0; r < s.geo.world; ++r) {
      epi.recv[r] = static_cast<E*>(s.recv->peer(r));
      epi.row_src[r] = static_cast<int2*>(s.row_src->peer(r));
      epi.row_w[r] = static_cast<float*>(s.row_w->peer(r));
      if (s.row_of) epi.row_of[r] = static_cast<ulonglong2*>(s.row_of->peer(r));
    }
    if (allgather) {
      epi.allgather = true;
      epi.num_tokens = num_tokens;
      for (int r = 0; r < s.geo.world; ++r) epi.gath[r] = static_cast<E*>(s.gath->peer(r));
      epi.counts = counts_local;
      epi.perm_base = s.plan.perm_base;
      epi.row_src_local = static_cast<const int2*>(s.row_src->local());
      epi.recv_local = static_cast<E*>(s.recv->local());
      epi.gather_rows = s.cfg.gather_rows;
    }
  };
  using gemm::sm90::Activation;
  const bool nk = d.b_layout == gemm::BLayout::kNK;
  // "l0pre": stop before the GEMM (the preparation kernels' time alone).
  if (stop_at("l0pre")) return;
  // Layer 0's GEMM with parts of its machinery left out (no dispatch, no waits; with SwiGLU):
  // "l0plain" a plain grouped schedule and epilogue (against "nosend": the cost of the send warps
  // and the ready schedule; against the grouped GEMM alone: the SwiGLU epilogue's), "l0sw" the
  // plain schedule with layer 0's epilogue (its idle send warps), "l0ready" layer 0's schedule
  // with the plain epilogue.
  if (diag != nullptr && d.swiglu &&
      (std::strstr(diag, "l0plain") != nullptr || std::strstr(diag, "l0sw") != nullptr ||
       std::strstr(diag, "l0ready") != nullptr)) {
    const gemm::sm90::GroupedSchedule plain = sched;
    const gemm::sm90::ActivationEpilogue<Activation::kSiluMul, false> act;
    auto go = [&](const auto& sc, const auto& ep) {
      launch_layer(nk, s.cfg.tma_store, s.max_rows, s.l0_cols(), d.hidden, s.recv->local(), w1, s.h1, d.ffn, sc, ep,
                   sms, s.geo.epr, stream);
    };
    if (std::strstr(diag, "l0sw") != nullptr) {
      L0Epilogue<Activation::kSiluMul> epi;
      fill(epi);
      epi.diag_no_send = true;
      go(plain, epi);
    } else if (std::strstr(diag, "l0ready") != nullptr) {
      L0Schedule ready = sched;
      ready.diag_no_wait = true;
      go(ready, act);
    } else {
      go(plain, act);
    }
    CCFUSE_CUDA_CHECK_LAUNCH();
    return;
  }
  // By PDL behind the kernel before it (the exchange; L0Schedule::kWaitsPriorGrid: every thread
  // waits for it before reading the plan), so that its launch and setup overlap the exchange.
  const bool gemm_pdl = pdl && l0_gemm_pdl();
  auto launch_l0 = [&](const auto& schedule) {
    if (d.swiglu) {
      L0Epilogue<Activation::kSiluMul> epi;
      fill(epi);
      launch_layer(nk, s.cfg.tma_store, s.max_rows, s.l0_cols(), d.hidden, s.recv->local(), w1, s.h1, d.ffn, schedule,
                   epi, sms, s.geo.epr, stream, gemm_pdl);
    } else {
      L0Epilogue<Activation::kNone> epi;
      fill(epi);
      launch_layer(nk, s.cfg.tma_store, s.max_rows, s.l0_cols(), d.hidden, s.recv->local(), w1, s.h1, d.ffn, schedule,
                   epi, sms, s.geo.epr, stream, gemm_pdl);
    }
  };
  if (allgather && s.cfg.gather_rows) {
    L0GatherSchedule gs;
    static_cast<L0Schedule&>(gs) = sched;
    gs.x = static_cast<const E*>(x);
    gs.gath_local = static_cast<const E*>(s.gath->local());
    gs.row_src = static_cast<const int2*>(s.row_src->local());
    launch_l0(gs);  // A's descriptor (recv) is built but unused: the producer warps gather the rows
  } else {
    launch_l0(sched);
  }
  CCFUSE_CUDA_CHECK_LAUNCH();
}

void MoeFfn::run_layer1_presum(int64_t num_tokens, const int32_t* topk_ids, const void* w2, void* out,
                               cudaStream_t stream) {
  State& s = *s_;
  const MoeFfnDesc& d = s.desc;
  const gemm::sm90::GroupedSchedule sched = s.grouped_schedule(int(d.hidden / kBlockN), s.plan.tile_prefix1);
  const int dev_sms = gemm::current_device_sms();
  // The row map (row_of) came with layer 0's rows (set_row_of): nothing to prepare here.
  const int sms_all = s.cfg.num_sms > 0 ? s.cfg.num_sms : dev_sms;
  const char* diag = std::getenv("CCFUSE_MOE_DIAG");
  const bool diag_gemm_only = diag != nullptr && std::strstr(diag, "l1gemm") != nullptr;
  if (s.presum_ctas > 0 && s.presum_ctas < sms_all) {
    // The pre-sum beside the GEMM: ~6 slices (A is read once per slice).
    const int n_tiles = int(d.hidden / kBlockN), slice = std::max(1, (n_tiles + 5) / 6);
    const int slices = (n_tiles + slice - 1) / slice;
    CCFUSE_CUDA_CHECK(cudaMemsetAsync(s.slice_done, 0, size_t(slices + 1) * sizeof(int), stream));
    L1SliceSchedule ssched;
    static_cast<gemm::sm90::GroupedSchedule&>(ssched) = sched;
    ssched.tile_bound = sched.tile_bound;
    ssched.num_side_ctas = s.presum_ctas;
    ssched.slice = slice;
    ssched.slice_done = s.slice_done;
    ssched.geo = s.geo;
    ssched.sig = s.sig->device();
    ssched.max_tokens = d.max_tokens;
    ssched.row_of = static_cast<const ulonglong2*>(s.row_of->local());
    ssched.y = static_cast<const E*>(s.y);
    ssched.partial = s.partial_peers;
    ssched.diag_no_presum = diag_gemm_only;
    L1SliceEpilogue epi;
    epi.scale = static_cast<const float*>(s.row_w->local());
    epi.slice = slice;
    epi.slice_done = s.slice_done;
    launch_layer(s.l1_nk(), s.cfg.tma_store, s.max_rows, d.hidden, d.ffn, s.h1, w2, s.y,
                 d.hidden, ssched, epi, sms_all, s.geo.epr, stream);
    CCFUSE_CUDA_CHECK_LAUNCH();
    if (diag_gemm_only) return;
  } else {
    // W = 1: the pre-sum writes the output itself (the combine would copy its one partial), unless
    // MoeFfnConfig::always_combine.
    const bool direct = s.geo.world == 1 && !s.cfg.always_combine;
    run_layer1_presum_after(w2, stream, diag_gemm_only, direct ? out : nullptr, num_tokens);
    if (diag_gemm_only || direct) return;
  }
  // "l1presum": stop before the combine (against "l1gemm": the pre-sum's time; against the whole
  // layer: the combine's). The output is not written then.
  if (diag != nullptr && std::strstr(diag, "l1presum") != nullptr) return;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(ceil_div(num_tokens, int64_t(8)), 4 * dev_sms)));
  presum_combine_kernel<<<blocks, 256, 0, stream>>>(s.geo, s.sig->device(), static_cast<const E*>(s.partial->local()),
                                                    d.max_tokens, topk_ids, num_tokens, static_cast<E*>(out));
  CCFUSE_CUDA_CHECK_LAUNCH();
}

// The pre-sum after the GEMM (presum_ctas 0): the weighted rows into y, then presum_kernel and
// the done flags.
void MoeFfn::run_layer1_presum_after(const void* w2, cudaStream_t stream, bool gemm_only, void* direct_out,
                                     int64_t num_tokens) {
  State& s = *s_;
  const MoeFfnDesc& d = s.desc;
  const gemm::sm90::GroupedSchedule sched = s.grouped_schedule(int(d.hidden / s.l1_block_n), s.plan.tile_prefix1);
  const int dev_sms = gemm::current_device_sms();
  // The weighted rows into y (the plain grouped GEMM with the router weight as row scale).
  gemm::sm90::ActivationEpilogue<gemm::sm90::Activation::kNone, true> epi;
  epi.scale = static_cast<const float*>(s.row_w->local());
  const int sms = s.cfg.num_sms > 0 ? s.cfg.num_sms : dev_sms;
  if (s.l1_pp) {
    launch_layer_pingpong(s.l1_nk(), s.max_rows, d.hidden, d.ffn, s.h1, w2, s.y, d.hidden,
                          sched, epi, sms, s.geo.epr, stream);
  } else {
    launch_layer(s.l1_nk(), s.cfg.tma_store, s.max_rows, d.hidden, d.ffn, s.h1, w2, s.y,
                 d.hidden, sched, epi, sms, s.geo.epr, stream);
  }
  CCFUSE_CUDA_CHECK_LAUNCH();
  // "l1gemm": stop after the GEMM (the pre-sum and combine kernels' time is the difference).
  if (gemm_only) return;
  presum_kernel<<<4 * dev_sms, 256, 0, stream>>>(s.geo, s.sig->device(), d.max_tokens,
                                                 static_cast<const ulonglong2*>(s.row_of->local()), static_cast<const E*>(s.y),
                                                 s.partial_peers, static_cast<E*>(direct_out), num_tokens);
  CCFUSE_CUDA_CHECK_LAUNCH();
  if (direct_out != nullptr) return;  // W = 1: no peer waits for this rank's partials
  presum_notify_kernel<<<1, 32, 0, stream>>>(s.geo, s.sig->device());
  CCFUSE_CUDA_CHECK_LAUNCH();
}

void MoeFfn::run_layer1(int64_t num_tokens, const int32_t* topk_ids, const void* w2, void* out, cudaStream_t stream) {
  State& s = *s_;
  const MoeFfnDesc& d = s.desc;
  CCFUSE_ARG_CHECK(num_tokens == s.num_tokens, "num_tokens ", num_tokens, " must equal the last run_layer0's (",
                   s.num_tokens, ")");
  check_ptr(w2, "w2");
  if (num_tokens > 0) {
    check_ptr(out, "out");
    CCFUSE_ARG_CHECK(topk_ids != nullptr, "topk_ids must be a device pointer");
  }
  // Layer 0 stopped before its exchange kernel (CCFUSE_MOE_DIAG=l0stop...): no plan to run on.
  if (const char* diag = std::getenv("CCFUSE_MOE_DIAG"); diag != nullptr && std::strstr(diag, "l0stop") != nullptr)
    return;
  const int n_tiles1 = int(d.hidden / kBlockN);
  const gemm::sm90::GroupedSchedule sched = s.grouped_schedule(n_tiles1, s.plan.tile_prefix1);
  if (s.cfg.combine == MoeCombine::kPresum) {
    run_layer1_presum(num_tokens, topk_ids, w2, out, stream);
    return;
  }
  L1Epilogue epi;
  epi.scale = static_cast<const float*>(s.row_w->local());
  epi.geo = s.geo;
  epi.sig = s.sig->device();
  epi.row_src = static_cast<const int2*>(s.row_src->local());
  epi.y = static_cast<const E*>(s.y);
  for (int r = 0; r < s.geo.world; ++r) epi.slots[r] = static_cast<E*>(s.slots->peer(r));
  epi.target = s.plan.target;
  epi.done_count = s.plan.done_count;
  const char* diag = std::getenv("CCFUSE_MOE_DIAG");
  epi.diag_no_send = diag != nullptr && std::strstr(diag, "l1nosend") != nullptr;
  const int sms = s.cfg.num_sms > 0 ? s.cfg.num_sms : gemm::current_device_sms();
  launch_layer(s.l1_nk(), false, s.max_rows, d.hidden, d.ffn, s.h1, w2, s.y, d.hidden, sched,
               epi, sms, s.geo.epr, stream);
  CCFUSE_CUDA_CHECK_LAUNCH();
  int dev_sms = gemm::current_device_sms();
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(ceil_div(num_tokens * (d.hidden / 8), 256), 4 * dev_sms)));
  combine_kernel<<<blocks, 256, 0, stream>>>(s.geo, s.sig->device(), static_cast<const E*>(s.slots->local()), topk_ids,
                                             num_tokens, static_cast<E*>(out));
  CCFUSE_CUDA_CHECK_LAUNCH();
}

void MoeFfn::run(const void* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w, const void* w1,
                 const void* w2, void* out, cudaStream_t stream, void* preact_out, int64_t preact_rows) {
  const MoeFfnDesc& d = s_->desc;
  if (num_tokens > 0 && out != nullptr && x != nullptr) {
    const size_t bytes = size_t(num_tokens * d.hidden) * 2;
    CCFUSE_ARG_CHECK(!bytes_overlap(out, bytes, x, bytes), "out must not overlap x");
  }
  if (preact_out != nullptr && num_tokens > 0 && out != nullptr) {
    const size_t bytes = size_t(num_tokens * d.hidden) * 2;
    const int64_t kept = preact_rows > 0 ? std::min(preact_rows, s_->max_rows) : s_->max_rows;
    CCFUSE_ARG_CHECK(!bytes_overlap(out, bytes, preact_out, size_t(kept * s_->l0_cols()) * 2),
                     "out must not overlap preact_out");
  }
  run_layer0(x, num_tokens, topk_ids, topk_w, w1, stream, preact_out, true, preact_rows);
  run_layer1(num_tokens, topk_ids, w2, out, stream);
}

}  // namespace ccfuse::moe
