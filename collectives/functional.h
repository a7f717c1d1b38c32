#pragma once
// Functional collectives on local tensors (PyTorch's _c10d_functional, in C++): every call
// returns new tensors and leaves its inputs untouched; groups are names resolved through the
// calling thread's RankContext. With async_op = true a call returns at once and its outputs are
// valid after wait_tensor(output) (or the Work from work_of(output)); the default is synchronous.
//
// Async outputs are allocated up front; reading them before wait_tensor is a data race.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/work.h"
#include "layout/placement.h"

namespace dtensor::collectives {

at::Tensor all_reduce(const at::Tensor& input, ReduceOp op, const std::string& group,
                      bool async_op = false);
// all_reduce into the caller's `output` (contiguous, input's numel and dtype, never input's
// storage), synchronously: nothing is allocated, so a caller that reuses one buffer pays no page
// faults for fresh output memory (the torch.distributed backend, NOTE [dtensor c10d backend]).
void all_reduce_into(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                     const std::string& group);
// One round of synchronisation per dtype present in `inputs`.
std::vector<at::Tensor> all_reduce_coalesced(const std::vector<at::Tensor>& inputs, ReduceOp op,
                                             const std::string& group, bool async_op = false);

// all_gather along dim 0 into the caller's `output` (contiguous, group size x input's numel, its
// dtype), synchronously (torch.distributed's all_gather_into_tensor). The input may be this rank's
// own chunk of the output (in place: nothing of it is copied).
void all_gather_into(const at::Tensor& input, const at::Tensor& output, const std::string& group);

// Concatenation of every rank's `input` along `gather_dim` (any dim; negative counts from the
// end). Inputs must have equal shapes.
at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t gather_dim,
                                  const std::string& group, bool async_op = false);
std::vector<at::Tensor> all_gather_into_tensor_coalesced(const std::vector<at::Tensor>& inputs,
                                                         int64_t gather_dim,
                                                         const std::string& group,
                                                         bool async_op = false);
// Uneven form: rank r contributes `sizes[r]` slices along `gather_dim` (its input's size there);
// the other dims must agree.
at::Tensor all_gather_uneven(const at::Tensor& input, int64_t gather_dim,
                             const std::vector<int64_t>& sizes, const std::string& group,
                             bool async_op = false);

// Reduces every rank's `input`, then rank r keeps the r-th of group-size equal chunks along
// `scatter_dim` (whose size must be divisible by the group size, as in PyTorch).
at::Tensor reduce_scatter_tensor(const at::Tensor& input, ReduceOp op, int64_t scatter_dim,
                                 const std::string& group, bool async_op = false);
std::vector<at::Tensor> reduce_scatter_tensor_coalesced(const std::vector<at::Tensor>& inputs,
                                                        ReduceOp op, int64_t scatter_dim,
                                                        const std::string& group,
                                                        bool async_op = false);

// Splits `input` along dim 0 by `input_splits` (rows sent to each rank; empty = equal split) and
// returns the rows received, `output_splits` from each rank (empty = equal split).
// `label` names the call in counts and errors: kScatterLabel for a scatter from one rank (the
// others send nothing), which CommDebugMode reports as PyTorch's scatter.
inline constexpr char kScatterLabel[] = "scatter";
at::Tensor all_to_all_single(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                             const std::vector<int64_t>& input_splits, const std::string& group,
                             bool async_op = false, const char* label = "all_to_all_single");
// NOTE [boxed all_to_all]
// all_to_all_single with views for buffers: send[r] lists the views ("boxes", any strides) whose
// elements, each box row-major, one box after another, go to group rank r; what rank r sends
// lands in the boxes recv[r], in the same order. A sender whose pieces are strided parts of a
// tensor (a cross-mesh redistribute: NOTE [cross-mesh redistribute]) then copies each element
// once into the transport and each receiver once out of it, as a flat buffer would, with no
// packing copy into a fresh buffer and no unpacking copy out of one. The backends that can
// (Communicator::takes_boxes: shm and threads) copy between the boxes and their own memory; for
// every other backend (c10d, nccl, cuda_ipc) and for tensors off the CPU, this function packs the
// boxes into a flat input and unpacks the flat output (no copy on a side whose boxes are
// consecutive runs of one contiguous tensor): correct everywhere, fast where ranks share memory.
// Ranks pair by the element counts alone, as all_to_all_single: a boxed call pairs with a flat
// one of the same splits. Every box has `result`'s dtype and device (a rank with no boxes passes
// a `result` of its peers' dtype). Receive boxes must not overlap one another, nor share storage
// with a send box, nor carry a lazy conjugation or negation. Returns `result`; with async_op the
// receive boxes are written, and the send boxes may change, once wait_tensor(result) returned
// (`result`: typically the tensor the receive boxes view).
at::Tensor all_to_all_boxes(const std::vector<std::vector<at::Tensor>>& send,
                            const std::vector<std::vector<at::Tensor>>& recv,
                            const at::Tensor& result, const std::string& group,
                            bool async_op = false, const char* label = "all_to_all_boxes");
// Split-dim / concat-dim form: `input` is cut into group-size equal chunks along `split_dim`,
// chunk i goes to rank i, and the chunks received are concatenated along `concat_dim` in rank
// order (the step behind Shard(i) -> Shard(j)).
at::Tensor all_to_all(const at::Tensor& input, int64_t split_dim, int64_t concat_dim,
                      const std::string& group, bool async_op = false);

