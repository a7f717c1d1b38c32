#pragma once
// Rendezvous like torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the
// environment (set by `./x launch` or `python3 -m torch.distributed.run`); libtorch's TCPStore
// at MASTER_ADDR:MASTER_PORT, hosted by rank 0, connects the ranks.

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

}  // namespace dtensor::collectives
