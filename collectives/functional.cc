// Every functional collective's entry point (functional.h). They share the packing helpers, the
// submit path and the thread-local state (causes, counters, program digests) of the anonymous
// namespace below, which no other file needs: one concept, one file past the 600-line guideline
// (docs/architecture.md, "File size").
#include "collectives/functional.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "base/error.h"
#include "collectives/boxes.h"
#include "collectives/rank_context.h"
#include "collectives/reduce.h"

namespace dtensor::collectives {
namespace {

// A collective as the functional layer runs it: backend calls, then an epilogue that moves the
// received bytes into the user-visible outputs (dims other than 0, coalesced lists).
struct Job {
  std::vector<CollectiveCall> calls;
  std::function<void()> epilogue;
};

// NOTE [async work registry]
// The outputs of async collectives -> their Work, for wait_tensor and work_of (PyTorch's
// WorkRegistry). An entry is found by its output's StorageImpl address and holds a weak reference
// to that storage: once the storage is freed the entry is expired and counts as absent, so a new
// tensor cannot inherit an old, unrelated Work (or its error). The weak reference also keeps the
// StorageImpl's memory (not its data) from being reused while the entry exists, so a live entry
// always refers to the storage at its address. add() prunes expired entries and those whose work
// finished fine; failed work stays until its output is waited on or freed.
class PendingWork {
 public:
  void add(const std::vector<at::Tensor>& outputs, const WorkPtr& work) {
    absl::MutexLock lock(&mu_);
    absl::erase_if(entries_, [](const auto& kv) {
      const Entry& e = kv.second;
      return e.storage.expired() || (e.work->is_completed() && !e.work->failed());
    });
    for (const at::Tensor& t : outputs) {
      if (const c10::StorageImpl* key = key_of(t)) {
        entries_.insert_or_assign(key, Entry{t.storage().getWeakStorageImpl(), work});
      }
    }
  }

  // The Work pending on t's storage, or null.
  WorkPtr find(const at::Tensor& t) {
    absl::MutexLock lock(&mu_);
    const Entry* e = live_entry(t);
    return e ? e->work : nullptr;
  }

  // Drops t's entry if it still belongs to `work`.
  void forget(const at::Tensor& t, const WorkPtr& work) {
    absl::MutexLock lock(&mu_);
    const Entry* e = live_entry(t);
    if (e != nullptr && e->work == work) entries_.erase(key_of(t));
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    WorkPtr work;
  };

  static const c10::StorageImpl* key_of(const at::Tensor& t) {
    return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  }

  // t's entry when it is live and refers to t's storage; else null (expired: the storage it was
  // made for is gone, whatever now lives at that address).
  const Entry* live_entry(const at::Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const c10::StorageImpl* key = key_of(t);
    if (key == nullptr) return nullptr;
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    const Entry& e = it->second;
    const bool live = !e.storage.expired() && e.storage._unsafe_get_target() == key;
    return live ? &e : nullptr;
  }

