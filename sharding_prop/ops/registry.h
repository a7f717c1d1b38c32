#pragma once
// The table of operators the engine can shard: ATen op name (with overload) -> everything about
// it (NOTE [one entry per op]). Every entry is one line in its family's file under
// sharding_prop/ops/ (pointwise_ops.cc, reduction_ops.cc, ...), so coverage is reviewable there;
// `./x ops` prints it. Custom ops register a rule string ("mk,kn->mn") at run time.

#include <c10/core/ScalarType.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "layout/tensor_meta.h"
#include "sharding_prop/rule.h"

namespace dtensor::sharding {

// NOTE [one entry per op]
// An OpEntry is the single place that says everything about one ATen overload:
//   - its rule builder (the factors of its inputs and outputs, and the output dtypes);
//   - its layout arguments: which schema arguments decide layouts, typed (LayoutArg), in the
//     order the builder reads them from LayoutArgs; the dispatcher reads them from the call by
//     these names, so no other table describes the op's arguments;
//   - which argument describes the output's shape and must be made local before the op runs on
//     a rank's piece (LocalShapeArg);
//   - how it executes when that is not "the same op on every piece" (Execution);
//   - whether it is in-place (self keeps its layout), derived from its name;
//   - whether the engine runs it although ATen would decompose it (run_composite);
//   - how its floating-point work is counted (Flops, from its family: NOTE [compute in the cost
//     model] in cost_model.h), for the propagator's prices and the FLOP counter alike.
// Adding an op is one add(...) line in the op table, in the file of its family (README: "Adding an
// op").

// One layout argument: the schema argument `name`, read as `kind`.
struct LayoutArg {
  enum class Kind : uint8_t {
    kInt,      // an int (a bool reads as 0/1, a dtype as its ScalarType number)
    kInts,     // every element of an int list (an int reads as one element)
    kCount,    // the length of a list (layer_norm's normalized_shape)
    kText,     // a string (einsum's equation): LayoutArgs::text
    kPresent,  // 1 when the tensor argument is given, 0 when it is None (which inputs are
               // which); for a Tensor?[] (index's indices) one int per element
    kDevice,   // a tensor argument's device type (c10::DeviceType's number): for the few kernels
               // whose outputs differ by device (CUDA's batch norm keeps [C] statistics in eval)
    kEqual,    // 1 when the number arguments `name` and `other` are equal (histc's min == max:
               // the range is read from the data), never the values themselves
    kNormOrd,  // a norm's order as the Partial its pieces reduce by (norm_partial_order): two
               // ints, the ReduceOp (-1: none, the reduced dims stay whole) and, for kNorm, the
               // order's float bits
  };
  std::string name;
  Kind kind = Kind::kInt;
  std::optional<int64_t> if_none;  // the value of a None argument (else None appends nothing)
  std::string other;               // kEqual's second argument

