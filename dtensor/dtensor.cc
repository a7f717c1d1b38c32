#include "dtensor/dtensor.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <optional>
#include <stdexcept>

#include "base/error.h"
#include "base/stable_hash.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/autograd.h"
#include "dtensor/engine_activity.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"
#include "layout/shard_layout.h"

namespace dtensor {
namespace {

at::Tensor move(const at::Tensor& local, DTensorSpec from, DTensorSpec to, bool async_op) {
  return redistribute_local(local, from, to, async_op);
}

bool records_grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

// Exchanges (dtype, ndim, requires_grad, shape...) over every rank of `mesh`; returns them in
// mesh order. requires_grad is sent as 0 unless `with_requires_grad` (only from_local's check
// compares it). The metadata travels on the mesh's device (NOTE [mesh device]: NCCL takes CUDA
// tensors only) and is read back on the CPU.
constexpr int64_t kMaxDims = 16;
constexpr int64_t kMetaHead = 3;

std::vector<std::vector<int64_t>> exchange_meta(const DeviceMesh& mesh, const at::Tensor& t,
                                                const char* what, bool with_requires_grad) {
  if (t.dim() > kMaxDims) {
    throw Error(std::string(what) + ": tensors of more than " + std::to_string(kMaxDims) +
                " dims are not supported");
  }
  std::vector<int64_t> dims(mesh.ndim());
  for (int64_t m = 0; m < mesh.ndim(); ++m) dims[m] = m;
  const std::string group = group_over_dims(mesh, dims);
  at::Tensor mine = at::full({kMetaHead + kMaxDims}, -1, at::kLong);
  mine[0] = static_cast<int64_t>(t.scalar_type());
  mine[1] = t.dim();
  mine[2] = with_requires_grad && t.requires_grad() ? 1 : 0;
  for (int64_t d = 0; d < t.dim(); ++d) mine[kMetaHead + d] = t.size(d);
  const at::Tensor all = collectives::all_gather_into_tensor(mine.to(mesh.local_device()), 0, group)
                             .cpu()
                             .view({-1, kMetaHead + kMaxDims});
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < all.size(0); ++i) {
    const at::Tensor row = all[i];
    std::vector<int64_t> v(row.data_ptr<int64_t>(),
                           row.data_ptr<int64_t>() + kMetaHead + row[1].item<int64_t>());
    out.push_back(std::move(v));
  }
  return out;
}

std::string meta_text(const std::vector<int64_t>& m) {
  return std::string(c10::toString(static_cast<c10::ScalarType>(m[0]))) + "[" +
         absl::StrJoin(std::vector<int64_t>(m.begin() + kMetaHead, m.end()), ",") + "]" +
         (m[2] ? " requires_grad" : "");
}

// distribute_tensor's scatter purpose: the tensor's dtype and shape, the shape as a hash when
// the text would not fit a purpose (collectives::kPurposeBytes).
std::string scatter_purpose(const at::Tensor& t) {
  const std::string dtype = c10::toString(t.scalar_type());
  std::string text = "distribute_tensor " + dtype + "[" + absl::StrJoin(t.sizes(), ",") + "]";
  if (text.size() < collectives::kPurposeBytes) return text;
  const std::vector<int64_t> sizes = t.sizes().vec();
  return "distribute_tensor " + dtype + "[#" +
         std::to_string(fnv1a(sizes.data(), sizes.size() * sizeof(int64_t))) + "]";
}

void refuse_partial(const Placements& placements, const char* what) {
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_partial()) {
      throw Error(std::string(what) + ": Partial placements are not allowed (" +
                  placements[m].to_string() + " on mesh dim " + std::to_string(m) +
                  "); lay the tensor out with Shard/Replicate, or use from_local "
                  "for partial values");
    }
  }
}

}  // namespace

DTensorSpec grad_spec(const DTensorSpec& spec, const std::optional<Placements>& grad_placements) {
  if (!grad_placements) return without_partial(spec);
  const DTensorSpec grad = DTensorSpec::make(spec.mesh(), *grad_placements, spec.meta());
  if (!holds_piece(spec.mesh())) return grad;  // NOTE [ranks outside the mesh]
  const auto coord = my_coordinate(spec.mesh(), "to_local");
  DTENSOR_CHECK(local_box(grad, coord).shape == local_box(spec, coord).shape,
                "to_local: grad_placements ", dtensor::to_string(*grad_placements),
                " give this rank a different local shape than ", spec.to_string());
  return grad;
}

at::Tensor DTensor::to_local(const std::optional<Placements>& grad_placements) const {
  const at::Tensor local = collectives::wait_tensor(local_);
  if (!records_grad(local)) return local;
  const DTensorSpec grad = grad_spec(spec_, grad_placements);
  if (grad == without_partial(spec_)) return local;
  // Through the one autograd stack (autograd.h): the piece as a distributed tensor, then back.
  return autograd::to_local(autograd::from_local(local, spec_), grad);
}

at::Tensor DTensor::full_tensor() const {
  my_coordinate(spec_.mesh(), "full_tensor");  // NOTE [ranks outside the mesh]: raises there
  return redistribute(Placements(spec_.mesh().ndim(), Replicate())).to_local();
}

