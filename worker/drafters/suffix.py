"""The `suffix` speculation mode: suffix decoding, drafted from text the worker has already seen.

As SuffixDecoding (Arctic Inference; vLLM's `suffix` method) does, two suffix trees
(worker/drafters/suffix_tree.py) are searched each step:

- the lane's own: its prompt and output so far (the last `max_history` tokens), which catches a
  reply quoting its prompt (a file echoed back with an edit, a tool result's fields), and
- the worker's: the outputs of recent requests, all lanes' (`global_tree`, at most
  `max_global_bytes`, the oldest outputs dropped first), which catches answers that share
  their structure (tool-call JSON, records extracted one after another); each output goes in
  when its request finishes (`finish`).

The lane's tail is matched in both (in its own tree, the deepest repeated suffix the tree keeps
for the tail anyway; in the worker's, a search that starts from the last step's match), each
match drafts a frequency-scored tree (worker/drafters/suffix_proposal.py), and the one
expected to get more tokens accepted is proposed. No weights, no target states: a step's
drafting is a few dictionary walks on the CPU, O(match length) amortized.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.drafters.suffix_proposal import SuffixProposal, draft_from
from worker.drafters.suffix_tree import NODE_BYTES, SuffixTree
from worker.engine.drafter_protocol import TargetStates
from worker.engine.sequence import Sequence
from worker.speculation.tree import DraftTree

OWN = 0  # the key of the lane's sequence in its own tree


@dataclass(slots=True, frozen=True)
class SuffixOptions:
    max_nodes: int = 8  # draft tree nodes (so also its deepest path)
    max_depth: int = 24  # longest substring the trees hold: the match plus what is drafted past it
    spec_factor: float = 1.0  # a draft is at most this many times as deep as the match is long
    min_prob: float = 0.1  # paths the trees' frequencies give less than this are not drafted
    max_history: int = 4096  # of a lane's own tokens, in its tree
    max_global_bytes: int = 64 << 20  # the worker's tree of recent outputs

    def __post_init__(self) -> None:
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes={self.max_nodes} must be >= 1")
        if not 0.0 <= self.min_prob <= 1.0:
            raise ValueError(f"min_prob={self.min_prob} must be within [0, 1]")
        if self.spec_factor <= 0:
            raise ValueError(f"spec_factor={self.spec_factor} must be > 0")


class SuffixState:
    """One lane's: its tokens (prompt + output as seen so far), its own tree (built on first use,
    so a prefix snapshot is just tokens) and where its tail stands in the worker's tree."""

    __slots__ = ("tokens", "tree", "num_in_tree", "global_match", "global_version", "num_matched")

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.tree: SuffixTree | None = None
        self.num_in_tree = 0  # tokens[:num_in_tree] went into `tree`
        self.global_match = 0  # the longest suffix of tokens[:num_matched] in the worker's tree
        self.global_version = -1  # the worker's tree's version then
        self.num_matched = 0


