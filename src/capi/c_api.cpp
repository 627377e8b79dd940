// The C ABI of include/ccfuse/c_api.h: a process-wide Team, further Teams on other communicators,
// and the ops behind opaque handles. Every op holds a reference to its Team (shared_ptr), so that
// ccfuse_finalize / ccfuse_team_destroy before an op's destroy leaves no op on a freed Team.
#include "ccfuse/c_api.h"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ccfuse/comm/team.h"
#include "ccfuse/common/error.h"
#include "ccfuse/gemm/gemm.h"
#include "ccfuse/tp/ag_gemm.h"
#include "ccfuse/moe/moe_ffn.h"
#include "ccfuse/moe/moe_tuner.h"
#include "ccfuse/moe/router.h"
#include "ccfuse/moe/router_gpu.h"
#include "ccfuse/tp/gemm_rs.h"
#include "ccfuse/tp/tuner.h"

struct ccfuse_team {
  std::shared_ptr<ccfuse::comm::Team> team;
};

// `team` first: members are destroyed in reverse order, so the op goes before its Team.
struct ccfuse_tp_op {
  std::shared_ptr<ccfuse::comm::Team> team;
  std::string op;
  std::unique_ptr<ccfuse::tp::AgGemm> ag;
  std::unique_ptr<ccfuse::tp::GemmRs> rs;
  std::unique_ptr<ccfuse::tp::GemmAr> ar;
};

struct ccfuse_moe_ffn {
  std::shared_ptr<ccfuse::comm::Team> team;
  std::unique_ptr<ccfuse::moe::MoeFfn> ffn;
  std::string description;
};

struct ccfuse_moe_ffn_backward {
  std::shared_ptr<ccfuse::comm::Team> team;
  std::unique_ptr<ccfuse::moe::MoeFfnBackward> bwd;
};

namespace {

thread_local std::string last_error;
std::mutex team_mu;
std::shared_ptr<ccfuse::comm::Team> team;  // the process's (ccfuse_init_*)

// Runs fn; an exception becomes the return code 1 and this thread's last error.
template <class F>
int guarded(F&& fn) {
  try {
    fn();
    last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown exception";
  }
  return 1;
}

std::shared_ptr<ccfuse::comm::Team> the_team() {
  std::lock_guard<std::mutex> lock(team_mu);
  CCFUSE_ARG_CHECK(team != nullptr, "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first");
  return team;
}

// The Team an op is made on: `t` (from ccfuse_team_create_from_comm), or the process's for null.
std::shared_ptr<ccfuse::comm::Team> team_of(ccfuse_team* t) {
  return t == nullptr ? the_team() : t->team;
}

// The C ABI's dtype and b_kn codes, checked.
ccfuse::DType gemm_dtype(int dtype) {
  CCFUSE_ARG_CHECK(dtype == 0 || dtype == 1, "dtype ", dtype, " must be 0 (bf16) or 1 (fp16)");
  return dtype == 0 ? ccfuse::DType::kBFloat16 : ccfuse::DType::kFloat16;
}

ccfuse::gemm::BLayout gemm_b_layout(int b_kn) {
  CCFUSE_ARG_CHECK(b_kn == 0 || b_kn == 1, "b_kn ", b_kn, " must be 0 (B is [n, k]) or 1 (B is [k, n])");
  return b_kn ? ccfuse::gemm::BLayout::kKN : ccfuse::gemm::BLayout::kNK;
}

// The router's configuration from the C ABI's arguments; the score, normalize and drop codes are
// checked here, the rest by route_gpu / router_workspace_bytes (moe::validate's messages).
ccfuse::moe::RouterConfig router_config(int num_experts, int topk, int score, int normalize, double capacity_factor,
                                        int drop, int world_size) {
  CCFUSE_ARG_CHECK(score == 0 || score == 1, "score ", score, " must be 0 (softmax) or 1 (sigmoid)");
  CCFUSE_ARG_CHECK(normalize == 0 || normalize == 1, "normalize ", normalize, " must be 0 or 1");
  CCFUSE_ARG_CHECK(drop == 0 || drop == 1, "drop ", drop, " must be 0 (by position) or 1 (by probability)");
  ccfuse::moe::RouterConfig c;
  c.num_experts = num_experts;
  c.topk = topk;
  c.score = score == 0 ? ccfuse::moe::ScoreFn::kSoftmax : ccfuse::moe::ScoreFn::kSigmoid;
  c.normalize = normalize != 0;
  c.capacity_factor = capacity_factor;
  c.drop = drop == 0 ? ccfuse::moe::DropPolicy::kByPosition : ccfuse::moe::DropPolicy::kByProbability;
  c.jitter_eps = 0;  // the logits come from the caller (jitter belongs to them)
  c.world_size = world_size;
  return c;
}

void check_pointers(std::initializer_list<std::pair<const void*, const char*>> ptrs) {
  for (auto [p, name] : ptrs) CCFUSE_ARG_CHECK(p != nullptr, name, " must not be null");
}

}  // namespace

