// NOTE [redistribute planning] in redistribute_plan.h: the planner's step pricing, its exact
// search and the plan cache. The step kinds (strided shards' gathers and local cuts among them)
// and the search share the file's state types: one file just past the 600-line guideline
// (docs/architecture.md, "File size"); the cost model itself lives in cost_model.cc.

#include "sharding_prop/redistribute_plan.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/lru_cache.h"
#include "layout/shard_layout.h"

namespace dtensor {
namespace {

// Above this many ranks the all_to_all_v step is not considered (pricing it compares every pair
// of ranks); the single-dim steps still plan any mesh.
constexpr int64_t kMaxRanksForExchange = 64;

int64_t element_size(const DTensorSpec& s) {
  return static_cast<int64_t>(c10::elementSize(s.meta().dtype));
}

// The largest local piece any rank holds, per dim (the rank at coordinate 0 holds it).
std::vector<int64_t> max_local_shape(const DTensorSpec& s) {
  std::vector<int64_t> shape = s.shape();
  for (int64_t d = 0; d < s.ndim(); ++d) {
    for (int64_t m : s.shard_order(d)) {
      const int64_t sf = s.placement(m).split_factor(), n = s.mesh().shape()[m];
      shape[d] = sf > 1 ? strided_size(shape[d], sf, n, 0) : chunk_size(shape[d], n);
    }
  }
  return shape;
}

// Whether some mesh dim of `s` holds a strided shard of tensor dim `d`: no other mesh dim may
// then shard d (NOTE [strided shards]), so the planner makes no such layout.
bool strided_on(const DTensorSpec& s, int64_t d) {
  if (!s.has_strided_shard()) return false;
  for (const Placement& p : s.placements()) {
    if (p.is_strided_shard(d)) return true;
  }
  return false;
}

int64_t bytes_of(const std::vector<int64_t>& shape, const DTensorSpec& s) {
  int64_t numel = 1;
  for (int64_t v : shape) numel *= v;
  return numel * element_size(s);
}

// Whether mesh dim `m` splits tensor dim `d` of `s` evenly for every rank (the pieces it splits
// depend on the coordinates along the mesh dims that split d before it).
bool split_even(const DTensorSpec& s, int64_t d, int64_t m) {
  std::set<int64_t> pieces{s.shape()[d]};
  for (int64_t k : s.shard_order(d)) {
    const int64_t n = s.mesh().shape()[k];
    if (k == m) {
      return std::all_of(pieces.begin(), pieces.end(), [n](int64_t p) { return p % n == 0; });
    }
    std::set<int64_t> next;
    for (int64_t p : pieces) {
      for (int64_t size : chunk_sizes(p, n)) next.insert(size);
    }
    pieces = std::move(next);
  }
  return true;
}

bool is_innermost(const DTensorSpec& s, int64_t d, int64_t m) {
  const auto& order = s.shard_order(d);
  return !order.empty() && order.back() == m;
}

// `s` with mesh dim m changed to `to`: m leaves the order of the dim it sharded and, for a Shard,
// becomes the innermost splitter of the new dim.
DTensorSpec with_placement(const DTensorSpec& s, int64_t m, Placement to) {
  Placements p = s.placements();
  ShardOrder order = s.shard_order();
  if (p[m].is_any_shard()) {
    auto& o = order[p[m].dim()];
    o.erase(std::find(o.begin(), o.end(), m));
  }
  p[m] = to;
  if (to.is_any_shard()) order[to.dim()].push_back(m);
  return DTensorSpec::make(s.mesh(), p, s.meta(), order);
}

// A compact key of the layout `x` would have with mesh dim m set to `to` (with_placement's
// result, without interning it): lets the search skip edges into finished layouts cheaply.
std::string layout_key(const DTensorSpec& x, int64_t m, Placement to) {
  std::string key;
  const int64_t n = x.mesh().ndim();
  key.reserve(3 * n + 2 * x.ndim() + n);
  for (int64_t k = 0; k < n; ++k) {
    const Placement p = k == m ? to : x.placement(k);
    key += static_cast<char>(p.kind());
    key += static_cast<char>(p.dim());
    key += static_cast<char>(p.reduce_op());
    key += static_cast<char>(p.split_factor() & 0xff);
    key += static_cast<char>(p.split_factor() >> 8);
  }
  const Placement from = m >= 0 ? x.placement(m) : Placement();
  for (int64_t d = 0; d < x.ndim(); ++d) {
    for (int64_t k : x.shard_order(d)) {
      if (!(k == m && from.is_any_shard(d))) key += static_cast<char>(k);
    }
    if (m >= 0 && to.is_any_shard(d)) key += static_cast<char>(m);
    key += '|';
  }
  return key;
}

int64_t volume(const LocalBox& a, const LocalBox& b) {  // of the intersection
  int64_t v = 1;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return 0;
    v *= hi - lo;
  }
  return v;
}

// The mesh dims an all_to_all_v from `x` to `t` must span, or empty when it does not apply.
std::vector<int64_t> exchange_dims(const DTensorSpec& x, const DTensorSpec& t) {
  if (x.has_strided_shard() || t.has_strided_shard()) return {};  // pieces that are not boxes
  std::set<int64_t> g;
  for (int64_t m = 0; m < x.mesh().ndim(); ++m) {
    if (x.placement(m) != t.placement(m)) g.insert(m);
  }
  for (int64_t d = 0; d < x.ndim(); ++d) {
    if (x.shard_order(d) == t.shard_order(d)) continue;
    g.insert(x.shard_order(d).begin(), x.shard_order(d).end());
    g.insert(t.shard_order(d).begin(), t.shard_order(d).end());
  }
  if (g.size() < 2) return {};  // one mesh dim: the named collectives do it
  for (int64_t m : g) {
    if (!x.placement(m).is_shard()) return {};
    if (t.placement(m).is_partial()) return {};
  }
  return {g.begin(), g.end()};
}

struct ExchangePrice {
  bool ok = false;
  int64_t recv_bytes = 0;  // the most any rank receives from others
  int64_t copy_bytes = 0;  // the most any rank packs and unpacks
};

// What every exchange pricing of one search shares: each rank's coordinate and target box.
struct ExchangeContext {
  std::vector<std::vector<int64_t>> coords;
  std::vector<LocalBox> after;
};

ExchangeContext exchange_context(const DTensorSpec& t) {
  ExchangeContext c;
  const DeviceMesh& mesh = t.mesh();
  if (mesh.size() > kMaxRanksForExchange) return c;
  for (int64_t r : mesh.ranks()) {
    c.coords.push_back(*mesh.coordinate(r));
    c.after.push_back(local_box(t, c.coords.back()));
  }
  return c;
}

// Checks that within every group (ranks differing only along `g`) the source boxes cover each
// target box, and measures the traffic.
ExchangePrice price_exchange(const DTensorSpec& x, const ExchangeContext& ctx,
                             const std::vector<int64_t>& g) {
  ExchangePrice price;
  const int64_t world = static_cast<int64_t>(ctx.coords.size());
  if (world == 0) return price;  // past kMaxRanksForExchange
  const DeviceMesh& mesh = x.mesh();
  std::vector<LocalBox> before(world);
  std::vector<int64_t> group_of(world);  // row-major index of the coordinates outside g
  for (int64_t i = 0; i < world; ++i) {
    before[i] = local_box(x, ctx.coords[i]);
    int64_t key = 0;
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      const bool in_g = std::find(g.begin(), g.end(), m) != g.end();
      key = key * mesh.shape()[m] + (in_g ? 0 : ctx.coords[i][m]);
    }
    group_of[i] = key;
  }
  const int64_t isz = element_size(x);
  for (int64_t r = 0; r < world; ++r) {
    int64_t got = 0, sent = 0;
    for (int64_t s = 0; s < world; ++s) {
      if (group_of[s] != group_of[r]) continue;
      got += volume(before[s], ctx.after[r]);
      if (s != r) sent += volume(before[r], ctx.after[s]);
    }
    if (got != ctx.after[r].numel()) return price;  // not covered: needs other ranks' data
    const int64_t from_others = got - volume(before[r], ctx.after[r]);
    price.recv_bytes = std::max(price.recv_bytes, from_others * isz);
    price.copy_bytes = std::max(price.copy_bytes, (from_others + sent) * isz);
  }
  price.ok = true;
  return price;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  return "[" + absl::StrJoin(dims, ",") + "]";
}

}  // namespace

