// Propagation against the single-device result: for every op case, every placement of every
// input (R, P(sum), S(d) per mesh dim) on meshes (4) and (2,2), with even and uneven shapes, each
// rank propagates, redistributes its inputs as planned, runs the local ATen op, and the gathered
// output (full_tensor) must equal the op on the global tensors. Runs on the threads backend.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <atomic>
#include <functional>
#include <mutex>

#include "collectives/rank_context.h"
#include "dtensor/dtensor.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"
#include "dtensor/testing/numeric_inputs.h"
#include "layout/shard_layout.h"
#include "sharding_prop/propagator.h"

namespace dtensor::sharding {
namespace {

using Shapes = std::vector<std::vector<int64_t>>;
// What a rank's local op may need beyond its tensors (null for the single-device run).
struct Local {
  const OpSharding* sharding;
  std::vector<int64_t> coord;
};
using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& in,
                                                 const Shapes& out_shapes, const Local* local)>;

using testing::Data;
using testing::make_input;

struct OpCase {
  std::string op;
  std::vector<Shapes> shape_sets;  // even and uneven
  LayoutArgs args;
  Fn fn;
  std::vector<Data> data = {};  // per input (default kAny)
  double tol = 1e-9;
};

template <class F>
Fn one(F f) {
  return [f](const std::vector<at::Tensor>& in, const Shapes& out, const Local*) {
    return std::vector<at::Tensor>{f(in, out)};
  };
}

template <class F>
Fn many(F f) {
  return [f](const std::vector<at::Tensor>& in, const Shapes& out, const Local*) {
    return f(in, out);
  };
}

// The masked lookup of a row-sharded embedding, as the dispatcher runs it.
at::Tensor embedding_local(const at::Tensor& weight, const at::Tensor& idx, const Local* local) {
  if (local == nullptr) return at::embedding(weight, idx);
  return masked_embedding(weight, idx, local->sharding->input_targets[0], local->coord,
                          local_box(local->sharding->outputs[0], local->coord).shape);
}

std::vector<OpCase> cases() {
  using T = std::vector<at::Tensor>;
  std::vector<OpCase> c;
  // Pointwise, with broadcasting and Partial-keeping linear ops.
  c.push_back({"aten::add.Tensor",
               {{{8, 4}, {4}}, {{5, 3}, {5, 3}}},
               {},
               one([](const T& x, const Shapes&) { return at::add(x[0], x[1]); })});
  c.push_back({"aten::sub.Tensor",
               {{{8, 4}, {8, 1}}, {{5, 3}, {3}}},
               {},
               one([](const T& x, const Shapes&) { return at::sub(x[0], x[1]); })});
  c.push_back({"aten::mul.Tensor",
               {{{8, 4}, {8, 4}}, {{5, 3}, {1, 3}}},
               {},
               one([](const T& x, const Shapes&) { return at::mul(x[0], x[1]); })});
  c.push_back({"aten::div.Tensor",
               {{{8, 4}, {4}}, {{5, 3}, {5, 3}}},
               {},
               one([](const T& x, const Shapes&) { return at::div(x[0], x[1]); }),
               {Data::kAny, Data::kPositive}});
  c.push_back({"aten::neg", {{{8, 4}}, {{5, 3}}}, {}, one([](const T& x, const Shapes&) {
                 return at::neg(x[0]);
               })});
  c.push_back({"aten::exp", {{{8, 4}}, {{5, 3}}}, {}, one([](const T& x, const Shapes&) {
                 return at::exp(x[0]);
               })});
  c.push_back({"aten::log",
               {{{8, 4}}, {{5, 3}}},
               {},
               one([](const T& x, const Shapes&) { return at::log(x[0]); }),
               {Data::kPositive}});
  c.push_back({"aten::gelu", {{{8, 4}}, {{5, 3}}}, {}, one([](const T& x, const Shapes&) {
                 return at::gelu(x[0]);
               })});
  c.push_back({"aten::where.self",
               {{{8, 4}, {8, 4}, {4}}, {{5, 3}, {5, 3}, {5, 3}}},
               {},
               one([](const T& x, const Shapes&) { return at::where(x[0], x[1], x[2]); }),
               {Data::kMask, Data::kAny, Data::kAny}});
  c.push_back(
      {"aten::threshold_backward",
       {{{8, 4}, {8, 4}}, {{5, 3}, {5, 3}}},
       {},
       one([](const T& x, const Shapes&) { return at::threshold_backward(x[0], x[1], 0); })});
  c.push_back({"aten::gelu_backward",
               {{{8, 4}, {8, 4}}, {{5, 3}, {5, 3}}},
               {},
               one([](const T& x, const Shapes&) { return at::gelu_backward(x[0], x[1]); })});
  // Matmul family.
  c.push_back(
      {"aten::mm", {{{8, 4}, {4, 6}}, {{5, 3}, {3, 7}}}, {}, one([](const T& x, const Shapes&) {
         return at::mm(x[0], x[1]);
       })});
  c.push_back({"aten::bmm",
               {{{4, 2, 4}, {4, 4, 2}}, {{3, 5, 3}, {3, 3, 2}}},
               {},
               one([](const T& x, const Shapes&) { return at::bmm(x[0], x[1]); })});
  c.push_back(
      {"aten::matmul", {{{4, 2, 4}, {4, 6}}, {{3, 5}, {5}}}, {}, one([](const T& x, const Shapes&) {
         return at::matmul(x[0], x[1]);
       })});
  c.push_back({"aten::addmm",
               {{{6}, {8, 4}, {4, 6}}, {{1, 7}, {5, 3}, {3, 7}}},
               {},
               one([](const T& x, const Shapes&) { return at::addmm(x[0], x[1], x[2]); })});
  c.push_back({"aten::linear",
               {{{8, 4}, {6, 4}, {6}}, {{2, 5, 3}, {7, 3}, {7}}},
               {},
               one([](const T& x, const Shapes&) { return at::linear(x[0], x[1], x[2]); })});
  c.push_back({"aten::einsum",
               {{{4, 2, 4}, {4, 4, 2}}, {{3, 5, 3}, {3, 3, 2}}},
               {{}, "bij,bjk->bik"},
               one([](const T& x, const Shapes&) {
                 return at::einsum("bij,bjk->bik", {x[0], x[1]});
               })});
  // Reductions (keepdim, dims...).
  c.push_back(
      {"aten::sum.dim_IntList", {{{8, 4}}, {{5, 3}}}, {{0, 0}}, one([](const T& x, const Shapes&) {
         return at::sum(x[0], {0}, false);
       })});
  c.push_back(
      {"aten::sum.dim_IntList", {{{8, 4}}, {{5, 3}}}, {{1, -1}}, one([](const T& x, const Shapes&) {
         return at::sum(x[0], {-1}, true);
       })});
  c.push_back({"aten::sum", {{{8, 4}}, {{5, 3}}}, {}, one([](const T& x, const Shapes&) {
                 return at::sum(x[0]);
               })});
  c.push_back({"aten::mean.dim", {{{8, 4}}, {{5, 3}}}, {{0, 1}}, one([](const T& x, const Shapes&) {
                 return at::mean(x[0], {1});
               })});
  c.push_back({"aten::amax", {{{8, 4}}, {{5, 3}}}, {{0, 0}}, one([](const T& x, const Shapes&) {
                 return at::amax(x[0], {0});
               })});
  c.push_back({"aten::max.dim", {{{8, 4}}, {{5, 3}}}, {{0, 1}}, many([](const T& x, const Shapes&) {
                 auto [v, idx] = at::max(x[0], 1);
                 return T{v, idx};
               })});
  c.push_back({"aten::argmax", {{{8, 4}}, {{5, 3}}}, {{0, 0}}, one([](const T& x, const Shapes&) {
                 return at::argmax(x[0], 0);
               })});
  c.push_back(
      {"aten::var.correction", {{{8, 4}}, {{5, 3}}}, {{0, 1}}, one([](const T& x, const Shapes&) {
         return at::var(x[0], {1});
       })});
  // Softmax and its backward (dim).
  c.push_back({"aten::_softmax", {{{8, 4}}, {{5, 3}}}, {{-1}}, one([](const T& x, const Shapes&) {
                 return at::_softmax(x[0], -1, false);
               })});
  c.push_back(
      {"aten::_log_softmax", {{{8, 4}}, {{5, 3}}}, {{0}}, one([](const T& x, const Shapes&) {
         return at::_log_softmax(x[0], 0, false);
       })});
  c.push_back({"aten::_softmax_backward_data",
               {{{8, 4}, {8, 4}}, {{5, 3}, {5, 3}}},
               {{1}},
               one([](const T& x, const Shapes&) {
                 return at::_softmax_backward_data(x[0], x[1], 1, at::kDouble);
               })});
  // Views and shape ops: the local op is given this rank's output shape.
  c.push_back({"aten::view", {{{8, 4}}, {{6, 4}}}, {{-1}}, one([](const T& x, const Shapes& o) {
                 return x[0].reshape(o[0]);
               })});
  c.push_back(
      {"aten::view", {{{8, 6}}, {{5, 6}}}, {{-1, 2, 3}}, one([](const T& x, const Shapes& o) {
         return x[0].reshape(o[0]);
       })});
  // Regroupings through shared factors ([8,4] -> [4,8] keeps a Shard of dim 0) and one with
  // none ([6,4] -> [4,6]).
  c.push_back({"aten::view", {{{8, 4}}}, {{4, 8}}, one([](const T& x, const Shapes& o) {
                 return x[0].reshape(o[0]);
               })});
  c.push_back({"aten::view", {{{8, 4}}}, {{16, 2}}, one([](const T& x, const Shapes& o) {
                 return x[0].reshape(o[0]);
               })});
  c.push_back({"aten::view", {{{6, 4}}}, {{4, 6}}, one([](const T& x, const Shapes& o) {
                 return x[0].reshape(o[0]);
               })});
  c.push_back(
      {"aten::transpose.int", {{{8, 4}}, {{5, 3}}}, {{0, 1}}, one([](const T& x, const Shapes&) {
         return x[0].transpose(0, 1);
       })});
  c.push_back(
      {"aten::permute", {{{4, 2, 6}}, {{3, 5, 2}}}, {{2, 0, 1}}, one([](const T& x, const Shapes&) {
         return x[0].permute({2, 0, 1});
       })});
  c.push_back({"aten::unsqueeze", {{{8, 4}}, {{5, 3}}}, {{1}}, one([](const T& x, const Shapes&) {
                 return x[0].unsqueeze(1);
               })});
  c.push_back(
      {"aten::squeeze.dim", {{{8, 1, 4}}, {{5, 1, 3}}}, {{1}}, one([](const T& x, const Shapes&) {
         return x[0].squeeze(1);
       })});
  c.push_back({"aten::flatten.using_ints",
               {{{4, 2, 6}}, {{3, 5, 2}}},
               {{0, 1}},
               one([](const T& x, const Shapes& o) { return x[0].reshape(o[0]); })});
  c.push_back(
      {"aten::expand", {{{8, 1}}, {{5, 1}}}, {{-1, 4}}, one([](const T& x, const Shapes& o) {
         return x[0].expand(o[0]);
       })});
  c.push_back(
      {"aten::cat", {{{8, 4}, {4, 4}}, {{5, 3}, {2, 3}}}, {{0}}, one([](const T& x, const Shapes&) {
         return at::cat({x[0], x[1]}, 0);
       })});
  c.push_back({"aten::stack",
               {{{8, 4}, {8, 4}}, {{5, 3}, {5, 3}}},
               {{1}},
               one([](const T& x, const Shapes&) {
                 return at::stack({x[0], x[1]}, 1);
               })});
  // Slicing and indexing.
  c.push_back({"aten::slice.Tensor",
               {{{8, 4}}, {{5, 3}}},
               {{0, 1, 4, 2}},
               one([](const T& x, const Shapes&) { return x[0].slice(0, 1, 4, 2); })});
  c.push_back(
      {"aten::narrow", {{{8, 4}}, {{5, 3}}}, {{1, 1, 2}}, one([](const T& x, const Shapes&) {
         return x[0].narrow(1, 1, 2);
       })});
  c.push_back({"aten::select.int", {{{8, 4}}, {{5, 3}}}, {{1}}, one([](const T& x, const Shapes&) {
                 return x[0].select(1, 1);
               })});
  c.push_back(
      {"aten::split.Tensor", {{{8, 4}}, {{5, 3}}}, {{2, 1}}, many([](const T& x, const Shapes&) {
         return x[0].split(2, 1);
       })});
  c.push_back({"aten::chunk", {{{8, 4}}, {{5, 3}}}, {{2, 0}}, many([](const T& x, const Shapes&) {
                 return x[0].chunk(2, 0);
               })});
  c.push_back({"aten::index_select",
               {{{8, 4}, {5}}, {{5, 3}, {7}}},
               {{0}},
               one([](const T& x, const Shapes&) { return at::index_select(x[0], 0, x[1]); }),
               {Data::kAny, Data::kIndex}});
  c.push_back({"aten::gather",
               {{{8, 4}, {8, 4}}, {{5, 3}, {5, 3}}},
               {{1}},
               one([](const T& x, const Shapes&) { return at::gather(x[0], 1, x[1]); }),
               {Data::kAny, Data::kIndex}});
  // Embedding: a row-sharded weight is a masked lookup summed over the shards.
  c.push_back(
      {"aten::embedding",
       {{{8, 4}, {3, 5}}, {{7, 3}, {6}}},
       {},
       [](const T& x, const Shapes&, const Local* l) { return T{embedding_local(x[0], x[1], l)}; },
       {Data::kAny, Data::kIndex}});
  c.push_back({"aten::embedding_dense_backward",
               {{{6, 4}, {6}}, {{5, 3}, {5}}},
               {{8}},
               one([](const T& x, const Shapes&) {
                 return at::embedding_dense_backward(x[0], x[1], 8, -1, false);
               }),
               {Data::kAny, Data::kIndex}});
  // Norms, losses, attention, dropout.
  c.push_back({"aten::native_layer_norm",
               {{{8, 4}, {4}, {4}}, {{5, 3}, {3}, {3}}},
               {{1}},
               many([](const T& x, const Shapes&) {
                 auto [o, mean, rstd] =
                     at::native_layer_norm(x[0], {x[0].size(-1)}, x[1], x[2], 1e-5);
                 return T{o, mean, rstd};
               }),
               {},
               1e-7});
  c.push_back(
      {"aten::native_layer_norm_backward",
       {{{8, 4}, {8, 4}, {8, 1}, {8, 1}, {4}, {4}}, {{5, 3}, {5, 3}, {5, 1}, {5, 1}, {3}, {3}}},
       {{1}},
       many([](const T& x, const Shapes&) {
         auto [gi, gw, gb] = at::native_layer_norm_backward(x[0], x[1], {x[1].size(-1)}, x[2], x[3],
                                                            x[4], x[5], {true, true, true});
         return T{gi, gw, gb};
       }),
       {Data::kAny, Data::kAny, Data::kAny, Data::kPositive, Data::kAny, Data::kAny},
       1e-7});
  for (int64_t reduction : {0, 2}) {
    c.push_back({"aten::nll_loss_forward",
                 {{{8, 4}, {8}}, {{5, 3}, {5}}},
                 {{reduction}},
                 many([reduction](const T& x, const Shapes&) {
                   auto [o, w] = at::nll_loss_forward(x[0], x[1], {}, reduction, -100);
                   return T{o, w};
                 }),
                 {Data::kAny, Data::kClass}});
    const std::vector<int64_t> g8 =
        reduction == 0 ? std::vector<int64_t>{8} : std::vector<int64_t>{};
    const std::vector<int64_t> g5 =
        reduction == 0 ? std::vector<int64_t>{5} : std::vector<int64_t>{};
    c.push_back({"aten::nll_loss_backward",
                 {{g8, {8, 4}, {8}, {}}, {g5, {5, 3}, {5}, {}}},
                 {{reduction}},
                 one([reduction](const T& x, const Shapes&) {
                   return at::nll_loss_backward(x[0], x[1], x[2], {}, reduction, -100, x[3]);
                 }),
                 {Data::kAny, Data::kAny, Data::kClass, Data::kPositive}});
  }
#if TORCH_VERSION_MAJOR < 2  // torch 2.x renamed it (scaled_dot_product_attention, no weights)
  c.push_back(
      {"aten::_scaled_dot_product_attention",
       {{{2, 2, 4, 3}, {2, 2, 5, 3}, {2, 2, 5, 2}}, {{1, 3, 5, 2}, {1, 3, 3, 2}, {1, 3, 3, 4}}},
       {},
       many([](const T& x, const Shapes&) {
         auto [o, a] = at::_scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true, false);
         return T{o, a};
       }),
       {},
       1e-7});
#endif
  c.push_back(
      {"aten::native_dropout", {{{8, 4}}, {{5, 3}}}, {}, many([](const T& x, const Shapes&) {
         auto [o, mask] = at::native_dropout(x[0], 0.0, true);
         return T{o, mask};
       })});
  c.push_back(
      {"aten::new_ones", {{{8, 4}}, {{5, 3}}}, {{3, 2}}, one([](const T& x, const Shapes& o) {
         return x[0].new_ones(o[0]);
       })});
  // Backward ops of views and indexing.
  // Execution::kSliceBackwardAtOffset: a grad piece lands at its own offset (start 1, step 2).
  c.push_back({"aten::slice_backward",
               {{{3, 3}}},
               {{0, 1, 6, 2, 6, 3}},
               [](const T& x, const Shapes& o, const Local* l) {
                 int64_t first = 1, rows = x[0].size(0);
                 if (l != nullptr)
                   first += 2 * local_box(l->sharding->input_targets[0], l->coord).offset[0];
                 return T{at::slice_backward(x[0], o[0], 0, first,
                                             rows == 0 ? first : first + 2 * (rows - 1) + 1, 2)};
               }});
  c.push_back({"aten::select_backward", {{{5}}}, {{1, 5, 4}}, one([](const T& x, const Shapes& o) {
                 return at::select_backward(x[0], o[0], 1, 2);
               })});
  c.push_back({"aten::scatter_add",
               {{{8, 4}, {8, 4}, {8, 4}}, {{5, 3}, {5, 3}, {5, 3}}},
               {{1}},
               one([](const T& x, const Shapes&) { return at::scatter_add(x[0], 1, x[1], x[2]); }),
               {Data::kAny, Data::kIndex, Data::kAny}});
  c.push_back({"aten::index_add",
               {{{4, 6}, {5}, {5, 6}}, {{3, 5}, {7}, {7, 5}}},
               {{0}},
               one([](const T& x, const Shapes&) { return at::index_add(x[0], 0, x[1], x[2]); }),
               {Data::kAny, Data::kIndex, Data::kAny}});
  c.push_back({"aten::value_selecting_reduction_backward",
               {{{5}, {5}}},
               {{1, 0, 5, 3}},
               one([](const T& x, const Shapes& o) {
                 return at::value_selecting_reduction_backward(x[0], 1, x[1], o[0], false);
               }),
               {Data::kAny, Data::kIndex}});
  c.push_back({"aten::zeros_like", {{{8, 4}}, {{5, 3}}}, {}, one([](const T& x, const Shapes&) {
                 return at::zeros_like(x[0]);
               })});
  return c;
}

