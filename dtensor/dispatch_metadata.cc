// NOTE [output metadata from ATen] (propagator.h), the dispatcher's side: the call key and the
// meta-kernel run.

#include <ATen/ATen.h>

#include "base/stable_hash.h"
#include "dtensor/dispatch_internal.h"

namespace dtensor::dispatch_detail {

TensorMeta meta_of(const at::Tensor& t) {
  return TensorMeta::make(t.sizes().vec(), t.scalar_type(), t.strides().vec());
}

// NOTE [output metadata from ATen] (propagator.h): the call's non-tensor arguments, encoded for
// the cache key, one tag per argument: ints, bools, dtypes, strings and int lists by value;
// floats, Scalars and generators by kind only (a Scalar's value never changes an output's dtype
// or shape, its kind can); tensors by presence and whether they are wrapped Python numbers
// (their specs are in the key).
void encode_call(const OpInfo& info, const c10::IValue* args, size_t n, std::vector<int64_t>& out) {
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    if (v.isNone()) {
      out.push_back(0);
    } else if (v.isTensor()) {
      // A wrapped Python number promotes like a scalar: same spec, another output dtype.
      const at::Tensor& t = v.toTensor();
      out.push_back(!t.defined() ? 2 : t.unsafeGetTensorImpl()->is_wrapped_number() ? 15 : 1);
    } else if (v.isTensorList()) {
      out.push_back(3);
      out.push_back(static_cast<int64_t>(v.toTensorList().size()));
    } else if (info.is_scalar[i]) {
      out.push_back(v.isComplexDouble() ? 4 : v.isDouble() ? 5 : v.isBool() ? 6 : 7);
    } else if (v.isBool()) {
      out.push_back(v.toBool() ? 9 : 8);
    } else if (v.isInt()) {
      out.push_back(10);
      out.push_back(v.toInt());
    } else if (v.isIntList()) {
      const auto list = v.toIntList();
      out.push_back(11);
      out.push_back(static_cast<int64_t>(list.size()));
      for (const int64_t x : list) out.push_back(x);
    } else if (v.isString()) {
      const std::string& text = v.toStringRef();
      out.push_back(12);
      out.push_back(static_cast<int64_t>(text.size()));
      for (const char c : text) out.push_back(c);
    } else if (v.isDevice()) {
      out.push_back(13);
      out.push_back(static_cast<int64_t>(v.toDevice().type()));
      out.push_back(v.toDevice().index());
    } else {
      out.push_back(14);  // floats, lists of floats, generators: by kind
    }
  }
}

namespace {

void fold(uint64_t& h, const void* data, size_t bytes) { h = fnv1a(data, bytes, h); }

void fold_value(uint64_t& h, const c10::IValue& v) {
  const auto word = [&h](int64_t x) { fold(h, &x, sizeof(x)); };
  const auto real = [&h](double x) { fold(h, &x, sizeof(x)); };
  if (v.isNone()) {
    word(0);
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    word(1);
    // A Python number passed where ATen wants a tensor (x * 2.5): its value counts, read in
    // place as its element's bytes (no dispatcher call such as item() on every op).
    if (t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number() && t.is_cpu()) {
      word(static_cast<int64_t>(t.scalar_type()));
      fold(h, t.data_ptr(), t.element_size());
    }
  } else if (v.isTensorList()) {
    word(2);
    word(static_cast<int64_t>(v.toTensorList().size()));
  } else if (v.isDouble()) {
    word(3);
    real(v.toDouble());
  } else if (v.isInt()) {
    word(4);
    word(v.toInt());
  } else if (v.isBool()) {
    word(v.toBool() ? 6 : 5);
  } else if (v.isComplexDouble()) {
    const c10::complex<double> z = v.toComplexDouble();
    word(7);
    real(z.real());
    real(z.imag());
  } else if (v.isString()) {
    const std::string& text = v.toStringRef();
    word(8);
    fold(h, text.data(), text.size());
  } else if (v.isIntList()) {
    word(9);
    for (const int64_t x : v.toIntList()) word(x);
  } else if (v.isDoubleList()) {
    word(10);
    for (const double x : v.toDoubleList()) real(x);
  } else if (v.isBoolList()) {
    word(11);
    for (const bool x : v.toBoolList()) word(x);
  } else if (v.isList()) {
    word(12);
    for (const c10::IValue& e : v.toListRef()) fold_value(h, e);
  } else if (v.isDevice()) {
    word(13);
    word(static_cast<int64_t>(v.toDevice().type()));
  } else {
    word(14);  // generators, layouts, memory formats: by kind (a dtype is an int)
  }
}

}  // namespace

uint64_t call_digest(const OpInfo& info, const c10::IValue* args, size_t n) {
  uint64_t h = info.name_hash;
  for (size_t i = 0; i < n; ++i) fold_value(h, args[i]);
  return h;
}

// The outputs' metadata from ATen: the op run on meta tensors of the global inputs; nullopt when
// ATen cannot run it on meta tensors (no meta kernel). Undefined outputs stay nullopt.
std::optional<std::vector<std::optional<TensorMeta>>> aten_output_metas(
    const c10::OperatorHandle& op, const OpInfo& info, const Inputs& inputs,
    const c10::IValue* args, size_t n) {
  torch::jit::Stack stack(args, args + n);
  for (const Input& in : inputs) {
    // A Python number wrapped as a 0-dim tensor promotes like a scalar, not like a tensor: it
    // goes in as itself, a CPU scalar, which ATen mixes with tensors of any device (torch 2.x's
    // TensorIterator refuses a wrapped number on the meta device, and the meta run then failed).
    if (in.local.unsafeGetTensorImpl()->is_wrapped_number() && in.local.is_cpu()) {
      put(stack.data(), in, in.local);
      continue;
    }
    const TensorMeta& m = in.spec.meta();
    put(stack.data(), in,
        at::empty_strided(m.shape, m.stride, at::TensorOptions().dtype(m.dtype).device(at::kMeta)));
  }
  // Every argument that could make the call compute for real goes to the meta device too: a
  // `device=` argument (randn_like(x, device="cpu") would otherwise draw a global tensor from the
  // CPU generator here, before the engine's own draw, so every later draw was off by one call),
  // a pinned-memory request (meta tensors have none) and the generator.
  for (size_t i = 0; i < n; ++i) {
    if (info.is_out[i] && stack[i].isTensor() && stack[i].toTensor().defined()) {
      stack[i] = at::empty({0}, stack[i].toTensor().options().device(at::kMeta));
    }
    if (stack[i].isDevice()) stack[i] = c10::Device(at::kMeta);
    if (static_cast<int>(i) == info.pin_memory_arg) stack[i] = c10::IValue();
    if (static_cast<int>(i) == info.generator_arg) stack[i] = c10::IValue();
  }
  try {
    op.callBoxed(&stack);
  } catch (const c10::Error&) {
    return std::nullopt;
  }
  std::vector<std::optional<TensorMeta>> out;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) {
      out.emplace_back();
    } else {
      out.push_back(meta_of(t));
    }
  };
  for (const c10::IValue& r : stack) {
    if (r.isTensor()) {
      add(r.toTensor());
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorList()) add(t);
    }
  }
  return out;
}

}  // namespace dtensor::dispatch_detail