std::optional<std::string> plan_refusal(const DTensorSpec& src, const DTensorSpec& dst,
                                        const PlanOptions& options) {
  const std::string head = absl::StrCat("redistribute ", to_string(src.placements()), " -> ",
                                        to_string(dst.placements()), ": ");
  if (src.mesh() != dst.mesh()) {
    return absl::StrCat(head, "source and target meshes differ (", src.mesh().to_string(), " vs ",
                        dst.mesh().to_string(), "); a redistribute stays on one mesh");
  }
  if (src.meta() != dst.meta()) {
    return absl::StrCat(head, "source and target describe different tensors (",
                        src.meta().to_string(), " vs ", dst.meta().to_string(), ")");
  }
  // PyTorch's words ("Can not redistribute from R to P(sum), redistributing to Partial is for
  // internal use only!"), which its tests and users match, then the engine's detail.
  for (int64_t m = 0; m < src.mesh().ndim(); ++m) {
    const Placement a = src.placement(m), b = dst.placement(m);
    if (!b.is_partial() || a == b) continue;
    if (a.is_partial() || !options.allow_partial) {
      return absl::StrCat("Can not redistribute from ", a.to_string(), " to ", b.to_string(),
                          ", redistributing to Partial is for internal use only! (", head,
                          "mesh dim ", m, ": ",
                          a.is_partial() ? "a Partial cannot change its reduce op; redistribute "
                                           "to Replicate() first"
                                         : "Partial comes only from operators, never from a "
                                           "redistribute",
                          ")");
    }
  }
  return std::nullopt;
}

