// Convolution and its backward, and pooling, upsampling and reflection/replication padding over
// the spatial dims of [batch, channel, spatial...] tensors (the "nn" family).

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// The factors of a convolution's tensors: batch (pass), input channels, output channels (pass,
// or whole with groups), kernel and spatial dims (whole). Weight is [Cout, Cin/g, k...], or
// [Cin, Cout/g, k...] when transposed; an unbatched input has no batch dim.
struct ConvFactors {
  Rule r;
  TensorFactors input, weight, output;
  DimFactors batch, cin, cout;
  DimFactors patches;  // the output-position factors of the patch dims (see conv_patches)
};

// Stride, padding, dilation and output_padding of a convolution or its backward, from its ints
// after `skip` leading ones: len(list), list..., four times (a list of one applies to every
// spatial dim; an empty one is the default).
struct ConvLists {
  std::vector<std::vector<int64_t>> lists;
  int64_t at(size_t list, size_t i) const {
    const auto& l = lists[list];
    if (l.empty()) return list == 0 || list == 2 ? 1 : 0;
    return l[std::min(i, l.size() - 1)];
  }
};
ConvLists conv_lists(const LayoutArgs& a, size_t skip, const char* op) {
  ConvLists c;
  for (size_t i = skip; i < a.ints.size();) {
    const int64_t n = a.ints[i];
    c.lists.emplace_back(a.ints.begin() + i + 1, a.ints.begin() + i + 1 + n);
    i += 1 + n;
  }
  if (c.lists.size() != 4)
    throw Error(std::string(op) + ": needs stride, padding, dilation, output_padding");
  return c;
}

// NOTE [patch convolution]: a spatial dim whose kernel tiles it exactly (stride == kernel,
// no padding, no dilation, not transposed, kernel dividing the size: a ViT's patch embedding, a
// downsampling convolution) maps each output position to its own run of `kernel` input
// positions. Its input dim is then the factors (positions, kernel), major first, and the output
// dim the positions factor, so a Shard of the spatial dim stays sharded through the convolution
// with no communication, as PyTorch's convolution rule keeps it; its backward sums the weight's
// and bias's gradients over those positions (Partial(sum) when sharded). Positions shard only
// evenly: an uneven split of the input would cut a patch across ranks. Returns, per spatial
// dim, its kernel when it tiles, else 0.
std::vector<int64_t> conv_patches(const TensorMeta& input, const TensorMeta& weight,
                                  bool transposed, const ConvLists& l) {
  const int64_t spatial = weight.ndim() - 2, first = input.ndim() - spatial;
  std::vector<int64_t> out(spatial, 0);
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = input.shape[first + i], k = weight.shape[2 + i];
    if (!transposed && k >= 1 && l.at(0, i) == k && l.at(1, i) == 0 && l.at(2, i) == 1 &&
        in % k == 0)
      out[i] = k;
  }
  return out;
}

