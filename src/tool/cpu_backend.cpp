// src/tool/cpu_backend.cpp: `check` and `bench` on the CPU reference world (W rank threads).
//
// check: random inputs (rounded to the dtype), outputs poisoned with NaN, the op on every rank
// inside World::run, then ‖out − ref‖/‖ref‖ over all ranks against the fp64 naive reference on
// the same rounded inputs.
//
// bench: CPU wall-clock medians of the same DESIGN §5 metrics. They time the reference world
// (threads, atomics, a scalar GEMM), not a GPU: useful to exercise the pipeline and the records,
// not as performance numbers. The parts are defined as
//   t_gemm   one rank's local GEMM alone (scalar fp32 loop, one thread)
//   t_comm   the bytes the op moves between ranks, memcpy'd by W threads
//   t_serial t_comm's copies and t_gemm's GEMM back to back, in the op's order
//   t_limit  max(t_gemm, t_comm); t_peer: none on the CPU (null)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "ccfuse/common/error.h"
#include "reference/naive.h"
#include "reference/tp_ops.h"
#include "reference/world.h"
#include "src/tool/cli.h"

namespace ccfuse::tool {

namespace {

using Clock = std::chrono::steady_clock;

// Per-rank shapes of one problem. --k is the global K; gemm_rs/gemm_ar hold K/W per rank.
struct Problem {
  std::string op;
  int w = 1;
  int64_t m = 0, n = 0, k_local = 0, m_local = 0;
  size_t a_count = 0, b_count = 0, c_count = 0;  // elements per rank
};

Problem problem_of(const Options& o) {
  CCFUSE_ARG_CHECK(o.world_size >= 1 && o.seed.has_value(),
                   "the CPU backend needs resolved options (world size and seed set; see resolve())");
  Problem p;
  p.op = o.op;
  p.w = o.world_size;
  p.m = o.m;
  p.n = o.n;
  p.k_local = local_k(o);
  p.m_local = o.m / o.world_size;
  if (o.op == "ag_gemm") {
    p.a_count = size_t(p.m_local * p.k_local);
    p.c_count = size_t(p.m * p.n);
  } else if (o.op == "gemm_rs" || o.op == "gemm_ar") {
    p.a_count = size_t(p.m * p.k_local);
    p.c_count = size_t((o.op == "gemm_rs" ? p.m_local : p.m) * p.n);
  } else {
    throw InvalidArgument(detail::str_cat("unknown op '", o.op, "'"));
  }
  p.b_count = size_t(p.k_local * p.n);
  return p;
}

// Poison for outputs: a cell the op forgets to write stays NaN, and rel_err turns +inf.
template <typename T> T poison();
template <> float poison<float>() { return std::numeric_limits<float>::quiet_NaN(); }
template <> bf16 poison<bf16>() { return bf16{0x7FC0}; }

template <typename T>
struct Inputs {
  std::vector<std::vector<T>> a, b;  // per rank, in the op's dtype
  ref::RankMats a_d, b_d;            // the same values as doubles, for the fp64 reference
};

template <typename T>
Inputs<T> make_inputs(const Problem& p, uint64_t seed) {
  Inputs<T> in;
  const size_t w = size_t(p.w);
  in.a.resize(w), in.b.resize(w), in.a_d.resize(w), in.b_d.resize(w);
  std::vector<float> buf;
  const auto fill = [&](int rank, int which, size_t count, std::vector<T>& typed, std::vector<double>& wide) {
    buf.resize(count);
    fill_uniform(seed, rank, which, buf.data(), count);
    typed.resize(count);
    wide.resize(count);
    for (size_t i = 0; i < count; ++i) {
      typed[i] = from_f32<T>(buf[i]);
      wide[i] = double(to_f32(typed[i]));  // the reference sees exactly what the op sees
    }
  };
  for (int r = 0; r < p.w; ++r) {
    fill(r, 0, p.a_count, in.a[size_t(r)], in.a_d[size_t(r)]);
    fill(r, 1, p.b_count, in.b[size_t(r)], in.b_d[size_t(r)]);
  }
  return in;
}

// The three reference ops behind one call shape, so check and bench need no switch per op.
template <typename T>
struct FusedOp {
  virtual ~FusedOp() = default;
  virtual void run(int rank, const T* a, const T* b, T* c) = 0;
};

template <typename T, typename Op>
struct FusedOpOf final : FusedOp<T> {
  Op op;
  FusedOpOf(ref::World& world, ref::TpShape shape, ref::TpConfig config) : op(world, shape, config) {}
  void run(int rank, const T* a, const T* b, T* c) override { op.run(rank, a, b, c); }
};

template <typename T>
std::unique_ptr<FusedOp<T>> make_fused(ref::World& world, const Problem& p, const Options& o) {
  const ref::TpShape shape{p.m, p.n, p.k_local};
  ref::TpConfig config;
  config.block_m = o.block_m;
  config.block_n = o.block_n;
  if (p.op == "ag_gemm") return std::make_unique<FusedOpOf<T, ref::AgGemm<T>>>(world, shape, config);
  if (p.op == "gemm_rs") return std::make_unique<FusedOpOf<T, ref::GemmRs<T>>>(world, shape, config);
  return std::make_unique<FusedOpOf<T, ref::GemmAr<T>>>(world, shape, config);
}

ref::RankMats naive_of(const Problem& p, const ref::RankMats& a, const ref::RankMats& b) {
  if (p.op == "ag_gemm") return ref::naive_ag_gemm(a, b, p.m, p.n, p.k_local);
  if (p.op == "gemm_rs") return ref::naive_gemm_rs(a, b, p.m, p.n, p.k_local);
  return ref::naive_gemm_ar(a, b, p.m, p.n, p.k_local);
}

template <typename T>
CheckResult check_impl(const Options& o, std::ostream& log) {
  const Problem p = problem_of(o);
  log << "check: " << p.op << " on the CPU reference world: " << p.w << " ranks, per rank A ["
      << p.a_count / size_t(p.k_local) << ", " << p.k_local << "] B [" << p.k_local << ", " << p.n << "], "
      << dtype_name(o.dtype) << ", seed " << *o.seed << "\n";
  Inputs<T> in = make_inputs<T>(p, *o.seed);
  std::vector<std::vector<T>> c(size_t(p.w), std::vector<T>(p.c_count, poison<T>()));

  ref::World world(ref::WorldOptions{p.w, o.watchdog_ms});
  auto op = make_fused<T>(world, p, o);
  const auto t0 = Clock::now();
  world.run([&](int r) { op->run(r, in.a[size_t(r)].data(), in.b[size_t(r)].data(), c[size_t(r)].data()); });
  const double op_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  char op_ms_text[32];
  std::snprintf(op_ms_text, sizeof(op_ms_text), "%.2f", op_ms);
  log << "check: op done in " << op_ms_text << " ms; computing the fp64 reference\n";

  const ref::RankMats expect = naive_of(p, in.a_d, in.b_d);
  std::vector<double> ref_all;
  ref_all.reserve(size_t(p.w) * p.c_count);
  for (const auto& e : expect) ref_all.insert(ref_all.end(), e.begin(), e.end());

  if (o.inject_fault && p.c_count > 0) {
    // Big enough to fail any tolerance: the error alone exceeds the whole reference's norm.
    double norm2 = 0;
    for (double v : ref_all) norm2 += v * v;
    T& cell = c[0][0];
    cell = from_f32<T>(to_f32(cell) + float(1.0 + 2.0 * std::sqrt(norm2)));
    log << "check: --inject-fault: corrupted element 0 of rank 0's output\n";
  }

  std::vector<double> out_all;
  out_all.reserve(ref_all.size());
  for (const auto& rank_out : c)
    for (const T& v : rank_out) out_all.push_back(double(to_f32(v)));

  CheckResult result;
  result.tolerance = tolerance_for(o.dtype, o.k);
  result.rel_err = ref::rel_err(out_all, ref_all);
  result.pass = result.rel_err <= result.tolerance;  // NaN and +inf fail
  return result;
}

// C [m, n] = A [m, k] @ B [k, n], fp32 accumulation, one thread. Column blocks keep a slab of B
// in cache while every row of A streams past it.
template <typename T>
void local_gemm(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kBlockN = 256;
  float acc[kBlockN];
  for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
    const int64_t jn = std::min(kBlockN, n - j0);
    for (int64_t i = 0; i < m; ++i) {
      std::fill(acc, acc + jn, 0.0f);
      const T* a_row = a + i * k;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float av = to_f32(a_row[kk]);
        const T* b_row = b + kk * n + j0;
        for (int64_t j = 0; j < jn; ++j) acc[j] += av * to_f32(b_row[j]);
      }
      T* c_row = c + i * n + j0;
      for (int64_t j = 0; j < jn; ++j) c_row[j] = from_f32<T>(acc[j]);
    }
  }
}

