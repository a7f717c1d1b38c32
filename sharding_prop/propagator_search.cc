// NOTE [sharding rules as factors] in rule.h: the propagator's candidate search, the part of
// propagation that runs on a cache miss (propagator.cc holds the entry points and the cache). One
// search in call order (enumerating candidates, admitting them, ordering shards, pricing) whose
// helpers share the file's Candidate type: one file past the 600-line guideline
// (docs/architecture.md, "File size").

#include "sharding_prop/propagator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>

#include "base/error.h"
#include "sharding_prop/propagator_internal.h"

namespace dtensor::sharding::detail {
namespace {

// One mesh dim's choice: every input's and output's placement there, the factor it shards (-1:
// none; the pieces then compute the whole op) and whether it was added for compute only.
struct Choice {
  std::vector<Placement> in, out;
  int factor = -1;
  bool introduced = false;
};

}  // namespace

std::string specs_text(const std::vector<DTensorSpec>& specs) {
  std::vector<std::string> parts;
  for (const auto& s : specs)
    parts.push_back(to_string(s.placements()) + " " + s.meta().to_string());
  return absl::StrJoin(parts, ", ");
}

namespace {

// Where factor f stands in a tensor: the dim it is the major factor of, -1 when absent, -2 when
// it is a minor factor of a merged dim (it cannot be sharded there).
int64_t dim_of(const TensorFactors& t, int f) {
  for (size_t d = 0; d < t.size(); ++d) {
    for (size_t k = 0; k < t[d].size(); ++k) {
      if (t[d][k] == f) return k == 0 ? static_cast<int64_t>(d) : -2;
    }
  }
  return -1;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::optional<Choice> shard_choice(const Rule& rule, int f) {
  const Factor& factor = rule.factors[f];
  Choice c;
  c.factor = f;
  for (size_t i = 0; i < rule.inputs.size(); ++i) {
    const int64_t d = dim_of(rule.inputs[i], f);
    if (d == -2) return std::nullopt;
    if (d >= 0) {
      c.in.push_back(Shard(static_cast<int32_t>(d)));
    } else if (factor.kind == FactorKind::kContract && i < rule.partial_with_contract.size() &&
               rule.partial_with_contract[i]) {
      c.in.push_back(Partial());
    } else {
      c.in.push_back(Replicate());
    }
  }
  for (size_t o = 0; o < rule.outputs.size(); ++o) {
    const int64_t d = dim_of(rule.outputs[o], f);
    const bool summed = o < rule.output_sums.size() &&
                        std::count(rule.output_sums[o].begin(), rule.output_sums[o].end(), f) > 0;
    if (d == -2) return std::nullopt;
    if (d >= 0) {
      c.out.push_back(Shard(static_cast<int32_t>(d)));
    } else if (factor.kind == FactorKind::kContract) {
      c.out.push_back(factor.partial());
    } else if (summed) {
      c.out.push_back(Partial());
    } else if (numel_of(rule.output_shape(o)) == 0) {
      c.out.push_back(Replicate());  // an empty output (eval batch norm's statistics) is whole
    } else {
      return std::nullopt;  // a pass factor missing from an output cannot be sharded
    }
  }
  return c;
}

// NOTE [kept Partials]
// Which Partial reduce ops an op commutes with, so that a Partial input's pending reduction can
// run after the op instead of before it (PyTorch keeps these lazily too; reducing early would
// communicate where PyTorch does not):
//   kMove        copies and views: any op;
//   kAdditive    sums (add, sub, neg, sum, mean, a Scalar factor): sum and avg;
//   kMultilinear products (mul, div by a Replicate, mm): sum and avg, in one linear input, the
//                other inputs Replicate (a Partial one reduced: one reduction instead of two);
//   kShift       a Scalar added: avg, max and min;
//   kMax, kMin   maximum/amax, minimum/amin: max, resp. min.
// All Partial inputs must hold the same Partial, and only the inputs the rule names in
// linear_inputs (when it names any) may be Partial: an index stays Replicate. Where the op
// combines its data inputs additively
// (kMove, kAdditive, kMax, kMin) a Replicate input joins by being partitioned into that
// Partial, which costs no communication: for sum one rank keeps the value and the others zero,
// for avg, max and min every rank keeps it (partial_share), so the reduction gives the value
// back exactly, one device's answer. Products keep Replicate factors as they are (a factor
// partitioned too would be counted n times).
std::vector<Choice> kept_partials(const Rule& rule, const std::vector<DTensorSpec>& inputs,
                                  int64_t m) {
  const size_t n_out = rule.outputs.size();
  if (rule.linearity == Linearity::kMultilinear) {
    // One linear Partial(sum or avg) input stays, every other input is made Replicate (another
    // Partial one reduced): one choice per such input.
    std::vector<Choice> out;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Placement p = inputs[i].placement(m);
      const bool linear = rule.linear_inputs.empty() || rule.linear_inputs[i];
      if (!linear || !p.is_partial() ||
          (p.reduce_op() != ReduceOp::kSum && p.reduce_op() != ReduceOp::kAvg))
        continue;
      Choice c{std::vector<Placement>(inputs.size(), Replicate()),
               std::vector<Placement>(n_out, p)};
      c.in[i] = p;
      out.push_back(std::move(c));
    }
    return out;
  }
  std::optional<Placement> partial;
  size_t n_partial = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Placement p = inputs[i].placement(m);
    if (!p.is_partial()) {
      if (!p.is_replicate()) return {};  // a Shard input: the shard choices cover it
      continue;
    }
    if (!rule.linear_inputs.empty() && !rule.linear_inputs[i]) return {};  // an index: reduced
    if (partial && *partial != p) return {};
    partial = p;
    ++n_partial;
  }
  if (!partial) return {};
  const ReduceOp op = partial->reduce_op();
  switch (rule.linearity) {
    case Linearity::kMove:
      break;
    case Linearity::kAdditive:
      if (op != ReduceOp::kSum && op != ReduceOp::kAvg) return {};
      break;
    case Linearity::kMax:
    case Linearity::kMin:
      if (op != (rule.linearity == Linearity::kMax ? ReduceOp::kMax : ReduceOp::kMin)) return {};
      break;
    case Linearity::kNorm:
      if (*partial != Placement::partial_norm(rule.norm)) return {};
      break;
    case Linearity::kShift:
      if (op != ReduceOp::kAvg && op != ReduceOp::kMax && op != ReduceOp::kMin) return {};
      if (n_partial != inputs.size()) return {};
      break;
    default:
      return {};
  }
  // Every data input Partial: Replicate ones are partitioned into it. The others (indices: not
  // in linear_inputs) stay Replicate, since a partitioned index would be a wrong index.
  std::vector<Placement> in(inputs.size(), *partial);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!rule.linear_inputs.empty() && !rule.linear_inputs[i]) in[i] = Replicate();
  }
  return {Choice{std::move(in), std::vector<Placement>(n_out, *partial)}};
}

