// ccfuse/comm/team.h: the communication runtime over an NCCL communicator (DESIGN §2.2, §3).
//
// A Team is one rank's view of a group of GPUs in one NVLink (LSA) domain. It gives
//   - symmetric buffers: ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC), with
//     peer pointers (NVLink load/store) for kernels and for the copy engine;
//   - signal sets: 64-bit flags in symmetric memory with the device-resident epoch protocol
//     (ccfuse/comm/epoch.h), an entry barrier per call, and watchdog'd waits;
//   - the NCCL device communicator (ncclDevComm) for kernels that use the NCCL device API.
// No NVLink multicast anywhere: lsaMultimem is never set.
//
// Collective calls (every rank must make them, in the same order): creation, alloc_symmetric,
// make_signals, and the destructors of what they return.
// ASSUMPTION: SymmetricBuffers and SignalSets are destroyed before the Team that made them (they
// deregister their windows on its communicator).
//
// Four ways to make a Team:
//   (a) one process drives all local GPUs, one thread per GPU:   run_local_world(...)
//       or Team::create(unique_id, rank, world_size, device) on each thread;
//   (b) one process per GPU (torchrun / srun / mpirun):           Team::from_env()
//   (c) around an existing communicator (e.g. PyTorch's):         Team::from_comm(comm)
//   (d) W ranks sharing one GPU, for tests and emulation:        run_local_world({d, d, ...})
//       Each rank is a thread with its own green context (a disjoint 1/W share of the SMs, so
//       that every rank's persistent kernels are resident at once and waits between ranks make
//       progress); "symmetric" buffers are plain allocations on that GPU whose addresses the
//       ranks exchange; no NCCL communicator (comm() is null). The kernels, signals, watchdog
//       and schedules are the multi-GPU ones; the transport is the GPU's own memory instead of
//       NVLink, so timings say nothing about a multi-GPU run. Set CUDA_MODULE_LOADING=EAGER and
//       CUDA_DEVICE_MAX_CONNECTIONS=32 before the process starts: under lazy loading a kernel's
//       first launch waits for the GPU's running kernels (a peer's too), and W ranks' streams
//       must not share hardware queues.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ccfuse/comm/bootstrap.h"
#include "ccfuse/comm/epoch.h"
#include "ccfuse/comm/watchdog.h"
#include "ccfuse/common/hd.h"

namespace ccfuse::comm {

// Largest LSA team a kernel argument carries peer pointers for.
// ASSUMPTION: one NVLink domain of at most 32 GPUs (an HGX board has 8; NVL72 racks need GIN
// or a larger table).
constexpr int kMaxLsaRanks = 32;

struct TeamOptions {
  // Bound of every device-side wait, in ms. <= 0: CCFUSE_WATCHDOG_MS from the environment, else 5000.
  int64_t watchdog_ms = 0;
};

// Typed pointers to one symmetric allocation on every rank of the Team (device-usable).
template <typename T>
struct SymmetricView {
  T* ptrs[kMaxLsaRanks];
  int rank;
  int world_size;
  CCFUSE_HD T* local() const { return ptrs[rank]; }
  CCFUSE_HD T* peer(int r) const { return ptrs[r]; }
};

class Team;

// One symmetric allocation. Same size on every rank; freed collectively by its destructor.
class SymmetricBuffer {
 public:
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  void* local() const { return local_; }
  size_t bytes() const { return bytes_; }
  ncclWindow_t window() const { return window_; }
  // Address of rank r's copy, mapped into this process (NVLink loads/stores, copy engine).
  void* peer(int r) const;

  template <typename T>
  SymmetricView<T> view() const {
    SymmetricView<T> v{};
    for (size_t r = 0; r < peers_.size(); ++r) v.ptrs[r] = static_cast<T*>(peers_[r]);
    v.rank = rank_;
    v.world_size = int(peers_.size());
    return v;
  }

 private:
  friend class Team;
  SymmetricBuffer() = default;
  Team* team_ = nullptr;
  void* local_ = nullptr;
  size_t bytes_ = 0;
  ncclWindow_t window_ = nullptr;
  int rank_ = 0;
  std::vector<void*> peers_;
};

// What a kernel needs to publish and wait for the signals of one SignalSet (pass by value).
struct DeviceSignals {
  epoch_t* flags[kMaxLsaRanks];  // flags[r] = rank r's flag array (this rank's peers' views)
  const epoch_t* epoch;          // this rank's call counter: the epoch of the current call
  WatchdogRecord* watchdog;      // host-mapped record of this rank
  int32_t* watchdog_claim;       // device word: nonzero once a wait of this rank timed out
  uint64_t timeout_ns;
  int rank;
  int world_size;
  int num_signals;               // user signals; [num_signals, num_signals + W) are barrier slots
  int set_id;
};

// A symmetric array of `num_signals` flags plus an epoch counter and an entry barrier.
// Per call of an op: begin_call(stream) (entry barrier across ranks + epoch += 1, one tiny
// kernel), then the op's kernels read the epoch from device memory, publish it with
// notify() and wait for it with wait() (ccfuse/comm/signals.cuh). No host sync, no memset,
// CUDA-graph capturable.
class SignalSet {
 public:
  ~SignalSet();
  const std::string& name() const { return name_; }
  int num_signals() const { return num_signals_; }
  const DeviceSignals& device() const { return dev_; }
  // Entry barrier (every rank has finished its previous call on its stream) + epoch bump.
  // `reset`: a set whose local flags (the first num_signals) are zeroed before this rank enters
  // the barrier: flags written with a fixed value (1) by the copy engine (cuStreamWriteValue64,
  // which cannot read the device epoch) are consumed once per call and cleared here, before any
  // peer can start the next call's writes.
  void begin_call(cudaStream_t stream, const SignalSet* reset = nullptr) const;
  // Host read of the device epoch counter (synchronous; tests and diagnostics only).
  epoch_t read_epoch() const;

