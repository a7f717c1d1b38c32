// The shm backend's collectives on symmetric memory (collectives/symmetric_memory.h).
//
// NOTE [symmetric collectives]
// Through the segment's buffers every byte is copied twice: the sender copies it in, each reader
// copies it out. When the ranks' tensors are symmetric memory rendezvoused on the group, peers
// address them directly and each byte is copied once, by the rank that needs it:
//   all_gather      pull (inputs symmetric): each rank copies every peer's shard into its output,
//                   starting at the next rank (rank r reads r+1, r+2, ...), so no two ranks read
//                   one peer at once; push (outputs symmetric): each rank copies its shard into
//                   every peer's output, in the same rotated order. An input that already is its
//                   place in the output (in place) is not copied.
//   reduce_scatter  each rank reduces only its own chunk, reading the peers' inputs in one pass
//                   of pieces that stay in cache (kPieceBytes).
//   all_reduce      one-shot (inputs symmetric): each rank reduces the whole tensor from every
//                   input; two-shot (inputs and outputs symmetric, from kTwoShotBytes, and always
//                   in place): each rank reduces its 1/n chunk and writes it into every output,
//                   its own and the peers', in the same pass (only the rank that reduces a chunk
//                   touches it anywhere, so in place is safe).
// Reductions fold all sources in one pass (NOTE [fused fold] in reduce.h) where the dtype and op
// allow; calls whose output is 16 MiB or more write with streaming stores (NOTE [streaming
// stores]).
//   all_to_all, broadcast: pull from the peers' inputs.
// Folds run in group-rank order, as through the buffers, so results are bit-identical to the
// other paths and to the threads backend. The call still starts with the descriptor step (the
// ranks check that their calls agree and learn where each rank's buffers are: the rendezvous id
// and offset), posts no data, and ends when every rank has marked the last step consumed, so no
// rank returns while a peer may still read its input or write its output. The ranks choose the
// algorithm from the descriptors alone (sym_mode), so they always agree; when some rank's
// tensors are not symmetric (or belong to another rendezvous), the call runs through the buffers
// from the next step, as when ranks disagree on cross memory attach. Only the calling thread
// copies; it waits as every shm wait does (spin briefly, then yield, then sleep), bounded by the
// timeout. Calls under DTENSOR_SHM_SYMMETRIC_MIN_BYTES (64 KiB) go through the buffers: a zero-copy
// call must wait for every peer to finish reading before it returns, a second round that costs
// more than copying a small message into the buffer (whose readers the next call waits for).
// Ranks may disagree on it (an all_to_all's sizes differ): those calls run through the buffers.
// Tensors that are not symmetric are staged through the segment's data area, a symmetric buffer
// pool every peer addresses, reused by every call of the group: copied in once by their owner,
// read out by each peer in pipelined chunks (shm_backend.cc), which costs no more copies than
// staging a whole tensor into a symmetric buffer would.

#include "collectives/shm_communicator.h"

#include <algorithm>
#include <cstdlib>

#include "absl/container/inlined_vector.h"

