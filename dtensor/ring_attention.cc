// Ring attention on local pieces (ring_attention.h). Each rank's q stays; its k/v move either by
// rotation around the ring (RotateMethod::kAllToAll) or by one all_gather (kAllGather). Every
// (q piece, k/v block) pair is one Block (ring_attention_blocks.h); the blocks' outputs
// merge through their log-sum-exp in the accumulation dtype (fp32, or the inputs' dtype when
// wider). Large all_to_all messages go per group of k/v heads (NOTE [ring attention memory]); the
// all_to_all backward overlaps the k/v rotation and the dk/dv accumulators' (NOTE [ring attention
// backward overlap]). The collectives carry no CommCause: the callers name their op.

#include "dtensor/ring_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "base/error.h"
#include "collectives/functional.h"
#include "dtensor/engine_activity.h"
#include "dtensor/ring_attention_blocks.h"
#include "layout/shard_layout.h"

namespace dtensor::attention {

using detail::acc_dtype;
using detail::add_rows;
using detail::Block;
using detail::block_backward;
using detail::block_forward;
using detail::blocks_of;
using detail::empty_attention;
using detail::merge;
using detail::pad_last;
using detail::Range;
using detail::rows_of;

SeqLayout SeqLayout::natural(int64_t seq_len, int64_t world) {
  DTENSOR_CHECK(seq_len >= 0 && world >= 1, "ring attention: no layout of a sequence of ", seq_len,
                " on ", world, " ranks");
  SeqLayout layout;
  layout.seq_len = seq_len;
  for (int64_t r = 0; r < world; ++r) {
    const ChunkSlice c = chunk_slice(seq_len, world, r);
    layout.segments.push_back({{c.offset, c.size}});
  }
  return layout;
}

SeqLayout SeqLayout::head_tail(int64_t seq_len, int64_t world) {
  DTENSOR_CHECK(seq_len >= 0 && world >= 1, "ring attention: no head-tail layout of a sequence of ",
                seq_len, " on ", world, " ranks");
  SeqLayout layout;
  layout.seq_len = seq_len;
  for (int64_t r = 0; r < world; ++r) {
    const ChunkSlice head = chunk_slice(seq_len, 2 * world, r);
    const ChunkSlice tail = chunk_slice(seq_len, 2 * world, 2 * world - 1 - r);
    layout.segments.push_back({{head.offset, head.size}, {tail.offset, tail.size}});
  }
  return layout;
}

int64_t SeqLayout::length(int64_t rank) const {
  DTENSOR_CHECK(rank >= 0 && rank < world(), "ring attention: rank ", rank, " outside a layout of ",
                world(), " ranks");
  int64_t n = 0;
  for (const auto& segment : segments[rank]) n += segment.second;
  return n;
}

namespace {

std::atomic<RotateMethod> g_rotate_method{RotateMethod::kAllGather};

// NOTE [ring attention memory]: the kAllToAll backward holds, per step, the block's k/v and the
// next one in flight (the inputs' dtype, 2x a local k each), the block's kernel gradients and
// its dk/dv accumulator arriving or leaving (the accumulation dtype; 2x each): about 8x a local k
// on top of out, dq and the final dk/dv, where one process at S/W holds out, dq, dk, dv and its
// kernel's buffers (about 5x). The forward's message (k/v, 2x) in flight with the block's kernel
// output adds as much. So a ring whose k/v and dk/dv messages together exceed kRingMessageBytes
// runs per group of k/v heads (the heads are independent), each group's messages at most that
// size or one head's: W-1 all_to_all_single forward and 2W-1 backward per group, and the peak
// per rank stays near one process's at S/W. Messages of 512 KiB keep the collectives' latency
// small beside their transfer. kAllGather holds every rank's k/v anyway and is not split.
constexpr int64_t kRingMessageBytes = int64_t{1} << 19;

// The k/v head ranges of the rings (NOTE [ring attention memory]), a message holding
// `head_bytes` per element of one head's piece; the same on every rank (the longest piece's).
std::vector<Range> head_groups(const RingPlan& plan, const at::Tensor& k4, int64_t head_bytes) {
  const int64_t hk = k4.size(1);
  if (plan.method != RotateMethod::kAllToAll || hk == 0) return {{0, hk}};
  int64_t longest = 0;
  for (int64_t j = 0; j < plan.kv.world(); ++j) longest = std::max(longest, plan.kv.length(j));
  const int64_t per_head = head_bytes * k4.size(0) * longest * k4.size(-1);
  const int64_t n =
      per_head == 0 ? hk : std::max<int64_t>(1, std::min(hk, kRingMessageBytes / per_head));
  std::vector<Range> out;
  for (int64_t a = 0; a < hk; a += n) out.push_back({a, std::min(a + n, hk)});
  return out;
}

// The shapes of rank j's k and v pieces (of one head group), and their numel together.
struct KvShapes {
  const RingPlan& plan;
  std::vector<int64_t> k, v;  // rank-free: the length (dim 2) filled per rank