extern "C" {

int ccfuse_init_from_env(void) {
  return guarded([] {
    std::lock_guard<std::mutex> lock(team_mu);
    if (team == nullptr) team = ccfuse::comm::Team::from_env();
  });
}

int ccfuse_init_from_comm(void* nccl_comm) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(nccl_comm != nullptr, "nccl_comm must be a valid ncclComm_t, got null");
    std::lock_guard<std::mutex> lock(team_mu);
    CCFUSE_ARG_CHECK(team == nullptr, "a Team exists already: call ccfuse_finalize() before ccfuse_init_from_comm");
    team = ccfuse::comm::Team::from_comm(static_cast<ncclComm_t>(nccl_comm));
  });
}

int ccfuse_world_size(int* out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = the_team()->world_size();
  });
}

int ccfuse_team_create_from_comm(void* nccl_comm, ccfuse_team** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = nullptr;
    CCFUSE_ARG_CHECK(nccl_comm != nullptr, "nccl_comm must be a valid ncclComm_t, got null");
    auto h = std::make_unique<ccfuse_team>();
    h->team = ccfuse::comm::Team::from_comm(static_cast<ncclComm_t>(nccl_comm));
    *out = h.release();
  });
}

int ccfuse_team_world_size(ccfuse_team* team_handle, int* out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    CCFUSE_ARG_CHECK(team_handle != nullptr, "team must be a handle from ccfuse_team_create_from_comm, got null");
    *out = team_of(team_handle)->world_size();
  });
}

int ccfuse_team_destroy(ccfuse_team* team_handle) {
  return guarded([&] { delete team_handle; });
}

int ccfuse_tp_create(const char* op, int64_t m, int64_t n, int64_t k, int b_kn, ccfuse_tp_op** out) {
  return ccfuse_tp_create_typed(op, m, n, k, b_kn, 0, out);
}

int ccfuse_tp_create_typed(const char* op, int64_t m, int64_t n, int64_t k, int b_kn, int dtype, ccfuse_tp_op** out) {
  return ccfuse_tp_create_on(nullptr, op, m, n, k, b_kn, dtype, out);
}

