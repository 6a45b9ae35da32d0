"""Adaptive speculation: how many draft tokens the lanes of a step get. Torch-free.

Speculation pays where a step's cost grows slower than the tokens it emits. On a worker with
many lanes the step is already wide, verification rows cost nearly what decoding rows cost, and
drafts are a loss; with one lane a few more rows are nearly free. So the worker measures at
start-up what a step costs on its own hardware with `num_lanes` decoding lanes each drafting
`k` tokens (drafting included: `StepCosts`), and before each step picks the k that emits the
most tokens per second at that load, from each lane's running acceptance:

    a lane with per-token acceptance a and a chain of k drafts emits E(k) = 1 + a + ... + a^k
    tokens (the accepted prefix and the target's bonus token); the step's rate is
    sum_i E_i(k) / cost(num_lanes, k), and k = 0 (plain decoding) is always a candidate,

so speculation never makes the worker slower than plain decoding at the same load, as far as
the measured costs and the running acceptance say. Worked example: costs at 16 lanes
{0: 50 ms, 1: 80, 3: 140}, acceptance 0.6 for every lane: k=0 gives 16/0.050 = 320 tokens/s,
k=1 16·1.6/0.080 = 320, k=3 16·2.18/0.140 = 249: plain decoding wins ties, k = 0.

A tree drafter's k is its node budget; E(k) for a tree is bounded by the chain's, so the rule
is conservative there. Lanes too young to have an acceptance use the worker's running one.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_ACCEPTANCE = 0.5  # before any draft was verified
MIN_GAIN = 0.03  # a draft length must beat plain decoding by this share: noise must not switch it on


@dataclass(slots=True, frozen=True)
class StepCosts:
    """Seconds a decode step takes, measured at (num_lanes, draft_length) points."""

    seconds: Mapping[tuple[int, int], float]

    @property
    def lane_counts(self) -> list[int]:
        return sorted({lanes for lanes, _ in self.seconds})

    @property
    def draft_lengths(self) -> list[int]:
        return sorted({k for _, k in self.seconds})

    def cost(self, num_lanes: int, draft_length: int) -> float:
        """Interpolated linearly in lanes between measured counts (extrapolated past the last)."""
        counts = self.lane_counts
        if num_lanes <= counts[0]:
            return self.seconds[(counts[0], draft_length)] * num_lanes / counts[0]
        if len(counts) == 1:
            return self.seconds[(counts[0], draft_length)] * num_lanes / counts[0]
        index = min(bisect.bisect_left(counts, num_lanes), len(counts) - 1)
        low, high = counts[index - 1], counts[index]
        low_s, high_s = self.seconds[(low, draft_length)], self.seconds[(high, draft_length)]
        return low_s + (high_s - low_s) * (num_lanes - low) / (high - low)


def expected_tokens(acceptance: float, draft_length: int) -> float:
    """1 + a + ... + a^k: tokens a chain of k drafts emits on average (bonus token included)."""
    return sum(acceptance**depth for depth in range(draft_length + 1))


def choose_draft_length(costs: StepCosts, acceptances: Sequence[float]) -> int:
    """The draft length (one of the measured ones) with the most tokens per second for these lanes."""
    num_lanes = len(acceptances)
    if num_lanes == 0:
        return 0
    best_k, best_rate = 0, num_lanes / costs.cost(num_lanes, 0) * (1 + MIN_GAIN)
    for k in costs.draft_lengths:
        if k == 0:
            continue
        rate = sum(expected_tokens(a, k) for a in acceptances) / costs.cost(num_lanes, k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


def lane_acceptance(draft_tokens: int, accepted_tokens: int, default: float) -> float:
    """A lane's acceptance so far (accepted ÷ drafted), or `default` before it has drafted."""
    return accepted_tokens / draft_tokens if draft_tokens else default
