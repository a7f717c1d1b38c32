#include "collectives/torch_process_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::collectives {
namespace {

// A collective that already ran: the engine's backends complete synchronous calls before they
// return. Its future holds the result tensors, as c10d's completed work does.
class CompletedWork : public c10d::Work {
 public:
  CompletedWork(std::vector<at::Tensor> result, c10d::OpType type)
      : Work(-1, type), result_(std::move(result)) {
    std::vector<c10::Device> devices;
    for (const auto& t : result_) {
      if (!t.is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices);
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> result, c10d::OpType type) {
  return c10::make_intrusive<CompletedWork>(std::move(result), type);
}

ReduceOp engine_op(const c10d::ReduceOp& op, const std::string& group) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    default:
      throw Error("torch process group '" + torch_group_name(group) + "': reduce op " +
                  std::to_string(static_cast<int>(op.op_)) +
                  " (PREMUL_SUM or unknown) is not supported by the engine's collectives");
  }
}

// Copies `src` into the caller's tensor `dst` (c10d's collectives write their outputs in place).
void write(const at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst.copy_(src.view(dst.sizes()));
}

// The engine group's collectives behind a c10d::ProcessGroup (NOTE [mesh groups as torch
// process groups]). Ranks in options (roots) are group ranks, as the engine's are.
class EngineBackend : public c10d::Backend {
 public:
  EngineBackend(std::string group, int rank, int size)
      : Backend(rank, size), group_(std::move(group)) {}

