#pragma once
// What the scheduler (serving/scheduler.h) needs of a model: cache slots, one forward call per
// step, and its sizes. The demo's Llama (serving/llama.h) and the Hugging Face families
// (serving/models/hf_model.h) implement it.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace dtensor::serving {

// One sequence of a forward call: its cache slot, the new token ids (the prompt for a prefill,
// one token for a decode step) and the position of the first of them (the cache length so far).
struct Sequence {
  int slot = 0;
  std::vector<int64_t> tokens;
  int64_t start = 0;
};

// Bytes a model holds: its weights on this rank and in all, and its KV cache on this rank.
struct MemoryUse {
  int64_t weights_local = 0;
  int64_t weights_total = 0;
  int64_t kv_cache_local = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  // Cache slots: alloc_slot returns the lowest free one (every rank alike) and throws when all
  // are taken.
  virtual int alloc_slot() = 0;
  virtual void free_slot(int slot) = 0;

  // Appends each sequence's new positions to its slot's cache and returns the last position's
  // logits of each sequence: a plain float [n, vocab] CPU tensor, equal on every rank. All ranks
  // call it with the same batch.
  virtual at::Tensor forward(const std::vector<Sequence>& batch) = 0;

  // Whether a new sequence that will hold up to `tokens` positions fits in the cache next to the
  // admitted ones (rank 0's admission; NOTE [paged KV cache] in serving/models/kv_cache.h), and
  // that reservation for `slot`. A cache of fixed slots of max_context() always fits.
  virtual bool can_reserve(int64_t /*tokens*/) const { return true; }
  virtual void reserve(int /*slot*/, int64_t /*tokens*/) {}

  virtual int64_t vocab() const = 0;
  // The longest sequence (prompt and generated tokens) a slot holds.
  virtual int64_t max_context() const = 0;
  // Where the model's tensors (their local pieces) live.
  virtual c10::Device device() const = 0;
  virtual MemoryUse memory() const = 0;
};

}  // namespace dtensor::serving
