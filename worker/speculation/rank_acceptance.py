"""How a lane's drafts get accepted by depth and by rank among siblings, and what a tree is worth. Torch-free.

A node at depth d is the j-th child (rank j, 0 = its drafter's first choice) of its parent. The
acceptance walk reaches the parent and then accepts at most one child. The rate q(d, j) is, of
the steps whose walk reached a parent at depth d - 1 that had a rank-j child and whose
children of rank < j were all refused, the share that accepted the rank-j child. Then

    P(node) = P(parent) (1 - q(d, 0)) ... (1 - q(d, j - 1)) q(d, j),   P(root) = 1
    E(tree) = 1 + sum of P(node) over its nodes       (tokens a step emits, the bonus included)

A chain is the tree of rank-0 nodes: E = 1 + p1 + p1 p2 + ... with p_d = q(d, 0), the formula of
worker.speculation.acceptance. Worked example: q(1, 0) = 0.4, q(1, 1) = 0.5, q(2, 0) = 0.5.
A chain of 2: 1 + 0.4 + 0.4 * 0.5 = 1.6. The tree of 2 that adds the depth-1 runner-up
instead: 1 + 0.4 + 0.6 * 0.5 = 1.7; it is worth the row where the first guess is often wrong.

`tree_expectations` gives E of the n-node tree a best-first policy would grow under these rates
(for n = 0..budget): the estimate auto compares with a chain's before it asks the head for either.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from worker.speculation.tree import ROOT, DraftTree

LANE_DECAY = 0.95  # a lane's counts weigh its last ~20 drafts (as acceptance.LANE_DECAY)
PRIOR_WEIGHT = 2.0

Rate = Callable[[int, int], float]  # (depth, rank) -> q(depth, rank)


class RankAcceptance:
    def __init__(self, decay: float = LANE_DECAY, prior_weight: float = PRIOR_WEIGHT):
        self.decay, self.prior_weight = decay, prior_weight
        self.attempts: dict[tuple[int, int], float] = {}  # (depth, rank) -> decayed walks that reached it
        self.accepted: dict[tuple[int, int], float] = {}  # of those, the walks that accepted it

    def record(self, tree: DraftTree, accepted_nodes: list[int]) -> None:
        """One verified draft and the nodes its walk accepted (root's child first)."""
        if tree.num_nodes == 0:
            return
        decay = self.decay
        self.attempts = {key: count * decay for key, count in self.attempts.items()}
        self.accepted = {key: count * decay for key, count in self.accepted.items()}
        parent = ROOT
        for depth in range(1, tree.num_nodes + 1):
            children = [i for i, p in enumerate(tree.parents) if p == parent]  # in rank order
            taken = accepted_nodes[depth - 1] if depth <= len(accepted_nodes) else None
            for rank, child in enumerate(children):
                key = (depth, rank)
                self.attempts[key] = self.attempts.get(key, 0.0) + 1.0
                if child == taken:
                    self.accepted[key] = self.accepted.get(key, 0.0) + 1.0
                    break
            if taken is None:
                return
            parent = taken

    def rate(self, depth: int, rank: int, prior: float) -> float:
        """q(depth, rank), shrunk towards `prior` while few walks have reached it."""
        key = (depth, rank)
        weight = self.attempts.get(key, 0.0) + self.prior_weight
        return (self.accepted.get(key, 0.0) + self.prior_weight * prior) / weight if weight > 0 else prior

    def chain_rates(self, max_depth: int, prior: float) -> list[float]:
        """p_d = q(d, 0) for d = 1..max_depth: a chain's conditional acceptance per depth."""
        return [self.rate(depth, 0, prior) for depth in range(1, max_depth + 1)]


def expected_tree_tokens(tree: DraftTree, rate: Rate) -> float:
    """E(tree) of the module docstring for a given tree (its siblings ranked in node order)."""
    reach: list[float] = []
    refused: dict[int, float] = {}  # parent -> P(parent) times the refusals of its children so far
    total = 1.0
    for i, (parent, depth) in enumerate(zip(tree.parents, tree.depths, strict=True)):
        base = refused.get(parent, 1.0 if parent == ROOT else reach[parent])
        rank = sum(1 for p in tree.parents[:i] if p == parent)
        q = rate(depth, rank)
        reach.append(base * q)
        refused[parent] = base * (1.0 - q)
        total += reach[-1]
    return total


def tree_expectations(rate: Rate, budget: int, max_depth: int, max_rank: int) -> list[float]:
    """[E of the best-first n-node tree under `rate`, for n = 0..budget]; children at most
    `max_rank` per node, depths at most `max_depth`. Grown as tree.build_best_first_tree grows
    one: the frontier holds each included node's best child and next sibling."""
    expectations = [1.0]
    # (-P(node), depth, tiebreak, rank, P before its own rate: the parent's reach times its elder siblings' refusals)
    frontier: list[tuple[float, int, int, int, float]] = []
    count = 0

    def push(depth: int, rank: int, base: float) -> None:
        nonlocal count
        if depth <= max_depth and rank < max_rank and base > 0.0:
            heapq.heappush(frontier, (-base * rate(depth, rank), depth, count, rank, base))
            count += 1

    push(1, 0, 1.0)
    while frontier and len(expectations) <= budget:
        neg_reach, depth, _, rank, base = heapq.heappop(frontier)
        reach = -neg_reach
        expectations.append(expectations[-1] + reach)
        push(depth + 1, 0, reach)  # its first child
        push(depth, rank + 1, base - reach)  # its next sibling: reached where this one was refused
    while len(expectations) <= budget:  # nothing left to add (max_depth x max_rank exhausted)
        expectations.append(expectations[-1])
    return expectations
