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
// every rank). Messages of any size pass through the fixed-size buffers chunk by chunk (or, on
// request and when larger than one step, straight from the peers' inputs: NOTE [shm cross memory
// attach]).

#include <ATen/ATen.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>

#include <thread>
#include "absl/strings/str_join.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/error.h"
#include "collectives/boxes.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/shm_communicator.h"
#include "collectives/shm_segment.h"

namespace dtensor::collectives {
namespace shm_detail {
namespace {

// What the ranks must agree on, read from a snapshot (see mismatch() in communicator.h).
CallSignature signature_of(const Snap& s) {
  CallSignature sig;
  sig.kind = static_cast<CollectiveKind>(s.d.kind);
  sig.op = static_cast<ReduceOp>(s.d.op);
  sig.dtype = s.d.dtype < 0 ? c10::ScalarType::Undefined : static_cast<c10::ScalarType>(s.d.dtype);
  sig.numel = s.d.numel;
  sig.src = s.d.src;
  sig.input_splits = s.in;
  sig.output_splits = s.out;
  sig.seq = s.d.seq;
  sig.thread = std::string_view(s.d.thread, strnlen(s.d.thread, sizeof(s.d.thread)));
  sig.thread_seq = s.d.thread_seq;
  sig.program_ops = s.d.program_ops;
  sig.program = s.d.program;
  sig.purpose = std::string_view(s.d.purpose, strnlen(s.d.purpose, sizeof(s.d.purpose)));
  return sig;
}

// How the ranks' calls disagree, or "": the same checks and wording as the threads backend.
// `sigs` is reused across calls (no allocation per call).
std::string snap_mismatch(const std::vector<Snap>& calls, std::vector<CallSignature>& sigs) {
  sigs.clear();
  for (const Snap& s : calls) sigs.push_back(signature_of(s));
  return mismatch(sigs);
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Checks what this rank alone can check before it takes part (a bad call would make the backend
// read or write out of bounds). Agreement across ranks is checked on the descriptors.
// `group` names the group in the message (built only on failure).
void check_call(const CollectiveCall& c, int64_t n, int64_t me, const std::string& group) {
  if (c.kind == CollectiveKind::kBarrier) return;
  const auto fits = [n](const std::vector<int64_t>& s) {
    return static_cast<int64_t>(s.size()) == n &&
           std::all_of(s.begin(), s.end(), [](int64_t x) { return x >= 0; });
  };
  bool ok = c.input.defined() && c.output.defined() && c.input.dim() == 1 && c.output.dim() == 1 &&
            c.input.is_contiguous() && c.output.is_contiguous() && c.input.is_cpu() &&
            c.output.is_cpu() && c.input.scalar_type() == c.output.scalar_type();
  // A boxed all_to_all (NOTE [boxed all_to_all] in functional.h) moves its boxes' elements.
  const bool boxed = ok && c.boxed();
  ok = ok && (!boxed || boxes_fit(c, n));
  const auto& is = c.input_splits;
  const auto& os = c.output_splits;
  const int64_t in = !ok ? 0 : boxed ? sum(is) : c.input.numel();
  const int64_t out = !ok ? 0 : boxed ? sum(os) : c.output.numel();
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
    throw Error(label_of(c) + " on group '" + group + "' (shm)" +
                ": needs flat contiguous CPU tensors (a boxed all_to_all: one list of CPU boxes "
                "per rank) of one dtype whose sizes match the split sizes (one per rank) and the "
                "source rank");
  }
}

}  // namespace

static_assert(sizeof(Desc::purpose) == kPurposeBytes);

Desc describe(const CollectiveCall& c, int64_t n) {
  Desc d;
  d.kind = static_cast<int32_t>(c.kind);
  d.op = static_cast<int32_t>(c.op);
  d.src = c.src;
  if (c.kind != CollectiveKind::kBarrier) {
    d.dtype = static_cast<int32_t>(c.input.scalar_type());
    d.numel = c.boxed() ? offset_of(c.input_splits, n) : c.input.numel();
  }
  d.seq = c.seq;
  d.thread_seq = c.thread_seq;
  d.program_ops = c.program_ops;
  d.program = c.program;
  std::memcpy(d.thread, c.thread.data(), std::min(c.thread.size(), sizeof(d.thread) - 1));
  std::memcpy(d.purpose, c.purpose.data(), std::min(c.purpose.size(), sizeof(d.purpose) - 1));
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
  absl::MutexLock lock(&mu_);
  const auto start = Clock::now();
  const Op op{call, start, start + timeout()};
  if (!broken_.empty()) throw CollectiveError(broken_);
  check_call(call, size(), rank(), group().name);
  if (hdr_ == nullptr) attach(op);
  if (hdr_->broken.load(std::memory_order_acquire) != 0) throw_peer_broken();
  call.seq = ++calls_;
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
  ctrl(rank())->pid = ::getpid();  // for cross memory attach; read by peers after step 1
  ctrl(rank())->probe = reinterpret_cast<uint64_t>(&g_probe_word);
  if (hdr_->attached.fetch_add(1, std::memory_order_acq_rel) + 1 == size()) {
    seg_.unlink_if_current();
  }
}

void ShmCommunicator::create_segment(const Op& op) {
  // A scatter round needs a slot of at least one element (16 bytes at most) per peer (NOTE [shm
  // scatter rounds]).
  const size_t half = std::max<size_t>(requested_half_, (16 * size() + 63) / 64 * 64);
  const Layout l = layout_for(size(), half);
  static std::once_flag reclaimed;  // leftovers of killed jobs (NOTE [stale segments])
  std::call_once(reclaimed, [] { shm::reclaim_stale_segments(); });
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
  auto next_poll = Clock::now() + kInterruptPoll;
  for (;;) {
    if (Clock::now() >= next_poll) {
      check_interrupt();  // NOTE [interrupts]
      next_poll = Clock::now() + kInterruptPoll;
    }
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
  const bool sym = find_symmetric_buffers(call);                // NOTE [symmetric collectives]
  const bool cma = !sym && cma_ == Cma::kYes && call.kind != CollectiveKind::kBarrier &&
                   !in_place(call) && !call.boxed() &&
                   std::max(call.input.nbytes(), call.output.nbytes()) > half_;
  uint64_t t = step_ + 1;
  // Step 1 carries the descriptors: check that the calls agree before computing anything.
  await(op, &Ctrl::consumed, t >= 2 ? t - 2 : 0, "did not finish");
  write_desc(call, mine, t, cma, sym);
  if (cma || sym) {
    ctrl(rank())->posted.store(t, std::memory_order_release);
  } else {
    post(call, mine, t, 0, per_round);
  }
  await(op, &Ctrl::posted, t, "did not arrive");
  snapshot(t);
  const std::string bad = snap_mismatch(snaps_, sigs_);
  if (!bad.empty()) {
    ctrl(rank())->consumed.store(t, std::memory_order_release);
    step_ = t;
    throw CallMismatch(label_of(call) + " on group '" + group().name +
                       "' (shm): ranks disagree: " + bad);
  }
  if (cma_ == Cma::kUnknown) probe_cma();
  int64_t readable = 0, direct = 0;  // ranks that posted their input's address / symmetric
  for (const Snap& s : snaps_) {     // buffers instead of data
    readable += s.d.cma == 1;
    direct += s.d.sym == 1;
  }
  const SymMode mode = direct == size() ? sym_mode(call) : SymMode::kNone;
  if (mode != SymMode::kNone) {
    step_ = run_symmetric(op, call, t, mode);
  } else if (readable == size()) {
    read_peers(op, call, t);
    step_ = t;
  } else {
    // Some ranks posted no data: start the rounds in the next step.
    bool fresh = readable + direct > 0;
    if (fresh) ctrl(rank())->consumed.store(t++, std::memory_order_release);
    const int64_t rounds = rounds_of(call, per_round);
    for (int64_t c = 0; c < rounds; ++c, ++t) {
      if (c > 0 || fresh) {
        await(op, &Ctrl::consumed, t - 2, "did not finish");
        post(call, mine, t, c, per_round);
        await(op, &Ctrl::posted, t, "did not arrive");
      }
      consume(call, t, c, per_round);
      ctrl(rank())->consumed.store(t, std::memory_order_release);
    }
    step_ = t - 1;
  }
  if (call.kind == CollectiveKind::kAllReduce || call.kind == CollectiveKind::kReduceScatter) {
    finish_reduce(call.output, call.op, size());
  }
}

// How many steps of `per_round` elements the largest share of any rank takes (at least one).
int64_t ShmCommunicator::rounds_of(const CollectiveCall& call, int64_t per_round) const {
  int64_t most = 0;
  if (scatters(call)) {  // NOTE [shm scatter rounds]
    for (int64_t r = 0; r < size(); ++r) {
      const auto& splits = call.kind == CollectiveKind::kAllToAll ? snaps_[r].in : snaps_[r].out;
      for (int64_t x : splits) most = std::max(most, x);
    }
    return std::max<int64_t>(1, (most + share_step(per_round) - 1) / share_step(per_round));
  }
  for (int64_t r = 0; r < size(); ++r) most = std::max(most, payload_of(snaps_[r].d, r));
  return std::max<int64_t>(1, (most + per_round - 1) / per_round);
}

// Copies this rank's data of round c into its buffer of step t and publishes the step.
void ShmCommunicator::post(const CollectiveCall& call, const Desc& mine, uint64_t t, int64_t c,
                           int64_t per_round) {
  if (size() > 1 && call.kind != CollectiveKind::kBarrier) {  // alone, a rank reads its input
    const size_t isz = call.input.element_size();
    const char* in = static_cast<const char*>(call.input.data_ptr());
    char* buf = buffer(rank(), t);
    if (scatters(call)) {  // NOTE [shm scatter rounds]
      const int64_t k = share_step(per_round);
      const auto& parts =
          call.kind == CollectiveKind::kAllToAll ? call.input_splits : call.output_splits;
      for (int64_t d = 0, first = 0; d < size(); first += parts[d], ++d) {
        const int64_t len = std::clamp<int64_t>(parts[d] - c * k, 0, k);
        if (d == rank() || len == 0) continue;
        char* to = buf + slot(d, rank()) * k * isz;
        if (call.boxed()) {
          pack_range(call.send_boxes[d], c * k, len, to);
        } else {
          std::memcpy(to, in + (first + c * k) * isz, len * isz);
        }
      }
    } else {
      const int64_t lo = c * per_round;
      const int64_t len = std::clamp<int64_t>(payload_of(mine, rank()) - lo, 0, per_round);
      if (len > 0) std::memcpy(buf, in + lo * isz, len * isz);
    }
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
  const auto poll = [&] {
    try {
      check_interrupt();
    } catch (...) {  // NOTE [interrupts]: the peers stop waiting for this rank
      mark_broken(absl::StrCat(label_of(op.call), " #", op.call.seq, " on group '", group().name,
                               "' (shm, ranks [", absl::StrJoin(group().ranks, ","),
                               "]): global rank ", group().ranks[rank()],
                               " was interrupted (SIGINT) and left the collective"));
      throw;
    }
  };
  switch (shm::wait_until(reached, hdr_->broken, op.deadline, poll, kInterruptPoll,
                          shm::yield_budget(size()))) {
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

void ShmCommunicator::write_desc(const CollectiveCall& call, const Desc& mine, uint64_t t, bool cma,
                                 bool sym) {
  const uint64_t p = t & 1;
  Desc d = mine;
  if (cma) {
    d.cma = 1;
    d.input = reinterpret_cast<uint64_t>(call.input.data_ptr());
  }
  if (sym) {
    d.sym = 1;
    if (sym_in_) {
      d.sym_in = sym_in_->mem->id();
      d.sym_in_at = sym_in_->offset;
    }
    if (sym_out_) {
      d.sym_out = sym_out_->mem->id();
      d.sym_out_at = sym_out_->offset;
    }
  }
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

// Produces this rank's part of the output from step t (round c), whose window is elements
// [c * per_round, (c + 1) * per_round) of every rank's payload (reduce_scatter: see NOTE [shm
// scatter rounds]).
void ShmCommunicator::consume(CollectiveCall& call, uint64_t t, int64_t c, int64_t per_round) {
  if (call.kind == CollectiveKind::kBarrier) return;
  const int64_t n = size(), me = rank(), lo = c * per_round;
  const size_t isz = call.output.element_size();
  const char* in = static_cast<const char*>(call.input.data_ptr());
  char* out = static_cast<char*>(call.output.data_ptr());
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      fold(call, lo, window(0, lo, per_round),
           [&](int64_t r, char*) { return source(call, r, t, lo); });
      break;
    case CollectiveKind::kReduceScatter: {  // NOTE [shm scatter rounds]
      const int64_t first = offset_of(call.output_splits, me), k = share_step(per_round);
      fold(call, c * k, std::clamp<int64_t>(call.output_splits[me] - c * k, 0, k),
           [&](int64_t r, char*) {
             return r == me ? in + (first + c * k) * isz : buffer(r, t) + slot(me, r) * k * isz;
           });
      break;
    }
    case CollectiveKind::kAllGather:
      for (int64_t r = 0, dst = 0; r < n; dst += call.output_splits[r], ++r) {
        const int64_t len = window(r, lo, per_round);
        const char* src = source(call, r, t, lo);
        if (len > 0 && src != out + (dst + lo) * isz)
          std::memcpy(out + (dst + lo) * isz, src, len * isz);
      }
      break;
    case CollectiveKind::kAllToAll: {  // NOTE [shm scatter rounds]
      const int64_t k = share_step(per_round);
      for (int64_t s = 0, dst = 0; s < n; dst += call.output_splits[s], ++s) {
        // Rank s sends this rank elements [from, from + count) of its input.
        const int64_t from = offset_of(snaps_[s].in, me), count = snaps_[s].in[me];
        const int64_t len = std::clamp<int64_t>(count - c * k, 0, k);
        if (len == 0) continue;
        if (call.boxed() && s == me) {  // its own part, whole in the first round
          if (c == 0) copy_boxes(call.send_boxes[me], call.recv_boxes[me]);
        } else if (call.boxed()) {
          unpack_range(call.recv_boxes[s], c * k, len, buffer(s, t) + slot(me, s) * k * isz);
        } else {
          const char* src =
              s == me ? in + (from + c * k) * isz : buffer(s, t) + slot(me, s) * k * isz;
          std::memcpy(out + (dst + c * k) * isz, src, len * isz);
        }
      }
      break;
    }
    case CollectiveKind::kBroadcast: {
      const int64_t len = window(call.src, lo, per_round);
      if (len > 0) std::memcpy(out + lo * isz, source(call, call.src, t, lo), len * isz);
      break;
    }
    case CollectiveKind::kBarrier:
      break;
  }
}

// Marks the group broken (so that peers stop waiting too) and throws a timeout error naming the
// ranks that are missing, worded as the threads backend words it.
void ShmCommunicator::fail(const Op& op, const std::vector<int64_t>& missing, const char* what) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - op.start);
  break_group(absl::StrCat(label_of(op.call), " #", op.call.seq, " on group '", group().name,
                           "' (shm, ranks [", absl::StrJoin(group().ranks, ","), "]): ranks [",
                           absl::StrJoin(missing, ","), "] ", what, " within the timeout of ",
                           timeout().count(), " ms (global rank ", group().ranks[rank()],
                           " waited ", ms.count(), " ms)"));
}

// Marks the group broken with `msg` (so that peers stop waiting and fail with it too) and throws.
void ShmCommunicator::break_group(const std::string& msg) {
  mark_broken(msg);
  throw CollectiveError(msg);
}

void ShmCommunicator::mark_broken(const std::string& msg) {
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
}

void ShmCommunicator::leave(const std::string& why) {
  if (!broken_.empty()) return;
  mark_broken("group '" + group().name + "' (shm, ranks [" + absl::StrJoin(group().ranks, ",") +
              "]): global rank " + std::to_string(group().ranks[rank()]) +
              " left with an error: " + why);
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

}  // namespace shm_detail

namespace {
BackendRegistration g_shm("shm", [](const CommunicatorOptions& o) {
  return std::make_unique<shm_detail::ShmCommunicator>(o);
});
}  // namespace

}  // namespace dtensor::collectives
