"""The paired prefill cache: prompt prefixes whose target KV *and* drafter context are kept together.

Keys are a hash chain over fixed blocks of tokens, so a prefix's key says nothing about what
follows it and equal prefixes get equal keys whatever the rest of the prompt:

    h1 = H(""  , tokens[0:32])    h2 = H(h1, tokens[32:64])    h3 = H(h2, tokens[64:96]) ...

An entry stores one prefix of n whole blocks (its target KV and drafter snapshot, both opaque
here) and is indexed under every h1..hn, because it serves any shorter block prefix too: a
request sharing only a 2-block system prompt with a stored 5-block prompt hits h2 and reuses the
first 64 tokens of that entry. Storing a prefix that extends an entry makes the old entry
redundant (the new one serves all it served), so it is dropped. Entries are evicted least
recently used first under a byte budget. Torch-free: the model side copies tensors or shares
KV-pool blocks.

An entry's payloads may hold something outside the cache (pool blocks, worker/serving/model_stepper.py):
`on_drop` is called with every entry that leaves (evicted, superseded, cleared) so their owner
lets go of it; `evict_oldest` drops one entry on demand (the pool short of free blocks).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BLOCK_TOKENS = 32


def block_hashes(token_ids: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[bytes]:
    """The hash chain over every whole block of `token_ids` (a partial last block is ignored)."""
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = array("q", token_ids[start : start + block_tokens]).tobytes()
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class PrefixEntry:
    hashes: list[bytes]  # one per block: the entry covers len(hashes) * block_tokens tokens
    target: Any  # the target's KV for those tokens
    drafter: Any  # the drafter's snapshot for those tokens (None without a drafter)
    num_bytes: int


@dataclass(slots=True)
class PrefixHit:
    num_tokens: int  # the reusable prefix: a whole number of blocks, <= the entry's length
    entry_tokens: int  # tokens the entry's target KV and drafter snapshot cover
    target: Any
    drafter: Any


@dataclass(slots=True)
class PrefixCacheStats:
    queries: int = 0
    hits: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evictions: int = 0


@dataclass(slots=True)
class _Index:
    # hash -> ids of the entries covering it, oldest first (an ordered set)
    entries: dict[bytes, dict[int, None]] = field(default_factory=dict)

    def add(self, entry_id: int, hashes: list[bytes]) -> None:
        for h in hashes:
            self.entries.setdefault(h, {})[entry_id] = None

    def remove(self, entry_id: int, hashes: list[bytes]) -> None:
        for h in hashes:
            ids = self.entries.get(h)
            if ids is not None:
                ids.pop(entry_id, None)
                if not ids:
                    del self.entries[h]

    def newest(self, h: bytes) -> int | None:
        ids = self.entries.get(h)
        return next(reversed(ids)) if ids else None


class PrefixCache:
    def __init__(
        self,
        max_bytes: int,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        on_drop: Callable[[PrefixEntry], None] | None = None,
    ):
        assert max_bytes >= 0 and block_tokens >= 1, (max_bytes, block_tokens)
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self.on_drop = on_drop  # called with each entry that leaves the cache
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # least recently used first
        self._index = _Index()
        self._next_id = 0
        self._bytes = 0

    @property
    def num_bytes(self) -> int:
        return self._bytes

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def storable_tokens(self, num_tokens: int) -> int:
        """The longest whole-block prefix of `num_tokens` tokens."""
        return num_tokens - num_tokens % self.block_tokens

    def lookup(self, token_ids: Sequence[int], max_tokens: int) -> PrefixHit | None:
        """The longest cached block prefix of `token_ids` with at most `max_tokens` tokens."""
        self.stats.queries += 1
        hashes = block_hashes(token_ids[: self.storable_tokens(max_tokens)], self.block_tokens)
        for num_blocks in range(len(hashes), 0, -1):
            entry_id = self._index.newest(hashes[num_blocks - 1])
            if entry_id is not None:
                return self._hit(entry_id, num_blocks * self.block_tokens)
        return None

    def covers(self, token_ids: Sequence[int]) -> bool:
        """Whether an entry already holds all of `token_ids` (a whole number of blocks)."""
        hashes = block_hashes(token_ids, self.block_tokens)
        return bool(hashes) and self._index.newest(hashes[-1]) is not None

    def insert(self, token_ids: Sequence[int], target: Any, drafter: Any, num_bytes: int) -> bool:
        """Store a prefix of whole blocks; False if it is already covered or larger than the budget."""
        assert len(token_ids) % self.block_tokens == 0 and token_ids, len(token_ids)
        if num_bytes > self.max_bytes or self.covers(token_ids):
            return False
        hashes = block_hashes(token_ids, self.block_tokens)
        self._drop_prefixes_of(hashes)
        self._evict_until_free(num_bytes)
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = PrefixEntry(hashes, target, drafter, num_bytes)
        self._index.add(entry_id, hashes)
        self._bytes += num_bytes
        self.stats.inserts += 1
        return True

    def clear(self) -> None:
        for entry_id in list(self._entries):
            self._remove(entry_id)

    def evict_oldest(self) -> bool:
        """Drop the least recently used entry; False if there is none."""
        if not self._entries:
            return False
        self._remove(next(iter(self._entries)))
        self.stats.evictions += 1
        return True

    def _hit(self, entry_id: int, num_tokens: int) -> PrefixHit:
        self._entries.move_to_end(entry_id)
        entry = self._entries[entry_id]
        self.stats.hits += 1
        self.stats.hit_tokens += num_tokens
        return PrefixHit(num_tokens, len(entry.hashes) * self.block_tokens, entry.target, entry.drafter)

    def _drop_prefixes_of(self, hashes: list[bytes]) -> None:
        # An entry whose last hash appears at the same depth in the new chain is a prefix of it.
        for depth, h in enumerate(hashes, start=1):
            for entry_id in list(self._index.entries.get(h, {})):
                if len(self._entries[entry_id].hashes) == depth:
                    self._remove(entry_id)

    def _evict_until_free(self, num_bytes: int) -> None:
        while self._bytes + num_bytes > self.max_bytes and self.evict_oldest():
            pass

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self._index.remove(entry_id, entry.hashes)
        self._bytes -= entry.num_bytes
        if self.on_drop is not None:
            self.on_drop(entry)
