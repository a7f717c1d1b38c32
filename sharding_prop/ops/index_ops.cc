// Indexing (the "index" family): index_select, gather, advanced indexing (index.Tensor), scatter,
// index_add/fill/copy/reduce, and the searches isin and bucketize.

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// index_select(self, dim, index): ints: dim. The output's dim follows the 1-D index.
BuiltRule index_select_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "index_select");
  if (m[0].ndim() == 0) return on_scalar_self(m);
  const auto& s = m[0].shape;
  if (m[1].shape.size() > 1) throw Error("index_select: index must be 1-D");
  const int64_t d =
      normalize_tensor_dim(arg(a, 0, "index_select", "dim"), s.size(), "index_select dim");
  Rule r = select_rule(s, d);  // self's dim replicated, removed
  const int64_t len = m[1].shape.empty() ? 1 : m[1].shape[0];
  const DimFactors idx = r.add_dim(len);
  r.outputs[0].insert(r.outputs[0].begin() + d, idx);
  r.inputs.push_back(m[1].shape.empty() ? TensorFactors{} : TensorFactors{idx});
  r.linear_inputs = {true, false};  // a Partial self passes through; the index does not
  return {std::move(r), {m[0].dtype}};
}

// gather(self, dim, index): ints: dim. Output = index's shape; dims where self and index agree
// shard together, the others (and `dim`) stay whole.
BuiltRule gather_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "gather");
  // A 0-dim self, or an empty index (ATen skips its shape checks then: the result is an empty
  // tensor of the index's shape; torch 2.11's op_db has gather([5], 0, [2, 0])).
  if (m[0].ndim() == 0 || m[1].numel() == 0) return on_scalar_self(m, m[1].shape);
  const auto &s = m[0].shape, &ix = m[1].shape;
  if (s.size() != ix.size()) throw Error("gather: index and self need the same number of dims");
  const int64_t d = normalize_tensor_dim(arg(a, 0, "gather", "dim"), s.size(), "gather dim");
  Rule r;
  TensorFactors ts, ti;
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) != d && s[k] == ix[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      ti.push_back(f);
    } else {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      ti.push_back({r.add_factor(
          ix[k], static_cast<int64_t>(k) == d ? FactorKind::kPass : FactorKind::kReplicate)});
    }
  }
  r.inputs = {ts, ti};
  r.outputs = {ti};
  return {std::move(r), {m[0].dtype}};
}

// index.Tensor(self, indices) (x[i], x[:, i, j]): ints: per element of `indices`, 1 for a tensor
// and 0 for None. The indexed dims of self stay whole; its other dims pass. The index tensors
// broadcast together (as pointwise inputs) into the block of output dims they make, which sits
// where the indexed dims were when those are adjacent, else in front (NumPy's advanced indexing);
// a sharded index tensor leaves that block sharded, as PyTorch's. A Partial self stays Partial
// (the op picks elements) while the indices are Replicate. A bool or uint8 index (a mask) makes
// an output of the data's shape: no rule, the replicate fallback runs it.
BuiltRule index_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1 + a.ints.size(), "index");
  const std::vector<int64_t>& shape = m[0].shape;
  const int64_t ndim = m[0].ndim();
  DTENSOR_CHECK(static_cast<int64_t>(a.ints.size()) <= ndim, "index: ", a.ints.size(),
                " indices for a ", ndim, "-D tensor");
  std::vector<int64_t> indexed;
  for (size_t i = 0; i < a.ints.size(); ++i) {
    if (a.ints[i] != 0) indexed.push_back(static_cast<int64_t>(i));
  }
  DTENSOR_CHECK(indexed.size() + 1 == m.size(), "index: ", indexed.size(), " index tensors, ",
                m.size() - 1, " given");
  for (size_t k = 1; k < m.size(); ++k) {
    if (m[k].dtype == c10::kBool || m[k].dtype == c10::kByte) {
      BuiltRule declined;
      declined.run_replicated = true;
      return declined;
    }
  }
  if (indexed.empty()) {  // x[None]-free and index-free: a copy of self
    return BuiltRule{pointwise_rule({shape}, Linearity::kMove), {m[0].dtype}};
  }
  Rule r;
  r.linearity = Linearity::kMultilinear;
  r.linear_inputs.assign(m.size(), false);
  r.linear_inputs[0] = true;
  TensorFactors self;
  for (int64_t d = 0; d < ndim; ++d) {
    const bool is_indexed = std::find(indexed.begin(), indexed.end(), d) != indexed.end();
    self.push_back(r.add_dim(shape[d], is_indexed ? FactorKind::kReplicate : FactorKind::kPass));
  }
  std::vector<std::vector<int64_t>> index_shapes;
  for (size_t k = 1; k < m.size(); ++k) index_shapes.push_back(m[k].shape);
  const std::vector<int64_t> block_shape = broadcast_shapes(index_shapes);
  TensorFactors block;
  for (const int64_t size : block_shape) block.push_back(r.add_dim(size));
  r.inputs.push_back(self);
  for (const auto& s : index_shapes) r.inputs.push_back(aligned_factors(s, block_shape, block));
  const bool adjacent =
      indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
  TensorFactors out;
  if (!adjacent) out = block;
  for (int64_t d = 0; d < ndim; ++d) {
    if (adjacent && d == indexed.front()) out.insert(out.end(), block.begin(), block.end());
    if (std::find(indexed.begin(), indexed.end(), d) == indexed.end()) out.push_back(self[d]);
  }
  r.outputs.push_back(std::move(out));
  return BuiltRule{std::move(r), {m[0].dtype}};
}