int ccfuse_tp_create_on(ccfuse_team* team_handle, const char* op, int64_t m, int64_t n, int64_t k, int b_kn,
                        int dtype, ccfuse_tp_op** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = nullptr;
    const ccfuse::DType dt = gemm_dtype(dtype);
    const std::string name = op != nullptr ? op : "";
    CCFUSE_ARG_CHECK(name == "ag_gemm" || name == "gemm_rs" || name == "gemm_ar", "op '", name,
                     "' is not a fused TP op (ag_gemm, gemm_rs, gemm_ar)");
    CCFUSE_ARG_CHECK(b_kn == 0 || b_kn == 1, "b_kn ", b_kn, " must be 0 (B is [n, k]) or 1 (B is [k, n])");
    auto h = std::make_unique<ccfuse_tp_op>();
    h->team = team_of(team_handle);
    ccfuse::comm::Team& t = *h->team;
    const int w = t.world_size();
    const ccfuse::gemm::BLayout layout = b_kn ? ccfuse::gemm::BLayout::kKN : ccfuse::gemm::BLayout::kNK;
    h->op = name;
    if (name == "ag_gemm") {
      ccfuse::tp::AgGemmDesc d;
      d.m = m;
      d.n = n;
      d.k = k;
      d.dtype = dt;
      d.b_layout = layout;
      // The tuner's transport, as `ccfuse bench` runs it (the copy engine where the push is
      // dense, tp::ag_copy_engine_pays); shapes it does not take (W not dividing M, ...) keep
      // the default, send warps, and AgGemm checks them.
      ccfuse::tp::AgGemmConfig cfg;
      ccfuse::tp::TpProblem p;
      p.op = "ag_gemm";
      p.world_size = w;
      p.m = m;
      p.n = n;
      p.k_per_rank = k;
      p.dtype = d.dtype;
      p.num_sms = ccfuse::gemm::current_device_sms();
      if (m > 0 && n > 0 && k > 0 && m % w == 0) {
        try {
          if (ccfuse::tp::choose_tp_config(p).transport == "copy-engine")
            cfg.transport = ccfuse::tp::AgTransport::kCopyEngine;
        } catch (const ccfuse::InvalidArgument&) {  // a problem the tuner refuses: AgGemm says why
        }
      }
      h->ag = std::make_unique<ccfuse::tp::AgGemm>(t, d, cfg);
    } else {
      CCFUSE_ARG_CHECK(k > 0 && k % w == 0, name, ": k ", k, " (the global K) is not divisible by the world size ", w);
      ccfuse::tp::GemmRsDesc d;
      d.m = m;
      d.n = n;
      d.k = k / w;
      d.dtype = dt;
      d.b_layout = layout;
      if (name == "gemm_rs") h->rs = std::make_unique<ccfuse::tp::GemmRs>(t, d);
      else h->ar = std::make_unique<ccfuse::tp::GemmAr>(t, d);
    }
    *out = h.release();
  });
}

int ccfuse_tp_run(ccfuse_tp_op* op, const void* a, const void* b, void* c, void* stream) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(op != nullptr, "op must be a handle from ccfuse_tp_create, got null");
    auto s = static_cast<cudaStream_t>(stream);
    if (op->ag) op->ag->run(a, b, c, s);
    else if (op->rs) op->rs->run(a, b, c, s);
    else op->ar->run(a, b, c, s);
  });
}

int ccfuse_tp_gathered(ccfuse_tp_op* op, const void** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = nullptr;
    CCFUSE_ARG_CHECK(op != nullptr, "op must be a handle from ccfuse_tp_create, got null");
    CCFUSE_ARG_CHECK(op->ag != nullptr, "op ", op->op, " has no gathered A (only ag_gemm gathers)");
    *out = op->ag->gathered_a();
  });
}

int ccfuse_tp_destroy(ccfuse_tp_op* op) {
  return guarded([&] { delete op; });
}