  const std::string getBackendName() const override { return "dtensor"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    for (auto& t : tensors) write(t, collectives::broadcast(t.contiguous(), opts.rootRank, group_));
    return done(tensors, c10d::OpType::BROADCAST);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const ReduceOp op = engine_op(opts.reduceOp, group_);
    for (auto& t : tensors) {
      if (t.is_contiguous()) {
        all_reduce_into(t, t, op, group_);  // in place (NOTE [in-place all_reduce])
      } else {
        write(t, all_reduce(t.contiguous(), op, group_));
      }
    }
    return done(tensors, c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const ReduceOp op = engine_op(opts.reduceOp, group_);
    std::vector<at::Tensor> inputs;
    for (const auto& t : tensors) inputs.push_back(t.contiguous());
    auto out = all_reduce_coalesced(inputs, op, group_);
    for (size_t i = 0; i < tensors.size(); ++i) write(tensors[i], out[i]);
    return done(tensors, c10d::OpType::ALLREDUCE_COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const ReduceOp op = engine_op(opts.reduceOp, group_);
    for (auto& t : tensors) {
      at::Tensor out = all_reduce(t.contiguous(), op, group_);
      if (getRank() == opts.rootRank) write(t, out);
    }
    return done(tensors, c10d::OpType::REDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    check_lists(outputs.size(), inputs.size(), "allgather");
    for (size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor gathered = all_gather_into_tensor(inputs[i].contiguous().unsqueeze(0), 0, group_);
      check_lists(outputs[i].size(), static_cast<size_t>(getSize()), "allgather output list");
      for (int r = 0; r < getSize(); ++r) write(outputs[i][r], gathered[r]);
    }
    return done(flatten(outputs), c10d::OpType::ALLGATHER);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return allgather(outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    gather_into(output, input);
    return done({output}, c10d::OpType::_ALLGATHER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& /*opts*/) override {
    check_lists(outputs.size(), inputs.size(), "allgather_into_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) gather_into(outputs[i], inputs[i]);
    return done(outputs, c10d::OpType::COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    for (const auto& t : inputs) {
      at::Tensor gathered = all_gather_into_tensor(t.contiguous().unsqueeze(0), 0, group_);
      if (getRank() == opts.rootRank) {
        check_lists(outputs.empty() ? 0 : outputs[0].size(), static_cast<size_t>(getSize()),
                    "gather output list");
        for (int r = 0; r < getSize(); ++r) write(outputs[0][r], gathered[r]);
      }
    }
    return done(flatten(outputs), c10d::OpType::GATHER);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    for (size_t i = 0; i < outputs.size(); ++i) {
      at::Tensor& o = outputs[i];
      std::vector<int64_t> shape = {getSize()};
      shape.insert(shape.end(), o.sizes().begin(), o.sizes().end());
      at::Tensor whole = getRank() == opts.rootRank ? at::stack(inputs.at(i)).contiguous()
                                                    : at::empty(shape, o.options());
      write(o, collectives::broadcast(whole, opts.rootRank, group_)[getRank()]);
    }
    return done(outputs, c10d::OpType::SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const ReduceOp op = engine_op(opts.reduceOp, group_);
    check_lists(outputs.size(), inputs.size(), "reduce_scatter");
    for (size_t i = 0; i < outputs.size(); ++i) {
      at::Tensor stacked = at::stack(inputs[i]).contiguous();
      write(outputs[i], reduce_scatter_tensor(stacked, op, 0, group_).squeeze(0));
    }
    return done(outputs, c10d::OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    scatter_into(output, input, engine_op(opts.reduceOp, group_));
    return done({output}, c10d::OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    check_lists(outputs.size(), inputs.size(), "reduce_scatter_tensor_coalesced");
    const ReduceOp op = engine_op(opts.reduceOp, group_);
    for (size_t i = 0; i < inputs.size(); ++i) scatter_into(outputs[i], inputs[i], op);
    return done(outputs, c10d::OpType::COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& /*opts*/) override {
    write(output, all_to_all_single(input.contiguous(), output_splits, input_splits, group_));
    return done({output}, c10d::OpType::ALLTOALL_BASE);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& /*opts*/) override {
    check_lists(outputs.size(), static_cast<size_t>(getSize()), "alltoall output list");
    check_lists(inputs.size(), static_cast<size_t>(getSize()), "alltoall input list");
    std::vector<at::Tensor> flat;
    std::vector<int64_t> in_splits, out_splits;
    for (const auto& t : inputs) {
      flat.push_back(t.contiguous().reshape({-1}));
      in_splits.push_back(t.numel());
    }
    for (const auto& o : outputs) out_splits.push_back(o.numel());
    at::Tensor out = all_to_all_single(at::cat(flat), out_splits, in_splits, group_);
    int64_t offset = 0;
    for (auto& o : outputs) {
      write(o, out.narrow(0, offset, o.numel()));
      offset += o.numel();
    }
    return done(outputs, c10d::OpType::ALLTOALL);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    collectives::barrier(group_);
    return done({}, c10d::OpType::BARRIER);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& /*tensors*/, int dst,
                                      int /*tag*/) override {
    throw Error(no_p2p("send to", dst));
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& /*tensors*/, int src,
                                      int /*tag*/) override {
    throw Error(no_p2p("recv from", src));
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& /*tensors*/,
                                               int /*tag*/) override {
    throw Error(no_p2p("recv from", -1));
  }

 private:
  void gather_into(const at::Tensor& output, const at::Tensor& input) {
    DTENSOR_CHECK(output.numel() == input.numel() * getSize(),
                  "all_gather on torch process group '", torch_group_name(group_), "' (rank ",
                  getRank(), "): output has ", output.numel(), " elements, expected ",
                  input.numel() * getSize());
    if (output.is_contiguous()) {
      all_gather_into(input.contiguous(), output, group_);
    } else {
      write(output, all_gather_into_tensor(input.contiguous().reshape({-1}), 0, group_));
    }
  }

  void scatter_into(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
    DTENSOR_CHECK(input.numel() == output.numel() * getSize(),
                  "reduce_scatter on torch process "
                  "group '",
                  torch_group_name(group_), "' (rank ", getRank(), "): input has ", input.numel(),
                  " elements, expected ", output.numel() * getSize());
    write(output, reduce_scatter_tensor(input.contiguous().reshape({-1}), op, 0, group_));
  }

  void check_lists(size_t got, size_t want, const char* what) const {
    DTENSOR_CHECK(got == want, what, " on torch process group '", torch_group_name(group_),
                  "' (rank ", getRank(), "): ", got, " tensors, expected ", want);
  }

  static std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> out;
    for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
    return out;
  }

  std::string no_p2p(const char* what, int peer) const {
    return "torch process group '" + torch_group_name(group_) + "' (rank " +
           std::to_string(getRank()) + "): " + what + " rank " + std::to_string(peer) +
           " is not supported: the engine's groups have no point-to-point collectives; use a "
           "Gloo or NCCL group of torch.distributed for send/recv";
  }

  std::string group_;
};

absl::Mutex g_mu;
// (job, rank, group) -> its ProcessGroup; never shrinks (a few groups per mesh).
std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>>& g_groups() {
  static auto* groups = new std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>>();
  return *groups;
}

}  // namespace

std::string torch_group_name(const std::string& group) { return "dtensor:" + group; }

c10::intrusive_ptr<c10d::ProcessGroup> torch_process_group(const std::string& group) {
  RankContext& ctx = current_context();
  const GroupInfo& info = ctx.group(group);
  const auto me = std::find(info.ranks.begin(), info.ranks.end(), ctx.rank());
  DTENSOR_CHECK(me != info.ranks.end(), "torch process group of '", group, "': rank ", ctx.rank(),
                " is not a member (ranks ", info.ranks.size(), ")");
  const int group_rank = static_cast<int>(me - info.ranks.begin());
  const int size = static_cast<int>(info.ranks.size());
  const std::string key = ctx.job() + "/" + std::to_string(ctx.rank()) + "/" + group;
  absl::MutexLock lock(&g_mu);
  auto& groups = g_groups();
  auto it = groups.find(key);
  if (it != groups.end()) return it->second;

  if (ctx.store() == nullptr) {
    // Ranks as threads: each thread registers its own group under the same name.
    c10d::set_thread_isolation_mode(true);
  }
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(group_rank, size);
  auto backend = c10::make_intrusive<EngineBackend>(group, group_rank, size);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  const std::string name = torch_group_name(group);
  pg->setGroupName(name);
  pg->setGroupDesc(name);
  // A name registered before (by another job of this process on the same engine group name, or
  // a thread that ran an earlier job) is replaced by this job's group.
  try {
    c10d::unregister_process_group(name);
  } catch (...) {
  }
  c10d::register_process_group(name, pg);
  groups.emplace(key, pg);
  return pg;
}

}  // namespace dtensor::collectives
