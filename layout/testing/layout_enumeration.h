#pragma once
// Enumerates every layout of the property tests: meshes (4), (2,2), (2,3), (2,2,2), every
// placement combination (R, P(sum), P(max), S(d) per mesh dim), every shard order, and shapes
// including sizes smaller than the mesh dims.

#include <algorithm>
#include <functional>
#include <vector>

#include "layout/dtensor_spec.h"

namespace dtensor::testing {

inline const std::vector<std::vector<int64_t>>& property_meshes() {
  static const std::vector<std::vector<int64_t>> meshes = {{4}, {2, 2}, {2, 3}, {2, 2, 2}};
  return meshes;
}

inline const std::vector<std::vector<int64_t>>& property_shapes() {
  static const std::vector<std::vector<int64_t>> shapes = {
      {0},    {1},    {2},    {3},    {5},       {7},       {13},     {1, 1},
      {3, 2}, {5, 7}, {2, 9}, {0, 3}, {1, 2, 3}, {3, 1, 5}, {4, 4, 2}};
  return shapes;
}

// Every shard order for `placements`: the product over tensor dims of the permutations of the
// mesh dims that shard each.
inline std::vector<ShardOrder> all_shard_orders(const Placements& placements, int64_t ndim) {
  ShardOrder base(ndim);
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_shard()) base[placements[m].dim()].push_back(m);
  }
  std::vector<ShardOrder> out = {base};
  for (int64_t d = 0; d < ndim; ++d) {
    std::vector<ShardOrder> next;
    for (const ShardOrder& o : out) {
      std::vector<int64_t> perm = base[d];
      do {
        next.push_back(o);
        next.back()[d] = perm;
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
    out = std::move(next);
  }
  return out;
}

// Calls `f` on every spec of the enumeration; returns how many it visited.
inline int64_t for_each_property_spec(const std::function<void(const DTensorSpec&)>& f) {
  int64_t count = 0;
  for (const auto& mesh_shape : property_meshes()) {
    const DeviceMesh mesh = DeviceMesh::arange(mesh_shape);
    for (const auto& shape : property_shapes()) {
      const int64_t ndim = static_cast<int64_t>(shape.size());
      std::vector<Placement> choices = {Replicate(), Partial(), Partial(ReduceOp::kMax)};
      for (int32_t d = 0; d < ndim; ++d) choices.push_back(Shard(d));
      const int64_t per_dim = static_cast<int64_t>(choices.size());
      int64_t combos = 1;
      for (size_t m = 0; m < mesh_shape.size(); ++m) combos *= per_dim;
      for (int64_t c = 0; c < combos; ++c) {
        Placements placements;
        for (int64_t m = 0, rem = c; m < mesh.ndim(); ++m, rem /= per_dim) {
          placements.push_back(choices[rem % per_dim]);
        }
        for (const ShardOrder& order : all_shard_orders(placements, ndim)) {
          f(DTensorSpec::make(mesh, placements, TensorMeta::make(shape), order));
          ++count;
        }
      }
    }
  }
  return count;
}

}  // namespace dtensor::testing
