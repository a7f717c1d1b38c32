#include "dtensor/api.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "base/error.h"
#include "collectives/launch_env.h"
#include "collectives/torch_process_group.h"
#include "dtensor/autograd.h"
#include "dtensor/dtensor.h"
#include "dtensor/engine_activity.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"
#include "layout/shard_layout.h"

namespace dtensor::api {
namespace {

// NOTE [leaf gradients keep the parameter's placements]
// A leaf made here with requires_grad (distribute_tensor, the factories) gets a hook that lays
// its gradient out like the leaf before it is accumulated, with one exception: a Partial
// gradient of a replicated leaf (a replicated weight used with a batch- or sequence-sharded
// input) stays Partial there, as in PyTorch, so the backward communicates nothing for it. Its
// reduction runs once, at the first op that needs the value (the optimizer step, a gradient
// norm), and the gradient then keeps the reduced layout (NOTE [a Partial reduced once] in
// dispatch.cc); micro-batches accumulate into it unreduced.
void make_leaf(at::Tensor& t, bool requires_grad) {
  if (!requires_grad) return;
  t.set_requires_grad(true);
  keep_grad_layout(t);
}

bool records_grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

DTensorSpec factory_spec(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                         const Placements& placements, const at::TensorOptions& options,
                         const char* what) {
  if (static_cast<int64_t>(placements.size()) != mesh.ndim()) {
    throw Error(std::string(what) + ": " + std::to_string(placements.size()) +
                " placements for a " + std::to_string(mesh.ndim()) + "-D mesh " + mesh.to_string());
  }
  for (const Placement& p : placements) {
    if (p.is_partial()) {
      throw Error(std::string(what) + ": Partial placements are not allowed");
    }
  }
  return DTensorSpec::make(mesh, placements,
                           TensorMeta::make(size, c10::typeMetaToScalarType(options.dtype())));
}

template <class Make>
at::Tensor factory(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                   const Placements& placements, const at::TensorOptions& options, const char* what,
                   Make make) {
  const DTensorSpec spec = factory_spec(size, mesh, placements, options, what);
  // NOTE [mesh device]: the piece lives on the mesh's device unless options name another.
  const at::TensorOptions local =
      options.has_device() ? options : options.device(mesh.local_device());
  // A general strided shard's piece is not a box (NOTE [strided shards]): it is made in the box
  // layout with the strided dims whole (random draws follow the global tensor there), then the
  // rank's runs are gathered locally.
  const DTensorSpec made = without_strided(spec);
  at::Tensor piece =
      holds_piece(mesh)
          ? make(made, local_box(made, my_coordinate(mesh, what)), local.requires_grad(false))
          : absent_piece(spec, local.requires_grad(false));  // NOTE [ranks outside the mesh]
  if (made != spec) piece = redistribute_local(piece, made, spec);
  at::Tensor t = make_dtensor(piece, spec);
  make_leaf(t, options.requires_grad());
  return t;
}

}  // namespace

void keep_grad_layout(at::Tensor& leaf_tensor) {
  at::Tensor& t = leaf_tensor;
  const DTensorSpec leaf = spec_of(t, "keep_grad_layout");
  t.register_hook([leaf](const at::Tensor& grad) -> at::Tensor {
    Placements want = leaf.placements();
    if (is_dtensor(grad)) {
      const DTensorSpec& g = spec_of(grad);
      for (size_t m = 0; m < want.size(); ++m) {
        if (want[m].is_replicate() && g.placement(static_cast<int64_t>(m)).is_partial()) {
          want[m] = g.placement(static_cast<int64_t>(m));
        }
      }
    }
    collectives::CommCause cause("leaf gradient hook");
    return autograd::relaid(grad, want);
  });
}

std::shared_ptr<collectives::RankContext> init_from_env(const std::string& backend) {
  return collectives::init_from_env(backend);
}

c10::intrusive_ptr<c10d::ProcessGroup> get_group(const DeviceMesh& mesh, int64_t mesh_dim) {
  collectives::RankContext& ctx = collectives::current_context();
  collectives::my_coordinate(mesh, "get_group");
  DTENSOR_CHECK(mesh_dim >= 0 && mesh_dim < mesh.ndim(), "get_group: mesh dim ", mesh_dim, " of a ",
                mesh.ndim(), "-D mesh");
  ctx.register_mesh(mesh);
  return collectives::torch_process_group(mesh.group_name(mesh_dim, ctx.rank()));
}

DeviceMesh init_device_mesh(const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names,
                            c10::DeviceType device_type) {
  if (!collectives::has_current_context()) {
    throw Error(
        "init_device_mesh: this thread has no rank context; call init_from_env() in a launched "
        "process or run ranks with collectives::run_threads");
  }
  collectives::RankContext& ctx = collectives::current_context();
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n != ctx.world_size()) {
    throw Error("init_device_mesh: a mesh of " + std::to_string(n) +
                " ranks does not match the world of " + std::to_string(ctx.world_size()) +
                " ranks");
  }
  DeviceMesh mesh = DeviceMesh::arange(shape, dim_names, device_type);
  ctx.register_mesh(mesh);
  return mesh;
}

