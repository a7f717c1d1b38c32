// The "shm" backend: the ranks of a group are processes on one host (or threads; it does not
// care) exchanging data through one POSIX shared-memory segment per group. It keeps the threads
// backend's semantics exactly (threads_backend.cc): the same per-kind results, the same fold
// order for reductions, the same mismatch and timeout messages (with "shm" for "threads").
//
// A collective is a sequence of steps (rounds). In each step every rank copies the next chunk of
// its input into its own data buffer, publishes the step number, waits until every rank has
// published it, then produces its part of the output by reading the peers' buffers directly, and
// finally publishes that it has finished reading. The first step of a collective also carries a
// descriptor of the call, which every rank checks against the others' (mismatched calls fail on
// every rank). Messages of any size pass through the fixed-size buffers chunk by chunk.

#include <ATen/ATen.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/shm_segment.h"
#include "dtensor/strings.h"

namespace dtensor::collectives {
namespace {

using Clock = std::chrono::steady_clock;

using shm::Ctrl;
using shm::Desc;
using shm::Header;
using shm::Layout;
using shm::layout_for;
using shm::Wait;

int64_t offset_of(const std::vector<int64_t>& splits, int64_t r) {
  int64_t off = 0;
  for (int64_t i = 0; i < r; ++i) off += splits[i];
  return off;
}

// A rank's call as every rank sees it (copied out of shared memory during the first step, since
// the slot may be rewritten while later steps of the call are still running).
struct Snap {
  Desc d;
  std::vector<int64_t> in, out;
};

// Rank r's share of the data of a call: what it streams through its buffer.
int64_t payload_of(const Desc& d, int64_t r) {
  switch (static_cast<CollectiveKind>(d.kind)) {
    case CollectiveKind::kBroadcast:
      return r == d.src ? d.numel : 0;
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return d.numel;
  }
}

std::string dtype_name(int32_t dtype) {
  return dtype < 0 ? "none" : c10::toString(static_cast<c10::ScalarType>(dtype));
}

// Describes how the ranks' calls disagree, or returns "" when they agree. The same checks and
// wording as the threads backend's mismatch().
std::string mismatch(const std::vector<Snap>& calls) {
  const Snap& a = calls[0];
  const auto kind_of = [](const Snap& s) { return static_cast<CollectiveKind>(s.d.kind); };
  for (size_t r = 1; r < calls.size(); ++r) {
    const Snap& b = calls[r];
    auto diff = [&](const std::string& what, const std::string& x, const std::string& y) {
      return what + " differs: rank 0 has " + x + ", group rank " + std::to_string(r) + " has " + y;
    };
    if (a.d.kind != b.d.kind)
      return diff("collective", collective_name(kind_of(a)), collective_name(kind_of(b)));
    if (kind_of(a) == CollectiveKind::kBarrier) continue;
    if (a.d.dtype != b.d.dtype) return diff("dtype", dtype_name(a.d.dtype), dtype_name(b.d.dtype));
    if (a.d.op != b.d.op) {
      return diff("reduce op", std::string(reduce_op_name(static_cast<ReduceOp>(a.d.op))),
                  std::string(reduce_op_name(static_cast<ReduceOp>(b.d.op))));
    }
    if (a.d.src != b.d.src)
      return diff("broadcast source", std::to_string(a.d.src), std::to_string(b.d.src));
    const bool same_numel = kind_of(a) == CollectiveKind::kAllReduce ||
                            kind_of(a) == CollectiveKind::kBroadcast ||
                            kind_of(a) == CollectiveKind::kReduceScatter;
    if (same_numel && a.d.numel != b.d.numel) {
      return diff("number of elements", std::to_string(a.d.numel), std::to_string(b.d.numel));
    }
    if ((kind_of(a) == CollectiveKind::kAllGather ||
         kind_of(a) == CollectiveKind::kReduceScatter) &&
        a.out != b.out) {
      return diff("split sizes", "[" + join(a.out) + "]", "[" + join(b.out) + "]");
    }
  }
  const int64_t n = static_cast<int64_t>(calls.size());
  for (int64_t r = 0; r < n; ++r) {
    const Snap& c = calls[r];
    if (kind_of(c) == CollectiveKind::kAllGather && c.out[r] != c.d.numel) {
      return "group rank " + std::to_string(r) + " sends " + std::to_string(c.d.numel) +
             " elements but the split sizes say " + std::to_string(c.out[r]);
    }
    if (kind_of(c) == CollectiveKind::kAllToAll) {
      for (int64_t s = 0; s < n; ++s) {
        if (calls[s].in[r] != c.out[s]) {
          return "group rank " + std::to_string(s) + " sends " + std::to_string(calls[s].in[r]) +
                 " elements to group rank " + std::to_string(r) + ", which expects " +
                 std::to_string(c.out[s]);
        }
      }
    }
  }
  return "";
}

std::string label_of(const CollectiveCall& call) {
  return call.label.empty() ? collective_name(call.kind) : call.label;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Checks what this rank alone can check before it takes part (a bad call would make the backend
// read or write out of bounds). Agreement across ranks is checked on the descriptors.
void check_call(const CollectiveCall& c, int64_t n, int64_t me, const std::string& where) {
  if (c.kind == CollectiveKind::kBarrier) return;
  const auto fits = [n](const std::vector<int64_t>& s) {
    return static_cast<int64_t>(s.size()) == n &&
           std::all_of(s.begin(), s.end(), [](int64_t x) { return x >= 0; });
  };
  bool ok = c.input.defined() && c.output.defined() && c.input.dim() == 1 && c.output.dim() == 1 &&
            c.input.is_contiguous() && c.output.is_contiguous() && c.input.is_cpu() &&
            c.output.is_cpu() && c.input.scalar_type() == c.output.scalar_type();
  const int64_t in = ok ? c.input.numel() : 0, out = ok ? c.output.numel() : 0;
  const auto& is = c.input_splits;
  const auto& os = c.output_splits;
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      ok = ok && out == in;
      break;
    case CollectiveKind::kBroadcast:
      ok = ok && out == in && c.src >= 0 && c.src < n;
      break;
    case CollectiveKind::kAllGather:
      ok = ok && fits(os) && out == sum(os);
      break;
    case CollectiveKind::kReduceScatter:
      ok = ok && fits(os) && in == sum(os) && out == os[me];
      break;
    case CollectiveKind::kAllToAll:
      ok = ok && fits(is) && fits(os) && in == sum(is) && out == sum(os);
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  if (!ok) {
    throw std::invalid_argument(where +
                                ": needs flat contiguous CPU tensors of one dtype whose sizes "
                                "match the split sizes (one per rank) and the source rank");
  }
}

class ShmCommunicator : public Communicator {
 public:
  explicit ShmCommunicator(const CommunicatorOptions& o)
      : Communicator(o.group, group_rank_of(o), o.timeout),
        name_(shm_segment_name(o.job, o.group.name)),
        snaps_(size()) {}
  ~ShmCommunicator() override;

  void run(CollectiveCall& call) override;

 private:
  struct Op {
    const CollectiveCall& call;
    Clock::time_point start, deadline;
  };

  void attach(const Op& op);
  void create_segment(const Op& op);
  void open_segment(const Op& op);
  bool remove_stale();
  void adopt(ShmSegment seg);

  void exchange(const Op& op, CollectiveCall& call);
  void post(const CollectiveCall& call, uint64_t t, int64_t lo, int64_t len);
  void await(const Op& op, std::atomic<uint64_t> Ctrl::*field, uint64_t step, const char* what);
  void write_desc(const CollectiveCall& call, uint64_t t);
  void snapshot(uint64_t t);
  void consume(CollectiveCall& call, uint64_t t, int64_t lo, int64_t per_round);
  void reduce_window(CollectiveCall& call, uint64_t t, int64_t lo, int64_t in_at, int64_t out_at,
                     int64_t len);

  [[noreturn]] void fail(const Op& op, const std::vector<int64_t>& missing, const char* what);
  [[noreturn]] void throw_peer_broken();

  Ctrl* ctrl(int64_t r) const {
    return reinterpret_cast<Ctrl*>(seg_.data() + layout_.ctrl_offset + r * layout_.ctrl_stride);
  }
  int64_t* splits(int64_t r, uint64_t parity, int which) const {
    return reinterpret_cast<int64_t*>(reinterpret_cast<char*>(ctrl(r) + 1)) +
           (parity * 2 + which) * size();
  }
  char* buffer(int64_t r, uint64_t t) const {
    return seg_.data() + layout_.data_offset + r * layout_.data_stride + (t & 1) * half_;
  }
  // Where rank r's data of the current step starts: its buffer, or for this rank its own input
  // (the same bytes, without reading them back).
  const char* source(const CollectiveCall& call, int64_t r, uint64_t t, int64_t lo) const {
    if (r != rank()) return buffer(r, t);
    return static_cast<const char*>(call.input.data_ptr()) + lo * call.input.element_size();
  }
  int64_t window(int64_t r, int64_t lo, int64_t per_round) const {
    return std::clamp<int64_t>(payload_of(snaps_[r].d, r) - lo, 0, per_round);
  }

  std::mutex mu_;  // one call at a time (the caller's thread or the group's worker)
  std::string name_;
  ShmSegment seg_;
  Header* hdr_ = nullptr;
  Layout layout_{};
  size_t half_ = 0;
  uint64_t step_ = 0;   // last step this rank completed
  std::string broken_;  // set once a call failed for good: later calls fail at once
  std::vector<Snap> snaps_;
};

Desc describe(const CollectiveCall& c, int64_t n) {
  Desc d;
  d.kind = static_cast<int32_t>(c.kind);
  d.op = static_cast<int32_t>(c.op);
  d.src = c.src;
  if (c.kind != CollectiveKind::kBarrier) {
    d.dtype = static_cast<int32_t>(c.input.scalar_type());
    d.numel = c.input.numel();
  }
  d.n_in = static_cast<int64_t>(c.input_splits.size()) == n ? static_cast<int32_t>(n) : 0;
  d.n_out = static_cast<int64_t>(c.output_splits.size()) == n ? static_cast<int32_t>(n) : 0;
  return d;
}

ShmCommunicator::~ShmCommunicator() {
  // A rank never attached (it died, or never used this group), so the last attacher's unlink
  // never happened: see NOTE [shm segment lifetime].
  if (hdr_ != nullptr && hdr_->attached.load(std::memory_order_acquire) < size()) {
    seg_.unlink_if_current();
  }
}

void ShmCommunicator::run(CollectiveCall& call) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto start = Clock::now();
  const Op op{call, start, start + timeout()};
  if (!broken_.empty()) throw CollectiveError(broken_);
  check_call(call, size(), rank(), label_of(call) + " on group '" + group().name + "' (shm)");
  if (hdr_ == nullptr) attach(op);
  if (hdr_->broken.load(std::memory_order_acquire) != 0) throw_peer_broken();
  exchange(op, call);
}

// NOTE [shm segment lifetime]
// Group rank 0 creates the segment (O_CREAT | O_EXCL, mode 0600) on its first call; the others
// open it, retrying until that call's timeout. Each rank counts itself in Header::attached once
// it has mapped the segment, and the rank that completes the count unlinks the name at once:
// from then on the memory lives exactly as long as the mappings, so no crash of any rank after
// that point can leave anything in /dev/shm. Before that point the name is removed by whoever
// gives up: a rank that times out (the survivors of a crash) and every communicator's destructor
// unlink it while the count is short. Only a crash before everyone attached, with no survivor,
// leaves the segment; the next run with the same job name finds it, sees that its creator is
// dead (or never finished it), and replaces it. Unlinking checks that the name still refers to
// the same inode, so a stale rank never removes a newer job's segment.
void ShmCommunicator::attach(const Op& op) {
  try {
    if (rank() == 0) {
      create_segment(op);
    } else {
      open_segment(op);
    }
  } catch (const std::system_error& e) {
    throw CollectiveError(label_of(op.call) + " on group '" + group().name +
                          "' (shm): " + e.what());
  }
  if (hdr_->attached.fetch_add(1, std::memory_order_acq_rel) + 1 == size()) {
    seg_.unlink_if_current();
  }
}

void ShmCommunicator::create_segment(const Op& op) {
  const size_t half = shm::half_buffer_bytes();
  const Layout l = layout_for(size(), half);
  for (int attempt = 0;; ++attempt) {
    ShmSegment seg = ShmSegment::create(name_, l.total);
    if (seg.valid()) {
      char* base = seg.data();
      auto* h = new (base) Header();
      h->total_bytes = l.total;
      h->half_bytes = half;
      h->group_size = size();
      h->creator_pid = ::getpid();
      for (int64_t r = 0; r < size(); ++r) new (base + l.ctrl_offset + r * l.ctrl_stride) Ctrl();
      h->magic.store(shm::kMagic, std::memory_order_release);  // publishes everything above
      adopt(std::move(seg));
      return;
    }
    if (attempt == 3 || !remove_stale()) {
      throw CollectiveError(
          label_of(op.call) + " on group '" + group().name + "' (shm): shared memory segment '" +
          name_ + "' is in use by a live process (do two running jobs share a job name?)");
    }
  }
}

// The name existed when group rank 0 came to create it. A leftover of a crashed run of a job with
// the same name (its creator is dead or never finished it) is removed; a live one is kept.
// Returns whether creating may be tried again.
bool ShmCommunicator::remove_stale() {
  ShmSegment old = ShmSegment::open(name_, sizeof(Header));
  if (old.valid()) {
    const auto* h = reinterpret_cast<const Header*>(old.data());
    if (h->magic.load(std::memory_order_acquire) == shm::kMagic &&
        shm::process_alive(h->creator_pid)) {
      return false;
    }
  }
  ::shm_unlink(name_.c_str());
  return true;
}

void ShmCommunicator::open_segment(const Op& op) {
  long nap_us = 20;
  for (;;) {
    ShmSegment seg = ShmSegment::open(name_, sizeof(Header));
    const auto* h = seg.valid() ? reinterpret_cast<const Header*>(seg.data()) : nullptr;
    if (h != nullptr && h->magic.load(std::memory_order_acquire) == shm::kMagic) {
      if (shm::process_alive(h->creator_pid)) {
        if (h->group_size != size() || h->total_bytes != seg.size() ||
            layout_for(size(), h->half_bytes).total != h->total_bytes) {
          throw CollectiveError(label_of(op.call) + " on group '" + group().name +
                                "' (shm): shared memory segment '" + name_ + "' holds a group of " +
                                std::to_string(h->group_size) + " ranks, not " +
                                std::to_string(size()));
        }
        adopt(std::move(seg));
        return;
      }
      // Its creator is dead: a leftover that rank 0 will replace, or rank 0 of this run crashed
      // (then the survivors remove it when they give up).
      if (Clock::now() >= op.deadline) seg.unlink_if_current();
    }
    if (Clock::now() >= op.deadline) fail(op, {group().ranks[0]}, "did not arrive");
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
    nap_us = std::min(nap_us * 2, 1000L);
  }
}

void ShmCommunicator::adopt(ShmSegment seg) {
  seg_ = std::move(seg);
  seg_.populate();
  hdr_ = reinterpret_cast<Header*>(seg_.data());
  half_ = hdr_->half_bytes;
  layout_ = layout_for(size(), half_);
}

void ShmCommunicator::exchange(const Op& op, CollectiveCall& call) {
  const Desc mine = describe(call, size());
  const size_t isz = call.input.defined() ? call.input.element_size() : 1;
  const int64_t per_round = static_cast<int64_t>(half_ / isz);  // elements per step
  const int64_t my_payload = payload_of(mine, rank());
  uint64_t t = step_ + 1;
  // Step 1 carries the descriptors: check that the calls agree before computing anything.
  await(op, &Ctrl::consumed, t >= 2 ? t - 2 : 0, "did not finish");
  write_desc(call, t);
  post(call, t, 0, std::min(my_payload, per_round));
  await(op, &Ctrl::posted, t, "did not arrive");
  snapshot(t);
  const std::string bad = mismatch(snaps_);
  if (!bad.empty()) {
    ctrl(rank())->consumed.store(t, std::memory_order_release);
    step_ = t;
    throw CollectiveError(label_of(call) + " on group '" + group().name +
                          "' (shm): ranks disagree: " + bad);
  }
  int64_t most = 0;
  for (int64_t r = 0; r < size(); ++r) most = std::max(most, payload_of(snaps_[r].d, r));
  const int64_t rounds = std::max<int64_t>(1, (most + per_round - 1) / per_round);
  for (int64_t c = 0; c < rounds; ++c, ++t) {
    const int64_t lo = c * per_round;
    if (c > 0) {
      await(op, &Ctrl::consumed, t - 2, "did not finish");
      post(call, t, lo, std::clamp<int64_t>(my_payload - lo, 0, per_round));
      await(op, &Ctrl::posted, t, "did not arrive");
    }
    consume(call, t, lo, per_round);
    ctrl(rank())->consumed.store(t, std::memory_order_release);
  }
  step_ = t - 1;
  if (call.kind == CollectiveKind::kAllReduce || call.kind == CollectiveKind::kReduceScatter) {
    finish_reduce(call.output, call.op, size());
  }
}

void ShmCommunicator::post(const CollectiveCall& call, uint64_t t, int64_t lo, int64_t len) {
  if (len > 0 && size() > 1) {  // alone, this rank reads its own input directly
    const size_t isz = call.input.element_size();
    std::memcpy(buffer(rank(), t), static_cast<const char*>(call.input.data_ptr()) + lo * isz,
                len * isz);
  }
  ctrl(rank())->posted.store(t, std::memory_order_release);  // publishes the chunk
}

// Waits until every rank's `field` has reached `step`; fails naming the ranks that have not.
void ShmCommunicator::await(const Op& op, std::atomic<uint64_t> Ctrl::*field, uint64_t step,
                            const char* what) {
  const int64_t n = size();
  int64_t next = 0;  // ranks before it have reached the step (counters only grow)
  auto reached = [&] {
    while (next < n && (ctrl(next)->*field).load(std::memory_order_acquire) >= step) ++next;
    return next == n;
  };
  switch (shm::wait_until(reached, hdr_->broken, op.deadline)) {
    case Wait::kReady:
      return;
    case Wait::kBroken:
      throw_peer_broken();
    case Wait::kTimeout:
      break;
  }
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < n; ++r) {
    if ((ctrl(r)->*field).load(std::memory_order_acquire) < step) {
      missing.push_back(group().ranks[r]);
    }
  }
  fail(op, missing, what);
}

void ShmCommunicator::write_desc(const CollectiveCall& call, uint64_t t) {
  const uint64_t p = t & 1;
  const Desc d = describe(call, size());
  ctrl(rank())->desc[p] = d;
  if (d.n_in > 0) {
    std::copy(call.input_splits.begin(), call.input_splits.end(), splits(rank(), p, 0));
  }
  if (d.n_out > 0) {
    std::copy(call.output_splits.begin(), call.output_splits.end(), splits(rank(), p, 1));
  }
}

void ShmCommunicator::snapshot(uint64_t t) {
  const uint64_t p = t & 1;
  const int32_t n = static_cast<int32_t>(size());
  for (int64_t r = 0; r < size(); ++r) {
    Snap& s = snaps_[r];
    s.d = ctrl(r)->desc[p];
    s.d.n_in = std::clamp(s.d.n_in, 0, n);  // never trust a count read from shared memory
    s.d.n_out = std::clamp(s.d.n_out, 0, n);
    s.in.assign(splits(r, p, 0), splits(r, p, 0) + s.d.n_in);
    s.out.assign(splits(r, p, 1), splits(r, p, 1) + s.d.n_out);
  }
}

// Produces this rank's part of the output from step t, whose window is elements
// [lo, lo + per_round) of every rank's payload.
void ShmCommunicator::consume(CollectiveCall& call, uint64_t t, int64_t lo, int64_t per_round) {
  if (call.kind == CollectiveKind::kBarrier) return;
  const int64_t n = size(), me = rank();
  const size_t isz = call.output.element_size();
  char* out = static_cast<char*>(call.output.data_ptr());
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      reduce_window(call, t, lo, 0, lo, window(0, lo, per_round));
      break;
    case CollectiveKind::kReduceScatter: {
      // Only the part of the window inside this rank's share [first, first + len).
      const int64_t first = offset_of(call.output_splits, me), len = call.output_splits[me];
      const int64_t x = std::max(lo, first);
      const int64_t y = std::min(lo + window(0, lo, per_round), first + len);
      if (x < y) reduce_window(call, t, lo, x - lo, x - first, y - x);
      break;
    }
    case CollectiveKind::kAllGather:
      for (int64_t r = 0, dst = 0; r < n; dst += call.output_splits[r], ++r) {
        const int64_t len = window(r, lo, per_round);
        if (len > 0) std::memcpy(out + (dst + lo) * isz, source(call, r, t, lo), len * isz);
      }
      break;
    case CollectiveKind::kAllToAll:
      for (int64_t s = 0, dst = 0; s < n; dst += call.output_splits[s], ++s) {
        // Rank s sends this rank elements [from, from + count) of its input.
        const int64_t from = offset_of(snaps_[s].in, me), count = snaps_[s].in[me];
        const int64_t x = std::max(lo, from);
        const int64_t y = std::min(lo + window(s, lo, per_round), from + count);
        if (x < y) {
          std::memcpy(out + (dst + x - from) * isz, source(call, s, t, lo) + (x - lo) * isz,
                      (y - x) * isz);
        }
      }
      break;
    case CollectiveKind::kBroadcast: {
      const int64_t len = window(call.src, lo, per_round);
      if (len > 0) std::memcpy(out + lo * isz, source(call, call.src, t, lo), len * isz);
      break;
    }
    case CollectiveKind::kBarrier:
      break;
  }
}

// output[out_at, out_at + len) = the fold, in group-rank order (so every rank gets identical
// bits), of elements [in_at, in_at + len) of every rank's data of step t.
void ShmCommunicator::reduce_window(CollectiveCall& call, uint64_t t, int64_t lo, int64_t in_at,
                                    int64_t out_at, int64_t len) {
  if (len <= 0) return;
  const size_t isz = call.output.element_size();
  at::Tensor acc = call.output.narrow(0, out_at, len);
  std::memcpy(acc.data_ptr(), source(call, 0, t, lo) + in_at * isz, len * isz);
  for (int64_t r = 1; r < size(); ++r) {
    const at::Tensor other = at::from_blob(const_cast<char*>(source(call, r, t, lo)) + in_at * isz,
                                           {len}, call.output.options());
    reduce_into(acc, other, call.op);
  }
}

// Marks the group broken (so that peers stop waiting too) and throws a timeout error naming the
// ranks that are missing, worded as the threads backend words it.
void ShmCommunicator::fail(const Op& op, const std::vector<int64_t>& missing, const char* what) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - op.start);
  const std::string msg = label_of(op.call) + " on group '" + group().name + "' (shm, ranks [" +
                          join(group().ranks) + "]): ranks [" + join(missing) + "] " + what +
                          " within the timeout of " + std::to_string(timeout().count()) +
                          " ms (global rank " + std::to_string(group().ranks[rank()]) + " waited " +
                          std::to_string(ms.count()) + " ms)";
  broken_ = msg;
  if (hdr_ != nullptr) {
    uint32_t expected = 0;
    if (hdr_->broken.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      const size_t len = std::min(msg.size(), sizeof(hdr_->why) - 1);
      std::memcpy(hdr_->why, msg.data(), len);
      hdr_->why[len] = '\0';
      hdr_->broken.store(2, std::memory_order_release);
    }
    if (hdr_->attached.load(std::memory_order_acquire) < size()) seg_.unlink_if_current();
  }
  throw CollectiveError(msg);
}

// Another rank marked the group broken: fail with its message (it names the missing ranks).
void ShmCommunicator::throw_peer_broken() {
  const auto until = Clock::now() + std::chrono::seconds(1);
  while (hdr_->broken.load(std::memory_order_acquire) == 1 && Clock::now() < until) {
    std::this_thread::yield();
  }
  broken_ = hdr_->broken.load(std::memory_order_acquire) == 2
                ? std::string(hdr_->why)
                : "group '" + group().name + "' (shm) was broken by a failure on another rank";
  throw CollectiveError(broken_);
}

BackendRegistration g_shm("shm", [](const CommunicatorOptions& o) {
  return std::make_unique<ShmCommunicator>(o);
});

}  // namespace
}  // namespace dtensor::collectives
