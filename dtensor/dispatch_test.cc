// Distributed tensors as at::Tensors (api.h): ATen calls on them against the single-device
// result, in-place / out= / views, mixing with plain tensors, strict mode, explain, the comm
// counter, random ops and autograd. Ranks are threads.

#include "dtensor/api.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>

#include "base/testing/expect_error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/engine_activity.h"

namespace dtensor {
namespace {

using collectives::run_threads;
using testing::expect_error;
namespace api = dtensor::api;

at::Tensor global_for(const std::vector<int64_t>& shape, int64_t salt = 0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return at::sin(at::arange(numel, at::kDouble) * 1.37 + salt * 0.71).reshape(shape);
}

void expect_same(const at::Tensor& dt, const at::Tensor& want) {
  ASSERT_TRUE(api::is_dtensor(dt));
  const at::Tensor got = api::full_tensor(dt);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(got, want, 1e-9, 1e-9)) << got << "\nvs\n" << want;
}

TEST(Dispatch, BasicOps) {
  const at::Tensor a = global_for({8, 4}), b = global_for({4, 6}, 1), c = global_for({8, 4}, 2);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    const at::Tensor db = api::distribute_tensor(b, mesh, {Replicate()});
    const at::Tensor dc = api::distribute_tensor(c, mesh, {Shard(1)});
    EXPECT_EQ(da.sizes(), a.sizes());
    EXPECT_EQ(da.scalar_type(), a.scalar_type());
    expect_same(at::add(da, dc), a + c);
    expect_same(da + dc * 2, a + c * 2);
    expect_same(at::mm(da, db), at::mm(a, b));
    expect_same(da.sum(), a.sum());
    expect_same(da.sum(1), a.sum(1));
    expect_same(da.view({4, 8}), a.view({4, 8}));
    expect_same(at::relu(da), at::relu(a));
    expect_same(da.t(), a.t());
    expect_same(at::matmul(da, db), at::matmul(a, b));
    // An async redistribute's piece is waited for by the next op that reads it.
    const at::Tensor pending = api::redistribute(da, {Replicate()}, /*async_op=*/true);
    expect_same(pending * 2, a * 2);
    expect_same(api::redistribute(dc, {Shard(0)}, true), c);
  });
}

TEST(Dispatch, InPlaceOutAndViews) {
  const at::Tensor a = global_for({8, 4}), b = global_for({8, 4}, 1);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    const at::Tensor db = api::distribute_tensor(b, mesh, {Shard(1)});
    // In-place: self keeps its layout; the other operand is moved to it.
    const at::Tensor same = da.add_(db);
    EXPECT_TRUE(same.is_same(da));
    EXPECT_EQ(api::spec(da).placements(), Placements{Shard(0)});
    expect_same(da, a + b);
    // A view aliases: writing through it changes the base.
    at::Tensor v = da.view({2, 4, 4});
    v.mul_(2);
    expect_same(da, (a + b) * 2);
    at::Tensor row = da.select(1, 0);
    EXPECT_EQ(api::spec(row).placements(), Placements{Shard(0)});
    // out=: the out tensor keeps its layout (NOTE [out= keeps its layout]); the result of
    // another layout is moved into it.
    at::Tensor out = api::zeros({8, 4}, mesh, {Replicate()}, at::kDouble);
    at::Tensor& r = at::add_out(out, da, db);
    EXPECT_TRUE(r.is_same(out));
    expect_same(out, (a + b) * 2 + b);
    EXPECT_EQ(api::spec(out).shape(), (std::vector<int64_t>{8, 4}));
    EXPECT_EQ(api::spec(out).placements(), Placements{Replicate()});
    EXPECT_EQ(api::local(out).sizes(), at::IntArrayRef({8, 4}));
    // out= overloads of the elementwise table (acos.out, fmod.Tensor_out, round.decimals_out).
    const at::Tensor unit = api::distribute_tensor(at::sin(a), mesh, {Shard(0)});
    at::Tensor o1 = api::zeros({8, 4}, mesh, {Shard(0)}, at::kDouble);
    at::acos_out(o1, unit);
    expect_same(o1, at::acos(at::sin(a)));
    at::Tensor o2 = api::zeros({8, 4}, mesh, {Replicate()}, at::kDouble);
    at::fmod_out(o2, da, db);
    expect_same(o2, at::fmod(api::full_tensor(da), b));
    at::Tensor o3 = api::zeros({8, 4}, mesh, {Shard(1)}, at::kDouble);
    at::round_out(o3, db, 1);
    expect_same(o3, at::round(b, 1));
    EXPECT_EQ(api::spec(o3).placements(), Placements{Shard(1)});
    EXPECT_EQ(api::spec(o2).placements(), Placements{Replicate()});
    // An in-place op no rule lets keep a Partial self (exp of a Partial value is not the sum of
    // the shares' exps) runs out of place on the reduced value and is copied back by partition
    // (NOTE [in-place by copy]): one device's values, self still Partial.
    at::Tensor dp = api::from_local(at::ones({8, 4}, at::kDouble), mesh, {Partial()});
    at::Tensor de = api::from_local(at::ones({8, 4}, at::kDouble), mesh, {Partial()});
    de.exp_();
    EXPECT_EQ(api::spec(de).placements(), Placements{Partial()});
    expect_same(de, at::exp(at::full({8, 4}, 2.0, at::kDouble)));
    // Moving the other operand instead is fine: R *= P all-reduces the P.
    at::Tensor dr = api::distribute_tensor(a, mesh, {Replicate()});
    dr.mul_(dp);
    EXPECT_EQ(api::spec(dr).placements(), Placements{Replicate()});
    expect_same(dr, a * 2);
  });
}

