"""Which blocks of the KV pool are free, and how many holders each used block has. Torch-free.

A block is `block_tokens` consecutive slots of the pool (worker/models/kv_pool.py). A lane holds
the blocks its tokens live in; a block may have several holders (a prefix shared by reference),
and goes back to the free list when its last holder lets go.

The prefill cache is a holder too (worker/serving/model_stepper.py: an entry holds the blocks of its
prefix). A block only the cache holds is *reclaimable*: when an allocation finds too few free
blocks, `reclaim` (set by the owner of the cache) drops cache entries, least recently used
first, until enough are free. So the scheduler counts free + reclaimable blocks as free.

Allocation prefers the block right after the caller's last one: a lane whose blocks are
consecutive is read in place, without gathering its K/V (kv_pool.PagedKVCache).
"""

from __future__ import annotations

from collections.abc import Callable


class OutOfBlocks(MemoryError):
    """The pool has fewer free blocks than asked for: the scheduler preempts before this happens."""


class BlockAllocator:
    def __init__(self, num_blocks: int):
        assert num_blocks >= 1, num_blocks
        self.num_blocks = num_blocks
        self._holders = [0] * num_blocks  # per block: how many hold it (0: free)
        self._cache_holds = [0] * num_blocks  # per block: how many of its holders are prefill-cache entries
        self._free: set[int] = set(range(num_blocks))
        self._reclaimable: set[int] = set()  # held, by the prefill cache alone
        # Called with the number of blocks an allocation is short of: frees what it can.
        self.reclaim: Callable[[int], None] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_reclaimable(self) -> int:
        """Blocks only the prefill cache holds: free once it lets go of them."""
        return len(self._reclaimable)

    def holders(self, block_id: int) -> int:
        return self._holders[block_id]

    def allocate(self, num: int, after: int | None = None) -> list[int]:
        """`num` free blocks, each with one holder: consecutive after `after` where they are free
        (reclaiming blocks the prefill cache alone holds where too few are)."""
        if num > len(self._free) and self.reclaim is not None:
            self.reclaim(num - len(self._free))
        if num > len(self._free):
            raise OutOfBlocks(f"asked for {num} KV blocks, {len(self._free)} of {self.num_blocks} are free")
        blocks: list[int] = []
        next_id = -1 if after is None else after + 1
        for _ in range(num):
            block_id = next_id if next_id in self._free else min(self._free)
            self._free.remove(block_id)
            self._holders[block_id] = 1
            blocks.append(block_id)
            next_id = block_id + 1
        return blocks

    def share(self, block_ids: list[int], by_cache: bool = False) -> None:
        """One more holder for each of `block_ids` (all in use): a lane, or a prefill-cache entry."""
        for block_id in block_ids:
            assert self._holders[block_id] > 0, f"block {block_id} is free: it cannot be shared"
            self._holders[block_id] += 1
            self._cache_holds[block_id] += by_cache
            self._classify(block_id)

    def free(self, block_ids: list[int], by_cache: bool = False) -> None:
        """One holder fewer for each; a block nobody holds is free again."""
        for block_id in block_ids:
            assert self._holders[block_id] > 0, f"block {block_id} freed more often than held"
            assert not by_cache or self._cache_holds[block_id] > 0, f"block {block_id} is not held by the cache"
            self._holders[block_id] -= 1
            self._cache_holds[block_id] -= by_cache
            if self._holders[block_id] == 0:
                self._free.add(block_id)
            self._classify(block_id)

    def _classify(self, block_id: int) -> None:
        holders = self._holders[block_id]
        if holders > 0 and holders == self._cache_holds[block_id]:
            self._reclaimable.add(block_id)
        else:
            self._reclaimable.discard(block_id)
