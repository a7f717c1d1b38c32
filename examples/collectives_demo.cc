// A multi-process program: `./x launch -n 4 -- bazel-bin/examples/collectives_demo [--backend B]`.
// Each rank joins the job through the torchrun variables, then runs a few collectives and prints
// what it got next to what a single device would compute.

#include <ATen/ATen.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "tools/cli_args.h"

ABSL_FLAG(std::string, backend, "",
          "collectives backend: shm or c10d (default: $DTENSOR_BACKEND, else shm)");

using namespace dtensor;
using namespace dtensor::collectives;

static std::string values(const at::Tensor& t) {
  std::string out = "[";
  const at::Tensor flat = t.reshape({-1}).to(at::kDouble).contiguous();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    out += (i ? ", " : "") + std::to_string(static_cast<int64_t>(flat[i].item<double>()));
  }
  return out + "]";
}

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "a few collectives on every rank, next to what one device computes.\n"
      "  ./x launch -n 4 -- bazel-bin/examples/collectives_demo [--backend shm|c10d]");
  try {
    auto ctx = init_from_env(absl::GetFlag(FLAGS_backend));
    const int64_t rank = ctx->rank(), n = ctx->world_size();
    const at::Tensor x = at::arange(4, at::kFloat) + 10 * rank;
    const at::Tensor sum = all_reduce(x, ReduceOp::kSum, RankContext::kWorld);
    const at::Tensor gathered = all_gather_into_tensor(x.view({1, 4}), 0, RankContext::kWorld);
    at::Tensor expected = at::zeros({4});
    for (int64_t r = 0; r < n; ++r) expected += at::arange(4, at::kFloat) + 10 * r;
    std::cout << "backend " << ctx->backend() << ", rank " << rank << " of " << n
              << ": all_reduce(sum) = " << values(sum) << ", single device: " << values(expected)
              << (at::equal(sum, expected) ? " OK" : " WRONG") << "\n"
              << "all_gather rows: " << gathered.size(0) << "\n";
    barrier(RankContext::kWorld);
    return at::equal(sum, expected) ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "collectives_demo: " << e.what() << "\n";
    return 2;
  }
}
