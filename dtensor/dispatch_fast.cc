// NOTE [unboxed fast path]
// Every op on distributed tensors reaches the boxed kernel (dispatch.cc), except the hot ops
// listed below, which get an unboxed kernel at the distributed tensors' key. Measured first
// (callgrind, torch 2.11, x.view(256) of a Shard(0) tensor from Python): boxing the call copies
// each distributed argument into the stack, and a tensor whose Python object exists then goes
// from one reference to two, which since torch 2.x takes the GIL to keep the Python object alive
// (TensorImpl::incref_pyobject), and gives it back when the stack is dropped: two GIL
// round trips per call, about a third of the engine's cost of a view (2.2k of 6.7k
// instructions). The unboxed kernel takes its arguments by reference and never copies a
// distributed tensor: it boxes the call with each argument's local piece in its place (plain
// tensors, no Python object), asks the propagator (its cache, as the boxed kernel does), and when
// the answer is "the op on the pieces, nothing moved" (no redistribute, no special execution,
// one output, no written argument) runs the local op and wraps its result exactly as the boxed
// kernel would; plain scalars (x + 1) are Replicate inputs there as in the boxed kernel. Anything
// else (a plain tensor that is not a scalar, a pending piece, a view of a gathered copy, an input
// that moves, an error, the FLOP counter) takes the boxed kernel, with the distributed tensors
// boxed, so the two paths cannot differ in what they compute or raise; the program digest of a
// call is the same on both (a piece and its distributed tensor fold alike), so ranks that take
// different paths still agree.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/permute_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/t_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/transpose_ops.h>
#include <ATen/ops/unsqueeze_ops.h>
#include <ATen/ops/view_ops.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "dtensor/dispatch.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/engine_activity.h"
#include "dtensor/flop_counter.h"
#include "dtensor/program_digest.h"

namespace dtensor::dispatch_detail {
namespace {

// A call being boxed with pieces in place of the distributed tensors (never owned here).
struct FastCall {
  torch::jit::Stack stack;
  Inputs inputs;
  const at::Tensor* first = nullptr;       // the first distributed argument (a view's base)
  std::vector<std::pair<int, int>> plain;  // plain scalars: (argument, -1)
  bool ok = true;

