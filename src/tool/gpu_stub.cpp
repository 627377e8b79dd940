// src/tool/gpu_stub.cpp: the GPU backend of a host-only build (CCFUSE_WITH_CUDA=OFF). It reports
// no GPUs, so `auto` picks the CPU world; an explicit GPU run gets a clear error, not a crash.
#include "ccfuse/common/error.h"
#include "src/tool/cli.h"

namespace ccfuse::tool {

namespace {
[[noreturn]] void no_cuda() { throw Error("this ccfuse was built without CUDA: use --backend cpu"); }
}  // namespace

int count_gpus() { return 0; }

CheckResult gpu_check(const Options&, std::ostream&) { no_cuda(); }

BenchRecord gpu_bench(const Options&, std::ostream&) { no_cuda(); }

std::string gpu_gemm_config(const Options&) { no_cuda(); }

}  // namespace ccfuse::tool
