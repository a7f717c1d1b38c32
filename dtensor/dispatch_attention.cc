// NOTE [ring attention in the engine]: scaled_dot_product_attention on distributed q, k, v
// sharded along the sequence runs as ring attention (ring_attention.h), so a C++ program gets
// context parallelism from a plain at::scaled_dot_product_attention call, with no Python. Two
// entries: SDPA's kernel at the autograd key (ring_sdpa: q/k/v of any rank >= 2, a value head
// size unlike the query's, GQA, any device: off the CPU the blocks are explicit fp32), and ATen's
// fused CPU attention op and its backward (run_ring_attention: what SDPA runs where the autograd
// key is skipped, under inference mode, or a direct call of the op). Both take:
// * q, k, v ([..., h, s, d]) on one mesh with the same placements: Shard(s) on exactly one mesh
//   dim m, and on every other mesh dim Replicate or a Shard of the heads or of a batch dim; those
//   only pick which rows and heads a rank holds, the same on every rank of one ring (the ranks
//   differing only along m). With GQA and the heads cut into pieces, the k/v heads divide by the
//   number of pieces, so every q head finds its k/v head on the same rank;
// * no attn_mask and no dropout (the table's rule and SDPA's math path compute those).
// The pieces are natural order (Shard's chunks), so a causal mask leaves the last rank the most
// work; Python's context_parallel shards head-tail for balance. The output (and logsumexp) take
// q's placements, dq/dk/dv their inputs'; a gradient of the output in another layout is moved to
// q's first. The ring's collectives count under the op's name. k/v move by one all_gather or by
// W-1 rotations (rotate_method(); PyTorch's default "allgather": the cost model prices one
// gather below W-1 rotations of the same bytes, and the rotation keeps memory per rank O(S/W)).
// The query never moves and a causal block nobody sees is skipped, where the fused op's rule
// (nn_ops.cc) would gather q for a causal mask. Any other layout runs as before.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/stable_hash.h"
#include "collectives/functional.h"
#include "dtensor/autograd.h"
#include "dtensor/dispatch.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/program_digest.h"
#include "dtensor/redistribute.h"
#include "dtensor/ring_attention.h"

namespace dtensor {

RingLayout ring_attention_mesh_dim(const DTensorSpec& q, const DTensorSpec& k,
                                   const DTensorSpec& v) {
  const int64_t n = q.ndim();
  if (n < 2) return {};
  int64_t seq = -1, seq_dims = 0, head_pieces = 1;
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    if (q.placement(m).is_shard(n - 2)) {
      seq = m;
      ++seq_dims;
    }
  }
  if (seq_dims == 0) return {};
  auto refuse = [](std::string why) { return RingLayout{-1, std::move(why)}; };
  if (k.ndim() != n || v.ndim() != n) return refuse("q, k, v have different numbers of dims");
  if (q.mesh() != k.mesh() || q.mesh() != v.mesh())
    return refuse("q, k, v are on different meshes");
  if (q.placements() != k.placements() || q.placements() != v.placements()) {
    return refuse("q, k, v are placed differently");
  }
  if (seq_dims > 1)
    return refuse("the sequence is sharded on " + std::to_string(seq_dims) + " mesh dims");
  if (!q.has_default_shard_order() || !k.has_default_shard_order() ||
      !v.has_default_shard_order()) {
    return refuse("a tensor dim is sharded by several mesh dims in a non-default order");
  }
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    const Placement p = q.placement(m);
    if (m == seq || p.is_replicate() || (p.is_shard() && p.dim() < n - 3)) continue;
    if (!p.is_shard(n - 3))
      return refuse("mesh dim " + std::to_string(m) + " is placed " + p.to_string());
    head_pieces *= q.mesh().size(m);
  }
  if (head_pieces > 1 && q.shape()[n - 3] != k.shape()[n - 3] &&
      k.shape()[n - 3] % head_pieces != 0) {
    return refuse("GQA with the heads cut in " + std::to_string(head_pieces) +
                  " pieces needs k/v heads divisible by " + std::to_string(head_pieces));
  }
  return {seq, ""};
}

}  // namespace dtensor

namespace dtensor::dispatch_detail {
namespace {

// The ring over mesh dim m for q/k/v of these specs (natural order: Shard's chunks).
attention::RingPlan plan_for(const DTensorSpec& q, const DTensorSpec& k, int64_t m, bool causal,
                             std::optional<double> scale) {
  const DeviceMesh& mesh = q.mesh();
  const int64_t n = q.ndim();
  attention::RingPlan plan;
  plan.group = group_over_dims(mesh, {m}, &plan.rank);
  plan.q = attention::SeqLayout::natural(q.shape()[n - 2], mesh.size(m));
  plan.kv = attention::SeqLayout::natural(k.shape()[n - 2], mesh.size(m));
  plan.causal = causal;
  plan.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.shape()[n - 1]));
  plan.method = attention::rotate_method();
  return plan;
}

