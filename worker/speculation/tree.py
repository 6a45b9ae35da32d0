"""Draft trees: their shape, the best-first tree policy, and the torch-free acceptance walk.

A draft tree hangs off the last committed token (the root, which is not a node). Nodes are kept
in topological order, so a verifier can write them into consecutive scratch slots and give node
`i` the position `start + depths[i]` and the attention row `ancestor_mask()[i]`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ROOT = -1  # parent index of depth-1 nodes: the last committed token


@dataclass(slots=True)
class DraftTree:
    tokens: list[int]
    parents: list[int]  # ROOT for children of the root; otherwise an earlier node index
    depths: list[int]  # 1 for children of the root
    # Where the guesses came from, for the per-source counters (`/metrics`, per-request stats);
    # "" stands for the worker's drafter (its `name`, which is the speculation mode's).
    source: str = ""
    _child_index: dict[tuple[int, int], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.parents) == len(self.depths):
            raise ValueError(
                f"tokens, parents, depths differ in length: {len(self.tokens)}, {len(self.parents)}, {len(self.depths)}"
            )
        self._child_index = {}
        for i, (token, parent, depth) in enumerate(zip(self.tokens, self.parents, self.depths)):
            self._check_node(i, token, parent, depth)
            self._child_index[(parent, token)] = i

    def _check_node(self, i: int, token: int, parent: int, depth: int) -> None:
        if not ROOT <= parent < i:
            raise ValueError(f"parents[{i}]={parent} is not the root or an earlier node")
        expected_depth = 1 if parent == ROOT else self.depths[parent] + 1
        if depth != expected_depth:
            raise ValueError(f"depths[{i}]={depth}, expected {expected_depth} under parent {parent}")
        # Two siblings with one token would make the acceptance walk ambiguous.
        if (parent, token) in self._child_index:
            raise ValueError(f"tokens[{i}]={token} repeats a sibling under parent {parent}")

    @classmethod
    def chain(cls, tokens: Sequence[int], source: str = "") -> DraftTree:
        return cls(list(tokens), list(range(ROOT, len(tokens) - 1)), list(range(1, len(tokens) + 1)), source)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def truncated(self, num_nodes: int) -> DraftTree:
        """The first `num_nodes` nodes: still a tree (topological order), the drafter's best first."""
        if num_nodes >= self.num_nodes:
            return self
        return DraftTree(self.tokens[:num_nodes], self.parents[:num_nodes], self.depths[:num_nodes], self.source)

    @property
    def is_chain(self) -> bool:
        # In topological order a path has each node's parent right before it.
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root's child down to node `i`, inclusive."""
        path = []
        while i != ROOT:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def _append_node(self, token: int, parent: int, depth: int) -> None:
        # Only the builder grows a tree; its candidates were validated, so no re-check here.
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(depth)
        self._child_index[(parent, token)] = self.num_nodes - 1

    def child_with_token(self, parent: int, token: int) -> int | None:
        return self._child_index.get((parent, token))

    def ancestor_mask(self) -> list[list[bool]]:
        """[num_nodes][num_nodes]: True where the column node is the row node or one of its ancestors."""
        mask: list[list[bool]] = []
        for i, parent in enumerate(self.parents):
            row = list(mask[parent]) if parent != ROOT else [False] * self.num_nodes
            row[i] = True
            mask.append(row)
        return mask


# Best-first tree building, the lazy k-best enumeration.
#
# Every node is a path (t_1, ..., t_d) with t_j picked from candidates[j-1]; its score is the sum
# of the picked logprobs. Logprobs are <= 0, so a child never outscores its parent, and the lists
# are sorted, so a sibling of rank r+1 never outscores the one of rank r. Hence the best node not
# yet in the tree is always either the first child of a node just added or the next sibling of
# one: the heap holds, for every included node (and the root), its best child not yet included.
#
# Example, budget 4, candidates = [[(a, -0.1), (b, -1.0)], [(c, -0.2), (d, -2.0)]]:
#   heap {a -0.1}                  pop a:    add a, push its first child ac -0.3, its sibling b -1.0
#   heap {ac -0.3, b -1.0}         pop ac:   add ac, push ad -2.1 (ac has no depth-3 child)
#   heap {b -1.0, ad -2.1}         pop b:    add b, push bc -1.2 (b has no next sibling)
#   heap {bc -1.2, ad -2.1}        pop bc:   add bc; budget reached
# The tree is a, ac, b, bc: the four best paths, closed under prefixes.


