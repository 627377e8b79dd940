// reference/tp_ops.h: the TP ops on the CPU reference world, following the GPU tile schedules
// (ccfuse/common/schedule.h) and the signal protocol (ccfuse/comm/epoch.h).
//
// An op object is built once per World (it owns the symmetric buffers and signals, as the GPU op
// will) and then run by every rank thread inside World::run, any number of times. Element type
// T is float or bf16 (bf16 inputs and outputs, fp32 accumulation, fp32 reduction of partials).
//
//   ag_gemm : rank r passes A_r [M/W, K] and B_r [K, N] (row-major); gets C_r [M, N] = AG(A) @ B_r
//             and optionally the gathered A [M, K].
//   gemm_rs : A_r [M, K_r], B_r [K_r, N]; gets C_r [M/W, N] = rows [r*M/W, (r+1)*M/W) of Σ A_r @ B_r.
//   gemm_ar : as gemm_rs; gets C_r [M, N] = Σ A_r @ B_r (reduce-scatter by row band, then all-gather).
// Here K is the local reduction length of each rank (K_r); all ranks use the same K.
#pragma once

#include <cstdint>
#include <memory>

#include "ccfuse/common/dtype.h"
#include "ccfuse/common/schedule.h"
#include "reference/world.h"

namespace ccfuse::ref {

struct TpShape {
  int64_t m = 0, n = 0, k = 0;
};

struct TpConfig {
  int block_m = 64;
  int block_n = 64;
  int64_t chunk_rows = 0;  // rows per transfer chunk (ag_gemm); 0 = block_m
};

// Throws InvalidArgument naming the argument and rule: sizes positive, W divides M, tiles positive.
void validate_tp(const World& world, const TpShape& shape, const TpConfig& config);

template <typename T>
class AgGemm {
 public:
  AgGemm(World& world, TpShape shape, TpConfig config = {});
  ~AgGemm();
  void run(int rank, const T* a_local, const T* b, T* c, T* a_gathered = nullptr);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

template <typename T>
class GemmRs {
 public:
  GemmRs(World& world, TpShape shape, TpConfig config = {});
  ~GemmRs();
  void run(int rank, const T* a, const T* b, T* c_band);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

template <typename T>
class GemmAr {
 public:
  GemmAr(World& world, TpShape shape, TpConfig config = {});
  ~GemmAr();
  void run(int rank, const T* a, const T* b, T* c);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ccfuse::ref
