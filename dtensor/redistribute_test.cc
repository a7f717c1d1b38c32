// The redistribute executor on real tensors: for every pair of layouts of the enumeration (every
// placement R, S(d), P(sum), P(max) per mesh dim, every shard order, even, uneven and empty
// shapes) on meshes (4), (2,2), (2,3) and (2,2,2), each rank starts from its local tensor of the
// source layout, runs the planned redistribute on the threads backend, and must hold exactly its
// local tensor of the target layout (the single-device oracle: slicing the global tensor), with
// full_tensor() equal to the global tensor, and the bytes handed to each collective (at most over
// the ranks) must equal the plan's. Moves PyTorch refuses must be refused before any
// communication. On (2,2,2) each Partial op gets its own run.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/dtensor.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"
#include "layout/testing/layout_enumeration.h"

namespace dtensor {
namespace {

using testing::all_shard_orders;

// Every spec on `mesh` for `shape` with placements from `choices` per mesh dim, every order.
std::vector<DTensorSpec> specs_for(const DeviceMesh& mesh, const std::vector<int64_t>& shape,
                                   std::vector<Placement> choices, c10::ScalarType dtype) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  for (int32_t d = 0; d < ndim; ++d) choices.push_back(Shard(d));
  const int64_t per = static_cast<int64_t>(choices.size());
  int64_t combos = 1;
  for (int64_t m = 0; m < mesh.ndim(); ++m) combos *= per;
  std::vector<DTensorSpec> out;
  for (int64_t c = 0; c < combos; ++c) {
    Placements p;
    for (int64_t m = 0, rem = c; m < mesh.ndim(); ++m, rem /= per) p.push_back(choices[rem % per]);
    for (const ShardOrder& order : all_shard_orders(p, ndim)) {
      out.push_back(DTensorSpec::make(mesh, p, TensorMeta::make(shape, dtype), order));
    }
  }
  return out;
}

bool allowed(const DTensorSpec& src, const DTensorSpec& dst) {
  for (int64_t m = 0; m < src.mesh().ndim(); ++m) {
    if (dst.placement(m).is_partial() && dst.placement(m) != src.placement(m)) return false;
  }
  return true;
}

// Integers (exact in double under any fold order), distinct enough to catch misplaced elements.
at::Tensor global_for(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kLong) * 7 % 23 - 11).reshape(shape).to(dtype);
}

// Per plan, per collective step: the most bytes any rank handed that collective (all_gather: its
// output; all_to_all_v: what it received; the others: their input), as the cost model counts.
struct Moved {
  std::mutex mu;
  std::map<const RedistributePlan*, std::vector<int64_t>> most;
};

void record_bytes(const RedistributePlan& plan, const collectives::CommCounter& counter,
                  Moved& moved) {
  std::vector<int64_t> bytes;
  size_t k = 0;
  for (const PlanStep& s : plan.steps) {
    if (s.kind == CommKind::kLocalChunk || s.kind == CommKind::kPartition) continue;
    if (k >= counter.records().size()) {
      bytes.push_back(-1);  // a collective step that ran no collective
      continue;
    }
    const auto& r = counter.records()[k++];
    const bool by_output = s.kind == CommKind::kAllGather || s.kind == CommKind::kAllToAllV;
    bytes.push_back(by_output ? r.output_bytes : r.input_bytes);
  }
  if (k != counter.records().size()) bytes.push_back(-2);  // more collectives than steps
  std::lock_guard<std::mutex> lock(moved.mu);
  auto& most = moved.most[&plan];
  most.resize(std::max(most.size(), bytes.size()), 0);
  for (size_t i = 0; i < bytes.size(); ++i) most[i] = std::max(most[i], bytes[i]);
}

struct Case {
  std::vector<int64_t> mesh;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<Placement> choices;  // besides Shard(d) for every tensor dim
  bool nonnegative = false;        // |values|: a Partial(norm)'s value is a norm
};

