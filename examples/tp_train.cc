// ./x demo: tensor-parallel training of a transformer block in C++, on N real processes.
//
//   ./x launch -n 4 -- bazel-bin/examples/tp_train [--mesh 4] [--steps 5] [--backend shm]
//
// Every rank joins through the launcher's environment, builds the mesh, lays the block's
// weights out as ColwiseParallel / RowwiseParallel would (examples/tp_model.h) and trains a few
// SGD steps with plain ATen calls on distributed tensors (the dispatcher does the rest). Rank 0
// also trains the same block on one device and prints both losses per step, the time per step
// and the collectives of one step, by the op that caused them.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/flags/flag.h"
#include "dtensor/api.h"
#include "examples/tp_model.h"
#include "tools/cli_args.h"

using dtensor::cli::IntList;

ABSL_FLAG(IntList, mesh, (IntList{{4}}), "mesh shape, e.g. 4 or 2,2 (its size: the ranks)");
ABSL_FLAG(int, steps, 5, "SGD steps");
ABSL_FLAG(std::string, backend, "",
          "collectives backend: shm or c10d (default: $DTENSOR_BACKEND, else shm)");

namespace {

using dtensor::examples::Params;
namespace api = dtensor::api;

constexpr int64_t kBatch = 4, kSeq = 32, kDim = 64, kHidden = 256, kHeads = 4;
constexpr double kLr = 0.05;

// One SGD step on mean((block(x) - target)^2); returns the loss.
at::Tensor step(const at::Tensor& x, const at::Tensor& target, const at::Tensor& mask, Params& p) {
  const at::Tensor out = dtensor::examples::transformer_block(x, p, mask, kHeads);
  const at::Tensor loss = (out - target).pow(2).mean();
  loss.backward();
  at::NoGradGuard no_grad;
  for (auto& [name, w] : p) {
    w.sub_(w.grad(), kLr);
    w.mutable_grad() = at::Tensor();
  }
  return loss.detach();
}

int run() {
  const std::vector<int64_t> mesh_shape = absl::GetFlag(FLAGS_mesh).values;
  const int steps = absl::GetFlag(FLAGS_steps);
  at::set_num_threads(1);

  auto ctx = api::init_from_env(absl::GetFlag(FLAGS_backend));
  const int64_t rank = ctx->rank();
  const dtensor::DeviceMesh mesh = api::init_device_mesh(mesh_shape);
  const dtensor::Placements replicated(mesh.ndim(), dtensor::Replicate());

  Params global = dtensor::examples::block_params(kDim, kHidden, at::kFloat);
  for (auto& [name, t] : global) {
    if (t.dim() == 2) t = t / std::sqrt(static_cast<double>(t.size(1)));  // fan-in scaling
  }
  const at::Tensor x = dtensor::examples::values({kBatch, kSeq, kDim}, 11, at::kFloat);
  const at::Tensor target = dtensor::examples::values({kBatch, kSeq, kDim}, 12, at::kFloat);
  const at::Tensor mask = at::ones({kSeq, kSeq}, at::kBool).triu(1);

  Params params = dtensor::examples::distribute_params(
      global, mesh, dtensor::examples::block_layout(mesh.ndim()), true);
  const at::Tensor dx = api::distribute_tensor(x, mesh, replicated);
  const at::Tensor dtarget = api::distribute_tensor(target, mesh, replicated);
  const at::Tensor dmask = api::distribute_tensor(mask, mesh, replicated);
  Params single;
  for (const auto& [name, t] : global) single[name] = t.clone().requires_grad_(true);

  if (rank == 0) {
    std::printf("transformer block B=%ld S=%ld D=%ld hidden=%ld heads=%ld, mesh %s on %s\n", kBatch,
                kSeq, kDim, kHidden, kHeads, mesh.to_string().c_str(), ctx->backend().c_str());
    std::printf("%5s %14s %14s %10s %12s %13s\n", "step", "loss (TP)", "loss (1 dev)", "|diff|",
                "ms/step (TP)", "ms/step (1 dev)");
  }
  std::string comms_of_step;
  for (int s = 0; s < steps; ++s) {
    api::CommDebugMode comms;
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor loss = step(dx, dtarget, dmask, params);
    const double tp_loss = api::full_tensor(loss).item<double>();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) comms_of_step = comms.to_string();
    if (rank == 0) {
      const auto t1 = std::chrono::steady_clock::now();
      const double one = step(x, target, mask, single).item<double>();
      const double ms_one =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
      std::printf("%5d %14.8f %14.8f %10.2e %12.2f %13.2f\n", s, tp_loss, one,
                  std::abs(tp_loss - one), ms, ms_one);
      std::fflush(stdout);
    }
  }
  if (rank == 0)
    std::printf("collectives of one step on rank 0 (op: collective xN):\n%s",
                comms_of_step.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x demo cpp: tensor-parallel training of a transformer block (run under ./x launch).\n"
      "  tp_train [--mesh 4|2,2] [--steps 5] [--backend shm|c10d]");
  return dtensor::cli::guarded_main("tp_train", [] { return run(); });
}
