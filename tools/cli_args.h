#pragma once
// What the small programs behind ./x (plan, ops, demo layout, tp_train, the benchmarks) share on
// top of Abseil flags: flag types for integer lists and placement lists (ABSL_FLAG(IntList, ...),
// ABSL_FLAG(PlacementList, ...): a bad value fails absl::ParseCommandLine with an error naming the
// flag and the value), the shard-order syntax "0:1,0;1:2" (it needs the spec, so it is parsed
// after the flags), and parse_command_line(): absl::ParseCommandLine plus the spellings ./x
// passes (--from-order, --max-bytes, --no-instructions, -h) and no stray positional arguments.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/error.h"
#include "layout/dtensor_spec.h"
#include "layout/placement.h"

namespace dtensor::cli {

// "2,3" -> {2, 3}. Empty text, an empty item or a non-integer item is an error (the message
// names the bad item and the whole text; callers add the flag).
inline bool parse_int_list(absl::string_view text, std::vector<int64_t>* out, std::string* error) {
  out->clear();
  if (text.empty()) {
    *error = "expected comma-separated integers, got \"\"";
    return false;
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v)) {
      *error = "'" + std::string(item) + "' is not an integer in \"" + std::string(text) + "\"";
      return false;
    }
    out->push_back(v);
  }
  return true;
}

// The same for text that is not a flag of type IntList: throws dtensor::Error naming `flag`.
inline std::vector<int64_t> parse_ints(const std::string& flag, absl::string_view text) {
  std::vector<int64_t> out;
  std::string error;
  if (!parse_int_list(text, &out, &error)) throw Error(flag + ": " + error);
  return out;
}

// A flag holding comma-separated integers: ABSL_FLAG(dtensor::cli::IntList, mesh, {{2, 2}}, ...).
struct IntList {
  std::vector<int64_t> values;
};
inline bool AbslParseFlag(absl::string_view text, IntList* list, std::string* error) {
  return parse_int_list(text, &list->values, error);
}
inline std::string AbslUnparseFlag(const IntList& list) { return absl::StrJoin(list.values, ","); }

// A flag holding a placement list, "S(0),R,P(avg)" (dtensor::parse_placements' syntax).
struct PlacementList {
  Placements values;
};
inline bool AbslParseFlag(absl::string_view text, PlacementList* list, std::string* error) {
  try {
    list->values = parse_placements(std::string_view(text.data(), text.size()));
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}
inline std::string AbslUnparseFlag(const PlacementList& list) {
  std::string text = to_string(list.values);  // "[S(0),R]": drop the brackets
  return text.size() >= 2 ? text.substr(1, text.size() - 2) : text;
}

// "0:1,0;1:2" -> tensor dim 0 is split by mesh dim 1 first, then mesh dim 0; tensor dim 1 by mesh
// dim 2. Dims not named keep `spec`'s order. Errors name `flag`.
inline ShardOrder parse_order(const std::string& flag, absl::string_view text,
                              const DTensorSpec& spec) {
  ShardOrder order = spec.shard_order();
  for (absl::string_view entry : absl::StrSplit(text, ';')) {
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) {
      throw Error(flag + ": expected <tensor dim>:<mesh dims>, got '" + std::string(entry) + "'");
    }
    const absl::string_view dim_text = entry.substr(0, colon);
    int64_t dim = 0;
    if (!absl::SimpleAtoi(dim_text, &dim) || dim < 0 || dim >= spec.ndim()) {
      throw Error(flag + ": '" + std::string(dim_text) + "' is not one tensor dim in [0, " +
                  std::to_string(spec.ndim() - 1) + "]");
    }
    order[dim] = parse_ints(flag, entry.substr(colon + 1));
  }
  return order;
}

// The arguments as absl::ParseCommandLine should see them (argv[0] unchanged): "-h" becomes
// "--help" and a flag spelled with hyphens becomes the ABSL_FLAG name it stands for
// ("--from-order" -> "--from_order", "--no-instructions" -> "--noinstructions" for a bool flag)
// when that flag exists; everything after "--" is left alone. Pure (it only looks flags up), so
// tests/fuzz:cli_args_fuzzer runs it on any argv.
inline std::vector<std::string> respell_args(int argc, const char* const* argv) {
  std::vector<std::string> spelled;
  spelled.reserve(argc);
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && !flags_done) {
      if (a == "--") {
        flags_done = true;
      } else if (a == "-h") {
        a = "--help";
      } else if (a.size() > 1 && a[0] == '-') {
        const std::string dashes = a.rfind("--", 0) == 0 ? "--" : "-";
        const size_t eq = a.find('=');
        const std::string name = a.substr(
            dashes.size(), eq == std::string::npos ? std::string::npos : eq - dashes.size());
        const std::string rest = eq == std::string::npos ? "" : a.substr(eq);
        std::string underscored = name;
        for (char& c : underscored) c = c == '-' ? '_' : c;
        if (underscored != name && absl::FindCommandLineFlag(underscored) != nullptr) {
          a = dashes + underscored + rest;
        } else if (name.rfind("no-", 0) == 0 &&
                   absl::FindCommandLineFlag(underscored.substr(3)) != nullptr) {
          a = dashes + "no" + underscored.substr(3) + rest;
        }
      }
    }
    spelled.push_back(std::move(a));
  }
  return spelled;
}

// absl::ParseCommandLine over respell_args(argv) with `usage` as the program's usage message
// (--help prints it and the flags of the program's own .cc); both spellings work. Positional
// arguments are an error. Errors print "<program>: error: ..." and exit 2 (absl's own errors,
// e.g. an unknown flag or an illegal value, print "ERROR: ..." and exit 1).
inline void parse_command_line(int argc, char** argv, const std::string& usage) {
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> spelled = respell_args(argc, argv);  // `args` points into it
  std::vector<char*> args;
  args.reserve(argc + 1);
  for (std::string& s : spelled) args.push_back(s.data());
  args.push_back(nullptr);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, args.data());
  if (positional.size() > 1) {
    const std::string_view program = argv[0];
    std::fprintf(stderr, "%s: error: unexpected argument '%s' (try --help)\n",
                 std::string(program.substr(program.rfind('/') + 1)).c_str(), positional[1]);
    std::exit(2);
  }
}

// main() of a small tool: runs `run`, turning an exception into "<name>: error: ..." and exit 2.
template <class Run>
int guarded_main(const char* name, Run&& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 2;
  }
}

}  // namespace dtensor::cli
