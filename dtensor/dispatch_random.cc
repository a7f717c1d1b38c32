// Random ops and dropout on distributed tensors: the parts of the dispatch kernel (dispatch.cc)
// that draw for the global tensor (NOTE [DTensor random] in random.h).

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <vector>

#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/engine_activity.h"
#include "dtensor/random.h"
#include "layout/shard_layout.h"

namespace dtensor::dispatch_detail {
namespace {

// ATen's is_non_overlapping_and_dense for a global shape and stride: the dims of size > 1,
// ordered by stride, tile memory without gaps (an empty tensor is dense).
bool non_overlapping_and_dense(const std::vector<int64_t>& shape,
                               const std::vector<int64_t>& stride) {
  std::vector<size_t> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return true;
    if (shape[d] > 1) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return stride[a] < stride[b]; });
  int64_t want = 1;
  for (const size_t d : dims) {
    if (stride[d] != want) return false;
    want *= shape[d];
  }
  return true;
}

}  // namespace

// Runs a random op for the global tensor chunk by chunk and keeps this rank's box (NOTE [DTensor
// random]): each chunk is the op called on a 1-D buffer standing in for the global tensor, or for
// the *_like factories (no generator argument) ATen's fill of it from the rank generator.
void run_random(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                c10::IValue* args, const Inputs& inputs, const sharding::OpSharding& s,
                const at::Tensor& self) {
  const DTensorSpec& out = s.outputs.at(0);
  const at::Tensor local = inputs.at(0).local;
  const bool in_place = info.return_alias.at(0) >= 0;
  const LocalBox box = local_box(out, my_coordinate(out.mesh()));
  // In-place: self's piece is filled directly; else a new piece laid out as self's (empty_like,
  // as ATen's functional random ops and *_like factories allocate).
  const at::TensorOptions options = local.options().dtype(out.meta().dtype);
  const at::Tensor piece = in_place                          ? local
                           : local.sizes().equals(box.shape) ? at::empty_like(local, options)
                                                             : at::empty(box.shape, options);
  at::Generator gen = rank_generator(piece.device());  // NOTE [random on a CUDA mesh]
  if (info.generator_arg >= 0) {
    if (args[info.generator_arg].isNone()) {
      args[info.generator_arg] = gen;
    } else {
      gen = args[info.generator_arg].toGenerator();
    }
  }
  check_generators_agree(out.mesh(), gen, info.name);  // NOTE [rank generators agree]
  RandomFill fill = like_fill(info.name, args, gen);   // rand_like & co.: from the rank generator
  // A device generator is the op's own default already; the CPU default is lent the rank's.
  const bool own_generator = info.generator_arg >= 0 || fill != nullptr || !gen.device().is_cpu();
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> call(args, args + n);
  torch::jit::drop(*stack, n);
  if (!fill) {
    fill = [&, self_arg = inputs[0].arg](const at::Tensor& buffer) {
      call[self_arg] = buffer;
      for (const c10::IValue& v : call) stack->push_back(v);
      const LocalKernelScope local;
      op.callBoxed(stack);
      at::Tensor drawn = stack->back().toTensor();
      stack->pop_back();
      return drawn;
    };
  }
  // NOTE [random draws in memory order]
  const DrawLayout d =
      draw_layout(out.shape(), out.meta().stride, box, piece, draw_order_of(info.name), info.name);
  if (own_generator) {
    draw_box(d.shape, d.box, d.order, gen, d.piece, fill);
  } else {  // the op draws from the default generator, which holds the rank's state meanwhile
    draw_with_rank_generator([&] {
      draw_box(d.shape, d.box, d.order, at::detail::getDefaultCPUGenerator(), d.piece, fill);
    });
  }
  stack->push_back(in_place ? self : make_dtensor(piece, out));
}