namespace {
// The MoE FFN's desc and the tuner's config for it (docs/moe-tuner.md; the tuner also checks the
// arguments), for the forward and the backward alike.
struct MoeSetup {
  ccfuse::moe::MoeFfnDesc desc;
  ccfuse::moe::MoeFfnConfig config;
  ccfuse::moe::MoeChoice choice;
};
void check_moe_codes(int swiglu, int b_kn) {  // before the Team is looked up: these errors come first
  CCFUSE_ARG_CHECK(swiglu == 0 || swiglu == 1, "swiglu ", swiglu, " must be 0 or 1");
  CCFUSE_ARG_CHECK(b_kn == 0 || b_kn == 1, "b_kn ", b_kn, " must be 0 (weights [.., N, K]) or 1 ([.., K, N])");
}
MoeSetup moe_setup(const ccfuse::comm::Team& t, int64_t max_tokens, int64_t hidden, int64_t ffn, int num_experts,
                   int topk, int swiglu, int b_kn, double imbalance) {
  ccfuse::moe::MoeProblem p;
  p.world_size = t.world_size();
  p.num_experts = num_experts;
  p.topk = topk;
  p.tokens_per_rank = max_tokens;
  p.hidden = hidden;
  p.ffn = ffn;
  p.imbalance = imbalance;
  MoeSetup m;
  m.choice = ccfuse::moe::choose_moe_config(p);
  ccfuse::moe::MoeFfnDesc& d = m.desc;
  d.max_tokens = max_tokens;
  d.hidden = hidden;
  d.ffn = ffn;
  d.num_experts = num_experts;
  d.topk = topk;
  d.swiglu = swiglu != 0;
  d.b_layout = b_kn ? ccfuse::gemm::BLayout::kKN : ccfuse::gemm::BLayout::kNK;
  ccfuse::moe::MoeFfnConfig& cfg = m.config;
  cfg.combine = m.choice.combine == "presum" ? ccfuse::moe::MoeCombine::kPresum : ccfuse::moe::MoeCombine::kPerSlot;
  cfg.interleave_sends = m.choice.send_order == "interleaved";
  cfg.striped_dispatch = m.choice.striped_dispatch ? 1 : 0;
  cfg.stripe_rows = m.choice.stripe_rows;
  // local_first stays -1: chosen per call from its token count (moe::auto_local_first).
  return m;
}
}  // namespace

int ccfuse_moe_ffn_create(int64_t max_tokens, int64_t hidden, int64_t ffn, int num_experts, int topk, int swiglu,
                          int b_kn, double imbalance, ccfuse_moe_ffn** out) {
  return ccfuse_moe_ffn_create_on(nullptr, max_tokens, hidden, ffn, num_experts, topk, swiglu, b_kn, imbalance, out);
}

int ccfuse_moe_ffn_create_on(ccfuse_team* team_handle, int64_t max_tokens, int64_t hidden, int64_t ffn,
                             int num_experts, int topk, int swiglu, int b_kn, double imbalance, ccfuse_moe_ffn** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = nullptr;
    check_moe_codes(swiglu, b_kn);
    auto h = std::make_unique<ccfuse_moe_ffn>();
    h->team = team_of(team_handle);
    ccfuse::comm::Team& t = *h->team;
    const MoeSetup m = moe_setup(t, max_tokens, hidden, ffn, num_experts, topk, swiglu, b_kn, imbalance);
    h->ffn = std::make_unique<ccfuse::moe::MoeFfn>(t, m.desc, m.config);
    h->description = h->ffn->describe() + "; tuner: " + ccfuse::moe::to_string(m.choice);
    *out = h.release();
  });
}

int ccfuse_moe_ffn_backward_create(int64_t max_tokens, int64_t hidden, int64_t ffn, int num_experts, int topk,
                                   int swiglu, int b_kn, int w1_swiglu_tiles, double imbalance,
                                   ccfuse_moe_ffn_backward** out) {
  return ccfuse_moe_ffn_backward_create_on(nullptr, max_tokens, hidden, ffn, num_experts, topk, swiglu, b_kn,
                                           w1_swiglu_tiles, imbalance, out);
}

int ccfuse_moe_ffn_backward_create_on(ccfuse_team* team_handle, int64_t max_tokens, int64_t hidden, int64_t ffn,
                                      int num_experts, int topk, int swiglu, int b_kn, int w1_swiglu_tiles,
                                      double imbalance, ccfuse_moe_ffn_backward** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = nullptr;
    CCFUSE_ARG_CHECK(w1_swiglu_tiles == 0 || w1_swiglu_tiles == 1, "w1_swiglu_tiles ", w1_swiglu_tiles,
                     " must be 0 (gate rows, then up rows) or 1 (ccfuse_swiglu_permutation order)");
    check_moe_codes(swiglu, b_kn);
    auto h = std::make_unique<ccfuse_moe_ffn_backward>();
    h->team = team_of(team_handle);
    ccfuse::comm::Team& t = *h->team;
    const MoeSetup m = moe_setup(t, max_tokens, hidden, ffn, num_experts, topk, swiglu, b_kn, imbalance);
    h->bwd = std::make_unique<ccfuse::moe::MoeFfnBackward>(t, m.desc, w1_swiglu_tiles != 0, m.config);
    *out = h.release();
  });
}

