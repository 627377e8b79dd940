// reference/moe_layers.cpp: the two MoE layers on the CPU reference world (DESIGN §1, §2.1, §2.2).
//
// The schedule and the signal protocol are the GPU's, step by step (as tp_ops.cpp does for TP):
//   - every call starts with the entry barrier, then takes this call's epoch from each of its
//     SignalArrays (they all advance once per call on every rank, so their epochs stay equal);
//   - data is written into a peer's symmetric buffer first, then the flag is release-stored;
//   - a consumer acquire-waits on every flag guarding what it reads, its own rank's included;
//   - every rank pushes everything it produces before it waits for anything, so no wait can
//     form a cycle (on the GPU the push and the wait run on different SMs at the same time).
//
// Layer 0 (dispatch + expert GEMM), on rank r:
//   1. For each destination d (rotated, r first): the send list (kAllGather: all of r's tokens;
//      kAllToAll: the tokens with at least one expert on d, deduplicated per destination), its
//      count, each token's top-k ids and weights and its index on r go into region r of d's
//      receive buffers; then routing_ready[d][r]. This is the small metadata transfer: the
//      expert-sorted layout needs the routing of every token it covers before its first row.
//   2. The token rows, chunk-major (chunk c to every destination before chunk c + 1), each chunk
//      followed by chunk_ready[d][r * max_chunks + c].
//   3. Wait for every source's routing, lay the received entries of local experts out with
//      make_layout (local source first), fill the metadata.
//   4. Tiles of block_m rows of each expert in layout order; a tile waits for the chunks that
//      hold its rows, then act = X_rows @ W1_e (fp32 accumulation; SwiGLU in fp32), rounded to T.
// Layer 1 (expert GEMM + combine), on rank r, column-major over experts (DESIGN §2.1):
//   1. For each owner o (staggered, r + 1 first): the list of o's tokens that r received in
//      layer 0 (count + token indices) into region r of o's combine buffers. It is written once
//      before any slice flag, so every slice flag guards it too.
//   2. For each N-slice [c0, c1) of H: y = act_rows @ W2_e[:, c0:c1] for every row of every
//      local expert, then the top-k weighted sum per received token in fp32 (rows in layout
//      order), then each owner's rows go to region r of its partial buffer and
//      slice_ready[o][r * num_slices + s] is set. kAllGather received every token of every rank,
//      so each owner gets a dense [T_o, slice] partial from every rank (reduce-scatter
//      semantics); kAllToAll sends only the tokens that came from o, each pre-reduced over the
//      slots whose experts live on r (at most one row per token per rank, never k).
//   3. The owner waits for slice s from sources 0..W-1 in that fixed order and sums in fp32
//      (deterministic: no dependence on arrival order), then rounds to T. Tokens no rank sent
//      anything for (all slots dropped) get 0.
#include "reference/moe_layers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ccfuse::ref {

void validate_moe(const World& world, const MoeShape& shape) {
  const int world_size = world.world_size();
  CCFUSE_ARG_CHECK(shape.max_tokens_per_rank > 0, "max_tokens_per_rank ", shape.max_tokens_per_rank,
                   " must be positive");
  CCFUSE_ARG_CHECK(shape.hidden > 0, "hidden ", shape.hidden, " must be positive");
  CCFUSE_ARG_CHECK(shape.ffn > 0, "ffn ", shape.ffn, " must be positive");
  CCFUSE_ARG_CHECK(shape.num_experts > 0, "num_experts ", shape.num_experts, " must be positive");
  CCFUSE_ARG_CHECK(shape.topk >= 1, "topk ", shape.topk, " must be at least 1");
  CCFUSE_ARG_CHECK(shape.num_experts % world_size == 0, "num_experts ", shape.num_experts,
                   " is not divisible by world_size ", world_size);
  CCFUSE_ARG_CHECK(shape.topk <= shape.num_experts, "topk ", shape.topk, " must not exceed num_experts ",
                   shape.num_experts);
  // Layout entries (token * k + slot over all received tokens) and signal indices are int32, as
  // on the GPU. Divisions, not products, so that the check itself cannot overflow.
  constexpr int64_t kMaxCount = std::numeric_limits<int32_t>::max();
  CCFUSE_ARG_CHECK(shape.max_tokens_per_rank <= kMaxCount / world_size / shape.topk, "max_tokens_per_rank ",
                   shape.max_tokens_per_rank, " with world_size ", world_size, " and topk ", shape.topk,
                   " gives more than ", kMaxCount, " entries");
}

