// FFTs (the "fft" family) with their out= forms: the transformed dims stay whole, the batch dims
// pass.

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// _fft_r2c(self, dim, normalization, onesided) / _fft_c2r(self, dim, normalization,
// last_dim_size): ints: the transformed dims, then onesided / last_dim_size. The transformed dims
// stay whole, the batch dims pass; the last transformed dim changes size (n/2+1 one-sided; the
// given size back to real).
RuleBuilder fft_of(bool real_to_complex) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, 1, 1, real_to_complex ? "_fft_r2c" : "_fft_c2r");
    if (a.ints.size() < 2) throw Error("_fft: needs the transformed dims");
    const std::vector<int64_t> dims(a.ints.begin(), a.ints.end() - 1);
    Rule r = replicate_dims_rule(shapes_of(m), dims);
    const int64_t last = normalize_tensor_dim(dims.back(), m[0].ndim(), "fft dim");
    const int64_t n = m[0].shape[last];
    const int64_t size = real_to_complex ? (a.ints.back() != 0 ? n / 2 + 1 : n) : a.ints.back();
    r.outputs[0][last] = r.add_dim(size, FactorKind::kReplicate);
    return BuiltRule{
        std::move(r),
        {real_to_complex ? c10::toComplexType(m[0].dtype) : c10::toRealValueType(m[0].dtype)}};
  };
}

void add_ffts(Adder& add) {
  // FFTs: the transformed dims stay whole, batch dims pass.
  add("aten::_fft_c2c", "fft", {ints_arg("dim")}, along_dims(1));
  add("aten::_fft_r2c", "fft", {ints_arg("dim"), int_arg("onesided")}, fft_of(true));
  add("aten::_fft_c2r", "fft", {ints_arg("dim"), int_arg("last_dim_size")}, fft_of(false));
  // The out= overloads of entries above: each the same entry under its out name.
  // clang-format off
  const std::vector<std::pair<const char*, const char*>> outs = {
      {"_fft_c2c", "_fft_c2c.out"},
      {"_fft_r2c", "_fft_r2c.out"},
      {"_fft_c2r", "_fft_c2r.out"},
  };
  // clang-format on
  for (const auto& [functional, out] : outs) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

}  // namespace

void add_fft_ops(Adder& add) { add_ffts(add); }

}  // namespace dtensor::sharding::ops