int ccfuse_moe_ffn_backward_run(ccfuse_moe_ffn_backward* bwd, const void* x, int64_t num_tokens,
                                const int32_t* topk_ids, const float* topk_w, const void* w1, const void* w2,
                                const void* g, void* dx, float* dtopk_w, void* stream) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(bwd != nullptr, "bwd must be a handle from ccfuse_moe_ffn_backward_create, got null");
    bwd->bwd->run(x, num_tokens, topk_ids, topk_w, w1, w2, g, dx, dtopk_w, static_cast<cudaStream_t>(stream));
  });
}

int ccfuse_moe_ffn_backward_run_saved(ccfuse_moe_ffn_backward* bwd, const void* x, int64_t num_tokens,
                                      const int32_t* topk_ids, const float* topk_w, const void* w1, const void* w2,
                                      const void* g, const void* h_saved, int64_t h_rows, void* dx, float* dtopk_w,
                                      void* stream) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(bwd != nullptr, "bwd must be a handle from ccfuse_moe_ffn_backward_create, got null");
    CCFUSE_ARG_CHECK(h_saved != nullptr, "h_saved must be the forward's preact_out (ccfuse_moe_ffn_run_keep), got "
                     "null (ccfuse_moe_ffn_backward_run recomputes it)");
    bwd->bwd->run(x, num_tokens, topk_ids, topk_w, w1, w2, g, dx, dtopk_w, static_cast<cudaStream_t>(stream), h_saved,
                  h_rows);
  });
}

int ccfuse_moe_ffn_backward_operands(ccfuse_moe_ffn_backward* bwd, const void** x_rows, const void** dh_rows,
                                     const void** g_rows, const void** pa_rows, const int32_t** expert_rows,
                                     int64_t* max_rows) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(bwd != nullptr, "bwd must be a handle from ccfuse_moe_ffn_backward_create, got null");
    CCFUSE_ARG_CHECK(x_rows != nullptr && dh_rows != nullptr && g_rows != nullptr && pa_rows != nullptr &&
                         expert_rows != nullptr && max_rows != nullptr,
                     "the output pointers must not be null");
    const ccfuse::moe::MoeWgradOperands o = bwd->bwd->wgrad_operands();
    *x_rows = o.x_rows;
    *dh_rows = o.dh_rows;
    *g_rows = o.g_rows;
    *pa_rows = o.pa_rows;
    *expert_rows = o.expert_rows;
    *max_rows = o.max_rows;
  });
}

int ccfuse_moe_ffn_backward_destroy(ccfuse_moe_ffn_backward* bwd) {
  return guarded([&] { delete bwd; });
}

int ccfuse_moe_ffn_run(ccfuse_moe_ffn* ffn, const void* x, int64_t num_tokens, const int32_t* topk_ids,
                       const float* topk_w, const void* w1, const void* w2, void* out, void* stream) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(ffn != nullptr, "ffn must be a handle from ccfuse_moe_ffn_create, got null");
    ffn->ffn->run(x, num_tokens, topk_ids, topk_w, w1, w2, out, static_cast<cudaStream_t>(stream));
  });
}

int ccfuse_moe_ffn_run_keep(ccfuse_moe_ffn* ffn, const void* x, int64_t num_tokens, const int32_t* topk_ids,
                            const float* topk_w, const void* w1, const void* w2, void* out, void* preact_out,
                            int64_t preact_rows, void* stream) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(ffn != nullptr, "ffn must be a handle from ccfuse_moe_ffn_create, got null");
    CCFUSE_ARG_CHECK(preact_out != nullptr, "preact_out must be a device buffer of preact_rows rows, "
                     "got null (ccfuse_moe_ffn_run keeps nothing)");
    ffn->ffn->run(x, num_tokens, topk_ids, topk_w, w1, w2, out, static_cast<cudaStream_t>(stream), preact_out,
                  preact_rows);
  });
}

