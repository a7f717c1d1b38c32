#pragma once
// Redistribute plans: how a tensor moves from one layout (DTensorSpec) to another on the same
// mesh, as plain data that prints, chosen by cost. No communication happens here; the executor
// (redistribute.h) runs a plan with the functional collectives.
//
// NOTE [redistribute planning]
// The planner searches the layouts between source and target (A*, exact, deterministic) with one
// step per edge, priced by the one cost model (cost_model.h). Steps on one mesh dim m:
//   S(d) -> R     all_gather       m must be the last (innermost) mesh dim splitting d
//   S(d) -> S(e)  all_to_all       same condition; m becomes the innermost splitter of e
//   P(op) -> R    all_reduce
//   P(op) -> S(e) reduce_scatter   m becomes the innermost splitter of e
//   R -> S(e)     local_chunk      (no communication)
//   R -> P(op)    partition        internal only (gradients); never in a user redistribute
//   _S(d,sf) -> R all_gather       then a local reorder into piece order (NOTE [strided shards])
//   R -> _S(d,sf) local_chunk      a local gather of the rank's runs; only to the target's _S,
//                                  and only where no other mesh dim shards d
// A general strided shard moves by those two steps alone (to S(e) or P, through R), and no step
// makes another mesh dim shard its tensor dim.
// plus one step over several mesh dims at once:
//   all_to_all_v  every rank receives exactly the elements its target box needs from the rank
//                 of its group that holds them (Shardy's "move only the difference"): e.g.
//                 [S(0),S(1)] -> [S(1),S(0)] moves one block instead of two all_gathers. Allowed
//                 when every mesh dim that changes is Shard on both sides (a Replicate source dim
//                 is first cut locally) and the group's source boxes cover every target box;
//                 never for a layout with a general strided shard (its pieces are not boxes).
// "Innermost" matters because a tensor dim split by several mesh dims is split in the spec's
// shard order (NOTE [uneven shards]); a collective over an outer splitter would not produce a
// layout. Uneven splits are allowed everywhere: a step pads its buffers only when uneven (the
// step says `padded`), and all_to_all_v never pads.
//
// Refused, as in PyTorch: meshes or tensor metadata that differ, a Partial appearing where the
// source has none (unless PlanOptions::allow_partial, for gradients), and a Partial changing its
// reduce op. Plans are cached by (source, target, options); every rank computes the same plan.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/lru_cache.h"
#include "layout/dtensor_spec.h"
#include "sharding_prop/cost_model.h"

namespace dtensor {

struct PlanStep {
  CommKind kind = CommKind::kAllGather;
  // The mesh dim of a single-dim step; the mesh dims of an all_to_all_v (ascending).
  std::vector<int64_t> mesh_dims;
  Placement from, to;  // on mesh_dims[0]; for all_to_all_v, unused (see before/after)
  DTensorSpec before, after;
  bool padded = false;  // an uneven split: buffers are padded to equal chunks, then trimmed
  int64_t bytes = 0;    // the size the cost model was given (see CostModel::step_cost)
  double cost = 0;      // microseconds under the planner's cost model

  // "all_to_all(mesh_dim=1, S(1)->S(0))", "all_to_all_v(mesh_dims=[0,1],
  // [S(0),S(1)]->[S(1),S(0)])".
  std::string to_string() const;
};

struct RedistributePlan {
  DTensorSpec src, dst;
  std::vector<PlanStep> steps;
  double cost = 0;  // sum of the steps' costs

  bool is_noop() const { return steps.empty(); }
  int64_t num_collectives() const;
  // "[S(0),S(1)] -> [S(1),S(0)] on mesh (2,2) shape [8,8]: step; step" (or ": no-op").
  std::string to_string() const;
};

struct PlanOptions {
  // Allow Replicate -> Partial (the partition step). Only internal callers (autograd) set it.
  bool allow_partial = false;
};

// The cheapest plan under the mesh's cost model (NOTE [cost model per device]), cached. Throws
// dtensor::Error with a clear message when the move is not allowed (see the NOTE above).
std::shared_ptr<const RedistributePlan> plan_redistribute(DTensorSpec src, DTensorSpec dst,
                                                          PlanOptions options = {});
// The same, or null when the move is not allowed (candidate searches: NOTE [error convention]).
std::shared_ptr<const RedistributePlan> try_plan_redistribute(const DTensorSpec& src,
                                                              const DTensorSpec& dst,
                                                              PlanOptions options = {});
// Why the move from `src` to `dst` is not allowed, or nullopt when it is.
std::optional<std::string> plan_refusal(const DTensorSpec& src, const DTensorSpec& dst,
                                        const PlanOptions& options);
// Uncached, with any cost model (tests and the explain tool).
RedistributePlan compute_plan(DTensorSpec src, DTensorSpec dst, const PlanOptions& options,
                              const CostModel& model);

// One single-mesh-dim step from layout `x`: mesh dim `mesh_dim` becomes `to` (the step kind
// follows from the two placements), priced under `model`. Throws for pairs no step turns into
// each other (Partial -> Partial, Shard -> Partial). The planner's edges, exposed for baselines.
PlanStep price_step(const DTensorSpec& x, int64_t mesh_dim, Placement to, const CostModel& model);

// A cheap lower bound on compute_plan(src, dst).cost (no search): 0 when no mesh dim needs a
// collective; else one latency plus, at bus bandwidth, the bytes of the rank that lacks the
// most of its target box (every element a rank lacks must arrive over some step, and a step is
// priced at no less than what any rank receives in it when splits are even, half of it when
// not). Box arithmetic up to 64 ranks; past that, the latency alone.
double plan_cost_lower_bound(const DTensorSpec& src, const DTensorSpec& dst,
                             const CostModel& model);

// The plan cache's counters (NOTE [caches]: bounded LRU).
CacheStats plan_cache_stats();

}  // namespace dtensor