  void push(const at::Tensor& t) {
    DTensorImpl* impl = t.defined() ? dtensor_impl(t) : nullptr;
    if (impl == nullptr && t.defined() && is_plain_scalar(t)) {
      // A plain scalar (x + 1 wraps the 1 as a tensor): replicated, as collect_inputs reads it.
      plain.emplace_back(static_cast<int>(stack.size()), -1);
      stack.emplace_back(t);
      return;
    }
    // A view of a gathered copy passes its mark on (mark_gathered_view): the boxed kernel's.
    if (impl == nullptr || !impl->plainly_ready() || !impl->detached_view_of().empty()) {
      ok = false;
      return;
    }
    if (first == nullptr) first = &t;
    inputs.push_back({static_cast<int>(stack.size()), -1, impl->spec(), impl->local()});
    stack.emplace_back(impl->local());
  }
  void push(const std::optional<at::Tensor>& t) {
    if (t.has_value() && t->defined()) return push(*t);
    stack.emplace_back();
  }
  template <class T>
  void push(const T& v) {
    stack.emplace_back(v);
  }
};

// The fast path of one call; false when the boxed kernel must run it (nothing was done).
bool run_fast(const c10::OperatorHandle& op, const OpInfo& info, FastCall& call, at::Tensor& out) {
  if (!call.ok || call.inputs.empty() || flop_counting()) return false;
  if (info.per_element || !info.written.empty() || entry_of(info) == nullptr ||
      (info.execution != sharding::Execution::kPieces &&
       info.execution != sharding::Execution::kViewAsLocal)) {
    return false;
  }
  add_replicated_inputs(call.inputs, call.plain, call.stack.data());
  const EngineScope engine;  // NOTE [engine activity]
  c10::IValue* args = call.stack.data();
  const size_t n = call.stack.size();
  std::shared_ptr<const sharding::OpSharding> sharding;
  try {
    sharding = propagate_inputs(op, info, call.inputs, args, n);
  } catch (const std::exception&) {
    return false;  // the boxed kernel raises it, with its context
  }
  const sharding::OpSharding& s = *sharding;
  if (s.run_replicated || s.in_place_by_copy || s.outputs.size() != 1) return false;
  for (size_t k = 0; k < call.inputs.size(); ++k) {  // nothing moves, not even by a no-op plan
    if (s.input_targets[k] != call.inputs[k].spec) return false;
  }
  const DeviceMesh& mesh = call.inputs[0].spec.mesh();
  const std::vector<int64_t>* piece_of_mine = nullptr;
  try {
    piece_of_mine = &my_piece_shape(s.outputs[0]);
  } catch (const Error&) {
    return false;  // NOTE [ranks outside the mesh]: the boxed kernel runs it
  }
  const std::vector<int64_t>& piece = *piece_of_mine;
  if (program_check_enabled() && mesh.size() > 1) {  // NOTE [program digest]
    record_program_op(mesh, kOpRan, call_digest(info, args, n));
  }
  at::Tensor local;
  if (info.execution == sharding::Execution::kViewAsLocal) {
    const LocalKernelScope scope;  // NOTE [engine activity]
    local = call.inputs[0].local.view(piece);
  } else {
    if (info.args.needs_local_shapes()) info.args.localize(args, piece);
    run_local_kernel(op, info, op.schema(), s, &call.stack, n);
    local = call.stack.back().toTensor();
  }
  const bool view = !info.returns_view.empty() && info.returns_view[0];
  out = wrap(info.name, std::move(local), s.outputs[0], view ? call.first : nullptr, &piece);
  return true;
}

template <class Op, class Sig = typename Op::schema>
struct FastKernel;

template <class Op, class... Args>
struct FastKernel<Op, at::Tensor(Args...)> {
  static at::Tensor call(c10::DispatchKeySet, Args... args) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    static const OpInfo& info = info_for(op);  // one per operator, shared by every thread
    {
      FastCall fast;
      fast.stack.reserve(sizeof...(Args));
      (fast.push(args), ...);
      at::Tensor out;
      if (run_fast(op, info, fast, out)) return out;
    }
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    (stack.emplace_back(args), ...);
    kernel(op, &stack);
    return std::move(stack.back()).toTensor();
  }
};

// "aten::add.Tensor", "aten::mm".
template <class Op>
std::string full_name() {
  const std::string overload = Op::overload_name;
  return overload.empty() ? std::string(Op::name) : c10::str(Op::name, ".", overload);
}

template <class Op>
void add_fast(torch::Library& lib) {
  lib.impl(full_name<Op>().c_str(),
           torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(FastKernel<Op>::call)));
}

// The hot ops (elementwise, matmul, reductions, views of a transformer's step): functional,
// one tensor returned.
template <class... Ops>
struct FastOps {
  static void add(torch::Library& lib) { (add_fast<Ops>(lib), ...); }
  static std::vector<std::string> names() { return {full_name<Ops>()...}; }
};

using Hot =
    FastOps<at::_ops::add_Tensor, at::_ops::sub_Tensor, at::_ops::mul_Tensor, at::_ops::div_Tensor,
            at::_ops::mm, at::_ops::bmm, at::_ops::sum, at::_ops::sum_dim_IntList,
            at::_ops::mean_dim, at::_ops::relu, at::_ops::gelu, at::_ops::silu, at::_ops::sigmoid,
            at::_ops::tanh, at::_ops::exp, at::_ops::neg, at::_ops::view, at::_ops::t,
            at::_ops::transpose_int, at::_ops::permute, at::_ops::unsqueeze>;

}  // namespace

void register_fast_kernels(torch::Library& lib) { Hot::add(lib); }

const std::vector<std::string>& fast_op_names() {
  static const std::vector<std::string> names = Hot::names();
  return names;
}

}  // namespace dtensor::dispatch_detail
