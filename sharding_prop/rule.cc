#include "sharding_prop/rule.h"

#include <absl/strings/ascii.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "base/error.h"

namespace dtensor::sharding {

std::string shape_text(const std::vector<int64_t>& s) { return "[" + absl::StrJoin(s, ",") + "]"; }

namespace {

char letter(int f) { return f < 26 ? static_cast<char>('a' + f) : static_cast<char>('A' + f - 26); }

}  // namespace

// Broadcast shape of `shapes` (right-aligned), or throws.
std::vector<int64_t> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  size_t n = 0;
  for (const auto& s : shapes) n = std::max(n, s.size());
  std::vector<int64_t> out(n, 1);
  for (const auto& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& o = out[n - s.size() + k];
      const int64_t v = s[k];
      if (v == o || v == 1) continue;
      if (o != 1) {
        std::vector<std::string> texts;
        for (const auto& x : shapes) texts.push_back(shape_text(x));
        fail("shapes " + absl::StrJoin(texts, " and ") + " do not broadcast");
      }
      o = v;
    }
  }
  return out;
}

// Factors of `shape` right-aligned against the output factors `out` (of shape `out_shape`): a
// dim equal to the output's shares its factor; a size-1 dim under a larger one has none.
TensorFactors aligned_factors(const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& out_shape, const TensorFactors& out) {
  TensorFactors t(shape.size());
  const size_t off = out_shape.size() - shape.size();
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == out_shape[off + k]) t[k] = out[off + k];
  }
  return t;
}

int Rule::add_factor(int64_t size, FactorKind kind, ReduceOp reduce) {
  factors.push_back({size, kind, reduce});
  return static_cast<int>(factors.size()) - 1;
}

std::vector<int64_t> Rule::output_shape(size_t i) const {
  std::vector<int64_t> shape;
  for (const DimFactors& dim : outputs.at(i)) {
    int64_t size = 1;
    for (int f : dim) size *= factors[f].size;
    shape.push_back(size);
  }
  return shape;
}

std::string Rule::to_string() const {
  // Letters in order of first appearance, inputs then outputs: "mk,kn->mn" reads "ab,bc->ac".
  std::vector<int> name(factors.size(), -1);
  int next = 0;
  for (const auto* group : {&inputs, &outputs}) {
    for (const TensorFactors& t : *group) {
      for (const DimFactors& dim : t) {
        for (int f : dim) {
          if (name[f] < 0) name[f] = next++;
        }
      }
    }
  }

  auto letter = [&name](int f) { return dtensor::sharding::letter(name[f]); };
  auto tensor = [&letter](const TensorFactors& t) {
    std::string s;
    for (const DimFactors& dim : t) {
      if (dim.empty()) {
        s += '1';
      } else if (dim.size() == 1) {
        s += letter(dim[0]);
      } else {
        s += '(';
        for (int f : dim) s += letter(f);
        s += ')';
      }
    }
    return s;
  };
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? "," : "") + tensor(inputs[i]);
  s += "->";
  for (size_t i = 0; i < outputs.size(); ++i) s += (i ? "," : "") + tensor(outputs[i]);
  std::vector<std::string> notes;
  for (size_t f = 0; f < factors.size(); ++f) {
    if (name[f] < 0) continue;  // in no tensor (a size-1 remnant): nothing to say
    if (factors[f].kind == FactorKind::kContract) {
      const std::string p = factors[f].partial().to_string();  // "P(sum)", "P(norm2)"
      notes.push_back(std::string(1, letter(static_cast<int>(f))) + ":" +
                      p.substr(2, p.size() - 3));
    } else if (factors[f].kind == FactorKind::kReplicate) {
      notes.push_back(std::string(1, letter(static_cast<int>(f))) + ":replicate");
    }
  }
  std::sort(notes.begin(), notes.end());
  if (!notes.empty()) s += " | " + absl::StrJoin(notes, ", ");
  return s;
}

namespace {

// ::isspace(char) is undefined for bytes over 0x7f (a negative char); rule text may hold any.
bool is_space(char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); }

// The factors of one input of a text rule: a letter per dim, new letters become factors (pass
// when the output has them, contract otherwise), known letters must keep their size.
TensorFactors parse_input(std::string_view text, const std::string& letters, size_t i,
                          const std::vector<int64_t>& shape, const std::string& out, Rule& rule,
                          std::map<char, int>& factor_of) {
  if (letters.size() != shape.size()) {
    fail("rule '", text, "': input ", i, " '", letters, "' has ", letters.size(),
         " dims but its tensor is ", shape_text(shape));
  }
  TensorFactors t;
  for (size_t k = 0; k < letters.size(); ++k) {
    const char c = letters[k];
    if (!absl::ascii_isalpha(static_cast<unsigned char>(c))) fail("rule letter '", c, "'");
    auto it = factor_of.find(c);
    if (it == factor_of.end()) {
      const FactorKind kind =
          out.find(c) != std::string::npos ? FactorKind::kPass : FactorKind::kContract;
      it = factor_of.emplace(c, rule.add_factor(shape[k], kind)).first;
    } else if (rule.factors[it->second].size != shape[k]) {
      fail("rule '", text, "': '", c, "' is ", rule.factors[it->second].size, " in one input and ",
           shape[k], " in input ", i);
    }
    t.push_back({it->second});
  }
  return t;
}

