#pragma once
// Views as the payload of an all_to_all (NOTE [boxed all_to_all] in functional.h): what one rank
// sends to another, or receives from it, is the elements of a list of views ("boxes"), each read
// in row-major order, one box after another. The backends that take such calls (shm, threads)
// copy through these helpers straight between the boxes and their own memory, without a packed
// copy of the whole list.

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace dtensor::collectives {

using BoxList = std::vector<at::Tensor>;

int64_t numel_of(const BoxList& boxes);

// Copies elements [from, from + count) of the row-major concatenation of `boxes` (CPU tensors of
// one dtype, any strides) to `dst`, packed; unpack_range copies `src`, packed, into those
// elements. count may be 0; the range must lie within the boxes.
void pack_range(const BoxList& boxes, int64_t from, int64_t count, void* dst);
void unpack_range(const BoxList& boxes, int64_t from, int64_t count, const void* src);

// The elements of `src` into `dst` (equal totals), box by box where the two lists' boxes have one
// shape, else through a small bounce buffer (CPU tensors).
void copy_boxes(const BoxList& src, const BoxList& dst);

// What `call` (an all_to_all) sends to group rank d: its boxes for d, or its input's split.
BoxList sent_to(const CollectiveCall& call, int64_t d);
// Where `call` (an all_to_all) receives what group rank s sends: its boxes for s, or its output's
// split.
BoxList received_from(const CollectiveCall& call, int64_t s);

// Checks all_to_all_boxes's arguments for a group of n ranks (NOTE [boxed all_to_all] in
// functional.h): one list per rank on each side, every box defined with `result`'s dtype and
// device, receive boxes without lazy conjugation or negation, not overlapping themselves, sharing
// no storage with a send box. Throws dtensor::Error starting with where() (built only on failure).
void check_box_lists(const std::vector<BoxList>& send, const std::vector<BoxList>& recv,
                     const at::Tensor& result, int64_t n,
                     const std::function<std::string()>& where);

// The packing fallback for backends that take flat buffers only (functional.cc):
// One flat view of the boxes when each non-empty one is contiguous, carries no lazy conjugation
// or negation, and starts where the previous one ended in one storage; undefined otherwise.
at::Tensor flat_view(const BoxList& boxes);
// The boxes' elements, packed into a fresh flat tensor of `options`.
at::Tensor pack(const BoxList& boxes, const at::TensorOptions& options);
// `flat`'s elements into the boxes (equal totals).
void unpack(const at::Tensor& flat, const BoxList& boxes);

// Whether a boxed call's lists fit a group of n ranks: one list per rank on each side, CPU boxes
// of the input's dtype whose element counts are the splits (what a backend must know before it
// reads or writes through them).
bool boxes_fit(const CollectiveCall& call, int64_t n);

}  // namespace dtensor::collectives
