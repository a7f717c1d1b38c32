// Fuzz target: the command lines of ./x plan and ./x ops (tools/cli_args.h over Abseil flags).
//
// Input: one argument per line, as a shell would pass them after the program name:
// "--mesh=2,2\n--shape\n8,8\n--from=S(0),S(1)\n--from-order=0:1,0". Each input runs what
// parse_command_line does short of absl::ParseCommandLine (which exits on a bad flag, so it cannot
// run in-process): respell_args, then every "--name[=value]" / "--name value" / "--noname" goes
// to that flag's parser (CommandLineFlag::ParseFrom, i.e. AbslParseFlag for IntList and
// PlacementList). Then, as plan_explain does, the mesh, the tensor meta and the specs with the
// --from-order / --to-order shard orders are built (cli::parse_order).
// Property (NOTE [fuzz property]): no exception escapes a flag parser; the IntList and
// PlacementList parsers agree with their unparsers (unparse(parse(x)) parses to the same value);
// cli::parse_ints, parse_order and the spec constructors return or throw dtensor::Error.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "layout/dtensor_spec.h"
#include "tests/fuzz/fuzz_check.h"
#include "tools/cli_args.h"

using dtensor::cli::IntList;
using dtensor::cli::PlacementList;

// The flags of tools/plan_explain.cc and tools/ops_list.cc (names, types and defaults).
ABSL_FLAG(IntList, mesh, (IntList{{2, 2}}), "mesh shape");
ABSL_FLAG(std::vector<std::string>, names, {}, "mesh dim names");
ABSL_FLAG(IntList, shape, (IntList{{8, 8}}), "global tensor shape");
ABSL_FLAG(PlacementList, from, (PlacementList{dtensor::parse_placements("S(0),S(1)")}), "source");
ABSL_FLAG(PlacementList, to, (PlacementList{dtensor::parse_placements("S(1),S(0)")}), "target");
ABSL_FLAG(std::string, dtype, "float32", "element type");
ABSL_FLAG(std::string, from_order, "", "shard order of the source");
ABSL_FLAG(std::string, to_order, "", "shard order of the target");
ABSL_FLAG(std::string, family, "", "ops: family");
ABSL_FLAG(bool, json, false, "ops: JSON");

