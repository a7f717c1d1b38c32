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
#include "dtensor/visualize.h"

namespace {

using dtensor::DeviceMesh;
using dtensor::DTensorSpec;

std::vector<int64_t> parse_ints(const std::string& flag, const std::string& text) {
  if (text.empty() || text.back() == ',') {
    throw std::invalid_argument(flag + ": expected comma-separated integers, got \"" + text + "\"");
  }
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::invalid_argument(flag + ": '" + item + "' is not an integer in \"" + text + "\"");
    }
  }
  return out;
}

std::vector<std::string> parse_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// "--order 0:1,0" -> tensor dim 0 is split by mesh dim 1 first, then mesh dim 0.
dtensor::ShardOrder parse_order(const std::string& text, const DTensorSpec& spec) {
  dtensor::ShardOrder order = spec.shard_order();
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ';')) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) {
      throw std::invalid_argument("--order: expected <tensor dim>:<mesh dims>, got '" + entry +
                                  "'");
    }
    const auto dims = parse_ints("--order", entry.substr(0, colon));
    if (dims.size() != 1 || dims[0] < 0 || dims[0] >= spec.ndim()) {
      throw std::invalid_argument("--order: '" + entry.substr(0, colon) +
                                  "' is not one tensor dim in [0, " +
                                  std::to_string(spec.ndim() - 1) + "]");
    }
    order[dims[0]] = parse_ints("--order", entry.substr(colon + 1));
  }
  return order;
}

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
  std::string mesh_text = "2,2", shape_text = "10,7", placements_text = "S(0),S(1)";
  std::string names_text, order_text;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--mesh")
      mesh_text = value();
    else if (arg == "--shape")
      shape_text = value();
    else if (arg == "--placements")
      placements_text = value();
    else if (arg == "--names")
      names_text = value();
    else if (arg == "--order")
      order_text = value();
    else if (arg == "--help" || arg == "-h") {
      std::cout << "usage: layout_demo --mesh 2,2 --shape 10,7 --placements \"S(0),S(1)\" "
                   "[--names dp,tp] [--order \"0:1,0\"]\n";
      return 0;
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "' (try --help)");
    }
  }
  const DeviceMesh mesh =
      DeviceMesh::arange(parse_ints("--mesh", mesh_text),
                         names_text.empty() ? std::vector<std::string>{} : parse_names(names_text));
  const auto meta = dtensor::TensorMeta::make(parse_ints("--shape", shape_text), at::kLong);
  DTensorSpec spec = DTensorSpec::make(mesh, dtensor::parse_placements(placements_text), meta);
  if (!order_text.empty()) {
    spec = DTensorSpec::make(mesh, spec.placements(), meta, parse_order(order_text, spec));
  }
  // The demo prints every element of every rank: keep it to what a terminal can show.
  constexpr int64_t kMaxElements = 1 << 20, kMaxRanks = 1024;
  if (meta.numel() > kMaxElements || mesh.size() > kMaxRanks) {
    throw std::invalid_argument("the demo prints every value: keep the tensor under " +
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
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "layout_demo: error: " << e.what() << "\n";
    return 2;
  }
}
