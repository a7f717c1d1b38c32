// Proves the opt-in CUDA/NCCL build compiles and links against /usr/local/cuda (./x turns
// --config=cuda on when nccl.h is there). Asking NCCL its version needs no GPU.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "collectives/communicator.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"

#ifdef DTENSOR_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <thread>
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)  // a CUDA build of libtorch
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#endif

namespace {

TEST(NcclLinkTest, LibraryAnswersItsVersion) {
#ifdef DTENSOR_WITH_CUDA
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_GE(version, 20000);  // NCCL 2.x encodes major*10000 + minor*100 + patch
  int runtime = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  EXPECT_GT(runtime, 0);
  std::cout << "NCCL " << version << ", CUDA runtime " << runtime << "\n";
#else
  GTEST_SKIP() << "built without --config=cuda: no CUDA/NCCL on this machine";
#endif
}

TEST(NcclLinkTest, BackendIsRegisteredWhenBuiltWithCuda) {
  const auto names = dtensor::collectives::backend_names();
  const bool has_nccl = std::find(names.begin(), names.end(), "nccl") != names.end();
#ifdef DTENSOR_WITH_CUDA
  EXPECT_TRUE(has_nccl);
#else
  EXPECT_FALSE(has_nccl);
#endif
}

#ifdef DTENSOR_WITH_CUDA
// A usable GPU and a CUDA-enabled libtorch (Debian's is CPU-only): the tests below skip otherwise.
bool usable_gpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 && at::hasCUDA();
}

// World size 1 on a real GPU (NCCL refuses two ranks on one GPU), joined once per process.
void join_nccl_world() {
  static const auto ctx = [] {
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", "29731", 1);
    return dtensor::collectives::init_from_env("nccl");
  }();
  (void)ctx;
}

const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);

// Holds a stream at a wait on a host flag (cuStreamWaitValue32, reached through the runtime's
// driver entry points, so no libcuda link) until release(): work queued behind it cannot start,
// so a collective that does not wait for that stream reads its input before it is written.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(uint32_t), cudaHostAllocMapped));
    *flag_ = 0;
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, flag_, 0));
    using WaitValue = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    check(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
                                           &found));
    EXPECT_EQ(found, cudaDriverEntryPointSuccess);
    EXPECT_EQ(reinterpret_cast<WaitValue>(fn)(stream, reinterpret_cast<CUdeviceptr>(dev), 1,
                                              CU_STREAM_WAIT_VALUE_GEQ),
              CUDA_SUCCESS);
  }
  // Opens the gate `ms` milliseconds from now, from another thread.
  void release_after(int ms) {
    opener_ = std::thread([this, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      reinterpret_cast<std::atomic<uint32_t>*>(flag_)->store(1);
    });
  }
  ~StreamGate() {
    if (opener_.joinable()) opener_.join();
    reinterpret_cast<std::atomic<uint32_t>*>(flag_)->store(1);
    cudaDeviceSynchronize();
    cudaFreeHost(flag_);
  }

 private:
  static void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }
  uint32_t* flag_ = nullptr;
  std::thread opener_;
};

// Gates `stream` (torch's current one), then queues x = arange + 1 behind the gate.
void write_behind_gate(StreamGate& gate, const at::Tensor& x) {
  x.copy_(at::arange(x.numel(), x.options()).view(x.sizes()) + 1);
  gate.release_after(300);
}
#endif

TEST(NcclLinkTest, AllReduceOnOneGpu) {
#ifdef DTENSOR_WITH_CUDA
  if (!usable_gpu()) GTEST_SKIP() << "no usable GPU here";
  join_nccl_world();
  const at::Tensor x = at::arange(8, kCuda);
  const at::Tensor y = dtensor::collectives::all_reduce(x, dtensor::ReduceOp::kSum, "world");
  EXPECT_TRUE(at::equal(y.cpu(), x.cpu()));
  const at::Tensor g = dtensor::collectives::all_gather_into_tensor(x.view({2, 4}), 1, "world");
  EXPECT_TRUE(at::equal(g.cpu(), x.view({2, 4}).cpu()));
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

// Every collective of the backend on CUDA tensors (one rank: each returns its input), and the
// reductions NCCL lacks refused by name.
TEST(NcclLinkTest, EveryCollectiveOnOneGpu) {
#ifdef DTENSOR_WITH_CUDA
  if (!usable_gpu()) GTEST_SKIP() << "no usable GPU here";
  join_nccl_world();
  namespace c = dtensor::collectives;
  const at::Tensor x = at::randn({6, 4}, kCuda);
  const at::Tensor host = x.cpu();
  for (auto op : {dtensor::ReduceOp::kSum, dtensor::ReduceOp::kMax, dtensor::ReduceOp::kAvg}) {
    EXPECT_TRUE(at::equal(c::all_reduce(x, op, "world").cpu(), host));
    EXPECT_TRUE(at::equal(c::reduce_scatter_tensor(x, op, 0, "world").cpu(), host));
  }
  EXPECT_TRUE(at::equal(c::all_gather_uneven(x, 0, {6}, "world").cpu(), host));
  EXPECT_TRUE(at::equal(c::all_to_all_single(x, {}, {}, "world").cpu(), host));
  EXPECT_TRUE(at::equal(c::broadcast(x, 0, "world").cpu(), host));
  EXPECT_TRUE(at::equal(c::all_reduce(x.to(at::kLong), dtensor::ReduceOp::kSum, "world").cpu(),
                        host.to(at::kLong)));
  c::barrier("world");
  try {
    c::all_reduce(x.to(at::kInt), dtensor::ReduceOp::kBand, "world");
    ADD_FAILURE() << "bitwise and on NCCL was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL has no"), std::string::npos) << e.what();
  }
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

