// The boxed kernel behind every ATen op on distributed tensors (NOTE [DTensor dispatch] in
// dispatch.h), as its pipeline in call order: reading the inputs, propagation, redistribution,
// the local call, wrapping the results. The parts that are a concept of their own live beside
// it: what an operator's schema says (dispatch_op_info.cc), installing the kernel
// (dispatch_install.cc), out= arguments (dispatch_out.cc), ranks outside the mesh
// (dispatch_outside_mesh.cc), the replicate fallback (dispatch_fallback.cc), random ops
// (dispatch_random.cc), output metadata (dispatch_metadata.cc), the hot ops' unboxed kernels
// (dispatch_fast.cc).

#include "dtensor/dispatch.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <stdexcept>

#include "base/error.h"
#include "base/stable_hash.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/dispatch_args.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/engine_activity.h"
#include "dtensor/flop_counter.h"
#include "dtensor/local_tensor.h"
#include "dtensor/program_digest.h"
#include "dtensor/redistribute.h"
#include "layout/shard_layout.h"
#include "sharding_prop/propagator.h"

namespace dtensor {

namespace dispatch_detail {

const std::vector<int64_t>& my_coordinate(const DeviceMesh& mesh) {
  return dtensor::my_coordinate(mesh, "DTensor op");
}

void put(c10::IValue* args, const Input& in, const at::Tensor& local) {
  if (in.element < 0) {
    args[in.arg] = local;
    return;
  }
  if (args[in.arg].isTensorList()) {
    c10::List<at::Tensor> list = args[in.arg].toTensorList().copy();
    list.set(in.element, local);
    args[in.arg] = std::move(list);
    return;
  }
  c10::List<std::optional<at::Tensor>> list = args[in.arg].toOptionalTensorList().copy();
  list.set(in.element, local);
  args[in.arg] = std::move(list);
}

at::Tensor element_of(const c10::IValue& v, int element) {
  if (element < 0) return v.toTensor();
  if (v.isTensorList()) return v.toTensorList().get(element);
  return v.toListRef()[element].toTensor();
}

void add_replicated_inputs(Inputs& inputs, const std::vector<std::pair<int, int>>& plain,
                           const c10::IValue* args) {
  if (plain.empty() || inputs.empty()) return;
  const DeviceMesh& mesh = inputs[0].spec.mesh();
  for (const auto& [arg, element] : plain) {
    const at::Tensor t = element_of(args[arg], element);
    const DTensorSpec spec =
        DTensorSpec::replicated(mesh, TensorMeta::make(t.sizes().vec(), t.scalar_type()));
    inputs.push_back({arg, element, spec, t});
  }
  std::sort(inputs.begin(), inputs.end(), [](const Input& a, const Input& b) {
    return std::make_pair(a.arg, a.element) < std::make_pair(b.arg, b.element);
  });
}

// This rank's piece shape of `spec`, memoized per thread (specs are interned: equal specs are one
// object, so a slot holds a spec and this rank's coordinate).
const std::vector<int64_t>& my_piece_shape(const DTensorSpec& spec) {
  struct Slot {
    std::optional<DTensorSpec> spec;
    std::vector<int64_t> coord, shape;
  };
  thread_local std::array<Slot, 64> slots;
  const std::vector<int64_t>& coord = my_coordinate(spec.mesh());
  Slot& slot = slots[spec.hash() % slots.size()];
  if (!slot.spec || *slot.spec != spec || slot.coord != coord) {
    slot.shape = local_box(spec, coord).shape;
    slot.spec = spec;
    slot.coord = coord;
  }
  return slot.shape;
}

// A local result becomes a distributed tensor of the propagated spec. Its dtype and shape must be
// the spec's piece: a disagreement is a wrong rule, raised, never cast or relabelled. It may show
// on some ranks only (an empty piece's shape), so it is a local failure as well (NOTE [local op
// failures]): the peers' next collective on the mesh fails at once instead of waiting for this
// rank. `view_base`: the argument the result views, if it is a view (NOTE [views in inference
// mode]).
at::Tensor wrap(const std::string& op, at::Tensor local, const DTensorSpec& spec,
                const at::Tensor* view_base, const std::vector<int64_t>* piece) {
  const std::vector<int64_t>& want = piece != nullptr ? *piece : my_piece_shape(spec);
  const bool dtype_ok = local.scalar_type() == spec.meta().dtype;
  if (C10_UNLIKELY(!dtype_ok || !local.sizes().equals(want))) {
    if (program_check_enabled()) record_program_op(spec.mesh(), kLocalFailure, fnv1a(op));
    TORCH_INTERNAL_ASSERT(dtype_ok, op, ": the local result is ", local.scalar_type(),
                          " but the propagated output ", spec.to_string(), " says ",
                          spec.meta().dtype, " (a wrong sharding rule; please report)");
    TORCH_INTERNAL_ASSERT(false, op, ": this rank's local result has shape ", local.sizes(),
                          " but the propagated output ", spec.to_string(),
                          " gives its piece the shape ", c10::IntArrayRef(want),
                          " (a wrong sharding rule; please report)");
  }
  if (view_base != nullptr) return make_dtensor_view(std::move(local), spec, *view_base);
  return make_dtensor(std::move(local), spec);
}

}  // namespace dispatch_detail

namespace {

using namespace dispatch_detail;  // NOLINT: this file's own internal header
using sharding::Execution;

thread_local bool t_strict = false;
thread_local bool t_replicate_plain = false;

}  // namespace

namespace {

std::string plain_error(const OpInfo& info, const c10::FunctionSchema& schema, int arg,
                        const at::Tensor& t) {
  return info.name + ": argument '" + schema.arguments()[arg].name() + "' is a plain tensor " +
         c10::str(t.sizes()) +
         " mixed with distributed tensors; make it distributed (distribute_tensor, from_local) "
         "or read plain tensors as replicated (ReplicatePlainTensorsGuard)";
}

// Finds the inputs; plain tensors become Replicate inputs under ReplicatePlainTensorsGuard.
// A plain tensor that is not a scalar is refused: with `refused`, the first such one is put there
// (the other inputs are still collected) and the caller decides; without, it raises.
struct Refused {
  int arg = -1;
  at::Tensor tensor;
};
Inputs collect_inputs(const OpInfo& info, const c10::FunctionSchema& schema, c10::IValue* args,
                      size_t n, Refused* refused = nullptr) {
  Inputs inputs;
  inputs.reserve(n);
  std::vector<std::pair<int, int>> plain;  // (arg, element)
  auto visit = [&](const at::Tensor& t, int arg, int element, bool plain_ok) {
    if (!t.defined()) return;
    if (DTensorImpl* impl = dtensor_impl(t)) {
      inputs.push_back({arg, element, impl->spec(), impl->ready_local()});
      return;
    }
    if (!is_plain_scalar(t) && !t_replicate_plain && !plain_ok) {
      if (refused == nullptr) throw Error(plain_error(info, schema, arg, t));
      if (refused->arg < 0) *refused = {arg, t};
      return;
    }
    plain.emplace_back(arg, element);
  };
  for (size_t i = 0; i < n; ++i) {
    if (info.is_out[i]) continue;
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      visit(v.toTensor(), static_cast<int>(i), -1, false);
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) visit(list.get(k), static_cast<int>(i), k, false);
    } else if (v.isList()) {
      // NOTE [index tensors]: a Tensor?[] (the indices of aten::index and index_put_, what
      // x[i] and x[i] = v call) is read like a tensor list: a distributed index is an input
      // (the local kernel cannot take it still distributed: the call would fail naming
      // `self`). A plain index tensor is read as replicated: PyTorch raises for a plain one,
      // but x[i] with a plain i is too common to refuse, and its answer is one device's
      // anyway.
      const c10::ArrayRef<c10::IValue> list = v.toListRef();
      for (size_t k = 0; k < list.size(); ++k) {
        if (list[k].isTensor()) visit(list[k].toTensor(), static_cast<int>(i), k, true);
      }
    }
  }
  if (refused != nullptr && refused->arg >= 0) return inputs;  // the caller decides first
  if (inputs.empty()) {
    throw Error(info.name +
                ": only an out= argument is distributed; its inputs must be "
                "distributed tensors too");
  }
  add_replicated_inputs(inputs, plain, args);
  return inputs;
}

}  // namespace

