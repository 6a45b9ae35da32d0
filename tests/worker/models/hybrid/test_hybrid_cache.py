"""The hybrid cache keeps the KV cache's commit contract for chains: after a verification the state
of the last accepted row is kept, and anything a chain cannot express (trees, rewinding a prefix,
prefix reuse) is refused rather than served wrong."""

from __future__ import annotations

import pytest
import torch

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.engine.runner import ModelRunner
from worker.model_stepper import ModelStepper
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.hybrid.hybrid_cache import HybridCache, TreeOverRecurrentState
from worker.models.loader import LoadedModel, load_model
from worker.prefix_cache import PrefixCache

PROMPT = [5, 17, 42, 99, 7, 3, 11, 60, 2, 31, 8]
DRAFT = [44, 45, 46]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> LoadedModel:
    folder = make_tiny_hybrid_model(tmp_path_factory.mktemp("next"), "qwen3_next")
    return load_model(folder, dtype="float64")


def _prefilled(decoder: HybridDecoder) -> HybridCache:
    cache = decoder.new_cache(64)
    decoder(torch.tensor(PROMPT), torch.arange(len(PROMPT)), cache, num_logits=0)
    cache.commit(len(PROMPT))
    return cache


def _forward(decoder: HybridDecoder, cache: HybridCache, token_ids: list[int]) -> torch.Tensor:
    positions = torch.arange(cache.length, cache.length + len(token_ids))
    return decoder(torch.tensor(token_ids), positions, cache).logits


def test_verification_commit_keeps_the_state_after_the_last_accepted_row(model):
    decoder = model.decoder
    verified = _prefilled(decoder)
    _forward(decoder, verified, [1, *DRAFT])  # root + 3 drafts
    verified.commit(4, [0, 1])  # the root and the first draft accepted
    stepped = _prefilled(decoder)
    _forward(decoder, stepped, [1, DRAFT[0]])
    stepped.commit(2)
    assert verified.length == stepped.length == len(PROMPT) + 2
    for name in ("conv_tails", "delta_states"):
        kept, expected = getattr(verified.recurrent, name), getattr(stepped.recurrent, name)
        assert torch.allclose(kept, expected, atol=1e-12), name
    assert not torch.allclose(verified.recurrent.delta_states, _prefilled(decoder).recurrent.delta_states)
    next_verified, next_stepped = _forward(decoder, verified, [9]), _forward(decoder, stepped, [9])
    assert torch.allclose(next_verified, next_stepped, atol=1e-10)


def test_rejecting_every_draft_keeps_the_roots_state(model):
    decoder = model.decoder
    verified = _prefilled(decoder)
    _forward(decoder, verified, [1, *DRAFT])
    verified.commit(4, [0])
    stepped = _prefilled(decoder)
    _forward(decoder, stepped, [1])
    stepped.commit(1)
    assert torch.allclose(verified.recurrent.delta_states, stepped.recurrent.delta_states, atol=1e-12)


def test_a_tree_is_refused_by_the_decoder_and_by_the_cache(model):
    decoder = model.decoder
    cache = _prefilled(decoder)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # root with two children
    with pytest.raises(TreeOverRecurrentState, match="tree verification over recurrent state"):
        decoder(torch.tensor([1, 2, 3]), torch.tensor([11, 12, 12]), cache, tree_mask=mask)
    _forward(decoder, cache, [1, 2, 3])
    with pytest.raises(TreeOverRecurrentState, match=r"accepted rows \[0, 2\] of 3 are not a prefix"):
        cache.commit(3, [0, 2])


def test_a_prefill_chunk_is_committed_whole(model):
    decoder = model.decoder
    cache = _prefilled(decoder)
    decoder(torch.tensor(DRAFT), torch.arange(cache.length, cache.length + 3), cache, num_logits=0)
    with pytest.raises(AssertionError, match="committed whole"):
        cache.commit(3, [0, 1])


def test_prefill_cache_is_off_for_hybrid_models(model):
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids)
    assert not runner.reuses_prefixes
    assert ModelStepper(runner, PrefixCache(1 << 20)).prefix_cache is None
