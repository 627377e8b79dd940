// ccfuse/common/ranges.h: the byte-range test behind the ops' "output overlaps input" errors.
#include <gtest/gtest.h>

#include "ccfuse/common/ranges.h"

namespace ccfuse {
namespace {

TEST(BytesOverlap, SharedBytesOnlyAndNeverForEmptyRanges) {
  char buf[64] = {};
  EXPECT_TRUE(bytes_overlap(buf, 16, buf, 16));             // the same range
  EXPECT_TRUE(bytes_overlap(buf, 16, buf + 15, 16));        // one shared byte
  EXPECT_TRUE(bytes_overlap(buf + 15, 16, buf, 16));        // either order
  EXPECT_TRUE(bytes_overlap(buf, 64, buf + 20, 4));         // one inside the other
  EXPECT_FALSE(bytes_overlap(buf, 16, buf + 16, 16));       // adjacent
  EXPECT_FALSE(bytes_overlap(buf + 16, 16, buf, 16));
  EXPECT_FALSE(bytes_overlap(buf, 0, buf, 16));             // empty ranges share nothing
  EXPECT_FALSE(bytes_overlap(buf, 16, buf + 8, 0));
  EXPECT_FALSE(bytes_overlap(nullptr, 0, buf, 16));          // an absent optional input
}

}  // namespace
}  // namespace ccfuse
