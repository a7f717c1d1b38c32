#pragma once
// DeviceMesh: an N-D array of global ranks with optional dim names. Topology only: it answers
// "who is where" and "who talks to whom along a dim"; communication lives in collectives/.
//
// A DeviceMesh is an immutable value that is cheap to copy (it shares its data). Unlike PyTorch's
// DeviceMesh it does not know "the current rank": the queries that depend on a rank take it as an
// argument, so one process can simulate every rank (the threads backend, the planner's tests).
//
// NOTE [mesh device]
// A mesh has a device type, as PyTorch's ("cpu", "cuda"; CPU by default): every local tensor of
// a distributed tensor on the mesh, and every tensor the engine makes to communicate over it
// (metadata exchanges, scatter buffers, factories' pieces), lives on local_device(): the CPU for
// a CPU mesh, the calling thread's current device of that type otherwise (for CUDA the device
// PyTorch's init_device_mesh selects, LOCAL_RANK % device_count). The device type is part of the
// mesh's identity (equality, hash, to_string when not CPU): a CPU and a CUDA mesh over the same
// ranks are different meshes, as their tensors cannot be mixed. It is read through c10's
// device-guard interface, so this layer needs no CUDA headers and links against a CPU-only
// libtorch (a CUDA mesh there fails on first use, naming the missing support).

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

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
  // has one unique, non-empty name per dim. `device_type`: where the mesh's tensors live (NOTE
  // [mesh device]). throws dtensor::Error naming what is wrong.
  DeviceMesh(std::vector<int64_t> shape, std::vector<int64_t> ranks,
             std::vector<std::string> dim_names = {},
             c10::DeviceType device_type = c10::DeviceType::CPU);

  // Ranks 0..N-1 laid out row-major: PyTorch's init_device_mesh(device, shape, mesh_dim_names).
  static DeviceMesh arange(std::vector<int64_t> shape, std::vector<std::string> dim_names = {},
                           c10::DeviceType device_type = c10::DeviceType::CPU);

  c10::DeviceType device_type() const { return impl_->device_type; }
  // The device on which the calling rank keeps the mesh's local tensors: mesh_device(device_type())
  // (NOTE [mesh device]).
  c10::Device local_device() const;
  // The same mesh on another device type.
  DeviceMesh with_device_type(c10::DeviceType device_type) const;

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

  // "DeviceMesh((2,2), ranks=[0,1,2,3], names=(dp,tp))"; a mesh not on the CPU ends with its
  // device type: "DeviceMesh((2), ranks=[0,1], device=cuda)".
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
    c10::DeviceType device_type = c10::DeviceType::CPU;
    size_t hash = 0;
  };

  std::string dim_label(int64_t dim) const;
  std::vector<int64_t> names_to_dims(const std::vector<std::string>& names) const;

  std::shared_ptr<const Impl> impl_;
};

// The one place that says where a rank's tensors of a `type` mesh live (NOTE [mesh device]): the
// CPU for CPU, else the calling thread's current device of `type` (c10's device guard). Throws
// dtensor::Error when this libtorch has no support for `type`.
c10::Device mesh_device(c10::DeviceType type);

// "cpu", "cuda": the lower-case name PyTorch's DeviceMesh.device_type holds.
std::string device_type_name(c10::DeviceType type);
// The device type of a name such as "cpu" or "cuda" (a device index is refused); throws naming it.
c10::DeviceType parse_device_type(const std::string& name);

// "ranks:0-1-2" for a rank list, or "ranks:<n>r<64-bit FNV-1a digest>" past 8 ranks: equal on
// every rank and in every process for the same list, different for different lists.
std::string group_name_for_ranks(const std::vector<int64_t>& ranks);

}  // namespace dtensor

template <>
struct std::hash<dtensor::DeviceMesh> {
  size_t operator()(const dtensor::DeviceMesh& m) const { return m.hash(); }
};
