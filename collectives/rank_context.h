#pragma once
// RankContext: one rank's view of a job (global rank, world size, default backend, timeout) and
// its groups, resolved by name. Collectives look up the calling thread's context: the process
// default, or a thread-local one installed by RankScope (the threads backend runs every rank of
// a job as a thread of one process, each with its own context).

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "collectives/communicator.h"
#include "collectives/work.h"
#include "device_mesh/device_mesh.h"

namespace dtensor::collectives {

// NOTE [collective timeouts]
// Every blocking wait of every backend is bounded by the context's timeout. The default is
// 300 s (PyTorch's Gloo default is 30 min, too long to notice a dead peer in tests); the
// environment variable DTENSOR_COLLECTIVE_TIMEOUT_MS overrides it for a whole job, and
// RankContext's constructor argument for one context.
// Timeouts are capped at a year, so that a deadline (now + timeout) never overflows the clock: a
// larger value means "no deadline" in practice (DTENSOR_COLLECTIVE_TIMEOUT_MS=9223372036854775807
// used to overflow and time out at once).
inline constexpr std::chrono::milliseconds kMaxTimeout{int64_t{365} * 24 * 3600 * 1000};
std::chrono::milliseconds default_timeout();
// `timeout` capped at kMaxTimeout; throws dtensor::Error when it is not positive.
std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout);

class RankContext {
 public:
  // `job` names the job for backends that need a job-unique namespace (shared memory segments,
  // the threads backend's shared state); it must be equal on every rank of a job.
  RankContext(int64_t rank, int64_t world_size, std::string backend, std::string job,
              std::chrono::milliseconds timeout = default_timeout());
  ~RankContext();

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  const std::string& backend() const { return backend_; }
  const std::string& job() const { return job_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The rendezvous store of a process job (see launch_env.h); null when ranks are threads.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  void set_store(c10::intrusive_ptr<c10d::Store> store) { store_ = std::move(store); }

  // Registers a group under `name` with `ranks` in group-rank order; every member must register
  // it with the same ranks. Registering an existing name with other ranks throws. `backend`
  // empty = the context's backend. Returns `name`.
  std::string register_group(const std::string& name, const std::vector<int64_t>& ranks,
                             const std::string& backend = "");
  // A group from a rank list, named group_name_for_ranks(ranks) (the name a mesh dim over the same
  // ranks gets, so both share one communicator), or "<tag>/ranks:..." when tagged, so two tagged
  // groups may cover the same ranks.
  std::string new_group(const std::vector<int64_t>& ranks, const std::string& tag = "");
  // Registers the group along every dim of `mesh` that holds this rank; returns one name per dim
  // (DeviceMesh::group_name). Throws when this rank is not in the mesh or the mesh names a rank
  // outside the world.
  std::vector<std::string> register_mesh(const DeviceMesh& mesh);
  // The group of all ranks, registered by the constructor.
  static constexpr const char* kWorld = "world";

  const GroupInfo& group(const std::string& name);
  // This rank's communicator and worker for a group (created on first use). Throws when the
  // group is unknown or this rank is not a member.
  struct Endpoint {
    GroupInfo info;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Worker> worker;
  };
  Endpoint& endpoint(const std::string& name);
  // This rank leaves every group it has communicated on (NOTE [leaving a group]): its thread or
  // process ends with the error `why`. run_threads calls it for a rank whose function raised.
  void leave(const std::string& why);

 private:
  int64_t rank_;
  int64_t world_size_;
  std::string backend_;
  std::string job_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  absl::Mutex mu_;
  // std::map: group() and endpoint() hand out references that must survive later insertions.
  std::map<std::string, GroupInfo> groups_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
};

// The calling thread's context. Throws when none is set (no RankScope and no process context).
RankContext& current_context();
bool has_current_context();
// Sets the process-wide default context (e.g. from RANK/WORLD_SIZE after rendezvous).
void set_process_context(std::shared_ptr<RankContext> context);

// The calling rank's coordinate in `mesh`, or null when it is not in the mesh; from a small
// per-thread cache (a few meshes per thread), valid until the next call on this thread.
const std::vector<int64_t>* find_my_coordinate(const DeviceMesh& mesh);
// The same, or dtensor::Error naming `what`, the rank and the mesh when it is not in the mesh.
const std::vector<int64_t>& my_coordinate(const DeviceMesh& mesh, const char* what);

// Installs `context` as the calling thread's context until destroyed.
class RankScope {
 public:
  explicit RankScope(std::shared_ptr<RankContext> context);
  ~RankScope();
  RankScope(const RankScope&) = delete;
  RankScope& operator=(const RankScope&) = delete;

 private:
  std::shared_ptr<RankContext> previous_;
};

// NOTE [control tensors]: the device type a backend's collectives take tensors on: CUDA for
// nccl and cuda_ipc, the CPU for every other backend (PyTorch's _get_pg_default_device).
// Collectives over a group with no mesh at hand (the checkpoint's world-wide flags and file
// statistics) make their small tensors on mesh_device(backend_device_type(group's backend)) (NOTE
// [mesh device]).
c10::DeviceType backend_device_type(const std::string& backend);
// That device for the calling rank's group `name` (the world by default).
c10::Device group_device(const std::string& name = RankContext::kWorld);

// Raises when this process cannot run several ranks as threads correctly; `who` names the caller.
// NOTE [thread-safe BLAS]: OpenBLAS's serial build (Debian's libopenblas0-serial) takes its GEMM
// work buffers from a table without a lock, so concurrent matrix products can share a buffer and
// return each other's partial sums: ranks as threads got wrong results in 48 of 300 runs of a
// 2-rank MLP (tests/model_test failed in CI), and 190 of 8000 concurrent products were wrong in
// threads_blas_test. The build the process loaded is asked (openblas_get_parallel: 0 is serial);
// the pthread build locks and is what ./x installs.
void check_ranks_as_threads(int64_t world_size, const char* who);

// Runs fn(rank) for rank 0..world_size-1, each on its own thread with its own RankContext on
// `backend` (a fresh job name per call). Joins all threads, then rethrows the lowest rank's error.
// Refuses (check_ranks_as_threads) a process whose BLAS is not thread-safe.
void run_threads(int64_t world_size, const std::function<void(int64_t rank)>& fn,
                 const std::string& backend = "threads",
                 std::chrono::milliseconds timeout = default_timeout());

}  // namespace dtensor::collectives
