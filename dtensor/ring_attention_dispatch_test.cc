// at::scaled_dot_product_attention on distributed tensors sharded along the sequence, from C++
// (NOTE [ring attention in the engine]): output and gradients equal one device's, the query is
// never gathered, and the collectives are the ring's. Ranks are threads.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
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

constexpr char kSdpa[] = "aten::scaled_dot_product_attention";
constexpr char kFlash[] = "aten::_scaled_dot_product_flash_attention_for_cpu";
constexpr char kFlashBackward[] = "aten::_scaled_dot_product_flash_attention_for_cpu_backward";

// The two entries of NOTE [ring attention in the engine]: SDPA's autograd kernel, and ATen's
// fused CPU op (and its backward) called directly.
enum class Entry { kSdpa, kFusedOp };

at::Tensor global_for(const std::vector<int64_t>& shape, int64_t salt) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return at::sin(at::arange(numel, at::kDouble) * 0.731 + salt * 1.37).reshape(shape);
}

struct Case {
  std::vector<int64_t> mesh;
  Placements placements;  // of q, k, v, the output and its gradient
  int64_t b = 2, hq = 4, hk = 4, s = 12, t = 12, e = 8, ev = 8;
  Entry entry = Entry::kSdpa;
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
      out = c.entry == Entry::kSdpa
                ? at::scaled_dot_product_attention(dq, dk, dv, {}, 0.0, c.causal, std::nullopt, gqa)
                : std::get<0>(
                      at::_scaled_dot_product_flash_attention_for_cpu(dq, dk, dv, 0.0, c.causal));
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

// The causes of the forward's and the backward's collectives for an entry.
std::pair<std::string, std::string> causes(Entry entry) {
  if (entry == Entry::kSdpa) return {kSdpa, kSdpa};
  return {kFlash, kFlashBackward};
}

TEST(RingAttentionDispatch, AllGatherCausalAndNot) {
  for (const Entry entry : {Entry::kSdpa, Entry::kFusedOp}) {
    for (const int64_t w : {2, 3, 4}) {
      for (const bool causal : {true, false}) {
        SCOPED_TRACE("world " + std::to_string(w) + (causal ? " causal" : "") +
                     (entry == Entry::kSdpa ? " sdpa" : " fused op"));
        Case c;
        c.mesh = {w};
        c.placements = {Shard(2)};
        c.causal = causal;
        c.entry = entry;
        const auto counts = run_case(c);
        const auto [fwd, bwd] = causes(entry);
        expect_only(counts[0], fwd);
        EXPECT_EQ(count(counts[0], fwd, "all_gather_into_tensor"), 1);
        expect_only(counts[1], bwd);
        EXPECT_EQ(count(counts[1], bwd, "all_gather_into_tensor"), 1);
        EXPECT_EQ(count(counts[1], bwd, "reduce_scatter_tensor"), 1);
      }
    }
  }
}

TEST(RingAttentionDispatch, AllToAllRotatesKeysAndValues) {
  for (const Entry entry : {Entry::kSdpa, Entry::kFusedOp}) {
    for (const int64_t w : {2, 4}) {
      SCOPED_TRACE("world " + std::to_string(w));
      Case c;
      c.mesh = {w};
      c.placements = {Shard(2)};
      c.method = RotateMethod::kAllToAll;
      c.entry = entry;
      const auto counts = run_case(c);
      const auto [fwd, bwd] = causes(entry);
      expect_only(counts[0], fwd);
      EXPECT_EQ(count(counts[0], fwd, "all_to_all_single"), w - 1);
      expect_only(counts[1], bwd);
      EXPECT_EQ(count(counts[1], bwd, "all_to_all_single"), 2 * w - 1);
    }
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
    expect_only(run_case(c)[0], kSdpa);
  }
}

TEST(RingAttentionDispatch, SequenceBesideHeadsAndBatch) {
  Case heads;
  heads.mesh = {2, 2};
  heads.placements = {Shard(1), Shard(2)};
  expect_only(run_case(heads)[0], kSdpa);
  heads.entry = Entry::kFusedOp;
  expect_only(run_case(heads)[0], kFlash);
  Case batch;
  batch.mesh = {2, 2};
  batch.placements = {Shard(2), Shard(0)};
  batch.hk = 2;
  batch.method = RotateMethod::kAllToAll;
  expect_only(run_case(batch)[0], kSdpa);
}

// Query and keys of different lengths, and a value head size unlike the query's (no fused
// kernel takes it: SDPA's entry only).
TEST(RingAttentionDispatch, CrossAttentionLengthsAndValueHeadSize) {
  Case c;
  c.mesh = {3};
  c.placements = {Shard(2)};
  c.s = 9;
  c.t = 14;
  for (const bool causal : {false, true}) {  // causal: top-left, query i sees keys j <= i
    c.causal = causal;
    expect_only(run_case(c)[0], kSdpa);
  }
  c.t = 9;
  c.ev = 5;
  expect_only(run_case(c)[0], kSdpa);
}

// Under inference mode SDPA's autograd kernel is skipped: the fused op's entry runs the ring.
TEST(RingAttentionDispatch, InferenceMode) {
  const at::Tensor q = global_for({2, 4, 10, 8}, 1), k = global_for({2, 4, 10, 8}, 2),
                   v = global_for({2, 4, 10, 8}, 3);
  const at::Tensor want = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  run_threads(3, [&](int64_t rank) {
    const c10::InferenceMode no_autograd;
    const DeviceMesh mesh = api::init_device_mesh({3});
    collectives::CommCounter counter;
    const at::Tensor out = at::scaled_dot_product_attention(
        api::distribute_tensor(q, mesh, {Shard(2)}), api::distribute_tensor(k, mesh, {Shard(2)}),
        api::distribute_tensor(v, mesh, {Shard(2)}), {}, 0.0, true);
    expect_only(counter.counts_by_cause(), kFlash);
    EXPECT_EQ(api::spec(out).placements(), Placements{Shard(2)});
    EXPECT_TRUE(at::allclose(api::full_tensor(out), want, 1e-10, 1e-10));
  });
}

// 3-D (no batch) and 5-D (two batch dims) q/k/v through SDPA's entry.
TEST(RingAttentionDispatch, OtherRanks) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{4, 9, 8}, {2, 3, 2, 9, 8}}) {
    const int64_t n = static_cast<int64_t>(shape.size());
    const at::Tensor q = global_for(shape, 1), k = global_for(shape, 2), v = global_for(shape, 3),
                     g = global_for(shape, 4);
    const at::Tensor rq = q.clone().requires_grad_();
    const at::Tensor want = at::scaled_dot_product_attention(rq, k, v, {}, 0.0, true);
    want.backward(g);
    run_threads(3, [&](int64_t) {
      const DeviceMesh mesh = api::init_device_mesh({3});
      const Placements seq = {Shard(static_cast<int32_t>(n - 2))};
      const at::Tensor dq = api::distribute_tensor(q, mesh, seq).requires_grad_();
      const at::Tensor dk = api::distribute_tensor(k, mesh, seq),
                       dv = api::distribute_tensor(v, mesh, seq),
                       dg = api::distribute_tensor(g, mesh, seq);
      at::Tensor out;
      {
        collectives::CommCounter counter;
        out = at::scaled_dot_product_attention(dq, dk, dv, {}, 0.0, true);
        out.backward(dg);
        expect_only(counter.counts_by_cause(), kSdpa);
      }
      EXPECT_TRUE(at::allclose(api::full_tensor(out), want, 1e-10, 1e-10));
      EXPECT_TRUE(at::allclose(api::full_tensor(dq.grad()), rq.grad(), 1e-10, 1e-10));
    });
  }
}

// NOTE [program digest]: ranks that call attention with different causal flags exchange
// messages of the same sizes; the ring's first collective fails on every rank instead of
// mixing one rank's blocks with another's.
TEST(RingAttentionDispatch, RanksWithDifferentArgumentsFail) {
  const at::Tensor q = global_for({1, 2, 8, 4}, 1);
  for (const Entry entry : {Entry::kSdpa, Entry::kFusedOp}) {
    run_threads(2, [&](int64_t rank) {
      const DeviceMesh mesh = api::init_device_mesh({2});
      const at::Tensor d = api::distribute_tensor(q, mesh, {Shard(2)});
      const bool causal = rank == 0;
      try {
        if (entry == Entry::kSdpa) {
          at::scaled_dot_product_attention(d, d, d, {}, 0.0, causal);
        } else {
          at::_scaled_dot_product_flash_attention_for_cpu(d, d, d, 0.0, causal);
        }
        ADD_FAILURE() << "rank " << rank << ": different causal flags were not caught";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("program differs"), std::string::npos) << e.what();
      }
    });
  }
}

}  // namespace
}  // namespace dtensor
