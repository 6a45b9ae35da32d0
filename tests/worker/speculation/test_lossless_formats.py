"""Losslessness in every weight format: speculative output equals plain decoding in the same format.

The same tiny targets and drafters as test_lossless.py, loaded in the fast formats: int4 and int8
weight-only on torch's kernels (bfloat16 inside a float32 model), and dense bfloat16 throughout.
Every forward runs in the model's one format (weight_formats.py): when a bfloat16 twin once
served verification beside int4 for one row, mtp diverged from plain decoding at the third token
of the first prompt, as two kernels' roundings differ on near-ties.
"""

from __future__ import annotations

import functools

import pytest

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from tests.worker.speculation.test_lossless import (
    FAMILIES,
    MODES,
    assert_same_tokens,
    decode,
    make_prompts,
)
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model

NUM_PROMPTS = 6
GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)
FORMATS = {"int4": ("auto", "int4"), "int8": ("auto", "int8"), "bfloat16": ("bfloat16", "none")}  # (dtype, quantize)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def loaded(family: str, weight_format: str) -> LoadedModel:
    dtype, quantize = FORMATS[weight_format]
    return load_model(speculation_checkpoints(family).target, dtype=dtype, quantize=quantize, kernels="torch")


@functools.cache
def outputs(family: str, weight_format: str, mode: str) -> tuple[list[list[int]], SpecStats]:
    model = loaded(family, weight_format)
    options = DraftOptions(draft=speculation_checkpoints(family).dflash if mode in ("dflash", "tree") else None)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, load_drafter(mode, model, options))
    prompts = make_prompts(model.config.vocab_size, NUM_PROMPTS, seed=FAMILIES.index(family))
    stats = SpecStats()
    return [decode(runner, prompt, GREEDY, stats) for prompt in prompts], stats


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_speculation_equals_plain_decoding_in_the_same_format(family: str, weight_format: str, mode: str) -> None:
    expected, _ = outputs(family, weight_format, "none")
    got, stats = outputs(family, weight_format, mode)
    assert_same_tokens(expected, got, f"{mode} in {weight_format}")
    assert stats.draft_tokens > 0, "the drafter never proposed anything: the test would prove nothing"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_formats_really_differ_from_float32(family: str) -> None:
    """Guards the test above against loading the exact path by mistake: int4 output is another model's."""
    int4, _ = outputs(family, "int4", "none")
    exact = load_model(speculation_checkpoints(family).target, dtype="float32")
    assert loaded(family, "int4").decoder.lm_head is not exact.decoder.lm_head
    assert loaded(family, "int4").decoder.model.layers[0].self_attn.qkv_proj is not None
    assert any(len(tokens) == GREEDY.max_tokens for tokens in int4)
