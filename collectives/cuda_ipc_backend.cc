// NOTE [cuda_ipc backend]
// Backend "cuda_ipc": ranks that are processes of one host and may share one GPU (NCCL refuses
// two ranks on one device). Each rank owns a staging buffer on the tensors' device (device memory
// from symmetric memory's device hooks, which its peers open by IPC handle), and every peer
// addresses every buffer. CPU tensors (control tensors, checkpoint flags) run on the shm backend
// of the same group; with DTENSOR_CUDA_IPC_STAGE_CPU=1 they run through the same staged algorithm
// with POSIX shared-memory buffers instead: that is how machines without a GPU (CI) test it. A
// collective runs in rounds of at most the buffer's size (DTENSOR_CUDA_IPC_BUFFER_BYTES, default 64
// MiB); in each round every rank
//   1. copies its part of the round into its own buffer (on the issuing thread's stream,
//      NOTE [nccl stream order]: after the kernels that computed the input),
//   2. waits for its stream and meets its peers at a host barrier,
//   3. computes its part of the output from the peers' buffers with device copies and
//      reductions (torch kernels on the stream; folds in group-rank order through reduce.h's
//      combine, so the bits equal the other backends'),
//   4. waits for its stream and meets its peers again (no rank refills its buffer while a peer
//      still reads it).
// Layout of a buffer in a round: all_reduce, all_gather and broadcast use it whole; reduce_scatter
// and all_to_all cut it into one slot per destination rank. The host side (the barriers, and a
// descriptor exchanged first: kind, reduction, dtype, device, sizes, all_to_all's splits) runs on
// an shm communicator of the same group, whose call checks (thread, sequence, program digest,
// purpose) apply as for shm; the descriptors decide the rounds, so every rank runs the same number
// of them. A rank that dies or leaves fails its peers' next barrier with the shm backend's
// message. Buffers are made at the group's first call on a device (a collective: every rank makes
// its first call on it at the same point of the group's sequence) and live as long as the
// communicator. Cost per byte: one staging copy and one read (a reduction reads n buffers), all
// on the one GPU the ranks share; on a host with several GPUs the buffers are peer memory.

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/error.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/shm_segment.h"
#include "collectives/symmetric_memory.h"

namespace dtensor::collectives {
namespace {

constexpr size_t kDefaultBufferBytes = size_t{64} << 20;

size_t buffer_bytes_setting() {
  const char* v = std::getenv("DTENSOR_CUDA_IPC_BUFFER_BYTES");
  const size_t bytes = v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : kDefaultBufferBytes;
  return std::max<size_t>(bytes, 1024);
}

// One rank's buffer record, exchanged through the host communicator.
struct Record {
  char name[96] = {};                         // CPU: the segment's name
  char ipc[symmetric::kIpcHandleBytes] = {};  // CUDA: the IPC handle
  uint64_t bytes = 0;
};

// Every rank's staging buffer on one device, addressed from this process.
struct Buffers {
  c10::Device device{c10::kCPU};
  size_t bytes = 0;
  std::vector<char*> base;  // by group rank
  ShmSegment own_segment;   // CPU
  std::vector<ShmSegment> peer_segments;
  void* own_device = nullptr;  // CUDA
  ~Buffers() {
    if (!device.is_cuda()) return;
    // At process exit the CUDA runtime may be gone already (the hooks then throw): nothing to free.
    try {
      const auto& hooks = symmetric::device_hooks();
      for (char* p : base) {
        if (p != nullptr && p != own_device) hooks.close_handle(p, device.index());
      }
      if (own_device != nullptr) hooks.free(own_device, device.index());
    } catch (...) {
    }
  }
};

// The descriptor of one call, as int64s: what the ranks must agree on, and all_to_all's splits.
enum Field : int64_t { kKind, kOp, kDtype, kDevice, kNumel, kOutNumel, kSrc, kFields };

int64_t clamp_len(int64_t total, int64_t off, int64_t cap) {
  return std::max<int64_t>(0, std::min(cap, total - off));
}

class IpcCommunicator final : public Communicator {
 public:
  explicit IpcCommunicator(const CommunicatorOptions& o)
      : Communicator(o.group, group_rank_of(o), o.timeout), job_(o.job) {
    CommunicatorOptions host = o;
    host.group.backend = "shm";
    host_ = make_communicator(host);
    const char* v = std::getenv("DTENSOR_CUDA_IPC_STAGE_CPU");
    stage_cpu_ = v != nullptr && std::string(v) == "1";
  }