namespace {

struct Node {
  DTensorSpec spec;
  double cost;
  int64_t parent;             // index into the node table, -1 for the source
  std::vector<PlanStep> via;  // the step from the parent (empty for the source)
  bool done = false;
};

}  // namespace

std::string PlanStep::to_string() const {
  std::string s(comm_kind_name(kind));
  if (kind == CommKind::kAllToAllV) {
    s += "(mesh_dims=" + dims_text(mesh_dims) + ", " + dtensor::to_string(before.placements()) +
         "->" + dtensor::to_string(after.placements());
  } else {
    s += "(mesh_dim=" + std::to_string(mesh_dims.at(0)) + ", " + from.to_string() + "->" +
         to.to_string();
  }
  if (padded) s += ", padded";
  return s + ")";
}

int64_t RedistributePlan::num_collectives() const {
  return std::count_if(steps.begin(), steps.end(), [](const PlanStep& s) {
    return s.kind != CommKind::kLocalChunk && s.kind != CommKind::kPartition;
  });
}

std::string RedistributePlan::to_string() const {
  std::vector<int64_t> mesh_shape = src.mesh().shape();
  std::string s = dtensor::to_string(src.placements()) + " -> " +
                  dtensor::to_string(dst.placements()) + " on mesh (" +
                  absl::StrJoin(mesh_shape, ",") + ") shape [" + absl::StrJoin(src.shape(), ",") +
                  "]";
  if (!src.has_default_shard_order() || !dst.has_default_shard_order()) {
    s += " (orders " + src.to_string() + " -> " + dst.to_string() + ")";
  }
  s += ":";
  if (steps.empty()) return s + " no-op";
  for (size_t i = 0; i < steps.size(); ++i) s += (i ? "; " : " ") + steps[i].to_string();
  return s;
}

double plan_cost_lower_bound(const DTensorSpec& src, const DTensorSpec& dst,
                             const CostModel& model) {
  const DeviceMesh& mesh = src.mesh();
  bool comm = false;
  for (int64_t m = 0; m < mesh.ndim() && !comm; ++m) {
    const Placement p = src.placement(m);
    comm = mesh.shape()[m] > 1 && !p.is_replicate() && p != dst.placement(m);
  }
  if (!comm) return 0.0;
  const double latency = model.step_cost(CommKind::kAllReduce, 2, 0);
  if (mesh.size() > kMaxRanksForExchange || src.mesh() != dst.mesh() || src.has_strided_shard() ||
      dst.has_strided_shard()) {
    return latency;  // (boxes measure what a rank lacks; a strided shard's piece is not one)
  }
  int64_t lacking = 0;
  for (int64_t r : mesh.ranks()) {
    const auto coord = *mesh.coordinate(r);
    const LocalBox want = local_box(dst, coord);
    lacking = std::max(lacking, want.numel() - volume(local_box(src, coord), want));
  }
  // A step prices the bytes of its largest piece with nccl-tests' factors; a rank receives at
  // most that when every split is even, and at most n/(n-1) <= 2 times that when a split is
  // uneven (a short piece receives more of the gathered whole). Every layout of this shape on
  // this mesh is even when each dim divides by the number of ranks.
  bool all_even = true;
  for (int64_t s : src.shape()) all_even = all_even && s % mesh.size() == 0;
  const double per_byte = (all_even ? 1.0 : 0.5) / (model.bandwidth_gbs * 1e3);
  return latency + static_cast<double>(lacking * element_size(src)) * per_byte;
}

