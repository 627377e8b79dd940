// src/moe/router.cu: the GPU MoE router (ccfuse/moe/router_gpu.h; design in docs/moe-router-gpu.md).
//
// Kernels, in launch order:
//   topk_kernel      one warp per token: scores and selection keys in double exactly as the CPU
//                    reference computes them (softmax's normaliser summed sequentially over the
//                    experts in ascending order), k rounds of a warp argmax under the order
//                    (key desc, id asc), weights normalised in slot order; dropless: a histogram
//                    of the ids; with a capacity: the sort keys of the entries.
//   (capacity only)  a stable CUB radix sort of the entries by expert (by position) or by
//                    (expert, weight desc) (by probability), entry index as value, so that inside
//                    an expert the entries are in (token) order; segment_bounds finds each
//                    expert's segment by binary search and writes the stats; drop_kernel drops
//                    the entries at rank >= capacity in their segment.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/error.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/moe/router_gpu.h"
#include "src/moe/radix_sort.h"
#include "src/moe/sorted_search.cuh"

namespace ccfuse::moe {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFull = 0xffffffffu;

// What the capacity step sorts by (the topk kernel writes the keys when they are non-null).
enum class SortKeys { kNone, kExpert, kExpertWeight };

// One warp per token. EPL = experts per lane (E <= 32 * EPL); expert e lives in lane e % 32,
// register e / 32, so every load of a row is coalesced. KPL = chosen experts kept per lane
// (k <= 32 * KPL; 1 for k <= 32, so that the kept arrays stay in registers).
template <int EPL, int KPL>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    topk_kernel(const float* __restrict__ logits, int64_t num_tokens, int num_experts, int topk, bool softmax,
                bool normalize, const float* __restrict__ bias, int32_t* __restrict__ topk_ids,
                float* __restrict__ topk_weights, int32_t* __restrict__ histogram, SortKeys sort_keys,
                void* __restrict__ keys_out, int32_t* __restrict__ values_out) {
  // Dynamic shared memory: per warp a row of E doubles (softmax), then the histogram [E].
  extern __shared__ __align__(16) unsigned char shared_raw[];
  double* shared_p = reinterpret_cast<double*>(shared_raw);
  int32_t* shared_hist = reinterpret_cast<int32_t*>(shared_raw + size_t(kWarpsPerBlock) * num_experts * sizeof(double));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (histogram != nullptr) {
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) shared_hist[e] = 0;
    __syncthreads();
  }

  for (int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp; t < num_tokens;
       t += int64_t(gridDim.x) * kWarpsPerBlock) {
    const float* row = logits + t * num_experts;
    float logit[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = j * 32 + lane;
      logit[j] = e < num_experts ? __ldg(row + e) : -INFINITY;
    }

    // Scores in double, as the reference: softmax from m = max logit (exact: a max of floats),
    // p_e = exp(l_e - m), Z = sum of p_e with e ascending (one sequential chain, every lane
    // computes the same Z from broadcasts so no rounding differs from the CPU's loop),
    // s_e = p_e / Z. Sigmoid: 1 / (1 + exp(-l_e)). IEEE add/div in double; no FMA can form
    // (no product feeds an add), and __dadd_rn pins the sum regardless.
    double score[EPL];
    if (softmax) {
      float m = logit[0];
#pragma unroll
      for (int j = 1; j < EPL; ++j) m = fmaxf(m, logit[j]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, off));
      const double md = double(m);
#pragma unroll
      for (int j = 0; j < EPL; ++j) score[j] = exp(double(logit[j]) - md);
      // Z in the reference's order (e ascending, one sequential chain): the p values go through
      // this warp's shared-memory row and every lane runs the chain on broadcast 16-byte loads
      // (a shuffle per element costs four times the issue slots).
      double* row_p = shared_p + size_t(warp) * size_t(num_experts);
#pragma unroll
      for (int j = 0; j < EPL; ++j)
        if (j * 32 + lane < num_experts) row_p[j * 32 + lane] = score[j];
      __syncwarp();
      double z = 0;
      int e = 0;
      if ((reinterpret_cast<uintptr_t>(row_p) & 15) == 0)
        for (; e + 1 < num_experts; e += 2) {
          const double2 two = *reinterpret_cast<const double2*>(row_p + e);
          z = __dadd_rn(z, two.x);
          z = __dadd_rn(z, two.y);
        }
      for (; e < num_experts; ++e) z = __dadd_rn(z, row_p[e]);
      __syncwarp();  // the row is rewritten by the next token
#pragma unroll
      for (int j = 0; j < EPL; ++j) score[j] = __ddiv_rn(score[j], z);
    } else {
#pragma unroll
      for (int j = 0; j < EPL; ++j) score[j] = __ddiv_rn(1.0, __dadd_rn(1.0, exp(-double(logit[j]))));
    }

