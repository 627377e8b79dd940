// `ccfuse check|bench --op grouped_gemm` on the host side: its options and rules, the routing's
// rows per expert (pinned against tests/data/grouped_routing_cases.txt, which the Python twin
// tools/moe_grouped.py is checked against too), what reaches the GPU side, and the record.
// The bad inputs are in tool_test_util.h's table.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "tool_test_util.h"

namespace ccfuse::tool::testing {
namespace {

Options parse(const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  return parse_args(int(argv.size()) - 1, argv.data());
}

std::vector<std::string> grouped_args(const std::string& command, const std::vector<std::string>& more = {}) {
  std::vector<std::string> a{command, "--op",   "grouped_gemm", "--experts", "8",   "--tokens",
                             "100",   "--topk", "2",            "--n",       "256", "--k",
                             "128"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

TEST(ToolGrouped, DefaultsAndRowsAreTokensTimesTopk) {
  Options o = parse(grouped_args("check"));
  EXPECT_TRUE(is_grouped(o));
  EXPECT_TRUE(is_single_gpu(o));
  EXPECT_FALSE(is_gemm(o));
  EXPECT_EQ(o.experts, 8);
  EXPECT_EQ(o.tokens, 100);
  EXPECT_EQ(o.topk, 2);
  EXPECT_EQ(o.m, 200);
  EXPECT_EQ(o.routing, Routing::kUniform);
  EXPECT_EQ(o.b_layout, gemm::BLayout::kNK);
  EXPECT_EQ(o.dtype, DType::kBFloat16);
  Options r = o;
  EXPECT_EQ(resolve(r, 2), "");
  EXPECT_EQ(r.backend, Backend::kGpu);
  EXPECT_EQ(r.world_size, 1);
}

TEST(ToolGrouped, EveryOptionParses) {
  Options o = parse(grouped_args("bench", {"--routing", "zipf", "--b-layout", "kn", "--dtype", "fp16", "--seed", "3",
                                           "--iters", "10", "--world-size", "1"}));
  EXPECT_EQ(o.routing, Routing::kZipf);
  EXPECT_EQ(o.b_layout, gemm::BLayout::kKN);
  EXPECT_EQ(o.dtype, DType::kFloat16);
  EXPECT_EQ(o.iters, 10);
  for (const char* name : {"uniform", "zipf", "one_hot", "empty_some"}) {
    EXPECT_EQ(routing_name(parse(grouped_args("check", {std::string("--routing=") + name})).routing), std::string(name));
  }
  // topk is a row multiplier: larger than the experts is allowed.
  EXPECT_EQ(parse({"check", "--op", "grouped_gemm", "--experts", "2", "--tokens", "3", "--topk", "8", "--n", "8",
                   "--k", "8"}).m,
            24);
}

TEST(ToolGrouped, RoutingSumsAreExactAndShapesAsDocumented) {
  for (int e : {1, 2, 3, 4, 7, 8, 64, 128, 4096}) {
    for (int64_t total : {int64_t(0), int64_t(1), int64_t(5), int64_t(100), int64_t(65536), int64_t(2147483647)}) {
      for (Routing r : {Routing::kUniform, Routing::kZipf, Routing::kOneHot, Routing::kEmptySome}) {
        if (r == Routing::kEmptySome && e < 2) continue;
        const auto rows = grouped_rows(e, total, r);
        ASSERT_EQ(rows.size(), size_t(e));
        EXPECT_EQ(sum(rows), total) << routing_name(r) << " e=" << e << " total=" << total;
        for (int64_t v : rows) EXPECT_GE(v, 0);
        if (r == Routing::kZipf || r == Routing::kOneHot) {
          for (size_t i = 1; i < rows.size(); ++i) {
            EXPECT_LE(rows[i], rows[i - 1]) << routing_name(r) << " e=" << e << " total=" << total << " expert " << i;
          }
        }
        if (r == Routing::kOneHot) {
          EXPECT_EQ(rows[0], total);
        }
        if (r == Routing::kEmptySome) {
          for (size_t i = 0; i < rows.size(); i += 2) {
            EXPECT_EQ(rows[i], 0) << "even expert " << i;
          }
          for (size_t i = 3; i < rows.size(); i += 2) {
            EXPECT_LE(rows[i - 2] - rows[i], 1);
          }
        }
        if (r == Routing::kUniform) {
          for (size_t i = 1; i < rows.size(); ++i) {
            EXPECT_LE(rows[i - 1] - rows[i], 1);
          }
        }
      }
    }
  }
  // zipf is skewed as documented: expert 0 takes about 1/H(E, 1.2) of the rows.
  const auto z = grouped_rows(8, 100000, Routing::kZipf);
  EXPECT_NEAR(double(z[0]) / double(z[1]), std::pow(2.0, kZipfExponent), 0.01);
  EXPECT_THROW(grouped_rows(0, 5, Routing::kUniform), InvalidArgument);
  EXPECT_THROW(grouped_rows(1, 5, Routing::kEmptySome), InvalidArgument);
  EXPECT_THROW(parse_routing("Zipf"), InvalidArgument);
}

// The checked-in counts (tools/moe_grouped.py must give the same: tests/python/test_moe_grouped.py).
TEST(ToolGrouped, RoutingMatchesTheCheckedInCounts) {
  std::string path = __FILE__;
  path = path.substr(0, path.rfind('/')) + "/../../data/grouped_routing_cases.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in.is_open()) << path;
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream head(line.substr(0, colon)), counts(line.substr(colon + 1));
    int experts = 0;
    int64_t total = 0;
    std::string routing;
    head >> experts >> total >> routing;
    std::vector<int64_t> want;
    for (int64_t v; counts >> v;) want.push_back(v);
    const auto got = grouped_rows(experts, total, parse_routing(routing));
    std::ostringstream printed;
    for (int64_t v : got) printed << " " << v;
    EXPECT_EQ(got, want) << experts << " " << total << " " << routing << " :" << printed.str();
    ++cases;
  }
  EXPECT_GE(cases, 10);
}

TEST(ToolGrouped, CheckReachesTheGpuSideAndPrintsTheCaseForReplay) {
  const ToolRun r = run_with(grouped_args("check", {"--routing", "empty_some", "--seed", "9", "--b-layout", "kn"}),
                             fake_hooks(1));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fake_seen().op, "grouped_gemm");
  EXPECT_EQ(fake_seen().backend, Backend::kGpu);
  EXPECT_EQ(fake_seen().world_size, 1);
  EXPECT_EQ(fake_seen().m, 200);
  EXPECT_EQ(fake_seen().routing, Routing::kEmptySome);
  EXPECT_EQ(last_line(r.out),
            "PASS op=grouped_gemm backend=gpu world_size=1 m=200 n=256 k=128 dtype=bf16 experts=8 tokens=100 topk=2 "
            "routing=empty_some b_layout=kn seed=9 rel_err=0.000e+00 tol=1e-02");
}

TEST(ToolGrouped, PrintConfigShowsTheRowsPerExpert) {
  const ToolRun r = run_with(grouped_args("check", {"--routing", "zipf", "--print-config", "--seed", "1"}),
                             fake_hooks(1));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_CONTAINS(r.out, "routing=zipf\n");
  EXPECT_CONTAINS(r.out, "group_rows=86,38,23,17,12,9,8,7\n");
  EXPECT_CONTAINS(r.out, "experts=8\ntokens=100\ntopk=2\n");
}

TEST(ToolGrouped, BenchRecordCarriesTheMoeFields) {
  const std::string path = ::testing::TempDir() + "ccfuse_grouped_test.jsonl";
  std::remove(path.c_str());
  const ToolRun r = run_with(grouped_args("bench", {"--routing", "one_hot", "--json", path}), fake_hooks(1));
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  for (const char* part : {"\"op\":\"grouped_gemm\"", "\"m\":200", "\"experts\":8", "\"topk\":2",
                           "\"tokens_per_rank\":100", "\"routing\":\"one_hot\"", "\"b_layout\":\"nk\"",
                           "\"group_rows\":[200,0,0,0,0,0,0,0]"})
    EXPECT_CONTAINS(line, part);
  std::remove(path.c_str());
}

TEST(ToolGrouped, JsonOfABaselineRecord) {
  BenchRecord rec;
  rec.op = "grouped_gemm";
  rec.t_fused_ms = 2.0, rec.t_gemm_ms = 1.8;
  rec.tflops = 600, rec.tflops_baseline = 540, rec.pct_of_baseline = 90;
  rec.baseline = "cublas_grouped";
  rec.experts = 4, rec.topk = 2, rec.tokens_per_rank = 8192, rec.routing = "zipf";
  rec.group_rows = {8659, 3769, 2316, 1640};
  const std::string j = to_json_line(rec);
  for (const char* part : {"\"tflops\":600", "\"tflops_baseline\":540", "\"pct_of_baseline\":90",
                           "\"baseline\":\"cublas_grouped\"", "\"experts\":4", "\"topk\":2",
                           "\"tokens_per_rank\":8192", "\"routing\":\"zipf\"", "\"group_rows\":[8659,3769,2316,1640]"})
    EXPECT_CONTAINS(j, part);
  // The TP records keep their shape: none of these fields.
  const std::string tp = to_json_line(BenchRecord{});
  for (const char* part : {"experts", "routing", "baseline", "group_rows", "topk"})
    EXPECT_EQ(tp.find(part), std::string::npos) << part;
  EXPECT_CONTAINS(format_bench_table(rec), "pct_of_baseline");
}

}  // namespace
}  // namespace ccfuse::tool::testing
