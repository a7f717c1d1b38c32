#include "device_mesh/device_mesh.h"
#include "base/testing/expect_error.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

#include <set>

namespace dtensor {
namespace {

using V = std::vector<int64_t>;
using Names = std::vector<std::string>;

using testing::expect_error;

TEST(DeviceMeshTest, ShapeSizeAndNames) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 3}, {"dp", "tp"});
  EXPECT_EQ(mesh.shape(), (V{2, 3}));
  EXPECT_EQ(mesh.ndim(), 2);
  EXPECT_EQ(mesh.size(), 6);
  EXPECT_EQ(mesh.size(0), 2);
  EXPECT_EQ(mesh.size(1), 3);
  EXPECT_EQ(mesh.size(-1), 3);
  EXPECT_EQ(mesh.dim_index("tp"), 1);
  EXPECT_EQ(mesh.ranks(), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(mesh.to_string(), "DeviceMesh((2,3), ranks=[0,1,2,3,4,5], names=(dp,tp))");
}

TEST(DeviceMeshTest, CoordinatesFollowRowMajorRankArray) {
  // Ranks need not be 0..N-1 nor sorted.
  const DeviceMesh mesh({2, 2}, {7, 3, 5, 1});
  struct Case {
    int64_t rank;
    std::optional<V> coord;
  };
  const Case cases[] = {{7, V{0, 0}}, {3, V{0, 1}},      {5, V{1, 0}},
                        {1, V{1, 1}}, {0, std::nullopt}, {8, std::nullopt}};
  for (const auto& c : cases) {
    EXPECT_EQ(mesh.coordinate(c.rank), c.coord) << "rank " << c.rank;
    if (c.coord) {
      EXPECT_EQ(mesh.rank_at(*c.coord), c.rank);
    }
  }
  EXPECT_FALSE(mesh.contains(2));
  expect_error([&] { mesh.rank_at({2, 0}); }, "outside mesh shape (2,2)");
  expect_error([&] { mesh.rank_at({0}); }, "1 entries for a 2-D mesh");
}

