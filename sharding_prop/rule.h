#pragma once
// NOTE [sharding rules as factors]
// A Rule says how an operator's tensor dims relate, in the einsum-like form of Shardy's factor
// propagation: every dim of every input and output is made of factors (usually one; a reshape
// that merges or splits dims makes a dim of several, major first; a dim broadcast into a larger
// one, or a size-1 dim a reshape adds or drops, of none). A factor has a size and a kind:
//   pass      appears in the inputs that carry it and in the output: shard it everywhere alike;
//   contract  appears in inputs but not in the output (mm's k, a reduction's dim): sharding it
//             leaves the output Partial(reduce op);
//   replicate must not be sharded (softmax's dim, a cat dim, var's reduced dim).
// From a Rule the propagator derives, for each mesh dim, the candidates "replicate", "shard
// factor f" and, where the op allows it (Linearity), "keep the inputs' Partial". A tensor dim of
// several factors can be sharded only through its major factor, and only evenly (its chunks are
// then chunks of the major factor).
//
// NOTE [size-1 factors]
// A size-1 dim has a factor of size 1 (Rule::add_dim). The propagator never shards one on its
// own (a piece of one element on one rank, empty pieces elsewhere, gains nothing), but an input
// that is already Shard on it (distribute_tensor(torch.ones(1, 8), mesh, [Shard(0)]), FSDP's
// Shard(0) of a [1, n] parameter) keeps it: the op runs on its pieces (the one row and the empty
// ones) and its output is Shard there, as PyTorch keeps such placements. Without that factor,
// `detach` would move such a tensor to another dim and an in-place op would raise. Reductions
// over it follow the usual rules: sum leaves Partial(sum), and avg, max and min refuse an uneven
// piece (contractions_even), so the input moves.
//
// Text form: inputs and output as letters, one per factor, a merged dim in parentheses, a dim
// with no factor as "1", then the factors that are not pass: "mk,kn->mn | k:sum",
// "bsd->bsd | d:replicate", "(ab)c->abc". parse_rule() reads it back for custom ops: "mk,kn->mn"
// (letters absent from the output contract with sum).

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "layout/placement.h"
#include "layout/tensor_meta.h"

namespace dtensor::sharding {

enum class FactorKind : uint8_t { kPass, kContract, kReplicate };

struct Factor {
  int64_t size = 1;
  FactorKind kind = FactorKind::kPass;
  ReduceOp reduce = ReduceOp::kSum;  // of a contract factor
  float norm = 0;                    // reduce == kNorm: the order p (NOTE [p-norm Partial])
  // May be sharded only evenly, so no rank's piece is empty: for ATen kernels that refuse an empty
  // dim (convolution's channels). Contract factors reduced by avg, max or min are even-only too.
  bool even_only = false;

  // The Partial that sharding this contract factor leaves on the output.
  Placement partial() const {
    return reduce == ReduceOp::kNorm ? Placement::partial_norm(norm) : Placement::partial(reduce);
  }
};

// The factors of one tensor dim, major first; empty for a broadcast dim or one a reshape adds.
using DimFactors = std::vector<int>;
using TensorFactors = std::vector<DimFactors>;

// How Partial inputs may pass through the op unreduced (NOTE [kept Partials] in
// propagator_search.cc).
enum class Linearity : uint8_t {
  kNone,         // every Partial input is reduced first
  kMove,         // data movement (views, cat, clone): Partial(any op) -> the same
  kAdditive,     // sums (add, sub, sum): Partial(sum or avg) -> the same
  kMultilinear,  // products (mul, mm): one input Partial(sum or avg), the others Replicate
  kShapeOnly,    // reads no values (zeros_like): a Partial input stays, the output is Replicate
  kShift,        // a Scalar added (add/sub .Scalar): Partial(avg, max or min) -> the same, as
                 // avg(x) + c = avg(x + c) and max(x) + c = max(x + c); Partial(sum) is reduced
  kMax,          // maximum, amax, max: Partial(max) -> Partial(max), as max(max(a), max(b)) is
                 // max(a, b)
  kMin,          // minimum, amin, min: Partial(min) -> Partial(min)
  kNorm,         // a p-norm of order Rule::norm: Partial(norm p) -> the same, as the p-norm of
                 // the pieces' p-norms is the whole's (NOTE [p-norm Partial])
};

struct Rule {
  std::vector<Factor> factors;
  std::vector<TensorFactors> inputs;   // one per tensor input, in argument order
  std::vector<TensorFactors> outputs;  // one per tensor output
  Linearity linearity = Linearity::kNone;
  float norm = 0;  // kNorm: the order whose Partial passes through
  // Which inputs a Partial may pass through (empty: all): kMultilinear's linear inputs (div is
  // linear in its first); for the other linearities the data inputs, not indices
  // (index_select's index stays Replicate: a partitioned index would select wrong rows).
  std::vector<bool> linear_inputs;
  // Inputs that must be Partial(sum) on a mesh dim that shards a contract factor (a bias added
  // to a product: kept on one rank of the mesh dim, zero on the others). Empty: none.
  std::vector<bool> partial_with_contract;
  // Per output: pass factors that output sums over (layer_norm's grad_weight sums the batch
  // dims its grad_input keeps): sharding one leaves that output Partial(sum). Empty: none.
  std::vector<std::vector<int>> output_sums;
  // The outputs' shapes come from an argument the dispatcher makes local (new_zeros' size), not
  // from the inputs' pieces: a kShapeOnly op may then keep sharded inputs as they are.
  bool output_shape_from_args = false;
  // Inputs the op writes besides an in-place self (batch norm's running stats): they keep their
  // placements, since a write into a redistributed copy would be lost. Empty: none.
  std::vector<bool> written_inputs;
  // Output dims whose factors are all kReplicate (never sharded) take their sizes from ATen's meta
  // kernel (pooling's and upsampling's spatial dims): the rule's sizes there are placeholders, and
  // only the dims that can be sharded are checked against ATen (NOTE [output metadata from ATen]).
  bool whole_output_sizes_from_aten = false;
  // The outputs' metadata is the rule's, not ATen's meta kernel's, for calls where torch's meta
  // registration disagrees with its own kernels (torch 1.13's Python meta of native_batch_norm
  // in eval gives save_mean [C], the CPU kernel [0]). The local-result check still guards it.
  bool metadata_from_rule = false;