  void leave(const std::string& why) override { host_->leave(why); }

  bool compares_calls() const override { return true; }
  void run(CollectiveCall& call) override {
    if (call.kind == CollectiveKind::kBarrier) {
      host_run(call, CollectiveKind::kBarrier);
      return;
    }
    if (!call.input.is_cuda() && !stage_cpu_) {
      host_->run(call);  // CPU tensors: the shm backend of the same group
      return;
    }
    try {
      run_staged(call);
    } catch (const CollectiveError&) {
      throw;
    } catch (const Error& e) {
      throw Error(absl::StrCat(call.label, " on group '", group().name, "' (cuda_ipc), rank ",
                               rank(), ": ", e.what()));
    }
  }

 private:
  // A host-side step of `call` on the shm communicator (errors name the call and this backend).
  void host_run(const CollectiveCall& call, CollectiveKind kind, at::Tensor in = {},
                at::Tensor out = {}, std::vector<int64_t> out_splits = {}) {
    CollectiveCall h;
    h.kind = kind;
    h.input = std::move(in);
    h.output = std::move(out);
    h.output_splits = std::move(out_splits);
    h.label = call.label;
    h.purpose = call.purpose;
    h.thread = call.thread;
    h.thread_seq = call.thread_seq;
    if (kind != CollectiveKind::kBarrier) {
      h.program_ops = call.program_ops;
      h.program = call.program;
    }
    try {
      host_->run(h);
    } catch (const CollectiveError& e) {
      throw CollectiveError(absl::StrCat("cuda_ipc backend (host side on shm): ", e.what()));
    }
  }

  // Every rank's descriptor (n rows of kFields + n).
  std::vector<std::vector<int64_t>> exchange(const CollectiveCall& call) {
    const int64_t n = size(), width = kFields + n;
    at::Tensor mine = at::zeros({width}, at::kLong);
    int64_t* d = mine.data_ptr<int64_t>();
    d[kKind] = static_cast<int64_t>(call.kind);
    d[kOp] = static_cast<int64_t>(call.op);
    d[kDtype] = static_cast<int64_t>(call.input.scalar_type());
    d[kDevice] = call.input.is_cuda() ? 1 : 0;
    d[kNumel] = call.input.numel();
    d[kOutNumel] = call.output.numel();
    d[kSrc] = call.src;
    if (call.kind == CollectiveKind::kAllToAll) {
      for (int64_t i = 0; i < n; ++i) d[kFields + i] = call.input_splits[i];
    }
    at::Tensor all = at::empty({n * width}, at::kLong);
    host_run(call, CollectiveKind::kAllGather, mine, all, std::vector<int64_t>(n, width));
    std::vector<std::vector<int64_t>> rows(n);
    const int64_t* a = all.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) rows[r].assign(a + r * width, a + (r + 1) * width);
    check_agreement(call, rows);
    return rows;
  }

