// The local kernel's run on this rank's pieces, and what happens when it raises on some ranks
// only: NOTE [local op failures].

#include <ATen/ATen.h>

#include <exception>

#include "base/stable_hash.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/engine_activity.h"
#include "dtensor/program_digest.h"

namespace dtensor::dispatch_detail {
namespace {

// NOTE [local op failures]
// The local kernel raises on some ranks only. Two cases:
// - This rank's pieces are empty (an uneven Shard leaves the last ranks nothing: 5 rows on 4
//   ranks) and the kernel refuses an empty input where one device runs fine (torch 2.x's MKL FFT
//   raises "Inconsistent configuration parameters" for a 0-row batch). Every output's piece on
//   this rank is then empty too, so its value is fully known: an empty tensor of the propagated
//   local shape and dtype, which is what the op returns here.
// - Otherwise the error goes up unchanged, and the failure is folded into this rank's program
//   digest (NOTE [program digest]): its peers ran the op, so the next collective on the mesh
//   fails on every rank ("ranks disagree: program ..."), promptly, never pairing this rank's
//   later calls with the peers' pending ones. A rank thread that leaves with the error marks its
//   groups (RankContext::leave), so peers already waiting fail at once as well. A local result
//   that does not fit its propagated piece (a wrong rule that shows on some ranks only, as an
//   empty piece's shape) is folded in the same way before wrap() raises.
// python/local_failure_test.py covers both (and an op with no outputs, which always re-raises).

// The empty pieces of every output on this rank, or nothing when a piece is not empty (or the op
// writes an argument, or returns other than tensors).
std::optional<std::vector<at::Tensor>> empty_pieces(const c10::FunctionSchema& schema,
                                                    const OpInfo& info,
                                                    const sharding::OpSharding& s) {
  // An op with no outputs (_linalg_check_errors) raises to say something: never swallowed.
  if (!info.written.empty() || s.outputs.empty() || s.outputs.size() != schema.returns().size())
    return std::nullopt;
  for (const c10::Argument& r : schema.returns()) {
    if (r.type()->kind() != c10::TypeKind::TensorType) return std::nullopt;
  }
  std::vector<at::Tensor> empties;
  for (const DTensorSpec& spec : s.outputs) {
    const std::vector<int64_t>& shape = my_piece_shape(spec);
    if (c10::multiply_integers(shape) != 0) return std::nullopt;
    empties.push_back(at::empty(
        shape, at::TensorOptions().dtype(spec.meta().dtype).device(spec.mesh().local_device())));
  }
  return empties;
}

}  // namespace

void run_local_kernel(const c10::OperatorHandle& op, const OpInfo& info,
                      const c10::FunctionSchema& schema, const sharding::OpSharding& s,
                      torch::jit::Stack* stack, size_t n) {
  const size_t base = stack->size() - n;
  try {
    const LocalKernelScope local;
    op.callBoxed(stack);
  } catch (const std::exception&) {
    if (auto empties = empty_pieces(schema, info, s)) {
      stack->resize(base);
      for (at::Tensor& t : *empties) stack->push_back(std::move(t));
      return;
    }
    if (program_check_enabled()) {
      const DeviceMesh& mesh =
          s.outputs.empty() ? s.input_targets.at(0).mesh() : s.outputs[0].mesh();
      record_program_op(mesh, kLocalFailure, fnv1a(info.name));
    }
    throw;
  }
}

}  // namespace dtensor::dispatch_detail
