"""What a decode step costs on this worker: a start-up table, corrected online by the steps it runs.

Torch-free. `StepCosts` is the table the worker measures at start-up: seconds for a step of
`num_lanes` decoding lanes each verifying `k` draft tokens. It is measured once, in about two
seconds, on a machine the worker shares with the gateway, Redis and its clients, so it can be
off by much, and even non-monotonic (one lane measured 41.7 ms with no draft, 88.6 with one,
76.1 with three). `OnlineStepCosts` keeps it only as a prior: every pure decode step the worker
really runs is compared with what the table says it should cost, and the recent ratios (per
draft length, a median: one step stalled by a neighbour does not move it) scale the table.

Only relative costs matter to adaptive speculation (which draft length gives the most tokens a
second now), and a busy neighbour slows every draft length alike, so a length whose ratios are
old would be judged against the machine of back then. Hence `explore`: a length not run for
`explore_after` steps is run once, to refresh its ratio (at most one step in `explore_after`
spent on a length the rule would not pick).
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

RATIO_WINDOW = 15  # recent steps per draft length whose cost ratios are kept
EXPLORE_AFTER = 96  # decode steps after which a draft length not run is run once


@dataclass(slots=True, frozen=True)
class StepCosts:
    """Seconds a decode step takes, measured at (num_lanes, draft_length) points."""

    seconds: Mapping[tuple[int, int], float]
    complete: bool = True  # False: the probe's time budget cut it short (kept for this start only)

    @property
    def lane_counts(self) -> list[int]:
        return sorted({lanes for lanes, _ in self.seconds})

    @property
    def draft_lengths(self) -> list[int]:
        return sorted({k for _, k in self.seconds})

    def cost(self, num_lanes: int, draft_length: int) -> float:
        """Interpolated linearly in lanes between measured counts (extrapolated past the last)."""
        counts = self.lane_counts
        if num_lanes <= counts[0] or len(counts) == 1:
            return self.seconds[(counts[0], draft_length)] * num_lanes / counts[0]
        index = min(bisect.bisect_left(counts, num_lanes), len(counts) - 1)
        low, high = counts[index - 1], counts[index]
        low_s, high_s = self.seconds[(low, draft_length)], self.seconds[(high, draft_length)]
        return low_s + (high_s - low_s) * (num_lanes - low) / (high - low)

    def nearest_length(self, mean_draft: float) -> int:
        """The measured draft length closest to a step's mean draft tokens per lane."""
        return min(self.draft_lengths, key=lambda k: (abs(k - mean_draft), k))


class OnlineStepCosts:
    """The start-up table scaled by what recent steps of each draft length really cost."""

    def __init__(self, prior: StepCosts, window: int = RATIO_WINDOW, explore_after: int = EXPLORE_AFTER):
        self.prior = prior
        self.explore_after = explore_after
        self._ratios: dict[int, deque[float]] = {k: deque(maxlen=window) for k in prior.draft_lengths}
        self._last_run: dict[int, int] = {k: 0 for k in prior.draft_lengths}  # decode step it last ran at
        self._steps = 0

    @property
    def draft_lengths(self) -> list[int]:
        return self.prior.draft_lengths

    def record(self, num_lanes: int, num_rows: int, seconds: float) -> None:
        """A decode step (no prefill in it) of `num_lanes` lanes and `num_rows` rows took `seconds`."""
        self._steps += 1
        if num_lanes < 1 or seconds <= 0:
            return
        k = self.prior.nearest_length(num_rows / num_lanes - 1)
        self._ratios[k].append(seconds / self.prior.cost(num_lanes, k))
        self._last_run[k] = self._steps

    def ratio(self, draft_length: int) -> float:
        """Recent measured ÷ table cost for this length; where it has not run, the other lengths'
        (the machine's present load), else 1."""
        own = self._ratios[draft_length]
        if own:
            return statistics.median(own)
        others = [ratio for ratios in self._ratios.values() for ratio in ratios]
        return statistics.median(others) if others else 1.0

    def cost(self, num_lanes: int, draft_length: int) -> float:
        return self.prior.cost(num_lanes, draft_length) * self.ratio(draft_length)

    def row_price(self, num_lanes: int) -> float:
        """What one more draft node costs a lane, as a share of its part of a plain step: the
        longest measured draft's extra cost spread over its nodes. A lane's draft of k nodes is
        worth drafting where its expected tokens beat 1 + row_price * k (worker.drafters.picker)."""
        longest = max(self.draft_lengths)
        plain = self.cost(num_lanes, 0)
        if longest == 0 or plain <= 0:
            return 0.0
        return max(self.cost(num_lanes, longest) - plain, 0.0) / (longest * plain)

    def explore(self, current: int) -> int | None:
        """A draft length next to `current` (the rule's present choice) whose cost is stale (not run
        for `explore_after` decode steps), oldest first. Only the neighbours: they are where the
        choice would move next, and a long draft tried while plain decoding wins costs several
        steps' worth (eight rows cost ~3 plain steps on a CPU)."""
        lengths = self.draft_lengths
        at = lengths.index(current) if current in lengths else 0
        neighbours = lengths[max(at - 1, 0) : at + 2]
        stale = [k for k in neighbours if k != current and self._steps - self._last_run[k] >= self.explore_after]
        if not stale:
            return None
        chosen = min(stale, key=lambda k: (self._last_run[k], k))
        self._last_run[chosen] = self._steps  # tried once; retried only after another explore_after steps
        return chosen
