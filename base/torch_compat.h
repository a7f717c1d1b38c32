#pragma once
// NOTE [torch versions]: where the torch versions the engine builds against (Debian's 1.13, PyPI's
// 2.x: NOTE [torch from Python]) differ in an API the engine's own code implements, one macro
// here instead of version checks at each use.

#include <c10/core/Allocator.h>
#include <torch/version.h>

// c10::Allocator: allocate() is const in torch 1.x and not in 2.x, where copy_data() must also
// be implemented. A CPU allocator declares `DTENSOR_ALLOCATOR_ALLOCATE(n) { ... }` and
// `DTENSOR_ALLOCATOR_COPY_DATA` among its public members.
#if TORCH_VERSION_MAJOR >= 2
#define DTENSOR_ALLOCATOR_ALLOCATE(n) c10::DataPtr allocate(size_t n) override
#define DTENSOR_ALLOCATOR_COPY_DATA                                               \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    default_copy_data(dest, src, count);                                          \
  }
#else
#define DTENSOR_ALLOCATOR_ALLOCATE(n) c10::DataPtr allocate(size_t n) const override
#define DTENSOR_ALLOCATOR_COPY_DATA
#endif

// scaled_dot_product_attention's native composites with enable_gqa (torch >= 2.5), which the
// engine registers for distributed tensors (NOTE [SDPA's math path] in
// dtensor/dispatch_install.cc).
#define DTENSOR_TORCH_HAS_SDPA_GQA \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))
