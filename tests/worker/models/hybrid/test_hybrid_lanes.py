"""Several hybrid lanes in one forward, and the rounding of verification over recurrent state.

A step's lanes share the norms, projections and MLPs but each runs its own attention and its
own recurrence: together they must give what each gives alone. And a node's outputs and state
must be rounded as plain decoding rounds the same token: in bfloat16, a tree's path equals the
same path verified as a chain equals the path decoded token by token, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.models.decoder import LaneRows
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.hybrid.hybrid_cache import HybridCache
from worker.models.loader import load_model

PROMPTS = [
    [5, 17, 42, 99, 7],
    [3, 11, 60, 2, 31, 8, 70, 12, 9],
    [23, 4, 88],
    [14, 15, 16, 17, 18, 19],
    [90, 91, 92, 93],
    [8, 6, 4, 2, 1, 3, 5],
]
# A tree of root + 5: two children of the root, a grandchild under each, and one under the second's.
TREE_TOKENS = [40, 41, 50, 51, 52, 53]
TREE_PARENTS = [-1, 0, 0, 1, 2, 4]
PATH = [0, 2, 4, 5]  # root -> 50 -> 52 -> 53


def _tree_mask(parents: list[int]) -> torch.Tensor:
    mask = torch.eye(len(parents), dtype=torch.bool)
    for node, parent in enumerate(parents):
        while parent >= 0:
            mask[node, parent] = True
            parent = parents[parent]
    return mask


def _prefilled(decoder: HybridDecoder, prompt: list[int]) -> HybridCache:
    cache = decoder.new_cache(64)
    decoder(torch.tensor(prompt), torch.arange(len(prompt)), cache, num_logits=0)
    cache.commit(len(prompt))
    return cache


def _tree_positions(start: int) -> list[int]:
    """A tree node sits at the position of its depth."""
    depth: list[int] = []
    for parent in TREE_PARENTS:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    return [start + d for d in depth]


def _rows(cache: HybridCache, token_ids: list[int], tree_mask=None, num_logits=None) -> LaneRows:
    start = cache.length
    positions = _tree_positions(start) if tree_mask is not None else list(range(start, start + len(token_ids)))
    return LaneRows(token_ids, positions, cache, tree_mask, num_logits)


def _step_lanes(decoder: HybridDecoder, caches: list[HybridCache]) -> list[LaneRows]:
    """A prefill chunk, decode rows, a tree and chains: each kind of row a step carries (two
    decode rows and two chains of equal length share one recurrence)."""
    return [
        _rows(caches[0], [61, 62, 63, 64, 65, 66, 67], num_logits=0),
        _rows(caches[1], [33]),
        _rows(caches[2], TREE_TOKENS, _tree_mask(TREE_PARENTS)),
        _rows(caches[3], [71, 72, 73, 74]),
        _rows(caches[4], [34]),
        _rows(caches[5], [75, 76, 77, 78]),
    ]


COMMITS = [None, None, PATH, [0, 1], None, [0, 1, 2, 3]]  # rows each lane keeps


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_next"])
def test_lanes_in_one_forward_equal_each_lane_alone(tmp_path, family):
    decoder = load_model(make_tiny_hybrid_model(tmp_path, family), dtype="float64").decoder
    together = [_prefilled(decoder, prompt) for prompt in PROMPTS]
    outs = decoder.forward_lanes(_step_lanes(decoder, together), hidden_layers=(1,), want_final_hidden=True)
    alone_caches = [_prefilled(decoder, prompt) for prompt in PROMPTS]
    for index, (lane, out) in enumerate(zip(_step_lanes(decoder, alone_caches), outs, strict=True)):
        expected = decoder.forward_lanes([lane], hidden_layers=(1,), want_final_hidden=True)[0]
        assert out.logits.shape == expected.logits.shape
        assert torch.allclose(out.logits, expected.logits, atol=1e-10), index
        assert torch.allclose(out.hidden[1], expected.hidden[1], atol=1e-10), index
        assert torch.allclose(out.final_hidden, expected.final_hidden, atol=1e-10), index
    for cache, alone, rows, keep in zip(together, alone_caches, _step_lanes(decoder, together), COMMITS, strict=True):
        cache.commit(len(rows.token_ids), keep)
        alone.commit(len(rows.token_ids), keep)
        assert cache.length == alone.length
        assert torch.allclose(cache.recurrent.delta_states, alone.recurrent.delta_states, atol=1e-10)
        assert torch.allclose(cache.recurrent.conv_tails, alone.recurrent.conv_tails, atol=1e-10)
        assert torch.allclose(cache.keys[:, :, : cache.length], alone.keys[:, :, : alone.length], atol=1e-10)


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_next"])
def test_in_bfloat16_a_trees_path_equals_its_chain_and_plain_decoding_bit_for_bit(tmp_path, family):
    decoder = load_model(make_tiny_hybrid_model(tmp_path, family), dtype="bfloat16").decoder
    prompt, path_tokens = PROMPTS[1], [TREE_TOKENS[node] for node in PATH]

    tree = _prefilled(decoder, prompt)
    positions = torch.tensor(_tree_positions(tree.length))
    tree_logits = decoder(torch.tensor(TREE_TOKENS), positions, tree, tree_mask=_tree_mask(TREE_PARENTS)).logits[PATH]
    tree.commit(len(TREE_TOKENS), PATH)

    chain = _prefilled(decoder, prompt)
    positions = torch.arange(chain.length, chain.length + len(path_tokens))
    chain_logits = decoder(torch.tensor(path_tokens), positions, chain).logits
    chain.commit(len(path_tokens))

    plain, plain_logits = _prefilled(decoder, prompt), []
    for token in path_tokens:
        plain_logits.append(decoder(torch.tensor([token]), torch.tensor([plain.length]), plain).logits[0])
        plain.commit(1)

    assert tree_logits.dtype == torch.bfloat16
    assert torch.equal(tree_logits, chain_logits)
    assert torch.equal(chain_logits, torch.stack(plain_logits))
    for name in ("delta_states", "conv_tails"):
        assert torch.equal(getattr(tree.recurrent, name), getattr(chain.recurrent, name)), name
        assert torch.equal(getattr(chain.recurrent, name), getattr(plain.recurrent, name)), name
    assert torch.equal(tree.keys[:, :, : tree.length], plain.keys[:, :, : plain.length])
