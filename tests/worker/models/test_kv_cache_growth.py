"""A lane's own KV cache (and a drafter's) allocates as the lane grows, not for its longest context.

The oracle: the same decoding with a cache allocated whole up front (INITIAL_TOKENS raised past
the context) gives the same logits; the growing cache holds about twice what the lane used,
whatever its max_tokens.
"""

from __future__ import annotations

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import speculation_checkpoints
from tests.support.tiny_models import make_tiny_model
from worker.drafters import mtp
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.models import kv_cache
from worker.models.kv_cache import INITIAL_TOKENS, KVCache
from worker.models.loader import LoadedModel, load_model

LONGEST = 1 << 20  # a lane that may reach a million tokens


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> LoadedModel:
    return load_model(make_tiny_model(tmp_path_factory.mktemp("growth") / "qwen3", "qwen3"), dtype="float64")


def test_the_buffer_starts_small_and_doubles_keeping_what_it_held(model):
    cache = KVCache(model.config, LONGEST, torch.float64)
    assert cache.keys.shape[2] == INITIAL_TOKENS
    cache.keys[:, :, :INITIAL_TOKENS] = torch.randn_like(cache.keys)
    before = cache.keys.clone()
    cache.reserve(INITIAL_TOKENS + 1)
    assert cache.keys.shape[2] == 2 * INITIAL_TOKENS and torch.equal(cache.keys[:, :, :INITIAL_TOKENS], before)
    cache.reserve(5 * INITIAL_TOKENS)
    assert cache.keys.shape[2] == 5 * INITIAL_TOKENS  # more than doubling asked: exactly what was asked
    small = KVCache(model.config, 100, torch.float64)
    assert small.keys.shape[2] == 100
    with pytest.raises(AssertionError, match="overflow"):
        small.reserve(101)


@pytest.mark.parametrize("mode", ["none", "mtp", "dflash", "tree"])
def test_a_growing_cache_decodes_as_one_allocated_whole(mode, monkeypatch):
    """Greedy decoding past several growths (from 64 slots, a 200-token prompt, 280 more tokens): the target's
    cache and the drafter's (MTP's K/V and hidden states, DFlash's K/V) grow, and the tokens are
    those of the same run with every buffer allocated whole."""
    checkpoints = speculation_checkpoints("qwen3")
    model = load_model(checkpoints.target, dtype="float64")
    dflash = mode in ("dflash", "tree")
    options = DraftOptions(draft=checkpoints.dflash if dflash else None, tree_budget=8 if mode == "tree" else None)
    prompt = [(7 * i) % 200 + 3 for i in range(200)]
    params = SamplingParams(max_tokens=280, ignore_eos=True)

    def run() -> tuple[list[int], int]:  # the tokens, and the slots allocated once prefilled
        drafter = None if mode == "none" else load_drafter(mode, model, options)
        runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
        sequence = runner.start("grow", prompt, params)
        while sequence.num_to_prefill:
            runner.prefill(sequence, 64)
        after_prefill = sequence.cache.keys.shape[2]
        while not sequence.finished:
            runner.decode_step(sequence)
        return sequence.output_ids, after_prefill

    for module in (kv_cache, mtp):
        monkeypatch.setattr(module, "INITIAL_TOKENS", 64)
    grown, allocated = run()
    assert allocated == 256  # 199 tokens prefilled: 64 -> 128 -> 256
    for module in (kv_cache, mtp):
        monkeypatch.setattr(module, "INITIAL_TOKENS", LONGEST)
    whole, allocated = run()
    assert allocated > len(prompt) + params.max_tokens  # the lane's longest, from its first token
    assert grown == whole