DTensor DTensor::redistribute(const Placements& placements, bool async_op) const {
  return redistribute(spec_.mesh(), placements, async_op);
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, const Placements& placements,
                              bool async_op) const {
  const DTensorSpec dst = DTensorSpec::make(mesh, placements, spec_.meta());
  if (dst == spec_) return *this;
  if (records_grad(local_)) {  // the one autograd stack (autograd.h)
    const at::Tensor moved =
        autograd::redistribute(autograd::from_local(collectives::wait_tensor(local_), spec_), dst);
    return DTensor(autograd::to_local(moved, without_partial(dst)), dst);
  }
  return DTensor(move(local_, spec_, dst, async_op), dst);
}

std::string DTensor::to_string() const {
  return "DTensor(" + spec_.to_string() + ", local " +
         std::string(c10::toString(local_.scalar_type())) + "[" +
         absl::StrJoin(local_.sizes().vec(), ",") + "])";
}

DTensor distribute_tensor(const at::Tensor& input, const DeviceMesh& mesh,
                          const Placements& placements, std::optional<int64_t> src_rank) {
  const EngineScope engine;  // NOTE [engine activity]
  refuse_partial(placements, "distribute_tensor");
  const at::Tensor tensor = to_mesh_device(input, mesh);  // NOTE [inputs move to the mesh's device]
  const DTensorSpec spec = DTensorSpec::make(
      mesh, placements, TensorMeta::make(tensor.sizes().vec(), tensor.scalar_type()));
  if (!holds_piece(mesh)) return DTensor(absent_piece(spec, tensor.options()), spec);
  const auto coord = my_coordinate(mesh, "distribute_tensor");
  // A meta tensor holds no data to send: every rank keeps its piece's metadata, with no
  // collective (as PyTorch's collectives return at once on meta tensors), so that a model built
  // on the meta device is parallelized before it is materialized (to_empty, then init).
  if (!src_rank || tensor.is_meta()) {
    return DTensor(local_tensor_for(tensor.detach(), spec, coord), spec);
  }

  if (!mesh.contains(*src_rank)) {
    throw Error("distribute_tensor: src_rank " + std::to_string(*src_rank) + " is not in " +
                mesh.to_string());
  }
  // A scatter as one all_to_all_single (a broadcast when no placement shards, as PyTorch's): the
  // source sends every rank exactly its box, and every rank receives its box as its own
  // tensor's shape gives it. So every rank must pass the
  // source's shape and dtype: a backend that compares calls checks it within the scatter (the
  // call's purpose names them), one collective as PyTorch's scatter; the others (NCCL) exchange
  // them first.
  std::vector<int64_t> dims(mesh.ndim());
  for (int64_t m = 0; m < mesh.ndim(); ++m) dims[m] = m;
  int64_t me = 0;
  const std::string group = group_over_dims(mesh, dims, &me);
  const int64_t src_index = [&] {
    const auto& ranks = mesh.ranks();
    return std::find(ranks.begin(), ranks.end(), *src_rank) - ranks.begin();
  }();
  std::optional<collectives::CommPurpose> purpose;
  if (collectives::compares_calls(group)) {
    purpose.emplace(scatter_purpose(tensor));
  } else {
    const auto metas = exchange_meta(mesh, tensor, "distribute_tensor", false);
    for (size_t i = 0; i < metas.size(); ++i) {
      if (metas[i] != metas[src_index]) {
        throw Error("distribute_tensor: rank " + std::to_string(mesh.ranks()[i]) + " passed " +
                    meta_text(metas[i]) + " but src_rank " + std::to_string(*src_rank) + " has " +
                    meta_text(metas[src_index]) +
                    "; every rank must pass a tensor of the same shape and dtype");
      }
    }
  }
  const at::Tensor data = tensor.detach();
  const bool whole = !spec.is_sharded();
  if (whole) {  // every rank gets the whole tensor: PyTorch's broadcast
    at::Tensor got = collectives::broadcast(data.contiguous(), src_index, group);
    if (got.is_alias_of(data)) got = got.clone();  // the result never shares the caller's tensor
    return DTensor(got, spec);
  }
  const int64_t n = mesh.size();
  const bool is_src = mesh.ranks()[me] == *src_rank;
  std::vector<int64_t> in_splits(n, 0), out_splits(n, 0);
  std::vector<at::Tensor> send;
  for (int64_t i = 0; i < n; ++i) {
    const auto coord_i = *mesh.coordinate(mesh.ranks()[i]);
    if (is_src) {
      in_splits[i] = local_box(spec, coord_i).numel();
      send.push_back(local_piece(data, spec, coord_i).reshape(-1));
    }
    if (i == src_index) out_splits[i] = local_box(spec, coord).numel();
  }
  const at::Tensor flat = is_src ? at::cat(send) : at::empty({0}, tensor.options());
  const at::Tensor got =
      collectives::all_to_all_single(flat.contiguous(), out_splits, in_splits, group,
                                     /*async_op=*/false, collectives::kScatterLabel);
  return DTensor(got.view(local_box(spec, coord).shape), spec);
}