TEST(Dispatch, MixingWithPlainTensors) {
  const at::Tensor a = global_for({8, 4}), p = global_for({4}, 3);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    expect_same(da * 3, a * 3);                                      // Python scalar
    expect_same(da + at::scalar_tensor(2.5, at::kDouble), a + 2.5);  // 0-dim tensor
    expect_error([&] { (void)(da + p); }, "plain tensor");
    expect_error([&] { (void)at::mm(da, p.view({4, 1})); }, "ReplicatePlainTensorsGuard");
    {
      api::ReplicatePlainTensorsGuard replicate;
      expect_same(da + p, a + p);
      expect_same(at::mm(da, p.view({4, 1})), at::mm(a, p.view({4, 1})));
    }
    expect_error([&] { (void)(da + p); }, "plain tensor");  // the scope ended
    {
      // A plain tensor before a distributed one keeps its argument position.
      api::ReplicatePlainTensorsGuard replicate;
      expect_same(at::sub(p.view({1, 4}).expand({8, 4}).contiguous(), da),
                  p.view({1, 4}).expand({8, 4}) - a);
      expect_same(at::where(a.gt(0), p, da), at::where(a.gt(0), p, a));
    }
  });
}

// NOTE [replicate fallback]: ops with no rule run gathered, equal one device, keep written
// arguments' layouts, and count; strict mode makes them errors.
TEST(Dispatch, ReplicateFallbackMatchesOneDevice) {
  const at::Tensor a = global_for({9, 4});
  reset_fallback_counts();
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    const at::Tensor c = at::trace(da);  // no rule: gathered, computed whole
    expect_same(c, at::trace(a));
    EXPECT_TRUE(api::spec(c).placements()[0].is_replicate());
    expect_same(at::nonzero(da.gt(0)), at::nonzero(a.gt(0)));  // data-dependent shape
    // In place on a sharded tensor: each rank takes its box of the result; the layout stays.
    const at::Tensor db = api::distribute_tensor(a, mesh, {Shard(1)});
    db.clamp_min_(0.25);
    EXPECT_EQ(api::spec(db).placements()[0], Shard(1));
    expect_same(db, at::clamp_min(a, 0.25));
    {
      StrictModeGuard strict;
      expect_error([&] { (void)at::trace(da); }, "no sharding rule");
    }
    // A view of a moved input views the moved copy (diagonal keeps dims 0 and 1 whole, so the
    // Shard(1) input is gathered): reading is right, writing into it raises.
    const at::Tensor sq = api::distribute_tensor(global_for({4, 4}), mesh, {Shard(1)});
    const at::Tensor diag = at::diagonal(sq);
    expect_same(diag, at::diagonal(global_for({4, 4})));
    expect_error([&] { diag.fill_(1.0); }, "view of a gathered copy");
    // The same for a view a rule computed on a moved input (a slice across a sharded dim).
    const at::Tensor rows = api::distribute_tensor(global_for({8, 4}), mesh, {Shard(0)});
    const at::Tensor cut = rows.narrow(0, 1, 5);
    if (!api::spec(cut).placements()[0].is_shard()) {
      expect_error([&] { cut.fill_(1.0); }, "view of a gathered copy");
    }
  });
  const auto counts = fallback_counts();
  EXPECT_EQ(counts.at("aten::trace"), 2);  // one call on each of the two ranks
  EXPECT_EQ(counts.at("aten::clamp_min_"), 2);
}

