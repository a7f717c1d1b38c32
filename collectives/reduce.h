#pragma once
// Reductions on local tensors, shared by every backend that reduces on the CPU (threads, shm) and
// by the functional layer (avg). One place decides which (op, dtype) pairs are meaningful.

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/types/span.h"
#include "layout/placement.h"

namespace dtensor::collectives {

// throws dtensor::Error naming `what` when `op` makes no sense for `dtype`:
// bitwise ops need integer or bool tensors; sum/avg need non-bool; avg needs floating point.
void check_reduce_op(ReduceOp op, c10::ScalarType dtype, const std::string& what);
// What makes `op` meaningless for `dtype`, or nullptr (no message is built: collectives check
// this first on every call and build check_reduce_op's message only on failure).
const char* reduce_op_problem(ReduceOp op, c10::ScalarType dtype);

// out = op(a, b), elementwise; `out` may be `a` (reduce_into). avg combines as sum (the caller
// divides). Every CPU backend folds through it, so all of them produce the same bits.
void combine(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op);

// combine() on raw contiguous memory by a plain loop, for sum, avg and product of float, double,
// int32 and int64 (each element is one IEEE or wrapping integer operation, so the bits equal
// combine()'s); returns false and does nothing for other pairs. `out` may be `a` or `b`. For small
// messages: no tensors to build, no TensorIterator (4 KiB of floats: 0.2 us against 2.4 us
// through at::add_out on one thread); large ones run faster through ATen's vectorised kernels.
bool combine_raw(void* out, const void* a, const void* b, int64_t n, c10::ScalarType dtype,
                 ReduceOp op);
// Whether combine_raw serves (op, dtype).
bool combine_raw_serves(c10::ScalarType dtype, ReduceOp op);

// NOTE [fused fold]
// Every destination gets srcs[0] op srcs[1] op ... op srcs[m-1] (folded in that order, as the
// backends fold, so the bits equal combine()'s), `n` elements, in one pass: blocks of 2 KiB are
// folded into an accumulator that stays in L1 (plain loops over fixed-size restrict blocks, which
// the compiler vectorises) and written to each destination, with streaming stores where
// `streaming[d]` says so (NOTE [streaming stores] in shm_symmetric.cc; an sfence ends the call).
// A destination may be a source (in place): each block is read whole before it is written. For
// the (dtype, op) pairs combine_raw serves; returns false and does nothing for the others (the
// caller folds through ATen). It halves a large all_reduce's time against folding through
// at::add_out piece by piece (docs/benchmarks.md, "Measurements behind design choices").
bool fold_raw(absl::Span<char* const> dsts, absl::Span<const bool> streaming,
              absl::Span<const char* const> srcs, int64_t n, c10::ScalarType dtype, ReduceOp op);

// memcpy with streaming (non-temporal) stores, any alignment (NOTE [streaming stores] in
// shm_symmetric.cc); stream_fence() orders them before a following release store. A plain memcpy
// where the CPU has no such stores.
void stream_store(char* dst, const char* src, size_t bytes);
void stream_fence();

// acc = op(acc, other), elementwise, in place: combine(acc, acc, other, op).
void reduce_into(at::Tensor& acc, const at::Tensor& other, ReduceOp op);

// Finishes a reduction over `group_size` ranks: divides by it for avg, else does nothing.
void finish_reduce(at::Tensor& acc, ReduceOp op, int64_t group_size);

}  // namespace dtensor::collectives
