"""One tree forward is the same computation as verifying each root-to-node path as a chain, and
committing an accepted path leaves the KV cache plain decoding would have built (float64)."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from worker.engine.logits_processing import make_generator
from worker.engine.sequence import Sequence
from worker.engine.verifier import tree_inputs
from worker.models.kv_cache import KVCache
from worker.models.loader import LoadedModel, load_model
from worker.speculation.tree import ROOT, DraftTree

PROMPT = [17, 3, 250, 41, 41, 9, 120, 77, 5, 64]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def model(family: str) -> LoadedModel:
    return load_model(speculation_checkpoints(family).target, dtype="float64")


def random_tree(rng: random.Random, num_nodes: int, vocab_size: int) -> DraftTree:
    tokens, parents, depths = [], [], []
    for i in range(num_nodes):
        parent = rng.choice([ROOT, *range(i)])
        siblings = {tokens[j] for j in range(i) if parents[j] == parent}
        token = rng.choice([t for t in range(3, vocab_size) if t not in siblings])
        tokens.append(token)
        parents.append(parent)
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    return DraftTree(tokens, parents, depths)


def prefilled(model: LoadedModel, capacity: int = 64) -> Sequence:
    """The prompt minus its last token (the root) in the cache, as the runner keeps it."""
    cache = model.decoder.new_cache(capacity)
    num = len(PROMPT) - 1
    model.decoder(torch.tensor(PROMPT[:num]), torch.arange(num), cache)
    cache.commit(num)
    return Sequence("verify", list(PROMPT), SamplingParams(), cache, make_generator(0))


def copy_prefix(model: LoadedModel, cache: KVCache) -> KVCache:
    """A new cache holding the same committed tokens (scratch slots left empty)."""
    fresh = model.decoder.new_cache(cache.max_tokens)
    fresh.load_prefix(cache.keys[:, :, : cache.length], cache.values[:, :, : cache.length])
    return fresh


def chain_logits(model: LoadedModel, sequence: Sequence, token_ids: list[int]) -> torch.Tensor:
    """Logits after the last of `token_ids`, fed as a chain after the sequence's committed prefix."""
    cache = copy_prefix(model, sequence.cache)
    start = cache.length
    out = model.decoder(torch.tensor(token_ids), torch.arange(start, start + len(token_ids)), cache)
    return out.logits[-1]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_each_tree_node_gets_the_logits_of_its_path_verified_as_a_chain(family, seed):
    model_ = model(family)
    tree = random_tree(random.Random(seed), num_nodes=9, vocab_size=model_.config.vocab_size)
    assert not tree.is_chain
    sequence = prefilled(model_)
    token_ids, positions, mask = tree_inputs(sequence, tree)
    logits = model_.decoder(
        torch.tensor(token_ids), torch.tensor(positions), copy_prefix(model_, sequence.cache), tree_mask=mask
    ).logits
    torch.testing.assert_close(logits[0], chain_logits(model_, sequence, [sequence.root_token]), rtol=0, atol=1e-5)
    for node in range(tree.num_nodes):
        path = [sequence.root_token] + [tree.tokens[i] for i in tree.path_to(node)]
        torch.testing.assert_close(logits[node + 1], chain_logits(model_, sequence, path), rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_committing_an_accepted_path_leaves_the_plain_decoding_cache(seed):
    model_ = model("qwen3")
    rng = random.Random(seed)
    tree = random_tree(rng, num_nodes=10, vocab_size=model_.config.vocab_size)
    sequence = prefilled(model_)
    token_ids, positions, mask = tree_inputs(sequence, tree)
    model_.decoder(torch.tensor(token_ids), torch.tensor(positions), sequence.cache, tree_mask=mask)
    path = tree.path_to(max(range(tree.num_nodes), key=lambda i: (tree.depths[i], i)))  # deepest, latest
    sequence.cache.commit(1 + tree.num_nodes, [0] + [node + 1 for node in path])
    accepted = PROMPT + [tree.tokens[i] for i in path]
    plain = model_.decoder.new_cache(len(accepted))
    for position, token in enumerate(accepted):
        model_.decoder(torch.tensor([token]), torch.tensor([position]), plain)
        plain.commit(1)
    length = sequence.cache.length
    assert length == len(accepted)
    torch.testing.assert_close(sequence.cache.keys[:, :, :length], plain.keys, rtol=0, atol=1e-10)
    torch.testing.assert_close(sequence.cache.values[:, :, :length], plain.values, rtol=0, atol=1e-10)
