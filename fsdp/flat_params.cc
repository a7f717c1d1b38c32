#include "fsdp/flat_params.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "base/error.h"
#include "collectives/functional.h"

namespace dtensor::fsdp {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// The shape with the shard dim first and `rows` slices there.
std::vector<int64_t> rows_first(const FlatParam& p, int64_t rows) {
  std::vector<int64_t> out{rows};
  for (size_t d = 0; d < p.shape.size(); ++d) {
    if (static_cast<int64_t>(d) != p.shard_dim) out.push_back(p.shape[d]);
  }
  return out;
}

void check_flat(const at::Tensor& flat, int64_t numel, const char* what) {
  if (!flat.is_contiguous() || flat.numel() != numel) {
    fail("fsdp ", what, ": the flat buffer must be contiguous with ", numel, " elements, got ",
         flat.sizes(), (flat.is_contiguous() ? "" : " (not contiguous)"));
  }
}

// A full-shape tensor of parameter `p` (`what`: "the unsharded parameter", "a full-shape tensor").
void check_full_shape(const at::Tensor& t, const FlatParam& p, const char* where,
                      const char* what) {
  if (t.sizes() != c10::IntArrayRef(p.shape)) {
    fail("fsdp ", where, ": ", what, " has shape ", t.sizes(), ", expected ",
         c10::IntArrayRef(p.shape));
  }
}

void check_count(const std::vector<at::Tensor>& ts, size_t n, const char* what) {
  if (ts.size() != n) fail("fsdp ", what, ": ", ts.size(), " tensors for ", n, " parameters");
}

}  // namespace

FlatParams::FlatParams(std::vector<FlatParam> params, int64_t shard_size)
    : params_(std::move(params)), shard_size_(shard_size) {
  if (shard_size < 1) fail("fsdp: shard group size ", shard_size);
  for (FlatParam& p : params_) {
    const int64_t numel = numel_of(p.shape);
    if (p.replicated) {
      chunk_.push_back(1);
      slice_numel_.push_back(numel);
      padded_.push_back(numel);
    } else {
      const int64_t n = static_cast<int64_t>(p.shape.size());
      if (p.shard_dim < -n || p.shard_dim >= n) {
        fail("fsdp: shard dim ", p.shard_dim, " out of range for shape ",
             c10::IntArrayRef(p.shape));
      }
      if (p.shard_dim < 0) p.shard_dim += n;
      const int64_t size = p.shape[p.shard_dim];
      const int64_t chunk = (size + shard_size - 1) / shard_size;
      const int64_t slice = size == 0 ? 0 : numel / size;
      chunk_.push_back(chunk);
      slice_numel_.push_back(slice);
      padded_.push_back(chunk * slice);
    }
    offset_.push_back(per_rank_);
    per_rank_ += padded_.back();
  }
}

int64_t FlatParams::local_slices(size_t i, int64_t r) const {
  if (params_[i].replicated) return 1;
  const int64_t size = params_[i].shape[params_[i].shard_dim];
  return std::max<int64_t>(0, std::min(chunk_[i], size - r * chunk_[i]));
}

void FlatParams::copy_in(const std::vector<at::Tensor>& pieces, const at::Tensor& flat) const {
  check_count(pieces, params_.size(), "all-gather copy-in");
  check_flat(flat, per_rank_, "all-gather copy-in");
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParam& p = params_[i];
    at::Tensor out = flat.narrow(0, offset_[i], padded_[i]);
    const at::Tensor& piece = pieces[i];
    const at::Tensor src = p.replicated ? piece.reshape({-1}) : piece.movedim(p.shard_dim, 0);
    const int64_t n = src.numel();
    if (n > padded_[i]) {
      fail("fsdp all-gather copy-in: a piece of shape ", piece.sizes(), " is larger than its ",
           padded_[i], "-element slot (parameter of shape ", c10::IntArrayRef(p.shape), ")");
    }
    out.narrow(0, 0, n).view(src.sizes()).copy_(src);
    if (n < padded_[i]) out.narrow(0, n, padded_[i] - n).zero_();
  }
}

