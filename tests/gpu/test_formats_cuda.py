"""On CUDA: tiny models in bfloat16 (and int4) against float32, and speculation lossless in each format.

- bfloat16 activations on CUDA (the `auto` dtype there) stay close to the float32 exact path on
  CPU: logits within bfloat16's reach, most greedy argmaxes equal.
- a tree (and chain) verification equals plain decoding token for token in the same format on
  CUDA, as tests/worker/speculation/test_lossless_formats.py checks on CPU.
Skipped without CUDA.
"""

from __future__ import annotations

import functools

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import speculation_checkpoints
from tests.worker.speculation.test_lossless import FAMILIES, assert_same_tokens, decode, make_prompts
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)
FORMATS = {"bfloat16": ("auto", "none"), "int4": ("auto", "int4"), "float32": ("float32", "none")}


@functools.cache
def loaded(family: str, weight_format: str) -> LoadedModel:
    dtype, quantize = FORMATS[weight_format]
    return load_model(speculation_checkpoints(family).target, dtype=dtype, quantize=quantize, device="cuda")


@functools.cache
def outputs(family: str, weight_format: str, mode: str) -> list[list[int]]:
    model = loaded(family, weight_format)
    options = DraftOptions(draft=speculation_checkpoints(family).dflash if mode in ("dflash", "tree") else None)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, load_drafter(mode, model, options))
    prompts = make_prompts(model.config.vocab_size, 6, seed=FAMILIES.index(family))
    return [decode(runner, prompt, GREEDY, SpecStats()) for prompt in prompts]


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_bfloat16_logits_stay_close_to_float32_on_cpu(family: str) -> None:
    target = speculation_checkpoints(family).target
    cpu = load_model(target, dtype="float32").decoder
    gpu = loaded(family, "bfloat16").decoder
    assert gpu.dtype == torch.bfloat16 and gpu.device.type == "cuda"
    token_ids = list(range(3, 40))
    expected = cpu(torch.tensor(token_ids), torch.arange(len(token_ids)), cpu.new_cache(64)).logits
    ours = gpu(torch.tensor(token_ids).cuda(), torch.arange(len(token_ids)).cuda(), gpu.new_cache(64)).logits
    ours = ours.float().cpu()
    assert (ours - expected).abs().max().item() < 0.06 * expected.abs().max().item()
    assert (ours.argmax(-1) == expected.argmax(-1)).float().mean().item() >= 0.75


@pytest.mark.parametrize("mode", ["ngram", "mtp", "dflash", "tree"])
@pytest.mark.parametrize("weight_format", list(FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_speculation_equals_plain_decoding(family: str, weight_format: str, mode: str) -> None:
    assert_same_tokens(outputs(family, weight_format, "none"), outputs(family, weight_format, mode), mode)
