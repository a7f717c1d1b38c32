// The DTensor value API on the threads backend: distribute_tensor, from_local, to_local,
// full_tensor, redistribute (sync and async) against the single-device tensor, their errors, and
// autograd: for every pair of layouts the gradient that reaches the source's local tensor must be
// the source's local piece of the single-device gradient (NOTE [DTensor autograd]).

#include "dtensor/dtensor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>

#include "base/testing/expect_error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/local_tensor.h"
#include "layout/testing/layout_enumeration.h"

namespace dtensor {
namespace {

using collectives::run_threads;
using testing::expect_error;

at::Tensor global_for(const std::vector<int64_t>& shape, int64_t salt = 0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return ((at::arange(numel, at::kLong) * 7 + salt) % 23 - 11).reshape(shape).to(at::kDouble);
}

std::vector<Placements> placements_on(int64_t mesh_ndim, int64_t tensor_ndim, bool partial) {
  std::vector<Placement> choices = {Replicate()};
  if (partial) choices.push_back(Partial());
  for (int32_t d = 0; d < tensor_ndim; ++d) choices.push_back(Shard(d));
  std::vector<Placements> out = {{}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const auto& p : out) {
      for (Placement c : choices) {
        next.push_back(p);
        next.back().push_back(c);
      }
    }
    out = std::move(next);
  }
  return out;
}

// Collects failures from rank threads; reports them on the test thread.
struct Failures {
  std::mutex mu;
  std::vector<std::string> items;
  void add(std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    if (items.size() < 20) items.push_back(std::move(s));
  }
  ~Failures() {
    for (const auto& f : items) ADD_FAILURE() << f;
  }
};

void check_equal(Failures& f, const at::Tensor& got, const at::Tensor& want,
                 const std::string& what) {
  if (got.sizes() != want.sizes() || !at::equal(got, want)) {
    f.add(what + "\n got " + c10::str(got) + "\n want " + c10::str(want));
  }
}

TEST(DTensorTest, DistributeEveryLayoutAndGatherBack) {
  Failures f;
  for (const auto& mesh_shape : std::vector<std::vector<int64_t>>{{4}, {2, 2}}) {
    const DeviceMesh mesh = DeviceMesh::arange(mesh_shape);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 4}, {5, 3}, {0, 2}}) {
      const at::Tensor global = global_for(shape);
      run_threads(mesh.size(), [&](int64_t rank) {
        const auto coord = *mesh.coordinate(rank);
        for (const auto& p : placements_on(mesh.ndim(), 2, false)) {
          const DTensor d = distribute_tensor(global, mesh, p);
          const std::string what = "rank " + std::to_string(rank) + " " + d.to_string();
          check_equal(f, d.to_local(), local_tensor_for(global, d.spec(), coord), what);
          check_equal(f, d.full_tensor(), global, what + " full_tensor");
          EXPECT_EQ(d.shape(), shape);
          // From rank 1's data only: the others pass zeros of the same shape.
          const at::Tensor mine = rank == 1 ? global : at::zeros_like(global);
          const DTensor s = distribute_tensor(mine, mesh, p, /*src_rank=*/1);
          check_equal(f, s.to_local(), local_tensor_for(global, s.spec(), coord), what + " src 1");
        }
      });
    }
  }
}

TEST(DTensorTest, RedistributeSyncAndAsyncMatchTheOracle) {
  Failures f;
  const DeviceMesh mesh = DeviceMesh::arange({2, 2});
  const at::Tensor global = global_for({6, 5});
  run_threads(4, [&](int64_t rank) {
    const auto coord = *mesh.coordinate(rank);
    const auto all = placements_on(2, 2, true);
    for (const auto& a : all) {
      const auto src = DTensorSpec::make(mesh, a, TensorMeta::make({6, 5}, at::kDouble));
      const DTensor d(local_tensor_for(global, src, coord), src);
      for (const auto& b : all) {
        bool ok = true;
        for (int64_t m = 0; m < 2; ++m) ok = ok && (!b[m].is_partial() || a[m] == b[m]);
        if (!ok) continue;
        for (bool async_op : {false, true}) {
          const DTensor e = d.redistribute(b, async_op);
          check_equal(f, e.to_local(), local_tensor_for(global, e.spec(), coord),
                      d.to_string() + " -> " + to_string(b));
        }
      }
    }
  });
}

TEST(DTensorTest, FromLocalEvenUnevenAndRunCheck) {
  const DeviceMesh mesh = DeviceMesh::arange({2});
  run_threads(2, [&](int64_t rank) {
    // Even: the global shape is inferred.
    const DTensor even = from_local(at::ones({3, 2}, at::kDouble), mesh, {Shard(0)}, true);
    EXPECT_EQ(even.shape(), (std::vector<int64_t>{6, 2}));
    // Uneven: 5 rows as 3 + 2, with the shape given, checked across ranks.
    const at::Tensor piece = at::full({rank == 0 ? 3 : 2, 2}, rank, at::kDouble);
    const DTensor uneven = from_local(piece, mesh, {Shard(0)}, true, std::vector<int64_t>{5, 2});
    const at::Tensor full = uneven.full_tensor();
    EXPECT_TRUE(
        at::equal(full, at::cat({at::zeros({3, 2}, at::kDouble), at::ones({2, 2}, at::kDouble)})));
    // Without the shape, uneven pieces make the ranks infer different global shapes: run_check
    // finds it and names every rank's piece; a local piece the given shape cannot hold is refused
    // even without it.
    expect_error([&] { from_local(piece, mesh, {Shard(0)}, true); },
                 "differ across ranks (rank 0 Double[3,2], rank 1 Double[2,2])");
    expect_error(
        [&] {
          from_local(at::ones({4, 2}), mesh, {Shard(0)}, false, std::vector<int64_t>{5, 2});
        },
        "does not match");
    // run_check names the rank whose piece disagrees, on every rank.
    const at::Tensor wrong = at::ones({rank == 1 ? 4 : 3, 2}, at::kDouble);
    expect_error(
        [&] {
          from_local(wrong, mesh, {Shard(0)}, true, std::vector<int64_t>{6, 2});
        },
        "rank 1 holds Double[4,2]");
  });
}

