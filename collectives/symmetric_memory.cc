#include "collectives/symmetric_memory.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <system_error>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/error.h"
#include "collectives/communicator.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::collectives {
namespace symmetric {

// A segment: the shm backend's Header (page 0: magic, sizes, creator, attach count, "broken"),
// the signal pad (uint32 flags [channel][sender]), then the data, page aligned.
constexpr size_t kPage = 4096;
constexpr size_t kPadOffset = kPage;
constexpr size_t kPadBytes =
    sizeof(uint32_t) * SymmetricMemory::kChannels * SymmetricMemory::kMaxRanks;
constexpr size_t kDataOffset = kPadOffset + (kPadBytes + kPage - 1) / kPage * kPage;
static_assert(sizeof(shm::Header) <= kPadOffset);

// Owns its handle once rendezvoused: a handle given out shares ownership of the allocation (an
// aliasing shared_ptr), so either keeps both alive and neither makes a cycle.
struct Allocation {
  ShmSegment seg;
  size_t bytes = 0;                         // of data
  std::unique_ptr<SymmetricMemory> handle;  // set by rendezvous, under g_mu
  c10::Device device = c10::kCPU;
  char* device_data = nullptr;  // CUDA: the data, from DeviceHooks::alloc (the segment has none)
  char* data() const { return device_data != nullptr ? device_data : seg.data() + kDataOffset; }
  // Serialises rendezvous of this allocation (a collective: held across it).
  absl::Mutex rendezvous_mu;
  ~Allocation();
};

namespace {

// What find_symmetric reads, guarded by g_mu (never by an allocation's own lock, which a
// rendezvous holds across a collective).
struct Entry {
  uintptr_t begin = 0, end = 0;
  std::weak_ptr<Allocation> alloc;
  std::string group;  // "" until rendezvoused
};

ABSL_CONST_INIT absl::Mutex g_mu(absl::kConstInit);
std::map<uintptr_t, Entry>& entries() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  static auto* m = new std::map<uintptr_t, Entry>();
  return *m;
}
// Rendezvous per (job, group, global rank): each rank's count of them (SymmetricMemory::id).
absl::flat_hash_map<std::string, int64_t>& rendezvous_counts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  static auto* m = new absl::flat_hash_map<std::string, int64_t>();
  return *m;
}
std::atomic<int64_t> g_live{0};  // allocations alive: find_symmetric is free when none is

// The record each rank contributes to rendezvous' all_gather.
struct Record {
  char name[96] = {};
  uint64_t bytes = 0;
  uint64_t total = 0;
  int64_t pid = 0;
  int64_t device = -1;  // CUDA device index, -1: CPU
  char ipc[kIpcHandleBytes] = {};
  char unused[64] = {};
};
static_assert(sizeof(Record) == 256);

Entry* entry_of(const void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto& m = entries();
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  return p < it->second.end ? &it->second : nullptr;
}

}  // namespace

DeviceHooks& device_hooks() {
  static DeviceHooks hooks;
  return hooks;
}

Allocation::~Allocation() {
  seg.unlink_if_current();  // never rendezvoused (or a peer never attached): the name goes now
  {
    absl::MutexLock lock(&g_mu);
    entries().erase(reinterpret_cast<uintptr_t>(data()));
  }
  handle.reset();  // closes the peers' device buffers before this one goes
  if (device_data != nullptr) device_hooks().free(device_data, device.index());
  g_live.fetch_sub(1, std::memory_order_relaxed);
}

void set_device_hooks(const DeviceHooks& hooks) { device_hooks() = hooks; }

}  // namespace symmetric

using symmetric::Allocation;
using symmetric::kDataOffset;
using symmetric::kPadOffset;

