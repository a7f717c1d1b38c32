#pragma once
// The shm backend's communicator (shm_backend.cc: the protocol through the segment's buffers and
// by cross memory attach; shm_symmetric.cc: collectives on symmetric memory). Private to the
// backend: only its two .cc files include it.

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/shm_segment.h"
#include "collectives/symmetric_memory.h"

namespace dtensor::collectives::shm_detail {

using Clock = std::chrono::steady_clock;

using shm::Ctrl;
using shm::Desc;
using shm::Header;
using shm::Layout;
using shm::layout_for;
using shm::Wait;

// What peers read to probe cross memory attach into this process (Ctrl::probe holds its address).
inline const uint64_t g_probe_word = shm::kProbeWord;

// Reductions through cross memory attach fold pieces of this many bytes: a peer's piece is read
// into a scratch buffer that stays in cache while it is folded into the output.
constexpr size_t kPieceBytes = size_t{256} << 10;
// Folds of at most this many bytes use combine_raw (ShmCommunicator::fold).
constexpr int64_t kRawFoldBytes = int64_t{64} << 10;

// A rank's call as every rank sees it (copied out of shared memory during the first step, since
// the slot may be rewritten while later steps of the call are still running).
struct Snap {
  Desc d;
  std::vector<int64_t> in, out;
};

// Rank r's share of the data of a call: what it streams through its buffer.
inline int64_t payload_of(const Desc& d, int64_t r) {
  switch (static_cast<CollectiveKind>(d.kind)) {
    case CollectiveKind::kBroadcast:
      return r == d.src ? d.numel : 0;
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return d.numel;
  }
}

inline std::string label_of(const CollectiveCall& call) {
  return call.label.empty() ? collective_name(call.kind) : call.label;
}

// NOTE [shm cross memory attach]
// Through the buffers, data crosses memory twice (the sender copies it in, the readers copy it
// out). With DTENSOR_SHM_CMA=1, a call larger than one step (more than half a data area in its
// input or output) is instead read straight from the peers' inputs with process_vm_readv (Linux
// Cross Memory Attach): the first step's descriptor publishes the input's address instead of
// data (Ctrl::pid names the process), every rank reads what it needs into its own output (its
// own part from its own input), marks the step consumed, and returns only once every peer has
// marked it consumed, so an input stays valid and unchanged while peers read it. Reductions fold
// pieces of kPieceBytes in group-rank order (identical bits on every rank, as through the
// buffers). Each rank probes once per communicator, on its first call (which goes through the
// buffers), whether it can read every peer (ptrace rules may deny it: EPERM; old kernels:
// ENOSYS), and falls back to the buffers if not. A call uses it only when every rank's
// descriptor says so; when only some do (the ranks disagree on the probe or the setting, or on
// the size of an all_to_all), the rounds start afresh in the next step with every rank posting
// data. A failed read (a peer died mid-call) marks the group broken and fails on every rank with
// a CollectiveError naming the rank.
// It is off by default because it loses where it was measured (2-vCPU VMs; docs/benchmarks.md,
// "Measurements behind design choices"): the kernel's copy is slower than memcpy, while the
// buffers pipeline two mostly in-cache copies. It is kept for machines whose kernel copies at
// memcpy speed, where one copy instead of two should win.
class ShmCommunicator : public Communicator {
 public:
  explicit ShmCommunicator(const CommunicatorOptions& o)
      : Communicator(o.group, group_rank_of(o), o.timeout),
        name_(shm_segment_name(o.job, o.group.name)),
        snaps_(size()),
        cma_(shm::cma_enabled() && size() > 1 ? Cma::kUnknown : Cma::kNo),
        symmetric_min_bytes_(shm::symmetric_min_bytes()),
        // Read on every rank (only group rank 0 sizes the segment), so that a malformed
        // DTENSOR_SHM_BUFFER_BYTES fails every rank at once instead of leaving the others
        // waiting out the timeout for a segment that never comes.
        requested_half_(shm::half_buffer_bytes()) {}
  ~ShmCommunicator() override;

  bool compares_calls() const override { return true; }
  bool takes_boxes() const override { return true; }
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

  enum class Cma { kUnknown, kYes, kNo };

  void exchange(const Op& op, CollectiveCall& call);
  int64_t rounds_of(const CollectiveCall& call, int64_t per_round) const;
  void post(const CollectiveCall& call, const Desc& mine, uint64_t t, int64_t c, int64_t per_round);
  void await(const Op& op, std::atomic<uint64_t> Ctrl::*field, uint64_t step, const char* what);
  void write_desc(const CollectiveCall& call, const Desc& mine, uint64_t t, bool cma, bool sym);
  void snapshot(uint64_t t);
  void probe_cma();
  void consume(CollectiveCall& call, uint64_t t, int64_t c, int64_t per_round);
  void read_peers(const Op& op, CollectiveCall& call, uint64_t t);
  template <class Piece>
  void fold(CollectiveCall& call, int64_t out_at, int64_t len, Piece&& piece);

  // NOTE [symmetric collectives] (shm_symmetric.cc)
  enum class SymMode { kNone, kPull, kPush, kOneShot, kTwoShot };
  // Looks up the call's input and output in symmetric memory rendezvoused on this group (sets
  // sym_in_, sym_out_); returns whether this rank can run the call on them without posting data.
  bool find_symmetric_buffers(const CollectiveCall& call);
  // The algorithm every rank runs, from the snapshots (equal on every rank), or kNone.
  SymMode sym_mode(const CollectiveCall& call) const;
  // Runs the call on the peers' symmetric buffers from step t; returns the last step it used.
  uint64_t run_symmetric(const Op& op, CollectiveCall& call, uint64_t t, SymMode mode);
  // Where rank r's input (output) of this call is, mapped in this process.
  const char* peer_input(int64_t r) const {
    return sym_in_->mem->buffer_ptr(r) + snaps_[r].d.sym_in_at;
  }
  char* peer_output(int64_t r) const {
    return sym_out_->mem->buffer_ptr(r) + snaps_[r].d.sym_out_at;
  }

