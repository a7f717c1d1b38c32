#pragma once
// The backend interface: a Communicator is one rank's endpoint of one group. Backends implement
// a handful of primitives on flat, contiguous 1-D buffers; the functional layer
// (functional.h) turns user-facing collectives (any gather dim, coalesced lists, async) into
// these calls. Backends are registered by name and may come from other libraries.

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "base/error.h"
#include "layout/placement.h"

namespace dtensor::collectives {

enum class CollectiveKind : uint8_t {
  kAllReduce,      // output = reduce(input of every rank); input and output have equal numel
  kAllGather,      // output = concat(input of every rank); output_splits[r] = numel of rank r
  kReduceScatter,  // output = reduce over ranks of input[offset(me) : +output_splits[me]]
  kAllToAll,       // input cut by input_splits (one count per destination), output by
                   // output_splits (one count per source)
  kBroadcast,      // output = input of rank `src`
  kBarrier,        // no data
};
const char* collective_name(CollectiveKind kind);

// One collective as plain data. Tensors are flat (1-D) and contiguous, on the backend's device;
// `output` is preallocated by the caller and is never the same storage as `input`, except that an
// all_reduce may be in place.
//
// NOTE [in-place all_reduce]
// An all_reduce whose output is its input (the same tensor: torch.distributed's all_reduce is in
// place) runs without a copy where the backend can: shm folds its own part from the copy it
// posted for the peers, Gloo and NCCL reduce in place; the threads backend, whose peers read the
// caller's input directly, posts a copy. Any other overlap of output and input is refused.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  at::Tensor input;
  at::Tensor output;
  std::vector<int64_t> input_splits;   // all_to_all
  std::vector<int64_t> output_splits;  // all_gather, reduce_scatter, all_to_all
  int64_t src = 0;                     // broadcast: group rank of the source
  std::string label;                   // what the user called (for errors): "all_reduce"
  std::string purpose;                 // NOTE [collective purpose] (CommPurpose); may be empty
  std::string thread;                  // the issuing thread's label (NOTE [issuing thread])
  uint64_t thread_seq = 0;             // the call's number among that thread's calls on the group
  uint64_t seq = 0;  // set by the backend: this call's number among the group's calls (1, 2, ...)
  // NOTE [program digest]: the issuing thread's distributed-tensor ops on the mesh this call
  // serves (their count and a digest of their names and non-tensor arguments); 0: unchecked.
  uint64_t program_ops = 0, program = 0;
  // CUDA tensors: the issuing thread's current stream on their device, which the backend orders
  // itself after (NOTE [nccl stream order]); unset otherwise.
  std::optional<c10::Stream> stream;
  // A boxed all_to_all (NOTE [boxed all_to_all] in functional.h), only for backends whose
  // takes_boxes() holds: send_boxes[r] (CPU views, any strides, each read row-major, one after
  // another) go to group rank r, and what rank r sends lands in recv_boxes[r]. input and output
  // are then empty 1-D tensors that carry the dtype, and the splits count the boxes' elements.
  std::vector<std::vector<at::Tensor>> send_boxes, recv_boxes;
  bool boxed() const { return !send_boxes.empty(); }
};

// NOTE [interrupts]
// A rank blocked in a collective must answer Ctrl-C (SIGINT) within a second, not when the
// collective times out. Every wait of every backend therefore calls check_interrupt() about every
// 50 ms. It runs the hook the embedding installed (the Python package's runs Python's signal
// handlers on the main thread: PyErr_CheckSignals, then throws the KeyboardInterrupt as
// pybind11's error_already_set, which torch's bindings hand back to Python unchanged). Once a hook
// threw, the process is marked interrupted: every wait on every thread (the per-group workers
// included) fails at once with a CollectiveError, and each backend marks its group broken so the
// peers fail within milliseconds instead of waiting out the timeout. A C++ program without a hook
// keeps SIGINT's default action (the process ends). The mark is never cleared: a process that
// caught the KeyboardInterrupt has broken groups and must start a new job to communicate again.
void set_interrupt_hook(std::function<void()> hook);
// Throws the hook's exception (and marks the process interrupted), or a CollectiveError when the
// process was marked interrupted on another thread.
void check_interrupt();
bool interrupted();
// How often waits call check_interrupt().
inline constexpr std::chrono::milliseconds kInterruptPoll{50};