// scatter / scatter_add / scatter_reduce (self, index[, src]): ints: dim. Along `dim` everything
// stays whole; other dims shard together where their sizes agree (each output element takes only
// index entries of its own coordinates there, whatever the reduction).
BuiltRule scatter_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "scatter");
  // A 0-dim self (index and src of <= 1 element), or an empty index (self unchanged: ATen skips
  // the shape checks; the backward of gather with an empty index).
  if (m[0].ndim() == 0 || m[1].numel() == 0) return on_scalar_self(m, m[0].shape);
  // The .value overloads scatter a Scalar: no src tensor.
  const auto &s = m[0].shape, &ix = m[1].shape, &src = m.size() == 3 ? m[2].shape : m[1].shape;
  if (ix.size() != s.size() || src.size() != s.size()) {
    throw Error("scatter: self, index and src need the same number of dims");
  }
  const int64_t d = normalize_tensor_dim(arg(a, 0, "scatter", "dim"), s.size(), "scatter dim");
  Rule r;
  TensorFactors ts, ti, tsrc;
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) != d && s[k] == ix[k] && ix[k] == src[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      ti.push_back(f);
      tsrc.push_back(f);
    } else {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      ti.push_back({r.add_factor(ix[k], FactorKind::kReplicate)});
      tsrc.push_back({r.add_factor(src[k], FactorKind::kReplicate)});
    }
  }
  r.inputs = {ts, ti, tsrc};
  if (m.size() == 2) r.inputs.pop_back();
  r.outputs = {ts};
  return {std::move(r), {m[0].dtype}};
}

BuiltRule index_add_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "index_add");
  if (m[0].ndim() == 0) return on_scalar_self(m);
  const auto &s = m[0].shape, &src = m[2].shape;
  const int64_t d = normalize_tensor_dim(arg(a, 0, "index_add", "dim"), s.size(), "index_add dim");
  if (src.size() != s.size() || m[1].shape.size() > 1) {
    throw Error("index_add: source must have self's dims and index must be 1-D");
  }
  Rule r;
  TensorFactors ts, tsrc;
  // The additions along `dim` land on the rows the index names: source rows and index entries
  // shard together, which leaves self's rows Partial(sum).
  const int64_t len = m[1].shape.empty() ? 1 : m[1].shape[0];
  const DimFactors rows = r.add_dim(len, FactorKind::kContract);
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) == d) {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      tsrc.push_back(rows);
    } else if (s[k] == src[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      tsrc.push_back(f);
    } else {
      throw Error("index_add: source and self differ outside dim");
    }
  }
  r.inputs = {ts, m[1].shape.empty() ? TensorFactors{} : TensorFactors{rows}, tsrc};
  r.outputs = {ts};
  r.partial_with_contract = {true, false, false};  // self joins the Partial sum on one rank
  return {std::move(r), {m[0].dtype}};
}

