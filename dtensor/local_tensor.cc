#include "dtensor/local_tensor.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "base/error.h"

namespace dtensor {

at::Tensor to_mesh_device(const at::Tensor& t, const DeviceMesh& mesh) {
  if (t.is_meta()) return t;
  const c10::Device device = mesh.local_device();
  return t.device() == device ? t : t.to(device);
}

at::Tensor to_mesh_device_type(const at::Tensor& t, const DeviceMesh& mesh) {
  if (t.is_meta() || t.device().type() == mesh.device_type()) return t;
  return t.to(mesh.local_device());
}

at::Tensor slice_box(const at::Tensor& global, const LocalBox& box) {
  if (global.dim() != static_cast<int64_t>(box.shape.size())) {
    throw Error("slice_box: a " + std::to_string(box.shape.size()) + "-D box does not fit a " +
                std::to_string(global.dim()) + "-D tensor");
  }
  at::Tensor out = global;
  for (int64_t d = 0; d < global.dim(); ++d) out = out.narrow(d, box.offset[d], box.shape[d]);
  return out;
}

at::Tensor sub_box(const at::Tensor& piece, const LocalBox& whole, const LocalBox& part) {
  at::Tensor out = piece;
  for (size_t d = 0; d < part.shape.size(); ++d) {
    const int64_t at = part.shape[d] == 0 ? 0 : part.offset[d] - whole.offset[d];
    out = out.narrow(static_cast<int64_t>(d), at, part.shape[d]);
  }
  return out;
}

at::Tensor local_piece(const at::Tensor& global, const DTensorSpec& spec,
                       const std::vector<int64_t>& coordinate) {
  if (!spec.has_strided_shard()) return slice_box(global, local_box(spec, coordinate));
  at::Tensor out = global;
  const auto runs = local_runs(spec, coordinate);
  for (int64_t d = 0; d < global.dim(); ++d) {
    if (runs[d].size() == 1) {
      out = out.narrow(d, runs[d][0].offset, runs[d][0].size);
      continue;
    }
    std::vector<at::Tensor> parts;
    for (const ChunkSlice& r : runs[d]) parts.push_back(out.narrow(d, r.offset, r.size));
    out = at::cat(parts, d);
  }
  return out;
}

at::Tensor local_tensor_for(const at::Tensor& global, const DTensorSpec& spec,
                            const std::vector<int64_t>& coordinate) {
  if (global.sizes().vec() != spec.shape()) {
    throw Error("local_tensor_for: tensor of shape " + c10::str(global.sizes()) +
                " does not match the spec " + spec.to_string());
  }
  at::Tensor local = local_piece(global, spec, coordinate).clone(at::MemoryFormat::Contiguous);
  for (int64_t m = 0; m < spec.mesh().ndim(); ++m) {
    const Placement p = spec.placement(m);
    if (p.is_partial()) local = partial_share(local, p.reduce_op(), coordinate[m] == 0);
  }
  return local;
}

at::Tensor partial_share(const at::Tensor& value, ReduceOp op, bool holder) {
  at::Tensor share;
  switch (holder ? ReduceOp::kAvg : op) {
    case ReduceOp::kSum:
    case ReduceOp::kBxor:
    case ReduceOp::kNorm:  // signed powers give the holder's value back (NOTE [p-norm Partial])
      share = at::zeros_like(value, at::MemoryFormat::Contiguous);
      break;
    case ReduceOp::kProduct:
      share = at::ones_like(value, at::MemoryFormat::Contiguous);
      break;
    default:  // the holder's, and avg, min, max, band, bor: idempotent on equal values
      share = value.clone(at::MemoryFormat::Contiguous);
      break;
  }
  // A Python number's tensor (`x.sum() + 1e-6`) stays one, so type promotion still reads it as
  // a number: a float32 sum plus a share that became a double 0-dim tensor would be double.
  if (value.unsafeGetTensorImpl()->is_wrapped_number()) {
    share.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return share;
}

at::Tensor masked_embedding(const at::Tensor& weight_piece, const at::Tensor& idx,
                            const DTensorSpec& weight_spec, const std::vector<int64_t>& coordinate,
                            const std::vector<int64_t>& out_shape) {
  const LocalBox box = local_box(weight_spec, coordinate);
  const int64_t rows = box.shape[0];
  if (rows == weight_spec.shape()[0]) return at::embedding(weight_piece, idx);
  // An index outside the global table is an error, as on one device (the masks below would
  // make its row zeros on every rank: a silent wrong answer). _assert_async raises here on
  // the CPU and as a device-side assert on CUDA, without a host sync on the hot path.
  const int64_t num = weight_spec.shape()[0];
  at::_assert_async(idx.ge(0).logical_and(idx.lt(num)).all(),
                    "aten::embedding: index out of range in self (an index is outside [0, " +
                        std::to_string(num) + ") of the row-sharded weight " +
                        weight_spec.to_string() + ")");
  if (rows == 0) return at::zeros(out_shape, weight_piece.options());
  const int64_t lo = box.offset[0];
  const at::Tensor hit = idx.ge(lo).logical_and(idx.lt(lo + rows));
  const at::Tensor found = at::embedding(weight_piece, (idx - lo).clamp(0, rows - 1));
  return found * hit.unsqueeze(-1).to(weight_piece.scalar_type());
}

}  // namespace dtensor