namespace dispatch_detail {

// The op's table entry, or null (looked up again while missing: register_rule may add it).
const sharding::OpEntry* entry_of(const OpInfo& info) {
  const sharding::OpEntry* entry = info.entry.load(std::memory_order_acquire);
  if (entry == nullptr && (entry = sharding::find_op(info.name)) != nullptr) {
    info.entry.store(entry, std::memory_order_release);
  }
  return entry;
}

// The propagator's answer for these inputs and arguments (the table entry is looked up once per
// operator; the specs vector is reused, so a cache hit allocates nothing here).
std::shared_ptr<const sharding::OpSharding> propagate_inputs(const c10::OperatorHandle& op,
                                                             const OpInfo& info,
                                                             const Inputs& inputs,
                                                             const c10::IValue* args, size_t n) {
  thread_local std::vector<DTensorSpec> specs;
  specs.clear();
  for (const Input& in : inputs) specs.push_back(in.spec);
  thread_local sharding::LayoutArgs layout;  // reused: its vectors keep their capacity
  info.args.layout(args, layout);
  layout.call.clear();
  encode_call(info, args, n, layout.call);
  const sharding::PropagateOptions options{t_strict};
  const sharding::OpEntry* entry = entry_of(info);
  if (entry == nullptr) return sharding::propagate(info.name, specs, layout, options);
  auto run_meta = [&] { return aten_output_metas(op, info, inputs, args, n); };
  const sharding::OutputMetas metas = run_meta;  // refers to run_meta: it must outlive the call
  return sharding::propagate(*entry, specs, layout, options, &metas);
}

}  // namespace dispatch_detail

