"""The start-up measurement of what a decode step costs: n lanes, each verifying k draft tokens.

Adaptive speculation takes this table as its prior (worker.speculation.step_costs corrects it
with the steps the worker then runs). Each point is the median of `repeats` steps, taken in
rounds that visit every draft length once (after a round to warm up), so a drift in the
machine's load falls on every length alike: on a shared machine a point measured apart from
the others could make a draft length look cheaper than it is, and speculation would then cost
throughput. Past a time budget no further round or lane count starts: a slow path (PyTorch's int4
kernels on a busy machine) gets a rougher table, not a minute-long start.

The drafter drafts as it would (its cost is part of a step's), but on the probe's arbitrary
prompt it may draft less than k, or nothing (suffix decoding finds no match in it): its draft
is then padded to k with a filler chain, so the point costs the rows it names.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from shared.sampling import SamplingParams
from worker.engine.drafter_protocol import Drafter, TargetStates
from worker.engine.runner import LaneWork, ModelRunner
from worker.engine.sequence import Sequence
from worker.models.kv_pool import KVPool
from worker.serving.step_cost_cache import StepCostKey, cpu_model
from worker.serving_model import ServingModel
from worker.speculation.step_costs import StepCosts
from worker.speculation.tree import DraftTree

# Lanes at which step costs are measured: interpolated between, extrapolated past the last (a step's
# cost grows about linearly in lanes from 4 on; 16 lanes x 8 drafts took 1-12 s a step on 2 vCPUs).
COST_LANE_COUNTS = (1, 4)
COST_REPEATS = 2  # measured rounds after the warm-up one: the median of two is their mean
# Seconds after which the probe starts no further round or lane count: on a slow path (PyTorch's int4
# kernels on a busy 2-vCPU machine, ~0.7 s a plain step) the full probe took 70 s. What it left out,
# the online correction (step_costs.OnlineStepCosts) makes up for during serving.
COST_BUDGET_S = 4.0
COST_PROMPT_TOKENS = 16
COST_PROMPT = list(range(3, 3 + COST_PROMPT_TOKENS))  # any tokens: a step's cost does not depend on them
FILLER_TOKEN = 3


class _PaddedDrafts:
    """The drafter, its drafts padded to the step's draft limit (see the module docstring)."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.name = drafter.name
        self.hidden_layers = drafter.hidden_layers
        self.wants_final_hidden = drafter.wants_final_hidden

    def start(self, sequence: Sequence) -> Any:
        return self.drafter.start(sequence)

    def observe(self, state: Any, committed: TargetStates) -> None:
        self.drafter.observe(state, committed)

    def observe_many(self, items: list[tuple[Any, TargetStates]]) -> None:
        if hasattr(self.drafter, "observe_many"):  # batched as in serving: its cost is the batched one
            self.drafter.observe_many(items)
        else:
            for state, committed in items:
                self.drafter.observe(state, committed)

    def propose(self, state: Any, sequence: Sequence) -> DraftTree | None:
        return _padded(self.drafter.propose(state, sequence), sequence)

    def propose_many(self, items: list[tuple[Any, Sequence]]) -> list[DraftTree | None]:
        if hasattr(self.drafter, "propose_many"):
            trees = list(self.drafter.propose_many(items))
        else:
            trees = [self.drafter.propose(state, sequence) for state, sequence in items]
        return [_padded(tree, sequence) for tree, (_, sequence) in zip(trees, items, strict=True)]

    def state_bytes(self, state: Any) -> int:
        return self.drafter.state_bytes(state)


def _padded(tree: DraftTree | None, sequence: Sequence) -> DraftTree | None:
    wanted = sequence.draft_limit or 0
    if tree is not None and tree.num_nodes >= wanted:
        return tree
    return DraftTree.chain([FILLER_TOKEN] * wanted) if wanted else tree


