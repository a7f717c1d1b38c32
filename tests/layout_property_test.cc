// Exhaustive property: for every layout of tests/layout_enumeration.h, the local boxes of all ranks
// tile the global tensor exactly: each element is held by exactly the ranks its placements imply
// (one coordinate per Shard mesh dim, every coordinate of the Replicate/Partial mesh dims), and
// owner_ranks() (the inverse) names exactly those ranks.

#include <gtest/gtest.h>

#include <set>

#include "layout/shard_layout.h"
#include "layout/testing/layout_enumeration.h"

namespace dtensor {
namespace {

bool box_contains(const LocalBox& box, const std::vector<int64_t>& index) {
  for (size_t d = 0; d < index.size(); ++d) {
    if (index[d] < box.offset[d] || index[d] >= box.offset[d] + box.shape[d]) return false;
  }
  return true;
}

void check_tiling(const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  int64_t replicas = 1;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!spec.placement(m).is_shard()) replicas *= mesh.size(m);
  }
  std::vector<LocalBox> boxes;
  int64_t held = 0;
  for (int64_t r : mesh.ranks()) {
    boxes.push_back(*local_box_of_rank(spec, r));
    const LocalBox& b = boxes.back();
    for (int64_t d = 0; d < spec.ndim(); ++d) {
      ASSERT_GE(b.shape[d], 0) << spec.to_string();
      ASSERT_LE(b.offset[d] + b.shape[d], spec.shape()[d]) << spec.to_string() << " rank " << r;
    }
    held += b.numel();
  }
  // Sizes add up: every element counted once per replica.
  ASSERT_EQ(held, spec.meta().numel() * replicas) << spec.to_string();
  const int64_t numel = spec.meta().numel();
  std::vector<int64_t> index(spec.ndim(), 0);
  for (int64_t flat = 0; flat < numel; ++flat) {
    for (int64_t d = spec.ndim() - 1, rem = flat; d >= 0; --d) {
      index[d] = rem % spec.shape()[d];
      rem /= spec.shape()[d];
    }
    std::vector<int64_t> holders;
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (box_contains(boxes[i], index)) holders.push_back(mesh.ranks()[i]);
    }
    ASSERT_EQ(static_cast<int64_t>(holders.size()), replicas) << spec.to_string();
    ASSERT_EQ(holders, owner_ranks(spec, index)) << spec.to_string();
  }
}

TEST(LayoutPropertyTest, LocalBoxesTileTheGlobalTensorExactly) {
  const int64_t visited = testing::for_each_property_spec(check_tiling);
  // Guard against the enumeration silently shrinking (it visits about 3k layouts: 4 meshes x 15
  // shapes x every placement combination x every shard order).
  EXPECT_GT(visited, 2500);
  std::cout << "checked " << visited << " layouts\n";
}

TEST(LayoutPropertyTest, ShardStepsComposeIntoTheLocalBox) {
  testing::for_each_property_spec([](const DTensorSpec& spec) {
    for (int64_t r : spec.mesh().ranks()) {
      const auto coord = *spec.mesh().coordinate(r);
      LocalBox rebuilt{spec.shape(), std::vector<int64_t>(spec.ndim(), 0)};
      for (const ShardStep& s : shard_steps(spec, coord)) {
        ASSERT_EQ(s.size + s.pad(), s.chunk);
        ASSERT_GE(s.pad(), 0);
        ASSERT_EQ(s.input_size, rebuilt.shape[s.tensor_dim]);  // splits what the last step left
        rebuilt.offset[s.tensor_dim] += s.offset;
        rebuilt.shape[s.tensor_dim] = s.size;
      }
      const LocalBox box = local_box(spec, coord);
      ASSERT_EQ(rebuilt.shape, box.shape) << spec.to_string();
      for (int64_t d = 0; d < spec.ndim(); ++d) {
        // Empty shards sit at offset == size (PyTorch's convention); others where steps put them.
        const int64_t want = box.shape[d] == 0 ? spec.shape()[d] : rebuilt.offset[d];
        ASSERT_EQ(box.offset[d], want) << spec.to_string() << " dim " << d;
      }
    }
  });
}

}  // namespace
}  // namespace dtensor
