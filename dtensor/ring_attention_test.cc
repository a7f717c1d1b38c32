// Ring attention on thread ranks against one device's scaled_dot_product_attention on the
// global q/k/v (in double, autograd for the gradients): every rank's output, log-sum-exp and
// dq/dk/dv must be the reference's rows at the rank's positions, and the collectives issued
// must be the ring's (W-1 all_to_all_single forward and 2W-1 backward per head group, or one
// all_gather forward and one all_gather and one reduce_scatter backward).

#include "dtensor/ring_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::attention {
namespace {

using collectives::CollectiveKind;

struct Case {
  const char* name;
  int64_t world, sq, sk;
  bool causal = false, q_head_tail = false, kv_head_tail = false;
  int64_t batch = 2, hq = 2, hk = 2, e = 8, ev = 8;
  at::ScalarType dtype = at::kDouble;
};

std::string describe(const Case& c, RotateMethod m) {
  return c10::str(c.name, " (W=", c.world, ", Sq=", c.sq, ", Sk=", c.sk, c.causal ? ", causal" : "",
                  c.q_head_tail ? ", q head-tail" : "", c.kv_head_tail ? ", kv head-tail" : "",
                  ", ", c.dtype, ", ", m == RotateMethod::kAllToAll ? "alltoall" : "allgather",
                  ")");
}

SeqLayout layout(int64_t seq, int64_t world, bool head_tail) {
  return head_tail ? SeqLayout::head_tail(seq, world) : SeqLayout::natural(seq, world);
}

// The rows (dim 2) of `global` at the rank's positions, in the order of its piece.
at::Tensor local(const at::Tensor& global, const SeqLayout& l, int64_t rank) {
  std::vector<at::Tensor> parts;
  for (const auto& [offset, size] : l.segments[rank])
    parts.push_back(global.narrow(2, offset, size));
  return at::cat(parts, 2);
}

struct Reference {
  at::Tensor q, k, v, grad;         // the inputs, in the case's dtype
  at::Tensor out, lse, dq, dk, dv;  // in double
};

Reference reference(const Case& c, double scale) {
  at::manual_seed(c.world * 1000 + c.sq * 10 + c.sk);
  Reference r;
  const auto randn = [&](std::vector<int64_t> shape) {
    return at::randn(shape, at::kDouble).to(c.dtype);
  };
  r.q = randn({c.batch, c.hq, c.sq, c.e});
  r.k = randn({c.batch, c.hk, c.sk, c.e});
  r.v = randn({c.batch, c.hk, c.sk, c.ev});
  r.grad = randn({c.batch, c.hq, c.sq, c.ev});
  const at::Tensor q = r.q.to(at::kDouble).requires_grad_();
  const at::Tensor k = r.k.to(at::kDouble).requires_grad_();
  const at::Tensor v = r.v.to(at::kDouble).requires_grad_();
  r.out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, c.causal, scale, c.hq != c.hk);
  (r.out * r.grad.to(at::kDouble)).sum().backward();
  r.out = r.out.detach();
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  // The log-sum-exp of the scaled scores, masked as SDPA's is_causal (top-left).
  at::NoGradGuard no_grad;
  at::Tensor s = at::matmul(q, k.repeat_interleave(c.hq / c.hk, 1).transpose(-1, -2)) * scale;
  if (c.causal) {
    const at::Tensor seen = at::ones({c.sq, c.sk}, at::kBool).tril();
    s = s.masked_fill(seen.logical_not(), -std::numeric_limits<double>::infinity());
  }
  r.lse = at::logsumexp(s, -1);
  return r;
}

// How many head groups a kAllToAll ring runs (NOTE [ring attention memory]): as many k/v heads
// per group as fit 512 KiB messages of `head_bytes` per element of a head's longest piece.
int64_t head_groups(const Case& c, const SeqLayout& kv, int64_t head_bytes) {
  int64_t longest = 0;
  for (int64_t j = 0; j < kv.world(); ++j) longest = std::max(longest, kv.length(j));
  const int64_t per_head = head_bytes * c.batch * longest * std::max(c.e, c.ev);
  const int64_t n = per_head == 0 ? c.hk : std::clamp<int64_t>((1 << 19) / per_head, 1, c.hk);
  return (c.hk + n - 1) / n;
}

// Empty when `got` matches `want` (double) to `tol` (absolute and relative), else what differs.
std::string compare(const char* what, const at::Tensor& got, at::ScalarType dtype,
                    const at::Tensor& want, double tol) {
  if (got.sizes() != want.sizes() || got.scalar_type() != dtype) {
    return c10::str(what, ": got ", got.sizes(), " ", got.scalar_type(), ", want ", want.sizes(),
                    " ", dtype);
  }
  const at::Tensor g = got.to(at::kDouble);
  if (at::allclose(g, want, tol, tol)) return "";
  const at::Tensor finite = at::isfinite(want);
  return c10::str(what, ": max error ",
                  (g - want).abs().masked_fill(finite.logical_not(), 0).max().item<double>(),
                  " (tolerance ", tol, ")");
}