def measure_step_costs(
    runner: ModelRunner,
    pool: KVPool,
    max_draft: int,
    lane_counts: tuple[int, ...],
    repeats: int,
    budget_s: float = COST_BUDGET_S,
) -> StepCosts | None:
    """The table at `lane_counts` (those the pool holds); past `budget_s` no further round or lane
    count starts, and the table says it was cut short (`StepCosts.complete`: not worth keeping)."""
    assert runner.drafter is not None
    draft_lengths = sorted({0, 1, max(max_draft // 2, 1), max_draft})
    max_tokens = (repeats + 1) * sum(length + 1 for length in draft_lengths)  # every draft accepted
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    per_lane = pool.blocks_for(COST_PROMPT_TOKENS + max_tokens + runner.max_draft_nodes + 1)
    seconds: dict[tuple[int, int], float] = {}
    deadline = time.monotonic() + budget_s
    drafter = runner.drafter
    runner.drafter = _PaddedDrafts(drafter)
    complete = True
    try:
        for num_lanes in lane_counts:
            most_lanes = pool.max_lanes
            if num_lanes * per_lane > pool.allocator.num_free or (most_lanes is not None and num_lanes > most_lanes):
                break
            if seconds and time.monotonic() > deadline:
                complete = False
                break
            measured, complete = _measure_at(runner, pool, num_lanes, draft_lengths, params, repeats, deadline)
            seconds.update(measured)
    finally:
        runner.drafter = drafter
    return StepCosts(seconds, complete) if seconds else None


def _measure_at(
    runner: ModelRunner,
    pool: KVPool,
    num_lanes: int,
    draft_lengths: list[int],
    params: SamplingParams,
    repeats: int,
    deadline: float,
) -> tuple[dict[tuple[int, int], float], bool]:
    """Each draft length's median over the rounds after the warm-up one; where the deadline passed
    before any such round, the warm-up round's (slow, so the table errs towards plain decoding)."""
    sequences = [runner.start(f"cost-{i}", COST_PROMPT, params, pool=pool) for i in range(num_lanes)]
    runner.step([LaneWork(sequence, sequence.num_to_prefill) for sequence in sequences])
    times: dict[int, list[float]] = {length: [] for length in draft_lengths}
    rounds = 0
    while rounds <= repeats and (rounds == 0 or time.monotonic() <= deadline):
        for draft_length in draft_lengths:
            for sequence in sequences:
                sequence.draft_limit = draft_length
            started = time.perf_counter()
            runner.step([LaneWork(sequence) for sequence in sequences])
            times[draft_length].append(time.perf_counter() - started)
        rounds += 1
    for sequence in sequences:
        sequence.cache.release()
    measured = {(num_lanes, k): statistics.median(t[1:] or t) for k, t in times.items()}
    return measured, rounds == repeats + 1


def step_cost_key(served: ServingModel, max_draft: int, lane_counts: tuple[int, ...]) -> StepCostKey:
    """What the costs `measure_step_costs` would measure for `served` depend on (step_cost_cache.py)."""
    loaded, drafter = served.loaded, served.runner.drafter
    formats = repr(loaded.formats) if loaded.formats is not None else f"exact path {loaded.decoder.dtype}"
    return StepCostKey(
        model=f"{served.name} {_file_identity(loaded.checkpoint.source)}",
        formats=formats,
        drafter=f"{served.speculation} {drafter.name if drafter is not None else None} max_draft={max_draft}"
        + "".join(f" {_file_identity(source)}" for source in _drafter_sources(drafter)),
        threads=torch.get_num_threads(),
        cpu=cpu_model(),
        lane_counts=lane_counts,
    )


def _drafter_sources(drafter) -> list[str]:
    """The checkpoints a drafter was read from (auto's: its model drafter's), so that another head
    in the same place (a new bundled one, --draft elsewhere) is another key."""
    if drafter is None:
        return []
    inner = getattr(drafter, "model", None)  # auto's model drafter (a DFlash drafter's network has no source)
    return [source for part in (drafter, inner) if (source := getattr(part, "source", ""))]


def _file_identity(source: str) -> str:
    """Path, bytes and modification time of a model file (of a folder's files, summed and latest)."""
    path = Path(source)
    if not source or not path.exists():
        return source
    files = [path] if path.is_file() else [child for child in path.iterdir() if child.is_file()]
    stats = [file.stat() for file in files]
    return f"{path.resolve()} {sum(s.st_size for s in stats)} B {max((s.st_mtime_ns for s in stats), default=0)}"