at::Tensor symmetric_empty(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
  RankContext& ctx = current_context();
  DTENSOR_CHECK(device.is_cpu() || (device.is_cuda() && symmetric::device_hooks().alloc),
                "symmetric_empty on ", device.str(),
                ": this build has no CUDA symmetric memory (build with --config=cuda)");
  int64_t numel = 1;
  for (int64_t s : sizes) {
    DTENSOR_CHECK(s >= 0, "symmetric_empty: negative size in ", sizes);
    numel *= s;
  }
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  // On CUDA the segment holds the header and the signal pads; the data is device memory.
  const size_t data_pages =
      device.is_cpu() ? std::max<size_t>(1, (bytes + symmetric::kPage - 1) / symmetric::kPage) : 0;
  const size_t total = kDataOffset + data_pages * symmetric::kPage;
  static std::once_flag reclaimed;  // leftovers of killed jobs (NOTE [stale segments])
  std::call_once(reclaimed, [] { shm::reclaim_stale_segments(); });
  static std::atomic<uint64_t> counter{0};
  auto alloc = std::make_shared<Allocation>();
  for (;;) {
    const std::string name = absl::StrFormat("/dtensor-%s-sym%x-%d", shm_job_tag(ctx.job()),
                                             ::getpid(), counter.fetch_add(1) + 1);
    try {
      alloc->seg = ShmSegment::create(name, total);
    } catch (const std::system_error& e) {
      throw Error(absl::StrCat("symmetric_empty of ", bytes, " bytes: ", e.what()));
    }
    if (alloc->seg.valid()) break;  // else the name is taken (a leftover): the next one
  }
  symmetric::g_live.fetch_add(1, std::memory_order_relaxed);
  alloc->seg.populate();
  alloc->bytes = bytes;
  alloc->device = device;
  if (device.is_cuda()) {
    alloc->device_data = static_cast<char*>(
        symmetric::device_hooks().alloc(std::max<size_t>(bytes, 1), device.index()));
  }
  auto* h = new (alloc->seg.data()) shm::Header();
  h->total_bytes = total;
  h->half_bytes = bytes;
  h->creator_pid = ::getpid();
  h->attached.store(1, std::memory_order_relaxed);  // the creator
  h->magic.store(shm::kMagic, std::memory_order_release);
  {
    absl::MutexLock lock(&symmetric::g_mu);
    symmetric::Entry& e = symmetric::entries()[reinterpret_cast<uintptr_t>(alloc->data())];
    e.begin = reinterpret_cast<uintptr_t>(alloc->data());
    e.end = e.begin + std::max<size_t>(bytes, 1);
    e.alloc = alloc;
  }
  char* data = alloc->data();
  return at::from_blob(
      data, sizes, [alloc](void*) mutable { alloc.reset(); },
      at::TensorOptions().dtype(dtype).device(device));
}

namespace {
// Where t's memory starts: its storage's data (a tensor with no elements has no data_ptr()).
const void* storage_start(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.storage().data() : nullptr;
}
}  // namespace

bool is_symmetric(const at::Tensor& t) {
  if (storage_start(t) == nullptr || symmetric::g_live.load(std::memory_order_relaxed) == 0) {
    return false;
  }
  absl::MutexLock lock(&symmetric::g_mu);
  return symmetric::entry_of(storage_start(t)) != nullptr;
}

