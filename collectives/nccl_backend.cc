// NOTE [nccl backend]
// Backend "nccl" for CUDA tensors, built with --config=cuda (./x turns it on when
// /usr/local/cuda has NCCL). One communicator per group: the group's rank 0 makes an
// ncclUniqueId and publishes it through the job's TCPStore under the group's prefix; the others
// read it, then all call ncclCommInitRank. Each call is enqueued on a stream the communicator
// owns; run() then polls the stream, so a dead peer cannot hang it: past the timeout the
// communicator is aborted (ncclCommAbort) and a CollectiveError names the collective, group,
// ranks and elapsed time. NCCL has no bitwise reductions; uneven all_gather pads to the largest
// contribution; reduce_scatter needs equal segments (the functional layer guarantees it).
//
// NOTE [nccl stream order]: the communicator's stream is non-blocking, so it does not wait for
// the kernels torch queued on its current stream (those that compute the input, and the padding
// copy below). The functional layer records the issuing thread's current stream in the call
// (async calls run on the group's worker thread, whose current stream is another); run() makes
// it current, queues the padding there, records an event on it and makes the communicator's
// stream wait for that event (through c10's device guard interface, so no CUDA build of
// libtorch is needed to compile this). run() returns once the communicator's stream finished, so
// what comes after on torch's stream sees the output.

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_join.h"
#include "base/error.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"

namespace dtensor::collectives {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return ncclFloat32;
    case c10::kDouble:
      return ncclFloat64;
    case c10::kHalf:
      return ncclFloat16;
    case c10::kBFloat16:
      return ncclBfloat16;
    case c10::kInt:
      return ncclInt32;
    case c10::kLong:
      return ncclInt64;
    case c10::kChar:
      return ncclInt8;
    case c10::kByte:
    case c10::kBool:
      return ncclUint8;
    default:
      throw Error(std::string("nccl backend: dtype ") + c10::toString(t) + " is not supported");
  }
}

