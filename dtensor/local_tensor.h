#pragma once
// Cutting a real at::Tensor by a layout: the bridge from shard arithmetic to data.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "device_mesh/device_mesh.h"
#include "layout/shard_layout.h"

namespace dtensor {

// NOTE [inputs move to the mesh's device]
// As PyTorch's DTensor, a tensor given to the engine lands on the mesh's device
// (DeviceMesh::local_device, NOTE [mesh device]) first: distribute_tensor moves a tensor that is
// anywhere else (a CPU tensor onto a CUDA mesh, or one on another GPU), from_local a piece whose
// device *type* differs from the mesh's (PyTorch's local_tensor.to(device_mesh.device_type)), so a
// CPU piece on a CUDA mesh becomes a CUDA piece and its gradient flows back to the CPU tensor.
// Meta tensors stay where they are (shapes only), as in PyTorch. `t` itself when nothing moves.
at::Tensor to_mesh_device(const at::Tensor& t, const DeviceMesh& mesh);
at::Tensor to_mesh_device_type(const at::Tensor& t, const DeviceMesh& mesh);

// The view of `global` that `box` covers (narrow per dim; shares storage with `global`).
at::Tensor slice_box(const at::Tensor& global, const LocalBox& box);
// The part of `piece` (which holds the box `whole` of the global tensor) that the box `part`
// covers: a view.
at::Tensor sub_box(const at::Tensor& piece, const LocalBox& whole, const LocalBox& part);

// The part of `global` the rank at `coordinate` holds under `spec`, Partial dims read as
// Replicate: the view slice_box(global, local_box(...)), or under a general strided shard its
// runs concatenated (a copy: NOTE [strided shards]).
at::Tensor local_piece(const at::Tensor& global, const DTensorSpec& spec,
                       const std::vector<int64_t>& coordinate);

// The local tensor the rank at `coordinate` holds for `spec`, as a fresh contiguous tensor
// (distribute_tensor with every rank holding the data). Shard dims slice. A Partial mesh dim is
// filled so that its reduction gives back `global` exactly, integers included: sum and bxor keep
// the value at coordinate 0 and put zeros elsewhere, product puts ones elsewhere, and avg, min,
// max, band and bor keep the value on every coordinate.
at::Tensor local_tensor_for(const at::Tensor& global, const DTensorSpec& spec,
                            const std::vector<int64_t>& coordinate);

// One rank's share of a Partial(op) whose reduction over the mesh dim is `value`: `value` itself
// on the holder (coordinate 0), and on the others the op's identity for sum and bxor (0) and
// product (1), or `value` again for the idempotent ops (avg, min, max, band, bor). A fresh tensor.
at::Tensor partial_share(const at::Tensor& value, ReduceOp op, bool holder);

// The masked lookup of a row-sharded embedding (PyTorch's MaskPartial): `weight_piece` is this
// rank's piece of a weight laid out by `weight_spec` (rows possibly sharded); rows this rank does
// not hold contribute zeros, so the Partial(sum) of the ranks' results is at::embedding(weight,
// idx). `out_shape` is this rank's output shape (used when it holds no rows).
at::Tensor masked_embedding(const at::Tensor& weight_piece, const at::Tensor& idx,
                            const DTensorSpec& weight_spec, const std::vector<int64_t>& coordinate,
                            const std::vector<int64_t>& out_shape);

}  // namespace dtensor