// NOTE [issuing thread]
// Every rank must issue the collectives of one group in one order. Two threads of a rank issuing
// on one group interleave differently on each rank, and calls of equal shape would then pair
// one thread's data with another's (seen: 30-39 of 40 results wrong per thread). Each call
// therefore carries a label of the thread that issued it and its number among that thread's
// calls on the group, which are part of what the ranks compare (CallSignature): calls that pair
// different threads, or one thread's i-th call with its j-th, fail on every rank with an error
// naming both, and calls that pair the same call of the same thread run correctly. A thread's label
// is set with set_thread_label(); otherwise the provider gives it (the Python package answers
// Python's thread name, equal across ranks for threads started in the same order, e.g.
// "MainThread", "Thread-1"); otherwise it is "". Threads with one label are not told apart:
// C++ programs that issue on one group from several threads label them (or order them).
// Labels are cut to kThreadLabelBytes - 1 bytes.
constexpr size_t kThreadLabelBytes = 32;
// The calling thread's label, computed once per thread.
const std::string& thread_label();
void set_thread_label(const std::string& label);
void set_thread_label_provider(std::function<std::string()> provider);

// What the ranks of a group must agree on about one call: a view of a CollectiveCall (threads)
// or of a descriptor read from shared memory (shm). The splits are views that must outlive it.
struct CallSignature {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // Undefined: no tensors (barrier)
  int64_t numel = 0;                                   // of the input
  int64_t src = 0;
  absl::Span<const int64_t> input_splits, output_splits;
  uint64_t seq = 0;         // the call's number on its group (CollectiveCall::seq)
  std::string_view thread;  // the issuing thread's label
  uint64_t thread_seq = 0;  // the call's number among that thread's calls on the group
  uint64_t program_ops = 0, program = 0;  // CollectiveCall::program_ops, program
  std::string_view purpose;               // CollectiveCall::purpose
};
CallSignature signature_of(const CollectiveCall& call);
// Where rank r's part starts in a buffer cut by `splits` (elements): the sum of splits[0..r).
inline int64_t offset_of(absl::Span<const int64_t> splits, int64_t r) {
  int64_t off = 0;
  for (int64_t i = 0; i < r; ++i) off += splits[i];
  return off;
}
// Purposes are compared and carried by the backends up to this many bytes (cut to one less).
constexpr size_t kPurposeBytes = 48;

// Describes how the ranks' calls (by group rank) disagree, e.g. "dtype differs: rank 0 has
// Float, group rank 1 has Int (group rank 0: all_reduce #3 of 4 Float (sum) from thread
// 'MainThread'; group rank 1: ...)", or returns "" when they agree. Backends report it as
// "<label> on group '<name>' (<backend>): ranks disagree: <this>".
std::string mismatch(const std::vector<CallSignature>& calls);

// A group as plain data: a name, the global ranks in group-rank order, and the backend.
struct GroupInfo {
  std::string name;
  std::vector<int64_t> ranks;
  std::string backend;
};