// index_fill / index_copy / index_reduce (self, dim, index[, source or 0-dim value]): ints: dim.
// Self's dim stays whole (the index names its rows), the 1-D index is replicated, a source with
// self's dims shards with self elsewhere.
BuiltRule index_along_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "index_fill/index_copy/index_reduce");
  if (m[0].ndim() == 0) return on_scalar_self(m);
  const auto& s = m[0].shape;
  const int64_t d = dim_arg(a, 0, m[0].ndim(), "index_fill/index_copy/index_reduce");
  const bool has_src = m.size() == 3 && m[2].ndim() == m[0].ndim();
  Rule r;
  TensorFactors ts, tsrc;
  for (int64_t k = 0; k < m[0].ndim(); ++k) {
    if (k == d) {
      ts.push_back(r.add_dim(s[k], FactorKind::kReplicate));
      if (has_src) tsrc.push_back(r.add_dim(m[2].shape[k], FactorKind::kReplicate));
    } else if (!has_src || m[2].shape[k] == s[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      tsrc.push_back(f);
    } else {
      throw Error("index_copy/index_reduce: source and self differ outside dim");
    }
  }
  r.inputs = {ts, dims_of(r, m[1].shape, FactorKind::kReplicate)};
  if (m.size() == 3) {
    r.inputs.push_back(has_src ? tsrc : dims_of(r, m[2].shape, FactorKind::kReplicate));
  }
  r.outputs = {ts};
  return {std::move(r), {m[0].dtype}};
}

// isin(elements, test_elements) / bucketize(self, boundaries): ints: the output dtype as a
// ScalarType number (isin: bool) or out_int32 (bucketize). The first tensor passes elementwise;
// the second is searched whole.
RuleBuilder search_of(bool bucketize) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, 2, 2, bucketize ? "bucketize" : "isin");
    Rule r;
    const TensorFactors t = dims_of(r, m[0].shape, FactorKind::kPass);
    r.inputs = {t, dims_of(r, m[1].shape, FactorKind::kReplicate)};
    r.outputs = {t};
    const c10::ScalarType out = !bucketize                                 ? c10::kBool
                                : arg(a, 0, "bucketize", "out_int32") != 0 ? c10::kInt
                                                                           : c10::kLong;
    return BuiltRule{std::move(r), {out}};
  };
}

// Reads along one dim (index_select, gather), by index tensors (index.Tensor), and searches.
void add_reads(Adder& add) {
  add("aten::index_select", "index", {int_arg("dim")}, index_select_of);
  add("aten::gather", "index", {int_arg("dim")}, gather_of);
  add("aten::index.Tensor", "index", {present_arg("indices")}, index_of);
  add("aten::_unsafe_index.Tensor", "index", {present_arg("indices")}, index_of);
  add("aten::isin.Tensor_Tensor", "index", {}, search_of(false));
  add("aten::bucketize.Tensor", "index", {int_arg("out_int32")}, search_of(true));
}

// Writes along one dim: scatter (the dim whole, other dims shard with index and src) and
// index_fill/index_copy/index_reduce (self's dim whole, the index replicated).
void add_indexing(Adder& add) {
  add("aten::scatter_add", "index", {int_arg("dim")}, scatter_of);
  add("aten::scatter.src", "index", {int_arg("dim")}, scatter_of);
  add("aten::index_add", "index", {int_arg("dim")}, index_add_of);
  for (const char* op : {"scatter.value", "scatter.reduce", "scatter.value_reduce",
                         "scatter_reduce.two", "scatter_.src", "scatter_.value", "scatter_.reduce",
                         "scatter_.value_reduce", "scatter_add_", "scatter_reduce_.two"}) {
    add(std::string("aten::") + op, "index", {int_arg("dim")}, scatter_of);
  }
  for (const char* op :
       {"index_fill.int_Scalar", "index_fill.int_Tensor", "index_fill_.int_Scalar",
        "index_fill_.int_Tensor", "index_copy", "index_copy_", "index_reduce", "index_reduce_"}) {
    add(std::string("aten::") + op, "index", {int_arg("dim")}, index_along_of);
  }
  add("aten::index_add_", "index", {int_arg("dim")}, index_add_of);
}

}  // namespace

void add_index_ops(Adder& add) {
  add_reads(add);
  add_indexing(add);
}

}  // namespace dtensor::sharding::ops
