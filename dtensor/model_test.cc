// Tensor-parallel models on distributed tensors against one device: a 2-layer MLP and a
// one-block transformer (RMS norm + causal attention + MLP, residuals) forward and backward on
// meshes (2) and (2,2), with column-sharded first and row-sharded second projections (as
// ColwiseParallel / RowwiseParallel lay them out) and, on (2,2), a batch-sharded input. The same
// function computes both runs: plain tensors on one device, distributed tensors on every rank.
// The output, the loss and every parameter gradient (values and placements) must match.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>

#include "collectives/rank_context.h"
#include "dtensor/api.h"

namespace dtensor {
namespace {

using collectives::run_threads;
namespace api = dtensor::api;
using Params = std::map<std::string, at::Tensor>;

at::Tensor values(const std::vector<int64_t>& shape, int64_t salt) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::sin(at::arange(numel, at::kDouble) * 1.37 + salt * 0.71) * 0.5).reshape(shape);
}

at::Tensor mlp(const at::Tensor& x, const Params& p) {
  const at::Tensor h = at::relu(at::linear(x, p.at("w1"), p.at("b1")));
  return at::linear(h, p.at("w2"), p.at("b2"));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& g) {
  return x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6) * g;
}

constexpr int64_t kHeads = 4;

// x: [B, S, D]. Heads are split from the (column-sharded) q/k/v projections' outputs, so each
// tensor-parallel rank holds whole heads. Heads go first ([H, B, S, hd]): matmul folds its batch
// dims into one, and a fold whose leading dim is the sharded one stays sharded, while folding
// (B, H) with H sharded cannot be a Shard placement and would gather.
at::Tensor transformer_block(const at::Tensor& x, const Params& p, const at::Tensor& mask) {
  const int64_t B = x.size(0), S = x.size(1), D = x.size(2), hd = D / kHeads;
  const at::Tensor n1 = rms_norm(x, p.at("g1"));
  auto heads = [&](const at::Tensor& t) {
    return t.view({B, S, kHeads, hd}).permute({2, 0, 1, 3});
  };
  const at::Tensor q = heads(at::linear(n1, p.at("wq")));
  const at::Tensor k = heads(at::linear(n1, p.at("wk")));
  const at::Tensor v = heads(at::linear(n1, p.at("wv")));
  const at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
  const at::Tensor attn = at::softmax(scores.masked_fill(mask, -1e9), -1);
  const at::Tensor ctx = at::matmul(attn, v).permute({1, 2, 0, 3}).reshape({B, S, D});
  const at::Tensor h = x + at::linear(ctx, p.at("wo"));
  const at::Tensor n2 = rms_norm(h, p.at("g2"));
  return h + at::linear(at::silu(at::linear(n2, p.at("w1"))), p.at("w2"));
}

struct Layout {
  std::vector<int64_t> mesh;
  Placements input;                          // the activations'
  std::map<std::string, Placements> params;  // by name; absent: replicated
};

Placements tp(const Layout& l, Placement p) {
  Placements out(l.mesh.size(), Replicate());
  out.back() = p;  // the last mesh dim is the tensor-parallel one
  return out;
}

