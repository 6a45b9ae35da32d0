"""The drafter protocol: what the model runner asks of every speculation mode.

A drafter sees the target only through `TargetStates` (tokens just committed to the KV cache,
with the hidden states it asked for) and answers with a `DraftTree` of guesses for the tokens
after the current root. Its per-request state is opaque to the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import torch

from worker.engine.sequence import Sequence
from worker.speculation.tree import DraftTree


class DrafterError(ValueError):
    """A drafter that cannot be loaded or does not fit its target: one line naming the problem."""


@dataclass(slots=True)
class TargetStates:
    """The target's view of tokens just committed at cache positions [start, start + len(token_ids))."""

    token_ids: list[int]
    start: int
    hidden: dict[int, torch.Tensor]  # layer -> [n, hidden]: output of that decoder layer
    final_hidden: torch.Tensor | None  # [n, hidden], after the final norm
    next_token: int  # the token after the last committed one: the next root


class Drafter(Protocol):
    name: str
    hidden_layers: tuple[int, ...]  # decoder layers whose outputs `observe` needs
    wants_final_hidden: bool

    def start(self, sequence: Sequence) -> Any:
        """A fresh per-request state (sized for the sequence's cache)."""

    def observe(self, state: Any, committed: TargetStates) -> None:
        """Advance the drafter's context by tokens the target just committed."""

    def propose(self, state: Any, sequence: Sequence) -> DraftTree | None:
        """Guesses for the tokens after `sequence.root_token`; None or an empty tree to skip drafting."""

    def state_bytes(self, state: Any) -> int:
        """Memory held by one request's state (the prefill cache budgets it)."""


class PrefixDrafter(Drafter, Protocol):
    """A drafter the paired prefill cache works with.

    The cache stores a drafter's context next to the target's KV for the same prefix. A drafter
    without these two methods still works; the cache is then off for it, since reusing the
    target's KV alone would leave the drafter blind to the prefix.
    """

    def export_prefix(self, state: Any, num_tokens: int) -> Any:
        """A snapshot (a copy) of what the first `num_tokens` committed tokens determine in `state`.

        `state` may itself be a snapshot (to cut a cached prefix shorter); `num_tokens` never
        exceeds the tokens the state has observed. The result must not share memory with `state`.
        """

    def import_prefix(self, sequence: Sequence, snapshot: Any) -> Any:
        """A fresh state for `sequence` that continues from `snapshot` (which stays untouched).

        The sequence's cache already holds the prefix's target KV; the next `observe` starts
        right after the prefix. The sequence's tokens after the prefix may be read.
        """


class LearningDrafter(Drafter, Protocol):
    """A drafter that learns from finished requests (suffix decoding: recent outputs of all requests)."""

    def finish(self, state: Any, sequence: Sequence) -> None:
        """`sequence` just finished (the runner set its finish reason); its output is final."""


def learns_from_outputs(drafter: Drafter | None) -> TypeGuard[LearningDrafter]:
    return hasattr(drafter, "finish")


def reuses_prefixes(drafter: Drafter) -> TypeGuard[PrefixDrafter]:
    return hasattr(drafter, "export_prefix") and hasattr(drafter, "import_prefix")


def supports_prefix_reuse(drafter: Drafter | None) -> bool:
    return drafter is None or reuses_prefixes(drafter)
