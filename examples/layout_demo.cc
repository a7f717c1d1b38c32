// ./x demo: lays a real tensor out on a mesh and prints what every rank holds.
//
//   layout_demo --mesh 2,2 --shape 10,7 --placements "S(0),S(1)" [--names dp,tp] [--order "0:1,0"]
//
// The global tensor is arange(numel) reshaped to --shape, so every value names its own global
// flat index and the printout can be checked by eye.

#include <ATen/ATen.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dtensor/local_tensor.h"
#include "layout/visualize.h"
#include "tools/cli_args.h"

namespace {

using dtensor::DeviceMesh;
using dtensor::DTensorSpec;

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

// Rows of the local tensor (last dim per line), values as integers.
void print_values(const at::Tensor& local) {
  if (local.numel() == 0) {
    std::cout << "    (empty)\n";
    return;
  }
  const at::Tensor rows =
      local.dim() == 0 ? local.reshape({1, 1}) : local.reshape({-1, local.size(-1)});
  const auto acc = rows.to(at::kLong).contiguous();
  for (int64_t i = 0; i < acc.size(0); ++i) {
    std::cout << "   ";
    for (int64_t j = 0; j < acc.size(1); ++j) {
      char buf[24];
      std::snprintf(buf, sizeof(buf), " %4lld", static_cast<long long>(acc[i][j].item<int64_t>()));
      std::cout << buf;
    }
    std::cout << "\n";
  }
}

int run(int argc, char** argv) {
  auto flags = dtensor::cli::parse_flags(argc, argv,
                                         {{"mesh", "2,2"},
                                          {"shape", "10,7"},
                                          {"placements", "S(0),S(1)"},
                                          {"names", ""},
                                          {"order", ""}});
  if (flags.count("help")) {
    std::cout << "usage: layout_demo --mesh 2,2 --shape 10,7 --placements \"S(0),S(1)\" "
                 "[--names dp,tp] [--order \"0:1,0\"]\n";
    return 0;
  }
  const std::string &mesh_text = flags["mesh"], &shape_text = flags["shape"];
  const std::string &placements_text = flags["placements"], &names_text = flags["names"];
  const std::string& order_text = flags["order"];
  const DeviceMesh mesh = DeviceMesh::arange(
      dtensor::cli::parse_ints("--mesh", mesh_text),
      names_text.empty() ? std::vector<std::string>{} : dtensor::cli::parse_names(names_text));
  const auto meta =
      dtensor::TensorMeta::make(dtensor::cli::parse_ints("--shape", shape_text), at::kLong);
  DTensorSpec spec = DTensorSpec::make(mesh, dtensor::parse_placements(placements_text), meta);
  if (!order_text.empty()) {
    spec = DTensorSpec::make(mesh, spec.placements(), meta,
                             dtensor::cli::parse_order("--order", order_text, spec));
  }
  // The demo prints every element of every rank: keep it to what a terminal can show.
  constexpr int64_t kMaxElements = 1 << 20, kMaxRanks = 1024;
  if (meta.numel() > kMaxElements || mesh.size() > kMaxRanks) {
    dtensor::fail("the demo prints every value: keep the tensor under " +
                                std::to_string(kMaxElements) + " elements and the mesh under " +
                                std::to_string(kMaxRanks) + " ranks");
  }
  const at::Tensor global = at::arange(meta.numel(), at::kLong).reshape(meta.shape);

  std::cout << "Layout " << spec.to_string() << "\n";
  std::cout << "Global tensor: arange(" << meta.numel() << ").reshape(" << join(meta.shape)
            << ")\n\n";
  std::cout << "rank  coordinate  local shape  global offset\n";
  for (int64_t r : mesh.ranks()) {
    const auto coord = *mesh.coordinate(r);
    const auto box = dtensor::local_box(spec, coord);
    char line[160];
    std::snprintf(line, sizeof(line), "%4lld  %-10s  %-11s  %s\n", static_cast<long long>(r),
                  ("(" + join(coord) + ")").c_str(), ("[" + join(box.shape) + "]").c_str(),
                  ("[" + join(box.offset) + "]").c_str());
    std::cout << line;
  }
  std::cout << "\n";
  for (int64_t r : mesh.ranks()) {
    const auto coord = *mesh.coordinate(r);
    const at::Tensor local = dtensor::local_tensor_for(global, spec, coord);
    std::cout << "rank " << r << " (" << join(coord) << ") holds " << local.sizes() << ":\n";
    print_values(local);
  }
  std::cout << "\n" << dtensor::visualize_sharding(spec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dtensor::cli::guarded_main("layout_demo", [&] { return run(argc, argv); });
}
