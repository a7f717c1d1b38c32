// out= arguments of ops on distributed tensors: their pieces before the local call, their
// layout after it (NOTE [resized out= arguments], NOTE [out= keeps its layout]).

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "base/error.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/engine_activity.h"
#include "dtensor/redistribute.h"
#include "layout/shard_layout.h"

namespace dtensor::dispatch_detail {

// out= arguments: their pieces are written (and resized) by the local op. A piece of the wrong
// shape is replaced (ATen would resize it with a warning).
void prepare_out_args(const OpInfo& info, const c10::FunctionSchema& schema,
                      const sharding::OpSharding& s,
                      const c10::SmallVector<at::Tensor, 8>& originals, c10::IValue* args,
                      size_t n) {
  for (size_t i = 0, o = 0; i < n; ++i) {
    if (!info.is_out[i] || !originals[i].defined()) continue;
    const size_t k = std::min(o++, s.outputs.size() - 1);
    const std::string& arg_name = schema.arguments()[i].name();
    DTENSOR_CHECK(is_dtensor(originals[i]), info.name, ": out= argument '", arg_name,
                  "' is a plain tensor but the inputs are distributed; pass a distributed out "
                  "tensor (e.g. api::empty on the same mesh)");
    DTENSOR_CHECK(spec_of(originals[i]).mesh() == s.outputs[k].mesh(), info.name,
                  ": out= argument '", arg_name, "' lives on ",
                  spec_of(originals[i]).mesh().to_string(), " but the inputs on ",
                  s.outputs[k].mesh().to_string());
    const at::Tensor piece = local_of(originals[i], "out=");
    const auto want = local_box(s.outputs[k], my_coordinate(s.outputs[k].mesh())).shape;
    if (piece.sizes().vec() == want) {
      args[i] = piece;
      continue;
    }
    // NOTE [resized out= arguments]: a single out= tensor of another shape or layout is resized
    // (its piece replaced, as ATen resizes with a warning). With several out= tensors (sort,
    // cummax, max.dim_max, ...) that crashed the process (a corrupted heap after the call), so
    // it is refused, naming the argument; pass out= tensors of the result's shape and layout.
    DTENSOR_CHECK(std::count(info.is_out.begin(), info.is_out.end(), true) == 1, info.name,
                  ": out= argument '", arg_name, "' is ", spec_of(originals[i]).to_string(),
                  " but the result is ", s.outputs[k].to_string(),
                  "; an op with several out= arguments needs each of the result's shape and "
                  "layout (redistribute it first, or call the op without out=)");
    args[i] = at::empty({0}, piece.options());
  }
}

// NOTE [out= keeps its layout]: as PyTorch's, an out= tensor keeps its placements: a result
// computed in another layout of the same global shape is redistributed into it (torch.add(S(0),
// 3, out=R) all-gathers the result into the Replicate out). A result of another global shape
// replaces the piece and spec (ATen resizes out= with a warning).
void settle_out_arg(const at::Tensor& out, const at::Tensor& local, const DTensorSpec& result) {
  const DTensorSpec& held = spec_of(out);
  const bool relayout = held.placements() != result.placements() && held.mesh() == result.mesh() &&
                        held.meta().dtype == result.meta().dtype &&
                        held.meta().shape == result.meta().shape;
  if (!relayout) {
    dtensor_impl(out)->set(local, result);
    return;
  }
  const DTensorSpec want = DTensorSpec::make(result.mesh(), held.placements(), result.meta());
  // A Partial out= tensor takes the result partitioned (one rank's share holds it).
  at::Tensor moved = redistribute_local(local, result, want, /*async_op=*/false,
                                        PlanOptions{/*allow_partial=*/true});
  const at::Tensor piece = local_of(out);
  const LocalKernelScope kernel;                        // NOTE [engine activity]
  if (moved.is_alias_of(piece)) moved = moved.clone();  // the kernel wrote into the piece
  piece.copy_(moved);
}

}  // namespace dtensor::dispatch_detail