std::shared_ptr<SymmetricMemory> rendezvous(const at::Tensor& t, const std::string& group) {
  const std::string what = "symmetric memory rendezvous on group '" + group + "'";
  std::shared_ptr<Allocation> alloc;
  {
    absl::MutexLock lock(&symmetric::g_mu);
    symmetric::Entry* e =
        storage_start(t) != nullptr ? symmetric::entry_of(storage_start(t)) : nullptr;
    if (e != nullptr) alloc = e->alloc.lock();
  }
  DTENSOR_CHECK(alloc != nullptr, what, ": the tensor was not allocated by symmetric_empty");
  absl::MutexLock rendezvous_lock(&alloc->rendezvous_mu);
  {
    absl::MutexLock lock(&symmetric::g_mu);
    symmetric::Entry* e = symmetric::entry_of(alloc->data());
    if (e != nullptr && !e->group.empty()) {
      DTENSOR_CHECK(e->group == group, what, ": the tensor is rendezvoused on group '", e->group,
                    "' already (one group per allocation)");
      if (alloc->handle) return std::shared_ptr<SymmetricMemory>(alloc, alloc->handle.get());
    }
  }
  RankContext& ctx = current_context();
  const GroupInfo& info = ctx.group(group);
  const int64_t n = static_cast<int64_t>(info.ranks.size());
  const auto me_it = std::find(info.ranks.begin(), info.ranks.end(), ctx.rank());
  DTENSOR_CHECK(me_it != info.ranks.end(), what, ": global rank ", ctx.rank(), " is not a member");
  DTENSOR_CHECK(n <= SymmetricMemory::kMaxRanks, what, ": ", n, " ranks, at most ",
                SymmetricMemory::kMaxRanks);
  const int64_t me = me_it - info.ranks.begin();
  const auto* own_header = reinterpret_cast<const shm::Header*>(alloc->seg.data());

  symmetric::Record mine;
  std::memcpy(mine.name, alloc->seg.name().data(),
              std::min(alloc->seg.name().size(), sizeof(mine.name) - 1));
  mine.bytes = alloc->bytes;
  mine.total = own_header->total_bytes;
  mine.pid = ::getpid();
  const bool cuda = alloc->device_data != nullptr;
  if (cuda) {
    mine.device = alloc->device.index();
    symmetric::device_hooks().export_handle(alloc->device_data, mine.ipc);
  }
  const at::Tensor rec = at::empty({static_cast<int64_t>(sizeof(mine))}, at::kByte);
  std::memcpy(rec.data_ptr(), &mine, sizeof(mine));
  // Over the group's own backend: on nccl the record travels on the device.
  const bool on_device = cuda && info.backend == "nccl";
  const at::Tensor all =
      all_gather_into_tensor(on_device ? rec.to(alloc->device) : rec, 0, group).cpu().contiguous();
  std::vector<symmetric::Record> recs(n);
  std::memcpy(recs.data(), all.data_ptr(), sizeof(mine) * n);
  bool same = true;
  for (const auto& r : recs) same = same && r.bytes == mine.bytes;
  if (!same) {
    std::vector<std::string> sizes;
    for (int64_t r = 0; r < n; ++r) {
      sizes.push_back(absl::StrCat("global rank ", info.ranks[r], ": ", recs[r].bytes));
    }
    throw Error(absl::StrCat(what, ": the ranks allocated different sizes (bytes by rank: ",
                             absl::StrJoin(sizes, ", "), "); every rank must allocate the same"));
  }
  std::vector<ShmSegment> peers(n);
  for (int64_t r = 0; r < n; ++r) {
    if (r == me) continue;
    recs[r].name[sizeof(recs[r].name) - 1] = '\0';
    try {
      peers[r] = ShmSegment::open(recs[r].name, recs[r].total);
    } catch (const std::system_error& e) {
      throw CollectiveError(absl::StrCat(what, ": mapping the buffer of global rank ",
                                         info.ranks[r], ": ", e.what()));
    }
    const auto* h =
        peers[r].valid() ? reinterpret_cast<const shm::Header*>(peers[r].data()) : nullptr;
    if (h == nullptr || h->magic.load(std::memory_order_acquire) != shm::kMagic) {
      throw CollectiveError(absl::StrCat(what, ": the buffer of global rank ", info.ranks[r],
                                         " (process ", recs[r].pid, ", '", recs[r].name,
                                         "') is gone: did that rank exit or free it?"));
    }
  }
  // Count this rank in every peer's attach count; whoever completes a count unlinks that name.
  for (int64_t r = 0; r < n; ++r) {
    if (r == me) continue;
    auto* h = reinterpret_cast<shm::Header*>(peers[r].data());
    if (h->attached.fetch_add(1, std::memory_order_acq_rel) + 1 == n) peers[r].unlink_if_current();
  }
  if (n == 1) alloc->seg.unlink_if_current();
  // No rank returns (and may free its tensor) before every peer has mapped its segment.
  barrier(group);
  int64_t id;
  {
    absl::MutexLock lock(&symmetric::g_mu);
    id = ++symmetric::rendezvous_counts()[absl::StrCat(ctx.job(), "\n", group, "\n", ctx.rank())];
  }
  std::vector<char*> device_data(n, nullptr);  // CUDA: the peers' buffers, opened by IPC handle
  if (cuda) {
    for (int64_t r = 0; r < n; ++r) {
      device_data[r] = r == me ? alloc->device_data
                               : static_cast<char*>(symmetric::device_hooks().open_handle(
                                     recs[r].ipc, alloc->device.index()));
    }
  }
  auto handle = std::make_unique<SymmetricMemory>(alloc, std::move(peers), std::move(device_data),
                                                  info.ranks, me, group, id, ctx.timeout());
  SymmetricMemory* raw = handle.get();
  {
    absl::MutexLock lock(&symmetric::g_mu);
    alloc->handle = std::move(handle);
    symmetric::Entry* e = symmetric::entry_of(alloc->data());
    if (e != nullptr) e->group = group;
  }
  return std::shared_ptr<SymmetricMemory>(alloc, raw);
}

