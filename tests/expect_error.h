#pragma once
// Asserts that `f` throws std::invalid_argument whose message contains `needle`.

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace dtensor::testing {

inline void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace dtensor::testing
