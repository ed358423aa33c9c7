#include <gtest/gtest.h>

#include "gfdit/error.h"
#include "gfdit/group.h"

using gfdit::Error;
using gfdit::ErrorCode;
using gfdit::Group;

namespace {

ErrorCode codeOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

}  // namespace

TEST(Group, KeepsOrderAndFindsSelf) {
  int ranks[] = {5, 2, 7};
  Group g = Group::create(ranks, 3, 8, 7);
  EXPECT_EQ(g.size(), 3);
  EXPECT_EQ(g.selfIdx(), 2);
  EXPECT_EQ(g.rankAt(0), 5);
  EXPECT_EQ(g.rankAt(1), 2);
  EXPECT_EQ(g.indexOf(2), 1);
  EXPECT_EQ(g.indexOf(3), -1);
  EXPECT_EQ(g.toString(), "[5, 2, 7]");
}

TEST(Group, Whole) {
  Group g = Group::whole(64, 63);
  EXPECT_EQ(g.size(), 64);
  EXPECT_EQ(g.selfIdx(), 63);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(g.rankAt(i), i);
}

TEST(Group, RefusesBadRankLists) {
  int dup[] = {0, 1, 1};
  EXPECT_EQ(codeOf([&] { Group::create(dup, 3, 4, 0); }), ErrorCode::kInvalidUsage);
  int out_of_range[] = {0, 4};
  EXPECT_EQ(codeOf([&] { Group::create(out_of_range, 2, 4, 0); }), ErrorCode::kInvalidUsage);
  int negative[] = {0, -1};
  EXPECT_EQ(codeOf([&] { Group::create(negative, 2, 4, 0); }), ErrorCode::kInvalidUsage);
  int empty[] = {1, 2};
  EXPECT_EQ(codeOf([&] { Group::create(empty, 0, 4, 1); }), ErrorCode::kInvalidUsage);
  int too_many[] = {0, 1, 2, 3, 4};
  EXPECT_EQ(codeOf([&] { Group::create(too_many, 5, 4, 0); }), ErrorCode::kInvalidUsage);
}

TEST(Group, NonMemberDescribesTheGroup) {
  // As with torch.distributed.new_group, every rank may describe every group.
  int not_member[] = {1, 2};
  Group g = Group::create(not_member, 2, 4, 3);
  EXPECT_FALSE(g.isMember());
  EXPECT_EQ(g.selfIdx(), -1);
  EXPECT_EQ(g.size(), 2);
  EXPECT_EQ(g.rankAt(1), 2);
  EXPECT_TRUE(Group::create(not_member, 2, 4, 2).isMember());
}

TEST(Group, MessageNamesTheProblem) {
  int dup[] = {1, 1};
  try {
    Group::create(dup, 2, 4, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 appears twice in the group"), std::string::npos) << e.what();
  }
}

TEST(Group, IsPlainData) {
  static_assert(std::is_trivially_copyable<Group>::value, "a group must be plain data");
  int ranks[] = {3, 1};
  Group a = Group::create(ranks, 2, 4, 1);
  Group b = a;
  EXPECT_EQ(b.rankAt(0), 3);
  EXPECT_EQ(b.selfIdx(), 1);
}