namespace {

// The argument a view return aliases: the op's first tensor argument (self), or null when the
// return `j` is not a view.
const at::Tensor* view_base(const OpInfo& info, size_t j,
                            const c10::SmallVector<at::Tensor, 8>& originals) {
  if (j >= info.returns_view.size() || !info.returns_view[j]) return nullptr;
  for (const at::Tensor& t : originals) {
    if (t.defined()) return &t;
  }
  return nullptr;
}

// NOTE [views of gathered copies]: a view that needed its input redistributed (x[1:3] across
// the pieces of a Shard(0) x) views a gathered copy, not x. Two things would go silently wrong,
// and both raise instead: a write into it (or into a view of it, which inherits the mark:
// x.view(-1)[0].fill_) would not reach x, so the dispatcher refuses it; and after x (or any view
// sharing x's version counter) is written in place, the copy still holds the old values, so
// reading it raises (DTensorImpl::ready_local compares x's version with the one at the copy).
// mark_gathered_view marks the view `w` (return j): `moved` when this op redistributed its
// input, else it inherits its input's mark.
void mark_gathered_view(const at::Tensor& w, const OpInfo& info, size_t j,
                        const c10::SmallVector<at::Tensor, 8>& originals, bool moved) {
  const at::Tensor* base = view_base(info, j, originals);
  if (base == nullptr) return;
  if (moved) {
    dtensor_impl(w)->set_detached_view_of(info.name, *base);
  } else if (const DTensorImpl* b = dtensor_impl(*base); b && !b->detached_view_of().empty()) {
    dtensor_impl(w)->set_detached_view_of(b->detached_view_of(), *base);
  }
}

// item(): every rank reads the whole value.
void run_replicated(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                    c10::IValue* args, const Input& in) {
  const DTensorSpec r = DTensorSpec::replicated(in.spec.mesh(), in.spec.meta());
  collectives::CommCause cause(info.name.c_str());
  put(args, in, redistribute_local(in.local, in.spec, r));
  const LocalKernelScope local;
  op.callBoxed(stack);
}

// NOTE [a Partial reduced once]
// A Partial tensor keeps its reduction pending (as in PyTorch) until an op needs its value
// reduced; the reduced piece then replaces the Partial one in the tensor itself, so the next op
// that reads it (the optimizer's second use of a gradient, say) communicates nothing. The global
// value is unchanged, only its layout; nobody can see the old piece, since it is replaced only
// when this tensor alone holds it (no view, alias, detached copy or to_local() result shares its
// storage). Written inputs are never moved, so never replaced.
void settle_reduced(const c10::IValue* args, const Input& in, const DTensorSpec& target,
                    const at::Tensor& reduced) {
  bool partial = false;
  for (const Placement& p : in.spec.placements()) partial = partial || p.is_partial();
  if (!partial) return;
  const c10::IValue& v = args[in.arg];
  if (in.element >= 0 || !v.isTensor()) return;
  DTensorImpl* impl = dtensor_impl(v.toTensor());
  // Two holders of the piece: the tensor and `in`; one of its storage: the piece.
  if (impl == nullptr || !impl->plainly_ready() || !impl->local().is_same(in.local) ||
      in.local.use_count() > 2 || in.local.storage().use_count() > 1) {
    return;
  }
  impl->set(reduced, target);
}

// Moves every input to its propagated target and puts the pieces into the arguments.
void redistribute_inputs(const OpInfo& info, const sharding::OpSharding& s, Inputs& inputs,
                         c10::IValue* args) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    Input& in = inputs[k];
    if (s.input_targets[k] != in.spec) {
      // A written input is never moved: the write would land in the moved copy and be lost
      // (rules keep them: in-place self, Rule::written_inputs).
      TORCH_INTERNAL_ASSERT(
          std::find(info.written.begin(), info.written.end(), in.arg) == info.written.end(),
          info.name, ": the sharding moves a written argument from ", in.spec.to_string(), " to ",
          s.input_targets[k].to_string(), " (a wrong sharding rule; please report)");
      collectives::CommCause cause(info.name.c_str());
      const at::Tensor moved = execute_plan(*s.input_plans[k], in.local);
      settle_reduced(args, in, s.input_targets[k], moved);
      in.local = moved;
    }
    put(args, in, in.local);
  }
}

