#pragma once
// Command-line parsing shared by the small programs behind ./x (demo, plan): integer lists,
// name lists, shard orders, and --flag value pairs. Errors are dtensor::Error naming the
// flag and the bad text.

#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "layout/dtensor_spec.h"

namespace dtensor::cli {

inline std::vector<int64_t> parse_ints(const std::string& flag, const std::string& text) {
  if (text.empty() || text.back() == ',') {
    throw Error(flag + ": expected comma-separated integers, got \"" + text + "\"");
  }
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) throw Error(item);
    } catch (const std::exception&) {
      throw Error(flag + ": '" + item + "' is not an integer in \"" + text + "\"");
    }
  }
  return out;
}

inline std::vector<std::string> parse_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// "0:1,0;1:2" -> tensor dim 0 is split by mesh dim 1 first, then mesh dim 0; tensor dim 1 by mesh
// dim 2. Dims not named keep `spec`'s order.
inline ShardOrder parse_order(const std::string& flag, const std::string& text,
                              const DTensorSpec& spec) {
  ShardOrder order = spec.shard_order();
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ';')) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) {
      throw Error(flag + ": expected <tensor dim>:<mesh dims>, got '" + entry +
                                  "'");
    }
    const auto dims = parse_ints(flag, entry.substr(0, colon));
    if (dims.size() != 1 || dims[0] < 0 || dims[0] >= spec.ndim()) {
      throw Error(flag + ": '" + entry.substr(0, colon) +
                                  "' is not one tensor dim in [0, " +
                                  std::to_string(spec.ndim() - 1) + "]");
    }
    order[dims[0]] = parse_ints(flag, entry.substr(colon + 1));
  }
  return order;
}

// "--flag value" pairs into a map over the flags given in `defaults` (their default values);
// "--help"/"-h" sets "help". Unknown flags and missing values throw.
inline std::map<std::string, std::string> parse_flags(int argc, char** argv,
                                                      std::map<std::string, std::string> defaults) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      defaults["help"] = "1";
      continue;
    }
    if (arg.rfind("--", 0) != 0 || defaults.count(arg.substr(2)) == 0) {
      throw Error("unknown argument '" + arg + "' (try --help)");
    }
    if (i + 1 >= argc) throw Error(arg + " needs a value");
    defaults[arg.substr(2)] = argv[++i];
  }
  return defaults;
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
