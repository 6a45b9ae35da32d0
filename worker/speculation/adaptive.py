"""Adaptive speculation: how many draft tokens the lanes of a step get. Torch-free.

Speculation pays where a step's cost grows slower than the tokens it emits. On a worker with
many lanes the step is already wide, verification rows cost nearly what decoding rows cost, and
drafts are a loss; with one lane a few more rows are nearly free. So before each step the
worker picks the draft length k that emits the most tokens per second at this load:

    the step's rate is sum_i E_i(k) / cost(num_lanes, k), with E_i(k) the tokens lane i emits
    on average with k draft nodes (worker.speculation.acceptance: from its acceptance at each
    depth, given the depth before was accepted), and k = 0 (plain decoding) always a candidate,

with costs from the steps the worker has run (worker.speculation.step_costs: a start-up table
corrected online). A length must beat plain decoding by MIN_GAIN, so noise does not switch
drafting on. Worked example: costs at 16 lanes {0: 50 ms, 1: 80, 3: 140}, every lane accepting
60 % at each depth: k=0 gives 16/0.050 = 320 tokens/s, k=1 16·1.6/0.080 = 320, k=3
16·2.18/0.140 = 249: plain decoding wins the tie, k = 0. At one lane {0: 17 ms, 1: 19, 3: 22}
k=3 gives 2.18/0.022 = 99 tokens/s against 59 for plain decoding.

A tree drafter's k is its node budget: its best-first nodes, of which the first k reach some
depth (`LaneOutlook.depth_at`); E counts the depths reached, with rates measured on its trees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from worker.speculation.acceptance import expected_tokens

MIN_GAIN = 0.03  # a draft length must beat plain decoding by this share: noise must not switch it on


class Costs(Protocol):
    @property
    def draft_lengths(self) -> list[int]: ...

    def cost(self, num_lanes: int, draft_length: int) -> float: ...


@dataclass(slots=True)
class LaneOutlook:
    """What one lane's drafts promise: its conditional acceptance per depth, and the depth its
    drafter's first k nodes reach (a chain: k; a tree: less)."""

    rates: list[float]  # [d]: acceptance at depth d+1 given depth d was accepted
    tree_depths: list[int] = field(default_factory=list)  # depths of its drafter's last tree's nodes; [] = a chain

    def depth_at(self, num_nodes: int) -> int:
        depths = self.tree_depths
        if not depths:
            return num_nodes
        if num_nodes <= len(depths):
            return max(depths[:num_nodes], default=0)
        return max(depths) + num_nodes - len(depths)  # past the nodes seen: as if they made a chain

    def expected_tokens(self, num_nodes: int) -> float:
        return expected_tokens(self.rates, self.depth_at(num_nodes))


def choose_draft_length(costs: Costs, lanes: Sequence[LaneOutlook]) -> int:
    """The draft length (one of the costed ones) with the most tokens per second for these lanes."""
    num_lanes = len(lanes)
    if num_lanes == 0:
        return 0
    best_k, best_rate = 0, num_lanes / costs.cost(num_lanes, 0) * (1 + MIN_GAIN)
    for k in costs.draft_lengths:
        if k == 0:
            continue
        rate = sum(lane.expected_tokens(k) for lane in lanes) / costs.cost(num_lanes, k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k
