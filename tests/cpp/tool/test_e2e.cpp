// The built `ccfuse` executable (CCFUSE_TOOL_PATH) run as a user runs it: exit codes, the last
// stdout line of check, and the one stderr line of bad input.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tool_test_util.h"

namespace ccfuse::tool::testing {
namespace {

struct Process {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the tool with `args` (already shell-safe) and collects stdout, stderr and the exit code.
Process run_binary(const std::string& args) {
  const char* dir = std::getenv("TMPDIR");
  std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/ccfuse_e2e_err_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const int fd = mkstemp(buf.data());
  if (fd >= 0) close(fd);
  const std::string err_path = buf.data();

  Process p;
  const std::string cmd = std::string("'") + CCFUSE_TOOL_PATH + "' " + args + " 2>'" + err_path + "'";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return p;
  }
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) p.out.append(chunk, n);
  const int status = pclose(pipe);
  p.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  p.err = slurp(err_path);
  std::remove(err_path.c_str());
  return p;
}

TEST(ToolBinary, HelpExitsZero) {
  const Process p = run_binary("--help");
  EXPECT_EQ(p.code, 0) << p.err;
  EXPECT_CONTAINS(p.out, "usage:");
  EXPECT_EQ(p.err, "");
}

TEST(ToolBinary, CheckPasses) {
  const Process p = run_binary("check --op gemm_rs --world-size 2 --m 16 --n 12 --k 8 --backend cpu --seed 77");
  EXPECT_EQ(p.code, 0) << p.out << p.err;
  EXPECT_TRUE(std::regex_match(last_line(p.out),
                               std::regex("PASS op=gemm_rs backend=cpu world_size=2 m=16 n=12 k=8 dtype=bf16 "
                                          "seed=77 rel_err=[-+.e0-9]+ tol=1e-02")))
      << p.out;
}

TEST(ToolBinary, DefaultBackendOnThisHostPrintsOneNotice) {
  // Host-only builds see no GPUs; a CUDA build on a GPU machine may see some: both are fine.
  const Process p = run_binary("check --op ag_gemm --m 8 --n 8 --k 8 --world-size 1");
  EXPECT_TRUE(p.code == 0 || p.code == 3) << p.out << p.err;
  size_t notices = 0;
  for (const auto& l : lines_of(p.err)) notices += l.find("found: running on the CPU reference world") != std::string::npos;
  EXPECT_LE(notices, 1u);
}

TEST(ToolBinary, BadInputExitsTwoWithOneLine) {
  const Process p = run_binary("check --op ag_gemm --m 1000 --n 8 --k 8 --world-size 3");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.err, "ccfuse: error: --m 1000 is not divisible by --world-size 3\n");
  EXPECT_EQ(p.out, "");
  const Process q = run_binary("frobnicate");
  EXPECT_EQ(q.code, 2);
  EXPECT_EQ(q.err, "ccfuse: error: unknown command 'frobnicate' (known: check, bench, help)\n");
}

TEST(ToolBinary, WrongAnswerExitsOne) {
  const Process p = run_binary("check --op gemm_ar --m 8 --n 8 --k 8 --backend cpu --seed 1 --inject-fault");
  EXPECT_EQ(p.code, 1) << p.err;
  EXPECT_EQ(last_line(p.out).rfind("FAIL op=gemm_ar ", 0), 0u) << p.out;
}

}  // namespace
}  // namespace ccfuse::tool::testing
