// ./x ops: prints every ATen overload the sharding propagator supports (all_ops()): its name,
// family, in-place flag, its layout arguments (OpEntry::args_text()), and the rule built for a
// small example input ("-" when none of the example inputs fits the op), then the count per
// family.
//
//   ops_list [--family NAME] [--json]
//
// The example: the op's own input shapes where it takes tensors of different ranks (layer_norm,
// nll_loss, embedding, baddbmm, linear), else the first of a few input sets (float32 metas, most
// inputs first: [8,4]x3, [6],[8,4],[4,6], [8,4],[4],[4], [8,4]x2, [8,4],[4,6], [2,8,4],[2,4,6],
// [8,4],[8], [8,4]) that the op's builder accepts, with example ints chosen by what the op's ints
// hold (dim -> 1, keepdim + dims -> 0,1, view's sizes -> -1, ...). Builders throw dtensor::Error
// for inputs or arguments that do not fit; those are skipped.

#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "base/error.h"
#include "layout/tensor_meta.h"
#include "sharding_prop/ops/registry.h"
#include "tools/cli_args.h"

ABSL_FLAG(std::string, family, "", "list only the ops of this family (default: all)");
ABSL_FLAG(bool, json, false,
          "print one JSON object per op on stdout (the per-family summary goes to stderr)");

