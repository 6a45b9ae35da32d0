"""The KV pool: every lane's K/V in one pair of tensors, handed out in fixed-size blocks.

    keys, values: [layers, kv_heads, num_blocks * block_tokens, head_dim]

Slot s of the pool belongs to block s // block_tokens. A lane's `PagedKVCache` holds a block
table; its token t lives in slot `block_ids[t // B] * B + t % B`. Memory is one setting
(ARBOR_KV_CACHE_BYTES): a lane takes blocks as it grows, not a full-context buffer up front, so
the number of lanes is bounded by the tokens they really hold.

Reading a lane's K/V for attention: where its blocks are consecutive (the allocator's first
choice) the lane's slots are one slice of the pool, read in place; otherwise one `index_select`
per layer gathers them (~4 us for 128 tokens on the 2-core CPU, a tenth of the attention itself).
Verification's scratch rows are slots past the lane's length, in blocks it already holds; commit
moves the accepted ones into place as KVCache.commit does, through the block table.

Prefixes are shared by reference (the prefill cache, worker/serving/model_stepper.py): `prefix_blocks`
names the blocks holding a lane's first n tokens, which a cache entry then holds too, and
`share_prefix` starts a fresh lane's table with such blocks (one more holder each), so many
lanes read one copy of a system prompt's K/V. A block may be shared only if it is whole and
below the lane's length; the lane writes at its length and after (new tokens, scratch rows,
commit's moves), so it never writes into a block another holder reads, and `release` drops
its holds without assuming it was the only one.

A hybrid model's lanes use the same pool for their attention layers' K/V, with their recurrent
state in slots beside it (worker/models/hybrid/hybrid_pool.py).
"""

from __future__ import annotations

import torch

from worker.models.block_allocator import BlockAllocator, OutOfBlocks
from worker.models.config import ModelConfig

__all__ = ["KVPool", "OutOfBlocks", "PagedKVCache"]

DEFAULT_BLOCK_TOKENS = 32  # the prefill cache's block (worker.serving.prefix_cache): a cached prefix is whole blocks
DEFAULT_MAX_KV_CACHE_BYTES = 2 << 30


