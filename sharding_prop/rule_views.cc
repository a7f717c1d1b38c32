// The shape-op rules of rule.h: reshape/view (dims regrouped as shared factors), permute, cat
// and stack, select, split, expand. rule.cc has the Rule itself, parse_rule and the other families.

#include <absl/strings/str_join.h>

#include <algorithm>
#include <type_traits>

#include <ATen/ceil_div.h>  // after <type_traits>: it uses std::enable_if_t without including it
#include <numeric>

#include "base/error.h"
#include "sharding_prop/rule.h"

namespace dtensor::sharding {

// A regrouping of dims `gi` of `from` into dims `gj` of `to` (equal products) as factors both
// sides share, major first: [8,4] -> [4,8] is (4,2),(4) -> (4),(2,4), so a Shard of the first dim
// survives through its major factor. Possible when, walking both sides, the smaller remaining
// size always divides the larger; otherwise returns false and adds nothing.
bool common_refinement(const std::vector<int64_t>& from, const std::vector<size_t>& gi,
                       const std::vector<int64_t>& to, const std::vector<size_t>& gj, Rule& rule,
                       TensorFactors& in, TensorFactors& out) {
  struct Piece {
    int64_t size;
    size_t in_dim, out_dim;
  };
  std::vector<Piece> pieces;
  size_t x = 0, y = 0;
  int64_t ra = from[gi[0]], rb = to[gj[0]];
  while (x < gi.size() && y < gj.size()) {
    const int64_t f = ra % rb == 0 ? rb : rb % ra == 0 ? ra : 0;
    if (f == 0) return false;
    pieces.push_back({f, gi[x], gj[y]});
    ra /= f;
    rb /= f;
    if (ra == 1 && ++x < gi.size()) ra = from[gi[x]];
    if (rb == 1 && ++y < gj.size()) rb = to[gj[y]];
  }
  for (const Piece& p : pieces) {
    const int f = rule.add_factor(p.size);
    in[p.in_dim].push_back(f);
    out[p.out_dim].push_back(f);
  }
  return true;
}

namespace {

// `to` with its -1 resolved, checked to hold as many elements as `from`.
std::vector<int64_t> resolved_view_shape(const std::vector<int64_t>& from,
                                         std::vector<int64_t> to) {
  int64_t numel = 1, known = 1, infer = -1;
  for (int64_t s : from) numel *= s;
  for (size_t j = 0; j < to.size(); ++j) {
    if (to[j] == -1) {
      if (infer >= 0) fail("view: only one dim can be -1 in ", shape_text(to));
      infer = static_cast<int64_t>(j);
    } else if (to[j] < 0) {
      fail("view: invalid size in ", shape_text(to));
    } else {
      known *= to[j];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      fail("view: shape ", shape_text(to), " is invalid for ", numel, " elements");
    }
    to[infer] = numel / known;
    known *= to[infer];
  }
  if (known != numel) {
    fail("view: shape ", shape_text(to), " is invalid for input of size ", numel, " ",
         shape_text(from));
  }
  return to;
}

// The dims of group `g` that are not of size 1 (size-1 dims inside a group carry no factor).
std::vector<size_t> sized_dims(const std::vector<size_t>& g, const std::vector<int64_t>& shape) {
  std::vector<size_t> r;
  for (size_t k : g) {
    if (shape[k] != 1) r.push_back(k);
  }
  return r;
}

// Factors for one group of input dims `gi` that holds exactly the elements of output dims `gj`:
// one dim to one dim, a split, a merge, or their common refinement (else all replicated).
void relate_group(const std::vector<int64_t>& from, const std::vector<size_t>& gi,
                  const std::vector<int64_t>& to, const std::vector<size_t>& gj, Rule& rule,
                  TensorFactors& in, TensorFactors& out) {
  if (gi.size() == 1 && gj.size() == 1) {
    const int f = rule.add_factor(from[gi[0]]);
    in[gi[0]] = {f};
    out[gj[0]] = {f};
  } else if (gi.size() == 1) {  // split
    for (size_t k : gj) {
      const int f = rule.add_factor(to[k]);
      in[gi[0]].push_back(f);
      out[k] = {f};
    }
  } else if (gj.size() == 1) {  // merge
    for (size_t k : gi) {
      const int f = rule.add_factor(from[k]);
      in[k] = {f};
      out[gj[0]].push_back(f);
    }
  } else if (!common_refinement(from, gi, to, gj, rule, in, out)) {
    // No factors both sides share ([6,4] -> [4,6]): nothing can stay sharded through it.
    for (size_t k : gi) in[k] = {rule.add_factor(from[k], FactorKind::kReplicate)};
    for (size_t k : gj) out[k] = {rule.add_factor(to[k], FactorKind::kReplicate)};
  }
}

}  // namespace

Rule reshape_rule(const std::vector<int64_t>& from, std::vector<int64_t> to) {
  to = resolved_view_shape(from, std::move(to));
  int64_t numel = 1;
  for (int64_t s : from) numel *= s;
  Rule rule;
  rule.linearity = Linearity::kMove;
  TensorFactors in(from.size()), out(to.size());
  if (numel == 0) {  // nothing to relate: every dim stands alone and stays whole
    for (size_t i = 0; i < from.size(); ++i)
      in[i] = {rule.add_factor(from[i], FactorKind::kReplicate)};
    for (size_t j = 0; j < to.size(); ++j)
      out[j] = {rule.add_factor(to[j], FactorKind::kReplicate)};
  } else {
    // Walk both shapes, grouping dims until the groups hold the same number of elements.
    size_t i = 0, j = 0;
    for (;;) {
      // A size-1 dim facing a size-1 dim is the same dim: it shares a factor, so a Shard there
      // stays (NOTE [size-1 factors]; PyTorch's view keeps it: x.view(1, 2, 4) of a [1, 8]
      // tensor sharded on dim 0 moves nothing). Other size-1 dims relate to nothing.
      while (i < from.size() && j < to.size() && from[i] == 1 && to[j] == 1) {
        const int f = rule.add_factor(1);
        in[i++] = {f};
        out[j++] = {f};
      }
      while (i < from.size() && from[i] == 1) ++i;
      while (j < to.size() && to[j] == 1) ++j;
      if (i == from.size() || j == to.size()) break;
      std::vector<size_t> gi = {i}, gj = {j};
      int64_t pi = from[i++], pj = to[j++];
      while (pi != pj) {
        if (pi < pj) {
          gi.push_back(i);
          pi *= from[i++];
        } else {
          gj.push_back(j);
          pj *= to[j++];
        }
      }
      relate_group(from, sized_dims(gi, from), to, sized_dims(gj, to), rule, in, out);
    }
  }
  rule.inputs.push_back(std::move(in));
  rule.outputs.push_back(std::move(out));
  return rule;
}

Rule permute_rule(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  if (static_cast<int64_t>(perm.size()) != ndim) {
    fail("permute: " + shape_text(perm) + " does not permute the " + std::to_string(ndim) +
         " dims of " + shape_text(shape));
  }
  Rule rule;
  rule.linearity = Linearity::kMove;
  TensorFactors in, out;
  for (int64_t d = 0; d < ndim; ++d) {
    in.push_back(rule.add_dim(shape[d]));
  }
  std::vector<bool> seen(ndim, false);
  for (int64_t p : perm) {
    const int64_t d = normalize_tensor_dim(p, ndim, "permute dim");
    if (seen[d]) fail("permute: dim " + std::to_string(d) + " repeats in " + shape_text(perm));
    seen[d] = true;
    out.push_back(in[d]);
  }
  rule.inputs.push_back(std::move(in));
  rule.outputs.push_back(std::move(out));
  return rule;
}

Rule cat_rule(const std::vector<std::vector<int64_t>>& shapes, int64_t dim, bool stack) {
  if (shapes.empty()) fail(std::string(stack ? "stack" : "cat") + ": no tensors");
  // cat skips "legacy empty" inputs, 1-D of size 0, whatever the others' shapes (ATen's cat
  // does: torch.cat([torch.empty(0), x], dim=1)); they take no part in the layout.
  const auto legacy_empty = [&](const std::vector<int64_t>& s) {
    return !stack && s.size() == 1 && s[0] == 0;
  };
  size_t ref = 0;
  while (ref + 1 < shapes.size() && legacy_empty(shapes[ref])) ++ref;
  const auto& first = shapes[ref];
  const int64_t ndim = static_cast<int64_t>(first.size());
  const int64_t d =
      normalize_tensor_dim(dim, stack ? ndim + 1 : ndim, stack ? "stack dim" : "cat dim");
  Rule rule;
  rule.linearity = Linearity::kMove;
  TensorFactors shared;
  for (int64_t k = 0; k < ndim; ++k) {
    shared.push_back(rule.add_dim(first[k]));
  }
  int64_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    if (legacy_empty(s) && !legacy_empty(first)) {
      rule.inputs.push_back({DimFactors{rule.add_factor(0, FactorKind::kReplicate)}});
      continue;
    }
    bool ok = static_cast<int64_t>(s.size()) == ndim;
    for (int64_t k = 0; ok && k < ndim; ++k) ok = s[k] == first[k] || (!stack && k == d);
    if (!ok) {
      fail(std::string(stack ? "stack" : "cat") + ": tensor " + std::to_string(i) + " of shape " +
           shape_text(s) + " does not match " + shape_text(first) +
           (stack ? "" : " outside dim " + std::to_string(d)));
    }
    TensorFactors t = shared;
    if (!stack) {
      t[d] = {rule.add_factor(s[d], FactorKind::kReplicate)};
      total += s[d];
    }
    rule.inputs.push_back(std::move(t));
  }
  TensorFactors out = shared;
  if (stack) {
    out.insert(out.begin() + d, DimFactors{rule.add_factor(static_cast<int64_t>(shapes.size()),
                                                           FactorKind::kReplicate)});
  } else {
    out[d] = {rule.add_factor(total, FactorKind::kReplicate)};
  }
  rule.outputs.push_back(std::move(out));
  return rule;
}

