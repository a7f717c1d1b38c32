#pragma once
// Rendezvous like torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the
// environment (set by `./x launch` or `python3 -m torch.distributed.run`); libtorch's TCPStore
// at MASTER_ADDR:MASTER_PORT, hosted by rank 0, connects the ranks.

#include <c10/core/DeviceType.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "collectives/rank_context.h"

namespace dtensor::collectives {

struct LaunchEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr;
  int port = 0;
};

// Reads the torchrun variables; nullopt when RANK and WORLD_SIZE are both absent. Throws
// dtensor::Error naming the variable when one is present but malformed or missing.
std::optional<LaunchEnv> launch_env_from_environ();

// Connects to the job's TCPStore, agrees on a job id (rank 0 makes one and publishes it), and
// installs a RankContext on `backend` (empty: $DTENSOR_BACKEND, else "shm") as the process
// context. Returns it. Throws when the environment is incomplete or the store is unreachable
// within `timeout`.
std::shared_ptr<RankContext> init_from_env(const std::string& backend = "",
                                           std::chrono::milliseconds timeout = default_timeout());

// The devices of `type` this process sees (0 where libtorch has no support for it, or no device).
int64_t device_count(c10::DeviceType type);

// The collectives backend a launched job uses for meshes of `device_type` (dtensor.device_mesh's
// default_backend calls this): $DTENSOR_BACKEND when set; else for CUDA "nccl", or "cuda_ipc"
// when this host's ranks outnumber its GPUs (LOCAL_WORLD_SIZE > device count on one host: ranks
// share a GPU, which NCCL refuses; NOTE [cuda_ipc backend]); "c10d" (Gloo) when CPU ranks span
// hosts (WORLD_SIZE > LOCAL_WORLD_SIZE), and "shm" (shared memory) for CPU ranks on one host.
// `devices`: the devices of that type this process sees (default: device_count(device_type)).
std::string default_backend(c10::DeviceType device_type,
                            std::optional<int64_t> devices = std::nullopt);

// PyTorch's init_device_mesh on a device type other than the CPU: the calling thread's current
// device becomes LOCAL_RANK % device count (RANK without LOCAL_RANK; unchanged outside a
// launch), before any communicator is made on it (NOTE [mesh device]). Throws, naming the device
// type, when this process sees no such device.
void select_local_device(c10::DeviceType device_type);

}  // namespace dtensor::collectives
