// Tensor-parallel models on distributed tensors against one device: a 2-layer MLP and a
// one-block transformer (RMS norm + causal attention + MLP, residuals; examples/tp_model.h)
// forward and backward on meshes (2) and (2,2), with column-sharded first and row-sharded second
// projections (as ColwiseParallel / RowwiseParallel lay them out) and, on (2,2), a batch-sharded
// input. The same function computes both runs: plain tensors on one device, distributed tensors
// on every rank. The output, the loss and every parameter gradient (values and placements) must
// match.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim.h>

#include <functional>
#include <iostream>

#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "examples/tp_model.h"

namespace dtensor {
namespace {

using collectives::run_threads;
using examples::Params;
using examples::values;
namespace api = dtensor::api;

using Model = std::function<at::Tensor(const at::Tensor&, const Params&)>;

void check_model(const std::vector<int64_t>& mesh_shape, bool batch_sharded, const Params& global,
                 const std::map<std::string, Placements>& layout, const at::Tensor& x,
                 const Model& model) {
  Params ref_params;
  for (const auto& [name, t] : global) ref_params[name] = t.clone().requires_grad_(true);
  const at::Tensor ref_out = model(x, ref_params);
  const at::Tensor ref_loss = ref_out.pow(2).sum();
  ref_loss.backward();

  int64_t world = 1;
  for (int64_t s : mesh_shape) world *= s;
  run_threads(world, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh(mesh_shape);
    const Params params = examples::distribute_params(global, mesh, layout, true);
    Placements input(mesh.ndim(), Replicate());
    if (batch_sharded) input[0] = Shard(0);
    const at::Tensor dx = api::distribute_tensor(x, mesh, input);
    api::CommDebugMode comms;
    const at::Tensor out = model(dx, params);
    const at::Tensor loss = out.pow(2).sum();
    if (getenv("SHOW_COMMS")) std::cout << api::to_string(out) << "\n" << comms.to_string();
    EXPECT_TRUE(at::allclose(api::full_tensor(out), ref_out, 1e-9, 1e-9));
    EXPECT_NEAR(api::full_tensor(loss).item<double>(), ref_loss.item<double>(), 1e-9);
    loss.backward();
    for (const auto& [name, p] : params) {
      const at::Tensor g = p.grad();
      ASSERT_TRUE(api::is_dtensor(g)) << name;
      // NOTE [leaf gradients keep the parameter's placements]: the parameter's placements, but
      // a replicated dim's gradient may stay Partial(sum), as PyTorch's.
      Placements want = api::spec(p).placements();
      const Placements& got = api::spec(g).placements();
      for (size_t m = 0; m < want.size(); ++m) {
        if (want[m].is_replicate() && got[m] == Partial()) want[m] = got[m];
      }
      EXPECT_EQ(got, want) << name;
      EXPECT_TRUE(at::allclose(api::full_tensor(g), ref_params.at(name).grad(), 1e-9, 1e-9))
          << name;
    }
  });
}

TEST(Models, MlpOnMesh2) {
  check_model({2}, false, examples::mlp_params(8, 16), examples::mlp_layout(1), values({6, 8}, 5),
              examples::mlp);
}

TEST(Models, MlpOnMesh2x2) {
  check_model({2, 2}, true, examples::mlp_params(8, 16), examples::mlp_layout(2), values({6, 8}, 5),
              examples::mlp);
}

void check_block(std::vector<int64_t> mesh_shape, bool batch_sharded) {
  const int64_t B = 2, S = 4, D = 8, heads = 4;
  const at::Tensor causal = at::ones({S, S}, at::kBool).triu(1);
  check_model(mesh_shape, batch_sharded, examples::block_params(D, 16),
              examples::block_layout(mesh_shape.size()), values({B, S, D}, 9),
              [&](const at::Tensor& x, const Params& p) {
                at::Tensor mask = causal;
                if (api::is_dtensor(x)) {
                  const DeviceMesh& mesh = api::spec(x).mesh();
                  mask = api::distribute_tensor(causal, mesh, Placements(mesh.ndim(), Replicate()));
                }
                return examples::transformer_block(x, p, mask, heads);
              });
}

TEST(Models, TransformerBlockOnMesh2) { check_block({2}, false); }
TEST(Models, TransformerBlockOnMesh2x2) { check_block({2, 2}, true); }

// torch::optim on distributed parameters: three Adam steps (and SGD with momentum) give the
// single-device parameters, and the parameters keep their placements.
template <class Optimizer, class Options>
void check_optimizer(const Options& options) {
  const Params global = examples::mlp_params(8, 16);
  const at::Tensor x = values({6, 8}, 5);
  auto train = [&](const at::Tensor& input, const Params& params) {
    std::vector<at::Tensor> list;
    for (const auto& [name, p] : params) list.push_back(p);
    Optimizer opt(list, options);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      examples::mlp(input, params).pow(2).mean().backward();
      opt.step();
    }
  };
  Params ref;
  for (const auto& [name, t] : global) ref[name] = t.clone().requires_grad_(true);
  train(x, ref);
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    const auto layout = examples::mlp_layout(2);
    const Params params = examples::distribute_params(global, mesh, layout, true);
    train(api::distribute_tensor(x, mesh, {Shard(0), Replicate()}), params);
    for (const auto& [name, p] : params) {
      const auto it = layout.find(name);
      EXPECT_EQ(api::spec(p).placements(),
                it == layout.end() ? Placements(2, Replicate()) : it->second)
          << name;
      EXPECT_TRUE(at::allclose(api::full_tensor(p), ref.at(name), 1e-9, 1e-9)) << name;
    }
  });
}

TEST(Models, AdamStepsOnMesh2x2) {
  check_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(0.01));
}

TEST(Models, SgdMomentumStepsOnMesh2x2) {
  check_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9));
}

}  // namespace
}  // namespace dtensor
