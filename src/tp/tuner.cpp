// src/tp/tuner.cpp: the fused TP ops' tuner (include/ccfuse/tp/tuner.h, docs/tp-tuner.md).
#include "ccfuse/tp/tuner.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "ccfuse/common/error.h"

namespace ccfuse::tp {

namespace {

using detail::str_cat;
using C = TpModelConstants;

constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 64;
constexpr int kChunkRows = 128;  // ag_gemm: flags cover 128-row chunks (one row tile)
constexpr int kMaxPieces = 32;
constexpr int kMaxRanks = 8;     // the fused TP kernels' limit (kMaxTpRanks, kMaxAgRanks)
constexpr int kDefaultGroupM = 8;
constexpr int kReferenceSms = 132;  // the GPU the peak was measured on (H200)
constexpr int kTableColumns = 12;
constexpr double kSignificantGain = 0.01;  // why-string: "would be faster" from a 1 % gain

const char* const kColumnNames[kTableColumns] = {
    "op", "world_size", "m", "n", "k_per_rank", "gpu_sms", "transport", "num_comm_ctas",
    "pieces_per_chunk", "group_m", "measured_fused_ms", "source_file"};

bool known_op(const std::string& op) { return op == "ag_gemm" || op == "gemm_rs" || op == "gemm_ar"; }
bool known_transport(const std::string& t) {
  return t == "sm-send-warps" || t == "sm-comm-ctas" || t == "copy-engine";
}

// Milliseconds with 4 significant digits: "3.028", "0.3887", "0.01823".
std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Same rule as src/tp/ag_gemm.cu pieces_for: the smallest power of two (<= 32) that gives every
// GEMM CTA a piece of this rank's band to push.
int auto_pieces(int64_t chunks_local, int gemm_ctas) {
  int p = 1;
  while (p < kMaxPieces && chunks_local * p < gemm_ctas) p *= 2;
  return p;
}

struct Candidate {
  std::string transport;
  int n_c = 0;
  bool built = false;
  double gemm_ms = 0, comm_ms = 0, exposed_ms = 0, fused_ms = 0;
};

std::string candidate_name(const Candidate& c) {
  return c.transport == "sm-comm-ctas" ? str_cat(c.transport, " n_c=", c.n_c) : c.transport;
}

// The cost model of one candidate (docs/tp-tuner.md "Cost model").
Candidate predict(const TpProblem& p, const std::string& transport, int n_c) {
  Candidate c;
  c.transport = transport;
  c.n_c = n_c;
  c.built = transport_built(p.op, transport);
  const double es = dtype_size(p.dtype);
  const int64_t w = p.world_size;
  const int64_t m_local = p.m / w;
  const int gemm_sms = std::max(1, p.num_sms - n_c);

  // GEMM: every rank multiplies [m, K] x [K, n] (ag_gemm: the gathered A; gemm_rs/ar: A_r).
  const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k_per_rank);
  const double tflops =
      gemm_efficiency(p.k_per_rank) * gemm_sustained_factor(flops) * C::kPeakTflops * gemm_sms / kReferenceSms;
  c.gemm_ms = flops / (tflops * 1e12) * 1e3;

  if (w == 1) {  // nothing to move: the GEMM and the entry barrier
    c.fused_ms = c.gemm_ms + C::kEntryBarrierUs * 1e-3;
    return c;
  }
  const double gbps = transport_gbps(transport, n_c, p.link_gbps);
  const double link_ms_per_byte = 1e3 / (gbps * 1e9);
  const double hbm_ms_per_byte = 1e3 / (C::kLocalHbmGbps * 1e9);
  const double flag_ms = C::kFlagRoundTripUs * 1e-3;

  // Bytes this rank sends: its A band to every peer (ag_gemm); its partials of the peers' bands
  // (gemm_rs); and for gemm_ar also its reduced band to every peer.
  double bytes = 0;
  if (p.op == "ag_gemm") bytes = double(w - 1) * double(m_local) * double(p.k_per_rank) * es;
  else bytes = double(w - 1) * double(m_local) * double(p.n) * es * (p.op == "gemm_ar" ? 2 : 1);
  // One flag round trip is exposed (the last chunk's); the copy engine also waits on the stream
  // for the entry barrier before its first copy (one more round trip).
  c.comm_ms = bytes * link_ms_per_byte + flag_ms * (transport == "copy-engine" ? 2 : 1);