PlanStep price_step(const DTensorSpec& x, int64_t m, Placement to, const CostModel& model) {
  const Placement from = x.placement(m);
  CommKind kind;
  if (from.is_strided_shard() && to.is_replicate()) {
    kind = CommKind::kAllGather;  // then a local reorder (NOTE [strided shards])
  } else if (from.is_replicate() && to.is_strided_shard()) {
    kind = CommKind::kLocalChunk;  // a local gather of the rank's runs
  } else if (from.is_shard() && to.is_replicate()) {
    kind = CommKind::kAllGather;
  } else if (from.is_shard() && to.is_shard()) {
    kind = CommKind::kAllToAll;
  } else if (from.is_partial() && to.is_replicate()) {
    kind = CommKind::kAllReduce;
  } else if (from.is_partial() && to.is_shard()) {
    kind = CommKind::kReduceScatter;
  } else if (from.is_replicate() && to.is_shard()) {
    kind = CommKind::kLocalChunk;
  } else if (from.is_replicate() && to.is_partial()) {
    kind = CommKind::kPartition;
  } else {
    throw Error("redistribute: no single step turns " + from.to_string() + " into " +
                to.to_string() + " on mesh dim " + std::to_string(m));
  }
  PlanStep step{kind, {m}, from, to, x, with_placement(x, m, to)};
  const int64_t n = x.mesh().shape()[m];
  // Bytes as the executor passes them to the collective on the rank holding the largest piece
  // (padding included), so they equal what a comm counter sees there.
  std::vector<int64_t> shape = max_local_shape(x);
  switch (kind) {
    case CommKind::kAllGather:  // gathers uneven pieces exactly: never pads
      shape = max_local_shape(step.after);
      break;
    case CommKind::kAllToAll:
      step.padded = !split_even(x, from.dim(), m) || !split_even(step.after, to.dim(), m);
      if (step.padded) shape[to.dim()] = chunk_size(shape[to.dim()], n) * n;
      break;
    case CommKind::kReduceScatter:
      step.padded = !split_even(step.after, to.dim(), m);
      if (step.padded) shape[to.dim()] = chunk_size(shape[to.dim()], n) * n;
      break;
    case CommKind::kLocalChunk:
    case CommKind::kPartition:
      shape = max_local_shape(step.after);
      break;
    default:
      break;
  }
  if (n == 1) step.padded = false;
  step.bytes = bytes_of(shape, x);
  step.cost = model.step_cost(kind, n, step.bytes);
  return step;
}

namespace {

// The A* search of compute_plan over layouts (NOTE [redistribute planning]), one node a layout.
class PlanSearch {
 public:
  PlanSearch(const DTensorSpec& src, const DTensorSpec& dst, const PlanOptions& options,
             const CostModel& model)
      : src_(src),
        dst_(dst),
        options_(options),
        model_(model),
        mesh_(src.mesh()),
        latency_(model.step_cost(CommKind::kAllReduce, 2, 0)),
        exchange_(exchange_context(dst)) {
    // Tensor dims worth sharding along the way: those sharded at either end (a detour through
    // another dim never moves less data).
    for (const auto& x : {src, dst}) {
      for (const Placement& p : x.placements()) {
        if (p.is_shard()) dims_.insert(p.dim());
      }
    }
  }

  // The cheapest steps from src to dst, in order.
  std::vector<PlanStep> run() {
    nodes_.push_back(Node{src_, 0.0, -1, {}});
    index_.emplace(src_, 0);
    queue_.emplace(0.0, pushes_++, 0);
    while (!queue_.empty()) {
      const auto [priority, order, at] = queue_.top();
      queue_.pop();
      if (nodes_[at].done || priority > nodes_[at].cost + remaining(nodes_[at].spec)) continue;
      nodes_[at].done = true;
      const DTensorSpec x = nodes_[at].spec;
      finished_.insert(layout_key(x, -1, Placement()));
      if (x == dst_) break;
      expand_single_dim_steps(at, x);
      expand_exchange(at, x);
    }
    return path();
  }

