"""Batched sampling reproduces plain sampling's distribution, lane by lane.

test_sampling_distribution's small-vocabulary target, exact marginals and table drafter, with
every sample a lane of one batch: NUM_SAMPLES lanes of the same prompt go through the real
scheduler and stepper, their K/V in one block pool, up to MAX_LANES of them in one target
forward. New lanes join every step while others are one or two tokens in, so a step mixes lanes
at different positions. What a broken batch would get wrong:

- a row handed to the wrong lane samples one position from another position's distribution
  (the marginals shift), or from another lane's context at the same position (the marginals
  stay, the joint of the first two tokens does not);
- lanes drawing from one shared generator keep the distribution but not the seeded tokens: a
  seeded lane must emit what the same request emits alone.

The last test checks that these checks have the power to see both kinds of mix-up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
import torch

from shared.sampling import SamplingParams
from tests.worker.speculation import test_sampling_distribution as single_lane
from tests.worker.speculation.test_sampling_distribution import (
    DRAFTERS,
    NUM_POSITIONS,
    NUM_SAMPLES,
    PARAMS,
    PROMPT,
    VOCAB_SIZE,
    Table,
    TableDrafter,
    chi_square_p_value,
    exact_marginals,
    position_counts,
    sample_outputs,
)
from worker.engine.runner import ModelRunner
from worker.models.kv_pool import KVPool
from worker.models.loader import LoadedModel
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.scheduler import LaneRequest, LaneWorkItem, Scheduler, SchedulerConfig, StepKind

MAX_LANES = 16
JOINS_PER_STEP = 8  # more than plain decoding retires (16 lanes / 3 steps): the lanes stay full
BLOCK_TOKENS = 4  # a lane spans several blocks, and churn scatters them
NUM_BLOCKS = 256  # room for every lane at its longest: no preemption here (test_batched_engine has it)
MAX_BATCH_TOKENS = 256
MODES = ["plain", *sorted(DRAFTERS)]

# The single-lane test's fixtures serve here too: its model, its exact table, one torch thread.
model, table, _one_thread = single_lane.model, single_lane.table, single_lane._one_thread


class RecordingStepper(ModelStepper):
    """The real stepper, noting for each step how many tokens each of its lanes had emitted."""

    def __init__(self, runner: ModelRunner, pool: KVPool):
        super().__init__(runner, pool=pool)
        self.step_positions: list[list[int]] = []

    def step(self, items: list[LaneWorkItem]) -> list[list[int] | Exception]:
        self.step_positions.append([len(item.state.output_ids) for item in items])
        return super().step(items)


@dataclass(slots=True)
class Batch:
    outputs: list[list[int]]  # one per seed, in the seeds' order
    step_positions: list[list[int]]  # per step: each lane's position (tokens emitted before it)


def drafter_for(mode: str, table: Table) -> TableDrafter | None:
    return None if mode == "plain" else TableDrafter(table, **DRAFTERS[mode])


def sample_batched(model: LoadedModel, drafter: TableDrafter | None, seeds: range) -> Batch:
    """One lane per seed, JOINS_PER_STEP joining before each step, run until every one is done."""
    decoder = model.decoder
    pool = KVPool(decoder.config, NUM_BLOCKS, BLOCK_TOKENS, decoder.dtype, decoder.device)
    stepper = RecordingStepper(ModelRunner(decoder, [], drafter), pool)
    scheduler = Scheduler(stepper, SchedulerConfig(MAX_LANES, 1 << 40, MAX_BATCH_TOKENS, pool.num_blocks))
    pending, outputs = deque(seeds), {}
    while pending or not scheduler.idle:
        for _ in range(min(JOINS_PER_STEP, len(pending))):
            submit(scheduler, stepper, pending.popleft())
        for result in scheduler.step():
            assert result.kind is StepKind.DECODE, (result.key, result.kind, result.error)
            if result.state.finished:
                outputs[int(result.key[0])] = list(result.state.output_ids)
                scheduler.retire(result.key)
        assert len(stepper.step_positions) <= NUM_POSITIONS * len(seeds), "the batch never drained"
    assert pool.allocator.num_used == 0
    return Batch([outputs[seed] for seed in seeds], stepper.step_positions)


def submit(scheduler: Scheduler, stepper: ModelStepper, seed: int) -> None:
    params = SamplingParams(seed=seed, **PARAMS)
    start = LaneStart(str(seed), PROMPT, params)
    blocks = stepper.blocks_to_admit(len(PROMPT))
    most = stepper.max_blocks(len(PROMPT), params.max_tokens)
    scheduler.submit(LaneRequest((str(seed), 0), 0, None, start, blocks, most))


def exact_joint(table: Table) -> torch.Tensor:
    """P(first token, second token), flattened to [V * V]."""
    first, never = table[()], torch.zeros(VOCAB_SIZE, dtype=torch.float64)
    return torch.stack([first[t] * table[(t,)] if first[t] > 0 else never for t in range(VOCAB_SIZE)]).flatten()


def joint_counts(outputs: list[list[int]]) -> torch.Tensor:
    counts = torch.zeros(VOCAB_SIZE * VOCAB_SIZE, dtype=torch.float64)
    for tokens in outputs:
        counts[tokens[0] * VOCAB_SIZE + tokens[1]] += 1
    return counts


@pytest.fixture(scope="module", params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def fresh_batch(model, table, mode) -> Batch:
    # Seeds the alone runs never use: an independent sample, not a replay of theirs.
    return sample_batched(model, drafter_for(mode, table), range(NUM_SAMPLES, 2 * NUM_SAMPLES))


def test_lanes_share_steps_at_different_positions(mode, fresh_batch):
    # Lanes in step with each other would hide a row handed to a lane at another position.
    lanes_per_step = [len(positions) for positions in fresh_batch.step_positions]
    mixed = sum(len(set(positions)) > 1 for positions in fresh_batch.step_positions)
    assert max(lanes_per_step) == MAX_LANES, mode
    assert sum(lanes_per_step) / len(lanes_per_step) >= 8, f"{mode}: {lanes_per_step}"
    assert mixed >= 0.8 * len(lanes_per_step), f"{mode}: {mixed} of {len(lanes_per_step)} steps mix positions"


def test_batched_sampling_matches_the_exact_marginals(table, mode, fresh_batch):
    for position, probs in enumerate(exact_marginals(table)):
        p_value = chi_square_p_value(position_counts(fresh_batch.outputs, position), probs)
        assert p_value > 1e-3, f"{mode}: position {position}, p={p_value:.2e}"


def test_batched_sampling_matches_the_exact_joint_of_the_first_two_tokens(table, mode, fresh_batch):
    p_value = chi_square_p_value(joint_counts(fresh_batch.outputs), exact_joint(table))
    assert p_value > 1e-3, f"{mode}: p={p_value:.2e}"


def test_a_seeded_lane_in_a_batch_emits_its_tokens_alone(model, table, mode):
    drafter = drafter_for(mode, table)
    batched = sample_batched(model, drafter, range(NUM_SAMPLES)).outputs
    alone = sample_outputs(model, drafter)  # seeds 0 .. NUM_SAMPLES-1, one request at a time
    differing = [seed for seed, (got, want) in enumerate(zip(batched, alone, strict=True)) if got != want]
    assert not differing, f"{mode}: {len(differing)} lanes differ from the request alone, e.g. seed {differing[0]}"


def rejects(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """Whether the checks above would fail on `counts` were `probs` the truth."""
    if counts[probs == 0].sum() > 0:
        return True  # a token it never draws: chi_square_p_value's assertion
    return chi_square_p_value(counts, probs) < 1e-4


def test_the_checks_detect_a_row_from_another_lane(table, mode, fresh_batch):
    # The batch's own tokens against what a mix-up would make of them: the second token drawn
    # from a fresh lane's row (the first token's distribution), or from the row of another lane
    # at the same position (independent of this lane's first token).
    marginals = exact_marginals(table)
    assert rejects(position_counts(fresh_batch.outputs, 1), marginals[0]), f"{mode}: another position's row"
    independent = torch.outer(marginals[0], marginals[1]).flatten()
    assert rejects(joint_counts(fresh_batch.outputs), independent), f"{mode}: another lane's row, same position"
