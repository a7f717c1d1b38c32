// Distributed tensors as at::Tensors (api.h): ATen calls on them against the single-device
// result, in-place / out= / views, mixing with plain tensors, strict mode, explain, the comm
// counter, random ops and autograd. Ranks are threads.

#include "dtensor/api.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "collectives/rank_context.h"
#include "tests/expect_error.h"

namespace dtensor {
namespace {

using collectives::run_threads;
using testing::expect_error;
namespace api = dtensor::api;

at::Tensor global_for(const std::vector<int64_t>& shape, int64_t salt = 0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return at::sin(at::arange(numel, at::kDouble) * 1.37 + salt * 0.71).reshape(shape);
}

void expect_same(const at::Tensor& dt, const at::Tensor& want) {
  ASSERT_TRUE(api::is_dtensor(dt));
  const at::Tensor got = api::full_tensor(dt);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(got, want, 1e-9, 1e-9)) << got << "\nvs\n" << want;
}

TEST(Dispatch, BasicOps) {
  const at::Tensor a = global_for({8, 4}), b = global_for({4, 6}, 1), c = global_for({8, 4}, 2);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    const at::Tensor db = api::distribute_tensor(b, mesh, {Replicate()});
    const at::Tensor dc = api::distribute_tensor(c, mesh, {Shard(1)});
    EXPECT_EQ(da.sizes(), a.sizes());
    EXPECT_EQ(da.scalar_type(), a.scalar_type());
    expect_same(at::add(da, dc), a + c);
    expect_same(da + dc * 2, a + c * 2);
    expect_same(at::mm(da, db), at::mm(a, b));
    expect_same(da.sum(), a.sum());
    expect_same(da.sum(1), a.sum(1));
    expect_same(da.view({4, 8}), a.view({4, 8}));
    expect_same(at::relu(da), at::relu(a));
    expect_same(da.t(), a.t());
    expect_same(at::matmul(da, db), at::matmul(a, b));
  });
}

}  // namespace
}  // namespace dtensor