 private:
  // A consistent lower bound on the cost still to pay: each Partial that must go needs its own
  // collective (all_reduce or reduce_scatter on its mesh dim), and a Shard that must change
  // needs at least one collective; anything else may be free. Mesh dims of size 1 cost nothing.
  // The search stays exact (the bound never exceeds a true remaining cost, and drops by at most
  // one step's cost per step) and explores far fewer layouts.
  double remaining(const DTensorSpec& x) const {
    int64_t partials = 0;
    bool shard_moves = false;
    for (int64_t m = 0; m < mesh_.ndim(); ++m) {
      const Placement p = x.placement(m);
      if (mesh_.shape()[m] == 1 || p == dst_.placement(m)) continue;
      if (p.is_partial()) ++partials;
      if (p.is_any_shard()) shard_moves = true;
    }
    return latency_ * static_cast<double>(std::max<int64_t>(partials, shard_moves ? 1 : 0));
  }

  void relax(int64_t from, PlanStep step) {
    const double cost = nodes_[from].cost + step.cost;
    const DTensorSpec to = step.after;
    auto it = index_.find(to);
    if (it != index_.end()) {
      Node& n = nodes_[it->second];
      if (n.done || cost >= n.cost) return;
      n.cost = cost;
      n.parent = from;
      n.via = {std::move(step)};
      queue_.emplace(cost + remaining(to), pushes_++, it->second);
      return;
    }
    index_.emplace(to, static_cast<int64_t>(nodes_.size()));
    nodes_.push_back(Node{to, cost, from, {std::move(step)}});
    queue_.emplace(cost + remaining(to), pushes_++, static_cast<int64_t>(nodes_.size()) - 1);
  }

  void edge(int64_t from, const DTensorSpec& x, int64_t m, Placement to) {
    if (finished_.count(layout_key(x, m, to)) > 0) return;  // no cheaper way into a done node
    relax(from, price_step(x, m, to, model_));
  }

  // Steps on one mesh dim (the table of NOTE [redistribute planning]).
  void expand_single_dim_steps(int64_t at, const DTensorSpec& x) {
    // A strided shard (NOTE [strided shards]) leaves only to Replicate, is made only from it
    // where the target has it, and no mesh dim joins it in sharding its tensor dim.
    for (int64_t m = 0; m < mesh_.ndim(); ++m) {
      const Placement p = x.placement(m);
      const auto shard_edges = [&](int64_t skip) {
        for (int64_t e : dims_) {
          if (e != skip && !strided_on(x, e)) edge(at, x, m, Shard(e));
        }
      };
      if (p.is_strided_shard()) {
        edge(at, x, m, Replicate());
      } else if (p.is_shard()) {
        if (!is_innermost(x, p.dim(), m)) continue;
        edge(at, x, m, Replicate());
        shard_edges(p.dim());
      } else if (p.is_replicate()) {
        shard_edges(-1);
        const Placement want = dst_.placement(m);
        if (want.is_strided_shard() && x.shard_order(want.dim()).empty()) edge(at, x, m, want);
        if (options_.allow_partial && want.is_partial()) edge(at, x, m, want);
      } else {  // Partial
        edge(at, x, m, Replicate());
        shard_edges(-1);
      }
    }
  }

  // The one multi-dim step: all_to_all_v straight to dst over the mesh dims that differ.
  void expand_exchange(int64_t at, const DTensorSpec& x) {
    const auto g = exchange_dims(x, dst_);
    if (g.empty()) return;
    const ExchangePrice price = price_exchange(x, exchange_, g);
    if (!price.ok) return;
    int64_t group = 1;
    for (int64_t m : g) group *= mesh_.shape()[m];
    PlanStep step{CommKind::kAllToAllV, g, x.placement(g[0]), dst_.placement(g[0]), x, dst_};
    step.bytes = price.recv_bytes;
    step.cost = model_.step_cost(CommKind::kAllToAllV, group, price.recv_bytes) +
                model_.step_cost(CommKind::kLocalChunk, 1, price.copy_bytes);
    relax(at, std::move(step));
  }