  // What the overlap cannot hide.
  if (p.op == "ag_gemm") {
    // The first chunk must land before the first tile of its band can start.
    c.exposed_ms = double(kChunkRows) * double(p.k_per_rank) * es * link_ms_per_byte + flag_ms;
  } else {
    // The last wave of own-band tiles: wait for the peers' flags, read W-1 partial tiles each.
    const int64_t own_tiles = ceil_div(m_local, kBlockM) * ceil_div(p.n, kBlockN);
    const double wave = double(std::min<int64_t>(own_tiles, gemm_sms));
    const double tile_bytes = double(kBlockM) * kBlockN * es;
    c.exposed_ms = wave * double(w - 1) * tile_bytes * hbm_ms_per_byte + flag_ms;
    if (p.op == "gemm_ar") {
      // The all-gather tail: the last wave's reduced tiles to every peer, then the copy of the
      // peers' bands into C (read + write).
      c.exposed_ms += wave * double(w - 1) * tile_bytes * link_ms_per_byte + flag_ms;
      c.exposed_ms += 2.0 * double(w - 1) * double(m_local) * double(p.n) * es * hbm_ms_per_byte;
    }
  }
  c.fused_ms = std::max(c.gemm_ms, c.comm_ms) + c.exposed_ms + C::kEntryBarrierUs * 1e-3;
  return c;
}

void check_problem(const TpProblem& p) {
  CCFUSE_ARG_CHECK(known_op(p.op), "op '", p.op, "' is not a fused TP op (known: ag_gemm, gemm_rs, gemm_ar)");
  CCFUSE_ARG_CHECK(p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat16, "dtype ", dtype_name(p.dtype),
                   " is not supported by the fused TP kernels (bf16 or fp16)");
  CCFUSE_ARG_CHECK(p.world_size >= 1, "world_size ", p.world_size, " must be at least 1");
  CCFUSE_ARG_CHECK(p.world_size <= kMaxRanks, "world_size ", p.world_size, " exceeds ", kMaxRanks,
                   " (the fused TP kernels' limit)");
  CCFUSE_ARG_CHECK(p.m > 0 && p.n > 0 && p.k_per_rank > 0, "m, n, k_per_rank must be positive (got ", p.m, ", ",
                   p.n, ", ", p.k_per_rank, ")");
  CCFUSE_ARG_CHECK(p.m % p.world_size == 0, "m ", p.m, " is not divisible by world_size ", p.world_size);
  CCFUSE_ARG_CHECK(p.num_sms > 0, "num_sms ", p.num_sms, " must be positive");
  CCFUSE_ARG_CHECK(p.link_gbps >= 0 && std::isfinite(p.link_gbps), "link_gbps ", p.link_gbps,
                   " must be >= 0 (0 = the model's default)");
}

TpChoice choice_from(const TpProblem& p, const Candidate& c, int pieces, int group_m) {
  TpChoice out;
  out.transport = c.transport;
  out.num_comm_ctas = c.n_c;
  out.block_m = kBlockM;
  out.block_n = kBlockN;
  out.block_k = kBlockK;
  out.chunk_rows = kChunkRows;
  const int gemm_ctas = std::max(1, p.num_sms - c.n_c);
  if (p.op == "ag_gemm")
    out.pieces_per_chunk = pieces > 0 ? pieces : auto_pieces(ceil_div(p.m / p.world_size, kChunkRows), gemm_ctas);
  else
    out.pieces_per_chunk = 1;  // gemm_rs/gemm_ar flag whole 128x256 tiles: no pieces knob
  out.group_m = group_m;
  if (p.op == "ag_gemm" && c.transport == "sm-send-warps") {
    out.push_spread_us = ag_push_spread_us(p);
    out.block_n = ag_block_n(p.m, p.n, gemm_ctas);
  }
  if (p.op != "ag_gemm") out.forward_spread_us = rs_forward_spread_us(p.world_size, p.m, p.n, gemm_ctas);
  out.predicted_gemm_ms = c.gemm_ms;
  out.predicted_comm_ms = c.comm_ms;
  out.predicted_fused_ms = c.fused_ms;
  return out;
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// ---- table parsing ---------------------------------------------------------------------------

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return out;
}

struct Row {
  const std::string& path;
  int line;
  const std::vector<std::string>& cols;

