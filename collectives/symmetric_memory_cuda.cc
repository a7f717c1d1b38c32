// CUDA symmetric memory (NOTE [symmetric memory]), built with --config=cuda: each rank's buffer
// is device memory (cudaMalloc), its peers open it by IPC handle (cudaIpcGetMemHandle /
// cudaIpcOpenMemHandle, with peer access enabled lazily), and the signal pads stay host flags in
// the rank's shared-memory segment. Installed into symmetric_memory.cc's DeviceHooks at load.

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "base/error.h"
#include "collectives/symmetric_memory.h"

namespace dtensor::collectives {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == symmetric::kIpcHandleBytes);

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(std::string("symmetric memory on CUDA: ") + what + ": " + cudaGetErrorString(err));
  }
}

// Makes `device` current for the scope (the caller's current device is restored).
struct DeviceGuard {
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous), "cudaGetDevice");
    if (device >= 0 && device != previous) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous); }
  int previous = 0;
};

void* alloc(size_t bytes, int device) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, bytes), "cudaMalloc");
  return ptr;
}

void free_buffer(void* ptr, int device) {
  DeviceGuard guard(device);
  cudaFree(ptr);  // in a destructor: nothing to report to
}

void export_handle(void* ptr, char* handle) {
  cudaIpcMemHandle_t h;
  check(cudaIpcGetMemHandle(&h, ptr), "cudaIpcGetMemHandle");
  std::memcpy(handle, &h, sizeof(h));
}

void* open_handle(const char* handle, int device) {
  DeviceGuard guard(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof(h));
  void* ptr = nullptr;
  check(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return ptr;
}

void synchronize(int device) {
  DeviceGuard guard(device);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before a signal");
}

void close_handle(void* ptr, int device) {
  DeviceGuard guard(device);
  cudaIpcCloseMemHandle(ptr);
}

const bool g_installed = [] {
  symmetric::DeviceHooks hooks;
  hooks.alloc = alloc;
  hooks.free = free_buffer;
  hooks.export_handle = export_handle;
  hooks.open_handle = open_handle;
  hooks.close_handle = close_handle;
  hooks.synchronize = synchronize;
  symmetric::set_device_hooks(hooks);
  return true;
}();

}  // namespace
}  // namespace dtensor::collectives