TEST(Dispatch, ForeachOpsRunPerElementAndTakePlainElements) {
  // The _foreach_*_ ops (an optimizer with foreach=True) write a list of tensors. Sharded
  // elements take the writes, no element is gathered, and a plain element beside distributed
  // ones (a parameter a TP plan leaves alone, with SGD's default foreach on CUDA) does not raise
  // "mixed with distributed tensors". NOTE [foreach ops per element]: each index runs on its own
  // layout.
  const at::Tensor a = global_for({8, 4}), b = global_for({8, 4}, 1), c = global_for({5}, 2);
  const at::Tensor p = global_for({3}, 3), q = global_for({3}, 4);
  reset_fallback_counts();
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({4});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    const at::Tensor db = api::distribute_tensor(b, mesh, {Shard(1)});
    const at::Tensor dc = api::distribute_tensor(c, mesh, {Replicate()});
    std::vector<at::Tensor> list = {da.clone(), dc.clone(), p.clone()};
    at::_foreach_mul_(list, 0.5);
    expect_same(list[0], a * 0.5);
    expect_same(list[1], c * 0.5);
    EXPECT_FALSE(api::is_dtensor(list[2]));
    EXPECT_TRUE(at::allclose(list[2], p * 0.5));
    EXPECT_EQ(api::spec(list[0]).placements()[0], Shard(0));
    at::_foreach_add_(list, std::vector<at::Tensor>{db, dc, q}, 2.0);
    expect_same(list[0], a * 0.5 + b * 2.0);
    expect_same(list[1], c * 2.5);
    EXPECT_TRUE(at::allclose(list[2], p * 0.5 + q * 2.0));
    at::_foreach_addcdiv_(list, std::vector<at::Tensor>{da, dc, p},
                          std::vector<at::Tensor>{db.abs() + 1, dc.abs() + 1, q.abs() + 1}, 0.1);
    expect_same(list[0], a * 0.5 + b * 2.0 + 0.1 * a / (b.abs() + 1));
    EXPECT_EQ(api::spec(list[0]).placements()[0], Shard(0));
    const std::vector<at::Tensor> norms = at::_foreach_norm(list, 2);
    expect_same(norms[0], (a * 0.5 + b * 2.0 + 0.1 * a / (b.abs() + 1)).norm());
    EXPECT_FALSE(api::is_dtensor(norms[2]));
  });
  for (const auto& [op, calls] : fallback_counts()) {
    EXPECT_EQ(op.rfind("aten::_foreach_", 0), std::string::npos) << op << " ran by the fallback";
  }
}