// NOTE [program digest]: the ring's collectives carry the mesh's program state, as a
// redistribute's do, so ranks whose programs differ (one called attention with another causal
// flag or scale: the ring's messages would pair all the same) fail at the ring's first
// collective instead of mixing blocks. The SDPA entry records its call here (the fused op's
// entry is recorded by the dispatcher with its arguments).
void record_ring_call(const DeviceMesh& mesh, const char* what, const attention::RingPlan& plan) {
  if (!program_check_enabled() || mesh.size() <= 1) return;
  uint64_t h = fnv1a(what);
  h = fnv1a_int(plan.causal ? 1 : 0, h);
  h = fnv1a(&plan.scale, sizeof plan.scale, h);
  h = fnv1a_int(static_cast<int64_t>(plan.method), h);
  record_program_op(mesh, kOpRan, h);
}

collectives::ProgramScope program_scope_of(const DeviceMesh& mesh) {
  const ProgramState state = program_state(mesh);
  return collectives::ProgramScope(state.ops, state.digest);
}

const Input* input_at(const Inputs& inputs, int arg) {
  for (const Input& in : inputs) {
    if (in.arg == arg && in.element < 0) return &in;
  }
  return nullptr;
}

// `in`'s piece in the placements `like` has, on its own shape and dtype (grad_out of another
// layout than q's, say).
at::Tensor piece_placed_as(const std::string& op, const Input& in, const DTensorSpec& like) {
  if (in.spec.placements() == like.placements() && in.spec.mesh() == like.mesh()) return in.local;
  const DTensorSpec target = DTensorSpec::make(like.mesh(), like.placements(), in.spec.meta());
  collectives::CommCause cause(op.c_str());
  return redistribute_local(in.local, in.spec, target);
}

}  // namespace

bool run_ring_attention(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                        c10::IValue* args, size_t n, const Inputs& inputs) {
  // forward  (q, k, v, dropout_p, is_causal, *, attn_mask, scale) -> (out, logsumexp)
  // backward (grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
  //          -> (dq, dk, dv)
  const bool backward = info.execution == sharding::Execution::kRingAttentionBackward;
  const int q_arg = backward ? 1 : 0, dropout_arg = backward ? 6 : 3;
  const c10::IValue& mask = args[dropout_arg + 2];  // None, or (from autograd) undefined
  if (args[dropout_arg].toDouble() != 0 || (mask.isTensor() && mask.toTensor().defined())) {
    return false;
  }
  const Input *q = input_at(inputs, q_arg), *k = input_at(inputs, q_arg + 1),
              *v = input_at(inputs, q_arg + 2);
  if (q == nullptr || k == nullptr || v == nullptr) return false;
  const int64_t m = ring_attention_mesh_dim(q->spec, k->spec, v->spec).mesh_dim;
  if (m < 0) return false;

  const DeviceMesh& mesh = q->spec.mesh();
  const c10::IValue& scale = args[dropout_arg + 3];
  const attention::RingPlan plan =
      plan_for(q->spec, k->spec, m, args[dropout_arg + 1].toBool(),
               scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()));

  // The outputs' pieces and their global shapes with the placements they take (ATen has no
  // meta kernel for these ops): out [b, hq, s, e] and logsumexp [b, hq, s] as q; dq, dk, dv as
  // q, k, v. Row-major, as the ring returns them.
  std::vector<at::Tensor> locals;
  std::vector<std::pair<std::vector<int64_t>, const DTensorSpec*>> shapes;
  {
    collectives::CommCause cause(info.name.c_str());
    const collectives::ProgramScope program = program_scope_of(mesh);
    if (!backward) {
      auto [out, lse] = attention::ring_attention_forward(q->local, k->local, v->local, plan);
      locals = {out, lse};
      const std::vector<int64_t>& qs = q->spec.shape();
      shapes = {{{qs[0], qs[1], qs[2], v->spec.shape()[3]}, &q->spec},
                {{qs[0], qs[1], qs[2]}, &q->spec}};
    } else {
      const Input *g = input_at(inputs, 0), *out = input_at(inputs, 4), *lse = input_at(inputs, 5);
      DTENSOR_CHECK(g != nullptr && out != nullptr && lse != nullptr, info.name,
                    ": grad_out, out and logsumexp must be distributed tensors beside q, k, v");
      auto [dq, dk, dv] = attention::ring_attention_backward(
          piece_placed_as(info.name, *g, q->spec), q->local, k->local, v->local,
          piece_placed_as(info.name, *out, q->spec), piece_placed_as(info.name, *lse, q->spec),
          plan);
      locals = {dq, dk, dv};
      shapes = {
          {q->spec.shape(), &q->spec}, {k->spec.shape(), &k->spec}, {v->spec.shape(), &v->spec}};
    }
  }
  torch::jit::drop(*stack, n);
  for (size_t j = 0; j < locals.size(); ++j) {
    const auto& [shape, like] = shapes[j];
    const DTensorSpec spec = DTensorSpec::make(mesh, like->placements(),
                                               TensorMeta::make(shape, locals[j].scalar_type()));
    stack->push_back(wrap(info.name, locals[j].contiguous(), spec));
  }
  return true;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr char kSdpa[] = "aten::scaled_dot_product_attention";