namespace {

using namespace dtensor;

std::vector<std::string> split_lines(std::string_view input) {
  std::vector<std::string> lines{"plan"};
  size_t start = 0;
  while (start <= input.size()) {
    const size_t end = std::min(input.find('\n', start), input.size());
    lines.emplace_back(input.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// The flags above, by name. Others (absl's --help, --flagfile, ...) print or exit in a real
// parse and are not this program's; they are left alone.
const absl::flat_hash_map<std::string, absl::CommandLineFlag*>& own_flags() {
  static const auto* flags = [] {
    auto* out = new absl::flat_hash_map<std::string, absl::CommandLineFlag*>;
    for (const auto& [name, flag] : absl::GetAllFlags()) {
      if (absl::EndsWith(flag->Filename(), "cli_args_fuzzer.cc")) out->emplace(name, flag);
    }
    return out;
  }();
  return *flags;
}

// Every input starts from the defaults (absl::FlagSaver would too, but logs each restore).
void reset_flags() {
  std::string error;
  for (const auto& [name, flag] : own_flags()) {
    if (!flag->ParseFrom(flag->DefaultValue(), &error)) {
      fuzz::finding("--" + name + "'s default '" + flag->DefaultValue() + "' does not parse", "");
    }
  }
}

absl::CommandLineFlag* find_flag(const std::string& name) {
  const auto it = own_flags().find(name);
  return it == own_flags().end() ? nullptr : it->second;
}

// One flag value, as ParseFrom gets it, plus the checks of its own parser.
void parse_value(std::string_view input, absl::CommandLineFlag& flag, const std::string& value) {
  std::string error;
  try {
    flag.ParseFrom(value, &error);  // false with a message on a bad value: fine
  } catch (...) {
    fuzz::finding("flag --" + std::string(flag.Name()) + " threw on '" + value + "'", input);
  }
  if (flag.IsOfType<IntList>()) {
    IntList list, again;
    if (cli::AbslParseFlag(value, &list, &error)) {
      const std::string text = cli::AbslUnparseFlag(list);
      FUZZ_CHECK(cli::AbslParseFlag(text, &again, &error) && again.values == list.values, input,
                 "IntList '" + value + "' unparses to '" + text + "'");
    }
    fuzz::parses(input, [&] { cli::parse_ints("--" + std::string(flag.Name()), value); });
  } else if (flag.IsOfType<PlacementList>()) {
    PlacementList list, again;
    fuzz::parses(input, [&] { parse_placements(value); });  // Error only, not just "an error"
    if (cli::AbslParseFlag(value, &list, &error)) {
      const std::string text = cli::AbslUnparseFlag(list);
      FUZZ_CHECK(cli::AbslParseFlag(text, &again, &error) && again.values == list.values, input,
                 "PlacementList '" + value + "' unparses to '" + text + "'");
    }
  }
}

// What absl::ParseCommandLine does with the flag arguments (without exiting on errors).
void parse_flags(std::string_view input, const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;  // positional
    const std::string body = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    absl::CommandLineFlag* flag = find_flag(name);
    std::string value;
    if (flag == nullptr && name.rfind("no", 0) == 0) {
      flag = find_flag(name.substr(2));
      if (flag == nullptr || !flag->IsOfType<bool>() || eq != std::string::npos) continue;
      value = "false";
    } else if (flag == nullptr) {
      continue;  // absl: unknown flag
    } else if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      continue;  // absl: missing value
    }
    parse_value(input, *flag, value);
  }
}

// plan_explain's run() up to the specs. Meshes over 4096 ranks that would be valid are skipped
// (their rank lists only cost time); invalid ones are built, as they must throw.
void build_specs(std::string_view input) {
  const std::vector<int64_t> mesh_shape = absl::GetFlag(FLAGS_mesh).values;
  int64_t ranks = 1;
  bool invalid = false;
  for (int64_t s : mesh_shape) {
    invalid = invalid || s <= 0 || __builtin_mul_overflow(ranks, s, &ranks);
  }
  if (!invalid && ranks > 4096 && ranks <= DeviceMesh::kMaxRanks) return;
  std::optional<DeviceMesh> mesh;
  std::optional<TensorMeta> meta;
  if (!fuzz::parses(input,
                    [&] { mesh = DeviceMesh::arange(mesh_shape, absl::GetFlag(FLAGS_names)); })) {
    return;
  }
  if (!fuzz::parses(input, [&] { meta = TensorMeta::make(absl::GetFlag(FLAGS_shape).values); })) {
    return;
  }
  const std::pair<Placements, std::string> layouts[] = {
      {absl::GetFlag(FLAGS_from).values, absl::GetFlag(FLAGS_from_order)},
      {absl::GetFlag(FLAGS_to).values, absl::GetFlag(FLAGS_to_order)}};
  for (const auto& layout : layouts) {
    fuzz::parses(input, [&] {
      const DTensorSpec s = DTensorSpec::make(*mesh, layout.first, *meta);
      if (layout.second.empty()) return;
      const ShardOrder order = cli::parse_order("--order", layout.second, s);
      (void)DTensorSpec::make(*mesh, s.placements(), *meta, order);
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = fuzz::as_text(data, size);
  reset_flags();
  const std::vector<std::string> lines = split_lines(input);
  std::vector<const char*> argv;
  for (const std::string& l : lines) argv.push_back(l.c_str());
  std::vector<std::string> args;
  if (!fuzz::parses(
          input, [&] { args = cli::respell_args(static_cast<int>(argv.size()), argv.data()); })) {
    fuzz::finding("respell_args threw dtensor::Error (it has no error)", input);
  }
  FUZZ_CHECK(args.size() == lines.size() && args[0] == lines[0], input, "respell_args count");
  parse_flags(input, args);
  for (const std::string& line : lines) {  // every argument as a bare int list and placement list
    fuzz::parses(input, [&] { cli::parse_ints("--mesh", line); });
    fuzz::parses(input, [&] { parse_placements(line); });
  }
  build_specs(input);
  return 0;
}
