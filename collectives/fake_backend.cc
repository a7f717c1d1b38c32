// The "fake" backend: one process stands for one rank of a job whose other ranks do not exist.
//
// NOTE [fake backend]
// PyTorch's tests and tools trace sharding on a single process with torch.distributed's "fake"
// process group (init_process_group("fake", store=FakeStore(), rank=r, world_size=n)): collectives
// return outputs of the right shapes whose values mean nothing, so what a test reads is layouts,
// shapes and collective counts. A process that joined such a group joins the engine as rank r of
// n on this backend (dtensor/device_mesh.py, NOTE [joining torch's default group]): every
// collective completes at once with no peer, each output filled as if every rank had passed this
// rank's input (an all_reduce returns the input, an all_gather repeats it, a reduce_scatter keeps
// this rank's chunk, an all_to_all and a broadcast keep what this rank sent itself and zero the
// rest). Values are therefore not one device's, as on PyTorch's fake group; the engine's counters
// (CommDebugMode) see every call as on a real backend. Never selected by a launcher.

#include <ATen/ATen.h>

#include "collectives/communicator.h"

namespace dtensor::collectives {
namespace {

class FakeCommunicator : public Communicator {
 public:
  using Communicator::Communicator;

  void run(CollectiveCall& call) override {
    call.seq = ++seq_;
    const at::Tensor& in = call.input;
    at::Tensor& out = call.output;
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kBroadcast:
        if (!out.is_same(in)) out.copy_(in);
        return;
      case CollectiveKind::kAllGather:
        for (int64_t r = 0; r < size(); ++r) fill_slot(out, call.output_splits, r, in);
        return;
      case CollectiveKind::kReduceScatter:
        out.copy_(in.narrow(0, offset_of(call.output_splits, rank()), call.output_splits[rank()]));
        return;
      case CollectiveKind::kAllToAll: {
        out.zero_();
        const int64_t sent =
            call.input_splits.empty() ? in.numel() / size() : call.input_splits[rank()];
        const int64_t from =
            call.input_splits.empty() ? rank() * sent : offset_of(call.input_splits, rank());
        fill_slot(out, call.output_splits, rank(), in.narrow(0, from, sent));
        return;
      }
      case CollectiveKind::kBarrier:
        return;
    }
  }

 private:
  // Writes `piece` into rank r's part of `out` (cut by `splits`, or equal parts when empty) when
  // the sizes agree; zeros otherwise.
  void fill_slot(at::Tensor& out, const std::vector<int64_t>& splits, int64_t r,
                 const at::Tensor& piece) {
    const int64_t n = splits.empty() ? out.numel() / size() : splits[r];
    const int64_t at = splits.empty() ? r * n : offset_of(splits, r);
    at::Tensor slot = out.narrow(0, at, n);
    if (piece.numel() == n) {
      slot.copy_(piece.reshape({-1}));
    } else {
      slot.zero_();
    }
  }

  uint64_t seq_ = 0;
};

BackendRegistration g_fake("fake", [](const CommunicatorOptions& o) {
  return std::make_unique<FakeCommunicator>(o.group, group_rank_of(o), o.timeout);
});

}  // namespace
}  // namespace dtensor::collectives
