#include "layout/dtensor_spec.h"

#include <absl/hash/hash.h>

#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>

#include "base/error.h"

namespace dtensor {
namespace {

using Data = DTensorSpec::Data;

// Interning table: hash -> entries with that hash (collisions are rare; the vector is tiny).
struct InternTable {
  absl::Mutex mu;
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<const Data>>> entries ABSL_GUARDED_BY(mu);
  size_t count ABSL_GUARDED_BY(mu) = 0;
};

InternTable& table() {
  static InternTable* t = new InternTable();  // never destroyed: specs outlive static teardown
  return *t;
}

bool same_layout(const Data& a, const Data& b) {
  return a.mesh == b.mesh && a.placements == b.placements && a.meta == b.meta &&
         a.shard_order == b.shard_order;
}

size_t hash_of(const Data& d) {
  size_t h = absl::HashOf(d.mesh.hash(), d.meta.hash(), d.shard_order);
  for (const Placement& p : d.placements) h = absl::HashOf(h, p.hash());
  return h;
}

// dtensor::fail with the class name in front.
template <typename... Args>
[[noreturn]] void fail_spec(const Args&... parts) {
  fail("DTensorSpec: ", parts...);
}

std::string mesh_text(const DeviceMesh& mesh) {
  std::string out = "(";
  for (size_t i = 0; i < mesh.shape().size(); ++i) {
    out += (i ? "," : "") + std::to_string(mesh.shape()[i]);
  }
  return out + ")";
}

// Turns every strided shard in box form (NOTE [strided shards]) into a plain Shard and returns
// the shard order they give (empty when there is none). Each tensor dim's order is built from
// the last mesh dim to the first: a plain Shard goes in front (it splits before the mesh dims to
// its right), a strided shard at the back (the mesh dims to its right split first), which it may
// only when its split factor is the product of their sizes. Other strided shards stay.
ShardOrder canonicalise_strided(Data& data) {
  Placements& p = data.placements;
  if (std::none_of(p.begin(), p.end(), [](Placement x) { return x.is_strided_shard(); })) {
    return {};
  }
  ShardOrder order(data.meta.ndim());
  std::vector<int64_t> general;
  bool changed = false;
  for (int64_t m = static_cast<int64_t>(p.size()) - 1; m >= 0; --m) {
    if (!p[m].is_any_shard()) continue;
    std::vector<int64_t>& o = order[p[m].dim()];
    if (p[m].is_shard()) {
      o.insert(o.begin(), m);
      continue;
    }
    int64_t right = 1;
    for (int64_t k : o) right *= data.mesh.size(k);
    if (right != p[m].split_factor()) {
      general.push_back(m);  // the general form: canonicalise_order checks it is alone
      continue;
    }
    o.push_back(m);
    p[m] = Shard(p[m].dim());
    changed = true;
  }
  if (!changed) return {};  // nothing became a Shard with an order
  for (int64_t m : general) order[p[m].dim()].push_back(m);
  return order;
}

// Fills `data.shard_order` from the placements, checking a user-given order against them.
void canonicalise_order(Data& data, const ShardOrder& given_order) {
  const ShardOrder strided_order = canonicalise_strided(data);
  const int64_t ndim = data.meta.ndim();
  ShardOrder order(ndim);
  for (size_t m = 0; m < data.placements.size(); ++m) {
    if (data.placements[m].is_any_shard()) order[data.placements[m].dim()].push_back(m);
  }
  for (size_t m = 0; m < data.placements.size(); ++m) {
    const Placement p = data.placements[m];
    if (!p.is_strided_shard()) continue;
    data.strided = true;
    if (order[p.dim()].size() > 1) {
      fail_spec(to_string(data.placements), " on mesh ", mesh_text(data.mesh), ": ", p.to_string(),
                " on mesh dim ", m, " shards tensor dim ", p.dim(),
                " together with other mesh dims, and no shard order expresses its split factor ",
                p.split_factor(),
                " (a strided shard in box form has the product of the sizes of the mesh dims to "
                "its right that shard the same dim); a general strided shard must be the only "
                "mesh dim sharding its tensor dim");
    }
  }
  const ShardOrder& given = given_order.empty() ? strided_order : given_order;
  if (!given_order.empty() && !strided_order.empty() && given_order != strided_order) {
    fail_spec("the shard order given disagrees with the one the strided shards of ",
              to_string(data.placements), " give");
  }
  data.default_order = true;
  if (!given.empty()) {
    if (static_cast<int64_t>(given.size()) != ndim) {
      fail_spec("shard order has " + std::to_string(given.size()) + " entries for a " +
                std::to_string(ndim) + "-D tensor");
    }
    for (int64_t d = 0; d < ndim; ++d) {
      std::vector<int64_t> sorted = given[d];
      std::sort(sorted.begin(), sorted.end());
      if (sorted != order[d]) {
        fail_spec("shard order for tensor dim " + std::to_string(d) +
                  " must list exactly the mesh dims that shard it under " +
                  to_string(data.placements));
      }
      if (given[d] != order[d]) data.default_order = false;
    }
    order = given;
  }
  data.shard_order = std::move(order);
}

}  // namespace

DTensorSpec DTensorSpec::make(const DeviceMesh& mesh, const Placements& placements,
                              const TensorMeta& meta, const ShardOrder& shard_order) {
  if (static_cast<int64_t>(placements.size()) != mesh.ndim()) {
    fail_spec(std::to_string(placements.size()) + " placements " + dtensor::to_string(placements) +
              " for a " + std::to_string(mesh.ndim()) + "-D mesh; give one placement per mesh dim");
  }
  Data data{mesh, placements, TensorMeta::make(meta.shape, meta.dtype, meta.stride),
            {},   true,       false,
            0,    0};
  for (Placement& p : data.placements) {
    if (p.is_partial() && is_bitwise(p.reduce_op()) &&
        !c10::isIntegralType(meta.dtype, /*includeBool=*/true)) {
      fail_spec(p.to_string() + " needs an integer or bool tensor, not " +
                std::string(c10::toString(meta.dtype)));
    }
    if (p.is_shard()) {
      p = Shard(static_cast<int32_t>(normalize_tensor_dim(p.dim(), meta.ndim(), "Shard dim")));
    } else if (p.is_strided_shard()) {
      p = StridedShard(
          static_cast<int32_t>(normalize_tensor_dim(p.dim(), meta.ndim(), "_StridedShard dim")),
          p.split_factor());
    }
  }
  canonicalise_order(data, shard_order);
  data.hash = hash_of(data);

  InternTable& t = table();
  {
    absl::ReaderMutexLock lock(&t.mu);
    auto it = t.entries.find(data.hash);
    if (it != t.entries.end()) {
      for (const auto& e : it->second) {
        if (same_layout(*e, data)) return DTensorSpec(e.get());
      }
    }
  }
  absl::MutexLock lock(&t.mu);
  auto& bucket = t.entries[data.hash];
  for (const auto& e : bucket) {
    if (same_layout(*e, data)) return DTensorSpec(e.get());  // interned by another thread
  }
  data.id = ++t.count;
  bucket.push_back(std::make_unique<const Data>(std::move(data)));
  return DTensorSpec(bucket.back().get());
}

size_t interned_spec_count() {
  absl::MutexLock lock(&table().mu);
  return table().count;
}

int64_t DTensorSpec::num_shards(int64_t tensor_dim) const {
  int64_t n = 1;
  for (int64_t m : shard_order(tensor_dim)) n *= mesh().size(m);
  return n;
}

DTensorSpec DTensorSpec::replicated(const DeviceMesh& mesh, const TensorMeta& meta) {
  return make(mesh, Placements(mesh.ndim(), Replicate()), meta);
}

bool DTensorSpec::is_replicated() const {
  return std::all_of(placements().begin(), placements().end(),
                     [](Placement p) { return p.is_replicate(); });
}

bool DTensorSpec::has_partial() const {
  return std::any_of(placements().begin(), placements().end(),
                     [](Placement p) { return p.is_partial(); });
}

DTensorSpec without_partial(const DTensorSpec& spec) {
  if (!spec.has_partial()) return spec;
  Placements p = spec.placements();
  for (Placement& x : p) {
    if (x.is_partial()) x = Replicate();
  }
  return DTensorSpec::make(spec.mesh(), p, spec.meta(), spec.shard_order());
}

DTensorSpec without_strided(const DTensorSpec& spec) {
  if (!spec.has_strided_shard()) return spec;
  Placements p = spec.placements();
  ShardOrder order = spec.shard_order();
  for (Placement& x : p) {
    if (!x.is_strided_shard()) continue;
    order[x.dim()].clear();
    x = Replicate();
  }
  return DTensorSpec::make(spec.mesh(), p, spec.meta(), order);
}

bool DTensorSpec::is_sharded() const {
  return std::any_of(placements().begin(), placements().end(),
                     [](Placement p) { return p.is_any_shard(); });
}

Placements torch_placements(const DTensorSpec& spec) {
  Placements out = spec.placements();
  if (spec.has_default_shard_order()) return out;
  const DeviceMesh& mesh = spec.mesh();
  const auto product = [&](auto begin, auto end) {
    int64_t n = 1;
    for (auto it = begin; it != end; ++it) n *= mesh.size(*it);
    return n;
  };
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    const std::vector<int64_t>& order = spec.shard_order(d);
    if (order.size() < 2) continue;
    // Inverse of canonicalise_strided: in mesh order, each splitter is the first of the rest of
    // the order (a plain Shard) or the last (strided over the others still in it).
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    size_t lo = 0, hi = order.size();
    Placements mine = out;
    bool ok = true;
    for (int64_t m : sorted) {
      const int32_t dim = static_cast<int32_t>(d);
      if (order[lo] == m) {
        mine[m] = Shard(dim);
        ++lo;
      } else if (order[hi - 1] == m) {
        --hi;
        mine[m] = StridedShard(dim, product(order.begin() + lo, order.begin() + hi));
      } else {
        ok = false;
        break;
      }
    }
    if (ok) {
      out = mine;
      continue;
    }
    size_t k = 1;  // the longest prefix in mesh order stays plain
    while (k < order.size() && order[k] > order[k - 1]) ++k;
    for (size_t i = k; i < order.size(); ++i) {
      out[order[i]] =
          StridedShard(static_cast<int32_t>(d), product(order.begin(), order.begin() + i));
    }
  }
  return out;
}

std::string DTensorSpec::to_string() const {
  std::string mesh_shape;
  for (size_t i = 0; i < mesh().shape().size(); ++i) {
    mesh_shape += (i ? "," : "") + std::to_string(mesh().shape()[i]);
  }
  std::string out =
      dtensor::to_string(placements()) + " on (" + mesh_shape + ") " + meta().to_string();
  if (!has_default_shard_order()) {
    out += " order{";
    bool first = true;
    for (int64_t d = 0; d < ndim(); ++d) {
      if (shard_order(d).size() < 2) continue;
      out += (first ? "" : ";") + std::to_string(d) + ":[";
      for (size_t i = 0; i < shard_order(d).size(); ++i) {
        out += (i ? "," : "") + std::to_string(shard_order(d)[i]);
      }
      out += "]";
      first = false;
    }
    out += "}";
  }
  return out;
}

}  // namespace dtensor