double tolerance(at::ScalarType dtype) {
  if (dtype == at::kDouble) return 1e-12;
  if (dtype == at::kFloat) return 1e-5;
  return 5e-2;  // bf16: 8 bits of mantissa in the kernel's inputs and products
}

void run_case(const Case& c, RotateMethod method) {
  const SeqLayout ql = layout(c.sq, c.world, c.q_head_tail);
  const SeqLayout kvl = layout(c.sk, c.world, c.kv_head_tail);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.e));
  const Reference ref = reference(c, scale);
  const at::ScalarType acc = at::promote_types(c.dtype, at::kFloat);
  const double tol = tolerance(c.dtype);
  const int64_t w = c.world;
  const bool a2a = method == RotateMethod::kAllToAll;
  const int64_t fwd_groups = a2a ? head_groups(c, kvl, 2 * c10::elementSize(c.dtype)) : 1;
  const int64_t bwd_groups = a2a ? head_groups(c, kvl, 4 * c10::elementSize(acc)) : 1;
  std::mutex mu;
  std::vector<std::string> failures;
  collectives::run_threads(w, [&](int64_t rank) {
    const RingPlan plan{collectives::RankContext::kWorld, rank, ql, kvl, c.causal, scale, method};
    const at::Tensor q = local(ref.q, ql, rank), k = local(ref.k, kvl, rank);
    const at::Tensor v = local(ref.v, kvl, rank), grad = local(ref.grad, ql, rank);
    std::vector<std::string> bad;
    at::Tensor out, lse, dq, dk, dv;
    {
      collectives::CommCounter counter;
      std::tie(out, lse) = ring_attention_forward(q, k, v, plan);
      const int64_t want = a2a ? fwd_groups * (w - 1) : 1;
      const CollectiveKind kind = a2a ? CollectiveKind::kAllToAll : CollectiveKind::kAllGather;
      if (counter.count(kind) != want || counter.total() != want) {
        bad.push_back(c10::str("forward collectives: ", counter.to_string(), ", want ", want, " ",
                               collectives::collective_name(kind)));
      }
    }
    {
      collectives::CommCounter counter;
      std::tie(dq, dk, dv) = ring_attention_backward(grad, q, k, v, out, lse, plan);
      const bool ok = a2a ? counter.count(CollectiveKind::kAllToAll) == bwd_groups * (2 * w - 1) &&
                                counter.total() == bwd_groups * (2 * w - 1)
                          : counter.count(CollectiveKind::kAllGather) == 1 &&
                                counter.count(CollectiveKind::kReduceScatter) == 1 &&
                                counter.total() == 2;
      if (!ok) {
        bad.push_back(c10::str("backward collectives: ", counter.to_string(), ", want ",
                               a2a ? bwd_groups * (2 * w - 1) : 2));
      }
    }
    for (std::string s :
         {compare("out", out, c.dtype, local(ref.out, ql, rank), tol),
          compare("lse", lse, acc, local(ref.lse.unsqueeze(-1), ql, rank).squeeze(-1), tol),
          compare("dq", dq, c.dtype, local(ref.dq, ql, rank), tol),
          compare("dk", dk, c.dtype, local(ref.dk, kvl, rank), tol),
          compare("dv", dv, c.dtype, local(ref.dv, kvl, rank), tol)}) {
      if (!s.empty()) bad.push_back(s);
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const std::string& s : bad) failures.push_back(c10::str("rank ", rank, ": ", s));
  });
  for (const std::string& f : failures) ADD_FAILURE() << describe(c, method) << ": " << f;
}

void run_both(const Case& c) {
  for (const RotateMethod m : {RotateMethod::kAllGather, RotateMethod::kAllToAll}) run_case(c, m);
}

TEST(RingAttention, EveryWorldCausalLayoutAndMethod) {
  // Lengths that do not divide: 9 on 2 (head-tail 3,3,3,0), 7 on 3 (2,2,2,1,0,0), 10 on 4
  // (head-tail: 2,2,2,2,2,0,0,0), and a world of one.
  const std::vector<std::pair<int64_t, int64_t>> sizes{{1, 5}, {2, 9}, {3, 7}, {4, 10}};
  for (const auto& [world, seq] : sizes) {
    for (const bool causal : {false, true}) {
      for (const bool head_tail : {false, true}) {
        Case c{"grid", world, seq, seq};
        c.causal = causal;
        c.q_head_tail = c.kv_head_tail = head_tail;
        run_both(c);
      }
    }
  }
}

