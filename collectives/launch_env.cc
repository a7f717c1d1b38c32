#include "collectives/launch_env.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <stdexcept>

#include <unistd.h>

#include "base/error.h"

namespace dtensor::collectives {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

int64_t env_int(const char* name, std::optional<int64_t> fallback = std::nullopt) {
  const auto v = env(name);
  if (!v) {
    if (fallback) return *fallback;
    throw Error(std::string("launch environment: ") + name +
                " is not set (start ranks with ./x launch -n N -- CMD, or "
                "python3 -m torch.distributed.run)");
  }
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || x < 0) {
    throw Error(std::string("launch environment: ") + name + "='" + *v +
                "' is not a non-negative integer");
  }
  return x;
}

}  // namespace

std::optional<LaunchEnv> launch_env_from_environ() {
  if (!env("RANK") && !env("WORLD_SIZE")) return std::nullopt;
  LaunchEnv e;
  e.rank = env_int("RANK");
  e.world_size = env_int("WORLD_SIZE");
  e.local_rank = env_int("LOCAL_RANK", e.rank);
  e.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
  e.port = static_cast<int>(env_int("MASTER_PORT", 29500));
  if (e.world_size < 1 || e.rank >= e.world_size) {
    throw Error("launch environment: RANK=" + std::to_string(e.rank) +
                " is not in a world of WORLD_SIZE=" + std::to_string(e.world_size));
  }
  if (e.port <= 0 || e.port > 65535) {
    throw Error("launch environment: MASTER_PORT=" + std::to_string(e.port) + " is not a TCP port");
  }
  return e;
}

std::shared_ptr<RankContext> init_from_env(const std::string& backend,
                                           std::chrono::milliseconds timeout) {
  const auto e = launch_env_from_environ();
  if (!e) {
    throw Error(
        "launch environment: RANK and WORLD_SIZE are not set (start ranks with "
        "./x launch -n N -- CMD, or python3 -m torch.distributed.run)");
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(e->port);
  // Under torchrun the agent already hosts the store at MASTER_PORT and says so with
  // TORCHELASTIC_USE_AGENT_STORE=True (as torch's env:// rendezvous reads it): every rank is then
  // a client. Otherwise rank 0 hosts it.
  const bool agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  opts.isServer = e->rank == 0 && !agent_store;
  opts.numWorkers = static_cast<size_t>(e->world_size);
  opts.waitWorkers = false;
  opts.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(e->master_addr, opts);
  // One job id for all ranks: shared-memory names and logs derive from it.
  std::string job;
  if (e->rank == 0) {
    job = "job-" + std::to_string(::getpid()) + "-" + std::to_string(e->port) + "-" +
          std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    store->set("dtensor/job", std::vector<uint8_t>(job.begin(), job.end()));
  } else {
    const auto bytes = store->get("dtensor/job");  // waits up to the store timeout
    job.assign(bytes.begin(), bytes.end());
  }
  std::string chosen = backend;
  if (chosen.empty()) chosen = env("DTENSOR_BACKEND").value_or("shm");
  auto ctx = std::make_shared<RankContext>(e->rank, e->world_size, chosen, job, timeout);
  ctx->set_store(store);
  set_process_context(ctx);
  return ctx;
}

}  // namespace dtensor::collectives
