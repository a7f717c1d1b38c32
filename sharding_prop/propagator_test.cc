// The propagator on tables of (op, input layouts) -> expected choice, its errors, strict mode,
// in-place ops, custom rules and the cache. No communication.

#include "sharding_prop/propagator.h"

#include <gtest/gtest.h>

#include "base/testing/expect_error.h"
#include "sharding_prop/cost_model.h"
#include "sharding_prop/redistribute_plan.h"

namespace dtensor::sharding {
namespace {

using testing::expect_error;

DTensorSpec spec(const std::vector<int64_t>& mesh, const std::string& placements,
                 const std::vector<int64_t>& shape) {
  return DTensorSpec::make(DeviceMesh::arange(mesh), parse_placements(placements),
                           TensorMeta::make(shape));
}

struct Row {
  std::string op;
  std::vector<int64_t> mesh;
  std::vector<std::pair<std::string, std::vector<int64_t>>> inputs;  // placements, shape
  LayoutArgs args;
  std::string want_inputs;   // target placements, ";"-separated
  std::string want_outputs;  // output placements, ";"-separated
  std::string want_rule;     // empty: not checked
};

std::string placements_of(const std::vector<DTensorSpec>& specs) {
  std::string s;
  for (size_t i = 0; i < specs.size(); ++i) s += (i ? ";" : "") + to_string(specs[i].placements());
  return s;
}

TEST(PropagatorTest, ChoosesTheCheapestLayoutTable) {
  const std::vector<Row> rows = {
      // Row-sharded activations times a replicated weight stay row-sharded.
      {"aten::mm",
       {4},
       {{"S(0)", {8, 6}}, {"R", {6, 4}}},
       {},
       "[S(0)];[R]",
       "[S(0)]",
       "ab,bc->ac | b:sum"},
      // Sharding the contraction leaves a Partial sum, with no communication.
      {"aten::mm", {4}, {{"S(1)", {8, 8}}, {"S(0)", {8, 4}}}, {}, "[S(1)];[S(0)]", "[P(sum)]", ""},
      {"aten::mm", {4}, {{"R", {8, 8}}, {"S(1)", {8, 4}}}, {}, "[R];[S(1)]", "[S(1)]", ""},
      // 2-D mesh: data parallel on dim 0, tensor parallel on dim 1.
      {"aten::mm",
       {2, 2},
       {{"S(0),R", {8, 8}}, {"R,S(1)", {8, 4}}},
       {},
       "[S(0),R];[R,S(1)]",
       "[S(0),S(1)]",
       ""},
      // Broadcasting: a bias vector follows the sharded rows for free.
      {"aten::add.Tensor",
       {4},
       {{"S(0)", {8, 4}}, {"R", {4}}},
       {},
       "[S(0)];[R]",
       "[S(0)]",
       "ab,b->ab"},
      {"aten::add.Tensor", {4}, {{"S(1)", {8, 4}}, {"R", {4}}}, {}, "[S(1)];[S(0)]", "[S(1)]", ""},
      // Linear ops keep Partial; non-linear ones reduce it to Replicate, as PyTorch.
      {"aten::add.Tensor",
       {4},
       {{"P", {8, 4}}, {"P", {8, 4}}},
       {},
       "[P(sum)];[P(sum)]",
       "[P(sum)]",
       ""},
      {"aten::mul.Tensor", {4}, {{"P", {8, 4}}, {"R", {8, 4}}}, {}, "[P(sum)];[R]", "[P(sum)]", ""},
      {"aten::exp", {4}, {{"P", {8, 4}}}, {}, "[R]", "[R]", ""},
      // A Scalar added keeps Partial(avg), max and min (x + c commutes with them), not sum.
      {"aten::add_.Scalar", {4}, {{"P(avg)", {8, 4}}}, {}, "[P(avg)]", "[P(avg)]", ""},
      {"aten::sub.Scalar", {4}, {{"P(max)", {8, 4}}}, {}, "[P(max)]", "[P(max)]", ""},
      {"aten::add.Scalar", {4}, {{"P", {8, 4}}}, {}, "[R]", "[R]", ""},
      // Reductions: a sharded reduced dim gives the matching Partial.
      {"aten::sum.dim_IntList",
       {4},
       {{"S(0)", {8, 4}}},
       {{0, 0}},
       "[S(0)]",
       "[P(sum)]",
       "ab->b | a:sum"},
      {"aten::sum.dim_IntList", {4}, {{"S(0)", {8, 4}}}, {{1, -1}}, "[S(0)]", "[S(0)]", ""},
      {"aten::amax", {4}, {{"S(1)", {8, 4}}}, {{0, 1}}, "[S(1)]", "[P(max)]", ""},
      {"aten::mean.dim", {4}, {{"S(1)", {8, 4}}}, {{0, 1}}, "[S(1)]", "[P(avg)]", ""},
      // A dim the op needs whole is gathered, as PyTorch's (not moved to another dim by an
      // all_to_all, whose output its consumers would have to gather again).
      {"aten::var.correction", {4}, {{"S(1)", {8, 4}}}, {{0, 1}}, "[R]", "[R]", ""},
      {"aten::_softmax", {4}, {{"S(1)", {8, 4}}}, {{1}}, "[R]", "[R]", "ab->ab | b:replicate"},
      {"aten::_softmax", {4}, {{"S(0)", {8, 4}}}, {{1}}, "[S(0)]", "[S(0)]", ""},
      // Views: a merged dim stays sharded through its major factor when even.
      {"aten::view", {4}, {{"S(0)", {8, 4}}}, {{32}}, "[S(0)]", "[S(0)]", "ab->(ab)"},
      {"aten::view", {4}, {{"S(0)", {6, 4}}}, {{24}}, "[R]", "[R]", ""},
      {"aten::view", {2}, {{"S(0)", {8}}}, {{2, 4}}, "[S(0)]", "[S(0)]", "(ab)->ab"},
      // A size-1 dim facing a size-1 dim keeps its (uneven) Shard, as PyTorch's view does.
      {"aten::view", {4}, {{"S(0)", {1, 8}}}, {{1, 2, 4}}, "[S(0)]", "[S(0)]", ""},
      {"aten::transpose.int", {4}, {{"S(0)", {8, 4}}}, {{0, 1}}, "[S(0)]", "[S(1)]", ""},
      {"aten::unsqueeze", {4}, {{"S(1)", {8, 4}}}, {{0}}, "[S(1)]", "[S(2)]", ""},
      // cat keeps the other dims' sharding; the cat dim is gathered.
      {"aten::cat",
       {4},
       {{"S(1)", {8, 4}}, {"S(1)", {3, 4}}},
       {{0}},
       "[S(1)];[S(1)]",
       "[S(1)]",
       ""},
      // A cat-dim shard is gathered; the Replicate input stays.
      {"aten::cat", {4}, {{"S(0)", {8, 4}}, {"R", {8, 4}}}, {{0}}, "[R];[R]", "[R]", ""},
      // A "legacy empty" 1-D [0] input takes no part (ATen's cat skips it; torch 2.11's op_db).
      {"aten::cat", {4}, {{"R", {0}}, {"S(0)", {8, 4}}}, {{1}}, "[R];[S(0)]", "[S(0)]", ""},
      // gather with an empty index: an empty result of the index's shape, whatever self's dims.
      {"aten::gather", {4}, {{"R", {5}}, {"R", {2, 0}}}, {{0}}, "[R];[R]", "[R]", ""},
      {"aten::scatter_add",
       {4},
       {{"R", {5}}, {"R", {2, 0}}, {"R", {2, 0}}},
       {{0}},
       "[R];[R];[R]",
       "[R]",
       ""},
      // addmm: with a sharded contraction the bias becomes Partial (kept on one rank).
      {"aten::addmm",
       {4},
       {{"R", {4}}, {"S(1)", {8, 8}}, {"S(0)", {8, 4}}},
       {},
       "[P(sum)];[S(1)];[S(0)]",
       "[P(sum)]",
       ""},
      // Factories read no values: the input stays as it is, even Partial.
      {"aten::zeros_like", {4}, {{"S(0)", {8, 4}}}, {}, "[S(0)]", "[S(0)]", ""},
      {"aten::zeros_like", {4}, {{"P", {8, 4}}}, {}, "[P(sum)]", "[R]", ""},
      {"aten::new_zeros", {4}, {{"S(1)", {8, 4}}}, {{3, 3}}, "[S(1)]", "[R]", ""},
      // NOTE [kept Partials]: a Replicate joins a sum's Partial by being partitioned (no
      // reduction); avg passes through a product; max through maximum and amax.
      {"aten::add.Tensor",
       {4},
       {{"P", {8, 4}}, {"R", {8, 4}}},
       {},
       "[P(sum)];[P(sum)]",
       "[P(sum)]",
       ""},
      // A Partial self passes through index_select; its Replicate index is not partitioned
      // (rows picked by a zero index on all but one rank were a wrong answer).
      {"aten::index_select",
       {2},
       {{"P", {3, 4}}, {"R", {2}}},
       {{0}},
       "[P(sum)];[R]",
       "[P(sum)]",
       ""},
      // ATen's fused CPU attention (ints: is_causal, attn_mask given): heads shard with no
      // communication; query rows shard when not causal (k/v gathered), dk/dv summed over them.
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {2},
       {{"S(1)", {2, 4, 6, 8}}, {"S(1)", {2, 4, 6, 8}}, {"S(1)", {2, 4, 6, 8}}},
       {{0, 0}},
       "[S(1)];[S(1)];[S(1)]",
       "[S(1)];[S(1)]",
       ""},
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {2},
       {{"S(2)", {2, 4, 6, 8}}, {"S(2)", {2, 4, 6, 8}}, {"S(2)", {2, 4, 6, 8}}},
       {{0, 0}},
       "[S(2)];[R];[R]",
       "[S(2)];[S(2)]",
       ""},
      // Causal: the kernel's mask counts rows from the piece's first, so the rows stay whole.
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {2},
       {{"S(2)", {2, 4, 6, 8}}, {"S(2)", {2, 4, 6, 8}}, {"S(2)", {2, 4, 6, 8}}},
       {{1, 0}},
       "[R];[R];[R]",
       "[R];[R]",
       ""},
      // GQA (4 query heads, 2 k/v heads): the heads stay whole.
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {2},
       {{"S(1)", {2, 4, 6, 8}}, {"S(1)", {2, 2, 6, 8}}, {"S(1)", {2, 2, 6, 8}}},
       {{0, 0}},
       "[R];[R];[R]",
       "[R];[R]",
       ""},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward",
       {2},
       {{"S(2)", {2, 4, 6, 8}},
        {"S(2)", {2, 4, 6, 8}},
        {"R", {2, 4, 6, 8}},
        {"R", {2, 4, 6, 8}},
        {"S(2)", {2, 4, 6, 8}},
        {"S(2)", {2, 4, 6}}},
       {{0, 0}},
       "[S(2)];[S(2)];[R];[R];[S(2)];[S(2)]",
       "[S(2)];[P(sum)];[P(sum)]",
       ""},
      {"aten::sub.Tensor",
       {4},
       {{"R", {4}}, {"P(avg)", {8, 4}}},
       {},
       "[P(avg)];[P(avg)]",
       "[P(avg)]",
       ""},
      {"aten::mul.Tensor",
       {4},
       {{"P(avg)", {8, 4}}, {"R", {8, 4}}},
       {},
       "[P(avg)];[R]",
       "[P(avg)]",
       ""},
      {"aten::maximum",
       {4},
       {{"P(max)", {8, 4}}, {"P(max)", {8, 4}}},
       {},
       "[P(max)];[P(max)]",
       "[P(max)]",
       ""},
      // minimum does not commute with max: reduced to Replicate, as PyTorch.
      {"aten::minimum", {4}, {{"P(max)", {8, 4}}, {"P(max)", {8, 4}}}, {}, "[R];[R]", "[R]", ""},
      {"aten::amax", {4}, {{"P(max)", {8, 4}}}, {{0, 1}}, "[P(max)]", "[P(max)]", ""},
      // Of self's shape: laid out as self, as PyTorch's new_* strategy.
      {"aten::new_zeros", {4}, {{"S(1)", {8, 4}}}, {{8, 4}}, "[S(1)]", "[S(1)]", ""},
      {"aten::new_empty_strided", {4}, {{"S(0)", {8, 4}}}, {{8, 4}}, "[S(0)]", "[S(0)]", ""},
      {"aten::new_full", {4}, {{"P", {8, 4}}}, {{8, 4}}, "[P(sum)]", "[R]", ""},
      // A Shard on a size-1 dim is kept through the op (NOTE [size-1 factors]), never introduced.
      {"aten::mul.Tensor",
       {2},
       {{"S(0)", {1, 8}}, {"R", {1, 8}}},
       {},
       "[S(0)];[S(0)]",
       "[S(0)]",
       "ab,ab->ab"},
      {"aten::mul.Tensor", {2}, {{"R", {1, 8}}, {"R", {1, 8}}}, {}, "[R];[R]", "[R]", ""},
      {"aten::mul_.Tensor", {2}, {{"S(0)", {1, 8}}, {"R", {8}}}, {}, "[S(0)];[R]", "[S(0)]", ""},
      {"aten::t", {2}, {{"S(0)", {1, 8}}}, {}, "[S(0)]", "[S(1)]", ""},
      {"aten::mm", {2}, {{"S(0)", {1, 8}}, {"R", {8, 3}}}, {}, "[S(0)];[R]", "[S(0)]", ""},
      {"aten::sum.dim_IntList", {2}, {{"S(0)", {1, 8}}}, {{0, 0}}, "[S(0)]", "[P(sum)]", ""},
      // A mean over it would average an empty piece: the input moves (contractions_even).
      {"aten::mean.dim", {2}, {{"S(0)", {1, 8}}}, {{0, 0}}, "[R]", "[R]", ""},
      {"aten::einsum",
       {2},
       {{"S(0)", {4, 3, 5}}, {"S(0)", {4, 5, 2}}},
       {{}, "bij,bjk->bik"},
       "[S(0)];[S(0)]",
       "[S(0)]",
       "abc,acd->abd | c:sum"},
  };
  for (const Row& r : rows) {
    std::vector<DTensorSpec> ins;
    for (const auto& [p, shape] : r.inputs) ins.push_back(spec(r.mesh, p, shape));
    const auto s = propagate(r.op, ins, r.args);
    EXPECT_EQ(placements_of(s->input_targets), r.want_inputs) << s->to_string();
    EXPECT_EQ(placements_of(s->outputs), r.want_outputs) << s->to_string();
    if (!r.want_rule.empty()) {
      EXPECT_EQ(s->rule, r.want_rule) << s->to_string();
    }
  }
}

