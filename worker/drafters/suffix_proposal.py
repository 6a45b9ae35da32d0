"""Suffix decoding's draft: the likeliest continuations of a match in a suffix tree. Torch-free.

Given the node of the request's matched suffix (worker/drafters/suffix_tree.py), the tokens
that followed it before are candidates, weighted by how often each followed: a child's
probability is child.count / node.continued, a path's the product along it. The draft is the
best-first tree of the most probable paths, so several continuations are verified in one
forward, and its score, the sum of the drafted nodes' path probabilities, is how many draft
tokens the target should accept if it continues as the tree's text did (each node is accepted
exactly when its whole path is: expectation is additive over nodes).

How much to draft follows the match: a long match is strong evidence, a one-token match weak,
so the tree is at most `spec_factor × match length` deep (and `max_nodes` nodes), and paths
below `min_prob` are not drafted at all.

Worked example, max_nodes 3, min_prob 0.1; the match "x" was followed by a 6 times, b 3 times,
c once; "x a" by d 6 times:

    heap {a 0.6, b 0.3, c 0.1}      pop a:  node 0, push a d 0.6·1.0 = 0.6
    heap {ad 0.6, b 0.3, c 0.1}     pop ad: node 1 (under 0)
    heap {b 0.3, c 0.1}             pop b:  node 2; budget reached
    tree a, a->d, b; score 0.6 + 0.6 + 0.3 = 1.5 tokens expected beyond the target's own
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from worker.drafters.suffix_tree import Position, SuffixTree
from worker.speculation.tree import ROOT, DraftTree


@dataclass(slots=True, frozen=True)
class SuffixProposal:
    tree: DraftTree
    node_probs: list[float]  # each node's path probability, in tree order (best first)
    match_length: int  # tokens of the request's tail the tree matched
    source: str  # "request" (its own prompt and output) or "global" (recent outputs of all requests)

    @property
    def score(self) -> float:
        """Draft tokens the target is expected to accept, by the tree's frequencies."""
        return sum(self.node_probs)

    @property
    def expected_tokens(self) -> float:
        """Tokens the verifying forward is expected to emit: the accepted drafts and one of its own."""
        return 1.0 + self.score

    def expected_tokens_within(self, num_nodes: int) -> float:
        """The same for the tree cut to its first `num_nodes` nodes (`DraftTree.truncated`)."""
        return 1.0 + sum(self.node_probs[:num_nodes])


def max_draft_depth(match_length: int, max_nodes: int, spec_factor: float) -> int:
    return min(max_nodes, int(spec_factor * match_length))


def draft_from(
    tree: SuffixTree, match: Sequence[int], source: str, max_nodes: int, spec_factor: float, min_prob: float
) -> SuffixProposal | None:
    """The draft after `match`, a suffix of the request's tokens that is in `tree` and was
    followed there (None: nothing to draft). The tree stores substrings of at most
    `tree.max_depth` tokens, so a match of L tokens sees max_depth - L tokens past it; where the
    draft may go deeper, it is drafted from a shorter suffix of the match instead."""
    depth = max_draft_depth(len(match), max_nodes, spec_factor)
    if depth < 1:
        return None
    kept = max(1, min(len(match), tree.max_depth - depth))  # tokens of the match drafted from
    depth = min(depth, tree.max_depth - kept)
    position = tree.find(match[len(match) - kept :])
    assert position is not None, "a suffix of a match is in the tree"
    draft, node_probs = best_first(tree, position, max_nodes, depth, min_prob)
    return SuffixProposal(draft, node_probs, len(match), source) if draft.num_nodes else None


def best_first(
    tree: SuffixTree, start: Position, max_nodes: int, max_depth: int, min_prob: float
) -> tuple[DraftTree, list[float]]:
    """The `max_nodes` most probable paths after `start` (at most `max_depth` deep, each at least
    `min_prob` likely), as a tree in the order found (a parent before its children: a child is
    never likelier than its parent), and their probabilities."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    heap: list[tuple[float, int, int, Position, int]] = []  # (-path probability, tie-break, token, position, parent)
    order = itertools.count()  # ties go to the path found first
    probs: list[float] = []

    def push(position: Position, parent: int, parent_prob: float) -> None:
        for token, after, share in tree.continuations(position):
            prob = parent_prob * share
            if prob >= min_prob:
                heapq.heappush(heap, (-prob, next(order), token, after, parent))

    push(start, ROOT, 1.0)
    while heap and len(tokens) < max_nodes:
        neg_prob, _, token, position, parent = heapq.heappop(heap)
        depth = 1 if parent == ROOT else depths[parent] + 1
        tokens.append(token)
        parents.append(parent)
        depths.append(depth)
        probs.append(-neg_prob)
        if depth < max_depth:
            push(position, len(tokens) - 1, -neg_prob)
    return DraftTree(tokens, parents, depths), probs