    // Selection keys: score + bias (double). Lanes past E and NaN keys (non-finite input, which
    // the CPU rejects) get -inf so that every chosen id is a real expert.
    double key[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = j * 32 + lane;
      double k = -INFINITY;
      if (e < num_experts) {
        k = __dadd_rn(score[j], bias != nullptr ? double(__ldg(bias + e)) : 0.0);
        if (k != k) k = -INFINITY;
        k = __dadd_rn(k, 0.0);  // -0 -> +0 (never arises from score + bias; keeps the integer map exact)
      }
      key[j] = k;
    }

    // k rounds; round r picks the best entry strictly after round r-1's winner in the order
    // (key desc, id asc), so nothing needs marking. The butterfly leaves the winner in every lane.
    // Lane r % 32 keeps round r's winner in register r / 32 (k <= 32 * KPL).
    int32_t kept_id[KPL];
    double kept_score[KPL];
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
      kept_id[j] = 0;
      kept_score[j] = 0;
    }
    // Keys as order-preserving uint64 (larger double <-> larger integer; keys are never -0 or
    // NaN here), so that a round's warp argmax is three single-instruction reductions: max of the
    // high words, max of the low words among those, min id among the lanes holding that key.
    uint64_t ukey[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const uint64_t b = uint64_t(__double_as_longlong(key[j]));
      ukey[j] = (b >> 63) != 0 ? ~b : (b | (uint64_t(1) << 63));
    }
    uint64_t prev_key = ~uint64_t(0);  // above every real key (NaN patterns never occur)
    unsigned prev_id = 0xffffffffu;     // with prev_key = max: "before everything"
    bool first = true;
    double slot_sum = 0;  // the chosen scores in slot order, as the reference's normaliser
    for (int r = 0; r < topk; ++r) {
      uint64_t best_key = 0;  // below every real key (-inf maps to 0x000f...)
      unsigned best_id = 0xffffffffu;
      double best_score = 0;
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        const unsigned e = unsigned(j * 32 + lane);
        const bool after = first || ukey[j] < prev_key || (ukey[j] == prev_key && e > prev_id);
        if (e < unsigned(num_experts) && after && ukey[j] > best_key) {  // j ascending: ties keep the lower id
          best_key = ukey[j];
          best_id = e;
          best_score = score[j];
        }
      }
      const unsigned hi = __reduce_max_sync(kFull, unsigned(best_key >> 32));
      const unsigned lo = __reduce_max_sync(kFull, unsigned(best_key >> 32) == hi ? unsigned(best_key) : 0u);
      const uint64_t win_key = (uint64_t(hi) << 32) | lo;
      const unsigned win_id = __reduce_min_sync(kFull, best_key == win_key ? best_id : 0xffffffffu);
      // The winner is lane win_id % 32's own best: its score comes along in one shuffle.
      const double win_score = __shfl_sync(kFull, best_score, int(win_id & 31));
      prev_key = win_key;
      prev_id = win_id;
      first = false;
      slot_sum = __dadd_rn(slot_sum, win_score);
      if (lane == (r & 31)) {
#pragma unroll
        for (int j = 0; j < KPL; ++j)
          if (j == (r >> 5)) {
            kept_id[j] = int32_t(win_id);
            kept_score[j] = win_score;
          }
      }
    }

    // Weights: the unbiased scores, / their slot-order sum with normalize; 1/k if that sum is 0.
    double norm = 1.0;
    if (normalize) norm = slot_sum > 0 ? slot_sum : 0.0;
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
      const int s = j * 32 + lane;
      if (s < topk) {
        const double w = norm > 0 ? __ddiv_rn(kept_score[j], norm) : __ddiv_rn(1.0, double(topk));
        const int64_t entry = t * topk + s;
        const float wf = __double2float_rn(w);
        topk_ids[entry] = kept_id[j];
        topk_weights[entry] = wf;
        if (histogram != nullptr) atomicAdd(&shared_hist[kept_id[j]], 1);
        if (sort_keys == SortKeys::kExpert) {
          static_cast<uint32_t*>(keys_out)[entry] = uint32_t(kept_id[j]);
          values_out[entry] = int32_t(entry);
        } else if (sort_keys == SortKeys::kExpertWeight) {
          // Ascending sort of (expert, ~weight bits): weight descending inside an expert (the
          // weights are >= 0, whose fp32 bit patterns order like the values); stable, so equal
          // weights keep entry (= token) order: the lower token stays, as in the reference.
          static_cast<uint64_t*>(keys_out)[entry] = (uint64_t(uint32_t(kept_id[j])) << 32) | uint64_t(~__float_as_uint(wf));
          values_out[entry] = int32_t(entry);
        }
      }
    }
  }

  if (histogram != nullptr) {
    __syncthreads();
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
      if (shared_hist[e] != 0) atomicAdd(&histogram[e], shared_hist[e]);
  }
}