// NOTE [strided shards through ops]
// An input strided on mesh dim m (a general _StridedShard: NOTE [strided shards] in
// layout/dtensor_spec.h) holds, on each rank, the same runs of its dim's factor as any other
// tensor strided by the same split factor there. An op whose pieces are computed elementwise
// along that factor (a pass factor: pointwise ops, a matmul's non-contracted dims, views that
// keep the dim whole) therefore keeps it: every tensor carrying the factor strided by the same
// split factor, the output too, with no communication (a packed_colwise linear's output stays
// _S(-1,2), as PyTorch keeps it). A contracted factor (reduced by sum) strided alike gives a
// Partial(sum), as a Shard does. Only a dim whose one factor this is qualifies (a merged or split
// dim is not the same runs), and only ops that run on their pieces with no shape argument made
// local; anything else is offered no strided choice, so its strided inputs are redistributed to
// what its rule takes.
std::vector<Choice> strided_choices(const Rule& rule, const std::vector<DTensorSpec>& inputs,
                                    int64_t m) {
  std::vector<Choice> out;
  std::set<std::pair<int, int64_t>> seen;
  for (size_t i = 0; i < inputs.size() && i < rule.inputs.size(); ++i) {
    const Placement p = inputs[i].placement(m);
    if (!p.is_strided_shard() || p.dim() >= static_cast<int64_t>(rule.inputs[i].size())) continue;
    const DimFactors& dim = rule.inputs[i][p.dim()];
    if (dim.size() != 1) continue;
    const int f = dim[0];
    const Factor& factor = rule.factors[f];
    const bool pass = factor.kind == FactorKind::kPass;
    const bool summed = factor.kind == FactorKind::kContract && factor.reduce == ReduceOp::kSum;
    if ((!pass && !summed) || !seen.insert({f, p.split_factor()}).second) continue;
    std::optional<Choice> c = shard_choice(rule, f);
    if (!c) continue;
    // Every tensor carrying f must carry it as its dim's only factor.
    bool whole_dims = true;
    const auto strided = [&](std::vector<Placement>& placements,
                             const std::vector<TensorFactors>& tensors) {
      for (size_t t = 0; t < placements.size() && t < tensors.size(); ++t) {
        if (!placements[t].is_shard()) continue;
        whole_dims = whole_dims && tensors[t][placements[t].dim()].size() == 1;
        placements[t] = StridedShard(placements[t].dim(), p.split_factor());
      }
    };
    strided(c->in, rule.inputs);
    strided(c->out, rule.outputs);
    if (whole_dims) out.push_back(std::move(*c));
  }
  return out;
}

