// _StridedShard on real tensors (NOTE [strided shards] in layout/dtensor_spec.h), against one
// device: for every pair of layouts with placements from {R, S(0), S(1), P(sum), _S(0,2),
// _S(1,3)} per mesh dim on meshes (2), (4) and (2,2), even and uneven shapes, each rank's piece
// (local_tensor_for, distribute_tensor's scatter) must equal PyTorch's rule applied to the
// global tensor by hand (each mesh dim in turn splitting the piece the ones before it left, a
// strided shard by torch.chunk into split_factor pieces, each chunked over the ranks), and the
// planned redistribute must give the target's pieces, with full_tensor() the global tensor.
// Layouts that DTensorSpec::make refuses (a general strided shard sharing its dim) are skipped.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <optional>

#include "collectives/rank_context.h"
#include "dtensor/dtensor.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"

namespace dtensor {
namespace {

// torch.chunk(t, k, d)[i], or an empty slice at the end when torch.chunk makes fewer pieces.
at::Tensor chunk_of(const at::Tensor& t, int64_t k, int64_t d, int64_t i) {
  const auto pieces = t.chunk(k, d);
  if (i < static_cast<int64_t>(pieces.size())) return pieces[i];
  return t.narrow(d, t.size(d), 0);
}

// PyTorch's placements applied by hand, mesh dim 0 first (the single-device oracle).
at::Tensor oracle_piece(const at::Tensor& global, const DeviceMesh& mesh, const Placements& p,
                        const std::vector<int64_t>& coord) {
  at::Tensor x = global;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const int64_t n = mesh.size(m), i = coord[m];
    if (p[m].is_shard()) {
      x = chunk_of(x, n, p[m].dim(), i);
    } else if (p[m].is_strided_shard()) {
      const int64_t d = p[m].dim(), sf = p[m].split_factor();
      std::vector<at::Tensor> mine;
      for (int64_t j = 0; j < sf; ++j) mine.push_back(chunk_of(chunk_of(x, sf, d, j), n, d, i));
      x = at::cat(mine, d);
    } else if (p[m].is_partial() && i != 0) {
      x = at::zeros_like(x);
    }
  }
  return x.contiguous();
}

struct Layout {
  Placements given;  // as PyTorch writes them (the oracle reads these)
  DTensorSpec spec;  // as DTensorSpec::make keeps them
};

std::vector<Layout> layouts_for(const DeviceMesh& mesh, const std::vector<int64_t>& shape) {
  const std::vector<Placement> choices = {Replicate(), Shard(0),           Shard(1),
                                          Partial(),   StridedShard(0, 2), StridedShard(1, 3)};
  const int64_t per = static_cast<int64_t>(choices.size());
  int64_t combos = 1;
  for (int64_t m = 0; m < mesh.ndim(); ++m) combos *= per;
  std::vector<Layout> out;
  for (int64_t c = 0; c < combos; ++c) {
    Placements p;
    for (int64_t m = 0, rem = c; m < mesh.ndim(); ++m, rem /= per) p.push_back(choices[rem % per]);
    try {
      out.push_back({p, DTensorSpec::make(mesh, p, TensorMeta::make(shape, at::kDouble))});
    } catch (const dtensor::Error&) {
      // A general strided shard sharing its dim: refused by design (dtensor_spec_test).
    }
  }
  return out;
}

at::Tensor global_for(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return at::arange(numel, at::kDouble).reshape(shape);
}

void run_all_pairs(const std::vector<int64_t>& mesh_shape,
                   const std::vector<std::vector<int64_t>>& shapes) {
  const DeviceMesh mesh = DeviceMesh::arange(mesh_shape);
  std::atomic<int64_t> runs{0};
  std::mutex mu;
  std::vector<std::string> failures;
  const auto fail_with = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (failures.size() < 20) failures.push_back(what);
  };
  for (const auto& shape : shapes) {
    const at::Tensor global = global_for(shape);
    const auto layouts = layouts_for(mesh, shape);
    collectives::run_threads(mesh.size(), [&](int64_t rank) {
      const auto coord = *mesh.coordinate(rank);
      for (const Layout& src : layouts) {
        const at::Tensor want_src = oracle_piece(global, mesh, src.given, coord);
        if (!at::equal(local_tensor_for(global, src.spec, coord), want_src)) {
          fail_with("local_tensor_for " + src.spec.to_string() + " on rank " +
                    std::to_string(rank) + "\n" + c10::str(want_src));
        }
        bool partial = false;
        for (const Placement& p : src.given) partial = partial || p.is_partial();
        if (!partial) {  // distribute_tensor's scatter from rank 0
          const DTensor d = distribute_tensor(global, mesh, src.given, /*src_rank=*/0);
          if (d.spec() != src.spec || !at::equal(d.to_local(), want_src)) {
            fail_with("distribute_tensor " + src.spec.to_string() + " on rank " +
                      std::to_string(rank));
          }
        }
        for (const Layout& dst : layouts) {
          bool creates_partial = false;
          for (int64_t m = 0; m < mesh.ndim(); ++m) {
            creates_partial =
                creates_partial || (dst.given[m].is_partial() && dst.given[m] != src.given[m]);
          }
          if (creates_partial) continue;  // refused, as in PyTorch
          const at::Tensor got =
              redistribute_local(local_tensor_for(global, src.spec, coord), src.spec, dst.spec);
          const at::Tensor want = oracle_piece(global, mesh, dst.given, coord);
          std::string bad;
          if (got.sizes() != want.sizes() || !at::equal(got, want)) {
            bad = "wrong values";
          } else if (!dst.spec.has_partial() &&
                     !at::equal(DTensor(got, dst.spec).full_tensor(), global)) {
            bad = "full_tensor() differs from the global tensor";
          }
          if (!bad.empty()) {
            fail_with(bad + " on rank " + std::to_string(rank) + ": " +
                      plan_redistribute(src.spec, dst.spec)->to_string() + "\n got " +
                      c10::str(got) + "\n want " + c10::str(want));
          }
          if (rank == 0) ++runs;
        }
      }
    });
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GT(runs.load(), 0);
  std::printf("mesh (%s): %lld redistributes checked on every rank\n",
              c10::str(c10::IntArrayRef(mesh_shape)).c_str(), static_cast<long long>(runs.load()));
}

TEST(StridedRedistributeTest, EveryPairOnMesh2) { run_all_pairs({2}, {{8, 6}, {7, 5}, {3, 2}}); }

TEST(StridedRedistributeTest, EveryPairOnMesh4) { run_all_pairs({4}, {{8, 12}, {13, 7}, {2, 3}}); }

TEST(StridedRedistributeTest, EveryPairOnMesh2x2) { run_all_pairs({2, 2}, {{8, 6}, {9, 7}}); }

// The FSDP-over-TP form is a Shard with an order: its pieces are PyTorch's too.
TEST(StridedRedistributeTest, BoxFormPiecesArePyTorchs) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 2});
  const Placements given = {StridedShard(0, 2), Shard(0)};
  const at::Tensor global = at::arange(8, at::kDouble);
  const DTensorSpec spec = DTensorSpec::make(mesh, given, TensorMeta::make({8}, at::kDouble));
  EXPECT_FALSE(spec.has_strided_shard());
  // (0,0) [0,1], (0,1) [4,5], (1,0) [2,3], (1,1) [6,7] (REFERENCE §12).
  const std::vector<std::vector<double>> want = {{0, 1}, {4, 5}, {2, 3}, {6, 7}};
  for (int64_t r = 0; r < 4; ++r) {
    const auto coord = *mesh.coordinate(r);
    const at::Tensor got = local_tensor_for(global, spec, coord);
    EXPECT_TRUE(at::equal(got, oracle_piece(global, mesh, given, coord))) << r;
    EXPECT_TRUE(at::equal(got, at::tensor(want[r], at::kDouble))) << r;
  }
}

}  // namespace
}  // namespace dtensor
