"""Losslessness in every weight format: speculative output equals plain decoding in the same format.

The same tiny targets and drafters as test_lossless.py, loaded in the fast formats: int4 and int8
weight-only (bfloat16 kernels inside a float32 model), dense bfloat16 throughout, and int4 with a
bfloat16 twin serving prefill chunks (or the reverse). Forwards whose logits choose tokens all run
in one decode format (row_plan.FormatSelector): with int4 for one row and the bfloat16 twin for
verification, mtp diverged from plain decoding at the third token of the first prompt, as two
kernels' roundings differ on near-ties.
"""

from __future__ import annotations

import functools

import pytest

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from tests.worker.speculation.test_lossless import (
    FAMILIES,
    MODES,
    PREFILL_CHUNK,
    assert_same_tokens,
    decode,
    make_prompts,
)
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model
from worker.models.row_plan import RowPlan

NUM_PROMPTS = 6
GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)
FORMATS = {  # name -> (dtype, quantize, prefill plan, decode format)
    "int4": ("auto", "int4", RowPlan.single("int4"), "int4"),
    "int8": ("auto", "int8", RowPlan.single("int8"), "int8"),
    "bfloat16": ("bfloat16", "none", None, None),
    # prefill chunks of 2+ rows in the bfloat16 twin, every forward with logits in int4
    "int4, bfloat16 prefill": ("auto", "int4", RowPlan(((1, "int4"), (None, "bfloat16"))), "int4"),
    # the reverse, as a tree worker whose verification width favours bfloat16 would run
    "bfloat16, int4 prefill": ("auto", "int4", RowPlan(((8, "int4"), (None, "bfloat16"))), "bfloat16"),
}
assert PREFILL_CHUNK > 1


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def loaded(family: str, weight_format: str) -> LoadedModel:
    dtype, quantize, plan, decode_format = FORMATS[weight_format]
    model = load_model(speculation_checkpoints(family).target, dtype=dtype, quantize=quantize, row_plan=plan)
    if plan is not None:
        model.decoder.set_formats(plan, decode_format)
    return model


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
