// SignalSet: flags in symmetric memory, a device epoch counter, and the entry barrier kernel.
#include <cuda.h>

#include <algorithm>

#include "ccfuse/comm/signals.cuh"
#include "ccfuse/common/cuda_check.h"
#include "src/common/driver_api.h"

namespace ccfuse::comm {

namespace {

// One CTA: bump the epoch, then meet every rank on the barrier slots of this epoch. Stream
// order makes this the entry barrier of DESIGN §2.2: once all ranks pass it, every rank has
// finished its previous call, so nobody overwrites what a peer still reads.
// `reset[0, reset_count)` (local flags of a set written with fixed values) is zeroed first: this
// rank consumed every one of them in its previous call, and no peer writes them again before
// it has passed the barrier below.
__global__ void begin_call_kernel(DeviceSignals sig, epoch_t* reset, int reset_count) {
  // A kernel launched after this one with programmatic dependent launch may start now; it waits
  // (griddepcontrol.wait) for this kernel's completion before anything that depends on it.
  asm volatile("griddepcontrol.launch_dependents;");
  for (int i = threadIdx.x; i < reset_count; i += blockDim.x) reset[i] = 0;
  __shared__ epoch_t epoch;
  if (threadIdx.x == 0) {
    epoch = *sig.epoch + 1;
    *const_cast<epoch_t*>(sig.epoch) = epoch;
  }
  __syncthreads();
  barrier_cta(sig, epoch);  // on a watchdog the record says who was missing
}

}  // namespace

std::unique_ptr<SignalSet> Team::make_signals(const std::string& name, int num_signals) {
  CCFUSE_ARG_CHECK(num_signals >= 0, "num_signals ", num_signals, " must not be negative (signal set '", name, "')");
  std::unique_ptr<SignalSet> set(new SignalSet());
  set->name_ = name;
  set->num_signals_ = num_signals;
  const size_t num_flags = size_t(num_signals) + size_t(world_size_);
  // The epoch before the flags: the collective is the last step, so that no rank is still
  // allocating (cudaMalloc may wait for the GPU's running kernels) once a peer that left the
  // collective launches kernels that wait for it (a one-GPU world; harmless elsewhere).
  CCFUSE_CUDA_CHECK(cudaMalloc(&set->epoch_, sizeof(epoch_t)));
  CCFUSE_CUDA_CHECK(cudaMemset(set->epoch_, 0, sizeof(epoch_t)));
  set->flags_ = alloc_symmetric(num_flags * sizeof(epoch_t));
  DeviceSignals& d = set->dev_;
  for (int r = 0; r < world_size_; ++r) d.flags[r] = static_cast<epoch_t*>(set->flags_->peer(r));
  d.epoch = set->epoch_;
  d.watchdog = nullptr;
  CCFUSE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d.watchdog), watchdog_, 0));
  d.watchdog_claim = watchdog_claim_;
  d.timeout_ns = uint64_t(watchdog_ms_) * 1000000ull;
  d.rank = rank_;
  d.world_size = world_size_;
  d.num_signals = num_signals;
  d.set_id = int(set_names_.size());
  set_names_.push_back(name);
  set_sizes_.push_back(num_signals);
  // The memsets above ran on the legacy stream. Not cudaDeviceSynchronize: in a one-GPU world
  // it would also wait for the other ranks' kernels, which may wait for this rank's next call.
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  return set;
}

SignalSet::~SignalSet() {
  if (epoch_) cudaFree(epoch_);
}

void SignalSet::begin_call(cudaStream_t stream, const SignalSet* reset) const {
  const int threads = int(round_up(std::max(dev_.world_size, reset != nullptr ? 256 : 1), 32));
  begin_call_kernel<<<1, threads, 0, stream>>>(dev_, reset != nullptr ? reset->dev_.flags[reset->dev_.rank] : nullptr,
                                               reset != nullptr ? reset->num_signals_ : 0);
  CCFUSE_CUDA_CHECK_LAUNCH();
}

void stream_write_flag(cudaStream_t stream, epoch_t* flag, epoch_t value) {
  static const auto fn = CCFUSE_DRIVER_FN(cuStreamWriteValue64, /*required=*/true);
  const CUresult r = fn(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value, 0);
  CCFUSE_CHECK(r == CUDA_SUCCESS, "cuStreamWriteValue64 to flag ", static_cast<void*>(flag), " failed (CUresult ", int(r), ")");
}

epoch_t SignalSet::read_epoch() const {
  epoch_t e = 0;
  CCFUSE_CUDA_CHECK(cudaMemcpy(&e, epoch_, sizeof(e), cudaMemcpyDeviceToHost));
  return e;
}

}  // namespace ccfuse::comm
