#pragma once
// The sharding propagator: for one operator call (op name, input specs, layout arguments) it
// chooses the output layouts and what every input must become, by cost, and caches the answer.
// Pure planning: no communication.
//
// NOTE [propagation]
// 1. The op's Rule (ops/registry.h) is built from the input metas and layout arguments.
// 2. Candidates, per mesh dim: "shard factor f" for every factor some input is sharded by there
//    (or every shardable factor when some input is Partial there, so a reduce_scatter can be
//    chosen), "keep Partial" where the op's linearity allows it and the inputs are Partial, and
//    "replicate". A candidate is one choice per mesh dim (their product); choices that would
//    shard a merged dim unevenly or through a minor factor are dropped.
// 3. Each candidate costs the sum over inputs of the redistribute plan from the input's spec to
//    the candidate's (redistribute_plan.h: the same planner and cost model as redistribute),
//    plus the op's compute on the candidate's largest piece (NOTE [compute in the cost model]).
//    The cheapest wins; ties go to the earlier candidate (shardings before replication, factors
//    in rule order), so every rank picks the same. A contraction whose inputs are all
//    replicated on a mesh dim also gets the candidates "shard pass factor f" there (inputs
//    chunked locally, each rank computing its piece), charged the all_gather that undoes them.
// 4. In-place ops keep self's layout: only candidates that leave self as it is and give the
//    output self's placements count. Strict mode refuses any implicit redistribute and names the
//    one the caller must write.
// The cache key is (op, interned input specs, layout args, strict): never runtime scalars, so an
// optimizer step's changing learning rate cannot miss; list arguments (cat) are just more
// inputs. The cache is an LRU, thread-safe, with hit/miss counts.

#include <absl/functional/function_ref.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sharding_prop/ops/registry.h"
#include "sharding_prop/redistribute_plan.h"

namespace dtensor::sharding {

struct OpSharding {
  std::string op;
  std::string rule;                        // the rule's text form
  std::vector<DTensorSpec> input_targets;  // what each input must be for the local op
  std::vector<std::shared_ptr<const RedistributePlan>> input_plans;  // from each input's spec
  std::vector<DTensorSpec> outputs;
  // Of the input redistributes and the local compute, under the one cost model (NOTE [compute
  // in the cost model]); `flops`: the op's FLOPs on the largest piece (0 for ops not priced so).
  double cost = 0;
  double flops = 0;
  // No layout keeps the op's written inputs (Rule::written_inputs: batch norm's running
  // statistics sharded so unevenly that the kernel would see an empty piece), or the builder
  // found no rule for these inputs (BuiltRule::run_replicated): the dispatcher runs the op by the
  // replicate fallback, which writes them back. No targets, no outputs.
  bool run_replicated = false;
  // An in-place op whose rule keeps no layout of self (a scan along self's sharded dim): the
  // dispatcher runs its out-of-place overload and copies the result into self, or raises where
  // copy_ cannot write into self (NOTE [in-place by copy] in dtensor/dispatch_fallback.cc). No
  // targets, no outputs.
  bool in_place_by_copy = false;

  bool needs_redistribute() const;
  // "aten::mm [S(0)],[R] -> [S(0)] (rule mk,kn->mn | k:sum, cost 0.0 us)" + one line per plan.
  std::string to_string() const;
};

// NOTE [output metadata from ATen]
// The outputs' shapes, dtypes and strides come from ATen: on a cache miss the dispatcher runs the
// op on meta tensors of the global inputs (as PyTorch's DTensor does) and the propagator takes
// the result, keeping only the placements from the rule. A rule whose output shapes disagree
// with ATen's is a bug in the rule and raises (never a silent pick of one). The result is cached
// with the propagation, keyed by the inputs' specs, the layout arguments and the call's other
// non-tensor arguments (LayoutArgs::call). An op ATen has no meta kernel for (the callback
// returns nullopt) keeps its rule's metadata; the dispatcher then checks every local result's
// dtype against it, so a wrong rule fails loudly there. A Python process also has torch's
// Python meta registrations (convolution's, for one); a C++ program only ATen's C++ ones, so a
// rule that leaves sizes to ATen (Rule::whole_output_sizes_from_aten) is used only for ops with
// a C++ meta kernel.
// One per output, nullopt for an undefined one (a masked-off gradient).
// A FunctionRef: the dispatcher builds one per call, and a std::function of its captures would
// allocate on every op.
using OutputMetas = absl::FunctionRef<std::optional<std::vector<std::optional<TensorMeta>>>()>;

struct PropagateOptions {
  bool strict = false;  // refuse implicit redistributes (NOTE above)
};

// "<op> has no sharding rule (inputs: ...); nearest supported: ..." (what propagate throws).
std::string no_rule_message(std::string_view op, const std::vector<DTensorSpec>& inputs);

// throws dtensor::Error, before any work, when the op has no rule (naming it, its input
// placements and the nearest supported ops), the inputs live on different meshes, the arguments
// do not fit the op, strict mode would need a redistribute, or an in-place op cannot keep self.
std::shared_ptr<const OpSharding> propagate(std::string_view op,
                                            const std::vector<DTensorSpec>& inputs,
                                            const LayoutArgs& args = {},
                                            PropagateOptions options = {});

// The same with the op's table entry already looked up (the dispatcher keeps it per operator);
// `aten_metas`, when given, is asked on a miss for the outputs' metadata (NOTE above).
std::shared_ptr<const OpSharding> propagate(const OpEntry& op,
                                            const std::vector<DTensorSpec>& inputs,
                                            const LayoutArgs& args = {},
                                            PropagateOptions options = {},
                                            const OutputMetas* aten_metas = nullptr);

// The propagation cache's counters (NOTE [caches]; hits include the per-thread front layer).
CacheStats propagation_cache_stats();
// Bounds the cache (least recently used entries go first); clears it.
void set_propagation_cache_capacity(size_t capacity);

}  // namespace dtensor::sharding
