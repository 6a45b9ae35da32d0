"""DFlash chain and tree speculation over recurrent state: the `dflash` and `tree` modes on tiny
random Qwen3.5 and Qwen3-Next targets give plain decoding's greedy tokens exactly (float64), and
the drafter, conditioned on hybrid layers' hidden states, sees after tree steps the context one
forward over the committed tokens gives, and after a prefill-cache hit the context of a cold run.

A random drafter is rarely right, so each mode also runs steered (tests/support/steered_dflash):
its drafts are right for the first 0 to 3 depths, then random (in a tree the right token comes
second, so an accepted path skips rows), and steps commit paths from the root alone to several
nodes deep: the recurrent state kept must be that path's.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.lanes_in_turn import serve_in_turn
from tests.support.steered_dflash import SteeredDFlash
from tests.support.tiny_drafters import write_random_dflash
from tests.support.tiny_hybrid_models import HYBRID_FAMILIES, make_tiny_hybrid_model
from tests.worker.models.hybrid.test_hybrid_prefix_cache import BLOCK as PREFIX_BLOCK
from tests.worker.models.hybrid.test_hybrid_prefix_cache import _lanes as shared_prefix_lanes
from tests.worker.speculation.test_lossless import make_prompts
from worker.drafters.dflash import DFlashDrafter
from worker.drafters.oracle import greedy_reference
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import TargetStates
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model
from worker.serving.model_stepper import ModelStepper
from worker.serving.prefix_cache import PrefixCache

GREEDY = SamplingParams(max_tokens=64, ignore_eos=True)
PREFILL_CHUNK = 7
NUM_PROMPTS = 4
# Outputs of a recurrent layer and of the attention layer (layer_types: linear, linear, full, linear).
TARGET_LAYER_IDS = (1, 2)
TREE_BUDGET = 8


@functools.cache
def hybrid_target(family: str) -> tuple[LoadedModel, Path]:
    """The target and its random DFlash drafter's folder, written once per family."""
    folder = Path(tempfile.mkdtemp(prefix=f"arbor-hybrid-dflash-{family}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    target = make_tiny_hybrid_model(folder / "target", family)
    dflash = write_random_dflash(folder / "dflash", target, target_layer_ids=TARGET_LAYER_IDS, num_layers=1)
    return load_model(target, dtype="float64"), dflash


def dflash_drafter(family: str, mode: str) -> DFlashDrafter:
    model, folder = hybrid_target(family)
    drafter = load_drafter(mode, model, DraftOptions(draft=folder, tree_budget=TREE_BUDGET))
    assert isinstance(drafter, DFlashDrafter)
    return drafter


def prompts(family: str) -> list[list[int]]:
    return make_prompts(hybrid_target(family)[0].config.vocab_size, NUM_PROMPTS, seed=3)


@functools.cache
def plain_outputs(family: str) -> list[list[int]]:
    model, _ = hybrid_target(family)
    return [greedy_reference(model.decoder, prompt, GREEDY.max_tokens) for prompt in prompts(family)]


def steered(family: str, mode: str) -> SteeredDFlash:
    return SteeredDFlash(dflash_drafter(family, mode), plain_outputs(family), TREE_BUDGET if mode == "tree" else None)


def run(runner: ModelRunner, prompt: list[int], stats: SpecStats, num_steps: int | None = None) -> Sequence:
    sequence = runner.start("hybrid-dflash", prompt, GREEDY)
    while sequence.num_to_prefill:
        runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished and num_steps != 0:
        runner.decode_step(sequence)
        num_steps = None if num_steps is None else num_steps - 1
    stats.merge(sequence.stats)
    return sequence


@pytest.mark.parametrize("mode", ["dflash", "tree"])
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_the_random_drafter_gives_plain_greedy_tokens(family, mode):
    model, _ = hybrid_target(family)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, dflash_drafter(family, mode))
    stats = SpecStats()
    for prompt, expected in zip(prompts(family), plain_outputs(family), strict=True):
        assert prompt + run(runner, prompt, stats).output_ids == expected
    assert stats.draft_tokens > 0


@pytest.mark.parametrize("mode", ["dflash", "tree"])
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_steered_drafts_accepted_and_rejected_give_plain_greedy_tokens(family, mode):
    model, _ = hybrid_target(family)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, steered(family, mode))
    stats = SpecStats()
    for prompt, expected in zip(prompts(family), plain_outputs(family), strict=True):
        assert prompt + run(runner, prompt, stats).output_ids == expected
    # committed paths of several depths: the root alone (first draft rejected), one draft, more
    assert stats.drafts > stats.accepted_per_depth[0] > stats.accepted_per_depth[1] > 0
    assert stats.accepted_tokens < stats.draft_tokens


@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_after_tree_steps_the_drafter_sees_what_one_forward_gives(family):
    """The runner hands the drafter the hidden states of the committed path's rows, which in a
    tree are not a prefix: recomputed from one forward over the committed tokens they must agree."""
    model, _ = hybrid_target(family)
    drafter = steered(family, "tree")
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    sequence = run(runner, prompts(family)[1], SpecStats(), num_steps=12)
    assert sequence.stats.accepted_tokens > 0 and not sequence.finished
    committed = sequence.token_ids[:-1]
    decoder = model.decoder
    out = decoder(
        torch.tensor(committed),
        torch.arange(len(committed)),
        decoder.new_cache(len(committed)),
        hidden_layers=drafter.hidden_layers,
        num_logits=0,
    )
    fresh = drafter.start(sequence)
    drafter.observe(fresh, TargetStates(committed, 0, out.hidden, None, sequence.root_token))
    inner = drafter.inner
    expected = inner.block_logits(fresh, sequence.root_token)
    torch.testing.assert_close(inner.block_logits(sequence.drafter_state, sequence.root_token), expected)


def _serve_recording_drafts(family: str, mode: str, lanes, cache: PrefixCache | None) -> tuple[dict, list, int]:
    """Lanes one after another through the scheduler (each stores its prefix before the next
    looks it up); returns their outputs, every tree the drafter proposed, and the cache's hits."""
    model, _ = hybrid_target(family)
    drafter = dflash_drafter(family, mode)
    proposed: list[tuple[str, list[int], list[int]]] = []
    propose = drafter.propose

    def recording(state, sequence):
        tree = propose(state, sequence)
        proposed.append((sequence.request_id, tree.tokens, tree.parents))
        return tree

    drafter.propose = recording  # type: ignore[method-assign]
    stepper = ModelStepper(ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter), cache)
    outputs = serve_in_turn(stepper, lanes)
    return outputs, proposed, stepper.counters.prefix_cache_hits


@pytest.mark.parametrize("mode", ["dflash", "tree"])
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_prefill_cache_hits_draft_what_a_cold_run_drafts(family, mode):
    """A hit continues the drafter from its snapshot of the prefix: its drafts, which depend on
    its whole context, must be a cold run's, draft for draft."""
    lanes = shared_prefix_lanes(hybrid_target(family)[0].config.vocab_size, 4)
    cold, cold_drafts, _ = _serve_recording_drafts(family, mode, lanes, None)
    warm, warm_drafts, hits = _serve_recording_drafts(family, mode, lanes, PrefixCache(1 << 30, PREFIX_BLOCK))
    assert hits == len(lanes) - 1
    assert warm == cold
    assert warm_drafts == cold_drafts
