#pragma once
// The backend interface: a Communicator is one rank's endpoint of one group. Backends implement
// a handful of primitives on flat, contiguous 1-D buffers; the functional layer
// (functional.h) turns user-facing collectives (any gather dim, coalesced lists, async) into
// these calls. Backends are registered by name and may come from other libraries.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
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
// `output` is preallocated by the caller and is never the same storage as `input`.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  at::Tensor input;
  at::Tensor output;
  std::vector<int64_t> input_splits;   // all_to_all
  std::vector<int64_t> output_splits;  // all_gather, reduce_scatter, all_to_all
  int64_t src = 0;                     // broadcast: group rank of the source
  std::string label;                   // what the user called (for errors): "all_reduce"
};

// What the ranks of a group must agree on about one call: a view of a CollectiveCall (threads)
// or of a descriptor read from shared memory (shm). The splits are views that must outlive it.
struct CallSignature {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // Undefined: no tensors (barrier)
  int64_t numel = 0;                                   // of the input
  int64_t src = 0;
  absl::Span<const int64_t> input_splits, output_splits;
};
CallSignature signature_of(const CollectiveCall& call);

// Describes how the ranks' calls (by group rank) disagree, e.g. "dtype differs: rank 0 has
// Float, group rank 1 has Int", or returns "" when they agree. Backends report it as
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

// Registers a backend under `name`; a second registration of the same name throws. Call it from
// a static initializer in the backend's own library (see BackendRegistration).
void register_backend(const std::string& name, BackendFactory factory);
bool has_backend(const std::string& name);
std::vector<std::string> backend_names();
// Creates a communicator; throws naming the registered backends when `options.group.backend`
// is unknown.
std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options);

// `static BackendRegistration reg("mybackend", factory);` in a backend's .cc file. Link such a
// library with alwayslink = 1 so its registration runs.
struct BackendRegistration {
  BackendRegistration(const std::string& name, BackendFactory factory) {
    register_backend(name, std::move(factory));
  }
};

}  // namespace dtensor::collectives
