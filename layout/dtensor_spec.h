#pragma once
// DTensorSpec: how one global tensor is laid out on a mesh: (mesh, placements, tensor meta,
// shard order). Immutable and interned, so equality is a pointer compare and the hash is computed
// once. See NOTE [spec interning].

#include <cstdint>
#include <string>
#include <vector>

#include "device_mesh/device_mesh.h"
#include "layout/placement.h"
#include "layout/tensor_meta.h"

namespace dtensor {

// For each tensor dim, the mesh dims that shard it, in the order they split it. The default is
// ascending mesh dims ("left to right": mesh dim 0 splits first, then each piece is split again),
// which is PyTorch's order for [S(0), S(0)]. A different order is PyTorch's _StridedShard /
// shard_order (e.g. FSDP over TP splits by the TP dim first).
using ShardOrder = std::vector<std::vector<int64_t>>;

// NOTE [strided shards]
// PyTorch's _StridedShard(d, split_factor=sf) on mesh dim m (Placement::strided_shard, "_S(d,sf)")
// means, applied as PyTorch applies placements (mesh dim 0 first, each splitting the piece the
// ones before it left): cut the piece's dim d into sf pieces (torch.chunk), cut each piece over
// m's ranks, and rank i holds chunk i of every piece, concatenated (8 rows, sf 2, 2 ranks: rank
// 0 holds rows [0,1,4,5], rank 1 [2,3,6,7]). DTensorSpec::make keeps two forms of it:
// - A box form: a strided shard whose split factor is the product of the sizes of the mesh dims
//   to its right that shard the same tensor dim (FSDP over TP: [_S(0,tp), S(0)] on (dp, tp))
//   gives every rank one contiguous chunk, split in another order than ascending: it becomes a
//   plain Shard plus the shard order (building each dim's order from the last mesh dim to the
//   first, a plain Shard goes in front and a strided one at the back). torch_placements() is the
//   inverse, the PyTorch form the Python API shows.
// - The general form, which no shard order expresses (1-D [_S(0,2)]: HF's packed_colwise fused
//   gate/up weights): it stays kStridedShard and must be the only mesh dim sharding its tensor
//   dim (shard_order(d) == {m}); other combinations throw, naming the placements and the mesh.
//   A rank's piece is then several runs of the dim (shard_layout.h: local_runs), not a box:
//   code that reads a piece as a box checks has_strided_shard() first. The redistribute planner
//   moves it only by _S -> R (all_gather and a local reorder) and R -> _S (a local gather of the
//   rank's runs); the propagator never hands it to a rule (its inputs are redistributed to a
//   layout the rule takes).

// NOTE [spec interning]
// Every DTensorSpec is canonicalised (negative shard dims normalised, shard order filled in) and
// stored once in a process-wide table; a DTensorSpec is a pointer to that entry. Two specs are
// equal iff their pointers are equal, and hash() is the entry's precomputed hash, so propagation
// and plan caches key on specs at the cost of an integer. The table never shrinks: the number of
// distinct layouts a program uses is bounded by its distinct (mesh, placements, shape, dtype)
// combinations, which PyTorch's own caches assume as well. The table is thread safe (the threads
// backend runs every rank in one process).
class DTensorSpec {
 public:
  // Validates, canonicalises (NOTE [strided shards]) and interns. throws dtensor::Error when a
  // placement count does not match the mesh, a shard dim is out of range, `shard_order` is not a
  // permutation of the mesh dims that shard each tensor dim (or disagrees with the order the
  // strided shards give), a general strided shard shares its tensor dim, or the meta is invalid.
  static DTensorSpec make(const DeviceMesh& mesh, const Placements& placements,
                          const TensorMeta& meta, const ShardOrder& shard_order = {});
  // Every mesh dim Replicate.
  static DTensorSpec replicated(const DeviceMesh& mesh, const TensorMeta& meta);

  const DeviceMesh& mesh() const { return data_->mesh; }
  const Placements& placements() const { return data_->placements; }
  const Placement& placement(int64_t mesh_dim) const { return data_->placements[mesh_dim]; }
  const TensorMeta& meta() const { return data_->meta; }
  const std::vector<int64_t>& shape() const { return data_->meta.shape; }
  int64_t ndim() const { return data_->meta.ndim(); }
  // Mesh dims sharding `tensor_dim`, in split order (empty when the dim is not sharded).
  const std::vector<int64_t>& shard_order(int64_t tensor_dim) const {
    return data_->shard_order[tensor_dim];
  }
  const ShardOrder& shard_order() const { return data_->shard_order; }
  bool has_default_shard_order() const { return data_->default_order; }

  // Number of pieces tensor dim `d` is cut into (product of the mesh dims sharding it).
  int64_t num_shards(int64_t tensor_dim) const;
  bool is_replicated() const;  // every placement is Replicate
  bool has_partial() const;
  bool is_sharded() const;  // some placement is Shard or _StridedShard
  // Some mesh dim holds a general strided shard (NOTE [strided shards]): a rank's piece is then
  // not a box of the global tensor.
  bool has_strided_shard() const { return data_->strided; }

  // Unique per interned spec within this process; not stable across processes.
  uint64_t id() const { return data_->id; }
  size_t hash() const { return data_->hash; }
  // "[S(0),S(1)] on (2,2) f32[10,7]" (+ " order{0:[1,0]}" for a non-default shard order).
  std::string to_string() const;

  friend bool operator==(DTensorSpec a, DTensorSpec b) { return a.data_ == b.data_; }
  friend bool operator!=(DTensorSpec a, DTensorSpec b) { return a.data_ != b.data_; }

  struct Data {
    DeviceMesh mesh;
    Placements placements;
    TensorMeta meta;
    ShardOrder shard_order;
    bool default_order = true;
    bool strided = false;
    size_t hash = 0;
    uint64_t id = 0;
  };

 private:
  explicit DTensorSpec(const Data* data) : data_(data) {}
  const Data* data_;
};

// The placements as PyTorch writes them (NOTE [strided shards]): a non-default shard order as
// _StridedShard placements, the inverse of DTensorSpec::make's canonicalisation. An order no
// PyTorch placements express (three or more mesh dims on one tensor dim, split neither
// outside-in nor inside-out) gets each later splitter as a strided shard whose split factor is
// the product of the sizes of the mesh dims before it in the order.
Placements torch_placements(const DTensorSpec& spec);

// Number of interned specs (for tests and cache statistics).
size_t interned_spec_count();

// `spec` with its Partial(op) placements read as Replicate: a gradient's layout (NOTE [DTensor
// autograd]), what a cross-mesh redistribute sends (NOTE [cross-mesh redistribute]).
DTensorSpec without_partial(const DTensorSpec& spec);
// `spec` with its general strided shards read as Replicate (a box layout: NOTE [strided shards]).
DTensorSpec without_strided(const DTensorSpec& spec);

}  // namespace dtensor

template <>
struct std::hash<dtensor::DTensorSpec> {
  size_t operator()(dtensor::DTensorSpec s) const { return s.hash(); }
};