  absl::Mutex mu_;
  absl::flat_hash_map<const c10::StorageImpl*, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

PendingWork& pending_work() {
  static auto* registry = new PendingWork();  // outlives workers still running at exit
  return *registry;
}

thread_local std::vector<CommCounter*> t_counters;
// This thread's calls per endpoint (a rank's group), for CollectiveCall::thread_seq. Endpoints live
// as long as their context; a new context's endpoint may reuse an address, but then the old one
// is gone on every rank alike, so the counts still agree.
thread_local absl::flat_hash_map<const void*, uint64_t> t_thread_calls;
thread_local const char* t_cause = nullptr;
thread_local std::string t_purpose;                      // NOTE [collective purpose]
thread_local uint64_t t_program_ops = 0, t_program = 0;  // NOTE [program digest]

void count_calls(const std::string& group, const Job& job) {
  for (const CollectiveCall& c : job.calls) {
    // A boxed all_to_all's input and output are empty: its splits count what it moves.
    const auto bytes = [&c](const at::Tensor& t, const std::vector<int64_t>& splits) {
      if (!t.defined()) return int64_t{0};
      return c.boxed() ? offset_of(splits, splits.size()) * static_cast<int64_t>(t.element_size())
                       : static_cast<int64_t>(t.nbytes());
    };
    const CommRecord r{c.kind,
                       c.label.empty() ? collective_name(c.kind) : c.label,
                       group,
                       bytes(c.input, c.input_splits),
                       bytes(c.output, c.output_splits),
                       t_cause ? t_cause : "",
                       torch::autograd::get_current_node() != nullptr};
    for (CommCounter* counter : t_counters) counter->record(r);
  }
}

std::vector<at::Tensor> submit(const std::string& group, std::shared_ptr<Job> job,
                               std::vector<at::Tensor> results, bool async_op) {
  if (!t_counters.empty()) count_calls(group, *job);
  RankContext::Endpoint& ep = current_context().endpoint(group);
  uint64_t& thread_calls = t_thread_calls[&ep];
  for (CollectiveCall& c : job->calls) {  // NOTE [issuing thread]
    c.thread = thread_label();
    c.thread_seq = ++thread_calls;
    c.program_ops = t_program_ops;
    c.program = t_program;
    c.purpose = t_purpose;
    const at::Tensor& t = c.input.defined() ? c.input : c.output;
    if (t.defined() && t.is_cuda()) {  // NOTE [nccl stream order]
      c.stream = c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device());
    }
  }
  Communicator* comm = ep.comm.get();
  auto run = [comm, job] {
    // Outputs may already carry autograd history (the torch ops set it before an async call
    // finishes): filling them must not be recorded as in-place autograd ops.
    at::AutoDispatchBelowADInplaceOrView no_autograd;
    for (CollectiveCall& c : job->calls) comm->run(c);
    if (job->epilogue) job->epilogue();
  };
  if (!async_op) {
    const auto t0 = t_counters.empty() ? std::chrono::steady_clock::time_point()
                                       : std::chrono::steady_clock::now();
    // Inline when nothing is queued; otherwise behind the queued async work, keeping issue order.
    if (ep.worker->idle()) {
      run();
    } else {
      ep.worker->submit(run)->wait();
    }
    if (!t_counters.empty()) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (CommCounter* counter : t_counters) counter->add_seconds(s);
    }
    return results;
  }
  pending_work().add(results, ep.worker->submit(run));
  return results;
}

at::Tensor submit_one(const std::string& group, std::shared_ptr<Job> job, at::Tensor result,
                      bool async_op) {
  return submit(group, std::move(job), {std::move(result)}, async_op)[0];
}

int64_t group_size(const std::string& group) {
  return static_cast<int64_t>(current_context().group(group).ranks.size());
}

int64_t my_group_rank(const std::string& group) {
  const auto& ranks = current_context().group(group).ranks;
  const int64_t me = current_context().rank();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == me) return static_cast<int64_t>(i);
  }
  throw Error("rank " + std::to_string(me) + " is not a member of group '" + group + "'");
}

int64_t norm_dim(int64_t dim, const at::Tensor& t, const char* what) {
  const int64_t n = t.dim();
  if (n == 0 || dim < -n || dim >= n) {
    throw Error(std::string(what) + ": dim " + std::to_string(dim) +
                " is out of range for a tensor of shape " + c10::str(t.sizes()));
  }
  return dim < 0 ? dim + n : dim;
}

// NOTE [lazy conjugate and negative views]
// A tensor may carry a pending conjugation or negation as a bit (x.conj(), torch.fft.ifft of a
// real input, x.imag's neg view): its memory holds the unconjugated values. Backends move raw
// memory, so every input is resolved here first (a copy only when a bit is set), and outputs,
// which backends write raw, must carry neither bit.
at::Tensor flat(const at::Tensor& t) {
  return t.resolve_conj().resolve_neg().contiguous().view({-1});
}

CollectiveCall make_call(CollectiveKind kind, const char* label, at::Tensor input,
                         int64_t out_numel) {
  CollectiveCall c;
  c.kind = kind;
  c.label = label;
  c.output = at::empty({out_numel}, input.options());
  c.input = std::move(input);
  return c;
}

// One synchronous call into the caller's `output` (the *_into collectives: nothing allocated).
void run_into(CollectiveKind kind, const char* label, const at::Tensor& input,
              const at::Tensor& output, ReduceOp op, std::vector<int64_t> output_splits,
              const std::string& group) {
  auto job = std::make_shared<Job>();
  CollectiveCall c;
  c.kind = kind;
  c.label = label;
  c.op = op;
  DTENSOR_CHECK(!output.is_conj() && !output.is_neg(), label, " on group '", group,
                "': the output has a pending conjugation or negation (a lazy view); pass a "
                "resolved tensor (resolve_conj(), resolve_neg())");
  c.input = flat(input);
  c.output = output.view({-1});
  c.output_splits = std::move(output_splits);
  job->calls.push_back(std::move(c));
  submit(group, job, {output}, /*async_op=*/false);
}

