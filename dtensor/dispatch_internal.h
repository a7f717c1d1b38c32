#pragma once
// Internal to the dispatch kernel (dispatch.cc), shared with its parts in dispatch_metadata.cc
// (output metadata from ATen) and dispatch_fallback.cc (the replicate fallback). Not an API.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <absl/container/inlined_vector.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dispatch_args.h"
#include "layout/dtensor_spec.h"
#include "sharding_prop/ops/registry.h"
#include "sharding_prop/propagator.h"

namespace dtensor::dispatch_detail {

// What the kernel keeps per operator: its table entry and what the schema says about its
// arguments.
struct OpInfo {
  std::string name;        // "aten::add.Tensor"
  uint64_t name_hash = 0;  // fnv1a(name): call_digest's seed (NOTE [program digest])
  OpArgs args;
  sharding::Execution execution = sharding::Execution::kPieces;
  std::vector<int> return_alias;   // per return: the argument it writes (in-place/out=), or -1
  std::vector<bool> is_out;        // per argument: an out= argument (not an input)
  std::vector<bool> is_scalar;     // per argument: of schema type Scalar (only its kind matters)
  std::vector<int> written;        // the arguments the op writes (in-place self, out=)
  std::vector<bool> returns_view;  // per return: a view of an argument (not written)
  int generator_arg = -1;
  int pin_memory_arg = -1;   // a factory's pin_memory (NOTE [output metadata from ATen])
  bool per_element = false;  // an aten::_foreach_* op: NOTE [foreach ops per element]
  bool amp_unscale = false;  // GradScaler's unscale: NOTE [amp unscale]
  bool same_size = false;    // is_same_size: the global shapes compared (plain tensors allowed)
  // The table entry, looked up on first use when it was missing (register_rule may add it later).
  mutable std::atomic<const sharding::OpEntry*> entry{nullptr};
};

// One tensor input found in the arguments: where it sits and what it is.
struct Input {
  int arg;
  int element;  // position in a tensor list, or -1
  DTensorSpec spec;
  at::Tensor local;
};
// An op's distributed inputs: inline for the usual few (no heap allocation per call).
using Inputs = absl::InlinedVector<Input, 4>;

// This rank's coordinate on `mesh` (an error naming "DTensor op" when it is not in the mesh).
const std::vector<int64_t>& my_coordinate(const DeviceMesh& mesh);

// "aten::add.Tensor": an operator's name with its overload.
std::string op_name(const c10::OperatorName& n);
// The operator's OpInfo (made once, then a per-thread lookup; dispatch_op_info.cc).
const OpInfo& info_for(const c10::OperatorHandle& op);
// Its table entry, or null.
const sharding::OpEntry* entry_of(const OpInfo& info);
// The propagator's answer for these inputs and arguments.
std::shared_ptr<const sharding::OpSharding> propagate_inputs(const c10::OperatorHandle& op,
                                                             const OpInfo& info,
                                                             const Inputs& inputs,
                                                             const c10::IValue* args, size_t n);
// The boxed kernel of distributed tensors (every op; the hot ops' unboxed kernels call it when
// their fast path does not apply: NOTE [unboxed fast path]).
void kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Registers the unboxed kernels of the hot ops (dispatch_fast.cc) at the distributed tensors'
// key; `fast_op_names` lists them, for the boxed registrations to skip.
void register_fast_kernels(torch::Library& lib);
const std::vector<std::string>& fast_op_names();

// A local tensor's metadata: shape, dtype, strides.
TensorMeta meta_of(const at::Tensor& t);

// Puts `local` where `in` sits in the arguments (a tensor list or a Tensor?[] is copied, then
// set).
void put(c10::IValue* args, const Input& in, const at::Tensor& local);

// The tensor at `element` of argument `v` (v itself when element < 0; NOTE [index tensors]).
at::Tensor element_of(const c10::IValue& v, int element);

// 0-dim and one-element plain tensors are replicated scalars, as in PyTorch.
inline bool is_plain_scalar(const at::Tensor& t) { return t.dim() == 0 || t.numel() == 1; }
// Adds the plain tensors at `plain` ((argument, element) of `args`) as Replicate inputs on the
// distributed inputs' mesh, then puts every input in argument order (rules read them so).
void add_replicated_inputs(Inputs& inputs, const std::vector<std::pair<int, int>>& plain,
                           const c10::IValue* args);

// NOTE [output metadata from ATen] (propagator.h), the dispatcher's side (dispatch_metadata.cc):
// the call's non-tensor arguments encoded for the cache key, and the outputs' metadata from the
// op run on meta tensors of the global inputs.
void encode_call(const OpInfo& info, const c10::IValue* args, size_t n, std::vector<int64_t>& out);
// NOTE [program digest]: a deterministic hash of the op's name and the values of its non-tensor
// arguments (scalars, numbers, lists, strings; wrapped Python numbers by value).
uint64_t call_digest(const OpInfo& info, const c10::IValue* args, size_t n);
std::optional<std::vector<std::optional<TensorMeta>>> aten_output_metas(
    const c10::OperatorHandle& op, const OpInfo& info, const Inputs& inputs,
    const c10::IValue* args, size_t n);

// This rank's piece shape of `spec` (memoized per thread).
const std::vector<int64_t>& my_piece_shape(const DTensorSpec& spec);

// Runs the op's local kernel on the stack's pieces (NOTE [local op failures] in
// dispatch_local.cc): empty pieces answer a kernel that refuses them; any other failure is
// folded into the program digest and re-raised.
void run_local_kernel(const c10::OperatorHandle& op, const OpInfo& info,
                      const c10::FunctionSchema& schema, const sharding::OpSharding& s,
                      torch::jit::Stack* stack, size_t n);

// A local result as a distributed tensor of the propagated spec; raises when its dtype or shape
// is not the spec's piece. `view_base`: the argument the result views, if it is a view (NOTE
// [views in inference mode]).
// `piece`: my_piece_shape(spec) when the caller has it.
at::Tensor wrap(const std::string& op, at::Tensor local, const DTensorSpec& spec,
                const at::Tensor* view_base = nullptr, const std::vector<int64_t>* piece = nullptr);

// Random ops and dropout on distributed tensors (dispatch_random.cc; NOTE [DTensor random]).
void run_random(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                c10::IValue* args, const Inputs& inputs, const sharding::OpSharding& s,
                const at::Tensor& self);
void run_dropout(const c10::IValue* args, torch::jit::Stack* stack, size_t n,
                 const at::Tensor& input, const sharding::OpSharding& s);

// NOTE [ring attention in the engine] (dispatch_attention.cc): the fused CPU attention op or its
// backward on q/k/v sharded along the sequence runs as ring attention; false for other layouts
// and arguments (the op's rule runs them).
bool run_ring_attention(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                        c10::IValue* args, size_t n, const Inputs& inputs);
// scaled_dot_product_attention's ring attention at the autograd key: distributed q/k/v of any
// rank >= 2 sharded along the sequence, without a mask or dropout; nullopt otherwise (SDPA's own
// path runs).
std::optional<at::Tensor> ring_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                    bool is_causal, std::optional<double> scale, bool enable_gqa);

