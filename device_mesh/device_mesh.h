#pragma once
// DeviceMesh: an N-D array of global ranks with optional dim names. Topology only: it answers
// "who is where" and "who talks to whom along a dim"; communication lives in collectives/.
//
// A DeviceMesh is an immutable value that is cheap to copy (it shares its data). Unlike PyTorch's
// DeviceMesh it does not know "the current rank": the queries that depend on a rank take it as an
// argument, so one process can simulate every rank (the threads backend, the planner's tests).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"  // the error type its functions throw

namespace dtensor {

class DeviceMesh {
 public:
  // Far beyond any real job; keeps a typo such as --mesh 100000,100000 a clear error.
  static constexpr int64_t kMaxRanks = int64_t{1} << 24;

  // `ranks` lists global ranks in row-major order of `shape`. They must be distinct and
  // non-negative, and their count must equal the product of `shape`. `dim_names` is empty or
  // has one unique, non-empty name per dim. throws dtensor::Error naming what is wrong.
  DeviceMesh(std::vector<int64_t> shape, std::vector<int64_t> ranks,
             std::vector<std::string> dim_names = {});

  // Ranks 0..N-1 laid out row-major: PyTorch's init_device_mesh(device, shape, mesh_dim_names).
  static DeviceMesh arange(std::vector<int64_t> shape, std::vector<std::string> dim_names = {});

  const std::vector<int64_t>& shape() const { return impl_->shape; }
  int64_t ndim() const { return static_cast<int64_t>(impl_->shape.size()); }
  // Size of one dim; negative dims count from the end.
  int64_t size(int64_t dim) const;
  // Number of ranks in the mesh.
  int64_t size() const { return static_cast<int64_t>(impl_->ranks.size()); }
  const std::vector<int64_t>& ranks() const { return impl_->ranks; }
  const std::vector<std::string>& dim_names() const { return impl_->dim_names; }
  bool has_dim_names() const { return !impl_->dim_names.empty(); }

  // Index of a named dim; throws naming the unknown name and the names that exist.
  int64_t dim_index(const std::string& name) const;
  // Normalises a possibly negative dim; throws when out of range.
  int64_t normalize_dim(int64_t dim) const;

  bool contains(int64_t rank) const { return coordinate(rank).has_value(); }
  // Coordinate of `rank` in the mesh, or nullopt when the rank is not part of it.
  std::optional<std::vector<int64_t>> coordinate(int64_t rank) const;
  // Global rank at a coordinate; throws when out of range.
  int64_t rank_at(const std::vector<int64_t>& coordinate) const;

  // The sub-mesh over the named dims that contains `rank` (PyTorch's mesh["dp", "tp"]): dims keep
  // the order the names are given in (any order is accepted), the other dims are fixed at
  // `rank`'s coordinate. Throws when a name is unknown or repeated, or `rank` is not in the mesh.
  DeviceMesh submesh(const std::vector<std::string>& names, int64_t rank) const;
  DeviceMesh submesh_dims(const std::vector<int64_t>& dims, int64_t rank) const;

  // Merges `dims` (major to minor in the order given) into one dim placed where the first of
  // them was; other dims keep their order. `name` defaults to the merged names joined by "_"
  // (PyTorch's _flatten), and is required to be new when the mesh has names. An unnamed mesh
  // cannot name the flattened dim.
  DeviceMesh flatten(const std::vector<std::string>& names, std::string name = "") const;
  DeviceMesh flatten_dims(const std::vector<int64_t>& dims, std::string name = "") const;

  // Ranks in `rank`'s group along `dim` (the row of the mesh through `rank` along that dim), in
  // coordinate order. Throws when `rank` is not in the mesh.
  std::vector<int64_t> group_ranks(int64_t dim, int64_t rank) const;
  // Every group along `dim`, in PyTorch's order: the rows of
  // mesh.swapdims(-1, dim).reshape(-1, size(dim)).
  std::vector<std::vector<int64_t>> all_groups(int64_t dim) const;
  // A name for `rank`'s group along `dim`: group_name_for_ranks(group_ranks(dim, rank)). It
  // depends on the ranks only, so slicing or flattening a mesh never makes a second name (and a
  // second communicator) for the same group. Collectives resolve groups by this name.
  std::string group_name(int64_t dim, int64_t rank) const;

  // "DeviceMesh((2,2), ranks=[0,1,2,3], names=(dp,tp))".
  std::string to_string() const;
  size_t hash() const { return impl_->hash; }

  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b);
  friend bool operator!=(const DeviceMesh& a, const DeviceMesh& b) { return !(a == b); }

 private:
  struct Impl {
    std::vector<int64_t> shape;
    std::vector<int64_t> ranks;
    std::vector<std::string> dim_names;
    std::vector<int64_t> strides;  // row-major strides of `shape`
    size_t hash = 0;
  };
  std::string dim_label(int64_t dim) const;
  std::vector<int64_t> names_to_dims(const std::vector<std::string>& names) const;

  std::shared_ptr<const Impl> impl_;
};

// "ranks:0-1-2" for a rank list, or "ranks:<n>r<64-bit FNV-1a digest>" past 8 ranks: equal on
// every rank and in every process for the same list, different for different lists.
std::string group_name_for_ranks(const std::vector<int64_t>& ranks);

}  // namespace dtensor

template <>
struct std::hash<dtensor::DeviceMesh> {
  size_t operator()(const dtensor::DeviceMesh& m) const { return m.hash(); }
};