// One thread per expert e in [0, E]: start[e] = first sorted position of expert e (start[E] = n),
// and for e < E the stats: tokens_per_expert = min(count, capacity), dropped += the excess.
template <typename Key>
__global__ void segment_bounds(const Key* __restrict__ sorted_keys, int64_t n, int num_experts, int shift,
                               int64_t capacity, int64_t* __restrict__ start, int32_t* __restrict__ tokens_per_expert,
                               int64_t* __restrict__ dropped) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e > num_experts) return;
  start[e] = detail::lower_bound(sorted_keys, n, Key(Key(e) << shift));
  if (e == num_experts) return;
  const int64_t count = detail::lower_bound(sorted_keys, n, Key(Key(e + 1) << shift)) - start[e];
  tokens_per_expert[e] = int32_t(count < capacity ? count : capacity);
  if (count > capacity) atomicAdd(reinterpret_cast<unsigned long long*>(dropped), (unsigned long long)(count - capacity));
}

// One thread per sorted position: an entry at rank >= capacity in its expert's segment is dropped.
template <typename Key>
__global__ void drop_kernel(const Key* __restrict__ sorted_keys, const int32_t* __restrict__ sorted_entries, int64_t n,
                            int shift, const int64_t* __restrict__ start, int64_t capacity, int32_t* __restrict__ topk_ids,
                            float* __restrict__ topk_weights) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const int e = int(sorted_keys[p] >> shift);
  if (p - start[e] >= capacity) {
    const int32_t entry = sorted_entries[p];
    topk_ids[entry] = -1;
    topk_weights[entry] = 0.0f;
  }
}

