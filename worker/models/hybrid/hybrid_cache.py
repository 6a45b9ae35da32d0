"""A hybrid model's per-sequence cache: K/V for its attention layers, recurrent state for the rest.

One buffer of its own, sized for the lane's longest context (generate, tests, the transformers
oracle's comparisons); served lanes live in the block pool instead (hybrid_pool.py), with the
same commit contract.

It keeps the KV cache's contract (worker/models/kv_cache.py), so the model runner drives it
unchanged: a forward writes after the committed `length`, and `commit(num_new, accepted)` keeps
the accepted new tokens. Recurrent state cannot be rearranged the way K/V slots can: it is the
state after one particular token. So the accepted rows must be a root-to-node path of the
forward (a prefix for a chain: prefill chunks, plain decoding, chain speculation; in a tree,
where each node's state continued its parent's, any path), and the state after its last row is kept.

For the paired prefill cache, a prefill chunk also keeps the state at each block boundary it
passes (`snapshot_every`): a prefix is exported as its K/V plus those states (`HybridPrefix`), so
an entry serves any of its block prefixes, as K/V alone would for a plain model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.recurrent_state import RecurrentState
from worker.models.kv_cache import move_accepted_slots


class HybridCache:
    def __init__(self, config: HybridConfig, max_tokens: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (len(config.attention_layers), config.num_key_value_heads, max_tokens, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [attention layers, kv_heads, max_tokens, d]
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        state_shape = (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
        self.recurrent = RecurrentState(
            len(config.linear_layers),
            config.conv_dim,
            config.linear_conv_kernel_dim,
            state_shape,
            dtype,
            torch.promote_types(dtype, torch.float32),  # the delta rule runs in at least float32
            device,
        )
        self.max_tokens = max_tokens
        self.length = 0  # committed tokens
        # Keep the recurrent state at each multiple of this many tokens a prefill chunk passes
        # (the prefill cache's blocks: it can then serve any block prefix); None: keep none.
        self.snapshot_every: int | None = None
        # At most this many snapshots are kept (None: all): past it every other one goes, the
        # newest kept, so a long prompt keeps states at a stride that doubles as it grows.
        self.max_snapshots: int | None = None

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def layer_kv(
        self, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new K/V ([kv_heads, T, d] each) of attention layer `slot` at slots [start, start+T);
        return views of its slots [0, start+T) (the plain KV cache's interface)."""
        end = start + keys.shape[1]
        self.keys[slot, :, start:end] = keys
        self.values[slot, :, start:end] = values
        return self.keys[slot, :, :end], self.values[slot, :, :end]

    def blocks_needed(self, num_tokens: int) -> int:
        return 0  # preallocated: a hybrid lane's memory is its admission cost (bytes_for)

    def reserve(self, num_tokens: int) -> None:
        assert num_tokens <= self.max_tokens, "KV cache overflow: caller must check context length"

    def release(self) -> None:
        """Back to no tokens at all (a preempted lane is prefilled again from its first token)."""
        self.recurrent.load(torch.zeros_like(self.recurrent.conv_tails), torch.zeros_like(self.recurrent.delta_states))
        self.length = 0  # (load dropped the snapshots too)

    @property
    def num_bytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size() + self.recurrent.num_bytes

    @staticmethod
    def bytes_for(config: HybridConfig, max_tokens: int, dtype: torch.dtype) -> int:
        """`num_bytes` of such a cache, without allocating it (a lane's admission cost)."""
        size, state_size = _element_size(dtype), _element_size(torch.promote_types(dtype, torch.float32))
        kv = 2 * len(config.attention_layers) * config.num_key_value_heads * max_tokens * config.head_dim * size
        conv = config.conv_dim * (config.linear_conv_kernel_dim - 1) * size
        heads, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
        return kv + len(config.linear_layers) * (conv + heads * dk * dv * state_size)

    def bytes_per_token(self) -> int:
        """K/V bytes a token adds (the recurrent state is a fixed cost, whatever the length)."""
        return 2 * self.keys[:, :, 0].numel() * self.keys.element_size()

    def commit(self, num_new: int, accepted: list[int] | None = None) -> None:
        """Keep new rows `accepted` (all if None), a root-to-node path of the last forward.

        Example: a tree of root + 5 nodes was verified; the accepted path is rows [0, 2, 3]. Their
        K/V move to slots L, L+1, L+2 (as in KVCache), and each recurrent layer keeps its state
        after row 3. A chain's path is a prefix, [0, 1, 2]: its K/V are already in place.
        """
        if accepted is None:
            accepted = list(range(num_new))
        self.recurrent.commit(num_new, accepted, self.length)  # raises NotAPath for anything but a path
        self.recurrent.thin_snapshots(self.max_snapshots)
        move_accepted_slots(self.keys, self.values, self.length, accepted)
        self.length += len(accepted)

    def truncate(self, length: int) -> None:
        """Recurrent state cannot be rewound: only a no-op truncation is possible."""
        assert length == self.length, "a hybrid cache cannot be truncated: its recurrent state summarises every token"

    def prefix_kv(self, num_tokens: int) -> HybridPrefix:
        """Copies of the first `num_tokens` committed tokens' K/V, with the recurrent state after
        them and after every earlier snapshot (the prefix's own block boundaries)."""
        assert 0 < num_tokens <= self.length, (num_tokens, self.length)
        states = self.recurrent.states_through(num_tokens, self.length)
        keys, values = self.keys[:, :, :num_tokens].clone(), self.values[:, :, :num_tokens].clone()
        return HybridPrefix(keys, values, states)

    def load_prefix(self, prefix: HybridPrefix) -> None:
        """Continue from a cached prefix: its K/V copied in, its last recurrent state installed."""
        assert self.length == 0, self.length
        num_tokens = prefix.num_tokens
        self.keys[:, :, :num_tokens] = prefix.keys
        self.values[:, :, :num_tokens] = prefix.values
        self.recurrent.load(*prefix.states[num_tokens])
        self.recurrent.snapshots = dict(prefix.states)  # read-only: a longer prefix stored later holds them too
        self.length = num_tokens

    def forget_snapshots(self) -> None:
        """Prefill is over (its prefix stored or not): the snapshots are of no more use."""
        self.recurrent.snapshots = {}


@dataclass(slots=True)
class HybridPrefix:
    """A cached prefix of a hybrid model: K/V of its attention layers, and the recurrent state
    after its last token and after each of its block boundaries (so it serves shorter prefixes)."""

    keys: torch.Tensor  # [attention layers, kv_heads, n, head_dim]
    values: torch.Tensor
    states: dict[int, tuple[torch.Tensor, torch.Tensor]]  # length -> (conv tails, delta states)

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def num_bytes(self) -> int:
        tensors = [self.keys, self.values, *(t for state in self.states.values() for t in state)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def cut(self, num_tokens: int) -> HybridPrefix:
        """The first `num_tokens` (a length with a state): views, nothing copied."""
        assert num_tokens in self.states, (num_tokens, sorted(self.states))
        states = {n: state for n, state in self.states.items() if n <= num_tokens}
        return HybridPrefix(self.keys[:, :, :num_tokens], self.values[:, :, :num_tokens], states)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
