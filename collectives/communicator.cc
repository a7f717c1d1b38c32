#include "collectives/communicator.h"

#include <map>
#include <mutex>
#include <stdexcept>

#include "base/error.h"

namespace dtensor::collectives {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives static destructors of backend libraries
  return *r;
}

}  // namespace

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

int64_t group_rank_of(const CommunicatorOptions& options) {
  const auto& ranks = options.group.ranks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == options.global_rank) return static_cast<int64_t>(i);
  }
  throw Error("rank " + std::to_string(options.global_rank) +
                              " is not a member of group '" + options.group.name + "'");
}

void register_backend(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(registry().mu);
  if (!registry().factories.emplace(name, std::move(factory)).second) {
    throw Error("collectives backend '" + name + "' is registered twice");
  }
}

bool has_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return registry().factories.count(name) > 0;
}

std::vector<std::string> backend_names() {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : registry().factories) names.push_back(name);
  return names;
}

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options) {
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    auto it = registry().factories.find(options.group.backend);
    if (it != registry().factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown collectives backend '" + options.group.backend +
                                "' for group '" + options.group.name +
                                "'; registered: " + (known.empty() ? "none" : known));
  }
  return factory(options);
}

}  // namespace dtensor::collectives