TEST(PropagatorTest, OutputMetaFollowsTheOp) {
  const auto a = spec({2}, "S(0)", {8, 4});
  EXPECT_EQ(propagate("aten::sum.dim_IntList", {a}, {{1, 1}})->outputs[0].shape(),
            (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(propagate("aten::view", {a}, {{-1, 2, 2}})->outputs[0].shape(),
            (std::vector<int64_t>{8, 2, 2}));
  EXPECT_EQ(propagate("aten::eq.Tensor", {a, a})->outputs[0].meta().dtype, c10::kBool);
  EXPECT_EQ(propagate("aten::_to_copy", {a}, {{static_cast<int64_t>(c10::kDouble)}})
                ->outputs[0]
                .meta()
                .dtype,
            c10::kDouble);
  const auto m = propagate("aten::max.dim", {a}, {{0, 1}});
  ASSERT_EQ(m->outputs.size(), 2u);
  EXPECT_EQ(m->outputs[1].meta().dtype, c10::kLong);
}

TEST(PropagatorTest, ClearErrorsBeforeAnyWork) {
  const auto a = spec({4}, "S(0)", {8, 4});
  expect_error(
      [&] {
        propagate("aten::ad.Tensor", {a, a});
      },
      "aten::ad.Tensor has no sharding rule (inputs: [S(0)] Float[8,4], [S(0)] "
      "Float[8,4]); nearest supported: aten::add.Tensor");
  expect_error(
      [&] {
        propagate("aten::add.Tensor", {a, spec({2, 2}, "R,R", {8, 4})});
      },
      "inputs live on different meshes");
  expect_error([&] { propagate("aten::mm", {a, spec({4}, "R", {5, 4})}); }, "cannot be multiplied");
  expect_error(
      [&] {
        propagate("aten::add.Tensor", {a, spec({4}, "R", {3})});
      },
      "do not broadcast");
  expect_error([&] { propagate("aten::sum.dim_IntList", {a}, {{0, 2}}); }, "out of range");
  expect_error([&] { propagate("aten::view", {a}, {{5, -1}}); }, "invalid");
}

TEST(PropagatorTest, StrictModeNamesTheRedistribute) {
  const auto a = spec({4}, "S(1)", {8, 8}), b = spec({4}, "S(1)", {8, 4});
  PropagateOptions strict;
  strict.strict = true;
  expect_error(
      [&] {
        propagate("aten::mm", {a, b}, {}, strict);
      },
      "strict mode: aten::mm on [S(1)] Float[8,8], [S(1)] Float[8,4] needs implicit "
      "redistributes (input 1: [S(1)] -> [S(0)])");
  // Nothing to move: fine in strict mode.
  EXPECT_FALSE(
      propagate("aten::mm", {a, spec({4}, "S(0)", {8, 4})}, {}, strict)->needs_redistribute());
}

TEST(PropagatorTest, InPlaceKeepsSelf) {
  const auto self = spec({4}, "R", {8, 4}), other = spec({4}, "S(0)", {8, 4});
  const auto s = propagate("aten::add_.Tensor", {self, other});
  EXPECT_EQ(placements_of(s->outputs), "[R]");
  EXPECT_TRUE(s->input_plans[0]->is_noop());
  // A Partial self cannot absorb a sharded product in place... but add_ of two Partials can.
  const auto p = spec({4}, "P", {8, 4});
  EXPECT_EQ(placements_of(propagate("aten::add_.Tensor", {p, p})->outputs), "[P(sum)]");
  // exp_ keeps no Partial self: it runs out of place and is copied back (NOTE [in-place by copy]).
  EXPECT_TRUE(propagate("aten::exp_", {p})->in_place_by_copy);
  EXPECT_FALSE(propagate("aten::exp_", {self})->in_place_by_copy);
}

TEST(PropagatorTest, CustomRuleFromAString) {
  register_rule("mylib::my_mm", "mk,kn->mn");
  const auto a = spec({4}, "S(1)", {8, 8}), b = spec({4}, "S(0)", {8, 4});
  const auto s = propagate("mylib::my_mm", {a, b});
  EXPECT_EQ(placements_of(s->outputs), "[P(sum)]");
  EXPECT_EQ(s->rule, "ab,bc->ac | b:sum");
  expect_error([] { register_rule("mylib::my_mm", "mk,kn->mn"); }, "already has a rule");
  register_rule("mylib::rowmax", "mk->m | k:max", Linearity::kNone);
  EXPECT_EQ(placements_of(propagate("mylib::rowmax", {a})->outputs), "[P(max)]");
}

// A letter naming two dims of one tensor (a diagonal) cannot be split by Shard placements: a row
// block's local diagonal is not a block of the global one, so the factor stays whole (an S(0)
// input kept through "ii->i" would give an S(0) output computed from the wrong elements).
TEST(PropagatorTest, CustomRuleWithARepeatedLetterKeepsItWhole) {
  register_rule("mylib::my_diag", "ii->i", Linearity::kNone);
  const auto s = propagate("mylib::my_diag", {spec({2}, "S(0)", {4, 4})});
  EXPECT_EQ(placements_of(s->input_targets), "[R]");
  EXPECT_EQ(placements_of(s->outputs), "[R]");
  EXPECT_EQ(s->rule, "aa->a | a:replicate");
  register_rule("mylib::my_trace", "ii->");
  EXPECT_EQ(placements_of(propagate("mylib::my_trace", {spec({2}, "S(1)", {4, 4})})->outputs),
            "[R]");
}

// NOTE [compute in the cost model]: the weight gradient of a column-parallel nn.Linear(in, out)
// whose output gradient arrives replicated (loss = out.sum()) is mm(grad_out.t() [out,B],
// x [B,in]), both replicated. Computed whole, every rank does the full product before the
// parameter's hook keeps its S(0) rows; chunking grad_out.t() locally (no communication) gives
// each rank its [out/N, in] block, which the hook then keeps as it is.
TEST(PropagatorTest, ReplicatedWeightGradientProductIsComputedSharded) {
  const int64_t out = 256, in = 256, batch = 32;
  for (const int64_t n : {2, 4}) {
    const auto grad_t = spec({n}, "R", {out, batch}), x = spec({n}, "R", {batch, in});
    const auto s = propagate("aten::mm", {grad_t, x});
    EXPECT_EQ(placements_of(s->input_targets), "[S(0)];[R]") << s->to_string();
    EXPECT_EQ(placements_of(s->outputs), "[S(0)]") << s->to_string();
    for (const auto& plan : s->input_plans) EXPECT_EQ(plan->num_collectives(), 0);
    const double whole = 2.0 * out * batch * in;
    EXPECT_DOUBLE_EQ(s->flops, whole / static_cast<double>(n)) << s->to_string();
    // Its transpose (the gradient of w.t()) keeps the rows of w sharded: S(1) of [in, out].
    const auto t = propagate("aten::t", {s->outputs[0]});
    EXPECT_EQ(placements_of(t->outputs), "[S(1)]");
  }
  // A product too small to pay for gathering its output later stays replicated, as before.
  const auto small = propagate("aten::mm", {spec({4}, "R", {8, 8}), spec({4}, "R", {8, 4})});
  EXPECT_EQ(placements_of(small->outputs), "[R]") << small->to_string();
  // Elementwise ops of replicated inputs are never split for compute.
  const auto add =
      propagate("aten::add.Tensor", {spec({4}, "R", {512, 512}), spec({4}, "R", {512, 512})});
  EXPECT_EQ(placements_of(add->outputs), "[R]") << add->to_string();
}

// NOTE [cost model per device]: on a CUDA mesh compute is priced a thousandth of a CPU rank's and
// a collective several times more, so the same weight-gradient product stays whole there; the
// propagation cache (keyed by specs, which hold the mesh) keeps the two answers apart.
TEST(PropagatorTest, CostModelFollowsTheMeshDevice) {
  const int64_t out = 256, in = 256, batch = 32;
  const DeviceMesh cpu = DeviceMesh::arange({2});
  const DeviceMesh cuda = cpu.with_device_type(c10::DeviceType::CUDA);
  auto on = [&](const DeviceMesh& mesh, const std::vector<int64_t>& shape) {
    return DTensorSpec::make(mesh, parse_placements("R"), TensorMeta::make(shape));
  };
  for (int round = 0; round < 2; ++round) {  // the second round answers from the cache
    const auto c = propagate("aten::mm", {on(cpu, {out, batch}), on(cpu, {batch, in})});
    EXPECT_EQ(placements_of(c->outputs), "[S(0)]") << c->to_string();
    const auto g = propagate("aten::mm", {on(cuda, {out, batch}), on(cuda, {batch, in})});
    EXPECT_EQ(placements_of(g->outputs), "[R]") << g->to_string();
    EXPECT_EQ(g->outputs[0].mesh().device_type(), c10::DeviceType::CUDA);
  }
  // Plans are priced by their mesh's model too: the same all_gather costs more on CUDA's.
  const auto meta = TensorMeta::make({64, 64});
  const auto gather_cpu = plan_redistribute(DTensorSpec::make(cpu, parse_placements("S(0)"), meta),
                                            DTensorSpec::make(cpu, parse_placements("R"), meta));
  const auto gather_cuda =
      plan_redistribute(DTensorSpec::make(cuda, parse_placements("S(0)"), meta),
                        DTensorSpec::make(cuda, parse_placements("R"), meta));
  EXPECT_DOUBLE_EQ(gather_cpu->cost,
                   default_cost_model().step_cost(CommKind::kAllGather, 2, 64 * 64 * 4));
  EXPECT_DOUBLE_EQ(
      gather_cuda->cost,
      cost_model_for(c10::DeviceType::CUDA).step_cost(CommKind::kAllGather, 2, 64 * 64 * 4));
  EXPECT_GT(gather_cuda->cost, gather_cpu->cost);
}

// native_batch_norm in eval: the CPU kernel returns empty saved statistics, CUDA's kernel [C]
// (unwritten). The rule reads the input's device (a layout argument), so that a CUDA mesh's call
// does not raise "this rank's local result has shape [C] but the propagated output ... Float[0]".
TEST(PropagatorTest, BatchNormEvalStatisticsFollowTheDevice) {
  const auto x = spec({2}, "S(1)", {4, 6, 3});
  const auto c = spec({2}, "S(0)", {6});
  auto saved = [&](c10::DeviceType device, int64_t training) {
    const LayoutArgs args{{training, 1, 1, 1, 1, static_cast<int64_t>(device)}};
    const auto s = propagate("aten::native_batch_norm", {x, c, c, c, c}, args);
    if (s->outputs.size() != 3u) {
      ADD_FAILURE() << s->to_string();
      return int64_t{-2};
    }
    return s->outputs[1].shape().empty() ? int64_t{-1} : s->outputs[1].shape()[0];
  };
  EXPECT_EQ(saved(c10::DeviceType::CPU, 0), 0);
  EXPECT_EQ(saved(c10::DeviceType::CUDA, 0), 6);
  EXPECT_EQ(saved(c10::DeviceType::CPU, 1), 6);
  EXPECT_EQ(saved(c10::DeviceType::CUDA, 1), 6);
  // [C] statistics follow the channel dim's sharding, as the local kernel's do; empty ones are
  // whole, and the input keeps its sharding, so the CPU's eval call finds a layout and does not
  // run by the replicate fallback (which gathers every input).
  const LayoutArgs cpu_eval{{0, 1, 1, 1, 1, static_cast<int64_t>(c10::DeviceType::CPU)}};
  EXPECT_EQ(placements_of(propagate("aten::native_batch_norm", {x, c, c, c, c}, cpu_eval)->outputs),
            "[S(1)];[R];[R]");
  const LayoutArgs cuda_eval{{0, 1, 1, 1, 1, static_cast<int64_t>(c10::DeviceType::CUDA)}};
  EXPECT_EQ(
      placements_of(propagate("aten::native_batch_norm", {x, c, c, c, c}, cuda_eval)->outputs),
      "[S(1)];[S(0)];[S(0)]");
}

// Among candidates of equal communication, the one computing less per rank wins; the FLOPs are
// those of the largest piece (uneven: ceil).
TEST(PropagatorTest, ComputeIsPricedOnTheLargestPiece) {
  const auto a = spec({4}, "S(0)", {10, 6}), b = spec({4}, "R", {6, 4});
  const auto s = propagate("aten::mm", {a, b});
  EXPECT_EQ(placements_of(s->outputs), "[S(0)]");
  EXPECT_DOUBLE_EQ(s->flops, 2.0 * 3 * 6 * 4);  // rows 3,3,3,1: the largest piece has 3
  const auto r = propagate("aten::mm", {spec({4}, "R", {10, 6}), b});
  EXPECT_DOUBLE_EQ(r->flops, 2.0 * 10 * 6 * 4);
  EXPECT_GT(r->cost, s->cost);
}

// Pass factors keep a general strided shard (NOTE [strided shards through ops]: a packed gate/up
// linear's output stays _S(-1,2)), a contraction over it gives a Partial, and ops whose rules
// take no strided input get it redistributed by the planner's cheapest plan.
TEST(PropagatorTest, StridedShardsThroughOps) {
  const std::vector<Row> rows = {
      {"aten::mm",
       {2},
       {{"R", {5, 6}}, {"_S(1,2)", {6, 16}}},
       {},
       "[R];[_S(1,2)]",
       "[_S(1,2)]",
       ""},
      {"aten::linear",
       {2},
       {{"R", {5, 6}}, {"_S(0,2)", {16, 6}}, {"_S(0,2)", {16}}},
       {},
       "[R];[_S(0,2)];[_S(0,2)]",
       "[_S(1,2)]",
       ""},
      {"aten::mm",
       {2},
       {{"_S(1,2)", {5, 16}}, {"_S(0,2)", {16, 6}}},
       {},
       "[_S(1,2)];[_S(0,2)]",
       "[P(sum)]",
       ""},
      {"aten::mul.Tensor",
       {4},
       {{"_S(0,2)", {8, 3}}, {"_S(0,2)", {8, 3}}},
       {},
       "[_S(0,2)];[_S(0,2)]",
       "[_S(0,2)]",
       ""},
      {"aten::add.Tensor",
       {4},
       {{"_S(0,2)", {8, 3}}, {"R", {3}}},
       {},
       "[_S(0,2)];[R]",
       "[_S(0,2)]",
       ""},
      {"aten::relu",
       {2, 2},
       {{"_S(0,2),S(1)", {8, 6}}},
       {},
       "[_S(0,2),S(1)]",
       "[_S(0,2),S(1)]",
       ""},
      {"aten::transpose.int", {2}, {{"_S(0,2)", {8, 4}}}, {{0, 1}}, "[_S(0,2)]", "[_S(1,2)]", ""},
      {"aten::sum.dim_IntList", {2}, {{"_S(0,2)", {8, 4}}}, {{0, 1}}, "[_S(0,2)]", "[_S(0,2)]", ""},
      // Different split factors: one input is moved (through Replicate) to the other's.
      {"aten::add.Tensor",
       {2},
       {{"_S(0,2)", {12, 3}}, {"_S(0,3)", {12, 3}}},
       {},
       "[_S(0,2)];[_S(0,2)]",
       "[_S(0,2)]",
       ""},
      // Rules that take no strided input: the input is gathered first.
      {"aten::view", {2}, {{"_S(0,2)", {8, 4}}}, {{32}}, "[R]", "[R]", ""},
      {"aten::_softmax", {2}, {{"_S(1,2)", {8, 4}}}, {{1}}, "[R]", "[R]", ""},
  };
  for (const Row& r : rows) {
    std::vector<DTensorSpec> ins;
    for (const auto& [p, shape] : r.inputs) ins.push_back(spec(r.mesh, p, shape));
    const auto s = propagate(r.op, ins, r.args);
    EXPECT_EQ(placements_of(s->input_targets), r.want_inputs) << r.op << "\n" << s->to_string();
    EXPECT_EQ(placements_of(s->outputs), r.want_outputs) << r.op << "\n" << s->to_string();
  }
  // Kept layouts move nothing.
  const auto mm = propagate("aten::mm", {spec({2}, "R", {5, 6}), spec({2}, "_S(1,2)", {6, 16})});
  EXPECT_FALSE(mm->needs_redistribute()) << mm->to_string();
  // In-place ops keep self's strided layout.
  const auto add_ =
      propagate("aten::add_.Tensor", {spec({2}, "_S(0,2)", {8, 3}), spec({2}, "R", {8, 3})});
  EXPECT_EQ(placements_of(add_->outputs), "[_S(0,2)]") << add_->to_string();
}

TEST(PropagatorTest, CacheHitsOnSpecsAndArgsOnlyAndIsBounded) {
  const auto a = spec({2}, "S(0)", {6, 4}), b = spec({2}, "S(0)", {2, 4});
  const auto before = propagation_cache_stats();
  const auto x = propagate("aten::cat", {a, b, a}, {{0}});
  const auto y = propagate("aten::cat", {a, b, a}, {{0}});
  EXPECT_EQ(x.get(), y.get());
  const auto after = propagation_cache_stats();
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_NE(propagate("aten::cat", {a, b, a}, {{-2}}).get(), x.get());  // args are in the key
  set_propagation_cache_capacity(2);
  propagate("aten::exp", {a});
  propagate("aten::neg", {a});
  propagate("aten::abs", {a});
  EXPECT_EQ(propagation_cache_stats().size, 2);
  set_propagation_cache_capacity(8192);
}

}  // namespace
}  // namespace dtensor::sharding