Rule slice_rule(const std::vector<int64_t>& shape, int64_t dim, int64_t start, int64_t end,
                int64_t step) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t d = normalize_tensor_dim(dim, nd, "slice dim");
  if (step < 1) fail("slice: step must be positive, got " + std::to_string(step));
  const int64_t n = shape[d];
  auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t lo = clampi(start), hi = std::max(clampi(end), clampi(start));
  const int64_t size = at::ceil_div(hi - lo, step);
  Rule rule = permute_rule(shape, [&] {
    std::vector<int64_t> p(nd);
    for (int64_t k = 0; k < nd; ++k) p[k] = k;
    return p;
  }());
  if (size == n) return rule;  // the whole dim: nothing changes
  rule.inputs[0][d] = rule.add_dim(n, FactorKind::kReplicate);
  rule.outputs[0][d] = rule.add_dim(size, FactorKind::kReplicate);
  return rule;
}

Rule select_rule(const std::vector<int64_t>& shape, int64_t dim) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t d = normalize_tensor_dim(dim, nd, "select dim");
  Rule rule = slice_rule(shape, d, 0, 1, 1);
  rule.outputs[0].erase(rule.outputs[0].begin() + d);
  if (shape[d] > 1) rule.factors[rule.inputs[0][d][0]].kind = FactorKind::kReplicate;
  return rule;
}