  std::string to_string() const;
  int add_factor(int64_t size, FactorKind kind = FactorKind::kPass,
                 ReduceOp reduce = ReduceOp::kSum);
  // One tensor dim's factor, new. A size-1 dim has one too (NOTE [size-1 factors]): an input
  // already sharded there keeps its Shard through the op, as in PyTorch.
  DimFactors add_dim(int64_t size, FactorKind kind = FactorKind::kPass) {
    return DimFactors{add_factor(size, kind)};
  }
  // The shape of output `i`: each dim the product of its factors' sizes (1 when it has none).
  std::vector<int64_t> output_shape(size_t i) const;
};

// "[8,4]": a shape in messages.
std::string shape_text(const std::vector<int64_t>& shape);

// Parses "mk,kn->mn" (optionally "| k:max, d:replicate") against the input shapes: a letter's
// size comes from the first input dim that carries it and must agree everywhere; letters absent
// from the output contract with sum unless annotated; a letter naming two dims of one tensor (a
// diagonal, "ii->i") is never sharded (kReplicate). throws dtensor::Error naming the problem.
Rule parse_rule(std::string_view text, const std::vector<std::vector<int64_t>>& input_shapes,
                Linearity linearity = Linearity::kMultilinear);

// The broadcast shape of `shapes` (right-aligned), or throws dtensor::Error naming them.
std::vector<int64_t> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes);
// Factors of `shape` right-aligned against the factors `out` of the broadcast shape `out_shape`:
// a dim equal to the output's shares its factor; a size-1 dim under a larger one has none.
TensorFactors aligned_factors(const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& out_shape, const TensorFactors& out);

// ---- builders for op families (each validates its arguments and throws dtensor::Error) --

// Elementwise with broadcasting over any number of inputs (0-dim inputs broadcast everywhere).
Rule pointwise_rule(const std::vector<std::vector<int64_t>>& shapes, Linearity linearity,
                    std::vector<bool> linear_inputs = {});
// Reduction of `dims` (empty: all) with keepdim; `reduce` the Partial op when a reduced dim is
// sharded, or replicate = true when the reduced dims must not be sharded (var, std, argmax).
Rule reduction_rule(const std::vector<int64_t>& shape, std::vector<int64_t> dims, bool keepdim,
                    ReduceOp reduce, bool replicate, Linearity linearity);
// Every dim passes except `dims`, which must be replicated (softmax, layer_norm's normalised dims).
Rule replicate_dims_rule(const std::vector<std::vector<int64_t>>& shapes,
                         const std::vector<int64_t>& dims, size_t n_outputs = 1);
// view/reshape/flatten/unflatten/squeeze/unsqueeze: `to` may hold one -1.
Rule reshape_rule(const std::vector<int64_t>& from, std::vector<int64_t> to);
// permute (transpose and t are permutes).
Rule permute_rule(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm);
// cat along `dim` (must be replicated); stack adds a new dim at `dim` (new = true).
Rule cat_rule(const std::vector<std::vector<int64_t>>& shapes, int64_t dim, bool stack);
// slice/narrow of [start, end) with step along `dim` (a whole-dim slice passes the dim through;
// otherwise it must be replicated), select (dim removed) when `select`.
Rule slice_rule(const std::vector<int64_t>& shape, int64_t dim, int64_t start, int64_t end,
                int64_t step);
Rule select_rule(const std::vector<int64_t>& shape, int64_t dim);
// split by sizes along `dim` (several outputs; the dim must be replicated).
Rule split_rule(const std::vector<int64_t>& shape, int64_t dim, const std::vector<int64_t>& sizes);
// expand to `to` (-1 keeps a size): an expanded size-1 dim is new in the output.
Rule expand_rule(const std::vector<int64_t>& from, const std::vector<int64_t>& to);
// mm / bmm / matmul (with broadcasting batch dims and 1-D operands) as an einsum.
Rule matmul_rule(const std::vector<int64_t>& a, const std::vector<int64_t>& b);
// addmm(bias, a, b) / linear(x, w[, bias]) / baddbmm(bias, a, b): the product, plus a bias
// broadcast into its output.
// `product` (two inputs, one output) with a bias added: a new first input broadcast into the
// output, kept on one rank of a mesh dim that shards a contraction (addmm, addbmm, addr).
Rule with_bias(Rule product, const std::vector<int64_t>& bias, const char* op);
Rule addmm_rule(const std::vector<int64_t>& bias, const std::vector<int64_t>& a,
                const std::vector<int64_t>& b);
Rule linear_rule(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                 const std::vector<int64_t>* bias);

}  // namespace dtensor::sharding
