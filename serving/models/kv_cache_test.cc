// The paged KV cache's bookkeeping (NOTE [paged KV cache]): block tables, the free list,
// reservations, and the pool rows of positions.

#include "serving/models/kv_cache.h"

#include <gtest/gtest.h>

#include <set>

#include "base/error.h"

namespace dtensor::serving {
namespace {

TEST(BlockTables, GrowsByBlocksAndMapsPositionsToRows) {
  BlockTables t(/*num_blocks=*/6, /*block_size=*/4, /*max_seqs=*/2);
  const int a = t.alloc_slot(), b = t.alloc_slot();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  t.grow(a, 5);  // 2 blocks
  t.grow(b, 1);  // 1 block
  t.grow(a, 8);  // still 2 blocks
  EXPECT_EQ(t.table(a), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(t.table(b), (std::vector<int64_t>{2}));
  EXPECT_EQ(t.capacity(a), 8);
  EXPECT_EQ(t.free_blocks(), 3);
  // Position p of a slot: table[p / 4] * 4 + p % 4.
  EXPECT_EQ(t.rows(a, 2, 7), (std::vector<int64_t>{2, 3, 4, 5, 6}));
  t.grow(b, 6);
  EXPECT_EQ(t.table(b), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.rows(b, 3, 6), (std::vector<int64_t>{11, 12, 13}));
  EXPECT_THROW(t.rows(b, 0, 9), Error);  // past its blocks
}

TEST(BlockTables, FreedBlocksAreReusedAndSlotsTakeTheLowestFree) {
  BlockTables t(4, 2, 3);
  const int a = t.alloc_slot(), b = t.alloc_slot();
  t.grow(a, 4);
  t.grow(b, 4);
  EXPECT_EQ(t.free_blocks(), 0);
  EXPECT_THROW(t.grow(a, 5), Error);  // the pool is empty
  t.free_slot(a);
  EXPECT_FALSE(t.allocated(a));
  EXPECT_EQ(t.free_blocks(), 2);
  EXPECT_EQ(t.alloc_slot(), 0);  // the lowest free slot again
  t.grow(0, 3);
  EXPECT_EQ(t.table(0), (std::vector<int64_t>{0, 1}));  // a's blocks, in their order
  std::set<int64_t> all(t.table(0).begin(), t.table(0).end());
  for (int64_t blk : t.table(b)) EXPECT_TRUE(all.insert(blk).second) << "block shared";
  EXPECT_THROW(t.free_slot(2), Error);  // never allocated
  EXPECT_EQ(t.alloc_slot(), 2);
  EXPECT_THROW(t.alloc_slot(), Error);  // every slot is in use
}

TEST(BlockTables, ReservationsKeepBlocksForTheirSlot) {
  BlockTables t(5, 4, 3);
  const int a = t.alloc_slot();
  EXPECT_TRUE(t.can_reserve(20));
  EXPECT_FALSE(t.can_reserve(21));
  t.reserve(a, 12);  // 3 blocks promised, none taken yet
  EXPECT_TRUE(t.can_reserve(8));
  EXPECT_FALSE(t.can_reserve(9));
  const int b = t.alloc_slot();
  // b did not reserve: it may take only the 2 unpromised blocks.
  t.grow(b, 8);
  EXPECT_THROW(t.grow(b, 9), Error);
  // a gets its 3 blocks even though only 3 are free.
  t.grow(a, 12);
  EXPECT_EQ(t.free_blocks(), 0);
  EXPECT_THROW(t.reserve(b, 12), Error);
  t.free_slot(a);
  EXPECT_TRUE(t.can_reserve(12));
  EXPECT_EQ(t.blocks_for(0), 0);
  EXPECT_EQ(t.blocks_for(1), 1);
  EXPECT_EQ(t.blocks_for(4), 1);
  EXPECT_EQ(t.blocks_for(5), 2);
}

TEST(BlockTables, RejectsEmptySizes) {
  EXPECT_THROW(BlockTables(0, 4, 1), Error);
  EXPECT_THROW(BlockTables(4, 0, 1), Error);
  EXPECT_THROW(BlockTables(4, 4, 0), Error);
}

}  // namespace
}  // namespace dtensor::serving