void FlatParams::copy_out(const at::Tensor& gathered, const std::vector<at::Tensor>& dsts) const {
  check_count(dsts, params_.size(), "all-gather copy-out");
  check_flat(gathered, shard_size_ * per_rank_, "all-gather copy-out");
  const at::Tensor rows = gathered.view({shard_size_, per_rank_});
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParam& p = params_[i];
    const at::Tensor& dst = dsts[i];
    check_full_shape(dst, p, "all-gather copy-out", "the unsharded parameter");
    if (p.replicated) {  // every row holds the whole parameter
      dst.copy_(rows[0].narrow(0, offset_[i], padded_[i]).view(p.shape));
      continue;
    }
    const at::Tensor d = dst.movedim(p.shard_dim, 0);
    for (int64_t r = 0; r < shard_size_; ++r) {
      const int64_t k = local_slices(i, r);
      if (k == 0) continue;
      d.narrow(0, r * chunk_[i], k)
          .copy_(rows[r].narrow(0, offset_[i], k * slice_numel_[i]).view(rows_first(p, k)));
    }
  }
}

void FlatParams::copy_reduce_scatter_input(const std::vector<at::Tensor>& grads,
                                           const at::Tensor& flat) const {
  copy_rows(grads, flat, 0, shard_size_, "reduce-scatter copy-in");
}

void FlatParams::copy_rows(const std::vector<at::Tensor>& fulls, const at::Tensor& flat,
                           int64_t first_row, int64_t rows, const char* what) const {
  check_count(fulls, params_.size(), what);
  if (first_row < 0 || rows < 0 || first_row + rows > shard_size_) {
    fail("fsdp ", what, ": rows [", first_row, ", ", first_row + rows, ") out of ", shard_size_);
  }
  check_flat(flat, rows * per_rank_, what);
  const at::Tensor out = flat.view({rows, per_rank_});
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParam& p = params_[i];
    const at::Tensor& full = fulls[i];
    check_full_shape(full, p, what, "a full-shape tensor");
    const at::Tensor block = out.narrow(1, offset_[i], padded_[i]);
    if (p.replicated) {  // the whole tensor in every row (each rank gets the sum)
      block.copy_(full.reshape({1, -1}));
      continue;
    }
    std::vector<int64_t> pieces_shape = rows_first(p, chunk_[i]);
    pieces_shape.insert(pieces_shape.begin(), rows);
    const at::Tensor pieces = block.view(pieces_shape);  // block is contiguous per row
    const at::Tensor g = full.movedim(p.shard_dim, 0);
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t r = first_row + j;
      const int64_t k = local_slices(i, r);
      at::Tensor row = pieces[j];
      if (k > 0) row.narrow(0, 0, k).copy_(g.narrow(0, r * chunk_[i], k));
      if (k < chunk_[i]) row.narrow(0, k, chunk_[i] - k).zero_();
    }
  }
}

std::vector<at::Tensor> FlatParams::pieces_of(const at::Tensor& reduced, int64_t shard_rank) const {
  check_flat(reduced, per_rank_, "reduce-scatter result");
  std::vector<at::Tensor> out;
  out.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParam& p = params_[i];
    if (p.replicated) {
      out.push_back(reduced.narrow(0, offset_[i], padded_[i]).view(p.shape));
      continue;
    }
    const int64_t k = local_slices(i, shard_rank);
    at::Tensor piece = reduced.narrow(0, offset_[i], k * slice_numel_[i])
                           .view(rows_first(p, k))
                           .movedim(0, p.shard_dim);
    out.push_back(p.shard_dim == 0 ? piece : piece.contiguous());
  }
  return out;
}

at::Tensor all_gather(const FlatParams& layout, const std::vector<at::Tensor>& pieces,
                      const at::Tensor& flat, const std::string& group, bool async_op) {
  {
    at::NoGradGuard no_grad;
    layout.copy_in(pieces, flat);
  }
  return collectives::all_gather_into_tensor(flat, 0, group, async_op);
}

at::Tensor reduce_scatter(const FlatParams& layout, const std::vector<at::Tensor>& grads,
                          const at::Tensor& flat, const std::string& group, bool async_op) {
  {
    at::NoGradGuard no_grad;
    layout.copy_reduce_scatter_input(grads, flat);
  }
  return collectives::reduce_scatter_tensor(flat, ReduceOp::kSum, 0, group, async_op);
}

}  // namespace dtensor::fsdp