// out= arguments (dispatch_out.cc): each out= piece put in the arguments before the local op
// (one of another shape replaced, NOTE [resized out= arguments]); after it, the out= tensor
// given the result, keeping its own placements (NOTE [out= keeps its layout]).
void prepare_out_args(const OpInfo& info, const c10::FunctionSchema& schema,
                      const sharding::OpSharding& s,
                      const c10::SmallVector<at::Tensor, 8>& originals, c10::IValue* args,
                      size_t n);
void settle_out_arg(const at::Tensor& out, const at::Tensor& local, const DTensorSpec& result);

// NOTE [ranks outside the mesh] (redistribute.h): the op's outputs on a rank outside its inputs'
// mesh, as empty pieces of the propagated specs (dispatch_outside_mesh.cc).
void run_outside_mesh(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                      c10::IValue* args, size_t n, const Inputs& inputs,
                      const c10::SmallVector<at::Tensor, 8>& originals);

// Runs `op`, which has no table entry, by the replicate fallback (dispatch_fallback.cc, NOTE
// [replicate fallback]).
void run_fallback(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                  c10::IValue* args, size_t n, Inputs& inputs,
                  const c10::SmallVector<at::Tensor, 8>& originals);
// Runs an in-place op as its out-of-place overload, then copies into self (NOTE [in-place by
// copy], dispatch_fallback.cc).
void run_in_place_by_copy(const c10::OperatorHandle& op, const OpInfo& info,
                          torch::jit::Stack* stack, size_t n,
                          const c10::SmallVector<at::Tensor, 8>& originals);

// NOTE [in-place view ops] (dispatch_fallback.cc): t_, transpose_, unsqueeze_, squeeze_ (and
// what decomposes to them) run as their view op on self, whose layout self then takes; false
// for other ops.
bool run_in_place_view(const OpInfo& info, torch::jit::Stack* stack, size_t n,
                       const c10::SmallVector<at::Tensor, 8>& originals);

// NOTE [foreach ops per element] (dispatch_fallback.cc): an aten::_foreach_* op runs as ATen's
// per-index loop, each element through the engine on its own layout.
void run_per_element(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// NOTE [amp unscale] (dispatch_fallback.cc): GradScaler's unscale on each rank's pieces, the
// non-finite flag reduced with max over the gradients' meshes.
void run_amp_unscale(const OpInfo& info, torch::jit::Stack* stack);

// NOTE [replicated scalars with plain tensors] (dispatch_fallback.cc): called where a plain
// tensor that is not a scalar was refused; runs the op as a plain op when every input is a
// replicated one-element tensor and no distributed argument is written, else false.
bool run_with_replicated_scalars(const c10::OperatorHandle& op, const OpInfo& info,
                                 torch::jit::Stack* stack, c10::IValue* args, const Inputs& inputs);

// NOTE [zeros of backward formulas] (dispatch_fallback.cc): true where a refused plain tensor is
// the zeros that split's or unbind's backward formula put beside distributed gradients in cat or
// stack; the dispatcher then reads the plain tensors as Replicate.
bool zeros_of_a_backward_formula(const OpInfo& info, const c10::IValue* args, size_t n);

}  // namespace dtensor::dispatch_detail