// The choices for mesh dim m, best-first for ties: shardings, kept Partials, replication.
// `compute_shardings`: when every input is replicated on m, also offer to shard each pass factor
// there for compute alone (NOTE [compute in the cost model]).
std::vector<Choice> choices_for(const Rule& rule, const std::vector<DTensorSpec>& inputs, int64_t m,
                                bool compute_shardings) {
  // Shardings that follow an input cost it nothing. A Partial the op cannot keep is reduced to
  // Replicate (one all_reduce), as PyTorch's pointwise and reduction rules do, unless another
  // input is sharded on m: then a reduce_scatter to any sharding the output keeps is a choice.
  // A reduce_scatter alone would move less here, but its Shard output is then a layout PyTorch's
  // code does not expect (to_local() of relu(P) is the whole tensor there), and a consumer that
  // needs it whole pays an all_gather: two collectives where PyTorch issues one. A Shard of a dim
  // the op needs whole (softmax's dim, a cumsum's, the dims a norm normalizes) goes to Replicate or
  // to another input's sharding, as PyTorch's: an all_to_all to some other dim moves less at this
  // op, but its output is then sharded where no input was, and the consumers that need it whole pay
  // the all_gather anyway (a LayerNorm over the sequence in sequence parallelism: all_to_all +
  // all_gather where PyTorch does one all_gather). A size-1 factor is a choice only when an input
  // is sharded on it (NOTE [size-1 factors]).
  std::set<int> factors, followed;
  bool any_partial = false, any_shard = false, keep_inputs = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Placement p = inputs[i].placement(m);
    if (p.is_partial()) any_partial = true;
    if (!p.is_shard()) continue;
    any_shard = true;
    const DimFactors& dim = rule.inputs[i][p.dim()];
    if (!dim.empty() && rule.factors[dim[0]].kind != FactorKind::kReplicate) {
      factors.insert(dim[0]);
      followed.insert(dim[0]);
    }
  }
  if (any_partial && any_shard) {
    // Not a factor the op contracts (unless an input is sharded there already): that output is
    // Partial again, and its second reduction is not priced here (vector_norm(P(sum), 0) would
    // reduce_scatter, count, and all_reduce later, where one all_reduce serves).
    for (size_t f = 0; f < rule.factors.size(); ++f) {
      if (rule.factors[f].kind == FactorKind::kContract && followed.count(static_cast<int>(f)) == 0)
        continue;
      factors.insert(static_cast<int>(f));
    }
  }
  std::vector<Choice> out;
  for (int f : factors) {
    if (rule.factors[f].kind == FactorKind::kReplicate) continue;
    if (rule.factors[f].size <= 1 && followed.count(f) == 0) continue;
    if (auto c = shard_choice(rule, f)) out.push_back(std::move(*c));
  }
  if (any_partial) {
    for (Choice& c : kept_partials(rule, inputs, m)) out.push_back(std::move(c));
    if (rule.linearity == Linearity::kShapeOnly) keep_inputs = true;
  }
  if (rule.linearity == Linearity::kShapeOnly && (keep_inputs || any_shard) &&
      (!any_shard || rule.output_shape_from_args)) {
    // Values unread (zeros_like, new_zeros): every input may stay as it is, output replicated,
    // when the local op gives the whole output's shape: its inputs' pieces have the whole shape
    // (Partial, Replicate), or the output's shape comes from an argument the dispatcher makes
    // local (new_zeros' size), not from a sharded input (zeros_like of a Shard keeps the Shard).
    Choice c{{}, std::vector<Placement>(rule.outputs.size(), Replicate())};
    for (const auto& in : inputs) c.in.push_back(in.placement(m));
    out.push_back(std::move(c));
  }
  if (compute_shardings && !any_partial && !any_shard && inputs[0].mesh().shape()[m] > 1) {
    // Inputs chunked locally (Replicate -> Shard is free of communication), each rank computing
    // its piece of the output; never a Partial output, whose later reduction is not priced.
    for (size_t f = 0; f < rule.factors.size(); ++f) {
      if (rule.factors[f].kind != FactorKind::kPass || rule.factors[f].size <= 1) continue;
      auto c = shard_choice(rule, static_cast<int>(f));
      if (!c || std::any_of(c->out.begin(), c->out.end(),
                            [](const Placement& p) { return p.is_partial(); }))
        continue;
      c->introduced = true;
      out.push_back(std::move(*c));
    }
  }
  out.push_back({std::vector<Placement>(inputs.size(), Replicate()),
                 std::vector<Placement>(rule.outputs.size(), Replicate())});
  return out;
}