TEST(Dispatch, InPlaceOpsThatCannotKeepSelfRunOutOfPlaceAndCopyBack) {
  // NOTE [in-place by copy]: none of these raises "no sharding keeps self's placements".
  const at::Tensor a = global_for({8, 6}), b = global_for({8, 6}, 1);
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({4});
    const at::Tensor scan = api::distribute_tensor(a, mesh, {Shard(0)});
    scan.cumsum_(0);  // a scan along the sharded dim
    expect_same(scan, at::cumsum(a, 0));
    EXPECT_EQ(api::spec(scan).placements()[0], Shard(0));
    const at::Tensor tri = api::distribute_tensor(a, mesh, {Shard(1)});
    const at::Tensor view = tri.narrow(0, 0, 8);  // shares tri's pieces
    tri.tril_(1);
    expect_same(tri, at::tril(a, 1));
    expect_same(view, at::tril(a, 1));  // the write reached self's own pieces
    EXPECT_EQ(api::spec(tri).placements()[0], Shard(1));
    // A Partial self takes the copy by partition: one device's values, self still Partial.
    const at::Tensor partial = api::from_local(b / 4, mesh, {Partial()});
    partial.exp_();
    EXPECT_EQ(api::spec(partial).placements()[0], Partial());
    expect_same(partial, at::exp(b));  // four shares of b / 4
  });
}

TEST(Dispatch, PlainScalarTensorsAreReplicatedInputs) {
  // 0-dim and one-element plain tensors are read as replicated scalars (as in PyTorch), in any
  // argument position (where's condition, addcmul's tensors).
  const at::Tensor a = global_for({6, 4}), b = global_for({6, 4}, 2);
  const at::Tensor s = at::scalar_tensor(0.5, at::kDouble), one = at::full({1}, 2.0, at::kDouble);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    expect_same(at::where(da.gt(0), s, da), at::where(a.gt(0), s, a));
    expect_same(at::addcmul(da, s, one), at::addcmul(a, s, one));
    expect_same(da * one, a * one);
    expect_same(at::where(da.gt(0), da, at::scalar_tensor(1.0, at::kFloat)),
                at::where(a.gt(0), a, at::scalar_tensor(1.0, at::kFloat)));
    // A wrapped Python number promotes like a scalar (Float), a plain 0-dim Double tensor like
    // a tensor (Double): same specs, so the cached output dtype must tell them apart
    // (else special.ndtr's backward would hit the Float entry with a Double result).
    const at::Tensor x =
        api::distribute_tensor(at::scalar_tensor(0.5, at::kFloat), mesh, {Replicate()});
    at::Tensor wrapped = at::scalar_tensor(2.0, at::kDouble);
    wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
    EXPECT_EQ(at::mul(x, wrapped).scalar_type(), at::kFloat);
    EXPECT_EQ(at::mul(x, at::scalar_tensor(2.0, at::kDouble)).scalar_type(), at::kDouble);
    // The same with a dimensioned tensor (t / 0.5 on torch 2.x: its TensorIterator refuses a
    // wrapped number on the meta device, and the result must not keep the Double of the rule's
    // promotion).
    const at::Tensor af = a.to(at::kFloat);
    const at::Tensor df = api::distribute_tensor(af, mesh, {Shard(0)});
    EXPECT_EQ(at::div(df, wrapped).scalar_type(), at::kFloat);
    expect_same(at::div(df, wrapped), at::div(af, wrapped));
  });
}

// NOTE [size-1 mesh dims]: a redistribute that changes only a size-1 mesh dim moves no data and
// issues no collective (no all_to_all on mesh (4,1)).
TEST(Dispatch, SizeOneMeshDimIssuesNoCollective) {
  const at::Tensor a = global_for({8, 6});
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({4, 1});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0), Shard(1)});
    collectives::CommCounter counter;
    const at::Tensor b = api::redistribute(da, {Shard(0), Shard(0)});
    const at::Tensor c = api::redistribute(b, {Shard(0), Replicate()});
    EXPECT_EQ(counter.total(), 0) << counter.to_string();
    expect_same(b, a);
    expect_same(c, a);
  });
}

