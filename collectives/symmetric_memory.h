#pragma once
// Symmetric memory on one host: tensors that every rank of a group can address directly, after
// PyTorch's torch.distributed._symmetric_memory (its C++ SymmetricMemory), written for POSIX
// shared memory between the processes (or threads) of one host.
//
// NOTE [symmetric memory]
// symmetric_empty() allocates a tensor in a shared-memory segment of this rank's own (named
// "/dtensor-<job tag>-sym<pid>-<n>", mode 0600, reserved up front like the shm backend's, so a
// full /dev/shm is an error at allocation, never a SIGBUS later). rendezvous(t, group) is a
// collective on `group`: the ranks all_gather their segments' names and sizes over the group's
// own backend, each maps every peer's segment (a barrier ends it, so no rank frees its tensor
// before every peer has mapped it), and the rank that completes a segment's attach
// count unlinks its name: from then on the memory lives exactly as long as the mappings, so no
// crash after rendezvous leaves anything in /dev/shm (NOTE [shm segment lifetime] holds as for
// the shm backend's segments; a rank that dies between symmetric_empty and rendezvous leaves its
// own segment, which reclaim_stale_segments and `./x clean` remove since its creator is dead).
// Every rank must allocate the same number of bytes (as PyTorch requires); a mismatch fails
// rendezvous on every rank with the sizes by rank. A tensor is rendezvoused on one group;
// rendezvous again on that group returns the same handle.
//
// A handle gives buffer_ptr(peer) / buffer_of(peer) (the peer's tensor, mapped here) and signal
// pads: put_signal / wait_signal are point-to-point flags in the receiver's pad (one per channel
// and sender), barrier() is a put and a wait with every peer; none goes through a store. Every
// wait is bounded by the group's timeout; a rank that gives up marks every peer's segment broken,
// so the peers' waits fail at once with its message (the group, its ranks, the rank waited for).
//
// The shm backend recognises symmetric tensors (find_symmetric) and runs its collectives on them
// without staging copies (NOTE [symmetric collectives] in shm_backend.cc).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/shm_segment.h"

namespace dtensor::collectives {

namespace symmetric {
struct Allocation;  // one rank's segment (symmetric_memory.cc)

// CUDA symmetric memory: the data is device memory each peer opens by IPC handle; the signal
// pads stay in the rank's shared-memory segment (host flags). symmetric_memory_cuda.cc (built
// with --config=cuda) installs these at load; without them CUDA allocations are refused.
// Host flags are not ordered after device work, so on CUDA put_signal (and barrier) first waits
// for the device to finish what this rank queued: a peer woken by the signal then reads what was
// written before it, as PyTorch's stream-ordered signals guarantee (found on the first GPU run:
// a peer read a buffer whose host-to-device copy was still in flight).
constexpr size_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t
struct DeviceHooks {
  void* (*alloc)(size_t bytes, int device) = nullptr;
  void (*free)(void* ptr, int device) = nullptr;
  void (*export_handle)(void* ptr, char* handle) = nullptr;        // kIpcHandleBytes
  void* (*open_handle)(const char* handle, int device) = nullptr;  // a peer's buffer
  void (*close_handle)(void* ptr, int device) = nullptr;
  void (*synchronize)(int device) = nullptr;  // waits for the device's queued work
};
void set_device_hooks(const DeviceHooks& hooks);
// The installed hooks (all null in a build without CUDA); the cuda_ipc backend uses them too.
DeviceHooks& device_hooks();
}  // namespace symmetric

class SymmetricMemory {
 public:
  static constexpr int kChannels = 32;   // signal channels per pad
  static constexpr int kMaxRanks = 256;  // ranks a pad has slots for

  SymmetricMemory(const std::shared_ptr<symmetric::Allocation>& own, std::vector<ShmSegment> peers,
                  std::vector<char*> device_data, std::vector<int64_t> ranks, int64_t group_rank,
                  std::string group, int64_t id, std::chrono::milliseconds timeout);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  int64_t rank() const { return rank_; }  // group rank
  int64_t world_size() const { return static_cast<int64_t>(ranks_.size()); }
  const std::vector<int64_t>& ranks() const { return ranks_; }  // global ranks by group rank
  const std::string& group() const { return group_; }
  // The rendezvous' number on its group in this rank (1, 2, ...): equal on every rank for the same
  // rendezvous, since rendezvous is a collective on the group.
  int64_t id() const { return id_; }
  size_t buffer_bytes() const { return bytes_; }
  char* buffer_ptr(int64_t peer) const;
  // The peer's buffer as a tensor (mapped in this process): the whole buffer as `dtype` from
  // `storage_offset` elements on, viewed as `sizes`. throws dtensor::Error when it does not fit.
  at::Tensor buffer_of(int64_t peer, at::IntArrayRef sizes, c10::ScalarType dtype,
                       int64_t storage_offset = 0) const;

  // Sets this rank's flag on `channel` in peer's pad, once the peer consumed the previous one.
  void put_signal(int64_t peer, int channel);
  // Waits for peer's flag on `channel` in this rank's pad and consumes it.
  void wait_signal(int64_t peer, int channel);
  // put_signal to every peer, then wait_signal from every peer.
  void barrier(int channel = 0);

 private:
  std::atomic<uint32_t>& slot(int64_t owner, int channel, int64_t sender) const;
  shm::Header& header(int64_t r) const;
  void wait_for(std::atomic<uint32_t>& flag, uint32_t from, uint32_t to, const char* what,
                int64_t peer);
  void check_peer(int64_t peer, const char* what) const;

  std::weak_ptr<symmetric::Allocation> own_;  // which owns this handle
  std::vector<ShmSegment> peers_;             // by group rank; this rank's is empty (own_ maps it)
  c10::Device device_;                        // of the buffers (CPU, or the CUDA device)
  std::vector<char*> bases_;                  // segment start by group rank (header, signal pad)
  std::vector<char*> data_;  // buffer start by group rank (CUDA: opened IPC handles)
  std::vector<int64_t> ranks_;
  int64_t rank_;
  std::string group_;
  int64_t id_;
  size_t bytes_;
  std::chrono::milliseconds timeout_;
};

// A tensor of `sizes` and `dtype` in symmetric memory (contiguous, uninitialised) on `device`
// (CPU, or CUDA in a --config=cuda build). Needs the calling thread's rank context (its job names
// the segment).
at::Tensor symmetric_empty(at::IntArrayRef sizes, c10::ScalarType dtype,
                           c10::Device device = c10::kCPU);
// Whether `t`'s data lies in memory from symmetric_empty.
bool is_symmetric(const at::Tensor& t);
// Collective on `group`: maps every peer's buffer of the tensors the ranks pass (each allocated by
// symmetric_empty with the same number of bytes). Returns the handle (the same one again for the
// same tensor and group).
std::shared_ptr<SymmetricMemory> rendezvous(const at::Tensor& t, const std::string& group);

// The handle of `group` whose buffer on this rank holds bytes [ptr, ptr + bytes), and where they
// start in it; nullopt when they are not in memory rendezvoused on that group.
struct SymmetricView {
  std::shared_ptr<SymmetricMemory> mem;
  size_t offset = 0;
};
std::optional<SymmetricView> find_symmetric(const void* ptr, size_t bytes,
                                            const std::string& group);

// How many collectives this process has run on symmetric memory without staging (NOTE [symmetric
// collectives]): tests and benchmarks check that a call took that path.
int64_t symmetric_collectives_run();
void count_symmetric_collective();

}  // namespace dtensor::collectives
