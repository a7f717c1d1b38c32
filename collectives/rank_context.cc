#include "collectives/rank_context.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <thread>

#include "absl/strings/str_join.h"
#include "base/error.h"

namespace dtensor::collectives {
namespace {

thread_local std::shared_ptr<RankContext> t_context;
ABSL_CONST_INIT absl::Mutex g_process_mu(absl::kConstInit);
std::shared_ptr<RankContext> g_process_context ABSL_GUARDED_BY(g_process_mu);
// g_process_context's object, read without the lock: every op on a distributed tensor asks for
// its rank (current_context), and a mutex there cost 2% of a call. Who replaces the context
// while ops run loses it the same way with or without the lock (the reference outlives it).
std::atomic<RankContext*> g_process_raw{nullptr};

}  // namespace

std::chrono::milliseconds default_timeout() {
  if (const char* env = std::getenv("DTENSOR_COLLECTIVE_TIMEOUT_MS")) {
    char* end = nullptr;
    errno = 0;
    const long long ms = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && ms > 0 && errno != ERANGE) {
      return std::min(std::chrono::milliseconds(ms), kMaxTimeout);
    }
    throw Error("DTENSOR_COLLECTIVE_TIMEOUT_MS='" + std::string(env) +
                "' is not a positive integer of milliseconds (at most 9223372036854775807; values "
                "above a year mean a year)");
  }
  return std::chrono::milliseconds(300000);
}

std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw Error("collective timeout of " + std::to_string(timeout.count()) + " ms is not positive");
  }
  return std::min(timeout, kMaxTimeout);
}

RankContext::RankContext(int64_t rank, int64_t world_size, std::string backend, std::string job,
                         std::chrono::milliseconds timeout)
    : rank_(rank),
      world_size_(world_size),
      backend_(std::move(backend)),
      job_(std::move(job)),
      timeout_(clamp_timeout(timeout)) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error("RankContext: rank " + std::to_string(rank) + " is not in a world of size " +
                std::to_string(world_size));
  }
  std::vector<int64_t> all(world_size);
  for (int64_t r = 0; r < world_size; ++r) all[r] = r;
  register_group(kWorld, all);
}

RankContext::~RankContext() = default;

std::string RankContext::register_group(const std::string& name, const std::vector<int64_t>& ranks,
                                        const std::string& backend) {
  if (ranks.empty()) throw Error("group '" + name + "' has no ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (ranks[i] == ranks[j]) {
        throw Error("group '" + name + "' lists rank " + std::to_string(ranks[i]) +
                    " twice (ranks [" + absl::StrJoin(ranks, ",") +
                    "]): a rank is a member of a group once");
      }
    }
  }
  for (int64_t r : ranks) {
    if (r < 0 || r >= world_size_) {
      throw Error("group '" + name + "' names rank " + std::to_string(r) +
                  " outside the world of size " + std::to_string(world_size_) + " (ranks [" +
                  absl::StrJoin(ranks, ",") + "])");
    }
  }
  GroupInfo info{name, ranks, backend.empty() ? backend_ : backend};
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = groups_.emplace(name, info);
  if (!inserted && (it->second.ranks != ranks || it->second.backend != info.backend)) {
    throw Error("group '" + name + "' is already registered with ranks [" +
                absl::StrJoin(it->second.ranks, ",") + "] on " + it->second.backend +
                "; cannot re-register it with [" + absl::StrJoin(ranks, ",") + "] on " +
                info.backend);
  }
  return name;
}

std::string RankContext::new_group(const std::vector<int64_t>& ranks, const std::string& tag) {
  const std::string name = (tag.empty() ? "" : tag + "/") + group_name_for_ranks(ranks);
  return register_group(name, ranks);
}

std::vector<std::string> RankContext::register_mesh(const DeviceMesh& mesh) {
  if (!mesh.contains(rank_)) {
    throw Error("rank " + std::to_string(rank_) + " is not in " + mesh.to_string());
  }
  std::vector<std::string> names;
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    names.push_back(register_group(mesh.group_name(d, rank_), mesh.group_ranks(d, rank_)));
  }
  return names;
}

const GroupInfo& RankContext::group(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    const std::string known = absl::StrJoin(
        groups_, ", ", [](std::string* out, const auto& entry) { out->append(entry.first); });
    throw Error("unknown group '" + name + "' on rank " + std::to_string(rank_) +
                "; registered: " + known);
  }
  return it->second;
}