  KvShapes(const RingPlan& p, const at::Tensor& k4, const at::Tensor& v4)
      : plan(p), k(k4.sizes().vec()), v(v4.sizes().vec()) {}
  std::array<std::vector<int64_t>, 2> of(int64_t j) const {
    std::array<std::vector<int64_t>, 2> s{k, v};
    s[0][2] = s[1][2] = plan.kv.length(j);
    return s;
  }
  int64_t numel(int64_t j) const {
    const auto s = of(j);
    return c10::multiply_integers(s[0]) + c10::multiply_integers(s[1]);
  }
};

// One new flat buffer of `dtype` holding `ts` and then `zeros` zeros.
at::Tensor pack(const std::vector<at::Tensor>& ts, at::ScalarType dtype, int64_t zeros = 0) {
  int64_t n = zeros;
  for (const at::Tensor& t : ts) n += t.numel();
  at::Tensor buf = at::empty({n}, ts[0].options().dtype(dtype));
  int64_t at = 0;
  for (const at::Tensor& t : ts) {
    buf.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
    at += t.numel();
  }
  buf.narrow(0, at, zeros).zero_();
  return buf;
}

std::array<at::Tensor, 2> unpack(const at::Tensor& flat,
                                 const std::array<std::vector<int64_t>, 2>& shapes) {
  const int64_t nk = c10::multiply_integers(shapes[0]);
  const int64_t nv = c10::multiply_integers(shapes[1]);
  return {flat.narrow(0, 0, nk).view(shapes[0]), flat.narrow(0, nk, nv).view(shapes[1])};
}

int64_t ring_mod(int64_t a, int64_t w) { return ((a % w) + w) % w; }

// Sends `flat` to rank+1 of the ring and receives `recv_numel` elements from rank-1: one
// all_to_all_single, returned unwaited (collectives::wait_tensor at first use).
at::Tensor rotate(const at::Tensor& flat, int64_t recv_numel, const RingPlan& plan) {
  const int64_t w = plan.q.world();
  std::vector<int64_t> send(w, 0), recv(w, 0);
  send[ring_mod(plan.rank + 1, w)] = flat.numel();
  recv[ring_mod(plan.rank - 1, w)] = recv_numel;
  return collectives::all_to_all_single(flat.contiguous(), recv, send, plan.group,
                                        /*async_op=*/true);
}

// Every rank's packed k/v by one all_gather_into_tensor of pieces padded to the longest; returns
// the gathered buffer and the padded size.
std::pair<at::Tensor, int64_t> gather_padded(const at::Tensor& k, const at::Tensor& v,
                                             const KvShapes& shapes, const RingPlan& plan) {
  int64_t pad = 0;
  for (int64_t j = 0; j < plan.kv.world(); ++j) pad = std::max(pad, shapes.numel(j));
  const at::Tensor mine = pack({k, v}, k.scalar_type(), pad - k.numel() - v.numel());
  return {collectives::all_gather_into_tensor(mine, 0, plan.group), pad};
}

using BlockFn =
    std::function<void(int64_t step, int64_t owner, const at::Tensor& k, const at::Tensor& v)>;

// The kAllToAll ring: calls fn(step, owner, k_j, v_j) for every rank j's k/v block, this rank's
// first, each step's rotation to rank+1 issued before fn and waited after it (the next block in
// flight while one is computed: two blocks live).
void ring(const RingPlan& plan, const at::Tensor& k, const at::Tensor& v, const BlockFn& fn) {
  const int64_t w = plan.q.world(), me = plan.rank;
  const KvShapes shapes(plan, k, v);
  at::Tensor flat;
  for (int64_t i = 0; i < w; ++i) {
    const int64_t owner = ring_mod(me - i, w);
    at::Tensor next;
    if (i < w - 1) {
      if (!flat.defined()) flat = pack({k, v}, k.scalar_type());
      next = rotate(flat, shapes.numel(ring_mod(owner - 1, w)), plan);
    }
    if (i == 0) {
      fn(i, owner, k, v);
    } else {
      const auto [bk, bv] = unpack(flat, shapes.of(owner));
      fn(i, owner, bk, bv);
    }
    if (next.defined()) flat = collectives::wait_tensor(next);
  }
}

// Calls fn for every rank's k/v block (4-D), this rank's first: gathered at once or rotated.
void kv_blocks(const RingPlan& plan, const at::Tensor& k, const at::Tensor& v, const BlockFn& fn) {
  if (plan.method == RotateMethod::kAllToAll) return ring(plan, k, v, fn);
  const int64_t w = plan.q.world(), me = plan.rank;
  const KvShapes shapes(plan, k, v);
  const auto [full, pad] = gather_padded(k, v, shapes, plan);
  fn(0, me, k, v);
  for (int64_t i = 1; i < w; ++i) {
    const int64_t j = ring_mod(me - i, w);
    const auto [bk, bv] = unpack(full.narrow(0, j * pad, shapes.numel(j)), shapes.of(j));
    fn(i, j, bk, bv);
  }
}

// A block's gradients of its k/v columns.
struct BlockGrads {
  Range cols;
  at::Tensor dk, dv;
};
using GradsFn = std::function<std::optional<BlockGrads>(int64_t owner, const at::Tensor& k,
                                                        const at::Tensor& v)>;

void add_block(const std::array<at::Tensor, 2>& acc, const std::optional<BlockGrads>& got) {
  if (!got) return;
  LocalKernelScope scope;
  rows_of(acc[0], got->cols).add_(got->dk);
  rows_of(acc[1], got->cols).add_(got->dv);
}

// The flat dk/dv accumulator of this rank's own block holding the block's gradients.
at::Tensor own_accumulator(const std::optional<BlockGrads>& got,
                           const std::array<std::vector<int64_t>, 2>& shapes, at::ScalarType dtype,
                           const at::TensorOptions& options) {
  if (got && got->cols.start == 0 && got->cols.stop == shapes[0][2]) {
    return pack({got->dk, got->dv}, dtype);
  }
  at::Tensor acc =
      at::zeros({c10::multiply_integers(shapes[0]) + c10::multiply_integers(shapes[1])},
                options.dtype(dtype));
  add_block(unpack(acc, shapes), got);
  return acc;
}

// NOTE [ring attention backward overlap]: the kAllToAll backward moves two things around the
// ring, as PyTorch's does: the k/v blocks, each step's rotation issued before the block's compute
// (W-1 all_to_all_single, the next block arriving while one is computed), and the dk/dv
// accumulators, one step behind: at step i rank r computes the gradients of block r-i, then takes
// the accumulator rank r-1 sent at the end of step i-1 (that same block's, arriving while rank r
// computed), adds them and sends it on to rank r+1 (W all_to_all_single; the first step's is the
// own block's, new; after the last, each accumulator has reached its owner). Each rank waits
// only for transfers issued a whole block's compute earlier, and the k/v travel in the inputs'
// dtype. The sums are exact: every block's gradients are added once, in ring order.
//
// Calls grads for every rank's k/v block and returns this rank's dk, dv (accumulation dtype)
// summed over every rank. kAllGather: k/v gathered once, every block's dk/dv reduce-scattered
// (sum) to its owner.
std::array<at::Tensor, 2> kv_grads(const RingPlan& plan, const at::Tensor& k, const at::Tensor& v,
                                   const GradsFn& grads) {
  const int64_t w = plan.q.world(), me = plan.rank;
  const KvShapes shapes(plan, k, v);
  const at::ScalarType dtype = acc_dtype(k.scalar_type());
  if (plan.method == RotateMethod::kAllGather) {
    at::Tensor buf;
    int64_t pad = 0;
    {
      const auto [full, padded] = gather_padded(k, v, shapes, plan);
      pad = padded;
      buf = at::zeros({w * pad}, k.options().dtype(dtype));
      for (int64_t j = 0; j < w; ++j) {
        const auto [bk, bv] = j == me
                                  ? std::array<at::Tensor, 2>{k, v}
                                  : unpack(full.narrow(0, j * pad, shapes.numel(j)), shapes.of(j));
        add_block(unpack(buf.narrow(0, j * pad, shapes.numel(j)), shapes.of(j)), grads(j, bk, bv));
      }
    }
    const at::Tensor mine = collectives::reduce_scatter_tensor(buf, ReduceOp::kSum, 0, plan.group);
    return unpack(mine.narrow(0, 0, shapes.numel(me)), shapes.of(me));
  }
  at::Tensor acc_in;
  ring(plan, k, v, [&](int64_t i, int64_t owner, const at::Tensor& bk, const at::Tensor& bv) {
    const std::optional<BlockGrads> got = grads(owner, bk, bv);
    at::Tensor acc;
    if (i == 0) {
      acc = own_accumulator(got, shapes.of(me), dtype, k.options());
    } else {
      acc = collectives::wait_tensor(acc_in);
      add_block(unpack(acc, shapes.of(owner)), got);
    }
    // Rank me+1 computes this block next; after the last step the accumulator this rank
    // receives is its own block's, from rank me-1, which computed that block last.
    acc_in = rotate(acc, shapes.numel(ring_mod(owner - 1, w)), plan);
  });
  return unpack(collectives::wait_tensor(acc_in), shapes.of(me));
}

std::string where(const RingPlan& plan) {
  return c10::str("ring attention on group '", plan.group, "' (rank ", plan.rank, ")");
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const RingPlan& plan) {
  DTENSOR_CHECK(plan.q.world() >= 1 && plan.q.world() == plan.kv.world(), where(plan),
                ": q and k/v layouts over ", plan.q.world(), " and ", plan.kv.world(), " ranks");
  DTENSOR_CHECK(plan.rank >= 0 && plan.rank < plan.q.world(), where(plan), ": rank outside ",
                plan.q.world(), " ranks");
  DTENSOR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, where(plan),
                ": q, k, v must be [B, H, L, E], got ", q.sizes(), ", ", k.sizes(), ", ",
                v.sizes());
  DTENSOR_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0 && q.size(0) == k.size(0) &&
                    q.size(3) == k.size(3) && k.sizes().slice(0, 3) == v.sizes().slice(0, 3),
                where(plan), ": q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
                " do not match (equal batch, q heads a multiple of k's, equal q/k head dims)");
  DTENSOR_CHECK(q.size(2) == plan.q.length(plan.rank) && k.size(2) == plan.kv.length(plan.rank),
                where(plan), ": local lengths q ", q.size(2), ", k/v ", k.size(2),
                " where the layouts give ", plan.q.length(plan.rank), " and ",
                plan.kv.length(plan.rank));
  DTENSOR_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                    q.device() == k.device() && q.device() == v.device(),
                where(plan), ": q, k, v differ in dtype or device (", q.scalar_type(), ", ",
                k.scalar_type(), ", ", v.scalar_type(), ")");
}

}  // namespace