// Median wall time of fn in ms, after `warmup` untimed runs. Progress at most every 2 s, so that
// a slow phase shows life without flooding the log.
double median_ms(const char* label, const std::function<void()>& fn, const Options& o, std::ostream& log) {
  log << "bench: " << label << ": " << o.warmup << " warmup + " << o.iters << " timed runs\n" << std::flush;
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> times;
  times.reserve(size_t(o.iters));
  auto last_report = Clock::now();
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    const auto t1 = Clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (t1 - last_report > std::chrono::seconds(2) && i + 1 < o.iters) {
      log << "bench: " << label << ": iter " << i + 1 << "/" << o.iters << "\n" << std::flush;
      last_report = t1;
    }
  }
  std::sort(times.begin(), times.end());
  const size_t mid = times.size() / 2;
  return times.size() % 2 ? times[mid] : 0.5 * (times[mid - 1] + times[mid]);
}

template <typename T>
BenchRecord bench_impl(const Options& o, std::ostream& log) {
  const Problem p = problem_of(o);
  BenchRecord rec;
  rec.gpu = "cpu-reference";
  rec.notes = "CPU reference world: wall-clock of rank threads and scalar loops, not GPU performance";

  log << "bench: correctness run\n";
  rec.rel_err = check_impl<T>(o, log).rel_err;

  const Inputs<T> in = make_inputs<T>(p, *o.seed);
  const size_t w = size_t(p.w);
  const bool is_ag = p.op == "ag_gemm";

  // t_fused: the reference-world op, every rank on its own thread.
  std::vector<std::vector<T>> c(w, std::vector<T>(p.c_count, poison<T>()));
  ref::World world(ref::WorldOptions{p.w, o.watchdog_ms});
  auto op = make_fused<T>(world, p, o);
  rec.t_fused_ms = median_ms("fused op", [&] {
    world.run([&](int r) { op->run(r, in.a[size_t(r)].data(), in.b[size_t(r)].data(), c[size_t(r)].data()); });
  }, o, log);

  // t_gemm: rank 0's GEMM alone. ag_gemm multiplies the gathered A [M, K]; gemm_rs/gemm_ar
  // multiply the local A_0 [M, K/W] into a full [M, N] partial.
  std::vector<T> gathered_a;
  if (is_ag)
    for (const auto& shard : in.a) gathered_a.insert(gathered_a.end(), shard.begin(), shard.end());
  const T* gemm_a = is_ag ? gathered_a.data() : in.a[0].data();
  std::vector<T> gemm_c(size_t(p.m * p.n));
  const auto gemm = [&] { local_gemm(gemm_a, in.b[0].data(), gemm_c.data(), p.m, p.n, p.k_local); };
  rec.t_gemm_ms = median_ms("gemm alone", gemm, o, log);

  // t_comm: what each rank receives from its W-1 peers, as plain copies on W threads.
  //   ag_gemm: the peers' A shards [M/W, K] into its gathered A (all-gather);
  //   gemm_rs: its row band [M/W, N] of every peer's partial (reduce-scatter, without the adds);
  //   gemm_ar: that, then every peer's reduced band (all-gather), after a barrier.
  const size_t band = size_t(p.m_local * p.n);
  const size_t shard = p.a_count;
  std::vector<std::vector<T>> send(w), recv(w), full(w);
  for (size_t r = 0; r < w; ++r) {
    if (is_ag) {
      recv[r].assign(size_t(p.m) * size_t(p.k_local), T{});
    } else {
      send[r].assign(size_t(p.m * p.n), from_f32<T>(1.0f));
      recv[r].assign(size_t(p.m * p.n), T{});
      if (p.op == "gemm_ar") full[r].assign(size_t(p.m * p.n), from_f32<T>(1.0f));
    }
  }
  ref::World comm_world(ref::WorldOptions{p.w, o.watchdog_ms});
  const auto comm = [&] {
    comm_world.run([&](int r) {
      const size_t rr = size_t(r);
      for (size_t s = 0; s < w; ++s) {
        if (s == rr) continue;
        if (is_ag)
          std::memcpy(recv[rr].data() + s * shard, in.a[s].data(), shard * sizeof(T));
        else
          std::memcpy(recv[rr].data() + s * band, send[s].data() + rr * band, band * sizeof(T));
      }
      if (p.op != "gemm_ar") return;
      comm_world.barrier(r);  // every band is reduced before anyone gathers it
      for (size_t s = 0; s < w; ++s)
        if (s != rr) std::memcpy(full[rr].data() + s * band, full[s].data() + s * band, band * sizeof(T));
    });
  };
  rec.t_comm_ms = median_ms("comm alone", comm, o, log);

  // t_serial: no overlap; the op's order (gather then multiply, or multiply then reduce).
  rec.t_serial_ms = median_ms("serial", [&] {
    if (is_ag) {
      comm();
      gemm();
    } else {
      gemm();
      comm();
    }
  }, o, log);
  rec.t_limit_ms = std::max(rec.t_gemm_ms, rec.t_comm_ms);
  rec.t_peer_ms = -1;  // no PyTorch symm_mem op on the CPU
  return rec;
}

}  // namespace