TEST(DTensorTest, ClearErrors) {
  const DeviceMesh mesh = DeviceMesh::arange({2});
  const DeviceMesh other = DeviceMesh::arange({2, 1});
  run_threads(2, [&](int64_t rank) {
    const at::Tensor t = at::ones({4}, at::kDouble);
    expect_error([&] { distribute_tensor(t, mesh, {Partial()}); }, "Partial placements");
    expect_error([&] { distribute_tensor(t, mesh, {Shard(1)}); }, "Shard");
    expect_error([&] { distribute_tensor(t, mesh, {Shard(0)}, 7); }, "src_rank 7");
    const at::Tensor mine = rank == 0 ? t : at::ones({5}, at::kDouble);
    // Checked within the scatter, whose purpose names each rank's shape and dtype.
    expect_error([&] { distribute_tensor(mine, mesh, {Shard(0)}, 0); },
                 "'distribute_tensor Double[4]', group rank 1 for 'distribute_tensor Double[5]'");
    const DTensor d = distribute_tensor(t, mesh, {Shard(0)});
    // Another mesh over the same ranks: a cross-mesh redistribute (NOTE [cross-mesh
    // redistribute]), no longer refused.
    EXPECT_TRUE(at::equal(d.redistribute(other, {Replicate(), Replicate()}).full_tensor(), t));
    expect_error([&] { d.redistribute({Partial()}); }, "Can not redistribute from S(0) to P(sum)");
    const DTensor p = from_local(t, mesh, {Partial(ReduceOp::kMax)});
    expect_error([&] { p.redistribute({Partial()}); }, "a Partial cannot change its reduce op");
  });
}

// For every pair of layouts (source with Partial included): leaf local tensor -> from_local ->
// redistribute -> to_local -> sum(local * W's local piece). Each rank's gradient must be its piece
// of W in the source layout with Partial read as Replicate.
TEST(DTensorTest, RedistributeGradientEveryPair) {
  Failures f;
  for (const auto& mesh_shape : std::vector<std::vector<int64_t>>{{2, 2}, {3}}) {
    const DeviceMesh mesh = DeviceMesh::arange(mesh_shape);
    const std::vector<int64_t> shape = {5, 4};
    const at::Tensor x = global_for(shape), w = global_for(shape, 5);
    const TensorMeta meta = TensorMeta::make(shape, at::kDouble);
    run_threads(mesh.size(), [&](int64_t rank) {
      const auto coord = *mesh.coordinate(rank);
      const auto all = placements_on(mesh.ndim(), 2, true);
      for (const auto& a : all) {
        const auto src = DTensorSpec::make(mesh, a, meta);
        for (const auto& b : all) {
          bool ok = true;
          for (int64_t m = 0; m < mesh.ndim(); ++m) ok = ok && (!b[m].is_partial() || a[m] == b[m]);
          if (!ok) continue;
          const at::Tensor leaf = local_tensor_for(x, src, coord).requires_grad_(true);
          const DTensor d = from_local(leaf, mesh, a, false, shape);
          const DTensor e = d.redistribute(b);
          const at::Tensor w_local = local_tensor_for(w, without_partial(e.spec()), coord);
          (e.to_local() * w_local).sum().backward();
          check_equal(
              f, leaf.grad(), local_tensor_for(w, without_partial(src), coord),
              "rank " + std::to_string(rank) + " grad of " + to_string(a) + " -> " + to_string(b));
        }
      }
    });
  }
}

TEST(DTensorTest, ToLocalGradPlacementsAndFullTensorGradients) {
  const DeviceMesh mesh = DeviceMesh::arange({2});
  const at::Tensor w = global_for({4, 3}, 3);
  run_threads(2, [&](int64_t rank) {
    const auto coord = *mesh.coordinate(rank);
    const TensorMeta meta = TensorMeta::make({4, 3}, at::kDouble);
    // A Partial gradient is reduced: each rank's share of W sums to W on every rank.
    const at::Tensor leaf = at::zeros({4, 3}, at::kDouble).requires_grad_(true);
    const DTensor d = from_local(leaf, mesh, {Replicate()});
    const auto partial = DTensorSpec::make(mesh, {Partial()}, meta);
    const at::Tensor share = local_tensor_for(w, partial, coord);
    (d.to_local(Placements{Partial()}) * share).sum().backward();
    EXPECT_TRUE(at::equal(leaf.grad(), w)) << leaf.grad();
    // full_tensor: the gradient of the gathered tensor comes back as this rank's shard.
    const auto sharded = DTensorSpec::make(mesh, {Shard(0)}, meta);
    const at::Tensor piece = at::zeros({2, 3}, at::kDouble).requires_grad_(true);
    (from_local(piece, mesh, {Shard(0)}).full_tensor() * w).sum().backward();
    EXPECT_TRUE(at::equal(piece.grad(), local_tensor_for(w, sharded, coord))) << piece.grad();
  });
}

}  // namespace
}  // namespace dtensor
