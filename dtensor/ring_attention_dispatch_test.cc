// at::scaled_dot_product_attention on distributed tensors sharded along the sequence, from C++
// (NOTE [ring attention in the engine]): output and gradients equal one device's, the query is
// never gathered, and the collectives are the ring's. Ranks are threads.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "dtensor/ring_attention.h"

namespace dtensor {
namespace {

using attention::RotateMethod;
using collectives::run_threads;
namespace api = dtensor::api;

constexpr char kFlash[] = "aten::_scaled_dot_product_flash_attention_for_cpu";
constexpr char kFlashBackward[] = "aten::_scaled_dot_product_flash_attention_for_cpu_backward";

at::Tensor global_for(const std::vector<int64_t>& shape, int64_t salt) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return at::sin(at::arange(numel, at::kDouble) * 0.731 + salt * 1.37).reshape(shape);
}

struct Case {
  std::vector<int64_t> mesh;
  Placements placements;  // of q, k, v, the output and its gradient
  int64_t b = 2, hq = 4, hk = 4, s = 12, t = 12, e = 8;
  bool causal = true;
  RotateMethod method = RotateMethod::kAllGather;
};

// Runs the case on every rank against one device's SDPA (float64, the fused CPU kernel on both
// sides); returns rank 0's collectives by (cause, label), forward then backward.
std::vector<std::map<std::pair<std::string, std::string>, int64_t>> run_case(const Case& c) {
  const at::Tensor q = global_for({c.b, c.hq, c.s, c.e}, 1),
                   k = global_for({c.b, c.hk, c.t, c.e}, 2),
                   v = global_for({c.b, c.hk, c.t, c.e}, 3),
                   g = global_for({c.b, c.hq, c.s, c.e}, 4);
  const bool gqa = c.hq != c.hk;
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(),
                   rv = v.clone().requires_grad_();
  const at::Tensor want =
      at::scaled_dot_product_attention(rq, rk, rv, {}, 0.0, c.causal, std::nullopt, gqa);
  want.backward(g);
  std::vector<std::map<std::pair<std::string, std::string>, int64_t>> counts(2);
  const RotateMethod before = attention::rotate_method();
  attention::set_rotate_method(c.method);
  int64_t world = 1;
  for (int64_t size : c.mesh) world *= size;
  run_threads(world, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh(c.mesh);
    auto place = [&](const at::Tensor& x) {
      return api::distribute_tensor(x, mesh, c.placements).requires_grad_();
    };
    const at::Tensor dq = place(q), dk = place(k), dv = place(v);
    at::Tensor out;
    {
      collectives::CommCounter forward;
      out = at::scaled_dot_product_attention(dq, dk, dv, {}, 0.0, c.causal, std::nullopt, gqa);
      if (rank == 0) counts[0] = forward.counts_by_cause();
    }
    EXPECT_EQ(api::spec(out).placements(), c.placements);
    {
      collectives::CommCounter backward;
      out.backward(api::distribute_tensor(g, mesh, c.placements));
      if (rank == 0) counts[1] = backward.counts_by_cause();
    }
    EXPECT_TRUE(at::allclose(api::full_tensor(out), want, 1e-10, 1e-10));
    EXPECT_TRUE(at::allclose(api::full_tensor(dq.grad()), rq.grad(), 1e-10, 1e-10));
    EXPECT_TRUE(at::allclose(api::full_tensor(dk.grad()), rk.grad(), 1e-10, 1e-10));
    EXPECT_TRUE(at::allclose(api::full_tensor(dv.grad()), rv.grad(), 1e-10, 1e-10));
    EXPECT_EQ(api::spec(dk.grad()).placements(), c.placements);
  });
  attention::set_rotate_method(before);
  return counts;
}

int64_t count(const std::map<std::pair<std::string, std::string>, int64_t>& counts,
              const std::string& cause, const std::string& label) {
  const auto it = counts.find({cause, label});
  return it == counts.end() ? 0 : it->second;
}

// Every collective of the case is the ring's, under the attention op's name.
void expect_only(const std::map<std::pair<std::string, std::string>, int64_t>& counts,
                 const std::string& cause) {
  for (const auto& [key, n] : counts) {
    EXPECT_EQ(key.first, cause) << key.second << " x" << n;
  }
}

TEST(RingAttentionDispatch, AllGatherCausalAndNot) {
  for (const int64_t w : {2, 3, 4}) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE("world " + std::to_string(w) + (causal ? " causal" : ""));
      Case c;
      c.mesh = {w};
      c.placements = {Shard(2)};
      c.causal = causal;
      const auto counts = run_case(c);
      expect_only(counts[0], kFlash);
      EXPECT_EQ(count(counts[0], kFlash, "all_gather_into_tensor"), 1);
      expect_only(counts[1], kFlashBackward);
      EXPECT_EQ(count(counts[1], kFlashBackward, "all_gather_into_tensor"), 1);
      EXPECT_EQ(count(counts[1], kFlashBackward, "reduce_scatter_tensor"), 1);
    }
  }
}

TEST(RingAttentionDispatch, AllToAllRotatesKeysAndValues) {
  for (const int64_t w : {2, 4}) {
    SCOPED_TRACE("world " + std::to_string(w));
    Case c;
    c.mesh = {w};
    c.placements = {Shard(2)};
    c.method = RotateMethod::kAllToAll;
    const auto counts = run_case(c);
    expect_only(counts[0], kFlash);
    EXPECT_EQ(count(counts[0], kFlash, "all_to_all_single"), w - 1);
    expect_only(counts[1], kFlashBackward);
    EXPECT_EQ(count(counts[1], kFlashBackward, "all_to_all_single"), 2 * w - 1);
  }
}

TEST(RingAttentionDispatch, UnevenSequenceAndGqa) {
  Case c;
  c.mesh = {4};
  c.placements = {Shard(2)};
  c.s = c.t = 10;  // pieces 3, 3, 3, 1
  c.hk = 2;
  for (const RotateMethod method : {RotateMethod::kAllGather, RotateMethod::kAllToAll}) {
    c.method = method;
    expect_only(run_case(c)[0], kFlash);
  }
}

TEST(RingAttentionDispatch, SequenceBesideHeadsAndBatch) {
  Case heads;
  heads.mesh = {2, 2};
  heads.placements = {Shard(1), Shard(2)};
  expect_only(run_case(heads)[0], kFlash);
  Case batch;
  batch.mesh = {2, 2};
  batch.placements = {Shard(2), Shard(0)};
  batch.hk = 2;
  batch.method = RotateMethod::kAllToAll;
  expect_only(run_case(batch)[0], kFlash);
}

// Query and keys of different lengths, not causal: every query row sees every key.
TEST(RingAttentionDispatch, CrossAttentionLengths) {
  Case c;
  c.mesh = {3};
  c.placements = {Shard(2)};
  c.s = 9;
  c.t = 14;
  c.causal = false;
  expect_only(run_case(c)[0], kFlash);
}

}  // namespace
}  // namespace dtensor
