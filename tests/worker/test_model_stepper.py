"""The scheduler and the paired prefill cache over a real (tiny, random) model and real drafters."""

from __future__ import annotations

import functools

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import speculation_checkpoints
from worker.drafters.oracle import OracleDrafter
from worker.drafters.registry import DraftOptions
from worker.engine.generate import generate
from worker.engine.runner import ModelRunner
from worker.serving.model_stepper import LaneStart, LaneState, ModelStepper
from worker.serving.prefix_cache import PrefixCache
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind
from worker.serving_model import ServingModel, load_serving_model
from worker.speculation.step_costs import StepCosts

SYSTEM = "You are a helpful assistant. Speculative decoding drafts tokens and verifies them in one forward pass. " * 2


@functools.cache
def served(mode: str) -> ServingModel:
    checkpoints = speculation_checkpoints("qwen3")
    draft = checkpoints.dflash if mode in ("dflash", "tree") else None
    return load_serving_model(checkpoints.target, mode, DraftOptions(draft=draft))


def chat(model: ServingModel, user: str) -> list[int]:
    return model.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])


def prefill(stepper: ModelStepper, prompt_ids: list[int], params: SamplingParams, chunk: int = 16) -> LaneState:
    state = stepper.start(LaneStart("lane", prompt_ids, params))
    while stepper.num_to_prefill(state):
        stepper.prefill(state, chunk)
    return state


def finish(stepper: ModelStepper, state: LaneState) -> LaneState:
    while not state.finished:
        stepper.decode(state)
    return state


def assert_same_drafter_context(mode: str, warm, cold, num_tokens: int) -> None:
    if mode == "auto":  # both of its sources' contexts
        assert_same_drafter_context("suffix", warm.suffix, cold.suffix, num_tokens)
        assert_same_drafter_context("mtp", warm.model, cold.model, num_tokens)
    elif mode == "ngram":
        assert (warm.num_seen, warm.draft()) == (cold.num_seen, cold.draft()) and warm.num_seen == num_tokens
    elif mode == "suffix":
        assert warm.tokens == cold.tokens and len(warm.tokens) == num_tokens
    elif mode in ("dflash", "tree"):
        assert warm.cache.length == cold.cache.length == num_tokens
        torch.testing.assert_close(warm.cache.keys[:, :, :num_tokens], cold.cache.keys[:, :, :num_tokens])
    elif mode == "mtp":
        assert warm.cache.length == cold.cache.length == num_tokens
        torch.testing.assert_close(warm.cache.keys[:, :, :num_tokens], cold.cache.keys[:, :, :num_tokens])
        torch.testing.assert_close(warm.next_hidden, cold.next_hidden)


@pytest.mark.parametrize("mode", ["none", "ngram", "mtp", "dflash", "tree", "suffix", "auto"])
def test_a_shared_system_prompt_hits_and_output_and_drafting_equal_a_cold_run(mode):
    model = served(mode)
    first, second = chat(model, "What is one plus one?"), chat(model, "Tell me about foxes, please.")
    params = SamplingParams(max_tokens=24)
    cold_stepper = ModelStepper(model.runner, None)
    cold = prefill(cold_stepper, second, params)
    cache = PrefixCache(1 << 30, block_tokens=8)
    stepper = ModelStepper(model.runner, cache)
    finish(stepper, prefill(stepper, first, params))
    warm = prefill(stepper, second, params)
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert warm.prefix_tokens == shared - shared % 8 > 0
    assert (stepper.counters.prefix_cache_queries, stepper.counters.prefix_cache_hits) == (2, 1)
    if mode != "none":
        assert_same_drafter_context(mode, warm.sequence.drafter_state, cold.sequence.drafter_state, len(second) - 1)
    if mode in ("suffix", "auto"):  # both draft from the worker's tree, which the first finished request just grew
        assert model.runner.drafter.propose(warm.sequence.drafter_state, warm.sequence) == model.runner.drafter.propose(
            cold.sequence.drafter_state, cold.sequence
        )
    finish(stepper, warm), finish(cold_stepper, cold)
    assert warm.output_ids == cold.output_ids
    if mode not in ("suffix", "auto"):  # (the one finishing first teaches the other's drafts its output)
        assert (warm.stats.drafts, warm.stats.accepted_tokens) == (cold.stats.drafts, cold.stats.accepted_tokens)
    if mode == "ngram":
        assert warm.stats.accepted_tokens > 0  # the reused index does real work


def test_a_drafter_that_cannot_export_its_context_turns_the_cache_off():
    model = served("none")
    runner = ModelRunner(
        model.runner.decoder,
        model.loaded.checkpoint.eos_token_ids,
        OracleDrafter([0] * 8, depth=2, vocab_size=model.loaded.config.vocab_size),
    )
    assert ModelStepper(runner, PrefixCache(1 << 20)).prefix_cache is None
    assert ModelStepper(model.runner, PrefixCache(1 << 20)).prefix_cache is not None