class KVPool:
    def __init__(
        self, config: ModelConfig, num_blocks: int, block_tokens: int, dtype: torch.dtype, device: torch.device | str
    ):
        shape = (config.num_hidden_layers, config.num_key_value_heads, num_blocks * block_tokens, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.block_tokens = block_tokens
        self.allocator = BlockAllocator(num_blocks)
        self._offsets = torch.arange(block_tokens, device=device)

    @staticmethod
    def block_bytes(config: ModelConfig, block_tokens: int, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * block_tokens * element

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def bytes_per_block(self) -> int:
        return 2 * self.keys[:, :, : self.block_tokens].numel() * self.keys.element_size()

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def new_cache(self, max_tokens: int) -> PagedKVCache:
        return PagedKVCache(self, max_tokens)

    @property
    def max_lanes(self) -> int | None:
        """Lanes the pool can hold at once beside their blocks (a hybrid's state slots); None: no limit."""
        return None

    def slot_ids(self, block_ids: list[int]) -> torch.Tensor:
        blocks = torch.tensor(block_ids, device=self.device)
        return (blocks[:, None] * self.block_tokens + self._offsets).flatten()  # [len(block_ids) * B]


class PagedKVCache:
    """One lane's view of the pool: its block table and committed length (KVCache's interface)."""

    def __init__(self, pool: KVPool, max_tokens: int):
        self.pool = pool
        self.max_tokens = max_tokens  # the most the lane may ever hold (context + scratch)
        self.length = 0  # committed tokens
        self.block_ids: list[int] = []
        self._slots: torch.Tensor | None = None  # slot of each token the blocks can hold
        self._first_slot: int | None = None  # where the blocks are consecutive: the first one's slot
        self.shared_tokens = 0  # tokens in blocks others may hold too: never written again

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def num_bytes(self) -> int:
        return len(self.block_ids) * self.pool.bytes_per_block

    @property
    def capacity(self) -> int:
        return len(self.block_ids) * self.pool.block_tokens

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks to take before slots [0, num_tokens) all exist."""
        return max(self.pool.blocks_for(num_tokens) - len(self.block_ids), 0)

    def reserve(self, num_tokens: int) -> None:
        """Take the blocks slots [0, num_tokens) need (raises OutOfBlocks, holding nothing new)."""
        assert num_tokens <= self.max_tokens, (num_tokens, self.max_tokens)
        needed = self.blocks_needed(num_tokens)
        if needed == 0:
            return
        after = self.block_ids[-1] if self.block_ids else None
        self.block_ids += self.pool.allocator.allocate(needed, after)
        self._table_changed()

    def release(self) -> None:
        """Give every block back; the lane holds nothing and must be prefilled again."""
        self.pool.allocator.free(self.block_ids)
        self.block_ids = []
        self.length = 0
        self.shared_tokens = 0
        self._table_changed()

    def layer_kv(
        self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new K/V ([kv_heads, T, d] each) at tokens [start, start+T); return the layer's
        K/V for tokens [0, start+T) ([kv_heads, start+T, d] each)."""
        end = start + keys.shape[1]
        assert start >= self.shared_tokens, f"a lane writes token {start} into a shared block"
        pool_keys, pool_values = self.pool.keys[layer], self.pool.values[layer]
        first = self._first_slot
        if first is not None:  # consecutive blocks: slices of the pool
            pool_keys[:, first + start : first + end] = keys
            pool_values[:, first + start : first + end] = values
            return pool_keys[:, first : first + end], pool_values[:, first : first + end]
        slots = self._slots
        assert slots is not None and end <= slots.shape[0], "reserve() the lane's blocks before a forward"
        new = slots[start:end]
        pool_keys.index_copy_(1, new, keys)
        pool_values.index_copy_(1, new, values)
        read = slots[:end]
        return pool_keys.index_select(1, read), pool_values.index_select(1, read)

    def token_slots(self, end: int) -> torch.Tensor:
        """[end] the pool slot of each token [0, end) (the blocks must be reserved)."""
        slots = self._slots
        assert slots is not None and end <= slots.shape[0], "reserve() the lane's blocks before a forward"
        return slots[:end]

    def commit(self, num_new: int, accepted: list[int] | None = None) -> None:
        """As KVCache.commit: scratch tokens `length + accepted[i]` become tokens `length + i`."""
        start = self.length
        if accepted is None:
            accepted = list(range(num_new))
        assert all(0 <= i < num_new for i in accepted), (accepted, num_new)
        if accepted != list(range(len(accepted))):
            slots = self._slots
            assert slots is not None
            source = slots[torch.tensor(accepted, device=self.device) + start]
            target = slots[start : start + len(accepted)]
            for tensor in (self.pool.keys, self.pool.values):
                tensor[:, :, target] = tensor[:, :, source]
        self.length = start + len(accepted)

    def truncate(self, length: int) -> None:
        assert self.shared_tokens <= length <= self.length, (self.shared_tokens, length, self.length)
        self.length = length

    def load_prefix(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install a cached prefix ([layers, kv_heads, n, head_dim] each) as the committed tokens."""
        num_tokens = keys.shape[2]
        self.reserve(num_tokens)
        assert self._slots is not None
        slots = self._slots[:num_tokens]
        self.pool.keys[:, :, slots] = keys
        self.pool.values[:, :, slots] = values
        self.length = num_tokens

    def prefix_kv(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the first `num_tokens` committed tokens' K/V ([layers, kv_heads, n, head_dim] each)."""
        assert 0 < num_tokens <= self.length, (num_tokens, self.length)
        assert self._slots is not None
        slots = self._slots[:num_tokens]
        return self.pool.keys[:, :, slots], self.pool.values[:, :, slots]

    def prefix_blocks(self, num_tokens: int) -> list[int]:
        """The blocks holding the first `num_tokens` committed tokens (whole blocks), to be held
        by another (the caller `share`s them); the lane writes none of them again."""
        block_tokens = self.pool.block_tokens
        assert 0 < num_tokens <= self.length and num_tokens % block_tokens == 0, (num_tokens, self.length)
        self.shared_tokens = max(self.shared_tokens, num_tokens)
        return self.block_ids[: num_tokens // block_tokens]

    def share_prefix(self, block_ids: list[int]) -> None:
        """Start this fresh lane from a prefix held in `block_ids` (one more holder each): its
        first len(block_ids) * block_tokens tokens, committed; its own tokens go in new blocks."""
        assert not self.block_ids and self.length == 0 and block_ids, (self.block_ids, block_ids)
        num_tokens = len(block_ids) * self.pool.block_tokens
        assert num_tokens <= self.max_tokens, (num_tokens, self.max_tokens)
        self.pool.allocator.share(block_ids)
        self.block_ids = list(block_ids)
        self.length = self.shared_tokens = num_tokens
        self._table_changed()

    def _table_changed(self) -> None:
        blocks = self.block_ids
        if not blocks:
            self._slots, self._first_slot = None, None
            return
        consecutive = blocks == list(range(blocks[0], blocks[0] + len(blocks)))
        self._first_slot = blocks[0] * self.pool.block_tokens if consecutive else None
        self._slots = self.pool.slot_ids(blocks)


class PackedRows:
    """Lanes of one pool attending together: one padded gather and one set of ops a layer for all
    of them, instead of ~10 small ops a lane a layer (16 lanes of a 30-layer model: ~4,800 calls a
    step, a quarter of it on the 2-core CPU). Lanes may bring several rows (a chain or a tree to
    verify): queries are padded to the most rows, keys to the longest lane, and one boolean mask
    [lanes, rows, keys] says what each real row may see (its lane's committed tokens and, among
    its new rows, its causal or tree mask); padding rows see one key and are dropped.
    The indices are built once per step and serve every layer.
    """

    def __init__(
        self, pool: KVPool, caches: list[PagedKVCache], first_rows: list[int], masks: list[torch.Tensor | None]
    ):
        device = pool.device
        num_new = [1 if mask is None else mask.shape[0] for mask in masks]
        lengths = [cache.length + n for cache, n in zip(caches, num_new, strict=True)]
        longest, most_rows, num_lanes = max(lengths), max(num_new), len(caches)
        read = torch.zeros(num_lanes, longest, dtype=torch.long, device=device)
        visible = torch.zeros(num_lanes, most_rows, longest, dtype=torch.bool, device=device)
        visible[:, :, 0] = True  # padding rows: one key, so their softmax stays finite
        query_rows = torch.zeros(num_lanes, most_rows, dtype=torch.long, device=device)
        writes: list[torch.Tensor] = []
        real: list[int] = []
        for lane, (cache, n, length, mask) in enumerate(zip(caches, num_new, lengths, masks, strict=True)):
            assert cache._slots is not None and length <= cache._slots.shape[0], "reserve() before a forward"
            read[lane, :length] = cache._slots[:length]
            visible[lane, :n, :length] = True if mask is None else mask
            query_rows[lane, :n] = torch.arange(first_rows[lane], first_rows[lane] + n, device=device)
            writes.append(cache._slots[cache.length : length])
            real.extend(lane * most_rows + t for t in range(n))
        self.pool = pool
        self.rows = torch.cat([query_rows[lane, :n] for lane, n in enumerate(num_new)])  # [N]: the step rows
        self.query_rows = query_rows.flatten()  # [B * T]
        self.real = torch.tensor(real, device=device)  # [N]: which padded rows are real, in `rows` order
        self.write = torch.cat(writes)  # [N]
        self.read = read.flatten()  # [B * S]
        self.visible = visible  # [B, T, S]
        self.shape = (num_lanes, most_rows, longest)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [heads, R, d] (the whole step's rows), k/v [kv_heads, N, d] (these lanes' new rows, in
        `rows` order) -> attention output [heads, N, d] for `rows`."""
        pool_keys, pool_values = self.pool.keys[layer], self.pool.values[layer]
        pool_keys.index_copy_(1, self.write, k)
        pool_values.index_copy_(1, self.write, v)
        num_lanes, most_rows, longest = self.shape
        num_heads, head_dim = q.shape[0], q.shape[2]
        num_kv_heads = k.shape[0]
        group = num_heads // num_kv_heads
        keys = pool_keys.index_select(1, self.read).view(num_kv_heads, num_lanes, longest, head_dim)
        values = pool_values.index_select(1, self.read).view(num_kv_heads, num_lanes, longest, head_dim)
        queries = q.index_select(1, self.query_rows).view(num_kv_heads, group, num_lanes, most_rows, head_dim)
        queries = queries.transpose(1, 2).reshape(num_kv_heads, num_lanes, group * most_rows, head_dim)
        scores = torch.matmul(queries, keys.transpose(2, 3)) * head_dim**-0.5  # [kv, B, G*T, S]
        visible = self.visible[:, None].expand(num_lanes, group, most_rows, longest)
        scores = scores.masked_fill(~visible.reshape(1, num_lanes, group * most_rows, longest), float("-inf"))
        compute = torch.promote_types(q.dtype, torch.float32)
        probs = torch.softmax(scores.to(compute), dim=-1).to(q.dtype)
        out = torch.matmul(probs, values).view(num_kv_heads, num_lanes, group, most_rows, head_dim)
        out = out.permute(0, 2, 1, 3, 4).reshape(num_heads, num_lanes * most_rows, head_dim)
        return out.index_select(1, self.real)  # [heads, N, d]