ConvFactors conv_factors(const TensorMeta& input, const TensorMeta& weight, bool transposed,
                         int64_t groups, FactorKind cin_kind,
                         const std::vector<int64_t>& patches = {}) {
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
  std::vector<DimFactors> positions(input.ndim());
  for (int64_t d = ch + 1; d < input.ndim(); ++d) {
    const int64_t k = patches.empty() ? 0 : patches[d - ch - 1];
    if (k == 0) {
      c.input.push_back(whole(input.shape[d]));
      continue;
    }
    const int pos = c.r.add_factor(input.shape[d] / k, FactorKind::kPass);
    c.r.factors[pos].even_only = true;
    positions[d] = {pos};
    c.patches.push_back(pos);
    c.input.push_back(k > 1 ? DimFactors{pos, c.r.add_factor(k, FactorKind::kReplicate)}
                            : DimFactors{pos});
  }
  const DimFactors w0 = grouped ? whole(weight.shape[0]) : (transposed ? c.cin : c.cout);
  const DimFactors w1 = grouped ? whole(weight.shape[1]) : (transposed ? c.cout : c.cin);
  c.weight = {w0, w1};
  for (int64_t d = 2; d < weight.ndim(); ++d) c.weight.push_back(whole(weight.shape[d]));
  if (batched) c.output.push_back(c.batch);
  c.output.push_back(c.cout);
  // Patch dims keep their positions; the others are set by the caller.
  for (int64_t d = ch + 1; d < input.ndim(); ++d) c.output.push_back(positions[d]);
  return c;
}

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups): ints: transposed, groups, then len(stride), stride..., and the same for padding,
// dilation and output_padding (a list of one applies to every spatial dim). A batch-sharded input
// gives a batch-sharded output, an output-channel-sharded weight (and bias) a channel-sharded
// output, input channels sharded on both input and weight a Partial(sum) output (the bias then
// joins on one rank). With groups, channels stay whole; channels shard only evenly. A spatial
// dim the kernel tiles stays sharded (NOTE [patch convolution]); other spatial dims stay whole.
BuiltRule convolution_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "convolution");
  const bool transposed = arg(a, 0, "convolution", "transposed") != 0;
  const int64_t groups = arg(a, 1, "convolution", "groups");
  const ConvLists l = conv_lists(a, 2, "convolution");
  ConvFactors c = conv_factors(m[0], m[1], transposed, groups, FactorKind::kContract,
                               conv_patches(m[0], m[1], transposed, l));
  Rule r = std::move(c.r);
  // The output's spatial sizes, computed here (ATen's meta kernel for convolution exists only in
  // Python's registrations, so a C++ program could not ask it).
  const int64_t spatial = m[1].ndim() - 2, first = m[0].ndim() - spatial;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = m[0].shape[first + i], k = m[1].shape[2 + i];
    const int64_t s = l.at(0, i), p = l.at(1, i), d = l.at(2, i), op = l.at(3, i);
    const int64_t out = transposed ? (in - 1) * s - 2 * p + d * (k - 1) + op + 1
                                   : (in + 2 * p - d * (k - 1) - 1) / s + 1;
    if (out < 0) throw Error("convolution: the output would have a negative size");
    if (c.output[first + i].empty()) c.output[first + i] = r.add_dim(out, FactorKind::kReplicate);
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
// ints as convolution's. grad_input sums over output channels and the weight gradients over the
// batch and the patch positions (NOTE [patch convolution]): sharding those leaves them
// Partial(sum).
BuiltRule convolution_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "convolution_backward");
  const bool transposed = arg(a, 0, "convolution_backward", "transposed") != 0;
  const int64_t groups = arg(a, 1, "convolution_backward", "groups");
  const ConvLists l = conv_lists(a, 2, "convolution_backward");
  ConvFactors c = conv_factors(m[1], m[2], transposed, groups, FactorKind::kPass,
                               conv_patches(m[1], m[2], transposed, l));
  Rule r = std::move(c.r);
  TensorFactors grad_output = c.output;
  for (size_t d = grad_output.size() - (m[1].ndim() - (m[1].ndim() == m[2].ndim() ? 2 : 1));
       d < grad_output.size(); ++d) {
    const int64_t size = m[0].shape[d];
    if (grad_output[d].empty()) grad_output[d] = r.add_dim(size, FactorKind::kReplicate);
  }
  r.inputs = {grad_output, c.input, c.weight};
  r.outputs = {c.input, c.weight, {c.cout}};
  // The weight's and bias's gradients sum over the batch and over the patch positions.
  DimFactors params_sum = c.batch;
  params_sum.insert(params_sum.end(), c.patches.begin(), c.patches.end());
  r.output_sums = {c.cout, params_sum, params_sum};
  return {std::move(r), {m[1].dtype, m[2].dtype, m[2].dtype}};
}

// Pooling, upsampling and padding over the last `spatial_dims` dims of [batch, channel,
// spatial...] tensors: the batch dim passes through (every tensor input and output shares the
// leading dims: a backward's grad, input and indices), the others stay whole, and the outputs'
// spatial sizes come from ATen (Rule::whole_output_sizes_from_aten). Outputs after the first are
// indices (max pooling).
RuleBuilder spatial(size_t spatial_dims, size_t outputs = 1) {
  return [=](const Metas& m, const LayoutArgs&) {
    need_inputs(m, 1, 3, "spatial op");
    const int64_t nd = m[0].ndim(), lead = nd - static_cast<int64_t>(spatial_dims);
    if (lead < 0) throw Error("spatial op: the input has fewer dims than the op's spatial dims");
    Rule r;
    r.whole_output_sizes_from_aten = true;
    // Only the batch dim of a batched input passes: ATen's kernels refuse a piece with no
    // channels ("non-empty ... expected"), which an uneven split of the channel dim leaves on some
    // rank, but accept an empty batch.
    TensorFactors leading;
    for (int64_t d = 0; d < lead; ++d) {
      const int64_t size = m[0].shape[d];
      const bool passes = d == 0 && lead >= 2;
      leading.push_back(r.add_dim(size, passes ? FactorKind::kPass : FactorKind::kReplicate));
    }
    auto whole = [&](int64_t size) {
      return size <= 1 ? DimFactors{} : DimFactors{r.add_factor(size, FactorKind::kReplicate)};
    };
    for (const TensorMeta& t : m) {
      TensorFactors f;
      for (int64_t d = 0; d < t.ndim(); ++d) {
        const bool shared = d < lead && t.ndim() == nd && t.shape[d] == m[0].shape[d];
        f.push_back(shared ? leading[d] : whole(t.shape[d]));
      }
      r.inputs.push_back(std::move(f));
    }
    BuiltRule b{std::move(r), {}};
    for (size_t o = 0; o < outputs; ++o) {
      TensorFactors f = leading;
      for (int64_t d = lead; d < nd; ++d)
        f.push_back({b.rule.add_factor(2, FactorKind::kReplicate)});
      b.rule.outputs.push_back(std::move(f));
      b.out_dtypes.push_back(o == 0 ? m[0].dtype : c10::kLong);
    }
    return b;
  };
}

