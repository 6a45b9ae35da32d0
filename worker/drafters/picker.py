"""The `auto` speculation mode: each lane drafts, step by step, from the source that promises most.

Two sources stand behind it: a model drafter (the MTP head, where the model has one) and suffix
decoding (worker.drafters.suffix: the lane's own prompt and output, and recent outputs of all
requests). Before each step, per lane:

    suffix: its proposal's expected tokens, from the suffix trees' frequencies (1 + score);
    model:  1 + p1 + p1 p2 + ... over the draft's depths, with p_d the lane's recent conditional
            acceptance of the model's drafts at depth d (worker.speculation.acceptance);

the larger wins, the suffix on a tie: it costs microseconds of CPU where the head costs a
forward per draft token (and the head is not asked at all then). Agentic text, where a tool
result is quoted or an answer repeats the structure of the last one, goes to the suffix; free
prose, where nothing matches, to the head. A grammar's forced tokens come first, in every mode
(worker.engine.runner), and adaptive speculation then limits the chosen draft to what pays at
this load (worker.speculation.adaptive).

The model drafter observes every committed token whichever source drafted, so it is ready when
its turn comes (deferred while adaptive speculation drafts nothing, as on its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.drafters.base import Drafter, TargetStates, reuses_prefixes
from worker.drafters.suffix import SuffixDrafter, SuffixState
from worker.engine.sequence import Sequence
from worker.speculation.acceptance import DepthAcceptance, expected_tokens
from worker.speculation.tree import DraftTree

MODEL_PRIOR = 0.5  # the model's acceptance at a depth before the lane has seen its drafts there
SUFFIX = "suffix"


@dataclass(slots=True)
class PickerState:
    suffix: SuffixState
    model: Any = None  # the model drafter's own state
    model_acceptance: DepthAcceptance = field(default_factory=DepthAcceptance)
    model_draft: list[int] = field(default_factory=list)  # the model's last chain, until observed


class SourcePicker:
    name = "auto"

    def __init__(self, model: Drafter | None, suffix: SuffixDrafter):
        self.model, self.suffix = model, suffix
        self.hidden_layers: tuple[int, ...] = model.hidden_layers if model is not None else ()
        self.wants_final_hidden = bool(model is not None and model.wants_final_hidden)
        model_budget = 0 if model is None else getattr(model, "tree_budget", None) or getattr(model, "num_draft", 0)
        self.tree_budget = max(int(model_budget or 0), suffix.tree_budget)  # rows a verification needs

    def start(self, sequence: Sequence) -> PickerState:
        model = self.model
        return PickerState(self.suffix.start(sequence), model.start(sequence) if model is not None else None)

    def observe(self, state: PickerState, committed: TargetStates) -> None:
        self.observe_many([(state, committed)])

    def observe_many(self, items: list[tuple[PickerState, TargetStates]]) -> None:
        for state, committed in items:
            self._learn(state, committed)
            self.suffix.observe(state.suffix, committed)
        model = self.model
        if model is None:
            return
        if hasattr(model, "observe_many"):
            model.observe_many([(state.model, committed) for state, committed in items])
        else:
            for state, committed in items:
                model.observe(state.model, committed)

    def propose(self, state: PickerState, sequence: Sequence) -> DraftTree | None:
        return self.propose_many([(state, sequence)])[0]

    def propose_many(self, items: list[tuple[PickerState, Sequence]]) -> list[DraftTree | None]:
        trees: list[DraftTree | None] = [None] * len(items)
        to_model: list[int] = []
        for index, (state, sequence) in enumerate(items):
            proposal = self.suffix.proposal(state.suffix, sequence)
            suffix_expected = 1.0 if proposal is None else proposal.expected_tokens
            if self.model is not None and self._model_expected(state, sequence) > suffix_expected:
                to_model.append(index)
            else:
                trees[index] = None if proposal is None else _named(proposal.tree, SUFFIX)
                state.model_draft = []
        model_name = self.model.name if self.model is not None else ""
        for index, tree in zip(to_model, self._model_propose([items[i] for i in to_model]), strict=True):
            trees[index] = None if tree is None else _named(tree, model_name)
            items[index][0].model_draft = list(tree.tokens) if tree is not None and tree.is_chain else []
        return trees

    def finish(self, state: PickerState, sequence: Sequence) -> None:
        self.suffix.finish(state.suffix, sequence)

    def state_bytes(self, state: PickerState) -> int:
        model_bytes = self.model.state_bytes(state.model) if self.model is not None else 0
        return self.suffix.state_bytes(state.suffix) + model_bytes

    def export_prefix(self, state: PickerState, num_tokens: int) -> PickerState | None:
        model = self.model
        snapshot = None
        if model is not None:
            if not reuses_prefixes(model):
                return None
            snapshot = model.export_prefix(state.model, num_tokens)
            if snapshot is None:
                return None
        return PickerState(self.suffix.export_prefix(state.suffix, num_tokens), snapshot)

    def import_prefix(self, sequence: Sequence, snapshot: PickerState | None) -> PickerState:
        if snapshot is None:
            return self.start(sequence)
        model = self.model
        model_state = None
        if model is not None:
            assert reuses_prefixes(model)
            model_state = model.import_prefix(sequence, snapshot.model)
        return PickerState(self.suffix.import_prefix(sequence, snapshot.suffix), model_state)

    def _model_expected(self, state: PickerState, sequence: Sequence) -> float:
        model = self.model
        depth = int(getattr(model, "num_draft", 0) or getattr(model, "tree_budget", 0) or 0)
        if sequence.draft_limit is not None:
            depth = min(depth, sequence.draft_limit)
        rates = state.model_acceptance.rates(depth, [MODEL_PRIOR] * depth)
        return expected_tokens(rates, depth)

    def _model_propose(self, items: list[tuple[PickerState, Sequence]]) -> list[DraftTree | None]:
        model = self.model
        if model is None or not items:
            return []
        pairs = [(state.model, sequence) for state, sequence in items]
        if len(pairs) > 1 and hasattr(model, "propose_many"):
            return list(model.propose_many(pairs))
        return [model.propose(state, sequence) for state, sequence in pairs]

    def _learn(self, state: PickerState, committed: TargetStates) -> None:
        """How far the model's last chain got: the committed tokens after the root are its
        accepted prefix (a decode step commits root + accepted drafts)."""
        draft = state.model_draft
        if not draft:
            return
        state.model_draft = []
        accepted = 0
        for drafted, committed_token in zip(draft, committed.token_ids[1:], strict=False):
            if drafted != committed_token:
                break
            accepted += 1
        state.model_acceptance.record(accepted, offered_next=accepted < len(draft))


def _named(tree: DraftTree, source: str) -> DraftTree:
    """The tree with its source named (per-source counters and acceptance tell them apart)."""
    tree.source = tree.source or source
    return tree
