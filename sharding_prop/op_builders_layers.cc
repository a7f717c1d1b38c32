// Rule builders for layers: convolution and its backward, group norm and its backward, and the
// elementwise losses (op_builders_nn.cc has indexing, embedding, layer norm, nll, attention,
// factories and view backward ops; op_builders.cc the shared helpers).

#include <algorithm>

#include "base/error.h"
#include "sharding_prop/op_builders.h"

namespace dtensor::sharding::builders {

namespace {

// The factors of a convolution's tensors: batch (pass), input channels, output channels (pass,
// or whole with groups), kernel and spatial dims (whole). Weight is [Cout, Cin/g, k...], or
// [Cin, Cout/g, k...] when transposed; an unbatched input has no batch dim.
struct ConvFactors {
  Rule r;
  TensorFactors input, weight, output;
  DimFactors batch, cin, cout;
};

ConvFactors conv_factors(const TensorMeta& input, const TensorMeta& weight, bool transposed,
                         int64_t groups, FactorKind cin_kind) {
  if (weight.ndim() < 3 || (input.ndim() != weight.ndim() && input.ndim() != weight.ndim() - 1))
    throw Error(
        "convolution: weight must be [out, in, kernel...] and input [batch, in, spatial...]");
  ConvFactors c;
  const bool batched = input.ndim() == weight.ndim();
  const int64_t ch = batched ? 1 : 0;  // the input's channel dim
  const bool grouped = groups != 1;
  c.batch = batched ? c.r.add_dim(input.shape[0], FactorKind::kPass) : DimFactors{};
  c.cin = c.r.add_dim(input.shape[ch], grouped ? FactorKind::kReplicate : cin_kind);
  const int64_t out_channels = transposed ? weight.shape[1] * groups : weight.shape[0];
  c.cout = c.r.add_dim(out_channels, grouped ? FactorKind::kReplicate : FactorKind::kPass);
  // ATen refuses a weight with no channels: channels shard only evenly (no rank's piece empty).
  for (const DimFactors* f : {&c.cin, &c.cout})
    for (const int k : *f) c.r.factors[k].even_only = true;
  auto whole = [&](int64_t size) { return c.r.add_dim(size, FactorKind::kReplicate); };
  if (batched) c.input.push_back(c.batch);
  c.input.push_back(c.cin);
  for (int64_t d = ch + 1; d < input.ndim(); ++d) c.input.push_back(whole(input.shape[d]));
  const DimFactors w0 = grouped ? whole(weight.shape[0]) : (transposed ? c.cin : c.cout);
  const DimFactors w1 = grouped ? whole(weight.shape[1]) : (transposed ? c.cout : c.cin);
  c.weight = {w0, w1};
  for (int64_t d = 2; d < weight.ndim(); ++d) c.weight.push_back(whole(weight.shape[d]));
  if (batched) c.output.push_back(c.batch);
  c.output.push_back(c.cout);
  for (int64_t d = ch + 1; d < input.ndim(); ++d) c.output.push_back({});  // set by the caller
  return c;
}

}  // namespace

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups): ints: transposed, groups, then len(stride), stride..., and the same for padding,
// dilation and output_padding (a list of one applies to every spatial dim). A batch-sharded input
// gives a batch-sharded output, an output-channel-sharded weight (and bias) a channel-sharded
// output, input channels sharded on both input and weight a Partial(sum) output (the bias then
// joins on one rank). With groups, channels stay whole; channels shard only evenly.
BuiltRule convolution_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "convolution");
  const bool transposed = arg(a, 0, "convolution", "transposed") != 0;
  const int64_t groups = arg(a, 1, "convolution", "groups");
  ConvFactors c = conv_factors(m[0], m[1], transposed, groups, FactorKind::kContract);
  Rule r = std::move(c.r);
  // The output's spatial sizes, computed here (ATen's meta kernel for convolution exists only in
  // Python's registrations, so a C++ program could not ask it).
  std::vector<std::vector<int64_t>> lists;
  for (size_t i = 2; i < a.ints.size();) {
    const int64_t n = a.ints[i];
    lists.emplace_back(a.ints.begin() + i + 1, a.ints.begin() + i + 1 + n);
    i += 1 + n;
  }
  if (lists.size() != 4)
    throw Error("convolution: needs stride, padding, dilation, output_padding");
  auto list_at = [&](size_t list, size_t i) -> int64_t {
    const auto& l = lists[list];
    if (l.empty()) return list == 0 || list == 2 ? 1 : 0;
    return l[std::min(i, l.size() - 1)];
  };
  const int64_t spatial = m[1].ndim() - 2, first = m[0].ndim() - spatial;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = m[0].shape[first + i], k = m[1].shape[2 + i];
    const int64_t s = list_at(0, i), p = list_at(1, i), d = list_at(2, i), op = list_at(3, i);
    const int64_t out = transposed ? (in - 1) * s - 2 * p + d * (k - 1) + op + 1
                                   : (in + 2 * p - d * (k - 1) - 1) / s + 1;
    if (out < 0) throw Error("convolution: the output would have a negative size");
    c.output[first + i] = r.add_dim(out, FactorKind::kReplicate);
  }
  r.inputs = {c.input, c.weight};
  if (m.size() == 3) {
    if (m[2].ndim() != 1) throw Error("convolution: bias must be 1-D");
    r.inputs.push_back({c.cout});
    r.partial_with_contract = {false, false, true};
  }
  r.outputs = {c.output};
  return {std::move(r), {promoted(m)}};
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias):
// ints: transposed, groups. grad_input sums over output channels and the weight gradients over
// the batch: sharding those leaves them Partial(sum).
BuiltRule convolution_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "convolution_backward");
  const bool transposed = arg(a, 0, "convolution_backward", "transposed") != 0;
  const int64_t groups = arg(a, 1, "convolution_backward", "groups");
  ConvFactors c = conv_factors(m[1], m[2], transposed, groups, FactorKind::kPass);
  Rule r = std::move(c.r);
  TensorFactors grad_output = c.output;
  for (size_t d = grad_output.size() - (m[1].ndim() - (m[1].ndim() == m[2].ndim() ? 2 : 1));
       d < grad_output.size(); ++d) {
    const int64_t size = m[0].shape[d];
    grad_output[d] = r.add_dim(size, FactorKind::kReplicate);
  }
  r.inputs = {grad_output, c.input, c.weight};
  r.outputs = {c.input, c.weight, {c.cout}};
  r.output_sums = {c.cout, c.batch, c.batch};
  return {std::move(r), {m[1].dtype, m[2].dtype, m[2].dtype}};
}

