#pragma once
// The redistribute executor: runs a RedistributePlan (redistribute_plan.h) on this rank's local
// tensor with the functional collectives, over the groups of the plan's mesh in the calling
// thread's collectives context (collectives/rank_context.h).
//
// NOTE [redistribute execution]
// - Every step but a no-op plan yields a fresh tensor: the caller's input is never aliased by the
//   result (local_chunk copies its slice; collectives return new tensors).
// - Buffers are padded only for an uneven all_to_all or reduce_scatter (PlanStep::padded):
//   pieces are padded to equal chunks, exchanged, and trimmed; all_gather and all_to_all_v move
//   uneven pieces exactly.
// - async_op: the last step, when it is a collective whose output needs no further local work,
//   is issued asynchronously (wait with collectives::wait_tensor); earlier steps, and a last step
//   that must trim padding or unpack, run synchronously (their results are needed at once), as
//   PyTorch's redistribute waits on every intermediate collective.

#include <ATen/core/Tensor.h>

#include "collectives/rank_context.h"
#include "sharding_prop/cross_mesh_plan.h"
#include "sharding_prop/redistribute_plan.h"

namespace dtensor {

// `local` must have the local shape of plan.src on this rank (checked). Returns the local tensor
// of plan.dst on this rank; `local` itself when the plan is a no-op.
at::Tensor execute_plan(const RedistributePlan& plan, const at::Tensor& local,
                        bool async_op = false);

// This rank's coordinate in a mesh: collectives::my_coordinate (collectives/rank_context.h).
using collectives::my_coordinate;

// NOTE [ranks outside the mesh]
// As PyTorch's, a distributed tensor exists on every rank of the job, also on the ranks outside
// its mesh (a sub-mesh's tensor): there it holds no piece (its local tensor is empty: [0], or a
// 0-d zero for a 0-d tensor) and carries the global metadata. Factories, from_local,
// distribute_tensor, redistribute and ops on such a rank compute the result's spec and nothing
// else: no kernel, no collective, no draw. What exists only on the mesh's ranks raises there,
// naming the op: full_tensor() and an op's non-tensor result (equal, item) -- PyTorch answers
// those with an empty tensor or a default value, which would be a silent wrong answer.
bool holds_piece(const DeviceMesh& mesh);
// The local tensor of `spec` on a rank outside its mesh.
at::Tensor absent_piece(const DTensorSpec& spec, const at::TensorOptions& options);

// This rank's group over mesh dims `dims` (ascending) of `mesh`: the ranks that share its
// coordinates on the other dims, in row-major order of `dims`; registered in the calling
// thread's collectives context. `my_index` receives this rank's position in it.
std::string group_over_dims(const DeviceMesh& mesh, const std::vector<int64_t>& dims,
                            int64_t* my_index = nullptr);

// NOTE [pieces in the spec's layout]: the engine keeps a distributed tensor's piece laid out as
// its global strides say (the dense layout in their order): reshape and view are decomposed by
// ATen on the global strides, and the piece's own view must then succeed. Collectives return
// row-major buffers and autograd lays gradients out as it likes, so a piece made by either for
// a spec whose strides are not row-major (a transposed tensor, to_local's gradient) had another
// layout, and `view` raised "view size is not compatible" where one device's tensor viewed
// (torchtitan's attention on local heads could not train). in_spec_layout returns `piece`
// itself when its strides are those, else a copy in that layout; each rank decides from the
// spec and its own piece, with no communication either way. Not done: an async_op redistribute's
// result (its collective still running) keeps the collective's row-major buffer.
at::Tensor in_spec_layout(const at::Tensor& piece, const DTensorSpec& spec);

// plan_redistribute + execute_plan; between two meshes plan_cross_mesh + execute_cross_mesh.
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src,
                              const DTensorSpec& dst, bool async_op = false,
                              PlanOptions options = {});

// Runs a cross-mesh plan (NOTE [cross-mesh redistribute] in sharding_prop/cross_mesh_plan.h):
// `local` is this rank's piece of plan.src (its absent piece on a rank outside the source mesh);
// returns its piece of plan.dst (the absent piece outside the
// destination mesh). Every rank of either mesh calls it; `tag` names the exchange's group (two
// tags over the same ranks are two independent FIFO channels: a pipeline's activations and
// gradients). `async_op`: on a rank that receives nothing and holds no piece of the result, the
// exchange is left running and the result is waited for at its first use; until then `local`
// must not change (it may be the send buffer itself, as a functional collective's input is).
// The result may be the exchange's output buffer itself (when the received boxes tile it in
// order), so it is row-major.
at::Tensor execute_cross_mesh(const CrossMeshPlan& plan, const at::Tensor& local,
                              bool async_op = false, const std::string& tag = "");

// execute_cross_mesh(plan_cross_mesh(src, dst)), through box layouts when either side has a
// general strided shard (NOTE [strided shards]): _S -> R on the source mesh first, R -> _S on
// the destination mesh after.
at::Tensor redistribute_across_meshes(const at::Tensor& local, const DTensorSpec& src,
                                      const DTensorSpec& dst, bool async_op = false,
                                      const std::string& tag = "");

}  // namespace dtensor