// The router's logits, bit-exact with router_logits_cpu: one thread per (t, e), h ascending.
__global__ void logits_kernel(const float* __restrict__ x, const float* __restrict__ w_gate, int64_t num_tokens,
                              int64_t hidden, int num_experts, float eps, uint64_t seed, float* __restrict__ logits) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t t = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (e >= num_experts || t >= num_tokens) return;
  const float* xrow = x + t * hidden;
  double acc = 0;
  for (int64_t h = 0; h < hidden; ++h) {
    float v = __ldg(xrow + h);
    if (eps > 0) {
      // jitter_factor(): splitmix64 output number i = t * H + h, 24 bits -> [0, 1), one fmaf.
      uint64_t z = seed + (uint64_t(t * hidden + h) + 1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float r = __fmul_rn(float(z >> 40), 0x1p-24f);
      v = __fmul_rn(v, fmaf(2.0f * eps, r, 1.0f - eps));
    }
    // The fp32 x fp32 product is exact in double, so a fused multiply-add rounds exactly as the
    // reference's separate multiply and add.
    acc = fma(double(v), double(__ldg(w_gate + h * num_experts + e)), acc);
  }
  logits[t * num_experts + e] = __double2float_rn(acc);
}

struct Plan {
  int64_t entries = 0, capacity = 0;
  bool sorted = false;  // a capacity that can bind: the sort path
  bool wide = false;    // by probability: 64-bit keys
  int end_bit = 0, shift = 0;
  size_t keys_in = 0, keys_out = 0, values_in = 0, values_out = 0, start = 0, temp = 0, temp_bytes = 0, total = 0;
};

void check_config(const RouterConfig& config, int64_t num_tokens) {
  validate(config);
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
  CCFUSE_ARG_CHECK(config.num_experts <= kGpuRouterMaxExperts, "num_experts ", config.num_experts,
                   " exceeds the GPU router's limit of ", kGpuRouterMaxExperts);
  CCFUSE_ARG_CHECK(num_tokens <= INT32_MAX / config.topk, "num_tokens * topk = ", num_tokens, " * ", config.topk,
                   " exceeds INT32_MAX");
}

Plan make_plan(const RouterConfig& config, int64_t num_tokens) {
  check_config(config, num_tokens);
  Plan p;
  p.entries = num_tokens * config.topk;
  p.capacity = expert_capacity(config, num_tokens);
  // An expert gets at most one entry per token, so a capacity >= T never drops (expert_capacity
  // clamps to T): that is the dropless path too.
  p.sorted = config.capacity_factor > 0 && p.capacity < num_tokens && num_tokens > 0;
  if (!p.sorted) return p;
  p.wide = config.drop == DropPolicy::kByProbability;
  const int expert_bits = detail::bits_for(uint64_t(config.num_experts - 1));
  p.shift = p.wide ? 32 : 0;
  p.end_bit = p.shift + expert_bits;
  const size_t key_size = p.wide ? 8 : 4;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = detail::align256(off + bytes);
    return at;
  };
  const size_t n = size_t(p.entries);
  p.keys_in = take(n * key_size);
  p.keys_out = take(n * key_size);
  p.values_in = take(n * 4);
  p.values_out = take(n * 4);
  p.start = take(size_t(config.num_experts + 1) * 8);
  p.temp_bytes = p.wide ? detail::radix_sort_pairs(nullptr, 0, static_cast<const uint64_t*>(nullptr), nullptr,
                                                   nullptr, nullptr, p.entries, p.end_bit, nullptr)
                        : detail::radix_sort_pairs(nullptr, 0, static_cast<const uint32_t*>(nullptr), nullptr,
                                                   nullptr, nullptr, p.entries, p.end_bit, nullptr);
  p.temp = take(p.temp_bytes);
  p.total = off;
  return p;
}