// Runs an op whose execution is not "the same op on the pieces" (Execution); false for those
// that are.
bool run_special(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                 c10::IValue* args, size_t n, const Inputs& inputs, const sharding::OpSharding& s,
                 const c10::SmallVector<at::Tensor, 8>& originals) {
  at::Tensor out;  // the one output of the cases that compute it here
  switch (info.execution) {
    case Execution::kRandom:
      run_random(op, info, stack, args, inputs, s, originals[inputs.at(0).arg]);
      return true;
    case Execution::kDropout:
      run_dropout(args, stack, n, inputs.at(0).local, s);
      return true;
    case Execution::kMaskedEmbedding: {
      const auto& coord = my_coordinate(s.outputs[0].mesh());
      const std::vector<int64_t> shape = local_box(s.outputs[0], coord).shape;
      const LocalKernelScope local;  // NOTE [engine activity]
      out = masked_embedding(inputs.at(0).local, inputs.at(1).local, s.input_targets[0], coord,
                             shape);
      break;
    }
    case Execution::kReshapeByLocal: {
      const LocalKernelScope local;
      out = at::reshape(inputs.at(0).local, args[1].toIntVector());
      break;
    }
    case Execution::kViewAsLocal: {
      const std::vector<int64_t> shape = my_piece_shape(s.outputs[0]);
      const LocalKernelScope local;
      out = inputs.at(0).local.view(shape);
      break;
    }
    case Execution::kSliceBackwardAtOffset: {  // slice_backward(grad, sizes, dim, start, end, step)
      const DTensorSpec& grad = s.input_targets.at(0);
      const LocalBox box = local_box(grad, my_coordinate(grad.mesh()));
      const std::vector<int64_t> sizes = args[1].toIntVector();  // local (LocalShapeArg)
      const int64_t d = normalize_tensor_dim(args[2].toInt(), static_cast<int64_t>(sizes.size()),
                                             "slice_backward dim");
      const int64_t n = s.outputs[0].meta().shape[d], step = args[5].toInt();
      const int64_t raw = args[3].toInt();
      const int64_t lo = std::clamp<int64_t>(raw < 0 ? raw + n : raw, 0, n);
      const int64_t first = lo + box.offset[d] * step;  // where this piece's first row lands
      const int64_t last = box.shape[d] == 0 ? first : first + (box.shape[d] - 1) * step + 1;
      const LocalKernelScope local;
      out = at::slice_backward(inputs.at(0).local, sizes, d, first, last, step);
      break;
    }
    case Execution::kEmptyByLocal: {
      const LocalKernelScope local;
      out = at::empty(args[1].toIntVector(), inputs.at(0).local.options());
      break;
    }
    default:
      return false;
  }
  torch::jit::drop(*stack, n);
  at::Tensor w = wrap(info.name, out, s.outputs[0], view_base(info, 0, originals));
  mark_gathered_view(w, info, 0, originals, s.needs_redistribute());  // as wrap_returns does
  stack->push_back(std::move(w));
  return true;
}

