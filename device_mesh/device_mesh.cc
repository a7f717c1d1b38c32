#include "device_mesh/device_mesh.h"

#include <absl/hash/hash.h>
#include <absl/strings/str_join.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include "base/error.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <unordered_set>

#include "base/stable_hash.h"

namespace dtensor {
namespace {

// dtensor::fail with the class name in front.
template <typename... Args>
[[noreturn]] void fail_mesh(const Args&... parts) {
  fail("DeviceMesh: ", parts...);
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                       std::vector<std::string> dim_names, c10::DeviceType device_type) {
  auto impl = std::make_shared<Impl>();
  int64_t numel = 1;
  for (int64_t s : shape) {
    if (s <= 0)
      fail_mesh("mesh shape (" + absl::StrJoin(shape, ",") +
                ") has a size <= 0; every dim needs a rank");
    if (__builtin_mul_overflow(numel, s, &numel) || numel > kMaxRanks) {
      fail_mesh("mesh shape (" + absl::StrJoin(shape, ",") + ") has more than " +
                std::to_string(kMaxRanks) + " ranks");
    }
  }
  if (numel != static_cast<int64_t>(ranks.size())) {
    fail_mesh("mesh shape (" + absl::StrJoin(shape, ",") + ") holds " + std::to_string(numel) +
              " ranks but " + std::to_string(ranks.size()) + " were given: [" +
              absl::StrJoin(ranks, ",") + "]");
  }
  std::unordered_set<int64_t> seen;
  for (int64_t r : ranks) {
    if (r < 0)
      fail_mesh("rank " + std::to_string(r) + " is negative in [" + absl::StrJoin(ranks, ",") +
                "]");
    if (!seen.insert(r).second) {
      fail_mesh("rank " + std::to_string(r) + " appears twice in [" + absl::StrJoin(ranks, ",") +
                "]");
    }
  }
  if (!dim_names.empty()) {
    if (dim_names.size() != shape.size()) {
      fail_mesh("mesh has " + std::to_string(shape.size()) + " dims but " +
                std::to_string(dim_names.size()) + " dim names were given: (" +
                absl::StrJoin(dim_names, ",") + ")");
    }
    std::unordered_set<std::string> names;
    for (const auto& n : dim_names) {
      if (n.empty())
        fail_mesh("dim names must not be empty: (" + absl::StrJoin(dim_names, ",") + ")");
      if (!names.insert(n).second) {
        fail_mesh("dim name '" + n + "' appears twice in (" + absl::StrJoin(dim_names, ",") + ")");
      }
    }
  }
  impl->strides.assign(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    impl->strides[d] = impl->strides[d + 1] * shape[d + 1];
  }
  impl->device_type = device_type;
  // In-process only (interning, maps).
  impl->hash = absl::HashOf(shape, ranks, dim_names, static_cast<int>(device_type));
  impl->shape = std::move(shape);
  impl->ranks = std::move(ranks);
  impl->dim_names = std::move(dim_names);
  impl_ = std::move(impl);
}

DeviceMesh DeviceMesh::arange(std::vector<int64_t> shape, std::vector<std::string> dim_names,
                              c10::DeviceType device_type) {
  int64_t numel = 1;
  for (int64_t s : shape) {
    if (s <= 0 || __builtin_mul_overflow(numel, s, &numel) || numel > kMaxRanks) {
      // Throws the full message.
      return DeviceMesh(std::move(shape), {}, std::move(dim_names), device_type);
    }
  }
  std::vector<int64_t> ranks(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) ranks[i] = i;
  return DeviceMesh(std::move(shape), std::move(ranks), std::move(dim_names), device_type);
}

c10::Device DeviceMesh::local_device() const { return mesh_device(impl_->device_type); }

DeviceMesh DeviceMesh::with_device_type(c10::DeviceType device_type) const {
  if (device_type == impl_->device_type) return *this;
  return DeviceMesh(impl_->shape, impl_->ranks, impl_->dim_names, device_type);
}

c10::Device mesh_device(c10::DeviceType type) {
  if (type == c10::DeviceType::CPU) return c10::Device(c10::DeviceType::CPU);
  DTENSOR_CHECK(c10::impl::hasDeviceGuardImpl(type), "DeviceMesh: a ", device_type_name(type),
                " mesh needs a libtorch with ", device_type_name(type),
                " support; the one this process loaded has none (a CPU-only build)");
  // A CUDA build of torch on a machine without a GPU (or its driver): a clear error here, not
  // the runtime's "driver version is insufficient" from the first copy.
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(type);
  DTENSOR_CHECK(impl->deviceCount() > 0, "DeviceMesh: a ", device_type_name(type), " mesh needs a ",
                device_type_name(type), " device; this process sees none");
  return impl->getDevice();
}

std::string device_type_name(c10::DeviceType type) {
  return c10::DeviceTypeName(type, /*lower_case=*/true);
}

c10::DeviceType parse_device_type(const std::string& name) {
  std::optional<c10::Device> device;
  try {
    device = c10::Device(name);
  } catch (const c10::Error&) {
  }
  DTENSOR_CHECK(device && !device->has_index(), "DeviceMesh: '", name,
                "' is not a device type; expected one such as 'cpu' or 'cuda'");
  return device->type();
}

int64_t DeviceMesh::normalize_dim(int64_t dim) const {
  const int64_t n = ndim();
  if (dim < -n || dim >= n) {
    fail_mesh("dim " + std::to_string(dim) + " is out of range for a " + std::to_string(n) +
              "-D mesh (" + absl::StrJoin(shape(), ",") + ")");
  }
  return dim < 0 ? dim + n : dim;
}

int64_t DeviceMesh::size(int64_t dim) const { return impl_->shape[normalize_dim(dim)]; }

int64_t DeviceMesh::dim_index(const std::string& name) const {
  const auto& names = impl_->dim_names;
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) {
    fail_mesh(
        "no dim named '" + name + "'; the mesh has " +
        (names.empty() ? std::string("no dim names") : "dims (" + absl::StrJoin(names, ",") + ")"));
  }
  return it - names.begin();
}

std::optional<std::vector<int64_t>> DeviceMesh::coordinate(int64_t rank) const {
  const auto& ranks = impl_->ranks;
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) return std::nullopt;
  int64_t flat = it - ranks.begin();
  std::vector<int64_t> coord(impl_->shape.size());
  for (size_t d = 0; d < coord.size(); ++d) {
    coord[d] = flat / impl_->strides[d];
    flat %= impl_->strides[d];
  }
  return coord;
}

