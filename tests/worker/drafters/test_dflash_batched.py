"""The DFlash drafter across lanes: `observe_many` and `propose_many` equal `observe` and `propose`
lane by lane (ragged context lengths, chain and tree mode, draft limits), in one drafter forward
for all lanes and one read-back of their drafts. A tiny random Qwen3 target and a random z-lab
drafter, in float64."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints, write_random_dflash
from tests.worker.engine.test_host_syncs import ReadBacks
from worker.drafters.dflash import DFlashDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import TargetStates
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import LoadedModel, load_model

PROMPT_LENGTHS = (3, 9, 17, 26)  # ragged contexts: each lane's attention reads its own length
BLOCK_SIZE = 6


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def target() -> LoadedModel:
    return load_model(speculation_checkpoints("qwen3").target, dtype="float64")


def load_dflash(tmp_path: Path, mode: str, **options) -> DFlashDrafter:
    folder = write_random_dflash(
        tmp_path / "dflash", speculation_checkpoints("qwen3").target, block_size=BLOCK_SIZE, seed=7
    )
    drafter = load_drafter(mode, target(), DraftOptions(draft=folder, **options))
    assert isinstance(drafter, DFlashDrafter)
    return drafter


def prefilled_lanes(drafter: DFlashDrafter, num_decode_steps: int = 0) -> list[Sequence]:
    """One lane per prompt length, prefilled (and decoded a few steps) through the runner."""
    runner = ModelRunner(target().decoder, [], drafter)
    generator = torch.Generator().manual_seed(3)
    vocab_size = target().config.vocab_size
    lanes = []
    for index, length in enumerate(PROMPT_LENGTHS):
        prompt = torch.randint(0, vocab_size - 1, (length,), generator=generator).tolist()
        sequence = runner.start(f"lane-{index}", prompt, SamplingParams(max_tokens=32, ignore_eos=True))
        while sequence.num_to_prefill > 0:
            runner.prefill(sequence, 8)
        for _ in range(num_decode_steps + index % 2):  # lanes a step apart: contexts grow unevenly
            runner.decode_step(sequence)
        lanes.append(sequence)
    return lanes


def tree_fields(tree) -> tuple | None:
    return None if tree is None else (tree.tokens, tree.parents, tree.depths)


@pytest.mark.parametrize("mode", ["dflash", "tree"])
def test_propose_many_drafts_what_each_lane_drafts_alone(tmp_path, mode):
    drafter = load_dflash(tmp_path, mode, tree_budget=8, tree_top_k=3)
    lanes = prefilled_lanes(drafter, num_decode_steps=2)
    assert len({lane.drafter_state.cache.length for lane in lanes}) == len(lanes)
    alone = [drafter.propose(lane.drafter_state, lane) for lane in lanes]
    together = drafter.propose_many([(lane.drafter_state, lane) for lane in lanes])
    assert [tree_fields(tree) for tree in together] == [tree_fields(tree) for tree in alone]
    if mode == "dflash":
        assert all(tree is not None and tree.num_nodes == BLOCK_SIZE - 1 and tree.is_chain for tree in together)
    else:
        assert all(tree is not None and tree.num_nodes == 8 for tree in together)
        assert any(tree is not None and not tree.is_chain for tree in together)


def test_block_logits_of_a_lane_do_not_depend_on_its_batch(tmp_path):
    drafter = load_dflash(tmp_path, "dflash")
    lanes = prefilled_lanes(drafter)
    alone = [drafter.block_logits(lane.drafter_state, lane.root_token) for lane in lanes]
    x = drafter._blocks([lane.drafter_state for lane in lanes], [lane.root_token for lane in lanes])
    together = drafter.vocabulary.logits(drafter.model.norm(x)).view(len(lanes), BLOCK_SIZE, -1)[:, 1:]
    for lane_logits, expected in zip(together, alone, strict=True):
        torch.testing.assert_close(lane_logits, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["dflash", "tree"])
def test_propose_many_respects_each_lanes_draft_limit(tmp_path, mode):
    drafter = load_dflash(tmp_path, mode, tree_budget=8, tree_top_k=3)
    lanes = prefilled_lanes(drafter)
    full = [drafter.propose(lane.drafter_state, lane) for lane in lanes]
    limits = (0, 1, 3, None)
    for lane, limit in zip(lanes, limits, strict=True):
        lane.draft_limit = limit
    together = drafter.propose_many([(lane.drafter_state, lane) for lane in lanes])
    assert together[0] is None  # a lane asked for no drafts gets none
    for tree, full_tree, limit in zip(together[1:], full[1:], limits[1:], strict=True):
        assert tree is not None and full_tree is not None
        expected = full_tree if limit is None else full_tree.truncated(limit)
        assert tree_fields(tree) == tree_fields(expected)
        assert tree.num_nodes == (full_tree.num_nodes if limit is None else limit)
    # every lane asked for none: nothing runs, nothing is drafted
    for lane in lanes:
        lane.draft_limit = 0
    assert drafter.propose_many([(lane.drafter_state, lane) for lane in lanes]) == [None] * len(lanes)


def random_committed(drafter: DFlashDrafter, start: int, num_tokens: int, seed: int) -> TargetStates:
    generator = torch.Generator().manual_seed(seed)
    size = target().config.hidden_size
    hidden = {
        layer: torch.randn(num_tokens, size, generator=generator, dtype=torch.float64)
        for layer in drafter.spec.target_layer_ids
    }
    return TargetStates(list(range(num_tokens)), start, hidden, None, next_token=1)


def test_observe_many_leaves_each_lanes_context_as_observe_does(tmp_path):
    drafter = load_dflash(tmp_path, "dflash")
    lanes = prefilled_lanes(drafter)
    alone = [drafter.start(lane) for lane in lanes]
    together = [drafter.start(lane) for lane in lanes]
    for step, sizes in enumerate([(7, 1, 12, 3), (1, 4, 1, 2)]):  # a prefill-like round, then decode-like
        batch = [
            random_committed(drafter, state.cache.length, n, 10 * step + i)
            for i, (state, n) in enumerate(zip(alone, sizes))
        ]
        for state, committed in zip(alone, batch, strict=True):
            drafter.observe(state, committed)
        drafter.observe_many(list(zip(together, batch, strict=True)))
    for one, many in zip(alone, together, strict=True):
        length = one.cache.length
        assert many.cache.length == length
        torch.testing.assert_close(many.cache.keys[:, :, :length], one.cache.keys[:, :, :length], rtol=0, atol=1e-12)
        torch.testing.assert_close(
            many.cache.values[:, :, :length], one.cache.values[:, :, :length], rtol=0, atol=1e-12
        )


def count_calls(module: torch.nn.Module) -> list[int]:
    calls = [0]

    def hook(*_) -> None:
        calls[0] += 1

    module.register_forward_hook(hook)
    return calls


@pytest.mark.parametrize("mode", ["dflash", "tree"])
def test_one_drafter_forward_serves_every_lane(tmp_path, mode):
    drafter = load_dflash(tmp_path, mode)
    lanes = prefilled_lanes(drafter)
    layers = list(drafter.model.draft_layers())
    queries = count_calls(layers[-1].self_attn.q_proj)  # once per block forward
    context_keys = count_calls(layers[0].self_attn.k_proj)  # once per observation and per block forward
    fc = count_calls(drafter.model.fc)  # once per observation
    drafter.propose_many([(lane.drafter_state, lane) for lane in lanes])
    assert queries[0] == 1 and context_keys[0] == 1
    batch = [random_committed(drafter, lane.drafter_state.cache.length, 2, i) for i, lane in enumerate(lanes)]
    drafter.observe_many([(lane.drafter_state, committed) for lane, committed in zip(lanes, batch, strict=True)])
    assert fc[0] == 1 and context_keys[0] == 2
    for lane in lanes:  # the counting sees per-lane calls too
        drafter.propose(lane.drafter_state, lane)
    assert queries[0] == 1 + len(lanes)


@pytest.mark.parametrize("mode", ["dflash", "tree"])
def test_propose_many_reads_every_lanes_drafts_back_at_once(tmp_path, monkeypatch, mode):
    drafter = load_dflash(tmp_path, mode)
    lanes = prefilled_lanes(drafter)
    read_backs = ReadBacks(monkeypatch)
    trees = drafter.propose_many([(lane.drafter_state, lane) for lane in lanes])
    assert all(tree is not None and tree.num_nodes > 0 for tree in trees)
    assert read_backs.count == 1