  void check_agreement(const CollectiveCall& call, const std::vector<std::vector<int64_t>>& rows) {
    const int64_t n = size();
    std::vector<CallSignature> sigs;
    // all_to_all: what each rank receives, as its peers' descriptors say (this rank's own
    // output_splits are checked against them below).
    std::vector<std::vector<int64_t>> received(n, std::vector<int64_t>(n));
    bool same = true;
    for (int64_t r = 0; r < n; ++r) {
      const auto& d = rows[r];
      CallSignature s = signature_of(call);
      s.kind = static_cast<CollectiveKind>(d[kKind]);
      s.op = static_cast<ReduceOp>(d[kOp]);
      s.dtype = static_cast<c10::ScalarType>(d[kDtype]);
      s.numel = d[kNumel];
      s.src = d[kSrc];
      if (s.kind == CollectiveKind::kAllToAll) {
        for (int64_t q = 0; q < n; ++q) received[r][q] = rows[q][kFields + r];
        s.input_splits = absl::MakeConstSpan(d.data() + kFields, n);
        s.output_splits = received[r];
      } else if (call.kind == CollectiveKind::kAllToAll) {
        s.input_splits = s.output_splits = {};
      }
      sigs.push_back(s);
      same = same && d[kDevice] == rows[0][kDevice];
    }
    const std::string why = mismatch(sigs);
    if (!why.empty()) {
      throw CallMismatch(absl::StrCat(call.label, " on group '", group().name,
                                      "' (cuda_ipc): ranks disagree: ", why));
    }
    if (!same) {
      std::vector<std::string> devs;
      for (int64_t r = 0; r < n; ++r) {
        devs.push_back(absl::StrCat("group rank ", r, ": ", rows[r][kDevice] ? "cuda" : "cpu"));
      }
      throw CollectiveError(absl::StrCat(call.label, " on group '", group().name,
                                         "' (cuda_ipc): ranks disagree on the device (",
                                         absl::StrJoin(devs, ", "), ")"));
    }
    if (call.kind == CollectiveKind::kAllToAll) {
      for (int64_t s = 0; s < n; ++s) {
        if (rows[s][kFields + rank()] != call.output_splits[s]) {
          throw CollectiveError(absl::StrCat(call.label, " on group '", group().name,
                                             "' (cuda_ipc): group rank ", s, " sends ",
                                             rows[s][kFields + rank()], " elements to group rank ",
                                             rank(), ", which expects ", call.output_splits[s]));
        }
      }
    }
  }

  Buffers& buffers_for(const CollectiveCall& call, c10::Device device) {
    std::unique_ptr<Buffers>& slot = device.is_cuda() ? cuda_ : cpu_;
    if (slot) {
      DTENSOR_CHECK(slot->device == device, "cuda_ipc: group '", group().name, "' runs on ",
                    slot->device.str(), " and cannot also run on ", device.str());
      return *slot;
    }
    auto b = std::make_unique<Buffers>();
    b->device = device;
    b->bytes = buffer_bytes_setting();
    const int64_t n = size(), me = rank();
    Record mine;
    mine.bytes = b->bytes;
    if (device.is_cuda()) {
      const auto& hooks = symmetric::device_hooks();
      DTENSOR_CHECK(hooks.alloc != nullptr,
                    "cuda_ipc: CUDA tensors need a --config=cuda build "
                    "(symmetric memory's CUDA hooks are not installed)");
      b->own_device = hooks.alloc(b->bytes, device.index());
      hooks.export_handle(b->own_device, mine.ipc);
    } else {
      const std::string name = shm_segment_name(job_, absl::StrCat(group().name, "|cuda_ipc|", me));
      b->own_segment = ShmSegment::create(name, b->bytes);
      DTENSOR_CHECK(b->own_segment.valid(), "cuda_ipc: segment ", name, " exists already");
      std::strncpy(mine.name, name.c_str(), sizeof(mine.name) - 1);
    }
    at::Tensor rec = at::empty({static_cast<int64_t>(sizeof(Record))}, at::kByte);
    std::memcpy(rec.data_ptr(), &mine, sizeof(Record));
    at::Tensor all = at::empty({n * static_cast<int64_t>(sizeof(Record))}, at::kByte);
    host_run(call, CollectiveKind::kAllGather, rec, all,
             std::vector<int64_t>(n, static_cast<int64_t>(sizeof(Record))));
    std::vector<Record> recs(n);
    std::memcpy(recs.data(), all.data_ptr(), sizeof(Record) * n);
    b->base.assign(n, nullptr);
    b->peer_segments.resize(n);
    for (int64_t r = 0; r < n; ++r) {
      DTENSOR_CHECK(recs[r].bytes == b->bytes, "cuda_ipc: group rank ", r, " has a ", recs[r].bytes,
                    "-byte buffer, this rank ", b->bytes,
                    " (DTENSOR_CUDA_IPC_BUFFER_BYTES must be equal on every rank)");
      if (r == me) {
        b->base[r] = device.is_cuda() ? static_cast<char*>(b->own_device) : b->own_segment.data();
      } else if (device.is_cuda()) {
        b->base[r] =
            static_cast<char*>(symmetric::device_hooks().open_handle(recs[r].ipc, device.index()));
      } else {
        recs[r].name[sizeof(recs[r].name) - 1] = '\0';
        b->peer_segments[r] = ShmSegment::open(recs[r].name, b->bytes);
        if (!b->peer_segments[r].valid()) {
          throw CollectiveError(absl::StrCat("cuda_ipc: the buffer of group rank ", r, " ('",
                                             recs[r].name, "') is gone"));
        }
        b->base[r] = b->peer_segments[r].data();
      }
    }
    // Every peer has opened every buffer: the names can go (the mappings stay).
    host_run(call, CollectiveKind::kBarrier);
    b->own_segment.unlink_if_current();
    slot = std::move(b);
    return *slot;
  }