int64_t DeviceMesh::rank_at(const std::vector<int64_t>& coordinate) const {
  if (coordinate.size() != impl_->shape.size()) {
    fail_mesh("coordinate (" + absl::StrJoin(coordinate, ",") + ") has " +
              std::to_string(coordinate.size()) + " entries for a " + std::to_string(ndim()) +
              "-D mesh");
  }
  int64_t flat = 0;
  for (size_t d = 0; d < coordinate.size(); ++d) {
    if (coordinate[d] < 0 || coordinate[d] >= impl_->shape[d]) {
      fail_mesh("coordinate (" + absl::StrJoin(coordinate, ",") + ") is outside mesh shape (" +
                absl::StrJoin(shape(), ",") + ")");
    }
    flat += coordinate[d] * impl_->strides[d];
  }
  return impl_->ranks[flat];
}

std::vector<int64_t> DeviceMesh::names_to_dims(const std::vector<std::string>& names) const {
  std::vector<int64_t> dims;
  dims.reserve(names.size());
  for (const auto& n : names) dims.push_back(dim_index(n));
  return dims;
}

DeviceMesh DeviceMesh::submesh(const std::vector<std::string>& names, int64_t rank) const {
  return submesh_dims(names_to_dims(names), rank);
}

DeviceMesh DeviceMesh::submesh_dims(const std::vector<int64_t>& dims_in, int64_t rank) const {
  std::vector<int64_t> dims;
  for (int64_t d : dims_in) {
    const int64_t nd = normalize_dim(d);
    if (std::find(dims.begin(), dims.end(), nd) != dims.end()) {
      fail_mesh("sub-mesh names dim " + dim_label(nd) + " twice");
    }
    dims.push_back(nd);
  }
  auto coord = coordinate(rank);
  if (!coord) fail_mesh("rank " + std::to_string(rank) + " is not in " + to_string());
  std::vector<int64_t> sub_shape, sub_ranks;
  std::vector<std::string> sub_names;
  for (int64_t d : dims) {
    sub_shape.push_back(impl_->shape[d]);
    if (has_dim_names()) sub_names.push_back(impl_->dim_names[d]);
  }
  // Walk the sub-mesh in row-major order of the requested dims.
  int64_t numel = 1;
  for (int64_t s : sub_shape) numel *= s;
  std::vector<int64_t> c = *coord;
  for (int64_t i = 0; i < numel; ++i) {
    int64_t rem = i;
    for (int64_t k = static_cast<int64_t>(dims.size()) - 1; k >= 0; --k) {
      c[dims[k]] = rem % sub_shape[k];
      rem /= sub_shape[k];
    }
    sub_ranks.push_back(rank_at(c));
  }
  return DeviceMesh(std::move(sub_shape), std::move(sub_ranks), std::move(sub_names),
                    impl_->device_type);
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names, std::string name) const {
  if (name.empty()) name = absl::StrJoin(names, "_");
  return flatten_dims(names_to_dims(names), std::move(name));
}

