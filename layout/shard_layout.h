#pragma once
// Shard arithmetic: which slice of the global tensor each rank holds.
//
// NOTE [uneven shards]
// Shard(d) over a mesh dim of size k follows torch.chunk: chunk = ceil(n / k), rank i holds
// [min(i*chunk, n), min((i+1)*chunk, n)), so trailing ranks may be short or empty
// (13/4 -> 4,4,4,1; 5/4 -> 2,2,1,0; 1/4 -> 1,0,0,0). When several mesh dims shard one tensor
// dim, they split it one after another in the spec's shard order (default: ascending mesh dims),
// each splitting the piece the previous one left. Collectives need equal-sized buffers, so a
// step over an uneven split pads every rank's piece to `chunk` (ShardStep::pad) and the receiver
// trims it again. A general strided shard (NOTE [strided shards] in dtensor_spec.h) follows
// torch.chunk twice: the dim is cut into split_factor pieces, each piece over the mesh dim's
// ranks (13 rows, sf 2, 2 ranks: pieces 7 and 6, rank 0 holds 4 + 3 rows, rank 1 3 + 3), so
// its ranks' sizes differ when a piece does not divide. Every function here derives from
// chunk_slice(); nothing else in the engine computes offsets or sizes of shards.

#include <cstdint>
#include <optional>
#include <vector>

#include "layout/dtensor_spec.h"

namespace dtensor {

// ceil(n / k) for n >= 0, k >= 1.
int64_t chunk_size(int64_t n, int64_t k);

struct ChunkSlice {
  int64_t offset = 0;
  int64_t size = 0;
  friend bool operator==(const ChunkSlice& a, const ChunkSlice& b) {
    return a.offset == b.offset && a.size == b.size;
  }
};
// Piece `i` of `n` elements split `k` ways with torch.chunk semantics (empty past the end).
ChunkSlice chunk_slice(int64_t n, int64_t k, int64_t i);
// Sizes of all k pieces: chunk_sizes(13, 4) == {4, 4, 4, 1}.
std::vector<int64_t> chunk_sizes(int64_t n, int64_t k);

// The runs of a dim of `n` elements that rank `i` of `k` holds under a strided shard of
// `split_factor` pieces: run j is chunk i of piece j, in piece order (empty runs included), as
// global offsets within the dim.
std::vector<ChunkSlice> strided_runs(int64_t n, int64_t split_factor, int64_t k, int64_t i);
// The sum of their sizes: that rank's local size.
int64_t strided_size(int64_t n, int64_t split_factor, int64_t k, int64_t i);

// One mesh dim splitting one tensor dim, as one rank sees it. For a strided shard
// (split_factor > 1) offset is the first element the rank holds (PyTorch's offset), size its
// local size, and chunk rank 0's (the largest); its runs come from strided_runs().
struct ShardStep {
  int64_t mesh_dim = 0;
  int64_t tensor_dim = 0;
  int64_t input_size = 0;    // size of the piece this step splits
  int64_t num_chunks = 1;    // size of the mesh dim
  int64_t chunk = 0;         // ceil(input_size / num_chunks): every rank's padded size
  int64_t index = 0;         // this rank's coordinate along mesh_dim
  int64_t offset = 0;        // offset of this rank's chunk inside the piece
  int64_t size = 0;          // this rank's size after the step
  int64_t split_factor = 1;  // a general strided shard's (NOTE [strided shards])

  int64_t pad() const { return chunk - size; }
  // True when every rank of the mesh dim gets the same size (no padding anywhere).
  bool even() const { return input_size % (num_chunks * split_factor) == 0; }
};

// The local box of one rank: its local shape and the global offset of its first element.
struct LocalBox {
  std::vector<int64_t> shape;
  std::vector<int64_t> offset;
  int64_t numel() const;
  friend bool operator==(const LocalBox& a, const LocalBox& b) {
    return a.shape == b.shape && a.offset == b.offset;
  }
};

// The elements `a` and `b` share (a zero size along a dim where they do not meet).
LocalBox intersect(const LocalBox& a, const LocalBox& b);

// The shard steps of the rank at `coordinate`, grouped by tensor dim (ascending) and in split
// order within a tensor dim. throws dtensor::Error when the coordinate is outside the mesh.
std::vector<ShardStep> shard_steps(const DTensorSpec& spec, const std::vector<int64_t>& coordinate);

// Local shape and global offset of the rank at `coordinate` (PyTorch's
// compute_local_shape_and_global_offset). Replicate and Partial dims keep the full size. An
// empty shard's offset along its dim is the dim's size, as in PyTorch. Under a general strided
// shard (spec.has_strided_shard()) the shape is exact but the piece is not this box: the offset
// is the first element held, as PyTorch's; local_runs() gives the elements.
LocalBox local_box(const DTensorSpec& spec, const std::vector<int64_t>& coordinate);
// The same for a global rank; nullopt when the rank is not in the spec's mesh (it holds nothing).
std::optional<LocalBox> local_box_of_rank(const DTensorSpec& spec, int64_t rank);

// Per tensor dim, the global runs the rank at `coordinate` holds, in the order its piece stores
// them: the box's one run per dim, or a strided shard's runs (strided_runs) along its dim.
std::vector<std::vector<ChunkSlice>> local_runs(const DTensorSpec& spec,
                                                const std::vector<int64_t>& coordinate);

// True when no shard step of any rank needs padding.
bool is_evenly_sharded(const DTensorSpec& spec);

// The inverse: the mesh coordinates / global ranks holding global element `index` (one entry
// per tensor dim). Shard mesh dims pin one coordinate each; Replicate and Partial mesh dims admit
// every coordinate, so the count is the product of the non-Shard mesh dim sizes. Ranks come in
// row-major coordinate order. throws dtensor::Error when `index` is out of bounds.
std::vector<std::vector<int64_t>> owner_coordinates(const DTensorSpec& spec,
                                                    const std::vector<int64_t>& index);
std::vector<int64_t> owner_ranks(const DTensorSpec& spec, const std::vector<int64_t>& index);

}  // namespace dtensor
