#include "collectives/launch_env.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "absl/strings/str_join.h"
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

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// NOTE [job identity]
// Two jobs started with one MASTER_PORT must never mix: the loser's rank 0 cannot bind the port,
// but its other ranks reach the winner's store and would take its job id and attach to its
// shared memory. Every rank therefore proves it belongs to the launch, by the first of:
//  1. a launch token: DTENSOR_JOB_TOKEN (made once per launch by ./x launch / ./x run), else
//     torchrun's TORCHELASTIC_RUN_ID unless "none";
//  2. a scheduler's job id: SLURM_JOB_ID (+ SLURM_STEP_ID), PMIX_NAMESPACE,
//  OMPI_MCA_ess_base_jobid,
//     LSB_JOBID, PBS_JOBID, FLUX_JOB_ID;
//  3. with neither (ranks started from the environment by a hand-written launcher): the process
//     that started it. Ranks on one host (hostname, boot id and network namespace) must share
//     their parent process (its pid and start time); a rank whose parent has gone (reparented to
//     pid 1) has no parent to compare.
// Each rank joins the store as its rank exactly once: arrivals are counted per rank (add), each
// arrival files its identity under its count, and once every rank has filed one, every rank
// compares the first arrival's identity of each rank with its own. An intruder is refused on its
// own rank (it arrives second, or its identity differs from rank 0's); when it came first, the
// rightful rank is refused and the launch's other ranks see the foreign identity, so every rank
// of both jobs that met fails with an error naming both, before any collective. A second arrival
// whose identity differs from the first's (token or launcher) is refused alone and the job whose
// ranks all came first runs; only a second arrival indistinguishable from the first marks the
// store, so ranks that have not finished joining fail too.
// What cannot be told apart: two jobs whose ranks one and the same process starts with the same
// environment and no token (only a double arrival catches those, when it comes in time).
std::string launch_token() {
  if (auto t = env("DTENSOR_JOB_TOKEN"); t && !t->empty()) return *t;
  if (auto t = env("TORCHELASTIC_RUN_ID"); t && !t->empty() && *t != "none") return *t;
  return "";
}

std::string scheduler_job() {
  for (const char* name : {"SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "LSB_JOBID",
                           "PBS_JOBID", "FLUX_JOB_ID"}) {
    auto v = env(name);
    if (!v || v->empty()) continue;
    std::string id = std::string(name) + "=" + *v;
    if (std::string(name) == "SLURM_JOB_ID") {
      if (auto step = env("SLURM_STEP_ID")) id += "." + *step;
    }
    return id;
  }
  return "";
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// "host\nparent": the host this process runs on and the process that started it (empty parent
// when it is gone).
std::string launcher_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  const std::string host_id = std::string(host) + "/" +
                              read_text("/proc/sys/kernel/random/boot_id") + "/" +
                              (n > 0 ? std::string(ns, n) : std::string());
  const pid_t ppid = ::getppid();
  std::string parent;
  if (ppid > 1) {
    // Field 22 of /proc/PID/stat (start time), counted after the command's closing parenthesis.
    const std::string stat = read_text("/proc/" + std::to_string(ppid) + "/stat");
    const auto close = stat.rfind(')');
    std::string start;
    if (close != std::string::npos) {
      std::istringstream fields(stat.substr(close + 2));
      std::string field;
      for (int i = 3; i <= 22 && fields >> field; ++i) {
        if (i == 22) start = field;
      }
    }
    parent = "pid " + std::to_string(ppid) + " (started at tick " + start + ")";
  }
  return host_id + "\n" + parent;
}

// Store keys of this launch attempt (a torchrun agent keeps its store across restarts).
std::string key(const std::string& k) {
  return "dtensor/" + env("TORCHELASTIC_RESTART_COUNT").value_or("0") + "/" + k;
}

