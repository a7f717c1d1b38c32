#include "serving/models/kv_cache.h"

#include <algorithm>

#include "base/error.h"

namespace dtensor::serving {

BlockTables::BlockTables(int64_t num_blocks, int64_t block_size, int64_t max_seqs)
    : num_blocks_(num_blocks), block_size_(block_size), slots_(static_cast<size_t>(max_seqs)) {
  DTENSOR_CHECK(num_blocks > 0 && block_size > 0 && max_seqs > 0, "paged KV cache: blocks (",
                num_blocks, "), block size (", block_size, ") and sequences (", max_seqs,
                ") must be positive");
  // Block 0 on top: the first sequence gets blocks 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

const BlockTables::Slot& BlockTables::slot_at(int slot) const {
  DTENSOR_CHECK(slot >= 0 && slot < max_seqs() && slots_[slot].used, "paged KV cache: slot ", slot,
                " is not allocated");
  return slots_[slot];
}

bool BlockTables::allocated(int slot) const {
  return slot >= 0 && slot < max_seqs() && slots_[slot].used;
}

int BlockTables::alloc_slot() {
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (!slots_[s].used) {
      slots_[s] = Slot{true, {}, 0};
      return static_cast<int>(s);
    }
  }
  fail("paged KV cache: all ", max_seqs(), " sequence slots are in use");
}

void BlockTables::free_slot(int slot) {
  slot_at(slot);
  Slot& s = slots_[slot];
  // Last block first back on the stack, so a freed table's blocks come back in its order.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  s = Slot{};
}

int64_t BlockTables::blocks_for(int64_t tokens) const {
  return (std::max<int64_t>(tokens, 0) + block_size_ - 1) / block_size_;
}

int64_t BlockTables::outstanding() const {
  int64_t n = 0;
  for (const Slot& s : slots_) {
    if (s.used)
      n += std::max<int64_t>(0, s.reserved_blocks - static_cast<int64_t>(s.blocks.size()));
  }
  return n;
}

bool BlockTables::can_reserve(int64_t tokens) const {
  return blocks_for(tokens) <= free_blocks() - outstanding();
}

void BlockTables::reserve(int slot, int64_t tokens) {
  slot_at(slot);
  Slot& s = slots_[slot];
  const int64_t want = blocks_for(tokens);
  const int64_t extra = want - std::max(s.reserved_blocks, static_cast<int64_t>(s.blocks.size()));
  DTENSOR_CHECK(extra <= free_blocks() - outstanding(), "paged KV cache: ", tokens,
                " positions need ", want, " blocks of ", block_size_, "; ",
                free_blocks() - outstanding(), " of ", num_blocks_, " are unreserved");
  s.reserved_blocks = std::max(s.reserved_blocks, want);
}

void BlockTables::grow(int slot, int64_t length) {
  slot_at(slot);
  Slot& s = slots_[slot];
  const int64_t want = blocks_for(length);
  if (static_cast<int64_t>(s.blocks.size()) >= want) return;
  // Blocks reserved by other slots stay theirs.
  int64_t others = outstanding() -
                   std::max<int64_t>(0, s.reserved_blocks - static_cast<int64_t>(s.blocks.size()));
  const int64_t need = want - static_cast<int64_t>(s.blocks.size());
  DTENSOR_CHECK(need <= free_blocks() - others, "paged KV cache: slot ", slot, " needs ", need,
                " more blocks of ", block_size_, " positions for length ", length, "; ",
                free_blocks() - others, " of ", num_blocks_,
                " are free (raise --kv-cache-memory or lower --max-batch)");
  while (static_cast<int64_t>(s.blocks.size()) < want) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
}

int64_t BlockTables::capacity(int slot) const {
  return static_cast<int64_t>(slot_at(slot).blocks.size()) * block_size_;
}

std::vector<int64_t> BlockTables::rows(int slot, int64_t begin, int64_t end) const {
  const Slot& s = slot_at(slot);
  DTENSOR_CHECK(0 <= begin && begin <= end && end <= capacity(slot), "paged KV cache: positions ",
                begin, "..", end, " of slot ", slot, " are outside its ", capacity(slot),
                " allocated positions");
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  for (int64_t p = begin; p < end; ++p) {
    out.push_back(s.blocks[p / block_size_] * block_size_ + p % block_size_);
  }
  return out;
}

const std::vector<int64_t>& BlockTables::table(int slot) const { return slot_at(slot).blocks; }

}  // namespace dtensor::serving