 private:
  friend class Team;
  SignalSet() = default;
  std::string name_;
  int num_signals_ = 0;
  std::unique_ptr<SymmetricBuffer> flags_;
  epoch_t* epoch_ = nullptr;  // device memory, local
  DeviceSignals dev_{};
};

// Stores `value` into `flag` (local or a peer's symmetric memory) from `stream`'s front end,
// after a system-wide memory fence, in stream order (cuStreamWriteValue64): a flag that follows
// a copy-engine copy on the same stream without using an SM. Capturable in CUDA graphs.
void stream_write_flag(cudaStream_t stream, epoch_t* flag, epoch_t value);

class Team {
 public:
  // (a) Join a group as `rank` of `world_size` on CUDA device `device`.
  static std::unique_ptr<Team> create(const ncclUniqueId& id, int rank, int world_size, int device,
                                      TeamOptions options = {});
  // (b) From the launcher's environment: RANK, WORLD_SIZE, LOCAL_RANK (device), MASTER_ADDR,
  // and CCFUSE_BOOTSTRAP_PORT (default MASTER_PORT + 1, since torchrun's store holds MASTER_PORT).
  static std::unique_ptr<Team> from_env(TeamOptions options = {});
  // (c) Around a communicator owned by someone else (not destroyed by the Team). Uses the
  // communicator's device.
  static std::unique_ptr<Team> from_comm(ncclComm_t comm, TeamOptions options = {});

  ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  // Null for a one-GPU world (mode d): no NCCL communicator there.
  ncclComm_t comm() const { return comm_; }
  // True for mode (d): the ranks share one GPU, each in its own green context.
  bool shares_device() const { return loopback_ != nullptr; }
  const ncclDevComm& dev_comm() const { return dev_comm_; }
  int64_t watchdog_ms() const { return watchdog_ms_; }

  // Collective. bytes > 0; rounded up to the allocation granularity.
  std::unique_ptr<SymmetricBuffer> alloc_symmetric(size_t bytes);
  // Collective. num_signals >= 0; the name appears in watchdog errors.
  std::unique_ptr<SignalSet> make_signals(const std::string& name, int num_signals);

  // Barrier across the Team on `stream` (in-kernel, watchdog'd). Collective.
  void barrier(cudaStream_t stream);

  // Throws TimeoutError if a device wait of this rank passed its bound since the last reset.
  void check_watchdog() const;
  // Clears the record (after a handled timeout, so the Team can be used again). Waits for the
  // device first, except in a one-GPU world (mode d), where only the stream that
  // synchronize() saw fail is known to be idle.
  void reset_watchdog();
  // cudaStreamSynchronize + launch errors + check_watchdog.
  void synchronize(cudaStream_t stream) const;

  // Throws InvalidArgument unless `ptr` lies in one of this Team's symmetric buffers
  // (`what` names the argument in the message).
  void require_symmetric(const void* ptr, size_t bytes, const char* what) const;

 private:
  Team() = default;
  void init(ncclComm_t comm, bool owns_comm, TeamOptions options);
  void init_common(TeamOptions options);  // watchdog record and the team barrier (both modes)
  // Makes this rank's device current on the calling thread: its green context in mode (d).
  void bind() const;
  friend class SymmetricBuffer;
  friend class SignalSet;
  friend void run_local_world(const std::vector<int>&, const std::function<void(Team&)>&, TeamOptions);

  struct Loopback;                       // mode (d): the ranks' meeting point (team.cu)
  std::shared_ptr<Loopback> loopback_;   // null for an NCCL Team
  void* green_ctx_ = nullptr;            // mode (d): this rank's CUcontext (from its green context)

  int rank_ = 0, world_size_ = 0, device_ = 0;
  bool owns_comm_ = false;
  ncclComm_t comm_ = nullptr;
  ncclDevComm dev_comm_{};
  bool has_dev_comm_ = false;
  int64_t watchdog_ms_ = 5000;
  WatchdogRecord* watchdog_ = nullptr;  // host-mapped pinned
  int32_t* watchdog_claim_ = nullptr;   // device memory
  std::vector<std::string> set_names_;   // by DeviceSignals::set_id, for watchdog messages
  std::vector<int> set_sizes_;           // user signals per set (the rest are barrier slots)
  std::vector<const SymmetricBuffer*> buffers_;
  std::unique_ptr<SignalSet> team_barrier_;
};

// Mode (a) helper: one thread per device, a Team each, fn(team) on every thread; rethrows the
// first error (the root cause: a rank's own failure before any knock-on error of another).
// The same device listed W >= 2 times is mode (d): W ranks on that GPU, each thread running fn
// with its green context current (cudaSetDevice in fn would leave it: call it before, not in fn).
// Devices listed twice among others are rejected.
void run_local_world(const std::vector<int>& devices, const std::function<void(Team&)>& fn,
                     TeamOptions options = {});

// NCCL version this ccfuse was built against and the one loaded; throws if major.minor differ
// (the device API has no ABI promise across releases). CCFUSE_ALLOW_NCCL_MISMATCH=1 overrides.
void check_nccl_version();

}  // namespace ccfuse::comm
