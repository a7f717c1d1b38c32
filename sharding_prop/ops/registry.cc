// The op table itself (find_op, all_ops, register_rule): the entries every family's file under
// sharding_prop/ops/ adds (family.h), indexed by name, and the ops registered at run time.

#include "sharding_prop/ops/registry.h"

#include "base/error.h"
#include "sharding_prop/ops/family.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

#include <absl/container/node_hash_map.h>
#include <absl/hash/hash.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>

namespace dtensor::sharding {
namespace {

using ops::Metas;

std::vector<OpEntry> build_table() {
  ops::Adder add;
  ops::add_pointwise_ops(add);
  ops::add_reduction_ops(add);
  ops::add_matrix_ops(add);
  ops::add_view_ops(add);
  ops::add_shape_ops(add);
  ops::add_index_ops(add);
  ops::add_fft_ops(add);
  ops::add_nn_ops(add);
  ops::add_conv_pool_ops(add);
  ops::add_factory_random_ops(add);
  std::vector<OpEntry>& t = add.entries;
  std::sort(t.begin(), t.end(), [](const OpEntry& a, const OpEntry& b) { return a.name < b.name; });
  return std::move(t);
}

// The op table: an interning table, not a cache (NOTE [caches]): entries are handed out by pointer
// and live for the process. The built-in entries never change after construction, so they are
// read without a lock (find_op is on the propagation path of every op whose entry the caller has
// not kept); entries registered at run time (register_rule) sit in their own map under a mutex.
struct Table {
  const absl::node_hash_map<std::string, OpEntry> builtin;
  absl::Mutex mu;
  absl::node_hash_map<std::string, OpEntry> custom ABSL_GUARDED_BY(mu);
  Table() : builtin(index(build_table())) {}

  static absl::node_hash_map<std::string, OpEntry> index(std::vector<OpEntry> entries) {
    absl::node_hash_map<std::string, OpEntry> out;
    for (auto& e : entries) {
      const std::string name = e.name;
      TORCH_INTERNAL_ASSERT(out.emplace(name, std::move(e)).second, "two entries for ", name);
    }
    return out;
  }
};

Table& op_table() {
  static Table* t = new Table();  // never destroyed: entries are handed out by pointer
  return *t;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

LayoutArg int_arg(std::string name, std::optional<int64_t> if_none) {
  return {std::move(name), LayoutArg::Kind::kInt, if_none};
}
LayoutArg ints_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kInts, {}}; }
LayoutArg count_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kCount, {}}; }
LayoutArg text_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kText, {}}; }
LayoutArg present_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kPresent, {}}; }
LayoutArg device_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kDevice, {}}; }
LayoutArg norm_ord_arg(std::string name) {
  return {std::move(name), LayoutArg::Kind::kNormOrd, {}};
}
LayoutArg equal_args(std::string name, std::string other) {
  return {std::move(name), LayoutArg::Kind::kEqual, {}, std::move(other)};
}
LocalShapeArg local_shape(std::string name, LocalShapeArg::Kind kind) {
  return {kind, std::move(name)};
}

std::string LayoutArg::to_string() const {
  switch (kind) {
    case Kind::kInts:
      return name + "...";
    case Kind::kCount:
      return "len(" + name + ")";
    case Kind::kText:
      return "\"" + name + "\"";
    case Kind::kPresent:
      return name + "?";
    case Kind::kDevice:
      return "device(" + name + ")";
    case Kind::kEqual:
      return name + "==" + other;
    case Kind::kNormOrd:
      return "class(" + name + ")";
    case Kind::kInt:
      break;
  }
  if (!if_none) return name;
  return absl::StrCat(
      name,
      "=None:", *if_none == std::numeric_limits<int64_t>::max() ? "max" : std::to_string(*if_none));
}

std::string OpEntry::args_text() const {
  return absl::StrJoin(layout_args, ", ",
                       [](std::string* out, const LayoutArg& a) { out->append(a.to_string()); });
}

size_t LayoutArgs::hash() const {
  return ints.empty() && text.empty() && call.empty() ? 0 : absl::HashOf(ints, text, call);
}

std::string LayoutArgs::to_string() const {
  std::string s = "(" + absl::StrJoin(ints, ",");
  if (!text.empty()) s += (ints.empty() ? "\"" : ", \"") + text + "\"";
  return s + ")";
}

Flops flops_of_family(std::string_view family) {
  if (family == "matmul" || family == "custom") return Flops::kContraction;
  if (family == "pointwise") return Flops::kOutputElements;
  return Flops::kNone;
}

double rule_flops(Flops kind, const Rule& rule, const std::vector<int64_t>& shards) {
  auto local = [&](size_t f) {
    const int64_t k = f < shards.size() ? std::max<int64_t>(shards[f], 1) : 1;
    return static_cast<double>((rule.factors[f].size + k - 1) / k);
  };
  double flops = 0;
  switch (kind) {
    case Flops::kNone:
      break;
    case Flops::kOutputElements:
      for (const TensorFactors& out : rule.outputs) {
        double n = 1;
        for (const DimFactors& dim : out) {
          for (int f : dim) n *= local(static_cast<size_t>(f));
        }
        flops += n;
      }
      break;
    case Flops::kContraction:
      flops = 2;
      for (size_t f = 0; f < rule.factors.size(); ++f) flops *= local(f);
      break;
  }
  return flops;
}

const OpEntry* find_op(std::string_view name) {
  Table& t = op_table();
  const absl::string_view key(name.data(), name.size());  // Debian's Abseil has its own
  if (auto it = t.builtin.find(key); it != t.builtin.end()) return &it->second;
  absl::MutexLock lock(&t.mu);
  auto it = t.custom.find(key);
  return it == t.custom.end() ? nullptr : &it->second;
}

std::vector<const OpEntry*> all_ops() {
  Table& t = op_table();
  std::vector<const OpEntry*> out;
  for (const auto& [name, e] : t.builtin) out.push_back(&e);
  {
    absl::MutexLock lock(&t.mu);
    for (const auto& [name, e] : t.custom) out.push_back(&e);
  }
  std::sort(out.begin(), out.end(),
            [](const OpEntry* a, const OpEntry* b) { return a->name < b->name; });
  return out;
}

std::vector<std::string> nearest_ops(std::string_view name, size_t count) {
  const std::string_view base = name.substr(0, name.find('.'));
  std::vector<std::pair<size_t, std::string>> scored;
  for (const OpEntry* e : all_ops()) {
    const std::string_view other = std::string_view(e->name).substr(0, e->name.find('.'));
    scored.emplace_back(edit_distance(base, other) * 100 + edit_distance(name, e->name), e->name);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < count; ++i) out.push_back(scored[i].second);
  return out;
}

void register_custom_op(const std::string& name, std::vector<LayoutArg> layout_args,
                        RuleBuilder build) {
  OpEntry e{name, "custom", std::move(layout_args), false, std::move(build)};
  e.flops = flops_of_family(e.family);
  Table& t = op_table();
  absl::MutexLock lock(&t.mu);
  if (t.builtin.count(name) != 0 || !t.custom.emplace(name, std::move(e)).second) {
    throw Error("register_rule: '" + name + "' already has a rule");
  }
}

void register_rule(const std::string& name, const std::string& rule_text, Linearity linearity) {
  register_custom_op(name, {}, [rule_text, linearity](const Metas& m, const LayoutArgs&) {
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& x : m) shapes.push_back(x.shape);
    return BuiltRule{parse_rule(rule_text, shapes, linearity), {m.at(0).dtype}};
  });
}

}  // namespace dtensor::sharding