  [[noreturn]] void fail(const Op& op, const std::vector<int64_t>& missing, const char* what);
  [[noreturn]] void fail_read(const Op& op, int64_t r, int64_t pid, int err);
  [[noreturn]] void break_group(const std::string& msg);
  void mark_broken(const std::string& msg);
  void leave(const std::string& why) override;
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
  // An in-place all_reduce reads its own part from its posted copy (NOTE [in-place all_reduce]):
  // the fold writes the output, which is the input, before it reads the last ranks' parts.
  const char* source(const CollectiveCall& call, int64_t r, uint64_t t, int64_t lo) const {
    if (r != rank() || (size() > 1 && in_place(call))) return buffer(r, t);
    return static_cast<const char*>(call.input.data_ptr()) + lo * call.input.element_size();
  }
  static bool in_place(const CollectiveCall& call) {
    return call.input.defined() && !call.boxed() && call.input.data_ptr() == call.output.data_ptr();
  }
  int64_t window(int64_t r, int64_t lo, int64_t per_round) const {
    return std::clamp<int64_t>(payload_of(snaps_[r].d, r) - lo, 0, per_round);
  }
  // NOTE [shm scatter rounds]
  // reduce_scatter and all_to_all send each peer its own part of the input. Through the buffers
  // they move only what peers read, and every rank receives (reduces) in every round: in round
  // c, rank r's buffer holds chunk c (share_step elements) of the part for each other rank, in
  // slots by destination (r's own part is skipped: slot(d, r)); each rank takes chunk c of its
  // part from the peers' slots, and from its own input. The part for rank d is d's share of the
  // input (reduce_scatter: output splits) or its input split (all_to_all). A boxed all_to_all
  // (NOTE [boxed all_to_all] in functional.h) copies chunk c of its boxes for d into the slot, and
  // chunk c from the peers' slots into its boxes for them: the same bytes, no packed copy.
  static bool scatters(const CollectiveCall& call) {
    return call.kind == CollectiveKind::kReduceScatter || call.kind == CollectiveKind::kAllToAll;
  }
  int64_t share_step(int64_t per_round) const {
    return size() > 1 ? per_round / (size() - 1) : per_round;
  }
  static int64_t slot(int64_t d, int64_t r) { return d < r ? d : d - 1; }
  // One call at a time (the caller's thread or the group's worker): held for a whole run(), it
  // guards every member below that a call changes.
  absl::Mutex mu_;
  std::string name_;
  ShmSegment seg_;
  Header* hdr_ = nullptr;
  Layout layout_{};
  size_t half_ = 0;
  uint64_t step_ = 0;   // last step this rank completed
  uint64_t calls_ = 0;  // calls this rank made on the group (CollectiveCall::seq)
  std::string broken_;  // set once a call failed for good: later calls fail at once
  std::vector<Snap> snaps_;
  std::vector<CallSignature> sigs_;  // snap_mismatch's, reused
  Cma cma_;
  std::vector<char> scratch_;  // a peer's piece of a reduction read by cross memory attach
  std::optional<SymmetricView> sym_in_, sym_out_;  // this call's symmetric buffers
  size_t symmetric_min_bytes_;                     // smaller calls go through the buffers
  size_t requested_half_;  // DTENSOR_SHM_BUFFER_BYTES / 2 (rank 0 sizes the segment by it)
};

// output[out_at, out_at + len) = the fold, in group-rank order (so every rank gets identical
// bits), of every rank's `len` elements. piece(r, dst) returns where rank r's elements are; for
// rank 0 it gets the output as dst and may put them there, for the others it gets nullptr.
template <class Piece>
void ShmCommunicator::fold(CollectiveCall& call, int64_t out_at, int64_t len, Piece&& piece) {
  if (len <= 0) return;
  const size_t isz = call.output.element_size();
  char* dst = static_cast<char*>(call.output.data_ptr()) + out_at * isz;
  const c10::ScalarType dtype = call.output.scalar_type();
  // Small pieces by a plain loop (no per-call tensors or TensorIterator); large ones through
  // ATen's vectorised kernels, which a plain loop that may alias its output does not match.
  if (size() > 1 && len * static_cast<int64_t>(isz) <= kRawFoldBytes &&
      combine_raw_serves(dtype, call.op)) {
    const char* first = piece(0, dst);
    combine_raw(dst, first, piece(1, nullptr), len, dtype, call.op);
    for (int64_t r = 2; r < size(); ++r)
      combine_raw(dst, dst, piece(r, nullptr), len, dtype, call.op);
    return;
  }
  at::Tensor acc = call.output.narrow(0, out_at, len);
  const char* first = piece(0, dst);
  int64_t r = 1;
  if (first != dst && size() > 1) {  // acc = first op second, in one pass over the output
    const auto blob = [&](const char* p) {
      return at::from_blob(const_cast<char*>(p), {len}, call.output.options());
    };
    combine(acc, blob(first), blob(piece(1, nullptr)), call.op);
    r = 2;
  } else if (first != dst) {
    std::memcpy(dst, first, len * isz);
  }
  for (; r < size(); ++r) {
    const at::Tensor other =
        at::from_blob(const_cast<char*>(piece(r, nullptr)), {len}, call.output.options());
    reduce_into(acc, other, call.op);
  }
}

}  // namespace dtensor::collectives::shm_detail