// Groups tensor indices by dtype, in first-seen order (one round per dtype).
std::vector<std::vector<size_t>> by_dtype(const std::vector<at::Tensor>& ts) {
  std::map<int, size_t> slot;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto [it, fresh] = slot.emplace(static_cast<int>(ts[i].scalar_type()), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  return groups;
}

// One tensor of a coalesced call: its index in the inputs, the dim it is gathered/scattered on,
// its element offset inside the packed per-rank buffer, and that call's output buffer.
struct Piece {
  size_t index;
  int64_t dim, offset;
  at::Tensor output;
};

std::vector<int64_t> shape_with(at::IntArrayRef sizes, int64_t dim, int64_t value) {
  std::vector<int64_t> s = sizes.vec();
  s[dim] = value;
  return s;
}

}  // namespace

bool compares_calls(const std::string& group) {
  return current_context().endpoint(group).comm->compares_calls();
}

at::Tensor all_reduce(const at::Tensor& input, ReduceOp op, const std::string& group,
                      bool async_op) {
  // One tensor: no packing, no dtype groups (the 4 KiB call is a few microseconds in all).
  if (reduce_op_problem(op, input.scalar_type()) != nullptr) {
    check_reduce_op(op, input.scalar_type(), "all_reduce on group '" + group + "'");
  }
  auto job = std::make_shared<Job>();
  CollectiveCall c =
      make_call(CollectiveKind::kAllReduce, "all_reduce", flat(input), input.numel());
  c.op = op;
  at::Tensor result = c.output.view(input.sizes());
  job->calls.push_back(std::move(c));
  return submit_one(group, std::move(job), std::move(result), async_op);
}

void all_reduce_into(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                     const std::string& group) {
  // Messages are built only on failure: this is torch.distributed's all_reduce (every call).
  if (reduce_op_problem(op, input.scalar_type()) != nullptr) {
    check_reduce_op(op, input.scalar_type(), "all_reduce on group '" + group + "'");
  }
  DTENSOR_CHECK(output.is_contiguous() && output.numel() == input.numel() &&
                    output.scalar_type() == input.scalar_type() &&
                    output.device() == input.device(),
                "all_reduce on group '", group,
                "': the output must be contiguous with the input's numel, dtype and device");
  const bool in_place = output.data_ptr() == input.data_ptr() && input.is_contiguous();
  DTENSOR_CHECK(in_place || !output.is_alias_of(input), "all_reduce on group '", group,
                "': the output must be the input itself (in place) or not share its storage");
  run_into(CollectiveKind::kAllReduce, "all_reduce", input, output, op, {}, group);
}

std::vector<at::Tensor> all_reduce_coalesced(const std::vector<at::Tensor>& inputs, ReduceOp op,
                                             const std::string& group, bool async_op) {
  auto job = std::make_shared<Job>();
  std::vector<at::Tensor> results(inputs.size());
  for (const auto& idx : by_dtype(inputs)) {
    if (reduce_op_problem(op, inputs[idx[0]].scalar_type()) != nullptr) {
      check_reduce_op(op, inputs[idx[0]].scalar_type(), "all_reduce on group '" + group + "'");
    }
    std::vector<at::Tensor> flats;
    for (size_t i : idx) flats.push_back(flat(inputs[i]));
    at::Tensor packed = flats.size() == 1 ? flats[0] : at::cat(flats);
    CollectiveCall c = make_call(CollectiveKind::kAllReduce, "all_reduce", packed, packed.numel());
    c.op = op;
    int64_t off = 0;
    for (size_t i : idx) {
      results[i] = c.output.narrow(0, off, inputs[i].numel()).view(inputs[i].sizes());
      off += inputs[i].numel();
    }
    job->calls.push_back(std::move(c));
  }
  return submit(group, job, results, async_op);
}