TEST(DeviceMeshTest, GroupsAlongEachDim) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 3}, {"dp", "tp"});
  EXPECT_EQ(mesh.group_ranks(0, 4), (V{1, 4}));
  EXPECT_EQ(mesh.group_ranks(1, 4), (V{3, 4, 5}));
  EXPECT_EQ(mesh.all_groups(0), (std::vector<V>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(mesh.all_groups(1), (std::vector<V>{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(mesh.all_groups(-1), mesh.all_groups(1));
  // PyTorch's order: swapdims(-1, d).reshape(-1, size(d)).
  const DeviceMesh cube = DeviceMesh::arange({2, 2, 2});
  EXPECT_EQ(cube.all_groups(0), (std::vector<V>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  EXPECT_EQ(cube.all_groups(1), (std::vector<V>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(cube.all_groups(2), (std::vector<V>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(DeviceMesh::arange({2, 3, 4}).all_groups(0), (std::vector<V>{{0, 12},
                                                                         {4, 16},
                                                                         {8, 20},
                                                                         {1, 13},
                                                                         {5, 17},
                                                                         {9, 21},
                                                                         {2, 14},
                                                                         {6, 18},
                                                                         {10, 22},
                                                                         {3, 15},
                                                                         {7, 19},
                                                                         {11, 23}}));
  expect_error([&] { mesh.group_ranks(0, 9); }, "rank 9 is not in");
  expect_error([&] { mesh.group_ranks(2, 0); }, "dim 2 is out of range for a 2-D mesh");
}

TEST(DeviceMeshTest, GroupNamesAreSharedWithinAGroupAndDistinctAcrossGroups) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 2, 2});
  for (int64_t dim = 0; dim < 3; ++dim) {
    std::set<std::string> names;
    for (const V& group : mesh.all_groups(dim)) {
      std::set<std::string> within;
      for (int64_t r : group) within.insert(mesh.group_name(dim, r));
      EXPECT_EQ(within.size(), 1u);
      names.insert(*within.begin());
    }
    EXPECT_EQ(names.size(), mesh.all_groups(dim).size());
  }
  EXPECT_EQ(mesh.group_name(2, 5), "ranks:4-5");
  EXPECT_EQ(DeviceMesh::arange({2, 2}, {"dp", "tp"}).group_name(0, 3), "ranks:1-3");
  // Slicing keeps the name: the sub-mesh's group is the same group.
  EXPECT_EQ(mesh.submesh_dims({2}, 5).group_name(0, 5), mesh.group_name(2, 5));
  // Large groups get a digest; it is deterministic.
  const DeviceMesh big = DeviceMesh::arange({16});
  EXPECT_EQ(big.group_name(0, 3), DeviceMesh::arange({16}).group_name(0, 0));
  EXPECT_EQ(big.group_name(0, 3).substr(0, 9), "ranks:16r");
}

TEST(DeviceMeshTest, SubmeshByNamesInAnyOrder) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 2, 2}, {"pp", "dp", "tp"});
  const DeviceMesh tp = mesh.submesh({"tp"}, 6);
  EXPECT_EQ(tp.shape(), (V{2}));
  EXPECT_EQ(tp.ranks(), (V{6, 7}));
  EXPECT_EQ(tp.dim_names(), (Names{"tp"}));
  const DeviceMesh dp_tp = mesh.submesh({"dp", "tp"}, 5);
  EXPECT_EQ(dp_tp.ranks(), (V{4, 5, 6, 7}));
  // Reversed order: the sub-mesh is transposed.
  const DeviceMesh tp_dp = mesh.submesh({"tp", "dp"}, 5);
  EXPECT_EQ(tp_dp.ranks(), (V{4, 6, 5, 7}));
  EXPECT_EQ(tp_dp.dim_names(), (Names{"tp", "dp"}));
  const DeviceMesh pp_tp = mesh.submesh({"pp", "tp"}, 2);
  EXPECT_EQ(pp_tp.ranks(), (V{2, 3, 6, 7}));
  expect_error([&] { mesh.submesh({"cp"}, 0); }, "no dim named 'cp'; the mesh has dims (pp,dp,tp)");
  expect_error([&] { mesh.submesh({"tp", "tp"}, 0); }, "names dim tp twice");
  expect_error([&] { mesh.submesh({"tp"}, 8); }, "rank 8 is not in");
}

TEST(DeviceMeshTest, FlattenMergesDims) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 2, 2}, {"pp", "dp", "tp"});
  const DeviceMesh f = mesh.flatten({"dp", "tp"});
  EXPECT_EQ(f.shape(), (V{2, 4}));
  EXPECT_EQ(f.dim_names(), (Names{"pp", "dp_tp"}));
  EXPECT_EQ(f.ranks(), mesh.ranks());  // adjacent dims in order: same rank array
  const DeviceMesh g = mesh.flatten({"pp", "tp"}, "ptp");
  EXPECT_EQ(g.shape(), (V{4, 2}));
  EXPECT_EQ(g.dim_names(), (Names{"ptp", "dp"}));
  EXPECT_EQ(g.group_ranks(0, 0), (V{0, 1, 4, 5}));
  EXPECT_EQ(g.group_ranks(1, 0), (V{0, 2}));
  const DeviceMesh h = mesh.flatten({"tp", "dp"});
  EXPECT_EQ(h.group_ranks(1, 0), (V{0, 2, 1, 3}));
  const DeviceMesh all = DeviceMesh::arange({2, 3}).flatten_dims({0, 1});
  EXPECT_EQ(all.shape(), (V{6}));
  expect_error([&] { mesh.flatten({"dp"}, "tp"); }, "'tp' already exists");
  expect_error([&] { mesh.flatten_dims({}); }, "at least one dim");
  expect_error([] { DeviceMesh::arange({2, 2}).flatten_dims({0, 1}, "x"); }, "has no dim names");
}

TEST(DeviceMeshTest, ValidationNamesTheProblem) {
  expect_error([] { DeviceMesh({2, 2}, {0, 1, 2}); }, "holds 4 ranks but 3 were given");
  expect_error([] { DeviceMesh({2, -1}, {0, 1}); }, "has a size <= 0");
  expect_error([] { DeviceMesh({2}, {0, 0}); }, "rank 0 appears twice");
  expect_error([] { DeviceMesh({2}, {0, -3}); }, "rank -3 is negative");
  expect_error([] { DeviceMesh({2, 2}, {0, 1, 2, 3}, {"dp", "dp"}); }, "'dp' appears twice");
  expect_error([] { DeviceMesh({2, 2}, {0, 1, 2, 3}, {"dp"}); }, "1 dim names");
  expect_error([] { DeviceMesh({2}, {0, 1}, {""}); }, "must not be empty");
  expect_error([] { DeviceMesh::arange({100000, 100000}); }, "more than 16777216 ranks");
}

TEST(DeviceMeshTest, EqualityAndHashByValue) {
  EXPECT_EQ(DeviceMesh::arange({2, 2}), DeviceMesh({2, 2}, {0, 1, 2, 3}));
  EXPECT_EQ(DeviceMesh::arange({2, 2}).hash(), DeviceMesh({2, 2}, {0, 1, 2, 3}).hash());
  EXPECT_NE(DeviceMesh::arange({2, 2}), DeviceMesh::arange({4}));
  EXPECT_NE(DeviceMesh::arange({2, 2}), DeviceMesh({2, 2}, {0, 2, 1, 3}));
  EXPECT_NE(DeviceMesh::arange({2, 2}), DeviceMesh::arange({2, 2}, {"a", "b"}));
}

// NOTE [mesh device]: the device type is part of the mesh: equality, hash, to_string, and every
// mesh derived from it.
TEST(DeviceMeshTest, DeviceTypeIsPartOfTheMesh) {
  const DeviceMesh cpu = DeviceMesh::arange({2, 2}, {"dp", "tp"});
  const DeviceMesh cuda = DeviceMesh::arange({2, 2}, {"dp", "tp"}, c10::DeviceType::CUDA);
  EXPECT_EQ(cpu.device_type(), c10::DeviceType::CPU);
  EXPECT_EQ(DeviceMesh({2}, {0, 1}).device_type(), c10::DeviceType::CPU);
  EXPECT_EQ(cuda.device_type(), c10::DeviceType::CUDA);
  EXPECT_NE(cpu, cuda);
  EXPECT_NE(cpu.hash(), cuda.hash());
  EXPECT_EQ(cuda, DeviceMesh({2, 2}, {0, 1, 2, 3}, {"dp", "tp"}, c10::DeviceType::CUDA));
  EXPECT_EQ(cuda.hash(),
            DeviceMesh({2, 2}, {0, 1, 2, 3}, {"dp", "tp"}, c10::DeviceType::CUDA).hash());
  EXPECT_EQ(cuda.with_device_type(c10::DeviceType::CPU), cpu);
  EXPECT_EQ(cpu.with_device_type(c10::DeviceType::CUDA), cuda);
  // A CPU mesh prints as before; another names its device type.
  EXPECT_EQ(cpu.to_string(), "DeviceMesh((2,2), ranks=[0,1,2,3], names=(dp,tp))");
  EXPECT_EQ(cuda.to_string(), "DeviceMesh((2,2), ranks=[0,1,2,3], names=(dp,tp), device=cuda)");
  // Sub-meshes and flattened meshes keep it.
  EXPECT_EQ(cuda.submesh({"tp"}, 2).device_type(), c10::DeviceType::CUDA);
  EXPECT_EQ(cuda.submesh_dims({1, 0}, 3).device_type(), c10::DeviceType::CUDA);
  EXPECT_EQ(cuda.flatten({"dp", "tp"}).device_type(), c10::DeviceType::CUDA);
  EXPECT_EQ(cpu.submesh({"tp"}, 2).device_type(), c10::DeviceType::CPU);
  EXPECT_NE(cuda.submesh({"tp"}, 2), cpu.submesh({"tp"}, 2));
  // Groups are named by ranks alone: a CPU and a CUDA mesh over the same ranks name the same.
  EXPECT_EQ(cuda.group_name(1, 2), cpu.group_name(1, 2));
}

TEST(DeviceMeshTest, DeviceTypeNames) {
  EXPECT_EQ(parse_device_type("cpu"), c10::DeviceType::CPU);
  EXPECT_EQ(parse_device_type("cuda"), c10::DeviceType::CUDA);
  EXPECT_EQ(device_type_name(c10::DeviceType::CPU), "cpu");
  EXPECT_EQ(device_type_name(c10::DeviceType::CUDA), "cuda");
  expect_error([] { parse_device_type("cuda:0"); }, "'cuda:0' is not a device type");
  expect_error([] { parse_device_type("tpu9"); }, "'tpu9' is not a device type");
}

// The one helper that says where a rank's tensors of a mesh live (NOTE [mesh device]).
TEST(DeviceMeshTest, LocalDevice) {
  EXPECT_EQ(DeviceMesh::arange({2}).local_device(), c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(mesh_device(c10::DeviceType::CPU), c10::Device(c10::DeviceType::CPU));
  const DeviceMesh cuda = DeviceMesh::arange({2}, {}, c10::DeviceType::CUDA);
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    // A CPU-only libtorch (Debian's): a clear error, not a CPU tensor in disguise.
    expect_error([&] { cuda.local_device(); }, "a cuda mesh needs a libtorch with cuda support");
    return;
  }
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  if (guard->deviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(cuda.local_device(), guard->getDevice());
  EXPECT_TRUE(cuda.local_device().is_cuda());
}

}  // namespace
}  // namespace dtensor
