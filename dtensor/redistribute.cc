#include "dtensor/redistribute.h"

#include <ATen/ATen.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/engine_activity.h"
#include "dtensor/local_tensor.h"
#include "dtensor/program_digest.h"
#include "layout/shard_layout.h"

namespace dtensor {
namespace {

namespace c = collectives;

struct Ctx {
  c::RankContext& ranks;
  int64_t rank;
  std::vector<int64_t> coord;
};

// This rank's group over mesh dims `dims` (ascending): the ranks sharing its coordinates on the
// other dims, in row-major order of `dims`. Registered (idempotently) in the context.
std::string group_over(Ctx& ctx, const DeviceMesh& mesh, const std::vector<int64_t>& dims,
                       int64_t* my_index = nullptr) {
  if (dims.size() == 1) {
    if (my_index != nullptr) *my_index = ctx.coord[dims[0]];
    return ctx.ranks.new_group(mesh.group_ranks(dims[0], ctx.rank));
  }
  std::vector<int64_t> ranks, coord = ctx.coord;
  for (int64_t m : dims) coord[m] = 0;
  for (;;) {
    if (coord == ctx.coord && my_index != nullptr) *my_index = static_cast<int64_t>(ranks.size());
    ranks.push_back(mesh.rank_at(coord));
    int64_t k = static_cast<int64_t>(dims.size()) - 1;
    for (; k >= 0; --k) {
      if (++coord[dims[k]] < mesh.shape()[dims[k]]) break;
      coord[dims[k]] = 0;
    }
    if (k < 0) break;
  }
  return ctx.ranks.new_group(ranks);
}

// The shard step of mesh dim m in `spec` for this rank.
ShardStep step_of(const DTensorSpec& spec, int64_t m, const std::vector<int64_t>& coord) {
  for (const ShardStep& s : shard_steps(spec, coord)) {
    if (s.mesh_dim == m) return s;
  }
  TORCH_INTERNAL_ASSERT(false, "redistribute: mesh dim ", m, " does not shard ", spec.to_string());
}

at::Tensor pad_dim(const at::Tensor& x, int64_t dim, int64_t size) {
  if (x.size(dim) == size) return x;
  // Zeros then a copy: works for zero-size inputs too, which torch 1.13's constant_pad_nd refused.
  std::vector<int64_t> shape = x.sizes().vec();
  shape[dim] = size;
  at::Tensor out = at::zeros(shape, x.options());
  out.narrow(dim, 0, x.size(dim)).copy_(x);
  return out;
}

at::Tensor fresh(const at::Tensor& x) { return x.clone(at::MemoryFormat::Contiguous); }

// Each rank's boxes go straight from views of its piece into views of the result (NOTE [boxed
// all_to_all]); its own box is copied directly.
at::Tensor all_to_all_v(Ctx& ctx, const PlanStep& s, const at::Tensor& x, bool async_op) {
  (void)async_op;  // the result is written by the exchange: always synchronous
  const DeviceMesh& mesh = s.before.mesh();
  int64_t me = 0;
  const std::string group = group_over(ctx, mesh, s.mesh_dims, &me);
  const auto& members = ctx.ranks.group(group).ranks;
  const int64_t n = static_cast<int64_t>(members.size());
  std::vector<LocalBox> before(n), after(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto coord = *mesh.coordinate(members[i]);
    before[i] = local_box(s.before, coord);
    after[i] = local_box(s.after, coord);
  }
  at::Tensor out = at::empty(after[me].shape, x.options());
  std::vector<std::vector<at::Tensor>> send(n), recv(n);
  for (int64_t p = 0; p < n; ++p) {
    const LocalBox sent = intersect(before[me], after[p]);
    const LocalBox got = intersect(before[p], after[me]);
    if (p == me) {
      if (got.numel() > 0) sub_box(out, after[me], got).copy_(sub_box(x, before[me], got));
      continue;
    }
    if (sent.numel() > 0) send[p].push_back(sub_box(x, before[me], sent));
    if (got.numel() > 0) recv[p].push_back(sub_box(out, after[me], got));
  }
  c::all_to_all_boxes(send, recv, out, group);
  return out;
}

// The rank's runs of dim `d` of `x` (which holds the whole dim), concatenated: R -> _S.
at::Tensor gather_runs(const at::Tensor& x, int64_t d, const std::vector<ChunkSlice>& runs) {
  std::vector<at::Tensor> parts;
  for (const ChunkSlice& r : runs) parts.push_back(x.narrow(d, r.offset, r.size));
  return at::cat(parts, d);
}

// _S -> R (NOTE [strided shards]): an all_gather of the ranks' pieces (rank i's runs, one after
// another), then a local reorder into piece order: run j of every rank, for each j.
at::Tensor gather_strided(Ctx& ctx, const PlanStep& s, const at::Tensor& x) {
  const int64_t m = s.mesh_dims.at(0), d = s.from.dim(), sf = s.from.split_factor();
  const int64_t n = s.before.mesh().shape()[m], size = s.before.shape()[d];
  const std::string group = group_over(ctx, s.before.mesh(), {m});
  std::vector<int64_t> sizes(n);
  std::vector<std::vector<ChunkSlice>> runs(n);
  for (int64_t i = 0; i < n; ++i) {
    runs[i] = strided_runs(size, sf, n, i);
    sizes[i] = strided_size(size, sf, n, i);
  }
  const bool equal =
      std::all_of(sizes.begin(), sizes.end(), [&](int64_t v) { return v == sizes[0]; });
  const at::Tensor in = x.contiguous();
  const at::Tensor got = equal ? c::all_gather_into_tensor(in, d, group, false)
                               : c::all_gather_uneven(in, d, sizes, group, false);
  std::vector<int64_t> start(n, 0);  // where rank i's piece begins in `got`
  for (int64_t i = 1; i < n; ++i) start[i] = start[i - 1] + sizes[i - 1];
  std::vector<at::Tensor> parts;
  for (int64_t j = 0; j < sf; ++j) {
    for (int64_t i = 0; i < n; ++i) {
      parts.push_back(got.narrow(d, start[i], runs[i][j].size));
      start[i] += runs[i][j].size;
    }
  }
  return at::cat(parts, d);
}

at::Tensor run_step(Ctx& ctx, const PlanStep& s, const at::Tensor& x, bool async_op) {
  const DeviceMesh& mesh = s.before.mesh();
  if (s.kind == CommKind::kAllToAllV) return all_to_all_v(ctx, s, x, async_op);
  const int64_t m = s.mesh_dims.at(0);
  const int64_t n = mesh.shape()[m], idx = ctx.coord[m];
  if (s.from.is_strided_shard()) return gather_strided(ctx, s, x);
  if (s.to.is_strided_shard()) {
    const int64_t d = s.to.dim();
    return gather_runs(x, d, strided_runs(x.size(d), s.to.split_factor(), n, idx));
  }
  switch (s.kind) {
    case CommKind::kLocalChunk: {
      const ShardStep st = step_of(s.after, m, ctx.coord);
      return fresh(x.narrow(st.tensor_dim, st.offset, st.size));
    }
    case CommKind::kPartition:
      return partial_share(x, s.to.reduce_op(), idx == 0);
    default:
      break;
  }
  const std::string group = group_over(ctx, mesh, {m});
  // A Partial(norm p) reduces as a sum of signed p-th powers, then the signed 1/p-th power
  // (NOTE [p-norm Partial]); synchronously, as the root reads the sum.
  const float p = s.from.norm_order();
  const ReduceOp op = p != 0 ? ReduceOp::kSum : s.from.reduce_op();
  const auto signed_pow = [](const at::Tensor& t, double e) { return t.sign() * t.abs().pow(e); };
  const at::Tensor in = p != 0 ? signed_pow(x, p).contiguous() : x.contiguous();
  const auto root = [&](const at::Tensor& sum) { return p != 0 ? signed_pow(sum, 1.0 / p) : sum; };
  if (p != 0) async_op = false;
  switch (s.kind) {
    case CommKind::kAllReduce:
      return root(c::all_reduce(in, op, group, async_op));
    case CommKind::kAllGather: {
      const ShardStep st = step_of(s.before, m, ctx.coord);
      if (st.even()) return c::all_gather_into_tensor(in, st.tensor_dim, group, async_op);
      return c::all_gather_uneven(in, st.tensor_dim, chunk_sizes(st.input_size, n), group,
                                  async_op);
    }
    case CommKind::kReduceScatter: {
      const ShardStep st = step_of(s.after, m, ctx.coord);
      const int64_t e = st.tensor_dim;
      if (st.even()) return root(c::reduce_scatter_tensor(in, op, e, group, async_op));
      const at::Tensor out = c::reduce_scatter_tensor(pad_dim(in, e, st.chunk * n), op, e, group);
      return root(fresh(out.narrow(e, 0, st.size)));
    }
    case CommKind::kAllToAll: {
      const ShardStep from = step_of(s.before, m, ctx.coord);
      const ShardStep to = step_of(s.after, m, ctx.coord);
      const int64_t d = from.tensor_dim, e = to.tensor_dim;
      if (from.even() && to.even()) return c::all_to_all(in, e, d, group, async_op);
      const at::Tensor padded = pad_dim(pad_dim(in, d, from.chunk), e, to.chunk * n);
      const at::Tensor got = c::all_to_all(padded.contiguous(), e, d, group);
      const auto sizes = chunk_sizes(from.input_size, n);
      std::vector<at::Tensor> pieces;
      for (int64_t i = 0; i < n; ++i) pieces.push_back(got.narrow(d, i * from.chunk, sizes[i]));
      return fresh(at::cat(pieces, d).narrow(e, 0, to.size));
    }
    default:
      break;
  }
  fail("redistribute: internal error: unexpected step ", s.to_string());
}

}  // namespace

bool holds_piece(const DeviceMesh& mesh) { return c::find_my_coordinate(mesh) != nullptr; }

at::Tensor absent_piece(const DTensorSpec& spec, const at::TensorOptions& options) {
  const at::TensorOptions o = options.dtype(spec.meta().dtype);
  return spec.ndim() == 0 ? at::zeros({}, o) : at::empty({0}, o);
}

std::string group_over_dims(const DeviceMesh& mesh, const std::vector<int64_t>& dims,
                            int64_t* my_index) {
  c::RankContext& ranks = c::current_context();
  Ctx ctx{ranks, ranks.rank(), c::my_coordinate(mesh, "redistribute")};
  return group_over(ctx, mesh, dims, my_index);
}

at::Tensor execute_plan(const RedistributePlan& plan, const at::Tensor& input, bool async_op) {
  const EngineScope engine;                        // NOTE [engine activity]
  const at::Tensor local = c::wait_tensor(input);  // a pending async result is waited first
  if (plan.is_noop()) return local;
  c::RankContext& ranks = c::current_context();
  const DeviceMesh& mesh = plan.src.mesh();
  if (!holds_piece(mesh))
    return absent_piece(plan.dst, local.options());  // NOTE [ranks outside the mesh]
  const ProgramState program = program_state(mesh);  // NOTE [program digest]
  const c::ProgramScope program_scope(program.ops, program.digest);
  const std::vector<int64_t> coord = c::my_coordinate(mesh, "redistribute");
  const LocalBox box = local_box(plan.src, coord);
  if (local.sizes().vec() != box.shape || local.scalar_type() != plan.src.meta().dtype) {
    throw Error("redistribute " + plan.to_string() + ": rank " + std::to_string(ranks.rank()) +
                " holds a local tensor " + std::string(c10::toString(local.scalar_type())) +
                c10::str(local.sizes()) + " but the source layout gives it " +
                std::string(c10::toString(plan.src.meta().dtype)) + "[" +
                absl::StrJoin(box.shape, ", ") + "]");
  }
  Ctx ctx{ranks, ranks.rank(), coord};
  at::Tensor x = local;
  try {
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      x = run_step(ctx, plan.steps[i], x, async_op && i + 1 == plan.steps.size());
    }
  } catch (const c::CallMismatch&) {
    reset_program_state(mesh);  // every rank raises here: the check starts over in step
    throw;
  }
  // NOTE [pieces in the spec's layout]; an async result is left as its collective writes it
  // (laying it out would wait for it).
  return async_op || plan.steps.empty() ? x : in_spec_layout(x, plan.dst);
}

