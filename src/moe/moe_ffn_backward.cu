// MoeFfnBackward (ccfuse/moe/moe_ffn.h): the MoE FFN's backward from the forward's fused layers,
// their roles swapped (docs/moe-layers.md, "The backward pass").
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/ranges.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/moe/moe_ffn.h"

namespace ccfuse::moe {

namespace {

constexpr int kRowThreads = 256;
constexpr int kVec = 8;  // bf16 columns per 16-byte access

gemm::BLayout flipped(gemm::BLayout b) { return b == gemm::BLayout::kNK ? gemm::BLayout::kKN : gemm::BLayout::kNK; }

struct Bf16x8 {
  __nv_bfloat162 v[4];
};

__device__ inline void load8(const __nv_bfloat16* p, float (&f)[kVec]) {
  const Bf16x8 x = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(x.v[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ inline void store8(__nv_bfloat16* p, const float (&f)[kVec]) {
  Bf16x8 x;
#pragma unroll
  for (int i = 0; i < 4; ++i) x.v[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<Bf16x8*>(p) = x;
}

// Per received row r < row_prefix[groups] (one block a row, grid-stride): from h (layer 0's
// pre-activation, [rows, L] with L = 2F for SwiGLU, F otherwise), u = g W2^T ([rows, F]) and the
// router weight p: a = act(h) rounded to bf16 (as the forward rounds it between the layers),
// dp[r] = <u, a> (fp32), d h = act'(h, p u) into dh, p a into u. h is the forward's kept copy
// h_kept (always in its tile order) when there is one and this call's rows fit in its kept_rows,
// else dh itself (recomputed in step 1, in w1's order: tiles_w1), updated in place. SwiGLU's gate
// column j is column j (tile order false: gate rows then up rows) or (j / 128) * 256 + j % 128
// (true: the forward's swiglu_column_permutation order); up's is F + j, or that + 128; dh in w1's
// order (kDstTiles = tiles_w1).
template <bool kSwiglu, bool kDstTiles>
__global__ void __launch_bounds__(kRowThreads) act_backward_kernel(const __nv_bfloat16* h_kept, int64_t kept_rows,
                                                                   __nv_bfloat16* dh, __nv_bfloat16* u, const float* p,
                                                                   const int64_t* row_prefix, int groups, int64_t ffn,
                                                                   float* dp) {
  __shared__ float partial[kRowThreads / 32];
  const int64_t rows = row_prefix[groups];
  const bool kept = h_kept != nullptr && rows <= kept_rows;  // else step 1 recomputed h into dh
  const __nv_bfloat16* h = kept ? h_kept : dh;
  const bool src_tiles = kept || kDstTiles;
  (void)src_tiles;  // SwiGLU's column order only
  const int64_t l = kSwiglu ? 2 * ffn : ffn;
  const auto gate_col = [](int64_t j, bool tiles) { return tiles ? (j / 128) * 256 + j % 128 : j; };
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const __nv_bfloat16* hr = h + r * l;
    __nv_bfloat16* dhr = dh + r * l;
    __nv_bfloat16* ur = u + r * ffn;
    const float pr = p[r];
    float acc = 0.f;
    for (int64_t j = int64_t(threadIdx.x) * kVec; j < ffn; j += int64_t(kRowThreads) * kVec) {
      float uu[kVec], out_u[kVec];
      load8(ur + j, uu);
      if constexpr (kSwiglu) {
        const int64_t gc = gate_col(j, src_tiles), uc = src_tiles ? gc + 128 : ffn + j;
        const int64_t gd = gate_col(j, kDstTiles), ud = kDstTiles ? gd + 128 : ffn + j;
        float gt[kVec], up[kVec], dg[kVec], du[kVec];
        load8(hr + gc, gt);
        load8(hr + uc, up);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float s = 1.f / (1.f + __expf(-gt[i]));
          const float silu = gt[i] * s;
          const float a = __bfloat162float(__float2bfloat16_rn(silu * up[i]));
          acc += uu[i] * a;
          const float da = pr * uu[i];
          dg[i] = da * up[i] * s * (1.f + gt[i] * (1.f - s));
          du[i] = da * silu;
          out_u[i] = pr * a;
        }
        store8(dhr + gd, dg);
        store8(dhr + ud, du);
      } else {
        float a[kVec], d[kVec];
        load8(hr + j, a);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          acc += uu[i] * a[i];
          d[i] = pr * uu[i];
          out_u[i] = pr * a[i];
        }
        store8(dhr + j, d);
      }
      store8(ur + j, out_u);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.f;
      for (int w = 0; w < kRowThreads / 32; ++w) sum += partial[w];
      dp[r] = sum;
    }
    __syncthreads();
  }
}

struct DpPeers {
  float* p[kMaxMoeRanks];
};

// Each received row's d topk_w to its token's owner: row_src[r] = (source rank, entry = token * k
// + slot), the owner's symmetric [max_tokens * k] floats. Every entry lives on one row of one
// rank, so the stores never collide. A system fence before the barrier that follows.
__global__ void dp_scatter_kernel(const int2* row_src, const int64_t* row_prefix, int groups, const float* dp,
                                  DpPeers peers) {
  const int64_t rows = row_prefix[groups];
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int2 se = row_src[r];
    peers.p[se.x][se.y] = dp[r];
  }
  __threadfence_system();
}

}  // namespace

struct MoeFfnBackward::State {
  comm::Team& team;
  MoeFfnDesc desc;
  bool tiles = false;
  std::unique_ptr<MoeFfn> fwd;  // layer 0: h = x W1 (N = 2F, no activation); layer 1: d x = d h W1^T
  std::unique_ptr<MoeFfn> bwd;  // layer 0: u = g W2^T (N = F); its layer 1 never runs
  std::unique_ptr<comm::SymmetricBuffer> dtw;  // [max_tokens * k] floats: d topk_w, by entry
  DpPeers dtw_peers{};
  float* ones = nullptr;  // [max_tokens * k] router weights 1 (the first FFN's)
  float* dp = nullptr;    // [max_rows] d topk_w by received row
  State(comm::Team& t, const MoeFfnDesc& d) : team(t), desc(d) {}
  ~State() {
    cudaFree(ones);
    cudaFree(dp);
  }
};

MoeFfnBackward::MoeFfnBackward(comm::Team& team, const MoeFfnDesc& d, bool w1_swiglu_tiles, MoeFfnConfig cfg)
    : s_(new State(team, d)) {
  CCFUSE_ARG_CHECK(!cfg.gather_rows, "moe_ffn backward: gather_rows leaves no received rows for the weight "
                   "gradients (use the default dispatch)");
  CCFUSE_ARG_CHECK(!d.l1_b_layout.has_value() || *d.l1_b_layout == d.b_layout,
                   "moe_ffn backward: desc.l1_b_layout must be unset (the forward's layers share one layout)");
  CCFUSE_ARG_CHECK(!w1_swiglu_tiles || d.swiglu, "w1_swiglu_tiles needs swiglu (the tile order is SwiGLU's)");
  State& s = *s_;
  s.tiles = w1_swiglu_tiles;
  MoeFfnDesc fd = d;  // h = x W1 over all 2F columns, then d x = d h W1^T
  fd.swiglu = false;
  fd.ffn = d.swiglu ? 2 * d.ffn : d.ffn;
  fd.l1_b_layout = flipped(d.b_layout);
  MoeFfnDesc bd = d;  // u = g W2^T
  bd.swiglu = false;
  bd.b_layout = flipped(d.b_layout);
  s.fwd = std::make_unique<MoeFfn>(team, fd, cfg);
  s.bwd = std::make_unique<MoeFfn>(team, bd, cfg);
  const int64_t entries = d.max_tokens * d.topk;
  s.dtw = team.alloc_symmetric(size_t(entries) * sizeof(float));
  for (int r = 0; r < team.world_size(); ++r) s.dtw_peers.p[r] = static_cast<float*>(s.dtw->peer(r));
  CCFUSE_CUDA_CHECK(cudaMalloc(&s.ones, size_t(entries) * sizeof(float)));
  CCFUSE_CUDA_CHECK(cudaMalloc(&s.dp, size_t(s.fwd->max_rows()) * sizeof(float)));
  // From the host (no device-wide sync: in a one-GPU world it would wait for the other ranks' kernels).
  const std::vector<float> ones(static_cast<size_t>(entries), 1.f);
  CCFUSE_CUDA_CHECK(cudaMemcpy(s.ones, ones.data(), size_t(entries) * sizeof(float), cudaMemcpyHostToDevice));
}

MoeFfnBackward::~MoeFfnBackward() = default;

void MoeFfnBackward::run(const void* x, int64_t num_tokens, const int32_t* topk_ids, const float* topk_w,
                         const void* w1, const void* w2, const void* g, void* dx, float* dtopk_w, cudaStream_t stream,
                         const void* h_saved, int64_t h_rows) {
  State& s = *s_;
  const MoeFfnDesc& d = s.desc;
  CCFUSE_ARG_CHECK(w2 != nullptr && reinterpret_cast<uintptr_t>(w2) % 16 == 0,
                   "w2 must be a 16-byte aligned device pointer");
  CCFUSE_ARG_CHECK(h_saved == nullptr || reinterpret_cast<uintptr_t>(h_saved) % 16 == 0,
                   "h_saved must be a 16-byte aligned device pointer (or null: recompute)");
  const int64_t max_rows = s.fwd->max_rows();
  CCFUSE_ARG_CHECK(h_rows >= 0 && h_rows <= max_rows, "h_rows ", h_rows, " must be in [1, max_rows() = ", max_rows,
                   "] (0: max_rows()), the forward's preact_rows");
  if (h_rows == 0) h_rows = max_rows;
  if (num_tokens > 0) {
    for (auto [p, name] : {std::pair<const void*, const char*>{g, "g"}, {dx, "dx"}, {dtopk_w, "dtopk_w"}})
      CCFUSE_ARG_CHECK(p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0, name,
                       " must be a 16-byte aligned device pointer");
    const size_t bytes = size_t(num_tokens * d.hidden) * 2;
    CCFUSE_ARG_CHECK(!bytes_overlap(dx, bytes, g, bytes), "dx must not overlap g");
    CCFUSE_ARG_CHECK(x == nullptr || !bytes_overlap(dx, bytes, x, bytes), "dx must not overlap x");
    if (h_saved != nullptr) {
      const size_t h_bytes = size_t(h_rows * (d.swiglu ? 2 * d.ffn : d.ffn)) * 2;
      CCFUSE_ARG_CHECK(!bytes_overlap(dx, bytes, h_saved, h_bytes), "dx must not overlap h_saved");
    }
  }
  // 1, 2: both dispatches and their GEMMs (the same routing: the same receive order); with
  // h_saved x's dispatch alone (its rows for d W1), its GEMM too where the rows exceed h_rows
  // (the forward kept only some: decided on the device)
  if (h_saved == nullptr)
    s.fwd->run_layer0(x, num_tokens, topk_ids, s.ones, w1, stream);
  else if (h_rows >= max_rows)
    s.fwd->run_layer0(x, num_tokens, topk_ids, s.ones, w1, stream, nullptr, false);
  else
    s.fwd->run_layer0(x, num_tokens, topk_ids, s.ones, w1, stream, nullptr, true, 0, h_rows);
  s.bwd->run_layer0(g, num_tokens, topk_ids, topk_w, w2, stream);
  // 3: the activation's backward, row by row (h from h_saved where it holds every row)
  const MoeFfn::Layer0View f = s.fwd->layer0_view(), b = s.bwd->layer0_view();
  const int sms = gemm::current_device_sms();
  auto* dh = static_cast<__nv_bfloat16*>(f.out);
  auto* u = static_cast<__nv_bfloat16*>(b.out);
  const int blocks = 8 * sms;
  const auto launch = [&](auto kernel) {
    kernel<<<blocks, kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(h_saved), h_rows, dh, u, b.row_w,
                                               f.row_prefix, f.groups, d.ffn, s.dp);
  };
  if (!d.swiglu)
    launch(act_backward_kernel<false, false>);
  else
    s.tiles ? launch(act_backward_kernel<true, true>) : launch(act_backward_kernel<true, false>);
  CCFUSE_CUDA_CHECK_LAUNCH();
  // 4: d x, combined at the owners (weights 1: the first FFN's row weights)
  s.fwd->run_layer1(num_tokens, topk_ids, w1, dx, stream);
  // 5: d topk_w to the owners: zero this rank's slots, barrier, scatter, barrier, copy out
  const int64_t mine = num_tokens * d.topk;
  if (mine > 0) CCFUSE_CUDA_CHECK(cudaMemsetAsync(s.dtw->local(), 0, size_t(mine) * sizeof(float), stream));
  s.team.barrier(stream);
  dp_scatter_kernel<<<2 * sms, 256, 0, stream>>>(reinterpret_cast<const int2*>(f.row_src), f.row_prefix, f.groups,
                                                 s.dp, s.dtw_peers);
  CCFUSE_CUDA_CHECK_LAUNCH();
  s.team.barrier(stream);
  if (mine > 0)
    CCFUSE_CUDA_CHECK(cudaMemcpyAsync(dtopk_w, s.dtw->local(), size_t(mine) * sizeof(float), cudaMemcpyDeviceToDevice,
                                      stream));
}

MoeWgradOperands MoeFfnBackward::wgrad_operands() const {
  MoeWgradOperands o;
  o.x_rows = s_->fwd->layer0_input();
  o.dh_rows = s_->fwd->layer0_output();
  o.g_rows = s_->bwd->layer0_input();
  o.pa_rows = s_->bwd->layer0_output();
  o.expert_rows = s_->fwd->expert_rows_device();
  o.row_src = s_->fwd->layer0_view().row_src;
  o.max_rows = s_->fwd->max_rows();
  return o;
}

}  // namespace ccfuse::moe
