// ccfuse/comm/bootstrap.h: the out-of-band exchange that mode (b) Teams use to share the NCCL
// unique id (no CUDA, no NCCL: host sockets only, so it is tested on the CPU).
#pragma once

#include <cstdint>
#include <string>

namespace ccfuse::comm {

// Rank 0 serves `blob` on host:port to the other world_size - 1 ranks; they connect (retrying
// until the server is up) and return what it sent. Rank 0 returns `blob`. Throws TimeoutError
// naming the rank and address past timeout_ms, InvalidArgument for a bad rank/size/port.
std::string broadcast_blob_tcp(int rank, int world_size, const std::string& host, int port,
                               const std::string& blob, int64_t timeout_ms);

// Launcher environment (torchrun, srun, mpirun): RANK/WORLD_SIZE/LOCAL_RANK, with the SLURM_* and
// OMPI_COMM_WORLD_* names as fallbacks; MASTER_ADDR (default 127.0.0.1) and the bootstrap port
// (CCFUSE_BOOTSTRAP_PORT, else MASTER_PORT + 1). Throws InvalidArgument naming a missing or bad
// variable.
struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr;
  int port = 0;
};
LaunchEnv read_launch_env();

}  // namespace ccfuse::comm
