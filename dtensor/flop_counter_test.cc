// NOTE [FLOP counter]: per-rank FLOPs of local calls, and the TP linear step (NOTE [compute in
// the cost model]): its matmuls on each of N ranks do 1/N of one rank's, and it still equals one
// device's step. Ranks are threads.

#include "dtensor/flop_counter.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "collectives/rank_context.h"
#include "dtensor/api.h"

namespace dtensor {
namespace {

using collectives::run_threads;
namespace api = dtensor::api;

TEST(FlopCounter, PlainTensorsCountByTheTableFormula) {
  const at::Tensor a = at::randn({3, 5}), b = at::randn({5, 7}), bias = at::randn({7});
  EXPECT_DOUBLE_EQ(op_flops("aten::mm", {a, b}), 2.0 * 3 * 5 * 7);
  EXPECT_DOUBLE_EQ(op_flops("aten::addmm", {bias, a, b}), 2.0 * 3 * 5 * 7);
  EXPECT_DOUBLE_EQ(op_flops("aten::bmm", {at::randn({2, 3, 5}), at::randn({2, 5, 7})}),
                   2.0 * 2 * 3 * 5 * 7);
  EXPECT_DOUBLE_EQ(op_flops("aten::add.Tensor", {a, a}), 15.0);  // one per output element
  EXPECT_DOUBLE_EQ(op_flops("aten::view", {a}), 0.0);            // not counted
  EXPECT_DOUBLE_EQ(op_flops("mylib::nothing", {a}), 0.0);
}

struct StepCounts {
  double matmul_flops = 0;          // the most any rank ran of aten::mm and aten::addmm
  std::vector<at::Tensor> results;  // loss, weight grad, bias grad (full), from rank 0
};

// nn.Linear(in, out) with weight and bias S(0) (column-parallel), input replicated: loss =
// out.sum(), backward, on n thread ranks under a FlopCounter each.
StepCounts tp_linear_step(int64_t n, const at::Tensor& w, const at::Tensor& b,
                          const at::Tensor& x) {
  StepCounts counts;
  std::mutex mu;
  run_threads(n, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh({n});
    at::Tensor dw = api::distribute_tensor(w.clone().requires_grad_(true), mesh, {Shard(0)});
    at::Tensor db = api::distribute_tensor(b.clone().requires_grad_(true), mesh, {Shard(0)});
    const at::Tensor dx = api::distribute_tensor(x, mesh, {Replicate()});
    FlopCounter counter;
    const at::Tensor loss = at::linear(dx, dw, db).sum();
    loss.backward();
    counter.stop();
    const auto& by_op = counter.by_op();
    double mm = 0;
    for (const char* op : {"aten::mm", "aten::addmm"}) {
      if (by_op.count(op) != 0) mm += by_op.at(op);
    }
    std::vector<at::Tensor> full = {api::full_tensor(loss), api::full_tensor(dw.grad()),
                                    api::full_tensor(db.grad())};
    std::lock_guard<std::mutex> lock(mu);
    counts.matmul_flops = std::max(counts.matmul_flops, mm);
    if (rank == 0) counts.results = std::move(full);
  });
  return counts;
}

TEST(FlopCounter, TensorParallelLinearStepComputesAShardPerRank) {
  const at::Tensor w = at::randn({256, 256}, at::kFloat), b = at::randn({256}, at::kFloat);
  const at::Tensor x = at::randn({32, 256}, at::kFloat);
  // One device: the same step on plain tensors.
  const at::Tensor pw = w.clone().requires_grad_(true), pb = b.clone().requires_grad_(true);
  const at::Tensor ploss = at::linear(x, pw, pb).sum();
  ploss.backward();
  const double single = tp_linear_step(1, w, b, x).matmul_flops;
  EXPECT_GT(single, 0);
  for (const int64_t n : {2, 4}) {
    const StepCounts c = tp_linear_step(n, w, b, x);
    EXPECT_LE(c.matmul_flops, 1.05 * single / static_cast<double>(n))
        << n << " ranks: " << c.matmul_flops << " matmul FLOPs per rank, one rank " << single;
    ASSERT_EQ(c.results.size(), 3u);
    EXPECT_TRUE(at::allclose(c.results[0], ploss, 1e-4, 1e-3));
    EXPECT_TRUE(at::allclose(c.results[1], pw.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(at::allclose(c.results[2], pb.grad(), 1e-5, 1e-5));
  }
}

}  // namespace
}  // namespace dtensor
