// NOTE [c10d backend]
// Maps each CollectiveCall onto ProcessGroup calls. What Gloo 1.13 lacks is composed from what
// it has: reduce_scatter = all_reduce + keep this rank's segment; uneven all_gather = pad every
// contribution to the largest, list all_gather, trim. Dtypes Gloo cannot reduce travel as a
// wider dtype (bool as uint8, bfloat16 as float32) and are converted back exactly. avg is a sum
// divided locally. Every wait is bounded by the group timeout; a dead peer surfaces as Gloo's
// error, rethrown as CollectiveError naming the collective, group, ranks and elapsed time.

#include "collectives/c10d_backend.h"

#include <ATen/ATen.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
// NOTE [Gloo headers]: PyPI's torch ships no Gloo headers (ProcessGroupGloo.hpp includes
// gloo/algorithm.h, which the wheel lacks), but its libtorch_cpu carries Gloo's code and
// ProcessGroupGloo. The build takes the headers from Debian's libgloo-dev (an older Gloo: only
// types passed by pointer cross between them, and the C++ c10d tests run on that pairing) and
// links no Debian libgloo against pip's torch. Without any Gloo headers this backend cannot
// create a Gloo group itself; it then runs over a ProcessGroup handed in (use_process_group; from
// Python, DeviceMesh.from_group or a group torch.distributed made) and says so otherwise.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define DTENSOR_HAVE_GLOO 1
#endif

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/error.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"