void fill_uniform(uint64_t seed, int rank, int which, float* out, size_t count) {
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(rank), uint32_t(which)};
  std::mt19937_64 gen(seq);
  for (size_t i = 0; i < count; ++i) {
    // 53 random bits -> [0, 1) -> [-1, 1); only the engine, not a std distribution, whose
    // algorithm differs between standard libraries.
    const double u = double(gen() >> 11) * (1.0 / 9007199254740992.0);
    out[i] = float(2.0 * u - 1.0);
  }
}

CheckResult cpu_check(const Options& options, std::ostream& log) {
  switch (options.dtype) {
    case DType::kFloat32: return check_impl<float>(options, log);
    case DType::kBFloat16: return check_impl<bf16>(options, log);
    default: break;
  }
  throw InvalidArgument(detail::str_cat("--dtype ", dtype_name(options.dtype), " is not supported (fp32, bf16)"));
}

BenchRecord cpu_bench(const Options& options, std::ostream& log) {
  switch (options.dtype) {
    case DType::kFloat32: return bench_impl<float>(options, log);
    case DType::kBFloat16: return bench_impl<bf16>(options, log);
    default: break;
  }
  throw InvalidArgument(detail::str_cat("--dtype ", dtype_name(options.dtype), " is not supported (fp32, bf16)"));
}

}  // namespace ccfuse::tool
