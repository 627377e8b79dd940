// The results format (DESIGN §5): JSON Lines records that a JSON reader accepts, with null where
// a time is missing, properly escaped strings, and `bench --json` appending one record per run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "tool_test_util.h"

namespace ccfuse::tool::testing {
namespace {

// ---- a strict reader of one flat JSON object (all the records are) --------------------------

struct JsonValue {
  enum Kind { kNull, kBool, kNumber, kString } kind = kNull;
  double number = 0;
  bool boolean = false;
  std::string text;
};

class FlatJsonReader {
 public:
  explicit FlatJsonReader(const std::string& s) : s_(s) {}

  std::map<std::string, JsonValue> object() {
    std::map<std::string, JsonValue> out;
    expect('{');
    if (peek() == '}') {
      ++i_;
    } else {
      for (;;) {
        const std::string key = string();
        expect(':');
        if (!out.emplace(key, value()).second) throw std::runtime_error("duplicate key " + key);
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skip_space();
    if (i_ != s_.size()) throw std::runtime_error("trailing text at " + std::to_string(i_));
    return out;
  }

 private:
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  char peek() {
    skip_space();
    if (i_ >= s_.size()) throw std::runtime_error("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) throw std::runtime_error(std::string("expected '") + c + "' at " + std::to_string(i_));
    ++i_;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) throw std::runtime_error("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) throw std::runtime_error("raw control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = s_.at(i_++);
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          const unsigned code = unsigned(std::stoul(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          if (code < 0x80) {
            out += char(code);
          } else {
            out += "<U+" + std::to_string(code) + ">";  // enough for the tests
          }
          break;
        }
        default: throw std::runtime_error("bad escape");
      }
    }
  }
  JsonValue value() {
    JsonValue v;
    const char c = peek();
    if (c == '"') {
      v.kind = JsonValue::kString;
      v.text = string();
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = JsonValue::kBool;
      v.boolean = c == 't';
      i_ += v.boolean ? 4 : 5;
    } else {
      static const std::regex number_re(R"(^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)");
      std::smatch m;
      const std::string rest = s_.substr(i_);
      if (!std::regex_search(rest, m, number_re)) throw std::runtime_error("bad value at " + std::to_string(i_));
      v.kind = JsonValue::kNumber;
      v.number = std::stod(m.str());
      i_ += size_t(m.length());
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::map<std::string, JsonValue> read_json(const std::string& line) { return FlatJsonReader(line).object(); }

BenchRecord sample_record() {
  BenchRecord r;
  r.op = "ag_gemm";
  r.dtype = "bf16";
  r.gpu = "NVIDIA H200";
  r.commit = "abc1234";
  r.date = "2025-01-02T03:04:05Z";
  r.backend = "gpu";
  r.command = "ccfuse bench --op ag_gemm --json 'a \"b\".jsonl'";
  r.world_size = 2;
  r.m = 8192, r.n = 14336, r.k = 8192;
  r.t_fused_ms = 2.8, r.t_serial_ms = 3.122, r.t_gemm_ms = 2.639, r.t_comm_ms = 0.339, r.t_limit_ms = 2.639;
  r.rel_err = 0.0031;
  return r;
}

const char* const kDesignKeys[] = {"op",        "world_size",  "m",         "n",         "k",
                                   "dtype",     "gpu",         "commit",    "date",      "t_fused_ms",
                                   "t_serial_ms", "t_gemm_ms", "t_comm_ms", "t_limit_ms", "t_peer_ms",
                                   "rel_err",   "backend",     "command",   "speedup",   "overlap_eff"};

TEST(ToolJson, RecordHasTheDesignFieldsAndNullForMissingTimes) {
  const BenchRecord r = sample_record();
  const std::string line = to_json_line(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);  // one record, one line
  const auto j = read_json(line);
  for (const char* key : kDesignKeys) EXPECT_EQ(j.count(key), 1u) << key;
  EXPECT_EQ(j.at("op").text, "ag_gemm");
  EXPECT_EQ(j.at("world_size").number, 2);
  EXPECT_EQ(j.at("n").number, 14336);
  EXPECT_EQ(j.at("command").text, r.command);  // quotes survive the round trip
  EXPECT_EQ(j.at("t_peer_ms").kind, JsonValue::kNull);
  EXPECT_NEAR(j.at("t_serial_ms").number, 3.122, 1e-12);
  EXPECT_NEAR(j.at("speedup").number, 3.122 / 2.8, 1e-6);
  EXPECT_NEAR(j.at("overlap_eff").number, (3.122 - 2.8) / (3.122 - 2.639), 1e-6);
  EXPECT_NEAR(j.at("rel_err").number, 0.0031, 1e-12);
}

TEST(ToolJson, NegativeOrNonFiniteBecomesNull) {
  BenchRecord r = sample_record();
  r.t_comm_ms = -1;
  r.t_serial_ms = -1;
  r.rel_err = std::numeric_limits<double>::infinity();
  const auto j = read_json(to_json_line(r));
  EXPECT_EQ(j.at("t_comm_ms").kind, JsonValue::kNull);
  EXPECT_EQ(j.at("t_serial_ms").kind, JsonValue::kNull);
  EXPECT_EQ(j.at("rel_err").kind, JsonValue::kNull);
  EXPECT_EQ(j.at("speedup").kind, JsonValue::kNull);      // needs t_serial
  EXPECT_EQ(j.at("overlap_eff").kind, JsonValue::kNull);  // likewise
}

TEST(ToolJson, OverlapEfficiencyKeepsItsSignAndIsNullWithoutRoom) {
  BenchRecord r = sample_record();
  r.t_fused_ms = 4.0;  // slower than serial: negative efficiency, still a number
  EXPECT_LT(read_json(to_json_line(r)).at("overlap_eff").number, 0);
  r.t_limit_ms = r.t_serial_ms;  // nothing to overlap: the ratio is undefined
  EXPECT_TRUE(std::isnan(overlap_eff_of(r)));
  EXPECT_EQ(read_json(to_json_line(r)).at("overlap_eff").kind, JsonValue::kNull);
  EXPECT_NEAR(speedup_of(r), 3.122 / 4.0, 1e-12);
}

TEST(ToolJson, SteadyTimesOnlyWhenMeasured) {
  BenchRecord r = sample_record();
  auto j = read_json(to_json_line(r));
  for (const char* key : {"steady_ms", "t_fused_steady_ms", "t_serial_steady_ms", "t_gemm_steady_ms",
                          "t_comm_steady_ms", "t_gemm_ccfuse_steady_ms", "pct_of_cublas_steady"})
    EXPECT_EQ(j.count(key), 0u) << key;  // the records of runs without CCFUSE_BENCH_STEADY_MS keep their shape
  r.steady_ms = 300;
  r.t_fused_steady_ms = 0.36;
  r.t_serial_steady_ms = 0.43;
  r.t_gemm_steady_ms = 0.30;
  r.t_comm_steady_ms = 0.2;
  r.t_gemm_ccfuse_steady_ms = 0.31;
  r.pct_of_cublas_steady = 96.5;
  j = read_json(to_json_line(r));
  EXPECT_EQ(j.at("steady_ms").number, 300);
  EXPECT_NEAR(j.at("t_fused_steady_ms").number, 0.36, 1e-12);
  EXPECT_NEAR(j.at("t_serial_steady_ms").number, 0.43, 1e-12);
  EXPECT_NEAR(j.at("t_gemm_steady_ms").number, 0.30, 1e-12);
  EXPECT_NEAR(j.at("t_comm_steady_ms").number, 0.2, 1e-12);
  EXPECT_NEAR(j.at("t_gemm_ccfuse_steady_ms").number, 0.31, 1e-12);
  EXPECT_NEAR(j.at("pct_of_cublas_steady").number, 96.5, 1e-12);
}

TEST(ToolEnv, IntegerVariablesAreCheckedAndNamed) {
  const char* name = "CCFUSE_TEST_ENV_INT";
  unsetenv(name);
  EXPECT_EQ(env_int(name, 7, 0, 100, "widgets"), 7);
  setenv(name, "", 1);
  EXPECT_EQ(env_int(name, 7, 0, 100, "widgets"), 7);
  setenv(name, "42", 1);
  EXPECT_EQ(env_int(name, 7, 0, 100, "widgets"), 42);
  for (const char* bad : {"101", "-1", "4x", "x"}) {
    setenv(name, bad, 1);
    try {
      env_int(name, 7, 0, 100, "widgets");
      ADD_FAILURE() << bad << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), std::string("CCFUSE_TEST_ENV_INT '") + bad +
                                           "' must be a number of widgets in [0, 100]");
    }
  }
  unsetenv(name);
  // The two benches' variables go through it.
  setenv("CCFUSE_BENCH_STEADY_MS", "20000", 1);
  EXPECT_THROW(bench_steady_ms(), InvalidArgument);
  setenv("CCFUSE_BENCH_STEADY_MS", "300", 1);
  EXPECT_EQ(bench_steady_ms(), 300);
  unsetenv("CCFUSE_BENCH_STEADY_MS");
  EXPECT_EQ(bench_steady_ms(), 0);
}

TEST(ToolJson, StringsAreEscaped) {
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(json_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json_quote("tab\there\nnl"), "\"tab\\there\\nnl\"");
  EXPECT_EQ(json_quote(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(json_quote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // valid UTF-8 passes through
  EXPECT_EQ(json_quote("bad\xff"), "\"bad\\ufffd\"");        // a stray byte would break the line
  BenchRecord r = sample_record();
  r.notes = std::string("line1\nline2 \"quoted\" \x7f");
  const auto j = read_json(to_json_line(r));
  EXPECT_EQ(j.at("notes").text, r.notes);
}

TEST(ToolJson, DateAndCommit) {
  EXPECT_TRUE(std::regex_match(iso_utc_now(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << iso_utc_now();
  ASSERT_EQ(setenv("CCFUSE_COMMIT", "feedbee", 1), 0);
  EXPECT_EQ(current_commit(), "feedbee");
  ASSERT_EQ(unsetenv("CCFUSE_COMMIT"), 0);
  const std::string sha = current_commit();  // git's short hash, or "unknown" outside a checkout
  EXPECT_TRUE(sha == "unknown" || std::regex_match(sha, std::regex("[0-9a-f]{4,40}"))) << sha;
}

TEST(ToolJson, BenchTableShowsEveryMetric) {
  const std::string table = format_bench_table(sample_record());
  for (const char* metric : {"t_fused", "t_serial", "t_gemm", "t_comm", "t_limit", "t_peer", "speedup",
                             "overlap_eff", "rel_err"})
    EXPECT_CONTAINS(table, metric);
  EXPECT_CONTAINS(table, "1.115x");  // 3.122 / 2.8
}

// A fresh path in the temp directory; the file is removed when the test ends.
class TempFile {
 public:
  TempFile() {
    const char* dir = std::getenv("TMPDIR");
    std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/ccfuse_tool_test_XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    const int fd = mkstemp(buf.data());
    if (fd >= 0) close(fd);
    path_ = buf.data();
    std::remove(path_.c_str());  // bench creates it
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  std::vector<std::string> lines() const {
    std::ifstream in(path_);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }

 private:
  std::string path_;
};

TEST(ToolBench, JsonRecordIsAppendedPerRun) {
  TempFile file;
  ASSERT_EQ(setenv("CCFUSE_COMMIT", "c0ffee1", 1), 0);
  const std::vector<std::string> args = {"bench", "--op", "gemm_ar", "--world-size", "3", "--m", "24", "--n", "16",
                                         "--k", "12", "--backend", "cpu", "--iters", "2", "--warmup", "1",
                                         "--seed", "5", "--json", file.path()};
  const ToolRun r = run(args);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "t_fused");
  EXPECT_CONTAINS(r.out, "appended 1 record to " + file.path());
  EXPECT_CONTAINS(r.err, "bench: fused op: 1 warmup + 2 timed runs");  // progress, on the log stream

  const auto lines = file.lines();
  ASSERT_EQ(lines.size(), 1u);
  const auto j = read_json(lines[0]);
  for (const char* key : kDesignKeys) EXPECT_EQ(j.count(key), 1u) << key;
  EXPECT_EQ(j.at("op").text, "gemm_ar");
  EXPECT_EQ(j.at("world_size").number, 3);
  EXPECT_EQ(j.at("m").number, 24);
  EXPECT_EQ(j.at("n").number, 16);
  EXPECT_EQ(j.at("k").number, 12);  // the global K, as given
  EXPECT_EQ(j.at("dtype").text, "bf16");
  EXPECT_EQ(j.at("gpu").text, "cpu-reference");
  EXPECT_EQ(j.at("backend").text, "cpu");
  EXPECT_EQ(j.at("commit").text, "c0ffee1");
  EXPECT_TRUE(std::regex_match(j.at("date").text, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  EXPECT_EQ(j.at("t_peer_ms").kind, JsonValue::kNull);
  for (const char* t : {"t_fused_ms", "t_serial_ms", "t_gemm_ms", "t_comm_ms", "t_limit_ms", "speedup"}) {
    ASSERT_EQ(j.at(t).kind, JsonValue::kNumber) << t;
    EXPECT_GT(j.at(t).number, 0) << t;
  }
  EXPECT_EQ(j.at("t_limit_ms").number, std::max(j.at("t_gemm_ms").number, j.at("t_comm_ms").number));
  EXPECT_LE(j.at("rel_err").number, 1e-2);
  EXPECT_CONTAINS(j.at("command").text, "ccfuse bench --op gemm_ar");

  // A second run appends; the first record stays.
  ASSERT_EQ(run(args).code, 0);
  ASSERT_EQ(file.lines().size(), 2u);
  EXPECT_EQ(file.lines()[0], lines[0]);
  ASSERT_EQ(unsetenv("CCFUSE_COMMIT"), 0);
}

TEST(ToolBench, WrongAnswerIsReportedAndNotRecorded) {
  TempFile file;
  const ToolRun r = run({"bench", "--op", "ag_gemm", "--m", "8", "--n", "8", "--k", "8", "--backend", "cpu",
                         "--iters", "1", "--warmup", "0", "--inject-fault", "--json", file.path()});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_CONTAINS(last_line(r.out), "FAIL op=ag_gemm ");
  EXPECT_TRUE(file.lines().empty());
}

TEST(ToolBench, FakeGpuBackendRecordsItsDeviceName) {
  TempFile file;
  const ToolRun r = run_with({"bench", "--op", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "--json", file.path()},
                             fake_hooks(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = file.lines();
  ASSERT_EQ(lines.size(), 1u);
  const auto j = read_json(lines[0]);
  EXPECT_EQ(j.at("gpu").text, "FakeGPU");
  EXPECT_EQ(j.at("backend").text, "gpu");
  EXPECT_EQ(j.at("world_size").number, 2);
  EXPECT_NEAR(j.at("overlap_eff").number, (1.5 - 1.0) / (1.5 - 1.0), 1e-9);
}

}  // namespace
}  // namespace ccfuse::tool::testing
