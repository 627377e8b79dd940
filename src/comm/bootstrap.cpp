// Out-of-band bootstrap for mode (b) Teams: rank 0 serves a blob (the NCCL unique id) over TCP.
#include "ccfuse/comm/bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ccfuse/common/error.h"

namespace ccfuse::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Closes the descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

int64_t ms_left(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

// Waits for `events` on fd until the deadline; false on timeout.
bool poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const int64_t left = ms_left(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, int(left > 1000 ? 1000 : left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw Error(detail::str_cat("bootstrap: poll failed: ", std::strerror(errno)));
  }
}

void send_all(int fd, const char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!poll_until(fd, POLLOUT, deadline)) throw TimeoutError("bootstrap: timed out sending to a peer");
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(detail::str_cat("bootstrap: send failed: ", std::strerror(errno)));
    }
    data += w;
    n -= size_t(w);
  }
}

void recv_all(int fd, char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!poll_until(fd, POLLIN, deadline)) throw TimeoutError("bootstrap: timed out receiving from rank 0");
    const ssize_t r = ::recv(fd, data, n, 0);
    if (r == 0) throw Error("bootstrap: rank 0 closed the connection early");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(detail::str_cat("bootstrap: recv failed: ", std::strerror(errno)));
    }
    data += r;
    n -= size_t(r);
  }
}

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    throw InvalidArgument(detail::str_cat("MASTER_ADDR '", host, "' does not resolve: ", gai_strerror(rc)));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(uint16_t(port));
  return addr;
}

int env_int(const char* const* names, int fallback, bool required) {
  for (const char* const* n = names; *n; ++n) {
    const char* v = std::getenv(*n);
    if (!v) continue;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    CCFUSE_ARG_CHECK(end != v && *end == '\0' && x >= 0, "environment variable ", *n, "='", v,
                     "' must be a non-negative integer");
    return int(x);
  }
  CCFUSE_ARG_CHECK(!required, "environment variable ", names[0],
                   " is not set: launch with torchrun, srun or mpirun, or use Team::create");
  return fallback;
}

}  // namespace

std::string broadcast_blob_tcp(int rank, int world_size, const std::string& host, int port,
                               const std::string& blob, int64_t timeout_ms) {
  CCFUSE_ARG_CHECK(world_size >= 1, "world_size ", world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " must be in [0, ", world_size, ")");
  CCFUSE_ARG_CHECK(port > 0 && port < 65536, "bootstrap port ", port, " must be in [1, 65535]");
  if (world_size == 1) return blob;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const sockaddr_in addr = resolve(host, port);

  if (rank == 0) {
    Fd server(::socket(AF_INET, SOCK_STREAM, 0));
    if (server.fd < 0) throw Error(detail::str_cat("bootstrap: socket failed: ", std::strerror(errno)));
    const int one = 1;
    ::setsockopt(server.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in bind_addr = addr;
    bind_addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(server.fd, reinterpret_cast<const sockaddr*>(&bind_addr), sizeof(bind_addr)) != 0)
      throw Error(detail::str_cat("bootstrap: rank 0 cannot listen on port ", port, ": ", std::strerror(errno),
                                  " (set CCFUSE_BOOTSTRAP_PORT to a free port)"));
    if (::listen(server.fd, world_size) != 0)
      throw Error(detail::str_cat("bootstrap: listen failed: ", std::strerror(errno)));
    const uint64_t size = blob.size();
    for (int served = 1; served < world_size; ++served) {
      if (!poll_until(server.fd, POLLIN, deadline))
        throw TimeoutError(detail::str_cat("bootstrap: rank 0 timed out after ", timeout_ms, " ms with ", served - 1,
                                           " of ", world_size - 1, " ranks connected on port ", port));
      Fd client(::accept(server.fd, nullptr, nullptr));
      if (client.fd < 0) throw Error(detail::str_cat("bootstrap: accept failed: ", std::strerror(errno)));
      send_all(client.fd, reinterpret_cast<const char*>(&size), sizeof(size), deadline);
      send_all(client.fd, blob.data(), blob.size(), deadline);
    }
    return blob;
  }

  // Other ranks: retry until rank 0 listens.
  for (;;) {
    Fd sock(::socket(AF_INET, SOCK_STREAM, 0));
    if (sock.fd < 0) throw Error(detail::str_cat("bootstrap: socket failed: ", std::strerror(errno)));
    if (::connect(sock.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      uint64_t size = 0;
      recv_all(sock.fd, reinterpret_cast<char*>(&size), sizeof(size), deadline);
      CCFUSE_CHECK(size < (1u << 20), "bootstrap: implausible blob size ", size);
      std::string out(size_t(size), '\0');
      recv_all(sock.fd, out.data(), out.size(), deadline);
      return out;
    }
    if (ms_left(deadline) <= 0)
      throw TimeoutError(detail::str_cat("bootstrap: rank ", rank, " could not reach rank 0 at ", host, ":", port,
                                         " within ", timeout_ms, " ms"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

LaunchEnv read_launch_env() {
  static const char* const kRank[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", nullptr};
  static const char* const kWorld[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", nullptr};
  static const char* const kLocal[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", nullptr};
  static const char* const kPort[] = {"CCFUSE_BOOTSTRAP_PORT", nullptr};
  static const char* const kMasterPort[] = {"MASTER_PORT", nullptr};
  LaunchEnv env;
  env.rank = env_int(kRank, 0, /*required=*/true);
  env.world_size = env_int(kWorld, 1, /*required=*/true);
  env.local_rank = env_int(kLocal, env.rank, /*required=*/false);
  CCFUSE_ARG_CHECK(env.world_size >= 1, "WORLD_SIZE ", env.world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(env.rank < env.world_size, "RANK ", env.rank, " must be below WORLD_SIZE ", env.world_size);
  const char* addr = std::getenv("MASTER_ADDR");
  env.master_addr = addr && *addr ? addr : "127.0.0.1";
  const int port = env_int(kPort, -1, false);
  if (port >= 0) {
    env.port = port;
  } else {
    const int master = env_int(kMasterPort, -1, false);
    CCFUSE_ARG_CHECK(master >= 0 || env.world_size == 1,
                     "neither CCFUSE_BOOTSTRAP_PORT nor MASTER_PORT is set (needed for WORLD_SIZE ", env.world_size, ")");
    env.port = master >= 0 ? master + 1 : 0;
  }
  CCFUSE_ARG_CHECK(env.world_size == 1 || (env.port > 0 && env.port < 65536), "bootstrap port ", env.port,
                   " must be in [1, 65535]");
  return env;
}

}  // namespace ccfuse::comm