int ccfuse_moe_ffn_max_rows(ccfuse_moe_ffn* ffn, int64_t* out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(ffn != nullptr && out != nullptr, "ffn and out must not be null");
    *out = ffn->ffn->max_rows();
  });
}

int ccfuse_moe_ffn_describe(ccfuse_moe_ffn* ffn, const char** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(ffn != nullptr && out != nullptr, "ffn and out must not be null");
    *out = ffn->description.c_str();
  });
}

int ccfuse_moe_ffn_destroy(ccfuse_moe_ffn* ffn) {
  return guarded([&] { delete ffn; });
}

int ccfuse_swiglu_permutation(int64_t ffn, int64_t* perm) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(perm != nullptr, "perm must not be null");
    CCFUSE_ARG_CHECK(ffn > 0 && ffn % 128 == 0, "ffn ", ffn, " must be a positive multiple of 128 (SwiGLU tiles)");
    const std::vector<int64_t> p = ccfuse::gemm::swiglu_column_permutation(ffn, 256);
    std::copy(p.begin(), p.end(), perm);
  });
}

// The plain problem of the C ABI's arguments, checked.
ccfuse::gemm::GemmDesc gemm_desc(int64_t m, int64_t n, int64_t k, int dtype, int b_kn) {
  ccfuse::gemm::GemmDesc d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.dtype = gemm_dtype(dtype);
  d.b_layout = gemm_b_layout(b_kn);
  CCFUSE_ARG_CHECK(m > 0 && n > 0 && k > 0, "m, n and k (", m, ", ", n, ", ", k, ") must be positive");
  return d;
}

int ccfuse_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int dtype, int b_kn, int64_t* bytes) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(bytes != nullptr, "bytes must not be null");
    const ccfuse::gemm::GemmDesc d = gemm_desc(m, n, k, dtype, b_kn);
    *bytes = int64_t(ccfuse::gemm::workspace_bytes(d, ccfuse::gemm::choose_config(d, ccfuse::gemm::current_device_sms())));
  });
}

int ccfuse_gemm(int64_t m, int64_t n, int64_t k, int dtype, int b_kn, const void* a, const void* b, void* c,
                void* workspace, void* stream) {
  return guarded([&] {
    const ccfuse::gemm::GemmDesc d = gemm_desc(m, n, k, dtype, b_kn);
    check_pointers({{a, "a"}, {b, "b"}, {c, "c"}});
    const ccfuse::gemm::GemmConfig cfg = ccfuse::gemm::choose_config(d, ccfuse::gemm::current_device_sms());
    ccfuse::gemm::run(d, cfg, a, b, c, stream, workspace);
  });
}

int ccfuse_grouped_gemm_workspace_bytes(int num_groups, int64_t* bytes) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(bytes != nullptr, "bytes must not be null");
    CCFUSE_ARG_CHECK(num_groups > 0, "num_groups ", num_groups, " must be positive");
    ccfuse::gemm::GroupedGemmDesc d;
    d.num_groups = num_groups;
    *bytes = int64_t(ccfuse::gemm::grouped_workspace_bytes(d));
  });
}

