"""Best-first search over a head's guesses, depth by depth: which nodes to grow, and the tree. Torch-free.

An MTP head conditions each guess on the path above it, so (unlike DFlash's per-depth candidates,
tree.build_best_first_tree) a node's children are known only once the head has run over the node.
The search runs a depth at a time: one head forward over the nodes chosen at a depth gives each
its top-k children. A node's score is its path's log-probability under the head (its logprob plus
its ancestors'), so a child never outscores its parent, and the tree is the `budget` best nodes
(ties to the shallower, then the earlier), closed under prefixes.

Which nodes to grow: a node outside the best `budget` found so far never enters them (later
nodes only push it down), nor do its children (they score no higher); so only nodes among the
current best `budget` are grown, at most `beam` of them a depth (the best), down to `max_depth`.

Example, budget 3, top-2 children, beam 2. Depth 1: a -0.1, b -1.2. Grow both (both in the best 3):
a gives c -0.3, d -2.5; b gives e -1.5, f -3.0. Best 3: a, c, b. Depth 2: only c is among them,
so c alone is grown: g -0.5, h -4.0. Best 3: a, c, g. The tree: a -> c -> g (a chain: the
head was sure), where a flatter head would have kept b.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.speculation.tree import ROOT, DraftTree


@dataclass(slots=True)
class HeadNode:
    token: int
    parent: int  # ROOT or an earlier node's index
    depth: int  # 1 for the root's children
    score: float  # log-probability of the path root..node under the head


class HeadTreeSearch:
    def __init__(self, budget: int, beam: int, max_depth: int):
        assert budget >= 1 and beam >= 1 and max_depth >= 1, (budget, beam, max_depth)
        self.budget, self.beam, self.max_depth = budget, beam, max_depth
        self.nodes: list[HeadNode] = []

    def add_children(self, parent: int, ranked: Sequence[tuple[int, float]]) -> None:
        """The head's top candidates after `parent` (ROOT: after the root), best first: (token, logprob)."""
        base, depth = (0.0, 1) if parent == ROOT else (self.nodes[parent].score, self.nodes[parent].depth + 1)
        for token, logprob in ranked:
            self.nodes.append(HeadNode(token, parent, depth, base + logprob))

    def to_grow(self, depth: int) -> list[int]:
        """The nodes at `depth` whose children may enter the tree, best first (at most `beam`)."""
        if depth >= self.max_depth:
            return []
        return [i for i in self._best() if self.nodes[i].depth == depth][: self.beam]

    def tree(self) -> DraftTree:
        """The best `budget` nodes, in order of score: parents first, siblings best first."""
        chosen = self._best()
        index = {node: position for position, node in enumerate(chosen)}
        nodes = [self.nodes[i] for i in chosen]
        parents = [ROOT if node.parent == ROOT else index[node.parent] for node in nodes]
        return DraftTree([node.token for node in nodes], parents, [node.depth for node in nodes])

    def _best(self) -> list[int]:
        nodes = self.nodes
        return sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth, i))[: self.budget]