  std::string to_string() const;  // "dim", "dims...", "len(normalized_shape)", "end=None:max"
};
LayoutArg int_arg(std::string name, std::optional<int64_t> if_none = std::nullopt);
LayoutArg ints_arg(std::string name);
LayoutArg count_arg(std::string name);
LayoutArg text_arg(std::string name);
LayoutArg present_arg(std::string name);
LayoutArg device_arg(std::string name);
LayoutArg equal_args(std::string name, std::string other);
LayoutArg norm_ord_arg(std::string name);

// The values of an op's layout arguments in one call, in the entry's order (never runtime scalar
// values): part of the propagation cache key.
struct LayoutArgs {
  std::vector<int64_t> ints;
  std::string text;
  // The call's other non-tensor arguments, encoded by the dispatcher (never read by rules): they
  // can change the outputs' dtype or shape (dtype=, a Scalar's kind), so they key the output
  // metadata ATen's meta kernel computes (NOTE [output metadata from ATen]).
  std::vector<int64_t> call;
  friend bool operator==(const LayoutArgs& a, const LayoutArgs& b) {
    return a.ints == b.ints && a.text == b.text && a.call == b.call;
  }
  size_t hash() const;
  std::string to_string() const;
};

// The argument that gives the output's shape (view's size, new_zeros's size): when the op runs
// on a rank's piece it must be the local shape.
struct LocalShapeArg {
  enum class Kind : uint8_t {
    kNone,
    kSizes,      // the first output's local shape
    kFirstSize,  // its first size (embedding_dense_backward's num_weights)
    kUnflatten,  // the local sizes of the unflattened dims (unflatten's sizes, with its dim)
  };
  Kind kind = Kind::kNone;
  std::string name;
};
LocalShapeArg local_shape(std::string name, LocalShapeArg::Kind kind = LocalShapeArg::Kind::kSizes);

// How the dispatcher runs the op when it is not the same op on every rank's piece.
enum class Execution : uint8_t {
  kPieces,   // the op on each rank's pieces (almost every op)
  kRandom,   // draws for the global tensor and keeps this rank's box (NOTE [DTensor random])
  kDropout,  // native_dropout with its mask drawn for the global tensor
  kMaskedEmbedding,  // a row-sharded weight is looked up with a mask -> Partial(sum)
  kReplicateFirst,   // item(): every rank reads the whole value (no rule)
  kReshapeByLocal,   // _reshape_alias: a reshape to the local shape (its strides are global)
  kEmptyByLocal,     // new_empty_strided: an empty piece of the local shape
  kViewAsLocal,      // view, squeeze: a view of the piece as the output's local shape (a piece
                     // may have a size-1 dim the global tensor has not)
  kSliceBackwardAtOffset,  // slice_backward of a grad piece: its start moved by the piece's
                           // offset along the sliced dim
  // The fused CPU attention and its backward: ring attention where q/k/v are sharded along the
  // sequence (NOTE [ring attention in the engine]), else the rule on the pieces.
  kRingAttention,
  kRingAttentionBackward,
};

// How an op's FLOPs follow from its rule's factors (NOTE [compute in the cost model]).
enum class Flops : uint8_t {
  kNone,            // priced by communication only (views, shape ops, most families)
  kOutputElements,  // one per element of its outputs (elementwise)
  kContraction,     // 2 x the product of every factor's size (the matmul family, einsum rules)
};
// The counting of a family: "matmul" and "custom" (einsum-like rules) contract, "pointwise" is
// elementwise, every other family kNone.
Flops flops_of_family(std::string_view family);
// The FLOPs of one call with rule `rule` on the largest piece, a factor f's size taken as
// ceil(size / shards[f]) (shards empty: every factor whole; the rule of a local call).
double rule_flops(Flops kind, const Rule& rule, const std::vector<int64_t>& shards = {});

struct BuiltRule {
  Rule rule;
  std::vector<c10::ScalarType> out_dtypes;  // one per output
  // No rule fits these inputs (an index by a bool mask, whose output shape is the data's): the
  // replicate fallback runs the call. `rule` is empty then.
  bool run_replicated = false;
};

using RuleBuilder =
    std::function<BuiltRule(const std::vector<TensorMeta>& inputs, const LayoutArgs& args)>;

struct OpEntry {
  std::string name;    // "aten::add.Tensor"
  std::string family;  // "pointwise", "matmul", ...
  std::vector<LayoutArg> layout_args;
  bool in_place = false;  // self is the output: its layout may not change
  RuleBuilder build;
  LocalShapeArg local_shape;
  Execution execution = Execution::kPieces;
  // A CompositeImplicitAutograd op the engine runs itself instead of letting ATen decompose it
  // above the engine: its decomposition makes a plain tensor (at::zeros(sizes, options)) and
  // scatters distributed values into it. Only backward ops are marked: on distributed tensors
  // they then have no autograd formula of their own (a double backward through them raises).
  bool run_composite = false;
  Flops flops = Flops::kNone;  // set from the family (flops_of_family)

  // The layout arguments for humans: "keepdim, dim..." (empty when none).
  std::string args_text() const;
};

// The entry of `name`, or null.
const OpEntry* find_op(std::string_view name);
// Every entry, sorted by name.
std::vector<const OpEntry*> all_ops();
// The registered names closest to `name` (edit distance on the base name), best first.
std::vector<std::string> nearest_ops(std::string_view name, size_t count = 3);

// Registers a custom op from an einsum-like rule (rule.h text form); its output dtype is its
// first input's. Throws when the name exists already.
void register_rule(const std::string& name, const std::string& rule_text,
                   Linearity linearity = Linearity::kMultilinear);
// Registers an op with no entry from a rule builder (family "custom"): register_rule's and the
// Python package's register_sharding (a Python function turned into factors) both end here.
// Throws when the name has an entry already (built-in entries are not replaced).
void register_custom_op(const std::string& name, std::vector<LayoutArg> layout_args,
                        RuleBuilder build);

}  // namespace dtensor::sharding