namespace dtensor::collectives {
namespace {

using Clock = std::chrono::steady_clock;

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// What the collectives run on: torch 2.x splits a ProcessGroup into per-device Backends (Gloo is
// one, for the CPU) and the engine calls the CPU Backend directly; torch 1.13's ProcessGroupGloo
// is itself the ProcessGroup.
#if TORCH_VERSION_MAJOR >= 2
using PgHandle = c10::intrusive_ptr<c10d::Backend>;
PgHandle cpu_handle(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& group) {
  try {
    return pg->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception& e) {
    throw Error("c10d backend: the ProcessGroup handed in for group '" + group +
                "' has no CPU backend (create it with backend \"gloo\" or \"cpu:gloo,...\"): " +
                first_line(e.what()));
  }
}
#else
using PgHandle = c10::intrusive_ptr<c10d::ProcessGroup>;
PgHandle cpu_handle(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string&) {
  return pg;
}
#endif

ABSL_CONST_INIT absl::Mutex g_user_pgs_mu(absl::kConstInit);
std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> g_user_pgs
    ABSL_GUARDED_BY(g_user_pgs_mu);

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::kProduct:
      return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    case ReduceOp::kMin:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case ReduceOp::kMax:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::kBand:
      return c10d::ReduceOp(c10d::ReduceOp::BAND);
    case ReduceOp::kBor:
      return c10d::ReduceOp(c10d::ReduceOp::BOR);
    case ReduceOp::kBxor:
      return c10d::ReduceOp(c10d::ReduceOp::BXOR);
    case ReduceOp::kNorm:  // refused earlier by check_reduce_op
      break;
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

// The dtype a tensor travels as: Gloo has no bool or bfloat16 kernels.
c10::ScalarType wire_dtype(c10::ScalarType t) {
  if (t == c10::kBool) return c10::kByte;
  if (t == c10::kBFloat16) return c10::kFloat;
  return t;
}

#ifdef DTENSOR_HAVE_GLOO
std::shared_ptr<::gloo::transport::Device> gloo_device() {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string host = addr ? addr : "127.0.0.1";
  if (host == "127.0.0.1" || host == "localhost") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

// NOTE [SIGPIPE and dead peers]
// Gloo writes to its peers' sockets; once a peer died, a write raises SIGPIPE, whose default
// action kills this rank before Gloo can report the closed connection as an error (seen as
// rank 0 exiting with -13 in the dead-peer test). Python ignores SIGPIPE at start-up; a C++
// program does not. So the first c10d communicator ignores it when its disposition is still the
// default, and a dead peer becomes a CollectiveError naming the collective, as on the other
// backends. A handler the program installed itself is left alone.
void ignore_default_sigpipe() {
  static const bool done = [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

class C10dCommunicator : public Communicator {
 public:
  explicit C10dCommunicator(const CommunicatorOptions& o)
      : Communicator(o.group, group_rank_of(o), o.timeout) {
    ignore_default_sigpipe();
    {
      absl::MutexLock lock(&g_user_pgs_mu);
      auto it = g_user_pgs.find(o.group.name);
      if (it != g_user_pgs.end()) pg_ = cpu_handle(it->second, o.group.name);
    }
    if (!pg_) {
      if (!o.store) {
        throw Error("c10d backend: group '" + o.group.name +
                    "' has no rendezvous store (start ranks with ./x launch or torchrun and call "
                    "init_from_env, or hand in a ProcessGroup with use_process_group)");
      }
#ifndef DTENSOR_HAVE_GLOO
      throw Error("c10d backend: group '" + o.group.name +
                  "' has no ProcessGroup, and this build's torch has no Gloo headers to create "
                  "one (PyPI's torch ships none): hand one in (use_process_group; from Python, "
                  "DeviceMesh.from_group or init_process_group(backend=\"gloo\") before the mesh)");
#else
      auto store =
          c10::make_intrusive<c10d::PrefixStore>("dtensor/" + o.job + "/" + o.group.name, o.store);
      store_ = c10::make_intrusive<c10d::PrefixStore>(
          "dtensor/" + o.job + "/" + o.group.name + "/status", o.store);
      auto options = c10d::ProcessGroupGloo::Options::create(o.timeout);
      options->devices.push_back(gloo_device());
      options->threads = 1;
      const auto start = Clock::now();
      const std::string me = std::to_string(rank());
      try {
        store_->set("joined/" + me, std::vector<uint8_t>(me.begin(), me.end()));
        pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank()),
                                                          static_cast<int>(size()), options);
      } catch (const std::exception& e) {
        // Gloo says only "Socket Timeout": name the ranks that never reached the group.
        std::vector<int64_t> absent;
        try {
          for (int64_t r = 0; r < size(); ++r) {
            if (!store_->check({"joined/" + std::to_string(r)})) absent.push_back(o.group.ranks[r]);
          }
        } catch (const std::exception&) {
          absent.push_back(o.group.ranks[0]);  // the store (rank 0's) is gone
        }
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        throw CollectiveError(
            "connecting the group's Gloo mesh failed after " + std::to_string(ms.count()) +
            " ms (timeout " + std::to_string(o.timeout.count()) + " ms): " + first_line(e.what()) +
            (absent.empty() ? std::string("; every rank reached the group (a peer died while "
                                          "connecting?)")
                            : "; global ranks [" + absl::StrJoin(absent, ",") +
                                  "] never reached it (exited, died, or waiting elsewhere)"));
      }
#endif  // DTENSOR_HAVE_GLOO
    }
    if (pg_->getRank() != rank() || pg_->getSize() != size()) {
      throw Error("c10d backend: process group for '" + o.group.name + "' has rank " +
                  std::to_string(pg_->getRank()) + " of " + std::to_string(pg_->getSize()) +
                  ", the group needs rank " + std::to_string(rank()) + " of " +
                  std::to_string(size()));
    }
  }

  bool compares_calls() const override { return true; }
  void run(CollectiveCall& call) override {
    absl::MutexLock lock(&mu_);  // one call of this rank at a time (NOTE [issuing thread])
    if (!broken_.empty()) throw CollectiveError(broken_);
    call.seq = ++calls_;
    const auto start = Clock::now();
    try {
      check_fingerprints(call);
      dispatch(call);
    } catch (const CollectiveError&) {
      throw;
    } catch (const std::exception& e) {  // c10::Error or gloo's IoException
      if (interrupted_) {  // NOTE [interrupts]: the hook's exception goes up unchanged
        broken_ = where(call) + ": global rank " + std::to_string(group().ranks[rank()]) +
                  " was interrupted (SIGINT) and left the collective";
        throw;
      }
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      // The group's connections are in an unknown state: later calls fail at once.
      broken_ = where(call) + " failed after " + std::to_string(ms.count()) + " ms (timeout " +
                std::to_string(timeout().count()) + " ms): " + first_line(e.what()) + "; " +
                whereabouts(call);
      throw CollectiveError(broken_);
    }
  }

 private:
  std::string where(const CollectiveCall& call) const {
    return (call.label.empty() ? collective_name(call.kind) : call.label) + " #" +
           std::to_string(call.seq) + " on group '" + group().name + "' (c10d/" +
           pg_->getBackendName() + ", ranks [" + absl::StrJoin(group().ranks, ",") +
           "], global rank " + std::to_string(group().ranks[rank()]) + ")";
  }

  // NOTE [c10d fingerprints]
  // Gloo exchanges whatever bytes the ranks hand it: calls that disagree (another collective, a
  // skipped one, another thread's) would pair silently or fail with "Socket Timeout". So every
  // call first all-gathers a fingerprint of each rank's call (sequence number, kind, dtype, reduce
  // op, element count, source, splits, issuing thread) and compares them with the shm and threads
  // backends' checks (mismatch()): a disagreement fails on every rank with both calls described.
  // It costs one small all_gather per call (`./x bench collectives --backends c10d` prints it).
  // When that exchange itself fails (a peer is gone or stuck elsewhere), each rank files what it
  // was doing in the store and reads the others' (whereabouts()), so the error names them.
  void check_fingerprints(const CollectiveCall& call) {
    const int64_t n = size();
    constexpr int64_t kPurposeWords = kPurposeBytes / 8;
    const int64_t width = 6 + 4 + 2 + 2 * n + 3 + kPurposeWords;
    at::Tensor mine = at::zeros({width}, at::kLong);
    int64_t* f = mine.data_ptr<int64_t>();
    const CallSignature sig = signature_of(call);
    f[0] = static_cast<int64_t>(sig.seq);
    f[1] = static_cast<int64_t>(sig.kind);
    f[2] = sig.dtype == c10::ScalarType::Undefined ? -1 : static_cast<int64_t>(sig.dtype);
    f[3] = static_cast<int64_t>(sig.op);
    f[4] = sig.numel;
    f[5] = sig.src;
    std::memcpy(f + 6, call.thread.data(), std::min<size_t>(call.thread.size(), 31));
    const bool has_in = static_cast<int64_t>(call.input_splits.size()) == n;
    const bool has_out = static_cast<int64_t>(call.output_splits.size()) == n;
    f[10] = has_in;
    f[11] = has_out;
    if (has_in) std::copy(call.input_splits.begin(), call.input_splits.end(), f + 12);
    if (has_out) std::copy(call.output_splits.begin(), call.output_splits.end(), f + 12 + n);
    f[12 + 2 * n] = static_cast<int64_t>(call.thread_seq);
    f[13 + 2 * n] = static_cast<int64_t>(call.program_ops);
    f[14 + 2 * n] = static_cast<int64_t>(call.program);
    std::memcpy(f + 15 + 2 * n, call.purpose.data(),
                std::min<size_t>(call.purpose.size(), kPurposeBytes - 1));
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int64_t r = 0; r < n; ++r) outs[0].push_back(at::empty({width}, at::kLong));
    std::vector<at::Tensor> in = {mine};
    wait(pg_->allgather(outs, in));
    std::vector<CallSignature> sigs(n);
    std::vector<std::string> threads(n), purposes(n);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t* g = outs[0][r].data_ptr<int64_t>();
      CallSignature& s = sigs[r];
      s.seq = static_cast<uint64_t>(g[0]);
      s.kind = static_cast<CollectiveKind>(g[1]);
      s.dtype = g[2] < 0 ? c10::ScalarType::Undefined : static_cast<c10::ScalarType>(g[2]);
      s.op = static_cast<ReduceOp>(g[3]);
      s.numel = g[4];
      s.src = g[5];
      const char* text = reinterpret_cast<const char*>(g + 6);
      threads[r].assign(text, strnlen(text, 31));
      s.thread = threads[r];
      if (g[10] != 0) s.input_splits = absl::MakeConstSpan(g + 12, n);
      if (g[11] != 0) s.output_splits = absl::MakeConstSpan(g + 12 + n, n);
      s.thread_seq = static_cast<uint64_t>(g[12 + 2 * n]);
      s.program_ops = static_cast<uint64_t>(g[13 + 2 * n]);
      s.program = static_cast<uint64_t>(g[14 + 2 * n]);
      const char* purpose = reinterpret_cast<const char*>(g + 15 + 2 * n);
      purposes[r].assign(purpose, strnlen(purpose, kPurposeBytes - 1));
      s.purpose = purposes[r];
      if (s.kind > CollectiveKind::kBarrier) s.kind = CollectiveKind::kBarrier;  // garbage guard
    }
    // A rank whose splits are absent cannot be compared split by split: its kind differs.
    const std::string bad = mismatch(sigs);
    if (!bad.empty()) {
      throw CallMismatch(where(call) + ": ranks disagree: " + bad);
    }
  }