  std::string where() const { return str_cat(path, ":", line, ": "); }

  int64_t integer(int i, int64_t lo, int64_t hi, const char* rule) const {
    const std::string& s = cols[i];
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    CCFUSE_ARG_CHECK(!s.empty() && ec == std::errc() && end == s.data() + s.size(), where(), "column ", i + 1, " ",
                     kColumnNames[i], " '", s, "' is not an integer");
    CCFUSE_ARG_CHECK(v >= lo && v <= hi, where(), "column ", i + 1, " ", kColumnNames[i], " ", v, " ", rule);
    return v;
  }
  double real(int i) const {
    const std::string& s = cols[i];
    char* end = nullptr;
    errno = 0;
    const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
    CCFUSE_ARG_CHECK(!s.empty() && errno == 0 && end == s.c_str() + s.size(), where(), "column ", i + 1, " ",
                     kColumnNames[i], " '", s, "' is not a number");
    CCFUSE_ARG_CHECK(std::isfinite(v) && v > 0, where(), "column ", i + 1, " ", kColumnNames[i], " ", s,
                     " must be positive");
    return v;
  }
};

}  // namespace

// ---- the model's pieces ------------------------------------------------------------------------

double gemm_efficiency(int64_t k) {
  // ccfuse's engine (TFLOP/s at m >= 4096 and under 1e12 FLOPs, bench/results/2026-11-29-h200x2-
  // gemm-summary-v4-interleaved.log) over kPeakTflops; below K = 512 extrapolated (not measured).
  static const std::pair<double, double> kPoints[] = {
      {64, 0.085}, {128, 0.16}, {256, 0.28}, {512, 0.47}, {1024, 0.68}, {1792, 0.82},
      {2048, 0.855}, {3584, 0.93}, {4096, 0.95}, {7168, 1.0}};
  if (k <= 0) return kPoints[0].second;
  const double x = std::log2(double(k));
  const size_t n = sizeof kPoints / sizeof kPoints[0];
  if (x <= std::log2(kPoints[0].first)) return kPoints[0].second;
  for (size_t i = 1; i < n; ++i) {
    const double x1 = std::log2(kPoints[i].first);
    if (x <= x1) {
      const double x0 = std::log2(kPoints[i - 1].first);
      const double t = (x - x0) / (x1 - x0);
      return kPoints[i - 1].second + t * (kPoints[i].second - kPoints[i - 1].second);
    }
  }
  return kPoints[n - 1].second;
}

double gemm_sustained_factor(double flops) {
  // The sweep's long GEMMs run at ~665 TFLOP/s where the short ones of the same K reach ~760
  // (clocks drop under sustained load): 1.0 up to 1e12 FLOPs, 0.875 from 1.9e12, linear between.
  if (flops <= C::kSustainedFromFlops) return 1.0;
  if (flops >= C::kThrottledFromFlops) return C::kThrottledFactor;
  const double t = (flops - C::kSustainedFromFlops) / (C::kThrottledFromFlops - C::kSustainedFromFlops);
  return 1.0 + t * (C::kThrottledFactor - 1.0);
}

double transport_gbps(const std::string& transport, int num_comm_ctas, double link_gbps) {
  double gbps = 0;
  if (transport == "copy-engine") gbps = C::kCopyEngineGbps;
  else if (transport == "sm-send-warps") gbps = C::kSendWarpsGbps;
  else if (transport == "sm-comm-ctas") gbps = num_comm_ctas >= 16 ? C::kCommCtas16Gbps : C::kCommCtas8Gbps;
  else CCFUSE_ARG_CHECK(false, "unknown transport '", transport, "' (known: sm-send-warps, sm-comm-ctas, copy-engine)");
  return link_gbps > 0 ? gbps * link_gbps / C::kCopyEngineGbps : gbps;
}

// The copy engine is built for ag_gemm (AgTransport::kCopyEngine). Until 2026-11-30 evening the
// tuner never chose it (measured 3-10 % slower on the small shapes, in the bench's old timing,
// which charged it the host latency of its many copies); in GPU time it is faster where the push
// is dense, and ag_copy_engine_pays decides between the two.
bool transport_built(const std::string& op, const std::string& transport) {
  return transport == "sm-send-warps" || (transport == "copy-engine" && op == "ag_gemm");
}

// ---- the table -------------------------------------------------------------------------------