namespace {

using namespace dtensor;
using namespace dtensor::sharding;
using Shapes = std::vector<std::vector<int64_t>>;

// Example layout arguments, by the op's layout arguments (OpEntry::args_text()); an op whose
// arguments read alike but take other values has its own entry.
LayoutArgs example_args(const OpEntry& op) {
  static const std::map<std::string, std::vector<int64_t>> kOpInts = {
      {"aten::view", {-1}},
      {"aten::reshape", {-1}},
      {"aten::expand", {2, 8, 4}},
  };
  static const std::map<std::string, std::vector<int64_t>> kInts = {
      {"dim", {1}},
      {"keepdim, dim...", {0, 1}},
      {"size...", {32}},
      {"start_dim, end_dim", {0, 1}},
      {"dim, sizes...", {1, 2, 2}},
      {"dim, split_sizes...", {1, 2, 2}},
      {"dim0, dim1", {0, 1}},
      {"dims...", {1, 0}},
      {"dim, start=None:0, end=None:max, step", {0, 0, 4, 1}},
      {"dim, start, length", {0, 0, 4}},
      {"split_size, dim", {4, 0}},
      {"chunks, dim", {2, 0}},
      {"num_weights", {8}},
      {"len(normalized_shape)", {1}},
      {"reduction", {1}},
      {"dtype=None:-1", {-1}},
  };
  const std::string what = op.args_text();
  LayoutArgs a;
  if (auto it = kOpInts.find(op.name); it != kOpInts.end()) {
    a.ints = it->second;
  } else if (auto it = kInts.find(what); it != kInts.end()) {
    a.ints = it->second;
  }
  if (what == "\"equation\"") a.text = "ij,jk->ik";
  return a;
}

struct Example {
  Shapes inputs;
  LayoutArgs args;
  std::string rule;
};

// Ops whose builders take inputs of different ranks: their own example first.
const std::map<std::string, Shapes>& example_overrides() {
  static const std::map<std::string, Shapes> kShapes = {
      {"aten::native_layer_norm", {{8, 4}, {4}, {4}}},
      {"aten::native_layer_norm_backward", {{8, 4}, {8, 4}, {8, 1}, {8, 1}, {4}, {4}}},
      {"aten::nll_loss_forward", {{8, 4}, {8}, {4}}},
      {"aten::nll_loss_backward", {{}, {8, 4}, {8}, {4}, {}}},  // grad_output, total_weight: 0-dim
      {"aten::embedding", {{8, 4}, {6}}},
      {"aten::embedding_dense_backward", {{6, 4}, {6}}},
      {"aten::baddbmm", {{2, 8, 6}, {2, 8, 4}, {2, 4, 6}}},
      {"aten::linear", {{8, 4}, {6, 4}, {6}}},
  };
  return kShapes;
}

std::optional<Example> build_example(const OpEntry& op) {
  static const std::vector<Shapes> kInputs = {
      {{8, 4}, {8, 4}, {8, 4}}, {{6}, {8, 4}, {4, 6}},  {{8, 4}, {4}, {4}}, {{8, 4}, {8, 4}},
      {{8, 4}, {4, 6}},         {{2, 8, 4}, {2, 4, 6}}, {{8, 4}, {8}},      {{8, 4}}};
  const LayoutArgs args = example_args(op);
  std::vector<Shapes> candidates;
  if (auto it = example_overrides().find(op.name); it != example_overrides().end()) {
    candidates.push_back(it->second);
  }
  candidates.insert(candidates.end(), kInputs.begin(), kInputs.end());
  for (const Shapes& shapes : candidates) {
    std::vector<TensorMeta> metas;
    for (const auto& s : shapes) metas.push_back(TensorMeta::make(s));
    try {
      return Example{shapes, args, op.build(metas, args).rule.to_string()};
    } catch (const Error&) {
    }
  }
  return std::nullopt;
}

std::string shapes_text(const Shapes& shapes) {
  std::vector<std::string> parts;
  for (const auto& s : shapes) parts.push_back("[" + absl::StrJoin(s, ",") + "]");
  return absl::StrJoin(parts, ",");
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// One JSON object per op (for scripts).
std::string json_line(const OpEntry& op, const std::optional<Example>& ex) {
  std::string line = "{\"op\":" + json_string(op.name) + ",\"family\":" + json_string(op.family) +
                     ",\"in_place\":" + (op.in_place ? "true" : "false") +
                     ",\"args\":" + json_string(op.args_text());
  if (ex) {
    line += ",\"example_inputs\":[" + shapes_text(ex->inputs) + "],\"example_ints\":[" +
            absl::StrJoin(ex->args.ints, ",") + "]";
    if (!ex->args.text.empty()) line += ",\"example_text\":" + json_string(ex->args.text);
    line += ",\"rule\":" + json_string(ex->rule);
  } else {
    line += ",\"example_inputs\":null,\"example_ints\":null,\"rule\":null";
  }
  return line + "}";
}

// One table row per op (for people).
void print_row(const OpEntry& op, const std::optional<Example>& ex) {
  std::string example = "-";
  if (ex) {
    example = shapes_text(ex->inputs);
    if (!ex->args.ints.empty() || !ex->args.text.empty()) example += " " + ex->args.to_string();
  }
  const std::string args = op.args_text();
  std::printf("%-40s %-10s %-3s %-34s %-28s %s\n", op.name.c_str(), op.family.c_str(),
              op.in_place ? "yes" : "", args.empty() ? "-" : args.c_str(), example.c_str(),
              ex ? ex->rule.c_str() : "-");
}

int run() {
  const std::string only = absl::GetFlag(FLAGS_family);  // "" or a family name
  const bool json = absl::GetFlag(FLAGS_json);
  std::map<std::string, int> families;  // over all ops, to validate --family
  for (const OpEntry* op : all_ops()) families[op->family];
  if (!only.empty() && families.count(only) == 0) {
    std::vector<std::string> names;
    for (const auto& [name, n] : families) names.push_back(name);
    throw Error("--family: no family '" + only + "' (families: " + absl::StrJoin(names, ", ") +
                ")");
  }

  std::map<std::string, int> counts;
  int total = 0;
  if (!json) {
    std::printf("%-40s %-10s %-3s %-34s %-28s %s\n", "op", "family", "in", "args (ints)",
                "example inputs", "rule (example)");
  }
  for (const OpEntry* op : all_ops()) {
    if (!only.empty() && op->family != only) continue;
    ++counts[op->family];
    ++total;
    const auto ex = build_example(*op);
    if (json) {
      std::printf("%s\n", json_line(*op, ex).c_str());
    } else {
      print_row(*op, ex);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [family, n] : counts) parts.push_back(family + " " + std::to_string(n));
  const std::string summary = absl::StrJoin(parts, ", ") + "; " + std::to_string(total) +
                              " overloads in " + std::to_string(counts.size()) +
                              (counts.size() == 1 ? " family" : " families");
  if (json) {
    std::cerr << summary << "\n";  // stdout holds only JSON objects
  } else {
    std::cout
        << "\n"
        << summary << "\n"
        << "Every overload listed has a native sharding rule (an entry whose rule column says "
           "\"no sharding rule\" is refused on purpose); an ATen op not listed runs by the "
           "replicate fallback (NOTE [replicate fallback]).\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x ops: the ATen overloads the sharding propagator supports, with example rules.\n"
      "  ./x ops [--family NAME] [--json]");
  return dtensor::cli::guarded_main("ops", [] { return run(); });
}
