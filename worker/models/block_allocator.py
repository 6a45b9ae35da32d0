"""Which blocks of the KV pool are free, and how many holders each used block has. Torch-free.

A block is `block_tokens` consecutive slots of the pool (worker/models/kv_pool.py). A lane holds
the blocks its tokens live in; a block may have several holders (a prefix shared by reference),
and goes back to the free list when its last holder lets go.

Allocation prefers the block right after the caller's last one: a lane whose blocks are
consecutive is read in place, without gathering its K/V (kv_pool.PagedKVCache).
"""

from __future__ import annotations


class OutOfBlocks(MemoryError):
    """The pool has fewer free blocks than asked for: the scheduler preempts before this happens."""


class BlockAllocator:
    def __init__(self, num_blocks: int):
        assert num_blocks >= 1, num_blocks
        self.num_blocks = num_blocks
        self._holders = [0] * num_blocks  # per block: how many hold it (0: free)
        self._free: set[int] = set(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def holders(self, block_id: int) -> int:
        return self._holders[block_id]

    def allocate(self, num: int, after: int | None = None) -> list[int]:
        """`num` free blocks, each with one holder: consecutive after `after` where they are free."""
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

    def share(self, block_ids: list[int]) -> None:
        """One more holder for each of `block_ids` (all in use)."""
        for block_id in block_ids:
            assert self._holders[block_id] > 0, f"block {block_id} is free: it cannot be shared"
            self._holders[block_id] += 1

    def free(self, block_ids: list[int]) -> None:
        """One holder fewer for each; a block nobody holds is free again."""
        for block_id in block_ids:
            assert self._holders[block_id] > 0, f"block {block_id} freed more often than held"
            self._holders[block_id] -= 1
            if self._holders[block_id] == 0:
                self._free.add(block_id)