const TunedEntry* TunedTable::find(const TpProblem& p) const {
  for (const TunedEntry& e : entries)
    if (e.op == p.op && e.world_size == p.world_size && e.m == p.m && e.n == p.n && e.k_per_rank == p.k_per_rank &&
        e.gpu_sms == p.num_sms)
      return &e;
  return nullptr;
}

TunedTable load_tuned_table(const std::string& path) {
  std::ifstream in(path);
  CCFUSE_ARG_CHECK(in.is_open(), "tuned table ", path, " cannot be opened");
  TunedTable table;
  table.path = path;
  std::string text;
  int line_no = 0;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    const size_t first = text.find_first_not_of(" \t");
    if (first == std::string::npos || text[first] == '#') continue;
    const std::vector<std::string> cols = split_tabs(text);
    CCFUSE_ARG_CHECK(cols.size() == size_t(kTableColumns), path, ":", line_no, ": expected ", kTableColumns,
                     " tab-separated columns (op world_size m n k_per_rank gpu_sms transport num_comm_ctas "
                     "pieces_per_chunk group_m measured_fused_ms source_file), got ", cols.size());
    const Row row{path, line_no, cols};
    constexpr int64_t kBig = int64_t(1) << 40;
    TunedEntry e;
    e.line = line_no;
    e.op = cols[0];
    CCFUSE_ARG_CHECK(known_op(e.op), row.where(), "column 1 op '", e.op,
                     "' is not a fused TP op (known: ag_gemm, gemm_rs, gemm_ar)");
    e.world_size = int(row.integer(1, 1, kMaxRanks, "must be in 1..8"));
    e.m = row.integer(2, 1, kBig, "must be positive");
    e.n = row.integer(3, 1, kBig, "must be positive");
    e.k_per_rank = row.integer(4, 1, kBig, "must be positive");
    e.gpu_sms = int(row.integer(5, 1, 100000, "must be positive"));
    e.transport = cols[6];
    CCFUSE_ARG_CHECK(known_transport(e.transport), row.where(), "column 7 transport '", e.transport,
                     "' is unknown (known: sm-send-warps, sm-comm-ctas, copy-engine)");
    if (e.transport == "sm-comm-ctas")
      e.num_comm_ctas = int(row.integer(7, 1, e.gpu_sms - 1, "must be in 1..gpu_sms-1 for sm-comm-ctas"));
    else
      e.num_comm_ctas = int(row.integer(7, 0, 0, "must be 0 for this transport"));
    e.pieces_per_chunk = int(row.integer(8, 0, kMaxPieces, "must be 0 (auto) or a power of two <= 32"));
    CCFUSE_ARG_CHECK((e.pieces_per_chunk & (e.pieces_per_chunk - 1)) == 0, row.where(),
                     "column 9 pieces_per_chunk ", e.pieces_per_chunk, " must be 0 (auto) or a power of two <= 32");
    e.group_m = int(row.integer(9, 1, 1024, "must be in 1..1024"));
    e.measured_fused_ms = row.real(10);
    e.source_file = cols[11];
    CCFUSE_ARG_CHECK(e.m % e.world_size == 0, row.where(), "m ", e.m, " is not divisible by world_size ",
                     e.world_size);
    for (const TunedEntry& prev : table.entries)
      CCFUSE_ARG_CHECK(!(prev.op == e.op && prev.world_size == e.world_size && prev.m == e.m && prev.n == e.n &&
                         prev.k_per_rank == e.k_per_rank && prev.gpu_sms == e.gpu_sms),
                       row.where(), "duplicate key (", e.op, " world_size=", e.world_size, " m=", e.m, " n=", e.n,
                       " k_per_rank=", e.k_per_rank, " gpu_sms=", e.gpu_sms, "), first at line ", prev.line);
    table.entries.push_back(std::move(e));
  }
  CCFUSE_ARG_CHECK(!in.bad(), "tuned table ", path, ": read error after line ", line_no);
  return table;
}

const TunedTable& default_table() {
  static const TunedTable table = [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("CCFUSE_TUNED_TABLE"); env && *env) paths.emplace_back(env);
#ifdef CCFUSE_SOURCE_DIR
    paths.emplace_back(CCFUSE_SOURCE_DIR "/bench/tuned/tp_tuned.tsv");
#endif
    paths.emplace_back("bench/tuned/tp_tuned.tsv");
    for (const std::string& path : paths)
      if (std::ifstream(path).is_open()) return load_tuned_table(path);
    return TunedTable{};
  }();
  return table;
}