// Notes after the '|': "k:max, d:replicate".
void apply_notes(std::string_view notes, const std::map<char, int>& factor_of, Rule& rule) {
  const absl::string_view all(notes.data(), notes.size());  // Debian's absl has its own string_view
  for (absl::string_view raw : absl::StrSplit(all, ',', absl::SkipWhitespace())) {
    std::string note(raw.data(), raw.size());
    note.erase(std::remove_if(note.begin(), note.end(), is_space), note.end());
    const size_t colon = note.find(':');
    auto it = colon == 1 ? factor_of.find(note[0]) : factor_of.end();
    if (it == factor_of.end()) fail("rule note '", note, "' names no factor of the rule");
    const std::string what = note.substr(2);
    Factor& f = rule.factors[it->second];
    if (what == "replicate") {
      f.kind = FactorKind::kReplicate;
    } else if (f.kind == FactorKind::kContract) {
      const Placement p = parse_placement("P(" + what + ")");
      f.reduce = p.reduce_op();
      f.norm = p.norm_order();
    } else {
      fail("rule note '", note, "': only a contracted factor takes a reduce op");
    }
  }
}

}  // namespace

Rule parse_rule(std::string_view text, const std::vector<std::vector<int64_t>>& shapes,
                Linearity linearity) {
  const std::pair<std::string, std::string> parts =
      absl::StrSplit(absl::string_view(text.data(), text.size()), absl::MaxSplits('|', 1));
  std::string body = parts.first;
  body.erase(std::remove_if(body.begin(), body.end(), is_space), body.end());
  const size_t arrow = body.find("->");
  if (arrow == std::string::npos) fail("rule '", text, "' has no '->'");
  const std::vector<std::string> ins = absl::StrSplit(body.substr(0, arrow), ',');
  const std::string out = body.substr(arrow + 2);
  if (ins.size() != shapes.size()) {
    fail("rule '", text, "' names ", ins.size(), " inputs but the op has ", shapes.size());
  }
  Rule rule;
  rule.linearity = linearity;
  std::map<char, int> factor_of;
  for (size_t i = 0; i < ins.size(); ++i) {
    rule.inputs.push_back(parse_input(text, ins[i], i, shapes[i], out, rule, factor_of));
  }
  TensorFactors o;
  for (char c : out) {
    auto it = factor_of.find(c);
    if (it == factor_of.end()) fail("rule '", text, "': output letter '", c, "' is in no input");
    o.push_back({it->second});
  }
  rule.outputs.push_back(std::move(o));
  apply_notes(parts.second, factor_of, rule);
  // A letter naming two dims of one tensor ("ii->i", a diagonal; einsum allows it) ties their
  // indices, but Shard placements split each dim on its own: a row block's local diagonal is not
  // a block of the global one. Such a factor stays whole whatever the notes say.
  for (const auto* group : {&rule.inputs, &rule.outputs}) {
    for (const TensorFactors& t : *group) {
      std::vector<int> uses(rule.factors.size(), 0);
      for (const DimFactors& dim : t) {
        for (int f : dim) {
          if (++uses[f] == 2) rule.factors[f].kind = FactorKind::kReplicate;
        }
      }
    }
  }
  return rule;
}

Rule pointwise_rule(const std::vector<std::vector<int64_t>>& shapes, Linearity linearity,
                    std::vector<bool> linear_inputs) {
  Rule rule;
  rule.linearity = linearity;
  rule.linear_inputs = std::move(linear_inputs);
  const auto out_shape = broadcast_shapes(shapes);
  TensorFactors out;
  for (int64_t s : out_shape) {
    out.push_back(rule.add_dim(s));
  }
  for (const auto& s : shapes) rule.inputs.push_back(aligned_factors(s, out_shape, out));
  rule.outputs.push_back(std::move(out));
  return rule;
}