  std::vector<PlanStep> path() const {
    auto it = index_.find(dst_);
    TORCH_INTERNAL_ASSERT(it != index_.end() && nodes_[it->second].done,
                          "redistribute planner found no plan from ", src_.to_string(), " to ",
                          dst_.to_string(), " (every allowed move has one)");
    std::vector<PlanStep> steps;
    for (int64_t i = it->second; nodes_[i].parent >= 0; i = nodes_[i].parent) {
      steps.push_back(nodes_[i].via.at(0));
    }
    std::reverse(steps.begin(), steps.end());
    return steps;
  }

  using Item = std::tuple<double, int64_t, int64_t>;  // cost, push order, node
  const DTensorSpec& src_;
  const DTensorSpec& dst_;
  const PlanOptions& options_;
  const CostModel& model_;
  const DeviceMesh& mesh_;
  const double latency_;
  const ExchangeContext exchange_;
  std::set<int64_t> dims_;
  std::vector<Node> nodes_;
  std::unordered_map<DTensorSpec, int64_t> index_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_;
  int64_t pushes_ = 0;
  std::unordered_set<std::string> finished_;  // layout_key of every done node
};

}  // namespace

// `spec` with every size-1 mesh dim Replicate (NOTE [size-1 mesh dims]); unchanged when it has a
// non-default shard order (the order names mesh dims).
DTensorSpec without_size1_mesh_dims(const DTensorSpec& spec) {
  const auto& shape = spec.mesh().shape();
  if (!spec.has_default_shard_order() ||
      std::none_of(shape.begin(), shape.end(), [](int64_t n) { return n == 1; })) {
    return spec;
  }
  Placements p = spec.placements();
  for (size_t m = 0; m < p.size(); ++m) {
    if (shape[m] == 1) p[m] = Replicate();
  }
  return DTensorSpec::make(spec.mesh(), p, spec.meta());
}

RedistributePlan compute_plan(DTensorSpec src, DTensorSpec dst, const PlanOptions& options,
                              const CostModel& model) {
  if (auto why = plan_refusal(src, dst, options)) fail(*why);
  RedistributePlan plan{src, dst, {}, 0.0};
  if (src == dst) return plan;
  // NOTE [size-1 mesh dims]: a mesh dim of size 1 splits nothing and reduces nothing, so a rank's
  // piece is the same data whatever that dim's placement is (Shard: a chunk of one is the whole;
  // Partial over one rank: the value itself). Plans compare and search layouts with those dims
  // read as Replicate, so changes on them alone are no-ops and never issue a collective.
  const DTensorSpec from = without_size1_mesh_dims(src), to = without_size1_mesh_dims(dst);
  if (from == to) return plan;
  plan.steps = PlanSearch(from, to, options, model).run();
  for (const PlanStep& s : plan.steps) plan.cost += s.cost;
  return plan;
}

namespace {

struct CacheKey {
  DTensorSpec src, dst;
  bool allow_partial;
  friend bool operator==(const CacheKey& a, const CacheKey& b) {
    return a.src == b.src && a.dst == b.dst && a.allow_partial == b.allow_partial;
  }
  template <typename H>
  friend H AbslHashValue(H h, const CacheKey& k) {
    return H::combine(std::move(h), k.src.hash(), k.dst.hash(), k.allow_partial);
  }
};

// Plans are pure functions of their key (NOTE [caches]); 16384 covers every pair of the layouts
// a model uses many times over.
constexpr size_t kPlanCacheCapacity = 16384;

LruCache<CacheKey, RedistributePlan>& plan_cache() {
  static auto* cache = new LruCache<CacheKey, RedistributePlan>(kPlanCacheCapacity);
  return *cache;
}

}  // namespace

std::shared_ptr<const RedistributePlan> try_plan_redistribute(const DTensorSpec& src,
                                                              const DTensorSpec& dst,
                                                              PlanOptions options) {
  const CacheKey key{src, dst, options.allow_partial};
  if (auto hit = plan_cache().find(key)) return hit;
  if (plan_refusal(src, dst, options)) return nullptr;
  return plan_cache().insert(
      key, std::make_shared<const RedistributePlan>(
               compute_plan(src, dst, options, cost_model_for(src.mesh().device_type()))));
}

std::shared_ptr<const RedistributePlan> plan_redistribute(DTensorSpec src, DTensorSpec dst,
                                                          PlanOptions options) {
  if (auto plan = try_plan_redistribute(src, dst, options)) return plan;
  fail(*plan_refusal(src, dst, options));
}

CacheStats plan_cache_stats() { return plan_cache().stats(); }

}  // namespace dtensor
