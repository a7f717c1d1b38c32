#pragma once
// One (q piece, k/v block) pair of ring attention (ring_attention.h): the part of it some query
// sees (Block, from global positions), its attention and gradients by ATen's fused CPU kernel or
// explicitly off the CPU (NOTE [ring attention blocks]), and the merges of blocks into a piece's
// output, log-sum-exp and gradients. Internal to ring_attention.cc.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/ring_attention.h"

namespace dtensor::attention::detail {

struct Range {
  int64_t start = 0, stop = 0;
  int64_t size() const { return stop - start; }
};

// Rows `r` of a [.., L, E] tensor (dim -2).
at::Tensor rows_of(const at::Tensor& t, Range r);

// What merges and gradient sums run in: fp32, or the inputs' dtype when wider.
at::ScalarType acc_dtype(at::ScalarType dtype);

// `t` with its last dim zero-padded to `size`.
at::Tensor pad_last(const at::Tensor& t, int64_t size);

// The part of (local q) x (k/v block of one owner) that needs computing: its rows, its columns and
// its mask: `causal` (exactly top-left causal within the box, the fused kernel's is_causal), `mask`
// (bool [rows, cols], true where visible), or neither (all visible).
struct Block {
  Range rows, cols;
  bool causal = false;
  at::Tensor mask;
  at::Tensor additive;  // `mask` as the fused kernel's attn_mask (it refuses bool), made once

  // `mask` as the fused kernel's attn_mask (additive, of `dtype`), or nullopt.
  std::optional<at::Tensor> kernel_mask(at::ScalarType dtype);
};

// Per rank j of the ring, the block of (this rank's q piece) x (rank j's k/v), or nullopt when no
// local query sees any of its keys.
std::vector<std::optional<Block>> blocks_of(const RingPlan& plan);

// A block's (out, lse) and its gradients given the final out and lse (NOTE [ring attention
// blocks]); q, k, v are the block's rows and columns, 4-D.
std::tuple<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, Block& blk, double scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, Block& blk, double scale);

// Out and lse of rows that see no key yet: zeros and -inf, in the accumulation dtype.
std::pair<at::Tensor, at::Tensor> empty_attention(const at::Tensor& q4);

// Merges a block's attention into `out`/`lse` (in place, rows `rows`); undefined `out`: the
// block is the first and covers every row.
void merge(at::Tensor& out, at::Tensor& lse, Range rows, const at::Tensor& b_out,
           const at::Tensor& b_lse);

// acc[.., rows, :] += grad (the accumulation dtype); undefined `acc` takes `grad` when it covers
// every row (`full`), else zeros first.
void add_rows(at::Tensor& acc, Range rows, const at::Tensor& grad, int64_t full);

}  // namespace dtensor::attention::detail
