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

#include "absl/flags/flag.h"
#include "dtensor/local_tensor.h"
#include "layout/visualize.h"
#include "tools/cli_args.h"

using dtensor::cli::IntList;
using dtensor::cli::PlacementList;

ABSL_FLAG(IntList, mesh, (IntList{{2, 2}}), "mesh shape, e.g. 2,3");
ABSL_FLAG(IntList, shape, (IntList{{10, 7}}), "global tensor shape, e.g. 5,7");
ABSL_FLAG(PlacementList, placements, (PlacementList{dtensor::parse_placements("S(0),S(1)")}),
          "placements, one per mesh dim, e.g. \"S(0),S(1)\"");
ABSL_FLAG(std::vector<std::string>, names, {}, "mesh dim names, e.g. dp,tp (default: none)");
ABSL_FLAG(std::string, order, "",
          "shard order: \"<tensor dim>:<mesh dims>;...\", e.g. \"0:1,0\" splits tensor dim 0 by "
          "mesh dim 1 first, then mesh dim 0 (default: mesh dims left to right)");

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

int run() {
  const DeviceMesh mesh =
      DeviceMesh::arange(absl::GetFlag(FLAGS_mesh).values, absl::GetFlag(FLAGS_names));
  const auto meta = dtensor::TensorMeta::make(absl::GetFlag(FLAGS_shape).values, at::kLong);
  DTensorSpec spec = DTensorSpec::make(mesh, absl::GetFlag(FLAGS_placements).values, meta);
  if (const std::string order = absl::GetFlag(FLAGS_order); !order.empty()) {
    spec = DTensorSpec::make(mesh, spec.placements(), meta,
                             dtensor::cli::parse_order("--order", order, spec));
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
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x demo layout: lays arange(numel) out on a mesh and prints what every rank holds.\n"
      "  layout_demo --mesh 2,2 --shape 10,7 --placements \"S(0),S(1)\" [--names dp,tp] "
      "[--order \"0:1,0\"]");
  return dtensor::cli::guarded_main("layout_demo", [] { return run(); });
}
