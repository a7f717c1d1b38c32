// NOTE [cross-mesh redistribute] on real tensors (threads backend): for pairs of meshes that are
// disjoint, overlapping, equal as rank sets with another shape, or reversed, and for every pair
// of layouts (R, S(d) per mesh dim on both sides, P(sum) on the source), each rank starts from
// its piece of the source (the absent piece outside the source mesh), runs the planned move and
// must hold exactly its piece of the target (the absent piece outside the target mesh). The plan
// must send no element twice: each destination rank receives exactly the part of its box it
// does not hold, and ranks outside both meshes take no part.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"

namespace dtensor {
namespace {

std::vector<Placements> layouts(int64_t mesh_ndim, int64_t tensor_ndim, bool partial) {
  std::vector<Placement> choices = {Replicate()};
  for (int32_t d = 0; d < tensor_ndim; ++d) choices.push_back(Shard(d));
  if (partial) choices.push_back(Partial());
  std::vector<Placements> out = {{}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const Placements& p : out) {
      for (const Placement c : choices) {
        Placements q = p;
        q.push_back(c);
        next.push_back(q);
      }
    }
    out = next;
  }
  return out;
}

// The piece a rank holds of `global` laid out as `spec`, or the absent piece outside its mesh.
at::Tensor piece_of(const at::Tensor& global, const DTensorSpec& spec, int64_t rank) {
  const auto coord = spec.mesh().coordinate(rank);
  if (!coord) return absent_piece(spec, global.options());
  return local_tensor_for(global, spec, *coord);
}

void run_pairs(int64_t world, const DeviceMesh& a, const DeviceMesh& b,
               const std::vector<std::vector<int64_t>>& shapes) {
  std::mutex mu;
  std::vector<std::string> failures;
  int64_t checked = 0;
  for (const auto& shape : shapes) {
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    const at::Tensor global = (at::arange(numel, at::kDouble) * 7 - 5).reshape(shape);
    const TensorMeta meta = TensorMeta::make(shape, at::kDouble);
    std::vector<std::pair<DTensorSpec, DTensorSpec>> pairs;
    for (const Placements& ps : layouts(a.ndim(), meta.ndim(), true)) {
      for (const Placements& pd : layouts(b.ndim(), meta.ndim(), false)) {
        pairs.emplace_back(DTensorSpec::make(a, ps, meta), DTensorSpec::make(b, pd, meta));
      }
    }
    for (const auto& [src, dst] : pairs) {
      // No element twice: what a destination rank receives is its box minus what it holds.
      const auto plan = plan_cross_mesh(src, dst);
      for (const int64_t r : b.ranks()) {
        int64_t got = 0;
        for (const auto& m : plan->moves) got += m.to == r ? m.box.numel() : 0;
        EXPECT_EQ(got, local_box_of_rank(dst, r)->numel()) << plan->to_string();
      }
      for (const auto& m : plan->moves) {
        EXPECT_TRUE(a.contains(m.from) && b.contains(m.to)) << plan->to_string();
      }
    }
    collectives::run_threads(world, [&](int64_t rank) {
      for (const auto& [src, dst] : pairs) {
        // A source piece holds the global value once: P(sum) pieces as local_tensor_for makes them.
        const at::Tensor in = piece_of(global, src, rank);
        const at::Tensor got = execute_cross_mesh(*plan_cross_mesh(src, dst), in);
        const at::Tensor want = piece_of(global, dst, rank);
        if (got.sizes() != want.sizes() || !at::equal(got, want)) {
          std::lock_guard<std::mutex> lock(mu);
          if (failures.size() < 10) {
            failures.push_back("rank " + std::to_string(rank) + ": " + src.to_string() + " -> " +
                               dst.to_string() + "\n got " + c10::str(got) + "\n want " +
                               c10::str(want));
          }
        }
        if (rank == 0) ++checked;
      }
    });
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GT(checked, 0);
  std::printf("%s -> %s: %lld moves checked on every rank\n", a.to_string().c_str(),
              b.to_string().c_str(), static_cast<long long>(checked));
}

DeviceMesh mesh(std::vector<int64_t> shape, std::vector<int64_t> ranks) {
  return DeviceMesh(std::move(shape), std::move(ranks));
}

TEST(CrossMeshTest, DisjointMeshes) {
  run_pairs(4, mesh({2}, {0, 1}), mesh({2}, {2, 3}), {{6, 3}, {5}, {1, 3}});
}

TEST(CrossMeshTest, OverlappingMeshesOfOtherSizes) {
  run_pairs(4, mesh({3}, {0, 1, 2}), mesh({2}, {2, 3}), {{7, 4}, {2}});
}

TEST(CrossMeshTest, SameRanksAnotherShape) {
  run_pairs(4, mesh({2, 2}, {0, 1, 2, 3}), mesh({4}, {3, 2, 1, 0}), {{8, 6}, {5, 3}});
}

TEST(CrossMeshTest, TwoDimensionalToTwoDimensionalDisjoint) {
  run_pairs(8, mesh({2, 2}, {0, 1, 2, 3}), mesh({2, 2}, {4, 6, 5, 7}), {{4, 6}});
}

// A rank outside both meshes takes no part: it is not in the exchange's group (a collective over
// the world would hang here, as rank 4 never calls it).
TEST(CrossMeshTest, RanksOutsideBothMeshesTakeNoPart) {
  const DeviceMesh a = mesh({2}, {0, 1}), b = mesh({2}, {2, 3});
  const TensorMeta meta = TensorMeta::make({4, 2}, at::kDouble);
  const DTensorSpec src = DTensorSpec::make(a, {Shard(0)}, meta);
  const DTensorSpec dst = DTensorSpec::make(b, {Shard(1)}, meta);
  const at::Tensor global = at::arange(8, at::kDouble).reshape({4, 2});
  collectives::run_threads(5, [&](int64_t rank) {
    if (rank == 4) return;
    const at::Tensor got =
        execute_cross_mesh(*plan_cross_mesh(src, dst), piece_of(global, src, rank));
    EXPECT_TRUE(at::equal(got, piece_of(global, dst, rank))) << rank;
  });
}

// With async_op, a rank that only sends (a pipeline stage passing activations on) may return at
// once with a pending absent piece (waited by wait_tensor); its strided boxes are read until the
// exchange is done, and the receivers hold one device's pieces, call after call.
TEST(CrossMeshTest, PureSendersMayGoOnAsynchronously) {
  const DeviceMesh a = mesh({2}, {0, 1}), b = mesh({2}, {2, 3});
  const TensorMeta meta = TensorMeta::make({6, 10}, at::kDouble);
  const DTensorSpec src = DTensorSpec::make(a, {Shard(0)}, meta);
  const DTensorSpec dst = DTensorSpec::make(b, {Shard(1)}, meta);
  const at::Tensor global = at::arange(60, at::kDouble).reshape({6, 10});
  collectives::run_threads(4, [&](int64_t rank) {
    for (int i = 0; i < 3; ++i) {
      const at::Tensor got = execute_cross_mesh(*plan_cross_mesh(src, dst),
                                                piece_of(global, src, rank), /*async_op=*/true);
      EXPECT_TRUE(at::equal(collectives::wait_tensor(got), piece_of(global, dst, rank))) << rank;
    }
  });
}

TEST(CrossMeshTest, RefusesAnotherTensorOrAPartialTarget) {
  const DeviceMesh a = mesh({2}, {0, 1}), b = mesh({2}, {2, 3});
  const DTensorSpec src = DTensorSpec::make(a, {Shard(0)}, TensorMeta::make({4, 2}, at::kFloat));
  EXPECT_THROW(
      plan_cross_mesh(src, DTensorSpec::make(b, {Shard(0)}, TensorMeta::make({4, 3}, at::kFloat))),
      Error);
  EXPECT_THROW(
      plan_cross_mesh(src, DTensorSpec::make(b, {Partial()}, TensorMeta::make({4, 2}, at::kFloat))),
      Error);
}

}  // namespace
}  // namespace dtensor