// Elementwise losses (mse, smooth_l1, huber, soft_margin, binary_cross_entropy[_with_logits])
// over up to `n` broadcasting tensors: ints: reduction (0 none, 1 mean, 2 sum). None is
// elementwise. Sum and mean reduce every dim: a sharded dim leaves the loss Partial(sum), or
// Partial(avg) when the split is even (a mean of unequal pieces' means is not the mean). A
// backward (grad_output first, 0-dim unless none) is elementwise for none and sum; for mean it
// scales by the element count, which a piece does not know, so its inputs stay whole.
RuleBuilder elementwise_loss(size_t n, bool backward) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, backward ? 2 : 1, n, "loss");
    const int64_t reduction = arg(a, 0, "loss", "reduction");
    if (reduction < 0 || reduction > 2) throw Error("loss: reduction must be 0, 1 or 2");
    Rule r = pointwise_rule(shapes_of(m), Linearity::kNone);
    if (backward && reduction == 1) {
      for (Factor& f : r.factors) f.kind = FactorKind::kReplicate;
    } else if (!backward && reduction != 0) {
      for (Factor& f : r.factors) {
        f.kind = FactorKind::kContract;
        f.reduce = reduction == 1 ? ReduceOp::kAvg : ReduceOp::kSum;
      }
      r.outputs = {TensorFactors{}};
    }
    return BuiltRule{std::move(r), {promoted(m)}};
  };
}

namespace {

// Group norm's factors: the batch dim passes; channels, spatial dims and groups stay whole.
struct GroupNormFactors {
  Rule r;
  TensorFactors input, channels, stats;  // [N, C, *], [C], [N, group]
  DimFactors batch;
};

GroupNormFactors group_norm_factors(const TensorMeta& input, int64_t group) {
  if (input.ndim() < 2) throw Error("native_group_norm: input must be [N, C, *]");
  GroupNormFactors g;
  g.batch = g.r.add_dim(input.shape[0], FactorKind::kPass);
  g.input.push_back(g.batch);
  const DimFactors c = g.r.add_dim(input.shape[1], FactorKind::kReplicate);
  g.input.push_back(c);
  for (int64_t d = 2; d < input.ndim(); ++d)
    g.input.push_back(g.r.add_dim(input.shape[d], FactorKind::kReplicate));
  g.channels = {c};
  g.stats = {g.batch, g.r.add_dim(group, FactorKind::kReplicate)};
  return g;
}

}  // namespace

// native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd): ints:
// group. Statistics are per (sample, group): the batch dim passes (N is made local: the first
// output's first size), the rest stays whole.
BuiltRule group_norm_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 3, "native_group_norm");
  GroupNormFactors g = group_norm_factors(m[0], arg(a, 0, "native_group_norm", "group"));
  Rule r = std::move(g.r);
  r.inputs = {g.input};
  for (size_t i = 1; i < m.size(); ++i) r.inputs.push_back(g.channels);
  r.outputs = {g.input, g.stats, g.stats};
  return {std::move(r), {m[0].dtype, m[0].dtype, m[0].dtype}};
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask) ->
// (grad_input, grad_weight, grad_bias): ints: group. The weight gradients sum over the batch:
// a sharded batch leaves them Partial(sum).
BuiltRule group_norm_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 4, 5, "native_group_norm_backward");
  GroupNormFactors g = group_norm_factors(m[1], arg(a, 0, "native_group_norm_backward", "group"));
  Rule r = std::move(g.r);
  r.inputs = {g.input, g.input, g.stats, g.stats};
  if (m.size() == 5) r.inputs.push_back(g.channels);
  r.outputs = {g.input, g.channels, g.channels};
  r.output_sums = {{}, g.batch, g.batch};
  return {std::move(r), {m[1].dtype, m[1].dtype, m[1].dtype}};
}

}  // namespace dtensor::sharding::builders