// native_dropout as the CPU kernel computes it, with the mask drawn for the global tensor (in
// chunks, as bernoulli_); on a CUDA mesh as the CUDA kernel computes it (NOTE [random on a CUDA
// mesh]).
void run_dropout(const c10::IValue* args, torch::jit::Stack* stack, size_t n,
                 const at::Tensor& input, const sharding::OpSharding& s) {
  const double p = args[1].toDouble();
  const bool train = args[2].isNone() || args[2].toBool();
  const DTensorSpec& out = s.outputs.at(0);
  const DTensorSpec& mask_spec = s.outputs.at(1);
  at::Tensor result, mask;
  const LocalBox box = train ? local_box(out, my_coordinate(out.mesh())) : LocalBox{};
  if (train && !input.device().is_cpu()) {
    // CUDA's fused dropout kernel draws its mask in its own order: the mask of one device's call
    // is that of native_dropout on ones of the global size (the mask depends on the generator,
    // the element count, the dtype and the alignment, which picks the kernel's vector width: a
    // fresh buffer is aligned as a fresh input is; an input viewed at an odd offset may not be).
    // The kernel's vector path (a dense tensor of an even element count) reads the data as a
    // flat array, so its mask is in memory order: the global stride maps it back. Its scalar
    // path (odd counts, and tensors with gaps, which a strided buffer stands in for) draws by
    // the elements' logical index (ATen's Dropout.cu).
    const at::Generator gen = rank_generator(input.device());
    check_generators_agree(out.mesh(), gen, "aten::native_dropout");
    const LocalKernelScope local;  // NOTE [engine activity]
    const std::vector<int64_t>& shape = out.shape();
    const std::vector<int64_t>& stride = out.meta().stride;
    int64_t numel = 1;
    for (const int64_t d : shape) numel *= d;
    const bool dense = non_overlapping_and_dense(shape, stride);
    at::Tensor ones = at::ones({dense ? numel : 2 * numel}, input.options());
    if (!dense) ones = ones.slice(0, 0, 2 * numel, 2);
    const at::Tensor flat = std::get<1>(at::native_dropout(ones, p, true));
    const bool memory_order = dense && numel % 2 == 0;
    at::Tensor whole = memory_order ? flat.as_strided(shape, stride) : flat.reshape(shape);
    for (size_t d = 0; d < box.shape.size(); ++d) {
      whole = whole.narrow(static_cast<int64_t>(d), box.offset[d], box.shape[d]);
    }
    mask = at::empty_like(input, input.options().dtype(at::kBool));
    mask.copy_(whole);
    // As the kernel: src * mask * (1 / keep probability), the inverse computed in its
    // accumulation type (float below double) from the keep probability in that type, and zeros
    // for p == 1 (ATen's Dropout.cu).
    const double p1m = 1. - p;
    const double scale = input.scalar_type() == at::kDouble
                             ? 1. / p1m
                             : static_cast<double>(1.0f / static_cast<float>(p1m));
    result = p1m == 0 ? at::zeros_like(input) : input.mul(mask).mul_(scale);
  } else if (train) {
    const double p1m = 1. - p;
    const double scale = p1m == 0 ? 0. : 1. / p1m;
    const at::Generator gen = rank_generator();
    check_generators_agree(out.mesh(), gen, "aten::native_dropout");
    const LocalKernelScope local;  // NOTE [engine activity]
    // The mask is laid out as the input (empty_like), as ATen's draws it.
    mask = at::empty_like(input);
    const DrawLayout d =
        draw_layout(out.shape(), out.meta().stride, box, mask,
                    draw_order_of("aten::bernoulli_.float"), "aten::native_dropout");
    draw_box(d.shape, d.box, d.order, gen, d.piece,
             [&](const at::Tensor& buffer) { return buffer.bernoulli_(p1m, gen); });
    result = input.mul(mask).mul_(scale);
    mask = mask.to(at::kBool);  // as ATen's CPU kernel returns it
  } else {
    const LocalKernelScope local;
    mask = at::ones_like(input, input.options().dtype(at::kBool));
    result = input.clone();
  }
  torch::jit::drop(*stack, n);
  stack->push_back(wrap("aten::native_dropout", result, out));
  stack->push_back(wrap("aten::native_dropout", mask, mask_spec));
}

}  // namespace dtensor::dispatch_detail
