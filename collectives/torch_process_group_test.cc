// The engine's groups as c10d process groups (NOTE [mesh groups as torch process groups]):
// c10d's collectives and torch's functional collectives, resolved by the registered group name,
// give the values one device computes from every rank's input.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include "base/error.h"
#include "collectives/rank_context.h"
#include "collectives/torch_process_group.h"

namespace dtensor::collectives {
namespace {

// Rank r's input: arange(n) + 100 r, so every result says which rank's elements it holds.
at::Tensor input_of(int64_t rank, int64_t n) {
  return at::arange(n, at::kFloat) + 100.0 * static_cast<double>(rank);
}

TEST(TorchProcessGroup, CollectivesThroughTheProcessGroupEqualOneDevice) {
  for (int64_t world : {1, 2, 3, 4}) {
    run_threads(world, [&](int64_t rank) {
      auto pg = torch_process_group(RankContext::kWorld);
      EXPECT_EQ(pg->getRank(), rank);
      EXPECT_EQ(pg->getSize(), world);
      EXPECT_EQ(pg->getGroupName(), torch_group_name(RankContext::kWorld));
      std::vector<at::Tensor> all;
      for (int64_t r = 0; r < world; ++r) all.push_back(input_of(r, 6));

      std::vector<at::Tensor> t = {input_of(rank, 6)};
      pg->allreduce(t)->wait();
      EXPECT_TRUE(at::equal(t[0], at::stack(all).sum(0)));

      at::Tensor gathered = at::empty({world * 6});
      at::Tensor mine = input_of(rank, 6);
      pg->_allgather_base(gathered, mine)->wait();
      EXPECT_TRUE(at::equal(gathered, at::cat(all)));

      std::vector<at::Tensor> outs = {at::empty({world * 6})}, ins = {input_of(rank, 6)};
      pg->allgather_into_tensor_coalesced(outs, ins)->wait();
      EXPECT_TRUE(at::equal(outs[0], at::cat(all)));

      at::Tensor whole = input_of(rank, 2 * world), piece = at::empty({2});
      pg->_reduce_scatter_base(piece, whole)->wait();
      at::Tensor sum = at::zeros({2 * world});
      for (int64_t r = 0; r < world; ++r) sum += input_of(r, 2 * world);
      EXPECT_TRUE(at::equal(piece, sum.narrow(0, 2 * rank, 2)));

      // all_to_all with uneven splits: rank r sends r + 1 elements to each peer.
      std::vector<int64_t> in_splits(world, rank + 1), out_splits;
      for (int64_t r = 0; r < world; ++r) out_splits.push_back(r + 1);
      at::Tensor send = input_of(rank, world * (rank + 1));
      at::Tensor recv = at::empty({world * (world + 1) / 2});
      pg->alltoall_base(recv, send, out_splits, in_splits)->wait();
      std::vector<at::Tensor> expect;
      for (int64_t r = 0; r < world; ++r)
        expect.push_back(input_of(r, world * (r + 1)).narrow(0, rank * (r + 1), r + 1));
      EXPECT_TRUE(at::equal(recv, at::cat(expect)));

      std::vector<at::Tensor> b = {input_of(rank, 3)};
      c10d::BroadcastOptions opts;
      opts.rootRank = static_cast<int>(world - 1);
      pg->broadcast(b, opts)->wait();
      EXPECT_TRUE(at::equal(b[0], input_of(world - 1, 3)));
      pg->barrier()->wait();
    });
  }
}

TEST(TorchProcessGroup, FunctionalCollectivesResolveTheRegisteredName) {
  run_threads(2, [&](int64_t rank) {
    const std::string name = torch_group_name(RankContext::kWorld);
    torch_process_group(RankContext::kWorld);
    EXPECT_EQ(c10d::resolve_process_group(name)->getRank(), rank);
    auto gather = c10::Dispatcher::singleton()
                      .findSchemaOrThrow("_c10d_functional::all_gather_into_tensor", "")
                      .typed<at::Tensor(const at::Tensor&, int64_t, std::string)>();
    auto wait = c10::Dispatcher::singleton()
                    .findSchemaOrThrow("_c10d_functional::wait_tensor", "")
                    .typed<at::Tensor(const at::Tensor&)>();
    at::Tensor out = wait.call(gather.call(input_of(rank, 4).view({2, 2}), 2, name));
    EXPECT_TRUE(at::equal(out, at::cat({input_of(0, 4), input_of(1, 4)}).view({4, 2})));
  });
}

TEST(TorchProcessGroup, SendNamesTheGroupAndRank) {
  run_threads(2, [&](int64_t rank) {
    auto pg = torch_process_group(RankContext::kWorld);
    std::vector<at::Tensor> t = {at::ones({2})};
    try {
      pg->getBackend(c10::DeviceType::CPU)->send(t, static_cast<int>(1 - rank), 0);
      ADD_FAILURE() << "send did not raise";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dtensor:world"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("point-to-point"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dtensor::collectives