void all_gather_into(const at::Tensor& input, const at::Tensor& output, const std::string& group) {
  const int64_t n = group_size(group);
  DTENSOR_CHECK(output.is_contiguous() && output.numel() == input.numel() * n &&
                    output.scalar_type() == input.scalar_type() &&
                    output.device() == input.device(),
                "all_gather on group '", group, "': the output must be contiguous with ", n,
                " times the input's numel and its dtype and device");
  // The input may be this rank's own place in the output (in place); any other overlap is not.
  const int64_t at = my_group_rank(group) * input.numel() * input.element_size();
  const bool in_place =
      input.is_contiguous() && input.data_ptr() == static_cast<char*>(output.data_ptr()) + at;
  DTENSOR_CHECK(in_place || !output.is_alias_of(input), "all_gather on group '", group,
                "': the input must be this rank's chunk of the output or not share its storage");
  run_into(CollectiveKind::kAllGather, "all_gather_into_tensor", input, output, ReduceOp::kSum,
           std::vector<int64_t>(n, input.numel()), group);
}

at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t gather_dim,
                                  const std::string& group, bool async_op) {
  return all_gather_into_tensor_coalesced({input}, gather_dim, group, async_op)[0];
}

std::vector<at::Tensor> all_gather_into_tensor_coalesced(const std::vector<at::Tensor>& inputs,
                                                         int64_t gather_dim,
                                                         const std::string& group, bool async_op) {
  const int64_t n = group_size(group);
  auto job = std::make_shared<Job>();
  std::vector<at::Tensor> results(inputs.size());
  std::vector<Piece> pieces;
  for (const auto& idx : by_dtype(inputs)) {
    std::vector<at::Tensor> flats;
    int64_t total = 0;
    for (size_t i : idx) {
      const int64_t d = norm_dim(gather_dim, inputs[i], "all_gather_into_tensor");
      flats.push_back(flat(inputs[i].movedim(d, 0)));
      total += inputs[i].numel();
    }
    at::Tensor packed = flats.size() == 1 ? flats[0] : at::cat(flats);
    CollectiveCall c =
        make_call(CollectiveKind::kAllGather, "all_gather_into_tensor", packed, total * n);
    c.output_splits.assign(n, total);
    int64_t off = 0;
    for (size_t i : idx) {
      const int64_t d = norm_dim(gather_dim, inputs[i], "");
      const auto shape = shape_with(inputs[i].sizes(), d, inputs[i].size(d) * n);
      if (idx.size() == 1 && d == 0) {
        results[i] = c.output.view(shape);  // already in place: no epilogue copy
      } else {
        results[i] = at::empty(shape, inputs[i].options());
        pieces.push_back({i, d, off, c.output});
      }
      off += inputs[i].numel();
    }
    job->calls.push_back(std::move(c));
  }
  // Epilogue: rank r's copy of input i sits at r * total + offset; move it to its slice.
  job->epilogue = [pieces, results, inputs, n] {
    for (const Piece& p : pieces) {
      const at::Tensor& in = inputs[p.index];
      const int64_t total = p.output.numel() / n, len = in.size(p.dim);
      const at::Tensor moved_shape = in.movedim(p.dim, 0);
      for (int64_t r = 0; r < n; ++r) {
        at::Tensor src = p.output.narrow(0, r * total + p.offset, in.numel())
                             .view(moved_shape.sizes())
                             .movedim(0, p.dim);
        results[p.index].narrow(p.dim, r * len, len).copy_(src);
      }
    }
  };
  return submit(group, job, results, async_op);
}

at::Tensor all_gather_uneven(const at::Tensor& input, int64_t gather_dim,
                             const std::vector<int64_t>& sizes, const std::string& group,
                             bool async_op) {
  const int64_t n = group_size(group), me = my_group_rank(group);
  const int64_t d = norm_dim(gather_dim, input, "all_gather_uneven");
  if (static_cast<int64_t>(sizes.size()) != n || sizes[me] != input.size(d)) {
    throw Error("all_gather_uneven on group '" + group + "': sizes must give one entry per rank (" +
                std::to_string(n) + ") and this rank's entry must equal its input's size " +
                std::to_string(input.size(d)) + " along dim " + std::to_string(d));
  }
  const at::Tensor moved = input.movedim(d, 0);
  const int64_t inner = c10::multiply_integers(moved.sizes().slice(1));
  int64_t rows = 0;
  std::vector<int64_t> counts;
  for (int64_t s : sizes) {
    if (s < 0) throw Error("all_gather_uneven: negative size in sizes");
    rows += s;
    counts.push_back(s * inner);
  }
  const int64_t total = rows * inner;
  CollectiveCall c = make_call(CollectiveKind::kAllGather, "all_gather_uneven", flat(moved), total);
  c.output_splits = counts;
  std::vector<int64_t> out_moved = moved.sizes().vec();
  out_moved[0] = rows;
  at::Tensor result = at::empty(shape_with(input.sizes(), d, rows), input.options());
  at::Tensor out = c.output;
  auto job = std::make_shared<Job>();
  job->calls.push_back(std::move(c));
  job->epilogue = [out, out_moved, result, d] { result.copy_(out.view(out_moved).movedim(0, d)); };
  return submit_one(group, job, result, async_op);
}

