"""Block allocator bookkeeping: holder counts, blocks only the prefill cache holds, reclaim. No torch."""

from __future__ import annotations

import pytest

from worker.models.block_allocator import BlockAllocator, OutOfBlocks


def test_a_block_held_only_by_the_cache_is_reclaimable_and_free_after_its_last_holder():
    allocator = BlockAllocator(4)
    blocks = allocator.allocate(2)  # a lane's
    allocator.share(blocks, by_cache=True)  # and a cache entry's
    assert allocator.num_reclaimable == 0 and allocator.holders(blocks[0]) == 2
    allocator.share(blocks[:1])  # a second lane shares the first block
    allocator.free(blocks)  # the first lane is done
    assert allocator.num_reclaimable == 1 and allocator.num_free == 2  # block 1: the cache's alone
    allocator.free(blocks[:1])  # the second lane is done
    assert allocator.num_reclaimable == 2
    allocator.free(blocks, by_cache=True)
    assert allocator.num_reclaimable == 0 and allocator.num_free == 4


def test_an_allocation_short_of_free_blocks_asks_reclaim_first():
    allocator = BlockAllocator(3)
    cached = allocator.allocate(2)
    allocator.share(cached, by_cache=True)
    allocator.free(cached)  # the lane left: the cache alone holds them
    asked: list[int] = []

    def reclaim(num_blocks: int) -> None:
        asked.append(num_blocks)
        dropped = cached[:num_blocks]
        del cached[:num_blocks]
        allocator.free(dropped, by_cache=True)

    allocator.reclaim = reclaim
    assert len(allocator.allocate(2)) == 2 and asked == [1]
    with pytest.raises(OutOfBlocks):
        allocator.allocate(2)  # one cached block left: reclaimed, still one short
    assert asked == [1, 2] and allocator.num_free == 1


def test_the_cache_cannot_free_a_hold_it_does_not_have():
    allocator = BlockAllocator(2)
    blocks = allocator.allocate(1)
    with pytest.raises(AssertionError):
        allocator.free(blocks, by_cache=True)
