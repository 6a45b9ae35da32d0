"""Hybrid lanes stepping together through the real scheduler and stepper emit what each request
emits alone, in every speculation mode a hybrid serves.

A hybrid lane's cache is its own (K/V of the attention layers and the recurrent state, sized at
its start: no block pool), so the scheduler admits it by `kv_bytes`. Lanes join every other step
and leave when done, a small token budget puts prefill chunks in the same steps as decode rows,
and the step's forward is one HybridDecoder.forward_lanes over every lane's rows. The DFlash
modes run with the random drafter and with it steered (tests/support/steered_dflash), so that
lanes in one step also commit tree paths several nodes deep. The oracle: plain greedy decoding
of the request alone; for a seeded sampled request, the same request alone in the same mode.
"""

from __future__ import annotations

import functools
import random

import pytest

from shared.sampling import SamplingParams
from tests.support.steered_dflash import SteeredDFlash
from tests.worker.models.hybrid.test_hybrid_dflash import TREE_BUDGET, dflash_drafter, hybrid_target
from tests.worker.speculation.test_lossless import decode, make_prompts
from worker.drafters.oracle import greedy_reference
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import Drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind

FAMILIES = ("qwen3_5_text", "qwen3_next")
MODES = ("none", "ngram", "dflash", "tree", "steered-dflash", "steered-tree")
NUM_LANES = 8
MAX_LANES = 6
MAX_BATCH_TOKENS = 48
MAX_NEW_TOKENS = 32
Lane = tuple[str, list[int], SamplingParams]


def lanes_for(family: str, sampled: bool = False) -> list[Lane]:
    rng = random.Random(13)
    prompts = make_prompts(hybrid_target(family)[0].config.vocab_size, NUM_LANES, seed=7)
    lanes = []
    for index, prompt in enumerate(prompts):
        max_tokens = rng.randint(6, MAX_NEW_TOKENS)
        params = (
            SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, top_p=0.9, seed=200 + index)
            if sampled
            else SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        )
        lanes.append((f"lane-{index}", prompt, params))
    return lanes


@functools.cache
def references(family: str) -> tuple[tuple[int, ...], ...]:
    """Each lane's prompt + its plain greedy continuation (the steered drafters' guide)."""
    decoder = hybrid_target(family)[0].decoder
    return tuple(tuple(greedy_reference(decoder, prompt, MAX_NEW_TOKENS + 4)) for _, prompt, _ in lanes_for(family))


def drafter_for(family: str, mode: str) -> Drafter | None:
    model, _ = hybrid_target(family)
    if mode.startswith("steered-"):
        base = mode.removeprefix("steered-")
        return SteeredDFlash(dflash_drafter(family, base), references(family), TREE_BUDGET if base == "tree" else None)
    if mode in ("dflash", "tree"):
        return dflash_drafter(family, mode)
    return load_drafter(mode, model, DraftOptions())


@functools.cache
def runner_for(family: str, mode: str) -> ModelRunner:
    model, _ = hybrid_target(family)
    return ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter_for(family, mode))


def run_batched(
    runner: ModelRunner, lanes: list[Lane]
) -> tuple[dict[str, list[int] | Exception], list[int], SpecStats]:
    """Lanes join one every other step; returns each one's output (or error), the number of
    lanes in each step and the lanes' speculation statistics summed."""
    stepper = ModelStepper(runner)
    scheduler = Scheduler(stepper, SchedulerConfig(MAX_LANES, 1 << 40, MAX_BATCH_TOKENS))
    pending, outputs, lanes_per_step, stats = list(lanes), {}, [], SpecStats()
    step = 0
    while pending or not scheduler.idle:
        if pending and step % 2 == 0:
            name, prompt, params = pending.pop(0)
            kv_bytes = stepper.kv_bytes(len(prompt), params.max_tokens)
            scheduler.submit(LaneRequest((name, 0), kv_bytes, None, LaneStart(name, prompt, params)))
        results = scheduler.step()
        lanes_per_step.append(sum(r.kind in (StepKind.PREFILL, StepKind.DECODE) for r in results))
        for result in results:
            if result.kind is StepKind.FAILED:
                outputs[result.key[0]] = result.error
            elif result.kind is StepKind.DECODE and result.state.finished:
                outputs[result.key[0]] = list(result.state.output_ids)
                stats.merge(result.state.sequence.stats)
                scheduler.retire(result.key)
        step += 1
        assert step < 2000, "the batch never drained"
    return outputs, lanes_per_step, stats


def alone(family: str, mode: str, prompt: list[int], params: SamplingParams) -> list[int]:
    return decode(runner_for(family, mode), prompt, params, SpecStats())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_hybrid_lane_of_a_batch_emits_its_greedy_tokens_alone(family, mode):
    lanes = lanes_for(family)
    outputs, lanes_per_step, stats = run_batched(runner_for(family, mode), lanes)
    assert max(lanes_per_step) == MAX_LANES, "lanes did share steps"
    for (name, prompt, params), reference in zip(lanes, references(family), strict=True):
        got = outputs[name]
        assert not isinstance(got, Exception), f"{name} failed: {got!r}"
        assert prompt + got == list(reference[: len(prompt) + params.max_tokens]), f"mode {mode}: {name}"
    if mode.startswith("steered-"):  # lanes in one step committed paths past the root
        assert stats.accepted_per_depth[1:] and stats.accepted_per_depth[1] > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_seeded_sampled_hybrid_lane_emits_the_same_tokens_in_a_batch(family, mode):
    lanes = lanes_for(family, sampled=True)
    outputs, _, _ = run_batched(runner_for(family, mode), lanes)
    for name, prompt, params in lanes:
        got = outputs[name]
        assert not isinstance(got, Exception), f"{name} failed: {got!r}"
        assert got == alone(family, mode, prompt, params), f"mode {mode}: {name} differs from the request alone"
