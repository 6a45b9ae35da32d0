"""A per-sequence KV cache with scratch-slot commit for speculative verification.

Slots [0, length) hold committed tokens. A verification forward writes its K/V into slots
[length, length + num_new); `commit` then moves the accepted subset into place and advances
`length`, which implicitly discards everything else written there.

It holds up to `max_tokens` (the lane's longest context) but allocates as it is used:
INITIAL_TOKENS first, then twice as many each time `reserve` asks for more (copying what it
holds), so a lane's memory follows its length rather than the longest it could reach (a drafter's
cache beside a 262,144-token context would otherwise be gigabytes a lane from its first token).
Every forward `reserve`s its rows first (decoder.lane_spans).
"""

from __future__ import annotations

import torch

from worker.models.config import ModelConfig

INITIAL_TOKENS = 256


class KVCache:
    def __init__(self, config: ModelConfig, max_tokens: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (config.num_hidden_layers, config.num_key_value_heads, min(max_tokens, INITIAL_TOKENS), config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [layers, kv_heads, allocated, head_dim]
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_tokens = max_tokens
        self.length = 0  # committed tokens

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def num_bytes(self) -> int:
        """What it holds now (allocated)."""
        return 2 * self.keys.numel() * self.keys.element_size()

    def bytes_per_token(self) -> int:
        return 2 * self.keys[:, :, 0].numel() * self.keys.element_size()

    def commit(self, num_new: int, accepted: list[int] | None = None) -> None:
        """Keep scratch slots `length + accepted[i]` as the next committed tokens (all, in order, if None).

        Example: a tree of 5 nodes was written to slots [L, L+5); the accepted path is nodes
        [0, 2, 3]; their K/V move to slots L, L+1, L+2 and the cache length becomes L+3.
        """
        start = self.length
        if accepted is None:
            accepted = list(range(num_new))
        assert all(0 <= i < num_new for i in accepted), (accepted, num_new)
        move_accepted_slots(self.keys, self.values, start, accepted)
        self.length = start + len(accepted)

    def layer_kv(
        self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new K/V ([kv_heads, T, d] each) at slots [start, start+T); return views of the
        layer's slots [0, start+T) (the interface worker.models.kv_pool.PagedKVCache shares)."""
        end = start + keys.shape[1]
        self.keys[layer, :, start:end] = keys
        self.values[layer, :, start:end] = values
        return self.keys[layer, :, :end], self.values[layer, :, :end]

    def blocks_needed(self, num_tokens: int) -> int:
        return 0  # no pool blocks: its own buffer

    def reserve(self, num_tokens: int) -> None:
        """Room for slots [0, num_tokens): grows the buffer (at least doubling) where it is short."""
        assert num_tokens <= self.max_tokens, "KV cache overflow: caller must check context length"
        allocated = self.keys.shape[2]
        if num_tokens <= allocated:
            return
        size = min(max(num_tokens, 2 * allocated), self.max_tokens)
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = old.new_zeros(old.shape[0], old.shape[1], size, old.shape[3])
            grown[:, :, :allocated] = old
            setattr(self, name, grown)

    def release(self) -> None:
        self.length = 0

    def prefix_kv(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the first `num_tokens` committed tokens' K/V ([layers, kv_heads, n, head_dim] each)."""
        assert 0 < num_tokens <= self.length, (num_tokens, self.length)
        return self.keys[:, :, :num_tokens].clone(), self.values[:, :, :num_tokens].clone()

    def truncate(self, length: int) -> None:
        assert 0 <= length <= self.length
        self.length = length

    def load_prefix(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install a cached prefix ([layers, kv_heads, n, head_dim] each) as the committed tokens."""
        n = keys.shape[2]
        self.reserve(n)
        self.keys[:, :, :n] = keys
        self.values[:, :, :n] = values
        self.length = n


def move_accepted_slots(keys: torch.Tensor, values: torch.Tensor, start: int, accepted: list[int]) -> None:
    """Scratch slots `start + accepted[i]` to slots `start + i`, in place (a prefix is already there).
    keys, values: [layers, kv_heads, max_tokens, head_dim]."""
    if accepted != list(range(len(accepted))):
        source = torch.tensor(accepted, device=keys.device) + start
        keys[:, :, start : start + len(accepted)] = keys[:, :, source]
        values[:, :, start : start + len(accepted)] = values[:, :, source]
