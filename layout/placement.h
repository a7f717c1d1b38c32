#pragma once
// Placement: how a tensor lives along one mesh dimension (Shard(d), Replicate(), Partial(op)).
// A small value type: 8 bytes, trivially copyable, hashed and compared by value.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"  // the error type its functions throw

namespace dtensor {

// Reduction that turns per-rank partial values into the logical value (Partial) or that a
// collective applies. Bitwise ops are for integer and bool tensors only.
enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProduct, kBand, kBor, kBxor };

// "sum", "avg", ...; the names PyTorch's c10d and DTensor use.
std::string_view reduce_op_name(ReduceOp op);
// Inverse of reduce_op_name; throws dtensor::Error naming the bad text.
ReduceOp parse_reduce_op(std::string_view text);
bool is_bitwise(ReduceOp op);

class Placement {
 public:
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };

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

  constexpr Kind kind() const { return kind_; }
  constexpr bool is_replicate() const { return kind_ == Kind::kReplicate; }
  constexpr bool is_shard() const { return kind_ == Kind::kShard; }
  constexpr bool is_shard(int64_t d) const { return kind_ == Kind::kShard && dim_ == d; }
  constexpr bool is_partial() const { return kind_ == Kind::kPartial; }
  // Tensor dim of a Shard; meaningless (0) for other kinds.
  constexpr int32_t dim() const { return dim_; }
  // Reduce op of a Partial; meaningless (kSum) for other kinds.
  constexpr ReduceOp reduce_op() const { return op_; }

  // "S(0)", "R", "P(sum)".
  std::string to_string() const;
  size_t hash() const {
    return (static_cast<size_t>(kind_) << 40) ^ (static_cast<size_t>(op_) << 32) ^
           static_cast<uint32_t>(dim_);
  }

  friend constexpr bool operator==(Placement a, Placement b) {
    return a.kind_ == b.kind_ && a.dim_ == b.dim_ && a.op_ == b.op_;
  }
  friend constexpr bool operator!=(Placement a, Placement b) { return !(a == b); }

 private:
  constexpr Placement(Kind kind, int32_t dim, ReduceOp op) : kind_(kind), op_(op), dim_(dim) {}

  Kind kind_ = Kind::kReplicate;
  ReduceOp op_ = ReduceOp::kSum;
  int32_t dim_ = 0;
};

// PyTorch-style spellings, so C++ reads like Python: {Shard(0), Replicate(), Partial()}.
constexpr Placement Shard(int32_t dim) { return Placement::shard(dim); }
constexpr Placement Replicate() { return Placement::replicate(); }
constexpr Placement Partial(ReduceOp op = ReduceOp::kSum) { return Placement::partial(op); }

using Placements = std::vector<Placement>;

// "[S(0),R,P(sum)]".
std::string to_string(const Placements& placements);

// Parses one placement: "S(0)", "S(-1)", "Shard(1)", "R", "Replicate()", "P", "P(avg)",
// "Partial(max)". Whitespace around tokens is ignored.
Placement parse_placement(std::string_view text);
// Parses a comma-separated list, with or without surrounding brackets: "S(0),R,P(avg)" or
// "[S(0), R]". throws dtensor::Error naming the bad token and its position.
Placements parse_placements(std::string_view text);

}  // namespace dtensor

template <>
struct std::hash<dtensor::Placement> {
  size_t operator()(dtensor::Placement p) const { return p.hash(); }
};
