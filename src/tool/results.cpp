// src/tool/results.cpp: what the tool writes: the check line, the bench table and the JSON Lines
// record of DESIGN §5 (one per (op, shape); fields are added, never renamed: plots read them).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>

#include <unistd.h>

#include "src/tool/cli.h"

namespace ccfuse::tool {

namespace {

// Shortest form that reads back to (nearly) the same value; times are ms, so 6 digits suffice.
std::string number(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// JSON has no inf/NaN, and the record uses negative for "not measured": both become null.
std::string json_number_or_null(double v) {
  if (!std::isfinite(v) || v < 0) return "null";
  return number(v, "%.9g");
}

// Length of the valid UTF-8 sequence at s[i], or 0 if it is not one (JSON must be UTF-8).
size_t utf8_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char c = byte(i);
  size_t len = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0Fu;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07u;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t j = 1; j < len; ++j) {
    if ((byte(i + j) & 0xC0u) != 0x80u) return 0;
    cp = cp << 6 | (byte(i + j) & 0x3Fu);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not valid UTF-8.
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// Runs `command` through the shell and returns its first line, or "" if it failed.
std::string first_line_of(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return "";
  char buf[256] = {0};
  const bool got = std::fgets(buf, sizeof(buf), pipe) != nullptr;
  // Drain the rest so that the child never blocks on a full pipe before pclose waits for it.
  char sink[256];
  while (std::fgets(sink, sizeof(sink), pipe) != nullptr) {
  }
  const int status = pclose(pipe);
  return got && status == 0 ? trim(buf) : "";
}

bool is_hex(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Directory of the running executable (Linux), so that the commit is the one the binary was
// built from even when it runs from another directory.
std::string executable_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, size_t(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

double tolerance_for(DType dtype, int64_t k) {
  if (dtype != DType::kFloat32) return 1e-2;
  return 1e-6 * std::max(1.0, std::sqrt(double(k) / 1024.0));
}

std::string check_line(const Options& o, const CheckResult& r) {
  std::ostringstream os;
  os << (r.pass ? "PASS" : "FAIL") << " op=" << o.op << " backend=" << backend_name(o.backend)
     << " world_size=" << o.world_size << " m=" << o.m << " n=" << o.n << " k=" << o.k
     << " dtype=" << dtype_name(o.dtype);
  // gemm: what else a replay needs (B's layout picks another kernel path; the SM budget another grid).
  if (is_gemm(o)) os << " b_layout=" << gemm::b_layout_name(o.b_layout) << " sms=" << o.sms;
  if (is_grouped(o))
    os << " experts=" << o.experts << " tokens=" << o.tokens << " topk=" << o.topk
       << " routing=" << routing_name(o.routing) << " b_layout=" << gemm::b_layout_name(o.b_layout);
  os << " seed=" << (o.seed ? std::to_string(*o.seed) : "none")
     << " rel_err=" << number(r.rel_err, "%.3e") << " tol=" << number(r.tolerance, "%.0e");
  return os.str();
}

double speedup_of(const BenchRecord& r) {
  if (!(r.t_serial_ms >= 0) || !(r.t_fused_ms > 0)) return -1;
  return r.t_serial_ms / r.t_fused_ms;
}

double overlap_eff_of(const BenchRecord& r) {
  if (!(r.t_serial_ms >= 0) || !(r.t_fused_ms >= 0) || !(r.t_limit_ms >= 0)) return std::nan("");
  const double room = r.t_serial_ms - r.t_limit_ms;
  // No room to overlap (the parts did not add up): the ratio would be noise.
  if (!(room > 0)) return std::nan("");
  return (r.t_serial_ms - r.t_fused_ms) / room;
}

namespace {

// The table of --op gemm: ccfuse against cuBLASLt; the TP metrics (serial, comm, overlap) do not apply.
std::string format_gemm_table(const BenchRecord& r) {
  const auto ms = [](double v) { return v < 0 ? std::string("-") : number(v, "%.4f"); };
  const auto fixed = [](double v, const char* fmt) { return v < 0 ? std::string("-") : number(v, fmt); };
  std::ostringstream os;
  os << "bench " << r.op << " backend=" << r.backend << " gpu=" << r.gpu << " m=" << r.m << " n=" << r.n
     << " k=" << r.k << " dtype=" << r.dtype << " b_layout=" << (r.b_layout.empty() ? "-" : r.b_layout)
     << " sms=" << r.sms << "/" << r.gpu_sms << "\n";
  const auto row = [&](const char* name, const std::string& value, const std::string& what) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "  %-14s %12s  %s", name, value.c_str(), what.c_str());
    os << trim(buf) << "\n";
  };
  row("metric", "value", "");
  row("t_fused", ms(r.t_fused_ms), "ms  ccfuse GEMM (" + r.config + ")");
  row("t_gemm", ms(r.t_gemm_ms), "ms  best cuBLASLt algorithm" + (r.cublas_algo.empty() ? "" : " (" + r.cublas_algo + ")"));
  row("tflops", fixed(r.tflops, "%.1f"), "TFLOP/s ccfuse");
  row("tflops_cublas", fixed(r.tflops_cublas, "%.1f"), "TFLOP/s cuBLASLt");
  row("pct_of_cublas", fixed(r.pct_of_cublas, "%.1f"), "% ccfuse / cuBLASLt throughput");
  row("rel_err", std::isnan(r.rel_err) || r.rel_err >= 0 ? number(r.rel_err, "%.3e") : "-",
      "||out - ref|| / ||ref|| (ccfuse)");
  row("rel_err_cublas", std::isnan(r.rel_err_cublas) || r.rel_err_cublas >= 0 ? number(r.rel_err_cublas, "%.3e") : "-",
      "||out - ref|| / ||ref|| (cuBLASLt)");
  if (!r.notes.empty()) os << "  notes: " << r.notes << "\n";
  return os.str();
}

// The table of --op grouped_gemm: ccfuse against the best grouped baseline.
std::string format_grouped_table(const BenchRecord& r) {
  const auto ms = [](double v) { return v < 0 ? std::string("-") : number(v, "%.4f"); };
  const auto fixed = [](double v, const char* fmt) { return v < 0 ? std::string("-") : number(v, fmt); };
  std::ostringstream os;
  os << "bench " << r.op << " backend=" << r.backend << " gpu=" << r.gpu << " experts=" << r.experts
     << " tokens=" << r.tokens_per_rank << " topk=" << r.topk << " routing=" << r.routing << " rows=" << r.m
     << " n=" << r.n << " k=" << r.k << " dtype=" << r.dtype << " b_layout=" << (r.b_layout.empty() ? "-" : r.b_layout)
     << "\n";
  if (!r.group_rows.empty()) {
    int64_t lo = r.group_rows[0], hi = r.group_rows[0], empty = 0;
    for (int64_t v : r.group_rows) lo = std::min(lo, v), hi = std::max(hi, v), empty += v == 0;
    os << "  rows per expert: min " << lo << ", max " << hi << ", " << empty << " empty\n";
  }
  const auto row = [&](const char* name, const std::string& value, const std::string& what) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "  %-16s %12s  %s", name, value.c_str(), what.c_str());
    os << trim(buf) << "\n";
  };
  row("metric", "value", "");
  row("t_fused", ms(r.t_fused_ms), "ms  ccfuse grouped GEMM (" + r.config + ")");
  row("t_gemm", ms(r.t_gemm_ms), "ms  best baseline (" + (r.baseline.empty() ? std::string("none") : r.baseline) + ")");
  row("tflops", fixed(r.tflops, "%.1f"), "TFLOP/s ccfuse");
  row("tflops_baseline", fixed(r.tflops_baseline, "%.1f"), "TFLOP/s baseline");
  row("pct_of_baseline", fixed(r.pct_of_baseline, "%.1f"), "% ccfuse / baseline throughput");
  row("rel_err", std::isnan(r.rel_err) || r.rel_err >= 0 ? number(r.rel_err, "%.3e") : "-",
      "||out - ref|| / ||ref|| (ccfuse)");
  row("rel_err_baseline",
      std::isnan(r.rel_err_baseline) || r.rel_err_baseline >= 0 ? number(r.rel_err_baseline, "%.3e") : "-",
      "||out - ref|| / ||ref|| (baseline)");
  if (!r.notes.empty()) os << "  notes: " << r.notes << "\n";
  return os.str();
}

}  // namespace

std::string format_bench_table(const BenchRecord& r) {
  if (r.op == "gemm") return format_gemm_table(r);
  if (r.op == "grouped_gemm") return format_grouped_table(r);
  const auto ms = [](double v) { return v < 0 ? std::string("-") : number(v, "%.4f"); };
  std::ostringstream os;
  os << "bench " << r.op << " backend=" << r.backend << " gpu=" << r.gpu << " world_size=" << r.world_size
     << " m=" << r.m << " n=" << r.n << " k=" << r.k << " dtype=" << r.dtype << "\n";
  const auto row = [&](const char* name, const std::string& value, const char* what) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "  %-12s %12s  %s", name, value.c_str(), what);
    os << trim(buf) << "\n";
  };
  row("metric", "value", "");
  row("t_fused", ms(r.t_fused_ms), "ms  the fused op");
  row("t_serial", ms(r.t_serial_ms), "ms  communication and GEMM one after the other");
  row("t_gemm", ms(r.t_gemm_ms), "ms  the GEMM alone");
  row("t_comm", ms(r.t_comm_ms), "ms  the communication alone");
  row("t_limit", ms(r.t_limit_ms), "ms  max(t_gemm, t_comm)");
  row("t_peer", ms(r.t_peer_ms), "ms  peer fused op (- = none)");
  if (r.t_gemm_ccfuse_ms >= 0) row("t_gemm_ccfuse", ms(r.t_gemm_ccfuse_ms), "ms  ccfuse's GEMM engine alone");
  const double s = speedup_of(r);
  row("speedup", s < 0 ? "-" : number(s, "%.3f") + "x", "t_serial / t_fused");
  // Shown even when negative (a fused op slower than serial is worth seeing).
  const double e = overlap_eff_of(r);
  const std::string eff = std::isfinite(e) ? number(e, "%.3f") : "-";
  row("overlap_eff", eff, "(t_serial - t_fused) / (t_serial - t_limit)");
  row("rel_err", std::isnan(r.rel_err) || r.rel_err >= 0 ? number(r.rel_err, "%.3e") : "-",
      "||out - ref|| / ||ref||");
  if (!r.notes.empty()) os << "  notes: " << r.notes << "\n";
  return os.str();
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else if (c >= 0x80) {
      const size_t len = utf8_length(s, i);
      if (len == 0) {
        out += "\\ufffd";  // a stray byte (argv is not guaranteed UTF-8): keep the line valid JSON
        ++i;
        continue;
      }
      out.append(s, i, len);
      i += len;
      continue;
    } else {
      out += char(c);
    }
    ++i;
  }
  return out + "\"";
}

