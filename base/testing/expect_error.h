#pragma once
// Asserts that `f` throws dtensor::Error (NOTE [error convention]) whose message contains
// `needle`.

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "base/error.h"

namespace dtensor::testing {

inline void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace dtensor::testing
