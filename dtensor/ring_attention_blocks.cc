// One (q piece, k/v block) pair of ring attention (ring_attention_blocks.h).

#include "dtensor/ring_attention_blocks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace dtensor::attention::detail {
namespace {

std::vector<int64_t> positions(const SeqLayout& layout, int64_t rank) {
  std::vector<int64_t> out;
  for (const auto& [offset, size] : layout.segments[rank]) {
    for (int64_t i = 0; i < size; ++i) out.push_back(offset + i);
  }
  return out;
}

// The block of `owner`'s k/v, or nullopt when no local query sees any of its keys. Every layout's
// positions increase along a piece (natural: one chunk; head-tail: chunk r, then chunk 2W-1-r),
// so the rows that see a key are a suffix of the piece and the keys seen a prefix, found by
// binary search (no Lq x Lk matrix). Every row of the box sees at least the box's first key, so
// no row of a block is fully masked. With q and k/v in the same layout the own block is exactly
// top-left causal and the others are unmasked; a mask arises only from different layouts.
std::optional<Block> block_of(const RingPlan& plan, int64_t owner) {
  const std::vector<int64_t> pq = positions(plan.q, plan.rank), pk = positions(plan.kv, owner);
  const auto lq = static_cast<int64_t>(pq.size()), lk = static_cast<int64_t>(pk.size());
  if (lq == 0 || lk == 0) return std::nullopt;
  if (!plan.causal) return Block{{0, lq}, {0, lk}};
  const int64_t r0 = std::lower_bound(pq.begin(), pq.end(), pk.front()) - pq.begin();
  const int64_t c1 = std::upper_bound(pk.begin(), pk.end(), pq.back()) - pk.begin();
  if (r0 == lq || c1 == 0) return std::nullopt;
  std::vector<int64_t> seen(lq - r0);  // the keys each row sees: a prefix of the box's columns
  bool all = true, causal = true;
  for (int64_t i = 0; i < lq - r0; ++i) {
    seen[i] = std::upper_bound(pk.begin(), pk.begin() + c1, pq[r0 + i]) - pk.begin();
    all = all && seen[i] == c1;
    causal = causal && seen[i] == std::min(i + 1, c1);
  }
  Block b{{r0, lq}, {0, c1}};
  if (!all && causal) b.causal = true;
  if (!all && !causal) {
    const at::Tensor counts = at::tensor(seen, at::kLong);
    b.mask = at::arange(c1, at::kLong).unsqueeze(0) < counts.unsqueeze(1);
  }
  return b;
}

std::pair<at::Tensor, int64_t> explicit_scores(const at::Tensor& q, const at::Tensor& k,
                                               const Block& blk, double scale) {
  const at::ScalarType acc = acc_dtype(q.scalar_type());
  const int64_t groups = q.size(-3) / k.size(-3);
  at::Tensor s = at::matmul(q.to(acc), k.to(acc).repeat_interleave(groups, -3).transpose(-1, -2));
  s = s * scale;
  at::Tensor mask = blk.mask;
  if (blk.causal) mask = at::ones({s.size(-2), s.size(-1)}, at::kBool).tril();
  if (mask.defined()) {
    s = s.masked_fill(mask.to(s.device()).logical_not(), -std::numeric_limits<double>::infinity());
  }
  return {s, groups};
}

std::tuple<at::Tensor, at::Tensor> explicit_forward(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const Block& blk,
                                                    double scale) {
  const auto [s, groups] = explicit_scores(q, k, blk, scale);
  at::Tensor lse = at::logsumexp(s, -1);
  const at::Tensor p = at::exp(s - lse.unsqueeze(-1));
  const at::Tensor ve = v.to(p.scalar_type()).repeat_interleave(groups, -3);
  return {at::matmul(p, ve).to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> explicit_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const Block& blk, double scale) {
  const auto [s, groups] = explicit_scores(q, k, blk, scale);
  const at::Tensor p = at::exp(s - lse.to(s.scalar_type()).unsqueeze(-1));
  const at::Tensor d = grad.to(p.scalar_type());
  const at::Tensor ve = v.to(p.scalar_type()).repeat_interleave(groups, -3);
  const at::Tensor ke = k.to(p.scalar_type()).repeat_interleave(groups, -3);
  const at::Tensor delta = (d * out.to(p.scalar_type())).sum(-1, true);
  const at::Tensor ds = p * (at::matmul(d, ve.transpose(-1, -2)) - delta);
  const at::Tensor dq = at::matmul(ds, ke) * scale;
  at::Tensor dk = at::matmul(ds.transpose(-1, -2), q.to(p.scalar_type())) * scale;
  at::Tensor dv = at::matmul(p.transpose(-1, -2), d);
  if (groups > 1) {  // the q heads of one k/v head are consecutive (repeat_interleave)
    dk = dk.unflatten(-3, {-1, groups}).sum(-3);
    dv = dv.unflatten(-3, {-1, groups}).sum(-3);
  }
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

}  // namespace

std::optional<at::Tensor> Block::kernel_mask(at::ScalarType dtype) {
  if (!mask.defined()) return std::nullopt;
  if (!additive.defined() || additive.scalar_type() != dtype) {
    additive = at::zeros(mask.sizes(), mask.options().dtype(dtype))
                   .masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return additive;
}

// Rows `r` of a [.., L, E] tensor (dim -2).
at::Tensor rows_of(const at::Tensor& t, Range r) { return t.narrow(-2, r.start, r.size()); }

at::ScalarType acc_dtype(at::ScalarType dtype) { return at::promote_types(dtype, at::kFloat); }

at::Tensor pad_last(const at::Tensor& t, int64_t size) {
  return t.size(-1) == size ? t : at::constant_pad_nd(t, {0, size - t.size(-1)});
}

std::vector<std::optional<Block>> blocks_of(const RingPlan& plan) {
  std::vector<std::optional<Block>> blocks;
  for (int64_t j = 0; j < plan.kv.world(); ++j) blocks.push_back(block_of(plan, j));
  return blocks;
}

// NOTE [ring attention blocks]: each block runs ATen's fused CPU flash-attention kernel in the
// inputs' dtype (no Lq x Lk tensor outside the kernel). Forward: the block's (out_b, lse_b) merge
// into the accumulated out/lse. Backward: the kernel's backward given the FINAL out and lse (the
// block's rows) returns the block's exact gradients, since it recomputes P = exp(S - lse), which
// is then the true probability, and delta = rowsum(dO * out) from the final output. The kernel
// takes fewer k/v heads (GQA) and returns dk/dv with those heads. It needs one head dim for q, k
// and v: the smaller of E and Ev is padded with zeros (the scale is given), which changes no
// value. Off the CPU a block is computed with explicit score matrices in the accumulation dtype
// (explicit_forward/explicit_backward).
std::tuple<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, Block& blk, double scale) {
  if (!q.device().is_cpu()) return explicit_forward(q, k, v, blk, scale);
  return at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, blk.causal,
                                                         blk.kernel_mask(q.scalar_type()), scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, Block& blk, double scale) {
  if (!q.device().is_cpu()) return explicit_backward(grad, q, k, v, out, lse, blk, scale);
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad, q, k, v, out, lse, 0.0, blk.causal, blk.kernel_mask(q.scalar_type()), scale);
}

// Out and lse of rows that see no key yet: zeros and -inf, in the accumulation dtype.
std::pair<at::Tensor, at::Tensor> empty_attention(const at::Tensor& q4) {
  const at::TensorOptions options = q4.options().dtype(acc_dtype(q4.scalar_type()));
  return {at::zeros(q4.sizes(), options),
          at::full(q4.sizes().slice(0, 3), -std::numeric_limits<double>::infinity(), options)};
}

// Merges a block's attention into `out`/`lse` (in place, rows `rows`); undefined `out`: the
// block is the first and covers every row.
void merge(at::Tensor& out, at::Tensor& lse, Range rows, const at::Tensor& b_out,
           const at::Tensor& b_lse) {
  if (!out.defined()) {
    out = b_out.to(acc_dtype(b_out.scalar_type()));
    lse = b_lse.to(out.scalar_type());
    return;
  }
  at::Tensor o = rows_of(out, rows), m = lse.narrow(-1, rows.start, rows.size());
  const at::Tensor fresh = at::logaddexp(m, b_lse);
  // Rows still at -inf on both sides stay 0 / -inf (exp(-inf - 0) = 0, no NaN).
  const at::Tensor ref = at::where(at::isfinite(fresh), fresh, at::zeros({}, fresh.options()));
  o.mul_(at::exp(m - ref).unsqueeze(-1));
  o.add_(b_out.to(o.scalar_type()) * at::exp(b_lse - ref).unsqueeze(-1));
  m.copy_(fresh);
}

// acc[.., rows, :] += grad (the accumulation dtype); undefined `acc` takes `grad` when it covers
// every row (`full`), else zeros first.
void add_rows(at::Tensor& acc, Range rows, const at::Tensor& grad, int64_t full) {
  if (!acc.defined()) {
    const at::ScalarType dtype = acc_dtype(grad.scalar_type());
    if (rows.start == 0 && rows.stop == full) {
      acc = grad.to(dtype);
      return;
    }
    std::vector<int64_t> shape = grad.sizes().vec();
    shape[shape.size() - 2] = full;
    acc = at::zeros(shape, grad.options().dtype(dtype));
  }
  rows_of(acc, rows).add_(grad);
}

}  // namespace dtensor::attention::detail