// api::get_group: a mesh dim's group as a c10d ProcessGroup, from C++ (NOTE [mesh groups as torch
// process groups]): its all_reduce sums over this rank's row of a 2x2 mesh.
TEST(Dispatch, MeshDimGroupIsATorchProcessGroup) {
  run_threads(4, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    const auto pg = api::get_group(mesh, 1);
    EXPECT_EQ(pg->getSize(), 2);
    EXPECT_EQ(pg->getRank(), rank % 2);
    std::vector<at::Tensor> t = {at::full({3}, static_cast<double>(rank))};
    pg->allreduce(t)->wait();
    const double first = static_cast<double>(rank - rank % 2);
    EXPECT_TRUE(at::equal(t[0], at::full({3}, first + first + 1))) << t[0];
    expect_error([&] { api::get_group(mesh, 2); }, "mesh dim 2 of a 2-D mesh");
  });
}

TEST(Dispatch, Errors) {
  const at::Tensor a = global_for({8, 4});
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    const DeviceMesh other = DeviceMesh::arange({4});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0), Replicate()});
    const at::Tensor db = api::distribute_tensor(a, other, {Shard(1)});
    expect_error([&] { (void)(da + db); }, "mesh");  // mismatched meshes
    {
      StrictModeGuard strict;  // no replicate fallback: an op with no rule is an error
      expect_error([&] { (void)at::trace(da); }, "aten::trace");  // no rule...
      expect_error([&] { (void)at::trace(da); }, "S(0)");         // ...and its placements
    }
    expect_error([&] { (void)da.sum(5); }, "dim");                     // invalid dim
    expect_error([&] { (void)api::init_device_mesh({3}); }, "world");  // mesh vs world
    expect_error([&] { (void)api::distribute_tensor(a, mesh, {Shard(2), Replicate()}); }, "dim");
    expect_error([&] { (void)api::spec(a); }, "plain tensor");
    // out= must match the inputs: distributed, on their mesh.
    at::Tensor plain_out = at::empty({8, 4}, at::kDouble);
    expect_error([&] { at::add_out(plain_out, da, da); }, "out= argument 'out' is a plain tensor");
    at::Tensor other_out = api::empty({8, 4}, other, {Replicate()}, at::kDouble);
    expect_error([&] { at::add_out(other_out, da, da); }, "out= argument 'out' lives on");
    at::Tensor dist_out = api::empty({8, 4}, mesh, {Replicate(), Replicate()}, at::kDouble);
    expect_error([&] { at::add_out(dist_out, a, a); }, "argument 'self' is a plain tensor");
  });
}

TEST(Dispatch, StrictModeExplainAndCommCounts) {
  const at::Tensor a = global_for({8, 4}), b = global_for({4, 6}, 1);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(1)});
    const at::Tensor db = api::distribute_tensor(b, mesh, {Shard(1)});
    {
      api::StrictModeGuard strict;
      expect_error([&] { (void)at::mm(da, db); }, "redistribute");
    }
    const std::string text = api::explain("aten::mm", {da, db});
    EXPECT_NE(text.find("aten::mm"), std::string::npos) << text;
    EXPECT_NE(text.find("S(1)"), std::string::npos) << text;
    api::CommDebugMode comms;
    const at::Tensor out = at::mm(da, db);
    EXPECT_GE(comms.total(), 1);
    for (const auto& [key, n] : comms.counts_by_cause()) EXPECT_EQ(key.first, "aten::mm");
    expect_same(out, at::mm(a, b));
    // explain ran nothing.
    EXPECT_EQ(api::explain("aten::sum.dim_IntList", {da, std::vector<int64_t>{1}}).find("error"),
              std::string::npos);
  });
}

TEST(Dispatch, FactoriesAndItem) {
  run_threads(4, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2, 2});
    const Placements pl = {Shard(0), Shard(1)};
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    expect_same(api::zeros({5, 3}, mesh, pl, opts), at::zeros({5, 3}, opts));
    expect_same(api::ones({5, 3}, mesh, pl, opts), at::ones({5, 3}, opts));
    expect_same(api::full({5, 3}, 2.5, mesh, pl, opts), at::full({5, 3}, 2.5, opts));
    EXPECT_EQ(api::empty({5, 3}, mesh, pl, opts).sizes(), at::IntArrayRef({5, 3}));
    const at::Tensor o = api::ones({5, 3}, mesh, pl, opts);
    EXPECT_DOUBLE_EQ(o.sum().item<double>(), 15.0);
  });
}