  void run_staged(CollectiveCall& call) {
    const auto rows = exchange(call);
    const int64_t n = size(), me = rank();
    const c10::Device device = call.input.defined() ? call.input.device() : call.output.device();
    Buffers& b = buffers_for(call, device);
    std::optional<c10::StreamGuard> guard;
    std::optional<c10::Stream> stream = call.stream;
    if (device.is_cuda() && !stream) {
      stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
    }
    if (stream) guard.emplace(*stream);
    const auto sync = [&] {
      if (stream) stream->synchronize();
    };
    const auto opts = call.output.options();
    const int64_t isz = static_cast<int64_t>(call.output.element_size());
    const int64_t cap = static_cast<int64_t>(b.bytes) / isz;  // elements per buffer
    const int64_t slot = cap / n;                             // elements per slot
    std::vector<at::Tensor> buf(n);
    for (int64_t r = 0; r < n; ++r) buf[r] = at::from_blob(b.base[r], {cap}, opts);
    at::Tensor& in = call.input;
    at::Tensor& out = call.output;
    // One round: stage, meet, read, meet.
    const auto round = [&](auto&& stage, auto&& read) {
      stage();
      sync();
      host_run(call, CollectiveKind::kBarrier);
      read();
      sync();
      host_run(call, CollectiveKind::kBarrier);
    };
    // acc = the fold of part(0..n-1) in group-rank order (reduce.h), finished for avg.
    const auto fold = [&](at::Tensor acc, auto&& part) {
      acc.copy_(part(0));
      for (int64_t r = 1; r < n; ++r) reduce_into(acc, part(r), call.op);
      finish_reduce(acc, call.op, n);
    };
    switch (call.kind) {
      case CollectiveKind::kAllReduce: {
        const int64_t total = in.numel();
        for (int64_t off = 0; off < total; off += cap) {
          const int64_t k = std::min(cap, total - off);
          round([&] { buf[me].narrow(0, 0, k).copy_(in.narrow(0, off, k)); },
                [&] {
                  fold(out.narrow(0, off, k), [&](int64_t r) { return buf[r].narrow(0, 0, k); });
                });
        }
        break;
      }
      case CollectiveKind::kAllGather: {
        const auto& splits = call.output_splits;
        const int64_t most = *std::max_element(splits.begin(), splits.end());
        for (int64_t off = 0; off < most; off += cap) {
          round(
              [&] {
                const int64_t k = clamp_len(splits[me], off, cap);
                if (k > 0) buf[me].narrow(0, 0, k).copy_(in.narrow(0, off, k));
              },
              [&] {
                for (int64_t j = 0; j < n; ++j) {
                  const int64_t r = (me + j) % n, k = clamp_len(splits[r], off, cap);
                  if (k > 0)
                    out.narrow(0, offset_of(splits, r) + off, k).copy_(buf[r].narrow(0, 0, k));
                }
              });
        }
        break;
      }
      case CollectiveKind::kReduceScatter: {
        const auto& splits = call.output_splits;
        const int64_t most = *std::max_element(splits.begin(), splits.end());
        DTENSOR_CHECK(slot > 0, "cuda_ipc: the buffer holds fewer than one element per rank");
        for (int64_t off = 0; off < most; off += slot) {
          round(
              [&] {
                for (int64_t d = 0; d < n; ++d) {
                  const int64_t k = clamp_len(splits[d], off, slot);
                  if (k > 0) {
                    buf[me]
                        .narrow(0, d * slot, k)
                        .copy_(in.narrow(0, offset_of(splits, d) + off, k));
                  }
                }
              },
              [&] {
                const int64_t k = clamp_len(splits[me], off, slot);
                if (k > 0) {
                  fold(out.narrow(0, off, k),
                       [&](int64_t r) { return buf[r].narrow(0, me * slot, k); });
                }
              });
        }
        break;
      }
      case CollectiveKind::kAllToAll: {
        DTENSOR_CHECK(slot > 0, "cuda_ipc: the buffer holds fewer than one element per rank");
        int64_t most = 0;
        for (int64_t s = 0; s < n; ++s) {
          for (int64_t d = 0; d < n; ++d) most = std::max(most, rows[s][kFields + d]);
        }
        const auto sent = [&](int64_t s, int64_t d) { return rows[s][kFields + d]; };
        for (int64_t off = 0; off < most; off += slot) {
          round(
              [&] {
                for (int64_t d = 0; d < n; ++d) {
                  const int64_t k = clamp_len(sent(me, d), off, slot);
                  if (k > 0) {
                    buf[me]
                        .narrow(0, d * slot, k)
                        .copy_(in.narrow(0, offset_of(call.input_splits, d) + off, k));
                  }
                }
              },
              [&] {
                for (int64_t j = 0; j < n; ++j) {
                  const int64_t s = (me + j) % n, k = clamp_len(sent(s, me), off, slot);
                  if (k > 0) {
                    out.narrow(0, offset_of(call.output_splits, s) + off, k)
                        .copy_(buf[s].narrow(0, me * slot, k));
                  }
                }
              });
        }
        break;
      }
      case CollectiveKind::kBroadcast: {
        const int64_t total = out.numel(), src = call.src;
        for (int64_t off = 0; off < total; off += cap) {
          const int64_t k = std::min(cap, total - off);
          round(
              [&] {
                if (me == src) buf[me].narrow(0, 0, k).copy_(in.narrow(0, off, k));
              },
              [&] { out.narrow(0, off, k).copy_(buf[src].narrow(0, 0, k)); });
        }
        break;
      }
      case CollectiveKind::kBarrier:
        break;
    }
  }

  std::string job_;
  std::unique_ptr<Communicator> host_;  // shm, same group: descriptors and barriers
  std::unique_ptr<Buffers> cpu_, cuda_;
  bool stage_cpu_ = false;  // DTENSOR_CUDA_IPC_STAGE_CPU=1
};

BackendRegistration g_cuda_ipc("cuda_ipc", [](const CommunicatorOptions& o) {
  return std::make_unique<IpcCommunicator>(o);
});

}  // namespace
}  // namespace dtensor::collectives
