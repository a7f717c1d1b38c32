// A backend registered from another library is selectable by name like the built-in ones.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::testing {
int loopback_calls();
}

namespace dtensor::collectives {
namespace {

TEST(ThirdPartyBackendTest, RegisteredByNameAndSelectable) {
  const auto names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "test_loopback"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "threads"), names.end());
  const int before = testing::loopback_calls();
  run_threads(
      1,
      [](int64_t) {
        const at::Tensor x = at::arange(6, at::kFloat).reshape({2, 3});
        EXPECT_TRUE(at::equal(all_reduce(x, ReduceOp::kSum, RankContext::kWorld), x));
        EXPECT_TRUE(at::equal(all_gather_into_tensor(x, 1, RankContext::kWorld), x));
        barrier(RankContext::kWorld);
      },
      "test_loopback");
  EXPECT_EQ(testing::loopback_calls() - before, 3);
}

TEST(ThirdPartyBackendTest, SecondRegistrationOfANameIsRejected) {
  EXPECT_THROW(register_backend("test_loopback", nullptr), dtensor::Error);
}

}  // namespace
}  // namespace dtensor::collectives