std::string to_json_line(const BenchRecord& r) {
  std::ostringstream os;
  os << "{\"op\":" << json_quote(r.op) << ",\"world_size\":" << r.world_size << ",\"m\":" << r.m
     << ",\"n\":" << r.n << ",\"k\":" << r.k << ",\"dtype\":" << json_quote(r.dtype)
     << ",\"gpu\":" << json_quote(r.gpu) << ",\"commit\":" << json_quote(r.commit)
     << ",\"date\":" << json_quote(r.date) << ",\"t_fused_ms\":" << json_number_or_null(r.t_fused_ms)
     << ",\"t_serial_ms\":" << json_number_or_null(r.t_serial_ms)
     << ",\"t_gemm_ms\":" << json_number_or_null(r.t_gemm_ms)
     << ",\"t_comm_ms\":" << json_number_or_null(r.t_comm_ms)
     << ",\"t_limit_ms\":" << json_number_or_null(r.t_limit_ms)
     << ",\"t_peer_ms\":" << json_number_or_null(r.t_peer_ms)
     << ",\"rel_err\":" << json_number_or_null(r.rel_err)
     << ",\"speedup\":" << json_number_or_null(speedup_of(r));
  // Overlap efficiency can be legitimately negative (fused slower than serial): keep its sign.
  const double e = overlap_eff_of(r);
  const std::string eff = std::isfinite(e) ? number(e, "%.6g") : "null";
  os << ",\"overlap_eff\":" << eff << ",\"backend\":" << json_quote(r.backend)
     << ",\"command\":" << json_quote(r.command) << ",\"notes\":" << json_quote(r.notes);
  // Fields of --op gemm, written only when set (the TP records stay as they were).
  const auto opt_number = [&](const char* key, double v) {
    if (v >= 0 || std::isnan(v)) os << ",\"" << key << "\":" << json_number_or_null(v);
  };
  const auto opt_string = [&](const char* key, const std::string& v) {
    if (!v.empty()) os << ",\"" << key << "\":" << json_quote(v);
  };
  opt_number("t_gemm_ccfuse_ms", r.t_gemm_ccfuse_ms);
  opt_number("steady_ms", r.steady_ms);
  opt_number("t_fused_steady_ms", r.t_fused_steady_ms);
  opt_number("t_serial_steady_ms", r.t_serial_steady_ms);
  opt_number("t_gemm_steady_ms", r.t_gemm_steady_ms);
  opt_number("t_comm_steady_ms", r.t_comm_steady_ms);
  opt_number("t_gemm_ccfuse_steady_ms", r.t_gemm_ccfuse_steady_ms);
  opt_number("pct_of_cublas_steady", r.pct_of_cublas_steady);
  opt_number("tflops", r.tflops);
  opt_number("tflops_cublas", r.tflops_cublas);
  opt_number("pct_of_cublas", r.pct_of_cublas);
  opt_number("rel_err_cublas", r.rel_err_cublas);
  opt_string("config", r.config);
  opt_string("b_layout", r.b_layout);
  opt_string("cublas_algo", r.cublas_algo);
  if (r.sms >= 0) os << ",\"sms\":" << r.sms;
  if (r.gpu_sms >= 0) os << ",\"gpu_sms\":" << r.gpu_sms;
  // Fields of --op grouped_gemm (DESIGN §5's MoE fields and the baseline), written only when set.
  if (r.experts >= 0) os << ",\"experts\":" << r.experts;
  if (r.topk >= 0) os << ",\"topk\":" << r.topk;
  if (r.tokens_per_rank >= 0) os << ",\"tokens_per_rank\":" << r.tokens_per_rank;
  opt_string("routing", r.routing);
  opt_number("tflops_baseline", r.tflops_baseline);
  opt_number("pct_of_baseline", r.pct_of_baseline);
  opt_number("rel_err_baseline", r.rel_err_baseline);
  opt_string("baseline", r.baseline);
  opt_string("variant_config", r.variant_config);
  opt_number("t_variant_ms", r.t_variant_ms);
  if (!r.group_rows.empty()) {
    os << ",\"group_rows\":[";
    for (size_t i = 0; i < r.group_rows.size(); ++i) os << (i ? "," : "") << r.group_rows[i];
    os << "]";
  }
  os << "}";
  return os.str();
}

std::string iso_utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

std::string current_commit() {
  if (const char* env = std::getenv("CCFUSE_COMMIT"); env && *env) return env;
  // The binary's own checkout first (it may run from anywhere), then the working directory.
  const std::string dir = executable_dir();
  std::string sha;
  if (!dir.empty()) sha = first_line_of("git -C " + shell_quote(dir) + " rev-parse --short HEAD 2>/dev/null");
  if (!is_hex(sha)) sha = first_line_of("git rev-parse --short HEAD 2>/dev/null");
  return is_hex(sha) ? sha : "unknown";
}

}  // namespace ccfuse::tool