RotateMethod rotate_method() { return g_rotate_method.load(std::memory_order_relaxed); }

void set_rotate_method(RotateMethod method) {
  g_rotate_method.store(method, std::memory_order_relaxed);
}

namespace {

std::tuple<at::Tensor, at::Tensor> forward_4d(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const RingPlan& plan) {
  check_inputs(q, k, v, plan);
  const int64_t dim = std::max(q.size(-1), v.size(-1));
  const at::Tensor q4 = pad_last(q, dim), k4 = pad_last(k, dim), v4 = pad_last(v, dim);
  std::vector<std::optional<Block>> blocks = blocks_of(plan);
  const int64_t groups = q4.size(1) / k4.size(1);
  const std::vector<Range> heads = head_groups(plan, k4, 2 * k4.element_size());
  at::Tensor out, lse;
  for (const Range& hs : heads) {
    const at::Tensor h_q = q4.narrow(1, hs.start * groups, hs.size() * groups);
    at::Tensor h_out, h_lse;
    auto compute = [&](int64_t, int64_t owner, const at::Tensor& bk, const at::Tensor& bv) {
      std::optional<Block>& blk = blocks[owner];
      if (!blk) return;
      LocalKernelScope scope;
      const auto [b_out, b_lse] = block_forward(rows_of(h_q, blk->rows), rows_of(bk, blk->cols),
                                                rows_of(bv, blk->cols), *blk, plan.scale);
      if (!h_out.defined() && blk->rows.size() < h_q.size(2)) {
        std::tie(h_out, h_lse) = empty_attention(h_q);
      }
      merge(h_out, h_lse, blk->rows, b_out, b_lse);
    };
    kv_blocks(plan, k4.narrow(1, hs.start, hs.size()), v4.narrow(1, hs.start, hs.size()), compute);
    if (!h_out.defined()) std::tie(h_out, h_lse) = empty_attention(h_q);  // nothing visible
    if (heads.size() == 1) {
      out = h_out;
      lse = h_lse;
      break;
    }
    if (!out.defined()) std::tie(out, lse) = empty_attention(q4);
    out.narrow(1, hs.start * groups, hs.size() * groups).copy_(h_out);
    lse.narrow(1, hs.start * groups, hs.size() * groups).copy_(h_lse);
  }
  out = out.to(q.scalar_type());
  return {out.size(-1) == v.size(-1) ? out : out.narrow(-1, 0, v.size(-1)), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_4d(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const RingPlan& plan) {
  check_inputs(q, k, v, plan);
  const std::vector<int64_t> out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  DTENSOR_CHECK(grad_out.sizes() == out_shape && out.sizes() == out_shape &&
                    lse.sizes() == at::IntArrayRef(out_shape).slice(0, 3),
                where(plan), ": backward needs grad_out and out ", at::IntArrayRef(out_shape),
                " and lse of its first 3 dims, got ", grad_out.sizes(), ", ", out.sizes(), ", ",
                lse.sizes());
  const int64_t dim = std::max(q.size(-1), v.size(-1));
  const at::Tensor q4 = pad_last(q, dim), k4 = pad_last(k, dim), v4 = pad_last(v, dim);
  const at::Tensor do4 = pad_last(grad_out.to(q.scalar_type()), dim);
  const at::Tensor out4 = pad_last(out.to(q.scalar_type()), dim);
  const at::Tensor lse_acc = lse.to(acc_dtype(q.scalar_type()));
  std::vector<std::optional<Block>> blocks = blocks_of(plan);
  const int64_t lq = q4.size(2), groups = q4.size(1) / k4.size(1);
  const at::ScalarType acc = acc_dtype(q.scalar_type());
  const std::vector<Range> heads = head_groups(plan, k4, 4 * c10::elementSize(acc));
  at::Tensor dq, dk, dv;
  for (const Range& hs : heads) {
    const int64_t q0 = hs.start * groups, nq = hs.size() * groups;
    const at::Tensor h_q = q4.narrow(1, q0, nq), h_do = do4.narrow(1, q0, nq);
    const at::Tensor h_out = out4.narrow(1, q0, nq), h_lse = lse_acc.narrow(1, q0, nq);
    at::Tensor h_dq;
    auto grads = [&](int64_t owner, const at::Tensor& bk,
                     const at::Tensor& bv) -> std::optional<BlockGrads> {
      std::optional<Block>& blk = blocks[owner];
      if (!blk) return std::nullopt;
      LocalKernelScope scope;
      const Range r = blk->rows, c = blk->cols;
      auto [b_dq, b_dk, b_dv] =
          block_backward(rows_of(h_do, r), rows_of(h_q, r), rows_of(bk, c), rows_of(bv, c),
                         rows_of(h_out, r), h_lse.narrow(-1, r.start, r.size()), *blk, plan.scale);
      add_rows(h_dq, r, b_dq, lq);
      return BlockGrads{c, b_dk, b_dv};
    };
    auto [h_dk, h_dv] =
        kv_grads(plan, k4.narrow(1, hs.start, hs.size()), v4.narrow(1, hs.start, hs.size()), grads);
    if (!h_dq.defined()) h_dq = at::zeros(h_q.sizes(), h_q.options().dtype(acc));
    if (heads.size() == 1) {
      dq = h_dq;
      dk = h_dk;
      dv = h_dv;
      break;
    }
    if (!dq.defined()) {
      dq = at::empty(q4.sizes(), q4.options().dtype(acc));
      dk = at::empty(k4.sizes(), k4.options().dtype(acc));
      dv = at::empty(v4.sizes(), v4.options().dtype(acc));
    }
    dq.narrow(1, q0, nq).copy_(h_dq);
    dk.narrow(1, hs.start, hs.size()).copy_(h_dk);
    dv.narrow(1, hs.start, hs.size()).copy_(h_dv);
  }
  return {dq.narrow(-1, 0, q.size(-1)).to(q.scalar_type()),
          dk.narrow(-1, 0, k.size(-1)).to(k.scalar_type()),
          dv.narrow(-1, 0, v.size(-1)).to(v.scalar_type())};
}

// [..., h, l, e] as the kernel's [b, h, l, e] (a view where strides allow).
at::Tensor as_4d(const at::Tensor& t) {
  if (t.dim() == 2) return t.unsqueeze(0).unsqueeze(0);
  if (t.dim() == 3) return t.unsqueeze(0);
  return t.dim() == 4 ? t : t.flatten(0, t.dim() - 4);
}

// `q`'s leading dims [..., h, l] followed by `last`.
std::vector<int64_t> rows_shape(const at::Tensor& q, std::optional<int64_t> last) {
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end() - 1);
  if (last) shape.push_back(*last);
  return shape;
}

void check_ranks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const RingPlan& plan) {
  DTENSOR_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), where(plan),
                ": q, k, v must be [..., H, L, E] of one rank >= 2, got ", q.sizes(), ", ",
                k.sizes(), ", ", v.sizes());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> ring_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v,
                                                          const RingPlan& plan) {
  check_ranks(q, k, v, plan);
  auto [out, lse] = forward_4d(as_4d(q), as_4d(k), as_4d(v), plan);
  return {out.reshape(rows_shape(q, v.size(-1))), lse.reshape(rows_shape(q, std::nullopt))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const RingPlan& plan) {
  check_ranks(q, k, v, plan);
  const at::Tensor q4 = as_4d(q);
  auto [dq, dk, dv] = backward_4d(as_4d(grad_out), q4, as_4d(k), as_4d(v), as_4d(out),
                                  lse.reshape({q4.size(0), q4.size(1), q4.size(2)}), plan);
  return {dq.reshape(q.sizes()), dk.reshape(k.sizes()), dv.reshape(v.sizes())};
}

}  // namespace dtensor::attention