// NOTE [DTensor random]: every layout draws exactly what one device draws after the same seed.
TEST(Dispatch, RandomOpsMatchOneDevice) {
  const std::vector<int64_t> shape = {6, 10};
  const uint64_t seed = 1234;
  at::Tensor want_rand, want_randn, want_drop, want_uniform, want_normal, want_native, want_mask;
  {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    want_rand = at::rand(shape, g, at::kDouble);
    want_randn = at::randn(shape, g, at::kDouble);
    want_uniform = at::empty(shape, at::kDouble).uniform_(-1, 1, g);
    want_normal = at::empty(shape, at::kDouble).normal_(0, 2, g);
  }
  {
    at::manual_seed(seed);  // dropout draws from the default generator
    want_drop = at::dropout(want_rand, 0.4, true);
    std::tie(want_native, want_mask) = at::native_dropout(want_rand, 0.3, true);
  }
  for (const std::vector<int64_t>& mesh_shape : {std::vector<int64_t>{2}, {2, 2}}) {
    std::vector<Placements> layouts;
    if (mesh_shape.size() == 1) {
      layouts = {{Shard(0)}, {Shard(1)}, {Replicate()}};
    } else {
      layouts = {{Shard(0), Shard(1)},
                 {Shard(1), Shard(0)},
                 {Replicate(), Shard(1)},
                 {Shard(1), Shard(1)}};
    }
    for (const Placements& pl : layouts) {
      run_threads(mesh_shape.size() == 1 ? 2 : 4, [&](int64_t) {
        const DeviceMesh mesh = api::init_device_mesh(mesh_shape);
        api::manual_seed(seed);
        const auto opts = at::TensorOptions().dtype(at::kDouble);
        const at::Tensor r = api::rand(shape, mesh, pl, opts);
        expect_same(r, want_rand);
        expect_same(api::randn(shape, mesh, pl, opts), want_randn);
        expect_same(api::empty(shape, mesh, pl, opts).uniform_(-1, 1), want_uniform);
        expect_same(api::empty(shape, mesh, pl, opts).normal_(0, 2), want_normal);
        api::manual_seed(seed);
        expect_same(at::dropout(r, 0.4, true), want_drop);
        auto [out, mask] = at::native_dropout(r, 0.3, true);
        expect_same(out, want_native);
        expect_same(mask, want_mask);
      });
    }
  }
}

TEST(Dispatch, AutogradThroughMovements) {
  const at::Tensor a = global_for({8, 4}), b = global_for({4, 6}, 1);
  at::Tensor ga, gb;
  {
    const at::Tensor ra = a.clone().requires_grad_(true), rb = b.clone().requires_grad_(true);
    at::mm(ra, rb).tanh().sum().backward();
    ga = ra.grad();
    gb = rb.grad();
  }
  run_threads(2, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    // from_local: the gradient reaches the local piece.
    const at::Tensor la = a.chunk(2, 0)[rank].clone().requires_grad_(true);
    const at::Tensor da = api::from_local(la, mesh, {Shard(0)});
    const at::Tensor db = api::distribute_tensor(b.clone().requires_grad_(true), mesh, {Shard(1)});
    const at::Tensor moved = api::redistribute(db, {Replicate()});
    api::to_local(at::mm(da, moved).tanh().sum()).backward();
    EXPECT_TRUE(at::allclose(la.grad(), ga.chunk(2, 0)[rank]));
    EXPECT_EQ(api::spec(db.grad()).placements(), Placements{Shard(1)});
    expect_same(db.grad(), gb);
  });
}

