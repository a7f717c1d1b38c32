// Convolution on distributed tensors (api.h) against one device: batch, channel and contracted
// input-channel layouts, and patch convolutions that keep a spatial dim sharded (NOTE [patch
// convolution]), forward and backward. Ranks are threads.

#include "dtensor/api.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/testing/numeric_inputs.h"

namespace dtensor {
namespace {

using collectives::run_threads;
namespace api = dtensor::api;

at::Tensor global_for(const std::vector<int64_t>& shape, int64_t salt = 0) {
  return testing::make_input(shape, salt, testing::Data::kAny);
}

void expect_same(const at::Tensor& dt, const at::Tensor& want) {
  ASSERT_TRUE(api::is_dtensor(dt));
  const at::Tensor got = api::full_tensor(dt);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(got, want, 1e-9, 1e-9)) << got << "\nvs\n" << want;
}

// Convolution: a batch-sharded input keeps the batch sharded, an output-channel-sharded weight
// shards the output's channels, input channels sharded on input and weight give a Partial sum;
// every result and gradient equals one device's.
TEST(ConvolutionDispatch, ConvolutionLayouts) {
  const at::Tensor x = global_for({4, 4, 6, 6}), w = global_for({8, 4, 3, 3}, 1),
                   b = global_for({8}, 2);
  const at::Tensor want = at::conv2d(x, w, b, {1, 1}, {1, 1});
  struct Case {
    Placement px, pw, pb, out;
  };
  for (const Case& c : {Case{Shard(0), Replicate(), Replicate(), Shard(0)},
                        Case{Replicate(), Shard(0), Shard(0), Shard(1)},
                        Case{Shard(1), Shard(1), Replicate(), Partial()}}) {
    run_threads(2, [&](int64_t) {
      const DeviceMesh mesh = api::init_device_mesh({2});
      const at::Tensor dx = api::distribute_tensor(x, mesh, {c.px});
      const at::Tensor dw = api::distribute_tensor(w, mesh, {c.pw});
      const at::Tensor db = api::distribute_tensor(b, mesh, {c.pb});
      collectives::CommCounter counter;
      const at::Tensor y = at::conv2d(dx, dw, db, {1, 1}, {1, 1});
      EXPECT_EQ(counter.total(), 0) << counter.to_string();
      EXPECT_EQ(api::spec(y).placements()[0], c.out);
      expect_same(y, want);
    });
  }
  // Gradients through the sharded weight.
  const at::Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_();
  at::conv2d(xg, wg, b, {1, 1}, {1, 1}).sum().backward();
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor dx = api::distribute_tensor(x, mesh, {Shard(0)}).requires_grad_();
    const at::Tensor dw = api::distribute_tensor(w, mesh, {Shard(0)}).requires_grad_();
    const at::Tensor db = api::distribute_tensor(b, mesh, {Shard(0)});
    at::conv2d(dx, dw, db, {1, 1}, {1, 1}).sum().backward();
    expect_same(dx.grad(), xg.grad());
    expect_same(dw.grad(), wg.grad());
  });
}

// A kernel that tiles a spatial dim (stride == kernel, no padding; NOTE [patch convolution])
// keeps that dim sharded with no collective, forward and backward, on 1-D and 2-D meshes; the
// weight's and bias's gradients are Partial sums over the positions; everything equals one
// device's. Positions that do not split evenly (4 row patches over 3 ranks) are not sharded
// there (the input moves), still equal to one device's.
TEST(ConvolutionDispatch, PatchConvolutionKeepsSpatialShards) {
  const at::Tensor x = global_for({2, 3, 16, 24}), w = global_for({5, 3, 4, 4}, 1),
                   b = global_for({5}, 2), g = global_for({2, 5, 4, 6}, 3);
  const auto conv = [](const at::Tensor& in, const at::Tensor& wt, const at::Tensor& bias) {
    return at::conv2d(in, wt, bias, at::IntArrayRef{4, 4}, at::IntArrayRef{0, 0});
  };
  const at::Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_(),
                   bg = b.clone().requires_grad_();
  const at::Tensor want = conv(xg, wg, bg);
  want.backward(g);
  struct Case {
    std::vector<int64_t> mesh;
    Placements px, out;
    bool local;
  };
  for (const Case& c :
       {Case{{2}, {Shard(3)}, {Shard(3)}, true}, Case{{2}, {Shard(2)}, {Shard(2)}, true},
        Case{{2, 2}, {Shard(2), Shard(3)}, {Shard(2), Shard(3)}, true},
        Case{{2, 2}, {Shard(0), Shard(3)}, {Shard(0), Shard(3)}, true},
        Case{{3}, {Shard(2)}, {}, false}}) {
    int64_t n = 1;
    for (int64_t s : c.mesh) n *= s;
    run_threads(n, [&](int64_t) {
      const DeviceMesh mesh = api::init_device_mesh(c.mesh);
      const Placements rep(c.mesh.size(), Replicate());
      const at::Tensor dx = api::distribute_tensor(x, mesh, c.px).requires_grad_();
      const at::Tensor dw = api::distribute_tensor(w, mesh, rep).requires_grad_();
      const at::Tensor db = api::distribute_tensor(b, mesh, rep).requires_grad_();
      collectives::CommCounter counter;
      const at::Tensor y = conv(dx, dw, db);
      if (c.local) {
        EXPECT_EQ(counter.total(), 0) << counter.to_string();
        EXPECT_EQ(api::spec(y).placements(), c.out);
      }
      expect_same(y, want);
      const at::Tensor dg = api::distribute_tensor(g, mesh, api::spec(y).placements());
      collectives::CommCounter backward;
      y.backward(dg);
      if (c.local) {
        EXPECT_EQ(backward.total(), 0) << backward.to_string();
        EXPECT_EQ(api::spec(dx.grad()).placements(), c.px);
      }
      expect_same(dx.grad(), xg.grad());
      expect_same(dw.grad(), wg.grad());
      expect_same(db.grad(), bg.grad());
    });
  }
}

}  // namespace
}  // namespace dtensor
