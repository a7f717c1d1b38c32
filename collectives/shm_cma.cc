// The shm backend's cross memory attach (NOTE [shm cross memory attach] in shm_communicator.h):
// probing whether peers' memory can be read, reading a whole call from the peers' inputs, and
// the error when a read fails. The protocol through the buffers is shm_backend.cc.

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/shm_communicator.h"

namespace dtensor::collectives::shm_detail {

// Whether this rank can read every peer's memory (NOTE [shm cross memory attach]). Runs after
// the first step, when every peer's Ctrl::pid and Ctrl::probe are published.
void ShmCommunicator::probe_cma() {
  bool ok = true;
  for (int64_t r = 0; r < size() && ok; ++r) {
    uint64_t word = 0;
    ok =
        r == rank() || (shm::read_process(ctrl(r)->pid, ctrl(r)->probe, &word, sizeof(word)) == 0 &&
                        word == shm::kProbeWord);
  }
  cma_ = ok ? Cma::kYes : Cma::kNo;
}

// Produces this rank's whole output of step t from the peers' inputs by cross memory attach, then
// waits until every peer has read this rank's input (NOTE [shm cross memory attach]).
void ShmCommunicator::read_peers(const Op& op, CollectiveCall& call, uint64_t t) {
  const int64_t n = size(), me = rank();
  const size_t isz = call.output.element_size();
  const char* in = static_cast<const char*>(call.input.data_ptr());
  char* out = static_cast<char*>(call.output.data_ptr());
  // Copies elements [at, at + len) of rank r's input to dst.
  const auto read = [&](int64_t r, int64_t at, char* dst, int64_t len) {
    if (len <= 0) return;
    if (r == me) {
      if (dst != in + at * isz) std::memcpy(dst, in + at * isz, len * isz);  // in place: there
      return;
    }
    const int64_t pid = ctrl(r)->pid;
    if (const int err = shm::read_process(pid, snaps_[r].d.input + at * isz, dst, len * isz);
        err != 0) {
      fail_read(op, r, pid, err);
    }
  };
  // Folds elements [at, at + len) of every rank's input into output[out_at, out_at + len).
  const auto reduce = [&](int64_t at, int64_t out_at, int64_t len) {
    const int64_t piece = static_cast<int64_t>(kPieceBytes / isz);
    scratch_.resize(kPieceBytes);
    for (int64_t x = 0; x < len; x += piece) {
      const int64_t k = std::min(piece, len - x);
      fold(call, out_at + x, k, [&](int64_t r, char* dst) {
        if (r == me) return in + (at + x) * isz;
        if (dst == nullptr) dst = scratch_.data();
        read(r, at + x, dst, k);
        return static_cast<const char*>(dst);
      });
    }
  };
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      reduce(0, 0, call.output.numel());
      break;
    case CollectiveKind::kReduceScatter:
      reduce(offset_of(call.output_splits, me), 0, call.output_splits[me]);
      break;
    case CollectiveKind::kAllGather:
      for (int64_t r = 0, dst = 0; r < n; dst += call.output_splits[r], ++r) {
        read(r, 0, out + dst * isz, call.output_splits[r]);
      }
      break;
    case CollectiveKind::kAllToAll:
      for (int64_t s = 0, dst = 0; s < n; dst += call.output_splits[s], ++s) {
        read(s, offset_of(snaps_[s].in, me), out + dst * isz, snaps_[s].in[me]);
      }
      break;
    case CollectiveKind::kBroadcast:
      read(call.src, 0, out, call.output.numel());
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  ctrl(me)->consumed.store(t, std::memory_order_release);
  await(op, &Ctrl::consumed, t, "did not finish");
}

// Reading rank r's input (in process `pid`) by cross memory attach failed with `err`: breaks the
// group with a message naming the rank.
void ShmCommunicator::fail_read(const Op& op, int64_t r, int64_t pid, int err) {
  break_group(absl::StrCat(label_of(op.call), " on group '", group().name, "' (shm, ranks [",
                           absl::StrJoin(group().ranks, ","), "]): reading the input of rank ",
                           group().ranks[r], " (process ", pid, ") by cross memory attach failed: ",
                           std::strerror(err), err == ESRCH ? " (the process is gone)" : ""));
}

}  // namespace dtensor::collectives::shm_detail
