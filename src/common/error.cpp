#include "ccfuse/common/error.h"

namespace ccfuse::detail {

void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg) {
  std::ostringstream os;
  os << "ccfuse: " << (msg.empty() ? std::string("check failed") : msg) << " [" << file << ":" << line
     << ": " << cond << "]";
  throw Error(os.str());
}

}  // namespace ccfuse::detail
