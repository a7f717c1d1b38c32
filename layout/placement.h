#pragma once
// Placement: how a tensor lives along one mesh dimension (Shard(d), Replicate(), Partial(op),
// _StridedShard(d, split_factor)). A small value type: 8 bytes, trivially copyable, hashed and
// compared by value.

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/error.h"  // the error type its functions throw

namespace dtensor {

// Reduction that turns per-rank partial values into the logical value (Partial) or that a
// collective applies. Bitwise ops are for integer and bool tensors only. kNorm is a Partial's
// only: pieces n_i of a p-norm whose value is (sum of |n_i|^p)^(1/p) (NOTE [p-norm Partial]);
// no collective reduces by it.
enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProduct, kBand, kBor, kBxor, kNorm };

// "sum", "avg", ...; the names PyTorch's c10d and DTensor use.
std::string_view reduce_op_name(ReduceOp op);
// Inverse of reduce_op_name; throws dtensor::Error naming the bad text.
ReduceOp parse_reduce_op(std::string_view text);
bool is_bitwise(ReduceOp op);

class Placement {
 public:
  enum class Kind : uint8_t { kReplicate, kShard, kPartial, kStridedShard };

  // Default: Replicate, so a vector of placements can be sized then filled.
  constexpr Placement() = default;

  static constexpr Placement replicate() { return Placement(Kind::kReplicate, 0, ReduceOp::kSum); }
  // `dim` may be negative here; DTensorSpec normalises it against the tensor's rank.
  static constexpr Placement shard(int32_t dim) {
    return Placement(Kind::kShard, dim, ReduceOp::kSum);
  }
  static constexpr Placement partial(ReduceOp op = ReduceOp::kSum) {
    return Placement(Kind::kPartial, 0, op);
  }
  // PyTorch's _StridedShard(dim, split_factor=sf) (NOTE [strided shards] in dtensor_spec.h):
  // tensor dim `dim` is cut into `split_factor` pieces (torch.chunk), each piece is cut over the
  // mesh dim's ranks, and rank i holds chunk i of every piece, concatenated. split_factor 1 is
  // Shard(dim). throws dtensor::Error for a split factor outside [1, 65535].
  static Placement strided_shard(int32_t dim, int64_t split_factor);
  // NOTE [p-norm Partial]: the pieces of a p-norm (vector_norm, dist, clip_grad_norm_'s total)
  // over a sharded dim are the pieces' own p-norms, and the value is (sum of piece^p)^(1/p). The
  // redistribute step computes it with signed powers, sign(x)|x|^p summed and sign(s)|s|^(1/p):
  // the same for norms (never negative), and exact for the shares a Replicate -> Partial move
  // makes (the value on one rank, zeros elsewhere) whatever their sign, so an in-place op on such
  // a tensor (clamp_min_ in cosine_similarity) copies its result back by partition. PyTorch calls
  // it _NormPartial. Only 0 < p < inf other than 1: the other orders reduce by sum (0, 1), max
  // (inf) or min (-inf) and use those Partials; for p < 0 the zero shares would be infinite. p
  // lives in the dim field as float bits, so equality and hashing tell orders apart; callers pass
  // an order a float holds exactly (norm_partial_order says which).
  static Placement partial_norm(float p) {
    int32_t bits = 0;
    std::memcpy(&bits, &p, sizeof bits);
    return Placement(Kind::kPartial, bits, ReduceOp::kNorm);
  }