@dataclass(slots=True, order=True)
class _Frontier:
    neg_score: float
    depth: int  # ties go to the shallower node, then to the one pushed first
    seq: int
    parent: int = field(compare=False)
    rank: int = field(compare=False)  # index into candidates[depth - 1]


def build_best_first_tree(candidates: Sequence[Sequence[tuple[int, float]]], budget: int) -> DraftTree:
    """The `budget` highest-scoring draft paths; candidates[d] = top-k (token, logprob) at depth d+1."""
    if budget < 0:
        raise ValueError(f"budget={budget} must be >= 0")
    _check_candidates(candidates)
    tree = DraftTree([], [], [])
    heap: list[_Frontier] = []
    scores: list[float] = []
    seq = 0

    def push(parent: int, depth: int, rank: int) -> None:
        nonlocal seq
        if depth > len(candidates) or rank >= len(candidates[depth - 1]):
            return
        base = scores[parent] if parent != ROOT else 0.0
        heapq.heappush(heap, _Frontier(-(base + candidates[depth - 1][rank][1]), depth, seq, parent, rank))
        seq += 1

    push(ROOT, 1, 0)
    while heap and tree.num_nodes < budget:
        best = heapq.heappop(heap)
        tree._append_node(candidates[best.depth - 1][best.rank][0], best.parent, best.depth)
        scores.append(-best.neg_score)
        push(tree.num_nodes - 1, best.depth + 1, 0)
        push(best.parent, best.depth, best.rank + 1)
    return tree


def _check_candidates(candidates: Sequence[Sequence[tuple[int, float]]]) -> None:
    for d, ranked in enumerate(candidates):
        logprobs = [logprob for _, logprob in ranked]
        if any(not lp <= 0.0 for lp in logprobs):
            raise ValueError(f"candidates[{d}] has a logprob that is not <= 0: {logprobs}")
        if any(a < b for a, b in zip(logprobs, logprobs[1:])):
            raise ValueError(f"candidates[{d}] is not sorted by logprob, descending: {logprobs}")
        tokens = [token for token, _ in ranked]
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"candidates[{d}] repeats a token: {tokens}")


# The acceptance walk, lossless by construction.
#
# Starting at the root, ask the target which token it would emit after the path so far, and
# descend into the child drafted with that token; stop at the first node with no such child. The
# last target token (the bonus) is emitted too, so every walk emits len(accepted) + 1 tokens.
#
# Greedy: next_token_at(node) is the target's argmax after root..node, so each emitted token is
# exactly what plain decoding would emit at that step; the draft only decides how many of those
# steps one target forward covers. Sampling: next_token_at(node) is one draw from the target's
# processed distribution (temperature, top-k/p, penalties) after root..node. Each emitted token
# is such a draw, made before looking at which children exist, so the output is distributed as
# plain sampling; the tree only lets later draws reuse the same forward when they hit a child.
#
# Example: tree a(0) -> b(1), a(0) -> c(2); target says a at root, c after a, x after a c:
# accepted [0, 2], emitted [a, c, x].


def walk(tree: DraftTree, next_token_at: Callable[[int], int]) -> tuple[list[int], list[int]]:
    """(accepted node indices, emitted tokens); next_token_at(node) is the target's token after it."""
    accepted: list[int] = []
    emitted: list[int] = []
    node = ROOT
    while True:
        token = next_token_at(node)
        emitted.append(token)
        child = tree.child_with_token(node, token)
        if child is None:
            return accepted, emitted
        accepted.append(child)
        node = child