def test_a_long_prompt_is_prefilled_in_chunks_in_the_steps_where_the_other_lane_decodes():
    model = served("ngram")
    short = chat(model, "Hi")
    long = chat(model, "Please summarise: " + "the quick brown fox jumps over the lazy dog " * 12)
    params = SamplingParams(max_tokens=12)
    stepper = ModelStepper(model.runner)
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=2, max_kv_bytes=1 << 40, max_batch_tokens=32))
    scheduler.submit(LaneRequest(("short", 0), 1, None, LaneStart("short", short, params)))
    scheduler.submit(LaneRequest(("long", 0), 1, None, LaneStart("long", long, params)))
    steps, outputs = [], {}
    while not scheduler.idle:
        results = scheduler.step()
        steps.append({(result.key[0], result.kind) for result in results})
        for result in results:
            if result.kind is StepKind.DECODE and result.state.finished:
                outputs[result.key[0]] = list(result.state.output_ids)
                scheduler.retire(result.key)
    long_prefills = [i for i, step in enumerate(steps) if ("long", StepKind.PREFILL) in step]
    assert len(long_prefills) >= 4, "the long prompt is prefilled in chunks"
    short_decodes = [i for i, step in enumerate(steps) if ("short", StepKind.DECODE) in step]
    while_short_runs = [i for i in long_prefills if short_decodes[0] <= i <= short_decodes[-1]]
    assert while_short_runs, "the short lane ran while the long one prefilled"
    assert all(i in short_decodes for i in while_short_runs), "each such step decodes the short lane too"
    for name, prompt in (("short", short), ("long", long)):
        assert outputs[name] == generate(model.runner, model.tokenizer, prompt, params).token_ids


def test_logprobs_come_with_every_emitted_token():
    model = served("ngram")
    stepper = ModelStepper(model.runner)
    state = stepper.start(LaneStart("lp", chat(model, "Hi"), SamplingParams(max_tokens=8), num_logprobs=3))
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 64)
    while not state.finished:
        emitted = stepper.decode(state)
        assert [entry.token_id for entry in state.logprobs] == emitted
        for entry in state.logprobs:
            assert len(entry.top) == 3 and entry.top[0][0] == entry.token_id  # greedy: the top token
            assert entry.logprob == pytest.approx(entry.top[0][1]) and entry.logprob <= 0.0


def test_logprobs_keep_coming_as_other_lanes_start_and_end():
    """The logits are observed only while some lane asks for logprobs: lanes that do not ask come and
    go around one that does, and a lane that asks after all others ended gets them again."""
    model = served("none")
    stepper = ModelStepper(model.runner)

    def started(name: str, num_logprobs: int | None) -> LaneState:
        params = SamplingParams(max_tokens=6)
        state = stepper.start(LaneStart(name, chat(model, "Hi"), params, num_logprobs=num_logprobs))
        while stepper.num_to_prefill(state):
            stepper.prefill(state, 64)
        return state

    def decode_checked(state: LaneState) -> None:
        emitted = stepper.decode(state)
        expected = emitted if state.num_logprobs is not None else []
        assert [entry.token_id for entry in state.logprobs] == expected

    asking, plain = started("asking", 2), started("plain", None)
    decode_checked(asking), decode_checked(plain)
    stepper.release(plain)  # a lane without logprobs ends: the asking one still gets them
    while not asking.finished:
        decode_checked(asking)
    stepper.release(asking)
    plain = started("plain-2", None)
    decode_checked(plain)
    asking = started("asking-2", 1)  # asks after every asking lane ended
    while not asking.finished:
        decode_checked(asking)


def test_a_lane_that_has_not_drafted_yet_drafts_though_the_workers_acceptance_is_low():
    """Adaptive speculation: a fresh lane gets the prior acceptance, not the worker's low figure
    (it would never draft, so never show its own); a lane that drafted badly stops drafting."""
    model = served("ngram")
    stepper = ModelStepper(model.runner)
    # drafting costs next to nothing here: a lane drafts whenever its acceptance is not tiny
    stepper.step_costs = StepCosts({(1, 0): 1.0, (1, 1): 1.1, (1, 3): 1.3})
    for _ in range(200):  # the worker's drafts were refused at depth 1 nineteen times in twenty
        stepper.worker_acceptance.record(1 if _ % 20 == 0 else 0, offered_next=True)
    fresh = prefill(stepper, chat(model, "Hi"), SamplingParams(max_tokens=4))
    stepper._limit_drafts([fresh])
    assert fresh.sequence.draft_limit == 3
    for _ in range(10):  # its own drafts were all rejected
        fresh.acceptance.record(0, offered_next=True)
    stepper._limit_drafts([fresh])
    assert fresh.sequence.draft_limit == 0
