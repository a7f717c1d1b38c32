#include "sharding_prop/cross_mesh_plan.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <map>

#include "base/error.h"
#include "base/lru_cache.h"
#include "sharding_prop/cost_model.h"
#include "sharding_prop/redistribute_plan.h"

namespace dtensor {
namespace {

// The distinct boxes of `spec` (they partition the tensor) with the ranks holding each, in rank
// order; empty boxes left out.
std::map<std::vector<int64_t>, std::pair<LocalBox, std::vector<int64_t>>> boxes_of(
    const DTensorSpec& spec) {
  std::map<std::vector<int64_t>, std::pair<LocalBox, std::vector<int64_t>>> out;
  for (const int64_t r : spec.mesh().ranks()) {
    const LocalBox box = *local_box_of_rank(spec, r);
    if (box.numel() == 0) continue;
    auto& slot = out[box.offset];  // distinct boxes of a spec differ in their offsets
    slot.first = box;
    slot.second.push_back(r);
  }
  for (auto& [offset, entry] : out) std::sort(entry.second.begin(), entry.second.end());
  return out;
}

CrossMeshPlan compute_plan(const DTensorSpec& src, const DTensorSpec& dst) {
  CrossMeshPlan plan{src, without_partial(src), dst, {}, {}, 0, 0};
  std::vector<int64_t> ranks = src.mesh().ranks();
  ranks.insert(ranks.end(), dst.mesh().ranks().begin(), dst.mesh().ranks().end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  plan.ranks = ranks;
  const auto sources = boxes_of(plan.src_reduced);
  const int64_t item = static_cast<int64_t>(c10::elementSize(src.meta().dtype));
  std::map<int64_t, int64_t> received;
  std::vector<int64_t> dst_ranks = dst.mesh().ranks();
  std::sort(dst_ranks.begin(), dst_ranks.end());
  for (const int64_t to : dst_ranks) {
    const LocalBox want = *local_box_of_rank(dst, to);
    if (want.numel() == 0) continue;
    for (const auto& [offset, entry] : sources) {
      const LocalBox part = intersect(want, entry.first);
      if (part.numel() == 0) continue;
      const std::vector<int64_t>& holders = entry.second;
      const bool own = std::binary_search(holders.begin(), holders.end(), to);
      const int64_t from = own ? to : holders[to % static_cast<int64_t>(holders.size())];
      plan.moves.push_back({from, to, part});
      if (from != to) received[to] += part.numel() * item;
    }
  }
  for (const auto& [rank, bytes] : received) plan.max_bytes = std::max(plan.max_bytes, bytes);
  if (src.has_partial()) plan.cost += plan_redistribute(src, plan.src_reduced)->cost;
  if (plan.max_bytes > 0) {
    plan.cost +=
        cost_model_for(src.mesh().device_type())
            .step_cost(CommKind::kAllToAllV, static_cast<int64_t>(ranks.size()), plan.max_bytes);
  }
  return plan;
}

struct CacheKey {
  DTensorSpec src;
  DTensorSpec dst;
  friend bool operator==(const CacheKey& a, const CacheKey& b) {
    return a.src == b.src && a.dst == b.dst;
  }
  template <typename H>
  friend H AbslHashValue(H h, const CacheKey& k) {
    return H::combine(std::move(h), k.src.hash(), k.dst.hash());
  }
};

// Plans are pure functions of their key (NOTE [caches]).
LruCache<CacheKey, CrossMeshPlan>& plan_cache() {
  static auto* cache = new LruCache<CacheKey, CrossMeshPlan>(4096);
  return *cache;
}

std::string box_text(const LocalBox& b) {
  std::vector<std::string> dims;
  for (size_t d = 0; d < b.shape.size(); ++d) {
    dims.push_back(absl::StrCat(b.offset[d], ":", b.offset[d] + b.shape[d]));
  }
  return "[" + absl::StrJoin(dims, ",") + "]";
}

}  // namespace

std::shared_ptr<const CrossMeshPlan> plan_cross_mesh(const DTensorSpec& src,
                                                     const DTensorSpec& dst) {
  const CacheKey key{src, dst};
  if (auto hit = plan_cache().find(key)) return hit;
  DTENSOR_CHECK(src.meta() == dst.meta(), "redistribute to another mesh: ", src.to_string(),
                " and ", dst.to_string(), " describe different tensors (", src.meta().to_string(),
                " vs ", dst.meta().to_string(), ")");
  DTENSOR_CHECK(!src.has_strided_shard() && !dst.has_strided_shard(),
                "redistribute to another mesh: ", src.to_string(), " -> ", dst.to_string(),
                ": a plan moves boxes, and a general strided shard's pieces are not boxes "
                "(redistribute_across_meshes goes through Replicate on its mesh dims)");
  DTENSOR_CHECK(!dst.has_partial(), "redistribute to another mesh: ", src.to_string(), " -> ",
                dst.to_string(),
                ": the target has a Partial; as in PyTorch, Partial comes only from operators");
  DTENSOR_CHECK(src.mesh().device_type() == dst.mesh().device_type(),
                "redistribute to another mesh: ", src.mesh().to_string(), " and ",
                dst.mesh().to_string(), " are on different device types");
  return plan_cache().insert(key, std::make_shared<const CrossMeshPlan>(compute_plan(src, dst)));
}

std::string CrossMeshPlan::to_string() const {
  std::string out =
      absl::StrCat("cross-mesh redistribute ", src.to_string(), " -> ", dst.to_string(),
                   " over ranks [", absl::StrJoin(ranks, ","), "], cost ", cost, " us\n  from ",
                   src.mesh().to_string(), "\n  to   ", dst.mesh().to_string(), "\n");
  if (src_reduced != src) {
    absl::StrAppend(&out, "  reduce on the source mesh: ", src.to_string(), " -> ",
                    src_reduced.to_string(), "\n");
  }
  const int64_t item = static_cast<int64_t>(c10::elementSize(src.meta().dtype));
  for (const Move& m : moves) {
    absl::StrAppend(&out, "  rank ", m.from, " -> rank ", m.to, ": ", box_text(m.box), " (",
                    m.box.numel() * item, " bytes", m.from == m.to ? ", local copy" : "", ")\n");
  }
  if (moves.empty()) absl::StrAppend(&out, "  nothing moves\n");
  return out;
}

}  // namespace dtensor