TEST(RingAttention, EmptyPieces) {
  Case c{"3 on 4: the last rank holds nothing", 4, 3, 3};
  c.causal = true;
  run_both(c);
  Case ht{"3 on 2 head-tail: one chunk empty", 2, 3, 3};
  ht.causal = ht.q_head_tail = ht.kv_head_tail = true;
  run_both(ht);
}

TEST(RingAttention, QueryAndKeysOfDifferentLengths) {
  run_both(Case{"Sq != Sk", 3, 6, 11});
  Case c{"Sq != Sk, q head-tail", 2, 7, 12};
  c.q_head_tail = true;
  run_both(c);
}

TEST(RingAttention, QueryAndKeysInDifferentLayoutsNeedAMask) {
  Case c{"q head-tail, k/v natural", 4, 12, 12};
  c.causal = c.q_head_tail = true;
  run_both(c);
  Case d{"q natural, k/v head-tail", 3, 7, 7};
  d.causal = d.kv_head_tail = true;
  run_both(d);
}

TEST(RingAttention, GroupedQueryAttention) {
  Case c{"GQA", 3, 9, 9};
  c.causal = c.q_head_tail = c.kv_head_tail = true;
  c.hq = 4;
  run_both(c);
}

TEST(RingAttention, ValueHeadDimDiffers) {
  Case c{"Ev < E", 2, 9, 9};
  c.causal = true;
  c.e = 8;
  c.ev = 5;
  run_both(c);
  Case d{"Ev > E, GQA", 3, 10, 10};
  d.causal = d.q_head_tail = d.kv_head_tail = true;
  d.e = 4;
  d.ev = 8;
  d.hq = 4;
  run_both(d);
}

TEST(RingAttention, Float32AndBFloat16) {
  Case c{"float32", 4, 10, 10};
  c.causal = c.q_head_tail = c.kv_head_tail = true;
  c.dtype = at::kFloat;
  run_both(c);
  Case d{"bfloat16", 2, 16, 16};
  d.causal = d.q_head_tail = d.kv_head_tail = true;
  d.dtype = at::kBFloat16;
  run_both(d);
}

TEST(RingAttention, LargeMessagesRunPerHeadGroup) {
  // k/v pieces of 4096 rows, 8 columns, fp32: one head's forward message (k and v) is 256 KiB,
  // so two heads go per ring; the backward's (k/v and dk/dv) 512 KiB, one head per ring.
  Case c{"head groups", 3, 48, 3 * 4096};
  c.batch = 1;
  c.hq = 8;
  c.hk = 4;
  c.dtype = at::kFloat;
  const SeqLayout kv = SeqLayout::natural(c.sk, c.world);
  ASSERT_EQ(head_groups(c, kv, 2 * 4), 2);
  ASSERT_EQ(head_groups(c, kv, 4 * 4), 4);
  run_both(c);
}

TEST(RingAttention, LayoutsFollowTorchChunk) {
  for (int64_t world = 1; world <= 4; ++world) {
    for (int64_t seq = 0; seq <= 11; ++seq) {
      for (const bool head_tail : {false, true}) {
        const int64_t n = head_tail ? 2 * world : world;
        std::vector<at::Tensor> chunks = at::arange(seq, at::kLong).chunk(n);
        while (static_cast<int64_t>(chunks.size()) < n) chunks.push_back(at::empty({0}, at::kLong));
        const SeqLayout l = layout(seq, world, head_tail);
        ASSERT_EQ(l.world(), world);
        for (int64_t r = 0; r < world; ++r) {
          const at::Tensor want =
              head_tail ? at::cat({chunks[r], chunks[2 * world - 1 - r]}) : chunks[r];
          const at::Tensor got = local(at::arange(seq, at::kLong).view({1, 1, seq}), l, r).view(-1);
          EXPECT_TRUE(at::equal(got, want)) << seq << " on " << world << " rank " << r;
          EXPECT_EQ(l.length(r), want.numel());
        }
      }
    }
  }
}

TEST(RingAttention, RotateMethodIsProcessWideAndAllGatherByDefault) {
  EXPECT_EQ(rotate_method(), RotateMethod::kAllGather);
  set_rotate_method(RotateMethod::kAllToAll);
  EXPECT_EQ(rotate_method(), RotateMethod::kAllToAll);
  set_rotate_method(RotateMethod::kAllGather);
  EXPECT_EQ(rotate_method(), RotateMethod::kAllGather);
}

TEST(RingAttention, WrongLocalLengthNamesTheRing) {
  const RingPlan plan{"g",   1,   SeqLayout::natural(8, 2), SeqLayout::natural(8, 2),
                      false, 1.0, RotateMethod::kAllGather};
  const at::Tensor q = at::zeros({1, 1, 3, 4}), kv = at::zeros({1, 1, 4, 4});
  try {
    ring_attention_forward(q, kv, kv, plan);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("ring attention on group 'g' (rank 1)"), std::string::npos) << what;
    EXPECT_NE(what.find("local lengths q 3"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace dtensor::attention
