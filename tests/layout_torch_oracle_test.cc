// Independent oracle: the local tensor of every rank, for every layout of the enumeration, equals
// what repeated torch.chunk calls on the real global tensor give (at::chunk, following the shard
// order). (That Partial locals reduce back to the global tensor is local_tensor_test's job.)

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dtensor/local_tensor.h"
#include "layout/testing/layout_enumeration.h"

namespace dtensor {
namespace {

// Piece `i` of at::chunk(t, k, dim), or an empty slice at the end when chunk returned fewer.
at::Tensor torch_chunk(const at::Tensor& t, int64_t k, int64_t dim, int64_t i) {
  const auto pieces = at::chunk(t, k, dim);
  if (i < static_cast<int64_t>(pieces.size())) return pieces[i];
  return t.narrow(dim, t.size(dim), 0);
}

at::Tensor oracle_local(const at::Tensor& global, const DTensorSpec& spec,
                        const std::vector<int64_t>& coord) {
  at::Tensor t = global;
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    for (int64_t m : spec.shard_order(d)) t = torch_chunk(t, spec.mesh().size(m), d, coord[m]);
  }
  return t;
}

TEST(LayoutTorchOracleTest, LocalSlicesMatchRepeatedTorchChunk) {
  testing::for_each_property_spec([](const DTensorSpec& spec) {
    const at::Tensor global = at::arange(spec.meta().numel(), at::kFloat).reshape(spec.shape());
    for (int64_t r : spec.mesh().ranks()) {
      const auto coord = *spec.mesh().coordinate(r);
      const at::Tensor expected = oracle_local(global, spec, coord);
      const at::Tensor got = slice_box(global, local_box(spec, coord));
      ASSERT_EQ(got.sizes(), expected.sizes()) << spec.to_string() << " rank " << r;
      ASSERT_TRUE(at::equal(got, expected)) << spec.to_string() << " rank " << r;
    }
  });
}

}  // namespace
}  // namespace dtensor
