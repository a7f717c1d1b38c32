// A program of another project using the installed library (tests/consumers/install_test.sh
// builds it with plain g++ and `pkg-config --cflags --libs dtensor`; the external Bazel
// workspace test builds it against @dtensor//:dtensor). Two ranks as threads, a mesh (2,): a
// row-sharded distributed matmul against the one-device result, then a checkpoint saved and loaded
// into another layout in a temporary directory. Prints "OK" and exits 0, or names the mismatch
// and exits 1.

#include <ATen/ATen.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include "dtensor_engine.h"  // the one public header

namespace api = dtensor::api;
namespace checkpoint = dtensor::checkpoint;

int main() {
  const at::Tensor x = at::arange(24, at::kFloat).reshape({6, 4}) / 10;
  const at::Tensor w = at::arange(12, at::kFloat).reshape({4, 3}) / 7;
  const at::Tensor expected = at::mm(x, w);

  char tmpl[] = "/tmp/hello_dtensor.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::cerr << "hello_dtensor: mkdtemp failed\n";
    return 1;
  }
  const std::string dir = std::string(tmpl) + "/ckpt";
  std::atomic<int> failures{0};
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::cerr << "hello_dtensor: mismatch: " << what << "\n";
      ++failures;
    }
  };

  try {
    dtensor::collectives::run_threads(2, [&](int64_t rank) {
      const api::DeviceMesh mesh = api::init_device_mesh({2});
      const at::Tensor dx = api::distribute_tensor(x, mesh, {api::Shard(0)});
      const at::Tensor dw = api::distribute_tensor(w, mesh, {api::Replicate()});
      const at::Tensor dy = at::mm(dx, dw);
      check(api::is_dtensor(dy), "mm of distributed tensors is not distributed");
      check(api::local(dy).size(0) == 3, "rank " + std::to_string(rank) + " holds " +
                                             std::to_string(api::local(dy).size(0)) + " rows");
      check(at::allclose(api::full_tensor(dy), expected), "distributed mm differs from one device");

      // Save Shard(0) with a step counter; load into Replicate.
      checkpoint::save({{"y", dy}, {"step", int64_t{7}}}, dir);
      std::map<std::string, checkpoint::Value> state = {
          {"y", api::zeros({6, 3}, mesh, {api::Replicate()})}, {"step", int64_t{0}}};
      checkpoint::load(state, dir);
      const at::Tensor loaded = std::get<at::Tensor>(state.at("y"));
      check(at::allclose(api::local(loaded), expected), "checkpoint round trip differs");
      check(std::get<int64_t>(state.at("step")) == 7, "checkpoint step differs");
    });
  } catch (const std::exception& e) {
    std::cerr << "hello_dtensor: " << e.what() << "\n";
    ++failures;
  }
  std::filesystem::remove_all(tmpl);
  if (failures != 0) return 1;
  std::cout << "OK\n";
  return 0;
}
