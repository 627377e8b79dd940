// ccfuse/moe/router_gpu.h: the GPU MoE router (DESIGN §2.3), host API (no CUDA headers needed).
//
// It follows the CPU reference's arithmetic (docs/moe-routing.md) so that, given the same fp32
// logits, the top-k ids equal route_logits_cpu's except at documented near-ties (two selection
// keys within ~1e-15 relative, where CUDA's double exp and the host libm's may round apart by one
// ulp); weights then agree to the last bit or so, stats exactly. Design: docs/moe-router-gpu.md.
//
// All pointers are device pointers; `stream` is a cudaStream_t (null = the legacy default stream).
// Every call is asynchronous (no host synchronisation, CUDA-graph capturable) and deterministic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccfuse/moe/router.h"

namespace ccfuse::moe {

// The GPU router keeps each token's scores in registers of one warp: num_experts <= this.
constexpr int kGpuRouterMaxExperts = 1024;

// Bytes of device workspace route_gpu needs for `num_tokens` tokens (0 for dropless configs, and
// whenever no expert can overflow, i.e. capacity >= num_tokens). Validates like route_gpu. Queries
// CUB's sort size, so it needs a current CUDA device.
size_t router_workspace_bytes(const RouterConfig& config, int64_t num_tokens);

// Routes T tokens from precomputed fp32 logits [T, E] (row-major), bias [E] or null:
//   topk_ids [T, k] int32 (-1 = dropped), topk_weights [T, k] fp32 (0 for dropped entries),
//   tokens_per_expert [E] int32 (after drops), dropped: one int64 (entries dropped by capacity).
// `workspace`: router_workspace_bytes(config, T) bytes, 256-byte aligned (may be null when that
// is 0). Config errors throw InvalidArgument with validate()'s messages (plus
// "num_experts N exceeds the GPU router's limit of 1024"). Unlike route_logits_cpu the data are
// not checked (that needs a host sync): non-finite logits or bias give unspecified ids and weights,
// but the ids stay in [0, E) and nothing is written out of bounds.
// The jitter fields of the config are ignored here (they apply to the logits; router_logits_gpu).
void route_gpu(const RouterConfig& config, const float* logits, int64_t num_tokens, const float* bias,
               int32_t* topk_ids, float* topk_weights, int32_t* tokens_per_expert, int64_t* dropped,
               void* workspace, void* stream);

// logits [T, E] = (x [T, H] * jitter) @ w_gate [H, E], bit-for-bit router_logits_cpu: products in
// double (exact), summed over h ascending in double, rounded to fp32 once; jitter_factor() per
// element when jitter_eps > 0. A reference-grade fp64 kernel (one thread per logit), meant for
// training-time jitter and for tests, not a fast GEMM (the fast path is a GEMM run by the caller).
void router_logits_gpu(const RouterConfig& config, const float* x, const float* w_gate, int64_t num_tokens,
                       int64_t hidden, float* logits, void* stream);

}  // namespace ccfuse::moe
