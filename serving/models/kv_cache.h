#pragma once
// NOTE [paged KV cache]
// vLLM's paged attention bookkeeping: each layer's keys and values live in one pool allocated
// once at start, [kv_heads, num_blocks * block_size, head_dim] (kv heads sharded or replicated as
// the model's k/v projections are, NOTE [GQA heads across ranks] in hf_weights.h), sized from a
// byte budget. A sequence owns a block table: its position p lives at pool row
// table[p / block_size] * block_size + p % block_size. Blocks are taken from a free list as a
// sequence grows and returned when its slot is freed: no request allocates or moves cache
// memory, and a context is limited by the blocks left, not by a per-slot maximum. Attention
// gathers a sequence's rows by its table (index_select), writes new positions by index_copy_.
// Every rank runs the same forward calls, so every rank's tables are identical (the free list
// is a stack, deterministic). Admission (rank 0 only) reserves a request's whole length
// (prompt + max new tokens) so that a running request never finds the pool empty.

#include <cstdint>
#include <vector>

namespace dtensor::serving {

class BlockTables {
 public:
  // `max_seqs` slots over `num_blocks` blocks of `block_size` positions.
  BlockTables(int64_t num_blocks, int64_t block_size, int64_t max_seqs);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t max_seqs() const { return static_cast<int64_t>(slots_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // The lowest free slot; throws when every slot is in use.
  int alloc_slot();
  // Returns the slot's blocks to the free list; throws for a slot not allocated.
  void free_slot(int slot);
  bool allocated(int slot) const;

  // Blocks for `tokens` positions.
  int64_t blocks_for(int64_t tokens) const;
  // Whether `tokens` more positions fit next to every allocated slot's reservation.
  bool can_reserve(int64_t tokens) const;
  // Reserves blocks for `tokens` positions of `slot` (its length may grow that far without the
  // pool running out); throws when they do not fit.
  void reserve(int slot, int64_t tokens);

  // Makes `slot` hold blocks for positions [0, length); throws naming the pool's size when the
  // free list runs out.
  void grow(int slot, int64_t length);
  // Positions [0, length) the slot has blocks for.
  int64_t capacity(int slot) const;
  // Pool rows of positions [begin, end) of `slot` (all within its blocks).
  std::vector<int64_t> rows(int slot, int64_t begin, int64_t end) const;
  const std::vector<int64_t>& table(int slot) const;

 private:
  struct Slot {
    bool used = false;
    std::vector<int64_t> blocks;
    int64_t reserved_blocks = 0;
  };
  const Slot& slot_at(int slot) const;
  // Blocks promised to allocated slots but not yet taken by them.
  int64_t outstanding() const;

  int64_t num_blocks_, block_size_;
  std::vector<int64_t> free_;  // a stack: the next block is free_.back()
  std::vector<Slot> slots_;
};

}  // namespace dtensor::serving