  // After a failed call: files this rank's call in the store and gives the peers up to a second
  // to file theirs; returns what each peer was doing, or that it filed nothing (gone, or blocked
  // in a call that has not failed yet).
  std::string whereabouts(const CollectiveCall& call) {
    if (!store_) return "a peer may have died or called a different collective";
    try {
      const std::string prefix = "failed/";
      const std::string what = (call.label.empty() ? collective_name(call.kind) : call.label) +
                               " #" + std::to_string(call.seq);
      store_->set(prefix + std::to_string(rank()), std::vector<uint8_t>(what.begin(), what.end()));
      std::vector<std::string> seen(size());
      const auto until = Clock::now() + std::chrono::seconds(1);
      for (bool all = false; !all && Clock::now() < until;) {
        all = true;
        for (int64_t r = 0; r < size(); ++r) {
          if (!seen[r].empty()) continue;
          if (store_->check({prefix + std::to_string(r)})) {
            const auto v = store_->get(prefix + std::to_string(r));
            seen[r].assign(v.begin(), v.end());
          } else {
            all = false;
          }
        }
        if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::vector<std::string> parts;
      for (int64_t r = 0; r < size(); ++r) {
        if (r == rank()) continue;
        parts.push_back("global rank " + std::to_string(group().ranks[r]) +
                        (seen[r].empty() ? " reported nothing (it exited, died, or waits in "
                                           "another call)"
                                         : " failed in " + seen[r]));
      }
      return absl::StrJoin(parts, "; ");
    } catch (const std::exception&) {
      return "the rendezvous store is gone too (rank 0 exited or died)";
    }
  }

  // Waits in slices of kInterruptPoll with check_interrupt() between them (NOTE [interrupts]);
  // c10d's Work::wait(timeout) throws "timed out" for a slice while the work goes on.
  void wait(const c10::intrusive_ptr<c10d::Work>& work) {
    const auto deadline = Clock::now() + timeout();
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const auto slice = std::max(std::chrono::milliseconds(1), std::min(left, kInterruptPoll));
      try {
        work->wait(slice);
        return;
      } catch (const std::exception&) {
        // The slice may end just before the work completes: then its "Operation timed out!" is
        // stale, and waiting again returns or raises the work's own error.
        if (work->isCompleted()) {
          work->wait(std::chrono::milliseconds(1));
          return;
        }
        if (Clock::now() >= deadline) throw;
      }
      try {
        check_interrupt();
      } catch (...) {
        interrupted_ = true;
        throw;
      }
    }
  }