at::Tensor reduce_scatter_tensor(const at::Tensor& input, ReduceOp op, int64_t scatter_dim,
                                 const std::string& group, bool async_op) {
  return reduce_scatter_tensor_coalesced({input}, op, scatter_dim, group, async_op)[0];
}

std::vector<at::Tensor> reduce_scatter_tensor_coalesced(const std::vector<at::Tensor>& inputs,
                                                        ReduceOp op, int64_t scatter_dim,
                                                        const std::string& group, bool async_op) {
  const int64_t n = group_size(group);
  auto job = std::make_shared<Job>();
  std::vector<at::Tensor> results(inputs.size());
  std::vector<Piece> pieces;
  for (const auto& idx : by_dtype(inputs)) {
    check_reduce_op(op, inputs[idx[0]].scalar_type(),
                    "reduce_scatter_tensor on group '" + group + "'");
    // Rank r's segment of the packed input: chunk r of every tensor, one after another.
    std::vector<std::vector<at::Tensor>> chunks(n);
    int64_t per_rank = 0;
    for (size_t i : idx) {
      const int64_t d = norm_dim(scatter_dim, inputs[i], "reduce_scatter_tensor");
      if (inputs[i].size(d) % n != 0) {
        throw Error("reduce_scatter_tensor on group '" + group + "': size " +
                    std::to_string(inputs[i].size(d)) + " of dim " + std::to_string(d) +
                    " of a tensor of shape " + c10::str(inputs[i].sizes()) +
                    " is not divisible by the group size " + std::to_string(n));
      }
      const int64_t len = inputs[i].size(d) / n;
      for (int64_t r = 0; r < n; ++r) chunks[r].push_back(flat(inputs[i].narrow(d, r * len, len)));
      pieces.push_back({i, d, per_rank, {}});
      per_rank += inputs[i].numel() / n;
    }
    // One tensor scattered along its outermost non-trivial dim is already packed: pass it as
    // is rather than copying its chunks (a full copy of the input on every call).
    const at::Tensor& first = inputs[idx[0]];
    const int64_t first_dim = pieces[pieces.size() - idx.size()].dim;
    at::Tensor packed;
    if (idx.size() == 1 && c10::multiply_integers(first.sizes().slice(0, first_dim)) == 1) {
      packed = flat(first);
    } else {
      std::vector<at::Tensor> all;
      for (auto& v : chunks) all.insert(all.end(), v.begin(), v.end());
      packed = all.size() == 1 ? all[0] : at::cat(all);
    }
    CollectiveCall c =
        make_call(CollectiveKind::kReduceScatter, "reduce_scatter_tensor", packed, per_rank);
    c.op = op;
    c.output_splits.assign(n, per_rank);
    // This rank's output holds each tensor's reduced chunk, contiguous and in natural layout:
    // the results are views of it, with no epilogue copy.
    for (size_t k = pieces.size() - idx.size(); k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      const auto shape =
          shape_with(inputs[p.index].sizes(), p.dim, inputs[p.index].size(p.dim) / n);
      results[p.index] = c.output.narrow(0, p.offset, c10::multiply_integers(shape)).view(shape);
    }
    job->calls.push_back(std::move(c));
  }
  return submit(group, job, results, async_op);
}

