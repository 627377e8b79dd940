// Team: NCCL communicator, symmetric buffers, device communicator, watchdog record.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "ccfuse/comm/team.h"
#include "ccfuse/common/cuda_check.h"
#include "ccfuse/common/host_barrier.h"
#include "src/common/driver_api.h"

namespace ccfuse::comm {

namespace {

// ncclGetLsaPointer is device code; peers' addresses are resolved once per buffer by a kernel.
__global__ void resolve_lsa_pointers(ncclWindow_t window, int num_peers, void** out) {
  for (int p = threadIdx.x; p < num_peers; p += blockDim.x) out[p] = ncclGetLsaPointer(window, 0, p);
}

int64_t watchdog_ms_from(const TeamOptions& options) {
  if (options.watchdog_ms > 0) return options.watchdog_ms;
  if (const char* env = std::getenv("CCFUSE_WATCHDOG_MS")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    CCFUSE_ARG_CHECK(end != env && *end == '\0' && v > 0, "CCFUSE_WATCHDOG_MS='", env,
                     "' must be a positive integer (milliseconds)");
    return v;
  }
  return 5000;
}

}  // namespace

// Mode (d): W rank threads on one GPU. Symmetric allocations are exchanged through `slots`;
// `barrier` is aborted when a rank fails, so that no other rank waits for it forever.
struct Team::Loopback {
  explicit Loopback(int n) : barrier(n, "another rank of the one-GPU world failed"), slots(size_t(n)) {}
  HostBarrier barrier;
  std::vector<void*> slots;
  // Collective: every rank's `mine`, by rank.
  std::vector<void*> all_gather(int rank, void* mine) {
    slots[size_t(rank)] = mine;
    barrier.arrive_and_wait();
    std::vector<void*> all = slots;
    barrier.arrive_and_wait();  // nobody overwrites a slot before everyone has read it
    return all;
  }
};

namespace {

// One green context per rank, each with a disjoint share of `device`'s SMs: the largest count
// that W equal groups can have at the driver's granularity (a multiple of 8 SMs on Hopper).
std::vector<CUgreenCtx> make_green_contexts(int device, int n) {
  static const auto device_get = CCFUSE_DRIVER_FN(cuDeviceGet, true);
  static const auto get_resource = CCFUSE_DRIVER_FN(cuDeviceGetDevResource, true);
  static const auto split = CCFUSE_DRIVER_FN(cuDevSmResourceSplitByCount, true);
  static const auto make_desc = CCFUSE_DRIVER_FN(cuDevResourceGenerateDesc, true);
  static const auto create = CCFUSE_DRIVER_FN(cuGreenCtxCreate, true);
  CCFUSE_CUDA_CHECK(cudaSetDevice(device));
  CCFUSE_CUDA_CHECK(cudaFree(nullptr));  // the primary context first (the green ones retain it)
  CUdevice dev = 0;
  detail::driver_check(device_get(&dev, device), "cuDeviceGet");
  CUdevResource all{};
  detail::driver_check(get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource(SM)");
  const unsigned align = std::max(1u, all.sm.smCoscheduledAlignment);
  const unsigned share = all.sm.smCount / unsigned(n) / align * align;
  CCFUSE_ARG_CHECK(share >= std::max(1u, all.sm.minSmPartitionSize), n, " ranks on device ", device,
                   " leave each fewer SMs than a green context may have (", all.sm.smCount, " SMs, at least ",
                   all.sm.minSmPartitionSize, " a context, in steps of ", align, ")");
  std::vector<CUdevResource> groups(static_cast<size_t>(n));
  unsigned made = unsigned(n);
  detail::driver_check(split(groups.data(), &made, &all, nullptr, 0, share), "cuDevSmResourceSplitByCount");
  CCFUSE_CHECK(made == unsigned(n), "device ", device, " split into ", made, " groups of ", share, " SMs, not ", n);
  std::vector<CUgreenCtx> ctxs;
  for (int r = 0; r < n; ++r) {
    CUdevResourceDesc desc = nullptr;
    detail::driver_check(make_desc(&desc, &groups[size_t(r)], 1), "cuDevResourceGenerateDesc");
    CUgreenCtx g = nullptr;
    detail::driver_check(create(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    ctxs.push_back(g);
  }
  return ctxs;
}

void destroy_green_contexts(const std::vector<CUgreenCtx>& ctxs) {
  static const auto destroy = CCFUSE_DRIVER_FN(cuGreenCtxDestroy, true);
  for (CUgreenCtx g : ctxs) destroy(g);  // NOTE: a failure here leaks a context; nothing to do about it
}

void set_current_context(void* ctx) {
  static const auto set_current = CCFUSE_DRIVER_FN(cuCtxSetCurrent, true);
  detail::driver_check(set_current(static_cast<CUcontext>(ctx)), "cuCtxSetCurrent");
}

}  // namespace

void Team::bind() const {
  if (loopback_) set_current_context(green_ctx_);
  else CCFUSE_CUDA_CHECK(cudaSetDevice(device_));
}

void check_nccl_version() {
  int loaded = 0;
  CCFUSE_NCCL_CHECK(ncclGetVersion(&loaded));
  const int built = NCCL_VERSION_CODE;
  // Version codes are MAJOR*10000 + MINOR*100 + PATCH since 2.9.
  const bool same_minor = loaded / 100 == built / 100;
  const char* allow = std::getenv("CCFUSE_ALLOW_NCCL_MISMATCH");
  if (!same_minor && !(allow && std::string(allow) == "1")) {
    throw Error(detail::str_cat("ccfuse was built against NCCL ", built, " but NCCL ", loaded,
                                " is loaded; the NCCL device API has no ABI promise across releases: "
                                "put the matching libnccl.so.2 first on LD_LIBRARY_PATH "
                                "(or set CCFUSE_ALLOW_NCCL_MISMATCH=1 at your own risk)"));
  }
}

std::unique_ptr<Team> Team::create(const ncclUniqueId& id, int rank, int world_size, int device,
                                   TeamOptions options) {
  CCFUSE_ARG_CHECK(world_size >= 1, "world_size ", world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " must be in [0, ", world_size, ")");
  int num_devices = 0;
  CCFUSE_CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  CCFUSE_ARG_CHECK(device >= 0 && device < num_devices, "device ", device, " must be in [0, ", num_devices,
                   ") (CUDA devices present)");
  check_nccl_version();
  CCFUSE_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  CCFUSE_NCCL_CHECK(ncclCommInitRankConfig(&comm, world_size, id, rank, &config));
  std::unique_ptr<Team> team(new Team());
  team->init(comm, /*owns_comm=*/true, options);
  return team;
}

std::unique_ptr<Team> Team::from_env(TeamOptions options) {
  const LaunchEnv env = read_launch_env();
  int num_devices = 0;
  CCFUSE_CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  CCFUSE_ARG_CHECK(env.local_rank < num_devices, "LOCAL_RANK ", env.local_rank, " has no GPU: ", num_devices,
                   " CUDA devices present");
  ncclUniqueId id{};
  std::string blob;
  if (env.rank == 0) {
    CCFUSE_NCCL_CHECK(ncclGetUniqueId(&id));
    blob.assign(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  blob = broadcast_blob_tcp(env.rank, env.world_size, env.master_addr, env.port, blob,
                            /*timeout_ms=*/std::max<int64_t>(60000, watchdog_ms_from(options)));
  CCFUSE_CHECK(blob.size() == sizeof(id), "bootstrap returned ", blob.size(), " bytes, want ", sizeof(id));
  std::memcpy(&id, blob.data(), sizeof(id));
  return create(id, env.rank, env.world_size, env.local_rank, options);
}

std::unique_ptr<Team> Team::from_comm(ncclComm_t comm, TeamOptions options) {
  CCFUSE_ARG_CHECK(comm != nullptr, "comm must be a valid ncclComm_t, got null");
  check_nccl_version();
  int device = 0;
  CCFUSE_NCCL_CHECK(ncclCommCuDevice(comm, &device));
  CCFUSE_CUDA_CHECK(cudaSetDevice(device));
  std::unique_ptr<Team> team(new Team());
  team->init(comm, /*owns_comm=*/false, options);
  return team;
}

void Team::init(ncclComm_t comm, bool owns_comm, TeamOptions options) {
  comm_ = comm;
  owns_comm_ = owns_comm;
  CCFUSE_NCCL_CHECK(ncclCommUserRank(comm, &rank_));
  CCFUSE_NCCL_CHECK(ncclCommCount(comm, &world_size_));
  CCFUSE_NCCL_CHECK(ncclCommCuDevice(comm, &device_));
  CCFUSE_ARG_CHECK(world_size_ <= kMaxLsaRanks, "world size ", world_size_, " exceeds the ", kMaxLsaRanks,
                   " ranks one NVLink domain may have in ccfuse");

  // The device communicator. NOTE: never lsaMultimem (NVLink multicast can take shared GPUs down).
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof(reqs));  // 2.28 has no initializer macro
  reqs.lsaBarrierCount = 1;
  reqs.lsaMultimem = false;
  const ncclResult_t res = ncclDevCommCreate(comm, &reqs, &dev_comm_);
  if (res != ncclSuccess)
    throw Error(detail::str_cat("ncclDevCommCreate failed (", ncclGetErrorString(res),
                                "): ccfuse needs NCCL symmetric memory: CUDA P2P between all local GPUs and "
                                "cuMem (NCCL_CUMEM_ENABLE must not be 0)"));
  has_dev_comm_ = true;
  CCFUSE_ARG_CHECK(dev_comm_.lsaSize == world_size_ && dev_comm_.lsaRank == rank_,
                   "every rank of a ccfuse Team must share one NVLink (LSA) domain: this rank sees lsaSize ",
                   dev_comm_.lsaSize, " of ", world_size_, " ranks (multi-node GIN is not supported yet)");

  init_common(options);
}

void Team::init_common(TeamOptions options) {
  watchdog_ms_ = watchdog_ms_from(options);
  CCFUSE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&watchdog_), sizeof(WatchdogRecord), cudaHostAllocMapped));
  std::memset(watchdog_, 0, sizeof(WatchdogRecord));
  CCFUSE_CUDA_CHECK(cudaMalloc(&watchdog_claim_, sizeof(int32_t)));
  CCFUSE_CUDA_CHECK(cudaMemset(watchdog_claim_, 0, sizeof(int32_t)));
  team_barrier_ = make_signals("team.barrier", 0);
}

Team::~Team() {
  // Members that free symmetric memory go first: they deregister windows on this communicator.
  try {
    team_barrier_.reset();
    if (has_dev_comm_) ncclDevCommDestroy(comm_, &dev_comm_);
    if (owns_comm_ && comm_) {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
  } catch (...) {
    // NOTE: destructors never throw; a failure here leaks, it does not crash.
  }
  if (watchdog_) cudaFreeHost(watchdog_);
  if (watchdog_claim_) cudaFree(watchdog_claim_);
}

std::unique_ptr<SymmetricBuffer> Team::alloc_symmetric(size_t bytes) {
  CCFUSE_ARG_CHECK(bytes > 0, "symmetric buffer size must be positive, got ", bytes, " bytes");
  bind();
  std::unique_ptr<SymmetricBuffer> buf(new SymmetricBuffer());
  buf->team_ = this;
  buf->rank_ = rank_;
  // Window offsets must be 4 KiB aligned; ncclMemAlloc hands out whole granules anyway.
  buf->bytes_ = size_t(round_up(int64_t(bytes), NCCL_WIN_REQUIRED_ALIGNMENT));
  if (loopback_) {
    CCFUSE_CUDA_CHECK(cudaMalloc(&buf->local_, buf->bytes_));
    CCFUSE_CUDA_CHECK(cudaMemset(buf->local_, 0, buf->bytes_));
    CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    buf->peers_ = loopback_->all_gather(rank_, buf->local_);  // also: every rank's memory is zeroed
    buffers_.push_back(buf.get());
    return buf;
  }
  CCFUSE_NCCL_CHECK(ncclMemAlloc(&buf->local_, buf->bytes_));
  CCFUSE_CUDA_CHECK(cudaMemset(buf->local_, 0, buf->bytes_));
  CCFUSE_NCCL_CHECK(ncclCommWindowRegister(comm_, buf->local_, buf->bytes_, &buf->window_, NCCL_WIN_COLL_SYMMETRIC));
  CCFUSE_CHECK(buf->window_ != nullptr, "ncclCommWindowRegister returned no window: symmetric memory is off");

  void** d_peers = nullptr;
  CCFUSE_CUDA_CHECK(cudaMalloc(&d_peers, sizeof(void*) * size_t(world_size_)));
  resolve_lsa_pointers<<<1, 32>>>(buf->window_, world_size_, d_peers);
  CCFUSE_CUDA_CHECK_LAUNCH();
  buf->peers_.resize(size_t(world_size_));
  CCFUSE_CUDA_CHECK(cudaMemcpy(buf->peers_.data(), d_peers, sizeof(void*) * size_t(world_size_), cudaMemcpyDeviceToHost));
  CCFUSE_CUDA_CHECK(cudaFree(d_peers));
  // NOTE: NCCL maps every rank's memory, the own one too, into one flat VA range, so the LSA
  // pointer of the own rank is a second mapping of local_. Use local_ for the own rank.
  buf->peers_[size_t(rank_)] = buf->local_;
  // Everyone's zeroed memory must be in place before anyone signals into it (the memset ran on
  // the legacy stream; the window registration above was collective).
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  buffers_.push_back(buf.get());
  return buf;
}

SymmetricBuffer::~SymmetricBuffer() {
  if (!team_) return;
  auto& list = team_->buffers_;
  list.erase(std::remove(list.begin(), list.end(), this), list.end());
  try {
    team_->bind();
    if (team_->loopback_) {
      // Collective, as the window deregistration is: no rank frees while a peer may still write.
      // After a rank failed the barrier throws and the memory leaks (a peer's kernel may still run).
      team_->loopback_->barrier.arrive_and_wait();
      if (local_) cudaFree(local_);
      return;
    }
  } catch (...) {
    return;  // NOTE: destructors never throw
  }
  if (window_) ncclCommWindowDeregister(team_->comm_, window_);
  if (local_) ncclMemFree(local_);
}

void* SymmetricBuffer::peer(int r) const {
  CCFUSE_ARG_CHECK(r >= 0 && r < int(peers_.size()), "peer rank ", r, " must be in [0, ", peers_.size(), ")");
  return peers_[size_t(r)];
}

void Team::require_symmetric(const void* ptr, size_t bytes, const char* what) const {
  const char* p = static_cast<const char*>(ptr);
  for (const SymmetricBuffer* b : buffers_) {
    const char* base = static_cast<const char*>(b->local());
    if (p >= base && p + bytes <= base + b->bytes()) return;
  }
  throw InvalidArgument(detail::str_cat(what, " (", ptr, ", ", bytes,
                                        " bytes) is not inside a symmetric buffer of this Team: "
                                        "allocate it with Team::alloc_symmetric"));
}

void Team::check_watchdog() const {
  const volatile WatchdogRecord* rec = watchdog_;
  if (rec->fired != 1) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  const int set_id = rec->set_id;
  const std::string set_name =
      set_id >= 0 && set_id < int(set_names_.size()) ? set_names_[size_t(set_id)] : std::string("?");
  const double waited_ms = double(rec->waited_ns) / 1e6;
  // Slots past a set's user signals are its entry barrier (one slot per rank).
  const bool is_barrier = set_id >= 0 && set_id < int(set_sizes_.size()) && rec->index >= set_sizes_[size_t(set_id)];
  const std::string signal =
      is_barrier ? detail::str_cat("entry barrier of '", set_name, "'")
                 : detail::str_cat("signal '", set_name, "'[", rec->index, "]");
  const std::string what =
      detail::str_cat("rank ", rec->rank, ": timed out after ", waited_ms, " ms (bound ", watchdog_ms_,
                      " ms) waiting for ", signal, " from rank ", rec->producer, " (want epoch ", rec->want,
                      ", have ", rec->have, ")");
  throw TimeoutError(what);
}

void Team::reset_watchdog() {
  bind();
  // In a one-GPU world no device sync: it would also wait for the other ranks' kernels
  // (measured), which may wait for this rank's next call. There the caller's stream is idle
  // already (Team::synchronize threw); work on its other streams is not waited for.
  if (!loopback_) CCFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  std::memset(watchdog_, 0, sizeof(WatchdogRecord));
  CCFUSE_CUDA_CHECK(cudaMemset(watchdog_claim_, 0, sizeof(int32_t)));
}

void Team::synchronize(cudaStream_t stream) const {
  CCFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  CCFUSE_CUDA_CHECK(cudaGetLastError());
  check_watchdog();
}

void Team::barrier(cudaStream_t stream) { team_barrier_->begin_call(stream); }

void run_local_world(const std::vector<int>& devices, const std::function<void(Team&)>& fn, TeamOptions options) {
  CCFUSE_ARG_CHECK(!devices.empty(), "run_local_world needs at least one device");
  const int n = int(devices.size());
  const bool one_gpu = n > 1 && std::all_of(devices.begin(), devices.end(), [&](int d) { return d == devices[0]; });
  if (!one_gpu) {
    std::vector<int> sorted = devices;
    std::sort(sorted.begin(), sorted.end());
    CCFUSE_ARG_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                     "devices: list each GPU once, or one GPU for every rank (a one-GPU world); "
                     "a GPU listed twice among others is not supported");
  }
  std::vector<CUgreenCtx> green;
  std::shared_ptr<Team::Loopback> hub;
  ncclUniqueId id{};
  if (one_gpu) {
    int num_devices = 0;
    CCFUSE_CUDA_CHECK(cudaGetDeviceCount(&num_devices));
    CCFUSE_ARG_CHECK(devices[0] >= 0 && devices[0] < num_devices, "device ", devices[0], " must be in [0, ",
                     num_devices, ") (CUDA devices present)");
    CCFUSE_ARG_CHECK(n <= kMaxLsaRanks, "world size ", n, " exceeds the ", kMaxLsaRanks,
                     " ranks one NVLink domain may have in ccfuse");
    // Both are read when CUDA starts, so they can only be asked for here.
    static std::once_flag warned;
    const char* loading = std::getenv("CUDA_MODULE_LOADING");
    if (std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") == nullptr || loading == nullptr || std::string(loading) != "EAGER")
      std::call_once(warned, [] {
        std::fprintf(stderr, "ccfuse: a one-GPU world wants CUDA_MODULE_LOADING=EAGER (a kernel's first launch under "
                             "lazy loading waits for the running kernels, a peer's among them) and "
                             "CUDA_DEVICE_MAX_CONNECTIONS=32 (the ranks' streams must not share hardware queues), "
                             "set before the process starts; without them a rank may time out\n");
      });
    green = make_green_contexts(devices[0], n);
    hub = std::make_shared<Team::Loopback>(n);
  } else {
    check_nccl_version();
    CCFUSE_NCCL_CHECK(ncclGetUniqueId(&id));
  }
  static const auto from_green = CCFUSE_DRIVER_FN(cuCtxFromGreenCtx, true);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  // The root cause is the first failure in time, a timeout first: the others may follow from it.
  std::atomic<int> first_failed{-1}, first_timeout{-1};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Team> team;
      try {
        if (one_gpu) {
          CUcontext ctx = nullptr;
          detail::driver_check(from_green(&ctx, green[size_t(r)]), "cuCtxFromGreenCtx");
          set_current_context(ctx);
          team.reset(new Team());
          team->loopback_ = hub;
          team->green_ctx_ = ctx;
          team->rank_ = r;
          team->world_size_ = n;
          team->device_ = devices[0];
          team->init_common(options);
        } else {
          team = Team::create(id, r, n, devices[size_t(r)], options);
        }
        fn(*team);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        int none = -1;
        first_failed.compare_exchange_strong(none, r);
        try {
          throw;
        } catch (const TimeoutError&) {
          none = -1;
          first_timeout.compare_exchange_strong(none, r);
        } catch (...) {
        }
        if (hub) hub->barrier.abort();  // the other ranks' collectives fail instead of waiting
      }
      team.reset();  // after the abort: a failed rank's collective frees must not wait for the others
    });
  }
  for (auto& t : threads) t.join();
  if (one_gpu) destroy_green_contexts(green);
  if (first_timeout.load() >= 0) std::rethrow_exception(errors[size_t(first_timeout.load())]);
  if (first_failed.load() >= 0) std::rethrow_exception(errors[size_t(first_failed.load())]);
}

}  // namespace ccfuse::comm
