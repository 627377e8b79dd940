// ccfuse/common/error.h: the one error header (DESIGN §4 rule 4).
//
// Host code throws; it never calls exit() or abort(). Three kinds of error:
//   ccfuse::InvalidArgument  bad input: names the argument and the rule it broke
//   ccfuse::TimeoutError     a watchdog'd wait passed its bound (names rank and signal)
//   ccfuse::Error            anything else (a failed CUDA/NCCL/cuBLAS call, a broken invariant)
// Messages of CCFUSE_CHECK carry file:line and the failed condition.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ccfuse {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad input from a caller: the message is one line naming the argument and the rule.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what) {}
};

// A wait on a remote signal passed its watchdog bound.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg);

// Streams any number of arguments into one string: str_cat("m=", m, " k=", k).
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ccfuse

// Internal invariant or failed call: ccfuse::Error with file:line and the condition.
#define CCFUSE_CHECK(cond, ...)                                                                \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::ccfuse::detail::throw_check_failure(__FILE__, __LINE__, #cond,                         \
                                            ::ccfuse::detail::str_cat("" __VA_ARGS__));        \
  } while (0)

// Bad input: ccfuse::InvalidArgument whose message is exactly the streamed text, e.g.
//   CCFUSE_ARG_CHECK(m % w == 0, "--m ", m, " is not divisible by --world-size ", w);
#define CCFUSE_ARG_CHECK(cond, ...)                                                            \
  do {                                                                                         \
    if (!(cond)) throw ::ccfuse::InvalidArgument(::ccfuse::detail::str_cat(__VA_ARGS__));     \
  } while (0)
