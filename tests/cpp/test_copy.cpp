// Copy tables: host and device paths, parsing, selection by size, path replacement.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "copy.h"
#include "gfdit/error.h"

using gfdit::CopyPath;
using gfdit::CopySelector;

TEST(CopyTable, ParsesDevicePathsAndPicksBySize) {
  CopySelector sel = CopySelector::parse("65536:sm,16777216:tma,inf:ce");
  EXPECT_TRUE(sel.isDevice());
  EXPECT_EQ(sel.pick(1), CopyPath::kCudaSm);
  EXPECT_EQ(sel.pick(65536), CopyPath::kCudaSm);
  EXPECT_EQ(sel.pick(65537), CopyPath::kCudaTma);
  EXPECT_EQ(sel.pick(16777216), CopyPath::kCudaTma);
  EXPECT_EQ(sel.pick(16777217), CopyPath::kCudaCe);
  EXPECT_EQ(sel.pick(std::numeric_limits<size_t>::max()), CopyPath::kCudaCe);
  EXPECT_EQ(sel.toString(), "65536:sm,16777216:tma,inf:ce");
  EXPECT_EQ(CopySelector::parse(sel.toString()).toString(), sel.toString());
}

TEST(CopyTable, TheLastBoundIsUnbounded) {
  CopySelector sel = CopySelector::parse("4096:sm,65536:ce");
  EXPECT_EQ(sel.pick(size_t{1} << 40), CopyPath::kCudaCe);
  EXPECT_EQ(sel.toString(), "4096:sm,inf:ce");
}

TEST(CopyTable, HostTablesStayHost) {
  CopySelector sel = CopySelector::parse("65536:memcpy,inf:stream");
  EXPECT_FALSE(sel.isDevice());
  EXPECT_FALSE(CopySelector().isDevice());
  std::vector<uint8_t> a(100, 7), b(100, 0);
  sel.copy(b.data(), a.data(), a.size());
  EXPECT_EQ(a, b);
}

TEST(CopyTable, RefusesMixedUnknownAndBadTables) {
  auto code = [](const std::string& spec) {
    try {
      CopySelector::parse(spec);
    } catch (const gfdit::Error& e) {
      return e.code();
    }
    return gfdit::ErrorCode::kInternal;  // not refused
  };
  EXPECT_EQ(code("65536:memcpy,inf:sm"), gfdit::ErrorCode::kInvalidUsage);
  EXPECT_EQ(code("inf:nvlink"), gfdit::ErrorCode::kInvalidUsage);
  EXPECT_EQ(code("64k:sm"), gfdit::ErrorCode::kInvalidUsage);
  EXPECT_EQ(code("4096:sm,1024:ce"), gfdit::ErrorCode::kInvalidUsage);
  EXPECT_EQ(code("sm"), gfdit::ErrorCode::kInvalidUsage);
  EXPECT_EQ(code(""), gfdit::ErrorCode::kInvalidUsage);
}

TEST(CopyTable, AHostCopyRefusesDevicePaths) {
  CopySelector sel = CopySelector::parse("inf:sm");
  uint8_t a = 1, b = 0;
  EXPECT_THROW(sel.copy(&b, &a, 1), gfdit::Error);
}

TEST(CopyTable, ReplacedMergesNeighbours) {
  CopySelector sel = CopySelector::parse("65536:sm,16777216:tma,inf:ce");
  EXPECT_EQ(sel.replaced(CopyPath::kCudaTma, CopyPath::kCudaSm).toString(), "16777216:sm,inf:ce");
  EXPECT_EQ(sel.replaced(CopyPath::kCudaCe, CopyPath::kCudaTma).toString(), "65536:sm,inf:tma");
  EXPECT_EQ(sel.replaced(CopyPath::kCpuMemcpy, CopyPath::kCpuStreaming).toString(), sel.toString());
}

TEST(CopyTable, PathNames) {
  EXPECT_STREQ(gfdit::copyPathName(CopyPath::kCudaSm), "sm");
  EXPECT_STREQ(gfdit::copyPathName(CopyPath::kCudaCe), "ce");
  EXPECT_STREQ(gfdit::copyPathName(CopyPath::kCudaTma), "tma");
  EXPECT_TRUE(gfdit::isDevicePath(CopyPath::kCudaTma));
  EXPECT_FALSE(gfdit::isDevicePath(CopyPath::kCpuStreaming));
}
