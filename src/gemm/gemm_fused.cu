// Fused epilogues of the GEMM engine (activation, per-row scale): bf16, cluster 1.
// A separate translation unit so that its kernels compile in parallel with gemm.cu's.
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/gemm/sm90_gemm.cuh"

namespace ccfuse::gemm {

namespace {

template <class Traits, sm90::Activation kAct, bool kScale>
void launch_fused(const GemmDesc& d, const GemmConfig& cfg, const float* scale, const void* a, const void* b, void* c,
                  cudaStream_t s) {
  const auto sched = sm90::plain_schedule(d.m, d.n, cfg.block_m, cfg.block_n, cfg.group_m,
                                          cfg.order == TileOrder::kColumnMajor);
  sm90::ActivationEpilogue<kAct, kScale> epi;
  epi.scale = scale;
  const int sms = cfg.num_sms > 0 ? cfg.num_sms : current_device_sms();
  const int64_t lda = d.lda ? d.lda : d.k;
  const int64_t ldb = d.ldb ? d.ldb : (d.b_layout == BLayout::kKN ? d.n : d.k);
  const int64_t out_n = kAct == sm90::Activation::kSiluMul ? d.n / 2 : d.n;
  const int64_t ldc = d.ldc ? d.ldc : out_n;
  sm90::launch_gemm<Traits>(d.m, d.n, d.k, a, lda, b, ldb, c, ldc, sched, epi, sms, s);
}

template <class Traits>
void dispatch_epilogue(const GemmDesc& d, const GemmConfig& cfg, const EpilogueDesc& e, const void* a, const void* b,
                       void* c, cudaStream_t s) {
  using A = sm90::Activation;
  const bool scaled = e.row_scale != nullptr;
  switch (e.op) {
    case EpilogueOp::kNone:
      if (scaled) launch_fused<Traits, A::kNone, true>(d, cfg, e.row_scale, a, b, c, s);
      else launch_fused<Traits, A::kNone, false>(d, cfg, nullptr, a, b, c, s);
      break;
    case EpilogueOp::kGelu:
      if (scaled) launch_fused<Traits, A::kGelu, true>(d, cfg, e.row_scale, a, b, c, s);
      else launch_fused<Traits, A::kGelu, false>(d, cfg, nullptr, a, b, c, s);
      break;
    case EpilogueOp::kSiluMul:
      if (scaled) launch_fused<Traits, A::kSiluMul, true>(d, cfg, e.row_scale, a, b, c, s);
      else launch_fused<Traits, A::kSiluMul, false>(d, cfg, nullptr, a, b, c, s);
      break;
  }
}

}  // namespace

void run_fused(const GemmDesc& d, const GemmConfig& cfg, const EpilogueDesc& e, const void* a, const void* b, void* c,
               void* stream) {
  CCFUSE_ARG_CHECK(d.dtype == DType::kBFloat16, "fused epilogues are built for bf16, not ", dtype_name(d.dtype));
  CCFUSE_ARG_CHECK(cfg.cluster_m == 1, "fused epilogues are built for cluster_m 1, not ", cfg.cluster_m);
  CCFUSE_ARG_CHECK(!cfg.tma_store, "fused epilogues store from registers: tma_store must be off");
  CCFUSE_ARG_CHECK(cfg.split_k == 1, "fused epilogues need whole tiles: split_k must be 1, not ", cfg.split_k);
  CCFUSE_ARG_CHECK(!cfg.stream_k, "fused epilogues need whole tiles: stream_k must be off");
  GemmDesc check = d;
  if (e.op == EpilogueOp::kSiluMul) {
    CCFUSE_ARG_CHECK(d.n % cfg.block_n == 0, "SwiGLU needs n (2 * ffn) ", d.n, " to be a multiple of block_n ",
                     cfg.block_n, " (gate and up halves of every tile)");
    const int64_t out_ldc = d.ldc ? d.ldc : d.n / 2;
    CCFUSE_ARG_CHECK(out_ldc >= d.n / 2, "ldc ", out_ldc, " must be at least n / 2 = ", d.n / 2, " (SwiGLU output)");
    check.ldc = 0;  // the GEMM's own shape rules; the output's stride was checked above
  }
  validate(check, cfg);
  for (auto [ptr, name] : {std::pair<const void*, const char*>{a, "A"}, {b, "B"}, {c, "C"}})
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, name, " (", ptr, ") must be 16-byte aligned (TMA)");
  auto s = static_cast<cudaStream_t>(stream);
  using E = cutlass::bfloat16_t;
  const bool nk = d.b_layout == BLayout::kNK;
  if (cfg.block_n == 256) {
    if (nk) dispatch_epilogue<sm90::Traits<E, 128, 256, 64, 4, true>>(d, cfg, e, a, b, c, s);
    else dispatch_epilogue<sm90::Traits<E, 128, 256, 64, 4, false>>(d, cfg, e, a, b, c, s);
  } else {
    if (nk) dispatch_epilogue<sm90::Traits<E, 128, 128, 64, 6, true>>(d, cfg, e, a, b, c, s);
    else dispatch_epilogue<sm90::Traits<E, 128, 128, 64, 6, false>>(d, cfg, e, a, b, c, s);
  }
}

std::vector<int64_t> swiglu_column_permutation(int64_t ffn, int block_n) {
  CCFUSE_ARG_CHECK(block_n > 0 && block_n % 2 == 0, "block_n ", block_n, " must be positive and even");
  const int64_t half = block_n / 2;
  CCFUSE_ARG_CHECK(ffn > 0 && ffn % half == 0, "ffn ", ffn, " must be a positive multiple of block_n / 2 = ", half);
  std::vector<int64_t> perm(size_t(2 * ffn));
  for (int64_t i = 0; i < 2 * ffn; ++i) {
    const int64_t tile = i / block_n, c = i % block_n;
    perm[size_t(i)] = c < half ? tile * half + c : ffn + tile * half + (c - half);
  }
  return perm;
}

}  // namespace ccfuse::gemm
