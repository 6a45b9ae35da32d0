"""The hybrid cache keeps the KV cache's commit contract: after a verification (chain or tree) the
state after the last accepted row is kept, and what recurrent state cannot express (rows that
are not a path, a prefill chunk committed in part) is refused rather than served wrong."""

from __future__ import annotations

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.engine.runner import ModelRunner
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.hybrid.hybrid_cache import HybridCache
from worker.models.hybrid.recurrent_state import NotAPath
from worker.models.loader import LoadedModel, load_model
from worker.serving.model_stepper import ModelStepper

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


def test_tree_commit_keeps_the_accepted_paths_kv_and_state(model):
    """Root, children a and b, grandchild c under b; the path root -> b -> c is accepted: K/V of
    rows [0, 2, 3] move into place, and the recurrent state is the one after c (from b's, from
    the root's), as if the path alone had been run as a chain."""
    decoder = model.decoder
    tree = _prefilled(decoder)
    start = tree.length
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    positions = torch.tensor([start, start + 1, start + 1, start + 2])  # start + depth
    decoder(torch.tensor([1, 44, 45, 46]), positions, tree, tree_mask=mask)
    tree.commit(4, [0, 2, 3])
    chain = _prefilled(decoder)
    _forward(decoder, chain, [1, 45, 46])
    chain.commit(3)
    assert tree.length == chain.length == start + 3
    assert torch.allclose(tree.keys[:, :, : tree.length], chain.keys[:, :, : chain.length], atol=1e-12)
    assert torch.allclose(tree.values[:, :, : tree.length], chain.values[:, :, : chain.length], atol=1e-12)
    for name in ("conv_tails", "delta_states"):
        kept, expected = getattr(tree.recurrent, name), getattr(chain.recurrent, name)
        assert torch.allclose(kept, expected, atol=1e-12), name
    assert torch.allclose(_forward(decoder, tree, [9]), _forward(decoder, chain, [9]), atol=1e-10)


def test_rows_that_are_not_a_path_are_refused(model):
    decoder = model.decoder
    cache = _prefilled(decoder)
    _forward(decoder, cache, [1, 2, 3])  # a chain: only prefixes are paths
    with pytest.raises(NotAPath, match=r"accepted rows \[0, 2\] of 3 are not a root-to-node path"):
        cache.commit(3, [0, 2])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # siblings under the root
    decoder(torch.tensor([1, 2, 3]), torch.tensor([11, 12, 12]), cache, tree_mask=mask)
    with pytest.raises(NotAPath):
        cache.commit(3, [0, 1, 2])


def test_a_prefill_chunk_is_committed_whole(model):
    decoder = model.decoder
    cache = _prefilled(decoder)
    decoder(torch.tensor(DRAFT), torch.arange(cache.length, cache.length + 3), cache, num_logits=0)
    with pytest.raises(AssertionError, match="committed whole"):
        cache.commit(3, [0, 1])


def test_a_lanes_admission_cost_is_what_its_cache_holds(model):
    """Attention layers' K/V plus the fixed recurrent state, not every layer's K/V."""
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids)
    stepper = ModelStepper(runner)
    sequence = runner.start("lane", PROMPT, SamplingParams(max_tokens=20))
    assert stepper.kv_bytes(len(PROMPT), 20) == sequence.cache.num_bytes