// NOTE [FLOP counter]: the FLOPs of the op on this rank's pieces (their shapes, after the moves).
void count_local_flops(const OpInfo& info, const Inputs& inputs, const c10::IValue* args) {
  std::vector<at::Tensor> locals;
  for (const Input& in : inputs) locals.push_back(in.local);
  count_flops(*entry_of(info), locals, info.args.layout(args));
}

// Wraps the returns: tensors and tensor-list elements take the propagated specs in order;
// in-place and out= returns are the caller's distributed tensors.
void wrap_returns(const OpInfo& info, const c10::FunctionSchema& schema,
                  const sharding::OpSharding& s, const c10::SmallVector<at::Tensor, 8>& originals,
                  torch::jit::Stack* stack) {
  const size_t returns = schema.returns().size();
  c10::IValue* rets = &(*stack)[stack->size() - returns];
  size_t next = 0;
  for (size_t j = 0; j < returns; ++j) {
    c10::IValue& r = rets[j];
    const int writes = info.return_alias[j];
    if (r.isTensor()) {
      const size_t o = next++;
      if (writes >= 0 && originals[writes].defined()) {
        if (info.is_out[writes]) settle_out_arg(originals[writes], r.toTensor(), s.outputs.at(o));
        r = originals[writes];
      } else if (r.toTensor().defined()) {
        r = wrap(info.name, r.toTensor(), s.outputs.at(o), view_base(info, j, originals));
        // A view of a redistributed input views the moved copy: writes into it would be lost.
        mark_gathered_view(r.toTensor(), info, j, originals, s.needs_redistribute());
      }
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> pieces = r.toTensorList();
      c10::List<at::Tensor> wrapped;
      for (size_t k = 0; k < pieces.size(); ++k) {
        at::Tensor w =
            wrap(info.name, pieces.get(k), s.outputs.at(next++), view_base(info, j, originals));
        mark_gathered_view(w, info, j, originals, s.needs_redistribute());
        wrapped.push_back(std::move(w));
      }
      r = std::move(wrapped);
    }
  }
}

void kernel_body(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = info_for(op);
  if (info.per_element) return run_per_element(op, stack);    // NOTE [foreach ops per element]
  const EngineScope engine;                                   // NOTE [engine activity]
  if (info.amp_unscale) return run_amp_unscale(info, stack);  // NOTE [amp unscale]
  if (info.same_size) {  // metadata only, as PyTorch's: no rule, no communication
    const bool same = (*stack)[stack->size() - 2].toTensor().sizes().equals(
        (*stack)[stack->size() - 1].toTensor().sizes());
    torch::jit::drop(*stack, 2);
    stack->push_back(same);
    return;
  }
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  c10::IValue* args = &(*stack)[stack->size() - n];
  // The distributed arguments as the caller passed them (in-place and out= return them).
  c10::SmallVector<at::Tensor, 8> originals(n);
  for (size_t i = 0; i < n; ++i) {
    if (args[i].isTensor()) originals[i] = args[i].toTensor();
  }
  for (const int i : info.written) {
    DTensorImpl* impl = originals[i].defined() ? dtensor_impl(originals[i]) : nullptr;
    DTENSOR_CHECK(impl == nullptr || impl->detached_view_of().empty(), info.name,
                  " writes into argument '", schema.arguments()[i].name(), "', a result of ",
                  impl->detached_view_of(),
                  " that is a view of a gathered copy (its input had to be redistributed first), "
                  "so the write would not reach the tensor it views; redistribute that input to "
                  "the needed layout before taking the view, or write out of place");
  }
  Refused refused;
  Inputs inputs = collect_inputs(info, schema, args, n, &refused);
  if (refused.arg >= 0) {  // a plain tensor that is not a scalar beside distributed ones
    if (run_with_replicated_scalars(op, info, stack, args, inputs)) return;
    if (!zeros_of_a_backward_formula(info, args, n)) {
      throw Error(plain_error(info, schema, refused.arg, refused.tensor));
    }
    const ReplicatePlainTensorsGuard zeros(true);  // NOTE [zeros of backward formulas]
    inputs = collect_inputs(info, schema, args, n);
  }
  if (!holds_piece(inputs[0].spec.mesh())) {  // NOTE [ranks outside the mesh]
    run_outside_mesh(op, info, stack, args, n, inputs, originals);
    return;
  }
  if (program_check_enabled() && inputs[0].spec.mesh().size() > 1) {  // NOTE [program digest]
    record_program_op(inputs[0].spec.mesh(), kOpRan, call_digest(info, args, n));
  }
  if (info.execution == Execution::kReplicateFirst) {
    run_replicated(op, info, stack, args, inputs.at(0));
    return;
  }
  if ((info.execution == Execution::kRingAttention ||
       info.execution == Execution::kRingAttentionBackward) &&
      run_ring_attention(op, info, stack, args, n, inputs)) {
    return;
  }
  if (entry_of(info) == nullptr) {
    if (run_in_place_view(info, stack, n, originals)) return;
    run_fallback(op, info, stack, args, n, inputs, originals);
    return;
  }
  const auto sharding = propagate_inputs(op, info, inputs, args, n);
  const sharding::OpSharding& s = *sharding;
  if (s.run_replicated) {
    run_fallback(op, info, stack, args, n, inputs, originals);
    return;
  }
  if (s.in_place_by_copy) {
    run_in_place_by_copy(op, info, stack, n, originals);
    return;
  }
  redistribute_inputs(info, s, inputs, args);
  prepare_out_args(info, schema, s, originals, args, n);
  if (info.args.needs_local_shapes() && !s.outputs.empty()) {
    info.args.localize(args, my_piece_shape(s.outputs[0]));
  }
  if (run_special(op, info, stack, args, n, inputs, s, originals)) return;
  if (flop_counting()) count_local_flops(info, inputs, args);
  run_local_kernel(op, info, schema, s, stack, n);
  wrap_returns(info, schema, s, originals, stack);
}

