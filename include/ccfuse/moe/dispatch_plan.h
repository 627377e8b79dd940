// ccfuse/moe/dispatch_plan.h: where dispatched rows land on the receiving rank, and which
// (source, expert) blocks a grouped-GEMM tile depends on (__host__ __device__, no CUDA headers).
//
// The GPU layer 0 plan (docs/moe-layers.md, "GPU plan"): every rank first publishes how many of
// its routed entries go to each expert (`counts`, [W][E] ints: counts[s * E + e] = entries of
// source s routed to global expert e, dropped ones excluded). From that matrix alone every rank
// knows every receiver's expert-sorted buffer: on receiver d, local expert e's rows are the
// blocks of sources d, d + 1, ... (rotated, local first), and inside a block the source's own
// entry order (token * k + slot). That is exactly make_layout's order (ccfuse/moe/layout.h), so
// a sender can store each row at its final position (contiguous rows per expert: TMA loads, no
// gather in the GEMM) and the receiver's grouped GEMM tile waits only for the blocks it covers.
#pragma once

#include <cstdint>

#include "ccfuse/common/hd.h"

namespace ccfuse::moe {

struct DispatchPlan {
  const int32_t* counts = nullptr;  // [W][E] entries per (source rank, global expert)
  int world_size = 1;
  int num_experts = 1;  // global; rank d owns experts [d * E / W, (d + 1) * E / W)

  CCFUSE_HD int experts_per_rank() const { return num_experts / world_size; }
  CCFUSE_HD int owner(int expert) const { return expert / experts_per_rank(); }
  CCFUSE_HD int32_t count(int src, int expert) const { return counts[int64_t(src) * num_experts + expert]; }

  // Rows of global expert e on its owner (all sources).
  CCFUSE_HD int64_t expert_rows(int expert) const {
    int64_t rows = 0;
    for (int s = 0; s < world_size; ++s) rows += count(s, expert);
    return rows;
  }
  // First row of global expert e in its owner's buffer (the owner's local experts in order).
  CCFUSE_HD int64_t expert_begin(int expert) const {
    int64_t row = 0;
    for (int e = owner(expert) * experts_per_rank(); e < expert; ++e) row += expert_rows(e);
    return row;
  }
  // Rows the owner of `dest`'s experts receives in all.
  CCFUSE_HD int64_t rank_rows(int dest) const {
    int64_t rows = 0;
    for (int e = dest * experts_per_rank(); e < (dest + 1) * experts_per_rank(); ++e) rows += expert_rows(e);
    return rows;
  }
  // First row of source `src`'s block of expert e in the owner's buffer: sources in rotated order
  // starting at the owner.
  CCFUSE_HD int64_t block_begin(int src, int expert) const {
    const int d = owner(expert);
    int64_t row = expert_begin(expert);
    for (int i = 0; i < (src - d + world_size) % world_size; ++i) row += count((d + i) % world_size, expert);
    return row;
  }
  // The blocks that rows [row0, row0 + rows) of expert e (rows counted from the expert's first
  // row) come from: rotated source positions [*first, *last] (position i = source (owner + i) %
  // W). Empty blocks inside the range are included (their flags are set too); rows <= 0 gives
  // first > last.
  CCFUSE_HD void tile_sources(int expert, int64_t row0, int64_t rows, int* first, int* last) const {
    const int d = owner(expert);
    *first = world_size;
    *last = -1;
    if (rows <= 0) return;
    int64_t begin = 0;
    for (int i = 0; i < world_size; ++i) {
      const int64_t end = begin + count((d + i) % world_size, expert);
      if (end > row0 && begin < row0 + rows) {
        if (*first > i) *first = i;
        *last = i;
      }
      begin = end;
    }
  }

  // All-gather mode (MoeDispatch::kAllGather, docs/moe-layers.md): receiver `dest` copies its
  // rows into place itself, in units of up to `unit_rows` rows of one (source, expert) block,
  // ordered by source rotated from dest (its own tokens first), then local expert, then chunk.
  // permute_bases: base[i * E_local + j] = first unit of the i-th rotated source's block of local
  // expert j; base[W * E_local] = all units.
  CCFUSE_HD void permute_bases(int dest, int unit_rows, int* base) const {
    const int epr = experts_per_rank();
    int u = 0;
    for (int i = 0; i < world_size; ++i)
      for (int j = 0; j < epr; ++j) {
        base[i * epr + j] = u;
        u += int((count((dest + i) % world_size, dest * epr + j) + unit_rows - 1) / unit_rows);
      }
    base[world_size * epr] = u;
  }
  struct PermuteUnit {
    int src, expert;      // source rank, global expert
    int64_t chunk;        // index of the unit inside its block
    int64_t row0, rows;   // its rows in dest's buffer
  };
  // Unit u (< base[W * E_local]) of receiver dest.
  CCFUSE_HD PermuteUnit permute_unit(int dest, const int* base, int64_t u, int unit_rows) const {
    const int epr = experts_per_rank();
    int lo = 0, hi = world_size * epr;  // the largest q with base[q] <= u: a block with units
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (base[mid] <= u) lo = mid;
      else hi = mid;
    }
    PermuteUnit p;
    p.src = (dest + lo / epr) % world_size;
    p.expert = dest * epr + lo % epr;
    p.chunk = u - base[lo];
    p.row0 = block_begin(p.src, p.expert) + p.chunk * unit_rows;
    const int64_t left = count(p.src, p.expert) - p.chunk * unit_rows;
    p.rows = left < unit_rows ? left : unit_rows;
    return p;
  }
};

// Source-side positions: entry (token * k + slot) of source `src` with expert e goes to row
// block_begin(src, e) + (its rank among src's entries of expert e in entry order) of the owner's
// buffer; dropped entries (-1) get -1. `positions` has num_tokens * topk entries. Host reference
// of what the GPU computes with the stable radix sort of the layout kernel.
void dispatch_positions(const DispatchPlan& plan, int src, const int32_t* topk_ids, int64_t num_tokens, int topk,
                        int64_t* positions);

// counts[src * E + e] from one source's routing (what each rank publishes first).
void dispatch_counts(const int32_t* topk_ids, int64_t num_tokens, int topk, int num_experts, int32_t* counts_row);

}  // namespace ccfuse::moe
