"""The `ngram` speculation mode: prompt lookup over the request's own tokens, drafted as a chain."""

from __future__ import annotations

from worker.drafters.ngram_index import NgramIndex
from worker.engine.drafter_protocol import TargetStates
from worker.engine.sequence import Sequence
from worker.speculation.tree import DraftTree


class PromptLookupDrafter:
    name = "ngram"
    hidden_layers: tuple[int, ...] = ()
    wants_final_hidden = False

    def __init__(self, num_draft: int = 3, min_n: int = 2, max_n: int = 4, max_history: int = 8192):
        self.num_draft, self.min_n, self.max_n, self.max_history = num_draft, min_n, max_n, max_history

    def start(self, sequence: Sequence) -> NgramIndex:
        return NgramIndex(self.min_n, self.max_n, self.num_draft, self.max_history)

    def observe(self, state: NgramIndex, committed: TargetStates) -> None:
        # Index prefill chunks as they are committed (so a prefix snapshot holds their index);
        # decode steps are caught up from the sequence's tokens in propose().
        if committed.start == state.num_seen:
            state.extend(committed.token_ids)

    def propose(self, state: NgramIndex, sequence: Sequence) -> DraftTree | None:
        tokens = state.propose(sequence.token_ids)
        return DraftTree.chain(tokens) if tokens else None

    def state_bytes(self, state: NgramIndex) -> int:
        return 64 * (state.num_indexed + min(state.num_seen, state.max_history))  # rough: dict entries + list

    def export_prefix(self, state: NgramIndex, num_tokens: int) -> NgramIndex | None:
        return state.prefix(num_tokens)  # the index is a function of the tokens: rebuild it for the prefix

    def import_prefix(self, sequence: Sequence, snapshot: NgramIndex | None) -> NgramIndex:
        if snapshot is None:
            return self.start(sequence)
        copy = snapshot.prefix(snapshot.num_seen)
        assert copy is not None
        return copy