DTensor from_local(const at::Tensor& input, const DeviceMesh& mesh, const Placements& placements,
                   bool run_check, const std::optional<std::vector<int64_t>>& shape,
                   const std::optional<std::vector<int64_t>>& stride,
                   const ShardOrder& shard_order) {
  const EngineScope engine;  // NOTE [engine activity]
  // NOTE [inputs move to the mesh's device]
  const at::Tensor local = to_mesh_device_type(input, mesh);
  if (static_cast<int64_t>(placements.size()) != mesh.ndim()) {
    throw Error("from_local: " + std::to_string(placements.size()) + " placements for a " +
                std::to_string(mesh.ndim()) + "-D mesh " + mesh.to_string());
  }
  std::vector<int64_t> global = local.sizes().vec();
  // NOTE [from_local strides]: without shape= and stride=, the global strides are the piece's
  // with each sharded dim's mesh size folded into the strides at or above that dim's, as
  // PyTorch's compute_global_tensor_info: a transposed piece gives a transposed global tensor
  // (so is_contiguous() and reshape's view path answer as one device's). A row-major piece keeps
  // row-major strides.
  std::vector<int64_t> global_stride = stride.value_or(std::vector<int64_t>{});
  if (shape) {
    global = *shape;
  } else {
    const bool strided = !stride && !local.is_contiguous() && local.is_non_overlapping_and_dense();
    if (strided) global_stride = local.strides().vec();
    for (size_t m = 0; m < placements.size(); ++m) {
      if (!placements[m].is_any_shard()) continue;
      const int64_t d =
          normalize_tensor_dim(placements[m].dim(), local.dim(), "from_local Shard dim");
      global[d] *= mesh.shape()[m];
      if (!strided) continue;
      const int64_t at = global_stride[d];
      for (int64_t i = 0; i < local.dim(); ++i) {
        if (i != d && global_stride[i] >= at) global_stride[i] *= mesh.shape()[m];
      }
    }
  }
  const DTensorSpec spec = DTensorSpec::make(
      mesh, placements, TensorMeta::make(global, local.scalar_type(), global_stride), shard_order);
  if (!holds_piece(mesh)) return DTensor(absent_piece(spec, local.options()), spec);
  const auto coord = my_coordinate(mesh, "from_local");
  if (run_check) {
    const auto metas = exchange_meta(mesh, local, "from_local", true);
    // Without shape= every rank infers the global shape from its own piece (even shards): pieces
    // that differ would give each rank another global shape, so name them all at once.
    const auto differs = [&](const std::vector<int64_t>& m) { return m != metas[0]; };
    if (!shape && std::any_of(metas.begin(), metas.end(), differs)) {
      std::vector<std::string> held;
      for (size_t i = 0; i < metas.size(); ++i) {
        held.push_back(absl::StrCat("rank ", mesh.ranks()[i], " ", meta_text(metas[i])));
      }
      const bool only_shapes = std::all_of(metas.begin(), metas.end(), [&](const auto& m) {
        return m[0] == metas[0][0] && m[2] == metas[0][2];
      });
      throw InvalidValue(
          absl::StrCat("from_local(run_check) with ", to_string(placements),
                       ": the local tensors differ across ranks (", absl::StrJoin(held, ", "), ")",
                       only_shapes ? "; pieces of an uneven Shard need shape= (and stride=)" : ""));
    }
    for (size_t i = 0; i < metas.size(); ++i) {
      const int64_t r = mesh.ranks()[i];
      std::vector<int64_t> want = {static_cast<int64_t>(spec.meta().dtype), spec.ndim(),
                                   metas[0][2]};
      const auto box = local_box(spec, *mesh.coordinate(r));
      want.insert(want.end(), box.shape.begin(), box.shape.end());
      if (metas[i] != want) {
        throw InvalidValue("from_local(run_check): rank " + std::to_string(r) + " holds " +
                           meta_text(metas[i]) + " but " + spec.to_string() + " gives it " +
                           meta_text(want));
      }
    }
    // As PyTorch's: replicas that differ are made equal, each Replicate mesh dim taking the data
    // of its first rank (written into `local`, which the result shares).
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (!placements[m].is_replicate() || mesh.shape()[m] == 1) continue;
      collectives::CommCause cause("from_local(run_check)");
      const at::Tensor first =
          collectives::broadcast(local.contiguous(), 0, group_over_dims(mesh, {m}));
      if (!first.is_same(local)) {
        const at::NoGradGuard no_grad;  // `local` may be a leaf that requires grad
        local.copy_(first);
      }
    }
  } else if (local.sizes().vec() != local_box(spec, coord).shape) {
    throw Error("from_local: this rank's local tensor " + c10::str(local.sizes()) +
                " does not match " + spec.to_string() + " (local shape [" +
                absl::StrJoin(local_box(spec, coord).shape, ",") + "])" +
                (shape ? "" : "; pass shape= for uneven shards"));
  }
  return DTensor(local, spec);
}

}  // namespace dtensor