void check_model(const Layout& layout, const Params& global, const at::Tensor& x,
                 const std::function<at::Tensor(const at::Tensor&, const Params&)>& model) {
  Params ref_params;
  for (const auto& [name, t] : global) ref_params[name] = t.clone().requires_grad_(true);
  const at::Tensor ref_out = model(x, ref_params);
  const at::Tensor ref_loss = ref_out.pow(2).sum();
  ref_loss.backward();

  run_threads(
      layout.mesh.size() == 1 ? layout.mesh[0] : layout.mesh[0] * layout.mesh[1], [&](int64_t) {
        const DeviceMesh mesh = api::init_device_mesh(layout.mesh);
        Params params;
        for (const auto& [name, t] : global) {
          const auto it = layout.params.find(name);
          const Placements pl =
              it == layout.params.end() ? Placements(mesh.ndim(), Replicate()) : it->second;
          params[name] = api::distribute_tensor(t.clone().requires_grad_(true), mesh, pl);
        }
        const at::Tensor dx = api::distribute_tensor(x, mesh, layout.input);
        api::CommDebugMode comms;
        const at::Tensor out = model(dx, params);
        const at::Tensor loss = out.pow(2).sum();
        if (getenv("SHOW_COMMS")) std::cout << api::to_string(out) << "\n" << comms.to_string();
        EXPECT_TRUE(at::allclose(api::full_tensor(out), ref_out, 1e-9, 1e-9));
        EXPECT_NEAR(api::full_tensor(loss).item<double>(), ref_loss.item<double>(), 1e-9);
        loss.backward();
        for (const auto& [name, p] : params) {
          const at::Tensor g = p.grad();
          ASSERT_TRUE(api::is_dtensor(g)) << name;
          EXPECT_EQ(api::spec(g).placements(), api::spec(p).placements()) << name;
          EXPECT_TRUE(at::allclose(api::full_tensor(g), ref_params.at(name).grad(), 1e-9, 1e-9))
              << name;
        }
      });
}

Params mlp_params(int64_t D, int64_t H) {
  return {{"w1", values({H, D}, 1)},
          {"b1", values({H}, 2)},
          {"w2", values({D, H}, 3)},
          {"b2", values({D}, 4)}};
}

Layout mlp_layout(std::vector<int64_t> mesh, bool batch_sharded) {
  Layout l{mesh, {}, {}};
  l.input = Placements(mesh.size(), Replicate());
  if (batch_sharded) l.input[0] = Shard(0);
  l.params["w1"] = tp(l, Shard(0));  // colwise
  l.params["b1"] = tp(l, Shard(0));
  l.params["w2"] = tp(l, Shard(1));  // rowwise
  return l;
}

TEST(Models, MlpOnMesh2) {
  check_model(mlp_layout({2}, false), mlp_params(8, 16), values({6, 8}, 5), mlp);
}

TEST(Models, MlpOnMesh2x2) {
  check_model(mlp_layout({2, 2}, true), mlp_params(8, 16), values({6, 8}, 5), mlp);
}

Params block_params(int64_t D, int64_t H) {
  return {{"g1", values({D}, 1) + 1}, {"wq", values({D, D}, 2)}, {"wk", values({D, D}, 3)},
          {"wv", values({D, D}, 4)},  {"wo", values({D, D}, 5)}, {"g2", values({D}, 6) + 1},
          {"w1", values({H, D}, 7)},  {"w2", values({D, H}, 8)}};
}

Layout block_layout(std::vector<int64_t> mesh, bool batch_sharded) {
  Layout l{mesh, {}, {}};
  l.input = Placements(mesh.size(), Replicate());
  if (batch_sharded) l.input[0] = Shard(0);
  for (const char* col : {"wq", "wk", "wv", "w1"}) l.params[col] = tp(l, Shard(0));
  for (const char* row : {"wo", "w2"}) l.params[row] = tp(l, Shard(1));
  return l;
}

void check_block(std::vector<int64_t> mesh, bool batch_sharded) {
  const int64_t B = 2, S = 4, D = 8;
  const at::Tensor causal = at::ones({S, S}, at::kBool).triu(1);
  check_model(block_layout(mesh, batch_sharded), block_params(D, 16), values({B, S, D}, 9),
              [&](const at::Tensor& x, const Params& p) {
                at::Tensor mask = causal;
                if (api::is_dtensor(x)) {
                  mask =
                      api::distribute_tensor(causal, api::spec(x).mesh(),
                                             Placements(api::spec(x).mesh().ndim(), Replicate()));
                }
                return transformer_block(x, p, mask);
              });
}

TEST(Models, TransformerBlockOnMesh2) { check_block({2}, false); }
TEST(Models, TransformerBlockOnMesh2x2) { check_block({2, 2}, true); }

}  // namespace
}  // namespace dtensor
