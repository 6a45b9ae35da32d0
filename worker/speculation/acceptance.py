"""How far a lane's drafts get: acceptance per depth, given the depth before was accepted. Torch-free.

The quantity adaptive speculation needs is the *conditional* acceptance at each depth d: of the
steps whose walk reached depth d - 1 and found a drafted child there, the share that accepted
one. A chain of k drafts then emits E(k) = 1 + p1 + p1 p2 + ... + p1 ... pk tokens on average
(the accepted prefix plus the target's bonus token). accepted ÷ drafted is not that rate: with
chains of 3 and p = 0.3 at every depth it is ~0.14, and the formula fed with it predicts 1.16
tokens a step where 1.42 come; at p = 0.6, 1.60 where 2.18 come.

Counts decay by `decay` a step, so a lane's rates follow its recent text (a tool call's JSON,
then free prose), and each rate starts from a prior worth `prior_weight` steps: a young lane
takes the worker's rates, the worker a fixed guess.

For a tree the same rates hold with "found a drafted child" meaning any child of the accepted
node: a tree's siblings raise p at the depths where they branch.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_ACCEPTANCE = 0.5  # the worker's rate at a depth nothing was drafted at yet
LANE_DECAY = 0.95  # a lane's counts weigh its last ~20 steps
WORKER_DECAY = 0.995  # the worker's, its last ~200
PRIOR_WEIGHT = 2.0


class DepthAcceptance:
    def __init__(self, decay: float = LANE_DECAY, prior_weight: float = PRIOR_WEIGHT):
        self.decay = decay
        self.prior_weight = prior_weight
        self.attempts: list[float] = []  # [d]: (decayed) steps that had a drafted node to accept at depth d+1
        self.accepted: list[float] = []  # [d]: of those, the steps that accepted one

    def record(self, num_accepted: int, offered_next: bool) -> None:
        """One verified draft: `num_accepted` nodes accepted along the walk, and whether the last
        accepted node (or the root) had a drafted child that was refused."""
        attempted = num_accepted + (1 if offered_next else 0)
        if attempted == 0:
            return
        decay = self.decay
        self.attempts = [count * decay for count in self.attempts]
        self.accepted = [count * decay for count in self.accepted]
        while len(self.attempts) < attempted:
            self.attempts.append(0.0)
            self.accepted.append(0.0)
        for depth in range(attempted):
            self.attempts[depth] += 1.0
        for depth in range(num_accepted):
            self.accepted[depth] += 1.0

    def rate(self, depth: int, prior: float) -> float:
        """The conditional acceptance at `depth` (1 = the root's children), shrunk towards `prior`."""
        index = depth - 1
        attempts = self.attempts[index] if index < len(self.attempts) else 0.0
        accepted = self.accepted[index] if index < len(self.accepted) else 0.0
        weight = attempts + self.prior_weight
        return (accepted + self.prior_weight * prior) / weight if weight > 0 else prior

    def rates(self, max_depth: int, priors: Sequence[float]) -> list[float]:
        return [self.rate(depth, priors[depth - 1]) for depth in range(1, max_depth + 1)]


def worker_priors(worker: DepthAcceptance, max_depth: int) -> list[float]:
    """The worker's rates, each depth's prior the depth before's (the first's: DEFAULT_ACCEPTANCE)."""
    priors, prior = [], DEFAULT_ACCEPTANCE
    for depth in range(1, max_depth + 1):
        prior = worker.rate(depth, prior)
        priors.append(prior)
    return priors


def expected_tokens(rates: Sequence[float], depth: int) -> float:
    """Tokens a draft reaching `depth` emits on average: 1 + p1 + p1 p2 + ... (bonus token included)."""
    total, reach = 1.0, 1.0
    for rate in rates[:depth]:
        reach *= rate
        total += reach
    return total
