// NOTE [ranks outside the mesh] (redistribute.h), the dispatcher's side: an op whose distributed
// inputs live on a mesh this rank is not in returns the propagated outputs as empty pieces.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "base/error.h"
#include "collectives/rank_context.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/redistribute.h"

namespace dtensor::dispatch_detail {
namespace {

// The outputs' specs: the propagator's, or for an op without a rule (run by the replicate
// fallback on the mesh's ranks) Replicate specs of ATen's output metadata.
std::vector<DTensorSpec> output_specs(const c10::OperatorHandle& op, const OpInfo& info,
                                      const Inputs& inputs, const c10::IValue* args, size_t n) {
  if (entry_of(info) != nullptr) {
    const auto s = propagate_inputs(op, info, inputs, args, n);
    if (!s->run_replicated && !s->in_place_by_copy) return s->outputs;
  }
  const DeviceMesh& mesh = inputs.at(0).spec.mesh();
  const auto metas = aten_output_metas(op, info, inputs, args, n);
  DTENSOR_CHECK(metas.has_value(), info.name, " on rank ", collectives::current_context().rank(),
                ", which is not in ", mesh.to_string(),
                ": ATen has no meta kernel to give its outputs' shapes");
  std::vector<DTensorSpec> out;
  for (const auto& m : *metas) {
    if (m) out.push_back(DTensorSpec::make(mesh, Placements(mesh.ndim(), Replicate()), *m));
  }
  return out;
}

}  // namespace

void run_outside_mesh(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                      c10::IValue* args, size_t n, const Inputs& inputs,
                      const c10::SmallVector<at::Tensor, 8>& originals) {
  const c10::FunctionSchema& schema = op.schema();
  const DeviceMesh& mesh = inputs.at(0).spec.mesh();
  for (const c10::Argument& r : schema.returns()) {
    const bool tensors = r.type()->kind() == c10::TypeKind::TensorType ||
                         (r.type()->kind() == c10::TypeKind::ListType &&
                          r.type()->containedType(0)->kind() == c10::TypeKind::TensorType);
    if (!tensors) {
      fail(info.name, " on rank ", collectives::current_context().rank(), ", which is not in ",
           mesh.to_string(), ": its ", r.type()->str(),
           " result exists only on the mesh's ranks (call it there, or on a mesh with this rank)");
    }
  }
  const std::vector<DTensorSpec> specs = output_specs(op, info, inputs, args, n);
  const at::TensorOptions options = inputs.at(0).local.options();
  size_t next = 0;  // the next output's spec
  auto next_spec = [&]() -> const DTensorSpec& {
    TORCH_INTERNAL_ASSERT(next < specs.size(), info.name, ": fewer output specs than outputs");
    return specs[next++];
  };
  const size_t returns = schema.returns().size();
  std::vector<c10::IValue> results;
  for (size_t j = 0; j < returns; ++j) {
    const c10::TypePtr& type = schema.returns()[j].type();
    const int writes = info.return_alias[j];
    if (type->kind() == c10::TypeKind::TensorType && writes >= 0 && originals[writes].defined()) {
      const DTensorSpec& spec = next_spec();
      // In-place view ops change self's spec (t_ of Shard(0) is Shard(1)); out= keeps its own.
      if (!info.is_out[writes] && spec != spec_of(originals[writes])) {
        dtensor_impl(originals[writes])->set(absent_piece(spec, options), spec);
      }
      results.emplace_back(originals[writes]);
    } else if (type->kind() == c10::TypeKind::TensorType) {
      const DTensorSpec& spec = next_spec();
      results.emplace_back(make_dtensor(absent_piece(spec, options), spec));
    } else {  // a tensor list, whose length the specs give only when it is the last return
      DTENSOR_CHECK(j + 1 == returns, info.name, ": a tensor list before other returns");
      c10::List<at::Tensor> list;
      while (next < specs.size()) {
        const DTensorSpec& spec = next_spec();
        list.push_back(make_dtensor(absent_piece(spec, options), spec));
      }
      results.emplace_back(std::move(list));
    }
  }
  torch::jit::drop(*stack, n);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
}

}  // namespace dtensor::dispatch_detail
