"""Batched speculative sampling on a hybrid reproduces plain sampling's distribution.

tests/worker/speculation/test_batched_sampling_distribution's check on a small-vocabulary
(16 tokens) random Qwen3.5 target: the exact marginals of the first three generated tokens and
the joint of the first two, enumerated through our decoder, against NUM_SAMPLES seeded lanes of
chain and tree speculation (the table drafter: the target's own distributions, accepted often
but not always) stepping together through the scheduler. A hybrid lane keeps its own cache, so
no block pool here. The last test checks that the sample would see a row handed to another lane.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.worker.speculation.test_batched_sampling_distribution import exact_joint, joint_counts, rejects
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
    exact_table,
    position_counts,
)
from worker.engine.runner import ModelRunner
from worker.models.loader import LoadedModel, load_model
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind

MAX_LANES = 16
JOINS_PER_STEP = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> LoadedModel:
    folder = tmp_path_factory.mktemp("small-vocab-hybrid")
    make_tiny_hybrid_model(folder, "qwen3_5_text", seed=3, vocab_size=VOCAB_SIZE)
    return load_model(folder, dtype="float64")


@pytest.fixture(scope="module")
def table(model) -> Table:
    return exact_table(model)


@pytest.fixture(scope="module", params=sorted(DRAFTERS))
def batch(request, model, table) -> tuple[str, list[list[int]]]:
    """Seeds NUM_SAMPLES.. (an independent sample), one lane each, JOINS_PER_STEP joining a step."""
    runner = ModelRunner(model.decoder, [], TableDrafter(table, **DRAFTERS[request.param]))
    stepper = ModelStepper(runner)
    scheduler = Scheduler(stepper, SchedulerConfig(MAX_LANES, 1 << 40))
    pending, outputs, accepted = deque(range(NUM_SAMPLES, 2 * NUM_SAMPLES)), {}, 0
    while pending or not scheduler.idle:
        for _ in range(min(JOINS_PER_STEP, len(pending))):
            seed = pending.popleft()
            params = SamplingParams(seed=seed, **PARAMS)
            kv_bytes = stepper.kv_bytes(len(PROMPT), params.max_tokens)
            scheduler.submit(LaneRequest((str(seed), 0), kv_bytes, None, LaneStart(str(seed), PROMPT, params)))
        for result in scheduler.step():
            assert result.kind is StepKind.DECODE, (result.key, result.kind, result.error)
            if result.state.finished:
                outputs[int(result.key[0])] = list(result.state.output_ids)
                accepted += result.state.sequence.stats.accepted_tokens
                scheduler.retire(result.key)
    assert accepted >= NUM_SAMPLES // 2, f"{request.param}: drafts were hardly accepted ({accepted})"
    return request.param, [outputs[seed] for seed in sorted(outputs)]


def test_the_hybrid_target_is_not_degenerate(table):
    for probs in exact_marginals(table):
        assert (probs > 0.05).sum() >= 3, probs


def test_batched_hybrid_sampling_matches_the_exact_marginals(table, batch):
    mode, outputs = batch
    assert len(outputs) == NUM_SAMPLES and all(len(tokens) == NUM_POSITIONS for tokens in outputs)
    for position, probs in enumerate(exact_marginals(table)):
        p_value = chi_square_p_value(position_counts(outputs, position), probs)
        assert p_value > 1e-3, f"{mode}: position {position}, p={p_value:.2e}"


def test_batched_hybrid_sampling_matches_the_exact_joint_of_the_first_two_tokens(table, batch):
    mode, outputs = batch
    p_value = chi_square_p_value(joint_counts(outputs), exact_joint(table))
    assert p_value > 1e-3, f"{mode}: p={p_value:.2e}"


def test_the_checks_detect_a_five_percent_bias_or_a_row_from_another_lane(table, batch):
    mode, outputs = batch
    marginals = exact_marginals(table)
    for position, probs in enumerate(marginals):
        order = torch.argsort(probs, descending=True)
        biased = probs.clone()
        biased[order[0]] -= 0.05
        biased[order[1]] += 0.05
        assert rejects(position_counts(outputs, position), biased), f"{mode}: position {position}"
    assert rejects(position_counts(outputs, 1), marginals[0]), f"{mode}: another position's row"
    independent = torch.outer(marginals[0], marginals[1]).flatten()
    assert rejects(joint_counts(outputs), independent), f"{mode}: another lane's row, same position"
