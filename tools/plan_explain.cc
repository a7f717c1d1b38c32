// ./x plan: prints the redistribute plan between two layouts, its cost and every rank's local
// shape before and after, without any communication.
//
//   plan_explain --mesh 2,2 --shape 8,8 --from "S(0),S(1)" --to "S(1),S(0)"
//                [--dtype float32] [--from-order "0:1,0"] [--to-order "..."] [--names dp,tp]
//   plan_explain --mesh 2 --to-mesh 2,2 --to-ranks 2,3,4,5 --shape 8,8 --from "S(0)" --to "S(1),R"
//                (a cross-mesh redistribute: NOTE [cross-mesh redistribute])

#include <c10/core/ScalarType.h>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "base/error.h"
#include "layout/shard_layout.h"
#include "sharding_prop/cross_mesh_plan.h"
#include "sharding_prop/redistribute_plan.h"
#include "tools/cli_args.h"

using dtensor::cli::IntList;
using dtensor::cli::PlacementList;

ABSL_FLAG(IntList, mesh, (IntList{{2, 2}}), "mesh shape, e.g. 2,2");
ABSL_FLAG(std::vector<std::string>, names, {}, "mesh dim names, e.g. dp,tp (default: none)");
ABSL_FLAG(IntList, shape, (IntList{{8, 8}}), "global tensor shape, e.g. 8,8");
ABSL_FLAG(PlacementList, from, (PlacementList{dtensor::parse_placements("S(0),S(1)")}),
          "source placements, one per mesh dim, e.g. \"S(0),S(1)\"");
ABSL_FLAG(PlacementList, to, (PlacementList{dtensor::parse_placements("S(1),S(0)")}),
          "target placements, one per mesh dim");
ABSL_FLAG(std::string, dtype, "float32",
          "element type: float32, float64, bfloat16, float16, int32, int64, bool");
ABSL_FLAG(std::string, from_order, "",
          "shard order of the source (also --from-order): \"<tensor dim>:<mesh dims>;...\", e.g. "
          "\"0:1,0\" splits tensor dim 0 by mesh dim 1 first, then mesh dim 0");
ABSL_FLAG(std::string, to_order, "", "shard order of the target (also --to-order)");
ABSL_FLAG(std::string, to_mesh, "",
          "the target's mesh shape when it is another mesh (a cross-mesh redistribute), e.g. 2,2");
ABSL_FLAG(std::string, to_ranks, "",
          "the target mesh's ranks, row-major (default: the ranks after the source mesh's)");

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

std::string shape_text(const std::vector<int64_t>& v) { return "[" + absl::StrJoin(v, ",") + "]"; }

int run() {
  const DeviceMesh mesh =
      DeviceMesh::arange(absl::GetFlag(FLAGS_mesh).values, absl::GetFlag(FLAGS_names));
  const TensorMeta meta =
      TensorMeta::make(absl::GetFlag(FLAGS_shape).values, parse_dtype(absl::GetFlag(FLAGS_dtype)));
  auto make = [&](const Placements& placements, const std::string& order,
                  const std::string& order_flag) {
    DTensorSpec s = DTensorSpec::make(mesh, placements, meta);
    if (order.empty()) return s;
    return DTensorSpec::make(mesh, s.placements(), meta, cli::parse_order(order_flag, order, s));
  };
  const DTensorSpec src =
      make(absl::GetFlag(FLAGS_from).values, absl::GetFlag(FLAGS_from_order), "--from-order");
  const std::string to_mesh = absl::GetFlag(FLAGS_to_mesh),
                    to_ranks = absl::GetFlag(FLAGS_to_ranks);
  if (!to_mesh.empty() || !to_ranks.empty()) {
    std::vector<int64_t> shape, ranks;
    if (!to_mesh.empty()) shape = cli::parse_ints("--to-mesh", to_mesh);
    if (!to_ranks.empty()) ranks = cli::parse_ints("--to-ranks", to_ranks);
    if (shape.empty()) shape = {static_cast<int64_t>(ranks.size())};
    int64_t n = 1;
    for (const int64_t s : shape) n *= s;
    if (ranks.empty()) {
      for (int64_t r = 0; r < n; ++r) ranks.push_back(mesh.size() + r);
    }
    const DeviceMesh other(shape, ranks);
    const DTensorSpec dst = DTensorSpec::make(other, absl::GetFlag(FLAGS_to).values, meta);
    std::cout << plan_cross_mesh(src, dst)->to_string();
    return 0;
  }
  const DTensorSpec dst =
      make(absl::GetFlag(FLAGS_to).values, absl::GetFlag(FLAGS_to_order), "--to-order");
  const auto plan = plan_redistribute(src, dst);
  const CostModel& model = cost_model_for(mesh.device_type());  // the model the plan used

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
                ("(" + absl::StrJoin(coord, ",") + ")").c_str(),
                shape_text(local_box(src, coord).shape).c_str(),
                shape_text(local_box(dst, coord).shape).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x plan: a redistribute plan, its cost and every rank's local shapes, without "
      "communicating.\n  ./x plan --mesh 2,2 --shape 8,8 --from \"S(0),S(1)\" --to \"S(1),S(0)\" "
      "[--dtype float32] [--from-order \"0:1,0\"] [--to-order ...] [--names dp,tp]\n  ./x plan "
      "--mesh 2 --to-mesh 2,2 --to-ranks 2,3,4,5 --shape 8,8 --from S(0) --to S(1),R (between "
      "meshes)");
  return dtensor::cli::guarded_main("plan", [] { return run(); });
}
