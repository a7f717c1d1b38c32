#pragma once
// DTensor as a value: a local at::Tensor (this rank's piece) plus the interned spec of the global
// tensor, with PyTorch's constructors and movements: distribute_tensor, from_local, to_local,
// full_tensor, redistribute: the value and its movement, differentiable through the one autograd
// stack (autograd.h). Operators on distributed tensors go through api.h (at::Tensor).
//
// NOTE [DTensor autograd]
// redistribute, from_local, to_local and full_tensor record nodes (autograd.h) whose backward
// moves the gradient with a planned redistribute. Gradients cross
// these nodes in one convention: the layout of the forward tensor with every Partial(op) read as
// Replicate (PyTorch's Redistribute.backward normalisation: the gradient of each share of a
// Partial value is the gradient of the whole value). Hence:
//  - redistribute: the gradient follows the reverse plan, from the normalised target to the
//    normalised source (a Partial source gets a Replicate gradient);
//  - to_local(grad_placements): the local gradient is taken to have `grad_placements` (default:
//    the normalised placements) and is redistributed into the convention (e.g. a Partial
//    gradient is all-reduced);
//  - from_local: the gradient passes through unchanged (the convention's local shape is the
//    forward local shape);
//  - full_tensor: redistribute to all-Replicate, then to_local.
// One corner differs from PyTorch on purpose: PyTorch's to_local() on a Partial DTensor without
// grad_placements labels the gradient Partial, so whether it is later all-reduced depends on
// which node consumes it; here it is always the (replicated) gradient of the whole value.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "sharding_prop/redistribute_plan.h"

namespace dtensor {

class DTensor {
 public:
  // Wraps without checks: `local` must be this rank's piece of `spec` (use from_local to check).
  DTensor(at::Tensor local, DTensorSpec spec) : local_(std::move(local)), spec_(spec) {}

  const DTensorSpec& spec() const { return spec_; }
  const DeviceMesh& device_mesh() const { return spec_.mesh(); }
  const Placements& placements() const { return spec_.placements(); }
  // Global shape, stride and dtype.
  const std::vector<int64_t>& shape() const { return spec_.shape(); }
  const std::vector<int64_t>& stride() const { return spec_.meta().stride; }
  c10::ScalarType dtype() const { return spec_.meta().dtype; }
  bool requires_grad() const { return local_.requires_grad(); }

  // This rank's local tensor (waits for a pending async redistribute). With `grad_placements`,
  // the gradient that reaches it is read with those placements (see NOTE [DTensor autograd]).
  at::Tensor to_local(const std::optional<Placements>& grad_placements = std::nullopt) const;
  // The global tensor on every rank of the mesh (a redistribute to all-Replicate).
  at::Tensor full_tensor() const;
  // The same tensor laid out by `placements` on the same mesh. async_op: the local tensor may be
  // pending until to_local() (or collectives::wait_tensor); autograd forces a synchronous run.
  DTensor redistribute(const Placements& placements, bool async_op = false) const;
  // On another mesh: NOTE [cross-mesh redistribute] (redistribute.h); every rank of either mesh
  // calls it, with the absent piece where it holds none.
  DTensor redistribute(const DeviceMesh& mesh, const Placements& placements,
                       bool async_op = false) const;

  // "DTensor([S(0),R] on (2,2) f32[8,8], local f32[4,8])".
  std::string to_string() const;

 private:
  at::Tensor local_;
  DTensorSpec spec_;
};

// Lays `tensor` out on `mesh` (Shard and Replicate placements; Partial is refused, as in
// PyTorch). src_rank empty: every rank passes the same full tensor and keeps its slice, with no
// communication. src_rank r: rank r's tensor is the data; the others pass a tensor of the same
// shape and dtype (its values are ignored) and receive exactly their slice from rank r. A
// tensor not on the mesh's device is moved there first (NOTE [inputs move to the mesh's device]).
DTensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                          const Placements& placements,
                          std::optional<int64_t> src_rank = std::nullopt);

// Wraps this rank's `local` piece. Without `shape`, the global shape assumes even shards (the
// local size times the number of shards, as PyTorch does); with `shape` (and optionally
// `stride`), uneven local shapes are accepted. run_check: every rank's local shape, dtype and
// requires_grad are exchanged and checked against the layout (a mismatch is an error on every rank,
// naming the ranks), and, as in PyTorch, each Replicate mesh dim's first rank broadcasts its data
// so the replicas agree (written into `local`). A piece whose device type is not the mesh's is
// moved to the mesh's device (NOTE [inputs move to the mesh's device]; then the result does not
// share `local`). `shard_order`: the order in which mesh dims split each tensor dim (DTensorSpec's;
// empty: ascending, PyTorch's default; FSDP over TP splits by the TP dim first).
DTensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                   bool run_check = false,
                   const std::optional<std::vector<int64_t>>& shape = std::nullopt,
                   const std::optional<std::vector<int64_t>>& stride = std::nullopt,
                   const ShardOrder& shard_order = {});

// The layout a local gradient is read in: `grad_placements` (checked to give this rank the same
// local shape as `spec`), or the convention (`spec` without Partial).
DTensorSpec grad_spec(const DTensorSpec& spec, const std::optional<Placements>& grad_placements);

}  // namespace dtensor
