"""The drafter protocol: what the model runner asks of every speculation mode.

A drafter sees the target only through `TargetStates` (tokens just committed to the KV cache,
with the hidden states it asked for) and answers with a `DraftTree` of guesses for the tokens
after the current root. Its per-request state is opaque to the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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