std::atomic<CallerLockRelease> g_release_caller_locks{nullptr};

struct KernelCall {
  const c10::OperatorHandle* op;
  torch::jit::Stack* stack;
};

}  // namespace

namespace dispatch_detail {

// NOTE [caller locks and thread ranks]: see dispatch.h.
void kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const CallerLockRelease release = g_release_caller_locks.load(std::memory_order_relaxed);
  if (release == nullptr) return kernel_body(op, stack);
  KernelCall call{&op, stack};
  release(
      [](void* c) {
        auto* k = static_cast<KernelCall*>(c);
        kernel_body(*k->op, k->stack);
      },
      &call);
}

}  // namespace dispatch_detail

StrictModeGuard::StrictModeGuard(bool enabled) : previous_(t_strict) { t_strict = enabled; }
StrictModeGuard::~StrictModeGuard() { t_strict = previous_; }
ReplicatePlainTensorsGuard::ReplicatePlainTensorsGuard(bool enabled)
    : previous_(t_replicate_plain) {
  t_replicate_plain = enabled;
}
ReplicatePlainTensorsGuard::~ReplicatePlainTensorsGuard() { t_replicate_plain = previous_; }
bool strict_mode_enabled() { return t_strict; }
bool replicate_plain_tensors_enabled() { return t_replicate_plain; }

void set_caller_lock_release(CallerLockRelease release) {
  g_release_caller_locks.store(release, std::memory_order_relaxed);
}

std::string explain(const std::string& op, std::vector<c10::IValue> args) {
  ensure_dispatch_installed();
  const auto dot = op.find('.');
  const std::string base = op.substr(0, dot),
                    overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  const auto handle = c10::Dispatcher::singleton().findSchema({base, overload});
  if (!handle) throw Error("explain: no ATen operator named '" + op + "'");
  const c10::FunctionSchema& schema = handle->schema();
  const auto& formal = schema.arguments();
  if (args.size() > formal.size()) {
    throw Error("explain: " + op + " takes " + std::to_string(formal.size()) + " arguments, got " +
                std::to_string(args.size()));
  }
  for (size_t i = args.size(); i < formal.size(); ++i) {
    if (!formal[i].default_value()) {
      throw Error("explain: " + op + " needs argument '" + formal[i].name() + "'");
    }
    args.push_back(*formal[i].default_value());
  }
  const OpInfo& info = info_for(*handle);
  const Inputs inputs = collect_inputs(info, schema, args.data(), args.size());
  return propagate_inputs(*handle, info, inputs, args.data(), args.size())->to_string();
}

}  // namespace dtensor
