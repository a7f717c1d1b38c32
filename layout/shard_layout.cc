#include "layout/shard_layout.h"

#include <ATen/ceil_div.h>
#include <absl/strings/str_join.h>
#include "base/error.h"

#include <algorithm>
#include <stdexcept>

namespace dtensor {
namespace {

void check_coordinate(const DTensorSpec& spec, const std::vector<int64_t>& coordinate) {
  const auto& shape = spec.mesh().shape();
  bool ok = coordinate.size() == shape.size();
  for (size_t d = 0; ok && d < shape.size(); ++d) {
    ok = coordinate[d] >= 0 && coordinate[d] < shape[d];
  }
  if (!ok) {
    throw Error("coordinate (" + absl::StrJoin(coordinate, ",") + ") is outside mesh shape (" +
                absl::StrJoin(shape, ",") + ")");
  }
}

}  // namespace

int64_t chunk_size(int64_t n, int64_t k) {
  DTENSOR_CHECK(n >= 0 && k >= 1, "chunk of ", n, " elements into ", k,
                " pieces: need n >= 0 and k >= 1");
  return at::ceil_div(n, k);
}

ChunkSlice chunk_slice(int64_t n, int64_t k, int64_t i) {
  const int64_t chunk = chunk_size(n, k);
  const int64_t begin = std::min(i * chunk, n);
  const int64_t end = std::min(begin + chunk, n);
  return {begin, end - begin};
}

std::vector<int64_t> chunk_sizes(int64_t n, int64_t k) {
  std::vector<int64_t> sizes(k);
  for (int64_t i = 0; i < k; ++i) sizes[i] = chunk_slice(n, k, i).size;
  return sizes;
}

std::vector<ChunkSlice> strided_runs(int64_t n, int64_t split_factor, int64_t k, int64_t i) {
  std::vector<ChunkSlice> runs;
  for (int64_t j = 0; j < split_factor; ++j) {
    const ChunkSlice piece = chunk_slice(n, split_factor, j);
    const ChunkSlice mine = chunk_slice(piece.size, k, i);
    runs.push_back({piece.offset + mine.offset, mine.size});
  }
  return runs;
}

int64_t strided_size(int64_t n, int64_t split_factor, int64_t k, int64_t i) {
  int64_t size = 0;
  for (int64_t j = 0; j < split_factor; ++j) {
    size += chunk_slice(chunk_slice(n, split_factor, j).size, k, i).size;
  }
  return size;
}

int64_t LocalBox::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<ShardStep> shard_steps(const DTensorSpec& spec,
                                   const std::vector<int64_t>& coordinate) {
  check_coordinate(spec, coordinate);
  std::vector<ShardStep> steps;
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    int64_t piece = spec.shape()[d];
    for (int64_t m : spec.shard_order(d)) {
      ShardStep s;
      s.mesh_dim = m;
      s.tensor_dim = d;
      s.input_size = piece;
      s.num_chunks = spec.mesh().shape()[m];
      s.chunk = chunk_size(piece, s.num_chunks);
      s.index = coordinate[m];
      const Placement p = spec.placement(m);
      if (p.is_strided_shard()) {  // the only splitter of d (NOTE [strided shards])
        s.split_factor = p.split_factor();
        s.chunk = strided_size(piece, s.split_factor, s.num_chunks, 0);
        s.size = strided_size(piece, s.split_factor, s.num_chunks, s.index);
        s.offset = piece;
        for (const ChunkSlice& run : strided_runs(piece, s.split_factor, s.num_chunks, s.index)) {
          if (run.size > 0) {
            s.offset = run.offset;
            break;
          }
        }
        piece = s.size;
        steps.push_back(s);
        continue;
      }
      const ChunkSlice slice = chunk_slice(piece, s.num_chunks, s.index);
      s.offset = slice.offset;
      s.size = slice.size;
      piece = slice.size;
      steps.push_back(s);
    }
  }
  return steps;
}

LocalBox intersect(const LocalBox& a, const LocalBox& b) {
  LocalBox out{a.shape, a.offset};
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    out.offset[d] = lo;
    out.shape[d] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

LocalBox local_box(const DTensorSpec& spec, const std::vector<int64_t>& coordinate) {
  LocalBox box{spec.shape(), std::vector<int64_t>(spec.ndim(), 0)};
  for (const ShardStep& s : shard_steps(spec, coordinate)) {
    box.offset[s.tensor_dim] += s.offset;
    box.shape[s.tensor_dim] = s.size;
  }
  // An empty shard gets the out-of-bounds offset `size` (PyTorch does the same; checkpointing
  // de-duplicates shards by offset, so empty ones must not alias a real offset).
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    if (box.shape[d] == 0) box.offset[d] = spec.shape()[d];
  }
  return box;
}

