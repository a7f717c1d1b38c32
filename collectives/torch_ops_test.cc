// The dtensor_c10d operators: eager results through the dispatcher, Meta shapes with no context
// and no communication, and autograd (all_gather <-> reduce_scatter, all_to_all swaps splits).

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::collectives {
namespace {

auto all_gather_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("dtensor_c10d::all_gather_into_tensor", "")
      .typed<at::Tensor(const at::Tensor&, int64_t, c10::string_view, int64_t)>();
}
auto reduce_scatter_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("dtensor_c10d::reduce_scatter_tensor", "")
      .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t, c10::string_view, int64_t)>();
}
auto all_to_all_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("dtensor_c10d::all_to_all_single", "")
      .typed<at::Tensor(const at::Tensor&, at::IntArrayRef, at::IntArrayRef, c10::string_view)>();
}
auto all_reduce_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("dtensor_c10d::all_reduce", "")
      .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view)>();
}
auto wait_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("dtensor_c10d::wait_tensor", "")
      .typed<at::Tensor(const at::Tensor&)>();
}

TEST(TorchOpsTest, MetaKernelsNeedNoContextNorCommunication) {
  ASSERT_FALSE(has_current_context());
  const at::Tensor m = at::empty({2, 6}, at::TensorOptions().device(at::kMeta));
  EXPECT_EQ(all_gather_op().call(m, 4, "no-such-group", 1).sizes(), at::IntArrayRef({2, 24}));
  EXPECT_EQ(reduce_scatter_op().call(m, "sum", 3, "g", -1).sizes(), at::IntArrayRef({2, 2}));
  EXPECT_EQ(all_to_all_op().call(m, {1, 4}, {1, 1}, "g").sizes(), at::IntArrayRef({5, 6}));
  EXPECT_EQ(all_reduce_op().call(m, "sum", "g").sizes(), m.sizes());
  EXPECT_TRUE(all_gather_op().call(m, 4, "g", 0).is_meta());
}

TEST(TorchOpsTest, EagerOpsAreAsyncUntilWaited) {
  run_threads(3, [](int64_t r) {
    const at::Tensor x = at::full({2}, static_cast<float>(r + 1));
    const at::Tensor y = wait_op().call(all_reduce_op().call(x, "sum", RankContext::kWorld));
    EXPECT_TRUE(at::equal(y, at::full({2}, 6.0f)));
    const at::Tensor g = wait_op().call(all_gather_op().call(x, 3, RankContext::kWorld, 0));
    EXPECT_TRUE(
        at::equal(g, at::cat({at::full({2}, 1.0f), at::full({2}, 2.0f), at::full({2}, 3.0f)})));
    EXPECT_THROW(all_gather_op().call(x, 2, RankContext::kWorld, 0), std::exception);  // size
  });
}

TEST(TorchOpsTest, AllGatherBackwardIsReduceScatter) {
  for (int64_t n : {1, 2, 3}) {
    run_threads(n, [&](int64_t r) {
      const at::Tensor x = (at::arange(3, at::kDouble) + r).requires_grad_(true);
      const at::Tensor y = wait_op().call(all_gather_op().call(x, n, RankContext::kWorld, 0));
      const at::Tensor w = at::arange(3 * n, at::kDouble) * (r + 1);  // differs per rank
      (y * w).sum().backward();
      // d loss_total / d x_r = sum over ranks q of w_q[chunk r] = (1 + 2) * arange chunk r.
      const at::Tensor expected =
          at::arange(3 * n, at::kDouble).narrow(0, 3 * r, 3) * (n * (n + 1) / 2);
      EXPECT_TRUE(at::allclose(x.grad(), expected)) << x.grad();
    });
  }
}

TEST(TorchOpsTest, ReduceScatterBackwardIsAllGather) {
  const int64_t n = 2;
  run_threads(n, [&](int64_t r) {
    const at::Tensor x = at::ones({4}, at::kDouble).requires_grad_(true);
    const at::Tensor y = wait_op().call(reduce_scatter_op().call(x, "sum", n, "world", 0));
    const at::Tensor w = at::full({2}, static_cast<double>(r + 1), at::kDouble);
    (y * w).sum().backward();
    // Every rank's x feeds every rank's output chunk: grad = [w_0, w_1] gathered.
    const at::Tensor expected =
        at::cat({at::full({2}, 1.0, at::kDouble), at::full({2}, 2.0, at::kDouble)});
    EXPECT_TRUE(at::allclose(x.grad(), expected)) << x.grad();
  });
}

TEST(TorchOpsTest, AllToAllBackwardSwapsSplits) {
  run_threads(2, [](int64_t r) {
    // Rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 2 to rank 0 and 1 to itself.
    const std::vector<int64_t> in =
        r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
    const std::vector<int64_t> out =
        r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
    const at::Tensor x = at::ones({3, 2}, at::kDouble).requires_grad_(true);
    const at::Tensor y = wait_op().call(all_to_all_op().call(x, out, in, "world"));
    // Weight each received row by its global row id on the receiver.
    const at::Tensor w = (at::arange(3, at::kDouble) + 10 * r).unsqueeze(1).expand({3, 2});
    (y * w).sum().backward();
    // Row i of x went to some rank as some row; its gradient is that row's weight there.
    const at::Tensor expected = r == 0 ? at::tensor({0.0, 10.0, 11.0}, at::kDouble)
                                       : at::tensor({1.0, 2.0, 12.0}, at::kDouble);
    EXPECT_TRUE(at::allclose(x.grad(), expected.unsqueeze(1).expand({3, 2}))) << x.grad();
  });
}

}  // namespace
}  // namespace dtensor::collectives