at::Tensor all_to_all_single(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                             const std::vector<int64_t>& input_splits, const std::string& group,
                             bool async_op, const char* label) {
  const int64_t n = group_size(group);
  if (input.dim() == 0) throw Error("all_to_all_single needs a tensor with dims");
  const int64_t rows = input.size(0);
  const int64_t inner = c10::multiply_integers(input.sizes().slice(1));
  auto equal_split = [&](const char* which) {
    if (rows % n != 0) {
      throw Error("all_to_all_single on group '" + group + "': no " + which +
                  " given and dim 0 of size " + std::to_string(rows) +
                  " does not split evenly over " + std::to_string(n) + " ranks");
    }
    return std::vector<int64_t>(n, rows / n);
  };
  const std::vector<int64_t> in_s =
      input_splits.empty() ? equal_split("input_splits") : input_splits;
  const std::vector<int64_t> out_s =
      output_splits.empty() ? equal_split("output_splits") : output_splits;
  int64_t in_rows = 0, out_rows = 0;
  for (int64_t s : in_s) in_rows += s;
  for (int64_t s : out_s) out_rows += s;
  if (static_cast<int64_t>(in_s.size()) != n || static_cast<int64_t>(out_s.size()) != n ||
      in_rows != rows) {
    throw Error("all_to_all_single on group '" + group + "': need one split per rank (" +
                std::to_string(n) + ") and input splits summing to dim 0 (" + std::to_string(rows) +
                ")");
  }
  CollectiveCall c = make_call(CollectiveKind::kAllToAll, label, flat(input), out_rows * inner);
  for (int64_t s : in_s) c.input_splits.push_back(s * inner);
  for (int64_t s : out_s) c.output_splits.push_back(s * inner);
  std::vector<int64_t> out_shape = input.sizes().vec();
  out_shape[0] = out_rows;
  at::Tensor result = c.output.view(out_shape);
  auto job = std::make_shared<Job>();
  job->calls.push_back(std::move(c));
  return submit_one(group, job, result, async_op);
}

at::Tensor all_to_all_boxes(const std::vector<BoxList>& send, const std::vector<BoxList>& recv,
                            const at::Tensor& result, const std::string& group, bool async_op,
                            const char* label) {
  const int64_t n = group_size(group);
  check_box_lists(send, recv, result, n, [&] {
    return c10::str(label, " on group '", group, "' (global rank ", current_context().rank(), ")");
  });
  const at::TensorOptions options = result.options();
  CollectiveCall c;
  c.kind = CollectiveKind::kAllToAll;
  c.label = label;
  for (int64_t r = 0; r < n; ++r) {
    c.input_splits.push_back(numel_of(send[r]));
    c.output_splits.push_back(numel_of(recv[r]));
  }
  auto job = std::make_shared<Job>();
  if (options.device().is_cpu() && current_context().endpoint(group).comm->takes_boxes()) {
    c.input = at::empty({0}, options);
    c.output = at::empty({0}, options);
    for (const BoxList& list : send) {  // NOTE [lazy conjugate and negative views]
      BoxList& mine = c.send_boxes.emplace_back();
      for (const at::Tensor& b : list) mine.push_back(b.resolve_conj().resolve_neg());
    }
    c.recv_boxes = recv;
    job->calls.push_back(std::move(c));
    return submit_one(group, std::move(job), result, async_op);
  }
  // The packing fallback: one flat input, one flat output (the receive boxes' own memory when
  // they are consecutive runs of one tensor).
  BoxList all_send, all_recv;
  for (const BoxList& list : send) all_send.insert(all_send.end(), list.begin(), list.end());
  for (const BoxList& list : recv) all_recv.insert(all_recv.end(), list.begin(), list.end());
  c.input = pack(all_send, options);
  c.output = flat_view(all_recv);
  const bool unpacks = !c.output.defined();
  if (unpacks) c.output = at::empty({numel_of(all_recv)}, options);
  if (unpacks) job->epilogue = [out = c.output, all_recv] { unpack(out, all_recv); };
  job->calls.push_back(std::move(c));
  return submit_one(group, std::move(job), result, async_op);
}

