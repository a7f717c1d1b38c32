// FSDP's flat buffers (NOTE [FSDP flat buffers]) against torch.chunk's pieces and one device:
// copy-in then copy-out rebuilds every parameter, the reduce-scatter input gives each rank the
// sum of its pieces, a block of rows (the post-forward piece) equals the gathered buffer's, uneven
// and empty pieces, shard dims other than 0, replicated parameters, mixed dtypes; then the
// all-gather and reduce-scatter on ranks as threads.

#include "fsdp/flat_params.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::fsdp {
namespace {

using collectives::RankContext;

struct Case {
  std::vector<int64_t> shape;
  int64_t shard_dim;
  bool replicated;
};

// Uneven (7 over 2..4), empty pieces (3 over 4), dims other than 0, a dim of size 0, a
// replicated (1,) bias and a 0-dim scalar.
const std::vector<Case> kCases = {
    {{7, 15}, 0, false}, {{7, 15}, 1, false}, {{3}, 0, false}, {{2, 3, 5}, 2, false},
    {{0, 4}, 0, false},  {{1}, 0, true},      {{}, 0, true},
};

FlatParams layout_of(int64_t shard_size) {
  std::vector<FlatParam> params;
  for (const Case& c : kCases) params.push_back({c.shape, c.shard_dim, c.replicated});
  return FlatParams(params, shard_size);
}

std::vector<at::Tensor> full_params(int64_t seed) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < kCases.size(); ++i) {
    out.push_back(at::arange(1, 1 + at::ones(kCases[i].shape).numel(), at::kFloat)
                      .reshape(kCases[i].shape)
                      .mul(static_cast<double>(seed + 10 * i)));
  }
  return out;
}

// Rank r's piece of `full` as torch.chunk gives it (an empty slice past the last chunk).
at::Tensor piece_of(const at::Tensor& full, const Case& c, int64_t shards, int64_t r) {
  if (c.replicated) return full;
  const auto chunks = full.chunk(shards, c.shard_dim);
  if (r < static_cast<int64_t>(chunks.size())) return chunks[r];
  return full.narrow(c.shard_dim, full.size(c.shard_dim), 0);
}

TEST(FlatParamsTest, CopyInThenCopyOutRebuildsEveryParameter) {
  for (int64_t shards = 1; shards <= 4; ++shards) {
    const FlatParams layout = layout_of(shards);
    const std::vector<at::Tensor> full = full_params(1);
    // Every rank's copy-in, as the all-gather would concatenate them.
    std::vector<at::Tensor> rows;
    for (int64_t r = 0; r < shards; ++r) {
      std::vector<at::Tensor> pieces;
      for (size_t i = 0; i < kCases.size(); ++i) {
        pieces.push_back(piece_of(full[i], kCases[i], shards, r));
        if (!kCases[i].replicated) {
          EXPECT_EQ(layout.local_slices(i, r), pieces.back().size(kCases[i].shard_dim))
              << "param " << i << " rank " << r << " of " << shards;
        }
      }
      at::Tensor flat = at::full({layout.per_rank_numel()}, -7.0);  // garbage must be overwritten
      layout.copy_in(pieces, flat);
      rows.push_back(flat);
    }
    std::vector<at::Tensor> dsts;
    for (const Case& c : kCases) dsts.push_back(at::full(c.shape, -7.0));
    layout.copy_out(at::cat(rows), dsts);
    for (size_t i = 0; i < kCases.size(); ++i) {
      EXPECT_TRUE(at::equal(dsts[i], full[i])) << "param " << i << " over " << shards;
    }
  }
}

TEST(FlatParamsTest, CopyOutIntoAnotherDtypeAndStrides) {
  const FlatParams layout({{{4, 6}, 1, false}}, 2);
  const at::Tensor full = at::randn({4, 6});
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < 2; ++r) {
    at::Tensor flat = at::empty({layout.per_rank_numel()}, at::kDouble);
    layout.copy_in({full.chunk(2, 1)[r]}, flat);
    rows.push_back(flat);
  }
  at::Tensor dst = at::empty({6, 4}, at::kDouble).t();  // not contiguous
  layout.copy_out(at::cat(rows), {dst});
  EXPECT_TRUE(at::equal(dst, full.to(at::kDouble)));
}

TEST(FlatParamsTest, ReduceScatterInputGivesEachRankItsPieces) {
  for (int64_t shards = 1; shards <= 4; ++shards) {
    const FlatParams layout = layout_of(shards);
    const std::vector<at::Tensor> grads = full_params(3);
    at::Tensor flat = at::full({shards * layout.per_rank_numel()}, -7.0);
    layout.copy_reduce_scatter_input(grads, flat);
    const at::Tensor rows = flat.view({shards, layout.per_rank_numel()});
    for (int64_t r = 0; r < shards; ++r) {
      const std::vector<at::Tensor> pieces = layout.pieces_of(rows[r], r);
      ASSERT_EQ(pieces.size(), kCases.size());
      for (size_t i = 0; i < kCases.size(); ++i) {
        EXPECT_TRUE(at::equal(pieces[i], piece_of(grads[i], kCases[i], shards, r)))
            << "param " << i << " rank " << r << " of " << shards;
      }
    }
    // Every element written: pieces, and zeros for the padding (a sum over ranks adds nothing).
    EXPECT_EQ(flat.eq(-7.0).sum().item<int64_t>(), 0) << "unwritten padding over " << shards;
  }
}