at::Tensor in_spec_layout(const at::Tensor& piece, const DTensorSpec& spec) {
  if (piece.numel() <= 1) return piece;
  const std::vector<int64_t> want = at::infer_dense_strides(piece.sizes(), spec.meta().stride);
  for (int64_t d = 0; d < piece.dim(); ++d) {
    if (piece.size(d) > 1 && piece.stride(d) != want[d]) {
      return at::empty_strided(piece.sizes(), want, piece.options()).copy_(piece);
    }
  }
  return piece;
}

at::Tensor execute_cross_mesh(const CrossMeshPlan& plan, const at::Tensor& local, bool async_op,
                              const std::string& tag) {
  c::RankContext& ranks = c::current_context();
  const int64_t me = ranks.rank();
  const bool in_src = holds_piece(plan.src.mesh()), in_dst = holds_piece(plan.dst.mesh());
  const at::TensorOptions options = local.options().dtype(plan.dst.meta().dtype);
  if (!in_src && !in_dst) return absent_piece(plan.dst, options);
  at::Tensor piece = local;
  std::optional<LocalBox> have, want;
  if (in_src) {
    if (plan.src_reduced != plan.src) piece = redistribute_local(piece, plan.src, plan.src_reduced);
    have = local_box_of_rank(plan.src_reduced, me);
    DTENSOR_CHECK(piece.sizes().vec() == have->shape, "redistribute to another mesh: rank ", me,
                  "'s piece of ", plan.src.to_string(), " has shape ", c10::str(piece.sizes()),
                  ", not its box's ", c10::str(c10::IntArrayRef(have->shape)));
  }
  if (in_dst) want = local_box_of_rank(plan.dst, me);
  at::Tensor out = in_dst ? at::empty(want->shape, options) : absent_piece(plan.dst, options);
  for (const CrossMeshPlan::Move& m : plan.moves) {
    if (m.from == me && m.to == me) sub_box(out, *want, m.box).copy_(sub_box(piece, *have, m.box));
  }
  if (plan.max_bytes == 0) return out;  // nobody sends: every rank computed the same plan
  const std::string group = ranks.new_group(plan.ranks, tag);
  const std::vector<int64_t>& members = plan.ranks;
  const auto index_of = [&](int64_t rank) {
    return std::lower_bound(members.begin(), members.end(), rank) - members.begin();
  };
  // This rank's boxes per peer, as views of its piece and of its result: the exchange copies
  // each straight into its transport and out of it (NOTE [boxed all_to_all]). Both sides list a
  // pair's boxes in the plan's order.
  std::vector<std::vector<at::Tensor>> send(members.size()), recv(members.size());
  bool receives = false;
  for (const CrossMeshPlan::Move& m : plan.moves) {
    if (m.from == m.to || m.box.numel() == 0) continue;  // self moves were copied above
    if (m.from == me) send[index_of(m.to)].push_back(sub_box(piece, *have, m.box));
    if (m.to == me) {
      recv[index_of(m.from)].push_back(sub_box(out, *want, m.box));
      receives = true;
    }
  }
  // A rank that receives nothing and holds no piece of the result need not wait: its result is
  // the absent piece, pending until its sends are done (a pipeline stage sending on).
  const bool send_async = async_op && !receives && !in_dst && plan.dst.ndim() > 0;
  return c::all_to_all_boxes(send, recv, out, group, send_async, "redistribute");
}

at::Tensor redistribute_across_meshes(const at::Tensor& local, const DTensorSpec& src,
                                      const DTensorSpec& dst, bool async_op,
                                      const std::string& tag) {
  if (!src.has_strided_shard() && !dst.has_strided_shard()) {
    return execute_cross_mesh(*plan_cross_mesh(src, dst), local, async_op, tag);
  }
  // Through box layouts (NOTE [strided shards]): _S -> R on the source mesh, the boxes across,
  // R -> _S on the destination mesh. Each mesh's step runs on its ranks only.
  const DTensorSpec from = without_strided(src), to = without_strided(dst);
  const at::Tensor boxed = execute_plan(*plan_redistribute(src, from), local);
  const at::Tensor moved = execute_cross_mesh(*plan_cross_mesh(from, to), boxed, false, tag);
  return execute_plan(*plan_redistribute(to, dst), moved, async_op);
}

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src,
                              const DTensorSpec& dst, bool async_op, PlanOptions options) {
  if (src.mesh() != dst.mesh()) {  // NOTE [cross-mesh redistribute]
    return redistribute_across_meshes(local, src, dst, async_op);
  }
  return execute_plan(*plan_redistribute(src, dst, options), local, async_op);
}

}  // namespace dtensor
