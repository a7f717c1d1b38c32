#include "collectives/boxes.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "base/error.h"

namespace dtensor::collectives {
namespace {

// A box as runs: its dims with size-1 dims dropped and each dim merged into the next inner one
// where the two are laid out as one (outer stride = inner stride x inner size), strides in
// elements. The innermost dim is a run of `sizes.back()` elements `strides.back()` apart.
struct Runs {
  char* base = nullptr;
  int64_t isz = 0;
  std::vector<int64_t> sizes, strides;
};

Runs runs_of(const at::Tensor& t) {
  Runs r;
  r.base = static_cast<char*>(t.data_ptr());
  r.isz = static_cast<int64_t>(t.element_size());
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    if (size == 1) continue;
    if (!r.sizes.empty() && r.strides.back() == stride * size) {
      r.sizes.back() *= size;
      r.strides.back() = stride;
      continue;
    }
    r.sizes.push_back(size);
    r.strides.push_back(stride);
  }
  if (r.sizes.empty()) {  // one element
    r.sizes.push_back(1);
    r.strides.push_back(1);
  }
  return r;
}

template <typename T>
void strided_copy(char* dst, int64_t dst_step, const char* src, int64_t src_step, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * src_step, sizeof(T));
    std::memcpy(dst + i * dst_step, &v, sizeof(T));
  }
}

// n elements of isz bytes, src_step and dst_step bytes apart.
void copy_elements(char* dst, int64_t dst_step, const char* src, int64_t src_step, int64_t n,
                   int64_t isz) {
  if (dst_step == isz && src_step == isz) {
    std::memcpy(dst, src, n * isz);
    return;
  }
  switch (isz) {
    case 1:
      return strided_copy<uint8_t>(dst, dst_step, src, src_step, n);
    case 2:
      return strided_copy<uint16_t>(dst, dst_step, src, src_step, n);
    case 4:
      return strided_copy<uint32_t>(dst, dst_step, src, src_step, n);
    case 8:
      return strided_copy<uint64_t>(dst, dst_step, src, src_step, n);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * dst_step, src + i * src_step, isz);
  }
}

// Elements [from, from + count) of one box, row-major, to (kPack) or from `flat`, packed.
template <bool kPack>
void move_range(const at::Tensor& box, int64_t from, int64_t count, char* flat) {
  if (count <= 0) return;
  const Runs r = runs_of(box);
  const int64_t nd = static_cast<int64_t>(r.sizes.size());
  std::vector<int64_t> at(nd);  // the multi-index of element `from`
  for (int64_t d = nd - 1, rest = from; d >= 0; --d) {
    at[d] = rest % r.sizes[d];
    rest /= r.sizes[d];
  }
  const int64_t inner = r.sizes.back(), step = r.strides.back() * r.isz;
  while (count > 0) {
    int64_t offset = 0;
    for (int64_t d = 0; d < nd; ++d) offset += at[d] * r.strides[d];
    char* p = r.base + offset * r.isz;
    const int64_t len = std::min(count, inner - at.back());
    if (kPack) {
      copy_elements(flat, r.isz, p, step, len, r.isz);
    } else {
      copy_elements(p, step, flat, r.isz, len, r.isz);
    }
    flat += len * r.isz;
    count -= len;
    at.back() += len;
    for (int64_t d = nd - 1; d > 0 && at[d] == r.sizes[d]; --d) {  // carry
      at[d] = 0;
      ++at[d - 1];
    }
  }
}

// Calls fn(box, first, count) for the parts of the boxes that elements [from, from + count) of
// their concatenation cover, in order.
template <class Fn>
void for_range(const BoxList& boxes, int64_t from, int64_t count, Fn&& fn) {
  for (const at::Tensor& b : boxes) {
    if (count <= 0) return;
    const int64_t n = b.numel();
    if (from >= n) {
      from -= n;
      continue;
    }
    const int64_t len = std::min(count, n - from);
    fn(b, from, len);
    count -= len;
    from = 0;
  }
  TORCH_INTERNAL_ASSERT(count <= 0, "boxes: a range past the end of the boxes");
}

}  // namespace

int64_t numel_of(const BoxList& boxes) {
  int64_t n = 0;
  for (const at::Tensor& b : boxes) n += b.numel();
  return n;
}

void pack_range(const BoxList& boxes, int64_t from, int64_t count, void* dst) {
  char* out = static_cast<char*>(dst);
  for_range(boxes, from, count, [&](const at::Tensor& b, int64_t first, int64_t len) {
    move_range<true>(b, first, len, out);
    out += len * static_cast<int64_t>(b.element_size());
  });
}

void unpack_range(const BoxList& boxes, int64_t from, int64_t count, const void* src) {
  char* in = const_cast<char*>(static_cast<const char*>(src));  // only read
  for_range(boxes, from, count, [&](const at::Tensor& b, int64_t first, int64_t len) {
    move_range<false>(b, first, len, in);
    in += len * static_cast<int64_t>(b.element_size());
  });
}