class SuffixDrafter:
    name = "suffix"
    hidden_layers: tuple[int, ...] = ()
    wants_final_hidden = False

    def __init__(self, options: SuffixOptions | None = None):
        self.options = options or SuffixOptions()
        self.tree_budget = self.options.max_nodes  # rows a verification needs (worker.serving_model)
        max_nodes = max(1, self.options.max_global_bytes // NODE_BYTES)
        self.global_tree = SuffixTree(self.options.max_depth, max_nodes=max_nodes)

    def start(self, sequence: Sequence) -> SuffixState:
        return SuffixState([])

    def observe(self, state: SuffixState, committed: TargetStates) -> None:
        # Prefill chunks as they are committed (so a prefix snapshot holds them); decode steps
        # are caught up from the sequence in proposal(), root included.
        if committed.start == len(state.tokens):
            state.tokens.extend(committed.token_ids)

    def propose(self, state: SuffixState, sequence: Sequence) -> DraftTree | None:
        proposal = self.proposal(state, sequence)
        return None if proposal is None else proposal.tree

    def proposal(self, state: SuffixState, sequence: Sequence) -> SuffixProposal | None:
        """The better of the two trees' drafts for the tokens after the root, with its score
        (accepted tokens expected): for a caller weighing it against another draft source."""
        self._catch_up(state, sequence)
        own = self._own_proposal(state)
        other = self._global_proposal(state)
        if own is None or (other is not None and other.score > own.score):
            return other
        return own

    def finish(self, state: SuffixState, sequence: Sequence) -> None:
        """A finished request's output goes into the worker's tree (replacing any earlier one of
        the same request, e.g. from before it was resumed elsewhere)."""
        if sequence.output_ids:
            self.global_tree.add(sequence.request_id, sequence.output_ids)

    def state_bytes(self, state: SuffixState) -> int:
        return 8 * len(state.tokens) + (state.tree.num_bytes if state.tree is not None else 0)

    def export_prefix(self, state: SuffixState, num_tokens: int) -> SuffixState:
        return SuffixState(state.tokens[:num_tokens])  # the trees are functions of the tokens

    def import_prefix(self, sequence: Sequence, snapshot: SuffixState | None) -> SuffixState:
        return self.start(sequence) if snapshot is None else SuffixState(list(snapshot.tokens))

    def _catch_up(self, state: SuffixState, sequence: Sequence) -> None:
        # A lane's tokens only grow: append those not seen yet (the root and any tokens its
        # last decode step committed), reading the prompt and output without joining them.
        seen, prompt = len(state.tokens), sequence.prompt_ids
        assert seen <= sequence.num_tokens, (seen, sequence.num_tokens)
        if seen < len(prompt):
            state.tokens.extend(prompt[seen:])
            seen = len(prompt)
        state.tokens.extend(sequence.output_ids[seen - len(prompt) :])

    def _own_proposal(self, state: SuffixState) -> SuffixProposal | None:
        options, tree = self.options, state.tree
        if tree is None:
            tree = state.tree = SuffixTree(options.max_depth, max_history=options.max_history)
            state.num_in_tree = max(0, len(state.tokens) - options.max_history)
        tree.extend(OWN, state.tokens[state.num_in_tree :])
        state.num_in_tree = len(state.tokens)
        # The tail itself is in this tree, unfollowed: the longest earlier occurrence is the
        # longest repeated tail suffix that something followed.
        length = next((node.depth for node in reversed(tree.active(OWN)) if node.continued > 0), 0)
        return self._draft(tree, state.tokens, length, "request")

    def _global_proposal(self, state: SuffixState) -> SuffixProposal | None:
        tree = self.global_tree
        if tree.num_sequences == 0:
            return None
        return self._draft(tree, state.tokens, self._global_match(state, tree), "global")

    def _draft(self, tree: SuffixTree, tokens: list[int], length: int, source: str) -> SuffixProposal | None:
        if length == 0:
            return None
        options = self.options
        return draft_from(tree, tokens[-length:], source, options.max_nodes, options.spec_factor, options.min_prob)

    def _global_match(self, state: SuffixState, tree: SuffixTree) -> int:
        """The longest suffix of the lane's tokens that the worker's tree has seen followed.

        The longest suffix in the tree at all grows by at most one a token (a suffix of the
        longer tail starts with one of the shorter's), so the search starts there and walks
        down: O(max_depth) a token amortized, each try O(its length). New or dropped outputs
        (a new version) may change it any way: then it starts from the top."""
        tokens = state.tokens
        num_new = len(tokens) - state.num_matched
        upper = tree.max_depth - 1
        if state.global_version == tree.version:
            upper = min(upper, state.global_match + num_new)
        upper = min(upper, len(tokens))
        present = followed = 0
        for length in range(upper, 0, -1):
            position = tree.find(tokens[len(tokens) - length :])
            if position is None:
                continue
            present = max(present, length)
            if tree.continued(position) > 0:
                followed = length
                break
        state.global_match, state.global_version, state.num_matched = present, tree.version, len(tokens)
        return followed
