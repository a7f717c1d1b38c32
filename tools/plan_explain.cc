// ./x plan: prints the redistribute plan between two layouts, its cost and every rank's local
// shape before and after, without any communication.
//
//   plan_explain --mesh 2,2 --shape 8,8 --from "S(0),S(1)" --to "S(1),S(0)"
//                [--dtype float32] [--from-order "0:1,0"] [--to-order "..."] [--names dp,tp]

#include <c10/core/ScalarType.h>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "base/error.h"
#include "sharding_prop/redistribute_plan.h"
#include "layout/shard_layout.h"
#include "base/strings.h"
#include "tools/cli_args.h"

namespace {

using namespace dtensor;

c10::ScalarType parse_dtype(const std::string& text) {
  static const std::pair<const char*, c10::ScalarType> kNames[] = {
      {"float32", c10::kFloat}, {"float", c10::kFloat},       {"float64", c10::kDouble},
      {"double", c10::kDouble}, {"bfloat16", c10::kBFloat16}, {"float16", c10::kHalf},
      {"int32", c10::kInt},     {"int64", c10::kLong},        {"bool", c10::kBool}};
  for (const auto& [name, type] : kNames) {
    if (text == name) return type;
  }
  throw Error("--dtype: unknown dtype '" + text +
                              "' (float32, float64, bfloat16, float16, int32, int64, bool)");
}

std::string shape_text(const std::vector<int64_t>& v) { return "[" + join(v, ",") + "]"; }

int run(int argc, char** argv) {
  auto f = cli::parse_flags(argc, argv,
                            {{"mesh", "2,2"},
                             {"shape", "8,8"},
                             {"from", "S(0),S(1)"},
                             {"to", "S(1),S(0)"},
                             {"dtype", "float32"},
                             {"from-order", ""},
                             {"to-order", ""},
                             {"names", ""}});
  if (f.count("help")) {
    std::cout << "usage: ./x plan --mesh 2,2 --shape 8,8 --from \"S(0),S(1)\" --to \"S(1),S(0)\" "
                 "[--dtype float32] [--from-order \"0:1,0\"] [--to-order ...] [--names dp,tp]\n";
    return 0;
  }
  const DeviceMesh mesh = DeviceMesh::arange(
      cli::parse_ints("--mesh", f["mesh"]),
      f["names"].empty() ? std::vector<std::string>{} : cli::parse_names(f["names"]));
  const TensorMeta meta =
      TensorMeta::make(cli::parse_ints("--shape", f["shape"]), parse_dtype(f["dtype"]));
  auto make = [&](const std::string& placements, const std::string& order_flag) {
    DTensorSpec s = DTensorSpec::make(mesh, parse_placements(placements), meta);
    const std::string& order = f[order_flag];
    if (order.empty()) return s;
    return DTensorSpec::make(mesh, s.placements(), meta,
                             cli::parse_order("--" + order_flag, order, s));
  };
  const DTensorSpec src = make(f["from"], "from-order"), dst = make(f["to"], "to-order");
  const auto plan = plan_redistribute(src, dst);
  const CostModel& model = default_cost_model();

  std::cout << plan->to_string() << "\n\n";
  std::printf(
      "cost model: %.1f us per collective + bus bytes at %.1f GB/s; local copies at %.1f "
      "GB/s\n",
      model.latency_us, model.bandwidth_gbs, model.local_gbs);
  std::printf("%-4s %-64s %12s %10s\n", "step", "", "bytes/rank", "cost us");
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    const PlanStep& s = plan->steps[i];
    std::printf("%-4zu %-64s %12lld %10.2f\n", i + 1, s.to_string().c_str(),
                static_cast<long long>(s.bytes), s.cost);
  }
  std::printf("total: %zu step(s), %lld collective(s), cost %.2f us\n\n", plan->steps.size(),
              static_cast<long long>(plan->num_collectives()), plan->cost);

  std::printf("%4s  %-10s  %-14s  %-14s\n", "rank", "coordinate", "local before", "local after");
  for (int64_t r : mesh.ranks()) {
    const auto coord = *mesh.coordinate(r);
    std::printf("%4lld  %-10s  %-14s  %-14s\n", static_cast<long long>(r),
                ("(" + join(coord, ",") + ")").c_str(),
                shape_text(local_box(src, coord).shape).c_str(),
                shape_text(local_box(dst, coord).shape).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dtensor::cli::guarded_main("plan", [&] { return run(argc, argv); });
}