// A contracted factor reduced by avg, max or min may be sharded only evenly: a mean of unequal
// chunks' means is not the mean, and an empty chunk has no max (sum and product are fine: an
// empty chunk gives their identity). So may a factor marked even_only (Factor::even_only).
bool contractions_even(const Rule& rule, const std::vector<Placements>& in,
                       const DeviceMesh& mesh) {
  for (size_t f = 0; f < rule.factors.size(); ++f) {
    const Factor& factor = rule.factors[f];
    const bool even_reduce = factor.kind == FactorKind::kContract &&
                             (factor.reduce == ReduceOp::kAvg || factor.reduce == ReduceOp::kMax ||
                              factor.reduce == ReduceOp::kMin);
    if (!even_reduce && !factor.even_only) continue;
    // The mesh dims sharding f: read them off the first input that carries it.
    for (size_t i = 0; i < rule.inputs.size(); ++i) {
      const int64_t d = dim_of(rule.inputs[i], static_cast<int>(f));
      if (d < 0) continue;
      int64_t k = 1;
      for (size_t m = 0; m < in[i].size(); ++m) {
        if (in[i][m].is_shard(d)) k *= mesh.shape()[m];
      }
      if (factor.size % k != 0) return false;
      break;
    }
  }
  return true;
}

// A merged dim (several factors) may be sharded only evenly through its major factor.
bool merged_dims_even(const Rule& rule, const TensorFactors& t, const Placements& p,
                      const DeviceMesh& mesh) {
  for (size_t d = 0; d < t.size(); ++d) {
    if (t[d].size() < 2) continue;
    int64_t k = 1;
    for (size_t m = 0; m < p.size(); ++m) {
      if (p[m].is_shard(static_cast<int64_t>(d))) k *= mesh.shape()[m];
    }
    if (rule.factors[t[d][0]].size % k != 0) return false;
  }
  return true;
}

constexpr size_t kMaxCandidates = 4096;

// Whether moving the inputs to `targets` needs communication: some mesh dim (of size > 1) turns
// a Shard or Partial into something else.
bool needs_collective(const std::vector<DTensorSpec>& inputs,
                      const std::vector<Placements>& targets) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DeviceMesh& mesh = inputs[i].mesh();
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      const Placement p = inputs[i].placement(m);
      if (mesh.shape()[m] > 1 && !p.is_replicate() && p != targets[i][m]) return true;
    }
  }
  return false;
}

// The op's rule for these inputs, checked against them; builder errors name the op and inputs.
BuiltRule checked_rule(const OpEntry& entry, const std::vector<DTensorSpec>& inputs,
                       const std::vector<TensorMeta>& metas, const LayoutArgs& args) {
  const std::string& op = entry.name;
  BuiltRule built = [&] {
    try {  // adds the op and its inputs to the builder's message, then rethrows
      return entry.build(metas, args);
    } catch (const Error& e) {
      fail(op, " on ", specs_text(inputs), ": ", e.what());
    }
  }();
  if (built.run_replicated) return built;
  const Rule& rule = built.rule;
  DTENSOR_CHECK(rule.inputs.size() == inputs.size(), op, ": its rule takes ", rule.inputs.size(),
                " tensors but got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTENSOR_CHECK(rule.inputs[i].size() == metas[i].shape.size(), op, ": input ", i, " has ",
                  metas[i].shape.size(), " dims but the op expects ", rule.inputs[i].size(),
                  " there (rule ", rule.to_string(), ")");
  }
  return built;
}

// Whether the op is offered shardings of replicated inputs for compute alone: a contraction of
// the built-in matmul family (custom rules are priced but keep their declared strategies),
// neither in-place nor out= (those keep their tensors' layouts).
bool offers_compute_shardings(const OpEntry& entry, const Rule& rule) {
  const std::string_view name = entry.name;
  const bool out_overload = name.size() > 4 && name.substr(name.size() - 4) == ".out";
  const bool contracts = std::any_of(rule.factors.begin(), rule.factors.end(), [](const Factor& f) {
    return f.kind == FactorKind::kContract;
  });
  return entry.family == "matmul" && entry.flops == Flops::kContraction && contracts &&
         !entry.in_place && !out_overload;
}

