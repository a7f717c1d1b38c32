#pragma once
// The C++ API for servers and training loops: one header. Distributed tensors are at::Tensors
// (dtensor_impl.h): every ATen call accepts them and returns distributed results (dispatch.h),
// autograd trains them, random ops match one device (random.h). Names follow
// torch.distributed.tensor.
//
//   auto ctx = dtensor::api::init_from_env();                 // torchrun / ./x launch variables
//   DeviceMesh mesh = dtensor::api::init_device_mesh({2, 2});
//   at::Tensor w = dtensor::api::distribute_tensor(weight, mesh, {Shard(0), Replicate()});
//   at::Tensor y = at::relu(at::mm(x, w.t()));                // distributed in, distributed out
//   at::Tensor full = dtensor::api::full_tensor(y);

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "device_mesh/device_mesh.h"
#include "dtensor/dispatch.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/flop_counter.h"
#include "dtensor/random.h"
#include "layout/placement.h"

namespace c10d {
class ProcessGroup;  // torch/csrc/distributed/c10d/ProcessGroup.hpp (get_group's callers include
                     // it)
}  // namespace c10d

namespace dtensor::api {

using dtensor::DeviceMesh;
using dtensor::DTensorSpec;
using dtensor::Partial;
using dtensor::Placement;
using dtensor::Placements;
using dtensor::Replicate;
using dtensor::Shard;

// ---- meshes ----
// Joins the job described by the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) on `backend` (empty: $DTENSOR_BACKEND, else shm) and makes it this process's
// context. Ranks that are threads use collectives::run_threads instead.
std::shared_ptr<collectives::RankContext> init_from_env(const std::string& backend = "");
// A mesh of `shape` over ranks 0..N-1 of the current context, whose world size must equal the
// mesh size; registers its groups. `device_type`: where its tensors live (NOTE [mesh device]; for
// CUDA the calling thread's current device, which the caller selects, e.g. LOCAL_RANK).
DeviceMesh init_device_mesh(const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names = {},
                            c10::DeviceType device_type = c10::DeviceType::CPU);
// The c10d ProcessGroup of this rank's group along `mesh_dim` (PyTorch's DeviceMesh.get_group),
// registered by name: torch's collectives and functional collectives run on it through the
// engine's backend of that group (NOTE [mesh groups as torch process groups]). Throws when this
// rank is not in the mesh.
c10::intrusive_ptr<c10d::ProcessGroup> get_group(const DeviceMesh& mesh, int64_t mesh_dim);

// ---- construction and movement (differentiable) ----
// See dtensor::distribute_tensor: with src_rank, rank src_rank's data is scattered. The result
// is a leaf that requires grad when `tensor` does.
at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                             const Placements& placements,
                             std::optional<int64_t> src_rank = std::nullopt);
// Wraps this rank's piece; gradients flow back to `local`. A piece of another device type than the
// mesh's moves to the mesh's device first (NOTE [inputs move to the mesh's device]).
at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                      bool run_check = false,
                      const std::optional<std::vector<int64_t>>& shape = std::nullopt,
                      const std::optional<std::vector<int64_t>>& stride = std::nullopt,
                      const ShardOrder& shard_order = {});
// This rank's piece, differentiable (NOTE [DTensor autograd] in dtensor.h).
at::Tensor to_local(const at::Tensor& dtensor,
                    const std::optional<Placements>& grad_placements = std::nullopt);
// The global tensor on every rank.
at::Tensor full_tensor(const at::Tensor& dtensor);
// The same tensor laid out by `placements` (a planned redistribute). async_op: the piece is
// waited for on first use.
at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements,
                        bool async_op = false);
// The same tensor on another mesh (other ranks, another shape), laid out by `placements`:
// NOTE [cross-mesh redistribute] (dtensor/redistribute.h). Every rank of either mesh calls it; a
// rank outside the source mesh passes the source's absent piece (a factory or from_local there
// makes one) and a rank outside `mesh` gets the absent piece of the result. Differentiable: the
// gradient goes back the same way. async_op: a rank that only sends returns at once. `channel`
// names the exchange's group among those over the same ranks (a pipeline's activations and its
// gradients each keep their own order).
at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh,
                        const Placements& placements, bool async_op = false,
                        const std::string& channel = "");

// ---- local computation (PyTorch's local_map) ----
// Runs `fn` on this rank's pieces of `inputs` (distributed tensors; plain ones pass as they are)
// and wraps its i-th result as a distributed tensor on the inputs' mesh with out_placements[i],
// the global shape inferred from the piece as from_local does (even shards). fn must compute
// exactly the piece those placements give this rank: nothing is checked or communicated, as in
// PyTorch. in_placements (one per input; ignored for plain ones): each distributed input must
// have them, or is moved to them when redistribute_inputs. Differentiable through to_local and
// from_local. One engine entry per input and per result instead of one per op inside fn.
std::vector<at::Tensor> local_map(
    const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& fn,
    const std::vector<at::Tensor>& inputs, const std::vector<Placements>& out_placements,
    const std::optional<std::vector<Placements>>& in_placements = std::nullopt,
    bool redistribute_inputs = false);

// Makes the gradient that reaches `leaf` (a distributed leaf that requires grad) take the leaf's
// placements before it is accumulated (NOTE [leaf gradients keep the parameter's placements]).
// distribute_tensor and the factories do it; call it for leaves made otherwise (e.g. a Python
// nn.Parameter wrapping a distributed tensor).
void keep_grad_layout(at::Tensor& leaf);

// ---- inspection ----
using dtensor::is_dtensor;
// The spec (mesh, placements, global meta); throws for a plain tensor.
const DTensorSpec& spec(const at::Tensor& dtensor);
// The piece without autograd (waits for a pending redistribute); throws for a plain tensor.
at::Tensor local(const at::Tensor& dtensor);
// "DTensor([S(0),R] on (2,2) f32[8,8], local f32[4,8])".
std::string to_string(const at::Tensor& dtensor);

// ---- factories: the piece of the global tensor on this rank ----
// On the mesh's device (NOTE [mesh device]) unless `options` names a device.
at::Tensor empty(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                 const Placements& placements, at::TensorOptions options = {});
at::Tensor zeros(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                 const Placements& placements, at::TensorOptions options = {});
at::Tensor ones(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                const Placements& placements, at::TensorOptions options = {});
at::Tensor full(const std::vector<int64_t>& size, const at::Scalar& value, const DeviceMesh& mesh,
                const Placements& placements, at::TensorOptions options = {});
// The values torch::rand / torch::randn give on one device after the same seed.
at::Tensor rand(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                const Placements& placements, at::TensorOptions options = {});
at::Tensor randn(const std::vector<int64_t>& size, const DeviceMesh& mesh,
                 const Placements& placements, at::TensorOptions options = {});
using dtensor::manual_seed;
// Random ops draw the global tensor in chunks of this many elements (NOTE [DTensor random]).
using dtensor::random_chunk_elements;
using dtensor::set_random_chunk_elements;

// ---- modes and debugging ----
using dtensor::explain;
using dtensor::ReplicatePlainTensorsGuard;
using dtensor::StrictModeGuard;
// Counts the collectives the calling rank issues while alive, with the op that caused each
// (CommCounter::counts_by_cause, to_string).
using CommDebugMode = collectives::CommCounter;
// Counts the FLOPs of the local ATen calls the calling rank runs while alive, by op (NOTE [FLOP
// counter]); op_flops gives the same count for plain tensors.
using dtensor::FlopCounter;
using dtensor::op_flops;

}  // namespace dtensor::api