namespace {
std::atomic<int64_t> g_symmetric_collectives{0};
}
int64_t symmetric_collectives_run() { return g_symmetric_collectives.load(); }
void count_symmetric_collective() { g_symmetric_collectives.fetch_add(1); }

std::optional<SymmetricView> find_symmetric(const void* ptr, size_t bytes,
                                            const std::string& group) {
  if (symmetric::g_live.load(std::memory_order_relaxed) == 0 || ptr == nullptr) return {};
  absl::MutexLock lock(&symmetric::g_mu);
  symmetric::Entry* e = symmetric::entry_of(ptr);
  if (e == nullptr || e->group != group) return {};
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (p + bytes > e->end && bytes > 0) return {};
  auto alloc = e->alloc.lock();
  if (!alloc || !alloc->handle) return {};
  return SymmetricView{std::shared_ptr<SymmetricMemory>(alloc, alloc->handle.get()),
                       static_cast<size_t>(p - e->begin)};
}

SymmetricMemory::SymmetricMemory(const std::shared_ptr<Allocation>& own,
                                 std::vector<ShmSegment> peers, std::vector<char*> device_data,
                                 std::vector<int64_t> ranks, int64_t group_rank, std::string group,
                                 int64_t id, std::chrono::milliseconds timeout)
    : own_(own),
      peers_(std::move(peers)),
      device_(own->device),
      ranks_(std::move(ranks)),
      rank_(group_rank),
      group_(std::move(group)),
      id_(id),
      bytes_(own->bytes),
      timeout_(timeout) {
  bases_.resize(ranks_.size());
  data_.resize(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    bases_[r] = static_cast<int64_t>(r) == rank_ ? own->seg.data() : peers_[r].data();
    data_[r] = device_.is_cuda() ? device_data[r] : bases_[r] + kDataOffset;
  }
}

SymmetricMemory::~SymmetricMemory() {
  if (!device_.is_cuda()) return;
  for (int64_t r = 0; r < world_size(); ++r) {
    if (r != rank_) symmetric::device_hooks().close_handle(data_[r], device_.index());
  }
}

void SymmetricMemory::check_peer(int64_t peer, const char* what) const {
  DTENSOR_CHECK(peer >= 0 && peer < world_size(), "symmetric memory ", what, " on group '", group_,
                "': peer ", peer, " is not a group rank (0..", world_size() - 1, ")");
}

char* SymmetricMemory::buffer_ptr(int64_t peer) const {
  check_peer(peer, "buffer_ptr");
  return data_[peer];
}