  void dispatch(CollectiveCall& call) {
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
        all_reduce(call.input, call.output, call.op);
        break;
      case CollectiveKind::kAllGather:
        all_gather(call);
        break;
      case CollectiveKind::kReduceScatter: {
        // Gloo 1.13 has no reduce_scatter: reduce everything, keep this rank's segment.
        at::Tensor full = at::empty_like(call.input);
        all_reduce(call.input, full, call.op);
        int64_t off = 0;
        for (int64_t r = 0; r < rank(); ++r) off += call.output_splits[r];
        call.output.copy_(full.narrow(0, off, call.output_splits[rank()]));
        break;
      }
      case CollectiveKind::kAllToAll:
        all_to_all(call);
        break;
      case CollectiveKind::kBroadcast: {
        if (call.input.numel() == 0) break;  // equal on every rank; Gloo faults on empty buffers
        std::vector<at::Tensor> t = {call.input.to(wire_dtype(call.input.scalar_type()), false,
                                                   /*copy=*/true)};
        c10d::BroadcastOptions opts;
        opts.rootRank = call.src;
        wait(pg_->broadcast(t, opts));
        call.output.copy_(t[0]);
        break;
      }
      case CollectiveKind::kBarrier:
        wait(pg_->barrier());
        break;
    }
  }