// Per mesh dim, the choices to combine (their product is bounded by kMaxCandidates).
std::vector<std::vector<Choice>> choices_per_dim(const OpEntry& entry, const Rule& rule,
                                                 const std::vector<DTensorSpec>& inputs) {
  const DeviceMesh& mesh = inputs[0].mesh();
  const bool compute_shardings = offers_compute_shardings(entry, rule);
  const bool keep_strided =  // NOTE [strided shards through ops]
      entry.execution == Execution::kPieces &&
      entry.local_shape.kind == LocalShapeArg::Kind::kNone && !rule.whole_output_sizes_from_aten &&
      std::any_of(inputs.begin(), inputs.end(),
                  [](const DTensorSpec& s) { return s.has_strided_shard(); });
  std::vector<std::vector<Choice>> per_dim;
  size_t total = 1;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    per_dim.push_back(choices_for(rule, inputs, m, compute_shardings));
    if (keep_strided) {  // first: they move nothing
      std::vector<Choice> kept = strided_choices(rule, inputs, m);
      per_dim.back().insert(per_dim.back().begin(), kept.begin(), kept.end());
    }
    total *= per_dim.back().size();
    if (total > kMaxCandidates) {  // keep only shardings that follow an input and replication
      per_dim.back().erase(per_dim.back().begin() + 1, per_dim.back().end() - 1);
    }
  }
  return per_dim;
}

// One candidate: the placements of every input and output, how many ranks share each factor,
// and the mesh dims it shards for compute alone (Choice::introduced).
struct Candidate {
  std::vector<Placements> in, out;
  std::vector<int64_t> shards;
  std::vector<int64_t> introduced;
};

Candidate candidate_at(const std::vector<std::vector<Choice>>& per_dim,
                       const std::vector<size_t>& pick, const Rule& rule, size_t n_in,
                       const DeviceMesh& mesh) {
  const int64_t ndim = static_cast<int64_t>(per_dim.size());
  const size_t n_out = rule.outputs.size();
  Candidate c{std::vector<Placements>(n_in, Placements(ndim)),
              std::vector<Placements>(n_out, Placements(ndim)),
              std::vector<int64_t>(rule.factors.size(), 1),
              {}};
  for (int64_t m = 0; m < ndim; ++m) {
    const Choice& choice = per_dim[m][pick[m]];
    for (size_t i = 0; i < n_in; ++i) c.in[i][m] = choice.in[i];
    for (size_t o = 0; o < n_out; ++o) c.out[o][m] = choice.out[o];
    if (choice.factor >= 0) c.shards[choice.factor] *= mesh.shape()[m];
    if (choice.introduced) c.introduced.push_back(m);
  }
  return c;
}

// What a candidate costs besides moving its inputs (NOTE [compute in the cost model]): the op's
// compute on its largest piece, and for the mesh dims it shards for compute alone the
// all_gather that would bring each output back to Replicate there. Null when such an undo is
// not allowed (then the candidate is not taken).
std::optional<double> extra_cost(const OpEntry& entry, const BuiltRule& built, const Candidate& c,
                                 const DeviceMesh& mesh, double* flops) {
  const Rule& rule = built.rule;
  *flops = rule_flops(entry.flops, rule, c.shards);
  double cost = cost_model_for(mesh.device_type()).compute_cost(*flops);
  for (size_t o = 0; o < rule.outputs.size() && !c.introduced.empty(); ++o) {
    const TensorMeta meta = TensorMeta::make(rule.output_shape(o), built.out_dtypes.at(o));
    Placements whole = c.out[o];
    for (int64_t m : c.introduced) whole[m] = Replicate();
    auto undo = try_plan_redistribute(DTensorSpec::make(mesh, c.out[o], meta),
                                      DTensorSpec::make(mesh, whole, meta));
    if (!undo) return std::nullopt;
    cost += undo->cost;
  }
  return cost;
}

