// The C ABI of include/ccfuse/c_api.h: a process-wide Team and the TP ops behind opaque handles.
#include "ccfuse/c_api.h"

#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "ccfuse/comm/team.h"
#include "ccfuse/common/error.h"
#include "ccfuse/tp/ag_gemm.h"
#include "ccfuse/tp/gemm_rs.h"

struct ccfuse_tp_op {
  std::string op;
  std::unique_ptr<ccfuse::tp::AgGemm> ag;
  std::unique_ptr<ccfuse::tp::GemmRs> rs;
  std::unique_ptr<ccfuse::tp::GemmAr> ar;
};

namespace {

thread_local std::string last_error;
std::mutex team_mu;
std::unique_ptr<ccfuse::comm::Team> team;

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

ccfuse::comm::Team& the_team() {
  std::lock_guard<std::mutex> lock(team_mu);
  CCFUSE_ARG_CHECK(team != nullptr, "no Team: call ccfuse_init_from_env() first");
  return *team;
}

}  // namespace

extern "C" {

int ccfuse_init_from_env(void) {
  return guarded([] {
    std::lock_guard<std::mutex> lock(team_mu);
    if (team == nullptr) team = ccfuse::comm::Team::from_env();
  });
}

int ccfuse_world_size(int* out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = the_team().world_size();
  });
}

int ccfuse_tp_create(const char* op, int64_t m, int64_t n, int64_t k, int b_kn, ccfuse_tp_op** out) {
  return guarded([&] {
    CCFUSE_ARG_CHECK(out != nullptr, "out must not be null");
    *out = nullptr;
    const std::string name = op != nullptr ? op : "";
    CCFUSE_ARG_CHECK(name == "ag_gemm" || name == "gemm_rs" || name == "gemm_ar", "op '", name,
                     "' is not a fused TP op (ag_gemm, gemm_rs, gemm_ar)");
    CCFUSE_ARG_CHECK(b_kn == 0 || b_kn == 1, "b_kn ", b_kn, " must be 0 (B is [n, k]) or 1 (B is [k, n])");
    ccfuse::comm::Team& t = the_team();
    const int w = t.world_size();
    const ccfuse::gemm::BLayout layout = b_kn ? ccfuse::gemm::BLayout::kKN : ccfuse::gemm::BLayout::kNK;
    auto h = std::make_unique<ccfuse_tp_op>();
    h->op = name;
    if (name == "ag_gemm") {
      ccfuse::tp::AgGemmDesc d;
      d.m = m;
      d.n = n;
      d.k = k;
      d.b_layout = layout;
      h->ag = std::make_unique<ccfuse::tp::AgGemm>(t, d);
    } else {
      CCFUSE_ARG_CHECK(k > 0 && k % w == 0, name, ": k ", k, " (the global K) is not divisible by the world size ", w);
      ccfuse::tp::GemmRsDesc d;
      d.m = m;
      d.n = n;
      d.k = k / w;
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

int ccfuse_tp_destroy(ccfuse_tp_op* op) {
  return guarded([&] { delete op; });
}

int ccfuse_finalize(void) {
  return guarded([] {
    std::lock_guard<std::mutex> lock(team_mu);
    team.reset();
  });
}

const char* ccfuse_last_error(void) { return last_error.c_str(); }

}  // extern "C"