// `input` of group rank `src` on every rank (every rank passes a tensor of the same shape).
at::Tensor broadcast(const at::Tensor& input, int64_t src, const std::string& group,
                     bool async_op = false);

void barrier(const std::string& group);

// One backend call as a CommCounter sees it: sizes of the flat buffers passed to the backend
// (padding included; a coalesced call is one record per dtype round).
struct CommRecord {
  CollectiveKind kind;
  std::string label;  // e.g. "all_gather_into_tensor", "all_gather_uneven"
  std::string group;
  int64_t input_bytes = 0, output_bytes = 0;
  std::string cause;      // the operator whose dispatch issued it (CommCause), or empty
  bool backward = false;  // issued while autograd ran a backward node (CommDebugMode's phase)
};

// Names the operator on whose behalf the calling thread issues collectives while it is alive
// (the DTensor dispatcher wraps each op's redistributes in one); CommCounter records carry it.
class CommCause {
 public:
  explicit CommCause(const char* op);
  ~CommCause();
  CommCause(const CommCause&) = delete;
  CommCause& operator=(const CommCause&) = delete;

 private:
  const char* previous_;
};

// NOTE [collective purpose]
// Two calls of one kind, dtype and size pair up on every backend, whatever each rank meant them
// for. A caller that issues collectives for a named part of a program (FSDP: the all-gathers and
// reduce-scatters of one module's parameter group) names it while a CommPurpose is alive; the
// name travels with each call (CollectiveCall::purpose, cut to kPurposeBytes - 1) and the ranks
// compare it with the rest of the call. Ranks that reached different parts (a module skipped on
// some ranks, as with unused experts, or modules run in another order) then fail that collective
// on every rank with an error naming both parts, instead of exchanging one module's parameters
// for another's of the same size (a silent wrong answer) or waiting out the timeout. Scopes nest
// (the innermost names the call); calls outside any scope carry "" and agree with each other.
class CommPurpose {
 public:
  explicit CommPurpose(std::string purpose);
  ~CommPurpose();
  CommPurpose(const CommPurpose&) = delete;
  CommPurpose& operator=(const CommPurpose&) = delete;

 private:
  std::string previous_;
};
// The calling thread's purpose ("" outside any CommPurpose).
const std::string& current_purpose();

// Whether the group's backend compares each call across ranks (Communicator::compares_calls).
bool compares_calls(const std::string& group);

// NOTE [program digest]
// Ranks of one job must run the same distributed-tensor ops with the same arguments (SPMD). A rank
// that gets another scalar (a Python random number drawn per process, a size, a reduction) or
// runs an op the others skip computes different pieces, and nothing in its collectives shows it:
// the result is silently wrong (seen: hinge_embedding_loss with a margin drawn per process). So
// the distributed tensor layer keeps, per thread and mesh, the count of ops run and a digest of
// their names and non-tensor arguments (dtensor/program_digest.h), and every collective it issues
// on that mesh carries them (this scope): the backends that compare calls (threads, shm, c10d)
// fail the collective on every rank, naming both counts, when they differ. Collectives issued
// outside a scope (functional collectives, torch.distributed) carry 0 and are not checked. The
// check runs at collectives only: reading a Replicate result (full_tensor, to_local) communicates
// nothing, so ranks that diverged after their last collective are caught at their next one.
// DTENSOR_PROGRAM_CHECK=0 turns it off (read once); ranks that must legitimately run different
// ops on one mesh (e.g. rank-0-only logging with distributed-tensor ops) need it off.
class ProgramScope {
 public:
  ProgramScope(uint64_t ops, uint64_t digest);
  ~ProgramScope();
  ProgramScope(const ProgramScope&) = delete;
  ProgramScope& operator=(const ProgramScope&) = delete;

 private:
  uint64_t previous_ops_, previous_digest_;
};

// Records every collective the constructing thread issues while it is alive (nested counters
// all record). The threads backend runs each rank on its own thread, so a counter counts one
// rank. Costs one thread-local check per collective when no counter is active.
class CommCounter {
 public:
  CommCounter();
  ~CommCounter();
  CommCounter(const CommCounter&) = delete;
  CommCounter& operator=(const CommCounter&) = delete;

  const std::vector<CommRecord>& records() const { return records_; }
  int64_t count(CollectiveKind kind) const;
  int64_t total() const { return static_cast<int64_t>(records_.size()); }
  // Records per (cause, label), e.g. {"aten::mm", "all_gather_into_tensor"} -> 2.
  std::map<std::pair<std::string, std::string>, int64_t> counts_by_cause() const;
  // One line per (cause, label): "aten::mm: all_gather_into_tensor x2".
  std::string to_string() const;
  void record(CommRecord r) { records_.push_back(std::move(r)); }
  // Wall time this thread spent inside synchronous collective calls while the counter lived
  // (waiting for peers included; async calls are not timed).
  double seconds() const { return seconds_; }
  void add_seconds(double s) { seconds_ += s; }

 private:
  std::vector<CommRecord> records_;
  double seconds_ = 0;
};

// Blocks until `t` (an output of an async collective) is valid and returns it. A tensor with no
// pending collective is returned as is.
at::Tensor wait_tensor(const at::Tensor& t);
// The pending Work of an async output, or null.
WorkPtr work_of(const at::Tensor& t);

}  // namespace dtensor::collectives