at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                             const Placements& placements, std::optional<int64_t> src_rank) {
  if (is_dtensor(tensor)) {
    throw Error("distribute_tensor: the tensor is already distributed (" + to_string(tensor) +
                "); use redistribute");
  }
  const DTensor v = dtensor::distribute_tensor(tensor.detach(), mesh, placements, src_rank);
  at::Tensor t = make_dtensor(v.to_local(), v.spec());
  make_leaf(t, tensor.requires_grad());
  return t;
}

at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                      bool run_check, const std::optional<std::vector<int64_t>>& shape,
                      const std::optional<std::vector<int64_t>>& stride,
                      const ShardOrder& shard_order) {
  if (is_dtensor(local)) {
    throw Error("from_local: the local tensor is already distributed (" + to_string(local) + ")");
  }
  // NOTE [inputs move to the mesh's device]: moved here, differentiably, so that the gradient
  // reaches `local` on its own device.
  const at::Tensor moved = to_mesh_device_type(local, mesh);
  const DTensor v =
      // requires_grad travels with the detached piece: run_check compares it across ranks.
      dtensor::from_local(moved.detach().requires_grad_(moved.requires_grad()), mesh, placements,
                          run_check, shape, stride, shard_order);
  if (records_grad(moved)) return autograd::from_local(moved, v.spec());
  return make_dtensor(v.to_local().detach(), v.spec());
}

at::Tensor to_local(const at::Tensor& dtensor, const std::optional<Placements>& grad_placements) {
  const DTensorSpec& s = spec_of(dtensor, "to_local");
  if (!records_grad(dtensor)) return local_of(dtensor);
  return autograd::to_local(dtensor, grad_spec(s, grad_placements));
}

std::vector<at::Tensor> local_map(
    const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& fn,
    const std::vector<at::Tensor>& inputs, const std::vector<Placements>& out_placements,
    const std::optional<std::vector<Placements>>& in_placements, bool redistribute_inputs) {
  if (in_placements && in_placements->size() != inputs.size()) {
    throw Error("local_map: " + std::to_string(in_placements->size()) + " in_placements for " +
                std::to_string(inputs.size()) + " inputs");
  }
  std::optional<DeviceMesh> mesh;
  std::vector<at::Tensor> pieces;
  pieces.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor t = inputs[i];
    if (!is_dtensor(t)) {
      pieces.push_back(t);
      continue;
    }
    const DTensorSpec& s = spec_of(t, "local_map");
    if (!mesh) {
      mesh = s.mesh();
    } else if (s.mesh() != *mesh) {
      throw Error("local_map: input " + std::to_string(i) + " lives on " + s.mesh().to_string() +
                  " but input 0 on " + mesh->to_string());
    }
    if (in_placements && (*in_placements)[i] != s.placements()) {
      if (!redistribute_inputs) {
        throw Error("local_map: input " + std::to_string(i) + " is " + to_string(t) +
                    " but in_placements wants " + dtensor::to_string((*in_placements)[i]) +
                    "; pass redistribute_inputs=true to move it");
      }
      t = api::redistribute(t, (*in_placements)[i]);
    }
    pieces.push_back(api::to_local(t));
  }
  if (!mesh) throw Error("local_map: no input is a distributed tensor");
  std::vector<at::Tensor> results;
  {
    const LocalKernelScope local;  // NOTE [engine activity]: fn is this rank's local computation
    results = fn(pieces);
  }
  if (results.size() != out_placements.size()) {
    throw Error("local_map: the function returned " + std::to_string(results.size()) +
                " tensors for " + std::to_string(out_placements.size()) + " out_placements");
  }
  std::vector<at::Tensor> out;
  out.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    out.push_back(api::from_local(results[i], *mesh, out_placements[i]));
  }
  return out;
}

