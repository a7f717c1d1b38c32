// Chains of ops on distributed values against the single-device chain: each op propagates,
// redistributes its inputs as planned and runs on the local tensors. Runs on the threads backend.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/rank_context.h"
#include "dtensor/dtensor.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"
#include "dtensor/testing/numeric_inputs.h"
#include "sharding_prop/propagator.h"

namespace dtensor::sharding {
namespace {

using testing::Data;
using testing::make_input;

// One op on distributed values: propagate, redistribute the inputs as planned, run `fn` on the
// local tensors, wrap the outputs with the propagated specs.
std::vector<DTensor> apply(
    const std::string& op, const std::vector<DTensor>& in, const LayoutArgs& args,
    const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& fn) {
  std::vector<DTensorSpec> specs;
  for (const auto& d : in) specs.push_back(d.spec());
  const auto s = propagate(op, specs, args);
  std::vector<at::Tensor> locals;
  for (size_t i = 0; i < in.size(); ++i)
    locals.push_back(execute_plan(*s->input_plans[i], in[i].to_local()));
  const auto outs = fn(locals);
  std::vector<DTensor> result;
  for (size_t o = 0; o < outs.size(); ++o) result.emplace_back(outs[o].contiguous(), s->outputs[o]);
  return result;
}

// Chains: an RMS norm built from covered ops (pow, mean keepdim, add, rsqrt, mul, mul by a
// weight) and cross entropy as log_softmax + nll_loss, from several input layouts, against the
// single-device chain.
TEST(PropagationChainTest, RmsNormAndCrossEntropyMatchOneDevice) {
  using T = std::vector<at::Tensor>;
  const DeviceMesh mesh = DeviceMesh::arange({2, 2});
  const at::Tensor x = make_input({6, 8}, 0, Data::kAny), w = make_input({8}, 1, Data::kAny);
  const at::Tensor target = make_input({6}, 2, Data::kClass);
  const at::Tensor logits = make_input({6, 3}, 3, Data::kAny);
  const at::Tensor rms_want = x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6) * w;
  const at::Tensor ce_want =
      std::get<0>(at::nll_loss_forward(at::_log_softmax(logits, 1, false), target, {}, 2, -100));
  std::mutex mu;
  std::vector<std::string> failures;
  collectives::run_threads(
      4,
      [&](int64_t rank) {
        const auto coord = *mesh.coordinate(rank);
        auto dist = [&](const at::Tensor& t, const std::string& p) {
          const auto spec = DTensorSpec::make(mesh, parse_placements(p),
                                              TensorMeta::make(t.sizes().vec(), t.scalar_type()));
          return DTensor(local_tensor_for(t, spec, coord), spec);
        };
        for (const char* px : {"S(0),R", "R,S(1)", "S(0),S(1)", "P,R", "S(1),P"}) {
          for (const char* pw : {"R,R", "R,S(0)"}) {
            const DTensor dx = dist(x, px), dw = dist(w, pw);
            auto sq = apply("aten::pow.Tensor_Scalar", {dx}, {},
                            [](const T& t) { return T{t[0].pow(2)}; });
            auto ms = apply("aten::mean.dim", sq, {{1, -1}},
                            [](const T& t) { return T{t[0].mean({-1}, true)}; });
            auto eps = apply("aten::add.Scalar", ms, {}, [](const T& t) { return T{t[0] + 1e-6}; });
            auto r = apply("aten::rsqrt", eps, {}, [](const T& t) { return T{t[0].rsqrt()}; });
            auto y = apply("aten::mul.Tensor", {dx, r[0]}, {},
                           [](const T& t) { return T{t[0] * t[1]}; });
            auto out = apply("aten::mul.Tensor", {y[0], dw}, {},
                             [](const T& t) { return T{t[0] * t[1]}; });
            const at::Tensor got = out[0].full_tensor();
            if (!at::allclose(got, rms_want, 1e-9, 1e-9)) {
              std::lock_guard<std::mutex> lock(mu);
              failures.push_back(std::string("rms norm from x ") + px + ", w " + pw + ": got " +
                                 c10::str(got));
            }
          }
        }
        for (const char* pl : {"S(0),R", "R,S(1)", "S(0),S(0)", "P,R"}) {
          const DTensor dl = dist(logits, pl), dt = dist(target, "S(0),R");
          auto lsm = apply("aten::_log_softmax", {dl}, {{1}},
                           [](const T& t) { return T{at::_log_softmax(t[0], 1, false)}; });
          auto loss = apply("aten::nll_loss_forward", {lsm[0], dt}, {{2}}, [](const T& t) {
            auto [o, tw] = at::nll_loss_forward(t[0], t[1], {}, 2, -100);
            return T{o, tw};
          });
          const at::Tensor got = loss[0].full_tensor();
          if (!at::allclose(got, ce_want, 1e-9, 1e-9)) {
            std::lock_guard<std::mutex> lock(mu);
            failures.push_back(std::string("cross entropy from logits ") + pl + ": got " +
                               c10::str(got));
          }
        }
      },
      "threads", std::chrono::seconds(30));
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace dtensor::sharding
