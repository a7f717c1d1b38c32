// _StridedShard as a placement of the layout layer (NOTE [strided shards] in dtensor_spec.h):
// its text form, the canonicalisation of DTensorSpec::make and its inverse torch_placements(),
// the combinations refused, and the shard arithmetic of the general form (runs, local shapes
// and offsets, owners), uneven sizes included.

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "base/testing/expect_error.h"
#include "layout/shard_layout.h"

namespace dtensor {
namespace {

using V = std::vector<int64_t>;

// `f` throws dtensor::Error naming every one of `needles`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  for (const std::string& needle : needles) testing::expect_error(f, needle);
}

DTensorSpec spec(const V& mesh, const char* placements, const V& shape,
                 const ShardOrder& order = {}) {
  return DTensorSpec::make(DeviceMesh::arange(mesh), parse_placements(placements),
                           TensorMeta::make(shape), order);
}

TEST(StridedShardTest, TextFormAndValueSemantics) {
  const Placement s = StridedShard(0, 2);
  EXPECT_EQ(s.to_string(), "_S(0,2)");
  EXPECT_EQ(parse_placement("_S(0,2)"), s);
  EXPECT_EQ(parse_placement("_StridedShard(0, split_factor=2)"), s);
  EXPECT_EQ(parse_placement(" _StridedShard(dim=0, sf=2) "), s);  // repr's spelling
  EXPECT_EQ(parse_placement("_S(-1,3)"), StridedShard(-1, 3));
  EXPECT_EQ(parse_placements("[_S(0,2), S(0)]"), (Placements{s, Shard(0)}));
  // As PyTorch's: not a Shard, never equal to Shard(dim), yet it shards its dim.
  EXPECT_FALSE(s.is_shard());
  EXPECT_FALSE(s.is_shard(0));
  EXPECT_TRUE(s.is_strided_shard() && s.is_strided_shard(0) && !s.is_strided_shard(1));
  EXPECT_TRUE(s.is_any_shard() && s.is_any_shard(0) && Shard(0).is_any_shard(0));
  EXPECT_FALSE(Replicate().is_any_shard());
  EXPECT_NE(s, Shard(0));
  EXPECT_NE(s, StridedShard(0, 3));
  EXPECT_NE(s.hash(), Shard(0).hash());
  EXPECT_NE(s.hash(), StridedShard(0, 3).hash());
  EXPECT_EQ(s.split_factor(), 2);
  EXPECT_EQ(Shard(0).split_factor(), 1);
  EXPECT_EQ(s.dim(), 0);
  // One piece is a plain Shard.
  EXPECT_EQ(StridedShard(1, 1), Shard(1));
  EXPECT_EQ(parse_placement("_S(1,1)"), Shard(1));
  EXPECT_EQ(sizeof(Placement), 8u);
}

TEST(StridedShardTest, BadTextNamesTheToken) {
  expect_error([] { parse_placement("_S(0)"); }, {"_S(0)", "split factor"});
  expect_error([] { parse_placement("_S(0,x)"); }, {"split factor 'x' is not an integer"});
  expect_error([] { parse_placement("_S(0,0)"); }, {"split factor must be in [1, 65535]"});
  expect_error([] { StridedShard(0, 70000); }, {"split factor must be in [1, 65535]"});
}

// Strided shards in box form become Shards plus a shard order (building each dim's order from
// the last mesh dim to the first: a Shard in front, a strided shard at the back when its split
// factor is the product of the sizes of the mesh dims to its right on that dim).
TEST(StridedShardTest, BoxFormsBecomeShardsWithAnOrder) {
  struct Case {
    V mesh;
    const char* given;
    const char* canonical;  // DTensorSpec::to_string
  };
  const Case cases[] = {
      // FSDP over TP on (dp, tp).
      {{2, 2}, "_S(0,2),S(0)", "[S(0),S(0)] on (2,2) Float[8,4] order{0:[1,0]}"},
      {{2, 4}, "_S(0,4),S(0)", "[S(0),S(0)] on (2,4) Float[8,4] order{0:[1,0]}"},
      {{2, 2}, "_S(1,2),S(1)", "[S(1),S(1)] on (2,2) Float[8,4] order{1:[1,0]}"},
      {{2, 2}, "_S(-2,2),S(0)", "[S(0),S(0)] on (2,2) Float[8,4] order{0:[1,0]}"},
      // HSDP over TP, and FSDP over 2-D TP.
      {{2, 2, 2}, "R,_S(0,2),S(0)", "[R,S(0),S(0)] on (2,2,2) Float[8,4] order{0:[2,1]}"},
      {{2, 2, 2}, "_S(0,4),S(0),S(0)", "[S(0),S(0),S(0)] on (2,2,2) Float[8,4] order{0:[1,2,0]}"},
      {{2, 2, 2},
       "_S(0,4),_S(0,2),S(0)",
       "[S(0),S(0),S(0)] on (2,2,2) Float[8,4] order{0:[2,1,0]}"},
      // A Shard left of a strided one splits first.
      {{2, 2, 2}, "S(0),_S(0,2),S(0)", "[S(0),S(0),S(0)] on (2,2,2) Float[8,4] order{0:[0,2,1]}"},
      // Other dims are unaffected.
      {{2, 2}, "_S(0,2),S(0)", "[S(0),S(0)] on (2,2) Float[8,4] order{0:[1,0]}"},
  };
  for (const auto& c : cases) {
    const DTensorSpec s = spec(c.mesh, c.given, {8, 4});
    EXPECT_EQ(s.to_string(), c.canonical) << c.given;
    EXPECT_FALSE(s.has_strided_shard()) << c.given;
    // The inverse gives PyTorch's placements back (negative dims normalised).
    const std::string want = to_string(parse_placements(c.given)) == "[_S(-2,2),S(0)]"
                                 ? "[_S(0,2),S(0)]"
                                 : to_string(parse_placements(c.given));
    EXPECT_EQ(to_string(torch_placements(s)), want) << c.given;
    EXPECT_EQ(spec(c.mesh, to_string(torch_placements(s)).c_str(), {8, 4}), s) << c.given;
  }
  // The same layout given as a shard order is the same interned spec.
  EXPECT_EQ(spec({2, 2}, "_S(0,2),S(0)", {8, 4}), spec({2, 2}, "S(0),S(0)", {8, 4}, {{1, 0}, {}}));
  // An explicit order that agrees is accepted; one that disagrees is refused.
  EXPECT_EQ(spec({2, 2}, "_S(0,2),S(0)", {8, 4}, {{1, 0}, {}}),
            spec({2, 2}, "_S(0,2),S(0)", {8, 4}));
  expect_error([] { spec({2, 2}, "_S(0,2),S(0)", {8, 4}, {{0, 1}, {}}); }, {"disagrees"});
  // Default orders need no strided shards.
  EXPECT_EQ(to_string(torch_placements(spec({2, 2}, "S(0),S(0)", {8, 4}))), "[S(0),S(0)]");
}

TEST(StridedShardTest, GeneralFormStaysAndMustShardItsDimAlone) {
  const DTensorSpec one = spec({2}, "_S(0,2)", {8});
  EXPECT_TRUE(one.has_strided_shard());
  EXPECT_TRUE(one.is_sharded());
  EXPECT_EQ(one.placements(), (Placements{StridedShard(0, 2)}));
  EXPECT_EQ(one.shard_order(0), (V{0}));
  EXPECT_EQ(one.to_string(), "[_S(0,2)] on (2) Float[8]");
  EXPECT_EQ(to_string(torch_placements(one)), "[_S(0,2)]");
  // Other mesh dims may shard other dims, replicate or hold Partials.
  EXPECT_TRUE(spec({2, 2}, "_S(0,2),S(1)", {8, 6}).has_strided_shard());
  EXPECT_TRUE(spec({2, 2}, "P(sum),_S(1,3)", {8, 6}).has_strided_shard());
  EXPECT_TRUE(spec({2, 2}, "_S(0,2),_S(1,3)", {8, 6}).has_strided_shard());
  EXPECT_EQ(spec({2, 2}, "R,_S(-1,3)", {8, 6}).placement(1), StridedShard(1, 3));
  // No shard order expresses these: PyTorch 2.11 refuses to redistribute them.
  expect_error(
      [] {
        spec({2, 2}, "S(0),_S(0,2)", {8, 4});
      },
      {"[S(0),_S(0,2)] on mesh (2,2)", "_S(0,2) on mesh dim 1",
       "the only mesh dim sharding its tensor dim"});
  expect_error([] { spec({2, 2}, "_S(0,2),_S(0,2)", {8, 4}); }, {"on mesh (2,2)"});
  expect_error([] { spec({2, 4}, "_S(0,2),S(0)", {8, 4}); }, {"[_S(0,2),S(0)] on mesh (2,4)"});
  expect_error([] { spec({2}, "_S(1,2)", {8}); }, {"_StridedShard dim"});
  EXPECT_EQ(without_strided(spec({2, 2}, "_S(0,2),S(1)", {8, 6})), spec({2, 2}, "R,S(1)", {8, 6}));
}

TEST(StridedShardTest, RunsFollowTorchChunkTwice) {
  struct Case {
    int64_t n, sf, k, i;
    std::vector<ChunkSlice> runs;
  };
  const Case cases[] = {
      // REFERENCE: 8 rows, sf 2, 2 ranks: rank 0 holds [0,1,4,5], rank 1 [2,3,6,7].
      {8, 2, 2, 0, {{0, 2}, {4, 2}}},
      {8, 2, 2, 1, {{2, 2}, {6, 2}}},
      // Uneven: pieces of 7 and 6 (torch.chunk(13, 2)), each over 2 ranks (4+3, 3+3).
      {13, 2, 2, 0, {{0, 4}, {7, 3}}},
      {13, 2, 2, 1, {{4, 3}, {10, 3}}},
      // Pieces 2,2,1 (torch.chunk(5, 3)); over 4 ranks, the last ranks hold nothing of them.
      {5, 3, 4, 0, {{0, 1}, {2, 1}, {4, 1}}},
      {5, 3, 4, 1, {{1, 1}, {3, 1}, {5, 0}}},
      {5, 3, 4, 3, {{2, 0}, {4, 0}, {5, 0}}},
      // torch.chunk(6, 4) makes three pieces of 2 and an empty fourth.
      {6, 4, 2, 1, {{1, 1}, {3, 1}, {5, 1}, {6, 0}}},
  };
  for (const auto& c : cases) {
    const auto runs = strided_runs(c.n, c.sf, c.k, c.i);
    ASSERT_EQ(runs.size(), c.runs.size());
    int64_t size = 0;
    for (size_t j = 0; j < runs.size(); ++j) {
      EXPECT_EQ(runs[j].size, c.runs[j].size)
          << c.n << "/" << c.sf << "/" << c.k << " rank " << c.i;
      if (c.runs[j].size > 0) {
        EXPECT_EQ(runs[j].offset, c.runs[j].offset);
      }
      size += runs[j].size;
    }
    EXPECT_EQ(strided_size(c.n, c.sf, c.k, c.i), size);
  }
}

TEST(StridedShardTest, LocalShapesOffsetsAndOwners) {
  struct Case {
    V mesh;
    const char* placements;
    V shape;
    V coord;
    V local_shape;
    V offset;  // PyTorch's: the first element held
  };
  const Case cases[] = {
      {{2}, "_S(0,2)", {8}, {1}, {4}, {2}},
      {{2}, "_S(0,2)", {13}, {0}, {7}, {0}},
      {{2}, "_S(0,2)", {13}, {1}, {6}, {4}},
      {{4}, "_S(0,3)", {5}, {3}, {0}, {5}},  // holds nothing: offset is the size
      {{4}, "_S(1,3)", {2, 7}, {1}, {2, 2}, {0, 1}},
      {{2, 2}, "_S(0,2),S(1)", {8, 6}, {1, 1}, {4, 3}, {2, 3}},
      {{2, 2}, "P(sum),_S(1,3)", {8, 6}, {1, 1}, {8, 3}, {0, 1}},
  };
  for (const auto& c : cases) {
    const DTensorSpec s = spec(c.mesh, c.placements, c.shape);
    const LocalBox box = local_box(s, c.coord);
    EXPECT_EQ(box.shape, c.local_shape) << c.placements << " " << s.to_string();
    EXPECT_EQ(box.offset, c.offset) << c.placements << " " << s.to_string();
  }
  // Local runs per dim, and the owners of each element agree with them.
  const DTensorSpec s = spec({2, 2}, "_S(0,2),S(1)", {8, 6});
  const auto runs = local_runs(s, {1, 0});
  ASSERT_EQ(runs[0].size(), 2u);
  EXPECT_EQ(runs[0][0], (ChunkSlice{2, 2}));
  EXPECT_EQ(runs[0][1], (ChunkSlice{6, 2}));
  EXPECT_EQ(runs[1], (std::vector<ChunkSlice>{{0, 3}}));
  EXPECT_EQ(owner_ranks(s, {5, 4}), (V{1}));  // row 5: piece 1, rank 0; col 4: rank 1
  EXPECT_EQ(owner_ranks(s, {6, 0}), (V{2}));  // row 6: piece 1, rank 1
  EXPECT_EQ(owner_ranks(spec({4}, "_S(0,2)", {13}), {12}), (V{2}));  // piece [7,13): 2,2,2,0
  EXPECT_TRUE(is_evenly_sharded(spec({2}, "_S(0,2)", {8})));
  EXPECT_FALSE(is_evenly_sharded(spec({2}, "_S(0,2)", {6})));  // pieces of 3
}

}  // namespace
}  // namespace dtensor