RankContext::Endpoint& RankContext::endpoint(const std::string& name) {
  {  // every collective comes here: the common case copies nothing
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(name);
    if (it != endpoints_.end()) return *it->second;
  }
  const GroupInfo info = group(name);
  absl::MutexLock lock(&mu_);
  auto it = endpoints_.find(name);
  if (it != endpoints_.end()) return *it->second;
  int64_t group_rank = -1;
  for (size_t i = 0; i < info.ranks.size(); ++i) {
    if (info.ranks[i] == rank_) group_rank = static_cast<int64_t>(i);
  }
  if (group_rank < 0) {
    throw Error("rank " + std::to_string(rank_) + " is not a member of group '" + name +
                "' (ranks [" + absl::StrJoin(info.ranks, ",") + "])");
  }
  CommunicatorOptions options{info, rank_, world_size_, timeout_};
  options.job = job_;
  options.store = store_;
  auto ep = std::make_unique<Endpoint>();
  ep->info = info;
  // Configuration errors (environment, store, backend) are raised by every rank alike: name the
  // group and the rank so that each rank's message is complete on its own.
  const auto where = [&] {
    return "group '" + name + "' (" + info.backend + ", ranks [" + absl::StrJoin(info.ranks, ",") +
           "]) on global rank " + std::to_string(rank_) + ": cannot set up its communicator: ";
  };
  try {
    ep->comm = make_communicator(options);
  } catch (const CollectiveError& e) {
    throw CollectiveError(where() + e.what());
  } catch (const std::exception& e) {
    const std::string what = e.what();  // c10::Error appends a backtrace: keep the message
    throw Error(where() + what.substr(0, what.find("\nException raised from")));
  }
  ep->worker = std::make_unique<Worker>();
  return *endpoints_.emplace(name, std::move(ep)).first->second;
}

bool has_current_context() {
  return t_context || g_process_raw.load(std::memory_order_acquire) != nullptr;
}

RankContext& current_context() {
  if (t_context) return *t_context;
  RankContext* process = g_process_raw.load(std::memory_order_acquire);
  if (process == nullptr) {
    throw Error(
        "no collectives context on this thread: initialise one (RankScope, run_threads, or "
        "set_process_context after rendezvous) before calling a collective");
  }
  return *process;
}

void set_process_context(std::shared_ptr<RankContext> context) {
  absl::MutexLock lock(&g_process_mu);
  g_process_raw.store(context.get(), std::memory_order_release);
  g_process_context = std::move(context);
}

RankScope::RankScope(std::shared_ptr<RankContext> context) : previous_(std::move(t_context)) {
  t_context = std::move(context);
}

RankScope::~RankScope() { t_context = std::move(previous_); }

c10::DeviceType backend_device_type(const std::string& backend) {
  return backend == "nccl" || backend == "cuda_ipc" ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
}

c10::Device group_device(const std::string& name) {
  return mesh_device(backend_device_type(current_context().group(name).backend));
}

void check_ranks_as_threads(int64_t world_size, const char* who) {
  if (world_size < 2) return;
  // Only a library this process already loaded (RTLD_NOLOAD): libtorch's BLAS, if it is OpenBLAS.
  void* blas = ::dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD);
  if (blas == nullptr) return;
  using GetParallel = int (*)();
  const auto get_parallel = reinterpret_cast<GetParallel>(::dlsym(blas, "openblas_get_parallel"));
  const bool serial = get_parallel != nullptr && get_parallel() == 0;
  ::dlclose(blas);
  if (serial) {
    throw Error(std::string(who) + ": " + std::to_string(world_size) +
                " ranks as threads of one process need a thread-safe BLAS, but this process "
                "loaded OpenBLAS's serial build (libopenblas0-serial), which can mix the matrix "
                "products of concurrent threads (NOTE [thread-safe BLAS]); install "
                "libopenblas0-pthread (./x does) or select it with update-alternatives "
                "--config libopenblas.so.0-x86_64-linux-gnu, or run the ranks as processes");
  }
}

void RankContext::leave(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, endpoint] : endpoints_) {
      if (endpoint->comm) endpoint->comm->leave(why);
    }
  }
  leave_job(backend_, job_, rank_, why);
}

namespace {
std::string first_line_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    const std::string what = x.what();
    return what.substr(0, what.find('\n'));
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
}  // namespace

void run_threads(int64_t world_size, const std::function<void(int64_t)>& fn,
                 const std::string& backend, std::chrono::milliseconds timeout) {
  check_ranks_as_threads(world_size, "run_threads");
  static std::atomic<uint64_t> counter{0};
  const std::string job = "threads-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<RankContext> ctx;
      try {
        ctx = std::make_shared<RankContext>(r, world_size, backend, job, timeout);
        RankScope scope(ctx);
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
        // Peers waiting for this rank fail now (NOTE [leaving a group]).
        if (ctx) ctx->leave(first_line_of(errors[r]));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

const std::vector<int64_t>* find_my_coordinate(const DeviceMesh& mesh) {
  struct Entry {
    DeviceMesh mesh;
    int64_t rank;
    std::optional<std::vector<int64_t>> coord;
  };
  thread_local std::vector<Entry> cache;
  const int64_t rank = current_context().rank();
  for (const Entry& e : cache) {
    if (e.rank == rank && e.mesh == mesh) return e.coord ? &*e.coord : nullptr;
  }
  constexpr size_t kEntries = 8;
  if (cache.size() == kEntries) cache.erase(cache.begin());
  cache.push_back({mesh, rank, mesh.coordinate(rank)});
  return cache.back().coord ? &*cache.back().coord : nullptr;
}

const std::vector<int64_t>& my_coordinate(const DeviceMesh& mesh, const char* what) {
  const std::vector<int64_t>* coord = find_my_coordinate(mesh);
  DTENSOR_CHECK(coord != nullptr, what, ": rank ", current_context().rank(), " is not in ",
                mesh.to_string());
  return *coord;
}

}  // namespace dtensor::collectives