// Whether the candidate gives a layout at all (merged dims and contractions split evenly) and
// keeps self for in-place ops.
bool admissible(const OpEntry& entry, const Rule& rule, const Candidate& c,
                const std::vector<DTensorSpec>& inputs) {
  const DeviceMesh& mesh = inputs[0].mesh();
  // A strided shard must shard its dim alone (NOTE [strided shards]): a strided choice on one
  // mesh dim with a sharding of the same factor on another gives no layout.
  const auto strided_alone = [](const Placements& p) {
    for (size_t m = 0; m < p.size(); ++m) {
      if (!p[m].is_strided_shard()) continue;
      for (size_t k = 0; k < p.size(); ++k) {
        if (k != m && p[k].is_any_shard(p[m].dim())) return false;
      }
    }
    return true;
  };
  for (const auto* side : {&c.in, &c.out}) {
    if (!std::all_of(side->begin(), side->end(), strided_alone)) return false;
  }
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (!merged_dims_even(rule, rule.inputs[i], c.in[i], mesh)) return false;
  }
  for (size_t o = 0; o < c.out.size(); ++o) {
    if (!merged_dims_even(rule, rule.outputs[o], c.out[o], mesh)) return false;
  }
  if (!contractions_even(rule, c.in, mesh)) return false;
  for (size_t i = 0; i < rule.written_inputs.size() && i < c.in.size(); ++i) {
    if (rule.written_inputs[i] && c.in[i] != inputs[i].placements()) return false;
  }
  return !entry.in_place ||
         (c.in[0] == inputs[0].placements() && c.out[0] == inputs[0].placements());
}

// NOTE [shard order through ops]
// A tensor dim sharded by several mesh dims may be split in another order than ascending
// (DTensorSpec's shard order: FSDP over TP splits a weight by "tp" first). An op keeps that order
// when it can: per factor, the order in which its kept inputs' dims (those whose major factor it
// is, sharded by two or more mesh dims) are split, when every such input agrees (inputs that are
// moved anyway are moved to that order). Then every input and output dim of that factor is split
// in that order, so each rank's pieces cover the same indices of the factor, as with the
// ascending order; any disagreement gives every dim the ascending order (the inputs are
// redistributed to it), except that a written input (in-place self, Rule::written_inputs) is
// never moved, so its order wins and the others are moved to it. Empty when every input has the
// default order.
std::vector<std::vector<int64_t>> factor_orders(const Rule& rule, const Candidate& c,
                                                const std::vector<DTensorSpec>& inputs,
                                                bool in_place) {
  if (std::all_of(inputs.begin(), inputs.end(),
                  [](const DTensorSpec& s) { return s.has_default_shard_order(); })) {
    return {};
  }
  const size_t n = std::min(inputs.size(), rule.inputs.size());
  auto written = [&](size_t i) {
    return (in_place && i == 0) || (i < rule.written_inputs.size() && rule.written_inputs[i]);
  };
  std::vector<size_t> visit;  // the written inputs first: their orders are kept
  for (size_t i = 0; i < n; ++i) {
    if (written(i)) visit.push_back(i);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!written(i)) visit.push_back(i);
  }
  std::vector<std::vector<int64_t>> order(rule.factors.size());
  std::vector<bool> conflict(rule.factors.size(), false), kept(rule.factors.size(), false);
  for (size_t i : visit) {
    // A moved input takes whatever order the kept ones agree on (its plan slices accordingly).
    if (c.in[i] != inputs[i].placements()) continue;
    if (static_cast<int64_t>(rule.inputs[i].size()) != inputs[i].ndim()) return {};
    for (size_t d = 0; d < rule.inputs[i].size(); ++d) {
      if (rule.inputs[i][d].empty()) continue;
      const int f = rule.inputs[i][d][0];
      std::vector<int64_t> mine;
      for (size_t m = 0; m < c.in[i].size(); ++m) {
        if (c.in[i][m].is_shard() && c.in[i][m].dim() == static_cast<int64_t>(d)) {
          mine.push_back(static_cast<int64_t>(m));
        }
      }
      if (mine.size() < 2) continue;
      mine = inputs[i].shard_order(static_cast<int64_t>(d));
      if (order[f].empty()) {
        order[f] = mine;
        kept[f] = written(i);
      } else if (order[f] != mine && !(kept[f] && !written(i))) {
        conflict[f] = true;  // (an unwritten input that disagrees with a written one is moved)
      }
    }
  }
  for (size_t f = 0; f < order.size(); ++f) {
    if (conflict[f] || std::is_sorted(order[f].begin(), order[f].end())) order[f].clear();
  }
  return order;
}

// The shard order of a tensor laid out by `placements` whose dims have the factors `dims`: the
// factor's order (factor_orders) where it is set and the dim is sharded by exactly its mesh dims,
// else ascending. Empty (the default) when no dim takes a factor's order.
ShardOrder order_of(const TensorFactors& dims, const Placements& placements,
                    const std::vector<std::vector<int64_t>>& orders) {
  if (orders.empty()) return {};
  ShardOrder out(dims.size());
  bool any = false;
  for (size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_any_shard()) continue;
    // A rule whose dims are not the tensor's (none should be): the default order.
    if (placements[m].dim() >= static_cast<int64_t>(dims.size())) return {};
    out[placements[m].dim()].push_back(static_cast<int64_t>(m));
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].empty() || orders[dims[d][0]].empty()) continue;
    std::vector<int64_t> theirs = orders[dims[d][0]];
    std::sort(theirs.begin(), theirs.end());
    if (theirs != out[d]) continue;
    out[d] = orders[dims[d][0]];
    any = true;
  }
  return any ? out : ShardOrder{};
}

