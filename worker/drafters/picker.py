"""The `auto` speculation mode: each lane drafts, step by step, from the source that promises most.

Two sources stand behind it: a model drafter (the MTP head, where the model has one) and suffix
decoding (worker.drafters.suffix: the lane's own prompt and output, and recent outputs of all
requests). Before each step, per lane:

    suffix: the expected tokens of its tree's first k nodes, from the suffix trees' frequencies
            (each node's path probability), scaled by how well they have predicted this lane;
    model:  a chain's 1 + p1 + p1 p2 + ... + p1...pk, with p_d the lane's recent conditional
            acceptance of the head's first choice at depth d, or, where the head drafts trees
            (worker.drafters.mtp_tree), a k-node tree's expected tokens from its acceptance by
            depth and rank among siblings (worker.speculation.rank_acceptance), whichever is worth more;

each source's draft is cut to the k that gives the most tokens for its cost, E(k) / (1 + r k),
with r what a draft node costs now as a share of a plain step (`row_price`, set by adaptive
speculation from the measured step costs: on a GPU rows are nearly free and r is small, on a
CPU each row is real compute), and the source whose cut draft is worth more wins, the suffix
on a tie: it costs microseconds of CPU where the head costs a forward per draft token (and the
head is not asked at all then). Agentic text, where a tool
result is quoted or an answer repeats the structure of the last one, goes to the suffix; free
prose, where nothing matches, to the head. A grammar's forced tokens come first, in every mode
(worker.engine.runner), and adaptive speculation then limits the chosen draft to what pays at
this load (worker.speculation.adaptive).

The model drafter is shown every committed token whichever source drafted; the MTP head keeps
only the target's hidden states while it is not drafting and, when its turn comes, catches up
on a short recent context (worker.drafters.mtp): a dormant head costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.drafters.suffix import SuffixDrafter, SuffixState
from worker.engine.drafter_protocol import Drafter, TargetStates, reuses_prefixes
from worker.engine.sequence import Sequence
from worker.speculation.acceptance import expected_tokens
from worker.speculation.rank_acceptance import RankAcceptance, tree_expectations
from worker.speculation.tree import ROOT, DraftTree

MODEL_PRIOR = 0.5  # the model's first choice's acceptance at a depth before the lane has seen its drafts there
RUNNER_UP_PRIOR = 0.2  # a lower-ranked sibling's, given those before it were refused
CHAIN, TREE = "chain", "tree"
SUFFIX = "suffix"
CALIBRATION_DECAY = 0.8  # the suffix trees' accuracy on a lane: its last few drafts weigh most
CALIBRATION_RANGE = (0.2, 1.5)


@dataclass(slots=True)
class PickerState:
    suffix: SuffixState
    model: Any = None  # the model drafter's own state
    model_acceptance: RankAcceptance = field(default_factory=RankAcceptance)
    model_draft: DraftTree | None = None  # the model's last draft (chain or tree), until observed
    suffix_draft: DraftTree | None = None  # the suffix's last tree, until observed
    suffix_expected: float = 0.0  # the draft tokens its frequencies promised for it
    suffix_calibration: float = 1.0  # accepted ÷ promised, decayed: frequencies overrate short matches


class SourcePicker:
    name = "auto"

    def __init__(self, model: Drafter | None, suffix: SuffixDrafter):
        self.model, self.suffix = model, suffix
        self.row_price = 0.0  # a draft node's cost as a share of a plain step (module docstring)
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
        to_model: list[tuple[int, str, int]] = []  # (item, chain or tree, nodes)
        for index, (state, sequence) in enumerate(items):
            state.model_draft, state.suffix_draft = None, None
            limit = self._limit(sequence)
            suffix_nodes, suffix_worth = self._suffix_cut(state, sequence, limit)
            shape, model_nodes, model_worth = self._model_cut(state, limit)
            if model_nodes and model_worth > suffix_worth:
                to_model.append((index, shape, model_nodes))
                state.suffix_draft = None  # not drafted: nothing to learn of it
            elif suffix_nodes and state.suffix_draft is not None:
                trees[index] = _named(state.suffix_draft, SUFFIX)
        model_name = self.model.name if self.model is not None else ""
        for (index, _, nodes), tree in zip(to_model, self._model_propose(items, to_model), strict=True):
            tree = None if tree is None else tree.truncated(nodes)
            trees[index] = None if tree is None else _named(tree, model_name)
            items[index][0].model_draft = tree
        return trees

    def _limit(self, sequence: Sequence) -> int:
        limit = self.tree_budget
        return limit if sequence.draft_limit is None else min(limit, sequence.draft_limit)

    def _worth(self, expected: float, num_nodes: int) -> float:
        return expected / (1.0 + self.row_price * num_nodes)

    def _suffix_cut(self, state: PickerState, sequence: Sequence, limit: int) -> tuple[int, float]:
        """The suffix tree's best cut (nodes, worth); its tree kept in the state, cut, for propose_many."""
        proposal = self.suffix.proposal(state.suffix, sequence)
        if proposal is None or limit == 0:
            return 0, 1.0
        scale = state.suffix_calibration
        best, best_worth = self._best_cut(
            lambda nodes: 1.0 + scale * (proposal.expected_tokens_within(nodes) - 1.0),
            min(limit, proposal.tree.num_nodes),
        )
        if best:
            state.suffix_draft = proposal.tree.truncated(best)
            state.suffix_expected = proposal.expected_tokens_within(best) - 1.0
        return best, best_worth

    def _model_cut(self, state: PickerState, limit: int) -> tuple[str, int, float]:
        """The head's best draft (chain or tree, nodes, worth) from the lane's acceptance by depth and rank."""
        model = self.model
        if model is None or limit == 0:
            return CHAIN, 0, 1.0
        acceptance = state.model_acceptance
        depth = min(limit, int(getattr(model, "num_draft", 0) or getattr(model, "tree_budget", 0) or 0))
        rates = acceptance.chain_rates(depth, MODEL_PRIOR)
        chain_nodes, chain_worth = self._best_cut(lambda nodes: expected_tokens(rates, nodes), depth)
        shape = getattr(model, "tree_shape", None)
        if shape is None or not hasattr(model, "propose_trees"):
            return CHAIN, chain_nodes, chain_worth

        def rate(depth: int, rank: int) -> float:
            return acceptance.rate(depth, rank, MODEL_PRIOR if rank == 0 else RUNNER_UP_PRIOR)

        budget = min(limit, shape.budget)
        expectations = tree_expectations(rate, budget, shape.max_depth, shape.top_k)
        tree_nodes, tree_worth = self._best_cut(lambda nodes: expectations[nodes], budget)
        if tree_worth > chain_worth:  # a tie goes to the chain: fewer head rows to draft it
            return TREE, tree_nodes, tree_worth
        return CHAIN, chain_nodes, chain_worth

    def _best_cut(self, expected: Callable[[int], float], max_nodes: int) -> tuple[int, float]:
        """The draft length in 1..max_nodes worth most (0 and worth 1: plain decoding wins)."""
        best, best_worth = 0, 1.0
        for nodes in range(1, max_nodes + 1):
            worth = self._worth(expected(nodes), nodes)
            if worth > best_worth:
                best, best_worth = nodes, worth
        return best, best_worth

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

    def _model_propose(
        self, items: list[tuple[PickerState, Sequence]], chosen: list[tuple[int, str, int]]
    ) -> list[DraftTree | None]:
        """The head's drafts for the chosen lanes, in `chosen`'s order: its chains and its trees
        each in one batched call where it has them, else one `propose` a lane (cut afterwards)."""
        model = self.model
        if model is None or not chosen:
            return []
        if not hasattr(model, "propose_chains"):
            return [model.propose(items[index][0].model, items[index][1]) for index, _, _ in chosen]
        drafts: dict[int, DraftTree | None] = {}
        for shape, propose in ((CHAIN, model.propose_chains), (TREE, getattr(model, "propose_trees", None))):
            lanes = [(index, nodes) for index, kind, nodes in chosen if kind == shape]
            if lanes and propose is not None:
                trees = propose([items[index][0].model for index, _ in lanes], [nodes for _, nodes in lanes])
                drafts.update((index, tree) for (index, _), tree in zip(lanes, trees, strict=True))
        return [drafts.get(index) for index, _, _ in chosen]

    def _learn(self, state: PickerState, committed: TargetStates) -> None:
        """How far the last draft got: the committed tokens after the root are its accepted path
        (a decode step commits root + accepted drafts). The head's acceptance by depth and rank,
        or how the suffix trees' promise compared with what they got."""
        accepted_path = committed.token_ids[1:]
        draft, state.model_draft = state.model_draft, None
        if draft is not None:
            state.model_acceptance.record(draft, _accepted_nodes(draft, accepted_path))
        tree, state.suffix_draft = state.suffix_draft, None
        if tree is not None and state.suffix_expected > 0:
            ratio = len(_accepted_nodes(tree, accepted_path)) / state.suffix_expected
            low, high = CALIBRATION_RANGE
            blended = CALIBRATION_DECAY * state.suffix_calibration + (1 - CALIBRATION_DECAY) * ratio
            state.suffix_calibration = min(max(blended, low), high)


def _accepted_nodes(tree: DraftTree, path: list[int]) -> list[int]:
    """The nodes of `tree` along the committed `path` from the root, as far as it follows them."""
    nodes, node = [], ROOT
    for token in path:
        child = tree.child_with_token(node, token)
        if child is None:
            break
        nodes.append(child)
        node = child
    return nodes


def _named(tree: DraftTree, source: str) -> DraftTree:
    """The tree with its source named (per-source counters and acceptance tell them apart)."""
    tree.source = tree.source or source
    return tree