// CPU tensors run through copies on the communicator's device and come back on the CPU (NOTE
// [nccl and CPU tensors]); before, the backend refused them: a CPU mesh's collectives failed in
// a job on nccl, e.g. clip_grad_norm_ over FSDP's CPU-offloaded gradients.
TEST(NcclLinkTest, CpuTensorsRunThroughTheDevice) {
#ifdef DTENSOR_WITH_CUDA
  if (!usable_gpu()) GTEST_SKIP() << "no usable GPU here";
  join_nccl_world();
  namespace c = dtensor::collectives;
  const at::Tensor x = at::randn({6, 4});
  for (const at::Tensor& y :
       {c::all_reduce(x, dtensor::ReduceOp::kSum, "world"),
        c::reduce_scatter_tensor(x, dtensor::ReduceOp::kSum, 0, "world"),
        c::all_gather_uneven(x, 0, {6}, "world"), c::all_to_all_single(x, {}, {}, "world"),
        c::broadcast(x, 0, "world")}) {
    EXPECT_FALSE(y.is_cuda());
    EXPECT_TRUE(at::equal(y, x));
  }
  const at::Tensor w = c::wait_tensor(c::all_reduce(x, dtensor::ReduceOp::kMax, "world", true));
  EXPECT_FALSE(w.is_cuda());
  EXPECT_TRUE(at::equal(w, x));
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

// The dtensor_c10d operators' CUDA kernels (collectives/torch_ops.cc) through the dispatcher,
// async until waited, and their autograd: all_gather's backward is a reduce_scatter.
TEST(NcclLinkTest, TorchOpsOnCudaTensors) {
#ifdef DTENSOR_WITH_CUDA
  if (!usable_gpu()) GTEST_SKIP() << "no usable GPU here";
  join_nccl_world();
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto all_reduce =
      dispatcher.findSchemaOrThrow("dtensor_c10d::all_reduce", "")
          .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view)>();
  const auto all_gather =
      dispatcher.findSchemaOrThrow("dtensor_c10d::all_gather_into_tensor", "")
          .typed<at::Tensor(const at::Tensor&, int64_t, c10::string_view, int64_t)>();
  const auto wait = dispatcher.findSchemaOrThrow("dtensor_c10d::wait_tensor", "")
                        .typed<at::Tensor(const at::Tensor&)>();
  const at::Tensor x = at::randn({3, 5}, kCuda);
  const at::Tensor y = wait.call(all_reduce.call(x, "sum", "world"));
  EXPECT_TRUE(y.is_cuda());
  EXPECT_TRUE(at::equal(y.cpu(), x.cpu()));
  const at::Tensor leaf = x.clone().requires_grad_(true);
  const at::Tensor g = wait.call(all_gather.call(leaf, 1, "world", 1));
  EXPECT_TRUE(at::equal(g.cpu(), x.cpu()));
  (g * 3).sum().backward();
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_TRUE(leaf.grad().is_cuda());
  EXPECT_TRUE(at::allclose(leaf.grad().cpu(), at::full({3, 5}, 3.0f)));
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

// NOTE [nccl stream order]: the input is written behind a gate on torch's stream when the
// collective is called; the output must hold the written values, not the zeros before them.
// (Slow kernels in front were not enough: on an H200 the communicator's stream happened to run
// after them anyway, and the test passed without the fix.)
TEST(NcclLinkTest, WaitsForWorkQueuedOnTheCurrentStream) {
#ifdef DTENSOR_WITH_CUDA
  if (!usable_gpu()) GTEST_SKIP() << "no usable GPU here";
  join_nccl_world();
  const at::Tensor want = at::arange(1 << 16, kCuda) + 1;
  for (bool gather : {false, true}) {  // all_gather pads through a buffer filled on the stream
    const at::Tensor x = at::zeros({1 << 16}, kCuda);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    at::Tensor y;
    {
      StreamGate gate(nullptr);  // torch's current stream here: the legacy default stream
      write_behind_gate(gate, x);
      y = gather ? dtensor::collectives::all_gather_into_tensor(x, 0, "world")
                 : dtensor::collectives::all_reduce(x, dtensor::ReduceOp::kSum, "world");
    }
    EXPECT_TRUE(at::equal(y.cpu(), want.cpu())) << (gather ? "all_gather" : "all_reduce");
  }
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

// An async collective runs on the group's worker thread: it must wait for the stream the
// issuing thread had current (here a side stream, not the default one).
TEST(NcclLinkTest, AsyncCallWaitsForTheIssuingThreadsStream) {
#ifdef DTENSOR_WITH_CUDA
  if (!usable_gpu()) GTEST_SKIP() << "no usable GPU here";
  join_nccl_world();
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)  // a CUDA build of libtorch
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  const at::Tensor x = at::zeros({1 << 16}, kCuda);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  at::Tensor y;
  {
    StreamGate gate(side.stream());
    c10::cuda::CUDAStreamGuard on_side(side);
    write_behind_gate(gate, x);
    y = dtensor::collectives::all_reduce(x, dtensor::ReduceOp::kSum, "world", /*async_op=*/true);
    y = dtensor::collectives::wait_tensor(y);
  }
  EXPECT_TRUE(at::equal(y.cpu(), (at::arange(1 << 16, kCuda) + 1).cpu()));
#else
  GTEST_SKIP() << "needs a CUDA build of libtorch (c10/cuda headers)";
#endif
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

}  // namespace
