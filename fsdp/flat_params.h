#pragma once
// FSDP's communication runtime (python/dtensor/fsdp drives it; NOTE [fully_shard] there): the
// flat buffers of one parameter group, and the all-gather and reduce-scatter over them.
//
// NOTE [FSDP flat buffers]
// Layout (PyTorch FSDP2's): a parameter sharded on dim d over S ranks is cut into S pieces of
// c = ceil(size(d) / S) slices along d (torch.chunk's: the last pieces may be smaller or empty);
// each rank pads its piece to c slices, so every rank contributes the same number of elements,
// c * numel / size(d), per parameter (a replicated parameter, NOTE [size-1 dims under FSDP] in
// python/dtensor/fsdp/_fsdp_param.py, contributes all of it). A group's all-gather input is the
// concatenation of this rank's padded pieces (one copy per element, no torch.cat of padded
// pieces); its output, seen as (S, per_rank), holds rank r's pieces in row r, from which each
// parameter is rebuilt by one copy per rank's piece into the unsharded parameter's own storage.
// The reduce-scatter input is built the other way round from the unsharded gradients, and this
// rank's reduced row gives each parameter's gradient piece as a view.
//
// NOTE [FSDP runtime in C++]
// What runs per parameter on every step (copy-in, copy-out, the reduce-scatter input and the
// gradient pieces) runs here, one call per group and phase, with the GIL released; the Python
// side keeps the state machine and the hooks, as PyTorch's FSDP2 keeps them in Python over its
// C++ copy-in/copy-out ops (torch.ops.fsdp.all_gather_copy_in, split_with_sizes_copy,
// chunk_cat). The collectives are the engine's functional ones: asynchronous when asked, run on
// the group's worker thread (collectives/work.h) beside compute. FlatParams depends on global
// metadata only (shapes, shard dims, group size), so every rank computes the same offsets.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dtensor::fsdp {

// One parameter as FSDP shards it.
struct FlatParam {
  std::vector<int64_t> shape;  // unsharded (under FSDP over TP: the TP piece's)
  int64_t shard_dim = 0;       // normalized; ignored when replicated
  bool replicated = false;     // whole on every rank (a parameter with no dim larger than 1)
};

// The flat-buffer layout of some parameters of one group over a shard group of `shard_size`
// ranks (NOTE [FSDP flat buffers]).
class FlatParams {
 public:
  FlatParams(std::vector<FlatParam> params, int64_t shard_size);

  size_t size() const { return params_.size(); }
  int64_t shard_size() const { return shard_size_; }
  // Elements each rank contributes for parameter i (its padded piece), and for all of them.
  int64_t padded_numel(size_t i) const { return padded_[i]; }
  int64_t per_rank_numel() const { return per_rank_; }
  // Slices along the shard dim in every rank's padded piece of parameter i.
  int64_t chunk(size_t i) const { return chunk_[i]; }
  // Slices of parameter i that rank `r` holds (torch.chunk's: possibly fewer than chunk, or 0).
  int64_t local_slices(size_t i, int64_t r) const;

  // Writes this rank's pieces (each of its sharded local shape, any dtype) into `flat`
  // (per_rank_numel elements, contiguous): each flattened with the shard dim first, then zeros
  // for its padding.
  void copy_in(const std::vector<at::Tensor>& pieces, const at::Tensor& flat) const;
  // Rebuilds every parameter from `gathered` (shard_size * per_rank_numel elements, rank r's
  // pieces in row r) into `dsts` (each of its full shape; any strides).
  void copy_out(const at::Tensor& gathered, const std::vector<at::Tensor>& dsts) const;
  // Writes the full-shape gradients into `flat` (shard_size * per_rank_numel elements): row r
  // holds rank r's padded pieces (every row the whole gradient for a replicated parameter).
  void copy_reduce_scatter_input(const std::vector<at::Tensor>& grads,
                                 const at::Tensor& flat) const;
  // Rows [first_row, first_row + rows) of that layout, from full-shape tensors, into `flat`
  // (rows * per_rank_numel elements): all rows are the reduce-scatter input; some rows of the
  // unsharded parameters are the piece a group resharded to a smaller group keeps after
  // forward (NOTE [reshard after forward to a smaller group] in python/dtensor/fsdp).
  void copy_rows(const std::vector<at::Tensor>& fulls, const at::Tensor& flat, int64_t first_row,
                 int64_t rows, const char* what) const;
  // This rank's gradient pieces from its reduced row `reduced` (per_rank_numel elements): views
  // of it in each parameter's sharded local shape (contiguous copies when the shard dim is not
  // 0), for group rank `shard_rank`.
  std::vector<at::Tensor> pieces_of(const at::Tensor& reduced, int64_t shard_rank) const;

 private:
  std::vector<FlatParam> params_;
  int64_t shard_size_;
  std::vector<int64_t> chunk_, slice_numel_, padded_, offset_;
  int64_t per_rank_ = 0;
};

// Copy-in then one all-gather of `flat` (per_rank_numel elements, the compute dtype; a
// symmetric buffer where the backend has them) on `group`; returns the gathered flat tensor
// (valid after collectives::wait_tensor when async_op).
at::Tensor all_gather(const FlatParams& layout, const std::vector<at::Tensor>& pieces,
                      const at::Tensor& flat, const std::string& group, bool async_op);
// Copy-in then one reduce-scatter (sum) of `flat` (shard_size * per_rank_numel elements) on
// `group`; returns this rank's reduced row (per_rank_numel elements).
at::Tensor reduce_scatter(const FlatParams& layout, const std::vector<at::Tensor>& grads,
                          const at::Tensor& flat, const std::string& group, bool async_op);

}  // namespace dtensor::fsdp
