// NOTE [ring attention in the engine]: ATen's fused CPU attention and its backward
// (_scaled_dot_product_flash_attention_for_cpu[_backward], what scaled_dot_product_attention
// runs on the CPU and its autograd calls) run as ring attention (ring_attention.h) when q, k
// and v are sharded along the sequence on exactly one mesh dim, so a C++ program gets context
// parallelism from a plain at::scaled_dot_product_attention call, with no Python:
// * q, k, v (4-D [b, h, s, d]) are on one mesh with the same placements: Shard(2) on one mesh
//   dim m, and on every other mesh dim Replicate or a Shard of the batch (0) or the heads (1);
//   those only pick which rows and heads a rank holds, the same on every rank of one ring (the
//   ranks differing only along m). With GQA and the heads cut into pieces, the k/v heads divide
//   by the number of pieces, so every q head finds its k/v head on the same rank;
// * no attn_mask and no dropout (the rule below computes those);
// * the backward's grad_out, out and logsumexp take q's placements (moved there if they are not).
// The pieces are natural order (Shard's chunks), so a causal mask leaves the last rank the most
// work; Python's context_parallel shards head-tail for balance. Outputs: out and logsumexp in
// q's placements, dq/dk/dv in their inputs'. The ring's collectives count under the op's name.
// k/v move by one all_gather or by W-1 rotations (rotate_method(), PyTorch's default
// "allgather": the cost model prices one gather below W-1 rotations of the same bytes; the
// rotation keeps memory per rank O(S/W)). The query never moves and a causal block nobody sees
// is skipped, where the table's rule (nn_ops.cc) would gather q for a causal mask. Any other
// layout runs by that rule.

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "collectives/functional.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/redistribute.h"
#include "dtensor/ring_attention.h"

namespace dtensor::dispatch_detail {
namespace {

// The mesh dim whose groups run ring attention on q, k, v of these specs, or -1 (the rule's).
int64_t ring_mesh_dim(const DTensorSpec& q, const DTensorSpec& k, const DTensorSpec& v) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) return -1;
  if (q.mesh() != k.mesh() || q.mesh() != v.mesh()) return -1;
  if (q.placements() != k.placements() || q.placements() != v.placements()) return -1;
  if (!q.has_default_shard_order() || !k.has_default_shard_order() ||
      !v.has_default_shard_order()) {
    return -1;
  }
  int64_t seq = -1, head_pieces = 1;
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    const Placement p = q.placement(m);
    if (p.is_shard(2)) {
      if (seq >= 0) return -1;  // the sequence cut on two mesh dims
      seq = m;
    } else if (p.is_shard(1)) {
      head_pieces *= q.mesh().size(m);
    } else if (!p.is_replicate() && !p.is_shard(0)) {
      return -1;  // Partial, or a cut head size
    }
  }
  if (seq >= 0 && head_pieces > 1 && q.shape()[1] != k.shape()[1] &&
      k.shape()[1] % head_pieces != 0) {
    return -1;
  }
  return seq;
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
  const c10::IValue& mask = args[dropout_arg + 2];  // autograd passes an undefined tensor
  if (args[dropout_arg].toDouble() != 0 || (mask.isTensor() && mask.toTensor().defined()) ||
      !(mask.isNone() || mask.isTensor())) {
    return false;
  }
  const Input *q = input_at(inputs, q_arg), *k = input_at(inputs, q_arg + 1),
              *v = input_at(inputs, q_arg + 2);
  if (q == nullptr || k == nullptr || v == nullptr) return false;
  const int64_t m = ring_mesh_dim(q->spec, k->spec, v->spec);
  if (m < 0) return false;

  const DeviceMesh& mesh = q->spec.mesh();
  attention::RingPlan plan;
  plan.group = group_over_dims(mesh, {m}, &plan.rank);
  plan.q = attention::SeqLayout::natural(q->spec.shape()[2], mesh.size(m));
  plan.kv = attention::SeqLayout::natural(k->spec.shape()[2], mesh.size(m));
  plan.causal = args[dropout_arg + 1].toBool();
  const c10::IValue& scale = args[dropout_arg + 3];
  plan.scale =
      scale.isNone() ? 1.0 / std::sqrt(static_cast<double>(q->spec.shape()[3])) : scale.toDouble();
  plan.method = attention::rotate_method();

  // The outputs' pieces and their global shapes with the placements they take (ATen has no
  // meta kernel for these ops): out [b, hq, s, e] and logsumexp [b, hq, s] as q; dq, dk, dv as
  // q, k, v. Row-major, as the ring returns them.
  std::vector<at::Tensor> locals;
  std::vector<std::pair<std::vector<int64_t>, const DTensorSpec*>> shapes;
  {
    collectives::CommCause cause(info.name.c_str());
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

}  // namespace dtensor::dispatch_detail