  constexpr Kind kind() const { return kind_; }
  constexpr bool is_replicate() const { return kind_ == Kind::kReplicate; }
  constexpr bool is_shard() const { return kind_ == Kind::kShard; }
  constexpr bool is_shard(int64_t d) const { return kind_ == Kind::kShard && dim_ == d; }
  constexpr bool is_partial() const { return kind_ == Kind::kPartial; }
  // A _StridedShard is not a Shard (is_shard() is false for it, as in PyTorch): code that reads
  // a Shard as one contiguous chunk of its dim per rank must not take it for one.
  constexpr bool is_strided_shard() const { return kind_ == Kind::kStridedShard; }
  constexpr bool is_strided_shard(int64_t d) const {
    return kind_ == Kind::kStridedShard && dim_ == d;
  }
  // Shard or _StridedShard: the mesh dim splits tensor dim dim().
  constexpr bool is_any_shard() const { return is_shard() || is_strided_shard(); }
  constexpr bool is_any_shard(int64_t d) const { return is_any_shard() && dim_ == d; }
  // Tensor dim of a Shard or _StridedShard; meaningless for other kinds (0, or a Partial(norm)'s
  // order bits).
  constexpr int32_t dim() const { return dim_; }
  // A _StridedShard's split factor; 1 for every other placement.
  constexpr int64_t split_factor() const { return kind_ == Kind::kStridedShard ? split_ : 1; }
  // Reduce op of a Partial; meaningless (kSum) for other kinds.
  constexpr ReduceOp reduce_op() const { return op_; }
  // The order p of a Partial(norm); 0 for every other placement.
  float norm_order() const {
    if (kind_ != Kind::kPartial || op_ != ReduceOp::kNorm) return 0;
    float p = 0;
    std::memcpy(&p, &dim_, sizeof p);
    return p;
  }

  // "S(0)", "R", "P(sum)", "P(norm2)", "_S(0,2)".
  std::string to_string() const;
  size_t hash() const {
    return (static_cast<size_t>(split_) << 48) ^ (static_cast<size_t>(kind_) << 40) ^
           (static_cast<size_t>(op_) << 32) ^ static_cast<uint32_t>(dim_);
  }

  friend constexpr bool operator==(Placement a, Placement b) {
    return a.kind_ == b.kind_ && a.dim_ == b.dim_ && a.op_ == b.op_ && a.split_ == b.split_;
  }
  friend constexpr bool operator!=(Placement a, Placement b) { return !(a == b); }

 private:
  constexpr Placement(Kind kind, int32_t dim, ReduceOp op, uint16_t split = 0)
      : kind_(kind), op_(op), split_(split), dim_(dim) {}

  Kind kind_ = Kind::kReplicate;
  ReduceOp op_ = ReduceOp::kSum;
  uint16_t split_ = 0;  // a _StridedShard's split factor (the former padding); 0 otherwise
  int32_t dim_ = 0;
};

static_assert(sizeof(Placement) == 8 && std::is_trivially_copyable_v<Placement>,
              "Placement stays a small value type");

// PyTorch-style spellings, so C++ reads like Python: {Shard(0), Replicate(), Partial()}.
constexpr Placement Shard(int32_t dim) { return Placement::shard(dim); }
constexpr Placement Replicate() { return Placement::replicate(); }
constexpr Placement Partial(ReduceOp op = ReduceOp::kSum) { return Placement::partial(op); }
inline Placement StridedShard(int32_t dim, int64_t split_factor) {
  return Placement::strided_shard(dim, split_factor);
}

using Placements = std::vector<Placement>;

// The Partial whose pieces are p-norms of order `ord` reduce by (NOTE [p-norm Partial]): sum for
// 0 and 1, max for inf, min for -inf, Partial(norm p) for a finite p > 0 a float holds exactly;
// none (the reduced dims stay whole) for any other order.
std::optional<Placement> norm_partial_order(double ord);

// "[S(0),R,P(sum)]".
std::string to_string(const Placements& placements);

// Parses one placement: "S(0)", "S(-1)", "Shard(1)", "R", "Replicate()", "P", "P(avg)",
// "Partial(max)", "P(norm2)", "P(norm1.5)" ("P(norm)": order 2), "_S(0,2)",
// "_StridedShard(0, split_factor=2)". Whitespace around tokens is ignored.
Placement parse_placement(std::string_view text);
// Parses a comma-separated list, with or without surrounding brackets: "S(0),R,P(avg)" or
// "[S(0), R]". throws dtensor::Error naming the bad token and its position.
Placements parse_placements(std::string_view text);

}  // namespace dtensor

template <>
struct std::hash<dtensor::Placement> {
  size_t operator()(dtensor::Placement p) const { return p.hash(); }
};