at::Tensor SymmetricMemory::buffer_of(int64_t peer, at::IntArrayRef sizes, c10::ScalarType dtype,
                                      int64_t storage_offset) const {
  check_peer(peer, "buffer_of");
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t esz = c10::elementSize(dtype);
  DTENSOR_CHECK(storage_offset >= 0 && numel >= 0 &&
                    static_cast<size_t>(storage_offset + numel) * esz <= bytes_,
                "symmetric memory buffer_of on group '", group_, "': ", numel, " elements of ", esz,
                " bytes from element ", storage_offset, " do not fit its ", bytes_, " bytes");
  // The view keeps the mappings alive (a peer's mapping belongs to this handle).
  return at::from_blob(
      buffer_ptr(peer) + storage_offset * esz, sizes, [keep = own_.lock()](void*) {},
      at::TensorOptions().dtype(dtype).device(device_));
}

shm::Header& SymmetricMemory::header(int64_t r) const {
  return *reinterpret_cast<shm::Header*>(bases_[r]);
}

std::atomic<uint32_t>& SymmetricMemory::slot(int64_t owner, int channel, int64_t sender) const {
  auto* pad = reinterpret_cast<std::atomic<uint32_t>*>(bases_[owner] + kPadOffset);
  return pad[channel * kMaxRanks + sender];
}

void SymmetricMemory::put_signal(int64_t peer, int channel) {
  check_peer(peer, "put_signal");
  DTENSOR_CHECK(channel >= 0 && channel < kChannels, "symmetric memory put_signal: channel ",
                channel, " is not in [0, ", kChannels, ")");
  // Device writes before the signal must land before a peer acts on it (NOTE [symmetric memory]).
  if (device_.is_cuda()) symmetric::device_hooks().synchronize(device_.index());
  wait_for(slot(peer, channel, rank_), 0, 1, "put_signal", peer);
}

void SymmetricMemory::wait_signal(int64_t peer, int channel) {
  check_peer(peer, "wait_signal");
  DTENSOR_CHECK(channel >= 0 && channel < kChannels, "symmetric memory wait_signal: channel ",
                channel, " is not in [0, ", kChannels, ")");
  wait_for(slot(rank_, channel, peer), 1, 0, "wait_signal", peer);
}

void SymmetricMemory::barrier(int channel) {
  for (int64_t k = 1; k < world_size(); ++k) put_signal((rank_ + k) % world_size(), channel);
  for (int64_t k = 1; k < world_size(); ++k) wait_signal((rank_ + k) % world_size(), channel);
}

// Moves `flag` from `from` to `to` once it holds `from`; fails naming the peer after the timeout
// and marks every rank's segment broken so that their waits fail at once too.
void SymmetricMemory::wait_for(std::atomic<uint32_t>& flag, uint32_t from, uint32_t to,
                               const char* what, int64_t peer) {
  const auto start = std::chrono::steady_clock::now();
  const auto ready = [&] {
    uint32_t expected = from;
    return flag.compare_exchange_strong(expected, to, std::memory_order_acq_rel);
  };
  shm::Header& mine = header(rank_);
  switch (shm::wait_until(
      ready, mine.broken, start + timeout_, [] { check_interrupt(); }, kInterruptPoll,
      shm::yield_budget(world_size()))) {
    case shm::Wait::kReady:
      return;
    case shm::Wait::kBroken: {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (mine.broken.load(std::memory_order_acquire) == 1 &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      throw CollectiveError(mine.broken.load(std::memory_order_acquire) == 2
                                ? std::string(mine.why)
                                : "symmetric memory on group '" + group_ + "' was broken");
    }
    case shm::Wait::kTimeout:
      break;
  }
  const std::string msg = absl::StrCat(
      "symmetric memory ", what, " on group '", group_, "' (ranks [", absl::StrJoin(ranks_, ","),
      "]): global rank ", ranks_[peer], " did not answer within the timeout of ", timeout_.count(),
      " ms (global rank ", ranks_[rank_], " waited)");
  for (int64_t r = 0; r < world_size(); ++r) {
    shm::Header& h = header(r);
    uint32_t expected = 0;
    if (h.broken.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      const size_t len = std::min(msg.size(), sizeof(h.why) - 1);
      std::memcpy(h.why, msg.data(), len);
      h.why[len] = '\0';
      h.broken.store(2, std::memory_order_release);
    }
  }
  throw CollectiveError(msg);
}

}  // namespace dtensor::collectives