void validate_moe(const World& world, const MoeShape& shape, const MoeConfig& config) {
  validate_moe(world, shape);
  CCFUSE_ARG_CHECK(config.chunk_tokens > 0, "chunk_tokens ", config.chunk_tokens, " must be positive");
  CCFUSE_ARG_CHECK(config.block_m > 0, "block_m ", config.block_m, " must be positive");
  CCFUSE_ARG_CHECK(config.slice_cols > 0, "slice_cols ", config.slice_cols, " must be positive");
}

namespace {

void check_rank(const World& world, int rank) {
  CCFUSE_CHECK(rank >= 0 && rank < world.world_size(), "rank ", rank, " out of range for world_size ",
               world.world_size());
}

// acc [cols] = a_row [k] @ b [k, cols] (row stride ldb) in fp32, summing over k in order
// 0..k-1 with one rounding per step, as one GPU thread of a fp32-accumulating MMA would (up to
// the MMA's internal order).
template <typename T>
void row_gemm_f32(const T* a_row, const T* b, int64_t ldb, int64_t cols, int64_t k, float* acc) {
  std::fill_n(acc, cols, 0.0f);
  for (int64_t p = 0; p < k; ++p) {
    const float a_p = to_f32(a_row[p]);
    const T* b_row = b + p * ldb;
    for (int64_t j = 0; j < cols; ++j) acc[j] += a_p * to_f32(b_row[j]);
  }
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

int64_t num_chunks(int64_t tokens, int64_t chunk_tokens) { return ceil_div(tokens, chunk_tokens); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layer 0: dispatch + expert GEMM

template <typename T>
struct MoeLayer0<T>::State {
  World& world;
  MoeShape shape;
  DispatchMode mode;
  MoeConfig config;
  int experts_per_rank;
  int max_chunks;  // chunks of a full send list (max_tokens_per_rank tokens)
  // Receive side on every rank, one region of max_tokens_per_rank tokens per source rank: a
  // source never sends a destination more tokens than it has.
  SymmetricBuffer<T> recv_x;              // [W src][max_T][H]
  SymmetricBuffer<int32_t> recv_ids;      // [W src][max_T][k] global expert ids, -1 = dropped
  SymmetricBuffer<float> recv_weights;    // [W src][max_T][k]
  SymmetricBuffer<int32_t> recv_token;    // [W src][max_T] index of the token on its owner
  SymmetricBuffer<int64_t> recv_count;    // [W src] tokens in the region
  SignalArray routing_ready;              // on d, index src: src's count + routing are in region src
  SignalArray chunk_ready;                // on d, index src * max_chunks + c: chunk c of src's list

  State(World& w, const MoeShape& s, DispatchMode m, const MoeConfig& c)
      : world(w),
        shape(s),
        mode(m),
        config(c),
        experts_per_rank(s.num_experts / w.world_size()),
        max_chunks(int(num_chunks(s.max_tokens_per_rank, c.chunk_tokens))),
        recv_x(w, size_t(w.world_size()) * size_t(s.max_tokens_per_rank) * size_t(s.hidden)),
        recv_ids(w, size_t(w.world_size()) * size_t(s.max_tokens_per_rank) * size_t(s.topk)),
        recv_weights(w, size_t(w.world_size()) * size_t(s.max_tokens_per_rank) * size_t(s.topk)),
        recv_token(w, size_t(w.world_size()) * size_t(s.max_tokens_per_rank)),
        recv_count(w, size_t(w.world_size())),
        routing_ready(w, "moe_routing", w.world_size()),
        chunk_ready(w, "moe_chunk", w.world_size() * max_chunks) {}
};

template <typename T>
MoeLayer0<T>::MoeLayer0(World& world, MoeShape shape, DispatchMode mode) : MoeLayer0(world, shape, mode, MoeConfig{}) {}

template <typename T>
MoeLayer0<T>::MoeLayer0(World& world, MoeShape shape, DispatchMode mode, MoeConfig config) {
  validate_moe(world, shape, config);
  s_ = std::make_unique<State>(world, shape, mode, config);
}

template <typename T>
MoeLayer0<T>::~MoeLayer0() = default;

template <typename T>
void MoeLayer0<T>::run(int rank, const T* x, int64_t num_tokens, const int32_t* topk_ids,
                       const float* topk_weights, const T* w1, std::vector<T>& act, MoeMetadata& meta,
                       std::vector<T>* preact, int64_t preact_rows) {
  State& s = *s_;
  check_rank(s.world, rank);
  const int world_size = s.world.world_size();
  const int k = s.shape.topk;
  const int num_experts = s.shape.num_experts;
  const int e_local = s.experts_per_rank;
  const int64_t h = s.shape.hidden, f = s.shape.ffn;
  const int64_t f_in = s.shape.swiglu ? 2 * f : f;  // columns of W1: [gate | up] with SwiGLU
  const int64_t max_t = s.shape.max_tokens_per_rank;
  const int64_t chunk_tokens = s.config.chunk_tokens;

  // Input checks before the entry barrier: a rank that throws here aborts the world and the
  // others stop at the barrier, so the caller sees this message, not a timeout.
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must not be negative");
  CCFUSE_ARG_CHECK(num_tokens <= max_t, "num_tokens ", num_tokens, " exceeds max_tokens_per_rank ", max_t);
  CCFUSE_ARG_CHECK(num_tokens == 0 || (x != nullptr && topk_ids != nullptr && topk_weights != nullptr),
                   "moe layer 0: x, topk_ids and topk_weights must not be null when num_tokens ", num_tokens,
                   " > 0");
  CCFUSE_ARG_CHECK(w1 != nullptr, "moe layer 0: w1 must not be null");
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int slot = 0; slot < k; ++slot) {
      const int32_t id = topk_ids[t * k + slot];
      CCFUSE_ARG_CHECK(id >= -1 && id < num_experts, "topk_ids[", t, "][", slot, "] = ", id,
                       " is out of range [-1, ", num_experts, ")");
    }

  s.world.barrier(rank);
  const epoch_t routing_epoch = s.routing_ready.begin_call(rank);
  const epoch_t chunk_epoch = s.chunk_ready.begin_call(rank);

  // 1. Send lists and routing, destinations rotated starting with ourselves.
  std::vector<std::vector<int32_t>> send(size_t(world_size), std::vector<int32_t>{});
  for (int step = 0; step < world_size; ++step) {
    const int dst = (rank + step) % world_size;
    std::vector<int32_t>& list = send[size_t(dst)];
    for (int64_t t = 0; t < num_tokens; ++t) {
      bool wanted = s.mode == DispatchMode::kAllGather;
      for (int slot = 0; slot < k && !wanted; ++slot) {
        const int32_t id = topk_ids[t * k + slot];
        wanted = id >= 0 && id / e_local == dst;  // once per destination, however many slots hit it
      }
      if (wanted) list.push_back(int32_t(t));
    }
    const int64_t region = int64_t(rank) * max_t;
    for (size_t p = 0; p < list.size(); ++p) {
      const int64_t t = list[p];
      const int64_t at = region + int64_t(p);
      std::copy_n(topk_ids + t * k, k, s.recv_ids.on(dst) + at * k);
      std::copy_n(topk_weights + t * k, k, s.recv_weights.on(dst) + at * k);
      s.recv_token.on(dst)[at] = int32_t(t);
    }
    s.recv_count.on(dst)[rank] = int64_t(list.size());
    s.routing_ready.notify(dst, rank, routing_epoch);
  }

  // 2. Token rows, chunk-major so that every destination gets its first rows early.
  for (int chunk = 0; chunk < s.max_chunks; ++chunk) {
    for (int step = 0; step < world_size; ++step) {
      const int dst = (rank + step) % world_size;
      const std::vector<int32_t>& list = send[size_t(dst)];
      const int64_t p0 = int64_t(chunk) * chunk_tokens;
      if (p0 >= int64_t(list.size())) continue;
      const int64_t p1 = min_i64(p0 + chunk_tokens, int64_t(list.size()));
      T* dst_x = s.recv_x.on(dst) + int64_t(rank) * max_t * h;
      for (int64_t p = p0; p < p1; ++p) std::copy_n(x + int64_t(list[size_t(p)]) * h, h, dst_x + p * h);
      s.chunk_ready.notify(dst, rank * s.max_chunks + chunk, chunk_epoch);
    }
  }

  // 3. Routing of every source (own first), then the layout of the entries of local experts.
  meta = MoeMetadata{};
  meta.num_tokens = num_tokens;
  meta.topk = k;
  meta.recv_offsets.assign(size_t(world_size) + 1, 0);
  for (int step = 0; step < world_size; ++step) {
    const int src = (rank + step) % world_size;
    s.routing_ready.wait(rank, src, routing_epoch, /*producer=*/src);
  }
  for (int src = 0; src < world_size; ++src) {
    const int64_t count = s.recv_count.on(rank)[src];
    CCFUSE_CHECK(count >= 0 && count <= max_t, "rank ", rank, ": source ", src, " sent ", count, " tokens");
    meta.recv_offsets[size_t(src) + 1] = meta.recv_offsets[size_t(src)] + count;
  }
  const int64_t received = meta.recv_offsets[size_t(world_size)];
  std::vector<int32_t> local_ids(size_t(received * k));
  std::vector<int32_t> token_src_rank(static_cast<size_t>(received));
  meta.recv_token.resize(size_t(received));
  for (int src = 0; src < world_size; ++src) {
    const int64_t off = meta.recv_offsets[size_t(src)];
    const int64_t count = meta.recv_offsets[size_t(src) + 1] - off;
    const int32_t* ids = s.recv_ids.on(rank) + int64_t(src) * max_t * k;
    const int32_t* tokens = s.recv_token.on(rank) + int64_t(src) * max_t;
    for (int64_t p = 0; p < count; ++p) {
      token_src_rank[size_t(off + p)] = src;
      meta.recv_token[size_t(off + p)] = tokens[p];
      for (int slot = 0; slot < k; ++slot) {
        const int32_t id = ids[p * k + slot];
        // Entries of other ranks' experts are not our rows.
        local_ids[size_t((off + p) * k + slot)] = id >= 0 && id / e_local == rank ? id - rank * e_local : -1;
      }
    }
  }
  meta.layout = moe::make_layout(local_ids.data(), received, k, e_local, token_src_rank.data(), rank, world_size);
  const int64_t rows = meta.layout.rows();
  meta.row_src_rank.resize(size_t(rows));
  meta.row_src_token.resize(size_t(rows));
  meta.row_slot.resize(size_t(rows));
  meta.row_weight.resize(size_t(rows));
  std::vector<int64_t> row_at(static_cast<size_t>(rows));  // [rows] position in the receive buffer (src * max_t + p)
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t entry = meta.layout.indices[size_t(i)];
    const int64_t g = entry / k;
    const int src = token_src_rank[size_t(g)];
    const int64_t at = int64_t(src) * max_t + (g - meta.recv_offsets[size_t(src)]);
    row_at[size_t(i)] = at;
    meta.row_src_rank[size_t(i)] = src;
    meta.row_src_token[size_t(i)] = meta.recv_token[size_t(g)];
    meta.row_slot[size_t(i)] = entry % k;
    meta.row_weight[size_t(i)] = s.recv_weights.on(rank)[at * k + entry % k];
  }

  // 4. Expert GEMMs in layout order (local source first, so the first tiles need no remote
  //    data). A tile waits for the chunk of each of its rows; a chunk already seen in this call
  //    is not waited for again (the GPU's producer warp keeps the same per-tile flag set).
  act.resize(size_t(rows * f));
  const int64_t kept_rows = preact_rows < 0 ? rows : min_i64(rows, preact_rows);
  if (preact != nullptr) preact->resize(size_t(kept_rows * f_in));
  std::vector<char> chunk_seen(size_t(world_size) * size_t(s.max_chunks), 0);
  std::vector<float> acc(static_cast<size_t>(f_in));
  const T* recv_x = s.recv_x.on(rank);
  for (int e = 0; e < e_local; ++e) {
    const int64_t e_begin = e == 0 ? 0 : meta.layout.bins[size_t(e) - 1];
    const int64_t e_end = meta.layout.bins[size_t(e)];
    const T* w1_e = w1 + int64_t(e) * h * f_in;
    for (int64_t row0 = e_begin; row0 < e_end; row0 += s.config.block_m) {
      const int64_t row1 = min_i64(row0 + s.config.block_m, e_end);
      for (int64_t i = row0; i < row1; ++i) {
        const int src = meta.row_src_rank[size_t(i)];
        const int chunk = int((row_at[size_t(i)] - int64_t(src) * max_t) / chunk_tokens);
        const int sig = src * s.max_chunks + chunk;
        if (!chunk_seen[size_t(sig)]) {
          s.chunk_ready.wait(rank, sig, chunk_epoch, /*producer=*/src);
          chunk_seen[size_t(sig)] = 1;
        }
      }
      for (int64_t i = row0; i < row1; ++i) {
        CCFUSE_CHECK(meta.layout.bin_ids[size_t(i)] == e, "layout row ", i, " has expert ",
                     meta.layout.bin_ids[size_t(i)], " inside expert ", e, "'s bin");
        row_gemm_f32(recv_x + row_at[size_t(i)] * h, w1_e, f_in, f_in, h, acc.data());
        if (preact != nullptr && i < kept_rows)
          for (int64_t j = 0; j < f_in; ++j) (*preact)[size_t(i * f_in + j)] = from_f32<T>(acc[size_t(j)]);
        T* act_row = act.data() + i * f;
        if (s.shape.swiglu) {
          for (int64_t j = 0; j < f; ++j) act_row[j] = from_f32<T>(silu(acc[size_t(j)]) * acc[size_t(f + j)]);
        } else {
          for (int64_t j = 0; j < f; ++j) act_row[j] = from_f32<T>(acc[size_t(j)]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Layer 1: expert GEMM + combine

template <typename T>
struct MoeLayer1<T>::State {
  World& world;
  MoeShape shape;
  DispatchMode mode;
  MoeConfig config;
  int num_slices;
  // Combine side on every owner, one region per source rank: the owner's tokens that the source
  // received in layer 0 (at most max_tokens_per_rank) and their fp32 partial sums.
  SymmetricBuffer<float> partials;       // [W src][max_T][H]
  SymmetricBuffer<int32_t> part_token;   // [W src][max_T] token index on the owner of each partial row
  SymmetricBuffer<int64_t> part_count;   // [W src] partial rows in the region
  SignalArray slice_ready;               // on owner o, index src * num_slices + s

  State(World& w, const MoeShape& s, DispatchMode m, const MoeConfig& c)
      : world(w),
        shape(s),
        mode(m),
        config(c),
        num_slices(int(ceil_div(s.hidden, c.slice_cols))),
        partials(w, size_t(w.world_size()) * size_t(s.max_tokens_per_rank) * size_t(s.hidden)),
        part_token(w, size_t(w.world_size()) * size_t(s.max_tokens_per_rank)),
        part_count(w, size_t(w.world_size())),
        slice_ready(w, "moe_slice", w.world_size() * num_slices) {}
};

template <typename T>
MoeLayer1<T>::MoeLayer1(World& world, MoeShape shape, DispatchMode mode) : MoeLayer1(world, shape, mode, MoeConfig{}) {}

template <typename T>
MoeLayer1<T>::MoeLayer1(World& world, MoeShape shape, DispatchMode mode, MoeConfig config) {
  validate_moe(world, shape, config);
  s_ = std::make_unique<State>(world, shape, mode, config);
}

template <typename T>
MoeLayer1<T>::~MoeLayer1() = default;

template <typename T>
void MoeLayer1<T>::run(int rank, const std::vector<T>& act, const MoeMetadata& meta, const T* w2, int64_t num_tokens,
                       T* out) {
  State& s = *s_;
  check_rank(s.world, rank);
  const int world_size = s.world.world_size();
  const int k = s.shape.topk;
  const int e_local = s.shape.num_experts / world_size;
  const int64_t h = s.shape.hidden, f = s.shape.ffn;
  const int64_t max_t = s.shape.max_tokens_per_rank;
  const int64_t rows = meta.layout.rows();

  // Input checks before the entry barrier (see layer 0).
  CCFUSE_ARG_CHECK(num_tokens >= 0, "num_tokens ", num_tokens, " must not be negative");
  CCFUSE_ARG_CHECK(num_tokens <= max_t, "num_tokens ", num_tokens, " exceeds max_tokens_per_rank ", max_t);
  CCFUSE_ARG_CHECK(num_tokens == meta.num_tokens, "num_tokens ", num_tokens, " does not match layer 0's num_tokens ",
                   meta.num_tokens);
  CCFUSE_ARG_CHECK(num_tokens == 0 || out != nullptr, "moe layer 1: out must not be null when num_tokens ",
                   num_tokens, " > 0");
  CCFUSE_ARG_CHECK(w2 != nullptr, "moe layer 1: w2 must not be null");
  CCFUSE_ARG_CHECK(meta.topk == k, "metadata topk ", meta.topk, " does not match the layer's topk ", k);
  CCFUSE_ARG_CHECK(int64_t(meta.recv_offsets.size()) == world_size + 1, "metadata has ",
                   meta.recv_offsets.size(), " receive offsets, expected world_size + 1 = ", world_size + 1);
  CCFUSE_ARG_CHECK(int64_t(act.size()) == rows * f, "act has ", act.size(), " elements, expected rows ", rows,
                   " x ffn ", f, " = ", rows * f);
  CCFUSE_ARG_CHECK(int64_t(meta.layout.bins.size()) == e_local, "metadata layout has ", meta.layout.bins.size(),
                   " experts, expected num_experts / world_size = ", e_local);
  CCFUSE_ARG_CHECK(int64_t(meta.row_weight.size()) == rows && int64_t(meta.layout.bin_ids.size()) == rows,
                   "metadata row arrays do not match its ", rows, " layout rows");
  const int64_t received = meta.recv_offsets[size_t(world_size)];
  CCFUSE_ARG_CHECK(int64_t(meta.recv_token.size()) == received, "metadata has ", meta.recv_token.size(),
                   " received tokens, its offsets say ", received);
  for (int src = 0; src < world_size; ++src) {
    const int64_t count = meta.recv_offsets[size_t(src) + 1] - meta.recv_offsets[size_t(src)];
    CCFUSE_ARG_CHECK(count >= 0 && count <= max_t, "metadata: ", count, " tokens received from rank ", src,
                     " (max_tokens_per_rank ", max_t, ")");
  }
  if (s.mode == DispatchMode::kAllGather) {
    const int64_t own = meta.recv_offsets[size_t(rank) + 1] - meta.recv_offsets[size_t(rank)];
    CCFUSE_ARG_CHECK(own == num_tokens, "all-gather metadata holds ", own, " tokens of rank ", rank,
                     ", not its num_tokens ", num_tokens);
  }

  s.world.barrier(rank);
  const epoch_t epoch = s.slice_ready.begin_call(rank);

  // 1. Which of each owner's tokens we hold partials for. Written once, before any slice flag.
  for (int step = 0; step < world_size; ++step) {
    const int owner = (rank + 1 + step) % world_size;
    const int64_t off = meta.recv_offsets[size_t(owner)];
    const int64_t count = meta.recv_offsets[size_t(owner) + 1] - off;
    std::copy_n(meta.recv_token.data() + off, count, s.part_token.on(owner) + int64_t(rank) * max_t);
    s.part_count.on(owner)[rank] = count;
  }

  // 2. N-slices, column-major over all local experts: the first slice of every owner is complete
  //    (and sent) before the second is computed.
  std::vector<float> token_acc;  // [received, cols] top-k weighted sums of this slice
  std::vector<float> y;          // [cols] one row of act @ W2_e[:, c0:c1]
  for (int slice = 0; slice < s.num_slices; ++slice) {
    const int64_t c0 = int64_t(slice) * s.config.slice_cols;
    const int64_t cols = min_i64(s.config.slice_cols, h - c0);
    token_acc.assign(size_t(received * cols), 0.0f);
    y.resize(size_t(cols));
    for (int64_t i = 0; i < rows; ++i) {
      const int e = meta.layout.bin_ids[size_t(i)];
      CCFUSE_CHECK(e >= 0 && e < e_local, "layout row ", i, " has expert ", e);
      row_gemm_f32(act.data() + i * f, w2 + int64_t(e) * f * h + c0, h, cols, f, y.data());
      const int64_t g = meta.layout.indices[size_t(i)] / k;
      CCFUSE_CHECK(g >= 0 && g < received, "layout row ", i, " has received token ", g);
      const float w = meta.row_weight[size_t(i)];
      float* dst = token_acc.data() + g * cols;
      for (int64_t j = 0; j < cols; ++j) dst[j] += w * y[size_t(j)];
    }
    for (int step = 0; step < world_size; ++step) {
      const int owner = (rank + 1 + step) % world_size;
      const int64_t off = meta.recv_offsets[size_t(owner)];
      const int64_t count = meta.recv_offsets[size_t(owner) + 1] - off;
      float* region = s.partials.on(owner) + int64_t(rank) * max_t * h;
      for (int64_t p = 0; p < count; ++p)
        std::copy_n(token_acc.data() + (off + p) * cols, cols, region + p * h + c0);
      s.slice_ready.notify(owner, rank * s.num_slices + slice, epoch);
    }
  }

  // 3. Our tokens: all W sources of a slice, summed in source order 0..W-1.
  std::vector<float> sum;  // [num_tokens, cols]
  for (int slice = 0; slice < s.num_slices; ++slice) {
    const int64_t c0 = int64_t(slice) * s.config.slice_cols;
    const int64_t cols = min_i64(s.config.slice_cols, h - c0);
    sum.assign(size_t(num_tokens * cols), 0.0f);
    for (int src = 0; src < world_size; ++src) {
      s.slice_ready.wait(rank, src * s.num_slices + slice, epoch, /*producer=*/src);
      const int64_t count = s.part_count.on(rank)[src];
      CCFUSE_CHECK(count >= 0 && count <= num_tokens, "rank ", rank, ": rank ", src, " sent ", count,
                   " partial rows for ", num_tokens, " tokens");
      const int32_t* tokens = s.part_token.on(rank) + int64_t(src) * max_t;
      const float* region = s.partials.on(rank) + int64_t(src) * max_t * h;
      for (int64_t p = 0; p < count; ++p) {
        const int64_t t = tokens[p];
        CCFUSE_CHECK(t >= 0 && t < num_tokens, "rank ", rank, ": rank ", src, " sent a partial for token ", t);
        for (int64_t j = 0; j < cols; ++j) sum[size_t(t * cols + j)] += region[p * h + c0 + j];
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t j = 0; j < cols; ++j) out[t * h + c0 + j] = from_f32<T>(sum[size_t(t * cols + j)]);
  }
}

template class MoeLayer0<float>;
template class MoeLayer0<bf16>;
template class MoeLayer1<float>;
template class MoeLayer1<bf16>;

}  // namespace ccfuse::ref
