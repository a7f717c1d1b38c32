// The "threads" backend: every rank of a job is a thread of one process. A collective is a
// rendezvous on state shared by the group's ranks: each rank posts its call, waits until all have
// posted, checks that the calls agree, computes its own output by reading the other ranks'
// inputs in place (no copies beyond the result), then waits until all have read its input before
// returning (its buffers must outlive the readers). Every wait is bounded by the timeout.

#include <ATen/ATen.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "absl/algorithm/container.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "collectives/boxes.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"

namespace dtensor::collectives {
namespace {

using Clock = std::chrono::steady_clock;

// State shared by the ranks of one group of one job. A rendezvous on a condition variable with
// steady-clock deadlines (std:: rather than absl::, whose deadlines are wall-clock times).
struct SharedGroup {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CollectiveCall*> posted;  // this round's calls, by group rank (null: not yet)
  std::vector<char> left;               // this round: rank has finished reading
  int64_t arrived = 0;
  int64_t departed = 0;
  uint64_t round = 0;
  std::string broken;  // set when a round failed for good (timeout): later calls fail at once
};

std::string left_message(const GroupInfo& group, int64_t global_rank, const std::string& why) {
  return absl::StrCat("group '", group.name, "' (threads, ranks [", absl::StrJoin(group.ranks, ","),
                      "]): global rank ", global_rank, " left with an error: ", why);
}

struct JobGroup {
  std::weak_ptr<SharedGroup> group;
  GroupInfo info;
};

ABSL_CONST_INIT absl::Mutex g_groups_mu(absl::kConstInit);
// key: job + '\0' + group name
absl::flat_hash_map<std::string, JobGroup> g_groups ABSL_GUARDED_BY(g_groups_mu);
// The ranks that left each job, with their errors: a group made after a member left is born
// broken (NOTE [leaving a group]). Kept for the process's life (an entry per rank that failed; a
// job's name is never reused), since a peer may make its first group after every group of the
// job has gone.
absl::flat_hash_map<std::string, std::vector<std::pair<int64_t, std::string>>> g_left
    ABSL_GUARDED_BY(g_groups_mu);

std::shared_ptr<SharedGroup> shared_group(const std::string& job, const GroupInfo& info) {
  absl::MutexLock lock(&g_groups_mu);
  JobGroup& entry = g_groups[job + '\0' + info.name];
  auto group = entry.group.lock();
  if (!group) {
    group = std::make_shared<SharedGroup>();
    group->posted.assign(info.ranks.size(), nullptr);
    group->left.assign(info.ranks.size(), 0);
    auto left = g_left.find(job);
    if (left != g_left.end()) {
      for (const auto& [rank, why] : left->second) {
        if (absl::c_linear_search(info.ranks, rank)) {
          group->broken = left_message(info, rank, why);
          break;
        }
      }
    }
    entry = JobGroup{group, info};
  }
  absl::erase_if(g_groups, [](const auto& e) { return e.second.group.expired(); });  // dead jobs
  return group;
}

// JobLeaveHook: every live group of `job` that names `rank` fails its waits, and groups made
// later are born broken.
void leave_threads_job(const std::string& job, int64_t rank, const std::string& why) {
  std::vector<std::pair<std::shared_ptr<SharedGroup>, std::string>> hit;
  {
    absl::MutexLock lock(&g_groups_mu);
    g_left[job].emplace_back(rank, why);
    const std::string prefix = job + '\0';
    for (const auto& [key, entry] : g_groups) {
      if (!absl::StartsWith(key, prefix) || !absl::c_linear_search(entry.info.ranks, rank)) {
        continue;
      }
      if (auto g = entry.group.lock())
        hit.emplace_back(std::move(g), left_message(entry.info, rank, why));
    }
  }
  for (auto& [g, msg] : hit) {
    std::lock_guard<std::mutex> lock(g->mu);
    if (g->broken.empty()) g->broken = msg;
    g->cv.notify_all();
  }
}

// How the ranks' posted calls disagree, or "" (see mismatch() in communicator.h).
std::string posted_mismatch(const std::vector<CollectiveCall*>& calls) {
  std::vector<CallSignature> sigs;
  sigs.reserve(calls.size());
  for (const CollectiveCall* c : calls) sigs.push_back(signature_of(*c));
  return mismatch(sigs);
}

int64_t offset_of(const std::vector<int64_t>& splits, int64_t r) {
  int64_t off = 0;
  for (int64_t i = 0; i < r; ++i) off += splits[i];
  return off;
}

// Computes this rank's output from every rank's posted call.
void compute(const std::vector<CollectiveCall*>& calls, int64_t me) {
  CollectiveCall& mine = *calls[me];
  const int64_t n = static_cast<int64_t>(calls.size());
  switch (mine.kind) {
    case CollectiveKind::kAllReduce: {
      // Every rank folds in group-rank order, so all ranks get bitwise-identical results.
      mine.output.copy_(calls[0]->input);
      for (int64_t r = 1; r < n; ++r) reduce_into(mine.output, calls[r]->input, mine.op);
      finish_reduce(mine.output, mine.op, n);
      break;
    }
    case CollectiveKind::kAllGather:
      for (int64_t r = 0; r < n; ++r) {
        mine.output.narrow(0, offset_of(mine.output_splits, r), mine.output_splits[r])
            .copy_(calls[r]->input);
      }
      break;
    case CollectiveKind::kReduceScatter: {
      const int64_t off = offset_of(mine.output_splits, me), len = mine.output_splits[me];
      mine.output.copy_(calls[0]->input.narrow(0, off, len));
      for (int64_t r = 1; r < n; ++r) {
        reduce_into(mine.output, calls[r]->input.narrow(0, off, len), mine.op);
      }
      finish_reduce(mine.output, mine.op, n);
      break;
    }
    case CollectiveKind::kAllToAll:
      // Straight from the sender's input or boxes into this rank's output or boxes (NOTE [boxed
      // all_to_all]); a boxed call pairs with a flat one of the same splits.
      for (int64_t r = 0; r < n; ++r) copy_boxes(sent_to(*calls[r], me), received_from(mine, r));
      break;
    case CollectiveKind::kBroadcast:
      mine.output.copy_(calls[mine.src]->input);
      break;
    case CollectiveKind::kBarrier:
      break;
  }
}

class ThreadsCommunicator : public Communicator {
 public:
  explicit ThreadsCommunicator(const CommunicatorOptions& o)
      : Communicator(o.group, group_rank_of(o), o.timeout), shared_(shared_group(o.job, o.group)) {}

