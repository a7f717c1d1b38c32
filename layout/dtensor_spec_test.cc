#include "layout/dtensor_spec.h"
#include "base/testing/expect_error.h"

#include <gtest/gtest.h>

#include <thread>

namespace dtensor {
namespace {

using V = std::vector<int64_t>;

using testing::expect_error;

const DeviceMesh kMesh = DeviceMesh::arange({2, 2});

TEST(DTensorSpecTest, InternedSpecsCompareByIdentity) {
  const auto a = DTensorSpec::make(kMesh, {Shard(0), Shard(1)}, TensorMeta::make({10, 7}));
  const auto b = DTensorSpec::make(DeviceMesh::arange({2, 2}), parse_placements("S(0),S(-1)"),
                                   TensorMeta::make({10, 7}));
  EXPECT_EQ(a, b);  // negative dim normalised, equal mesh built separately
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.placements(), (Placements{Shard(0), Shard(1)}));
  // Every field matters.
  EXPECT_NE(a, DTensorSpec::make(kMesh, {Shard(1), Shard(0)}, TensorMeta::make({10, 7})));
  EXPECT_NE(a, DTensorSpec::make(kMesh, {Shard(0), Shard(1)}, TensorMeta::make({10, 8})));
  EXPECT_NE(
      a, DTensorSpec::make(kMesh, {Shard(0), Shard(1)}, TensorMeta::make({10, 7}, c10::kBFloat16)));
  EXPECT_NE(a, DTensorSpec::make(DeviceMesh({2, 2}, {3, 2, 1, 0}), {Shard(0), Shard(1)},
                                 TensorMeta::make({10, 7})));
}

TEST(DTensorSpecTest, InterningIsThreadSafe) {
  std::vector<uint64_t> ids(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&ids, t] {
      for (int i = 0; i < 200; ++i) {
        ids[t] =
            DTensorSpec::make(kMesh, {Shard(0), Replicate()}, TensorMeta::make({1000 + i})).id();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < 8; ++t) EXPECT_EQ(ids[t], ids[0]);
}

TEST(DTensorSpecTest, ShardOrderDefaultsLeftToRightAndAcceptsOtherOrders) {
  const auto meta = TensorMeta::make({8, 4});
  const auto ltr = DTensorSpec::make(kMesh, {Shard(0), Shard(0)}, meta);
  EXPECT_EQ(ltr.shard_order(0), (V{0, 1}));
  EXPECT_TRUE(ltr.shard_order(1).empty());
  EXPECT_TRUE(ltr.has_default_shard_order());
  EXPECT_EQ(ltr, DTensorSpec::make(kMesh, {Shard(0), Shard(0)}, meta, {{0, 1}, {}}));
  const auto rtl = DTensorSpec::make(kMesh, {Shard(0), Shard(0)}, meta, {{1, 0}, {}});
  EXPECT_NE(ltr, rtl);
  EXPECT_FALSE(rtl.has_default_shard_order());
  EXPECT_EQ(rtl.to_string(), "[S(0),S(0)] on (2,2) Float[8,4] order{0:[1,0]}");
  EXPECT_EQ(ltr.to_string(), "[S(0),S(0)] on (2,2) Float[8,4]");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Shard(0), Shard(0)}, meta, {{1}, {}});
      },
      "must list exactly the mesh dims");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Shard(0), Shard(0)}, meta, {{0, 1}});
      },
      "1 entries for a 2-D tensor");
}

TEST(DTensorSpecTest, Queries) {
  const auto meta = TensorMeta::make({8, 4});
  const auto s = DTensorSpec::make(kMesh, {Shard(1), Partial(ReduceOp::kMax)}, meta);
  EXPECT_TRUE(s.is_sharded());
  EXPECT_TRUE(s.has_partial());
  EXPECT_FALSE(s.is_replicated());
  EXPECT_EQ(s.num_shards(0), 1);
  EXPECT_EQ(s.num_shards(1), 2);
  const auto r = DTensorSpec::make(kMesh, {Replicate(), Replicate()}, meta);
  EXPECT_TRUE(r.is_replicated());
  EXPECT_EQ(DTensorSpec::make(kMesh, {Shard(0), Shard(0)}, meta).num_shards(0), 4);
  // 0-D tensors can be replicated or partial, never sharded.
  EXPECT_TRUE(
      DTensorSpec::make(kMesh, {Replicate(), Partial()}, TensorMeta::make({})).has_partial());
}

TEST(DTensorSpecTest, ValidationNamesTheProblem) {
  const auto meta = TensorMeta::make({8, 4});
  expect_error([&] { DTensorSpec::make(kMesh, {Shard(0)}, meta); },
               "1 placements [S(0)] for a 2-D mesh");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Shard(2), Replicate()}, meta);
      },
      "Shard dim 2 is out of range for a 2-D tensor");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Shard(-3), Replicate()}, meta);
      },
      "Shard dim -3 is out of range");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Shard(0), Replicate()}, TensorMeta::make({}));
      },
      "out of range for a 0-D tensor");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Replicate(), Replicate()}, TensorMeta{{-1}, {1}});
      },
      "negative size");
  expect_error(
      [&] {
        DTensorSpec::make(kMesh, {Replicate(), Partial(ReduceOp::kBxor)}, meta);
      },
      "P(bxor) needs an integer or bool tensor, not Float");
  // Bitwise partials are fine for integers.
  EXPECT_TRUE(DTensorSpec::make(kMesh, {Replicate(), Partial(ReduceOp::kBxor)},
                                TensorMeta::make({8, 4}, c10::kInt))
                  .has_partial());
}

}  // namespace
}  // namespace dtensor