Rule split_rule(const std::vector<int64_t>& shape, int64_t dim, const std::vector<int64_t>& sizes) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t d = normalize_tensor_dim(dim, nd, "split dim");
  int64_t total = 0;
  for (int64_t v : sizes) total += v;
  if (total != shape[d]) {
    fail("split: sizes " + shape_text(sizes) + " do not add up to dim " + std::to_string(d) +
         " of " + shape_text(shape));
  }
  Rule rule = slice_rule(shape, d, 0, shape[d], 1);
  rule.outputs.clear();
  if (shape[d] > 1) rule.factors[rule.inputs[0][d][0]].kind = FactorKind::kReplicate;
  for (int64_t v : sizes) {
    TensorFactors out = rule.inputs[0];
    out[d] = rule.add_dim(v, FactorKind::kReplicate);
    rule.outputs.push_back(std::move(out));
  }
  return rule;
}

Rule expand_rule(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  if (to.size() < from.size()) {
    fail("expand: " + shape_text(to) + " has fewer dims than " + shape_text(from));
  }
  Rule rule;
  rule.linearity = Linearity::kMove;
  const size_t off = to.size() - from.size();
  TensorFactors in(from.size()), out(to.size());
  for (size_t j = 0; j < to.size(); ++j) {
    if (j < off) {
      if (to[j] < 0) fail("expand: -1 is not allowed for a new dim in " + shape_text(to));
      if (to[j] != 1) out[j] = {rule.add_factor(to[j], FactorKind::kReplicate)};
      continue;
    }
    const int64_t s = from[j - off], t = to[j] == -1 ? s : to[j];
    if (s == t) {
      if (s != 1) in[j - off] = out[j] = {rule.add_factor(s)};
    } else if (s == 1) {
      out[j] = {rule.add_factor(t, FactorKind::kReplicate)};
    } else {
      fail("expand: size " + std::to_string(s) + " cannot expand to " + std::to_string(t) + " (" +
           shape_text(from) + " to " + shape_text(to) + ")");
    }
  }
  rule.inputs.push_back(std::move(in));
  rule.outputs.push_back(std::move(out));
  return rule;
}

}  // namespace dtensor::sharding