int ccfuse_grouped_gemm(int num_groups, int64_t max_rows, int64_t n, int64_t k, int dtype, int b_kn, const void* a,
                        const void* b, void* c, const int32_t* group_rows, void* workspace, void* stream) {
  return guarded([&] {
    ccfuse::gemm::GroupedGemmDesc d;
    d.num_groups = num_groups;
    d.max_rows = max_rows;
    d.n = n;
    d.k = k;
    d.dtype = gemm_dtype(dtype);
    d.b_layout = gemm_b_layout(b_kn);
    CCFUSE_ARG_CHECK(num_groups > 0, "num_groups ", num_groups, " must be positive");
    CCFUSE_ARG_CHECK(max_rows > 0 && n > 0 && k > 0, "max_rows, n and k (", max_rows, ", ", n, ", ", k,
                     ") must be positive");
    check_pointers({{a, "a"}, {b, "b"}, {c, "c"}, {group_rows, "group_rows"}, {workspace, "workspace"}});
    const ccfuse::gemm::GemmConfig cfg = ccfuse::gemm::choose_config(d, ccfuse::gemm::current_device_sms());
    ccfuse::gemm::grouped_run(d, cfg, a, b, c, group_rows, workspace, nullptr, stream);
  });
}

namespace {
// ccfuse_kgrouped_gemm and its accumulating form (c fp32 +=).
int kgrouped_gemm(int num_groups, int64_t max_rows, int64_t m, int64_t n, int dtype, const void* a, const void* b,
                  void* c, const int32_t* group_rows, void* workspace, void* stream, bool accumulate) {
  return guarded([&] {
    ccfuse::gemm::KGroupedGemmDesc d;
    d.num_groups = num_groups;
    d.max_rows = max_rows;
    d.m = m;
    d.n = n;
    d.dtype = gemm_dtype(dtype);
    d.accumulate = accumulate;
    check_pointers({{a, "a"}, {b, "b"}, {c, "c"}, {group_rows, "group_rows"}, {workspace, "workspace"}});
    // num_sms 0: every SM of the current device (the choice itself asks the device nothing, so
    // kgrouped_run's checks come before any CUDA call)
    const ccfuse::gemm::GemmConfig cfg = ccfuse::gemm::choose_config(d, 0);
    ccfuse::gemm::kgrouped_run(d, cfg, a, b, c, group_rows, workspace, nullptr, stream);
  });
}
}  // namespace

int ccfuse_kgrouped_gemm(int num_groups, int64_t max_rows, int64_t m, int64_t n, int dtype, const void* a,
                         const void* b, void* c, const int32_t* group_rows, void* workspace, void* stream) {
  return kgrouped_gemm(num_groups, max_rows, m, n, dtype, a, b, c, group_rows, workspace, stream, false);
}

int ccfuse_kgrouped_gemm_accumulate(int num_groups, int64_t max_rows, int64_t m, int64_t n, int dtype, const void* a,
                                    const void* b, float* c, const int32_t* group_rows, void* workspace,
                                    void* stream) {
  return kgrouped_gemm(num_groups, max_rows, m, n, dtype, a, b, c, group_rows, workspace, stream, true);
}

int ccfuse_moe_route_workspace_bytes(int num_experts, int topk, int score, int normalize, double capacity_factor,
                                     int drop, int world_size, int64_t num_tokens, int64_t* bytes) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(bytes != nullptr, "bytes must not be null");
    const ccfuse::moe::RouterConfig c =
        router_config(num_experts, topk, score, normalize, capacity_factor, drop, world_size);
    *bytes = int64_t(ccfuse::moe::router_workspace_bytes(c, num_tokens));
  });
}

int ccfuse_moe_route(int num_experts, int topk, int score, int normalize, double capacity_factor, int drop,
                     int world_size, const float* logits, int64_t num_tokens, const float* bias, int32_t* topk_ids,
                     float* topk_weights, int32_t* tokens_per_expert, int64_t* dropped, void* workspace, void* stream) {
  return guarded([&] {
    const ccfuse::moe::RouterConfig c =
        router_config(num_experts, topk, score, normalize, capacity_factor, drop, world_size);
    ccfuse::moe::route_gpu(c, logits, num_tokens, bias, topk_ids, topk_weights, tokens_per_expert, dropped, workspace,
                           stream);
  });
}

int ccfuse_finalize(void) {
  return guarded([] {
    std::lock_guard<std::mutex> lock(team_mu);
    team.reset();
  });
}

const char* ccfuse_last_error(void) { return last_error.c_str(); }

}  // extern "C"
