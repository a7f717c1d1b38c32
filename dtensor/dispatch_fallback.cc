// The dispatch kernel's ways off the sharded path: the replicate fallback (NOTE [replicate
// fallback] below), in-place by copy, in-place views, foreach ops per element, replicated scalars
// with plain tensors, the zeros of backward formulas, and GradScaler's unscale.

#include <ATen/ATen.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "base/error.h"
#include "collectives/functional.h"
#include "dtensor/dispatch.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/engine_activity.h"
#include "dtensor/local_tensor.h"
#include "dtensor/random.h"
#include "dtensor/redistribute.h"
#include "layout/shard_layout.h"
#include "sharding_prop/propagator.h"

namespace dtensor {
namespace dispatch_detail {
namespace {

// NOTE [replicate fallback]
// An op with no table entry still runs, correctly, the way PyTorch's DTensor cannot: every
// distributed input is gathered to Replicate, the op runs on the whole tensors on every rank, and
// every output is Replicate with the metadata of the tensor it computed. Every rank computes the
// same values from the same data (random ops draw from the rank generator, whose state equals
// one device's: NOTE [DTensor random]), so outputs whose shape depends on the data (nonzero,
// unique, masked_select) are correct too. The decision depends only on the op's name, so ranks
// never diverge. What it costs: the gathers (attributed to the op, as any redistribute) and the
// whole computation on every rank. It warns once per op, naming the collectives of its first
// call; dtensor::fallback_counts() counts calls per op. Strict mode and DTENSOR_FALLBACK=error
// turn it into the "no sharding rule" error. An argument the op writes (in-place self, out=,
// rrelu's noise, each distributed element of a written tensor list) is gathered too, and
// afterwards each rank copies its box of the written whole back into its piece, so the tensor keeps
// its layout (a Partial one takes its share); one the op resizes becomes Replicate (write_back).
// A view it returns of an input it had to gather views the gathered copy, not the input's pieces:
// reading it is right, writing into it would not reach the input, so such a view is marked and
// any later write into it raises.

struct FallbackRecord {
  absl::Mutex mu;
  std::map<std::string, int64_t> calls ABSL_GUARDED_BY(mu);
};

FallbackRecord& fallback_record() {
  static auto* r = new FallbackRecord();
  return *r;
}

bool fallback_disabled_by_env() {
  static const bool disabled = [] {
    const char* env = std::getenv("DTENSOR_FALLBACK");
    if (env == nullptr || std::string(env).empty() || std::string(env) == "warn") return false;
    if (std::string(env) == "error") return true;
    throw Error("DTENSOR_FALLBACK='" + std::string(env) +
                "': expected 'warn' (default) or 'error'");
  }();
  return disabled;
}

// The "no sharding rule" error of an op without an entry, with why no fallback ran.
[[noreturn]] void no_rule(const OpInfo& info, const Inputs& inputs, const char* why) {
  std::vector<DTensorSpec> specs;
  for (const Input& in : inputs) specs.push_back(in.spec);
  throw Error(sharding::no_rule_message(info.name, specs) + why);
}

// The distributed arguments the call writes (gathered like inputs; see write_back).
std::vector<int> fallback_written_args(const OpInfo& info, const c10::FunctionSchema& schema,
                                       const c10::SmallVector<at::Tensor, 8>& originals) {
  std::vector<int> written;
  for (const int i : info.written) {
    if (originals[i].defined() && is_dtensor(originals[i])) written.push_back(i);
  }
  return written;
}

// After the call: a written distributed argument that kept its shape and dtype takes back its
// box of the written whole, so it keeps its layout and its pieces stay shared with any tensor
// they alias; a Partial one takes its share of the box (the value on the first rank of a
// Partial(sum) mesh dim and zeros on the others; the value on each of an avg/max/min one).
// A Partial one keeps its storage (it does not become Replicate with new storage), so its
// aliasing holds: a write into a view of a Partial tensor (p[1:3] = 5) reaches p, and views of
// a Partial tensor written in place see the new values. One that the op resized (resize_)
// becomes Replicate holding the written whole: the same global values, a new layout.
void write_back_one(const at::Tensor& original, const at::Tensor& whole) {
  DTensorImpl* impl = dtensor_impl(original);
  const DTensorSpec spec = impl->spec();
  if (whole.sizes().vec() != spec.shape() || whole.scalar_type() != spec.meta().dtype) {
    impl->set(whole, DTensorSpec::replicated(spec.mesh(), meta_of(whole)));
    return;
  }
  const at::Tensor piece = impl->ready_local();
  if (piece.is_same(whole)) return;
  const std::vector<int64_t>& coord = my_coordinate(spec.mesh());
  if (spec.has_partial()) {
    piece.copy_(local_tensor_for(whole, spec, coord));
  } else {
    piece.copy_(local_piece(whole, spec, coord));
  }
}

void write_back(const std::vector<int>& written, const c10::SmallVector<at::Tensor, 8>& originals,
                const c10::IValue* args) {
  for (const int i : written) write_back_one(originals[i], args[i].toTensor());
}

// A written tensor list (the self of the _foreach_*_ ops): its elements as the caller holds them.
// Each distributed one takes back its box of the whole the op wrote, as a written tensor does,
// so the writes reach its pieces and not only the gathered copies (an optimizer with
// foreach=True updates its sharded parameters).
struct WrittenList {
  int arg;
  c10::List<at::Tensor> original;
};

std::vector<WrittenList> fallback_written_lists(const OpInfo& info, const c10::IValue* args) {
  std::vector<WrittenList> lists;
  for (const int i : info.written) {
    if (!args[i].isTensorList()) continue;
    const c10::List<at::Tensor> list = args[i].toTensorList();
    for (const at::Tensor& t : list) {
      if (t.defined() && is_dtensor(t)) {
        lists.push_back({i, list.copy()});
        break;
      }
    }
  }
  return lists;
}

void write_back_lists(const std::vector<WrittenList>& lists, const c10::IValue* whole_args) {
  for (const WrittenList& w : lists) {
    const c10::List<at::Tensor> wholes = whole_args[w.arg].toTensorList();
    for (size_t k = 0; k < w.original.size(); ++k) {
      const at::Tensor original = w.original.get(k);
      if (original.defined() && is_dtensor(original)) write_back_one(original, wholes.get(k));
    }
  }
}

void note_fallback(const OpInfo& info, const collectives::CommCounter& counter) {
  FallbackRecord& r = fallback_record();
  bool first = false;
  {
    absl::MutexLock lock(&r.mu);
    first = r.calls[info.name]++ == 0;
  }
  if (!first) return;
  std::string comms =
      counter.total() == 0 ? "no collectives (inputs already Replicate)\n" : counter.to_string();
  comms.pop_back();
  TORCH_WARN("dtensor: ", info.name,
             " has no sharding rule for these inputs; it ran by the replicate fallback (inputs "
             "gathered, the op "
             "computed whole on every rank, outputs Replicate). Its first call cost: ",
             comms,
             ". DTENSOR_FALLBACK=error or strict mode makes this an error; "
             "dtensor.debug.fallback_counts() counts such calls.");
}

// Gathers every distributed input and out= argument to Replicate and puts the whole tensors into
// the arguments; true when some piece had to be gathered (a copy, not the piece itself).
bool gather_arguments(const OpInfo& info, Inputs& inputs,
                      const c10::SmallVector<at::Tensor, 8>& originals, c10::IValue* args,
                      size_t n) {
  bool gathered = false;
  for (Input& in : inputs) {
    const DeviceMesh& mesh = in.spec.mesh();
    const DTensorSpec whole = DTensorSpec::replicated(mesh, in.spec.meta());
    if (in.spec != whole) {
      gathered = true;
      collectives::CommCause cause(info.name.c_str());
      in.local = redistribute_local(in.local, in.spec, whole);
    }
    put(args, in, in.local);
  }
  for (size_t i = 0; i < n; ++i) {  // out= arguments: gathered like inputs
    if (!info.is_out[i] || !originals[i].defined() || !is_dtensor(originals[i])) continue;
    const DTensorSpec& spec = spec_of(originals[i]);
    const DTensorSpec whole = DTensorSpec::replicated(spec.mesh(), spec.meta());
    collectives::CommCause cause(info.name.c_str());
    args[i] = redistribute_local(local_of(originals[i], "out="), spec, whole);
  }
  return gathered;
}

// The fallback's returns: written arguments return the caller's tensors (written back), others
// become Replicate distributed tensors; views of gathered copies are marked.
void wrap_fallback_returns(const OpInfo& info, size_t returns, const DeviceMesh& mesh,
                           bool gathered, const c10::SmallVector<at::Tensor, 8>& originals,
                           torch::jit::Stack* stack) {
  c10::IValue* rets = &(*stack)[stack->size() - returns];
  // NOTE [views of gathered copies] (dispatch.cc): a view of an input that is itself a view of a
  // gathered copy inherits its mark.
  std::string inherited;
  at::Tensor base;
  for (const at::Tensor& t : originals) {
    if (!t.defined()) continue;
    base = t;
    if (const DTensorImpl* impl = dtensor_impl(t)) inherited = impl->detached_view_of();
    break;
  }
  auto wrap_whole = [&](const at::Tensor& t, size_t j) {
    at::Tensor w = make_dtensor(t, DTensorSpec::replicated(mesh, meta_of(t)));
    if (info.returns_view[j] && gathered) {
      dtensor_impl(w)->set_detached_view_of(info.name, base);
    } else if (info.returns_view[j] && !inherited.empty()) {
      dtensor_impl(w)->set_detached_view_of(inherited, base);
    }
    return w;
  };
  for (size_t j = 0; j < returns; ++j) {
    c10::IValue& r = rets[j];
    const int writes = info.return_alias[j];
    if (r.isTensor()) {
      const at::Tensor t = r.toTensor();
      if (writes >= 0 && originals[writes].defined() && is_dtensor(originals[writes])) {
        r = originals[writes];  // written back
      } else if (t.defined()) {
        r = wrap_whole(t, j);
      }
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> wrapped;
      for (const at::Tensor& t : r.toTensorList()) wrapped.push_back(wrap_whole(t, j));
      r = std::move(wrapped);
    }
  }
}

// NOTE [random on a CUDA mesh] (random.h) for the fallback: an op given a CPU generator while its
// tensors live on another device (a CUDA mesh) runs on CPU copies of its arguments, so it draws
// the CPU generator's values; the arguments it writes take the CPU results back and its other
// returns go to the device, as ATen refuses a CPU generator for device tensors ("Expected a
// 'cuda' device type for generator but found 'cpu'": normal, bernoulli, multinomial, rrelu). An
// op given no generator gets the device's from the fallback; only an explicit CPU one comes here.
void call_with_cpu_generator(const c10::OperatorHandle& op, const OpInfo& info,
                             torch::jit::Stack* stack, size_t n) {
  c10::IValue* args = &(*stack)[stack->size() - n];
  std::optional<c10::Device> device;
  auto to_cpu = [&](const at::Tensor& t) {
    if (!t.defined() || t.is_cpu()) return t;
    device = t.device();
    return t.cpu();
  };
  const std::vector<c10::IValue> on_device(args, args + n);
  std::vector<c10::IValue> on_cpu(n);
  for (size_t i = 0; i < n; ++i) {
    if (args[i].isTensor()) {
      args[i] = to_cpu(args[i].toTensor());
    } else if (args[i].isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : args[i].toTensorList()) list.push_back(to_cpu(t));
      args[i] = std::move(list);
    }
    on_cpu[i] = args[i];
  }
  op.callBoxed(stack);
  if (!device) return;
  for (const int i : info.written) {
    if (on_device[i].isTensor() && on_device[i].toTensor().defined()) {
      on_device[i].toTensor().copy_(on_cpu[i].toTensor());
    }
  }
  const size_t returns = op.schema().returns().size();
  c10::IValue* rets = &(*stack)[stack->size() - returns];
  for (size_t j = 0; j < returns; ++j) {
    const int writes = info.return_alias[j];
    if (writes >= 0 && on_device[writes].isTensor()) {
      rets[j] = on_device[writes];
    } else if (rets[j].isTensor() && rets[j].toTensor().defined()) {
      rets[j] = rets[j].toTensor().to(*device);
    }
  }
}

}  // namespace

// Runs `op` by the replicate fallback (NOTE [replicate fallback]).
void run_fallback(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                  c10::IValue* args, size_t n, Inputs& inputs,
                  const c10::SmallVector<at::Tensor, 8>& originals) {
  if (strict_mode_enabled()) no_rule(info, inputs, " (strict mode: no replicate fallback)");
  if (fallback_disabled_by_env()) no_rule(info, inputs, " (DTENSOR_FALLBACK=error)");
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<int> written = fallback_written_args(info, schema, originals);
  const std::vector<WrittenList> written_lists = fallback_written_lists(info, args);
  collectives::CommCounter counter;
  const bool gathered = gather_arguments(info, inputs, originals, args, n);
  // The whole tensors the call writes, to hand each rank's box back afterwards.
  c10::SmallVector<c10::IValue, 8> written_whole(n);
  for (const int i : written) written_whole[i] = args[i];
  for (const WrittenList& w : written_lists) written_whole[w.arg] = args[w.arg];
  const DeviceMesh mesh = inputs.at(0).spec.mesh();
  if (info.generator_arg >= 0 && args[info.generator_arg].isNone()) {
    // The whole tensors are on the mesh's device: its generator (NOTE [random on a CUDA mesh]).
    args[info.generator_arg] = rank_generator(mesh.local_device());
  }
  {
    const LocalKernelScope local;  // NOTE [engine activity]
    // Any op may draw inside (a composite's dropout: _scaled_dot_product_attention_forward
    // carries no nondeterministic_seeded tag in torch 1.13), and ranks as threads drawing from
    // the shared default generator would each give a different "Replicate" result. So every op
    // without a generator argument draws from the rank's generator; this costs nothing where
    // that is the process default (one process per rank).
    if (info.generator_arg < 0) {
      draw_with_rank_generator([&] { op.callBoxed(stack); });
    } else if (mesh.device_type() != c10::DeviceType::CPU &&
               args[info.generator_arg].isGenerator() &&
               args[info.generator_arg].toGenerator().device().is_cpu()) {
      call_with_cpu_generator(op, info, stack, n);
    } else {
      op.callBoxed(stack);
    }
  }
  write_back(written, originals, written_whole.data());
  write_back_lists(written_lists, written_whole.data());
  wrap_fallback_returns(info, schema.returns().size(), mesh, gathered, originals, stack);
  note_fallback(info, counter);
}

// NOTE [in-place by copy]: an in-place op whose rule keeps no layout of self (a scan, a
// triangle or a scatter along self's sharded dim) runs as its out-of-place overload, laid out as
// the propagator chooses, and the result is copied into self, which copy_ redistributes to self's
// layout: one device's values, self keeps its layout and its pieces (and so every view of them), at
// the cost of the out-of-place op plus one redistribute. The propagation decides it from global
// metadata, so every rank takes this path. An op whose out-of-place overload takes other
// arguments (pow_.Scalar) still raises "no sharding keeps self's placements". A self sharding a
// dim of size 1 or 0 takes this path too, since copy_'s rule keeps such a Shard
// (NOTE [size-1 factors]): cumsum_(0) of a [1, 8] Shard(0) works. A Partial self takes the
// result by partition (copy_ moves data: the holder rank of each Partial mesh dim gets the
// value, the others the reduction's identity), so masked_fill_, fill_ or clamp_ of a Partial
// tensor give one device's values (the backward of vector_norm on a Partial tensor masks one in
// place).
void run_in_place_by_copy(const c10::OperatorHandle& op, const OpInfo& info,
                          torch::jit::Stack* stack, size_t n,
                          const c10::SmallVector<at::Tensor, 8>& originals) {
  const c10::FunctionSchema& schema = op.schema();
  std::string base = schema.name();
  c10::optional<c10::OperatorHandle> functional;
  // copy_ is how the result gets into self: it cannot itself go this way.
  if (base != "aten::copy_" && !base.empty() && base.back() == '_') {
    base.pop_back();
    functional = c10::Dispatcher::singleton().findSchema({base, schema.overload_name()});
  }
  // copy_ writes into self's own pieces whatever they shard, a dim of size 1 or 0 included
  // (NOTE [size-1 factors]: its rule keeps an input's Shard there).
  const bool copy_keeps_self = originals[0].defined() && is_dtensor(originals[0]);
  // A Partial self takes a Replicate or Partial source by copy_'s rule; a sharded source is
  // gathered first (the planner makes a Partial only from a Replicate, by partition).
  const bool partial_self = copy_keeps_self && spec_of(originals[0]).has_partial();
  auto for_partial_self = [&](const at::Tensor& t) {
    if (!partial_self || !t.defined() || !is_dtensor(t)) return t;
    const DTensorSpec& spec = spec_of(t);
    if (spec.is_replicated() || spec.has_partial()) return t;
    const DTensorSpec r = DTensorSpec::replicated(spec.mesh(), spec.meta());
    collectives::CommCause cause(info.name.c_str());
    return make_dtensor(redistribute_local(local_of(t), spec, r), r);
  };
  bool same_arguments = copy_keeps_self && functional.has_value() &&
                        functional->schema().arguments().size() == n &&
                        functional->schema().returns().size() == 1;
  for (size_t i = 0; same_arguments && i < n; ++i) {
    same_arguments = *functional->schema().arguments()[i].type() == *schema.arguments()[i].type();
  }
  // Below autograd: the in-place op's own autograd kernel has recorded the call already.
  at::AutoDispatchBelowADInplaceOrView below;
  // What self takes: the out-of-place op's result, or for copy_ itself (here when its own rule
  // found no layout) its source when gathering it makes one.
  at::Tensor value;
  if (same_arguments) {
    torch::jit::Stack call(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    functional->callBoxed(&call);
    value = for_partial_self(call.back().toTensor());
  } else if (base == "aten::copy_" && n >= 2 && (*stack)[stack->size() - n + 1].isTensor()) {
    const at::Tensor src = (*stack)[stack->size() - n + 1].toTensor();
    const at::Tensor gathered = for_partial_self(src);
    if (!gathered.is_same(src)) value = gathered;
  }
  if (!value.defined()) {
    std::vector<std::string> texts;
    for (const at::Tensor& t : originals) {
      if (t.defined() && is_dtensor(t)) texts.push_back(spec_of(t).to_string());
    }
    throw Error(info.name + " (in-place) on " + absl::StrJoin(texts, ", ") +
                ": no sharding keeps self's placements; redistribute self first or use the "
                "out-of-place op");
  }
  at::Tensor self = originals[0];
  self.copy_(value);
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(self));
}

// NOTE [in-place view ops]: t_, transpose_, unsqueeze_ and squeeze_ (swapdims_ and swapaxes_
// decompose to transpose_) change self's shape and strides, not its values. With no rule they
// would go by the replicate fallback, which gathers self and leaves it Replicate (every rank
// holding the whole tensor). Here the view op (t, transpose.int, unsqueeze, squeeze.*) runs on
// self and self takes its result, piece and layout: t_ of a Shard(0) matrix is Shard(1), with no
// communication. (PyTorch's DTensor does so for squeeze_.dim and raises for the others.)
bool run_in_place_view(const OpInfo& info, torch::jit::Stack* stack, size_t n,
                       const c10::SmallVector<at::Tensor, 8>& originals) {
  static const std::map<std::string, std::pair<const char*, const char*>> kViews = {
      {"aten::t_", {"aten::t", ""}},
      {"aten::transpose_", {"aten::transpose", "int"}},
      {"aten::swapdims_", {"aten::transpose", "int"}},
      {"aten::swapaxes_", {"aten::transpose", "int"}},
      {"aten::unsqueeze_", {"aten::unsqueeze", ""}},
      {"aten::squeeze_", {"aten::squeeze", ""}},
      {"aten::squeeze_.dim", {"aten::squeeze", "dim"}},
      {"aten::squeeze_.dims", {"aten::squeeze", "dims"}}};
  const auto it = kViews.find(info.name);
  if (it == kViews.end() || !originals[0].defined() || !is_dtensor(originals[0])) return false;
  const auto view = c10::Dispatcher::singleton().findSchema({it->second.first, it->second.second});
  if (!view) return false;
  at::Tensor self = originals[0];
  DTensorImpl* impl = dtensor_impl(self);
  DTENSOR_CHECK(impl->detached_view_of().empty(), info.name, " on a result of ",
                impl->detached_view_of(),
                " that is a view of a gathered copy; redistribute its input first");
  // Below autograd: the in-place op's own autograd kernel has recorded the call already.
  at::AutoDispatchBelowADInplaceOrView below;
  torch::jit::Stack call(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  view->callBoxed(&call);
  const at::Tensor result = call.back().toTensor();
  impl->set(local_of(result, info.name.c_str()), spec_of(result, info.name.c_str()));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(self));
  return true;
}

// NOTE [foreach ops per element]
// The _foreach_* ops (optimizers' foreach=True, the default for CUDA tensors) apply one op to
// each index of their lists, and indices are independent. They run as ATen's own loop (the
// CompositeExplicitAutograd kernel every backend but CUDA uses), which calls the single-tensor op
// per index: a distributed element goes through the engine with its own layout (Shard stays
// Shard, no communication), a plain one runs as is. As one call, the whole op would raise "mixed
// with distributed tensors" for a plain element beside distributed ones (the LayerNorm a TP plan
// leaves alone), and the replicate fallback would gather every sharded element.
void run_per_element(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// NOTE [replicated scalars with plain tensors]
// An op whose distributed arguments are all replicated one-element tensors, with a plain tensor
// that is not a scalar among its arguments, and that writes no distributed argument, runs as a
// plain op on the scalars' local values, with plain results: each rank computes what one device
// computes for its plain data (a replicated scalar's local value is its global value). This is
// clip_grad_norm_(foreach=True) over a model a TP plan parallelizes in part: the plain gradients
// times the clip coefficient, a replicated scalar. Without this path it would raise "mixed with
// distributed tensors" (PyTorch's DTensor raises). No collective runs, so ranks whose plain
// tensors differ still take no different communication. The dispatcher asks only when it refused a
// plain tensor, so ops on distributed tensors alone pay nothing for it.
bool run_with_replicated_scalars(const c10::OperatorHandle& op, const OpInfo& info,
                                 torch::jit::Stack* stack, c10::IValue* args,
                                 const Inputs& inputs) {
  for (const int i : info.written) {  // out= arguments are not among the inputs
    if (args[i].isTensor() && is_dtensor(args[i].toTensor())) return false;
  }
  if (inputs.empty()) return false;
  for (const Input& in : inputs) {  // the distributed ones (plain scalars stay as they are)
    if (in.element >= 0 || in.local.numel() != 1 || !in.spec.is_replicated()) return false;
  }
  for (const Input& in : inputs) args[in.arg] = in.local;
  op.callBoxed(stack);
  return true;
}

// NOTE [zeros of backward formulas]
// Autograd's formulas for split, split_with_sizes and unbind (FunctionsManual.cpp's
// split_backward, split_with_sizes_backward, unbind_backward) give an output that received no
// gradient plain zeros (at::zeros with the input's options: a plain tensor on the mesh's device),
// then cat or stack them with the distributed gradients of the outputs that were used. Refused,
// those zeros would make `x, y = a.split(n)` with only x used raise in backward ("a plain tensor
// mixed with distributed tensors"). Zeros are the same on every rank, so the engine reads them
// as Replicate, only there: the op is cat or stack, the autograd node being evaluated on this
// thread is one of those formulas', and every plain tensor in the list is all zeros (checked: a
// gradient that a hook made plain is not read as replicated; the check reads values, on this
// rare path only). Every rank runs the same backward graph, so the formula's zeros pass on
// every rank alike; a rank whose hook-made plain gradient is not zero raises, naming the op, and
// ranks that went on fail at their next collective (its timeout bounds the wait).
bool zeros_of_a_backward_formula(const OpInfo& info, const c10::IValue* args, size_t n) {
  if ((info.name != "aten::cat" && info.name != "aten::stack") || n == 0 ||
      !args[0].isTensorList()) {
    return false;
  }
  const std::shared_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
  if (node == nullptr) return false;
  static const absl::flat_hash_set<std::string> kFormulas = {"SplitBackward0",
                                                             "SplitWithSizesBackward0",
                                                             "UnsafeSplitBackward0",
                                                             "UnsafeSplitWithSizesBackward0",
                                                             "UnbindBackward0",
                                                             "SplitBackward0_copy",
                                                             "SplitWithSizesBackward0_copy",
                                                             "UnbindBackward0_copy"};
  if (!kFormulas.contains(node->name())) return false;
  const c10::List<at::Tensor> list = args[0].toTensorList();
  for (size_t k = 0; k < list.size(); ++k) {
    const at::Tensor t = list.get(k);
    if (!t.defined() || is_dtensor(t)) continue;
    const LocalKernelScope local;
    if (t.ne(0).any().item<bool>()) return false;
  }
  return true;
}

// NOTE [amp unscale]
// aten::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale) is
// GradScaler.unscale_ (torch.amp) on distributed gradients, as PyTorch's DTensor runs it (its
// found_inf_reduce_handler): each rank unscales its own pieces in place, an elementwise product by
// one positive factor that keeps every placement's meaning (a Partial share included), and flags a
// non-finite value among them; the flag is then reduced with max over every mesh the distributed
// gradients live on, in the list's order (equal on every rank), so every rank skips or takes the
// optimizer step alike: a non-finite piece or share makes the whole gradient non-finite. Plain
// elements (a part of the model no plan distributes) are unscaled as on one device. The
// replicate fallback would instead gather every gradient to every rank on every step.
void run_amp_unscale(const OpInfo& info, torch::jit::Stack* stack) {
  c10::IValue* args = &(*stack)[stack->size() - 3];
  const std::vector<at::Tensor> grads = args[0].toTensorVector();
  const auto plain = [&](const at::Tensor& t, const char* what) {
    if (!is_dtensor(t)) return t;
    const DTensorSpec& spec = spec_of(t, what);
    DTENSOR_CHECK(spec.is_replicated(), info.name, ": ", what, " must be plain or Replicate, got ",
                  spec.to_string());
    return local_of(t, what);
  };
  at::Tensor found = plain(args[1].toTensor(), "found_inf");
  const at::Tensor inv_scale = plain(args[2].toTensor(), "inv_scale");
  std::vector<at::Tensor> locals;
  std::vector<DeviceMesh> meshes;
  for (const at::Tensor& g : grads) {
    if (!is_dtensor(g)) {
      locals.push_back(g);
      continue;
    }
    locals.push_back(local_of(g, "gradient"));
    const DeviceMesh& mesh = spec_of(g).mesh();
    if (std::find(meshes.begin(), meshes.end(), mesh) == meshes.end()) meshes.push_back(mesh);
  }
  {
    const LocalKernelScope local;
    at::_amp_foreach_non_finite_check_and_unscale_(locals, found, inv_scale);
  }
  collectives::CommCause cause(info.name.c_str());
  for (const DeviceMesh& mesh : meshes) {
    if (mesh.size() == 1) continue;
    const TensorMeta meta = meta_of(found);
    const DTensorSpec flags =
        DTensorSpec::make(mesh, Placements(mesh.ndim(), Partial(ReduceOp::kMax)), meta);
    const at::Tensor any = redistribute_local(found, flags, DTensorSpec::replicated(mesh, meta));
    const LocalKernelScope local;
    found.copy_(any);
  }
  torch::jit::drop(*stack, 3);
}

}  // namespace dispatch_detail

std::map<std::string, int64_t> fallback_counts() {
  dispatch_detail::FallbackRecord& r = dispatch_detail::fallback_record();
  absl::MutexLock lock(&r.mu);
  return r.calls;
}

void reset_fallback_counts() {
  dispatch_detail::FallbackRecord& r = dispatch_detail::fallback_record();
  absl::MutexLock lock(&r.mu);
  r.calls.clear();
}

}  // namespace dtensor