// The post-forward piece of a group resharded to k ranks: every block of rows equals those rows
// of the gathered buffer that the ranks' copy-ins make, so the k pieces rebuild it.
TEST(FlatParamsTest, CopyRowsGivesTheGatheredBuffersRows) {
  const int64_t shards = 4;
  const FlatParams layout = layout_of(shards);
  const std::vector<at::Tensor> full = full_params(5);
  std::vector<at::Tensor> gathered;
  for (int64_t r = 0; r < shards; ++r) {
    std::vector<at::Tensor> pieces;
    for (size_t i = 0; i < kCases.size(); ++i) {
      pieces.push_back(piece_of(full[i], kCases[i], shards, r));
    }
    gathered.push_back(at::empty({layout.per_rank_numel()}));
    layout.copy_in(pieces, gathered.back());
  }
  const at::Tensor all = at::cat(gathered);
  for (int64_t rows : {1, 2, 4}) {
    for (int64_t first = 0; first + rows <= shards; first += rows) {
      at::Tensor piece = at::full({rows * layout.per_rank_numel()}, -7.0);
      layout.copy_rows(full, piece, first, rows, "test");
      EXPECT_TRUE(at::equal(
          piece, all.narrow(0, first * layout.per_rank_numel(), rows * layout.per_rank_numel())))
          << "rows " << first << "+" << rows;
    }
  }
  try {
    at::Tensor piece = at::empty({2 * layout.per_rank_numel()});
    layout.copy_rows(full, piece, 3, 2, "test");
    ADD_FAILURE() << "rows past the group accepted";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows [3, 5) out of 4"), std::string::npos) << e.what();
  }
}

TEST(FlatParamsTest, WrongArgumentsAreClearErrors) {
  const FlatParams layout({{{4, 6}, 0, false}}, 2);
  try {
    layout.copy_in({}, at::empty({layout.per_rank_numel()}));
    ADD_FAILURE() << "no pieces accepted";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("0 tensors for 1 parameters"), std::string::npos)
        << e.what();
  }
  try {
    layout.copy_in({at::zeros({2, 6})}, at::empty({5}));
    ADD_FAILURE() << "short flat buffer accepted";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("12 elements"), std::string::npos) << e.what();
  }
  try {
    layout.copy_out(at::empty({24}), {at::empty({6, 4})});
    ADD_FAILURE() << "wrong unsharded shape accepted";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected [4, 6]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(FlatParams({{{4, 6}, 2, false}}, 2), dtensor::Error);
}

// The group's collectives on ranks as threads: every rank gets every parameter whole, and the
// reduce-scatter gives each rank the sum over ranks of its pieces, as one device computes it.
TEST(FlatParamsTest, AllGatherAndReduceScatterOnRanksAsThreads) {
  for (int64_t world : {1, 2, 3, 4}) {
    const FlatParams layout = layout_of(world);
    const std::vector<at::Tensor> full = full_params(5);
    std::vector<at::Tensor> grad_sum;
    for (size_t i = 0; i < kCases.size(); ++i) grad_sum.push_back(at::zeros(kCases[i].shape));
    for (int64_t r = 0; r < world; ++r) {
      const std::vector<at::Tensor> g = full_params(r + 1);
      for (size_t i = 0; i < kCases.size(); ++i) grad_sum[i] += g[i];
    }
    collectives::run_threads(world, [&](int64_t r) {
      std::vector<at::Tensor> pieces;
      for (size_t i = 0; i < kCases.size(); ++i) {
        pieces.push_back(piece_of(full[i], kCases[i], world, r));
      }
      for (bool async_op : {false, true}) {
        at::Tensor gathered = all_gather(layout, pieces, at::empty({layout.per_rank_numel()}),
                                         RankContext::kWorld, async_op);
        gathered = collectives::wait_tensor(gathered);
        std::vector<at::Tensor> dsts;
        for (const Case& c : kCases) dsts.push_back(at::empty(c.shape));
        layout.copy_out(gathered, dsts);
        for (size_t i = 0; i < kCases.size(); ++i) {
          EXPECT_TRUE(at::equal(dsts[i], full[i])) << "param " << i << " rank " << r;
        }
        const at::Tensor reduced = collectives::wait_tensor(
            reduce_scatter(layout, full_params(r + 1), at::empty({world * layout.per_rank_numel()}),
                           RankContext::kWorld, async_op));
        const std::vector<at::Tensor> got = layout.pieces_of(reduced, r);
        for (size_t i = 0; i < kCases.size(); ++i) {
          EXPECT_TRUE(at::allclose(got[i], piece_of(grad_sum[i], kCases[i], world, r)))
              << "param " << i << " rank " << r << " of " << world;
        }
      }
    });
  }
}

}  // namespace
}  // namespace dtensor::fsdp