int ag_push_spread_us(const TpProblem& p, double band_fraction) {
  check_problem(p);
  CCFUSE_ARG_CHECK(p.op == "ag_gemm", "ag_push_spread_us: op '", p.op, "' is not ag_gemm");
  CCFUSE_ARG_CHECK(std::isfinite(band_fraction) && band_fraction >= 0 && band_fraction <= 2,
                   "push_spread_fraction ", band_fraction, " must be in [0, 2]");
  if (p.world_size == 1) return 0;
  const double band_us = predict(p, "sm-send-warps", 0).gemm_ms * 1e3 / double(p.world_size);
  return int(std::lround(std::min(band_fraction * band_us, 100000.0)));
}

int ag_block_n(int64_t m, int64_t n, int num_sms) {
  CCFUSE_ARG_CHECK(m > 0 && n > 0 && num_sms > 0, "ag_block_n: m ", m, ", n ", n, " and num_sms ", num_sms,
                   " must be positive");
  if (n % 8 != 0) return kBlockN;
  const auto cost = [&](int64_t block_n) {
    return double(ceil_div(ceil_div(m, kBlockM) * ceil_div(n, block_n), int64_t(num_sms))) * double(block_n);
  };
  return cost(192) < 0.95 * cost(kBlockN) ? 192 : kBlockN;
}

int rs_forward_spread_us(int world_size, int64_t m, int64_t n, int num_sms) {
  CCFUSE_ARG_CHECK(world_size > 0 && m > 0 && n > 0 && num_sms > 0, "rs_forward_spread_us: world_size ", world_size,
                   ", m ", m, ", n ", n, " and num_sms ", num_sms, " must be positive");
  if (world_size == 1) return 0;
  const double waves = double(ceil_div(m, kBlockM) * ceil_div(n, kBlockN)) / double(num_sms);
  return waves >= TpModelConstants::kRsForwardSpreadMinWaves ? TpModelConstants::kRsForwardSpreadUs : 0;
}

bool ag_copy_engine_pays(const TpProblem& p) {
  check_problem(p);
  CCFUSE_ARG_CHECK(p.op == "ag_gemm", "ag_copy_engine_pays: op '", p.op, "' is not ag_gemm");
  // Measured at W = 2 only (the GPUs lent so far): W - 1 copies per chunk at W = 4 or 8 cost more
  // host time and stream-ordered flags, so larger teams keep the send warps until measured.
  if (p.world_size != 2) return false;
  const Candidate warps = predict(p, "sm-send-warps", 0);
  return warps.comm_ms >= TpModelConstants::kAgCopyEngineMinCommRatio * warps.gemm_ms &&
         ag_block_n(p.m, p.n, p.num_sms) == kBlockN;
}

// ---- the choice ------------------------------------------------------------------------------