Rule reduction_rule(const std::vector<int64_t>& shape, std::vector<int64_t> dims, bool keepdim,
                    ReduceOp reduce, bool replicate, Linearity linearity) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(ndim, dims.empty());
  for (int64_t d : dims) {
    if (ndim > 0) reduced[normalize_tensor_dim(d, ndim, "reduction dim")] = true;
  }
  Rule rule;
  rule.linearity = linearity;
  TensorFactors in, out;
  for (int64_t d = 0; d < ndim; ++d) {
    const FactorKind kind = !reduced[d] ? FactorKind::kPass
                            : replicate ? FactorKind::kReplicate
                                        : FactorKind::kContract;
    const int f = rule.add_factor(shape[d], kind, reduce);
    in.push_back({f});
    if (!reduced[d]) {
      out.push_back({f});
    } else if (keepdim) {
      out.push_back({});
    }
  }
  rule.inputs.push_back(std::move(in));
  rule.outputs.push_back(std::move(out));
  return rule;
}

Rule replicate_dims_rule(const std::vector<std::vector<int64_t>>& shapes,
                         const std::vector<int64_t>& dims, size_t n_outputs) {
  Rule rule = pointwise_rule(shapes, Linearity::kNone);
  const int64_t ndim = static_cast<int64_t>(shapes.at(0).size());
  for (int64_t d : dims) {
    // ATen wraps a 0-dim tensor's dim as one of a 1-dim tensor (dim 0 or -1: softmax, cumsum,
    // sort of a scalar); there is no dim to keep whole then (found by the full op_db sweep).
    if (ndim == 0) {
      DTENSOR_CHECK(d == 0 || d == -1, "dim ", d,
                    " is out of range for a 0-D tensor (expected a dim in [-1, 0])");
      continue;
    }
    const int64_t k = normalize_tensor_dim(d, ndim, "dim");
    for (int f : rule.inputs[0][k]) rule.factors[f].kind = FactorKind::kReplicate;
  }
  while (rule.outputs.size() < n_outputs) rule.outputs.push_back(rule.outputs[0]);
  return rule;
}

Rule matmul_rule(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.empty() || b.empty()) fail("matmul: both arguments need at least 1 dim");
  Rule rule;
  rule.linearity = Linearity::kMultilinear;
  const int64_t ka = a.back(), kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb) {
    fail("matmul: shapes " + shape_text(a) + " and " + shape_text(b) + " cannot be multiplied (" +
         std::to_string(ka) + " vs " + std::to_string(kb) + ")");
  }
  const int k = rule.add_factor(ka, FactorKind::kContract);
  // Batch dims: everything before the last two (or one, for a 1-D operand), broadcast.
  const std::vector<int64_t> ba(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  const std::vector<int64_t> bb(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  const auto batch = broadcast_shapes({ba, bb});
  TensorFactors bo;
  for (int64_t s : batch) bo.push_back(rule.add_dim(s));
  TensorFactors ta = aligned_factors(ba, batch, bo), tb = aligned_factors(bb, batch, bo), out = bo;
  if (a.size() >= 2) {
    const DimFactors m = rule.add_dim(a[a.size() - 2]);
    ta.push_back(m);
    out.push_back(m);
  }
  ta.push_back({k});
  tb.push_back({k});
  if (b.size() >= 2) {
    const DimFactors n = rule.add_dim(b.back());
    tb.push_back(n);
    out.push_back(n);
  }
  rule.inputs = {ta, tb};
  rule.outputs = {out};
  return rule;
}

Rule with_bias(Rule product, const std::vector<int64_t>& bias, const char* op) {
  const auto out_shape = product.output_shape(0);
  broadcast_shapes({bias, out_shape});  // validates
  if (bias.size() > out_shape.size()) fail(op, ": bias ", shape_text(bias), " has too many dims");
  product.inputs.insert(product.inputs.begin(),
                        aligned_factors(bias, out_shape, product.outputs[0]));
  // A sharded contraction makes the product Partial: the bias must then be Partial as well (kept
  // on one rank), which the propagator does with an internal partition.
  product.linearity = Linearity::kNone;
  product.partial_with_contract = {true, false, false};
  return product;
}

Rule addmm_rule(const std::vector<int64_t>& bias, const std::vector<int64_t>& a,
                const std::vector<int64_t>& b) {
  return with_bias(matmul_rule(a, b), bias, "addmm");
}

Rule linear_rule(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                 const std::vector<int64_t>* bias) {
  if (w.size() != 2) fail("linear: weight must be 2-D, got " + shape_text(w));
  Rule rule = matmul_rule(x, {w[1], w[0]});
  // The weight is [n, k]: swap its factors back.
  std::swap(rule.inputs[1][0], rule.inputs[1][1]);
  if (bias != nullptr) {
    const auto out_shape = rule.output_shape(0);
    broadcast_shapes({*bias, out_shape});
    rule.inputs.push_back(aligned_factors(*bias, out_shape, rule.outputs[0]));
    rule.linearity = Linearity::kNone;
    rule.partial_with_contract = {false, false, true};
  }
  return rule;
}

}  // namespace dtensor::sharding
