#pragma once
// The engine's groups as torch.distributed process groups.
//
// NOTE [mesh groups as torch process groups]
// PyTorch's DTensor hands a mesh dim's group to torch's own collectives: torch.distributed.*
// with group=, the functional collectives (_c10d_functional ops, which resolve a group by its
// registered name), DDP, and compiled graphs that bake the group name in. For the engine's groups
// to serve the same code, each is also a c10d::ProcessGroup:
//  - its backend (for CPU and CUDA tensors, BackendType::CUSTOM, named "dtensor") runs every
//    collective through this library's functional collectives on the engine group, so the group's
//    own transport (shm, Gloo, NCCL, cuda_ipc, threads) moves the bytes and the engine's
//    CommCounter sees them;
//  - it is registered in c10d's group registry under "dtensor:" + the engine group's name, which
//    every member computes alike (a mesh dim's group is named by its ranks), so a name baked into
//    a graph on one rank resolves on every rank;
//  - one ProcessGroup per (job, rank, engine group), made on first use and kept for the process's
//    life (the registry holds only a weak reference);
//  - collectives run synchronously on the calling rank's context and return completed Work, as
//    the engine's own synchronous collectives do; ranks as threads switch c10d's registry to one
//    per thread (c10d::set_thread_isolation_mode), as PyTorch's threaded process groups do.
// Point-to-point send/recv are refused with an error naming the group: the engine has none.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>

namespace dtensor::collectives {

// The registry name of engine group `group` ("dtensor:" + group).
std::string torch_group_name(const std::string& group);

// The c10d::ProcessGroup of the calling rank's engine group `group` (see the NOTE above). Throws
// dtensor::Error when the calling thread has no rank context or is not a member of the group.
c10::intrusive_ptr<c10d::ProcessGroup> torch_process_group(const std::string& group);

}  // namespace dtensor::collectives
