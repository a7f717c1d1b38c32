// Distributed tensors as at::Tensors across real processes: 4 forked ranks join through the
// launcher environment (api::init_from_env: a TCPStore rendezvous) on shm and on c10d (Gloo),
// build a (2,2) mesh with api::init_device_mesh, train one SGD step of a tensor-parallel MLP
// (batch-sharded input, column/row-sharded weights) and draw random tensors seeded with the
// process's own torch generator; everything must equal the single-device run each process also
// computes.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "collectives/testing/fork_ranks.h"
#include "dtensor/api.h"

namespace dtensor {
namespace {

namespace api = dtensor::api;

at::Tensor values(const std::vector<int64_t>& shape, int64_t salt) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::sin(at::arange(numel, at::kDouble) * 1.37 + salt * 0.71) * 0.5).reshape(shape);
}

// One SGD step; returns the loss before it and the weights after it.
std::vector<at::Tensor> train_step(const at::Tensor& x, std::vector<at::Tensor> p) {
  const at::Tensor h = at::gelu(at::linear(x, p[0], p[1]));
  const at::Tensor loss = at::linear(h, p[2]).pow(2).mean();
  loss.backward();
  at::NoGradGuard no_grad;
  for (at::Tensor& w : p) w.sub_(w.grad(), 0.1);
  p.insert(p.begin(), loss.detach());
  return p;
}

int rank_body(int rank, int n, int port, const std::string& backend) {
  testing::set_launch_env(rank, n, port);
  at::set_num_threads(1);
  int failures = 0;
  auto fail = [&](const char* what) {
    std::fprintf(stderr, "[rank %d] %s: %s differs from one device\n", rank, backend.c_str(), what);
    ++failures;
  };
  try {
    auto ctx = api::init_from_env(backend);
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    const std::vector<at::Tensor> global = {values({16, 8}, 1), values({16}, 2),
                                            values({8, 16}, 3)};
    const at::Tensor x = values({6, 8}, 4);
    std::vector<at::Tensor> ref;
    for (const at::Tensor& t : global) ref.push_back(t.clone().requires_grad_(true));
    const std::vector<at::Tensor> want = train_step(x, ref);

    const std::vector<Placements> layouts = {
        {Replicate(), Shard(0)}, {Replicate(), Shard(0)}, {Replicate(), Shard(1)}};
    std::vector<at::Tensor> params;
    for (size_t i = 0; i < global.size(); ++i) {
      params.push_back(
          api::distribute_tensor(global[i].clone().requires_grad_(true), mesh, layouts[i]));
    }
    const at::Tensor dx = api::distribute_tensor(x, mesh, {Shard(0), Replicate()});
    const std::vector<at::Tensor> got = train_step(dx, params);
    if (!at::allclose(api::full_tensor(got[0]), want[0], 1e-9, 1e-9)) fail("loss");
    for (size_t i = 1; i < got.size(); ++i) {
      if (api::spec(got[i]).placements() != layouts[i - 1]) fail("parameter placements");
      if (!at::allclose(api::full_tensor(got[i]), want[i], 1e-9, 1e-9)) fail("updated weight");
    }
    // Random: the process generator, seeded as on one device.
    at::manual_seed(7);
    const at::Tensor want_rand = at::rand({5, 6}, at::kDouble);
    const at::Tensor want_drop = at::dropout(want_rand, 0.5, true);
    at::manual_seed(7);
    const at::Tensor r = api::rand({5, 6}, mesh, {Shard(1), Shard(0)}, at::kDouble);
    if (!at::equal(api::full_tensor(r), want_rand)) fail("rand");
    if (!at::equal(api::full_tensor(at::dropout(r, 0.5, true)), want_drop)) fail("dropout");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", rank, backend.c_str(), e.what());
    return 2;
  }
  std::printf("[rank %d] %s: %d failures\n", rank, backend.c_str(), failures);
  return failures == 0 ? 0 : 1;
}

class DispatchProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DispatchProcessTest, TensorParallelStepOnFourProcesses) {
  const std::string backend = GetParam();
  const int port = testing::free_port();
  const auto codes = testing::run_forked(
      4, [&](int r) { return rank_body(r, 4, port, backend); }, std::chrono::seconds(120));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " on " << backend;
}

INSTANTIATE_TEST_SUITE_P(Backends, DispatchProcessTest, ::testing::Values("shm", "c10d"));

}  // namespace
}  // namespace dtensor