// The candidate's input targets and plans, or null when a move is not allowed (a Partial(max)
// bias cannot join a Partial(sum) product) or its cost cannot beat `best`. `extra`: its cost
// besides the moves (extra_cost), `flops` its compute.
std::shared_ptr<OpSharding> priced(const std::string& op, const Rule& rule, const Candidate& c,
                                   const std::vector<DTensorSpec>& inputs,
                                   const std::vector<TensorMeta>& metas, const OpSharding* best,
                                   double extra, double flops, bool in_place) {
  const DeviceMesh& mesh = inputs[0].mesh();
  auto cand = std::make_shared<OpSharding>();
  cand->op = op;
  cand->cost = extra;
  cand->flops = flops;
  const auto orders = factor_orders(rule, c, inputs, in_place);  // NOTE [shard order through ops]
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ShardOrder order =
        i < rule.inputs.size() ? order_of(rule.inputs[i], c.in[i], orders) : ShardOrder{};
    cand->input_targets.push_back(DTensorSpec::make(mesh, c.in[i], metas[i], order));
  }
  if (best) {  // a bound that cannot beat the best skips the plan searches
    double bound = extra;
    for (size_t i = 0; i < inputs.size(); ++i) {
      bound += plan_cost_lower_bound(inputs[i], cand->input_targets[i],
                                     cost_model_for(inputs[i].mesh().device_type()));
    }
    if (bound >= best->cost) return nullptr;
  }
  PlanOptions internal;
  internal.allow_partial = true;  // a bias joins a Partial product by being partitioned
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto plan = try_plan_redistribute(inputs[i], cand->input_targets[i], internal);
    if (!plan) return nullptr;
    cand->cost += plan->cost;
    cand->input_plans.push_back(std::move(plan));
  }
  return cand;
}

// Strict mode: names the redistributes the caller must write.
void check_strict(const std::string& op, const OpSharding& best,
                  const std::vector<DTensorSpec>& inputs) {
  if (!best.needs_redistribute()) return;
  std::vector<std::string> what;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (best.input_plans[i]->is_noop()) continue;
    what.push_back(absl::StrCat("input ", i, ": ", to_string(inputs[i].placements()), " -> ",
                                to_string(best.input_targets[i].placements())));
  }
  fail("strict mode: ", op, " on ", specs_text(inputs), " needs implicit redistributes (",
       absl::StrJoin(what, "; "), "); call redistribute() on those inputs first");
}

// Advances the odometer `pick` over per_dim; false when every combination was visited.
bool next_pick(std::vector<size_t>& pick, const std::vector<std::vector<Choice>>& per_dim) {
  for (int64_t m = static_cast<int64_t>(pick.size()) - 1; m >= 0; --m) {
    if (++pick[m] < per_dim[m].size()) return true;
    pick[m] = 0;
  }
  return false;
}

// Whether output `o`'s rule shape agrees with ATen's: every dim, or with
// Rule::whole_output_sizes_from_aten the rank and the dims that have a shardable factor.
bool shapes_agree(const Rule& rule, size_t o, const std::vector<int64_t>& mine,
                  const std::vector<int64_t>& aten) {
  if (!rule.whole_output_sizes_from_aten) return mine == aten;
  if (mine.size() != aten.size()) return false;
  for (size_t d = 0; d < mine.size(); ++d) {
    const DimFactors& f = rule.outputs[o][d];
    const bool shardable = std::any_of(
        f.begin(), f.end(), [&](int k) { return rule.factors[k].kind != FactorKind::kReplicate; });
    if (shardable && mine[d] != aten[d]) return false;
  }
  return true;
}

