// The redistribute planner without communication: golden plan strings for the cases PyTorch's
// greedy planner gets wrong, refusals, determinism and the cache, and, for every pair of layouts
// of the enumeration, a plan that chains from source to target and costs no more than PyTorch's
// per-mesh-dim greedy order priced by the same cost model.

#include "sharding_prop/redistribute_plan.h"

#include <gtest/gtest.h>

#include "base/testing/expect_error.h"
#include "layout/testing/layout_enumeration.h"

namespace dtensor {
namespace {

using testing::expect_error;

DTensorSpec spec(const std::vector<int64_t>& mesh, const std::string& placements,
                 const std::vector<int64_t>& shape, const ShardOrder& order = {}) {
  return DTensorSpec::make(DeviceMesh::arange(mesh), parse_placements(placements),
                           TensorMeta::make(shape), order);
}

std::string plan_text(const std::vector<int64_t>& mesh, const std::string& from,
                      const std::string& to, const std::vector<int64_t>& shape) {
  return plan_redistribute(spec(mesh, from, shape), spec(mesh, to, shape))->to_string();
}

// PyTorch's _gen_transform_infos (default shard order): mesh dims from last to first, a Shard
// target whose tensor dim is split differently by the earlier mesh dims is replicated first; then
// first to last to reach the target. Each transform is priced as the planner prices that step.
double greedy_cost(const DTensorSpec& src, const DTensorSpec& dst) {
  const CostModel& model = default_cost_model();
  const int64_t n = src.mesh().ndim();
  DTensorSpec x = src;
  double cost = 0;
  auto apply = [&](int64_t m, Placement to) {
    const PlanStep s = price_step(x, m, to, model);
    cost += s.cost;
    x = s.after;
  };
  for (int64_t m = n - 1; m >= 0; --m) {
    Placement target = dst.placement(m);
    if (target.is_shard()) {
      for (int64_t i = 0; i < m; ++i) {
        if (src.placement(i).is_shard(target.dim()) != dst.placement(i).is_shard(target.dim())) {
          target = Replicate();
        }
      }
    }
    if (x.placement(m) != target) apply(m, target);
  }
  for (int64_t m = 0; m < n; ++m) {
    if (x.placement(m) != dst.placement(m)) apply(m, dst.placement(m));
  }
  return cost;
}

TEST(RedistributePlanTest, GoldenPlansForPyTorchIssueCases) {
  // PyTorch issue 132751: a transpose of the block grid moves one block, not two all_gathers.
  EXPECT_EQ(plan_text({2, 2}, "S(0),S(1)", "S(1),S(0)", {8, 8}),
            "[S(0),S(1)] -> [S(1),S(0)] on mesh (2,2) shape [8,8]: "
            "all_to_all_v(mesh_dims=[0,1], [S(0),S(1)]->[S(1),S(0)])");
  // PR 131210: (S1,S1) -> (S1,S2) is one all_to_all on the inner mesh dim.
  EXPECT_EQ(plan_text({2, 2}, "S(1),S(1)", "S(1),S(2)", {8, 8, 8}),
            "[S(1),S(1)] -> [S(1),S(2)] on mesh (2,2) shape [8,8,8]: "
            "all_to_all(mesh_dim=1, S(1)->S(2))");
  // Unsharding the outer of two mesh dims that split one tensor dim: one exchange.
  EXPECT_EQ(plan_text({2, 2}, "S(0),S(0)", "R,S(0)", {8, 8}),
            "[S(0),S(0)] -> [R,S(0)] on mesh (2,2) shape [8,8]: "
            "all_to_all_v(mesh_dims=[0,1], [S(0),S(0)]->[R,S(0)])");
  // Partial -> Shard is a reduce_scatter; Replicate -> Shard is local; uneven steps say so.
  EXPECT_EQ(plan_text({4}, "P(sum)", "S(0)", {8}),
            "[P(sum)] -> [S(0)] on mesh (4) shape [8]: reduce_scatter(mesh_dim=0, P(sum)->S(0))");
  EXPECT_EQ(plan_text({4}, "P(sum)", "S(0)", {7}),
            "[P(sum)] -> [S(0)] on mesh (4) shape [7]: "
            "reduce_scatter(mesh_dim=0, P(sum)->S(0), padded)");
  EXPECT_EQ(plan_text({4}, "R", "S(1)", {3, 5}),
            "[R] -> [S(1)] on mesh (4) shape [3,5]: local_chunk(mesh_dim=0, R->S(1))");
  EXPECT_EQ(plan_text({4}, "S(0)", "S(1)", {8, 8}),
            "[S(0)] -> [S(1)] on mesh (4) shape [8,8]: all_to_all(mesh_dim=0, S(0)->S(1))");
  // Reduce before gathering: the all_reduce runs on the smaller sharded piece.
  EXPECT_EQ(plan_text({2, 2}, "P(sum),S(0)", "R,R", {8, 8}),
            "[P(sum),S(0)] -> [R,R] on mesh (2,2) shape [8,8]: all_reduce(mesh_dim=0, P(sum)->R); "
            "all_gather(mesh_dim=1, S(0)->R)");
  EXPECT_EQ(plan_text({2, 2}, "S(0),R", "S(0),R", {8, 8}),
            "[S(0),R] -> [S(0),R] on mesh (2,2) shape [8,8]: no-op");
}

// NOTE [size-1 mesh dims]: changes on mesh dims of size 1 move no data.
TEST(RedistributePlanTest, SizeOneMeshDimsNeverCommunicate) {
  const std::vector<int64_t> shape = {8, 6};
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"S(0),S(1)", "S(0),S(0)"},
                                                        {"S(0),S(1)", "S(0),R"},
                                                        {"S(0),P(sum)", "S(0),R"},
                                                        {"S(0),R", "S(0),S(1)"},
                                                        {"S(0),P(max)", "S(0),S(0)"}}) {
    const auto plan = plan_redistribute(spec({4, 1}, from, shape), spec({4, 1}, to, shape));
    EXPECT_TRUE(plan->is_noop()) << plan->to_string();
  }
  // Only the size-1 dim is free: the size-4 dim still moves.
  const auto plan =
      plan_redistribute(spec({4, 1}, "S(0),S(1)", shape), spec({4, 1}, "R,S(0)", shape));
  EXPECT_EQ(plan->num_collectives(), 1) << plan->to_string();
  EXPECT_TRUE(plan_redistribute(spec({1, 4}, "S(1),S(0)", shape), spec({1, 4}, "R,S(0)", shape))
                  ->is_noop());
}