void check_membership(c10d::Store& store, const LaunchEnv& e, const std::string& token,
                      const std::string& where) {
  std::string identity = token;
  if (identity.empty()) identity = scheduler_job();
  const std::string mine = identity.empty() ? "(none)" : identity;
  const std::string me = std::to_string(e.rank);
  const int64_t arrival = store.add(key("arrivals/" + me), 1);
  store.set(key("token/" + me + "/" + std::to_string(arrival)),
            std::vector<uint8_t>(mine.begin(), mine.end()));
  const std::string launcher = identity.empty() ? launcher_identity() : std::string();
  if (identity.empty()) {
    store.set(key("launcher/" + me + "/" + std::to_string(arrival)),
              std::vector<uint8_t>(launcher.begin(), launcher.end()));
  }
  const auto foreign = [&](int64_t r, const std::string& theirs) {
    return Error(where + ": global rank " + std::to_string(r) +
                 " of the job on this store joined with launch token '" + theirs +
                 "', this rank has '" + mine +
                 "': processes of two jobs met on one rendezvous store (two jobs with one "
                 "MASTER_PORT?); refusing to mix them");
  };
  const auto mark_mixed = [&](const std::string& why) {
    try {
      store.set(key("mixed"), std::vector<uint8_t>(why.begin(), why.end()));
    } catch (const std::exception&) {
    }
  };
  if (arrival != 1) {
    const std::string first = text(store.get(key("token/" + me + "/1")));
    // An arrival that differs from the first (another token, or another launcher) is an
    // intruder: it alone is refused, and the job whose rank came first goes on (marking the store
    // here raced with that job's ranks that had already passed the last check: seen in CI, three
    // ranks of the rightful job then waited for the fourth until the collective timeout).
    if (first != mine) throw foreign(e.rank, first);
    const std::string where_first =
        identity.empty() ? text(store.get(key("launcher/" + me + "/1"))) : std::string();
    const std::string why =
        where + ": another process already joined this store as global rank " + me +
        " (launch token '" + mine + "'): two processes share RANK=" + me +
        " (two jobs with one MASTER_PORT, or one launch that gave a rank twice)";
    if (where_first != launcher) throw Error(why);
    // Indistinguishable from the first arrival: nobody can tell which job is rightful; both are
    // refused, as far as the mark reaches them in time.
    mark_mixed(why);
    throw Error(why);
  }
  std::vector<std::string> keys;
  for (int64_t r = 0; r < e.world_size; ++r) {
    keys.push_back(key("token/" + std::to_string(r) + "/1"));
  }
  try {
    store.wait(keys);
  } catch (const std::exception&) {
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < e.world_size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw Error(where + ": ranks [" + absl::StrJoin(missing, ",") +
                "] did not join the rendezvous store within the timeout (they exited, died, or "
                "joined another job's store: two jobs with one MASTER_PORT?)");
  }
  for (int64_t r = 0; r < e.world_size; ++r) {
    const std::string theirs = text(store.get(keys[r]));
    if (theirs != mine) throw foreign(r, theirs);
  }
  if (identity.empty()) {
    const auto split = [](const std::string& s) {
      const auto nl = s.find('\n');
      return std::make_pair(s.substr(0, nl), nl == std::string::npos ? "" : s.substr(nl + 1));
    };
    const auto [my_host, my_parent] = split(launcher);
    for (int64_t r = 0; r < e.world_size; ++r) {
      if (r == e.rank) continue;
      // Filed right after the token: a short wait at most.
      const auto [host, parent] =
          split(text(store.get(key("launcher/" + std::to_string(r) + "/1"))));
      if (host != my_host || parent.empty() || my_parent.empty() || parent == my_parent) continue;
      const std::string why =
          where + ": global rank " + std::to_string(r) + " on this host was started by " + parent +
          ", this rank by " + my_parent +
          ", and no launch token or scheduler job id names the job: processes of two launches "
          "met on one rendezvous store (two jobs with one MASTER_PORT?); refusing to mix them. "
          "Ranks of one job started by different processes need one DTENSOR_JOB_TOKEN";
      mark_mixed(why);
      throw Error(why);
    }
  }
  if (store.check({key("mixed")})) {
    throw Error(where + ": refusing to start: " + text(store.get(key("mixed"))));
  }
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
  timeout = clamp_timeout(timeout);
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
  const std::string where = "launch: global rank " + std::to_string(e->rank) + " of " +
                            std::to_string(e->world_size) + ", store " + e->master_addr + ":" +
                            std::to_string(e->port);
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(e->master_addr, opts);
  } catch (const std::exception& err) {
    throw Error(where + ": " +
                (opts.isServer ? "cannot host the rendezvous store (is another job using "
                                 "MASTER_PORT? ./x launch picks a free one): "
                               : "cannot reach the rendezvous store hosted by rank 0: ") +
                first_line(err.what()));
  }
  const std::string token = launch_token();
  // One job id for all ranks: shared-memory names and logs derive from it. With a launch token
  // the id is the token's, so the launcher can find (and remove) the job's segments itself.
  std::string job;
  try {
    if (e->rank == 0) {
      job = token.empty()
                ? "job-" + std::to_string(::getpid()) + "-" + std::to_string(e->port) + "-" +
                      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())
                : "job-" + token + "-" + env("TORCHELASTIC_RESTART_COUNT").value_or("0");
      store->set(key("job"), std::vector<uint8_t>(job.begin(), job.end()));
    } else {
      const auto bytes = store->get(key("job"));  // waits up to the store timeout
      job.assign(bytes.begin(), bytes.end());
    }
    check_membership(*store, *e, token, where);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    throw Error(where + ": rendezvous failed: " + first_line(err.what()) +
                (opts.isServer ? std::string()
                               : " (the store hosted by global rank 0 stopped answering: rank 0 "
                                 "left the rendezvous, and its own error says why)"));
  }
  std::string chosen = backend;
  if (chosen.empty()) chosen = env("DTENSOR_BACKEND").value_or("shm");
  auto ctx = std::make_shared<RankContext>(e->rank, e->world_size, chosen, job, timeout);
  ctx->set_store(store);
  set_process_context(ctx);
  return ctx;
}