template <int EPL, int KPL>
void launch_topk_k(const RouterConfig& c, const float* logits, int64_t num_tokens, const float* bias, int32_t* ids,
                 float* weights, int32_t* hist, SortKeys sk, void* keys, int32_t* values, cudaStream_t s) {
  const int64_t blocks_needed = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // Enough blocks to fill the GPU several times over; warps loop over the remaining tokens.
  const int64_t blocks = std::min<int64_t>(blocks_needed, int64_t(gemm::current_device_sms()) * 16);
  // The selection order is the reference's (KeyGreater): higher key first, equal keys: lower id.
  const size_t smem = size_t(kWarpsPerBlock) * size_t(c.num_experts) * sizeof(double) +
                      (hist != nullptr ? size_t(c.num_experts) * sizeof(int32_t) : 0);
  CCFUSE_CUDA_CHECK(cudaFuncSetAttribute(topk_kernel<EPL, KPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  topk_kernel<EPL, KPL><<<unsigned(blocks), kWarpsPerBlock * 32, smem, s>>>(
      logits, num_tokens, c.num_experts, c.topk, c.score == ScoreFn::kSoftmax, c.normalize, bias, ids, weights, hist,
      sk, keys, values);
  CCFUSE_CUDA_CHECK_LAUNCH();
}

template <int EPL>
void launch_topk(const RouterConfig& c, const float* logits, int64_t num_tokens, const float* bias, int32_t* ids,
                 float* weights, int32_t* hist, SortKeys sk, void* keys, int32_t* values, cudaStream_t s) {
  if (c.topk <= 32) launch_topk_k<EPL, 1>(c, logits, num_tokens, bias, ids, weights, hist, sk, keys, values, s);
  else if constexpr (EPL > 1) launch_topk_k<EPL, EPL>(c, logits, num_tokens, bias, ids, weights, hist, sk, keys, values, s);
}

}  // namespace

size_t router_workspace_bytes(const RouterConfig& config, int64_t num_tokens) {
  return make_plan(config, num_tokens).total;
}

void route_gpu(const RouterConfig& config, const float* logits, int64_t num_tokens, const float* bias,
               int32_t* topk_ids, float* topk_weights, int32_t* tokens_per_expert, int64_t* dropped,
               void* workspace, void* stream) {
  const Plan p = make_plan(config, num_tokens);
  CCFUSE_ARG_CHECK(tokens_per_expert != nullptr, "tokens_per_expert must not be null");
  CCFUSE_ARG_CHECK(dropped != nullptr, "dropped must not be null");
  if (num_tokens > 0) {
    CCFUSE_ARG_CHECK(logits != nullptr, "logits must not be null");
    CCFUSE_ARG_CHECK(topk_ids != nullptr, "topk_ids must not be null");
    CCFUSE_ARG_CHECK(topk_weights != nullptr, "topk_weights must not be null");
  }
  if (p.total > 0) {
    CCFUSE_ARG_CHECK(workspace != nullptr, "workspace must not be null (router_workspace_bytes = ", p.total, ")");
    CCFUSE_ARG_CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace must be 256-byte aligned");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int E = config.num_experts;
  CCFUSE_CUDA_CHECK(cudaMemsetAsync(dropped, 0, sizeof(int64_t), s));
  if (!p.sorted) CCFUSE_CUDA_CHECK(cudaMemsetAsync(tokens_per_expert, 0, size_t(E) * sizeof(int32_t), s));
  if (num_tokens == 0) return;

  char* ws = static_cast<char*>(workspace);
  int32_t* hist = p.sorted ? nullptr : tokens_per_expert;
  const SortKeys sk = !p.sorted ? SortKeys::kNone : (p.wide ? SortKeys::kExpertWeight : SortKeys::kExpert);
  void* keys_in = p.sorted ? ws + p.keys_in : nullptr;
  int32_t* values_in = p.sorted ? reinterpret_cast<int32_t*>(ws + p.values_in) : nullptr;
  const int epl = (E + 31) / 32;
  if (epl <= 1) launch_topk<1>(config, logits, num_tokens, bias, topk_ids, topk_weights, hist, sk, keys_in, values_in, s);
  else if (epl <= 2) launch_topk<2>(config, logits, num_tokens, bias, topk_ids, topk_weights, hist, sk, keys_in, values_in, s);
  else if (epl <= 4) launch_topk<4>(config, logits, num_tokens, bias, topk_ids, topk_weights, hist, sk, keys_in, values_in, s);
  else if (epl <= 8) launch_topk<8>(config, logits, num_tokens, bias, topk_ids, topk_weights, hist, sk, keys_in, values_in, s);
  else if (epl <= 16) launch_topk<16>(config, logits, num_tokens, bias, topk_ids, topk_weights, hist, sk, keys_in, values_in, s);
  else launch_topk<32>(config, logits, num_tokens, bias, topk_ids, topk_weights, hist, sk, keys_in, values_in, s);
  if (!p.sorted) return;

  int32_t* values_out = reinterpret_cast<int32_t*>(ws + p.values_out);
  int64_t* start = reinterpret_cast<int64_t*>(ws + p.start);
  const unsigned bound_blocks = unsigned((E + 1 + 255) / 256);
  const unsigned drop_blocks = unsigned((p.entries + 255) / 256);
  if (p.wide) {
    const uint64_t* kin = reinterpret_cast<const uint64_t*>(ws + p.keys_in);
    uint64_t* kout = reinterpret_cast<uint64_t*>(ws + p.keys_out);
    detail::radix_sort_pairs(ws + p.temp, p.temp_bytes, kin, kout, values_in, values_out, p.entries, p.end_bit, stream);
    segment_bounds<<<bound_blocks, 256, 0, s>>>(kout, p.entries, E, p.shift, p.capacity, start, tokens_per_expert,
                                                dropped);
    CCFUSE_CUDA_CHECK_LAUNCH();
    drop_kernel<<<drop_blocks, 256, 0, s>>>(kout, values_out, p.entries, p.shift, start, p.capacity, topk_ids,
                                            topk_weights);
  } else {
    const uint32_t* kin = reinterpret_cast<const uint32_t*>(ws + p.keys_in);
    uint32_t* kout = reinterpret_cast<uint32_t*>(ws + p.keys_out);
    detail::radix_sort_pairs(ws + p.temp, p.temp_bytes, kin, kout, values_in, values_out, p.entries, p.end_bit, stream);
    segment_bounds<<<bound_blocks, 256, 0, s>>>(kout, p.entries, E, p.shift, p.capacity, start, tokens_per_expert,
                                                dropped);
    CCFUSE_CUDA_CHECK_LAUNCH();
    drop_kernel<<<drop_blocks, 256, 0, s>>>(kout, values_out, p.entries, p.shift, start, p.capacity, topk_ids,
                                            topk_weights);
  }
  CCFUSE_CUDA_CHECK_LAUNCH();
}

void router_logits_gpu(const RouterConfig& config, const float* x, const float* w_gate, int64_t num_tokens,
                       int64_t hidden, float* logits, void* stream) {
  validate(config);
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must be >= 0");
  CCFUSE_ARG_CHECK(hidden >= 1, "hidden ", hidden, " must be at least 1");
  if (num_tokens == 0) return;
  CCFUSE_ARG_CHECK(x != nullptr, "x must not be null");
  CCFUSE_ARG_CHECK(w_gate != nullptr, "w_gate must not be null");
  CCFUSE_ARG_CHECK(logits != nullptr, "logits must not be null");
  const int E = config.num_experts;
  const unsigned threads = unsigned(std::min(E, 256));
  const int64_t y = std::min<int64_t>(num_tokens, 65535);
  const int64_t z = (num_tokens + y - 1) / y;
  CCFUSE_ARG_CHECK(z <= 65535, "num_tokens ", num_tokens, " is too large for router_logits_gpu");
  const dim3 grid(unsigned((E + threads - 1) / threads), unsigned(y), unsigned(z));
  logits_kernel<<<grid, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, w_gate, num_tokens, hidden, E, config.jitter_eps, config.jitter_seed, logits);
  CCFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace ccfuse::moe
