"""What a sequence keeps for its gated DeltaNet layers, with the same commit contract as the KV cache.

Per linear-attention layer, two tensors summarise every committed token:
- the conv tail [conv_dim, kernel - 1]: the short convolution's last inputs;
- the delta-rule state [heads, dk, dv].

A forward never overwrites them: each layer *stages* what it computed (the conv window, old tail
then the new tokens' inputs, and the delta-rule state after each new token, or only after the
last for a prefill chunk); `commit(num_new, accepted)` then installs the state after the last
accepted row. Example: a chain verification over root + 3 drafts stages 4 states; two drafts
are accepted, rows [0, 1, 2] are kept, and the state after row 2 becomes the committed one.
In a tree the accepted rows are a root-to-node path, e.g. [0, 2, 5]: the state after row 5 (which
continued row 2's, which continued the root's), and as conv tail the inputs of the path's last
kernel - 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def conv_columns(parents: list[int], kernel: int) -> list[list[int]]:
    """Per new token, the `kernel` window columns its convolution reads, oldest first.

    Columns [0, kernel - 1) of a window hold the committed tail, column kernel - 1 + t new token t.
    A token reads itself, then its ancestors, then the tail. Example, kernel 3, parents
    [-1, 0, 0] (a root with two children): [[0, 1, 2], [1, 2, 3], [1, 2, 4]].
    """
    columns = []
    for t in range(len(parents)):
        window, node, tail = [kernel - 1 + t], parents[t], kernel - 2
        while len(window) < kernel:
            if node >= 0:
                window.append(kernel - 1 + node)
                node = parents[node]
            else:
                window.append(tail)
                tail -= 1
        columns.append(window[::-1])
    return columns


def chain_parents(num_tokens: int) -> list[int]:
    return list(range(-1, num_tokens - 1))


@dataclass(slots=True)
class StagedStep:
    conv_window: torch.Tensor  # [conv_dim, kernel - 1 + T]: committed tail, then the new tokens' inputs
    states: torch.Tensor  # [T, heads, dk, dv] after each new token, or [1, ...] after the last only
    every_position: bool  # False: only the last state was kept (a prefill chunk, committed whole)
    parents: list[int] | None = None  # a tree's: row i continues row parents[i] (-1: the committed state)
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)  # row -> the state after it (prefill cache)

    def tail_after(self, row: int, width: int) -> torch.Tensor:
        """The conv tail [conv_dim, width] once rows up to `row` (along its path) are committed."""
        if self.parents is None:
            return self.conv_window[:, row + 1 : row + 1 + width]
        columns = conv_columns(self.parents, width + 1)[row][1:]
        return self.conv_window[:, columns]


class NotAPath(ValueError):
    """Rows to commit that are not a root-to-node path of the forward that staged them."""


class RecurrentState:
    def __init__(
        self,
        num_layers: int,
        conv_dim: int,
        conv_kernel: int,
        state_shape: tuple[int, int, int],  # (heads, dk, dv)
        dtype: torch.dtype,
        state_dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        conv_tails = torch.zeros(num_layers, conv_dim, conv_kernel - 1, dtype=dtype, device=device)
        self._hold(conv_tails, torch.zeros(num_layers, *state_shape, dtype=state_dtype, device=device))

    @classmethod
    def over(cls, conv_tails: torch.Tensor, delta_states: torch.Tensor) -> RecurrentState:
        """A state kept in tensors someone else owns (a slot of the state pool, worker/models/hybrid/
        state_pool.py): commits and loads write into them, in place."""
        state = cls.__new__(cls)
        state._hold(conv_tails, delta_states)
        return state

    def _hold(self, conv_tails: torch.Tensor, delta_states: torch.Tensor) -> None:
        self.conv_tails = conv_tails  # [layers, conv_dim, kernel - 1]
        self.delta_states = delta_states  # [layers, heads, dk, dv]
        self.staged: list[StagedStep | None] = [None] * conv_tails.shape[0]
        # The committed state at some earlier lengths (the prefill cache's block boundaries):
        # length -> (conv tails, delta states), shaped as the two tensors above.
        self.snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv_tails, self.delta_states))

    def stage(self, layer: int, step: StagedStep) -> None:
        self.staged[layer] = step

    def commit(self, num_new: int, accepted: list[int], start: int = 0) -> None:
        """Install, in every layer, the state after the last of the `accepted` rows of `num_new` staged
        (`start`: the committed tokens before them, where staged snapshots are filed)."""
        width = self.conv_tails.shape[-1]
        snapshot_rows = self._snapshot_rows()
        tails: dict[int, list[torch.Tensor]] = {row: [] for row in snapshot_rows}
        states: dict[int, list[torch.Tensor]] = {row: [] for row in snapshot_rows}
        for layer, step in enumerate(self.staged):
            if step is None:
                continue
            assert step.conv_window.shape[-1] == width + num_new, "commit does not match the last forward"
            _check_path(accepted, step.parents or chain_parents(num_new))
            if accepted:
                last = accepted[-1]
                assert step.every_position or last == num_new - 1, (
                    "a prefill chunk (or a forward with logits past MAX_VERIFY_TOKENS rows) is committed whole"
                )
                self.delta_states[layer] = step.states[last if step.every_position else -1]
                self.conv_tails[layer] = step.tail_after(last, width)
            for row in snapshot_rows:
                tails[row].append(step.tail_after(row, width))
                states[row].append(step.snapshots[row])
            self.staged[layer] = None
        for row in snapshot_rows:
            self.snapshots[start + row + 1] = (torch.stack(tails[row]), torch.stack(states[row]))

    def _snapshot_rows(self) -> list[int]:
        """Rows after which every layer staged its state for a snapshot (a prefill chunk, committed whole)."""
        staged = [step for step in self.staged if step is not None]
        if not staged or not staged[0].snapshots:
            return []
        rows = sorted(staged[0].snapshots)
        assert len(staged) == len(self.staged) and all(sorted(s.snapshots) == rows for s in staged)
        return rows

    def states_through(self, num_tokens: int, length: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The states after the first `num_tokens` of `length` committed tokens and after each
        earlier snapshot (a prefix for the prefill cache); the current one is copied."""
        states = {n: state for n, state in self.snapshots.items() if n <= num_tokens}
        if num_tokens == length:
            states[num_tokens] = (self.conv_tails.clone(), self.delta_states.clone())
        assert num_tokens in states, f"no recurrent state was kept after {num_tokens} tokens"
        return states

    def thin_snapshots(self, most: int | None) -> None:
        """At most `most` snapshots (None: all): past it every other one goes, the newest kept, so
        a long prompt keeps states at a stride that doubles as it grows."""
        snapshots = self.snapshots
        while most is not None and len(snapshots) > most:
            kept = sorted(snapshots)[::-1][::2]  # the newest, then every other one before it
            self.snapshots = snapshots = {length: snapshots[length] for length in sorted(kept)}

    def load(self, conv_tails: torch.Tensor, delta_states: torch.Tensor) -> None:
        self.conv_tails.copy_(conv_tails)
        self.delta_states.copy_(delta_states)
        self.staged = [None] * len(self.staged)
        self.snapshots = {}


def _check_path(rows: list[int], parents: list[int]) -> None:
    previous = -1
    for row in rows:
        if not 0 <= row < len(parents) or parents[row] != previous:
            raise NotAPath(f"accepted rows {rows} of {len(parents)} are not a root-to-node path of the last forward")
        previous = row