at::Tensor all_to_all(const at::Tensor& input, int64_t split_dim, int64_t concat_dim,
                      const std::string& group, bool async_op) {
  const int64_t n = group_size(group);
  const int64_t sd = norm_dim(split_dim, input, "all_to_all");
  const int64_t cd = norm_dim(concat_dim, input, "all_to_all");
  if (input.size(sd) % n != 0) {
    throw Error("all_to_all on group '" + group + "': split dim " + std::to_string(sd) +
                " of size " + std::to_string(input.size(sd)) + " does not split evenly over " +
                std::to_string(n) + " ranks");
  }
  const int64_t len = input.size(sd) / n;
  std::vector<at::Tensor> chunks;
  for (int64_t r = 0; r < n; ++r) chunks.push_back(flat(input.narrow(sd, r * len, len)));
  const std::vector<int64_t> chunk_shape = shape_with(input.sizes(), sd, len);
  const int64_t chunk_numel = c10::multiply_integers(chunk_shape);
  CollectiveCall c = make_call(CollectiveKind::kAllToAll, "all_to_all",
                               chunks.size() == 1 ? chunks[0] : at::cat(chunks), n * chunk_numel);
  c.input_splits.assign(n, chunk_numel);
  c.output_splits.assign(n, chunk_numel);
  at::Tensor result = at::empty(shape_with(chunk_shape, cd, chunk_shape[cd] * n), input.options());
  at::Tensor out = c.output;
  auto job = std::make_shared<Job>();
  job->calls.push_back(std::move(c));
  job->epilogue = [out, result, chunk_shape, chunk_numel, cd, n] {
    const int64_t step = chunk_shape[cd];
    for (int64_t r = 0; r < n; ++r) {
      result.narrow(cd, r * step, step)
          .copy_(out.narrow(0, r * chunk_numel, chunk_numel).view(chunk_shape));
    }
  };
  return submit_one(group, job, result, async_op);
}

at::Tensor broadcast(const at::Tensor& input, int64_t src, const std::string& group,
                     bool async_op) {
  const int64_t n = group_size(group);
  if (src < 0 || src >= n) {
    throw Error("broadcast on group '" + group + "': source rank " + std::to_string(src) +
                " is not a group rank (group size " + std::to_string(n) + ")");
  }
  CollectiveCall c = make_call(CollectiveKind::kBroadcast, "broadcast", flat(input), input.numel());
  c.src = src;
  at::Tensor result = c.output.view(input.sizes());
  auto job = std::make_shared<Job>();
  job->calls.push_back(std::move(c));
  return submit_one(group, job, result, async_op);
}

void barrier(const std::string& group) {
  auto job = std::make_shared<Job>();
  CollectiveCall c;
  c.kind = CollectiveKind::kBarrier;
  c.label = "barrier";
  job->calls.push_back(std::move(c));
  submit(group, job, {}, false);
}

WorkPtr work_of(const at::Tensor& t) { return pending_work().find(t); }

CommCounter::CommCounter() { t_counters.push_back(this); }

CommCounter::~CommCounter() {
  t_counters.erase(std::find(t_counters.begin(), t_counters.end(), this));
}

CommPurpose::CommPurpose(std::string purpose) : previous_(std::move(t_purpose)) {
  if (purpose.size() >= kPurposeBytes) purpose.resize(kPurposeBytes - 1);
  t_purpose = std::move(purpose);
}
CommPurpose::~CommPurpose() { t_purpose = std::move(previous_); }
const std::string& current_purpose() { return t_purpose; }

CommCause::CommCause(const char* op) : previous_(t_cause) { t_cause = op; }
CommCause::~CommCause() { t_cause = previous_; }

ProgramScope::ProgramScope(uint64_t ops, uint64_t digest)
    : previous_ops_(t_program_ops), previous_digest_(t_program) {
  t_program_ops = ops;
  t_program = digest;
}
ProgramScope::~ProgramScope() {
  t_program_ops = previous_ops_;
  t_program = previous_digest_;
}

std::map<std::pair<std::string, std::string>, int64_t> CommCounter::counts_by_cause() const {
  std::map<std::pair<std::string, std::string>, int64_t> out;
  for (const CommRecord& r : records_) ++out[{r.cause, r.label}];
  return out;
}

std::string CommCounter::to_string() const {
  std::string s;
  for (const auto& [key, n] : counts_by_cause()) {
    s += (key.first.empty() ? std::string("(no op)") : key.first) + ": " + key.second + " x" +
         std::to_string(n) + "\n";
  }
  return s;
}

int64_t CommCounter::count(CollectiveKind kind) const {
  return std::count_if(records_.begin(), records_.end(),
                       [kind](const CommRecord& r) { return r.kind == kind; });
}

at::Tensor wait_tensor(const at::Tensor& t) {
  WorkPtr work = work_of(t);
  if (work) {
    work->wait();
    pending_work().forget(t, work);
  }
  return t;
}

}  // namespace dtensor::collectives
