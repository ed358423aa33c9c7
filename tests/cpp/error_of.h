// The message of the gfdit::Error a call throws, for tests of refusals.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "gfdit/error.h"

namespace gfdit {
namespace testing {

/// What `fn` throws as gfdit::Error with `code` (a test failure when it throws nothing or another code).
inline std::string errorOf(const std::function<void()>& fn, ErrorCode code = ErrorCode::kInvalidUsage) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    return e.what();
  }
  ADD_FAILURE() << "no gfdit::Error thrown";
  return "";
}

}  // namespace testing
}  // namespace gfdit