at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements, bool async_op) {
  const DTensorSpec& s = spec_of(dtensor, "redistribute");
  const DTensorSpec dst = DTensorSpec::make(s.mesh(), placements, s.meta());
  // Into its own layout: nothing moves, but a tensor that records gradients still gets the
  // redistribute's autograd node, whose backward lays the gradient out as the input is (a
  // Partial gradient of a Replicate input is reduced there, as PyTorch's).
  if (dst == s && !records_grad(dtensor)) return dtensor;
  collectives::CommCause cause("redistribute");
  if (records_grad(dtensor)) return autograd::redistribute(dtensor, dst);
  return make_dtensor(redistribute_local(local_of(dtensor), s, dst, async_op), dst, async_op);
}

at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh,
                        const Placements& placements, bool async_op, const std::string& channel) {
  const DTensorSpec& s = spec_of(dtensor, "redistribute");
  if (mesh == s.mesh()) return redistribute(dtensor, placements, async_op);
  const DTensorSpec dst = DTensorSpec::make(mesh, placements, s.meta());
  collectives::CommCause cause("redistribute");
  if (records_grad(dtensor)) return autograd::redistribute(dtensor, dst);
  const at::Tensor piece = redistribute_across_meshes(local_of(dtensor), s, dst, async_op, channel);
  return make_dtensor(piece, dst, async_op);
}

at::Tensor full_tensor(const at::Tensor& dtensor) {
  const DTensorSpec& s = spec_of(dtensor, "full_tensor");
  my_coordinate(s.mesh(), "full_tensor");  // NOTE [ranks outside the mesh]: raises there
  return to_local(redistribute(dtensor, Placements(s.mesh().ndim(), Replicate())));
}

const DTensorSpec& spec(const at::Tensor& dtensor) { return spec_of(dtensor, "spec"); }
at::Tensor local(const at::Tensor& dtensor) { return local_of(dtensor, "local"); }
std::string to_string(const at::Tensor& dtensor) {
  return value_of(dtensor, "to_string").to_string();
}

at::Tensor empty(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                 const Placements& placements, at::TensorOptions options) {
  return factory(size, mesh, placements, options, "empty",
                 [](const DTensorSpec&, const LocalBox& b, const at::TensorOptions& o) {
                   return at::empty(b.shape, o);
                 });
}

at::Tensor zeros(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                 const Placements& placements, at::TensorOptions options) {
  return factory(size, mesh, placements, options, "zeros",
                 [](const DTensorSpec&, const LocalBox& b, const at::TensorOptions& o) {
                   return at::zeros(b.shape, o);
                 });
}

at::Tensor ones(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                const Placements& placements, at::TensorOptions options) {
  return factory(size, mesh, placements, options, "ones",
                 [](const DTensorSpec&, const LocalBox& b, const at::TensorOptions& o) {
                   return at::ones(b.shape, o);
                 });
}

at::Tensor full(const std::vector<int64_t>& size, const at::Scalar& value, const DeviceMesh& mesh,
                const Placements& placements, at::TensorOptions options) {
  return factory(size, mesh, placements, options, "full",
                 [&value](const DTensorSpec&, const LocalBox& b, const at::TensorOptions& o) {
                   return at::full(b.shape, value, o);
                 });
}

// NOTE [DTensor random] (random.h): the global tensor is drawn chunk by chunk, the box kept (ATen's
// rand and randn are empty(size).uniform_(0, 1) and empty(size).normal_(0, 1)); on a CUDA mesh in
// one draw on the GPU (NOTE [random on a CUDA mesh]).
at::Tensor rand(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                const Placements& placements, at::TensorOptions options) {
  return factory(size, mesh, placements, options, "rand",
                 [](const DTensorSpec& s, const LocalBox& b, const at::TensorOptions& o) {
                   const at::Generator g = rank_generator(o.device());
                   check_generators_agree(s.mesh(), g, "rand");
                   at::Tensor piece = at::empty(b.shape, o);
                   draw_box(s.shape(), b, DrawOrder::kPerElement, g, piece,
                            [&g](const at::Tensor& buf) { return buf.uniform_(0, 1, g); });
                   return piece;
                 });
}

at::Tensor randn(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                 const Placements& placements, at::TensorOptions options) {
  return factory(size, mesh, placements, options, "randn",
                 [](const DTensorSpec& s, const LocalBox& b, const at::TensorOptions& o) {
                   const at::Generator g = rank_generator(o.device());
                   check_generators_agree(s.mesh(), g, "randn");
                   at::Tensor piece = at::empty(b.shape, o);
                   draw_box(s.shape(), b, DrawOrder::kNormalFill, g, piece,
                            [&g](const at::Tensor& buf) { return buf.normal_(0, 1, g); });
                   return piece;
                 });
}

}  // namespace dtensor::api