ncclRedOp_t nccl_op(ReduceOp op, c10::ScalarType t) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
    default:
      throw Error(std::string("nccl backend: NCCL has no ") + std::string(reduce_op_name(op)) +
                  " reduction (dtype " + c10::toString(t) + ")");
  }
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw CollectiveError(std::string("nccl backend: ") + what + ": " + cudaGetErrorString(e));
  }
}

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(const CommunicatorOptions& o)
      : Communicator(o.group, group_rank_of(o), o.timeout) {
    if (!o.store) {
      throw Error("nccl backend: group '" + o.group.name +
                  "' has no rendezvous store (use init_from_env)");
    }
    const std::string key = "dtensor/" + o.job + "/" + o.group.name + "/nccl_id";
    ncclUniqueId id;
    if (rank() == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      o.store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
    } else {
      const auto bytes = o.store->get(key);
      if (bytes.size() != sizeof(id)) throw CollectiveError("nccl backend: bad unique id");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    check(ncclCommInitRank(&comm_, static_cast<int>(size()), id, static_cast<int>(rank())),
          "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");  // the communicator's device
  }

  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void run(CollectiveCall& call) override {
    const auto start = Clock::now();
    if (call.kind != CollectiveKind::kBarrier && !call.input.is_cuda()) {
      if (!call.input.defined()) {
        throw Error("nccl backend: " + std::string(collective_name(call.kind)) + " on group '" +
                    group().name + "' has no input tensor");
      }
      run_through_device(call);
      return;
    }
    // On the issuing thread's stream (async calls run on the group's worker thread).
    c10::OptionalStreamGuard on_issue_stream;
    if (call.stream) on_issue_stream.reset_stream(*call.stream);
    prepare(call);
    follow_current_stream(call.kind == CollectiveKind::kBarrier ? token_.device()
                                                                : call.input.device());
    enqueue(call);
    wait_stream(call, start);
    if (call.kind == CollectiveKind::kAllGather) compact_gather(call);
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) {
      throw CollectiveError(std::string("nccl backend: ") + what + " on group '" + group().name +
                            "': " + ncclGetErrorString(r));
    }
  }

  // NOTE [nccl and CPU tensors]: NCCL reads device memory only, and a job has one backend; a
  // collective on CPU tensors (a CPU mesh's in a job on nccl: FSDP's offloaded parameters and
  // gradients, CPUOffloadPolicy, whose clip_grad_norm_ all-reduces their norms) runs on copies
  // on the communicator's device, and its output is copied back. PyTorch's nccl process group
  // refuses CPU tensors instead (its users add a "cpu:gloo" backend). The copies run on the
  // current stream of the communicator's device, which run() orders the collective after; the
  // copy back follows run()'s wait for the communicator's stream.
  void run_through_device(CollectiveCall& call) {
    const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_));
    const c10::DeviceGuard on_device(device);
    CollectiveCall staged = call;
    staged.input = call.input.to(device);
    if (call.output.defined()) {
      staged.output = at::empty(call.output.sizes(), call.output.options().device(device));
    }
    staged.stream.reset();
    run(staged);
    if (call.output.defined()) call.output.copy_(staged.output);
    call.seq = staged.seq;
  }

  // Buffers queued on torch's current stream before the collective: all_gather's padded copy,
  // the barrier's token.
  void prepare(const CollectiveCall& call) {
    if (call.kind == CollectiveKind::kAllGather) {
      int64_t longest = 0;
      for (int64_t s : call.output_splits) longest = std::max(longest, s);
      padded_ = at::zeros({longest * size()}, call.input.options());
      padded_.narrow(0, rank() * longest, call.input.numel()).copy_(call.input);
    } else if (call.kind == CollectiveKind::kBarrier && !token_.defined()) {
      token_ = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
    }
  }

  // NOTE [nccl stream order]
  void follow_current_stream(c10::Device device) {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    void* event = nullptr;
    impl->record(&event, impl->getStream(device), device.index(), c10::EventFlag::PYTORCH_DEFAULT);
    const cudaError_t e = cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0);
    impl->destroyEvent(event, device.index());
    check_cuda(e, "cudaStreamWaitEvent");
  }

  void enqueue(CollectiveCall& call) {
    const auto dtype = call.input.defined() ? nccl_dtype(call.input.scalar_type()) : ncclUint8;
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
        check(ncclAllReduce(call.input.data_ptr(), call.output.data_ptr(), call.input.numel(),
                            dtype, nccl_op(call.op, call.input.scalar_type()), comm_, stream_),
              "ncclAllReduce");
        break;
      case CollectiveKind::kAllGather: {
        const int64_t longest = padded_.numel() / size();
        check(ncclAllGather(padded_.narrow(0, rank() * longest, longest).data_ptr(),
                            padded_.data_ptr(), longest, dtype, comm_, stream_),
              "ncclAllGather");
        break;
      }
      case CollectiveKind::kReduceScatter:
        check(ncclReduceScatter(call.input.data_ptr(), call.output.data_ptr(),
                                call.output_splits[rank()], dtype,
                                nccl_op(call.op, call.input.scalar_type()), comm_, stream_),
              "ncclReduceScatter");
        break;
      case CollectiveKind::kAllToAll:
        all_to_all(call, dtype);
        break;
      case CollectiveKind::kBroadcast:
        check(ncclBroadcast(call.input.data_ptr(), call.output.data_ptr(), call.input.numel(),
                            dtype, static_cast<int>(call.src), comm_, stream_),
              "ncclBroadcast");
        break;
      case CollectiveKind::kBarrier:
        check(ncclAllReduce(token_.data_ptr(), token_.data_ptr(), 1, ncclFloat32, ncclSum, comm_,
                            stream_),
              "ncclAllReduce (barrier)");
        break;
    }
  }

  void all_to_all(CollectiveCall& call, ncclDataType_t dtype) {
    const size_t elem = call.input.element_size();
    auto* in = static_cast<char*>(call.input.data_ptr());
    auto* out = static_cast<char*>(call.output.data_ptr());
    check(ncclGroupStart(), "ncclGroupStart");
    int64_t in_off = 0, out_off = 0;
    for (int64_t p = 0; p < size(); ++p) {
      if (call.input_splits[p] > 0) {
        check(ncclSend(in + in_off * elem, call.input_splits[p], dtype, static_cast<int>(p), comm_,
                       stream_),
              "ncclSend");
      }
      if (call.output_splits[p] > 0) {
        check(ncclRecv(out + out_off * elem, call.output_splits[p], dtype, static_cast<int>(p),
                       comm_, stream_),
              "ncclRecv");
      }
      in_off += call.input_splits[p];
      out_off += call.output_splits[p];
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  // Polls the stream (never a blocking sync: a dead peer would hang it) until done or timeout.
  void wait_stream(const CollectiveCall& call, Clock::time_point start) {
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const auto elapsed = Clock::now() - start;
      if (async != ncclSuccess || elapsed > timeout()) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed);
        throw CollectiveError(
            std::string(call.label.empty() ? collective_name(call.kind) : call.label) +
            " on group '" + group().name + "' (nccl, ranks [" + absl::StrJoin(group().ranks, ",") +
            "]) " +
            (async != ncclSuccess ? std::string("failed: ") + ncclGetErrorString(async)
                                  : "did not finish within the timeout of " +
                                        std::to_string(timeout().count()) + " ms") +
            " after " + std::to_string(ms.count()) + " ms; communicator aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void compact_gather(CollectiveCall& call) {
    const int64_t longest = padded_.numel() / size();
    int64_t off = 0;
    for (int64_t r = 0; r < size(); ++r) {
      call.output.narrow(0, off, call.output_splits[r])
          .copy_(padded_.narrow(0, r * longest, call.output_splits[r]));
      off += call.output_splits[r];
    }
    padded_ = at::Tensor();
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  at::Tensor padded_;
  at::Tensor token_;
};

BackendRegistration g_nccl("nccl", [](const CommunicatorOptions& o) {
  return std::make_unique<NcclCommunicator>(o);
});

}  // namespace
}  // namespace dtensor::collectives