DeviceMesh DeviceMesh::flatten_dims(const std::vector<int64_t>& dims_in, std::string name) const {
  if (dims_in.empty()) fail_mesh("flatten needs at least one dim");
  if (!name.empty() && !has_dim_names()) {
    fail_mesh("cannot name the flattened dim '" + name + "': " + to_string() + " has no dim names");
  }
  std::vector<int64_t> merged;
  for (int64_t d : dims_in) {
    const int64_t nd = normalize_dim(d);
    if (std::find(merged.begin(), merged.end(), nd) != merged.end()) {
      fail_mesh("flatten names dim " + dim_label(nd) + " twice");
    }
    merged.push_back(nd);
  }
  const int64_t first = *std::min_element(merged.begin(), merged.end());
  // New dim order: kept dims in order, with the merged group (in the order given) at `first`.
  std::vector<int64_t> order;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d == first) order.insert(order.end(), merged.begin(), merged.end());
    if (std::find(merged.begin(), merged.end(), d) == merged.end()) order.push_back(d);
  }
  std::vector<int64_t> new_shape;
  std::vector<std::string> new_names;
  int64_t merged_size = 1;
  for (int64_t d : merged) merged_size *= impl_->shape[d];
  if (name.empty() && has_dim_names()) {
    std::vector<std::string> parts;
    for (int64_t d : merged) parts.push_back(impl_->dim_names[d]);
    name = absl::StrJoin(parts, "_");
  }
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d == first) {
      new_shape.push_back(merged_size);
      if (has_dim_names()) new_names.push_back(name);
    } else if (std::find(merged.begin(), merged.end(), d) == merged.end()) {
      new_shape.push_back(impl_->shape[d]);
      if (has_dim_names()) {
        if (impl_->dim_names[d] == name)
          fail_mesh("flattened dim name '" + name + "' already exists");
        new_names.push_back(impl_->dim_names[d]);
      }
    }
  }
  // Ranks: iterate the permuted mesh (dims in `order`) row-major.
  std::vector<int64_t> perm_shape;
  for (int64_t d : order) perm_shape.push_back(impl_->shape[d]);
  std::vector<int64_t> new_ranks;
  new_ranks.reserve(impl_->ranks.size());
  std::vector<int64_t> c(ndim(), 0);
  for (int64_t i = 0; i < size(); ++i) {
    int64_t rem = i;
    for (int64_t k = ndim() - 1; k >= 0; --k) {
      c[order[k]] = rem % perm_shape[k];
      rem /= perm_shape[k];
    }
    new_ranks.push_back(rank_at(c));
  }
  return DeviceMesh(std::move(new_shape), std::move(new_ranks), std::move(new_names),
                    impl_->device_type);
}

std::vector<int64_t> DeviceMesh::group_ranks(int64_t dim, int64_t rank) const {
  const int64_t d = normalize_dim(dim);
  auto coord = coordinate(rank);
  if (!coord) fail_mesh("rank " + std::to_string(rank) + " is not in " + to_string());
  std::vector<int64_t> out;
  out.reserve(impl_->shape[d]);
  for (int64_t i = 0; i < impl_->shape[d]; ++i) {
    (*coord)[d] = i;
    out.push_back(rank_at(*coord));
  }
  return out;
}

std::vector<std::vector<int64_t>> DeviceMesh::all_groups(int64_t dim) const {
  const int64_t d = normalize_dim(dim);
  // Row order of swapdims(-1, d).reshape(-1, size(d)): the other dims row-major, with the last
  // dim standing where `d` was.
  std::vector<int64_t> others;
  for (int64_t k = 0; k + 1 < ndim(); ++k) others.push_back(k == d ? ndim() - 1 : k);
  const int64_t rows = size() / impl_->shape[d];
  std::vector<std::vector<int64_t>> groups;
  std::vector<int64_t> coord(ndim(), 0);
  for (int64_t i = 0; i < rows; ++i) {
    int64_t rem = i;
    for (int64_t k = static_cast<int64_t>(others.size()) - 1; k >= 0; --k) {
      coord[others[k]] = rem % impl_->shape[others[k]];
      rem /= impl_->shape[others[k]];
    }
    coord[d] = 0;
    groups.push_back(group_ranks(d, rank_at(coord)));
  }
  return groups;
}

std::string DeviceMesh::dim_label(int64_t dim) const {
  return has_dim_names() ? impl_->dim_names[dim] : "dim" + std::to_string(dim);
}

std::string DeviceMesh::group_name(int64_t dim, int64_t rank) const {
  return group_name_for_ranks(group_ranks(dim, rank));
}

std::string group_name_for_ranks(const std::vector<int64_t>& ranks) {
  if (ranks.size() <= 8) return "ranks:" + absl::StrJoin(ranks, "-");
  uint64_t h = kFnvOffset;  // equal in every process: peers find the group by this name
  for (int64_t r : ranks) h = fnv1a_int(r, h);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return "ranks:" + std::to_string(ranks.size()) + "r" + buf;
}

std::string DeviceMesh::to_string() const {
  std::string out = "DeviceMesh((" + absl::StrJoin(shape(), ",") + "), ranks=[" +
                    absl::StrJoin(ranks(), ",") + "]";
  if (has_dim_names()) out += ", names=(" + absl::StrJoin(dim_names(), ",") + ")";
  if (device_type() != c10::DeviceType::CPU) out += ", device=" + device_type_name(device_type());
  return out + ")";
}

bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
  if (a.impl_ == b.impl_) return true;
  return a.impl_->hash == b.impl_->hash && a.impl_->device_type == b.impl_->device_type &&
         a.impl_->shape == b.impl_->shape && a.impl_->ranks == b.impl_->ranks &&
         a.impl_->dim_names == b.impl_->dim_names;
}

}  // namespace dtensor