  void all_reduce(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
    if (input.numel() == 0) return;  // equal on every rank; Gloo faults on empty buffers
    std::vector<at::Tensor> t = {input.to(wire_dtype(input.scalar_type()), false, /*copy=*/true)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    wait(pg_->allreduce(t, opts));
    output.copy_(t[0]);
    finish_reduce(output, op, size());
  }

  void all_gather(CollectiveCall& call) {
    // Pad every contribution to the largest, gather the list, trim (uneven sizes).
    int64_t longest = 0;
    for (int64_t s : call.output_splits) longest = std::max(longest, s);
    if (longest == 0) return;  // the splits are equal on every rank; Gloo faults on empty buffers
    const auto wire = wire_dtype(call.input.scalar_type());
    std::vector<at::Tensor> in = {at::zeros({longest}, call.input.options().dtype(wire))};
    in[0].narrow(0, 0, call.input.numel()).copy_(call.input);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int64_t r = 0; r < size(); ++r) outs[0].push_back(at::empty_like(in[0]));
    wait(pg_->allgather(outs, in));
    int64_t off = 0;
    for (int64_t r = 0; r < size(); ++r) {
      const int64_t len = call.output_splits[r];
      call.output.narrow(0, off, len).copy_(outs[0][r].narrow(0, 0, len));
      off += len;
    }
  }

  // Gloo faults on empty pairwise messages, which uneven splits produce: every message carries
  // one leading pad element, dropped on receipt.
  void all_to_all(CollectiveCall& call) {
    const auto wire = wire_dtype(call.input.scalar_type());
    const at::Tensor src = call.input.to(wire);
    std::vector<at::Tensor> pieces;
    std::vector<int64_t> in_splits, out_splits;
    int64_t off = 0;
    for (int64_t d = 0; d < size(); ++d) {
      pieces.push_back(at::zeros({1}, src.options()));
      pieces.push_back(src.narrow(0, off, call.input_splits[d]));
      off += call.input_splits[d];
      in_splits.push_back(call.input_splits[d] + 1);
      out_splits.push_back(call.output_splits[d] + 1);
    }
    at::Tensor in = at::cat(pieces);
    at::Tensor out = at::empty({call.output.numel() + size()}, src.options());
    // ProcessGroupGloo moves the split vectors into its work object: hand it copies.
    std::vector<int64_t> out_copy = out_splits, in_copy = in_splits;
    wait(pg_->alltoall_base(out, in, out_copy, in_copy));
    int64_t in_off = 0, out_off = 0;
    for (int64_t s = 0; s < size(); ++s) {
      call.output.narrow(0, out_off, call.output_splits[s])
          .copy_(out.narrow(0, in_off + 1, call.output_splits[s]));
      in_off += out_splits[s];
      out_off += call.output_splits[s];
    }
  }

  PgHandle pg_;
  c10::intrusive_ptr<c10d::Store> store_;  // null for a ProcessGroup handed in by the user
  absl::Mutex mu_;
  uint64_t calls_ = 0;
  std::string broken_;
  bool interrupted_ = false;
};

BackendRegistration g_c10d("c10d", [](const CommunicatorOptions& o) {
  return std::make_unique<C10dCommunicator>(o);
});

}  // namespace

void use_process_group(const std::string& group_name, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  absl::MutexLock lock(&g_user_pgs_mu);
  g_user_pgs[group_name] = std::move(pg);
}

}  // namespace dtensor::collectives