std::vector<std::vector<ChunkSlice>> local_runs(const DTensorSpec& spec,
                                                const std::vector<int64_t>& coordinate) {
  const LocalBox box = local_box(spec, coordinate);
  std::vector<std::vector<ChunkSlice>> runs(spec.ndim());
  for (int64_t d = 0; d < spec.ndim(); ++d) runs[d] = {{box.offset[d], box.shape[d]}};
  if (!spec.has_strided_shard()) return runs;
  for (int64_t m = 0; m < spec.mesh().ndim(); ++m) {
    const Placement p = spec.placement(m);
    if (!p.is_strided_shard()) continue;
    runs[p.dim()] =
        strided_runs(spec.shape()[p.dim()], p.split_factor(), spec.mesh().size(m), coordinate[m]);
  }
  return runs;
}

std::optional<LocalBox> local_box_of_rank(const DTensorSpec& spec, int64_t rank) {
  auto coord = spec.mesh().coordinate(rank);
  if (!coord) return std::nullopt;
  return local_box(spec, *coord);
}

bool is_evenly_sharded(const DTensorSpec& spec) {
  // Evenness of a later step depends on the piece an earlier step left, which differs by rank:
  // check every combination of coordinates of the sharding mesh dims.
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    const auto& order = spec.shard_order(d);
    if (order.empty()) continue;
    int64_t piece = spec.shape()[d];
    for (int64_t m : order) {
      const int64_t k = spec.mesh().shape()[m];
      const int64_t sf = spec.placement(m).split_factor();
      for (int64_t j = 0; j < sf; ++j) {
        if (chunk_slice(piece, sf, j).size % k != 0) return false;
      }
      piece /= k;  // even pieces stay equal, so one path suffices
    }
  }
  return true;
}

std::vector<std::vector<int64_t>> owner_coordinates(const DTensorSpec& spec,
                                                    const std::vector<int64_t>& index) {
  if (static_cast<int64_t>(index.size()) != spec.ndim()) {
    throw Error("index (" + absl::StrJoin(index, ",") + ") has " + std::to_string(index.size()) +
                " entries for a " + std::to_string(spec.ndim()) + "-D tensor");
  }
  const auto& mesh_shape = spec.mesh().shape();
  // Coordinates allowed per mesh dim: one for Shard dims, all for the others.
  std::vector<std::vector<int64_t>> allowed(mesh_shape.size());
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    for (int64_t i = 0; i < mesh_shape[m]; ++i) allowed[m].push_back(i);
  }
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    if (index[d] < 0 || index[d] >= spec.shape()[d]) {
      throw Error("index (" + absl::StrJoin(index, ",") + ") is out of bounds for shape [" +
                  absl::StrJoin(spec.shape(), ",") + "]");
    }
    int64_t piece = spec.shape()[d];
    int64_t pos = index[d];  // position inside the current piece
    for (int64_t m : spec.shard_order(d)) {
      if (spec.placement(m).is_strided_shard()) {  // the only splitter of d: find the piece
        const int64_t sf = spec.placement(m).split_factor();
        const int64_t j = pos / chunk_size(piece, sf);
        const ChunkSlice p = chunk_slice(piece, sf, j);
        allowed[m] = {(pos - p.offset) / chunk_size(p.size, mesh_shape[m])};
        continue;
      }
      const int64_t chunk = chunk_size(piece, mesh_shape[m]);
      const int64_t i = pos / chunk;
      allowed[m] = {i};
      pos -= i * chunk;
      piece = chunk_slice(piece, mesh_shape[m], i).size;
    }
  }
  // Cartesian product, row-major.
  std::vector<std::vector<int64_t>> out = {{}};
  for (const auto& choices : allowed) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& prefix : out) {
      for (int64_t c : choices) {
        next.push_back(prefix);
        next.back().push_back(c);
      }
    }
    out = std::move(next);
  }
  return out;
}

std::vector<int64_t> owner_ranks(const DTensorSpec& spec, const std::vector<int64_t>& index) {
  std::vector<int64_t> ranks;
  for (const auto& c : owner_coordinates(spec, index)) ranks.push_back(spec.mesh().rank_at(c));
  return ranks;
}

}  // namespace dtensor