namespace dtensor::collectives::shm_detail {
namespace {

// all_reduce of at least this many bytes runs two-shot when the outputs are symmetric too.
constexpr size_t kTwoShotBytes = size_t{256} << 10;

// NOTE [streaming stores]
// A rank that writes into a peer's memory with ordinary stores first reads each cache line for
// ownership (taking it from the peer's cache or memory), then the peer, reading its output,
// takes the line back: every byte crosses twice more than it needs to. Non-temporal (streaming)
// stores write whole lines to memory without reading them, and an sfence before the step's
// release store makes them visible to the peers that acquire it. Small outputs would still be
// in cache for their reader, where streaming loses: calls whose output is under kStreamBytes
// (DTENSOR_SHM_STREAM_BYTES) keep ordinary stores (the measurements: docs/benchmarks.md,
// "Measurements behind design choices").
constexpr size_t kStreamBytes = size_t{16} << 20;

size_t stream_bytes() {
  static const size_t bytes = [] {
    const char* v = std::getenv("DTENSOR_SHM_STREAM_BYTES");
    return v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : kStreamBytes;
  }();
  return bytes;
}

}  // namespace

bool ShmCommunicator::find_symmetric_buffers(const CollectiveCall& call) {
  sym_in_.reset();
  sym_out_.reset();
  if (size() == 1 || call.kind == CollectiveKind::kBarrier || call.boxed() ||
      std::max(call.input.nbytes(), call.output.nbytes()) < symmetric_min_bytes_) {
    return false;
  }
  sym_in_ = find_symmetric(call.input.data_ptr(), call.input.nbytes(), group().name);
  sym_out_ = find_symmetric(call.output.data_ptr(), call.output.nbytes(), group().name);
  if (call.kind == CollectiveKind::kAllGather) return sym_in_ || sym_out_;
  return sym_in_.has_value();
}

ShmCommunicator::SymMode ShmCommunicator::sym_mode(const CollectiveCall& call) const {
  const auto all_same = [&](int64_t Desc::*id) {
    for (const Snap& s : snaps_) {
      if (s.d.*id < 0 || s.d.*id != snaps_[0].d.*id) return false;
    }
    return true;
  };
  const bool in = all_same(&Desc::sym_in) && sym_in_;
  const bool out = all_same(&Desc::sym_out) && sym_out_;
  bool any_in_place = false;  // some rank's output is its input
  for (const Snap& s : snaps_) {
    any_in_place = any_in_place || (s.d.sym_in >= 0 && s.d.sym_in == s.d.sym_out &&
                                    s.d.sym_in_at == s.d.sym_out_at);
  }
  switch (call.kind) {
    case CollectiveKind::kAllGather:
      return out ? SymMode::kPush : in ? SymMode::kPull : SymMode::kNone;
    case CollectiveKind::kAllReduce: {
      const size_t bytes = static_cast<size_t>(snaps_[0].d.numel) * call.input.element_size();
      if (in && out && (any_in_place || bytes >= kTwoShotBytes)) return SymMode::kTwoShot;
      return in && !any_in_place ? SymMode::kOneShot : SymMode::kNone;
    }
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kBroadcast:
      return in ? SymMode::kPull : SymMode::kNone;
    case CollectiveKind::kBarrier:
      break;
  }
  return SymMode::kNone;
}

uint64_t ShmCommunicator::run_symmetric(const Op& op, CollectiveCall& call, uint64_t t,
                                        SymMode mode) {
  count_symmetric_collective();
  const int64_t n = size(), me = rank();
  const size_t isz = call.output.element_size();
  char* out = static_cast<char*>(call.output.data_ptr());
  const char* in = static_cast<const char*>(call.input.data_ptr());
  const bool streaming = call.output.nbytes() >= stream_bytes();  // NOTE [streaming stores]
  const auto copy = [streaming](char* dst, const char* src, int64_t bytes) {
    if (bytes <= 0 || dst == src) return;
    if (streaming) {
      stream_store(dst, src, bytes);
      stream_fence();
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  // output[out_at, out_at + len) = the fold of src(r)[0, len) over the ranks, in pieces that stay
  // in cache. This rank's own piece is read from a copy when the output overwrites it.
  const auto reduce = [&](int64_t out_at, int64_t len, auto&& src) {
    const int64_t piece = static_cast<int64_t>(kPieceBytes / isz);
    for (int64_t x = 0; x < len; x += piece) {
      const int64_t k = std::min(piece, len - x);
      const char* own = src(me) + x * isz;
      if (own == out + (out_at + x) * isz && n > 1) {
        scratch_.resize(kPieceBytes);
        std::memcpy(scratch_.data(), own, k * isz);
        own = scratch_.data();
      }
      fold(call, out_at + x, k, [&](int64_t r, char*) {
        return r == me ? own : static_cast<const char*>(src(r) + x * isz);
      });
    }
  };
  // NOTE [fused fold]: each of `dsts` = the fold of every rank's `len` elements at src(r), in one
  // pass, streaming into destinations that are not sources (in place, the block was just read
  // and is in cache). False when (dtype, op) needs ATen's fold (`reduce`).
  const auto fused = [&](absl::Span<char* const> dsts, int64_t len, auto&& src) {
    absl::InlinedVector<const char*, 8> srcs(n);
    for (int64_t r = 0; r < n; ++r) srcs[r] = src(r);
    absl::InlinedVector<bool, 8> streams(dsts.size());
    for (size_t d = 0; d < dsts.size(); ++d) {
      streams[d] = streaming && std::find(srcs.begin(), srcs.end(), dsts[d]) == srcs.end();
    }
    return fold_raw(dsts, streams, srcs, len, call.output.scalar_type(), call.op);
  };
  // Every rank has finished the steps up to `last`: then no peer reads this rank's input or
  // writes its output any more.
  const auto finish = [&](uint64_t last) {
    ctrl(me)->consumed.store(last, std::memory_order_release);
    await(op, &Ctrl::consumed, last, "did not finish");
    return last;
  };
  switch (mode) {
    case SymMode::kPull:
      switch (call.kind) {
        case CollectiveKind::kAllGather:
          for (int64_t k = 0; k < n; ++k) {
            const int64_t r = (me + k) % n;
            copy(out + offset_of(call.output_splits, r) * isz, peer_input(r),
                 call.output_splits[r] * isz);
          }
          break;
        case CollectiveKind::kReduceScatter: {
          const int64_t off = offset_of(call.output_splits, me) * isz;
          const auto src = [&](int64_t r) { return peer_input(r) + off; };
          if (!fused({out}, call.output_splits[me], src)) reduce(0, call.output_splits[me], src);
          break;
        }
        case CollectiveKind::kAllToAll:
          for (int64_t k = 0; k < n; ++k) {
            const int64_t s = (me + k) % n;
            copy(out + offset_of(call.output_splits, s) * isz,
                 peer_input(s) + offset_of(snaps_[s].in, me) * isz, snaps_[s].in[me] * isz);
          }
          break;
        case CollectiveKind::kBroadcast:
          copy(out, peer_input(call.src), call.output.numel() * isz);
          break;
        default:
          break;
      }
      return finish(t);
    case SymMode::kPush: {  // all_gather: this rank's shard into every output
      const int64_t at = offset_of(call.output_splits, me) * isz;
      for (int64_t k = 0; k < n; ++k) {
        copy(peer_output((me + k) % n) + at, in, call.input.numel() * isz);
      }
      return finish(t);
    }
    case SymMode::kOneShot: {
      const auto src = [&](int64_t r) { return peer_input(r); };
      if (!fused({out}, call.output.numel(), src)) reduce(0, call.output.numel(), src);
      return finish(t);
    }
    case SymMode::kTwoShot: {
      // This rank reduces its chunk and writes it into every output, its own and the peers', in
      // one pass (NOTE [fused fold]): one step, and no rank reads a reduced chunk back.
      const int64_t numel = call.output.numel(), chunk = (numel + n - 1) / n;
      const int64_t lo = std::min(me * chunk, numel), len = std::min(lo + chunk, numel) - lo;
      absl::InlinedVector<char*, 8> dsts{out + lo * isz};
      for (int64_t j = 1; j < n; ++j) dsts.push_back(peer_output((me + j) % n) + lo * isz);
      if (fused(dsts, len, [&](int64_t r) { return peer_input(r) + lo * isz; })) return finish(t);
      // Otherwise piece by piece through ATen, pushing each reduced piece (still in cache).
      const int64_t piece = static_cast<int64_t>(kPieceBytes / isz);
      for (int64_t x = 0; x < len; x += piece) {
        const int64_t k = std::min(piece, len - x), at = (lo + x) * isz;
        reduce(lo + x, k, [&](int64_t r) { return peer_input(r) + at; });
        for (int64_t j = 1; j < n; ++j) copy(peer_output((me + j) % n) + at, out + at, k * isz);
      }
      return finish(t);
    }
    case SymMode::kNone:
      break;
  }
  return finish(t);
}

}  // namespace dtensor::collectives::shm_detail