TEST(RedistributePlanTest, RefusalsAreClear) {
  const auto r = spec({2, 2}, "R,R", {8, 8});
  expect_error(
      [&] {
        plan_redistribute(r, spec({2, 2}, "P(sum),R", {8, 8}));
      },
      "Can not redistribute from R to P(sum), redistributing to Partial is for internal use "
      "only! (redistribute [R,R] -> [P(sum),R]: mesh dim 0: Partial comes only from operators");
  expect_error([&] { plan_redistribute(spec({2}, "P(max)", {4}), spec({2}, "P(sum)", {4})); },
               "Can not redistribute from P(max) to P(sum), redistributing to Partial is for "
               "internal use only! (redistribute [P(max)] -> [P(sum)]: mesh dim 0: a Partial "
               "cannot change its reduce op");
  expect_error([&] { plan_redistribute(r, spec({4}, "R", {8, 8})); }, "meshes differ");
  expect_error(
      [&] {
        plan_redistribute(r, spec({2, 2}, "R,R", {8, 9}));
      },
      "different tensors (Float[8,8] vs Float[8,9])");
  // Internally (gradients) a Partial may be created.
  PlanOptions internal;
  internal.allow_partial = true;
  const auto plan = plan_redistribute(r, spec({2, 2}, "P(sum),R", {8, 8}), internal);
  EXPECT_EQ(plan->steps.at(0).to_string(), "partition(mesh_dim=0, R->P(sum))");
}

TEST(RedistributePlanTest, CachedAndDeterministic) {
  const auto a = spec({2, 3}, "S(0),S(1)", {7, 5});
  const auto b = spec({2, 3}, "S(1),R", {7, 5});
  const auto before = plan_cache_stats();
  const auto p1 = plan_redistribute(a, b);
  const auto p2 = plan_redistribute(a, b);
  EXPECT_EQ(p1.get(), p2.get());
  const auto after = plan_cache_stats();
  EXPECT_GE(after.hits, before.hits + 1);
  EXPECT_EQ(compute_plan(a, b, {}, default_cost_model()).to_string(), p1->to_string());
}

// Every pair of the enumeration (meshes (4), (2,2), (2,3), (2,2,2); R, P(sum), P(max), S(d);
// every shard order; even, uneven, smaller-than-mesh and empty shapes), with the cost lower
// bound the propagator prunes by.
TEST(RedistributePlanTest, EveryPairChainsAndBeatsTheGreedyOrder) {
  int64_t plans = 0, strictly_better = 0;
  std::vector<DTensorSpec> all;
  testing::for_each_property_spec([&](const DTensorSpec& s) { all.push_back(s); });
  for (const auto& src : all) {
    for (const auto& dst : all) {
      if (src.mesh() != dst.mesh() || src.meta() != dst.meta()) continue;
      // 3-D tensors on the 3-D mesh alone would be 80% of the pairs: keep this test quick.
      if (src.mesh().ndim() == 3 && src.ndim() == 3) continue;
      bool allowed = true;
      for (int64_t m = 0; m < src.mesh().ndim(); ++m) {
        if (dst.placement(m).is_partial() && dst.placement(m) != src.placement(m)) allowed = false;
      }
      if (!allowed) {
        EXPECT_THROW(plan_redistribute(src, dst), dtensor::Error);
        continue;
      }
      const auto plan = plan_redistribute(src, dst);
      ++plans;
      DTensorSpec at = src;
      double cost = 0;
      for (const PlanStep& s : plan->steps) {
        ASSERT_EQ(s.before, at) << plan->to_string();
        at = s.after;
        cost += s.cost;
      }
      ASSERT_EQ(at, dst) << plan->to_string();
      EXPECT_DOUBLE_EQ(cost, plan->cost);
      // The propagator prunes candidates with this bound: it must never exceed the plan's cost.
      EXPECT_LE(plan_cost_lower_bound(src, dst, default_cost_model()), plan->cost + 1e-9)
          << plan->to_string();
      if (src.has_default_shard_order() && dst.has_default_shard_order()) {
        const double greedy = greedy_cost(src, dst);
        EXPECT_LE(plan->cost, greedy + 1e-9) << plan->to_string();
        if (plan->cost < greedy - 1e-9) ++strictly_better;
      }
    }
  }
  std::printf("%lld plans checked; %lld strictly cheaper than the greedy order\n",
              static_cast<long long>(plans), static_cast<long long>(strictly_better));
  EXPECT_GT(strictly_better, 0);
}

