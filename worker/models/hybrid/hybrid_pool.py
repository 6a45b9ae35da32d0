"""Hybrid lanes in the block pool: attention K/V in paged blocks, recurrent state in a pool slot.

A hybrid model (Qwen3.5, Qwen3-Next) keeps K/V for its attention layers only. Those go into the
same paged KV pool as a plain model's (worker/models/kv_pool.py), sized for the attention layers:
blocks taken as the lane grows, block tables, preemption, prefixes shared by reference with the
prefill cache. Its recurrent layers' state, a fixed size whatever the length, lives in a slot of
the state pool (state_pool.py) while the lane runs.

`PagedHybridCache` is a `PagedKVCache` whose commit also commits the recurrent state (the state
after the accepted path's last row, as HybridCache does), and whose release also gives its slot
back. A cached prefix of a hybrid lane is `HybridBlocks`: the pool blocks holding its tokens
(shared, not copied) and the recurrent state at each of its block boundaries (copies: a state is
the state after one particular token, and the lane that kept it goes on changing its slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.models.config import ModelConfig
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.gated_attention import attention_view
from worker.models.hybrid.recurrent_state import RecurrentState
from worker.models.hybrid.state_pool import StatePool
from worker.models.kv_pool import KVPool, PagedKVCache

States = dict[int, tuple[torch.Tensor, torch.Tensor]]  # length -> (conv tails, delta states) after it


class HybridPool(KVPool):
    def __init__(
        self,
        config: HybridConfig,
        num_blocks: int,
        block_tokens: int,
        num_state_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        super().__init__(attention_kv_config(config), num_blocks, block_tokens, dtype, device)
        self.states = StatePool(config, num_state_slots, dtype, device)

    def new_cache(self, max_tokens: int) -> PagedHybridCache:
        return PagedHybridCache(self, max_tokens)

    @property
    def max_lanes(self) -> int | None:
        return self.states.num_slots


def attention_kv_config(config: HybridConfig) -> ModelConfig:
    """The attention layers' K/V sizes as a plain model's config (what KVPool is built from)."""
    return attention_view(config, len(config.attention_layers), config.head_dim)


class PagedHybridCache(PagedKVCache):
    """One hybrid lane: its block table (attention K/V) and, while it runs, a state slot."""

    pool: HybridPool

    def __init__(self, pool: HybridPool, max_tokens: int):
        super().__init__(pool, max_tokens)
        self._slot: int | None = None
        self._recurrent: RecurrentState | None = None
        # As HybridCache's: keep the state at each multiple of this many tokens a prefill chunk
        # passes (the prefill cache's blocks), at most `max_snapshots` of them (None: no limit).
        self.snapshot_every: int | None = None
        self.max_snapshots: int | None = None

    @property
    def recurrent(self) -> RecurrentState:
        """The lane's state, in its slot (taken on first use: a fresh or resumed lane)."""
        if self._recurrent is None:
            self._slot, self._recurrent = self.pool.states.acquire()
        return self._recurrent

    @property
    def holds_state_slot(self) -> bool:
        return self._slot is not None

    @property
    def num_bytes(self) -> int:
        state = 0 if self._recurrent is None else self._recurrent.num_bytes
        return super().num_bytes + state

    def reserve(self, num_tokens: int) -> None:
        super().reserve(num_tokens)
        _ = self.recurrent  # a forward is coming: the lane needs its slot

    def release(self) -> None:
        """Blocks and slot back: the lane holds nothing and must be prefilled again."""
        super().release()
        if self._slot is not None:
            self.pool.states.release(self._slot)
        self._slot, self._recurrent = None, None

    def commit(self, num_new: int, accepted: list[int] | None = None) -> None:
        """As HybridCache.commit: the accepted rows are a root-to-node path of the last forward;
        each recurrent layer keeps its state after the path's last row, and their K/V move into
        place through the block table."""
        if accepted is None:
            accepted = list(range(num_new))
        self.recurrent.commit(num_new, accepted, self.length)  # raises NotAPath for anything but a path
        self.recurrent.thin_snapshots(self.max_snapshots)
        super().commit(num_new, accepted)

    def truncate(self, length: int) -> None:
        """Recurrent state cannot be rewound: only a no-op truncation is possible."""
        assert length == self.length, "a hybrid cache cannot be truncated: its recurrent state summarises every token"

    def prefix(self, num_tokens: int) -> HybridBlocks:
        """The first `num_tokens` committed tokens (whole blocks) for the prefill cache: their blocks
        (the caller `share`s them; the lane writes none of them again) and copies of the states
        after them and after each earlier snapshot."""
        states = self.recurrent.states_through(num_tokens, self.length)
        return HybridBlocks(self.prefix_blocks(num_tokens), states, self.pool.block_tokens)

    def share_hybrid_prefix(self, prefix: HybridBlocks) -> None:
        """Start this fresh lane from a cached prefix: its blocks shared, its last state loaded into
        the lane's slot."""
        self.share_prefix(prefix.block_ids)
        recurrent = self.recurrent
        recurrent.load(*prefix.states[prefix.num_tokens])
        recurrent.snapshots = dict(prefix.states)  # read-only: the entry holds them too

    def forget_snapshots(self) -> None:
        """Prefill is over (its prefix stored or not): the snapshots are of no more use."""
        if self._recurrent is not None:
            self._recurrent.snapshots = {}


@dataclass(slots=True)
class HybridBlocks:
    """A cached prefix of a hybrid lane in the pool: the blocks holding its K/V, and the recurrent
    state after its last token and after each of its block boundaries (so it serves shorter
    prefixes)."""

    block_ids: list[int]
    states: States
    block_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.block_ids) * self.block_tokens

    @property
    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for state in self.states.values() for t in state)

    def cut(self, num_tokens: int) -> HybridBlocks:
        """The first `num_tokens` (a length with a state)."""
        assert num_tokens in self.states and num_tokens % self.block_tokens == 0, (num_tokens, sorted(self.states))
        states = {n: state for n, state in self.states.items() if n <= num_tokens}
        return HybridBlocks(self.block_ids[: num_tokens // self.block_tokens], states, self.block_tokens)