constexpr char kSdpaBackward[] = "aten::scaled_dot_product_attention (ring backward)";

// What the SDPA-level ring keeps for its backward besides the pieces.
struct SavedRing : torch::CustomClassHolder {
  SavedRing(attention::RingPlan p, DTensorSpec q, DTensorSpec k, DTensorSpec v)
      : plan(std::move(p)), q(q), k(k), v(v) {}
  attention::RingPlan plan;
  DTensorSpec q, k, v;
};

// Ring attention on distributed q, k, v: the output is distributed as q, and the backward gives
// dq, dk, dv distributed as their inputs.
struct RingSdpaFn : torch::autograd::Function<RingSdpaFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t m, bool causal,
                            std::optional<double> scale) {
    const DTensorSpec &qs = spec_of(q), &ks = spec_of(k), &vs = spec_of(v);
    auto saved = c10::make_intrusive<SavedRing>(plan_for(qs, ks, m, causal, scale), qs, ks, vs);
    const at::Tensor ql = local_of(q), kl = local_of(k), vl = local_of(v);
    at::Tensor out, lse;
    {
      record_ring_call(qs.mesh(), kSdpa, saved->plan);
      collectives::CommCause cause(kSdpa);
      const collectives::ProgramScope program = program_scope_of(qs.mesh());
      std::tie(out, lse) = attention::ring_attention_forward(ql, kl, vl, saved->plan);
    }
    ctx->save_for_backward({ql, kl, vl, out, lse});
    ctx->saved_data["ring"] = at::IValue::make_capsule(saved);
    std::vector<int64_t> shape = qs.shape();
    shape.back() = vs.shape().back();
    const DTensorSpec spec =
        DTensorSpec::make(qs.mesh(), qs.placements(), TensorMeta::make(shape, out.scalar_type()));
    return make_dtensor(out, spec);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(6);
    const auto& saved = *static_cast<const SavedRing*>(ctx->saved_data["ring"].toCapsule().get());
    const variable_list pieces = ctx->get_saved_variables();
    const at::Tensor &ql = pieces[0], &kl = pieces[1], &vl = pieces[2];
    // The output's gradient in the output's placements (a Partial one reduced first).
    const at::Tensor g = local_of(autograd::relaid(grads[0], saved.q.placements()));
    at::Tensor dq, dk, dv;
    {
      record_ring_call(saved.q.mesh(), kSdpaBackward, saved.plan);
      collectives::CommCause cause(kSdpa);
      const collectives::ProgramScope program = program_scope_of(saved.q.mesh());
      std::tie(dq, dk, dv) =
          attention::ring_attention_backward(g, ql, kl, vl, pieces[3], pieces[4], saved.plan);
    }
    return {make_dtensor(in_spec_layout(dq, saved.q), saved.q),
            make_dtensor(in_spec_layout(dk, saved.k), saved.k),
            make_dtensor(in_spec_layout(dv, saved.v), saved.v),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

std::optional<at::Tensor> ring_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                    bool is_causal, std::optional<double> scale, bool enable_gqa) {
  if (!is_dtensor(q) || !is_dtensor(k) || !is_dtensor(v)) return std::nullopt;
  if ((attn_mask && attn_mask->defined()) || dropout_p != 0) return std::nullopt;
  const DTensorSpec &qs = spec_of(q), &ks = spec_of(k), &vs = spec_of(v);
  const int64_t m = ring_attention_mesh_dim(qs, ks, vs).mesh_dim;
  if (m < 0 || !holds_piece(qs.mesh())) return std::nullopt;
  // SDPA's own checks (its composite raises for the rest): one head size for q and k, k and v
  // alike but for v's head size, equal batch dims, and GQA's heads.
  const int64_t n = qs.ndim();
  const auto &qd = qs.shape(), &kd = ks.shape(), &vd = vs.shape();
  if (qd[n - 1] != kd[n - 1] || !std::equal(kd.begin(), kd.end() - 1, vd.begin())) {
    return std::nullopt;
  }
  if (n >= 3) {
    if (!std::equal(qd.begin(), qd.end() - 3, kd.begin())) return std::nullopt;
    if (qd[n - 3] != kd[n - 3] && (!enable_gqa || qd[n - 3] % kd[n - 3] != 0)) {
      return std::nullopt;
    }
  }
  return RingSdpaFn::apply(q, k, v, m, is_causal, scale);
}

}  // namespace dtensor::dispatch_detail