class Communicator {
 public:
  Communicator(GroupInfo group, int64_t group_rank, std::chrono::milliseconds timeout)
      : group_(std::move(group)), group_rank_(group_rank), timeout_(timeout) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const GroupInfo& group() const { return group_; }
  int64_t rank() const { return group_rank_; }  // rank within the group
  int64_t size() const { return static_cast<int64_t>(group_.ranks.size()); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Runs one collective to completion on the calling thread. Calls on one communicator are made
  // in the same order on every rank of the group (the functional layer guarantees it). Throws
  // CollectiveError when a peer does not arrive within timeout() or the ranks disagree.
  virtual void run(CollectiveCall& call) = 0;

  // Whether run() compares every call across the group's ranks (kind, dtype, sizes, splits,
  // purpose, program digest: mismatch() below) and raises CallMismatch on every rank when they
  // differ. Callers may then leave a check to the call itself instead of exchanging metadata
  // first (distribute_tensor names the tensor's shape and dtype in its call's purpose).
  virtual bool compares_calls() const { return false; }

  // Whether run() takes boxed all_to_all calls (CollectiveCall::send_boxes): the backend copies
  // straight between the boxes and its transport. The functional layer packs the boxes into flat
  // buffers for every other backend (NOTE [boxed all_to_all] in functional.h).
  virtual bool takes_boxes() const { return false; }

  // NOTE [leaving a group]: this rank leaves the group for good, its thread or process ending
  // with an error `why` (RankContext::leave): the peers' calls that wait for it, now or later,
  // fail at once with a CollectiveError that says so, instead of waiting out the timeout (a
  // rank whose local op raised while the others went on into the next collective; NOTE [local
  // op failures] in dtensor/dispatch_local.cc). A backend's JobLeaveHook extends this to groups
  // the rank never joined. Backends that cannot tell their peers do nothing (their peers still
  // time out, naming the missing rank).
  virtual void leave(const std::string& why) {}

 private:
  GroupInfo group_;
  int64_t group_rank_;
  std::chrono::milliseconds timeout_;
};

// Raised for communication failures (timeouts, dead peers, mismatched calls across ranks).
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// Raised when the ranks' calls of one collective disagree ("ranks disagree: ..."): every rank of
// the group raises it at the same call, and the group stays usable (NOTE [collective purpose],
// NOTE [program digest]).
class CallMismatch : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// What a backend factory gets: the group, this rank's global rank, the timeout, and the job name
// (equal on every rank of one job; backends derive job-unique resource names from it).
struct CommunicatorOptions {
  GroupInfo group;
  int64_t global_rank = 0;
  int64_t world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::string job;
  // The job's rendezvous store (libtorch's TCPStore) when launched as processes; null for the
  // threads backend. Backends that exchange ids (nccl) or wrap c10d use it.
  c10::intrusive_ptr<c10d::Store> store;
};
// `options.global_rank`'s index in `options.group.ranks`; throws when it is not a member.
int64_t group_rank_of(const CommunicatorOptions& options);

using BackendFactory =
    std::function<std::unique_ptr<Communicator>(const CommunicatorOptions& options)>;

// What a backend does when global rank `rank` of job `job` leaves it (NOTE [leaving a group]),
// beyond Communicator::leave on the groups that rank has communicated on: the waits for it on
// groups it never joined (a peer's first call on a group that names it) fail too.
using JobLeaveHook =
    std::function<void(const std::string& job, int64_t rank, const std::string& why)>;

// Registers a backend under `name`; a second registration of the same name throws. Call it from
// a static initializer in the backend's own library (see BackendRegistration).
void register_backend(const std::string& name, BackendFactory factory,
                      JobLeaveHook on_leave = nullptr);
// Runs `backend`'s JobLeaveHook, if it has one.
void leave_job(const std::string& backend, const std::string& job, int64_t rank,
               const std::string& why);
bool has_backend(const std::string& name);
std::vector<std::string> backend_names();
// Creates a communicator; throws naming the registered backends when `options.group.backend`
// is unknown.
std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options);

// `static BackendRegistration reg("mybackend", factory);` in a backend's .cc file. Link such a
// library with alwayslink = 1 so its registration runs.
struct BackendRegistration {
  BackendRegistration(const std::string& name, BackendFactory factory,
                      JobLeaveHook on_leave = nullptr) {
    register_backend(name, std::move(factory), std::move(on_leave));
  }
};

}  // namespace dtensor::collectives
