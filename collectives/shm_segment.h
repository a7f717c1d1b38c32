#pragma once
// The shared-memory segment of the shm backend (shm_backend.cc): its name, its layout, how ranks
// wait on it, and ShmSegment, RAII over one named POSIX shared-memory segment (shm_open + mmap).

#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dtensor::collectives {

// The segment name of one group of one job: "/dtensor-<fnv1a(job)>-<fnv1a(group)>" (16 hex digits
// each). Equal in every process of the job, distinct across groups and (up to 64-bit hash
// collisions) across jobs.
std::string shm_segment_name(const std::string& job, const std::string& group);
// The job's part of every segment name of that job (16 hex digits): tests look for leftovers by it.
std::string shm_job_tag(const std::string& job);

namespace shm {

// NOTE [shm segment layout]
// One segment per (job, group), named by shm_segment_name(). It holds:
//   Header                    page 0: layout facts, attach count, the "broken" message
//   Ctrl slot per group rank  128-byte aligned: step counters, call descriptors and splits
//   data area per group rank  page aligned: two buffers of Header::half_bytes each
// Every rank writes only its own slot and its own data area; the others only read them. Step t
// of the group uses buffer and descriptor parity t & 1 (double buffering): a rank may start
// writing step t once every rank has finished reading step t - 2, so writing the next chunk
// overlaps the peers' reading of the previous one. Counters are lock-free atomics, which are
// address-free and therefore valid across processes.
constexpr uint64_t kMagic = 0x33306d6873746e64ull;  // "dtnshm03" (tools/shm_clean.py: MAGIC)
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct Header {
  std::atomic<uint64_t> magic{0};  // kMagic once the creator has initialised everything
  uint64_t total_bytes = 0;
  uint64_t half_bytes = 0;  // one data buffer of one rank (a multiple of 64 bytes)
  int64_t group_size = 0;
  int64_t creator_pid = 0;
  std::atomic<uint32_t> attached{0};  // ranks that have mapped the segment
  std::atomic<uint32_t> broken{0};    // 0: fine; 1: a rank is writing `why`; 2: `why` is final
  char why[2048] = {};
};

// A call as plain data. Splits follow the Ctrl struct: [parity][input, output][group size].
struct Desc {
  int32_t kind = 0, dtype = -1, op = 0;
  int32_t n_in = 0, n_out = 0;  // number of input / output splits (0 or the group size)
  int32_t cma = 0;              // 1: peers read `input` directly, no data was posted (see
                                // NOTE [shm cross memory attach] in shm_communicator.h)
  int32_t sym = 0;              // 1: input / output are symmetric as below, no data was posted
                                // (NOTE [symmetric collectives] in shm_backend.cc)
  int64_t sym_in = -1, sym_out = -1;       // SymmetricMemory::id of the input's / output's memory
  uint64_t sym_in_at = 0, sym_out_at = 0;  // their byte offsets in this rank's buffer
  int64_t src = 0, numel = 0;
  uint64_t input = 0;    // cma: the address of the input's data in the rank's process (Ctrl::pid)
  uint64_t seq = 0;      // CollectiveCall::seq
  char thread[32] = {};  // CollectiveCall::thread, NUL-terminated (NOTE [issuing thread])
  uint64_t thread_seq = 0;
  uint64_t program_ops = 0, program = 0;  // CollectiveCall::program_ops, program
  char purpose[48] = {};                  // CollectiveCall::purpose, NUL-terminated (kPurposeBytes)
};

struct alignas(64) Ctrl {
  std::atomic<uint64_t> posted{0};    // last step whose chunk this rank has written
  std::atomic<uint64_t> consumed{0};  // last step whose peers' chunks this rank has read
  int64_t pid = 0;                    // this rank's process and the address of kProbeWord in it:
  uint64_t probe = 0;                 // peers probe cross memory attach on it (set before step 1)
  Desc desc[2];                       // by step parity
};

// The word peers read from a rank's process to check that cross memory attach works.
constexpr uint64_t kProbeWord = 0x65626f72706d6d63ull;  // "cmmprobe"

// Copies `bytes` bytes at `remote` in process `pid` to `local` with process_vm_readv (Linux
// Cross Memory Attach). Returns 0, or the errno of the failure (a short read is EFAULT).
int read_process(int64_t pid, uint64_t remote, void* local, size_t bytes);

// Whether DTENSOR_SHM_CMA asks for cross memory attach ("1"; unset or "0": off, see NOTE [shm
// cross memory attach] in shm_backend.cc).
// throws dtensor::Error on another value.
bool cma_enabled();

struct Layout {
  size_t ctrl_offset, ctrl_stride, data_offset, data_stride, total;
};
Layout layout_for(int64_t group_size, size_t half_bytes);

// One data buffer's size: half of DTENSOR_SHM_BUFFER_BYTES (the data area of one rank; small
// values make tests cross many chunk boundaries) or of 1 MiB, rounded down to 64 bytes so that
// every element size divides it. throws dtensor::Error on a malformed value.
size_t half_buffer_bytes();

// Calls on symmetric memory smaller than this (in the input's or output's bytes) go through the
// buffers all the same: a copy into the buffer costs less than the extra round a zero-copy call
// needs before it may return (NOTE [symmetric collectives]). DTENSOR_SHM_SYMMETRIC_MIN_BYTES sets
// it (tests: 0). throws dtensor::Error on a malformed value.
constexpr size_t kDefaultSymmetricMinBytes = size_t{64} << 10;
size_t symmetric_min_bytes();

// Whether a process with this id exists (a segment whose creator is gone is a leftover).
bool process_alive(int64_t pid);

// Removes every leftover segment of any dtensor job from /dev/shm: its creator is dead, or its
// header was never finished and it is over a minute old (NOTE [stale segments] in
// tools/shm_clean.py, which ./x clean runs). A live job's segments are never touched. Returns
// how many were removed. The first segment a process creates runs it once.
int reclaim_stale_segments(const char* dir = "/dev/shm");

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

enum class Wait { kReady, kBroken, kTimeout };

// How long a waiter yields before it sleeps (wait_until). Yielding lets a peer that needs this
// core run, which matters when the group has more ranks than the machine has cores (4 ranks on 2:
// a 1 MiB all_reduce took 484 us with 100 us of yielding, 366 us with 1 ms); but a yielding thread
// stays runnable and takes CPU from compute it overlaps with (a matmul beside async collectives
// on 2 ranks, 2 cores: slowed 27% with 1 ms of yielding, 13-18% with 100 us). So: 1 ms when the
// group outnumbers the cores, 100 us otherwise. A local choice: it shapes no communication.
inline std::chrono::microseconds yield_budget(int64_t group_size) {
  static const auto cores = static_cast<int64_t>(std::thread::hardware_concurrency());  // a syscall
  return std::chrono::microseconds(cores > 0 && group_size > cores ? 1000 : 100);
}

// Waits until ready() holds, the group is marked broken, or the deadline passes. A peer running
// on another core answers within a microsecond or two, so spin first (~20 us); then yield for
// `yield_for` (yield_budget), since the peer we wait for may need this core and a yield costs
// nothing when no one else wants it; then nap with growing sleeps (10 us to 100 us) so that long
// waits cost no CPU.
// poll() runs about every poll_every while waiting (it may throw: NOTE [interrupts] in
// collectives/communicator.h).
template <class Ready, class Poll>
Wait wait_until(Ready&& ready, const std::atomic<uint32_t>& broken,
                std::chrono::steady_clock::time_point deadline, Poll&& poll,
                std::chrono::milliseconds poll_every, std::chrono::microseconds yield_for) {
  constexpr auto kSpinFor = std::chrono::microseconds(20);
  for (int i = 0; i < 64; ++i) {  // the common case: the peers are (almost) there
    if (ready()) return Wait::kReady;
    cpu_relax();
  }
  const auto start = std::chrono::steady_clock::now();
  auto next_poll = start + poll_every;
  long nap_ns = 10000;
  for (;;) {
    if (ready()) return Wait::kReady;
    if (broken.load(std::memory_order_acquire) != 0) return Wait::kBroken;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return ready() ? Wait::kReady : Wait::kTimeout;
    if (now >= next_poll) {
      poll();
      next_poll = now + poll_every;
    }
    if (now - start < kSpinFor) {
      for (int k = 0; k < 16; ++k) cpu_relax();
    } else if (now - start < yield_for) {
      std::this_thread::yield();
    } else {
      timespec ts{0, nap_ns};
      ::nanosleep(&ts, nullptr);
      nap_ns = std::min(nap_ns * 2, 100000L);
    }
  }
}

}  // namespace shm

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates `name` exclusively (O_CREAT | O_EXCL, mode 0600) with `bytes` bytes reserved up front
  // (posix_fallocate, so a full /dev/shm is an error here rather than a SIGBUS later) and maps
  // it. Returns an invalid segment when the name exists already; throws std::system_error on
  // other failures.
  static ShmSegment create(const std::string& name, size_t bytes);
  // Opens an existing segment and maps all of it. Returns an invalid segment when the name does
  // not exist or is still smaller than `min_bytes` (its creator is sizing it).
  static ShmSegment open(const std::string& name, size_t min_bytes);

  bool valid() const { return base_ != nullptr; }
  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // Maps every page now rather than on first touch: on this VM a first-touch fault costs ~12 us
  // per page, several times more than populating (4 MiB: ~14 ms of faults against ~4 ms).
  void populate();

  // Unlinks the name if it still refers to this segment (not to a newer segment of the same
  // name). The mapping stays valid; the memory goes away with the last mapping.
  void unlink_if_current();

 private:
  void reset();
  // Wraps a fresh mapping of `bytes` at `base` of the file `st` describes.
  static ShmSegment adopt(const std::string& name, void* base, size_t bytes, const struct stat& st);

  std::string name_;
  void* base_ = nullptr;
  size_t size_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace dtensor::collectives