TpChoice choose_tp_config(const TpProblem& p, const TunedTable& table) {
  check_problem(p);

  std::vector<Candidate> cands;
  cands.push_back(predict(p, "sm-send-warps", 0));
  for (int n_c : {8, 16})
    if (n_c < p.num_sms) cands.push_back(predict(p, "sm-comm-ctas", n_c));
  cands.push_back(predict(p, "copy-engine", 0));

  // A measured row for exactly this problem wins (when its transport is built).
  std::string table_note;
  if (const TunedEntry* e = table.find(p)) {
    if (transport_built(p.op, e->transport)) {
      const Candidate c = predict(p, e->transport, e->num_comm_ctas);
      TpChoice out = choice_from(p, c, e->pieces_per_chunk, e->group_m);
      out.predicted_fused_ms = e->measured_fused_ms;
      out.source = str_cat("table:", basename_of(table.path), ":", e->line);
      out.why = str_cat(candidate_name(c), " from the tuned table (", basename_of(table.path), " line ", e->line,
                        "): measured ", ms(e->measured_fused_ms), " ms on this exact problem (", e->source_file,
                        "); the model alone predicts ", ms(c.fused_ms), " ms (gemm ", ms(c.gemm_ms), ", comm ",
                        ms(c.comm_ms), ").");
      return out;
    }
    table_note = str_cat(" The tuned table's row (line ", e->line, ", ", e->transport, ") names a transport that is "
                         "not built: ignored.");
  }

  // ag_gemm: the transport by the measured rule (ag_copy_engine_pays; the model has no term for
  // the send warps' contention with the GEMM). The other ops: the fastest built candidate.
  const Candidate* best = nullptr;
  std::string rule;
  if (p.op == "ag_gemm") {
    const bool ce = ag_copy_engine_pays(p);
    for (const Candidate& c : cands)
      if (c.transport == (ce ? "copy-engine" : "sm-send-warps")) best = &c;
    const Candidate& warps = cands.front();  // sm-send-warps, n_c 0
    const double ratio = warps.gemm_ms > 0 ? warps.comm_ms / warps.gemm_ms : 0;
    if (p.world_size == 1)
      rule = ": one rank, nothing to push.";
    else if (p.world_size != 2)
      rule = ": the copy-engine rule is measured at W = 2 only; send warps at other world sizes.";
    else if (ce)
      rule = str_cat(": the push is dense (the send warps' comm ", ms(warps.comm_ms), " ms is ", ms(ratio),
                     " x the GEMM, >= ", TpModelConstants::kAgCopyEngineMinCommRatio,
                     "), where the copy engine measured 2-3 % faster than the send warps beside the GEMM.");
    else if (ratio >= TpModelConstants::kAgCopyEngineMinCommRatio)
      rule = str_cat(": the push is dense (comm ", ms(ratio), " x the GEMM) but the send warps' 192-column tile "
                     "pays more than the copy engine (which has only 256).");
    else
      rule = str_cat(": the push is sparse (comm ", ms(ratio), " x the GEMM, < ",
                     TpModelConstants::kAgCopyEngineMinCommRatio, "), where the copy engine measured no faster.");
  } else {
    for (const Candidate& c : cands)
      if (c.built && (!best || c.fused_ms < best->fused_ms)) best = &c;
  }
  CCFUSE_CHECK(best, "no built transport among the candidates");
  int built_count = 0;
  for (const Candidate& c : cands) built_count += c.built;
  if (rule.empty()) rule = built_count == 1 ? ": the only built transport." : ": the fastest built transport.";

  TpChoice out = choice_from(p, *best, 0, kDefaultGroupM);
  out.source = "model";
  std::ostringstream why;
  why << candidate_name(*best) << " predicts " << ms(best->fused_ms) << " ms (gemm " << ms(best->gemm_ms) << " on "
      << std::max(1, p.num_sms - best->n_c) << " SMs, comm " << ms(best->comm_ms) << ", "
      << (best->gemm_ms >= best->comm_ms ? "GEMM-bound" : "comm-bound") << ")" << rule;
  std::string also_built;
  for (const Candidate& c : cands)
    if (c.built && &c != best)
      also_built += str_cat(also_built.empty() ? "" : "; ", candidate_name(c), " ", ms(c.fused_ms), " ms");
  if (!also_built.empty()) why << " Also built: " << also_built << ".";
  std::string not_built;
  for (const Candidate& c : cands) {
    if (c.built) continue;
    not_built += str_cat(not_built.empty() ? "" : "; ", candidate_name(c), " ", ms(c.fused_ms), " ms");
    // Only a gain the model can tell from noise (1 %) is called one.
    if (c.fused_ms < best->fused_ms * (1 - kSignificantGain))
      not_built += str_cat(" (would be ", ms(best->fused_ms - c.fused_ms), " ms faster)");
  }
  if (!not_built.empty()) why << " Not built: " << not_built << ".";
  why << table_note;
  out.why = why.str();
  return out;
}

std::string to_string(const TpChoice& c) {
  return str_cat("transport=", c.transport, " n_c=", c.num_comm_ctas, " block=", c.block_m, "x", c.block_n, "x",
                 c.block_k, " chunk_rows=", c.chunk_rows, " pieces_per_chunk=", c.pieces_per_chunk,
                 " group_m=", c.group_m,
                 c.push_spread_us > 0 ? str_cat(" push_spread_us=", c.push_spread_us) : std::string(),
                 c.forward_spread_us > 0 ? str_cat(" forward_spread_us=", c.forward_spread_us) : std::string(),
                 " predicted_ms=", ms(c.predicted_fused_ms), " source=", c.source);
}

}  // namespace ccfuse::tp
