#include "layout/visualize.h"

#include <gtest/gtest.h>

namespace dtensor {
namespace {

std::string picture(std::vector<int64_t> mesh, const char* placements, std::vector<int64_t> shape) {
  return visualize_sharding(DTensorSpec::make(
      DeviceMesh::arange(mesh), parse_placements(placements), TensorMeta::make(shape)));
}

// Golden pictures: the grid's rows/columns are the distinct index ranges of the local boxes.
TEST(VisualizeTest, TwoDimGrid) {
  EXPECT_EQ(picture({2, 2}, "S(0),S(1)", {10, 7}),
            "Tensor Float[10,7] as [S(0),S(1)] on DeviceMesh((2,2), ranks=[0,1,2,3])\n"
            "              cols 0:4   cols 4:7\n"
            "  rows 0:5    r0         r1\n"
            "  rows 5:10   r2         r3\n");
}

TEST(VisualizeTest, UnevenOneDimListsEmptyRanks) {
  EXPECT_EQ(picture({4}, "S(0)", {5}),
            "Tensor Float[5] as [S(0)] on DeviceMesh((4), ranks=[0,1,2,3])\n"
            "     cols 0:2   cols 2:4   cols 4:5\n"
            "     r0         r1         r2\n"
            "  empty (uneven shards): r3\n");
}

TEST(VisualizeTest, PartialAndReplicaOwnersAreMarked) {
  const std::string p = picture({2, 2}, "R,P(sum)", {4, 4});
  EXPECT_NE(p.find("r0 r1 r2 r3 *"), std::string::npos) << p;
  EXPECT_NE(p.find("partial values"), std::string::npos) << p;
}

TEST(VisualizeTest, HigherRankListsBoxes) {
  const std::string p = picture({2, 2}, "S(0),S(2)", {4, 2, 3});
  EXPECT_NE(p.find("[2:4, 0:2, 2:3]  r3"), std::string::npos) << p;
}

}  // namespace
}  // namespace dtensor
