// src/tp/tile_copy.cuh: the copies of the fused TP ops' send warps (internal).
// The destination is usually a peer's symmetric buffer over NVLink: 16-byte stores, several loads
// in flight per thread before their stores, few registers (the send warps run with 56).
#pragma once

#include <cstdint>

#include "ccfuse/common/hd.h"

namespace ccfuse::tp {

// Copies a rows x cols tile (row strides ld_from, ld_to in elements) with `num_threads` threads:
// with 16-byte aligned rows, thread t owns one 16-byte column of rows t / per_row, + step, ... and
// keeps four loads in flight before their stores; otherwise element by element.
template <class Element>
__device__ __forceinline__ void copy_tile(const Element* from, int64_t ld_from, Element* to, int64_t ld_to,
                                          int64_t rows, int64_t cols, int tid, int num_threads) {
  const int64_t per_row = cols / 8;
  const bool vec = cols % 8 == 0 && ld_from % 8 == 0 && ld_to % 8 == 0 && per_row <= num_threads &&
                   (reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to)) % 16 == 0;
  if (!vec) {
    for (int64_t i = tid; i < rows * cols; i += num_threads) to[(i / cols) * ld_to + i % cols] = from[(i / cols) * ld_from + i % cols];
    return;
  }
  const int rows_step = num_threads / int(per_row);
  if (tid >= rows_step * per_row) return;
  int64_t r = tid / per_row;
  const int4* src = reinterpret_cast<const int4*>(from + r * ld_from) + tid % per_row;
  int4* dst = reinterpret_cast<int4*>(to + r * ld_to) + tid % per_row;
  const int64_t src_step = rows_step * ld_from / 8, dst_step = rows_step * ld_to / 8;
  for (; r + 3 * rows_step < rows; r += 4 * rows_step, src += 4 * src_step, dst += 4 * dst_step) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = src[u * src_step];
#pragma unroll
    for (int u = 0; u < 4; ++u) dst[u * dst_step] = v[u];
  }
  for (; r < rows; r += rows_step, src += src_step, dst += dst_step) *dst = *src;
}

// Copies `bytes` contiguous bytes (both ends 16-byte aligned, bytes a multiple of 16) with
// `num_threads` threads.
__device__ __forceinline__ void copy_contiguous(const void* from, void* to, int64_t bytes, int tid, int num_threads) {
  const int4* src = static_cast<const int4*>(from);
  int4* dst = static_cast<int4*>(to);
  const int64_t total = bytes / 16;
  int64_t i = tid;
  for (; i + 3 * num_threads < total; i += 4 * num_threads) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = src[i + u * num_threads];
#pragma unroll
    for (int u = 0; u < 4; ++u) dst[i + u * num_threads] = v[u];
  }
  for (; i < total; i += num_threads) dst[i] = src[i];
}

}  // namespace ccfuse::tp