// Every input's placements: one of R, P(sum) (float inputs only), S(d) per mesh dim; all their
// combinations, or (past kMaxCombos) an evenly spaced deterministic sample of them.
constexpr int64_t kMaxCombos = 600;

std::vector<std::vector<Placements>> combos(const DeviceMesh& mesh, const Shapes& shapes,
                                            const std::vector<Data>& data) {
  std::vector<std::vector<Placements>> per_input;
  int64_t total = 1;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<Placement> choices = {Replicate()};
    const Data kind = i < data.size() ? data[i] : Data::kAny;
    if (kind == Data::kAny || kind == Data::kPositive) choices.push_back(Partial());
    for (size_t d = 0; d < shapes[i].size(); ++d) choices.push_back(Shard(static_cast<int32_t>(d)));
    std::vector<Placements> per = {{}};
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      std::vector<Placements> next;
      for (const auto& p : per) {
        for (Placement c : choices) {
          next.push_back(p);
          next.back().push_back(c);
        }
      }
      per = std::move(next);
    }
    total *= static_cast<int64_t>(per.size());
    per_input.push_back(std::move(per));
  }
  const int64_t step = (total + kMaxCombos - 1) / kMaxCombos;
  std::vector<std::vector<Placements>> out;
  for (int64_t k = 0; k < total; k += step) {
    std::vector<Placements> one;
    for (int64_t i = static_cast<int64_t>(per_input.size()) - 1, rem = k; i >= 0; --i) {
      const int64_t n = static_cast<int64_t>(per_input[i].size());
      one.insert(one.begin(), per_input[i][rem % n]);
      rem /= n;
    }
    out.push_back(std::move(one));
  }
  return out;
}