int64_t device_count(c10::DeviceType type) {
  if (type == c10::DeviceType::CPU) return 1;
  if (!c10::impl::hasDeviceGuardImpl(type)) return 0;
  return c10::impl::getDeviceGuardImpl(type)->deviceCount();
}

std::string default_backend(c10::DeviceType device_type, std::optional<int64_t> devices) {
  if (const auto b = env("DTENSOR_BACKEND"); b && !b->empty()) return *b;
  const auto local = env("LOCAL_WORLD_SIZE");
  const int64_t local_n = local ? env_int("LOCAL_WORLD_SIZE") : 0;
  const int64_t world = local ? env_int("WORLD_SIZE", local_n) : 0;
  if (device_type == c10::DeviceType::CUDA) {
    const int64_t gpus = devices ? *devices : device_count(device_type);
    const bool shared = local && gpus > 0 && local_n > gpus && world == local_n;
    return shared ? "cuda_ipc" : "nccl";
  }
  if (local && local_n < world) return "c10d";
  return "shm";
}

void select_local_device(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::CPU) return;
  const int64_t count = device_count(device_type);
  if (count == 0) {
    throw Error(std::string("select_local_device: this process sees no ") +
                c10::DeviceTypeName(device_type, /*lower_case=*/true) +
                " device (libtorch without its support, or none on this machine)");
  }
  if (!env("LOCAL_RANK") && !env("RANK")) return;  // not launched: the current device stays
  const int64_t local = env("LOCAL_RANK") ? env_int("LOCAL_RANK") : env_int("RANK");
  c10::impl::getDeviceGuardImpl(device_type)
      ->setDevice(c10::Device(device_type, static_cast<c10::DeviceIndex>(local % count)));
}

}  // namespace dtensor::collectives