void copy_boxes(const BoxList& src, const BoxList& dst) {
  constexpr int64_t kBounceBytes = 64 << 10;
  std::array<char, kBounceBytes> bounce;
  size_t i = 0, j = 0;
  int64_t at_i = 0, at_j = 0;  // elements of src[i] / dst[j] already copied
  for (;;) {
    while (i < src.size() && at_i == src[i].numel()) ++i, at_i = 0;
    while (j < dst.size() && at_j == dst[j].numel()) ++j, at_j = 0;
    if (i == src.size() || j == dst.size()) break;
    const at::Tensor &s = src[i], &d = dst[j];
    if (at_i == 0 && at_j == 0 && s.sizes() == d.sizes()) {
      d.copy_(s);
      at_i = s.numel();
      at_j = d.numel();
      continue;
    }
    const int64_t len = std::min({s.numel() - at_i, d.numel() - at_j,
                                  kBounceBytes / static_cast<int64_t>(s.element_size())});
    move_range<true>(s, at_i, len, bounce.data());
    move_range<false>(d, at_j, len, bounce.data());
    at_i += len;
    at_j += len;
  }
  TORCH_INTERNAL_ASSERT(i == src.size() && j == dst.size(),
                        "boxes: copy between lists of different sizes");
}

void check_box_lists(const std::vector<BoxList>& send, const std::vector<BoxList>& recv,
                     const at::Tensor& result, int64_t n,
                     const std::function<std::string()>& where) {
  DTENSOR_CHECK(result.defined(), where(), ": needs a defined result tensor");
  DTENSOR_CHECK(static_cast<int64_t>(send.size()) == n && static_cast<int64_t>(recv.size()) == n,
                where(), ": needs one list of send boxes and one of receive boxes per rank of the ",
                n, "-rank group, got ", send.size(), " and ", recv.size());
  const auto check = [&](const at::Tensor& b, const char* side) {
    DTENSOR_CHECK(
        b.defined() && b.scalar_type() == result.scalar_type() && b.device() == result.device(),
        where(), ": a ", side, " box is ",
        b.defined() ? c10::str(b.scalar_type(), " on ", b.device()) : "undefined", ", not ",
        result.scalar_type(), " on ", result.device(), " as the result");
  };
  for (const BoxList& list : send) {
    for (const at::Tensor& b : list) check(b, "send");
  }
  for (const BoxList& list : recv) {
    for (const at::Tensor& b : list) {
      check(b, "receive");
      DTENSOR_CHECK(!b.is_conj() && !b.is_neg(), where(),
                    ": a receive box has a pending conjugation or negation (a lazy view)");
      DTENSOR_CHECK(at::has_internal_overlap(b) != at::MemOverlap::Yes, where(),
                    ": a receive box of shape ", b.sizes(), " overlaps itself");
      for (const BoxList& sent : send) {
        for (const at::Tensor& s : sent) {
          DTENSOR_CHECK(b.numel() == 0 || s.numel() == 0 || !b.is_alias_of(s), where(),
                        ": a receive box shares storage with a send box");
        }
      }
    }
  }
}

at::Tensor flat_view(const BoxList& boxes) {
  const at::Tensor* first = nullptr;
  int64_t total = 0;
  const char* next = nullptr;
  for (const at::Tensor& b : boxes) {
    if (b.numel() == 0) continue;
    if (!b.is_contiguous() || b.is_conj() || b.is_neg()) return {};
    if (first == nullptr) {
      first = &b;
    } else if (!b.is_alias_of(*first) || b.data_ptr() != next) {
      return {};
    }
    total += b.numel();
    next = static_cast<const char*>(b.data_ptr()) + b.nbytes();
  }
  if (first == nullptr) return {};
  return first->as_strided({total}, {1}, first->storage_offset());
}

at::Tensor pack(const BoxList& boxes, const at::TensorOptions& options) {
  at::Tensor flat = flat_view(boxes);
  if (flat.defined()) return flat;
  flat = at::empty({numel_of(boxes)}, options);
  int64_t at = 0;
  for (const at::Tensor& b : boxes) {
    if (b.numel() == 0) continue;
    flat.narrow(0, at, b.numel()).view(b.sizes()).copy_(b);
    at += b.numel();
  }
  return flat;
}

void unpack(const at::Tensor& flat, const BoxList& boxes) {
  int64_t at = 0;
  for (const at::Tensor& b : boxes) {
    if (b.numel() == 0) continue;
    b.copy_(flat.narrow(0, at, b.numel()).view(b.sizes()));
    at += b.numel();
  }
}

BoxList sent_to(const CollectiveCall& call, int64_t d) {
  if (call.boxed()) return call.send_boxes[d];
  return {call.input.narrow(0, offset_of(call.input_splits, d), call.input_splits[d])};
}

BoxList received_from(const CollectiveCall& call, int64_t s) {
  if (call.boxed()) return call.recv_boxes[s];
  return {call.output.narrow(0, offset_of(call.output_splits, s), call.output_splits[s])};
}

bool boxes_fit(const CollectiveCall& call, int64_t n) {
  const auto fits = [&](const std::vector<BoxList>& lists, const std::vector<int64_t>& splits) {
    if (static_cast<int64_t>(lists.size()) != n || static_cast<int64_t>(splits.size()) != n) {
      return false;
    }
    for (int64_t r = 0; r < n; ++r) {
      for (const at::Tensor& b : lists[r]) {
        if (!b.defined() || !b.is_cpu() || b.scalar_type() != call.input.scalar_type()) {
          return false;
        }
      }
      if (numel_of(lists[r]) != splits[r]) return false;
    }
    return true;
  };
  return call.kind == CollectiveKind::kAllToAll && call.input.defined() &&
         fits(call.send_boxes, call.input_splits) && fits(call.recv_boxes, call.output_splits);
}

}  // namespace dtensor::collectives