// NOTE [views in inference mode]: under c10::InferenceMode, views of normal distributed tensors
// (a weight's t() inside linear) stay normal, other results are inference tensors, in-place
// writes into a normal tensor work, and the values equal one device's. The first view does not
// raise "Cannot set version_counter for inference tensor".
TEST(Dispatch, InferenceMode) {
  const at::Tensor x = global_for({4, 8}), w = global_for({6, 8}, 1), c = global_for({4, 6}, 2);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor dx = api::distribute_tensor(x, mesh, {Replicate()});
    const at::Tensor dw = api::distribute_tensor(w, mesh, {Shard(0)});
    at::Tensor cache = api::distribute_tensor(c.clone(), mesh, {Shard(1)});
    c10::InferenceMode guard;
    const at::Tensor wt = dw.t();
    EXPECT_FALSE(wt.is_inference());
    const at::Tensor y = at::linear(dx, dw);
    EXPECT_TRUE(y.is_inference());
    expect_same(y, at::linear(x, w));
    expect_same(dw.view({3, 16}).narrow(0, 1, 2), w.view({3, 16}).narrow(0, 1, 2));
    cache.narrow(0, 0, 2).copy_(y.narrow(0, 0, 2));
    at::Tensor want = c.clone();
    want.narrow(0, 0, 2).copy_(at::linear(x, w).narrow(0, 0, 2));
    expect_same(cache, want);
  });
}

// local_map (PyTorch's): fn sees this rank's pieces and its result is wrapped with the given
// placements; mismatched inputs raise unless moved; gradients flow through to the inputs.
TEST(Dispatch, LocalMap) {
  const at::Tensor a = global_for({8, 6}), g = global_for({6}, 1);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a.clone().requires_grad_(true), mesh, {Shard(0)});
    const at::Tensor dg = api::distribute_tensor(g, mesh, {Replicate()});
    using Pieces = std::vector<at::Tensor>;
    auto scale = [](const Pieces& p) { return Pieces{p[0] * p[1] + 1}; };
    const at::Tensor out = api::local_map(scale, {da, dg}, {{Shard(0)}},
                                          std::vector<Placements>{{Shard(0)}, {Replicate()}})
                               .at(0);
    expect_same(out, a * g + 1);
    EXPECT_EQ(api::spec(out).placements(), (Placements{Shard(0)}));
    out.sum().backward();
    expect_same(da.grad(), g.expand({8, 6}));
    // A Shard(1) input where Shard(0) is wanted: an error naming the input, or moved when asked.
    const at::Tensor d1 = api::distribute_tensor(a, mesh, {Shard(1)});
    expect_error(
        [&] {
          api::local_map(scale, {d1, dg}, {{Shard(0)}},
                         std::vector<Placements>{{Shard(0)}, {Replicate()}});
        },
        "input 0");
    expect_same(api::local_map(scale, {d1, dg}, {{Shard(0)}},
                               std::vector<Placements>{{Shard(0)}, {Replicate()}}, true)
                    .at(0),
                a * g + 1);
    expect_error([&] { api::local_map(scale, {a, g}, {{Shard(0)}}); }, "no input is a distributed");
  });
}

// NOTE [engine activity]: the engine enters and leaves its scopes around each distributed op,
// and a LocalKernelClock times only the local computation of such ops, never a plain op.
TEST(Dispatch, EngineActivityTimesLocalKernelsOnly) {
  const at::Tensor a = global_for({256, 256}), b = global_for({256, 256}, 1);
  run_threads(2, [&](int64_t) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const at::Tensor da = api::distribute_tensor(a, mesh, {Shard(0)});
    const at::Tensor db = api::distribute_tensor(b, mesh, {Replicate()});
    const LocalKernelClock clock;
    const uint64_t entries = engine_activity().entries;
    (void)at::mm(a, b);  // plain: neither an engine entry nor a local kernel
    EXPECT_EQ(engine_activity().entries, entries);
    EXPECT_EQ(clock.seconds(), 0);
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor dc = at::mm(da, db);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GT(engine_activity().entries, entries);
    EXPECT_GT(clock.seconds(), 0);
    EXPECT_LE(clock.seconds(), wall);
    EXPECT_EQ(engine_activity().depth, 0);
    EXPECT_EQ(engine_activity().local, 0);
    expect_same(dc, at::mm(a, b));
  });
}

}  // namespace
}  // namespace dtensor