// The outputs' metadata: ATen's (checked against the rule's shapes) when the caller can run the
// op on meta tensors, else the rule's (NOTE [output metadata from ATen]).
std::vector<TensorMeta> output_metas(const OpEntry& entry, const BuiltRule& built,
                                     const std::vector<DTensorSpec>& inputs,
                                     const OutputMetas* aten_metas) {
  const Rule& rule = built.rule;
  std::optional<std::vector<std::optional<TensorMeta>>> aten;
  if (aten_metas != nullptr && !rule.metadata_from_rule) aten = (*aten_metas)();
  DTENSOR_CHECK(!aten || aten->size() == rule.outputs.size(), "internal error: the rule of ",
                entry.name, " on ", specs_text(inputs), " gives ", rule.outputs.size(),
                " outputs, ATen's meta kernel ", aten->size(), " (rule ", rule.to_string(), ")");
  DTENSOR_CHECK(
      aten || !rule.whole_output_sizes_from_aten, entry.name, " on ", specs_text(inputs),
      ": its rule takes output sizes from ATen's meta kernel, which cannot run this call");
  std::vector<TensorMeta> out;
  for (size_t o = 0; o < rule.outputs.size(); ++o) {
    const std::vector<int64_t> shape = rule.output_shape(o);
    if (!aten || !(*aten)[o]) {
      out.push_back(TensorMeta::make(shape, built.out_dtypes.at(o)));
      continue;
    }
    DTENSOR_CHECK(shapes_agree(rule, o, shape, (*aten)[o]->shape), "internal error: the rule of ",
                  entry.name, " on ", specs_text(inputs), " gives output ", o, " the shape [",
                  absl::StrJoin(shape, ","), "], ATen's meta kernel [",
                  absl::StrJoin((*aten)[o]->shape, ","), "] (rule ", rule.to_string(), ")");
    out.push_back(std::move(*(*aten)[o]));
  }
  return out;
}

}  // namespace

std::shared_ptr<const OpSharding> compute(const OpEntry& entry,
                                          const std::vector<DTensorSpec>& inputs,
                                          const LayoutArgs& args, const PropagateOptions& opt,
                                          const OutputMetas* aten_metas) {
  std::vector<TensorMeta> metas;
  for (const auto& s : inputs) metas.push_back(s.meta());
  const BuiltRule built = checked_rule(entry, inputs, metas, args);
  if (built.run_replicated) {
    auto replicated = std::make_shared<OpSharding>();
    replicated->op = entry.name;
    replicated->run_replicated = true;
    return replicated;
  }
  const Rule& rule = built.rule;
  const std::vector<std::vector<Choice>> per_dim = choices_per_dim(entry, rule, inputs);
  const DeviceMesh& mesh = inputs[0].mesh();
  const double latency = cost_model_for(mesh.device_type()).step_cost(CommKind::kAllReduce, 2, 0);
  std::shared_ptr<OpSharding> best;
  Candidate best_layout;
  std::vector<size_t> pick(per_dim.size(), 0);
  do {
    Candidate c = candidate_at(per_dim, pick, rule, inputs.size(), mesh);
    if (!admissible(entry, rule, c, inputs)) continue;
    double flops = 0;
    const std::optional<double> extra = extra_cost(entry, built, c, mesh, &flops);
    if (!extra) continue;
    // A candidate that needs a collective costs at least one latency: once a cheaper one is
    // known, it cannot win (ties go to the earlier), so its plans are never searched.
    if (best && needs_collective(inputs, c.in) && latency + *extra >= best->cost) continue;
    auto cand =
        priced(entry.name, rule, c, inputs, metas, best.get(), *extra, flops, entry.in_place);
    if (cand && (!best || cand->cost < best->cost)) {
      best = std::move(cand);
      best_layout = std::move(c);
    }
  } while (next_pick(pick, per_dim));
  const bool writes = std::find(rule.written_inputs.begin(), rule.written_inputs.end(), true) !=
                      rule.written_inputs.end();
  if (best == nullptr && writes && !entry.in_place) {
    auto replicated = std::make_shared<OpSharding>();
    replicated->op = entry.name;
    replicated->rule = rule.to_string();
    replicated->run_replicated = true;
    return replicated;
  }
  if (best == nullptr && entry.in_place) {
    auto by_copy = std::make_shared<OpSharding>();
    by_copy->op = entry.name;
    by_copy->rule = rule.to_string();
    by_copy->in_place_by_copy = true;
    return by_copy;
  }
  DTENSOR_CHECK(best != nullptr, entry.name, " on ", specs_text(inputs),
                ": no sharding keeps the written inputs' placements; redistribute them first");
  std::vector<TensorMeta> out_metas = output_metas(entry, built, inputs, aten_metas);
  const auto orders =
      factor_orders(rule, best_layout, inputs, entry.in_place);  // NOTE [shard order through ops]
  for (size_t o = 0; o < rule.outputs.size(); ++o) {
    best->outputs.push_back(
        DTensorSpec::make(inputs[0].mesh(), best_layout.out[o], std::move(out_metas[o]),
                          order_of(rule.outputs[o], best_layout.out[o], orders)));
  }
  best->rule = rule.to_string();
  if (opt.strict) check_strict(entry.name, *best, inputs);
  return best;
}

}  // namespace dtensor::sharding::detail
