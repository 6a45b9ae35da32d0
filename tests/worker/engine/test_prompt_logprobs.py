"""The prompt's logprobs from the prefill forward, against a transformers float32 forward of the
same tokens. Tolerance: 1e-4 absolute on each logprob (both float32; observed ~1e-6)."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import speculation_checkpoints
from worker.drafters.registry import DraftOptions
from worker.models.kv_pool import KVPool
from worker.serving.model_stepper import LaneStart, LaneState, ModelStepper
from worker.serving.prefix_cache import PrefixCache
from worker.serving_model import ServingModel, load_serving_model

ATOL = 1e-4
PROMPT = "The quick brown fox jumps over the lazy dog. def add(a, b): return a + b"


@functools.cache
def served(mode: str = "none") -> ServingModel:
    checkpoints = speculation_checkpoints("qwen3")
    draft = checkpoints.dflash if mode in ("dflash", "tree") else None
    return load_serving_model(checkpoints.target, mode, DraftOptions(draft=draft))


@functools.cache
def reference() -> transformers.PreTrainedModel:
    target = speculation_checkpoints("qwen3").target
    return transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()


def reference_logprobs(token_ids: list[int]) -> torch.Tensor:  # [T - 1, V]: row i scores token i + 1
    with torch.inference_mode():
        logits = reference()(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


def scored(stepper: ModelStepper, prompt_ids: list[int], num_top: int, max_tokens: int = 4, chunk: int = 7):
    state = stepper.start(
        LaneStart("lane", prompt_ids, SamplingParams(max_tokens=max_tokens), num_prompt_logprobs=num_top)
    )
    while stepper.num_to_prefill(state):
        stepper.prefill(state, chunk)
    return state


def entries_of(state: LaneState) -> list[tuple[int, float, int]]:
    prompt = state.sequence.prompt_logprobs
    assert prompt is not None and prompt.complete
    return [(ranked.entry.token_id, ranked.entry.logprob, ranked.rank) for ranked in prompt.entries]


def assert_same(first: list[tuple[int, float, int]], second: list[tuple[int, float, int]]) -> None:
    assert [(token, rank) for token, _, rank in first] == [(token, rank) for token, _, rank in second]
    assert [logprob for _, logprob, _ in first] == pytest.approx([logprob for _, logprob, _ in second], abs=ATOL)


@pytest.mark.parametrize("mode", ["none", "mtp", "tree"])
def test_prompt_logprobs_equal_a_transformers_forward(mode):
    model = served(mode)
    prompt_ids = model.encode_text(PROMPT)
    state = scored(ModelStepper(model.runner), prompt_ids, num_top=3)
    expected = reference_logprobs(prompt_ids)
    prompt = state.sequence.prompt_logprobs
    assert prompt is not None and len(prompt.entries) == len(prompt_ids) - 1
    for position, ranked in enumerate(prompt.entries):
        token = prompt_ids[position + 1]
        row = expected[position]
        assert ranked.entry.token_id == token
        assert ranked.entry.logprob == pytest.approx(row[token].item(), abs=ATOL)
        assert ranked.rank == int((row > row[token]).sum()) + 1 or abs(ranked.entry.logprob - row.max().item()) < ATOL
        top_ids = [token_id for token_id, _ in ranked.entry.top]
        assert top_ids == row.topk(3).indices.tolist()
        assert (ranked.rank == 1) == (top_ids[0] == token)


def test_chunking_does_not_change_them_and_decoding_goes_on():
    model = served()
    prompt_ids = model.encode_text(PROMPT)
    whole = scored(ModelStepper(model.runner), prompt_ids, num_top=2, chunk=1000)
    chunked = scored(ModelStepper(model.runner), prompt_ids, num_top=2, chunk=3)
    assert_same(entries_of(chunked), entries_of(whole))
    stepper = ModelStepper(model.runner)
    while not chunked.finished:
        stepper.decode(chunked)
    assert len(chunked.output_ids) == 4


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing():
    model = served()
    prompt_ids = model.encode_text(PROMPT)
    stepper = ModelStepper(model.runner)
    state = stepper.start(LaneStart("zero", prompt_ids, SamplingParams(max_tokens=0), num_prompt_logprobs=0))
    assert not state.finished  # its prefill is still to run
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 5)
    assert state.finished and state.finish_reason == "length" and state.output_ids == []
    assert len(entries_of(state)) == len(prompt_ids) - 1
    assert stepper.decode(state) == []


def test_a_cached_prefix_is_computed_again_for_prompt_logprobs():
    model = served()
    pool = KVPool(model.runner.decoder.config, 64, 8, model.runner.decoder.dtype, model.runner.decoder.device)
    stepper = ModelStepper(model.runner, PrefixCache(1 << 30, block_tokens=8), pool=pool)
    prompt_ids = model.encode_text(PROMPT)
    plain = stepper.start(LaneStart("warm", prompt_ids, SamplingParams(max_tokens=1)))
    while stepper.num_to_prefill(plain):
        stepper.prefill(plain, 64)
    stepper.release(plain)  # its prefix stays in the cache
    state = scored(stepper, prompt_ids, num_top=0)
    assert state.prefix_tokens == 0 and stepper.counters.prefix_cache_hits == 0
    alone = scored(ModelStepper(model.runner), prompt_ids, num_top=0)
    assert_same(entries_of(state), entries_of(alone))


def test_a_preempted_lane_keeps_one_entry_per_token():
    model = served()
    pool = KVPool(model.runner.decoder.config, 64, 8, model.runner.decoder.dtype, model.runner.decoder.device)
    stepper = ModelStepper(model.runner, pool=pool)
    prompt_ids = model.encode_text(PROMPT)
    state = scored(stepper, prompt_ids, num_top=1, chunk=64)
    before = entries_of(state)
    stepper.preempt(state)
    stepper.resume(state)
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 5)
    assert entries_of(state) == before