bool close(const at::Tensor& got, const at::Tensor& want, double tol) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  if (!at::isFloatingType(want.scalar_type())) return at::equal(got, want);
  return at::allclose(got, want, tol, tol);
}

void run_case(const OpCase& c, const std::vector<int64_t>& mesh_shape, std::atomic<int64_t>& runs,
              std::vector<std::string>& failures, std::mutex& mu) {
  const DeviceMesh mesh = DeviceMesh::arange(mesh_shape);
  for (const Shapes& shapes : c.shape_sets) {
    std::vector<at::Tensor> globals;
    for (size_t i = 0; i < shapes.size(); ++i) {
      globals.push_back(make_input(shapes[i], static_cast<int64_t>(i),
                                   i < c.data.size() ? c.data[i] : Data::kAny));
    }
    Shapes global_out;
    const auto all = combos(mesh, shapes, c.data);
    // The expected outputs, once.
    {
      std::vector<DTensorSpec> specs;
      for (size_t i = 0; i < shapes.size(); ++i) {
        specs.push_back(DTensorSpec::make(mesh, Placements(mesh.ndim(), Replicate()),
                                          TensorMeta::make(shapes[i], globals[i].scalar_type())));
      }
      for (const auto& o : propagate(c.op, specs, c.args)->outputs) global_out.push_back(o.shape());
    }
    const auto expected = c.fn(globals, global_out, nullptr);
    collectives::run_threads(
        mesh.size(),
        [&](int64_t rank) {
          const auto coord = *mesh.coordinate(rank);
          for (const auto& placements : all) {
            try {
              std::vector<DTensorSpec> specs;
              std::vector<at::Tensor> locals;
              for (size_t i = 0; i < shapes.size(); ++i) {
                specs.push_back(DTensorSpec::make(
                    mesh, placements[i], TensorMeta::make(shapes[i], globals[i].scalar_type())));
                locals.push_back(local_tensor_for(globals[i], specs[i], coord));
              }
              const auto s = propagate(c.op, specs, c.args);
              std::vector<at::Tensor> moved;
              for (size_t i = 0; i < locals.size(); ++i)
                moved.push_back(execute_plan(*s->input_plans[i], locals[i]));
              Shapes out_local;
              for (const auto& o : s->outputs) out_local.push_back(local_box(o, coord).shape);
              const Local local{s.get(), coord};
              std::vector<at::Tensor> outs;
              try {
                outs = c.fn(moved, out_local, &local);
              } catch (const std::exception& e) {  // name the case; the peers then time out
                std::lock_guard<std::mutex> lock(mu);
                failures.push_back(c.op + " " + c.args.to_string() +
                                   ": the local op threw on rank " + std::to_string(rank) + ": " +
                                   s->to_string() + "\n" + e.what());
                throw;
              }
              for (size_t o = 0; o < outs.size(); ++o) {
                const at::Tensor full =
                    DTensor(outs[o].to(s->outputs[o].meta().dtype).contiguous(), s->outputs[o])
                        .full_tensor();
                if (!close(full, expected[o], c.tol)) {
                  std::lock_guard<std::mutex> lock(mu);
                  if (failures.size() < 10) {
                    failures.push_back(c.op + " " + c.args.to_string() + " on rank " +
                                       std::to_string(rank) + ": " + s->to_string() + "\n output " +
                                       std::to_string(o) + " got\n" + c10::str(full) + "\n want\n" +
                                       c10::str(expected[o]));
                  }
                }
              }
              if (rank == 0) ++runs;
            } catch (const std::exception& e) {  // name the case before the peers time out
              std::string where;
              for (const auto& p : placements) where += to_string(p) + " ";
              std::fprintf(stderr, "%s %s with inputs %s: rank %lld failed: %s\n", c.op.c_str(),
                           c.args.to_string().c_str(), where.c_str(), static_cast<long long>(rank),
                           e.what());
              throw;
            }
          }
        },
        "threads", std::chrono::seconds(10));
  }
}

class PropagationNumericTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(PropagationNumericTest, EveryOpEveryInputLayoutMatchesOneDevice) {
  std::atomic<int64_t> runs{0};
  std::vector<std::string> failures;
  std::mutex mu;
  const auto all = cases();
  for (const OpCase& c : all) run_case(c, GetParam(), runs, failures, mu);
  for (const auto& f : failures) ADD_FAILURE() << f;
  std::printf("%zu op cases, %lld propagate+redistribute+local op runs checked\n", all.size(),
              static_cast<long long>(runs.load()));
}

INSTANTIATE_TEST_SUITE_P(Meshes, PropagationNumericTest,
                         ::testing::Values(std::vector<int64_t>{4}, std::vector<int64_t>{2, 2}));

}  // namespace
}  // namespace dtensor::sharding