void run_all_pairs(const Case& c, bool async_op) {
  const DeviceMesh mesh = DeviceMesh::arange(c.mesh);
  std::atomic<int64_t> runs{0}, refused{0};
  Moved moved;
  std::mutex mu;
  std::vector<std::string> failures;
  for (const auto& shape : c.shapes) {
    const at::Tensor global = global_for(shape, at::kDouble);
    const auto specs = specs_for(mesh, shape, c.choices, at::kDouble);
    // Refusals first, once, without any communication.
    std::vector<std::pair<DTensorSpec, DTensorSpec>> pairs;
    for (const auto& src : specs) {
      for (const auto& dst : specs) {
        if (allowed(src, dst)) {
          pairs.emplace_back(src, dst);
        } else {
          EXPECT_THROW(plan_redistribute(src, dst), dtensor::Error)
              << src.to_string() << " -> " << dst.to_string();
          ++refused;
        }
      }
    }
    collectives::run_threads(mesh.size(), [&](int64_t rank) {
      const auto coord = *mesh.coordinate(rank);
      for (const auto& [src, dst] : pairs) {
        const at::Tensor local = local_tensor_for(global, src, coord);
        const at::Tensor before = local.clone();
        const auto plan = plan_redistribute(src, dst);
        collectives::CommCounter counter;
        at::Tensor got = execute_plan(*plan, local, async_op);
        if (async_op) got = collectives::wait_tensor(got);
        record_bytes(*plan, counter, moved);
        const at::Tensor want = local_tensor_for(global, dst, coord);
        std::string bad;
        if (got.sizes() != want.sizes() || !at::equal(got, want)) {
          bad = "wrong values";
        } else if (!dst.has_partial() && !at::equal(DTensor(got, dst).full_tensor(), global)) {
          bad = "full_tensor() differs from the global tensor";
        } else if (!at::equal(local, before)) {
          bad = "input modified";
        } else if (!plan->is_noop() && got.numel() > 0 &&
                   got.storage().unsafeGetStorageImpl() == local.storage().unsafeGetStorageImpl()) {
          bad = "result aliases the input";
        }
        if (!bad.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          if (failures.size() < 20) {
            failures.push_back(bad + " on rank " + std::to_string(rank) + ": " + plan->to_string() +
                               "\n got " + c10::str(got.sizes()) + "\n" + c10::str(got) +
                               "\n want " + c10::str(want.sizes()) + "\n" + c10::str(want));
          }
        }
        if (rank == 0) ++runs;
      }
    });
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
  // The bytes the collectives were given, at their largest over the ranks, are the plan's.
  int64_t steps = 0;
  for (const auto& [plan, most] : moved.most) {
    int64_t k = 0;
    for (const PlanStep& s : plan->steps) {
      if (s.kind == CommKind::kLocalChunk || s.kind == CommKind::kPartition) continue;
      EXPECT_EQ(most.at(k), s.bytes) << plan->to_string() << " step " << s.to_string();
      ++k, ++steps;
    }
  }
  EXPECT_GT(steps, 0);
  EXPECT_GT(runs.load(), 0);
  std::printf("mesh (%s): %lld redistributes checked on every rank, %lld refused\n",
              c10::str(c10::IntArrayRef(c.mesh)).c_str(), static_cast<long long>(runs.load()),
              static_cast<long long>(refused.load()));
}

const std::vector<Placement> kAll = {Replicate(), Partial(), Partial(ReduceOp::kAvg),
                                     Partial(ReduceOp::kMax)};
const std::vector<Placement> kNoMax = {Replicate(), Partial()};

TEST(RedistributeTest, EveryPairOnMesh4) {
  run_all_pairs({{4}, {{8, 4}, {5, 3}, {3}, {0, 2}, {2, 1, 5}}, kAll}, false);
}

TEST(RedistributeTest, EveryPairOnMesh2x2) {
  run_all_pairs({{2, 2}, {{8, 4}, {5, 3}, {3, 2}, {0, 3}}, kAll}, false);
}

TEST(RedistributeTest, EveryPairOnMesh2x3) {
  run_all_pairs({{2, 3}, {{12, 6}, {7, 5}}, kAll}, false);
}

// On (2,2,2) one Partial op at a time keeps the pair count (and the run time) in bounds.
TEST(RedistributeTest, EveryPairOnMesh2x2x2) {
  run_all_pairs({{2, 2, 2}, {{5, 6}}, {Replicate(), Partial()}}, false);
}

TEST(RedistributeTest, EveryPairOnMesh2x2x2PartialAvg) {
  run_all_pairs({{2, 2, 2}, {{4, 3}}, {Replicate(), Partial(ReduceOp::kAvg)}}, false);
}

TEST(RedistributeTest, EveryPairOnMesh2x2x2PartialMax) {
  run_all_pairs({{2, 2, 2}, {{3, 7}}, {Replicate(), Partial(ReduceOp::kMax)}}, false);
}

// A Partial(norm 2) reduces as the signed square root of a sum of signed squares (NOTE [p-norm
// Partial]): exact on these integers, negative ones included.
TEST(RedistributeTest, EveryPairOnMesh2x2PartialNorm) {
  run_all_pairs({{2, 2}, {{5, 3}, {8, 4}}, {Replicate(), Placement::partial_norm(2)}}, false);
}

TEST(RedistributeTest, AsyncLastStepOnMesh2x2) {
  run_all_pairs({{2, 2}, {{8, 4}, {5, 3}}, kNoMax}, true);
}

TEST(RedistributeTest, NoOpReturnsTheInputItself) {
  const DeviceMesh mesh = DeviceMesh::arange({2});
  const auto spec = DTensorSpec::make(mesh, {Shard(0)}, TensorMeta::make({4}, at::kDouble));
  collectives::run_threads(2, [&](int64_t rank) {
    const at::Tensor local = at::ones({2}, at::kDouble);
    const at::Tensor got = redistribute_local(local, spec, spec);
    EXPECT_TRUE(got.is_same(local));
  });
}

TEST(RedistributeTest, WrongLocalShapeIsAClearError) {
  const DeviceMesh mesh = DeviceMesh::arange({2});
  const auto src = DTensorSpec::make(mesh, {Shard(0)}, TensorMeta::make({5}, at::kDouble));
  const auto dst = DTensorSpec::make(mesh, {Replicate()}, TensorMeta::make({5}, at::kDouble));
  collectives::run_threads(2, [&](int64_t rank) {
    try {
      redistribute_local(at::ones({4}, at::kDouble), src, dst);
      ADD_FAILURE() << "no error";
    } catch (const dtensor::Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds a local tensor"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dtensor
