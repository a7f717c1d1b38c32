#include "layout/shard_layout.h"

#include <gtest/gtest.h>

namespace dtensor {
namespace {

using V = std::vector<int64_t>;

DTensorSpec spec(V mesh_shape, const char* placements, V shape, const ShardOrder& order = {}) {
  return DTensorSpec::make(DeviceMesh::arange(mesh_shape), parse_placements(placements),
                           TensorMeta::make(shape), order);
}

TEST(ChunkTest, TorchChunkSemantics) {
  struct Case {
    int64_t n, k;
    V sizes;
  };
  const Case cases[] = {
      {13, 4, {4, 4, 4, 1}}, {5, 4, {2, 2, 1, 0}},       {1, 4, {1, 0, 0, 0}}, {0, 3, {0, 0, 0}},
      {8, 4, {2, 2, 2, 2}},  {6, 4, {2, 2, 2, 0}},       {7, 1, {7}},          {3, 3, {1, 1, 1}},
      {10, 3, {4, 4, 2}},    {9, 6, {2, 2, 2, 2, 1, 0}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(chunk_sizes(c.n, c.k), c.sizes) << c.n << " over " << c.k;
    int64_t offset = 0;
    for (int64_t i = 0; i < c.k; ++i) {
      EXPECT_EQ(chunk_slice(c.n, c.k, i).offset, std::min(offset, c.n));
      offset += c.sizes[i];
    }
  }
  EXPECT_EQ(chunk_size(13, 4), 4);
  EXPECT_EQ(chunk_size(0, 4), 0);
  EXPECT_THROW(chunk_size(5, 0), dtensor::Error);
  EXPECT_THROW(chunk_sizes(-5, 2), dtensor::Error);
}

TEST(LocalBoxTest, TableOfLayouts) {
  struct Case {
    V mesh;
    const char* placements;
    V shape;
    V coord;
    V local_shape;
    V offset;
  };
  const Case cases[] = {
      // 1-D mesh, even and uneven.
      {{4}, "S(0)", {8}, {1}, {2}, {2}},
      {{4}, "S(0)", {13}, {3}, {1}, {12}},
      {{4}, "S(0)", {5}, {3}, {0}, {5}},  // empty shard sits at the end
      {{4}, "S(0)", {1}, {0}, {1}, {0}},
      {{4}, "S(0)", {1}, {2}, {0}, {1}},
      {{4}, "R", {5}, {2}, {5}, {0}},
      {{4}, "P(sum)", {5}, {2}, {5}, {0}},
      // 2-D mesh: the issue's default demo layout.
      {{2, 2}, "S(0),S(1)", {10, 7}, {0, 0}, {5, 4}, {0, 0}},
      {{2, 2}, "S(0),S(1)", {10, 7}, {1, 1}, {5, 3}, {5, 4}},
      {{2, 2}, "S(1),S(0)", {10, 7}, {0, 1}, {5, 4}, {5, 0}},
      {{2, 2}, "R,S(1)", {10, 7}, {1, 1}, {10, 3}, {0, 4}},
      // Two mesh dims on one tensor dim: mesh dim 0 splits first (left to right).
      {{2, 2}, "S(0),S(0)", {8, 2}, {1, 0}, {2, 2}, {4, 0}},
      {{2, 2}, "S(0),S(0)", {5, 2}, {0, 1}, {1, 2}, {2, 0}},  // 5 -> 3,2 ; 3 -> 2,1
      {{2, 2}, "S(0),S(0)", {5, 2}, {1, 1}, {1, 2}, {4, 0}},  // 2 -> 1,1
      {{2, 3}, "S(0),S(0)", {7}, {1, 2}, {1}, {6}},           // 7 -> 4,3 ; 3 -> 1,1,1
      {{2, 3}, "S(0),S(0)", {4}, {0, 2}, {0}, {4}},           // 4 -> 2,2 ; 2 -> 1,1,0 (empty)
      {{2, 2, 2}, "S(0),R,S(1)", {3, 3}, {1, 0, 1}, {1, 1}, {2, 2}},
      // Empty shards (at any nesting level) sit at offset == size, as in PyTorch.
      {{2, 4}, "S(0),S(0)", {5}, {0, 3}, {0}, {5}},  // 5 -> 3,2 ; 3 -> 1,1,1,0
      {{2, 2}, "S(0),S(1)", {1, 4}, {1, 0}, {0, 2}, {1, 0}},
  };
  for (const auto& c : cases) {
    const auto s = spec(c.mesh, c.placements, c.shape);
    const LocalBox box = local_box(s, c.coord);
    EXPECT_EQ(box.shape, c.local_shape) << s.to_string();
    EXPECT_EQ(box.offset, c.offset) << s.to_string();
  }
}

TEST(LocalBoxTest, RightToLeftOrderSplitsByTheLastMeshDimFirst) {
  // [S(0),S(0)] with order {1,0}: mesh dim 1 splits 8 into 4+4, then mesh dim 0 splits each.
  const auto s = spec({2, 2}, "S(0),S(0)", {8}, {{1, 0}});
  EXPECT_EQ(local_box(s, {0, 0}).offset, V{0});
  EXPECT_EQ(local_box(s, {1, 0}).offset, V{2});
  EXPECT_EQ(local_box(s, {0, 1}).offset, V{4});
  EXPECT_EQ(local_box(s, {1, 1}).offset, V{6});
}

TEST(ShardStepTest, PaddingPerStep) {
  const auto s = spec({2, 2}, "S(0),S(0)", {5, 3});
  const auto steps = shard_steps(s, {1, 1});
  ASSERT_EQ(steps.size(), 2u);
  // mesh dim 0 splits 5 into 3,2: rank index 1 has 2, padded to 3.
  EXPECT_EQ(steps[0].mesh_dim, 0);
  EXPECT_EQ(steps[0].input_size, 5);
  EXPECT_EQ(steps[0].chunk, 3);
  EXPECT_EQ(steps[0].size, 2);
  EXPECT_EQ(steps[0].pad(), 1);
  EXPECT_FALSE(steps[0].even());
  // mesh dim 1 splits that 2 into 1,1: even.
  EXPECT_EQ(steps[1].input_size, 2);
  EXPECT_EQ(steps[1].chunk, 1);
  EXPECT_EQ(steps[1].pad(), 0);
  EXPECT_TRUE(steps[1].even());
  EXPECT_FALSE(is_evenly_sharded(s));
  EXPECT_TRUE(is_evenly_sharded(spec({2, 2}, "S(0),S(0)", {8, 3})));
  EXPECT_TRUE(is_evenly_sharded(spec({2, 2}, "R,P(sum)", {3, 3})));
  EXPECT_FALSE(is_evenly_sharded(spec({2, 2}, "S(0),S(0)", {6, 3})));  // 6 -> 3,3 -> 2,1
  EXPECT_THROW(shard_steps(s, {2, 0}), dtensor::Error);
}

TEST(OwnersTest, InverseOfLocalBox) {
  const auto s = spec({2, 3}, "S(0),R", {5, 4});
  EXPECT_EQ(owner_ranks(s, {0, 0}), (V{0, 1, 2}));
  EXPECT_EQ(owner_ranks(s, {3, 2}), (V{3, 4, 5}));
  const auto p = spec({2, 2}, "S(1),P(sum)", {4, 4});
  EXPECT_EQ(owner_ranks(p, {0, 3}), (V{2, 3}));
  const auto ss = spec({2, 2}, "S(0),S(0)", {5});
  EXPECT_EQ(owner_ranks(ss, {0}), V{0});
  EXPECT_EQ(owner_ranks(ss, {2}), V{1});
  EXPECT_EQ(owner_ranks(ss, {3}), V{2});
  EXPECT_EQ(owner_ranks(ss, {4}), V{3});
  EXPECT_THROW(owner_ranks(ss, {5}), dtensor::Error);
  EXPECT_THROW(owner_ranks(ss, {0, 0}), dtensor::Error);
}

TEST(LocalBoxTest, RankOutsideTheMeshHoldsNothing) {
  const auto s = DTensorSpec::make(DeviceMesh({2}, {4, 6}), {Shard(0)}, TensorMeta::make({4}));
  EXPECT_FALSE(local_box_of_rank(s, 5).has_value());
  EXPECT_EQ(local_box_of_rank(s, 6)->offset, V{2});
}

}  // namespace
}  // namespace dtensor