// Pooling, upsampling and reflection/replication padding: the batch dim passes, channel and
// spatial dims stay whole (their output sizes from ATen's meta kernels). Only ops with a C++ meta
// kernel in torch 1.13 are here (a C++ program has no Python meta registrations): the others
// (max_pool3d_with_indices, _adaptive_avg_pool2d/3d, reflection_pad2d, some pad backward ops,
// max_unpool) are left to the replicate fallback. Convolution computes its own output sizes.
void add_spatial(Adder& add) {
  add("aten::convolution", "nn",
      {int_arg("transposed"), int_arg("groups"), count_arg("stride"), ints_arg("stride"),
       count_arg("padding"), ints_arg("padding"), count_arg("dilation"), ints_arg("dilation"),
       count_arg("output_padding"), ints_arg("output_padding")},
      convolution_of);
  add("aten::convolution_backward", "nn",
      {int_arg("transposed"), int_arg("groups"), count_arg("stride"), ints_arg("stride"),
       count_arg("padding"), ints_arg("padding"), count_arg("dilation"), ints_arg("dilation"),
       count_arg("output_padding"), ints_arg("output_padding")},
      convolution_backward_of);
  add("aten::upsample_nearest1d.vec", "nn", {}, spatial(1));
  add("aten::upsample_linear1d.vec", "nn", {}, spatial(1));
  add("aten::upsample_nearest1d_backward.vec", "nn", {}, spatial(1), local_shape("input_size"));
  add("aten::upsample_linear1d_backward.vec", "nn", {}, spatial(1), local_shape("input_size"));
  add("aten::reflection_pad1d", "nn", {}, spatial(1));
  add("aten::reflection_pad1d_backward", "nn", {}, spatial(1));
  add("aten::replication_pad1d", "nn", {}, spatial(1));
  add("aten::replication_pad1d_backward", "nn", {}, spatial(1));
  add("aten::avg_pool2d", "nn", {}, spatial(2));
  add("aten::avg_pool2d_backward", "nn", {}, spatial(2));
  add("aten::max_pool2d_with_indices", "nn", {}, spatial(2, 2));
  add("aten::max_pool2d_with_indices_backward", "nn", {}, spatial(2));
  add("aten::adaptive_max_pool2d", "nn", {}, spatial(2, 2));
  add("aten::adaptive_max_pool2d_backward", "nn", {}, spatial(2));
  add("aten::upsample_nearest2d.vec", "nn", {}, spatial(2));
  add("aten::upsample_bilinear2d.vec", "nn", {}, spatial(2));
  add("aten::upsample_bicubic2d.vec", "nn", {}, spatial(2));
  add("aten::upsample_nearest2d_backward.vec", "nn", {}, spatial(2), local_shape("input_size"));
  add("aten::upsample_bilinear2d_backward.vec", "nn", {}, spatial(2), local_shape("input_size"));
  add("aten::upsample_bicubic2d_backward.vec", "nn", {}, spatial(2), local_shape("input_size"));
  add("aten::replication_pad2d", "nn", {}, spatial(2));
  add("aten::avg_pool3d", "nn", {}, spatial(3));
  add("aten::avg_pool3d_backward", "nn", {}, spatial(3));
  add("aten::adaptive_max_pool3d", "nn", {}, spatial(3, 2));
  add("aten::adaptive_max_pool3d_backward", "nn", {}, spatial(3));
  add("aten::upsample_nearest3d.vec", "nn", {}, spatial(3));
  add("aten::upsample_trilinear3d.vec", "nn", {}, spatial(3));
  add("aten::upsample_nearest3d_backward.vec", "nn", {}, spatial(3), local_shape("input_size"));
  add("aten::upsample_trilinear3d_backward.vec", "nn", {}, spatial(3), local_shape("input_size"));
  add("aten::reflection_pad3d", "nn", {}, spatial(3));
  add("aten::reflection_pad3d_backward", "nn", {}, spatial(3));
  add("aten::replication_pad3d", "nn", {}, spatial(3));
}

}  // namespace

void add_conv_pool_ops(Adder& add) { add_spatial(add); }

}  // namespace dtensor::sharding::ops