TEST(RedistributePlanTest, DocumentedNdCasesAreStrictlyCheaperThanGreedy) {
  for (auto [from, to, shape] :
       std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>{
           {"S(0),S(1)", "S(1),S(0)", {8, 8}},
           {"S(0),S(0)", "R,S(0)", {8, 8}},
           {"S(0),S(1)", "S(1),S(0)", {1024, 1024}}}) {
    const auto a = spec({2, 2}, from, shape), b = spec({2, 2}, to, shape);
    EXPECT_LT(plan_redistribute(a, b)->cost, greedy_cost(a, b)) << from << " -> " << to;
  }
}

// A general strided shard (NOTE [strided shards]) leaves only to Replicate (all_gather, then a
// local reorder) and is made only from it (a local gather of the rank's runs); everything else
// goes through those. Box forms are Shards with an order and plan as such.
TEST(RedistributePlanTest, StridedShardPlans) {
  const char* head1 = " on mesh (2) shape [8]: ";
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"_S(0,2)", "R"}, "all_gather(mesh_dim=0, _S(0,2)->R)"},
      {{"R", "_S(0,2)"}, "local_chunk(mesh_dim=0, R->_S(0,2))"},
      {{"_S(0,2)", "S(0)"}, "all_gather(mesh_dim=0, _S(0,2)->R); local_chunk(mesh_dim=0, R->S(0))"},
      {{"S(0)", "_S(0,2)"}, "all_gather(mesh_dim=0, S(0)->R); local_chunk(mesh_dim=0, R->_S(0,2))"},
      {{"P(sum)", "_S(0,2)"},
       "all_reduce(mesh_dim=0, P(sum)->R); local_chunk(mesh_dim=0, R->_S(0,2))"},
      {{"_S(0,2)", "_S(0,4)"},
       "all_gather(mesh_dim=0, _S(0,2)->R); local_chunk(mesh_dim=0, R->_S(0,4))"},
  };
  for (const auto& [pair, steps] : cases) {
    EXPECT_EQ(plan_text({2}, pair[0], pair[1], {8}),
              "[" + pair[0] + "] -> [" + pair[1] + "]" + head1 + steps);
  }
  // Other mesh dims keep their placements; an uneven gather needs no padding.
  EXPECT_EQ(plan_text({2, 2}, "_S(0,2),S(1)", "S(0),S(1)", {7, 6}),
            "[_S(0,2),S(1)] -> [S(0),S(1)] on mesh (2,2) shape [7,6]: "
            "all_gather(mesh_dim=0, _S(0,2)->R); local_chunk(mesh_dim=0, R->S(0))");
  EXPECT_EQ(plan_text({2, 2}, "S(0),R", "S(0),_S(1,3)", {8, 6}),
            "[S(0),R] -> [S(0),_S(1,3)] on mesh (2,2) shape [8,6]: "
            "local_chunk(mesh_dim=1, R->_S(1,3))");
  // Priced by the one cost model: an all_gather of the whole, as S(0) -> R.
  const auto strided = plan_redistribute(spec({2}, "_S(0,2)", {8}), spec({2}, "R", {8}));
  const auto plain = plan_redistribute(spec({2}, "S(0)", {8}), spec({2}, "R", {8}));
  EXPECT_DOUBLE_EQ(strided->cost, plain->cost);
  EXPECT_EQ(strided->steps[0].bytes, plain->steps[0].bytes);
  // The box form is a Shard with an order: FSDP over TP unshards as before.
  EXPECT_EQ(plan_redistribute(spec({2, 2}, "_S(0,2),S(0)", {8, 4}), spec({2, 2}, "R,S(0)", {8, 4}))
                ->steps.size(),
            1u);
  EXPECT_LE(plan_cost_lower_bound(spec({2}, "_S(0,2)", {8}), spec({2}, "S(0)", {8}),
                                  default_cost_model()),
            plan_redistribute(spec({2}, "_S(0,2)", {8}), spec({2}, "S(0)", {8}))->cost);
}

}  // namespace
}  // namespace dtensor