  bool compares_calls() const override { return true; }
  bool takes_boxes() const override { return true; }
  void run(CollectiveCall& call) override {
    // One call of this rank at a time: two threads sharing a rank's context take turns (their
    // calls are told apart by NOTE [issuing thread]).
    std::lock_guard<std::mutex> mine(mu_);
    call.seq = ++calls_;
    // An in-place all_reduce (NOTE [in-place all_reduce] in communicator.h): the peers read this
    // rank's input while it writes its output, so they read a copy.
    if (call.kind == CollectiveKind::kAllReduce &&
        call.output.data_ptr() == call.input.data_ptr()) {
      call.input = call.input.clone();
    }
    SharedGroup& g = *shared_;
    const auto start = Clock::now();
    const auto deadline = start + timeout();
    std::unique_lock<std::mutex> lock(g.mu);
    // Phase 1: post and wait for everyone.
    const uint64_t my_round = g.round;
    g.posted[rank()] = &call;
    if (++g.arrived == size()) g.cv.notify_all();
    if (!wait(g, lock, call, deadline, [&] { return g.arrived == size() || !g.broken.empty(); })) {
      fail(g, call, "did not arrive", start);
    }
    if (!g.broken.empty()) throw CollectiveError(g.broken);
    const std::string bad = posted_mismatch(g.posted);
    lock.unlock();
    if (bad.empty()) compute(g.posted, rank());
    lock.lock();
    // Phase 2: wait until every rank has read this rank's input, then open the next round.
    g.left[rank()] = 1;
    if (++g.departed == size()) {
      g.arrived = 0;
      g.departed = 0;
      std::fill(g.posted.begin(), g.posted.end(), nullptr);
      std::fill(g.left.begin(), g.left.end(), 0);
      ++g.round;
      g.cv.notify_all();
    } else if (!wait(g, lock, call, deadline,
                     [&] { return g.round != my_round || !g.broken.empty(); })) {
      fail(g, call, "did not finish", start);
    }
    if (!bad.empty()) {
      throw CallMismatch(std::string(call.label.empty() ? collective_name(call.kind) : call.label) +
                         " on group '" + group().name + "' (threads): ranks disagree: " + bad);
    }
  }

 private:
  // cv.wait_until(deadline, ready) in slices of kInterruptPoll with check_interrupt() between
  // them (NOTE [interrupts]): an interrupt marks the group broken, so the peers stop waiting.
  template <class Ready>
  bool wait(SharedGroup& g, std::unique_lock<std::mutex>& lock, const CollectiveCall& call,
            Clock::time_point deadline, Ready&& ready) {
    while (!ready()) {
      const auto slice = std::min(deadline, Clock::now() + kInterruptPoll);
      if (g.cv.wait_until(lock, slice, ready)) return true;
      if (Clock::now() >= deadline) return false;
      lock.unlock();  // the hook may take Python's lock: never hold the group's meanwhile
      try {
        check_interrupt();
      } catch (...) {
        lock.lock();
        g.broken = absl::StrCat(call.label.empty() ? collective_name(call.kind) : call.label, " #",
                                call.seq, " on group '", group().name, "' (threads): global rank ",
                                group().ranks[rank()],
                                " was interrupted (SIGINT) and left the collective");
        g.cv.notify_all();
        lock.unlock();
        throw;
      }
      lock.lock();
    }
    return true;
  }

  // Marks the group broken (so peers stop waiting too) and throws a timeout error naming the
  // ranks that are missing. Called with the lock held.
  [[noreturn]] void fail(SharedGroup& g, const CollectiveCall& call, const char* what,
                         Clock::time_point start) {
    const bool all_arrived = g.arrived == size();
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < size(); ++r) {
      if (all_arrived ? !g.left[r] : g.posted[r] == nullptr) missing.push_back(group().ranks[r]);
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    const std::string msg = absl::StrCat(
        call.label.empty() ? collective_name(call.kind) : call.label, " #", call.seq, " on group '",
        group().name, "' (threads, ranks [", absl::StrJoin(group().ranks, ","), "]): ranks [",
        absl::StrJoin(missing, ","), "] ", what, " within the timeout of ", timeout().count(),
        " ms (global rank ", group().ranks[rank()], " waited ", ms.count(), " ms)");
    g.broken = msg;
    g.cv.notify_all();
    throw CollectiveError(msg);
  }

  void leave(const std::string& why) override {
    SharedGroup& g = *shared_;
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.broken.empty()) g.broken = left_message(group(), group().ranks[rank()], why);
    g.cv.notify_all();
  }

  std::mutex mu_;
  uint64_t calls_ = 0;  // calls this rank made on the group (CollectiveCall::seq)
  std::shared_ptr<SharedGroup> shared_;
};

BackendRegistration g_threads(
    "threads",
    [](const CommunicatorOptions& o) { return std::make_unique<ThreadsCommunicator>(o); },
    leave_threads_job);

}  // namespace
}  // namespace dtensor::collectives
